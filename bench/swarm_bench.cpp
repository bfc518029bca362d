// SWARM benchmark: a model trained through stage servers (src/swarm: 2 stages x 2 peers and one
// trainer, in this process, over loopback sockets) against the same stages run one after the other
// in one process with no network (the ideal pipeline for one trainer that sends one microbatch at
// a time), the same batches and Adam steps, measured in the same run.
//
// The swarm's result is checked before any figure is printed: every microbatch's loss and every
// stage peer's final parameters must equal the one-process run's (1e-4 relative, 1e-4 absolute),
// and each stage must account for every sample once; otherwise the benchmark fails.
//
// RESULT swarm_samples_per_second, ideal_samples_per_second, and swarm_vs_ideal_pipeline (the
// ratio; what the network hops, routing and stage rounds cost). Then the same swarm with 8-bit
// stage boundaries (blockwise, 256 values per scale): RESULT swarm_boundary8_bytes_ratio, the
// trainer's bytes on the wire against the float32 run's, checked to train within 1% of the
// one-process losses.
//
// Then rebalancing (swarm/rebalancing.h): stage peers of one kind of machine (each announces the
// same throughput; on one machine their real speeds are the machine's), 3 in the first stage and
// 2 in the second, a trainer sending microbatches all along; one peer of the second stage goes
// down without a word (its node stops; its records live on until they expire). RESULT
// swarm_rebalance_s: the time until the pipeline is back to >= 75% of the best capacity these
// peers could give (the best assignment of the survivors to the stages, found by trying every
// one) and a microbatch went through the peer that moved. Checked: no microbatch of the trainer
// failed, the peer that moved took the stage's state, and the second stage's two peers end with
// the same parameters. The time is mostly the record lifetime plus one rebalancing round, both
// options (--record-ttl, --rebalance-period), printed with it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/optim/adam.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "bench_support.h"
#include "loopback_node.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "serve/routing.h"
#include "swarm/layout.h"
#include "swarm/pipeline.h"
#include "swarm/rebalancing.h"
#include "swarm/stage.h"
#include "train/collaborative.h"
#include "train/optimizers.h"

