// Mixture-of-experts benchmark: a RemoteMixtureOfExperts over 4 `colony experts serve` processes
// on loopback against the same layer computed locally, forward + backward, measured in the same
// run.
//
// The grid is ffn 4 x 4; server s hosts ffn.s.0 .. ffn.s.3 (hidden --hidden, inner 4 x hidden,
// SGD with learning rate 0, so the weights stay the seeded ones and the local layer can be built
// from the same seeds). Each step draws an input, runs the remote layer and the local one (the
// same gating, exhaustive top k over the 16 experts, softmax, the experts' ffn) forward and
// backward, and fails when their outputs or input gradients differ. Medians over --steps steps
// per batch size give RESULT moe_remote_vs_local (batch 512; goal <= 1.3 on loopback).
//
// Then one server is stopped (SIGSTOP: its connections stay open and never answer) and the
// layer runs with timeout_after_k_min = --cut: each step costs about the cut after the other
// experts answered. Its outputs are checked against the local layer over the 12 live experts.
// RESULT moe_hang_step_vs_timeout = (median step - median round trip) / cut (goal <= 1.1, i.e. a
// step within 1.1 x cut + one round trip, as the issue states it; the step's own compute counts
// against it). It also prints the step over the healthy step + cut + round trip: what the hang
// adds beyond the cut.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <limits>
#include <map>
#include <set>

#include "bench_support.h"
#include "dht/node.h"
#include "moe/expert.h"
#include "moe/expert_server.h"
#include "moe/expert_uid.h"
#include "moe/mixture.h"
#include "tools/record_rules.h"

