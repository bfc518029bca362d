// Attacks on a state donor's download slots (issue 15, parts 3 and 5), through real sockets: a
// donor serves at most max_concurrent_state_transfers downloads (or digests) at once, so a
// caller that opens downloads and never reads them would hold every slot, and every honest
// newcomer would be told the donor is busy, for as long as the caller's deadline (its choice).
//  - one address holds at most max_state_transfers_per_address of the slots (the donor applies
//    its per-address caps to loopback here, so 127.0.0.2 plays the attacker's machine);
//  - a download whose caller gives no credit is cut by the transport's stall timeout
//    (net::ConnectionOptions::send_stall_timeout), so callers from several addresses cannot hold
//    the slots for longer either.
// An honest newcomer loads the state beside each attack.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "adversary/attack_measurements.h"
#include "adversary/hostile_peer.h"
#include "averaging/averager.h"
#include "averaging/wire.h"
#include "dht/node.h"
#include "test_support.h"

namespace colony::averaging {
namespace {

using namespace std::chrono_literals;
using test::HostilePeer;

constexpr size_t kStateValues = 1 << 20;  // 4 MiB: far more than a stingy caller's window

struct Member {
  std::unique_ptr<std::vector<float>> values = std::make_unique<std::vector<float>>(4);
  std::unique_ptr<dht::Node> node;
  std::unique_ptr<Averager> averager;
};

Member Start(const std::vector<std::string>& initial_peers, bool limit_loopback,
             AveragerOptions options, std::chrono::milliseconds send_stall_timeout = 60s) {
  Member m;
  dht::NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = initial_peers;
  o.host.limit_loopback_addresses = limit_loopback;
  o.host.connection.send_stall_timeout = send_stall_timeout;
  auto node = dht::Node::Start(KeyPair::Generate(), o);
  EXPECT_TRUE(node.ok()) << node.status().ToString();
  if (!node.ok()) return m;
  m.node = std::move(*node);
  options.prefix = "test.avg";
  auto averager = Averager::Create(*m.node, {std::span<float>(*m.values)}, options);
  EXPECT_TRUE(averager.ok()) << averager.status().ToString();
  if (averager.ok()) m.averager = std::move(*averager);
  return m;
}

// A donor sharing kStateValues values, and a newcomer that can load them.
struct DonorAndNewcomer {
  Member donor, newcomer;
  std::vector<float> state;
  Multiaddr donor_addr;

  DonorAndNewcomer(bool limit_loopback, AveragerOptions donor_options,
                   std::chrono::milliseconds send_stall_timeout = 60s) {
    donor = Start({}, limit_loopback, donor_options, send_stall_timeout);
    if (!donor.averager) return;
    donor_addr = donor.node->VisibleAddresses().at(0);
    state.resize(kStateValues);
    for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i % 977) * 0.5f;
    donor.averager->ShareState(
        [values = state]() -> Result<SharedState> {
          return SharedState{"epoch 7", {values}};
        },
        7.0);
    newcomer = Start({donor_addr.ToString()}, false, AveragerOptions{});
  }

  bool AdvertSeen() {
    return test::WaitUntil(
        [&] {
          auto r = newcomer.node->GetSync("test.avg.state", dht::Freshness::kLatest);
          return r.ok() && r->is_dict && !r->subkeys.empty();
        },
        20s);
  }

