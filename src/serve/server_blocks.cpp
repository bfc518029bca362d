// The blocks a server hosts: loading only their tensors from a Hugging Face checkpoint (in the
// server's dtype, optionally int8-quantized), running hidden states through them with deep
// prompts, adapters and KV caches, and measuring their throughput for the announcements.
#include <fmt/format.h>

#include "serve/server_internal.h"

namespace colony::serve {

Result<at::ScalarType> ParseDType(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  return InvalidArgument(
      fmt::format("unsupported server dtype '{}'; use float32 or bfloat16", name));
}

std::string DTypeLabel(at::ScalarType t) { return t == at::kBFloat16 ? "bfloat16" : "float32"; }

int64_t CacheBytesPerToken(const model::LlamaConfig& config, at::ScalarType dtype) {
  return 2 * config.num_kv_heads * config.head_dim() *
         static_cast<int64_t>(c10::elementSize(dtype));
}

Status BlockServer::Impl::LoadBlocks(int64_t first, int64_t last) {
  COLONY_ASSIGN_OR_RETURN(model::LlamaBlockRange range,
                          model::LoadLlamaBlocks(options_.model_dir, first, last));
  int64_t bytes = 0;
  for (auto& b : range.blocks) {
    b->eval();
    for (auto& p : b->parameters()) p.set_requires_grad(false);
    b->to(device_, dtype_);
    b->Quantize(quantization_);
    for (const auto& p : b->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    for (const auto& p : b->buffers()) bytes += static_cast<int64_t>(p.nbytes());
  }
  blocks_ = std::move(range.blocks);
  std::lock_guard lock(mu_);
  weight_bytes_ = bytes;
  return Status();
}

// Hidden states of positions offset.. through blocks [start, end) (absolute indices within
// ours). Deep prompts [end-start, B or 1, P, H] are added to the positions < P before each block.
at::Tensor BlockServer::Impl::RunBlocks(int64_t start, int64_t end, at::Tensor h, int64_t offset,
                                        std::vector<model::KVCache>* caches,
                                        const at::Tensor& prompts,
                                        const std::vector<model::BlockAdapters>* adapters) {
  if (start >= end) return h;
  // One set of rotary tables for all the blocks (they share the model's config).
  const model::RopeTables rope =
      blocks_[static_cast<size_t>(start - first_)]->Rope(h.size(1), offset, h.options());
  for (int64_t i = start; i < end; ++i) {
    if (prompts.defined() && offset < prompts.size(2)) {
      const int64_t n = std::min(prompts.size(2) - offset, h.size(1));
      at::Tensor pr = prompts[i - start].narrow(1, offset, n).to(h.device(), h.scalar_type());
      h = at::cat({h.narrow(1, 0, n) + pr, h.narrow(1, n, h.size(1) - n)}, 1);
    }
    h = blocks_[static_cast<size_t>(i - first_)]->forward(
        h, offset, caches ? &(*caches)[static_cast<size_t>(i - start)] : nullptr,
        adapters ? &(*adapters)[static_cast<size_t>(i - start)] : nullptr, &rope);
  }
  return h;
}

void BlockServer::Impl::MeasureThroughput() {
  const int64_t n = last_ - first_;
  if (options_.throughput_override > 0) {
    throughput_ = inference_rps_ = options_.throughput_override;
    return;
  }
  at::NoGradGuard no_grad;
  if (options_.torch_threads > 0) at::set_num_threads(options_.torch_threads);
  const int64_t tokens = 16;
  at::Tensor x = at::randn({1, tokens, config_.hidden_size}).to(device_, dtype_);
  RunBlocks(first_, last_, x, 0, nullptr, {});
  model::Synchronize(device_);
  auto t0 = Clock::now();
  const int reps = 3;
  for (int i = 0; i < reps; ++i) RunBlocks(first_, last_, x, 0, nullptr, {});
  model::Synchronize(device_);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  throughput_ = tokens * reps / std::max(secs, 1e-6) * static_cast<double>(n);
  std::vector<model::KVCache> caches(static_cast<size_t>(n));
  at::Tensor one = at::randn({1, 1, config_.hidden_size}).to(device_, dtype_);
  RunBlocks(first_, last_, one, 0, &caches, {});
  model::Synchronize(device_);
  const int steps = 8;
  t0 = Clock::now();
  for (int i = 1; i <= steps; ++i) RunBlocks(first_, last_, one, i, &caches, {});
  model::Synchronize(device_);
  secs = std::chrono::duration<double>(Clock::now() - t0).count();
  inference_rps_ = steps / std::max(secs, 1e-6) * static_cast<double>(n);
}

}  // namespace colony::serve
