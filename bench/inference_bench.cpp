// Inference benchmark: a Llama decoder served by 3 `colony serve` processes on loopback (Petals'
// setup) against the same model in this process, measured in the same run; then the same over an
// emulated WAN (the network lab) against the latency floor.
//
// A seeded random checkpoint (default: hidden 768, 12 layers, 12 heads, 4 KV heads, intermediate
// 2048, vocab 8192, about 82M parameters) is written to a temporary directory. Three servers
// split its blocks into 3 ranges; the first is the DHT bootstrap, the others join through it.
// This process is the client (a DHT client-mode node) and measures:
//   (a) decode steps: one token per step with a KV cache, after a prompt. Local: serve::
//       LocalBackend on the whole model (model::LoadLlama). Distributed: serve::RemoteBackend
//       (embeddings and head here, the blocks through an InferenceSession over the 3 servers).
//       Both include the embedding and the LM head. The two are stepped alternately, token for
//       token, so that both see the same machine; median over --steps steps after --warmup.
//   (b) forward throughput (prefill/training-style, no cache): hidden states [B, T, H] through
//       all blocks (blocks only: no embeddings, no head), locally (each model->block(i)) vs
//       serve::RemoteSequential::Forward, at batch 1 and --batch (default 64), --seq tokens.
//
// WAN phase (after the loopback one, unless --no-wan): the network lab (scripts/lab, see
// bench/lab_support.h) with hosts `client`, s1..sN in a star around its core router, every uplink
// `rate --wan-rate-mbit delay --wan-rtt-ms/4` (a packet between two hosts crosses two uplinks,
// so any two hosts are --wan-rtt-ms apart; default 100 Mbit/s and 100 ms). `colony serve` runs
// in s1..sN with the same blocks and threads as on loopback (s1 is the DHT bootstrap); this
// program runs again inside `client` (--wan-client) and steps there, alternately token for
// token: the local model (LocalBackend: the compute of a step), an InferenceSession with push
// (each server sends its output straight to the next one: the client's default) and, unless
// --wan-skip-nopush, one without push (ClientOptions.use_push = false). The floor of a step is
// compute + (servers + 1) x RTT/2: client -> s1 -> ... -> sN -> client is servers + 1 one-way
// trips (without push each server's output goes back to the client first: 2 x servers one-way
// trips). The floor uses the configured RTT; the measured one (pings over the client's
// connections to the servers) is printed too. Where the lab cannot run (not root, no network
// namespaces) the phase is skipped with the reason. The lab is torn down at the end, on errors
// and on SIGINT/SIGTERM (unless --keep-lab).
//
// Device: --device cuda puts the servers' blocks and this process's local model and client head
// on the GPU (the servers share it); hidden states still cross the network through host memory.
//
// Threads: every server and this process run LibTorch with --threads threads (default 1). A
// pipeline of servers computes one at a time, so with 1 thread each the 2 cores here are never
// oversubscribed, and the local reference gets the same single thread. With --threads > 1 the
// bench runs itself and the servers with OMP_WAIT_POLICY=PASSIVE (unless set): by default
// OpenMP workers spin after each parallel region, and a server's spinning workers then steal
// the cores from the next computation (here: the local step ran 7x slower with 2 threads).
//
// The last lines are RESULT key=value pairs (see scripts/bench): the loopback phase's end with
// inference_step_vs_local = distributed median step time / local median step time, the WAN
// phase's with inference_wan_vs_floor = distributed median step time (push) / floor.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "core/identity.h"
#include "core/log.h"
#include "core/multiaddr.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "lab_support.h"
#include "model/checkpoint.h"
#include "model/device.h"
#include "model/llama.h"
#include "serve/client.h"
#include "serve/generation.h"

using namespace colony;
namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

using colony::bench::ColonyBinary;
using colony::bench::Fixed;
using colony::bench::Lab;
using colony::bench::Median;
using colony::bench::Millis;
using colony::bench::Tail;

struct Args {
  int64_t hidden = 768, layers = 12, heads = 12, kv_heads = 4, intermediate = 2048, vocab = 8192;
  int64_t max_seq_len = 512;
  int servers = 3;
  int threads = 1;
  int prompt = 16;
  int warmup = 4;
  int steps = 32;
  int64_t batch = 64;
  int64_t seq = 16;
  int forward_reps = 3;
  double timeout = 120;        // seconds for the servers to start and be visible
  std::string device = "cpu";  // the servers' and the local model's (model/device.h)
  bool keep = false;
  uint64_t seed = 0;
  // WAN phase.
  bool no_wan = false, keep_lab = false, wan_skip_nopush = false;
  double wan_rtt_ms = 100, wan_rate_mbit = 100;
  // Internal: this process is the WAN phase's client, inside the lab.
  bool wan_client = false;
  std::string wan_model_dir, wan_model_name;
  std::vector<std::string> wan_servers;  // their addresses, s1 first
};

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "bench_inference: %s\n", message.c_str());
  std::exit(1);
}

