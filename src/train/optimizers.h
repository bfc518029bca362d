// Optimizers that fit small memory, as LibTorch optimizers, and how to make one by name.
//
//  - Lamb: layer-wise adaptive Adam (You et al. 2019), as DeDLOC/hivemind's CPULAMB: stable at
//    the huge, variable batch sizes of collaborative training.
//  - Adam8bit: Adam/AdamW whose two moments are stored as 8-bit codes with one float32 absmax per
//    block (Dettmers et al. 2022, "8-bit optimizers via block-wise quantization"): 2 bytes of state
//    per parameter instead of 8.
//
//   auto opt = MakeOptimizer("lamb", model_params, {.lr = 1e-3, .weight_decay = 0.01});
//   loss.backward(); (*opt)->step();
//
// Their state, like that of torch's SGD and Adam(W), can be exported and imported as named
// tensors (optimizer_state.h).
//
// Both optimizers save()/load() their full state through torch::serialize archives like the
// built-in ones. They are not thread-safe (like all torch optimizers): one step at a time, and
// no export while a step runs.
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::train {

// ---------------------------------------------------------------------------------------------
// LAMB

struct LambOptions : public torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): torch loads with (0)
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  // Upper bound of ||w|| in the trust ratio, so that large-norm layers do not take huge steps.
  TORCH_ARG(double, clamp_value) = 10;
  TORCH_ARG(bool, bias_correction) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct LambParamState : public torch::optim::OptimizerCloneableParamState<LambParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// Per parameter tensor w with gradient g, at step t (bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, both 1
// without bias_correction):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * w
//   r = min(||w||, clamp_value) / ||u||   (1 when either norm is 0)
//   w -= lr * r * u
// The trust ratio is computed on the device as a tensor (no host sync per parameter).
class Lamb : public torch::optim::Optimizer {
 public:
  explicit Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LambOptions defaults = {});
  explicit Lamb(std::vector<torch::Tensor> params, LambOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

// ---------------------------------------------------------------------------------------------
// Adam with 8-bit block-wise states

struct Adam8bitOptions : public torch::optim::OptimizerCloneableOptions<Adam8bitOptions> {
  Adam8bitOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): torch loads with (0)
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  // false: Adam's L2 penalty (weight_decay * w added to the gradient); true: AdamW's decoupled
  // decay (w *= 1 - lr * weight_decay before the update).
  TORCH_ARG(bool, decoupled_weight_decay) = false;
  // Elements per absmax block: smaller blocks isolate outliers better and cost 4 bytes each.
  TORCH_ARG(int64_t, block_size) = 2048;
  // Parameters with fewer elements keep float32 states (as bitsandbytes does): they are cheap,
  // and biases/norm gains are the most sensitive to quantization noise.
  TORCH_ARG(int64_t, min_8bit_size) = 4096;
  // States live in host memory even when the parameters are on an accelerator: device memory is
  // the scarce one, and each step streams the parameters and gradients through the host in
  // chunks of about 1M elements. false keeps the states on the parameters' device and updates
  // them there with tensor ops (also chunk by chunk).
  TORCH_ARG(bool, state_on_cpu) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;

  // The layout of a parameter's state under these options: where it lives, whether it is
  // quantized (parameters of at least min_8bit_size elements), and its number of absmax blocks.
  c10::Device state_device(const torch::Tensor& p) const;
  bool uses_8bit(const torch::Tensor& p) const;
  int64_t num_blocks(const torch::Tensor& p) const;
};

// Either exp_avg/exp_avg_sq (float32, the parameter's shape; small parameters) or the four
// quantized tensors (large parameters): *_codes are flat uint8 with one code per element and
// *_absmax float32 with one scale per block. A value is map[code] * absmax[block].
struct Adam8bitParamState : public torch::optim::OptimizerCloneableParamState<Adam8bitParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, exp_avg_codes);
  TORCH_ARG(torch::Tensor, exp_avg_absmax);
  TORCH_ARG(torch::Tensor, exp_avg_sq_codes);
  TORCH_ARG(torch::Tensor, exp_avg_sq_absmax);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

// Each step, for each block: dequantize both moments into a reused scratch buffer, do the Adam
// update in float32 (exactly torch::optim::Adam's arithmetic), take the new absmax of each moment
// and requantize by nearest value (not stochastic). The full float32 moments never exist at once.
// With min_8bit_size larger than every parameter this is torch's Adam/AdamW bit for bit.
class Adam8bit : public torch::optim::Optimizer {
 public:
  explicit Adam8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    Adam8bitOptions defaults = {});
  explicit Adam8bit(std::vector<torch::Tensor> params, Adam8bitOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Bytes held by the optimizer states (codes, absmaxes and float32 states of small parameters).
  size_t StateBytes() const;
};

