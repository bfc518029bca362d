#include "model/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/files.h"

namespace colony::model {
namespace {

constexpr std::string_view kConfigFileName = "config.json";
constexpr uint64_t kMaxConfigFileSize = 1 << 20;

bool IsFloat(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kF64;
}

// Checks that the file's tensor can be copied into `dest` (shape equal, dtypes equal or both
// floating point).
Status CheckCompatible(const SafetensorsFile& file, const TensorInfo& info,
                       const torch::Tensor& dest) {
  if (!dest.defined()) {
    return InvalidArgument(fmt::format("tensor '{}': destination tensor is undefined", info.name));
  }
  if (info.shape != dest.sizes().vec()) {
    return InvalidArgument(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]",
                                       file.path().string(), info.name, fmt::join(info.shape, ", "),
                                       fmt::join(dest.sizes().vec(), ", ")));
  }
  auto dest_dtype = ToDType(dest.scalar_type());
  if (!dest_dtype ||
      (*dest_dtype != info.dtype && !(IsFloat(*dest_dtype) && IsFloat(info.dtype)))) {
    return InvalidArgument(fmt::format("{}: tensor '{}' is {}, cannot load it into a {} tensor",
                                       file.path().string(), info.name, DTypeName(info.dtype),
                                       c10::toString(dest.scalar_type())));
  }
  return Status::Ok();
}

// Reads one tensor and copies it into `dest` (converting float types).
Status CopyInto(const SafetensorsFile& file, const TensorInfo& info, torch::Tensor& dest) {
  auto tmp = at::empty(info.shape, at::TensorOptions().dtype(ToScalarType(info.dtype)));
  COLONY_RETURN_IF_ERROR(
      file.ReadInto(info, std::span<uint8_t>(static_cast<uint8_t*>(tmp.data_ptr()), tmp.nbytes())));
  torch::NoGradGuard no_grad;
  dest.copy_(tmp);
  return Status::Ok();
}

}  // namespace

std::optional<DType> ToDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kDouble:
      return DType::kF64;
    case at::kLong:
      return DType::kI64;
    case at::kInt:
      return DType::kI32;
    case at::kShort:
      return DType::kI16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF64:
      return at::kDouble;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

NamedTensors NamedParametersOf(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

Status SaveModule(const std::filesystem::path& file, const NamedTensors& named,
                  const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;  // CPU contiguous copies must outlive the write
  keep.reserve(named.size());
  std::vector<TensorToWrite> tensors;
  tensors.reserve(named.size());
  for (const auto& [name, tensor] : named) {
    if (!tensor.defined()) {
      return InvalidArgument(fmt::format("SaveModule: tensor '{}' is undefined", name));
    }
    auto dtype = ToDType(tensor.scalar_type());
    if (!dtype) {
      return InvalidArgument(fmt::format("SaveModule: tensor '{}' has unsupported dtype {}", name,
                                         c10::toString(tensor.scalar_type())));
    }
    keep.push_back(tensor.detach().to(at::kCPU).contiguous());
    const auto& t = keep.back();
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.shape = t.sizes().vec();
    tensors.emplace_back(
        std::move(info),
        std::span<const uint8_t>(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes()));
  }
  return WriteSafetensors(file, tensors, metadata);
}

Status LoadModule(const std::filesystem::path& file, const NamedTensors& named) {
  COLONY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(file));
  std::set<std::string, std::less<>> wanted;
  for (const auto& [name, tensor] : named) {
    if (!wanted.insert(name).second) {
      return InvalidArgument(fmt::format("LoadModule: tensor name '{}' given twice", name));
    }
    const TensorInfo* info = f.Find(name);
    if (info == nullptr) {
      return NotFound(fmt::format("{}: missing tensor '{}'", file.string(), name));
    }
    COLONY_RETURN_IF_ERROR(CheckCompatible(f, *info, tensor));
  }
  for (const TensorInfo& info : f.header().tensors) {
    if (!wanted.contains(info.name)) {
      return InvalidArgument(
          fmt::format("{}: unexpected tensor '{}' (not in the module)", file.string(), info.name));
    }
  }
  for (const auto& [name, tensor] : named) {
    torch::Tensor dest = tensor;
    COLONY_RETURN_IF_ERROR(CopyInto(f, *f.Find(name), dest));
  }
  return Status::Ok();
}

