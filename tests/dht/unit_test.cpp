// Unit tests of the DHT's pieces: ids and distance, storage semantics and limits, validators,
// and the routing table.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "dht/id.h"
#include "dht/record.h"
#include "dht/routing.h"
#include "dht/validation.h"
#include "dht/vouches.h"

namespace colony::dht {
namespace {

constexpr double kNow = 1.7e9;

StoreItem Item(std::string key, std::string value, double expiration,
               std::optional<std::string> subkey = std::nullopt) {
  return {std::move(key), std::move(subkey), std::move(value), expiration};
}

TEST(DhtId, HashesAreStableDistinctAndXorIsAMetric) {
  EXPECT_EQ(DhtId::ForKey("a"), DhtId::ForKey("a"));
  EXPECT_NE(DhtId::ForKey("a"), DhtId::ForKey("b"));
  const PeerId p = KeyPair::Generate().peer_id();
  EXPECT_NE(DhtId::ForPeer(p), DhtId::ForKey(p.ToString()));
  const DhtId a = DhtId::ForKey("x"), b = DhtId::ForKey("y");
  EXPECT_EQ((a ^ a), DhtId());
  EXPECT_EQ((a ^ b), (b ^ a));
  EXPECT_EQ(a.CommonPrefixBits(a), kIdBits);
  EXPECT_EQ(a.ToHex().size(), 40u);
  EXPECT_FALSE(DhtId::FromBytes(Bytes(19)).ok());
  EXPECT_TRUE(DhtId::FromBytes(Bytes(20)).ok());
}

TEST(DhtId, RandomInBucketSharesExactlyThePrefix) {
  std::mt19937_64 rng(1);
  const DhtId base = DhtId::Random(rng);
  for (size_t bits : {0u, 1u, 7u, 8u, 63u, 159u}) {
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(base.CommonPrefixBits(DhtId::RandomInBucket(base, bits, rng)), bits);
    }
  }
}

TEST(DhtStorage, NewestExpirationWinsAndTiesConverge) {
  Storage s;
  const PeerId w = KeyPair::Generate().peer_id();
  const DhtId id = DhtId::ForKey("k");
  ASSERT_TRUE(s.Store(id, Item("k", "a", kNow + 10), w, kNow).ok());
  EXPECT_EQ(s.Store(id, Item("k", "b", kNow + 5), w, kNow).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(s.Store(id, Item("k", "a", kNow + 10), w, kNow).ok());  // identical: idempotent
  ASSERT_TRUE(s.Store(id, Item("k", "c", kNow + 10), w, kNow).ok());  // tie: larger value wins
  EXPECT_EQ(s.Store(id, Item("k", "b", kNow + 10), w, kNow).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.Get(id, kNow)->value.value, "c");
  ASSERT_TRUE(s.Store(id, Item("k", "d", kNow + 20), w, kNow).ok());
  EXPECT_EQ(s.Get(id, kNow)->value, (ValueEntry{"d", kNow + 20}));
  EXPECT_EQ(s.Get(id, kNow + 20), nullptr);  // expired
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(DhtStorage, DictionariesAndPlainValues) {
  Storage s;
  const PeerId w = KeyPair::Generate().peer_id();
  const DhtId id = DhtId::ForKey("d");
  ASSERT_TRUE(s.Store(id, Item("d", "plain", kNow + 10), w, kNow).ok());
  // A subkey turns the key into a dictionary, whatever the plain value's expiration.
  ASSERT_TRUE(s.Store(id, Item("d", "x", kNow + 5, "s1"), w, kNow).ok());
  ASSERT_TRUE(s.Store(id, Item("d", "y", kNow + 30, "s2"), w, kNow).ok());
  const Record* r = s.Get(id, kNow);
  ASSERT_TRUE(r && r->is_dict);
  EXPECT_EQ(r->subkeys.size(), 2u);
  EXPECT_EQ(r->Expiration(), kNow + 30);
  // Subkeys expire one by one.
  r = s.Get(id, kNow + 15);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->subkeys.size(), 1u);
  // A plain value never replaces a dictionary (hivemind lets a newer one win: that is how one
  // peer would wipe everyone's entries), however far its expiration.
  auto st = s.Store(id, Item("d", "p", kNow + 3000), w, kNow + 15);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("a plain value cannot replace it"), std::string::npos)
      << st.message();
  EXPECT_TRUE(s.Get(id, kNow + 15)->is_dict);
  // Once the dictionary has expired, the key is free again.
  ASSERT_TRUE(s.Store(id, Item("d", "p", kNow + 3000), w, kNow + 31).ok());
  EXPECT_FALSE(s.Get(id, kNow + 31)->is_dict);
}

TEST(DhtStorage, OwnerSignedSubkeysPushOutUnsignedOnesWhenTheDictionaryIsFull) {
  StorageLimits limits;
  limits.max_subkeys = 4;
  Storage s(limits);
  const PeerId attacker = KeyPair::Generate().peer_id();
  const PeerId owner = KeyPair::Generate().peer_id(), other = KeyPair::Generate().peer_id();
  const DhtId id = DhtId::ForKey("d");
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(
        s.Store(id, Item("d", "junk", kNow + 100 + i, "j" + std::to_string(i)), attacker, kNow)
            .ok());
  }
  // An unsigned newcomer is refused; an owner's entry takes the place of the soonest-expiring
  // junk, and the attacker's quota is credited.
  EXPECT_EQ(s.Store(id, Item("d", "more", kNow + 500, "j9"), attacker, kNow).code(),
            StatusCode::kResourceExhausted);
  const size_t before = s.usage_of(attacker);
  ASSERT_TRUE(s.Store(id, Item("d", "mine", kNow + 10, OwnerMarker(owner)), owner, kNow).ok());
  EXPECT_LT(s.usage_of(attacker), before);
  const Record* r = s.Get(id, kNow);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->subkeys.size(), 4u);
  EXPECT_FALSE(r->subkeys.contains("j0"));
  EXPECT_TRUE(r->subkeys.contains("j1"));
  EXPECT_EQ(r->subkeys.at(OwnerMarker(owner)).value, "mine");
  // Owners' entries are never pushed out: a dictionary full of them refuses the next owner.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.Store(id, Item("d", "x", kNow + 10, OwnerMarker(KeyPair::Generate().peer_id())),
                        other, kNow)
                    .ok());
  }
  EXPECT_EQ(s.Store(id, Item("d", "x", kNow + 10, OwnerMarker(other)), other, kNow).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Get(id, kNow)->subkeys.size(), 4u);
}

