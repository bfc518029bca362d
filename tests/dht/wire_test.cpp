// The DHT wire codec: round trips, bounds, and the fuzz corpus seeds being valid messages.
#include "dht/wire.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_support.h"

namespace colony::dht {
namespace {

Contact SomeContact() {
  KeyPair k = KeyPair::Generate();
  return {k.peer_id(), DhtId::ForPeer(k.peer_id()), {"/ip4/127.0.0.1/tcp/4001"}};
}

TEST(DhtWire, RoundTrips) {
  StoreRequest store{{false, {"/ip4/1.2.3.4/tcp/5"}}, {}};
  store.items.push_back(
      {{"key", std::string("sub\0x", 5), std::string("v\0\xff", 3), 1.7e9 + 0.125}, true});
  store.items.push_back({{"k2", std::nullopt, "", 1.7e9}, false});
  auto s = DecodeStoreRequest(EncodeStoreRequest(store));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_EQ(s->items[0].item.subkey, store.items[0].item.subkey);
  EXPECT_EQ(s->items[0].item.value, store.items[0].item.value);
  EXPECT_EQ(s->items[0].item.expiration, 1.7e9 + 0.125);
  EXPECT_TRUE(s->items[0].in_cache);
  EXPECT_FALSE(s->items[1].item.subkey.has_value());
  EXPECT_EQ(s->sender.addrs, store.sender.addrs);

  FindResponse find;
  FindResult r;
  r.record = Record{true, {}, {{"a", {"1", 5.5}}, {"b", {"2", 6.5}}}};
  r.nearest = {SomeContact(), SomeContact()};
  find.results.push_back(r);
  find.results.push_back({Record{false, {"plain", 7.25}, {}}, {}});
  find.results.push_back({});
  auto f = DecodeFindResponse(EncodeFindResponse(find), 3);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->results[0].record, r.record);
  EXPECT_EQ(f->results[0].nearest[1].peer, r.nearest[1].peer);
  EXPECT_EQ(f->results[0].nearest[1].id, r.nearest[1].id);
  EXPECT_EQ(f->results[1].record->value.value, "plain");
  EXPECT_FALSE(f->results[2].record.has_value());

  StoreResponse sr{{Status::Ok(), AlreadyExists("newer")}};
  auto d = DecodeStoreResponse(EncodeStoreResponse(sr), 2);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->results[1], AlreadyExists("newer"));
  auto p = DecodePingResponse(EncodePingResponse({PeerId(), 123.5, true}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->wall_time, 123.5);
  EXPECT_TRUE(p->client_mode);
}

TEST(DhtWire, RejectsWhatIsOutOfBounds) {
  EXPECT_EQ(DecodeFindRequest("\xff\xff").status().code(), StatusCode::kProtocolError);
  FindRequest none;
  EXPECT_FALSE(DecodeFindRequest(EncodeFindRequest(none)).ok());  // no ids
  StoreRequest many;
  many.items.resize(kMaxStoreItems + 1);
  EXPECT_FALSE(DecodeStoreRequest(EncodeStoreRequest(many)).ok());
  StoreRequest bad_exp;
  bad_exp.items.push_back(
      {{"k", std::nullopt, "v", std::numeric_limits<double>::infinity()}, false});
  EXPECT_FALSE(DecodeStoreRequest(EncodeStoreRequest(bad_exp)).ok());
  FindRequest bad_addr{{false, {"/not/an/address"}}, {DhtId()}};
  EXPECT_FALSE(DecodeFindRequest(EncodeFindRequest(bad_addr)).ok());
  FindResponse lots;
  FindResult r;
  r.nearest.assign(kMaxContactsPerResult + 1, SomeContact());
  lots.results.push_back(r);
  EXPECT_FALSE(DecodeFindResponse(EncodeFindResponse(lots), 1).ok());
  EXPECT_FALSE(DecodeFindResponse(EncodeFindResponse({}), 1).ok());  // wrong count
  EXPECT_FALSE(DecodeStoreResponse(EncodeStoreResponse({{Status::Ok()}}), 2).ok());
}

TEST(DhtWire, FuzzCorpusSeedsAreValidMessages) {
  const std::filesystem::path corpus = std::filesystem::path(COLONY_SOURCE_DIR) / "fuzz/corpus";
  size_t decoded = 0;
  for (const char* dir : {"dht_ping", "dht_store", "dht_find"}) {
    for (const auto& entry : std::filesystem::directory_iterator(corpus / dir)) {
      const std::string bytes = test::ReadFile(entry.path().string());
      const std::string name = entry.path().filename().string();
      bool ok = false;
      if (std::string(dir) == "dht_ping") {
        ok = name.starts_with("req") ? DecodePingRequest(bytes).ok()
                                     : DecodePingResponse(bytes).ok();
      } else if (std::string(dir) == "dht_store") {
        ok = name.starts_with("req") ? DecodeStoreRequest(bytes).ok()
                                     : DecodeStoreResponse(bytes, 3).ok();
      } else {
        ok = name.starts_with("req") ? DecodeFindRequest(bytes).ok()
             : name == "resp2"       ? DecodeFindResponse(bytes, 2).ok()
                                     : DecodeFindResponse(bytes, 1).ok();
      }
      EXPECT_TRUE(ok) << dir << "/" << name;
      ++decoded;
    }
  }
  EXPECT_GE(decoded, 9u);
}

}  // namespace
}  // namespace colony::dht
