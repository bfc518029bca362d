#include "moe/dispatch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "moe/remote_expert.h"

namespace colony::moe {
namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Calls still running on threads of their own; the mixture waits for them before it goes.
struct InFlight {
  std::mutex mu;
  std::condition_variable cv;
  size_t count = 0;
  void Enter() {
    std::lock_guard lock(mu);
    ++count;
  }
  void Leave() {
    std::lock_guard lock(mu);
    --count;
    cv.notify_all();
  }
  void WaitIdle() {
    std::unique_lock lock(mu);
    cv.wait(lock, [this] { return count == 0; });
  }
};

struct Counters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> failed{0};
};

// One forward's experts: which inputs each serves (in row order), and which answered.
struct CallPlan : torch::CustomClassHolder {
  std::vector<std::shared_ptr<RemoteExpert>> experts;
  std::vector<ScoredExpert> found;  // per expert: its servers and the keys that listed them
  std::weak_ptr<BeamSearcher> searcher;
  std::vector<std::vector<int64_t>> inputs;
  int64_t batch = 0;
  MixtureOptions options;
  std::shared_ptr<InFlight> in_flight;
  std::shared_ptr<Counters> counters;
  std::vector<bool> alive;  // after the forward
};

// The search leaves the servers that failed in a call out for a while (all the expert's servers
// when none could be tried) and reads the keys that named them again
// (BeamSearchOptions::avoid_failed_for); a server that answered is avoided no longer. Calls cut
// for being late, or refused because the server is busy or the input is wrong, do not count:
// the server is alive.
void Reconsider(const CallPlan& plan, const std::vector<size_t>& failed,
                const std::vector<CallReport>& reports) {
  auto searcher = plan.searcher.lock();
  if (!searcher) return;
  std::vector<PeerId> answered;
  for (const CallReport& r : reports) {
    if (r.answered) answered.push_back(*r.answered);
  }
  if (!answered.empty()) searcher->Answered(answered);
  for (size_t j : failed) {
    const std::vector<PeerId>& tried = reports[j].failed;
    searcher->Avoid(tried.empty() ? plan.found[j].expert.servers : tried, plan.found[j].keys);
  }
}

