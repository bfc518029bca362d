#include "train/optimizers.h"

#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/serialize.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "train/param_key.h"

namespace colony::train {
namespace {

using torch::Tensor;
using torch::optim::OptimizerParamState;

std::atomic<bool> g_force_tensor_kernel{false};

// Runs the closure (if any) with gradients enabled, as torch's optimizers do.
Tensor RunClosure(const torch::optim::Optimizer::LossClosure& closure) {
  Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  return loss;
}

void CheckBetas(const std::tuple<double, double>& betas) {
  const auto [b1, b2] = betas;
  TORCH_CHECK(b1 >= 0 && b1 < 1, "Invalid beta parameter at index 0: ", b1);
  TORCH_CHECK(b2 >= 0 && b2 < 1, "Invalid beta parameter at index 1: ", b2);
}

// ---------------------------------------------------------------------------------------------
// Quantization maps

struct QuantTable {
  std::array<float, 256> levels;
  std::array<float, 255> thresholds;  // midpoints between neighbouring levels
};

QuantTable MakeTable(std::vector<double> levels) {
  std::sort(levels.begin(), levels.end());
  QuantTable t;
  for (size_t i = 0; i < 256; ++i) t.levels[i] = static_cast<float>(levels[i]);
  for (size_t i = 0; i < 255; ++i) {
    t.thresholds[i] = static_cast<float>((levels[i] + levels[i + 1]) / 2);
  }
  return t;
}

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): decade i
// (scale 10^(i-6)) holds the 2^i midpoints of linspace(0.1, 1, 2^i + 1), mirrored, plus 0 and 1.
QuantTable MakeSignedTable() {
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) {
    const int n = 1 << i;
    const double scale = std::pow(10.0, i - 6);
    for (int k = 0; k < n; ++k) {
      const double mean = 0.1 + 0.9 * (k + 0.5) / n;
      v.push_back(scale * mean);
      v.push_back(-scale * mean);
    }
  }
  v.push_back(0);
  v.push_back(1);
  return MakeTable(std::move(v));
}

// 0, then 55 levels log-spaced over [1e-8, 1e-3) and 200 over [1e-3, 1] (see QuantMap).
QuantTable MakeUnsignedTable() {
  std::vector<double> v{0.0};
  for (int k = 0; k < 55; ++k) v.push_back(std::pow(10.0, -8.0 + 5.0 * k / 55));
  for (int k = 0; k < 200; ++k) v.push_back(std::pow(10.0, -3.0 + 3.0 * k / 199));
  v.back() = 1.0;  // exactly, so that a block's absmax element round-trips exactly
  return MakeTable(std::move(v));
}

const QuantTable& Table(QuantMap map) {
  static const QuantTable kSignedTable = MakeSignedTable();
  static const QuantTable kUnsignedTable = MakeUnsignedTable();
  return map == QuantMap::kSigned ? kSignedTable : kUnsignedTable;
}

inline uint8_t Quantize(const QuantTable& t, bool is_unsigned, float x) {
  // First threshold above x; NaN compares false everywhere and lands on a valid code.
  auto code = static_cast<uint8_t>(std::upper_bound(t.thresholds.begin(), t.thresholds.end(), x) -
                                   t.thresholds.begin());
  if (is_unsigned && code == 0 && x > 0) code = 1;
  return code;
}

// ---------------------------------------------------------------------------------------------
// Adam8bit kernels

struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float eps, weight_decay, decay_factor;  // decay_factor = 1 - lr * wd (decoupled only)
  float sqrt_bc2, step_size;              // sqrt(1 - beta2^t), lr / (1 - beta1^t)
  bool l2, decoupled;
};