// ---------------------------------------------------------------------------------------------
// The 8-bit quantization maps (exposed for tests and tools)

enum class QuantMap : uint8_t {
  // For exp_avg: Dettmers' dynamic tree map (bitsandbytes' create_dynamic_map(signed=True)):
  // 0, +1 and 127 values of each sign whose magnitudes cover the decades 1e-7..1 with 2^i
  // linearly spaced values in decade i (i = 0..6), so precision follows magnitude down to the
  // smallest level, 5.5e-7 of the block's absmax. Values below half of it round to 0, which is
  // harmless in the numerator of the update.
  kSigned,
  // For exp_avg_sq: 0, then log-spaced levels: 200 over [1e-3, 1] (neighbours 3.5% apart: at most
  // ~1.8% relative error) and 55 over [1e-8, 1e-3) (23% apart: at most ~11%). Second moments span
  // the square of the gradients' range, and a value rounded down to 0 sits in the denominator
  // and explodes the update, so *relative* precision over many decades matters here (the
  // dynamic tree bottoms out at 1e-7, a linear map at 1/510). The levels are dense near the
  // absmax because with nearest rounding a moment whose per-step change is below half a gap
  // sticks, and lagging second moments make steps too long: with one uniform log scale over
  // 1e-8..1 (7.5% gaps) a test MLP ended 8% below fp32 Adam's loss after 100 steps, with these
  // levels 3% (stochastic rounding would remove the bias; not implemented).
  // Positive values below the smallest level round up to it, never to 0: a too-large v only
  // shortens a step.
  kUnsigned,
};

// The 256 levels of a map, ascending, normalized to [-1, 1] or [0, 1].
const std::array<float, 256>& QuantLevels(QuantMap map);
// Code of the level nearest to x (x normalized by its block's absmax).
uint8_t QuantizeValue(QuantMap map, float x);

// Block-wise quantization of x: absmax.size() == ceil(x.size() / block_size), codes.size() ==
// x.size(). A block of zeros gets absmax 0.
void QuantizeBlockwise(QuantMap map, std::span<const float> x, size_t block_size,
                       std::span<uint8_t> codes, std::span<float> absmax);
void DequantizeBlockwise(QuantMap map, std::span<const uint8_t> codes,
                         std::span<const float> absmax, size_t block_size, std::span<float> out);

// Sets the learning rate of every parameter group (and of the defaults used by groups added
// later). InvalidArgument for a negative or non-finite lr; Unimplemented when the optimizer's
// options have no learning rate (torch's OptimizerOptions base).
Status SetLearningRate(torch::optim::Optimizer& optimizer, double lr);
// The first group's learning rate (the defaults' without groups); NaN when there is none.
double GetLearningRate(const torch::optim::Optimizer& optimizer);

struct OptimizerConfig {
  double lr = 1e-3;
  std::tuple<double, double> betas{0.9, 0.999};  // adam, adamw, lamb, adam8bit, adamw8bit
  std::optional<double> eps = std::nullopt;  // unset: each optimizer's default (1e-8, LAMB 1e-6)
  double weight_decay = 0;    // L2 for sgd/adam/adam8bit, decoupled for adamw/adamw8bit/lamb
  double momentum = 0;        // sgd
  bool nesterov = false;      // sgd (needs momentum > 0)
  int64_t block_size = 2048;  // adam8bit, adamw8bit
  int64_t min_8bit_size = 4096;
  bool state_on_cpu = true;
  double clamp_value = 10;  // lamb
};

// Names: "sgd", "adam", "adamw", "lamb", "adam8bit", "adamw8bit" (case-insensitive).
// InvalidArgument for an unknown name (listing the valid ones) or out-of-range settings.
Result<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(std::string_view name,
                                                               std::vector<torch::Tensor> params,
                                                               const OptimizerConfig& cfg);

namespace internal {
// Tests only: run Adam8bit's device (tensor-op) kernel even for states on the CPU, so that the
// path taken for accelerator-resident states is exercised on machines without one.
void ForceAdam8bitTensorKernelForTesting(bool force);
}  // namespace internal

}  // namespace colony::train