// A benchmark of a wrong computation measures nothing: the distributed decode must give exactly
// the local logits (the same kernels on the same inputs), and forward passes the local hidden
// states up to float noise. Exits non-zero otherwise, before any RESULT line.
constexpr double kForwardTolerance = 1e-4;
void CheckAgreement(const std::string& what, double max_diff, int64_t mismatches,
                    double tolerance) {
  if (mismatches == 0 && max_diff <= tolerance) return;
  Die(what + " disagrees with the local model: max |difference| " + std::to_string(max_diff) +
      " (allowed " + std::to_string(tolerance) + "), greedy mismatches " +
      std::to_string(mismatches) + "; the timings would be of a wrong computation");
}

struct Server {
  std::string label;
  int64_t first = 0, last = 0;
  std::string stderr_path;
  std::optional<Subprocess> process;
  std::string address;  // first printed multiaddr (with /p2p/)
};

// `n` servers splitting `layers` blocks into contiguous ranges; label(i) names server i.
template <typename F>
std::vector<Server> MakeServers(int n, int64_t layers, F label) {
  std::vector<Server> servers(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& s = servers[static_cast<size_t>(i)];
    s.label = label(i);
    s.first = layers * i / n;
    s.last = layers * (i + 1) / n;
  }
  return servers;
}

// The `colony serve` command line of server `s`; `bootstrap` empty for the first server.
std::vector<std::string> ServeArgv(const Args& a, const fs::path& model_dir,
                                   const std::string& model_name, const Server& s,
                                   const std::string& listen, const std::string& bootstrap) {
  std::vector<std::string> args = {
      ColonyBinary(), "--log-level",
      "warn",         "serve",
      "--model",      model_dir.string(),
      "--model-name", model_name,
      "--blocks",     std::to_string(s.first) + ":" + std::to_string(s.last),
      "--listen",     listen,
      "--threads",    std::to_string(a.threads),
      "--device",     a.device};
  if (!bootstrap.empty()) {
    args.push_back("--initial-peers");
    args.push_back(bootstrap);
  }
  return args;
}

// Starts server `s` as `argv`; the error, or empty.
std::string Spawn(Server& s, const std::vector<std::string>& argv) {
  auto p = Subprocess::Spawn(argv, s.stderr_path);
  if (!p.ok()) return s.label + ": " + p.status().ToString();
  s.process.emplace(std::move(*p));
  return {};
}

// Reads the address server `s` prints when it is up; the error, or empty.
std::string ReadAddress(Server& s, Steady::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now());
  auto line = s.process->ReadLine(std::max(left, std::chrono::milliseconds(1)));
  if (!line.ok()) {
    return s.label + " did not print its address: " + line.status().ToString() +
           Tail(s.stderr_path);
  }
  s.address = *line;
  return {};
}

// SIGTERM (the server announces itself offline and exits), then SIGKILL if it lingers.
void Stop(Server& s) {
  if (!s.process || !s.process->running()) return;
  s.process->Signal(SIGTERM);
  auto code = s.process->Wait(std::chrono::seconds(15));
  if (!code.ok()) {
    std::fprintf(stderr, "%s did not exit after SIGTERM; killing it\n", s.label.c_str());
    s.process->Signal(SIGKILL);
    (void)s.process->Wait(std::chrono::seconds(5));
  } else if (*code != 0) {
    std::fprintf(stderr, "%s exited with %d%s\n", s.label.c_str(), *code,
                 Tail(s.stderr_path).c_str());
  }
}