Result<LlamaConfig> LoadLlamaConfig(const std::filesystem::path& dir) {
  const auto path = dir / kConfigFileName;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return NotFound(fmt::format("{}: {}", path.string(), ec.message()));
  if (size > kMaxConfigFileSize) {
    return InvalidArgument(
        fmt::format("{} is {} bytes, too large for a config", path.string(), size));
  }
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxConfigFileSize));
  auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return InvalidArgument(fmt::format("{} is not valid JSON", path.string()));
  auto config = LlamaConfig::FromJson(doc);
  if (!config.ok()) return config.status().WithContext(path.string());
  return config;
}

Status SaveLlama(const std::filesystem::path& dir, LlamaModel& model) {
  if (model->config().remote_experts) {
    return InvalidArgument(
        "SaveLlama: this model's experts are remote; it holds no expert weights");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Unavailable(fmt::format("create {}: {}", dir.string(), ec.message()));
  COLONY_RETURN_IF_ERROR(
      SaveModule(dir / kSafetensorsFileName, model->NamedParametersHF(), {{"format", "pt"}}));
  // Config last: a directory with a config.json has its weights.
  return WriteFileAtomically(dir / kConfigFileName, model->config().ToJson().dump(2) + "\n");
}

Status SaveLlama(const std::filesystem::path& dir, LlamaModel& model, const LlamaConfig& config) {
  if (!(config == model->config())) {
    return InvalidArgument(fmt::format("SaveLlama: config {} is not the model's config {}",
                                       config.ToJson().dump(), model->config().ToJson().dump()));
  }
  return SaveLlama(dir, model);
}

Status LoadLlamaTensors(const std::filesystem::path& dir, const NamedTensors& named) {
  COLONY_ASSIGN_OR_RETURN(auto index, ReadShardIndex(dir));
  // Group by shard so that each file is opened once.
  std::map<std::filesystem::path, std::vector<const std::pair<std::string, torch::Tensor>*>>
      by_file;
  for (const auto& entry : named) {
    auto it = index.find(entry.first);
    if (it == index.end()) {
      return NotFound(fmt::format("{}: checkpoint has no tensor '{}'", dir.string(), entry.first));
    }
    by_file[it->second].push_back(&entry);
  }
  std::vector<std::pair<SafetensorsFile, decltype(by_file)::mapped_type>> files;
  for (auto& [path, entries] : by_file) {
    COLONY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
    for (const auto* entry : entries) {
      const TensorInfo* info = f.Find(entry->first);
      if (info == nullptr) {
        return DataLoss(fmt::format("{}: the index maps tensor '{}' to this file, which lacks it",
                                    path.string(), entry->first));
      }
      COLONY_RETURN_IF_ERROR(CheckCompatible(f, *info, entry->second));
    }
    files.emplace_back(std::move(f), std::move(entries));
  }
  // Copy only once every tensor checked out, so that a bad checkpoint leaves the model intact
  // (I/O errors in the middle excepted).
  for (auto& [f, entries] : files) {
    for (const auto* entry : entries) {
      torch::Tensor dest = entry->second;
      COLONY_RETURN_IF_ERROR(CopyInto(f, *f.Find(entry->first), dest));
    }
  }
  return Status::Ok();
}

Result<LlamaModel> LoadLlama(const std::filesystem::path& dir) {
  COLONY_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(dir));
  LlamaModel model(config);
  COLONY_RETURN_IF_ERROR(LoadLlamaTensors(dir, model->NamedParametersHF()));
  return model;
}

Result<LlamaBlockRange> LoadLlamaBlocks(const std::filesystem::path& dir, int64_t first,
                                        int64_t last) {
  COLONY_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(dir));
  if (first < 0 || first >= last || last > config.num_layers) {
    return InvalidArgument(fmt::format("blocks [{}, {}) are not a range of the {} layers of {}",
                                       first, last, config.num_layers, dir.string()));
  }
  LlamaBlockRange range{config, first, {}};
  NamedTensors named;
  for (int64_t i = first; i < last; ++i) {
    range.blocks.emplace_back(config);
    for (auto& entry : BlockParametersHF(range.blocks.back(), i)) named.push_back(std::move(entry));
  }
  COLONY_RETURN_IF_ERROR(LoadLlamaTensors(dir, named));
  return range;
}

}  // namespace colony::model
