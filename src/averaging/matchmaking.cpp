// Matchmaking: forming a group of peers that average together.
//
// Every peer looking for a group declares itself in the DHT under the group key
// "<prefix>.0b<bits>" (subkey: its owner marker, so nobody can declare in its name; value: its
// addresses, the hash of its tensors' shapes, looking = true; expiration: the moment it will
// start averaging at the latest). Declarations are ordered by (expiration, peer id); the first
// one is the natural leader.
//
// A peer repeatedly reads the declarations under its key and asks the best peer that comes
// before it to let it join ("avg.join" RPC). A leader holds each join call open until its group
// is formed: as soon as it has target_group_size members, or at its declared deadline when it
// has at least min_group_size; then every follower's call returns BEGIN with the group (members,
// their gathered metadata, the spans each reduces). Before a peer asks a leader, it redirects
// its own followers to that leader, and while it waits for an answer it redirects newcomers
// there too, so groups grow flat around the earliest leader instead of in chains. A leader that
// cannot reach min_group_size disbands its followers. Requests carry the tensors' schema hash:
// a leader refuses a mismatched peer with a reason, which the refused peer reports if it finds
// no group. Client-mode peers never declare and never lead; they only ask.
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in fmt/format.h only before fmt 11)

#include <algorithm>
#include <random>

#include "averaging/group_key.h"
#include "averaging/internal.h"
#include "averaging/load_balance.h"
#include "core/clock.h"
#include "dht/validation.h"

namespace colony::averaging {

// Ends a leader's refusal of a requester that does what the group does not (or the reverse):
// the requester's step reports it, since the requester must change to join.
constexpr std::string_view kMustAgree = "all peers under one prefix must agree";

namespace {

bool Before(double exp_a, const PeerId& a, double exp_b, const PeerId& b) {
  return exp_a != exp_b ? exp_a < exp_b : a < b;
}

// The members' loads for load balancing, bandwidths bounded (BoundBandwidths).
std::vector<PeerLoad> BoundedLoads(const GroupInfo& g) {
  std::vector<PeerLoad> loads;
  for (const auto& m : g.members) {
    loads.push_back({m.bandwidth, m.mode != Mode::kAux, m.mode != Mode::kClient});
  }
  BoundBandwidths(loads);
  return loads;
}

}  // namespace

Result<Multiaddr> DialAddress(net::Host& host, const std::vector<std::string>& addrs,
                              const PeerId& peer) {
  host.SetPeerAddresses(peer, ParseMultiaddrs(addrs));
  Status last = ProtocolError("peer " + peer.ToString() + " announced no address");
  for (const auto& a : addrs) {
    auto m = Multiaddr::Parse(a);
    if (!m.ok()) {
      last = m.status();
      continue;
    }
    if (!m->peer_id()) m = Multiaddr::Parse(a + "/p2p/" + peer.ToString());
    if (m.ok() && m->peer_id() == peer) return *m;
    last = ProtocolError("address " + a + " names a different peer than " + peer.ToString());
  }
  return last;
}

std::vector<std::string> Averager::Impl::OwnAddrs() const {
  std::vector<std::string> out;
  if (options_.mode == Mode::kClient) return out;
  for (const auto& a : node_.VisibleAddresses()) {
    if (out.size() < kMaxAddrs) out.push_back(a.ToString());
  }
  return out;
}

JoinRequest Averager::Impl::OwnJoinRequest(const std::string& key,
                                           const std::string& gathered) const {
  JoinRequest r;
  r.group_key = key;
  r.schema_hash = schema_hash_;
  r.mode = options_.mode;
  r.bandwidth = options_.bandwidth;
  r.gathered = gathered;
  r.addrs = OwnAddrs();
  r.verify = options_.verify;
  r.audit = options_.audit_targets > 0;
  return r;
}

asio::awaitable<Status> Averager::Impl::Declare(const std::string& key, double expiration,
                                                Availability availability) {
  Declaration d;
  d.addrs = OwnAddrs();
  d.looking = availability == Availability::kLooking;
  d.schema_hash = schema_hash_;
  std::string value = EncodeDeclaration(d);
  std::optional<std::string> subkey = dht::OwnerMarker(host_.peer_id());
  co_return co_await node_.Store(key, std::move(value), expiration, std::move(subkey));
}

asio::awaitable<std::vector<Averager::Impl::Candidate>> Averager::Impl::FetchCandidates(
    const std::string& key) {
  std::vector<Candidate> out;
  auto record = co_await node_.Get(key, dht::Freshness::kLatest);
  if (!record.ok() || !record->is_dict) co_return out;
  const double now = dht::Now();
  for (const auto& [subkey, entry] : record->subkeys) {
    if (entry.expiration <= now) continue;
    auto peer = dht::ParseOwnerMarker(subkey);
    if (!peer || *peer == host_.peer_id() || IsBanned(*peer)) continue;
    auto d = DecodeDeclaration(entry.value);
    if (!d.ok() || !d->looking || d->addrs.empty()) continue;
    out.push_back(Candidate{*peer, d->addrs, entry.expiration});
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return Before(a.expiration, a.peer, b.expiration, b.peer);
  });
  co_return out;
}

