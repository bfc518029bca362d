#include "moe/expert.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <filesystem>

#include "core/log.h"

namespace colony::moe {

struct Expert::Impl {
  ExpertOptions options;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  uint64_t steps = 0;
  uint64_t skipped_steps = 0;  // backward calls whose gradients were not finite
};

at::Tensor ExpertFunction(const at::Tensor& x, const std::vector<at::Tensor>& p) {
  if (p.size() == 3) return at::linear(at::silu(at::linear(x, p[0])) * at::linear(x, p[2]), p[1]);
  return at::linear(at::gelu(at::linear(x, p[0], p[1])), p[2], p[3]);
}

namespace {

// The gradients' global L2 norm, accumulated in double (float32 squares overflow past ~1.8e19).
double GradNorm(const std::vector<at::Tensor>& params) {
  double squares = 0;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    const double n =
        at::linalg_vector_norm(p.grad(), 2, c10::nullopt, false, at::kDouble).item<double>();
    squares += n * n;
  }
  return std::sqrt(squares);
}

// Scales the gradients by max_norm / their norm when that is below 1 (as PyTorch's
// clip_grad_norm_, whose 1e-6 keeps a zero norm from dividing).
void ClipGradNorm(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  const double scale = max_norm / (norm + 1e-6);
  if (scale >= 1) return;
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(scale);
  }
}

}  // namespace

Result<std::unique_ptr<Expert>> Expert::Create(const ExpertOptions& o) {
  const int64_t ffn = o.ffn_hidden > 0 ? o.ffn_hidden : 4 * o.hidden;
  if (o.hidden < 1 || o.hidden > 65536 || ffn > 4 * 65536) {
    return InvalidArgument(fmt::format("expert sizes {} x {} outside [1, 65536]", o.hidden, ffn));
  }
  if (!std::isfinite(o.lr) || o.lr < 0) {
    return InvalidArgument(
        fmt::format("expert learning rate {} is not a non-negative number", o.lr));
  }
  if (Status st = o.schedule.Check({.warmup = "warmup steps", .total = "total steps"}); !st.ok())
    return st.WithContext("expert learning rate");
  if (!std::isfinite(o.clip_grad_norm) || o.clip_grad_norm < 0) {
    return InvalidArgument(fmt::format(
        "expert gradient clipping norm {} is not a non-negative number", o.clip_grad_norm));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  impl->options.ffn_hidden = ffn;
  // PyTorch's nn.Linear init: weights and biases uniform in +-1/sqrt(fan_in).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto uniform = [&](std::vector<int64_t> shape, int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return at::empty(shape, at::kFloat).uniform_(-bound, bound, gen).requires_grad_(true);
  };
  if (o.kind == "ffn") {
    impl->params = {uniform({ffn, o.hidden}, o.hidden), uniform({ffn}, o.hidden),
                    uniform({o.hidden, ffn}, ffn), uniform({o.hidden}, ffn)};
  } else if (o.kind == "swiglu") {
    impl->params = {uniform({ffn, o.hidden}, o.hidden), uniform({o.hidden, ffn}, ffn),
                    uniform({ffn, o.hidden}, o.hidden)};
  } else {
    return InvalidArgument(
        fmt::format("unknown expert kind '{}' (ffn or swiglu)", o.kind.substr(0, 32)));
  }
  if (o.optimizer == "adam") {
    impl->optimizer =
        std::make_unique<torch::optim::Adam>(impl->params, torch::optim::AdamOptions(o.lr));
  } else if (o.optimizer == "sgd") {
    impl->optimizer =
        std::make_unique<torch::optim::SGD>(impl->params, torch::optim::SGDOptions(o.lr));
  } else {
    return InvalidArgument(
        fmt::format("unknown expert optimizer '{}' (adam or sgd)", o.optimizer.substr(0, 32)));
  }
  return std::unique_ptr<Expert>(new Expert(std::move(impl)));
}

