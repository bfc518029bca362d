// colony average: one averaging peer on synthetic data, for tests, benchmarks and trying the
// averaging layer by hand. It joins the DHT, runs --rounds averaging steps and prints one JSON
// line per event on stdout:
//   {"event":"ready","peer":"12D3KooW...","addrs":[...]}
//   {"event":"round","round":0,"ok":true,"group_size":4,"members":[...],"parts":[...],...}
//   {"event":"state","ok":true,...}                      (with --load-state)
//   {"event":"done"}
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "averaging/averager.h"
#include "core/clock.h"
#include "core/multiaddr.h"
#include "dht/node.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

struct AverageArgs {
  std::vector<std::string> initial_peers;
  AccessArgs access;
  std::string listen = "/ip4/127.0.0.1/tcp/0";
  std::string prefix = "colony.avg";
  uint64_t values = 1 << 20;
  int tensors = 1;
  uint64_t seed = 0;
  double weight = 1;
  double max_weight = 1e9;
  std::string mode = "node";
  size_t target_group_size = 4;
  size_t min_group_size = 2;
  double matchmaking_time = 5;
  double timeout = 60;
  int rounds = 1;
  std::string group_bits;
  std::string codec = "none";
  size_t part_size_kib = 512;
  double bandwidth_mbps = 1000;
  double max_send_mbps = 0;
  double part_timeout = 5;
  double clip_tau = 0;
  int clip_iterations = 20;
  bool verify = false;
  std::string lie = "none";
  double start_at = 0;
  bool start_on_signal = false;
  std::string gather;
  std::string output;
  bool output_last_round_only = false;
  std::string fault = "none";
  std::string garbage;
  double share_state = -1;
  bool load_state = false;
  double linger = 0;
  std::vector<std::string> announce;
  std::vector<std::string> relays;
  std::string relay_listen;
  bool no_hole_punching = false;
};

// Set by SIGUSR1 (--start-on-signal). A handler rather than a blocked signal: any thread may take
// it, including those the libraries started before Run.
volatile sig_atomic_t start_signalled = 0;
extern "C" void OnStartSignal(int) { start_signalled = 1; }

// Waits until SIGUSR1 has arrived, or fails after `timeout` seconds.
Status WaitForStartSignal(double timeout) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  while (!start_signalled) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded(
          fmt::format("--start-on-signal: no SIGUSR1 within --timeout ({} s)", timeout));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return Status::Ok();
}

void Emit(const nlohmann::json& j) {
  std::printf("%s\n", Dump(j).c_str());
  std::fflush(stdout);
}