TEST(DhtStorage, MergeFollowsTheSameRules) {
  Record a{true, {}, {{"x", {"1", kNow + 5}}, {"y", {"2", kNow + 9}}}};
  Record b{true, {}, {{"x", {"3", kNow + 7}}, {"z", {"4", kNow + 1}}}};
  MergeRecord(a, b);
  EXPECT_EQ(a.subkeys.size(), 3u);
  EXPECT_EQ(a.subkeys["x"].value, "3");
  // A plain value does not replace a dictionary, however new; a dictionary replaces it.
  Record plain{false, {"p", kNow + 100}, {}};
  MergeRecord(a, plain);
  EXPECT_TRUE(a.is_dict);
  MergeRecord(plain, a);
  EXPECT_TRUE(plain.is_dict);
  Record p2{false, {"p", kNow + 100}, {}};
  EXPECT_TRUE(DropExpired(p2, kNow));
  EXPECT_FALSE(DropExpired(p2, kNow + 100));
}

// What a lookup merged from several replicas is trimmed to one node's limits: unsigned subkeys
// go first, earliest expiration first, and owner-signed ones stay while they fit.
TEST(DhtStorage, AMergedDictionaryIsTrimmedToTheLimitsKeepingOwnersEntries) {
  StorageLimits limits;
  limits.max_subkeys = 3;
  const std::string owner1 = OwnerMarker(KeyPair::Generate().peer_id());
  const std::string owner2 = OwnerMarker(KeyPair::Generate().peer_id());
  Record r{true, {}, {{"a", {"1", kNow + 9}}, {"b", {"2", kNow + 5}}, {owner1, {"3", kNow + 1}}}};
  EXPECT_TRUE(FitsLimits("k", r, limits));
  r.subkeys[owner2] = {"4", kNow + 2};
  r.subkeys["c"] = {"5", kNow + 7};
  EXPECT_FALSE(FitsLimits("k", r, limits));
  TrimToLimits("k", r, limits);
  ASSERT_EQ(r.subkeys.size(), 3u);
  EXPECT_TRUE(r.subkeys.contains(owner1) && r.subkeys.contains(owner2));
  EXPECT_TRUE(r.subkeys.contains("a"));  // the unsigned entry that expires last
  // Bytes count as storage counts them: key, subkey, value and 64 bytes of bookkeeping each.
  limits.max_subkeys = 100;
  limits.max_record_bytes = 3 * (1 + 1 + 1 + 64);
  Record small{true, {}, {{"a", {"1", kNow + 9}}, {"b", {"2", kNow + 5}}, {"c", {"3", kNow + 1}}}};
  EXPECT_TRUE(FitsLimits("k", small, limits));
  small.subkeys["d"] = {"4", kNow + 3};
  TrimToLimits("k", small, limits);
  EXPECT_EQ(small.subkeys.size(), 3u);
  EXPECT_FALSE(small.subkeys.contains("c"));
  // A plain value larger than a node stores does not fit.
  limits.max_value_bytes = 4;
  EXPECT_FALSE(FitsLimits("k", Record{false, {"12345", kNow + 1}, {}}, limits));
}

