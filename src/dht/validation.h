// Record validators: every node checks every record it stores or receives.
//
// A validator can sign a value before it is stored, check a stored value, and strip what it
// added before the value reaches the user. Validators compose in a ValidatorChain: signing runs
// in ascending priority (the highest-priority validator's additions are outermost), checking and
// stripping in descending priority, each validator seeing the value the outer ones stripped.
#pragma once

#include <functional>
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
// Whether `text` names an owner anywhere (then a valid record under it is the owner's).
bool HasOwnerMarker(std::string_view text);

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

// A family of keys that one of Colony's layers keeps its records under (block servers, progress
// reports, averaging groups, state donors, relays). Each peer writes only its own entry: every
// record under such a key must be a dictionary entry whose subkey is exactly the owner marker of
// the peer that signed it, and its value (the signature stripped) must parse as the layer parses
// it. So nobody can replace, wipe or fill in another peer's name, and junk never reaches readers.
struct KeyFamily {
  std::string name;  // what the records are, for errors ("server records")
  std::function<bool(std::string_view key)> matches;
  // The layer's parser, applied to the value with the signature stripped (null: any value).
  std::function<Status(std::string_view key, const PeerId& owner, std::string_view value)> check;
};

// Enforces KeyFamily rules on every store a node accepts and every entry a lookup returns.
class KeyFamilyValidator final : public RecordValidator {
 public:
  explicit KeyFamilyValidator(std::vector<KeyFamily> families) : families_(std::move(families)) {}
  Status Validate(const RecordView& record) const override;
  // Below OwnerValidator: it sees values whose signature was checked and stripped.
  int priority() const override { return 10; }

 private:
  std::vector<KeyFamily> families_;
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
