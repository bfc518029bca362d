// serve.forward and serve.backward: hidden states through a range of the server's blocks, and
// gradients w.r.t. the inputs (recomputing the forward), with the client's deep prompts and LoRA
// adapters applied for the request only.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>

#include "model/finite.h"
#include "runtime/tensor_io.h"
#include "serve/server_internal.h"

namespace colony::serve {

bool AllFinite(const Tuning& t) {
  bool finite = model::AllFinite(t.prompts);
  for (const auto& a : t.lora) finite = finite && model::AllFinite(a);
  return finite;
}

// The adapters of `blocks` blocks as model::BlockAdapters, from flat tensors (block, target,
// (A, B)).
std::vector<model::BlockAdapters> MakeAdapters(const std::vector<at::Tensor>& flat, int64_t blocks,
                                               const TuningSpec& spec) {
  std::vector<model::BlockAdapters> out;
  if (flat.empty()) return out;
  out.resize(static_cast<size_t>(blocks));
  size_t k = 0;
  for (auto& block : out) {
    for (const auto& name : spec.lora_targets) {
      model::LoraAdapter* a = block.Find(name);
      a->a = flat[k++];
      a->b = flat[k++];
      a->scale = spec.lora_scale;
    }
  }
  return out;
}

// Validates a hidden-state tensor [B, T, H] from a client.
Result<at::Tensor> BlockServer::Impl::ReadHidden(const net::TensorFrame& frame,
                                                 int64_t max_elements) const {
  COLONY_ASSIGN_OR_RETURN(
      at::Tensor h, runtime::FromFrame(frame, {.max_elements = static_cast<uint64_t>(max_elements),
                                               .allowed_dtypes = kFloatDTypes,
                                               .rank = 3,
                                               .allowed_codecs = CompressedBoundaryCodecs()}));
  if (h.size(2) != config_.hidden_size) {
    return InvalidArgument(
        fmt::format("hidden states have size {} in the last dimension; this "
                    "model's hidden size is {}",
                    h.size(2), config_.hidden_size));
  }
  if (h.size(0) < 1 || h.size(0) > options_.max_batch) {
    return InvalidArgument(
        fmt::format("batch of {} outside [1, {}]", h.size(0), options_.max_batch));
  }
  if (h.size(1) < 1 || h.size(1) > max_length_) {
    return InvalidArgument(
        fmt::format("{} tokens per sequence outside [1, {}]", h.size(1), max_length_));
  }
  return h;
}

Result<Tuning> BlockServer::Impl::ReadTuning(const std::vector<net::TensorFrame>& tensors,
                                             size_t first, int64_t start, int64_t end,
                                             const TuningSpec& spec, int64_t batch,
                                             int64_t max_prompt) const {
  // The spec's rank, targets and scale were checked when the request was decoded.
  const int64_t p = spec.prompt_length, rank = spec.lora_rank;
  const auto& targets = spec.lora_targets;
  const size_t lora_count = rank > 0 ? 2 * static_cast<size_t>(end - start) * targets.size() : 0;
  const size_t want = first + (p > 0 ? 1 : 0) + lora_count;
  if (tensors.size() != want) {
    return InvalidArgument(fmt::format("expected {} tensors, got {}", want, tensors.size()));
  }
  const auto max_elements = static_cast<uint64_t>(options_.max_request_elements);
  Tuning out;
  size_t next = first;
  if (p > 0) {
    COLONY_ASSIGN_OR_RETURN(out.prompts,
                            runtime::FromFrame(tensors[next++], {.max_elements = max_elements,
                                                                 .allowed_dtypes = kFloatDTypes,
                                                                 .rank = 4}));
    const auto& pr = out.prompts;
    if (pr.size(0) != end - start || (pr.size(1) != batch && pr.size(1) != 1) || pr.size(2) != p ||
        pr.size(3) != config_.hidden_size || p > max_prompt) {
      return InvalidArgument(fmt::format(
          "deep prompts must have shape [{}, {} or 1, {}, {}] with {} <= {} tokens, got [{}]",
          end - start, batch, p, config_.hidden_size, p, max_prompt, fmt::join(pr.sizes(), ", ")));
    }
  }
  for (size_t i = 0; i < lora_count; ++i) {
    const std::string& target = targets[(i / 2) % targets.size()];
    const auto shape = config_.ProjectionShape(target);
    if (!shape) {
      return InvalidArgument(
          fmt::format("LoRA target {} is not a projection of this model's blocks", target));
    }
    COLONY_ASSIGN_OR_RETURN(at::Tensor t,
                            runtime::FromFrame(tensors[next++], {.max_elements = max_elements,
                                                                 .allowed_dtypes = kFloatDTypes,
                                                                 .rank = 2}));
    const bool is_a = i % 2 == 0;
    const int64_t rows = is_a ? rank : shape->second, cols = is_a ? shape->first : rank;
    if (t.size(0) != rows || t.size(1) != cols) {
      return InvalidArgument(fmt::format("LoRA {} for {} must have shape [{}, {}]",
                                         is_a ? "A" : "B", target, rows, cols));
    }
    out.lora.push_back(t);
  }
  return out;
}

// A trainable server's pass: the forward, or the backward that also leaves the blocks'
// parameter gradients in their .grad (BlockTraining::Run takes them). The result stays on the
// server's device (the reply is encoded from there).
Result<std::vector<at::Tensor>> BlockServer::Impl::TrainingPass(int64_t start, int64_t end,
                                                                const at::Tensor& x,
                                                                const at::Tensor& grad_out) {
  const bool backward = grad_out.defined();
  at::AutoGradMode grad_mode(backward);
  at::Tensor xin = x.to(device_, dtype_).detach().requires_grad_(backward);
  at::Tensor out = RunBlocks(start, end, xin, 0, nullptr, {});
  if (!backward) return std::vector<at::Tensor>{out.detach()};
  out.backward(grad_out.to(out.device(), out.scalar_type()));
  return std::vector<at::Tensor>{xin.grad()};
}

asio::awaitable<Result<net::Message>> BlockServer::Impl::Forward(std::string source, net::Message m,
                                                                 bool backward) {
  COLONY_CO_RETURN_IF_ERROR(CheckServing());
  // A place among the requests waiting or running (given back when this request ends).
  net::SourceBudget::Lease place = queued_requests_.Open(source);
  COLONY_CO_RETURN_IF_ERROR(place.Take(1));
  auto req = DecodeBlockRequest(m.meta);
  if (!req.ok()) co_return req.status();
  const int64_t start = req->start, end = req->end;
  COLONY_CO_RETURN_IF_ERROR(CheckRange(start, end));
  const TuningSpec spec = req->tuning;
  const size_t base = backward ? 2 : 1;
  if (m.tensors.size() < base) {
    co_return InvalidArgument(
        fmt::format("expected at least {} tensors, got {}", base, m.tensors.size()));
  }
  auto x = ReadHidden(m.tensors[0], options_.max_request_elements);
  if (!x.ok()) co_return x.status();
  at::Tensor grad_out;
  if (backward) {
    auto g = ReadHidden(m.tensors[1], options_.max_request_elements);
    if (!g.ok()) co_return g.status();
    if (!g->sizes().equals(x->sizes())) {
      co_return InvalidArgument("grad_outputs and inputs have different shapes");
    }
    grad_out = *g;
  }
  auto tuning = ReadTuning(m.tensors, base, start, end, spec, x->size(0), x->size(1));
  if (!tuning.ok()) co_return tuning.status();
  if (training_ && (spec.prompt_length > 0 || spec.lora_rank > 0)) {
    co_return InvalidArgument(
        "this server trains its blocks (a SWARM stage): it takes no deep prompts or adapters");
  }
  // The decoded tensors wait and run under the byte budget; the received message is let go.
  uint64_t bytes = x->nbytes() + (grad_out.defined() ? grad_out.nbytes() : 0);
  if (tuning->prompts.defined()) bytes += tuning->prompts.nbytes();
  for (const auto& t : tuning->lora) bytes += t.nbytes();
  m = net::Message();
  net::SourceBudget::Lease held = held_request_bytes_.Open(std::move(source));
  COLONY_CO_RETURN_IF_ERROR(held.Take(bytes));
  const at::ScalarType client_dtype = x->scalar_type();
  auto self = shared_from_this();
  const TrainingCall call{.epoch = req->epoch,
                          .samples = x->size(0),
                          .backward = backward,
                          .start = start,
                          .end = end,
                          .microbatch = backward ? req->microbatch : 0,
                          .replay = backward && req->replay,
                          .attempt = backward ? req->attempt : 0};
  // Named first: g++ 12 mishandles temporaries (lambdas) inside co_await expressions.
  auto compute = [self, start, end, x = *x, grad_out, backward, call, tuning = std::move(*tuning),
                  spec]() -> Result<std::vector<at::Tensor>> {
    const bool finite = model::AllFinite(x) && model::AllFinite(grad_out) && AllFinite(tuning);
    if (!finite) return InvalidArgument("inputs contain NaN or infinity");
    if (!self->Holds(start, end)) return self->MovedError();
    if (self->training_) {
      Result<std::vector<at::Tensor>> out = std::vector<at::Tensor>{};
      Status st = self->training_->Run(call, [&]() -> Status {
        out = self->TrainingPass(start, end, x, grad_out);
        return out.status();
      });
      if (!st.ok()) return st;
      return out;
    }
    at::AutoGradMode grad_mode(backward);
    at::Tensor xin =
        model::ToDevice(x, self->device_, self->dtype_).detach().requires_grad_(backward);
    at::Tensor pin;
    if (tuning.prompts.defined()) {
      pin = tuning.prompts.to(self->device_, self->dtype_).detach().requires_grad_(backward);
    }
    std::vector<at::Tensor> lin;
    for (const auto& t : tuning.lora) {
      lin.push_back(t.to(self->device_, self->dtype_).detach().requires_grad_(backward));
    }
    const std::vector<model::BlockAdapters> adapters = MakeAdapters(lin, end - start, spec);
    at::Tensor out =
        self->RunBlocks(start, end, xin, 0, nullptr, pin, adapters.empty() ? nullptr : &adapters);
    if (!backward) return std::vector<at::Tensor>{out};
    std::vector<at::Tensor> inputs{xin};
    if (pin.defined()) inputs.push_back(pin);
    for (const auto& t : lin) inputs.push_back(t);
    auto grads = torch::autograd::grad({out}, inputs,
                                       {model::ToDevice(grad_out, out.device(), out.scalar_type())},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    std::vector<at::Tensor> res;
    for (size_t i = 0; i < grads.size(); ++i) {
      res.push_back(grads[i].defined() ? grads[i] : at::zeros_like(inputs[i]));
    }
    return res;
  };
  // The hidden states (or their gradient) in the client's codec, prompt and adapter gradients
  // raw, all in the client's dtype; encoded in the compute task, off the network threads (a GPU
  // server's in a codec that allows it on the GPU: runtime/device_codec.h).
  const compression::Codec codec = req->boundary_codec;
  auto work = [compute = std::move(compute), codec,
               client_dtype]() -> Result<std::vector<net::TensorFrame>> {
    auto tensors = compute();
    if (!tensors.ok()) return tensors.status();
    std::vector<net::TensorFrame> frames;
    for (size_t i = 0; i < tensors->size(); ++i) {
      const at::Tensor t = (*tensors)[i].to(client_dtype);
      auto f = runtime::ToFrame(t, i == 0 ? codec : compression::Codec::kNone,
                                {.block_size = kBoundaryBlockSize, .max_threads = 1});
      if (!f.ok()) return f.status();
      frames.push_back(std::move(*f));
    }
    return frames;
  };
  auto result = co_await runtime::RunOnPool<std::vector<net::TensorFrame>>(
      pool_, runtime::kPriorityTraining, std::move(work));
  if (!result.ok()) co_return result.status();
  {
    std::lock_guard lock(mu_);
    ++(backward ? backwards_ : forwards_);
  }
  net::Message reply;
  reply.tensors = std::move(*result);
  co_return reply;
}

asio::awaitable<Result<net::Message>> BlockServer::Impl::Fence(net::Message m) {
  if (!training_) {
    co_return FailedPrecondition("this server does not train its blocks: it takes no fences");
  }
  auto req = DecodeFence(m.meta);
  if (!req.ok()) co_return req.status();
  COLONY_CO_RETURN_IF_ERROR(CheckRange(req->start, req->end));
  const bool taken = training_->Fence(req->microbatch, req->start, req->end, req->attempt);
  co_return net::Message(EncodeFenceReply({.taken = taken}));
}

}  // namespace colony::serve
