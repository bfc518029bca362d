#include "model/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/files.h"
#include "model/strict_json.h"

namespace colony::model {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<DType, std::string_view>, 10> kDTypeNames = {{
    {DType::kF32, "F32"},
    {DType::kF16, "F16"},
    {DType::kBF16, "BF16"},
    {DType::kI64, "I64"},
    {DType::kI32, "I32"},
    {DType::kI16, "I16"},
    {DType::kI8, "I8"},
    {DType::kU8, "U8"},
    {DType::kBool, "BOOL"},
    {DType::kF64, "F64"},
}};

// A tensor of more dimensions than this is surely garbage (the format sets no limit).
constexpr size_t kMaxRank = 64;
// Index files are small JSON maps; anything larger is refused before reading it into memory.
constexpr uint64_t kMaxIndexFileSize = 64ull << 20;
constexpr std::string_view kMetadataKey = "__metadata__";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Status Invalid(std::string_view what) {
  return InvalidArgument(fmt::format("safetensors: {}", what));
}
Status InvalidTensor(std::string_view name, std::string_view what) {
  return InvalidArgument(fmt::format("safetensors: tensor '{}': {}", name, what));
}

std::string ErrnoString(int err) { return std::strerror(err); }

// Number of bytes of a tensor, or nullopt when the product overflows.
std::optional<uint64_t> TensorBytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

Result<TensorInfo> ParseEntry(const std::string& name, const json& entry) {
  if (!entry.is_object()) return InvalidTensor(name, "entry is not a JSON object");
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return InvalidTensor(name, "missing or non-string \"dtype\"");
  }
  auto dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) return InvalidTensor(name, dtype.status().message());
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return InvalidTensor(name, "missing or non-array \"shape\"");
  }
  if (shape_it->size() > kMaxRank) {
    return InvalidTensor(name, fmt::format("shape has {} dimensions (at most {} supported)",
                                           shape_it->size(), kMaxRank));
  }
  for (const json& d : *shape_it) {
    // Non-negative integer literals parse as unsigned; negatives, fractions and values beyond
    // 2^64 do not.
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidTensor(
          name, fmt::format("shape dimension {} is not a non-negative integer", d.dump()));
    }
    info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return InvalidTensor(name, "\"data_offsets\" must be two non-negative integers [begin, end]");
  }
  info.begin = (*offsets_it)[0].get<uint64_t>();
  info.end = (*offsets_it)[1].get<uint64_t>();
  if (info.end < info.begin) {
    return InvalidTensor(
        name, fmt::format("data_offsets [{}, {}) end before they begin", info.begin, info.end));
  }
  auto bytes = TensorBytes(info.shape, info.dtype);
  if (!bytes) {
    return InvalidTensor(name, fmt::format("shape {} of {} overflows 64 bits",
                                           ShapeString(info.shape), DTypeName(info.dtype)));
  }
  if (*bytes != info.end - info.begin) {
    return InvalidTensor(
        name, fmt::format("data_offsets [{}, {}) span {} bytes but shape {} of {} needs {}",
                          info.begin, info.end, info.end - info.begin, ShapeString(info.shape),
                          DTypeName(info.dtype), *bytes));
  }
  return info;
}

