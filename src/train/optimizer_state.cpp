// How optimizer state becomes named tensors and back (optimizer_state.h). Every supported
// optimizer type describes its per-parameter state once, as a StateLayout: the fields it has
// under given options (names, shapes, dtypes, device), how to reach them in a state object, and
// how to make an empty one. A table keyed by the optimizer's exact type finds the layout, so
// adding an optimizer is one more entry, not one more branch in every function.
#include "train/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <string_view>
#include <typeindex>
#include <unordered_map>

#include "train/optimizers.h"
#include "train/param_key.h"

namespace colony::train {
namespace {

using torch::Tensor;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

// What a field of a parameter's state must look like.
enum class FieldType {
  kLikeParam,   // the parameter's shape and dtype
  kFloatParam,  // the parameter's shape, float32
  kStep,        // int64 scalar
  kCodes,       // uint8 [numel]
  kAbsmax,      // float32 [blocks]
};

struct FieldSpec {
  std::string_view name;
  FieldType type;
};

// Mutable references into one state object: its step (if any) and its named tensors.
struct Slots {
  int64_t* step = nullptr;
  std::vector<std::pair<std::string_view, Tensor*>> tensors;
};

// The state layout of one optimizer type.
class StateLayout {
 public:
  virtual ~StateLayout() = default;
  // The fields a parameter's state has under its group's options, in export order.
  virtual std::vector<FieldSpec> Fields(const OptimizerOptions& options, const Tensor& p) const = 0;
  virtual Slots Bind(OptimizerParamState& state) const = 0;
  virtual std::unique_ptr<OptimizerParamState> NewState() const = 0;
  // Where the state of `p` lives, and (for kAbsmax fields) its number of blocks.
  virtual torch::Device Device(const OptimizerOptions&, const Tensor& p) const {
    return p.device();
  }
  virtual int64_t Blocks(const OptimizerOptions&, const Tensor&) const { return 0; }
};

class SgdLayout final : public StateLayout {
 public:
  std::vector<FieldSpec> Fields(const OptimizerOptions& options, const Tensor&) const override {
    if (static_cast<const torch::optim::SGDOptions&>(options).momentum() == 0) return {};
    return {{"momentum_buffer", FieldType::kLikeParam}};
  }
  Slots Bind(OptimizerParamState& st) const override {
    auto& s = static_cast<torch::optim::SGDParamState&>(st);
    return {nullptr, {{"momentum_buffer", &s.momentum_buffer()}}};
  }
  std::unique_ptr<OptimizerParamState> NewState() const override {
    return std::make_unique<torch::optim::SGDParamState>();
  }
};

// torch's Adam and AdamW: the same fields, under their own option and state types.
template <typename Options, typename State>
class AdamLayout final : public StateLayout {
 public:
  std::vector<FieldSpec> Fields(const OptimizerOptions& options, const Tensor&) const override {
    std::vector<FieldSpec> f{{"step", FieldType::kStep},
                             {"exp_avg", FieldType::kLikeParam},
                             {"exp_avg_sq", FieldType::kLikeParam}};
    if (static_cast<const Options&>(options).amsgrad()) {
      f.push_back({"max_exp_avg_sq", FieldType::kLikeParam});
    }
    return f;
  }
  Slots Bind(OptimizerParamState& st) const override {
    auto& s = static_cast<State&>(st);
    return {&s.step(),
            {{"exp_avg", &s.exp_avg()},
             {"exp_avg_sq", &s.exp_avg_sq()},
             {"max_exp_avg_sq", &s.max_exp_avg_sq()}}};
  }
  std::unique_ptr<OptimizerParamState> NewState() const override {
    return std::make_unique<State>();
  }
};

class LambLayout final : public StateLayout {
 public:
  std::vector<FieldSpec> Fields(const OptimizerOptions&, const Tensor&) const override {
    return {{"step", FieldType::kStep},
            {"exp_avg", FieldType::kLikeParam},
            {"exp_avg_sq", FieldType::kLikeParam}};
  }
  Slots Bind(OptimizerParamState& st) const override {
    auto& s = static_cast<LambParamState&>(st);
    return {&s.step(), {{"exp_avg", &s.exp_avg()}, {"exp_avg_sq", &s.exp_avg_sq()}}};
  }
  std::unique_ptr<OptimizerParamState> NewState() const override {
    return std::make_unique<LambParamState>();
  }
};

class Adam8bitLayout final : public StateLayout {
 public:
  std::vector<FieldSpec> Fields(const OptimizerOptions& options, const Tensor& p) const override {
    if (Opts(options).uses_8bit(p)) {
      return {{"step", FieldType::kStep},
              {"exp_avg_codes", FieldType::kCodes},
              {"exp_avg_absmax", FieldType::kAbsmax},
              {"exp_avg_sq_codes", FieldType::kCodes},
              {"exp_avg_sq_absmax", FieldType::kAbsmax}};
    }
    return {{"step", FieldType::kStep},
            {"exp_avg", FieldType::kFloatParam},
            {"exp_avg_sq", FieldType::kFloatParam}};
  }
  Slots Bind(OptimizerParamState& st) const override {
    auto& s = static_cast<Adam8bitParamState&>(st);
    return {&s.step(),
            {{"exp_avg", &s.exp_avg()},
             {"exp_avg_sq", &s.exp_avg_sq()},
             {"exp_avg_codes", &s.exp_avg_codes()},
             {"exp_avg_absmax", &s.exp_avg_absmax()},
             {"exp_avg_sq_codes", &s.exp_avg_sq_codes()},
             {"exp_avg_sq_absmax", &s.exp_avg_sq_absmax()}}};
  }
  std::unique_ptr<OptimizerParamState> NewState() const override {
    return std::make_unique<Adam8bitParamState>();
  }
  torch::Device Device(const OptimizerOptions& options, const Tensor& p) const override {
    return Opts(options).state_device(p);
  }
  int64_t Blocks(const OptimizerOptions& options, const Tensor& p) const override {
    return Opts(options).num_blocks(p);
  }