namespace {

using namespace colony;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

int Fail(const std::string& why) {
  std::fprintf(stderr, "bench_swarm: %s\n", why.c_str());
  return 1;
}

struct Args {
  int64_t hidden = 128, layers = 4, vocab = 512, seq_len = 64, batch = 8;
  int64_t per_epoch = 4, epochs = 6;
  double lr = 1e-3;
  double rebalance_period = 5, record_ttl = 6;
};

train::CollaborativeOptions Rounds(const std::string& run, const Args& a) {
  train::CollaborativeOptions o;
  o.run_id = run;
  o.target_batch_size = a.batch * a.per_epoch;
  o.matchmaking_time = 5s;
  o.averaging_timeout = 60s;
  o.progress_min_refresh = 50ms;
  o.progress_max_refresh = 300ms;
  return o;
}

struct SwarmRun {
  std::vector<double> losses;
  double seconds = 0;
  double bytes = 0;  // sent and received by the trainer's node while it trained
  std::vector<std::vector<at::Tensor>> parameters;  // each stage peer's, at the end (copies)
};

// 2 stages x 2 peers and a trainer, in this process over loopback, trained on the first n
// batches with hidden states crossing stages in `codec`. Checks that each stage accounted for
// every sample once and that every peer ended the last epoch.
Result<SwarmRun> RunSwarm(const Args& a, const std::filesystem::path& model_dir,
                          const std::vector<at::Tensor>& batches, size_t n,
                          compression::Codec codec) {
  const std::string run = fmt::format("bench-{}", compression::CodecName(codec));
  auto boot = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions());
  if (!boot.ok()) return boot.status();
  const std::string boot_addr = (*boot)->VisibleAddresses().at(0).ToString();
  std::vector<std::unique_ptr<dht::Node>> nodes;
  std::vector<std::unique_ptr<swarm::Stage>> stages;
  std::unique_ptr<swarm::Pipeline> pipeline;
  std::unique_ptr<train::CollaborativeOptimizer> opt;
  auto done = [&](Result<SwarmRun> r) {
    opt.reset();
    pipeline.reset();
    stages.clear();
    for (auto& node : nodes) node->Shutdown();
    (*boot)->Shutdown();
    return r;
  };
  auto add_node = [&]() -> Result<dht::Node*> {
    auto node = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({boot_addr}));
    if (!node.ok()) return node.status();
    nodes.push_back(std::move(*node));
    return nodes.back().get();
  };
  const int64_t half = a.layers / 2;
  for (int i = 0; i < 4; ++i) {
    swarm::StageOptions o;
    o.run = run;
    o.model_dir = model_dir;
    o.first_block = i < 2 ? 0 : half;
    o.last_block = i < 2 ? half : a.layers;
    o.server.announce_period = 1s;
    o.training.optimizer_config.lr = a.lr;
    o.training.collaborative = Rounds("", a);
    auto node = add_node();
    if (!node.ok()) return done(node.status());
    auto stage = swarm::Stage::Start(**node, o);
    if (!stage.ok()) return done(stage.status());
    stages.push_back(std::move(*stage));
  }
  auto trainer_node = add_node();
  if (!trainer_node.ok()) return done(trainer_node.status());
  auto p = swarm::Pipeline::Create(**trainer_node,
                                   {.run = run, .model_dir = model_dir, .boundary_codec = codec});
  if (!p.ok()) return done(p.status());
  pipeline = std::move(*p);
  train::OptimizerConfig oc;
  oc.lr = a.lr;
  auto inner = train::MakeOptimizer("adam", pipeline->parameters(), oc);
  if (!inner.ok()) return done(inner.status());
  auto o = train::CollaborativeOptimizer::Create(
      **trainer_node, pipeline->parameters(),
      std::shared_ptr<torch::optim::Optimizer>(std::move(*inner)), Rounds(run, a));
  if (!o.ok()) return done(o.status());
  opt = std::move(*o);
  const bool seen = test::WaitUntil(
      [&] {
        (void)pipeline->manager().Refresh();
        return pipeline->manager().Servers().size() >= 4;
      },
      10s);
  if (!seen) return done(DeadlineExceeded("the trainer does not see the 4 stage peers"));
  SwarmRun out;
  const auto before = (*trainer_node)->host().TotalStats();
  const auto t0 = SteadyClock::now();
  for (size_t i = 0; i < n; ++i) {
    pipeline->SetEpoch(opt->local_epoch());
    auto loss = pipeline->TrainStep(batches[i]);
    if (!loss.ok()) return done(loss.status().WithContext(fmt::format("microbatch {}", i)));
    out.losses.push_back(*loss);
    auto r = opt->Step(a.batch);
    if (!r.ok()) return done(r.status());
  }
  // The stages end the last epoch when the trainer's next request shows it.
  pipeline->SetEpoch(opt->local_epoch());
  if (auto l = pipeline->Loss(batches[n]); !l.ok()) return done(l.status());
  out.seconds = bench::SecondsSince(t0);
  const auto after = (*trainer_node)->host().TotalStats();
  out.bytes = static_cast<double>((after.bytes_sent - before.bytes_sent) +
                                  (after.bytes_received - before.bytes_received));
  int64_t samples[2] = {0, 0};
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto t = stages[s]->training_stats();
    samples[s / 2] += t.samples;
    if (t.epoch != a.epochs) {
      return done(
          Internal(fmt::format("stage peer {} is at epoch {}, not {}", s, t.epoch, a.epochs)));
    }
    std::vector<at::Tensor> copy;
    for (const auto& w : stages[s]->parameters()) copy.push_back(w.detach().clone());
    out.parameters.push_back(std::move(copy));
  }
  const int64_t total = static_cast<int64_t>(n) * a.batch;
  if (samples[0] != total || samples[1] != total) {
    return done(Internal(fmt::format("the stages accounted for {} and {} samples of {}", samples[0],
                                     samples[1], total)));
  }
  return done(std::move(out));
}