// Who held each subkey of a merged dictionary: a source's answers count once however many it
// sends (two identities on one machine are one source), the entries held by more sources are
// kept first, signed or not, and what each source adds to the table is bounded.
TEST(DhtStorage, AMergedDictionaryKeepsTheEntriesMoreSourcesHeldFirst) {
  const std::string signed_by_liar = OwnerMarker(KeyPair::Generate().peer_id());
  Record honest{true, {}, {{"a", {"1", kNow + 5}}, {"b", {"2", kNow + 5}}}};
  Record liar{true, {}, {{"x", {"9", kNow + 90}}, {signed_by_liar, {"9", kNow + 90}}}};
  SubkeyVouches vouches(100);
  vouches.Note("10.0.0.1", honest);
  vouches.Note("10.0.0.2", honest);
  vouches.Note("10.0.0.66", liar);
  vouches.Note("10.0.0.66", liar);  // a second identity at the same address
  EXPECT_EQ(vouches.Count("a"), 2u);
  EXPECT_EQ(vouches.Count("x"), 1u);
  EXPECT_EQ(vouches.Count(signed_by_liar), 1u);
  EXPECT_EQ(vouches.Count("never seen"), 0u);
  Record merged = honest;
  MergeRecord(merged, liar);
  StorageLimits limits;
  limits.max_subkeys = 3;
  TrimToLimits("k", merged, limits, [&](const std::string& sub) { return vouches.Count(sub); });
  ASSERT_EQ(merged.subkeys.size(), 3u);
  EXPECT_TRUE(merged.subkeys.contains("a") && merged.subkeys.contains("b"));
  EXPECT_TRUE(merged.subkeys.contains(signed_by_liar));  // then signed before unsigned
  // Each source brings at most `per_source` subkeys first: one that answered first with more
  // cannot fill the table and leave the subkeys later sources hold uncounted.
  SubkeyVouches small(2);
  const Record flood{
      true, {}, {{"x", {"9", kNow + 90}}, {"y", {"9", kNow + 90}}, {"z", {"9", kNow + 90}}}};
  small.Note("flooder", flood);
  EXPECT_EQ(small.tracked(), 2u);
  EXPECT_EQ(small.Count("z"), 0u);
  const Record three{
      true, {}, {{"a", {"1", kNow + 5}}, {"b", {"2", kNow + 5}}, {"c", {"3", kNow + 5}}}};
  small.Note("s", three);
  EXPECT_EQ(small.tracked(), 4u);
  EXPECT_EQ(small.Count("a"), 1u);
  EXPECT_EQ(small.Count("c"), 0u);  // past s's share
  // 63 sources get a bit each (here the flooder, s, and 61 of these), the rest share one.
  for (int i = 0; i < 100; ++i) small.Note("source " + std::to_string(i), three);
  EXPECT_EQ(small.tracked(), 5u);
  EXPECT_EQ(small.Count("a"), 63u);
  EXPECT_EQ(small.Count("c"), 62u);
  EXPECT_EQ(small.Count("x"), 1u);
}