  // One honest load: its duration, or -1 when it failed (the failure is reported).
  double Load(std::chrono::milliseconds timeout) {
    const auto t0 = std::chrono::steady_clock::now();
    auto loaded = newcomer.averager->LoadStateFromPeersSync({.timeout = timeout});
    if (!loaded.ok()) {
      last_failure = loaded.status().ToString();
      return -1;
    }
    EXPECT_EQ(loaded->metadata, "epoch 7");
    EXPECT_TRUE(loaded->tensors.size() == 1 && loaded->tensors[0] == state);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string last_failure;
};

// The smallest windows a peer may announce, dialing from `from`.
net::HostOptions StingyFrom(const std::string& from) {
  net::HostOptions o;
  o.dial_from = from;
  o.connection.limits.stream_window = 64 * 1024;
  o.connection.limits.connection_window = 64 * 1024;
  return o;
}

net::Message DownloadRequest() { return net::Message(EncodeStateRequest({"test.avg", {}, false})); }

// Reads `stream` to its end: the status it ended with (OK for a whole download).
Status Drain(HostilePeer& peer, const std::shared_ptr<net::Stream>& stream) {
  auto drain = [&]() -> asio::awaitable<Status> {
    for (;;) {
      auto m = co_await stream->Read();
      if (!m.ok()) co_return m.status();
      if (!m->has_value()) co_return Status::Ok();
    }
  };
  return asio::co_spawn(peer.host().io_context(), drain(), asio::use_future).get();
}

// Whether `stream` was reset (by the donor's stall verdict), without reading it.
bool Reset(net::Stream& stream) {
  auto check = [&]() -> asio::awaitable<bool> { co_return stream.cancelled(); };
  return asio::co_spawn(stream.strand(), check(), asio::use_future).get();
}

TEST(StateDonorAttack, OneAddressHoldsOnlyItsShareOfTheDonorsSlots) {
  AveragerOptions o;  // the defaults: 2 slots, 1 per address
  DonorAndNewcomer swarm(/*limit_loopback=*/true, o);
  ASSERT_TRUE(swarm.donor.averager && swarm.newcomer.averager);
  ASSERT_TRUE(swarm.AdvertSeen());
  std::vector<double> before, during;
  for (int i = 0; i < 3; ++i) {
    before.push_back(swarm.Load(20s));
    ASSERT_GT(before.back(), 0) << swarm.last_failure;
  }

  // The attacker opens downloads from 127.0.0.2 and never reads them.
  HostilePeer attacker(StingyFrom("127.0.0.2"));
  ASSERT_TRUE(attacker.start_error().ok()) << attacker.start_error().ToString();
  auto held = attacker.OpenAndAbandon(swarm.donor_addr, "avg.state/test.avg", DownloadRequest(), 0);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::vector<std::shared_ptr<net::Stream>> refused;
  for (int i = 0; i < 3; ++i) {
    auto s = attacker.OpenAndAbandon(swarm.donor_addr, "avg.state/test.avg", DownloadRequest(), 0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    refused.push_back(std::move(*s));
  }
  // Every download after the first is refused at once, naming the limit per address (reading
  // a refused call gives no credit to anything: it carries no data).
  for (const auto& s : refused) {
    Status st = Drain(attacker, s);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("limit per address"), std::string::npos) << st.ToString();
  }
  // The honest newcomer still loads while the first download is held.
  for (int i = 0; i < 3; ++i) {
    during.push_back(swarm.Load(20s));
    ASSERT_GT(during.back(), 0) << swarm.last_failure;
  }
  std::printf("honest state load median %.1f ms unattacked, %.1f ms beside the attack\n",
              1e3 * test::Median(before), 1e3 * test::Median(during));
  EXPECT_LT(test::RecordHonestSlowdown(before, during), 10);
}

TEST(StateDonorAttack, ACallerThatStopsReadingLosesItsSlot) {
  // Callers from 127.0.0.2 and 127.0.0.3 take both slots, one each, within the per-address cap;
  // the donor's transport gives up a write that waits 2 s for credit.
  DonorAndNewcomer swarm(/*limit_loopback=*/true, AveragerOptions{}, 2s);
  ASSERT_TRUE(swarm.donor.averager && swarm.newcomer.averager);
  ASSERT_TRUE(swarm.AdvertSeen());
  std::vector<double> before;
  for (int i = 0; i < 3; ++i) {
    before.push_back(swarm.Load(20s));
    ASSERT_GT(before.back(), 0) << swarm.last_failure;
  }

  HostilePeer a(StingyFrom("127.0.0.2")), b(StingyFrom("127.0.0.3"));
  ASSERT_TRUE(a.start_error().ok() && b.start_error().ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto held_a = a.OpenAndAbandon(swarm.donor_addr, "avg.state/test.avg", DownloadRequest(), 0);
  auto held_b = b.OpenAndAbandon(swarm.donor_addr, "avg.state/test.avg", DownloadRequest(), 0);
  ASSERT_TRUE(held_a.ok() && held_b.ok());
  // The slots come back once the stall timeout cuts the held downloads: the newcomer, trying
  // again while it is told the donor is busy, loads the state.
  double loaded = -1;
  std::vector<double> during;
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        loaded = swarm.Load(10s);
        return loaded > 0;
      },
      30s))
      << swarm.last_failure;
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  during.push_back(loaded);
  // Both held downloads end with the donor's stall verdict, which names the credit it waited
  // for. One slot coming back is enough for the newcomer: wait for the other reset too before
  // reading (reading gives credit, and would let a download not cut yet complete).
  EXPECT_TRUE(test::WaitUntil([&] { return Reset(**held_a) && Reset(**held_b); }, 20s));
  for (auto* held : {&held_a, &held_b}) {
    Status st = Drain(held == &held_a ? a : b, **held);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("flow-control credit"), std::string::npos) << st.ToString();
  }
  std::printf("slots free again %.1f s after the attack began (stall timeout 2 s)\n", waited);
  EXPECT_LT(waited, 20);
  EXPECT_LT(test::RecordHonestSlowdown(before, during), 10);
}

}  // namespace
}  // namespace colony::averaging
