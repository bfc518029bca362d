// Audit claims (audit.h): a fixed little-endian binary form.
//   u8 version (1) | u64 seed | i64 batch size | 16 bytes params | u16 runs | runs x (i64 first,
//   i64 batches)
#include "train/audit.h"

#include <fmt/format.h>
#include <sodium.h>

#include <limits>

namespace colony::train {
namespace {

constexpr uint8_t kVersion = 1;
constexpr size_t kDigestBytes = 16;

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(std::string_view in, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return v;
}

}  // namespace

int64_t AuditClaim::Batches() const {
  int64_t n = 0;
  for (const auto& [first, count] : runs) n += count;
  return n;
}

bool AuditClaim::Add(int64_t index) {
  if (!runs.empty() && runs.back().first + runs.back().second == index) {
    ++runs.back().second;
    return true;
  }
  if (runs.size() >= kMaxAuditRuns) return false;
  runs.emplace_back(index, 1);
  return true;
}

std::string EncodeAuditClaim(const AuditClaim& c) {
  std::string out;
  out.push_back(static_cast<char>(kVersion));
  PutU64(out, c.seed);
  PutU64(out, static_cast<uint64_t>(c.batch_size));
  std::string digest = c.params;
  digest.resize(kDigestBytes, '\0');
  out += digest;
  out.push_back(static_cast<char>(c.runs.size() & 0xff));
  out.push_back(static_cast<char>((c.runs.size() >> 8) & 0xff));
  for (const auto& [first, count] : c.runs) {
    PutU64(out, static_cast<uint64_t>(first));
    PutU64(out, static_cast<uint64_t>(count));
  }
  return out;
}

Result<AuditClaim> DecodeAuditClaim(std::string_view in) {
  constexpr size_t kHeader = 1 + 8 + 8 + kDigestBytes + 2;
  if (in.size() < kHeader || static_cast<uint8_t>(in[0]) != kVersion) {
    return InvalidArgument("an audit claim must be version 1 and at least its header long");
  }
  AuditClaim c;
  c.seed = GetU64(in, 1);
  c.batch_size = static_cast<int64_t>(GetU64(in, 9));
  c.params = std::string(in.substr(17, kDigestBytes));
  const size_t runs = static_cast<uint8_t>(in[kHeader - 2]) |
                      (static_cast<size_t>(static_cast<uint8_t>(in[kHeader - 1])) << 8);
  if (c.batch_size < 1 || c.batch_size > kMaxAuditBatchSize) {
    return InvalidArgument(fmt::format("an audit claim's batch size {} is not in [1, {}]",
                                       c.batch_size, kMaxAuditBatchSize));
  }
  if (runs > kMaxAuditRuns || in.size() != kHeader + 16 * runs) {
    return InvalidArgument(fmt::format(
        "an audit claim must name at most {} runs of batches and nothing else", kMaxAuditRuns));
  }
  int64_t end = 0;  // runs in order, not overlapping
  for (size_t r = 0; r < runs; ++r) {
    const auto first = static_cast<int64_t>(GetU64(in, kHeader + 16 * r));
    const auto count = static_cast<int64_t>(GetU64(in, kHeader + 16 * r + 8));
    if (first < end || count < 1 || count > std::numeric_limits<int64_t>::max() / 2 - first) {
      return InvalidArgument("an audit claim's runs of batches must be non-empty and in order");
    }
    end = first + count;
    c.runs.emplace_back(first, count);
  }
  return c;
}

uint64_t AuditDataSeed(std::string_view run_id, const PeerId& peer, int64_t epoch) {
  // Lengths first, so that no two (run, peer) pairs hash the same bytes.
  std::string in = "colony.audit-data.v1";
  PutU64(in, run_id.size());
  in += run_id;
  const Bytes id = peer.ToBytes();
  PutU64(in, id.size());
  in.append(id.begin(), id.end());
  PutU64(in, static_cast<uint64_t>(epoch));
  unsigned char digest[8];
  crypto_generichash(digest, sizeof digest, reinterpret_cast<const unsigned char*>(in.data()),
                     in.size(), nullptr, 0);
  return GetU64(std::string_view(reinterpret_cast<const char*>(digest), sizeof digest), 0);
}

std::string ParamsDigest(std::span<const float> flat) {
  std::string out(kDigestBytes, '\0');
  crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out.size(),
                     reinterpret_cast<const unsigned char*>(flat.data()), flat.size_bytes(),
                     nullptr, 0);
  return out;
}

}  // namespace colony::train