TEST(DhtStorage, LimitsQuotaCapacityAndExpirationCap) {
  StorageLimits limits;
  limits.per_peer_quota_bytes = 10'000;
  limits.capacity_bytes = 15'000;
  limits.max_ttl_seconds = 100;
  limits.max_subkeys = 3;
  Storage s(limits);
  const PeerId a = KeyPair::Generate().peer_id(), b = KeyPair::Generate().peer_id();
  const std::string v(4000, 'v');
  ASSERT_TRUE(s.Store(DhtId::ForKey("1"), Item("1", v, kNow + 10), a, kNow).ok());
  ASSERT_TRUE(s.Store(DhtId::ForKey("2"), Item("2", v, kNow + 10), a, kNow).ok());
  auto st = s.Store(DhtId::ForKey("3"), Item("3", v, kNow + 10), a, kNow);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("quota"), std::string::npos);
  // Overwriting one's own record is charged only for the difference.
  EXPECT_TRUE(s.Store(DhtId::ForKey("2"), Item("2", v, kNow + 11), a, kNow).ok());
  ASSERT_TRUE(s.Store(DhtId::ForKey("4"), Item("4", v, kNow + 10), b, kNow).ok());
  st = s.Store(DhtId::ForKey("5"), Item("5", v, kNow + 10), b, kNow);
  EXPECT_NE(st.message().find("full"), std::string::npos) << st.message();
  // Too many subkeys.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        s.Store(DhtId::ForKey("d"), Item("d", "", kNow + 10, std::to_string(i)), b, kNow, false)
            .ok());
  }
  EXPECT_EQ(s.Store(DhtId::ForKey("d"), Item("d", "", kNow + 10, "x"), b, kNow, false).code(),
            StatusCode::kResourceExhausted);
  // Too far an expiration is refused, not shortened (owners sign it); the clock slack is allowed.
  Storage h(limits);
  auto far = h.Store(DhtId::ForKey("far"), Item("far", "v", kNow + 1e6), a, kNow);
  EXPECT_EQ(far.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(far.message().find("at most 100 s"), std::string::npos) << far.message();
  EXPECT_EQ(h.usage_of(a), 0u);
  EXPECT_TRUE(
      h.Store(DhtId::ForKey("near"), Item("near", "v", kNow + 100 + kExpirationClockSlack), a, kNow)
          .ok());
}