// Runs call(j) for each job j on a thread of its own and returns what arrived in time: all
// results by `timeout`, or, once every input has min(k_min, its jobs) answers, whatever arrives
// within `after_k_min` more. Late calls finish on their own (by their own deadlines). What the
// calls that ended in time found out about servers goes to Reconsider.
std::vector<std::optional<at::Tensor>> CallInParallel(
    const CallPlan& plan, const std::vector<size_t>& jobs,
    const std::function<Result<at::Tensor>(size_t, CallReport*)>& call, size_t k_min, Ms timeout,
    Ms after_k_min) {
  struct Gather {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::optional<Result<at::Tensor>>> results;
    std::vector<CallReport> reports;
  };
  auto g = std::make_shared<Gather>();
  g->results.resize(plan.experts.size());
  g->reports.resize(plan.experts.size());
  for (size_t j : jobs) {
    plan.in_flight->Enter();
    plan.counters->calls++;
    auto finish = [g, j, in_flight = plan.in_flight](Result<at::Tensor> r, CallReport report) {
      {
        std::lock_guard lock(g->mu);
        g->results[j] = std::move(r);
        g->reports[j] = std::move(report);
      }
      g->cv.notify_all();
      in_flight->Leave();
    };
    try {
      std::thread([j, call, finish] {
        CallReport report;
        // An exception would end the process from this thread: the call fails on this side
        // (aborted, which does not count against the servers).
        auto r = [&]() -> Result<at::Tensor> {
          try {
            return call(j, &report);
          } catch (const std::exception& e) {
            return Status(StatusCode::kAborted,
                          fmt::format("the expert call failed here: {}", e.what()));
          } catch (...) {
            return Status(StatusCode::kAborted, "the expert call failed here with an exception");
          }
        }();
        finish(std::move(r), std::move(report));
      }).detach();
    } catch (...) {
      // This side's resources (a thread, memory), not the servers': not a failure to avoid them
      // for.
      finish(Status(StatusCode::kAborted, "no thread could be started for an expert call"), {});
    }
  }
  auto deadline = Clock::now() + timeout;
  bool cut = false;
  std::vector<std::optional<at::Tensor>> out(plan.experts.size());
  std::unique_lock lock(g->mu);
  for (;;) {
    size_t done = 0;
    std::vector<size_t> answered(static_cast<size_t>(plan.batch), 0);
    std::vector<size_t> asked(static_cast<size_t>(plan.batch), 0);
    for (size_t j : jobs) {
      const bool ok = g->results[j].has_value() && g->results[j]->ok();
      done += g->results[j].has_value();
      for (int64_t i : plan.inputs[j]) {
        ++asked[static_cast<size_t>(i)];
        answered[static_cast<size_t>(i)] += ok;
      }
    }
    if (done == jobs.size()) break;
    if (!cut) {
      bool enough = true;
      for (size_t i = 0; i < asked.size(); ++i) {
        enough = enough && answered[i] >= std::min(k_min, asked[i]);
      }
      if (enough) {
        cut = true;
        deadline = std::min(deadline, Clock::now() + after_k_min);
      }
    }
    if (Clock::now() >= deadline) break;
    g->cv.wait_until(lock, deadline);
  }
  std::vector<size_t> failed;
  for (size_t j : jobs) {
    if (g->results[j].has_value() && g->results[j]->ok()) {
      out[j] = **g->results[j];
    } else {
      plan.counters->failed++;
      // A busy server (resource_exhausted) is alive, and a refused input or a call that failed
      // here (aborted) is this side's fault; unless the call's report names servers that failed
      // (also one that refused too many calls in a row: ServerHealth).
      const StatusCode code =
          g->results[j].has_value() ? g->results[j]->status().code() : StatusCode::kOk;
      const bool server_alive = code == StatusCode::kResourceExhausted ||
                                code == StatusCode::kInvalidArgument ||
                                code == StatusCode::kAborted;
      if (g->results[j].has_value() && (!server_alive || !g->reports[j].failed.empty())) {
        failed.push_back(j);
      }
    }
  }
  std::vector<CallReport> reports(plan.experts.size());
  for (size_t j : jobs) {
    if (g->results[j].has_value()) reports[j] = g->reports[j];
  }
  lock.unlock();
  Reconsider(plan, failed, reports);
  return out;
}