// Reads exactly out.size() bytes at `offset`.
Status PreadAll(int fd, std::span<uint8_t> out, uint64_t offset,
                const std::filesystem::path& path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return DataLoss(fmt::format("read {}: {}", path.string(), ErrnoString(errno)));
    }
    if (n == 0) {
      return DataLoss(
          fmt::format("read {}: unexpected end of file at byte {} (file truncated "
                      "while open?)",
                      path.string(), offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteAll(int fd, std::span<const uint8_t> data, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(fmt::format("write {}: {}", path.string(), ErrnoString(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  for (const auto& [d, name] : kDTypeNames) {
    if (d == dtype) return name;
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  for (const auto& [d, n] : kDTypeNames) {
    if (n == name) return d;
  }
  // Bound the echoed name: it comes from untrusted input.
  return InvalidArgument(fmt::format(
      "unsupported dtype \"{}\" (supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)",
      name.substr(0, 32)));
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> prefix,
                                                 uint64_t file_size) {
  if (prefix.size() < 8 || file_size < 8) {
    return Invalid(fmt::format("file of {} bytes is too short for the 8-byte header length",
                               std::min<uint64_t>(prefix.size(), file_size)));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[static_cast<size_t>(i)];
  if (n > kMaxSafetensorsHeaderSize) {
    return Invalid(fmt::format("header length {} exceeds the limit of {} bytes", n,
                               kMaxSafetensorsHeaderSize));
  }
  if (n > file_size - 8) {
    return Invalid(
        fmt::format("header length {} runs past the end of the {}-byte file", n, file_size));
  }
  if (prefix.size() - 8 < n) {
    return Invalid(fmt::format("truncated header: {} of {} bytes present", prefix.size() - 8, n));
  }
  const auto* text = reinterpret_cast<const char*>(prefix.data() + 8);
  if (n == 0 || text[0] != '{') return Invalid("header is not a JSON object");

  SafetensorsHeader header;
  header.data_offset = 8 + n;
  const uint64_t data_size = file_size - header.data_offset;
  try {
    // Duplicate keys would let two readers see different tensors under the same name. A valid
    // header nests 3 deep (entry, shape); the bound only cuts hostile ones short.
    auto parsed = ParseStrictJsonObject(std::string_view(text, n), "header", /*max_depth=*/16);
    if (!parsed.ok()) return Invalid(parsed.status().message());
    const json& doc = *parsed;

    for (const auto& [key, value] : doc.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) return Invalid("\"__metadata__\" is not a JSON object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string()) {
            return Invalid(
                fmt::format("\"__metadata__\" value of \"{}\" is not a string", mk.substr(0, 256)));
          }
          header.metadata.emplace(mk, mv.get<std::string>());
        }
        continue;
      }
      COLONY_ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(key, value));
      if (info.end > data_size) {
        return InvalidTensor(key, fmt::format("data_offsets [{}, {}) lie beyond the {}-byte data "
                                              "section (file truncated?)",
                                              info.begin, info.end, data_size));
      }
      header.tensors.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    // nlohmann reports some malformed input (and allocation failures) by throwing.
    return Invalid(fmt::format("header could not be parsed: {}", e.what()));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin == t.end) continue;  // empty tensors occupy no bytes
    if (prev != nullptr && t.begin < prev->end) {
      return InvalidTensor(t.name, fmt::format("data_offsets [{}, {}) overlap tensor '{}' at "
                                               "[{}, {})",
                                               t.begin, t.end, prev->name, prev->begin, prev->end));
    }
    prev = &t;
  }
  return header;
}

struct SafetensorsFile::Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Result<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.fd_ = std::make_shared<Fd>();
  file.fd_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd_->fd < 0) {
    int err = errno;
    std::string msg = fmt::format("open {}: {}", path.string(), ErrnoString(err));
    return err == ENOENT ? NotFound(std::move(msg)) : Unavailable(std::move(msg));
  }
  struct stat st {};
  if (::fstat(file.fd_->fd, &st) != 0) {
    return Unavailable(fmt::format("stat {}: {}", path.string(), ErrnoString(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(fmt::format("{} is not a regular file", path.string()));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);

  std::vector<uint8_t> prefix(8);
  if (file_size >= 8) {
    COLONY_RETURN_IF_ERROR(PreadAll(file.fd_->fd, prefix, 0, path));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[static_cast<size_t>(i)];
    // Only read as much as the parser will accept; it reports the errors.
    if (n <= kMaxSafetensorsHeaderSize && n <= file_size - 8) {
      prefix.resize(8 + n);
      COLONY_RETURN_IF_ERROR(
          PreadAll(file.fd_->fd, std::span<uint8_t>(prefix).subspan(8), 8, path));
    }
  }
  auto header = ParseSafetensorsHeader(prefix, file_size);
  if (!header.ok()) return header.status().WithContext(path.string());
  file.header_ = std::move(header).value();
  for (size_t i = 0; i < file.header_.tensors.size(); ++i) {
    file.index_.emplace(file.header_.tensors[i].name, i);
  }
  return file;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Result<std::vector<uint8_t>> SafetensorsFile::ReadRaw(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return NotFound(fmt::format("{}: no tensor named '{}'", path_.string(), name));
  }
  std::vector<uint8_t> out(info->num_bytes());
  COLONY_RETURN_IF_ERROR(ReadInto(*info, out));
  return out;
}

Status SafetensorsFile::ReadInto(const TensorInfo& info, std::span<uint8_t> out) const {
  if (out.size() != info.num_bytes()) {
    return InvalidArgument(fmt::format("{}: tensor '{}' has {} bytes, buffer has {}",
                                       path_.string(), info.name, info.num_bytes(), out.size()));
  }
  if (!fd_) return FailedPrecondition("SafetensorsFile used before Open");
  return PreadAll(fd_->fd, out, header_.data_offset + info.begin, path_);
}

Status WriteSafetensors(const std::filesystem::path& path,
                        const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json doc = json::object();
  if (!metadata.empty()) doc[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const auto& [info, data] : tensors) {
    if (info.name.empty() || info.name == kMetadataKey) {
      return InvalidArgument(fmt::format("safetensors: invalid tensor name '{}'", info.name));
    }
    if (doc.contains(info.name)) {
      return InvalidArgument(fmt::format("safetensors: tensor '{}' given twice", info.name));
    }
    auto bytes = TensorBytes(info.shape, info.dtype);
    if (!bytes || *bytes != data.size()) {
      return InvalidArgument(fmt::format(
          "safetensors: tensor '{}': shape {} of {} does not match its {} bytes of data", info.name,
          ShapeString(info.shape), DTypeName(info.dtype), data.size()));
    }
    doc[info.name] = {{"dtype", DTypeName(info.dtype)},
                      {"shape", info.shape},
                      {"data_offsets", {offset, offset + data.size()}}};
    offset += data.size();
  }
  std::string text;
  try {
    text = doc.dump();
  } catch (const json::exception& e) {  // names or metadata that are not valid UTF-8
    return InvalidArgument(fmt::format("safetensors: cannot encode header: {}", e.what()));
  }
  // Pad so that the data section starts at a multiple of 8 bytes.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> prefix(8 + text.size());
  for (int i = 0; i < 8; ++i)
    prefix[static_cast<size_t>(i)] = static_cast<uint8_t>(text.size() >> (8 * i));
  std::memcpy(prefix.data() + 8, text.data(), text.size());

  static std::atomic<uint64_t> counter{0};
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp-{}-{}", ::getpid(), counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Unavailable(fmt::format("create {}: {}", tmp.string(), ErrnoString(errno)));
  }
  Status st = WriteAll(fd, prefix, tmp);
  for (const auto& [info, data] : tensors) {
    if (!st.ok()) break;
    st = WriteAll(fd, data, tmp);
  }
  if (st.ok() && ::fsync(fd) != 0) {
    st = Internal(fmt::format("fsync {}: {}", tmp.string(), ErrnoString(errno)));
  }
  if (::close(fd) != 0 && st.ok()) {
    st = Internal(fmt::format("close {}: {}", tmp.string(), ErrnoString(errno)));
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Internal(
        fmt::format("rename {} to {}: {}", tmp.string(), path.string(), ErrnoString(errno)));
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

Result<std::map<std::string, std::filesystem::path>> ReadShardIndex(
    const std::filesystem::path& dir) {
  std::map<std::string, std::filesystem::path> out;
  const std::filesystem::path index_path = dir / kSafetensorsIndexFileName;
  std::error_code ec;
  if (std::filesystem::exists(index_path, ec)) {
    auto size = std::filesystem::file_size(index_path, ec);
    if (ec) return Unavailable(fmt::format("stat {}: {}", index_path.string(), ec.message()));
    if (size > kMaxIndexFileSize) {
      return InvalidArgument(fmt::format("{} is {} bytes; refusing index files over {}",
                                         index_path.string(), size, kMaxIndexFileSize));
    }
    COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path, kMaxIndexFileSize));
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      return InvalidArgument(fmt::format("{} is not a JSON object", index_path.string()));
    }
    auto map_it = doc.find("weight_map");
    if (map_it == doc.end() || !map_it->is_object()) {
      return InvalidArgument(fmt::format("{} has no \"weight_map\" object", index_path.string()));
    }
    for (const auto& [name, file] : map_it->items()) {
      // Shards must be files next to the index: no directories, no "..".
      if (!file.is_string() || file.get_ref<const std::string&>().empty() ||
          file.get_ref<const std::string&>().find('/') != std::string::npos ||
          file.get_ref<const std::string&>() == "." || file.get_ref<const std::string&>() == "..") {
        return InvalidArgument(fmt::format("{}: tensor '{}' maps to {}, not a file name in {}",
                                           index_path.string(), name, file.dump(), dir.string()));
      }
      out.emplace(name, dir / file.get<std::string>());
    }
    return out;
  }
  const std::filesystem::path single = dir / kSafetensorsFileName;
  if (!std::filesystem::exists(single, ec)) {
    return NotFound(fmt::format("{} has neither {} nor {}", dir.string(), kSafetensorsFileName,
                                kSafetensorsIndexFileName));
  }
  COLONY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single));
  for (const TensorInfo& t : file.header().tensors) out.emplace(t.name, single);
  return out;
}

}  // namespace colony::model
