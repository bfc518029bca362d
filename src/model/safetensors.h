// The safetensors container format (https://huggingface.co/docs/safetensors), torch-free.
//
//   [8 bytes: little-endian u64 N][N bytes: JSON header, padded with spaces][data section]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte
// offsets within the data section) and may carry "__metadata__", a string -> string map.
// Headers come from files downloaded off the Internet, so the parser treats them as hostile:
// every entry is checked before any offset is used.
//
//   COLONY_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open("model.safetensors"));
//   COLONY_ASSIGN_OR_RETURN(auto bytes, file.ReadRaw("model.norm.weight"));
//
// Values are stored little-endian; Colony only runs on little-endian hosts, so the bytes are used
// as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::model {

// The element types Colony reads and writes (safetensors also defines U16/U32/U64 and F8 types,
// which are refused as unsupported).
enum class DType { kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF64 };

size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "I64", ..., "BOOL".
std::string_view DTypeName(DType dtype);
Result<DType> ParseDType(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // [] is a scalar (one element)
  uint64_t begin = 0, end = 0;  // byte offsets within the data section

  uint64_t num_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in ascending order of `begin` (then name)
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data section starts in the file: 8 + N
};

// Largest accepted JSON header (as in the reference implementation).
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

// Parses and validates the header at the start of a file of `file_size` bytes. `prefix` must hold
// at least the first 8 + N bytes (more is fine). Refuses, naming the tensor and the problem:
// truncated input, a length over kMaxSafetensorsHeaderSize, malformed JSON or duplicate keys,
// unknown dtypes, negative or overflowing shapes, data_offsets that disagree with shape * dtype
// size, lie beyond the file, or overlap another tensor's.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> prefix,
                                                 uint64_t file_size);

// A safetensors file opened for reading single tensors: only the header is read on Open; each
// Read* reads one tensor's bytes with pread. Thread-safe for concurrent reads.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::filesystem::path& path);

  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* Find(std::string_view name) const;

  Result<std::vector<uint8_t>> ReadRaw(std::string_view name) const;
  // Reads the tensor's bytes into `out`, which must be exactly info.num_bytes() long (lets
  // callers read straight into a tensor's storage).
  Status ReadInto(const TensorInfo& info, std::span<uint8_t> out) const;

 private:
  struct Fd;
  SafetensorsFile() = default;
  std::filesystem::path path_;
  std::shared_ptr<Fd> fd_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

// One tensor to write: `info.begin`/`end` are ignored (the writer lays tensors out in the given
// order); `data` must hold exactly prod(shape) * DTypeSize(dtype) bytes.
using TensorToWrite = std::pair<TensorInfo, std::span<const uint8_t>>;

// Writes a safetensors file atomically (a temporary file in the same directory, fsync, rename),
// so readers never see a partial file. The header is padded with spaces to a multiple of 8 bytes
// so that the data section is aligned.
Status WriteSafetensors(const std::filesystem::path& path,
                        const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Hugging Face checkpoint layout: tensor name -> file holding it. Reads
// `dir/model.safetensors.index.json` ("weight_map") when present, else lists the tensors of
// `dir/model.safetensors`. Shard file names must be plain names inside `dir`.
inline constexpr std::string_view kSafetensorsFileName = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFileName = "model.safetensors.index.json";
Result<std::map<std::string, std::filesystem::path>> ReadShardIndex(
    const std::filesystem::path& dir);

}  // namespace colony::model