// The experts' part of the layer as one autograd function: the forward calls every expert on
// its rows, the backward sends each answered expert its gradient. Failed experts give zeros
// (their weight is 0) and get no gradient.
class MixtureCall : public torch::autograd::Function<MixtureCall> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList xs,
                                                c10::intrusive_ptr<CallPlan> plan) {
    std::vector<size_t> jobs(plan->experts.size());
    for (size_t j = 0; j < jobs.size(); ++j) jobs[j] = j;
    std::vector<at::Tensor> inputs;  // the last of xs is the dummy (see Forward)
    for (size_t j = 0; j + 1 < xs.size(); ++j) inputs.push_back(xs[j].detach().contiguous());
    const MixtureOptions& o = plan->options;
    auto experts = plan->experts;
    auto results = CallInParallel(
        *plan, jobs,
        [experts, inputs, t = o.forward_timeout](size_t j, CallReport* report) {
          return experts[j]->Forward(inputs[j], t, report);
        },
        o.k_min, o.forward_timeout, o.timeout_after_k_min);
    torch::autograd::variable_list ys;
    plan->alive.assign(jobs.size(), false);
    for (size_t j = 0; j < jobs.size(); ++j) {
      plan->alive[j] = results[j].has_value();
      ys.push_back(results[j] ? *results[j] : at::zeros_like(inputs[j]));
    }
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    ctx->saved_data["inputs"] = inputs;
    return ys;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = ctx->saved_data["plan"].toCapsule();
    auto* plan = static_cast<CallPlan*>(holder.get());
    const std::vector<at::Tensor> inputs = ctx->saved_data["inputs"].toTensorVector();
    const MixtureOptions& o = plan->options;
    std::vector<size_t> jobs;
    std::vector<at::Tensor> gys(inputs.size());
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (!plan->alive[j] || !grads[j].defined()) continue;
      gys[j] = grads[j].contiguous();
      TORCH_CHECK(!o.detect_anomalies || at::isfinite(gys[j]).all().item<bool>(),
                  "mixture of experts: a gradient holds NaN or infinite values");
      jobs.push_back(j);
    }
    auto experts = plan->experts;
    auto results = CallInParallel(
        *plan, jobs,
        [experts, inputs, gys, t = o.backward_timeout](size_t j, CallReport* report) {
          return experts[j]->Backward(inputs[j], gys[j], t, report);
        },
        o.backward_k_min, o.backward_timeout, o.timeout_after_k_min);
    std::vector<size_t> answered(static_cast<size_t>(plan->batch), 0);
    std::vector<size_t> asked(static_cast<size_t>(plan->batch), 0);
    torch::autograd::variable_list out;
    for (size_t j = 0; j < inputs.size(); ++j) {
      out.push_back(results[j] ? *results[j] : at::zeros_like(inputs[j]));
      if (!plan->alive[j]) continue;
      for (int64_t i : plan->inputs[j]) {
        ++asked[static_cast<size_t>(i)];
        answered[static_cast<size_t>(i)] += results[j].has_value();
      }
    }
    for (size_t i = 0; i < asked.size(); ++i) {
      TORCH_CHECK(answered[i] >= std::min(o.backward_k_min, asked[i]),
                  fmt::format("mixture of experts: input {} got {} backward answers of the {} it "
                              "needs (backward_k_min)",
                              i, answered[i], std::min(o.backward_k_min, asked[i])));
    }
    out.emplace_back();  // the dummy
    out.emplace_back();  // the plan
    return out;
  }
};

}  // namespace

Status CheckMixtureOptions(const MixtureOptions& o) {
  if (o.hidden < 1 || o.hidden > 65536) {
    return InvalidArgument(fmt::format("hidden size {} outside [1, 65536]", o.hidden));
  }
  if (o.k_best < 1 || o.k_min > o.k_best || o.backward_k_min > o.k_best) {
    return InvalidArgument(
        fmt::format("k_best {} must be at least 1 and at least k_min {} and backward_k_min {}",
                    o.k_best, o.k_min, o.backward_k_min));
  }
  return Status::Ok();
}

Status CheckMixtureInput(const at::Tensor& x, const MixtureOptions& o) {
  if (!x.defined() || x.dim() != 2 || x.size(1) != o.hidden || x.size(0) < 1 || x.size(0) > 65536 ||
      x.scalar_type() != at::kFloat) {
    return InvalidArgument(
        fmt::format("a mixture of experts takes float32 [1..65536, {}]; got {} of shape {}",
                    o.hidden, x.defined() ? std::string(c10::toString(x.scalar_type())) : "nothing",
                    x.defined() ? fmt::format("{}", fmt::join(x.sizes(), " x ")) : "-"));
  }
  if (o.detect_anomalies && !at::isfinite(x).all().item<bool>()) {
    return InvalidArgument("mixture of experts: the input holds NaN or infinite values");
  }
  return Status::Ok();
}

std::vector<int64_t> GridOffsets(const std::vector<int64_t>& grid_size) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : grid_size) {
    offsets.push_back(total);
    total += n;
  }
  return offsets;
}

Gating MakeGating(const MixtureOptions& o) {
  Gating g;
  g.offsets = GridOffsets(o.grid_size);
  const int64_t total = std::accumulate(o.grid_size.begin(), o.grid_size.end(), int64_t{0});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(o.hidden));
  g.weight = at::empty({total, o.hidden}, at::kFloat).uniform_(-bound, bound, gen).requires_grad_();
  g.bias = at::empty({total}, at::kFloat).uniform_(-bound, bound, gen).requires_grad_();
  return g;
}

struct ExpertDispatcher::Impl {
  dht::Node& node;
  MixtureOptions options;
  std::shared_ptr<BeamSearcher> searcher;
  std::vector<int64_t> offsets;
  std::shared_ptr<InFlight> in_flight = std::make_shared<InFlight>();
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::shared_ptr<ServerHealth> health = std::make_shared<ServerHealth>();
  std::map<std::string, std::shared_ptr<RemoteExpert>> experts;  // by uid and servers