// Updates n elements (a whole number of blocks, the last one possibly partial) of a float32
// parameter and its quantized moments, in parallel over blocks with one scratch per task.
void CpuKernel(float* p, const float* g, uint8_t* m_codes, float* m_absmax, uint8_t* v_codes,
               float* v_absmax, int64_t n, int64_t block_size, const AdamScalars& s) {
  const QuantTable& st = Table(QuantMap::kSigned);
  const QuantTable& ut = Table(QuantMap::kUnsigned);
  const int64_t blocks = (n + block_size - 1) / block_size;
  const int64_t grain = std::max<int64_t>(1, 65536 / block_size);
  at::parallel_for(0, blocks, grain, [&](int64_t b_begin, int64_t b_end) {
    std::vector<float> scratch(2 * static_cast<size_t>(block_size));
    float* ms = scratch.data();
    float* vs = ms + block_size;
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t e0 = b * block_size;
      const int64_t len = std::min(block_size, n - e0);
      const float am = m_absmax[b], av = v_absmax[b];
      float new_am = 0, new_av = 0;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = e0 + j;
        float pi = p[i];
        float gi = g[i];
        if (s.l2) gi += s.weight_decay * pi;
        if (s.decoupled) pi *= s.decay_factor;
        const float m = st.levels[m_codes[i]] * am * s.beta1 + s.one_minus_beta1 * gi;
        const float v = ut.levels[v_codes[i]] * av * s.beta2 + s.one_minus_beta2 * gi * gi;
        p[i] = pi - s.step_size * m / (std::sqrt(v) / s.sqrt_bc2 + s.eps);
        ms[j] = m;
        vs[j] = v;
        new_am = std::max(new_am, std::fabs(m));
        new_av = std::max(new_av, v);
      }
      m_absmax[b] = new_am;
      v_absmax[b] = new_av;
      const float inv_m = new_am > 0 ? 1.0f / new_am : 0.0f;
      const float inv_v = new_av > 0 ? 1.0f / new_av : 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        m_codes[e0 + j] = Quantize(st, false, ms[j] * inv_m);
        v_codes[e0 + j] = Quantize(ut, true, vs[j] * inv_v);
      }
    }
  });
}

// The elements per chunk when parameters or gradients have to be copied (to the host, or to
// float32) or when the tensor-op kernel runs: bounds the transient float32 copies.
constexpr int64_t kChunkElements = 1 << 20;

// Per-block absmax of a flat float tensor of len elements (last block possibly partial).
Tensor BlockAbsmax(const Tensor& x, int64_t block_size) {
  const int64_t len = x.numel();
  const int64_t blocks = (len + block_size - 1) / block_size;
  Tensor padded = at::constant_pad_nd(x.abs(), {0, blocks * block_size - len}, 0);
  return std::get<0>(padded.view({blocks, block_size}).max(1));
}

Tensor ExpandBlocks(const Tensor& per_block, int64_t block_size, int64_t len) {
  return per_block.repeat_interleave(block_size).narrow(0, 0, len);
}

Tensor QuantizeTensor(QuantMap map, const Tensor& x, const Tensor& absmax_per_element) {
  const QuantTable& t = Table(map);
  Tensor thresholds =
      torch::from_blob(const_cast<float*>(t.thresholds.data()), {255}, torch::kFloat32)
          .to(x.device());
  Tensor inv = torch::where(absmax_per_element > 0, absmax_per_element.reciprocal(),
                            torch::zeros_like(absmax_per_element));
  Tensor normalized = x * inv;
  Tensor codes = torch::bucketize(normalized, thresholds, /*out_int32=*/false, /*right=*/true);
  if (map == QuantMap::kUnsigned) {
    codes = torch::where((codes == 0).logical_and(normalized > 0), torch::ones_like(codes), codes);
  }
  return codes.to(torch::kUInt8);
}

Tensor DequantizeTensor(QuantMap map, const Tensor& codes, const Tensor& absmax_per_element) {
  const QuantTable& t = Table(map);
  Tensor levels = torch::from_blob(const_cast<float*>(t.levels.data()), {256}, torch::kFloat32)
                      .to(codes.device());
  return levels.index_select(0, codes.to(torch::kLong)) * absmax_per_element;
}

