// Training checkpoints: a safetensors file with the peer's whole state (parameters, optimizer
// state, and what its way of stepping adds) plus its epoch and inner step as metadata. Resuming
// installs it like a state downloaded from a peer (state_sync.cpp), with the same validation.
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <span>

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "train/internal.h"

namespace colony::train {

Status CollaborativeOptimizer::Impl::SaveCheckpoint(const std::filesystem::path& file) {
  if (stepping_->HasPending()) stepping_->FinishPending(nullptr);
  NamedTensors named;
  int64_t epoch;
  {
    std::lock_guard lock(state_mu_);
    named = CollectState();
    epoch = params_epoch_;
  }
  std::vector<std::pair<model::TensorInfo, std::span<const uint8_t>>> items;
  for (auto& [name, t] : named) {
    t = t.contiguous();
    model::TensorInfo info;
    info.name = name;
    const auto dtype = model::ToDType(t.scalar_type());
    if (!dtype) {
      return InvalidArgument(
          fmt::format("no safetensors dtype for {}", at::toString(t.scalar_type())));
    }
    info.dtype = *dtype;
    info.shape = t.sizes().vec();
    items.emplace_back(
        info, std::span<const uint8_t>(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes()));
  }
  std::map<std::string, std::string> metadata = {
      {"format", "colony-train-state"},
      {"epoch", std::to_string(epoch)},
      {"inner_step", std::to_string(stepping_->InnerStep())},
      {"run_id", options_.run_id}};
  return model::WriteSafetensors(file, items, metadata);
}

Status CollaborativeOptimizer::Impl::LoadCheckpoint(const std::filesystem::path& file) {
  COLONY_ASSIGN_OR_RETURN(auto f, model::SafetensorsFile::Open(file));
  const auto& h = f.header();
  auto meta_int = [&](const std::string& k) -> Result<int64_t> {
    auto it = h.metadata.find(k);
    if (it == h.metadata.end()) {
      return InvalidArgument(fmt::format("{} lacks '{}'", file.string(), k));
    }
    try {
      return static_cast<int64_t>(std::stoll(it->second));
    } catch (...) {
      return InvalidArgument(fmt::format("{} has a bad '{}'", file.string(), k));
    }
  };
  auto fmt_it = h.metadata.find("format");
  if (fmt_it == h.metadata.end() || fmt_it->second != "colony-train-state") {
    return InvalidArgument(fmt::format("{} is not a colony training checkpoint", file.string()));
  }
  COLONY_ASSIGN_OR_RETURN(int64_t epoch, meta_int("epoch"));
  COLONY_ASSIGN_OR_RETURN(int64_t inner, meta_int("inner_step"));
  NamedTensors named;
  for (const auto& info : h.tensors) {
    COLONY_ASSIGN_OR_RETURN(auto raw, f.ReadRaw(info.name));
    at::Tensor t =
        at::empty(info.shape, at::TensorOptions().dtype(model::ToScalarType(info.dtype)));
    if (static_cast<size_t>(t.nbytes()) != raw.size()) {
      return DataLoss(fmt::format("{}: tensor {} has the wrong size", file.string(), info.name));
    }
    std::memcpy(t.data_ptr(), raw.data(), raw.size());
    named.emplace_back(info.name, std::move(t));
  }
  COLONY_RETURN_IF_ERROR(ApplyState(named, epoch, inner));
  Publish(Active());
  UpdatePriority();
  return Status::Ok();
}

}  // namespace colony::train