Expert::Expert(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Expert::~Expert() = default;

at::Tensor Expert::Forward(const at::Tensor& x) {
  at::NoGradGuard no_grad;
  return ExpertFunction(x, impl_->params);
}

at::Tensor Expert::Backward(const at::Tensor& x, const at::Tensor& grad_y) {
  at::Tensor input = x.detach().requires_grad_(true);
  impl_->optimizer->zero_grad();
  at::Tensor y = ExpertFunction(input, impl_->params);
  torch::autograd::backward({y}, {grad_y});
  const double norm = GradNorm(impl_->params);
  // Finite inputs and weights can still overflow: a step would make every weight NaN. Finite
  // gradients beyond kMaxStepGradNorm (unclipped) are skipped too: their squares overflow
  // float32 in Adam's second moment, which then stays infinite and freezes the expert for good
  // (one client's request would end its training for everyone).
  if (!std::isfinite(norm) || (impl_->options.clip_grad_norm <= 0 && norm > kMaxStepGradNorm)) {
    COLONY_LOG_WARN("expert: gradient norm {:g} is {}; its optimizer step is skipped", norm,
                    std::isfinite(norm) ? "too large to step with" : "not finite");
    impl_->optimizer->zero_grad();
    ++impl_->skipped_steps;
    return input.grad();
  }
  if (impl_->options.clip_grad_norm > 0) {
    ClipGradNorm(impl_->params, norm, impl_->options.clip_grad_norm);
  }
  const double rate = impl_->options.lr;  // the schedule's base: this server's --lr
  train::SetLearningRates(*impl_->optimizer, {&rate, 1},
                          impl_->options.schedule.Factor(static_cast<int64_t>(impl_->steps)));
  impl_->optimizer->step();
  ++impl_->steps;
  return input.grad();
}

std::vector<at::Tensor> Expert::parameters() const { return impl_->params; }

std::vector<at::Tensor> BackwardBatch(Expert& expert,
                                      const std::vector<std::pair<at::Tensor, at::Tensor>>& batch) {
  std::vector<at::Tensor> out;
  if (batch.empty()) return out;
  if (batch.size() == 1) {
    out.push_back(expert.Backward(batch[0].first, batch[0].second));
    return out;
  }
  std::vector<at::Tensor> xs, gs;
  std::vector<int64_t> rows;
  for (const auto& [x, g] : batch) {
    xs.push_back(x);
    gs.push_back(g);
    rows.push_back(x.size(0));
  }
  const uint64_t skipped = expert.skipped_steps();
  const at::Tensor whole = expert.Backward(at::cat(xs, 0), at::cat(gs, 0));
  if (expert.skipped_steps() == skipped) {
    for (const auto& part : whole.split_with_sizes(rows, 0)) out.push_back(part.contiguous());
    return out;
  }
  COLONY_LOG_WARN(
      "expert: the step of a batch of {} backward requests was skipped; each runs alone",
      batch.size());
  for (const auto& [x, g] : batch) out.push_back(expert.Backward(x, g));
  return out;
}

Status Expert::SetWeights(const std::vector<at::Tensor>& weights) {
  if (weights.size() != impl_->params.size()) {
    return InvalidArgument(fmt::format("a {} expert has {} weights, got {}", impl_->options.kind,
                                       impl_->params.size(), weights.size()));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].defined() || !weights[i].sizes().equals(impl_->params[i].sizes())) {
      return InvalidArgument(fmt::format(
          "expert weight {} has shape [{}], this expert's is [{}]", i,
          weights[i].defined() ? fmt::format("{}", fmt::join(weights[i].sizes(), ", ")) : "",
          fmt::join(impl_->params[i].sizes(), ", ")));
    }
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < weights.size(); ++i) impl_->params[i].copy_(weights[i]);
  return Status::Ok();
}

Status Expert::Save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    for (size_t i = 0; i < impl_->params.size(); ++i) {
      archive.write(fmt::format("param{}", i), impl_->params[i].detach());
    }
    archive.write("steps", at::tensor(static_cast<int64_t>(impl_->steps)));
    torch::serialize::OutputArchive opt;
    impl_->optimizer->save(opt);
    archive.write("optimizer", opt);
    archive.save_to(tmp);
  } catch (const c10::Error& e) {
    return Internal(fmt::format("saving expert to {}: {}", path, e.what_without_backtrace()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal(fmt::format("saving expert to {}: {}", path, ec.message()));
  return Status::Ok();
}

Status Expert::Load(const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    std::vector<at::Tensor> loaded(impl_->params.size());
    for (size_t i = 0; i < loaded.size(); ++i) {
      archive.read(fmt::format("param{}", i), loaded[i]);
      if (!loaded[i].sizes().equals(impl_->params[i].sizes()) ||
          loaded[i].scalar_type() != at::kFloat) {
        return InvalidArgument(fmt::format(
            "expert checkpoint {}: parameter {} has shape [{}], this expert's is [{}]", path, i,
            fmt::join(loaded[i].sizes(), ", "), fmt::join(impl_->params[i].sizes(), ", ")));
      }
    }
    at::Tensor steps;
    archive.read("steps", steps);
    if (steps.numel() != 1 || steps.scalar_type() != at::kLong || steps.item<int64_t>() < 0) {
      return InvalidArgument(
          fmt::format("expert checkpoint {}: its step count is not a count", path));
    }
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < loaded.size(); ++i) impl_->params[i].copy_(loaded[i]);
    }
    impl_->optimizer->load(opt);
    impl_->steps = static_cast<uint64_t>(steps.item<int64_t>());
  } catch (const c10::Error& e) {
    return InvalidArgument(
        fmt::format("expert checkpoint {} cannot be read: {}", path, e.what_without_backtrace()));
  }
  return Status::Ok();
}
int64_t Expert::hidden() const { return impl_->options.hidden; }
uint64_t Expert::steps() const { return impl_->steps; }
uint64_t Expert::skipped_steps() const { return impl_->skipped_steps; }

}  // namespace colony::moe