// The same update with tensor ops on the states' device, chunk by chunk: used for states that
// live on an accelerator. `p_flat` is a flat view of the parameter.
void TensorKernel(const Tensor& p_flat, const Tensor& g_flat, Adam8bitParamState& state,
                  int64_t block_size, const AdamScalars& s) {
  const int64_t n = p_flat.numel();
  const int64_t blocks = (n + block_size - 1) / block_size;
  const int64_t chunk_blocks = std::max<int64_t>(1, kChunkElements / block_size);
  const torch::Device dev = state.exp_avg_codes().device();
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk_blocks) {
    const int64_t b1 = std::min(blocks, b0 + chunk_blocks);
    const int64_t e0 = b0 * block_size;
    const int64_t len = std::min(n, b1 * block_size) - e0;
    Tensor m_codes = state.exp_avg_codes().narrow(0, e0, len);
    Tensor v_codes = state.exp_avg_sq_codes().narrow(0, e0, len);
    Tensor m_absmax = state.exp_avg_absmax().narrow(0, b0, b1 - b0);
    Tensor v_absmax = state.exp_avg_sq_absmax().narrow(0, b0, b1 - b0);
    Tensor m =
        DequantizeTensor(QuantMap::kSigned, m_codes, ExpandBlocks(m_absmax, block_size, len));
    Tensor v =
        DequantizeTensor(QuantMap::kUnsigned, v_codes, ExpandBlocks(v_absmax, block_size, len));
    Tensor p_target = p_flat.narrow(0, e0, len);
    Tensor pc = p_target.to(dev, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
    Tensor gc = g_flat.narrow(0, e0, len).to(dev, torch::kFloat32);
    if (s.l2) gc = gc.add(pc, s.weight_decay);
    if (s.decoupled) pc.mul_(s.decay_factor);
    m.mul_(s.beta1).add_(gc, s.one_minus_beta1);
    v.mul_(s.beta2).addcmul_(gc, gc, s.one_minus_beta2);
    pc.addcdiv_(m, (v.sqrt() / s.sqrt_bc2).add_(s.eps), -s.step_size);
    p_target.copy_(pc);
    Tensor new_m_absmax = BlockAbsmax(m, block_size);
    Tensor new_v_absmax = BlockAbsmax(v, block_size);
    m_absmax.copy_(new_m_absmax);
    v_absmax.copy_(new_v_absmax);
    m_codes.copy_(
        QuantizeTensor(QuantMap::kSigned, m, ExpandBlocks(new_m_absmax, block_size, len)));
    v_codes.copy_(
        QuantizeTensor(QuantMap::kUnsigned, v, ExpandBlocks(new_v_absmax, block_size, len)));
  }
}

torch::Device StateDevice(const Adam8bitOptions& o, const Tensor& p) { return o.state_device(p); }
bool Uses8bit(const Adam8bitOptions& o, const Tensor& p) { return o.uses_8bit(p); }
int64_t NumBlocks(const Adam8bitOptions& o, const Tensor& p) { return o.num_blocks(p); }

// Makes a loaded or imported state usable by the kernels: right device, right sizes.
void PrepareState8bit(Adam8bitParamState& s, const Tensor& p, const Adam8bitOptions& o) {
  const torch::Device dev = StateDevice(o, p);
  for (Tensor* t :
       {&s.exp_avg_codes(), &s.exp_avg_sq_codes(), &s.exp_avg_absmax(), &s.exp_avg_sq_absmax()}) {
    TORCH_CHECK(t->defined(), "Adam8bit: 8-bit state of a ", p.numel(),
                "-element parameter is missing (state from an optimizer with other options?)");
    if (t->device() != dev || !t->is_contiguous()) *t = t->to(dev).contiguous();
  }
  TORCH_CHECK(s.exp_avg_codes().scalar_type() == torch::kUInt8 &&
                  s.exp_avg_sq_codes().scalar_type() == torch::kUInt8 &&
                  s.exp_avg_codes().numel() == p.numel() &&
                  s.exp_avg_sq_codes().numel() == p.numel(),
              "Adam8bit: codes must be uint8 with one per parameter element");
  TORCH_CHECK(s.exp_avg_absmax().scalar_type() == torch::kFloat32 &&
                  s.exp_avg_sq_absmax().scalar_type() == torch::kFloat32 &&
                  s.exp_avg_absmax().numel() == NumBlocks(o, p) &&
                  s.exp_avg_sq_absmax().numel() == NumBlocks(o, p),
              "Adam8bit: absmax must be float32 with one per block of ", o.block_size());
}

