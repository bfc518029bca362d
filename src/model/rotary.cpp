// Rotary inverse frequencies per rope_type (default, linear, dynamic NTK, llama3, yarn), in
// float32 as transformers computes them, and the cos/sin tables built from them.
#include "model/rotary.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>

namespace colony::model {
namespace {

at::Tensor BaseFrequencies(double theta, int64_t dim, const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  return 1.0 / at::pow(theta, at::arange(0, dim, 2, f32) / static_cast<double>(dim));
}

// Llama 3.1: wavelengths longer than the original context / low_freq_factor are divided by
// `factor`, those shorter than context / high_freq_factor are kept, and the band between is
// interpolated smoothly.
at::Tensor Llama3Frequencies(const at::Tensor& inv_freq, const RopeScaling& s) {
  const double context = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = context / s.low_freq_factor;
  const double high_wavelen = context / s.high_freq_factor;
  const at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth =
      (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// YaRN: dimensions that rotate fewer than beta_slow times over the original context are
// interpolated (divided by factor), those rotating more than beta_fast times are kept, with a
// linear ramp between.
at::Tensor YarnFrequencies(double theta, int64_t dim, int64_t context, const RopeScaling& s,
                           const at::Device& device) {
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(context) / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor ramp = ((at::arange(dim / 2, f32) - low) / (high - low)).clamp(0, 1);
  const at::Tensor extrapolation = BaseFrequencies(theta, dim, device);
  const at::Tensor interpolation = extrapolation / s.factor;
  const at::Tensor keep = 1 - ramp;
  return interpolation * (1 - keep) + extrapolation * keep;
}

}  // namespace

std::pair<at::Tensor, double> RopeInverseFrequencies(const LlamaConfig& config, int64_t seq_len,
                                                     const at::Device& device) {
  const RopeScaling& s = config.rope_scaling;
  const int64_t dim = config.head_dim();
  switch (s.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      return {BaseFrequencies(config.rope_theta, dim, device) / s.factor, 1.0};
    case RopeType::kDynamic: {
      // NTK-aware: past the trained length the base grows with the sequence; before it, the
      // frequencies are the default ones.
      const auto trained = static_cast<double>(config.max_seq_len);
      if (static_cast<double>(seq_len) <= trained) break;
      const double base =
          config.rope_theta *
          std::pow(s.factor * static_cast<double>(seq_len) / trained - (s.factor - 1),
                   static_cast<double>(dim) / static_cast<double>(dim - 2));
      return {BaseFrequencies(base, dim, device), 1.0};
    }
    case RopeType::kLlama3:
      return {Llama3Frequencies(BaseFrequencies(config.rope_theta, dim, device), s), 1.0};
    case RopeType::kYarn: {
      const int64_t context = s.original_max_position_embeddings > 0
                                  ? s.original_max_position_embeddings
                                  : config.max_seq_len;
      const double attention =
          s.attention_factor > 0 ? s.attention_factor : 0.1 * std::log(s.factor) + 1.0;
      return {YarnFrequencies(config.rope_theta, dim, context, s, device), attention};
    }
  }
  return {BaseFrequencies(config.rope_theta, dim, device), 1.0};
}

Rotary::Rotary(const LlamaConfig& config) : config_(config) {
  std::tie(inv_freq_, scale_) = RopeInverseFrequencies(config, config.max_seq_len, at::kCPU);
}

RopeTables Rotary::Tables(int64_t length, int64_t offset, const at::TensorOptions& options) const {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device());
  at::Tensor inv_freq = InverseFrequenciesOn(options.device());
  double scale = scale_;
  if (config_.rope_scaling.type == RopeType::kDynamic && offset + length > config_.max_seq_len) {
    std::tie(inv_freq, scale) = RopeInverseFrequencies(config_, offset + length, options.device());
  }
  const at::Tensor positions = at::arange(offset, offset + length, f32);
  const at::Tensor freqs = at::outer(positions, inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos(), sin = emb.sin();
  if (scale != 1.0) {
    cos = cos * scale;
    sin = sin * scale;
  }
  return {cos.to(options.dtype()), sin.to(options.dtype())};
}

at::Tensor Rotary::InverseFrequenciesOn(const c10::Device& device) const {
  if (device.is_cpu()) return inv_freq_;
  std::lock_guard lock(device_copy_->mu);
  at::Tensor& copy = device_copy_->inv_freq;
  if (!copy.defined() || copy.device() != device) copy = inv_freq_.to(device);
  return copy;
}

RopeTables RotaryTables(const LlamaConfig& config, int64_t length, int64_t offset,
                        const at::TensorOptions& options) {
  return Rotary(config).Tables(length, offset, options);
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace colony::model