int Run(const AverageArgs& a) {
  auto mode = averaging::ParseMode(a.mode);
  if (!mode.ok()) return Fail(mode.status());
  auto codec = compression::ParseCodec(a.codec);
  if (!codec.ok()) return Fail(codec.status());
  auto fault = averaging::ParseFault(a.fault);
  if (!fault.ok()) return Fail(fault.status());
  if (a.start_on_signal) {
    struct sigaction action = {};
    action.sa_handler = OnStartSignal;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGUSR1, &action, nullptr) != 0)
      return Fail(Internal("--start-on-signal: cannot handle SIGUSR1"));
  }

  auto identity = LoadOrGenerateIdentity(a.access.identity);
  if (!identity.ok()) return Fail(identity.status());
  auto access = MakeSwarmAccess(a.access, identity->peer_id());
  if (!access.ok()) return Fail(access.status());
  dht::NodeOptions node_options;
  node_options.validators = {SwarmRecordRules()};
  node_options.host.access = access->control;
  node_options.initial_peers = a.initial_peers;
  node_options.relays = a.relays;
  node_options.host.hole_punching = !a.no_hole_punching;
  if (!a.relay_listen.empty()) {
    auto relay_listen = Multiaddr::Parse(a.relay_listen);
    if (!relay_listen.ok()) return Fail(relay_listen.status());
    node_options.relay_service = net::RelayOptions{};
    node_options.relay_service->listen = *relay_listen;
  }
  if (*mode == averaging::Mode::kClient || !a.relays.empty()) {
    // Behind NAT: a DHT client, reachable (when not a client averager) through its relays.
    node_options.dht.client_mode = true;
  } else {
    auto listen = Multiaddr::Parse(a.listen);
    if (!listen.ok()) return Fail(listen.status());
    node_options.listen = {*listen};
  }
  auto announce = ParseAnnounce(a.announce);
  if (!announce.ok()) return Fail(announce.status());
  node_options.announce = std::move(*announce);
  auto node = dht::Node::Start(std::move(*identity), std::move(node_options));
  if (!node.ok()) return Fail(node.status().WithContext("joining the DHT"));
  SwarmAccess swarm_access = std::move(*access);  // stops before the node goes
  swarm_access.Attach(**node);

  // Synthetic data: value i of the flattened tensors is SyntheticValues(seed)[i], unless this
  // peer is told to misbehave.
  std::vector<std::vector<float>> storage(static_cast<size_t>(a.tensors));
  std::vector<std::span<float>> tensors;
  uint64_t at = 0;
  for (int t = 0; t < a.tensors; ++t) {
    const uint64_t n = a.values / static_cast<uint64_t>(a.tensors) +
                       (static_cast<uint64_t>(t) < a.values % static_cast<uint64_t>(a.tensors));
    storage[t].resize(n);
    averaging::SyntheticValues(a.seed, at, storage[t]);
    if (a.garbage == "nan") std::fill(storage[t].begin(), storage[t].end(), NAN);
    if (a.garbage == "inf") std::fill(storage[t].begin(), storage[t].end(), INFINITY);
    if (a.garbage == "huge") std::fill(storage[t].begin(), storage[t].end(), 1e30f);
    at += n;
    tensors.push_back(storage[t]);
  }
  averaging::AveragerOptions options;
  options.prefix = a.prefix;
  options.mode = *mode;
  options.target_group_size = a.target_group_size;
  options.min_group_size = a.min_group_size;
  options.matchmaking_time = SecondsToMillis(a.matchmaking_time);
  options.group_bits = a.group_bits;
  options.codec = *codec;
  options.part_size_bytes = a.part_size_kib * 1024;
  options.bandwidth = a.bandwidth_mbps * 1e6 / 8;
  options.max_send_rate = a.max_send_mbps * 1e6 / 8;
  options.part_timeout = SecondsToMillis(a.part_timeout);
  options.max_weight = a.max_weight;
  if (a.clip_tau > 0)
    options.centered_clip = averaging::CenteredClipOptions{a.clip_tau, a.clip_iterations};
  options.testing.fault = *fault;
  options.verify = a.verify;
  if (a.lie != "none" && a.lie != "wrong-result" && a.lie != "wrong-projections") {
    return Fail(InvalidArgument("--lie must be none, wrong-result or wrong-projections, not '" +
                                a.lie + "'"));
  }
  options.testing.wrong_result = a.lie == "wrong-result";
  options.testing.wrong_projections = a.lie == "wrong-projections";
  auto averager = averaging::Averager::Create(**node, tensors, options);
  if (!averager.ok()) return Fail(averager.status());

  nlohmann::json addrs = nlohmann::json::array();
  for (const auto& m : (*node)->VisibleAddresses()) addrs.push_back(m.ToString());
  Emit({{"event", "ready"}, {"peer", (*node)->peer_id().ToString()}, {"addrs", addrs}});

  if (a.share_state >= 0) {
    auto snapshot = [&storage]() -> Result<averaging::SharedState> {
      Emit({{"event", "serving_state"}});
      averaging::SharedState s;
      s.metadata = "synthetic";
      s.tensors = storage;
      return s;
    };
    (*averager)->ShareState(snapshot, a.share_state);
  }
  if (a.start_at > 0) {
    const double wait = a.start_at - dht::Now();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  if (a.start_on_signal) {
    if (auto st = WaitForStartSignal(a.timeout); !st.ok()) return Fail(st);
  }
  if (a.load_state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto state = (*averager)->LoadStateFromPeersSync({.timeout = SecondsToMillis(a.timeout)});
    nlohmann::json j{{"event", "state"}, {"ok", state.ok()}};
    if (state.ok()) {
      uint64_t n = 0;
      bool same = true;
      std::vector<float> expect;
      for (const auto& t : state->tensors) {
        expect.resize(t.size());
        averaging::SyntheticValues(a.seed, n, expect);
        same = same && expect == t;
        n += t.size();
      }
      j["values"] = n;
      j["matches_seed"] = same;
      j["metadata"] = state->metadata;
      j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      j["error"] = state.status().ToString();
    }
    Emit(j);
  }
  bool all_ok = true;
  for (int r = 0; r < a.rounds; ++r) {
    const auto before = (*node)->host().TotalStats();
    auto result = (*averager)->StepSync(
        {.weight = a.weight,
         .gather = a.gather.empty() ? (*node)->peer_id().ToString() : a.gather,
         .timeout = SecondsToMillis(a.timeout)});
    const auto after = (*node)->host().TotalStats();
    nlohmann::json j{{"event", "round"}, {"round", r}, {"ok", result.ok()}};
    j["bytes_sent"] = after.bytes_sent - before.bytes_sent;
    j["bytes_received"] = after.bytes_received - before.bytes_received;
    if (result.ok()) {
      j["group_size"] = result->members.size();
      j["self_index"] = result->self_index;
      nlohmann::json members = nlohmann::json::array();
      for (const auto& m : result->members) {
        members.push_back({{"peer", m.peer.ToString()},
                           {"mode", averaging::ModeName(m.mode)},
                           {"gathered", m.gathered}});
      }
      j["members"] = members;
      nlohmann::json parts = nlohmann::json::array();
      for (const auto& p : result->parts) parts.push_back({p.begin, p.end, p.contributors});
      j["parts"] = parts;
      j["matchmaking_s"] = result->matchmaking_seconds;
      j["allreduce_s"] = result->allreduce_seconds;
      j["next_group_bits"] = result->next_group_bits;
      if (const auto& v = result->verification; v.performed) {
        nlohmann::json banned = nlohmann::json::array();
        for (uint32_t m : v.banned) banned.push_back(result->members[m].peer.ToString());
        nlohmann::json discarded = nlohmann::json::array();
        for (uint32_t m : v.discarded) discarded.push_back(result->members[m].peer.ToString());
        j["verification"] = {{"banned", banned},
                             {"discarded", discarded},
                             {"reasons", v.reasons},
                             {"bytes_sent", v.bytes_sent}};
      }
    } else {
      all_ok = false;
      j["error"] = result.status().ToString();
    }
    // The values are written before the round is reported, so a reader of the report finds them.
    if (!a.output.empty() && (!a.output_last_round_only || r + 1 == a.rounds)) {
      std::ofstream out(a.output, std::ios::binary | std::ios::trunc);
      for (const auto& t : storage) {
        out.write(reinterpret_cast<const char*>(t.data()),
                  static_cast<std::streamsize>(t.size() * sizeof(float)));
      }
      if (!out) return Fail("could not write " + a.output);
    }
    Emit(j);
  }
  if (a.linger > 0) std::this_thread::sleep_for(std::chrono::duration<double>(a.linger));
  Emit({{"event", "done"}, {"ok", all_ok}});
  (*averager)->Shutdown();
  return 0;
}

}  // namespace

void AddAverageCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto a = std::make_shared<AverageArgs>();
  auto* cmd = app.add_subcommand(
      "average",
      "average synthetic tensors with peers found in the DHT (prints JSON lines: ready, one per "
      "round, done)");
  cmd->add_option("--initial-peers", a->initial_peers, "multiaddr of a DHT peer (repeatable)")
      ->check(MultiaddrCheck())
      ->required();
  AddAccessOptions(cmd, a->access);
  cmd->add_option("--listen", a->listen, "address to listen on")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  AddAnnounceOption(cmd, a->announce);
  cmd->add_option("--prefix", a->prefix, "key prefix shared by the peers that average together")
      ->capture_default_str();
  cmd->add_option("--values", a->values, "float32 values to average")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--tensors", a->tensors, "split the values into this many tensors")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed of this peer's synthetic values")->capture_default_str();
  cmd->add_option("--weight", a->weight, "this peer's weight in the mean")->capture_default_str();
  cmd->add_option("--max-weight", a->max_weight,
                  "the largest weight a member may declare (a sender declaring more is excluded)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--mode", a->mode, "node, client or aux")->capture_default_str();
  cmd->add_option("--target-group-size", a->target_group_size, "peers per group")
      ->capture_default_str();
  cmd->add_option("--min-group-size", a->min_group_size, "fewest peers to average with")
      ->capture_default_str();
  cmd->add_option("--matchmaking-time", a->matchmaking_time, "seconds a leader waits for peers")
      ->capture_default_str();
  cmd->add_option("--timeout", a->timeout, "seconds per step (matchmaking and all-reduce)")
      ->capture_default_str();
  cmd->add_option("--rounds", a->rounds, "averaging steps to run")->capture_default_str();
  cmd->add_option("--group-bits", a->group_bits, "initial Moshpit group bits, e.g. 01");
  cmd->add_option("--codec", a->codec,
                  "none, fp16, bf16, scaled-fp16, uniform8, quantile8, blockwise8, blockwise4, "
                  "topk")
      ->capture_default_str();
  cmd->add_option("--part-size-kib", a->part_size_kib, "KiB of float32 data per part")
      ->check(CLI::Range(size_t{1}, size_t{65536}))
      ->capture_default_str();
  cmd->add_option("--bandwidth-mbps", a->bandwidth_mbps, "announced bandwidth (load balancing)")
      ->capture_default_str();
  cmd->add_option("--max-send-mbps", a->max_send_mbps, "pace sends to this rate (0: unlimited)")
      ->capture_default_str();
  cmd->add_option("--part-timeout", a->part_timeout,
                  "seconds without progress before a peer is excluded")
      ->capture_default_str();
  cmd->add_option("--centered-clip-tau", a->clip_tau, "reduce with CenteredClip (0: mean)");
  cmd->add_option("--centered-clip-iterations", a->clip_iterations, "CenteredClip iterations")
      ->capture_default_str();
  cmd->add_flag("--verify", a->verify,
                "after each round, check every reducer's result with the group on a shared "
                "random direction and ban cheaters (BTARD; needs --codec none)");
  cmd->add_option("--relay", a->relays,
                  "behind NAT: accept connections through this relay peer (its multiaddr; "
                  "repeatable)")
      ->check(MultiaddrCheck());
  cmd->add_option("--relay-listen", a->relay_listen,
                  "run a relay for peers behind NAT, with circuits on this address")
      ->check(MultiaddrCheck());
  cmd->add_flag("--no-hole-punching", a->no_hole_punching,
                "keep relayed connections instead of trying to replace them with direct ones");
  auto* start_at =
      cmd->add_option("--start-at", a->start_at, "wall-clock time (Unix seconds) to start at");
  cmd->add_flag("--start-on-signal", a->start_on_signal,
                "after the ready line, wait for SIGUSR1 before the first round (a script that "
                "starts many peers starts their rounds together, however slowly each started)")
      ->excludes(start_at);
  cmd->add_option("--gather", a->gather, "metadata sent to the group (default: the peer id)");
  auto* output = cmd->add_option("--output", a->output,
                                 "after each round, write the averaged values (raw float32) to "
                                 "this file");
  cmd->add_flag("--output-last-round-only", a->output_last_round_only,
                "write --output after the last round only (benchmarks: no file writes while "
                "other peers still finish a round)")
      ->needs(output);
  cmd->add_option("--inject-fault", a->fault,
                  "tests: kill-before-sending, kill-while-sending, stop-while-sending, "
                  "kill-while-reducing, stop-while-reducing, cancel-while-sending");
  cmd->add_option("--garbage", a->garbage, "tests: send nan, inf or huge values instead of data");
  cmd->add_option("--lie", a->lie,
                  "tests: with --verify, cheat as a reducer (wrong-result: return this peer's "
                  "own values) or in the checks (wrong-projections)")
      ->capture_default_str();
  cmd->add_option("--share-state", a->share_state,
                  "share this peer's values with newcomers at this priority");
  cmd->add_flag("--load-state", a->load_state, "download values from the best donor first");
  cmd->add_option("--linger", a->linger, "seconds to keep serving after the last round");
  commands.emplace_back(cmd, [a]() { return Run(*a); });
}

}  // namespace colony::cli
