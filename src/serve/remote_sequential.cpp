// RemoteSequential (remote_sequential.h): a torch autograd function whose forward runs on the
// swarm and whose backward asks the servers for gradients of the hidden states, deep prompts and
// LoRA adapters.
#include "serve/remote_sequential.h"

#include <torch/autograd.h>

#include <stdexcept>

#include "serve/client_internal.h"

namespace colony::serve {

namespace {

LoraSpec LoraFromSaved(torch::autograd::AutogradContext* ctx) {
  LoraSpec lora;
  lora.rank = ctx->saved_data["lora_rank"].toInt();
  lora.scale = ctx->saved_data["lora_scale"].toDouble();
  for (const auto& t : ctx->saved_data["lora_targets"].toList()) {
    lora.targets.push_back(t.get().toStringRef());
  }
  return lora;
}

class RemoteFunction : public torch::autograd::Function<RemoteFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor hidden,
                            at::Tensor prompts, at::TensorList adapters, int64_t manager,
                            int64_t start, int64_t end, int64_t lora_rank, double lora_scale,
                            std::vector<std::string> lora_targets) {
    auto* m = reinterpret_cast<SequenceManager*>(manager);
    if (prompts.numel() == 0) prompts = at::Tensor();
    const LoraSpec lora{lora_rank, lora_targets, lora_scale};
    const std::vector<at::Tensor> adapter_list(adapters.begin(), adapters.end());
    std::vector<SpanInput> inputs;
    auto out = RemoteForward(*m, start, end, hidden, prompts, &inputs, lora, adapter_list);
    if (!out.ok()) throw std::runtime_error(out.status().ToString());
    std::vector<at::Tensor> xs;
    std::vector<int64_t> bounds;
    for (auto& s : inputs) {
      xs.push_back(s.input);
      bounds.push_back(s.start);
      bounds.push_back(s.end);
    }
    ctx->saved_data["inputs"] = xs;
    ctx->saved_data["bounds"] = bounds;
    ctx->saved_data["manager"] = manager;
    ctx->saved_data["start"] = start;
    ctx->saved_data["prompts"] = prompts.defined() ? prompts.detach() : at::empty({0});
    std::vector<at::Tensor> detached;
    for (const auto& a : adapter_list) detached.push_back(a.detach());
    ctx->saved_data["adapters"] = detached;
    ctx->saved_data["lora_rank"] = lora_rank;
    ctx->saved_data["lora_scale"] = lora_scale;
    c10::List<std::string> names;
    for (const auto& t : lora_targets) names.push_back(t);
    ctx->saved_data["lora_targets"] = names;
    return *out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* m = reinterpret_cast<SequenceManager*>(ctx->saved_data["manager"].toInt());
    const auto xs = ctx->saved_data["inputs"].toTensorVector();
    const auto bounds = ctx->saved_data["bounds"].toIntVector();
    const int64_t start = ctx->saved_data["start"].toInt();
    at::Tensor prompts = ctx->saved_data["prompts"].toTensor();
    if (prompts.numel() == 0) prompts = at::Tensor();
    const auto adapters = ctx->saved_data["adapters"].toTensorVector();
    const LoraSpec lora = LoraFromSaved(ctx);
    const size_t per_block = lora.rank > 0 ? 2 * lora.targets.size() : 0;
    at::Tensor g = grads[0];
    std::vector<at::Tensor> prompt_grads(xs.size());
    std::vector<at::Tensor> adapter_grads(adapters.size());
    for (size_t i = xs.size(); i-- > 0;) {
      const int64_t s = bounds[2 * i], e = bounds[2 * i + 1];
      at::Tensor pr = prompts.defined() ? prompts.narrow(0, s - start, e - s) : at::Tensor();
      const size_t first = static_cast<size_t>(s - start) * per_block;
      const size_t last = static_cast<size_t>(e - start) * per_block;
      std::vector<at::Tensor> span_adapters(adapters.begin() + static_cast<std::ptrdiff_t>(first),
                                            adapters.begin() + static_cast<std::ptrdiff_t>(last));
      auto r = RemoteBackward(*m, s, e, xs[i], g, pr, lora, span_adapters);
      if (!r.ok()) throw std::runtime_error(r.status().ToString());
      g = r->hidden;
      prompt_grads[i] = r->prompts;
      for (size_t k = first; k < last; ++k) adapter_grads[k] = r->adapters[k - first];
    }
    torch::autograd::variable_list out{g.to(grads[0].device())};  // hidden's device
    out.push_back(prompts.defined() ? at::cat(prompt_grads, 0) : at::Tensor());
    for (auto& ga : adapter_grads) out.push_back(ga);
    for (int i = 0; i < 6; ++i) out.push_back(at::Tensor());  // the non-tensor arguments
    return out;
  }
};

}  // namespace

RemoteSequential::RemoteSequential(std::shared_ptr<SequenceManager> manager, int64_t start,
                                   int64_t end)
    : manager_(std::move(manager)),
      start_(start),
      end_(end < 0 ? manager_->options().num_blocks : end) {}

at::Tensor RemoteSequential::forward(const at::Tensor& hidden, const at::Tensor& prompts,
                                     const LoraSpec& lora,
                                     const std::vector<at::Tensor>& adapters) {
  // Autograd functions take no undefined tensors: an empty one stands for "no prompts".
  return RemoteFunction::apply(hidden, prompts.defined() ? prompts : at::empty({0}),
                               at::TensorList(adapters), reinterpret_cast<int64_t>(manager_.get()),
                               start_, end_, lora.rank, lora.scale, lora.targets);
}

Result<at::Tensor> RemoteSequential::Forward(const at::Tensor& hidden, const at::Tensor& prompts,
                                             const LoraSpec& lora,
                                             const std::vector<at::Tensor>& adapters) {
  return RemoteForward(*manager_, start_, end_, hidden, prompts, nullptr, lora, adapters);
}

std::unique_ptr<InferenceSession> RemoteSequential::OpenSession(SessionOptions options) {
  return std::make_unique<InferenceSession>(manager_, start_, end_, options);
}

}  // namespace colony::serve