asio::awaitable<Result<JoinResponse>> Averager::Impl::RequestJoin(const Candidate& leader,
                                                                  SteadyTime deadline,
                                                                  const std::string& gathered) {
  auto addr = DialAddress(host_, leader.addrs, leader.peer);
  if (!addr.ok()) co_return addr.status();
  net::Message msg(EncodeJoinRequest(OwnJoinRequest(looking_->group_key, gathered)));
  std::string method = MethodName("join");
  net::CallOptions call_options{.timeout = MsUntil(deadline)};
  auto reply = co_await host_.Call(*addr, std::move(method), std::move(msg), call_options);
  if (!reply.ok()) co_return reply.status();
  co_return DecodeJoinResponse(reply->meta);
}

void Averager::Impl::ResolveFollowers(const JoinResponse& response) {
  if (!looking_) return;
  for (auto& f : looking_->followers) f->outcome = response;
  looking_->followers.clear();
  looking_changed_.Notify();
}

uint64_t Averager::Impl::OwnPartSize() const {
  return std::clamp<uint64_t>(options_.part_size_bytes / sizeof(float), 1, kMaxPartSize);
}

Result<GroupInfo> Averager::Impl::FormGroup() {
  GroupInfo g;
  g.group_id.resize(16);
  {
    std::lock_guard lock(state_mu_);
    for (auto& c : g.group_id) c = static_cast<char>(rng_() & 0xff);
  }
  g.total = total_;
  g.part_size = OwnPartSize();
  MemberInfo self;
  self.peer = host_.peer_id();
  self.addrs = options_.testing.addrs_in_led_groups.empty() ? OwnAddrs()
                                                            : options_.testing.addrs_in_led_groups;
  self.mode = options_.mode;
  self.bandwidth = options_.bandwidth;
  self.gathered = looking_->gathered;
  g.members.push_back(std::move(self));
  for (const auto& f : looking_->followers) {
    MemberInfo m;
    m.peer = f->peer;
    m.addrs = f->request.addrs;
    m.mode = f->request.mode;
    m.bandwidth = f->request.bandwidth;
    m.gathered = f->request.gathered;
    g.members.push_back(std::move(m));
  }
  const std::vector<PeerLoad> loads = BoundedLoads(g);
  COLONY_ASSIGN_OR_RETURN(auto spans, LoadBalance(g.total, loads));
  for (size_t i = 0; i < spans.size(); ++i) g.members[i].span = spans[i];
  COLONY_RETURN_IF_ERROR(CheckGroup(g));
  return g;
}