// The rebalancing phase (see the top): the seconds until the pipeline recovered, or an error.
Result<double> MeasureRebalance(const Args& a, const std::filesystem::path& model_dir,
                                const std::vector<at::Tensor>& batches) {
  const auto layout = swarm::EvenLayout(a.layers, 2);
  if (!layout.ok()) return layout.status();
  COLONY_RETURN_IF_ERROR(swarm::WriteLayout(model_dir, *layout));
  auto boot = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions());
  if (!boot.ok()) return boot.status();
  const std::string boot_addr = (*boot)->VisibleAddresses().at(0).ToString();
  std::vector<std::unique_ptr<dht::Node>> nodes;
  std::vector<std::unique_ptr<swarm::StagePeer>> peers;
  auto cleanup = [&] {
    peers.clear();
    for (auto& node : nodes) {
      if (node) node->Shutdown();
    }
    (*boot)->Shutdown();
  };
  constexpr double kThroughput = 100;
  for (int i = 0; i < 5; ++i) {
    auto node = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({boot_addr}));
    if (!node.ok()) return node.status();
    swarm::StagePeerOptions o;
    o.stage.run = "bench-rebalance";
    o.stage.model_dir = model_dir;
    o.stage.first_block = i < 3 ? 0 : a.layers / 2;
    o.stage.last_block = i < 3 ? a.layers / 2 : a.layers;
    o.stage.server.throughput_override = kThroughput;
    o.stage.server.record_ttl_seconds = a.record_ttl;
    o.stage.server.announce_period =
        std::chrono::milliseconds(static_cast<int64_t>(a.record_ttl * 250));
    o.stage.training.optimizer_config.lr = a.lr;
    o.stage.training.collaborative = Rounds("", a);
    o.stage.training.collaborative.load_state_timeout = 10s;
    o.layout = *layout;
    o.rebalance.period = std::chrono::milliseconds(static_cast<int64_t>(a.rebalance_period * 1e3));
    auto peer = swarm::StagePeer::Start(**node, std::move(o));
    if (!peer.ok()) return peer.status();
    nodes.push_back(std::move(*node));
    peers.push_back(std::move(*peer));
  }
  auto trainer_node = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({boot_addr}));
  if (!trainer_node.ok()) return trainer_node.status();
  auto pipeline =
      swarm::Pipeline::Create(**trainer_node, {.run = "bench-rebalance", .model_dir = model_dir});
  if (!pipeline.ok()) return pipeline.status();
  train::OptimizerConfig oc;
  oc.lr = a.lr;
  auto inner = train::MakeOptimizer("adam", (*pipeline)->parameters(), oc);
  if (!inner.ok()) return inner.status();
  auto opt = train::CollaborativeOptimizer::Create(
      **trainer_node, (*pipeline)->parameters(),
      std::shared_ptr<torch::optim::Optimizer>(std::move(*inner)), Rounds("bench-rebalance", a));
  if (!opt.ok()) return opt.status();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> microbatches{0};
  Status trainer_status;
  std::thread trainer([&] {
    for (size_t i = 0; !stop; ++i) {
      (*pipeline)->SetEpoch((*opt)->local_epoch());
      auto loss = (*pipeline)->TrainStep(batches[i % batches.size()]);
      if (!loss.ok()) {
        trainer_status = loss.status().WithContext(fmt::format("microbatch {}", i));
        return;
      }
      if (auto r = (*opt)->Step(a.batch); !r.ok()) {
        trainer_status = r.status();
        return;
      }
      ++microbatches;
    }
  });
  auto finish = [&](Status st) -> Status {
    stop = true;
    trainer.join();
    if (st.ok()) st = trainer_status;
    return st;
  };
  // A few epochs with every peer, then the second stage loses one of its two.
  if (!test::WaitUntil([&] { return microbatches >= 3 * a.per_epoch || !trainer_status.ok(); },
                       120s)) {
    Status st = finish(DeadlineExceeded("the trainer made no progress"));
    cleanup();
    return st;
  }
  nodes[4]->Shutdown();  // no offline record: the others learn it when its records expire
  const auto t0 = SteadyClock::now();
  // The best the 4 survivors could give: try every assignment (2^4) to the 2 stages.
  std::vector<swarm::PeerLoad> survivors(4);
  double best = 0;
  for (int code = 0; code < 16; ++code) {
    for (int k = 0; k < 4; ++k) {
      survivors[k].stage = static_cast<size_t>((code >> k) & 1);
      survivors[k].throughput = kThroughput;
    }
    const auto caps = swarm::StageCapacities(*layout, survivors);
    best = std::max(best, std::min(caps[0], caps[1]));
  }
  auto recovered = [&] {
    std::vector<double> caps(2, 0.0);
    bool moved_and_used = false;
    for (int k = 0; k < 4; ++k) {
      const auto st = peers[k]->stats();
      const size_t stage = st.first == 0 ? 0 : 1;
      caps[stage] += kThroughput / static_cast<double>(st.last - st.first);
      moved_and_used = moved_and_used || (st.moves > 0 && st.training.backwards > 0);
    }
    return std::min(caps[0], caps[1]) >= 0.75 * best && moved_and_used;
  };
  const bool ok = test::WaitUntil([&] { return recovered() || !trainer_status.ok(); }, 300s);
  const double seconds = bench::SecondsSince(t0);
  // Some more microbatches through the new layout, then the checks.
  const int64_t at_recovery = microbatches;
  (void)test::WaitUntil(
      [&] { return microbatches >= at_recovery + 2 * a.per_epoch || !trainer_status.ok(); }, 120s);
  Status st =
      finish(ok ? Status::Ok() : DeadlineExceeded("the pipeline did not recover within 300 s"));
  if (st.ok()) {
    // The second stage's peers (the survivor and the one that moved) end at the same epoch with
    // the same parameters; the mover took the stage's state.
    std::vector<swarm::StagePeer*> second;
    for (int k = 0; k < 4; ++k) {
      if (peers[k]->stats().first != 0) second.push_back(peers[k].get());
    }
    const bool settled = test::WaitUntil(
        [&] {
          return second.size() == 2 &&
                 second[0]->stats().training.epoch == second[1]->stats().training.epoch;
        },
        30s);
    if (!settled) st = Internal("the second stage's peers are not two at one epoch");
    for (auto* p : second) {
      if (st.ok() && p->stats().moves > 0 && p->stats().training.state_loads == 0) {
        st = Internal("the peer that moved did not take the stage's state");
      }
    }
    if (st.ok()) {
      const auto& x = second[0]->parameters();
      const auto& y = second[1]->parameters();
      for (size_t k = 0; k < x.size() && st.ok(); ++k) {
        const double d = (x[k] - y[k]).abs().max().item<double>();
        if (d > 1e-6) {
          st = Internal(fmt::format("the second stage's peers differ by {} in parameter {}", d, k));
        }
      }
    }
  }
  opt->reset();
  pipeline->reset();
  (*trainer_node)->Shutdown();
  cleanup();
  if (!st.ok()) return st;
  return seconds;
}

