// Record validators: every node checks every record it stores or receives.
//
// A validator can sign a value before it is stored, check a stored value, and strip what it
// added before the value reaches the user. Validators compose in a ValidatorChain: signing runs
// in ascending priority (the highest-priority validator's additions are outermost), checking and
// stripping in descending priority, each validator seeing the value the outer ones stripped.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/identity.h"
#include "core/status.h"

namespace colony::dht {

// A record as validators see it. `value` is the stored form (signatures included).
struct RecordView {
  std::string_view key;
  std::optional<std::string_view> subkey;
  std::string value;
  double expiration = 0;
};

class RecordValidator {
 public:
  virtual ~RecordValidator() = default;
  // OK when the record may be stored and returned; otherwise why not.
  virtual Status Validate(const RecordView& record) const = 0;
  // The value to store in place of record.value (e.g. with a signature appended).
  virtual Result<std::string> Sign(const RecordView& record) const { return record.value; }
  // The value without what Sign() added.
  virtual std::string Strip(const RecordView& record) const { return record.value; }
  virtual int priority() const { return 0; }
};

class ValidatorChain {
 public:
  void Add(std::shared_ptr<const RecordValidator> validator);
  Result<std::string> Sign(RecordView record) const;
  // Validates and, on success, returns the stripped value.
  Result<std::string> ValidateAndStrip(RecordView record) const;
  bool empty() const { return validators_.empty(); }

 private:
  std::vector<std::shared_ptr<const RecordValidator>> validators_;  // ascending priority
};

// Owner-protected records. A key or subkey containing OwnerMarker(peer) belongs to that peer:
// its value must carry the peer's Ed25519 signature over (key, subkey, value, expiration), so
// nobody else can write it, even after the owner has left. The signature travels appended to
// the value and is stripped before values are returned.
std::string OwnerMarker(const PeerId& peer);
// The peer named by `text` when it is exactly one owner marker (e.g. the subkey a peer stored
// its own entry under), else nullopt.
std::optional<PeerId> ParseOwnerMarker(std::string_view text);

class OwnerValidator final : public RecordValidator {
 public:
  // `signer`: this node's identity, used to sign records that name it (may be null: validate
  // only). The key pair must outlive the validator.
  explicit OwnerValidator(const KeyPair* signer) : signer_(signer) {}
  Status Validate(const RecordView& record) const override;
  Result<std::string> Sign(const RecordView& record) const override;
  std::string Strip(const RecordView& record) const override;
  int priority() const override { return 100; }

 private:
  const KeyPair* signer_;
};

// Schema validation for JSON values: records under the listed keys must hold JSON of the given
// shape (for dictionary records, every subkey's value must). "779.0" is not an int.
enum class JsonType { kAny, kNull, kBool, kInt, kNumber, kString, kArray, kObject };
std::string_view JsonTypeName(JsonType type);

struct FieldSchema {
  std::string name;
  JsonType type = JsonType::kAny;
  bool required = true;
};

struct ValueSchema {
  std::string key;  // the DHT key this schema governs
  JsonType type = JsonType::kAny;
  std::vector<FieldSchema> fields;  // for kObject: checked fields (others are allowed)
  // Whether the key must be stored as a dictionary (true), a plain value (false), or either.
  std::optional<bool> dictionary;
};

class SchemaValidator final : public RecordValidator {
 public:
  // `allow_other_keys`: whether keys without a schema are accepted.
  explicit SchemaValidator(std::vector<ValueSchema> schemas, bool allow_other_keys = true);
  Status Validate(const RecordView& record) const override;
  int priority() const override { return 0; }

 private:
  std::vector<ValueSchema> schemas_;
  bool allow_other_keys_;
};

}  // namespace colony::dht