asio::awaitable<Result<GroupInfo>> Averager::Impl::Matchmake(SteadyTime step_deadline,
                                                             std::string gathered,
                                                             size_t expected_group_size,
                                                             std::vector<std::string>& reasons) {
  const std::string key = GroupKey(options_.prefix, group_bits_);
  const bool can_lead = options_.mode != Mode::kClient;
  const auto mm_time = std::min<std::chrono::steady_clock::duration>(options_.matchmaking_time,
                                                                     step_deadline - SteadyNow());
  looking_.emplace();
  looking_->group_key = key;
  looking_->deadline = SteadyNow() + mm_time;
  // Later than our last withdrawal, also when this step follows a round that ended within a
  // millisecond of its declaration (two peers, little data): the withdrawal's expiration is that
  // declaration's plus 1 ms, and the DHT keeps the newest.
  looking_->expiration = std::max(dht::Now() + Seconds(mm_time), withdrawn_expiration_ + 1e-3);
  looking_->gathered = gathered;
  looking_->start_size = std::min(options_.target_group_size, kMaxGroupSize);
  if (expected_group_size > 0) {
    looking_->start_size =
        std::max(std::min(looking_->start_size, expected_group_size), options_.min_group_size);
  }
  if (can_lead) {
    declared_expiration_ = looking_->expiration;
    Status st = co_await Declare(key, looking_->expiration, Availability::kLooking);
    if (!st.ok()) {
      looking_.reset();
      co_return st.WithContext("declaring this peer under " + key + " in the DHT");
    }
  }
  // Peers (with the expiration they declared) that refused us or failed: not asked again.
  std::set<std::pair<PeerId, double>> tried;
  std::optional<Candidate> redirect;
  // Declarations appear within a DHT round trip: look again soon, then less often.
  const auto refetch_max = std::clamp<std::chrono::steady_clock::duration>(
      options_.matchmaking_time / 8, std::chrono::milliseconds(100), std::chrono::seconds(1));
  int fetches = 0;
  // Ends this attempt: no longer looking (waiting followers were resolved just before).
  auto finish = [this]() {
    looking_.reset();
    looking_changed_.Notify();
  };

  for (;;) {
    if (shut_down_) {
      ResolveFollowers({JoinResponse::Code::kDisbanded, "the leader is shutting down", {}, {}, {}});
      finish();
      co_return Closed("the averager was shut down");
    }
    if (cancel_requested_) {
      ResolveFollowers(
          {JoinResponse::Code::kDisbanded, "the leader cancelled its step", {}, {}, {}});
      finish();
      co_return Cancelled("the averaging step was cancelled");
    }
    const size_t size = looking_->followers.size() + 1;
    const bool out_of_time = SteadyNow() >= looking_->deadline;
    if (can_lead &&
        (size >= looking_->start_size || (out_of_time && size >= options_.min_group_size))) {
      auto group = FormGroup();
      if (!group.ok()) {
        ResolveFollowers({JoinResponse::Code::kDisbanded, group.status().ToString(), {}, {}, {}});
        finish();
        co_return group.status();
      }
      JoinResponse begin;
      begin.code = JoinResponse::Code::kBegin;
      begin.group = *group;
      ResolveFollowers(begin);
      finish();
      co_return *group;
    }
    if (out_of_time) {
      ResolveFollowers({JoinResponse::Code::kDisbanded,
                        fmt::format("only {} of the {} peers needed joined by the deadline", size,
                                    options_.min_group_size),
                        {},
                        {},
                        {}});
      finish();
      co_return NotFound(fmt::format(
          "no group formed under {} within {:.1f} s ({} peer(s) found, {} needed){}", key,
          Seconds(mm_time), size, options_.min_group_size,
          reasons.empty() ? std::string("; are other peers running with the same prefix?")
                          : "; " + fmt::format("{}", fmt::join(reasons, "; "))));
    }

    // Find the best leader to ask: a redirect first, else the earliest declaration before ours.
    std::optional<Candidate> leader;
    if (redirect && !tried.count({redirect->peer, redirect->expiration})) leader = redirect;
    redirect.reset();
    if (!leader) {
      auto candidates = co_await FetchCandidates(key);
      if (!looking_) co_return Closed("the averager was shut down");
      for (auto& c : candidates) {
        if (tried.count({c.peer, c.expiration})) continue;
        if (can_lead && !Before(c.expiration, c.peer, looking_->expiration, host_.peer_id())) {
          break;  // sorted: everyone else comes after us
        }
        leader = std::move(c);
        break;
      }
    }
    if (!leader) {
      const auto refetch = std::min<std::chrono::steady_clock::duration>(
          refetch_max, std::chrono::milliseconds(25 << std::min(fetches++, 6)));
      co_await looking_changed_.WaitUntil(std::min(looking_->deadline, SteadyNow() + refetch));
      continue;
    }

    // Send our followers there too, then ask.
    tried.insert({leader->peer, leader->expiration});
    looking_->requesting = leader;
    if (!looking_->followers.empty()) {
      JoinResponse go;
      go.code = JoinResponse::Code::kRedirect;
      go.reason = "the leader joins an earlier leader";
      go.leader = leader->peer;
      go.leader_addrs = leader->addrs;
      ResolveFollowers(go);
    }
    // The leader answers by its deadline; allow for clock skew and its DHT round trips.
    const double wait_s = std::max(0.0, leader->expiration - dht::Now()) + 3.0;
    const SteadyTime ask_deadline = std::min(step_deadline, SteadyNow() + SecondsToMillis(wait_s));
    auto answer = co_await RequestJoin(*leader, ask_deadline, gathered);
    if (!looking_) co_return Closed("the averager was shut down");
    looking_->requesting.reset();
    if (!answer.ok()) {
      COLONY_LOG_DEBUG("averaging: join request to {} failed: {}", leader->peer.Short(),
                       answer.status().ToString());
      continue;
    }
    switch (answer->code) {
      case JoinResponse::Code::kBegin: {
        const auto& members = answer->group.members;
        const bool in_group = std::any_of(members.begin(), members.end(), [&](const MemberInfo& m) {
          return m.peer == host_.peer_id();
        });
        if (answer->group.total != total_ || !in_group || members.front().peer != leader->peer) {
          reasons.push_back("leader " + leader->peer.ToString() +
                            " sent an inconsistent group; ignored");
          continue;
        }
        const uint64_t own_part_size = OwnPartSize();
        if (answer->group.part_size < std::min(own_part_size, kMinPartSize)) {
          reasons.push_back(fmt::format(
              "leader {} chose parts of {} values (this peer takes at least {}); ignored",
              leader->peer.ToString(), answer->group.part_size,
              std::min(own_part_size, kMinPartSize)));
          continue;
        }
        // The leader sized the spans: one that hands itself or a friend far more than the
        // announced bandwidths justify is not followed.
        std::vector<uint64_t> spans;
        for (const MemberInfo& m : members) spans.push_back(m.span);
        if (Status st = CheckLoadBalance(total_, BoundedLoads(answer->group), spans); !st.ok()) {
          reasons.push_back("leader " + leader->peer.ToString() + " sent an unbalanced group (" +
                            st.message() + "); ignored");
          continue;
        }
        // Anyone who asked us meanwhile was redirected; nobody is waiting on us.
        ResolveFollowers({JoinResponse::Code::kRedirect,
                          "the peer joined a group",
                          leader->peer,
                          leader->addrs,
                          {}});
        finish();
        co_return std::move(answer->group);
      }
      case JoinResponse::Code::kRedirect:
        // The leader is busy asking another peer. Follow it there, and do not write the leader
        // off: its request may fail and it may lead again (writing it off split groups under
        // load). When the target was already tried, pause briefly instead of spinning.
        tried.erase({leader->peer, leader->expiration});
        if (answer->leader && *answer->leader != host_.peer_id() &&
            !tried.count({*answer->leader, 0})) {
          redirect = Candidate{*answer->leader, answer->leader_addrs, 0};
        } else {
          co_await looking_changed_.WaitUntil(
              std::min(looking_->deadline, SteadyNow() + std::chrono::milliseconds(100)));
          if (!looking_) co_return Closed("the averager was shut down");
        }
        continue;
      case JoinResponse::Code::kRejected:
      case JoinResponse::Code::kDisbanded:
        COLONY_LOG_DEBUG("averaging: {} did not take us: {}", leader->peer.Short(), answer->reason);
        // Refusals about this peer itself (its tensors, verification or audits, a ban) are what the
        // caller must fix or know: they go into the step's error.
        if (answer->code == JoinResponse::Code::kRejected &&
            (answer->reason.find("schema") != std::string::npos ||
             answer->reason.find(kMustAgree) != std::string::npos ||
             answer->reason.find("banned you") != std::string::npos)) {
          reasons.push_back("peer " + leader->peer.ToString() + " refused: " + answer->reason);
        }
        continue;
    }
  }
}

