#include "dht/validation.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/bytes.h"

namespace colony::dht {
namespace {

constexpr std::string_view kOwnerPrefix = "[owner:";
constexpr std::string_view kSignaturePrefix = "[signature:";
constexpr size_t kSignatureB64 = 88;  // base64 (padded) of 64 bytes

// Owner ids named in `s` (every "[owner:<id>]" occurrence), or an error for a malformed one.
Status FindOwners(std::string_view s, std::vector<PeerId>& owners) {
  size_t pos = 0;
  while ((pos = s.find(kOwnerPrefix, pos)) != std::string_view::npos) {
    const size_t start = pos + kOwnerPrefix.size();
    const size_t end = s.find(']', start);
    if (end == std::string_view::npos) {
      return PermissionDenied("owner marker without closing ']'");
    }
    auto id = PeerId::Parse(s.substr(start, end - start));
    if (!id.ok())
      return PermissionDenied("owner marker names no valid peer id: " + id.status().message());
    owners.push_back(*id);
    pos = end;
  }
  return Status::Ok();
}

Result<std::optional<PeerId>> OwnerOf(const RecordView& r) {
  std::vector<PeerId> owners;
  COLONY_RETURN_IF_ERROR(FindOwners(r.key, owners));
  if (r.subkey) COLONY_RETURN_IF_ERROR(FindOwners(*r.subkey, owners));
  if (owners.empty()) return std::optional<PeerId>();
  for (const PeerId& o : owners) {
    if (!(o == owners[0])) {
      return PermissionDenied("key and subkey name different owners (" + owners[0].Short() + ", " +
                              o.Short() + ")");
    }
  }
  return std::optional<PeerId>(owners[0]);
}

Bytes SignedMessage(const RecordView& r, std::string_view value) {
  Bytes out;
  ByteWriter w(out);
  w.Raw(std::string_view("colony-dht-record-v1"));
  w.Varint(r.key.size());
  w.Raw(r.key);
  w.U8(r.subkey ? 1 : 0);
  if (r.subkey) {
    w.Varint(r.subkey->size());
    w.Raw(*r.subkey);
  }
  w.Varint(value.size());
  w.Raw(value);
  w.U64(std::bit_cast<uint64_t>(r.expiration));
  return out;
}

// Splits "<value>[signature:<base64>]"; nullopt when there is no well-formed signature suffix.
std::optional<std::pair<std::string_view, Signature>> SplitSignature(std::string_view v) {
  const size_t suffix = kSignaturePrefix.size() + kSignatureB64 + 1;
  if (v.size() < suffix || v.back() != ']') return std::nullopt;
  const std::string_view tail = v.substr(v.size() - suffix);
  if (tail.substr(0, kSignaturePrefix.size()) != kSignaturePrefix) return std::nullopt;
  const std::string_view b64 = tail.substr(kSignaturePrefix.size(), kSignatureB64);
  Signature sig;
  size_t len = 0;
  if (sodium_base642bin(sig.data(), sig.size(), b64.data(), b64.size(), nullptr, &len, nullptr,
                        sodium_base64_VARIANT_ORIGINAL) != 0 ||
      len != sig.size()) {
    return std::nullopt;
  }
  return std::make_pair(v.substr(0, v.size() - suffix), sig);
}

}  // namespace

void ValidatorChain::Add(std::shared_ptr<const RecordValidator> validator) {
  validators_.push_back(std::move(validator));
  std::stable_sort(validators_.begin(), validators_.end(),
                   [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
}

Result<std::string> ValidatorChain::Sign(RecordView record) const {
  for (const auto& v : validators_) {
    COLONY_ASSIGN_OR_RETURN(record.value, v->Sign(record));
  }
  return std::move(record.value);
}

Result<std::string> ValidatorChain::ValidateAndStrip(RecordView record) const {
  for (auto it = validators_.rbegin(); it != validators_.rend(); ++it) {
    COLONY_RETURN_IF_ERROR((*it)->Validate(record));
    record.value = (*it)->Strip(record);
  }
  return std::move(record.value);
}

std::string OwnerMarker(const PeerId& peer) {
  return std::string(kOwnerPrefix) + peer.ToString() + "]";
}

std::optional<PeerId> ParseOwnerMarker(std::string_view text) {
  if (!text.starts_with(kOwnerPrefix) || !text.ends_with("]")) return std::nullopt;
  auto peer =
      PeerId::Parse(text.substr(kOwnerPrefix.size(), text.size() - kOwnerPrefix.size() - 1));
  if (!peer.ok()) return std::nullopt;
  return *peer;
}

bool HasOwnerMarker(std::string_view text) {
  return text.find(kOwnerPrefix) != std::string_view::npos;
}

Status KeyFamilyValidator::Validate(const RecordView& record) const {
  for (const KeyFamily& family : families_) {
    if (!family.matches(record.key)) continue;
    const std::optional<PeerId> owner =
        record.subkey ? ParseOwnerMarker(*record.subkey) : std::nullopt;
    if (!owner) {
      return PermissionDenied(fmt::format(
          "key '{}' holds {}: each peer writes only its own entry, under a subkey that is its "
          "owner marker ({}), signed",
          record.key, family.name, record.subkey ? "not this subkey" : "no plain value"));
    }
    if (HasOwnerMarker(record.key)) {
      return PermissionDenied(fmt::format("key '{}' holds {} and must not name an owner itself",
                                          record.key, family.name));
    }
    if (family.check) {
      Status st = family.check(record.key, *owner, record.value);
      if (!st.ok()) {
        return PermissionDenied(fmt::format("the entry of {} under key '{}' is not one of {}: {}",
                                            owner->Short(), record.key, family.name, st.message()));
      }
    }
    return Status::Ok();
  }
  return Status::Ok();
}

Status OwnerValidator::Validate(const RecordView& record) const {
  COLONY_ASSIGN_OR_RETURN(std::optional<PeerId> owner, OwnerOf(record));
  if (!owner) return Status::Ok();
  auto split = SplitSignature(record.value);
  if (!split) {
    return PermissionDenied("record names owner " + owner->Short() + " but carries no signature");
  }
  if (!owner->Verify(SignedMessage(record, split->first), split->second)) {
    return PermissionDenied("record's signature is not " + owner->Short() +
                            "'s (only the owner may write it)");
  }
  return Status::Ok();
}

Result<std::string> OwnerValidator::Sign(const RecordView& record) const {
  COLONY_ASSIGN_OR_RETURN(std::optional<PeerId> owner, OwnerOf(record));
  if (!owner) return record.value;
  if (signer_ == nullptr || !(signer_->peer_id() == *owner)) {
    return PermissionDenied("record names owner " + owner->Short() + ", but this node is " +
                            (signer_ ? signer_->peer_id().Short() : std::string("anonymous")) +
                            " and cannot sign for it");
  }
  const Signature sig = signer_->Sign(SignedMessage(record, record.value));
  char b64[kSignatureB64 + 1];
  sodium_bin2base64(b64, sizeof(b64), sig.data(), sig.size(), sodium_base64_VARIANT_ORIGINAL);
  return record.value + std::string(kSignaturePrefix) + std::string(b64, kSignatureB64) + "]";
}

std::string OwnerValidator::Strip(const RecordView& record) const {
  auto owner = OwnerOf(record);
  if (!owner.ok() || !*owner) return record.value;
  auto split = SplitSignature(record.value);
  return split ? std::string(split->first) : record.value;
}

std::string_view JsonTypeName(JsonType type) {
  switch (type) {
    case JsonType::kAny:
      return "any";
    case JsonType::kNull:
      return "null";
    case JsonType::kBool:
      return "bool";
    case JsonType::kInt:
      return "int";
    case JsonType::kNumber:
      return "number";
    case JsonType::kString:
      return "string";
    case JsonType::kArray:
      return "array";
    case JsonType::kObject:
      return "object";
  }
  return "?";
}

namespace {

bool Matches(const nlohmann::json& j, JsonType type) {
  switch (type) {
    case JsonType::kAny:
      return true;
    case JsonType::kNull:
      return j.is_null();
    case JsonType::kBool:
      return j.is_boolean();
    case JsonType::kInt:
      return j.is_number_integer();
    case JsonType::kNumber:
      return j.is_number();
    case JsonType::kString:
      return j.is_string();
    case JsonType::kArray:
      return j.is_array();
    case JsonType::kObject:
      return j.is_object();
  }
  return false;
}

std::string Describe(const nlohmann::json& j) {
  std::string s = j.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return fmt::format("{} ({})", s, j.type_name());
}

}  // namespace

SchemaValidator::SchemaValidator(std::vector<ValueSchema> schemas, bool allow_other_keys)
    : schemas_(std::move(schemas)), allow_other_keys_(allow_other_keys) {}

Status SchemaValidator::Validate(const RecordView& record) const {
  auto it = std::find_if(schemas_.begin(), schemas_.end(),
                         [&](const ValueSchema& s) { return s.key == record.key; });
  if (it == schemas_.end()) {
    if (allow_other_keys_) return Status::Ok();
    return PermissionDenied(fmt::format("key '{}' has no schema on this swarm", record.key));
  }
  const ValueSchema& schema = *it;
  if (schema.dictionary && *schema.dictionary != record.subkey.has_value()) {
    return PermissionDenied(fmt::format("key '{}' must be stored {}", record.key,
                                        *schema.dictionary ? "with a subkey" : "without a subkey"));
  }
  nlohmann::json j = nlohmann::json::parse(record.value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return PermissionDenied(fmt::format("value under key '{}' is not JSON", record.key));
  }
  if (!Matches(j, schema.type)) {
    return PermissionDenied(fmt::format("value under key '{}' must be {}, got {}", record.key,
                                        JsonTypeName(schema.type), Describe(j)));
  }
  if (j.is_object()) {
    for (const FieldSchema& f : schema.fields) {
      auto field = j.find(f.name);
      if (field == j.end()) {
        if (f.required) {
          return PermissionDenied(
              fmt::format("value under key '{}' lacks field '{}'", record.key, f.name));
        }
        continue;
      }
      if (!Matches(*field, f.type)) {
        return PermissionDenied(fmt::format("field '{}' under key '{}' must be {}, got {}", f.name,
                                            record.key, JsonTypeName(f.type), Describe(*field)));
      }
    }
  }
  return Status::Ok();
}

}  // namespace colony::dht
