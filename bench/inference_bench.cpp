// Inference benchmark: a Llama decoder served by 3 `colony serve` processes on loopback (Petals'
// setup) against the same model in this process, measured in the same run.
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
// Threads: every server and this process run LibTorch with --threads threads (default 1). A
// pipeline of servers computes one at a time, so with 1 thread each the 2 cores here are never
// oversubscribed, and the local reference gets the same single thread. With --threads > 1 the
// bench runs itself and the servers with OMP_WAIT_POLICY=PASSIVE (unless set): by default
// OpenMP workers spin after each parallel region, and a server's spinning workers then steal
// the cores from the next computation (here: the local step ran 7x slower with 2 threads).
//
// The last lines are RESULT key=value pairs (see scripts/bench); the final one is
// inference_step_vs_local = distributed median step time / local median step time.
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

#include "core/identity.h"
#include "core/log.h"
#include "bench_support.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "serve/client.h"
#include "serve/generation.h"

using namespace colony;
namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

using colony::bench::ColonyBinary;
using colony::bench::Median;
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
  double timeout = 120;  // seconds for the servers to start and be visible
  bool keep = false;
  uint64_t seed = 0;
};

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "bench_inference: %s\n", message.c_str());
  std::exit(1);
}

// A temporary directory removed (with the checkpoint and the servers' logs) on scope exit.
struct TempDir {
  fs::path path;
  bool keep = false;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "colony-inference-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) Die("cannot create a temporary directory");
    path = tmpl;
  }
  ~TempDir() {
    if (keep) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

struct Server {
  std::string label;
  int64_t first = 0, last = 0;
  std::string stderr_path;
  std::optional<Subprocess> process;
  std::string address;  // first printed multiaddr (with /p2p/)
};

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
  at::Tensor x = at::randn({batch, seq, local->config().hidden_size}, gen);
  std::vector<double> lt, rt;
  at::Tensor lo, ro;
  for (int i = 0; i <= reps; ++i) {  // the first of each is a warm-up
    auto t0 = Steady::now();
    lo = LocalBlocks(local, x);
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

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Inference through `colony serve` processes (3 by default) vs the same model "
               "locally"};
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
  app.add_flag("--keep", a.keep, "keep the temporary directory (checkpoint, server logs)");
  CLI11_PARSE(app, argc, argv);
  if (a.threads > 1 && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    // libgomp reads the policy when it loads: set it and start again (the servers inherit it).
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    const std::string self = SelfExecutable();
    ::execv(self.c_str(), argv);
    Die("cannot re-run " + self + " with OMP_WAIT_POLICY=PASSIVE");
  }
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

  TempDir tmp;
  tmp.keep = a.keep;
  const fs::path model_dir = tmp.path / "llama";
  const std::string model_name = "bench-llama-" + std::to_string(::getpid());
  {
    const auto t0 = Steady::now();
    at::manual_seed(a.seed);
    model::LlamaModel m(config);
    if (Status st = model::SaveLlama(model_dir, m); !st.ok()) Die(st.ToString());
    std::printf("model: hidden %lld, %lld layers, %lld heads (%lld KV), intermediate %lld, vocab "
                "%lld: %.1fM parameters (%.2f s to create and save)\n",
                static_cast<long long>(a.hidden), static_cast<long long>(a.layers),
                static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads),
                static_cast<long long>(a.intermediate), static_cast<long long>(a.vocab),
                static_cast<double>(config.NumParameters()) / 1e6, Seconds(Steady::now() - t0));
  }

  // ---- servers: the first is the DHT bootstrap, the others join through it.
  std::vector<Server> servers(static_cast<size_t>(a.servers));
  for (int i = 0; i < a.servers; ++i) {
    auto& s = servers[static_cast<size_t>(i)];
    s.label = "server " + std::to_string(i);
    s.first = a.layers * i / a.servers;
    s.last = a.layers * (i + 1) / a.servers;
    s.stderr_path = (tmp.path / ("server" + std::to_string(i) + ".err")).string();
  }
  const auto deadline = Steady::now() + std::chrono::milliseconds(static_cast<int64_t>(a.timeout * 1000));
  auto spawn = [&](Server& s, const std::string& bootstrap) {
    std::vector<std::string> args = {ColonyBinary(), "--log-level", "warn", "serve", "--model",
                                     model_dir.string(), "--model-name", model_name, "--blocks",
                                     std::to_string(s.first) + ":" + std::to_string(s.last),
                                     "--listen", "/ip4/127.0.0.1/tcp/0", "--threads",
                                     std::to_string(a.threads)};
    if (!bootstrap.empty()) {
      args.push_back("--initial-peers");
      args.push_back(bootstrap);
    }
    auto p = Subprocess::Spawn(args, s.stderr_path);
    if (!p.ok()) Die(s.label + ": " + p.status().ToString());
    s.process.emplace(std::move(*p));
  };
  auto read_address = [&](Server& s) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now());
    auto line = s.process->ReadLine(std::max(left, std::chrono::milliseconds(1)));
    if (!line.ok()) {
      Die(s.label + " did not print its address: " + line.status().ToString() +
          Tail(s.stderr_path));
    }
    s.address = *line;
  };
  const auto t_start = Steady::now();
  spawn(servers[0], "");
  read_address(servers[0]);
  for (size_t i = 1; i < servers.size(); ++i) spawn(servers[i], servers[0].address);
  for (size_t i = 1; i < servers.size(); ++i) read_address(servers[i]);
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

  auto local = model::LoadLlama(model_dir);
  if (!local.ok()) Die("loading the model: " + local.status().ToString());
  auto head = serve::LoadClientModel(model_dir);
  if (!head.ok()) Die("loading the client model: " + head.status().ToString());

  // ---- (a) decode steps, local and distributed alternately.
  serve::RemoteSequential remote(manager);
  auto session = remote.OpenSession({.max_length = max_length, .batch_size = 1});
  serve::LocalBackend local_backend(*local);
  serve::RemoteBackend remote_backend(*head, *session, max_length);
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> prompt;
  for (int i = 0; i < a.prompt; ++i) prompt.push_back((i * 37 + 11) % a.vocab);
  at::Tensor prompt_tokens = at::tensor(prompt, long_opts).unsqueeze(0);
  auto lp = local_backend.Step(prompt_tokens, 0, {});
  auto rp = remote_backend.Step(prompt_tokens, 0, {});
  if (!lp.ok()) Die("local prompt: " + lp.status().ToString());
  if (!rp.ok()) Die("distributed prompt: " + rp.status().ToString());
  double max_diff = (*lp - *rp).abs().max().item<double>();
  int64_t token = lp->select(1, -1).argmax(-1).item<int64_t>();
  std::vector<double> local_steps, remote_steps;
  int64_t mismatches = 0;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    at::Tensor t = at::full({1, 1}, token, long_opts);
    auto t0 = Steady::now();
    auto l = local_backend.Step(t, local_backend.position(), {});
    const double ls = Seconds(Steady::now() - t0);
    t0 = Steady::now();
    auto r = remote_backend.Step(t, remote_backend.position(), {});
    const double rs = Seconds(Steady::now() - t0);
    if (!l.ok()) Die("local step: " + l.status().ToString());
    if (!r.ok()) Die("distributed step: " + r.status().ToString());
    max_diff = std::max(max_diff, (*l - *r).abs().max().item<double>());
    token = l->select(1, -1).argmax(-1).item<int64_t>();  // greedy decoding, locally chosen
    mismatches += r->select(1, -1).argmax(-1).item<int64_t>() != token;
    if (i >= a.warmup) {
      local_steps.push_back(ls);
      remote_steps.push_back(rs);
    }
  }
  const auto& stats = session->stats();
  session->Close();
  const double local_step = Median(local_steps), remote_step = Median(remote_steps);
  std::printf("decode, 1 token per step after a %d-token prompt (median of %d steps after %d "
              "warm-up; embeddings and LM head included in both):\n",
              a.prompt, a.steps, a.warmup);
  std::printf("  local (LocalBackend, whole model):         %8.2f ms/step  (%.1f tokens/s)\n",
              local_step * 1e3, 1 / local_step);
  std::printf("  distributed (RemoteBackend, %zu servers):    %8.2f ms/step  (%.1f tokens/s)\n",
              stats.route.size(), remote_step * 1e3, 1 / remote_step);
  std::printf("  overhead per step %.2f ms; max |logit difference| %.2e; greedy mismatches %lld; "
              "failovers %lld\n",
              (remote_step - local_step) * 1e3, max_diff, static_cast<long long>(mismatches),
              static_cast<long long>(stats.failovers));

  // ---- (b) forward throughput through all blocks (no embeddings, no head, no cache).
  std::printf("forward, hidden states through all %lld blocks (blocks only), %lld tokens per "
              "sequence (median of %d after 1 warm-up):\n",
              static_cast<long long>(a.layers), static_cast<long long>(a.seq), a.forward_reps);
  std::vector<std::pair<int64_t, ForwardResult>> forwards;
  for (int64_t b : {int64_t{1}, a.batch}) {
    const int reps = b == 1 ? std::max(a.forward_reps, 8) : a.forward_reps;
    ForwardResult f = MeasureForward(*local, remote, b, a.seq, reps);
    const double tokens = static_cast<double>(b * a.seq);
    std::printf("  batch %3lld: local %9.1f tokens/s (%.3f s), distributed %9.1f tokens/s "
                "(%.3f s); max |difference| %.2e\n",
                static_cast<long long>(b), tokens / f.local_s, f.local_s, tokens / f.remote_s,
                f.remote_s, f.max_diff);
    forwards.emplace_back(b, f);
  }

  for (auto& s : servers) Stop(s);
  (*node)->Shutdown();

  for (const auto& [b, f] : forwards) {
    std::printf("RESULT forward_b%lld_time_vs_local=%.3f\n", static_cast<long long>(b),
                f.remote_s / f.local_s);
  }
  std::printf("RESULT inference_step_vs_local=%.3f\n", remote_step / local_step);
  return 0;
}