asio::awaitable<Result<net::Message>> Averager::Impl::HandleJoin(PeerId from,
                                                                 net::Message message) {
  auto request = DecodeJoinRequest(message.meta);
  if (!request.ok()) co_return request.status();
  auto reply = [](JoinResponse r) { return net::Message(EncodeJoinResponse(r)); };
  auto reject = [&](std::string reason) {
    JoinResponse r;
    r.code = JoinResponse::Code::kRejected;
    r.reason = std::move(reason);
    return reply(std::move(r));
  };
  if (shut_down_) co_return reject("the averager is shutting down");
  if (options_.mode == Mode::kClient) co_return reject("client-mode peers do not lead groups");
  if (IsBanned(from)) co_return reject("this peer banned you: verification caught you cheating");
  if (request->mode != Mode::kClient) {
    // Every member dials it: one that cannot be dialed would only cost the group its span.
    if (auto dial = DialAddress(host_, request->addrs, from); !dial.ok()) {
      co_return reject("a node-mode peer must announce an address to dial it at: " +
                       dial.status().message());
    }
  }
  if (request->schema_hash != schema_hash_) {
    co_return reject(fmt::format(
        "tensor schema mismatch: this peer averages {} values in {} tensor(s) (schema {}); "
        "the request's schema is {}; all peers under one prefix must average the same shapes",
        total_, tensors_.size(), HexEncode(AsBytes(schema_hash_)).substr(0, 16),
        HexEncode(AsBytes(request->schema_hash)).substr(0, 16)));
  }
  // What a whole group does or does not: a requester that differs is refused, named.
  auto differs = [](bool mine, std::string_view what) {
    return fmt::format("{} {} and {} not: {}", mine ? "this peer" : "the request", what,
                       mine ? "the request does" : "this peer does", kMustAgree);
  };
  if (request->verify != options_.verify) {
    co_return reject(differs(options_.verify, "verifies its rounds (--verify)"));
  }
  if (request->audit != (options_.audit_targets > 0)) {
    co_return reject(differs(options_.audit_targets > 0, "audits its group's values"));
  }
  if (!looking_ || looking_->group_key != request->group_key) {
    co_return reject("not looking for a group under " + request->group_key);
  }
  if (looking_->requesting) {
    JoinResponse r;
    r.code = JoinResponse::Code::kRedirect;
    r.reason = "this peer is joining another leader";
    r.leader = looking_->requesting->peer;
    r.leader_addrs = looking_->requesting->addrs;
    co_return reply(std::move(r));
  }
  for (const auto& f : looking_->followers) {
    if (f->peer == from) co_return reject("this peer has already asked to join");
  }
  if (looking_->followers.size() + 1 >= std::min(options_.target_group_size, kMaxGroupSize)) {
    co_return reject("the group is full");
  }
  auto follower = std::make_shared<PendingFollower>();
  follower->peer = from;
  follower->request = std::move(*request);
  looking_->followers.push_back(follower);
  looking_changed_.Notify();
  const SteadyTime give_up = looking_->deadline + std::chrono::seconds(2);
  while (!follower->outcome) {
    if (SteadyNow() >= give_up) {
      // No outcome by our deadline (we are stuck): forget the requester. A requester that gave
      // up earlier (it died, or its call timed out) may still be put into the group; the
      // all-reduce then excludes it like any failed peer.
      if (looking_) {
        std::erase(looking_->followers, follower);
        looking_changed_.Notify();
      }
      co_return DeadlineExceeded("the join request ended before the group formed");
    }
    co_await looking_changed_.WaitUntil(give_up);
  }
  co_return reply(std::move(*follower->outcome));
}

}  // namespace colony::averaging