void Step8bit(const Tensor& p, const Tensor& grad, Adam8bitParamState& state,
              const Adam8bitOptions& o, const AdamScalars& s) {
  PrepareState8bit(state, p, o);
  TORCH_CHECK(p.is_contiguous(), "Adam8bit: 8-bit states need contiguous parameters");
  const int64_t n = p.numel();
  const int64_t bs = o.block_size();
  Tensor p_flat = p.view({-1});
  Tensor g_flat = grad.reshape({-1});
  const bool state_cpu = state.exp_avg_codes().device().is_cpu();
  if (!state_cpu || g_force_tensor_kernel.load(std::memory_order_relaxed)) {
    TensorKernel(p_flat, g_flat, state, bs, s);
    return;
  }
  auto* m_codes = state.exp_avg_codes().data_ptr<uint8_t>();
  auto* v_codes = state.exp_avg_sq_codes().data_ptr<uint8_t>();
  auto* m_absmax = state.exp_avg_absmax().data_ptr<float>();
  auto* v_absmax = state.exp_avg_sq_absmax().data_ptr<float>();
  if (p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && grad.device().is_cpu() &&
      grad.scalar_type() == torch::kFloat32) {
    Tensor g_contig = g_flat.contiguous();
    CpuKernel(p_flat.data_ptr<float>(), g_contig.data_ptr<float>(), m_codes, m_absmax, v_codes,
              v_absmax, n, bs, s);
    return;
  }
  // Accelerator or non-float32 parameters: stream them through host float32 copies.
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / bs) * bs;
  for (int64_t e0 = 0; e0 < n; e0 += chunk) {
    const int64_t len = std::min(chunk, n - e0);
    Tensor p_part = p_flat.narrow(0, e0, len);
    Tensor pc = p_part.to(torch::kCPU, torch::kFloat32, false, /*copy=*/true).contiguous();
    Tensor gc = g_flat.narrow(0, e0, len).to(torch::kCPU, torch::kFloat32).contiguous();
    CpuKernel(pc.data_ptr<float>(), gc.data_ptr<float>(), m_codes + e0, m_absmax + e0 / bs,
              v_codes + e0, v_absmax + e0 / bs, len, bs, s);
    p_part.copy_(pc);
  }
}

// Small parameters: float32 states, exactly torch::optim::Adam / AdamW's arithmetic.
void Step32bit(const Tensor& p, const Tensor& grad, Adam8bitParamState& state,
               const Adam8bitOptions& o, const AdamScalars& s) {
  const torch::Device dev = StateDevice(o, p);
  TORCH_CHECK(state.exp_avg().defined() && state.exp_avg_sq().defined() &&
                  state.exp_avg().sizes() == p.sizes() && state.exp_avg_sq().sizes() == p.sizes(),
              "Adam8bit: float32 state of a ", p.numel(),
              "-element parameter is missing or misshapen (state from other options?)");
  for (Tensor* t : {&state.exp_avg(), &state.exp_avg_sq()}) {
    if (t->device() != dev || t->scalar_type() != torch::kFloat32) {
      *t = t->to(dev, torch::kFloat32);
    }
  }
  const bool direct = p.device() == dev && p.scalar_type() == torch::kFloat32;
  Tensor pw = direct ? p : p.to(dev, torch::kFloat32, false, /*copy=*/true);
  Tensor g = grad.to(dev, torch::kFloat32);
  if (s.decoupled) pw.mul_(s.decay_factor);
  if (s.l2) g = g.add(pw, s.weight_decay);
  state.exp_avg().mul_(s.beta1).add_(g, s.one_minus_beta1);
  state.exp_avg_sq().mul_(s.beta2).addcmul_(g, g, s.one_minus_beta2);
  Tensor denom = (state.exp_avg_sq().sqrt() / s.sqrt_bc2).add_(s.eps);
  pw.addcdiv_(state.exp_avg(), denom, -s.step_size);
  if (!direct) p.copy_(pw);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Quantization maps

const std::array<float, 256>& QuantLevels(QuantMap map) { return Table(map).levels; }

uint8_t QuantizeValue(QuantMap map, float x) {
  return Quantize(Table(map), map == QuantMap::kUnsigned, x);
}

void QuantizeBlockwise(QuantMap map, std::span<const float> x, size_t block_size,
                       std::span<uint8_t> codes, std::span<float> absmax) {
  const QuantTable& t = Table(map);
  const bool is_unsigned = map == QuantMap::kUnsigned;
  assert(codes.size() == x.size() && absmax.size() == (x.size() + block_size - 1) / block_size);
  for (size_t b = 0; b * block_size < x.size(); ++b) {
    const size_t e0 = b * block_size;
    const size_t e1 = std::min(x.size(), e0 + block_size);
    float a = 0;
    for (size_t i = e0; i < e1; ++i) a = std::max(a, std::fabs(x[i]));
    absmax[b] = a;
    const float inv = a > 0 ? 1.0f / a : 0.0f;
    for (size_t i = e0; i < e1; ++i) codes[i] = Quantize(t, is_unsigned, x[i] * inv);
  }
}

void DequantizeBlockwise(QuantMap map, std::span<const uint8_t> codes,
                         std::span<const float> absmax, size_t block_size, std::span<float> out) {
  const QuantTable& t = Table(map);
  assert(out.size() == codes.size() && absmax.size() * block_size >= codes.size());
  for (size_t i = 0; i < codes.size(); ++i) out[i] = t.levels[codes[i]] * absmax[i / block_size];
}

// ---------------------------------------------------------------------------------------------
// Options and states

LambOptions::LambOptions(double lr) : lr_(lr) {}
double LambOptions::get_lr() const { return lr(); }
void LambOptions::set_lr(const double lr) { this->lr(lr); }

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(clamp_value);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, clamp_value);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_sq);
}

