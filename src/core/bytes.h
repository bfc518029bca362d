// Byte buffers and explicit little-endian / varint encoding. Wire formats are written field by
// field with these helpers — never by copying packed structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace colony {

using Bytes = std::vector<uint8_t>;

// An allocator whose value-less construct() leaves memory uninitialised, so that resizing a
// buffer that is about to be overwritten (by a cipher, a socket read) costs no memset.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
// A byte buffer that grows without zero-filling.
using RawBuffer = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;
// Makes room for at least `capacity` bytes (at least doubling), moving the contents with one
// memcpy. Grow hot buffers with this before resize(): the vector's own reallocation moves a
// RawBuffer byte by byte (its allocator's construct() keeps libstdc++ off its memmove path),
// which cost ~6% of an all-reduce's CPU when the write buffer regrew after every small write.
void ReserveRaw(RawBuffer& buffer, size_t capacity);
using ByteSpan = std::span<const uint8_t>;
using MutableByteSpan = std::span<uint8_t>;

inline ByteSpan AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
inline std::string_view AsStringView(ByteSpan b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

std::string HexEncode(ByteSpan bytes);

// Appends fields to a growing buffer.
class ByteWriter {
 public:
  explicit ByteWriter(Bytes& out) : out_(out) {}
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<uint8_t>(v));
  }
  void Raw(ByteSpan b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void Raw(std::string_view s) { Raw(AsBytes(s)); }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  Bytes& out_;
};

// Reads fields from untrusted input. Every read is bounds-checked; after the first failure all
// reads fail and ok() is false, so decoders can read a whole header and check once.
class ByteReader {
 public:
  explicit ByteReader(ByteSpan in) : in_(in) {}
  bool ok() const { return ok_; }
  size_t remaining() const { return ok_ ? in_.size() - pos_ : 0; }
  size_t position() const { return pos_; }

  uint8_t U8() { return static_cast<uint8_t>(Le(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Le(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  // LEB128, at most 10 bytes, rejecting overlong encodings of 64-bit overflow.
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (!Need(1)) return 0;
      uint8_t b = in_[pos_++];
      if (shift == 63 && b > 1) return Fail();
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return Fail();
  }
  ByteSpan Raw(size_t n) {
    if (!Need(n)) return {};
    ByteSpan s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  ByteSpan Rest() { return Raw(remaining()); }

 private:
  bool Need(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  uint64_t Fail() {
    ok_ = false;
    return 0;
  }
  uint64_t Le(int n) {
    if (!Need(static_cast<size_t>(n))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += static_cast<size_t>(n);
    return v;
  }
  ByteSpan in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace colony