  Impl(dht::Node& n, MixtureOptions o)
      : node(n), options(std::move(o)), offsets(GridOffsets(options.grid_size)) {}

  std::shared_ptr<RemoteExpert> ExpertFor(const RemoteExpertInfo& info) {
    std::string key = info.uid;
    for (const auto& s : info.servers) key += "|" + s.ToString();
    for (const auto& a : info.addrs) key += "|" + (a.empty() ? std::string() : a[0]);
    if (auto it = experts.find(key); it != experts.end()) return it->second;
    // Bounded (rebuilt on demand): the keys come from the DHT's records. Each names at most
    // kMaxServersPerExpert servers with their addresses (a few KiB).
    if (experts.size() >= 4096) experts.clear();
    auto expert = std::make_shared<RemoteExpert>(node.host(), info, health);
    experts.emplace(std::move(key), expert);
    return expert;
  }

  Result<Routed> Call(const at::Tensor& x, const at::Tensor& logits) {
    const MixtureOptions& o = options;
    const int64_t batch = x.size(0);
    const size_t dims = o.grid_size.size();
    const auto k = static_cast<int64_t>(o.k_best);
    if (logits.dim() != 2 || logits.size(0) != batch ||
        logits.size(1) != offsets.back() + o.grid_size.back()) {
      return InvalidArgument("mixture of experts: the gating's scores do not fit the grid");
    }
    const at::Tensor plain = logits.detach().to(at::kFloat).contiguous();
    auto acc = plain.accessor<float, 2>();
    std::vector<std::vector<std::vector<float>>> scores(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      auto& s = scores[static_cast<size_t>(i)];
      s.resize(dims);
      for (size_t d = 0; d < dims; ++d) {
        for (int64_t c = 0; c < o.grid_size[d]; ++c) s[d].push_back(acc[i][offsets[d] + c]);
      }
    }
    COLONY_ASSIGN_OR_RETURN(auto found, searcher->BatchFindBestExperts(scores, o.k_best));
    // Avoiding failed servers is a preference: inputs it leaves no expert at all (this side's
    // network was down and every server it called failed) search again with the avoided
    // servers included, now and then (BeamSearchOptions::retry_avoided_after), rather than fail
    // every step until the avoidance ends.
    std::vector<size_t> starved;
    for (size_t i = 0; i < found.size(); ++i) {
      if (found[i].empty()) starved.push_back(i);
    }
    if (!starved.empty() && searcher->MayIncludeAvoided()) {
      std::vector<std::vector<std::vector<float>>> again;
      for (size_t i : starved) again.push_back(scores[i]);
      COLONY_ASSIGN_OR_RETURN(auto more, searcher->BatchFindBestExperts(again, o.k_best, true));
      for (size_t n = 0; n < starved.size(); ++n) found[starved[n]] = std::move(more[n]);
    }

    auto plan = c10::make_intrusive<CallPlan>();
    plan->batch = batch;
    plan->options = o;
    plan->in_flight = in_flight;
    plan->counters = counters;
    plan->searcher = searcher;
    std::map<std::string, size_t> index_of;
    std::vector<std::vector<int64_t>> coords_of;  // per expert
    std::vector<std::vector<std::pair<size_t, int64_t>>> slots(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      for (const auto& se : found[static_cast<size_t>(i)]) {
        auto [it, fresh] = index_of.emplace(se.expert.uid, plan->experts.size());
        if (fresh) {
          plan->experts.push_back(ExpertFor(se.expert));
          plan->found.push_back(se);
          plan->inputs.emplace_back();
          coords_of.push_back(ParseExpertUid(se.expert.uid)->coords);
        }
        const size_t e = it->second;
        slots[static_cast<size_t>(i)].emplace_back(e, static_cast<int64_t>(plan->inputs[e].size()));
        plan->inputs[e].push_back(i);
      }
    }
    Routed r;
    r.alive = at::zeros({batch, k}, at::kBool);
    r.coords.resize(dims);
    for (auto& t : r.coords) t = at::zeros({batch, k}, at::kLong);
    if (plan->experts.empty()) {
      if (!o.allow_zero_outputs) {
        return NotFound(
            fmt::format("no live expert of grid '{}' was found in the DHT", o.grid_name));
      }
      r.outputs = at::zeros({batch, k, o.hidden});
      return r;
    }
    torch::autograd::variable_list xs;
    for (const auto& rows : plan->inputs) {
      xs.push_back(x.index_select(0, at::tensor(rows, at::kLong)));
    }
    // An input that always requires grad, so that the backward reaches the experts (and trains
    // them) also when x does not require grad (hivemind's DUMMY). A TensorList, not a vector:
    // apply() counts only tensors and TensorLists as inputs.
    xs.push_back(at::empty({0}).requires_grad_(true));
    torch::autograd::variable_list ys = MixtureCall::apply(at::TensorList(xs), plan);

    // Each input's slots: the experts' rows in the stacked outputs (row 0 is a zero row for
    // empty slots), their coordinates and whether they answered.
    std::vector<int64_t> offset_of(plan->experts.size() + 1, 1);
    for (size_t e = 0; e < plan->experts.size(); ++e) {
      offset_of[e + 1] = offset_of[e] + static_cast<int64_t>(plan->inputs[e].size());
    }
    at::Tensor pos = at::zeros({batch, k}, at::kLong);
    auto pos_at = pos.accessor<int64_t, 2>();
    auto alive_at = r.alive.accessor<bool, 2>();
    std::vector<at::TensorAccessor<int64_t, 2>> idx_at;
    for (auto& t : r.coords) idx_at.push_back(t.accessor<int64_t, 2>());
    for (int64_t i = 0; i < batch; ++i) {
      size_t answered = 0;
      const auto& s = slots[static_cast<size_t>(i)];
      for (size_t j = 0; j < s.size(); ++j) {
        const auto [e, row] = s[j];
        const auto jj = static_cast<int64_t>(j);
        pos_at[i][jj] = offset_of[e] + row;
        alive_at[i][jj] = plan->alive[e];
        answered += plan->alive[e];
        for (size_t d = 0; d < dims; ++d) idx_at[d][i][jj] = coords_of[e][d];
      }
      const size_t needed = std::max<size_t>(1, std::min(o.k_min, s.size()));
      if (!o.allow_zero_outputs && answered < needed) {
        return Unavailable(fmt::format(
            "mixture of experts: input {} got {} answers of the {} it needs (k_min); "
            "{} of {} expert calls failed or came late",
            i, answered, needed, std::count(plan->alive.begin(), plan->alive.end(), false),
            plan->alive.size()));
      }
    }
    ys.insert(ys.begin(), at::zeros({1, o.hidden}));
    r.outputs = at::cat(ys, 0).index_select(0, pos.flatten()).view({batch, k, o.hidden});
    return r;
  }
};

Result<std::unique_ptr<ExpertDispatcher>> ExpertDispatcher::Create(dht::Node& node,
                                                                   const MixtureOptions& options) {
  COLONY_RETURN_IF_ERROR(CheckMixtureOptions(options));
  auto impl = std::make_unique<Impl>(node, options);
  COLONY_ASSIGN_OR_RETURN(impl->searcher, BeamSearcher::Create(node, options.grid_name,
                                                               options.grid_size, options.search));
  return std::unique_ptr<ExpertDispatcher>(new ExpertDispatcher(std::move(impl)));
}

ExpertDispatcher::ExpertDispatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ExpertDispatcher::~ExpertDispatcher() { impl_->in_flight->WaitIdle(); }

Result<ExpertDispatcher::Routed> ExpertDispatcher::Call(const at::Tensor& x,
                                                        const at::Tensor& scores) {
  return impl_->Call(x, scores);
}

MixtureStats ExpertDispatcher::stats() const {
  return {.expert_calls = impl_->counters->calls.load(),
          .failed_calls = impl_->counters->failed.load()};
}

}  // namespace colony::moe