Adam8bitOptions::Adam8bitOptions(double lr) : lr_(lr) {}
c10::Device Adam8bitOptions::state_device(const Tensor& p) const {
  return state_on_cpu() ? c10::Device(c10::kCPU) : p.device();
}
bool Adam8bitOptions::uses_8bit(const Tensor& p) const { return p.numel() >= min_8bit_size(); }
int64_t Adam8bitOptions::num_blocks(const Tensor& p) const {
  return (p.numel() + block_size() - 1) / block_size();
}
double Adam8bitOptions::get_lr() const { return lr(); }
void Adam8bitOptions::set_lr(const double lr) { this->lr(lr); }

void Adam8bitOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(decoupled_weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(block_size);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_8bit_size);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(state_on_cpu);
}

void Adam8bitOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, decoupled_weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, block_size);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, min_8bit_size);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, state_on_cpu);
}

void Adam8bitParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_codes);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_absmax);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_codes);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_absmax);
}

void Adam8bitParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_codes);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_absmax);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_sq_codes);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Tensor, exp_avg_sq_absmax);
}

// ---------------------------------------------------------------------------------------------
// Lamb

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LambOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.eps() >= 0, "Invalid epsilon value: ", defaults.eps());
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
  TORCH_CHECK(defaults.clamp_value() > 0, "Invalid clamp_value: ", defaults.clamp_value());
  CheckBetas(defaults.betas());
}

Lamb::Lamb(std::vector<Tensor> params, LambOptions defaults)
    : Lamb(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           defaults) {}

Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  Tensor loss = RunClosure(closure);
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const Tensor& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "Lamb does not support sparse gradients");
      auto& slot = state_[StateKey(p)];
      if (slot == nullptr) {
        auto s = std::make_unique<LambParamState>();
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<LambParamState&>(*slot);
      s.step(s.step() + 1);
      const double bc1 = o.bias_correction() ? 1 - std::pow(beta1, s.step()) : 1.0;
      const double bc2 = o.bias_correction() ? 1 - std::pow(beta2, s.step()) : 1.0;
      s.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
      s.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      Tensor update = (s.exp_avg() / bc1).div_((s.exp_avg_sq() / bc2).sqrt_().add_(o.eps()));
      if (o.weight_decay() != 0) update.add_(p, o.weight_decay());
      Tensor weight_norm = p.norm().clamp_max(o.clamp_value());
      Tensor update_norm = update.norm();
      Tensor trust = torch::where(weight_norm.gt(0).logical_and(update_norm.gt(0)),
                                  weight_norm / update_norm, torch::ones_like(weight_norm));
      p.sub_(update.mul_(trust), o.lr());
    }
  }
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

