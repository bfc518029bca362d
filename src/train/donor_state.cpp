// Parsing a state donor's metadata (see donor_state.h).
#include "train/donor_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string_view>

namespace colony::train {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxValues = int64_t{1} << 40;

// LibTorch's names (at::toString) of the dtypes a state may hold.
constexpr std::array<std::string_view, 10> kDtypes = {
    "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"};

}  // namespace

Result<DonorState> ParseDonorState(const std::string& metadata, const std::string& run_id) {
  auto meta = Json::parse(metadata, nullptr, false);
  if (!meta.is_object() || !meta.contains("tensors") || !meta["tensors"].is_array() ||
      !meta.contains("epoch") || !meta["epoch"].is_number_integer() ||
      !meta.contains("inner_step") || !meta["inner_step"].is_number_integer() ||
      !meta.contains("diverged") || !meta["diverged"].is_boolean() || !meta.contains("run_id") ||
      !meta["run_id"].is_string()) {
    return ProtocolError(
        "the donor's state metadata is malformed (it needs tensors, epoch, inner_step, diverged "
        "and run_id)");
  }
  for (const auto& [key, unused] : meta.items()) {
    if (key != "tensors" && key != "epoch" && key != "inner_step" && key != "diverged" &&
        key != "run_id") {
      return ProtocolError(
          fmt::format("the donor's state metadata has an unknown field '{}'", key.substr(0, 32)));
    }
  }
  if (meta["run_id"].get_ref<const std::string&>() != run_id) {
    return ProtocolError("the donor's state belongs to another run");
  }
  DonorState out;
  out.epoch = meta["epoch"].get<int64_t>();
  out.inner_step = meta["inner_step"].get<int64_t>();
  out.diverged = meta["diverged"].get<bool>();
  if (out.epoch < 0 || out.inner_step < 0) {
    return ProtocolError("the donor's state has a negative epoch or inner step");
  }
  for (const auto& e : meta["tensors"]) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("dtype") ||
        !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array()) {
      return ProtocolError("a tensor of the donor's state needs a name, a dtype and a shape");
    }
    DonorTensor t;
    t.name = e["name"].get<std::string>();
    if (t.name.size() > kMaxDonorTensorName) {
      return ProtocolError("a tensor of the donor's state has an overlong name");
    }
    t.dtype = e["dtype"].get<std::string>();
    if (std::find(kDtypes.begin(), kDtypes.end(), t.dtype) == kDtypes.end()) {
      return ProtocolError(fmt::format("the donor's state tensor '{}' has an unknown dtype '{}'",
                                       t.name, t.dtype.substr(0, 32)));
    }
    if (e["shape"].size() > kMaxDonorTensorDims) {
      return ProtocolError(
          fmt::format("the donor's state tensor '{}' has too many dimensions", t.name));
    }
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxValues) {
        return ProtocolError(fmt::format("the donor's state tensor '{}' has a bad shape", t.name));
      }
      t.shape.push_back(d.get<int64_t>());
      // Both factors are at most 2^40 and the product so far is checked: no overflow.
      if (t.shape.back() != 0 && t.numel > kMaxValues / t.shape.back()) {
        return ProtocolError(fmt::format("the donor's state tensor '{}' is too large", t.name));
      }
      t.numel *= t.shape.back();
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace colony::train