// Every server's record for `model_name` is visible to the client, or the deadline passes.
bool WaitForServers(serve::SequenceManager& manager, const std::vector<Server>& servers,
                    Steady::time_point deadline) {
  while (Steady::now() < deadline) {
    (void)manager.Refresh();
    auto known = manager.Servers();
    size_t found = 0;
    for (const auto& s : servers) {
      for (const auto& r : known) {
        if (s.address.ends_with("/p2p/" + r.peer.ToString()) && r.start == s.first &&
            r.end == s.last) {
          ++found;
          break;
        }
      }
    }
    if (found == servers.size()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// ---- decode steps ----------------------------------------------------------------------------

struct RemoteDecode {
  double step_s = 0;  // median
  double max_diff = 0;
  int64_t mismatches = 0;
};

struct DecodeResult {
  double local_s = 0;  // median
  std::vector<RemoteDecode> remote;
};

// A --prompt-token prompt, then --warmup + --steps greedy steps of one token: the local backend
// and each remote one stepped alternately, token for token (the local model chooses the
// tokens). Medians over the timed steps; the largest logit difference of each remote backend
// from the local one (the prompt included) and its greedy mismatches.
DecodeResult MeasureDecode(const Args& a, int64_t vocab, serve::LocalBackend& local,
                           const std::vector<serve::DecoderBackend*>& remotes,
                           const std::vector<std::string>& names) {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> prompt;
  for (int i = 0; i < a.prompt; ++i) prompt.push_back((i * 37 + 11) % vocab);
  at::Tensor prompt_tokens = at::tensor(prompt, long_opts).unsqueeze(0);
  DecodeResult out;
  out.remote.resize(remotes.size());
  auto lp = local.Step(prompt_tokens, 0, {}, serve::StepLogits::kAll);
  if (!lp.ok()) Die("local prompt: " + lp.status().ToString());
  for (size_t k = 0; k < remotes.size(); ++k) {
    auto rp = remotes[k]->Step(prompt_tokens, 0, {}, serve::StepLogits::kAll);
    if (!rp.ok()) Die(names[k] + " prompt: " + rp.status().ToString());
    out.remote[k].max_diff = (*lp - *rp).abs().max().item<double>();
  }
  int64_t token = lp->select(1, -1).argmax(-1).item<int64_t>();
  std::vector<double> local_steps;
  std::vector<std::vector<double>> remote_steps(remotes.size());
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    at::Tensor t = at::full({1, 1}, token, long_opts);
    auto t0 = Steady::now();
    auto l = local.Step(t, local.position(), {}, serve::StepLogits::kLast);
    const double ls = Seconds(Steady::now() - t0);
    if (!l.ok()) Die("local step: " + l.status().ToString());
    const int64_t next = l->select(1, -1).argmax(-1).item<int64_t>();  // greedy, chosen locally
    for (size_t k = 0; k < remotes.size(); ++k) {
      t0 = Steady::now();
      auto r = remotes[k]->Step(t, remotes[k]->position(), {}, serve::StepLogits::kLast);
      const double rs = Seconds(Steady::now() - t0);
      if (!r.ok()) Die(names[k] + " step: " + r.status().ToString());
      auto& o = out.remote[k];
      o.max_diff = std::max(o.max_diff, (*l - *r).abs().max().item<double>());
      o.mismatches += r->select(1, -1).argmax(-1).item<int64_t>() != next;
      if (i >= a.warmup) remote_steps[k].push_back(rs);
    }
    token = next;
    if (i >= a.warmup) local_steps.push_back(ls);
  }
  out.local_s = Median(local_steps);
  for (size_t k = 0; k < remotes.size(); ++k) out.remote[k].step_s = Median(remote_steps[k]);
  return out;
}

// Hidden states [B, T, H] through every block of the local model.
at::Tensor LocalBlocks(model::LlamaModel& m, at::Tensor h) {
  for (int64_t i = 0; i < m->num_blocks(); ++i) h = m->block(i)->forward(h);
  return h;
}

struct ForwardResult {
  double local_s = 0, remote_s = 0, max_diff = 0;
};

ForwardResult MeasureForward(model::LlamaModel& local, serve::RemoteSequential& remote,
                             int64_t batch, int64_t seq, int reps) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + batch);
  const c10::Device device = model::DeviceOf(*local);
  at::Tensor x = at::randn({batch, seq, local->config().hidden_size}, gen).to(device);
  std::vector<double> lt, rt;
  at::Tensor lo, ro;
  for (int i = 0; i <= reps; ++i) {  // the first of each is a warm-up
    auto t0 = Steady::now();
    lo = LocalBlocks(local, x);
    model::Synchronize(device);
    const double l = Seconds(Steady::now() - t0);
    t0 = Steady::now();
    auto r = remote.Forward(x);
    const double s = Seconds(Steady::now() - t0);
    if (!r.ok()) Die("remote forward failed: " + r.status().ToString());
    ro = *r;
    if (i > 0) {
      lt.push_back(l);
      rt.push_back(s);
    }
  }
  return {Median(lt), Median(rt), (lo - ro).abs().max().item<double>()};
}

// ---- loopback phase --------------------------------------------------------------------------

