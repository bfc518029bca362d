// RemoteSequential: a range of a served model's blocks as one differentiable module. Its forward
// pass runs on the swarm's servers; its backward pass asks them for gradients (w.r.t. the hidden
// states, deep prompts and LoRA adapters), so a client trains prompts or adapters through frozen
// remote blocks.
//
//   RemoteSequential remote(manager);
//   at::Tensor out = remote.forward(hidden);  // differentiable (autograd)
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "core/status.h"
#include "serve/inference_session.h"
#include "serve/remote_forward.h"
#include "serve/routing.h"

namespace colony::serve {

// Blocks [start, end) of a model served by the swarm, as one differentiable module.
class RemoteSequential {
 public:
  explicit RemoteSequential(std::shared_ptr<SequenceManager> manager, int64_t start = 0,
                            int64_t end = -1);

  // hidden [B, T, H] through the blocks. Deep prompts [end-start, B, P, H] (optional) are added
  // to the first P positions before each block. Differentiable w.r.t. hidden and prompts: the
  // backward pass asks the servers for gradients. Throws std::runtime_error when the swarm
  // cannot serve the request after every retry (as LibTorch modules throw).
  // LoRA adapters (flat, see LoraSpec) are applied by the servers and differentiable too.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& prompts = {},
                     const LoraSpec& lora = {}, const std::vector<at::Tensor>& adapters = {});
  // The same without autograd, reporting failures as a Status.
  Result<at::Tensor> Forward(const at::Tensor& hidden, const at::Tensor& prompts = {},
                             const LoraSpec& lora = {},
                             const std::vector<at::Tensor>& adapters = {});

  std::unique_ptr<InferenceSession> OpenSession(SessionOptions options);

  int64_t start() const { return start_; }
  int64_t end() const { return end_; }
  SequenceManager& manager() { return *manager_; }

 private:
  std::shared_ptr<SequenceManager> manager_;
  int64_t start_, end_;
};

}  // namespace colony::serve
