// Rotary position embeddings as transformers computes them, with every rope_type Colony reads
// (config.h): the inverse frequencies per rope_type, and the cos/sin tables a block rotates its
// queries and keys with.
//
//   auto [cos, sin] = RotaryTables(config, /*length=*/t, /*offset=*/past, q.options());
//   q = q * cos + RotateHalf(q) * sin;
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "model/config.h"

namespace colony::model {

// cos and sin tables [length, head_dim] for a run of positions.
using RopeTables = std::pair<at::Tensor, at::Tensor>;

// The inverse frequencies [head_dim / 2] (float32, on `device`) for a sequence whose positions
// reach `seq_len` - 1 (only dynamic scaling depends on it), and the factor cos and sin are
// multiplied by (yarn's attention factor; 1 otherwise).
std::pair<at::Tensor, double> RopeInverseFrequencies(const LlamaConfig& config, int64_t seq_len,
                                                     const at::Device& device);

// The rotary embedding of one attention layer. The frequencies are computed once, at
// construction (on the CPU; moved to the inputs' device per call); only dynamic scaling past the
// trained length recomputes them for the sequence at hand. Tables() is const and safe to call
// from several threads.
class Rotary {
 public:
  explicit Rotary(const LlamaConfig& config);
  // cos and sin [length, head_dim] for positions offset .. offset + length - 1, computed in
  // float32 and returned in options' dtype.
  RopeTables Tables(int64_t length, int64_t offset, const at::TensorOptions& options) const;

 private:
  // inv_freq_ on `device`: copied there once, not at every call (a blocking host-to-GPU copy
  // per block and step otherwise).
  at::Tensor InverseFrequenciesOn(const c10::Device& device) const;

  LlamaConfig config_;
  at::Tensor inv_freq_;  // float32, CPU
  double scale_ = 1.0;
  struct DeviceCopy {
    std::mutex mu;
    at::Tensor inv_freq;  // on the device last asked for
  };
  std::shared_ptr<DeviceCopy> device_copy_ = std::make_shared<DeviceCopy>();
};

// Rotary(config).Tables(length, offset, options), for a one-off table.
RopeTables RotaryTables(const LlamaConfig& config, int64_t length, int64_t offset,
                        const at::TensorOptions& options);

// transformers' rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor RotateHalf(const at::Tensor& x);

}  // namespace colony::model