void RunLoopback(const Args& a, const fs::path& model_dir, const std::string& model_name,
                 const fs::path& dir) {
  // The first server is the DHT bootstrap, the others join through it.
  auto servers =
      MakeServers(a.servers, a.layers, [](int i) { return "server " + std::to_string(i); });
  for (size_t i = 0; i < servers.size(); ++i) {
    servers[i].stderr_path = (dir / ("server" + std::to_string(i) + ".err")).string();
  }
  const auto deadline = Steady::now() + Millis(a.timeout);
  const std::string listen = "/ip4/127.0.0.1/tcp/0";
  auto check = [](const std::string& error) {
    if (!error.empty()) Die(error);
  };
  const auto t_start = Steady::now();
  check(Spawn(servers[0], ServeArgv(a, model_dir, model_name, servers[0], listen, "")));
  check(ReadAddress(servers[0], deadline));
  for (size_t i = 1; i < servers.size(); ++i) {
    check(Spawn(servers[i],
                ServeArgv(a, model_dir, model_name, servers[i], listen, servers[0].address)));
  }
  for (size_t i = 1; i < servers.size(); ++i) check(ReadAddress(servers[i], deadline));
  for (const auto& s : servers) {
    std::printf("%s: blocks [%lld, %lld) at %s\n", s.label.c_str(), static_cast<long long>(s.first),
                static_cast<long long>(s.last), s.address.c_str());
  }

  // ---- client
  dht::NodeOptions node_options;
  node_options.initial_peers = {servers[0].address};
  node_options.dht.client_mode = true;
  auto node = dht::Node::Start(KeyPair::Generate(), node_options);
  if (!node.ok()) Die("client DHT node: " + node.status().ToString());
  auto manager = std::make_shared<serve::SequenceManager>(
      **node, serve::ClientOptions{.model_name = model_name, .num_blocks = a.layers});
  if (!WaitForServers(*manager, servers, deadline)) {
    Die("the servers' records did not all become visible in time");
  }
  std::printf("servers up and visible in %.1f s; %d LibTorch thread(s) per server and locally\n",
              Seconds(Steady::now() - t_start), a.threads);

  auto device = model::ParseDevice(a.device);
  if (!device.ok()) Die("--device: " + device.status().ToString());
  auto local = model::LoadLlama(model_dir);
  if (!local.ok()) Die("loading the model: " + local.status().ToString());
  (*local)->to(*device);
  auto head = serve::LoadClientModel(model_dir, *device);
  if (!head.ok()) Die("loading the client model: " + head.status().ToString());
  std::printf("the servers and the local model compute on %s\n", device->str().c_str());

  // ---- (a) decode steps, local and distributed alternately.
  const int64_t max_length = a.prompt + a.warmup + a.steps;
  serve::RemoteSequential remote(manager);
  auto session = remote.OpenSession({.max_length = max_length, .batch_size = 1});
  serve::LocalBackend local_backend(*local);
  serve::RemoteBackend remote_backend(*head, *session, max_length);
  const DecodeResult d =
      MeasureDecode(a, a.vocab, local_backend, {&remote_backend}, {"distributed"});
  const auto& stats = session->stats();
  session->Close();
  const double local_step = d.local_s, remote_step = d.remote[0].step_s;
  std::printf(
      "decode, 1 token per step after a %d-token prompt (median of %d steps after %d "
      "warm-up; embeddings and LM head included in both):\n",
      a.prompt, a.steps, a.warmup);
  std::printf("  local (LocalBackend, whole model):         %8.2f ms/step  (%.1f tokens/s)\n",
              local_step * 1e3, 1 / local_step);
  std::printf("  distributed (RemoteBackend, %zu servers):    %8.2f ms/step  (%.1f tokens/s)\n",
              stats.route.size(), remote_step * 1e3, 1 / remote_step);
  std::printf(
      "  overhead per step %.2f ms; max |logit difference| %.2e; greedy mismatches %lld; "
      "failovers %lld\n",
      (remote_step - local_step) * 1e3, d.remote[0].max_diff,
      static_cast<long long>(d.remote[0].mismatches), static_cast<long long>(stats.failovers));

  // ---- (b) forward throughput through all blocks (no embeddings, no head, no cache).
  std::printf(
      "forward, hidden states through all %lld blocks (blocks only), %lld tokens per "
      "sequence (median of %d after 1 warm-up):\n",
      static_cast<long long>(a.layers), static_cast<long long>(a.seq), a.forward_reps);
  std::vector<std::pair<int64_t, ForwardResult>> forwards;
  for (int64_t b : {int64_t{1}, a.batch}) {
    const int reps = b == 1 ? std::max(a.forward_reps, 8) : a.forward_reps;
    ForwardResult f = MeasureForward(*local, remote, b, a.seq, reps);
    const double tokens = static_cast<double>(b * a.seq);
    std::printf(
        "  batch %3lld: local %9.1f tokens/s (%.3f s), distributed %9.1f tokens/s "
        "(%.3f s); max |difference| %.2e\n",
        static_cast<long long>(b), tokens / f.local_s, f.local_s, tokens / f.remote_s, f.remote_s,
        f.max_diff);
    forwards.emplace_back(b, f);
  }

  for (auto& s : servers) Stop(s);
  (*node)->Shutdown();

  CheckAgreement("the distributed decode", d.remote[0].max_diff, d.remote[0].mismatches, 0.0);
  for (const auto& [b, f] : forwards) {
    CheckAgreement("the distributed forward at batch " + std::to_string(b), f.max_diff, 0,
                   kForwardTolerance);
  }
  for (const auto& [b, f] : forwards) {
    std::printf("RESULT forward_b%lld_time_vs_local=%.3f\n", static_cast<long long>(b),
                f.remote_s / f.local_s);
  }
  std::printf("RESULT inference_step_vs_local=%.3f\n", remote_step / local_step);
  std::fflush(stdout);
}