namespace {

using namespace colony;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

int Fail(const std::string& why) {
  std::fprintf(stderr, "bench_moe: %s\n", why.c_str());
  return 1;
}

// The layer computed here: the top k of the experts in `live` by the gating's scores, softmax
// over those in `answering`, their outputs summed.
at::Tensor LocalMixture(const at::Tensor& x, const std::vector<at::Tensor>& gate,
                        const std::map<std::string, std::vector<at::Tensor>>& experts,
                        const std::set<std::string>& answering, size_t k) {
  const at::Tensor logits = at::linear(x, gate[0], gate[1]);
  const at::Tensor plain = logits.detach();
  // Scores of every expert for every input, then the top k per input.
  std::vector<std::string> uids;
  std::vector<at::Tensor> columns;
  for (const auto& [uid, w] : experts) {
    auto u = moe::ParseExpertUid(uid);
    uids.push_back(uid);
    columns.push_back(logits.select(1, u->coords[0]) + logits.select(1, 4 + u->coords[1]));
  }
  const at::Tensor scores = at::stack(columns, 1);  // [batch, experts]
  const at::Tensor top = std::get<1>(scores.detach().topk(static_cast<int64_t>(k), 1));
  at::Tensor mask = at::zeros_like(scores, at::kBool);
  mask.scatter_(1, top, true);
  for (size_t e = 0; e < uids.size(); ++e) {
    if (!answering.contains(uids[e])) mask.select(1, static_cast<int64_t>(e)).fill_(false);
  }
  // Inputs none of whose top k answered get zeros (allow_zero_outputs).
  const at::Tensor weights =
      at::where(mask.any(1, /*keepdim=*/true),
                at::softmax(scores.masked_fill(~mask, -std::numeric_limits<float>::infinity()), 1),
                at::zeros_like(scores));
  // Each expert computes the rows routed to it only, as a server does.
  at::Tensor out = at::zeros({x.size(0), x.size(1)});
  for (size_t e = 0; e < uids.size(); ++e) {
    const auto ee = static_cast<int64_t>(e);
    const at::Tensor rows = mask.select(1, ee).nonzero().squeeze(1);
    if (rows.numel() == 0) continue;
    const at::Tensor y = moe::ExpertFunction(x.index_select(0, rows), experts.at(uids[e]));
    out = out.index_add(0, rows, weights.select(1, ee).index_select(0, rows).unsqueeze(1) * y);
  }
  return out;
}

struct Step {
  double remote = 0, local = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a remote mixture of experts over 4 expert servers vs the same layer computed here"};
  int64_t hidden = 256;
  int steps = 7;
  double cut = 0.5;
  app.add_option("--hidden", hidden, "the experts' size")->capture_default_str();
  app.add_option("--steps", steps, "measured steps per batch size")->capture_default_str();
  app.add_option("--cut", cut, "timeout_after_k_min (s) with a server hanging")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  bench::TempDir dir("bench-moe");
  test::ProcessGroup swarm(dir.path());
  auto boot = swarm.Start("dht", {"dht", "--listen", "/ip4/127.0.0.1/tcp/0"}, "warn");
  if (!boot.ok()) return Fail(boot.status().ToString());
  std::map<std::string, std::vector<at::Tensor>> experts;
  std::vector<std::string> servers;
  for (int s = 0; s < 4; ++s) {
    std::vector<std::string> args = {"experts",
                                     "serve",
                                     "--initial-peers",
                                     *boot,
                                     "--listen",
                                     "/ip4/127.0.0.1/tcp/0",
                                     "--hidden-dim",
                                     std::to_string(hidden),
                                     "--optimizer",
                                     "sgd",
                                     "--lr",
                                     "0",
                                     "--seed",
                                     "7",
                                     "--threads",
                                     "1",
                                     "--expert-ids"};
    for (int c = 0; c < 4; ++c) {
      const std::string uid = "ffn." + std::to_string(s) + "." + std::to_string(c);
      args.push_back(uid);
      auto e = moe::Expert::Create(
          {.hidden = hidden, .optimizer = "sgd", .lr = 0, .seed = moe::ExpertSeed(7, uid)});
      if (!e.ok()) return Fail(e.status().ToString());
      experts[uid] = (*e)->parameters();
    }
    const std::string label = "server" + std::to_string(s);
    auto ready = swarm.Start(label, args, "warn");
    if (!ready.ok()) return Fail(ready.status().ToString());
    servers.push_back(label);
  }
  dht::NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = {*boot};
  o.validators = {cli::SwarmRecordRules()};
  auto node = dht::Node::Start(KeyPair::Generate(), o);
  if (!node.ok()) return Fail(node.status().ToString());
  auto make = [&](size_t k, std::chrono::milliseconds after_k_min) {
    return moe::RemoteMixtureOfExperts::Create(**node, {.grid_name = "ffn",
                                                        .grid_size = {4, 4},
                                                        .hidden = hidden,
                                                        .k_best = k,
                                                        .forward_timeout = 60s,
                                                        .backward_timeout = 60s,
                                                        .timeout_after_k_min = after_k_min,
                                                        .allow_zero_outputs = true,
                                                        .seed = 3});
  };
  std::set<std::string> all;
  for (const auto& [uid, w] : experts) all.insert(uid);

  // One step of both layers on the same input; fails when they differ.
  auto step = [&](moe::RemoteMixtureOfExperts& layer, size_t k, int64_t batch,
                  const std::set<std::string>& answering, Step& t) -> Status {
    std::vector<at::Tensor> gate;
    for (const auto& p : layer.gating_parameters()) {
      gate.push_back(p.detach().clone().requires_grad_(true));
    }
    const at::Tensor data = at::randn({batch, hidden});
    at::Tensor x = data.clone().requires_grad_(true);
    auto start = SteadyClock::now();
    auto y = layer.Forward(x);
    if (!y.ok()) return y.status();
    y->sum().backward();
    t.remote = bench::SecondsSince(start);
    at::Tensor xl = data.clone().requires_grad_(true);
    start = SteadyClock::now();
    const at::Tensor yl = LocalMixture(xl, gate, experts, answering, k);
    yl.sum().backward();
    t.local = bench::SecondsSince(start);
    if (!at::allclose(*y, yl, 1e-3, 1e-4) || !at::allclose(x.grad(), xl.grad(), 1e-3, 1e-4)) {
      return Internal(fmt::format(
          "the remote layer differs from the local one by {} (output), {} "
          "(input gradient)",
          (*y - yl).abs().max().item<double>(), (x.grad() - xl.grad()).abs().max().item<double>()));
    }
    return Status::Ok();
  };