TEST(DhtStorage, OneSourceAddressHoldsAtMostItsQuotaWhateverIdentitiesItUses) {
  StorageLimits limits;
  limits.per_peer_quota_bytes = 10'000;
  limits.per_source_quota_bytes = 15'000;
  limits.capacity_bytes = 100'000;
  Storage s(limits);
  const std::string v(4000, 'v');
  int accepted = 0;
  Status last;
  for (int id = 0; id < 5; ++id) {
    const PeerId sybil = KeyPair::Generate().peer_id();
    for (int i = 0; i < 2; ++i) {
      const std::string key = "s" + std::to_string(id) + "." + std::to_string(i);
      last = s.Store(DhtId::ForKey(key), Item(key, v, kNow + 10), sybil, kNow, true, "10.0.0.2");
      accepted += last.ok();
    }
  }
  // 3 of ~4,070 bytes fit in 15,000, though 5 identities could each hold 2.
  EXPECT_EQ(accepted, 3);
  EXPECT_LE(s.usage_of_source("10.0.0.2"), limits.per_source_quota_bytes);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(last.message().find("address 10.0.0.2"), std::string::npos) << last.message();
  // Another address, and an exempt one (""), are not held back by it.
  const PeerId other = KeyPair::Generate().peer_id(), local = KeyPair::Generate().peer_id();
  EXPECT_TRUE(
      s.Store(DhtId::ForKey("o"), Item("o", v, kNow + 10), other, kNow, true, "10.0.0.3").ok());
  EXPECT_TRUE(s.Store(DhtId::ForKey("l"), Item("l", v, kNow + 10), local, kNow, true, "").ok());
  EXPECT_EQ(s.usage_of_source(""), 0u);
  // Replacing one's own entry is charged only for the difference; expiry gives the bytes back.
  EXPECT_TRUE(s.Store(DhtId::ForKey("s0.0"), Item("s0.0", v, kNow + 11),
                      KeyPair::Generate().peer_id(), kNow, true, "10.0.0.2")
                  .ok());
  s.Purge(kNow + 20);
  EXPECT_EQ(s.usage_of_source("10.0.0.2"), 0u);
  EXPECT_EQ(s.usage_of_source("10.0.0.3"), 0u);
}

TEST(DhtStorage, CheckItemNamesTheProblem) {
  StorageLimits l;
  EXPECT_NE(CheckItem(Item("", "v", kNow + 1), l, kNow).message().find("empty"), std::string::npos);
  EXPECT_NE(CheckItem(Item("k", std::string(l.max_value_bytes + 1, 'x'), kNow + 1), l, kNow)
                .message()
                .find("limit"),
            std::string::npos);
  EXPECT_NE(CheckItem(Item("k", "v", kNow), l, kNow).message().find("future"), std::string::npos);
  EXPECT_FALSE(CheckItem(Item("k", "v", INFINITY), l, kNow).ok());
  EXPECT_TRUE(CheckItem(Item("k", "v", kNow + 1), l, kNow).ok());
}