// ---------------------------------------------------------------------------------------------
// Adam8bit

Adam8bit::Adam8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   Adam8bitOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<Adam8bitOptions>(defaults)) {
  TORCH_CHECK(defaults.lr() >= 0, "Invalid learning rate: ", defaults.lr());
  TORCH_CHECK(defaults.eps() >= 0, "Invalid epsilon value: ", defaults.eps());
  TORCH_CHECK(defaults.weight_decay() >= 0,
              "Invalid weight_decay value: ", defaults.weight_decay());
  TORCH_CHECK(defaults.block_size() > 0, "Invalid block_size: ", defaults.block_size());
  TORCH_CHECK(defaults.min_8bit_size() >= 0, "Invalid min_8bit_size: ", defaults.min_8bit_size());
  CheckBetas(defaults.betas());
}

Adam8bit::Adam8bit(std::vector<Tensor> params, Adam8bitOptions defaults)
    : Adam8bit(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                   std::move(params))},
               defaults) {}

Tensor Adam8bit::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  Tensor loss = RunClosure(closure);
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const Adam8bitOptions&>(group.options());
    TORCH_CHECK(o.block_size() > 0, "Adam8bit: invalid block_size ", o.block_size());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const Tensor& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "Adam8bit does not support sparse gradients");
      const bool q8 = Uses8bit(o, p);
      auto& slot = state_[StateKey(p)];
      if (slot == nullptr) {
        auto s = std::make_unique<Adam8bitParamState>();
        const auto dev = StateDevice(o, p);
        if (q8) {
          // Code 0 is never the zero level of the signed map, so start from explicit zeros.
          const uint8_t zero_code = QuantizeValue(QuantMap::kSigned, 0.0f);
          auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(dev);
          auto floats = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
          s->exp_avg_codes(torch::full({p.numel()}, zero_code, bytes));
          s->exp_avg_sq_codes(torch::zeros({p.numel()}, bytes));
          s->exp_avg_absmax(torch::zeros({NumBlocks(o, p)}, floats));
          s->exp_avg_sq_absmax(torch::zeros({NumBlocks(o, p)}, floats));
        } else {
          auto floats = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
          s->exp_avg(torch::zeros(p.sizes(), floats));
          s->exp_avg_sq(torch::zeros(p.sizes(), floats));
        }
        slot = std::move(s);
      }
      auto& s = static_cast<Adam8bitParamState&>(*slot);
      s.step(s.step() + 1);
      const double bc1 = 1 - std::pow(beta1, s.step());
      const double bc2 = 1 - std::pow(beta2, s.step());
      const bool decay = o.weight_decay() != 0;
      const AdamScalars scalars{
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .eps = static_cast<float>(o.eps()),
          .weight_decay = static_cast<float>(o.weight_decay()),
          .decay_factor = static_cast<float>(1 - o.lr() * o.weight_decay()),
          .sqrt_bc2 = static_cast<float>(std::sqrt(bc2)),
          .step_size = static_cast<float>(o.lr() / bc1),
          .l2 = decay && !o.decoupled_weight_decay(),
          .decoupled = decay && o.decoupled_weight_decay(),
      };
      if (q8) {
        Step8bit(p, grad, s, o, scalars);
      } else {
        Step32bit(p, grad, s, o, scalars);
      }
    }
  }
  return loss;
}

void Adam8bit::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<Adam8bitParamState, Adam8bitOptions>(archive, *this);
}

void Adam8bit::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<Adam8bitParamState, Adam8bitOptions>(archive, *this);
}

size_t Adam8bit::StateBytes() const {
  size_t bytes = 0;
  for (const auto& [key, slot] : state_) {
    const auto& s = static_cast<const Adam8bitParamState&>(*slot);
    for (const Tensor* t : {&s.exp_avg(), &s.exp_avg_sq(), &s.exp_avg_codes(), &s.exp_avg_absmax(),
                            &s.exp_avg_sq_codes(), &s.exp_avg_sq_absmax()}) {
      if (t->defined()) bytes += t->nbytes();
    }
  }
  return bytes;
}

