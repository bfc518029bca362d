// The demo's last stage: the trained model run together, Petals-style. Block servers host its
// layers and a client generates text through them; then the server it used for the last blocks
// is killed and the client generates again through the replacement, which must give the same
// (seeded) text.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "demo/demo.h"

namespace colony::demo {
namespace {

std::string OneLine(std::string t) {
  for (char& c : t) {
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  }
  return t;
}

}  // namespace

Result<std::string> ServeTrained(const DemoOptions& a, const Output& out) {
  using namespace std::chrono;
  const std::string self = ColonyExecutable(a);
  const std::filesystem::path dir = std::filesystem::absolute(a.out_dir);
  const std::string model = (dir / "model").string();
  std::ifstream cfg(dir / "model" / "config.json");
  auto config = nlohmann::json::parse(cfg, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.value("num_hidden_layers", 0)) {
    return DataLoss("the trained model's config.json is unreadable");
  }
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  const int64_t split = std::max<int64_t>(1, layers / 2);
  out("\nRunning the trained model together (Petals-style block servers):\n");
  std::vector<Subprocess> servers;
  std::vector<std::string> addrs;
  struct Span {
    int64_t first, last;
  };
  // Blocks [0, split) on one server; [split, layers) on two (a replacement for failover).
  for (const Span span : {Span{0, split}, Span{split, layers}, Span{split, layers}}) {
    std::vector<std::string> argv = {self,           "serve",
                                     "--model",      model,
                                     "--model-name", "demo-lm",
                                     "--blocks",     fmt::format("{}:{}", span.first, span.last),
                                     "--listen",     "/ip4/127.0.0.1/tcp/0",
                                     "--threads",    "1",
                                     "--cache-mib",  "64"};
    if (!addrs.empty()) argv.insert(argv.end(), {"--initial-peers", addrs.front()});
    const auto log = dir / fmt::format("server{}.log", servers.size());
    COLONY_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Spawn(argv, log.string()));
    auto line = p.ReadLine(seconds(60));
    if (!line.ok()) {
      return line.status().WithContext(
          fmt::format("block server {} did not start; see {}", servers.size(), log.string()));
    }
    out(fmt::format("  server {}  blocks {}:{}  {}\n", servers.size(), span.first, span.last,
                    *line));
    addrs.push_back(*line);
    servers.push_back(std::move(p));
  }
  const std::string client_log = (dir / "client.log").string();
  auto run = [&](std::vector<std::string> argv) -> Result<std::string> {
    argv.insert(argv.begin(), self);
    COLONY_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Spawn(argv, client_log));
    std::string text;
    while (true) {
      auto line = p.ReadLine(seconds(120));
      if (!line.ok()) break;
      text += *line + "\n";
    }
    COLONY_ASSIGN_OR_RETURN(int code, p.Wait(seconds(30)));
    if (code != 0) {
      return Internal(
          fmt::format("'colony {}' failed (exit code {}); see {}", argv[1], code, client_log));
    }
    return text;
  };
  // Wait until the client sees every server in the DHT.
  std::string table;
  for (int attempt = 0; attempt < 50; ++attempt) {
    COLONY_ASSIGN_OR_RETURN(table, run({"servers", "--model", model, "--model-name", "demo-lm",
                                        "--initial-peers", addrs.front()}));
    if (table.find("3 servers") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  out(table);
  // Seeded sampling: the same text on every run through any servers.
  auto generate = [&]() -> Result<nlohmann::json> {
    COLONY_ASSIGN_OR_RETURN(std::string printed,
                            run({"generate",   "--model",          model,         "--model-name",
                                 "demo-lm",    "--initial-peers",  addrs.front(), "--prompt",
                                 "The kernel", "--max-new-tokens", "32",          "--threads",
                                 "1",          "--temperature",    "0.8",         "--top-k",
                                 "40",         "--seed",           "1",           "--json"}));
    auto j = nlohmann::json::parse(printed, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return Internal("colony generate printed no result");
    return j;
  };
  COLONY_ASSIGN_OR_RETURN(nlohmann::json j, generate());
  out(fmt::format("  generated through {} servers: The kernel{}\n", j["route"].size(),
                  OneLine(j.value("text", std::string()))));
  // Kill (SIGKILL) the server that held the last blocks; the replacement takes over.
  size_t victim = 0;
  for (size_t i = 1; i < addrs.size(); ++i) {
    for (const auto& hop : j["route"]) {
      if (addrs[i].ends_with(hop.value("peer", std::string("?")))) victim = i;
    }
  }
  if (victim == 0) return Internal("the route used none of the servers of the last blocks");
  servers[victim].Signal(SIGKILL);
  (void)servers[victim].Wait(seconds(10));
  out(fmt::format("  killed server {} (SIGKILL); generating again:\n", victim));
  COLONY_ASSIGN_OR_RETURN(nlohmann::json j2, generate());
  out(fmt::format("  generated through the replacement: The kernel{}\n",
                  OneLine(j2.value("text", std::string()))));
  int clean = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    if (i == victim) continue;
    servers[i].Signal(SIGTERM);
    auto code = servers[i].Wait(seconds(20));
    clean += code.ok() && *code == 0;
  }
  if (clean != static_cast<int>(servers.size()) - 1) {
    return Internal("some block servers did not shut down cleanly; see server*.log in " +
                    dir.string());
  }
  if (j2["tokens"] != j["tokens"]) {
    return Internal("generation through the replacement server differs from the first run");
  }
  return fmt::format("{} tokens generated through {} block servers, the same after one was killed",
                     j["tokens"].size(), j["route"].size());
}

}  // namespace colony::demo