TEST(DhtValidation, OwnerSignaturesSignVerifyAndStrip) {
  KeyPair owner = KeyPair::Generate(), other = KeyPair::Generate();
  ValidatorChain chain;
  chain.Add(std::make_shared<OwnerValidator>(&owner));
  const std::string key = "rec" + OwnerMarker(owner.peer_id());
  auto signed_value = chain.Sign({key, std::nullopt, "hello", kNow + 5});
  ASSERT_TRUE(signed_value.ok());
  EXPECT_NE(*signed_value, "hello");
  auto stripped = chain.ValidateAndStrip({key, std::nullopt, *signed_value, kNow + 5});
  ASSERT_TRUE(stripped.ok());
  EXPECT_EQ(*stripped, "hello");
  // Any change to key, value or expiration breaks the signature.
  EXPECT_FALSE(chain.ValidateAndStrip({key, std::nullopt, *signed_value, kNow + 6}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({key, "sub", *signed_value, kNow + 5}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({key, std::nullopt, "x" + *signed_value, kNow + 5}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({key, std::nullopt, "hello", kNow + 5}).ok());
  // Someone else cannot sign for the owner.
  ValidatorChain theirs;
  theirs.Add(std::make_shared<OwnerValidator>(&other));
  EXPECT_EQ(theirs.Sign({key, std::nullopt, "evil", kNow + 5}).status().code(),
            StatusCode::kPermissionDenied);
  // Key and subkey naming different owners are refused.
  EXPECT_FALSE(chain.ValidateAndStrip({key, OwnerMarker(other.peer_id()), "x", kNow}).ok());
  // Records without a marker pass untouched, even when their value looks signed.
  auto plain = chain.ValidateAndStrip({"open", std::nullopt, *signed_value, kNow + 5});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, *signed_value);
  // Owner in the subkey.
  auto sub = chain.Sign({"group", OwnerMarker(owner.peer_id()), "v", kNow + 5});
  ASSERT_TRUE(sub.ok());
  EXPECT_TRUE(chain.ValidateAndStrip({"group", OwnerMarker(owner.peer_id()), *sub, kNow + 5}).ok());
  EXPECT_FALSE(
      chain.ValidateAndStrip({"group", OwnerMarker(other.peer_id()), *sub, kNow + 5}).ok());
  // Malformed markers.
  EXPECT_FALSE(chain.ValidateAndStrip({"a[owner:nope]", std::nullopt, "v", kNow}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({"a[owner:12D3", std::nullopt, "v", kNow}).ok());
}

TEST(DhtValidation, OwnerMarkersParseBackToTheirPeer) {
  KeyPair owner = KeyPair::Generate();
  auto parsed = ParseOwnerMarker(OwnerMarker(owner.peer_id()));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, owner.peer_id());
  EXPECT_FALSE(ParseOwnerMarker("x" + OwnerMarker(owner.peer_id())).has_value());
  EXPECT_FALSE(ParseOwnerMarker("[owner:not-a-peer]").has_value());
  EXPECT_FALSE(ParseOwnerMarker("[owner:").has_value());
  EXPECT_FALSE(ParseOwnerMarker("").has_value());
}

TEST(DhtValidation, SchemaChecksTypesAndFieldsAndComposesWithOwners) {
  KeyPair owner = KeyPair::Generate();
  ValidatorChain chain;
  chain.Add(std::make_shared<SchemaValidator>(
      std::vector<ValueSchema>{{"count", JsonType::kInt, {}, false},
                               {"peer", JsonType::kObject, {{"name", JsonType::kString}}, true}},
      /*allow_other_keys=*/false));
  chain.Add(std::make_shared<OwnerValidator>(&owner));
  EXPECT_TRUE(chain.ValidateAndStrip({"count", std::nullopt, "779", kNow}).ok());
  auto bad = chain.ValidateAndStrip({"count", std::nullopt, "779.0", kNow});
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(bad.status().message().find("must be int"), std::string::npos);
  EXPECT_FALSE(chain.ValidateAndStrip({"count", "sub", "1", kNow}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({"other", std::nullopt, "1", kNow}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({"peer", "s", R"({"name": 5})", kNow}).ok());
  EXPECT_FALSE(chain.ValidateAndStrip({"peer", "s", R"({})", kNow}).ok());
  // An owner-signed subkey: the schema sees the value without the signature.
  const std::string sub = OwnerMarker(owner.peer_id());
  auto s = chain.Sign({"peer", sub, R"({"name": "x"})", kNow + 1});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto v = chain.ValidateAndStrip({"peer", sub, *s, kNow + 1});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, R"({"name": "x"})");
}

TEST(DhtValidation, KeyFamiliesAdmitOnlyEachOwnersOwnParsedEntry) {
  KeyPair owner = KeyPair::Generate(), other = KeyPair::Generate();
  ValidatorChain chain;
  chain.Add(std::make_shared<OwnerValidator>(&owner));
  chain.Add(std::make_shared<KeyFamilyValidator>(std::vector<KeyFamily>{
      {.name = "test records",
       .matches = [](std::string_view key) { return key.ends_with(".fam"); },
       .check =
           [](std::string_view, const PeerId& who, std::string_view value) {
             return value == "ok:" + who.Short() ? Status::Ok() : ProtocolError("bad value");
           }}}));
  const std::string mine = OwnerMarker(owner.peer_id());
  const std::string good = "ok:" + owner.peer_id().Short();
  auto signed_value = chain.Sign({"a.fam", mine, good, kNow + 5});
  ASSERT_TRUE(signed_value.ok()) << signed_value.status().ToString();
  auto v = chain.ValidateAndStrip({"a.fam", mine, *signed_value, kNow + 5});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, good);  // the check saw the value without its signature
  // A plain value, an unsigned subkey, a subkey that only contains a marker, a key that names an
  // owner, and a value the layer cannot parse: each refused, naming the family.
  const std::vector<std::pair<std::string, std::optional<std::string>>> refused{
      {"a.fam", std::nullopt},
      {"a.fam", "plain-subkey"},
      {"a.fam", "x" + mine},
      {mine + ".fam", mine}};
  for (const auto& [key, subkey] : refused) {
    RecordView view{key, subkey, "ok", kNow + 5};
    if (auto s = chain.Sign(view); s.ok()) view.value = *s;
    auto st = chain.ValidateAndStrip(view).status();
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << key;
    EXPECT_NE(st.message().find("test records"), std::string::npos) << st.message();
  }
  auto bad = chain.Sign({"a.fam", mine, "nonsense", kNow + 5});
  ASSERT_TRUE(bad.ok());
  auto st = chain.ValidateAndStrip({"a.fam", mine, *bad, kNow + 5}).status();
  EXPECT_NE(st.message().find("is not one of test records: bad value"), std::string::npos)
      << st.message();
  // Another owner's entry under its own marker is fine; keys outside the family are untouched.
  ValidatorChain theirs;
  theirs.Add(std::make_shared<OwnerValidator>(&other));
  auto other_value = theirs.Sign(
      {"a.fam", OwnerMarker(other.peer_id()), "ok:" + other.peer_id().Short(), kNow + 5});
  ASSERT_TRUE(other_value.ok());
  EXPECT_TRUE(
      chain.ValidateAndStrip({"a.fam", OwnerMarker(other.peer_id()), *other_value, kNow + 5}).ok());
  EXPECT_TRUE(chain.ValidateAndStrip({"a.other", std::nullopt, "anything", kNow + 5}).ok());
}

TEST(DhtRouting, BucketsNearestAndFailures) {
  std::mt19937_64 rng(3);
  const DhtId self = DhtId::Random(rng);
  RoutingTable table(self, 4, 2);
  std::vector<Contact> all;
  for (int i = 0; i < 200; ++i) {
    KeyPair k = KeyPair::Generate();
    Contact c{k.peer_id(), DhtId::ForPeer(k.peer_id()), {"/ip4/127.0.0.1/tcp/1"}};
    table.Seen(c, SteadyTime{});
    all.push_back(c);
  }
  // Bucket 0 holds at most 4 of the ~100 contacts that differ in the first bit.
  EXPECT_LT(table.size(), 60u);
  const DhtId target = DhtId::Random(rng);
  auto nearest = table.Nearest(target, 5);
  ASSERT_EQ(nearest.size(), 5u);
  for (size_t i = 1; i < nearest.size(); ++i) {
    EXPECT_TRUE(Closer(target, nearest[i - 1].id, nearest[i].id));
  }
  // Every contact in the table is among those added; nearest to our own id is the deepest.
  const Contact victim = table.Nearest(self, 1)[0];
  table.Failed(victim.peer);
  EXPECT_TRUE(table.Find(victim.peer).has_value());  // one failure is forgiven
  table.Failed(victim.peer);
  EXPECT_FALSE(table.Find(victim.peer).has_value());
  const size_t before = table.size();
  table.Remove(nearest[0].peer);
  EXPECT_EQ(table.size(), before - 1);
  EXPECT_FALSE(table.Seen({KeyPair::Generate().peer_id(), self, {}}, SteadyTime{}));
}

// A contact's own addresses (its header, or where we dialled it) replace the known ones; those
// another peer referred it at do not (a referrer could point a known contact where it cannot be
// reached, and we would hand that on to everyone who asks).
TEST(DhtRouting, ReferredAddressesDoNotReplaceAContactsOwn) {
  std::mt19937_64 rng(4);
  RoutingTable table(DhtId::Random(rng), 4, 2);
  const PeerId p = KeyPair::Generate().peer_id();
  ASSERT_TRUE(table.Seen({p, DhtId::ForPeer(p), {"/ip4/10.0.0.1/tcp/1"}}, SteadyTime{}));
  table.Seen({p, DhtId::ForPeer(p), {"/ip4/10.6.6.6/tcp/6"}}, SteadyTime{}, "",
             /*update_addrs=*/false);
  ASSERT_TRUE(table.Find(p).has_value());
  EXPECT_EQ(table.Find(p)->addrs, std::vector<std::string>{"/ip4/10.0.0.1/tcp/1"});
  table.Seen({p, DhtId::ForPeer(p), {"/ip4/10.0.0.2/tcp/2"}}, SteadyTime{});
  EXPECT_EQ(table.Find(p)->addrs, std::vector<std::string>{"/ip4/10.0.0.2/tcp/2"});
  // A contact first met by referral enters with the referred addresses.
  const PeerId q = KeyPair::Generate().peer_id();
  table.Seen({q, DhtId::ForPeer(q), {"/ip4/10.0.0.3/tcp/3"}}, SteadyTime{}, "", false);
  if (table.Find(q)) {
    EXPECT_EQ(table.Find(q)->addrs, std::vector<std::string>{"/ip4/10.0.0.3/tcp/3"});
  }
}

// One address holds at most 2 contacts per bucket however many identities it brings; other
// addresses and uncapped ones ("", loopback) still enter; a contact that fails makes way for a
// replacement whose address has room, not for one whose address is full.
TEST(DhtRouting, OneAddressHoldsAtMostItsShareOfEachBucket) {
  std::mt19937_64 rng(5);
  const DhtId self = DhtId::Random(rng);
  RoutingTable table(self, 8, 2, /*max_per_address=*/2);
  auto fresh = [] {
    KeyPair k = KeyPair::Generate();
    return Contact{k.peer_id(), DhtId::ForPeer(k.peer_id()), {"/ip4/203.0.113.7/tcp/1"}};
  };
  // Expected, counted apart: per bucket (shared prefix length with self), min(2, identities).
  std::map<size_t, size_t> per_bucket;
  size_t held = 0;
  for (int i = 0; i < 300; ++i) {
    const Contact c = fresh();
    const size_t bucket = std::min(self.CommonPrefixBits(c.id), kIdBits - 1);
    const bool room = per_bucket[bucket] < 2;
    EXPECT_EQ(table.Seen(c, SteadyTime{}, "203.0.113.7"), room) << i;
    if (room) ++per_bucket[bucket], ++held;
  }
  EXPECT_EQ(table.size(), held);
  EXPECT_LE(held, 2 * per_bucket.size());
  EXPECT_EQ(table.refused_for_address(), 300 - held);

  // Bucket 0 (the half of the id space that differs in the first bit): the attacker's 2, then
  // honest contacts from other addresses fill it to k.
  auto in_bucket0 = [&] {
    for (;;) {
      Contact c = fresh();
      if (self.CommonPrefixBits(c.id) == 0) return c;
    }
  };
  std::vector<Contact> honest;
  for (int i = 0; i < 6; ++i) {
    honest.push_back(in_bucket0());
    EXPECT_TRUE(table.Seen(honest.back(), SteadyTime{}, "198.51.100." + std::to_string(i)));
  }
  // Full: an uncapped newcomer waits as a replacement, and so does one from a fresh address;
  // the attacker's address gets neither.
  const Contact waiting_uncapped = in_bucket0();
  EXPECT_FALSE(table.Seen(waiting_uncapped, SteadyTime{}, ""));
  const Contact attacker = in_bucket0();
  const uint64_t refused = table.refused_for_address();
  EXPECT_FALSE(table.Seen(attacker, SteadyTime{}, "203.0.113.7"));
  EXPECT_EQ(table.refused_for_address(), refused + 1);
  // An honest contact fails twice: the freshest replacement with room takes its place.
  table.Failed(honest[0].peer);
  table.Failed(honest[0].peer);
  EXPECT_FALSE(table.Find(honest[0].peer).has_value());
  EXPECT_TRUE(table.Find(waiting_uncapped.peer).has_value());
  EXPECT_FALSE(table.Find(attacker.peer).has_value());
  // Without a cap the same address fills a bucket.
  RoutingTable open(self, 8, 2);
  size_t open_held = 0;
  for (int i = 0; i < 40; ++i) open_held += open.Seen(in_bucket0(), SteadyTime{}, "203.0.113.7");
  EXPECT_EQ(open_held, 8u);
}

}  // namespace
}  // namespace colony::dht