Status SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return InvalidArgument("learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  try {
    optimizer.defaults().set_lr(lr);
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
  } catch (const c10::Error& e) {
    return Unimplemented("this optimizer's options have no learning rate: " +
                         std::string(e.what_without_backtrace()));
  }
  return Status::Ok();
}

double GetLearningRate(const torch::optim::Optimizer& optimizer) {
  try {
    if (!optimizer.param_groups().empty()) {
      return optimizer.param_groups().front().options().get_lr();
    }
    return optimizer.defaults().get_lr();
  } catch (const c10::Error&) {
    return std::numeric_limits<double>::quiet_NaN();
  }
}

Result<std::unique_ptr<torch::optim::Optimizer>> MakeOptimizer(std::string_view name,
                                                               std::vector<Tensor> params,
                                                               const OptimizerConfig& cfg) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static constexpr std::string_view kValid = "sgd, adam, adamw, lamb, adam8bit, adamw8bit";
  auto bad = [&](const std::string& why) {
    return InvalidArgument("optimizer \"" + std::string(name) + "\": " + why);
  };
  const auto [beta1, beta2] = cfg.betas;
  if (!(cfg.lr >= 0) || !std::isfinite(cfg.lr)) return bad("lr must be finite and >= 0");
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) return bad("betas must be in [0, 1)");
  if (cfg.eps && !(*cfg.eps >= 0)) return bad("eps must be >= 0");
  if (!(cfg.weight_decay >= 0)) return bad("weight_decay must be >= 0");
  if (!(cfg.momentum >= 0)) return bad("momentum must be >= 0");
  for (const Tensor& p : params) {
    if (!p.defined()) return bad("undefined parameter tensor");
  }
  try {
    if (lower == "sgd") {
      if (cfg.nesterov && cfg.momentum <= 0) return bad("nesterov needs momentum > 0");
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(cfg.lr)
                                                                     .momentum(cfg.momentum)
                                                                     .weight_decay(cfg.weight_decay)
                                                                     .nesterov(cfg.nesterov)));
    }
    if (lower == "adam") {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::Adam>(
          std::move(params), torch::optim::AdamOptions(cfg.lr)
                                 .betas(cfg.betas)
                                 .eps(cfg.eps.value_or(1e-8))
                                 .weight_decay(cfg.weight_decay)));
    }
    if (lower == "adamw") {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(
          std::move(params), torch::optim::AdamWOptions(cfg.lr)
                                 .betas(cfg.betas)
                                 .eps(cfg.eps.value_or(1e-8))
                                 .weight_decay(cfg.weight_decay)));
    }
    if (lower == "lamb") {
      if (!(cfg.clamp_value > 0)) return bad("clamp_value must be > 0");
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<Lamb>(std::move(params), LambOptions(cfg.lr)
                                                        .betas(cfg.betas)
                                                        .eps(cfg.eps.value_or(1e-6))
                                                        .weight_decay(cfg.weight_decay)
                                                        .clamp_value(cfg.clamp_value)));
    }
    if (lower == "adam8bit" || lower == "adamw8bit") {
      if (cfg.block_size <= 0) return bad("block_size must be > 0");
      if (cfg.min_8bit_size < 0) return bad("min_8bit_size must be >= 0");
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Adam8bit>(
          std::move(params), Adam8bitOptions(cfg.lr)
                                 .betas(cfg.betas)
                                 .eps(cfg.eps.value_or(1e-8))
                                 .weight_decay(cfg.weight_decay)
                                 .decoupled_weight_decay(lower == "adamw8bit")
                                 .block_size(cfg.block_size)
                                 .min_8bit_size(cfg.min_8bit_size)
                                 .state_on_cpu(cfg.state_on_cpu)));
    }
  } catch (const c10::Error& e) {
    return bad(e.what_without_backtrace());
  }
  return bad("unknown optimizer; valid names: " + std::string(kValid));
}

namespace internal {
void ForceAdam8bitTensorKernelForTesting(bool force) { g_force_tensor_kernel.store(force); }
}  // namespace internal

}  // namespace colony::train