int Run(const Args& a) {
  at::set_num_threads(1);
  bench::TempDir dir("bench-swarm");
  const auto model_dir = dir.path() / "init";
  model::LlamaConfig c;
  c.vocab_size = a.vocab;
  c.hidden_size = a.hidden;
  c.intermediate_size = (a.hidden * 8 / 3 + 31) / 32 * 32;
  c.num_layers = a.layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = std::max<int64_t>(a.seq_len, 64);
  c.tie_word_embeddings = false;
  if (Status st = c.Validate(); !st.ok()) return Fail(st.ToString());
  at::manual_seed(3);
  {
    model::LlamaModel m(c);
    if (Status st = model::SaveLlama(model_dir, m); !st.ok()) return Fail(st.ToString());
  }
  // Counting sequences from random starts: learnable, the same for both runs.
  std::vector<at::Tensor> batches;
  const at::Tensor steps = at::arange(a.seq_len + 1, at::kLong).unsqueeze(0);
  for (int64_t i = 0; i < a.epochs * a.per_epoch + 1; ++i) {
    batches.push_back((at::randint(a.vocab, {a.batch, 1}, at::kLong) + steps).remainder(a.vocab));
  }
  const size_t n = static_cast<size_t>(a.epochs * a.per_epoch);

  // The ideal pipeline: the same blocks one after the other, here.
  auto local = model::LoadLlama(model_dir);
  if (!local.ok()) return Fail(local.status().ToString());
  std::vector<double> want;
  double ideal_seconds = 0;
  {
    torch::optim::Adam adam((*local)->parameters(), torch::optim::AdamOptions(a.lr));
    const auto t0 = SteadyClock::now();
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& b = batches[i];
      at::Tensor loss = model::LanguageModelLoss((*local)->forward(b.slice(1, 0, a.seq_len)),
                                                 b.slice(1, 1, a.seq_len + 1));
      want.push_back(loss.item<double>());
      (loss / static_cast<double>(a.per_epoch)).backward();
      if ((i + 1) % static_cast<size_t>(a.per_epoch) == 0) {
        adam.step();
        adam.zero_grad();
      }
    }
    ideal_seconds = bench::SecondsSince(t0);
  }

  // The swarm: 2 stages x 2 peers and a trainer, with float32 boundaries (checked exact), then
  // with 8-bit ones (checked close).
  auto exact = RunSwarm(a, model_dir, batches, n, compression::Codec::kNone);
  if (!exact.ok()) return Fail(exact.status().ToString());
  for (size_t i = 0; i < n; ++i) {
    if (std::abs(exact->losses[i] - want[i]) > 1e-4 * std::abs(want[i]) + 1e-4) {
      return Fail(fmt::format("microbatch {}: the swarm's loss {} differs from {}", i,
                              exact->losses[i], want[i]));
    }
  }
  const int64_t half = a.layers / 2;
  for (size_t s = 0; s < exact->parameters.size(); ++s) {
    std::vector<at::Tensor> ref;
    const int64_t first = s < 2 ? 0 : half;
    for (int64_t b = first; b < first + half; ++b) {
      for (const auto& p : (*local)->block(b)->parameters()) ref.push_back(p);
    }
    for (size_t k = 0; k < ref.size(); ++k) {
      const double d = (exact->parameters[s][k] - ref[k]).abs().max().item<double>();
      if (d > 1e-4) return Fail(fmt::format("stage peer {}'s parameter {} is {} off", s, k, d));
    }
  }
  auto eight = RunSwarm(a, model_dir, batches, n, compression::Codec::kBlockwise8);
  if (!eight.ok()) return Fail("8-bit boundaries: " + eight.status().ToString());
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(eight->losses[i] - want[i]) / std::abs(want[i]));
  }
  if (!(worst < 1e-2)) {
    return Fail(fmt::format("8-bit boundaries: a loss {:.2e} relative off one process's", worst));
  }
  const int64_t total = static_cast<int64_t>(n) * a.batch;
  const double swarm_seconds = exact->seconds;
  const double swarm_sps = static_cast<double>(total) / swarm_seconds;
  const double ideal_sps = static_cast<double>(total) / ideal_seconds;
  std::printf(
      "swarm: %zu microbatches of %lld x %lld tokens through 2 stages x 2 peers in %.2f s; "
      "one process: %.2f s; losses and parameters equal\n",
      n, static_cast<long long>(a.batch), static_cast<long long>(a.seq_len), swarm_seconds,
      ideal_seconds);
  std::printf(
      "8-bit stage boundaries: %.2f MB per microbatch through the trainer instead of %.2f MB "
      "(x%.3f), losses within %.1e relative of one process's\n",
      eight->bytes / 1e6 / static_cast<double>(n), exact->bytes / 1e6 / static_cast<double>(n),
      eight->bytes / exact->bytes, worst);
  auto rebalance = MeasureRebalance(a, model_dir, batches);
  if (!rebalance.ok()) return Fail("rebalancing: " + rebalance.status().ToString());
  std::printf(
      "rebalancing: 3 + 2 stage peers, one of the second stage gone: back to >= 75%% of the best "
      "in %.1f s (rounds every %.1f s, records live %.1f s); the mover took the stage's state "
      "and its parameters equal its stage peer's\n",
      *rebalance, a.rebalance_period, a.record_ttl);
  std::printf("RESULT swarm_samples_per_second=%.1f\n", swarm_sps);
  std::printf("RESULT ideal_samples_per_second=%.1f\n", ideal_sps);
  std::printf("RESULT swarm_vs_ideal_pipeline=%.3f\n", swarm_sps / ideal_sps);
  std::printf("RESULT swarm_boundary8_bytes_ratio=%.3f\n", eight->bytes / exact->bytes);
  std::printf("RESULT swarm_rebalance_s=%.1f\n", *rebalance);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SWARM training through stage servers vs the same stages in one process"};
  Args a;
  app.add_option("--hidden", a.hidden, "hidden size")->capture_default_str();
  app.add_option("--layers", a.layers, "blocks (two stages of half each)")->capture_default_str();
  app.add_option("--seq-len", a.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per microbatch")->capture_default_str();
  app.add_option("--per-epoch", a.per_epoch, "microbatches per step")->capture_default_str();
  app.add_option("--epochs", a.epochs, "optimizer steps")->capture_default_str();
  app.add_option("--rebalance-period", a.rebalance_period, "seconds between rebalancing rounds")
      ->check(CLI::Range(0.5, 600.0))
      ->capture_default_str();
  app.add_option("--record-ttl", a.record_ttl, "seconds a stage peer's records live")
      ->check(CLI::Range(2.0, 600.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);  // the stages' per-epoch lines would bury the figures
  if (a.layers < 2 || a.layers % 2 != 0) return Fail("--layers must be even and at least 2");
  try {
    return Run(a);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}