 private:
  static const Adam8bitOptions& Opts(const OptimizerOptions& o) {
    return static_cast<const Adam8bitOptions&>(o);
  }
};

// The layout of the optimizer's exact type; null for unsupported types.
const StateLayout* LayoutOf(const torch::optim::Optimizer& optimizer) {
  static const auto* layouts = [] {
    auto* m = new std::unordered_map<std::type_index, std::unique_ptr<StateLayout>>();
    m->emplace(typeid(torch::optim::SGD), std::make_unique<SgdLayout>());
    m->emplace(
        typeid(torch::optim::Adam),
        std::make_unique<AdamLayout<torch::optim::AdamOptions, torch::optim::AdamParamState>>());
    m->emplace(
        typeid(torch::optim::AdamW),
        std::make_unique<AdamLayout<torch::optim::AdamWOptions, torch::optim::AdamWParamState>>());
    m->emplace(typeid(Lamb), std::make_unique<LambLayout>());
    m->emplace(typeid(Adam8bit), std::make_unique<Adam8bitLayout>());
    return m;
  }();
  auto it = layouts->find(typeid(optimizer));
  return it == layouts->end() ? nullptr : it->second.get();
}

std::string FieldName(size_t group, size_t param, std::string_view field) {
  return "group" + std::to_string(group) + ".param" + std::to_string(param) + "." +
         std::string(field);
}

// Parses "group<g>.param<i>.<field>".
bool ParseName(std::string_view name, size_t& group, size_t& param, std::string_view& field) {
  auto number = [&](std::string_view prefix, size_t& out) {
    if (name.substr(0, prefix.size()) != prefix) return false;
    name.remove_prefix(prefix.size());
    const char* end = name.data() + name.size();
    auto [ptr, ec] = std::from_chars(name.data(), end, out);
    if (ec != std::errc() || ptr == name.data() || ptr == end || *ptr != '.') return false;
    name.remove_prefix(static_cast<size_t>(ptr - name.data()) + 1);
    return true;
  };
  if (!number("group", group) || !number("param", param) || name.empty()) return false;
  field = name;
  return true;
}

std::string Describe(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "] " + c10::toString(dtype);
}

// The device, dtype and shape an imported tensor must have.
struct Expected {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  torch::Device device;
};

Expected ExpectedFor(const StateLayout& layout, FieldType type, const OptimizerOptions& options,
                     const Tensor& p) {
  const torch::Device dev = layout.Device(options, p);
  switch (type) {
    case FieldType::kLikeParam:
      return {p.sizes().vec(), p.scalar_type(), dev};
    case FieldType::kFloatParam:
      return {p.sizes().vec(), torch::kFloat32, dev};
    case FieldType::kStep:
      return {{}, torch::kInt64, torch::kCPU};
    case FieldType::kCodes:
      return {{p.numel()}, torch::kUInt8, dev};
    case FieldType::kAbsmax:
      return {{layout.Blocks(options, p)}, torch::kFloat32, dev};
  }
  return {{}, torch::kFloat32, dev};
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> ExportOptimizerState(
    torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<std::string, Tensor>> out;
  const StateLayout* layout = LayoutOf(optimizer);
  if (layout == nullptr) return out;
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = optimizer.state().find(StateKey(params[i]));
      if (it == optimizer.state().end() || it->second == nullptr) continue;
      Slots slots = layout->Bind(*it->second);
      if (slots.step != nullptr) {
        out.emplace_back(FieldName(g, i, "step"), torch::scalar_tensor(*slots.step, torch::kInt64));
      }
      for (const FieldSpec& f : layout->Fields(groups[g].options(), params[i])) {
        for (auto& [name, tensor] : slots.tensors) {
          if (name == f.name && tensor->defined()) {
            out.emplace_back(FieldName(g, i, name), tensor->detach());
          }
        }
      }
    }
  }
  return out;
}

Status ImportOptimizerState(torch::optim::Optimizer& optimizer,
                            const std::vector<std::pair<std::string, Tensor>>& state) {
  const StateLayout* layout = LayoutOf(optimizer);
  if (layout == nullptr) {
    return Unimplemented(
        "ImportOptimizerState supports torch::optim::SGD, Adam, AdamW and colony's Lamb and "
        "Adam8bit only");
  }
  auto& groups = optimizer.param_groups();
  // (group, param) -> field -> tensor, validated one entry at a time.
  std::map<std::pair<size_t, size_t>, std::map<std::string_view, const Tensor*>> by_param;
  for (const auto& [name, tensor] : state) {
    auto bad = [&name = name](const std::string& why) {
      return InvalidArgument("optimizer state entry \"" + name + "\": " + why);
    };
    size_t g = 0, i = 0;
    std::string_view field;
    if (!ParseName(name, g, i, field)) {
      return bad("not of the form group<g>.param<i>.<field>");
    }
    if (g >= groups.size() || i >= groups[g].params().size()) {
      return bad("no such parameter (the optimizer has " + std::to_string(groups.size()) +
                 " groups" +
                 (g < groups.size() ? ", group " + std::to_string(g) + " has " +
                                          std::to_string(groups[g].params().size()) + " parameters)"
                                    : ")"));
    }
    const Tensor& p = groups[g].params()[i];
    const std::vector<FieldSpec> fields = layout->Fields(groups[g].options(), p);
    auto spec = std::find_if(fields.begin(), fields.end(),
                             [&field = field](const FieldSpec& f) { return f.name == field; });
    if (spec == fields.end()) {
      std::string valid;
      for (const FieldSpec& f : fields) valid += (valid.empty() ? "" : ", ") + std::string(f.name);
      return bad("unknown field for this optimizer and parameter (expected: " +
                 (valid.empty() ? std::string("no state") : valid) + ")");
    }
    if (!tensor.defined()) return bad("undefined tensor");
    const Expected want = ExpectedFor(*layout, spec->type, groups[g].options(), p);
    if (tensor.sizes() != c10::IntArrayRef(want.sizes) || tensor.scalar_type() != want.dtype) {
      return bad("expected " + Describe(want.sizes, want.dtype) + ", got " +
                 Describe(tensor.sizes(), tensor.scalar_type()));
    }
    if (tensor.is_sparse() || tensor.layout() != torch::kStrided) return bad("not a dense tensor");
    if (spec->type == FieldType::kStep && tensor.item<int64_t>() < 0) {
      return bad("negative step " + std::to_string(tensor.item<int64_t>()));
    }
    if (spec->type == FieldType::kAbsmax &&
        !tensor.isfinite().logical_and(tensor.ge(0)).all().item<bool>()) {
      return bad("absmax values must be finite and non-negative");
    }
    if (!by_param[{g, i}].emplace(spec->name, &tensor).second) return bad("duplicate entry");
  }
  // Every parameter mentioned must come with its complete state.
  std::vector<std::pair<OptimizerStateKey, std::unique_ptr<OptimizerParamState>>> fresh;
  for (const auto& [index, fields] : by_param) {
    const auto [g, i] = index;
    const Tensor& p = groups[g].params()[i];
    const std::vector<FieldSpec> layout_fields = layout->Fields(groups[g].options(), p);
    for (const FieldSpec& f : layout_fields) {
      if (fields.count(f.name) == 0) {
        return InvalidArgument("optimizer state for group" + std::to_string(g) + ".param" +
                               std::to_string(i) + " lacks \"" + std::string(f.name) + "\"");
      }
    }
    auto st = layout->NewState();
    Slots slots = layout->Bind(*st);
    for (const FieldSpec& f : layout_fields) {
      const Tensor& src = *fields.at(f.name);
      if (f.type == FieldType::kStep) {
        *slots.step = src.item<int64_t>();
        continue;
      }
      const Expected want = ExpectedFor(*layout, f.type, groups[g].options(), p);
      for (auto& [name, slot] : slots.tensors) {
        if (name == f.name) {
          *slot = src.detach().to(want.device, want.dtype, /*non_blocking=*/false, /*copy=*/true,
                                  torch::MemoryFormat::Contiguous);
        }
      }
    }
    fresh.emplace_back(StateKey(p), std::move(st));
  }
  // Nothing fails from here on: replace the state.
  for (auto& group : groups) {
    for (const Tensor& p : group.params()) optimizer.state().erase(StateKey(p));
  }
  for (auto& [key, st] : fresh) optimizer.state()[key] = std::move(st);
  return Status::Ok();
}

}  // namespace colony::train
