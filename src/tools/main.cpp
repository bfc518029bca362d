// colony: the command-line interface. `colony --help` lists the subcommands.
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>

#include "core/log.h"
#include "core/subprocess.h"
#include "tools/commands.h"

namespace colony::cli {

int Fail(const Status& status) {
  return Fail(status.message().empty() ? status.ToString() : status.message());
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "colony: error: %s\n", message.c_str());
  return 1;
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

#ifndef COLONY_WITH_TORCH
// Commands that run models (train, serve, generate, finetune, api, experts, swarm-train) run in
// the colony-torch program next to this one: only it links LibTorch, so every other command
// starts in milliseconds instead of loading LibTorch (about a second of CPU per process, which a
// swarm of 16 peer processes on 2 cores felt).
int ExecTorch(char** argv) {
  const std::string path =
      (std::filesystem::path(colony::SelfExecutable()).parent_path() / "colony-torch").string();
  argv[0] = const_cast<char*>(path.c_str());
  ::execv(path.c_str(), argv);
  return Fail(
      fmt::format("cannot run {}: {}; build it (cmake --build build --target "
                  "colony-torch) or install it next to colony",
                  path, std::strerror(errno)));
}
#endif

}  // namespace colony::cli

int main(int argc, char** argv) {
  using namespace colony::cli;
#ifndef COLONY_WITH_TORCH
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--log-level") {
      ++i;
      continue;
    }
    if (arg.starts_with("-")) continue;
    if (arg == "train" || arg == "serve" || arg == "generate" || arg == "finetune" ||
        arg == "api" || arg == "experts" || arg == "swarm-train") {
      return ExecTorch(argv);
    }
    break;
  }
#endif
  // Peers move large buffers of the same sizes every round (messages, parts, snapshots). By
  // default glibc hands each freed one back to the kernel (mmap above 128 KiB, heap trimming)
  // and faults it in again on the next round, which cost a third of an all-reduce's time here.
  // Keep up to 256 MiB of freed heap for reuse instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{
      "Colony: train and run large neural networks together over the Internet.\n"
      "Peers find each other, authenticate, and exchange tensors over encrypted connections.",
      // Usage lines say "colony" also when colony-torch runs a command handed over to it.
      "colony"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("colony ") + COLONY_VERSION_STRING);
  std::string log_level;
  app.add_option(
      "--log-level", log_level,
      "log level: trace, debug, info, warn, error, critical, off (default: $COLONY_LOG or info)");

  std::vector<std::pair<CLI::App*, Command>> commands;
#ifdef COLONY_WITH_TORCH
  AddTrainCommand(app, commands);
  AddServeCommands(app, commands);
  AddApiCommand(app, commands);
  AddExpertsCommands(app, commands);
  AddSwarmTrainCommands(app, commands);
#else
  AddIdentityCommands(app, commands);
  AddAuthorityCommands(app, commands);
  AddPeerCommands(app, commands);
  AddDhtCommands(app, commands);
  AddAverageCommand(app, commands);
  // Listed for --help; main() hands these to colony-torch before parsing.
  app.add_subcommand("train",
                     "train a model together with peers found in the DHT (runs colony-torch; "
                     "see 'colony train --help')");
  app.add_subcommand("serve",
                     "host a range of a model's transformer blocks for the swarm (Petals-style; "
                     "see 'colony serve --help')");
  app.add_subcommand("generate",
                     "generate text with a model whose blocks are served by the swarm (see "
                     "'colony generate --help')");
  app.add_subcommand("finetune",
                     "prompt-tune or LoRA-tune a model through the swarm's frozen blocks (see "
                     "'colony finetune --help')");
  app.add_subcommand("api",
                     "serve generation through the swarm over HTTP, compatible with the OpenAI "
                     "API (see 'colony api --help')");
  app.add_subcommand("experts",
                     "decentralized mixture-of-experts: host experts for the swarm, or generate "
                     "with a checkpoint whose experts they host (Learning@home; see 'colony "
                     "experts serve --help', 'colony experts generate --help')");
  app.add_subcommand("swarm-train",
                     "SWARM parallelism: train a model cut into pipeline stages, each hosted by a "
                     "swarm of peers (see 'colony swarm-train --help')");
  AddServersCommand(app, commands);
  AddMonitorCommand(app, commands);
  AddDemoCommand(app, commands);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version "fail" with exit code 0; let CLI11 print them.
    if (e.get_exit_code() == 0) return app.exit(e);
    // Usage errors: one "colony: error:" line like every other error, and the usual exit code 2.
    std::string command = "colony";
    for (CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      command += " " + sub->get_name();
    }
    Fail(std::string(e.what()) + "; see '" + command + " --help'");
    return 2;
  }
  if (auto st = colony::InitLogging(log_level); !st.ok()) return Fail(st);
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  return Fail("no command given; see 'colony --help'");
}
