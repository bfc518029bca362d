// The end-to-end run behind `colony demo`, on one machine: a swarm of real `colony` processes on
// loopback that find each other through the DHT, exchange and average tensors, train a
// Llama-style language model together, then serve it from block servers and survive a killed
// one. Each stage checks its own result against an independent reference (bytes echoed, the
// exact mean, the held-out loss falling, the same seeded text after a failover) and reports its
// progress as text through an Output; the command only parses flags and prints.
//
//   demo::DemoOptions o;  o.peers = 4;  o.quick = true;
//   Status st = demo::RunDemo(o, [](std::string_view s) { std::fwrite(s.data(), 1, s.size(),
//   stdout); });
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/multiaddr.h"
#include "core/status.h"
#include "core/subprocess.h"

namespace colony::demo {

struct DemoOptions {
  int peers = 4;                        // processes in each stage (2 to 32)
  int tensor_mib = 4;                   // size of the tensor echoed and averaged (1 to 256 MiB)
  bool quick = false;                   // less text, a smaller vocabulary, 30 training steps
  int64_t train_steps = 0;              // global steps of training; 0: 200 (30 with quick)
  std::string out_dir = "colony-demo";  // loss curve, metrics, logs and the trained model
  std::string cache_dir = {};           // corpus/tokenizer cache ("": the default cache)
  std::string model_size = "tiny";      // tiny, small or base
  std::string colony = {};              // the colony executable to run ("": this process's)
};

// The colony executable the stages run: options.colony, else this process's own.
std::string ColonyExecutable(const DemoOptions& options);

// Receives the demo's progress as text (whole lines, each ending in '\n').
using Output = std::function<void(std::string_view text)>;

// Runs every stage and prints a summary; an error when any stage failed (the output says which).
Status RunDemo(const DemoOptions& options, const Output& out);

// ---- the stages (local_swarm.cpp, train_stage.cpp, serve_stage.cpp)

// `colony listen` peers, each joined through the first: their addresses, and how many of the
// discovery pings (peer i pings the i peers before it) were answered.
struct LocalSwarm {
  std::vector<Subprocess> peers;
  std::vector<Multiaddr> addresses;
  std::string bootstrap;  // the first peer's address
  int pings_answered = 0;
  int pings_expected = 0;
};
Result<LocalSwarm> StartLocalSwarm(const DemoOptions& options, const Output& out);
// Sends a tensor of options.tensor_mib MiB to each peer's echo handler and compares the bytes.
struct EchoReport {
  int verified = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};
Result<EchoReport> EchoThroughEveryPeer(const DemoOptions& options,
                                        const std::vector<Multiaddr>& addresses, const Output& out);
// options.peers `colony average` processes average one synthetic tensor each in one group; the
// number whose result equals the mean computed here.
Result<int> AverageAcrossProcesses(const DemoOptions& options, const std::string& bootstrap,
                                   const Output& out);
// SIGTERM to every peer; the number that exited cleanly.
int StopLocalSwarm(LocalSwarm& swarm, const Output& out);

// options.peers `colony train` processes train one language model together; a summary line.
Result<std::string> TrainTogether(const DemoOptions& options, const std::string& bootstrap,
                                  const Output& out);
// Block servers host the trained model; a client generates through them, one server is killed
// and the client generates the same seeded text through its replacement; a summary line.
Result<std::string> ServeTrained(const DemoOptions& options, const Output& out);

}  // namespace colony::demo