// ---- WAN phase: the client, inside the lab's `client` host (--wan-client) ---------------------

// Prints its report, then RESULT lines; exits non-zero (Die) on failure.
int RunWanClient(const Args& a) {
  // COLONY_LOG overrides (e.g. COLONY_LOG=info to see failovers).
  (void)InitLogging(std::getenv("COLONY_LOG") != nullptr ? "" : "warn");
  at::set_num_threads(a.threads);
  const auto deadline = Steady::now() + Millis(a.timeout);
  if (a.wan_servers.empty()) Die("--wan-client needs --wan-servers");
  auto local = model::LoadLlama(a.wan_model_dir);
  if (!local.ok()) Die("loading the model: " + local.status().ToString());
  auto head = serve::LoadClientModel(a.wan_model_dir);
  if (!head.ok()) Die("loading the client model: " + head.status().ToString());
  const model::LlamaConfig& config = (*local)->config();

  auto servers = MakeServers(static_cast<int>(a.wan_servers.size()), config.num_layers,
                             [](int i) { return "s" + std::to_string(i + 1); });
  for (size_t i = 0; i < servers.size(); ++i) servers[i].address = a.wan_servers[i];
  dht::NodeOptions node_options;
  node_options.initial_peers = {servers[0].address};
  node_options.dht.client_mode = true;
  auto node = dht::Node::Start(KeyPair::Generate(), node_options);
  if (!node.ok()) Die("client DHT node: " + node.status().ToString());
  serve::ClientOptions push_options{.model_name = a.wan_model_name,
                                    .num_blocks = config.num_layers};
  serve::ClientOptions nopush_options = push_options;
  nopush_options.use_push = false;
  auto push_manager = std::make_shared<serve::SequenceManager>(**node, push_options);
  auto nopush_manager = std::make_shared<serve::SequenceManager>(**node, nopush_options);
  if (!WaitForServers(*push_manager, servers, deadline)) {
    Die("the servers' records did not all become visible in time");
  }

  // The RTT as the client's connections see it (after connecting: pings only).
  std::vector<double> rtts;
  std::string per_server;
  for (const auto& s : servers) {
    auto addr = Multiaddr::Parse(s.address);
    if (!addr.ok()) Die(s.label + ": bad address " + s.address);
    (void)(*node)->host().PingSync(*addr);  // connects
    std::vector<double> mine;
    for (int k = 0; k < 5; ++k) {
      auto ping = (*node)->host().PingSync(*addr);
      if (ping.ok()) mine.push_back(std::chrono::duration<double>(ping->rtt).count());
    }
    if (mine.empty()) Die("cannot ping " + s.label + " at " + s.address);
    rtts.insert(rtts.end(), mine.begin(), mine.end());
    per_server += (per_server.empty() ? "" : ", ") + s.label + " " + Fixed(Median(mine) * 1e3, 1);
  }
  const double measured_rtt = Median(rtts);
  std::printf(
      "  measured RTT client <-> servers (5 pings each over the connections): median "
      "%.1f ms (%s ms)\n",
      measured_rtt * 1e3, per_server.c_str());
  std::fflush(stdout);

  const int64_t max_length = a.prompt + a.warmup + a.steps;
  serve::RemoteSequential push_remote(push_manager), nopush_remote(nopush_manager);
  auto push_session = push_remote.OpenSession({.max_length = max_length, .batch_size = 1});
  auto nopush_session = nopush_remote.OpenSession({.max_length = max_length, .batch_size = 1});
  serve::LocalBackend local_backend(*local);
  serve::RemoteBackend push_backend(*head, *push_session, max_length);
  serve::RemoteBackend nopush_backend(*head, *nopush_session, max_length);
  std::vector<serve::DecoderBackend*> remotes = {&push_backend};
  std::vector<std::string> names = {"distributed (push)"};
  if (!a.wan_skip_nopush) {
    remotes.push_back(&nopush_backend);
    names.push_back("distributed (no push)");
  }
  const DecodeResult d = MeasureDecode(a, config.vocab_size, local_backend, remotes, names);
  const auto push_stats = push_session->stats();
  const auto nopush_stats = nopush_session->stats();
  push_session->Close();
  nopush_session->Close();
  (*node)->Shutdown();

  const double hops = static_cast<double>(push_stats.route.size()) + 1;
  const double floor_s = d.local_s + hops * a.wan_rtt_ms / 1e3 / 2;
  const double nopush_floor_s =
      d.local_s + 2 * static_cast<double>(push_stats.route.size()) * a.wan_rtt_ms / 1e3 / 2;
  std::printf(
      "  decode, 1 token per step after a %d-token prompt (median of %d steps after %d "
      "warm-up), stepped alternately in the client host:\n",
      a.prompt, a.steps, a.warmup);
  std::printf("    local compute (LocalBackend, whole model): %8.2f ms/step  (%6.2f steps/s)\n",
              d.local_s * 1e3, 1 / d.local_s);
  auto show = [&](const std::string& name, const RemoteDecode& r, const serve::SessionStats& st) {
    std::printf(
        "    %-41s %8.2f ms/step  (%6.2f steps/s); %.2f x floor; max |logit difference| "
        "%.2e; greedy mismatches %lld; %zu servers; failovers %lld\n",
        (name + ":").c_str(), r.step_s * 1e3, 1 / r.step_s, r.step_s / floor_s, r.max_diff,
        static_cast<long long>(r.mismatches), st.route.size(),
        static_cast<long long>(st.failovers));
  };
  show("distributed, push", d.remote[0], push_stats);
  if (d.remote.size() > 1) show("distributed, no push", d.remote[1], nopush_stats);
  std::printf(
      "    floor = compute + (servers + 1) x RTT/2 = %.2f + %.0f x %.1f = %.2f ms/step "
      "(%.2f steps/s); without push a step needs at least %.2f ms (2 x servers x "
      "RTT/2)\n",
      d.local_s * 1e3, hops, a.wan_rtt_ms / 2, floor_s * 1e3, 1 / floor_s, nopush_floor_s * 1e3);
  std::printf("    push saves %.2f ms per step (%.1f RTT/2; ideal: %.0f)\n",
              d.remote.size() > 1 ? (d.remote[1].step_s - d.remote[0].step_s) * 1e3 : 0.0,
              d.remote.size() > 1
                  ? (d.remote[1].step_s - d.remote[0].step_s) / (a.wan_rtt_ms / 1e3 / 2)
                  : 0.0,
              hops - 2);
  CheckAgreement("the distributed decode with push", d.remote[0].max_diff, d.remote[0].mismatches,
                 0.0);
  if (d.remote.size() > 1) {
    CheckAgreement("the distributed decode without push", d.remote[1].max_diff,
                   d.remote[1].mismatches, 0.0);
  }
  std::printf("RESULT inference_wan_rtt_ms=%.1f\n", measured_rtt * 1e3);
  if (d.remote.size() > 1) {
    std::printf("RESULT inference_wan_nopush_vs_floor=%.3f\n", d.remote[1].step_s / floor_s);
  }
  std::printf("RESULT inference_wan_vs_floor=%.3f\n", d.remote[0].step_s / floor_s);
  std::fflush(stdout);
  return 0;
}