  auto layer = make(4, 60s);
  if (!layer.ok()) return Fail(layer.status().ToString());
  double ratio512 = 0;
  for (int64_t batch : {64, 512}) {
    std::vector<double> remote, local;
    for (int i = 0; i < steps + 1; ++i) {
      Step t;
      Status st = step(**layer, 4, batch, all, t);
      if (!st.ok()) return Fail(st.ToString());
      if (i == 0) continue;  // connections and caches warm up
      remote.push_back(t.remote);
      local.push_back(t.local);
    }
    const double r = bench::Median(remote), l = bench::Median(local);
    std::printf("batch %4lld: remote %.1f ms, local %.1f ms per forward+backward (medians of %d)\n",
                static_cast<long long>(batch), r * 1e3, l * 1e3, steps);
    if (batch == 512) ratio512 = r / l;
  }

  // The same layer as with a server hanging (k = 8, the cut) while all servers answer: the step
  // the hang adds to.
  auto healthy = make(8, std::chrono::milliseconds(static_cast<int64_t>(cut * 1000)));
  if (!healthy.ok()) return Fail(healthy.status().ToString());
  std::vector<double> healthy_steps;
  for (int i = 0; i < steps + 1; ++i) {
    Step t;
    Status st = step(**healthy, 8, 64, all, t);
    if (!st.ok()) return Fail(st.ToString());
    if (i > 0) healthy_steps.push_back(t.remote);
  }
  healthy->reset();

  // A hanging server: its experts cost the cut after the others answered.
  std::vector<double> rtts;
  for (int i = 0; i < 5; ++i) {
    auto ping = (*node)->host().PingSync(*Multiaddr::Parse(*boot));
    if (ping.ok()) rtts.push_back(std::chrono::duration<double>(ping->rtt).count());
  }
  const double rtt = bench::Median(rtts);
  swarm["server3"].Signal(SIGSTOP);
  std::set<std::string> live;
  for (const auto& uid : all) {
    if (uid.rfind("ffn.3.", 0) != 0) live.insert(uid);
  }
  // k = 8: every input has live experts (a server holds 4), so the cut starts once they
  // answered; the first step (not counted) also finds the stopped server's DHT node silent, and
  // the DHT backs off from it.
  auto hanging = make(8, std::chrono::milliseconds(static_cast<int64_t>(cut * 1000)));
  if (!hanging.ok()) return Fail(hanging.status().ToString());
  std::vector<double> hang_steps;
  Status failed;
  for (int i = 0; i < steps + 1 && failed.ok(); ++i) {
    Step t;
    failed = step(**hanging, 8, 64, live, t);
    if (i > 0) hang_steps.push_back(t.remote);
  }
  swarm["server3"].Signal(SIGCONT);  // its late answers arrive; the layers can go
  hanging->reset();
  layer->reset();
  (*node)->Shutdown();
  if (!failed.ok()) return Fail("with a server hanging: " + failed.ToString());
  const double hang = bench::Median(hang_steps);
  const double base = bench::Median(healthy_steps);
  std::printf(
      "k 8, batch 64: %.1f ms per step with every server answering, %.1f ms with server3 "
      "hanging (cut %.0f ms, round trip %.2f ms)\n",
      base * 1e3, hang * 1e3, cut * 1e3, rtt * 1e3);
  // The goal, step <= 1.1 x cut + one round trip, as a ratio to hold <= 1.1. The step
  // includes its own compute (the healthy step), which the goal leaves no room for; against
  // the healthy step plus the cut, the hang costs:
  std::printf("hanging step / (healthy step + cut + round trip) = %.3f\n",
              hang / (base + cut + rtt));
  std::printf("RESULT moe_hang_step_vs_timeout=%.3f\n", (hang - rtt) / cut);
  std::printf("RESULT moe_remote_vs_local=%.3f\n", ratio512);
  return 0;
}
