// colony demo: the main job, end to end on one machine (src/demo does the work; see demo.h).
//
// The demo starts a small swarm of real peer processes on loopback: a bootstrap peer, then peers
// that join the DHT through it, announce their addresses there as owner-signed records, find
// each other's, and ping each other over authenticated, encrypted connections. It exchanges
// tensors with every peer and lets as many new peer processes average a tensor each in one group
// (checking the exact mean). Then the main job: that many `colony train` processes train a
// Llama-style language model together on the Linux kernel's documentation (collaborative
// optimizer, target global batch), with live progress; the demo plots the loss curve to a PNG,
// prints text sampled from the trained model, serves it from block servers (surviving a killed
// one), and shuts the swarm down cleanly.
#include <cstdio>
#include <memory>

#include "demo/demo.h"
#include "tools/commands.h"

namespace colony::cli {

void AddDemoCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto args = std::make_shared<demo::DemoOptions>();
  auto* demo = app.add_subcommand(
      "demo",
      "run a local swarm of peer processes that find each other, exchange and average tensors, "
      "then train a language model together (loss curve PNG and sampled text in --out-dir) and "
      "serve it from block servers, surviving a killed server");
  demo->add_option("--peers", args->peers, "number of peer processes")
      ->check(CLI::Range(2, 32))
      ->capture_default_str();
  demo->add_option("--tensor-mib", args->tensor_mib, "size of the tensor echoed by each peer (MiB)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  demo->add_flag("--quick", args->quick,
                 "a short version: less text, a smaller vocabulary, 30 steps of training");
  demo->add_option("--train-steps", args->train_steps,
                   "global steps of collaborative training (default 200, 30 with --quick)")
      ->check(CLI::Range(int64_t{1}, int64_t{100'000}));
  demo->add_option("--out-dir", args->out_dir,
                   "where the loss curve, metrics, logs and the trained model are written")
      ->capture_default_str();
  demo->add_option("--cache-dir", args->cache_dir,
                   "corpus/tokenizer cache (default: $COLONY_CACHE_DIR or ~/.cache/colony)");
  demo->add_option("--model-size", args->model_size, "tiny, small or base")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str();
  commands.emplace_back(demo, [args]() -> int {
    Status st = demo::RunDemo(*args, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace colony::cli