// ---- WAN phase: the lab and the servers (this process, outside the lab) -----------------------

// Runs the WAN phase; prints its report and, last, its RESULT lines (or why they are missing).
// 0 when it ran or was skipped, 1 when it failed.
int RunWan(const Args& a, const fs::path& model_dir, const std::string& model_name,
           const fs::path& dir) {
  std::printf(
      "\nWAN: %d servers and the client on separate lab hosts, every uplink %s Mbit/s "
      "and %s ms one way (%s ms RTT between any two hosts)\n",
      a.servers, Fixed(a.wan_rate_mbit, 1).c_str(), Fixed(a.wan_rtt_ms / 4, 2).c_str(),
      Fixed(a.wan_rtt_ms, 1).c_str());
  std::fflush(stdout);
  auto unavailable = [](const std::string& why) {
    std::printf("(RESULT inference_wan_vs_floor not available: %s)\n", why.c_str());
    std::fflush(stdout);
  };
  if (const std::string why = colony::bench::CannotRunLab(dir.string()); !why.empty()) {
    std::printf("WAN phase skipped: %s\n", why.c_str());
    unavailable("WAN phase skipped");
    return 0;
  }
  colony::bench::UseLabLinkNextToColony();

  const std::string name = "inf" + std::to_string(::getpid() % 100000);
  const std::string link =
      " rate " + Fixed(a.wan_rate_mbit, 3) + "mbit delay " + Fixed(a.wan_rtt_ms / 4, 3) + "ms\n";
  std::string topology = "# bench_inference: the client and " + std::to_string(a.servers) +
                         " servers\nhost client" + link;
  for (int i = 1; i <= a.servers; ++i) topology += "host s" + std::to_string(i) + link;

  std::vector<std::string> results;  // the client's RESULT lines, printed last
  std::string error;
  int client_code = -1;
  {
    Lab lab(name, dir.string(), a.keep_lab);
    const auto t0 = Steady::now();
    error = lab.Up(topology);
    if (!error.empty()) {
      std::printf("WAN phase FAILED: %s\n", error.c_str());
      unavailable("the lab did not come up");
      return 1;
    }
    std::printf("  lab %s up in %.1f s (client %s)\n", name.c_str(), Seconds(Steady::now() - t0),
                lab.addr("client").c_str());
    std::fflush(stdout);

    auto servers =
        MakeServers(a.servers, a.layers, [](int i) { return "s" + std::to_string(i + 1); });
    for (auto& s : servers) s.stderr_path = (dir / ("wan-" + s.label + ".err")).string();
    const auto deadline = Steady::now() + Millis(a.timeout);
    auto listen = [&](const Server& s) { return "/ip4/" + lab.addr(s.label) + "/tcp/0"; };
    auto start = [&](Server& s, const std::string& bootstrap) {
      return Spawn(s,
                   lab.In(s.label, ServeArgv(a, model_dir, model_name, s, listen(s), bootstrap)));
    };
    const auto t_start = Steady::now();
    error = start(servers[0], "");
    if (error.empty()) error = ReadAddress(servers[0], deadline);
    for (size_t i = 1; i < servers.size() && error.empty(); ++i) {
      error = start(servers[i], servers[0].address);
    }
    for (size_t i = 1; i < servers.size() && error.empty(); ++i) {
      error = ReadAddress(servers[i], deadline);
    }
    if (error.empty()) {
      std::vector<std::string> addresses;
      for (const auto& s : servers) {
        std::printf("  %s: blocks [%lld, %lld) at %s\n", s.label.c_str(),
                    static_cast<long long>(s.first), static_cast<long long>(s.last),
                    s.address.c_str());
        addresses.push_back(s.address);
      }
      std::printf("  servers up in %.1f s\n", Seconds(Steady::now() - t_start));
      std::fflush(stdout);

      std::string joined;
      for (const auto& s : addresses) joined += (joined.empty() ? "" : ",") + s;
      std::vector<std::string> argv = {SelfExecutable(),   "--wan-client",
                                       "--wan-model-dir",  model_dir.string(),
                                       "--wan-model-name", model_name,
                                       "--wan-servers",    joined,
                                       "--threads",        std::to_string(a.threads),
                                       "--prompt",         std::to_string(a.prompt),
                                       "--warmup",         std::to_string(a.warmup),
                                       "--steps",          std::to_string(a.steps),
                                       "--timeout",        Fixed(a.timeout),
                                       "--wan-rtt-ms",     Fixed(a.wan_rtt_ms, 3)};
      if (a.wan_skip_nopush) argv.push_back("--wan-skip-nopush");
      const std::string client_err = (dir / "wan-client.err").string();
      auto client = Subprocess::Spawn(lab.In("client", argv), client_err);
      if (!client.ok()) {
        error = "the client: " + client.status().ToString();
      } else {
        // Generous: the servers' visibility, then every step at 20x the floor.
        const double floor_guess = 0.2 + (a.servers + 1) * a.wan_rtt_ms / 2e3;
        const auto client_deadline =
            Steady::now() +
            Millis(a.timeout + 60 + (a.warmup + a.steps + 2) * 3 * 20 * floor_guess);
        Status st = colony::bench::ReadUntil(*client, client_deadline, [&](const std::string& l) {
          if (l.starts_with("RESULT ")) {
            results.push_back(l);
          } else {
            std::printf("%s\n", l.c_str());
            std::fflush(stdout);
          }
          return false;
        });
        if (st.code() != StatusCode::kNotFound) {
          error = "the client did not finish in time: " + st.ToString();
          client->Signal(SIGKILL);
        }
        auto code = client->Wait(std::chrono::seconds(10));
        client_code = code.ok() ? *code : -1;
        if (error.empty() && client_code != 0) {
          error = "the client exited with " + std::to_string(client_code) + Tail(client_err);
        }
      }
    }
    for (auto& s : servers) Stop(s);
  }  // ~Lab tears it down
  if (!error.empty()) std::printf("WAN phase FAILED: %s\n", error.c_str());
  for (const auto& l : results) std::printf("%s\n", l.c_str());
  const bool headline =
      !results.empty() && results.back().starts_with("RESULT inference_wan_vs_floor=");
  if (!headline)
    unavailable(error.empty() ? "the client printed no result" : "the WAN phase failed");
  std::fflush(stdout);
  return headline && error.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Inference through `colony serve` processes (3 by default) vs the same model "
      "locally, on loopback and in the network lab (WAN)"};
  app.add_option("--hidden", a.hidden, "hidden size")->capture_default_str();
  app.add_option("--layers", a.layers, "transformer blocks")->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads")->capture_default_str();
  app.add_option("--kv-heads", a.kv_heads, "key/value heads")->capture_default_str();
  app.add_option("--intermediate", a.intermediate, "MLP size")->capture_default_str();
  app.add_option("--vocab", a.vocab, "vocabulary size")->capture_default_str();
  app.add_option("--servers", a.servers, "server processes (block ranges)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--threads", a.threads, "LibTorch threads per server and for the local model")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--prompt", a.prompt, "prompt tokens before the decode steps")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed decode steps")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--steps", a.steps, "timed decode steps (median)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--batch", a.batch, "large forward batch (the servers accept up to 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per sequence in the forward measurements")
      ->check(CLI::Range(int64_t{1}, int64_t{512}))
      ->capture_default_str();
  app.add_option("--forward-reps", a.forward_reps, "timed forward passes per case (median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--timeout", a.timeout, "seconds for the servers to start")->capture_default_str();
  app.add_option("--seed", a.seed, "weights seed")->capture_default_str();
  app.add_option("--device", a.device,
                 "where the servers and the local reference compute: cpu, cuda, cuda:N or auto")
      ->capture_default_str();
  app.add_flag("--keep", a.keep, "keep the temporary directory (checkpoint, server logs)");
  app.add_flag("--no-wan", a.no_wan, "skip the WAN phase (the network lab)");
  app.add_option("--wan-rtt-ms", a.wan_rtt_ms,
                 "WAN: RTT between any two lab hosts, ms (one-way delay per uplink: RTT/4)")
      ->check(CLI::Range(0.1, 2000.0))
      ->capture_default_str();
  app.add_option("--wan-rate-mbit", a.wan_rate_mbit, "WAN: rate of every uplink, Mbit/s")
      ->check(CLI::Range(0.1, 10000.0))
      ->capture_default_str();
  app.add_flag("--wan-skip-nopush", a.wan_skip_nopush,
               "WAN: measure only the session with push (not also one without)");
  app.add_flag("--keep-lab", a.keep_lab, "WAN: leave the lab up at the end (debugging)");
  // Internal: the WAN client, run by this program inside the lab. Hidden (empty group).
  app.add_flag("--wan-client", a.wan_client, "internal: run as the WAN client")->group("");
  app.add_option("--wan-model-dir", a.wan_model_dir, "internal: the checkpoint")->group("");
  app.add_option("--wan-model-name", a.wan_model_name, "internal: the model's name")->group("");
  app.add_option("--wan-servers", a.wan_servers, "internal: the servers' addresses")
      ->delimiter(',')
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (a.threads > 1 && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    // libgomp reads the policy when it loads: set it and start again (the servers inherit it).
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    const std::string self = SelfExecutable();
    ::execv(self.c_str(), argv);
    Die("cannot re-run " + self + " with OMP_WAIT_POLICY=PASSIVE");
  }
  if (a.wan_client) return RunWanClient(a);
  // Before any other thread: SIGINT/SIGTERM/SIGHUP tear down the lab and remove the directory.
  colony::bench::StartSignalThread("bench_inference");
  if (a.layers < a.servers) Die("need at least one block per server");
  // COLONY_LOG overrides (e.g. COLONY_LOG=info to see failovers).
  (void)InitLogging(std::getenv("COLONY_LOG") != nullptr ? "" : "warn");
  at::set_num_threads(a.threads);

  model::LlamaConfig config;
  config.vocab_size = a.vocab;
  config.hidden_size = a.hidden;
  config.intermediate_size = a.intermediate;
  config.num_layers = a.layers;
  config.num_heads = a.heads;
  config.num_kv_heads = a.kv_heads;
  config.max_seq_len = a.max_seq_len;
  if (Status st = config.Validate(); !st.ok()) Die("bad model config: " + st.ToString());
  const int64_t max_length = a.prompt + a.warmup + a.steps;
  if (max_length > config.max_seq_len || a.seq > config.max_seq_len) {
    Die("--prompt + --warmup + --steps and --seq must fit in max_seq_len " +
        std::to_string(config.max_seq_len));
  }

  colony::test::TempDir tmp("inference-bench");
  if (a.keep) {
    tmp.keep();
  } else {
    colony::bench::SetScratchDir(tmp.path().string());
  }
  const fs::path model_dir = tmp.path() / "llama";
  const std::string model_name = "bench-llama-" + std::to_string(::getpid());
  {
    const auto t0 = Steady::now();
    at::manual_seed(a.seed);
    model::LlamaModel m(config);
    if (Status st = model::SaveLlama(model_dir, m); !st.ok()) Die(st.ToString());
    std::printf(
        "model: hidden %lld, %lld layers, %lld heads (%lld KV), intermediate %lld, vocab "
        "%lld: %.1fM parameters (%.2f s to create and save)\n",
        static_cast<long long>(a.hidden), static_cast<long long>(a.layers),
        static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads),
        static_cast<long long>(a.intermediate), static_cast<long long>(a.vocab),
        static_cast<double>(config.NumParameters()) / 1e6, Seconds(Steady::now() - t0));
  }

  RunLoopback(a, model_dir, model_name, tmp.path());
  if (a.no_wan) return 0;
  return RunWan(a, model_dir, model_name, tmp.path());
}
