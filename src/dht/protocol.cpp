#include "dht/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "dht/vouches.h"

namespace colony::dht {
namespace {

std::vector<StoreItem> Entries(const std::string& key, const Record& record) {
  std::vector<StoreItem> out;
  if (record.is_dict) {
    for (const auto& [sub, v] : record.subkeys) out.push_back({key, sub, v.value, v.expiration});
  } else if (record.value.expiration != 0) {
    out.push_back({key, std::nullopt, record.value.value, record.value.expiration});
  }
  return out;
}

// Where an answer came from, grouped as sources are (the group the reply arrived from, else the
// environment's group of the peer's address): nullopt when unknown, empty when not grouped.
std::optional<std::string> AnswerGroup(const Environment& env, const PeerId& peer,
                                       const std::optional<std::string>& source_group) {
  return source_group ? source_group : env.AddressGroupOf(peer);
}

bool Contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}
bool SharesAnAddress(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return std::any_of(a.begin(), a.end(), [&](const std::string& x) { return Contains(b, x); });
}

// Collects one result per part and calls `done` once all parts have reported.
template <typename T>
struct Join {
  std::vector<T> results;
  size_t remaining;
  std::function<void(std::vector<T>)> done;
  Join(size_t n, std::function<void(std::vector<T>)> d)
      : results(n), remaining(n), done(std::move(d)) {}
  void Set(size_t i, T value) {
    results[i] = std::move(value);
    if (--remaining == 0) done(std::move(results));
  }
};

// A peer that answered "busy" (its rate limits, or the replies it holds in transit) is alive, and
// is who its referrers said it is.
bool Busy(const Status& s) { return s.code() == StatusCode::kResourceExhausted; }
}  // namespace

struct DhtCore::Lookup {
  enum class State { kNew, kInFlight, kDone, kFailed };
  struct Candidate {
    Contact contact;
    State state = State::kNew;
    size_t depth = 1;
    bool had_value = false;
    bool probe = false;  // asked whatever its distance (random probe)
    size_t path = 0;     // the disjoint path it belongs to (DhtOptions::disjoint_paths)
    // Failed because it could not be reached at contact.addrs (not because it was busy or its
    // answer was refused): it is asked again at other addresses a referrer offers.
    bool unreachable = false;
    // Who named it at contact.addrs (none: this node's routing table), the first kMaxReferrers.
    std::vector<PeerId> referrers = {};
    // Other addresses other referrers named it at, not tried yet (at most kMaxReferrers offers),
    // and the addresses it failed at: a referrer that names an honest contact first, at a wrong
    // address, does not take it out of the lookup.
    struct Offer {
      PeerId referrer;
      std::vector<std::string> addrs;
    };
    std::vector<Offer> offers = {};
    std::vector<std::string> tried = {};
  };
  DhtId target;
  std::optional<std::string> key;  // set: also looking for its value
  Freshness freshness = Freshness::kAnyCopy;
  size_t paths = 1;                                 // disjoint paths
  std::map<DhtId, Candidate> candidates;            // by XOR distance to target
  std::map<std::string, size_t> answers_per_group;  // answers counted per address group
  struct Referrals {
    size_t answered = 0, failed = 0;
    bool distrusted = false;
  };
  std::map<PeerId, Referrals> referrals;  // per referrer: how the contacts it named did
  bool Distrusted(const PeerId& referrer) const {
    auto r = referrals.find(referrer);
    return r != referrals.end() && r->second.distrusted;
  }
  // Moves `c` to the first offer, from a referrer still trusted, of addresses not tried yet: it
  // becomes a new candidate at those addresses, named by that referrer. False when none is left.
  bool TakeNextOffer(Candidate& c) const {
    while (!c.offers.empty()) {
      Candidate::Offer offer = std::move(c.offers.front());
      c.offers.erase(c.offers.begin());
      std::erase_if(offer.addrs, [&](const std::string& a) { return Contains(c.tried, a); });
      if (offer.addrs.empty() || Distrusted(offer.referrer)) continue;
      c.contact.addrs = std::move(offer.addrs);
      c.referrers = {offer.referrer};
      c.state = State::kNew;
      c.unreachable = false;
      return true;
    }
    return false;
  }
  // `c` could not be reached at its addresses (a failed dial, or addresses backed off).
  static void MarkUnreachable(Candidate& c) {
    c.state = State::kFailed;
    c.unreachable = true;
    for (const std::string& a : c.contact.addrs) {
      if (!Contains(c.tried, a)) c.tried.push_back(a);
    }
  }
  bool finished = false;
  std::optional<Record> found;
  size_t found_depth = 0;
  // Which sources held each subkey of `found` (from the first dictionary answer on).
  std::optional<SubkeyVouches> vouches;
  std::function<void(Lookup&)> on_done;

  // Trims a union of copies to `limits`, dropping first what the fewest sources held.
  void Trim(Record& merged, const StorageLimits& limits) const {
    TrimToLimits(*key, merged, limits, [this](const std::string& subkey) {
      return vouches ? vouches->Count(subkey) : 0;
    });
  }

  // Responded candidates, nearest first.
  std::vector<const Candidate*> Responded(size_t limit) const {
    std::vector<const Candidate*> out;
    for (const auto& [_, c] : candidates) {
      if (out.size() >= limit) break;
      if (c.state == State::kDone) out.push_back(&c);
    }
    return out;
  }
};

struct DhtCore::GetOp {
  std::string key;
  DhtId id;
  Freshness freshness = Freshness::kAnyCopy;
  std::vector<std::function<void(Result<Record>)>> waiters;
};

std::shared_ptr<DhtCore> DhtCore::Create(const KeyPair& identity, std::vector<std::string> addrs,
                                         DhtOptions options, Environment& env) {
  return std::shared_ptr<DhtCore>(new DhtCore(identity, std::move(addrs), options, env));
}

DhtCore::DhtCore(const KeyPair& identity, std::vector<std::string> addrs, DhtOptions options,
                 Environment& env)
    : self_{identity.peer_id(), DhtId::ForPeer(identity.peer_id()), std::move(addrs)},
      options_(options),
      env_(env),
      routing_(self_.id, options.bucket_size, /*max_failures=*/2,
               options.max_contacts_per_address_per_bucket),
      storage_(options.storage),
      cache_([&] {
        StorageLimits l = options.storage;
        l.capacity_bytes = options.cache_capacity_bytes;
        l.per_peer_quota_bytes = std::min(l.per_peer_quota_bytes, options.cache_capacity_bytes / 4);
        l.per_source_quota_bytes =
            std::min(l.per_source_quota_bytes, options.cache_capacity_bytes / 2);
        return l;
      }()),
      rng_([&] {
        uint64_t seed = 0;
        std::memcpy(&seed, self_.id.bytes().data(), sizeof(seed));
        return seed;
      }()) {
  if (options_.client_mode) self_.addrs.clear();
  validators_.Add(std::make_shared<OwnerValidator>(&identity));
}

void DhtCore::AddValidator(std::shared_ptr<const RecordValidator> validator) {
  validators_.Add(std::move(validator));
}

NodeHeader DhtCore::Header() const { return {options_.client_mode, self_.addrs}; }

void DhtCore::SetAddresses(std::vector<std::string> addrs, std::function<void()> told) {
  if (stopped_) {
    told();
    return;
  }
  options_.client_mode = addrs.empty();
  self_.addrs = std::move(addrs);
  if (options_.client_mode) {
    told();  // nobody to tell: a client's requests carry no contact
    return;
  }
  FindNodes(self_.id, [told = std::move(told)](const Result<std::vector<Contact>>&) { told(); });
}

// ---------------------------------------------------------------------------------------------
// Bootstrap and maintenance

void DhtCore::Bootstrap(std::vector<std::string> initial_peers, Callback<size_t> done) {
  if (initial_peers.empty()) {
    StartMaintenance();
    done(size_t{0});
    return;
  }
  struct Outcome {
    std::string address;
    Status status;
  };
  const size_t n = initial_peers.size();
  auto weak = weak_from_this();
  auto join = std::make_shared<Join<Outcome>>(n, [weak, done](std::vector<Outcome> outcomes) {
    auto self = weak.lock();
    if (!self || self->stopped_) {
      done(Closed("DHT node shut down during bootstrap"));
      return;
    }
    std::string why;
    size_t ok = 0;
    for (const Outcome& o : outcomes) {
      if (o.status.ok()) {
        ++ok;
      } else {
        why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", o.address, o.status.message());
      }
    }
    if (ok == 0) {
      done(Unavailable(fmt::format(
          "none of the {} initial peers could be used ({}); check the addresses, that the peers "
          "run, and firewalls",
          outcomes.size(), why)));
      return;
    }
    if (!why.empty()) COLONY_LOG_WARN("DHT bootstrap: some initial peers failed: {}", why);
    self->StartMaintenance();
    // Fill the routing table: our own neighbourhood first, then one random id per bucket.
    auto refreshed = [weak, done] {
      auto me = weak.lock();
      if (!me || me->stopped_) {
        done(Closed("DHT node shut down during bootstrap"));
      } else {
        done(me->routing_.size());
      }
    };
    self->FindNodes(self->self_.id, [weak, done, refreshed](Result<std::vector<Contact>>) {
      auto me = weak.lock();
      if (!me || me->stopped_) {
        done(Closed("DHT node shut down during bootstrap"));
        return;
      }
      const SteadyTime all = me->Now() + std::chrono::hours(1);
      me->RefreshBuckets(me->routing_.StaleBuckets(all, all), refreshed);
    });
  });
  for (size_t i = 0; i < n; ++i) {
    Contact c{PeerId(), DhtId(), {initial_peers[i]}};
    const std::string addr = initial_peers[i];
    const double sent_at = Wall();
    env_.Ping(c, {Header(), sent_at}, options_.request_timeout,
              [weak, join, i, addr, sent_at](Result<PingResponse> r) {
                auto self = weak.lock();
                if (!self) {
                  join->Set(i, {addr, Closed("shut down")});
                  return;
                }
                if (!r.ok()) {
                  join->Set(i, {addr, r.status()});
                  return;
                }
                // The peer read its clock somewhere between our send and this reply.
                const double now = self->Wall();
                const double skew = r->wall_time - (sent_at + now) / 2;
                const double slack = (now - sent_at) / 2 + self->options_.max_clock_skew_seconds;
                if (std::abs(skew) > slack || !std::isfinite(skew)) {
                  join->Set(i, {addr, FailedPrecondition(fmt::format(
                                          "its clock differs from ours by {:.1f} s (at most "
                                          "{:.1f} s allowed); synchronize clocks (NTP)",
                                          skew, self->options_.max_clock_skew_seconds))});
                  return;
                }
                if (r->client_mode) {
                  join->Set(i, {addr, FailedPrecondition("it is in client mode and serves no "
                                                         "DHT requests")});
                  return;
                }
                self->OnSuccess({r->peer, DhtId::ForPeer(r->peer), {addr}}, false,
                                /*firsthand=*/true);
                join->Set(i, {addr, Status::Ok()});
              });
  }
}

void DhtCore::StartMaintenance() {
  if (maintenance_started_) return;
  maintenance_started_ = true;
  auto weak = weak_from_this();
  env_.Schedule(options_.join_refresh_delay, [weak] {
    if (auto self = weak.lock()) self->Maintain();
  });
}

void DhtCore::Maintain() {
  if (stopped_) return;
  const double wall = Wall();
  storage_.Purge(wall);
  cache_.Purge(wall);
  const SteadyTime now = Now();
  std::erase_if(backoff_,
                [&](const auto& kv) { return kv.second.until + options_.backoff_max < now; });
  std::erase_if(rate_,
                [&](const auto& kv) { return now - kv.second.last > std::chrono::minutes(1); });
  std::erase_if(source_rate_,
                [&](const auto& kv) { return now - kv.second.last > std::chrono::minutes(1); });
  if (!options_.client_mode || routing_.size() > 0) {
    // The first round after joining refreshes every sparse bucket: peers that joined at the
    // same moment as us were not there to be found during our own join.
    const SteadyTime sparse_before =
        joined_refresh_done_ ? now - options_.sparse_bucket_refresh_interval : now;
    joined_refresh_done_ = true;
    RefreshBuckets(routing_.StaleBuckets(now - options_.bucket_refresh_interval, sparse_before),
                   [] {});
  }
  auto weak = weak_from_this();
  env_.Schedule(options_.maintenance_interval, [weak] {
    if (auto self = weak.lock()) self->Maintain();
  });
}

void DhtCore::RefreshBuckets(std::vector<size_t> buckets, std::function<void()> done) {
  if (buckets.empty() || routing_.size() == 0) {
    done();
    return;
  }
  auto join = std::make_shared<Join<int>>(buckets.size(), [done](std::vector<int>) { done(); });
  for (size_t i = 0; i < buckets.size(); ++i) {
    routing_.MarkRefreshed(buckets[i], Now());
    const DhtId target = DhtId::RandomInBucket(self_.id, buckets[i], rng_);
    StartLookup({.target = target, .random_probes = options_.alpha},
                [join, i](Lookup&) { join->Set(i, 0); });
  }
}

// ---------------------------------------------------------------------------------------------
// Peer bookkeeping

bool DhtCore::BackedOff(const Contact& contact) const {
  auto it = backoff_.find(contact.peer);
  if (it == backoff_.end() || it->second.until <= Now()) return false;
  // Only at addresses it failed at: a referrer that named it at a wrong one must not make it
  // skipped at its own.
  const std::vector<std::string>& failed = it->second.addrs;
  return std::all_of(contact.addrs.begin(), contact.addrs.end(),
                     [&](const std::string& a) { return Contains(failed, a); });
}

void DhtCore::OnSuccess(const Contact& contact, bool client_mode, bool firsthand) {
  if (!contact.peer.valid()) return;
  backoff_.erase(contact.peer);
  if (client_mode || contact.addrs.empty()) return;
  const std::optional<std::string> group = env_.AddressGroupOf(contact.peer);
  if (!group) return;  // its connection closed already: it enters when it answers again
  routing_.Seen(contact, Now(), *group, /*update_addrs=*/firsthand);
  stats_.contacts_refused_for_address = routing_.refused_for_address();
}

void DhtCore::OnFailure(const Contact& contact, const Status& why) {
  ++stats_.requests_failed;
  if (!contact.peer.valid()) return;
  // Counted against its routing table entry only when it failed at an address the table holds
  // for it: addresses a referrer named say nothing about the contact itself. A busy peer is
  // alive: under load (an attack on it, say) its callers would otherwise all drop it at once.
  if (const auto known = routing_.Find(contact.peer);
      !Busy(why) && known && SharesAnAddress(known->addrs, contact.addrs)) {
    routing_.Failed(contact.peer);
  }
  Backoff& b = backoff_[contact.peer];
  ++b.failures;
  for (const std::string& a : contact.addrs) {
    if (!Contains(b.addrs, a)) b.addrs.push_back(a);
  }
  if (b.addrs.size() > kMaxBackoffAddrs) {
    b.addrs.erase(b.addrs.begin(),
                  b.addrs.begin() + static_cast<std::ptrdiff_t>(b.addrs.size() - kMaxBackoffAddrs));
  }
  Duration wait = options_.backoff_base;
  for (size_t i = 1; i < b.failures && wait < options_.backoff_max; ++i) wait *= 2;
  b.until = Now() + std::min(wait, options_.backoff_max);
}

template <typename Key>
bool DhtCore::TakeToken(std::unordered_map<Key, Bucket>& buckets, const Key& key, double rate) {
  const SteadyTime now = Now();
  const double burst = 2 * rate;
  auto [it, fresh] = buckets.try_emplace(key, Bucket{burst, now});
  Bucket& b = it->second;
  if (!fresh) {
    const double dt = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst, b.tokens + dt * rate);
    b.last = now;
  }
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void DhtCore::NoteSender(const PeerId& from, const NodeHeader& header) {
  if (header.client_mode || header.addrs.empty()) return;
  OnSuccess({from, DhtId::ForPeer(from), header.addrs}, false, /*firsthand=*/true);
}

// ---------------------------------------------------------------------------------------------
// Lookups

void DhtCore::StartLookup(LookupSpec spec, std::function<void(Lookup&)> on_done) {
  const DhtId target = spec.target;
  size_t random_probes = spec.random_probes;
  auto lookup = std::make_shared<Lookup>();
  lookup->target = target;
  lookup->key = std::move(spec.key);
  lookup->freshness = spec.freshness;
  lookup->on_done = std::move(on_done);
  lookup->paths = std::clamp<size_t>(options_.disjoint_paths, 1, kMaxDisjointPaths);
  // The nearest known contacts, dealt out to the paths in turn (the nearest to path 0, ...).
  size_t dealt = 0;
  for (Contact& c : routing_.Nearest(target, options_.beam_size * lookup->paths)) {
    const DhtId d = c.id ^ target;
    lookup->candidates.emplace(
        d, Lookup::Candidate{.contact = std::move(c), .path = dealt++ % lookup->paths});
  }
  if (random_probes > 0) {
    std::vector<Contact> all = routing_.All();
    std::shuffle(all.begin(), all.end(), rng_);
    for (Contact& c : all) {
      if (random_probes == 0) break;
      auto [it, fresh] = lookup->candidates.try_emplace(c.id ^ target, Lookup::Candidate{c});
      if (fresh) {
        it->second.probe = true;
        --random_probes;
      }
    }
  }
  // Pruned here too: with nobody to ask, no find is sent and FlushFinds never prunes.
  PruneLookups();
  active_lookups_.push_back(lookup);
  std::weak_ptr<Lookup> weak_lookup = lookup;
  auto weak = weak_from_this();
  env_.Schedule(options_.lookup_timeout, [weak, weak_lookup] {
    auto self = weak.lock();
    auto l = weak_lookup.lock();
    if (self && l && !l->finished) {
      COLONY_LOG_DEBUG("DHT lookup of {} hit its deadline", l->target.ToHex());
      self->FinishLookup(l);
    }
  });
  Step(lookup);
}

void DhtCore::Step(const std::shared_ptr<Lookup>& lookup) {
  Lookup& l = *lookup;
  if (l.finished) return;
  if (stopped_ || (l.key && l.freshness == Freshness::kAnyCopy && l.found)) {
    FinishLookup(lookup);
    return;
  }
  // Each path has alpha requests in flight at most.
  std::vector<size_t> flying(l.paths, 0);
  for (const auto& [_, c] : l.candidates) {
    if (c.state == Lookup::State::kInFlight) ++flying[c.path];
  }
  const auto ask = [&](Lookup::Candidate& c) {
    if (c.state != Lookup::State::kNew || flying[c.path] >= options_.alpha) return;
    c.state = Lookup::State::kInFlight;
    ++flying[c.path];
    SendFind(lookup, c.contact, c.depth);
  };
  // Settled: every probe and, on each path, each of the beam_size nearest live candidates
  // answered.
  bool settled = true;
  for (auto& [_, c] : l.candidates) {
    if (!c.probe || c.state == Lookup::State::kDone || c.state == Lookup::State::kFailed) continue;
    settled = false;
    ask(c);
  }
  std::vector<size_t> considered(l.paths, 0);
  for (auto& [_, c] : l.candidates) {
    if (considered[c.path] >= options_.beam_size) continue;
    if (c.state == Lookup::State::kFailed) continue;
    while (c.state == Lookup::State::kNew && BackedOff(c.contact)) {
      Lookup::MarkUnreachable(c);
      l.TakeNextOffer(c);
    }
    if (c.state == Lookup::State::kFailed) continue;
    ++considered[c.path];
    if (c.state == Lookup::State::kDone) continue;
    settled = false;
    ask(c);
  }
  if (settled) FinishLookup(lookup);
}

void DhtCore::SendFind(const std::shared_ptr<Lookup>& lookup, const Contact& contact,
                       size_t depth) {
  // A batch goes to one set of addresses: one queued for this peer at others is sent first.
  if (auto queued = find_batches_.find(contact.peer);
      queued != find_batches_.end() && queued->second.contact.addrs != contact.addrs) {
    FlushFinds(contact.peer);
  }
  auto [it, fresh] = find_batches_.try_emplace(contact.peer, FindBatch{contact, {}});
  it->second.queued.push_back({lookup, depth});
  if (it->second.queued.size() >= kMaxFindIds) {
    FlushFinds(contact.peer);
  } else if (fresh) {
    // Sent once the current event is over, with whatever other lookups queued meanwhile.
    auto weak = weak_from_this();
    env_.Schedule(Duration::zero(), [weak, peer = contact.peer] {
      if (auto self = weak.lock()) self->FlushFinds(peer);
    });
  }
}

void DhtCore::FlushFinds(const PeerId& peer) {
  auto it = find_batches_.find(peer);
  if (it == find_batches_.end()) return;
  FindBatch batch = std::move(it->second);
  find_batches_.erase(it);
  if (stopped_) {
    for (const QueuedFind& q : batch.queued) {
      OnFindReply(q.lookup, batch.contact, q.depth, Closed("DHT node is shut down"), false);
    }
    return;
  }
  // Piggyback other lookups that would ask this peer anyway.
  PruneLookups();
  for (const auto& weak_lookup : active_lookups_) {
    if (batch.queued.size() >= kMaxFindIds) break;
    auto other = weak_lookup.lock();
    auto c = other->candidates.find(batch.contact.id ^ other->target);
    if (c == other->candidates.end() || c->second.state != Lookup::State::kNew ||
        c->second.contact.addrs != batch.contact.addrs) {
      continue;
    }
    c->second.state = Lookup::State::kInFlight;
    batch.queued.push_back({other, c->second.depth});
  }
  FindRequest request{Header(), {}};
  for (const QueuedFind& q : batch.queued) request.ids.push_back(q.lookup->target);
  ++stats_.requests_sent;
  auto weak = weak_from_this();
  const Contact contact = batch.contact;
  env_.Find(
      contact, std::move(request), options_.request_timeout,
      [weak, contact, queued = std::move(batch.queued)](Result<FindResponse> reply) {
        auto self = weak.lock();
        if (!self) return;
        if (reply.ok() && reply->results.size() != queued.size()) {
          reply = ProtocolError(fmt::format("find reply has {} results for {} ids",
                                            reply->results.size(), queued.size()));
        }
        for (size_t i = 0; i < queued.size(); ++i) {
          Result<FindResponse> one =
              reply.ok()
                  ? Result<FindResponse>(FindResponse{.results = {std::move(reply->results[i])},
                                                      .source_group = reply->source_group})
                  : Result<FindResponse>(reply.status());
          self->OnFindReply(queued[i].lookup, contact, queued[i].depth, std::move(one), i == 0);
        }
      });
}

void DhtCore::OnFindReply(const std::shared_ptr<Lookup>& lookup, const Contact& contact,
                          size_t depth, Result<FindResponse> reply, bool first_of_batch) {
  Lookup& l = *lookup;
  auto it = l.candidates.find(contact.id ^ l.target);
  if (reply.ok() && reply->results.size() != 1) {
    reply = ProtocolError(fmt::format("find reply has {} results for 1 id", reply->results.size()));
  }
  if (!reply.ok()) {
    if (first_of_batch) {
      COLONY_LOG_DEBUG("DHT find to {} failed: {}", contact.peer.Short(),
                       reply.status().ToString());
      OnFailure(contact, reply.status());
    }
    if (it != l.candidates.end()) {
      Lookup::Candidate& c = it->second;
      c.state = Lookup::State::kFailed;
      if (!Busy(reply.status())) {
        Lookup::MarkUnreachable(c);
        CountReferral(l, c.referrers, false);
        l.TakeNextOffer(c);  // at addresses another referrer named
      }
    }
    Step(lookup);
    return;
  }
  if (first_of_batch) OnSuccess(contact, false);
  if (stopped_) {
    Step(lookup);
    return;
  }
  if (!CountAnswer(l, contact.peer, reply->source_group)) {
    // Identities are free: beyond its share, an address's answers are ignored (their records
    // and contacts too), and it takes no slot among the nearest that answered.
    if (it != l.candidates.end()) it->second.state = Lookup::State::kFailed;
    ++stats_.candidates_refused;
    Step(lookup);
    return;
  }
  FindResult& result = reply->results[0];
  bool had_value = false;
  if (l.key && result.record) {
    // Keep only entries that validate and have not expired; merge with what we have.
    Record& r = *result.record;
    // No honest replica holds more than its storage limits allow (the wire allows 64 MiB and
    // 65,536 subkeys): a reply with more is ignored before any of it is validated, so a liar
    // cannot make us check tens of thousands of signatures; and what several replicas' copies
    // merge into is trimmed to those limits, so a lookup holds at most one record's worth.
    if (!FitsLimits(*l.key, r, options_.storage)) {
      COLONY_LOG_DEBUG("DHT: ignoring {}'s copy of '{}': larger than a node stores",
                       contact.peer.ToString(), *l.key);
      result.record.reset();
    }
  }
  if (l.key && result.record) {
    Record& r = *result.record;
    const double now = Wall();
    // A replica's copy is as untrusted as a store: too far an expiration is not believed either.
    const double latest = now + options_.storage.max_ttl_seconds + kExpirationClockSlack;
    auto valid = [&](std::optional<std::string_view> sub, const ValueEntry& v) {
      return v.expiration > now && v.expiration <= latest &&
             validators_.ValidateAndStrip({*l.key, sub, v.value, v.expiration}).ok();
    };
    if (r.is_dict) {
      std::erase_if(r.subkeys, [&](const auto& kv) { return !valid(kv.first, kv.second); });
      had_value = !r.subkeys.empty();
    } else {
      had_value = valid(std::nullopt, r.value);
    }
    if (had_value && r.is_dict) {
      // Sources as CountAnswer groups them; a peer whose address is not grouped is its own.
      const auto group = AnswerGroup(env_, contact.peer, reply->source_group);
      if (!l.vouches) l.vouches.emplace(options_.storage.max_subkeys);
      l.vouches->Note(group && !group->empty() ? *group : "peer " + contact.peer.ToString(), r);
    }
    if (had_value) {
      if (!l.found) {
        l.found = std::move(r);
        l.found_depth = depth;
      } else {
        MergeRecord(*l.found, r);
        l.Trim(*l.found, options_.storage);
      }
    }
  }
  if (it != l.candidates.end()) {
    it->second.state = Lookup::State::kDone;
    it->second.had_value = had_value;
    CountReferral(l, it->second.referrers, true);
  }
  if (!l.finished) {
    AddCandidates(l, contact.peer, std::move(result.nearest), depth + 1,
                  it != l.candidates.end() ? it->second.path : 0);
  }
  Step(lookup);
}

bool DhtCore::CountAnswer(Lookup& l, const PeerId& peer,
                          const std::optional<std::string>& source_group) {
  if (options_.max_answers_per_address == 0) return true;
  // Grouped by where the answer came from, not by addresses anyone claimed for it.
  const std::optional<std::string> group = AnswerGroup(env_, peer, source_group);
  if (!group) return false;  // where it answered from is unknown
  if (group->empty()) return true;
  size_t& n = l.answers_per_group[*group];
  if (n >= options_.max_answers_per_address) return false;
  ++n;
  return true;
}

void DhtCore::AddCandidates(Lookup& l, const PeerId& referrer, std::vector<Contact> contacts,
                            size_t depth, size_t path) {
  std::erase_if(contacts, [&](const Contact& c) {
    return !c.peer.valid() || c.peer == self_.peer || c.addrs.empty();
  });
  // An honest peer names its k nearest; a reply may list more (the wire allows 64), and only
  // the k nearest of them are taken.
  const auto nearer = [&](const Contact& a, const Contact& b) {
    return (a.id ^ l.target) < (b.id ^ l.target);
  };
  if (contacts.size() > options_.bucket_size) {
    std::partial_sort(contacts.begin(),
                      contacts.begin() + static_cast<std::ptrdiff_t>(options_.bucket_size),
                      contacts.end(), nearer);
    stats_.candidates_refused += contacts.size() - options_.bucket_size;
    contacts.resize(options_.bucket_size);
  }
  for (Contact& c : contacts) {
    // A contact in the routing table is asked at the addresses the table holds (its own, or
    // those it answered at), whatever a referrer says.
    if (auto known = routing_.Find(c.peer)) c.addrs = std::move(known->addrs);
    const DhtId distance = c.id ^ l.target;
    auto it = l.candidates.find(distance);
    if (it == l.candidates.end()) {
      l.candidates.emplace(
          distance,
          Lookup::Candidate{
              .contact = std::move(c), .depth = depth, .path = path, .referrers = {referrer}});
      continue;
    }
    Lookup::Candidate& candidate = it->second;
    if (candidate.path != path) continue;       // another path's: disjoint paths share no peer
    if (candidate.referrers.empty()) continue;  // from this node's own table
    if (SharesAnAddress(c.addrs, candidate.contact.addrs)) {
      std::vector<PeerId>& referrers = candidate.referrers;
      if (candidate.state == Lookup::State::kNew && referrers.size() < kMaxReferrers &&
          std::find(referrers.begin(), referrers.end(), referrer) == referrers.end()) {
        referrers.push_back(referrer);
      }
      continue;
    }
    // Named at other addresses: offered for when the ones it is asked at fail.
    std::erase_if(c.addrs, [&](const std::string& a) { return Contains(candidate.tried, a); });
    if (c.addrs.empty() || candidate.state == Lookup::State::kDone ||
        candidate.offers.size() >= kMaxReferrers) {
      continue;
    }
    candidate.offers.push_back({referrer, std::move(c.addrs)});
    if (candidate.state == Lookup::State::kFailed && candidate.unreachable) {
      l.TakeNextOffer(candidate);
    }
  }
  // Bound the candidate set: far candidates that were never contacted are dropped.
  const size_t cap = 4 * options_.beam_size * l.paths;
  if (l.candidates.size() > cap) {
    auto victim = std::prev(l.candidates.end());
    while (l.candidates.size() > cap && victim != l.candidates.begin()) {
      auto prev = std::prev(victim);
      if (victim->second.state == Lookup::State::kNew && !victim->second.probe) {
        l.candidates.erase(victim);
      }
      victim = prev;
    }
  }
}

void DhtCore::CountReferral(Lookup& l, const std::vector<PeerId>& referrers, bool answered) {
  // Stopped: FlushFinds fails the queued finds inline, from inside Step's loop.
  if (options_.max_failed_referrals == 0 || stopped_) return;
  bool newly_distrusted = false;
  for (const PeerId& referrer : referrers) {
    Lookup::Referrals& r = l.referrals[referrer];
    (answered ? r.answered : r.failed)++;
    // Honest peers name dead contacts too (churn), but mostly live ones.
    if (!r.distrusted && r.failed >= options_.max_failed_referrals && r.failed > 2 * r.answered) {
      r.distrusted = true;
      newly_distrusted = true;
    }
  }
  if (!newly_distrusted) return;
  // Candidates not asked yet that only distrusted peers named are dropped, or moved to
  // addresses an honest peer offered; one that an honest peer named too stays (and one dropped
  // comes back when an honest peer names it later). Only kNew candidates go: the caller's
  // candidate, and those in flight, stay where they are.
  for (auto it = l.candidates.begin(); it != l.candidates.end();) {
    Lookup::Candidate& c = it->second;
    if (c.state != Lookup::State::kNew || c.probe || c.referrers.empty() ||
        !std::all_of(c.referrers.begin(), c.referrers.end(),
                     [&](const PeerId& p) { return l.Distrusted(p); }) ||
        l.TakeNextOffer(c)) {
      ++it;
      continue;
    }
    ++stats_.candidates_refused;
    it = l.candidates.erase(it);
  }
}

void DhtCore::PruneLookups() {
  std::erase_if(active_lookups_, [](const auto& w) {
    auto l = w.lock();
    return !l || l->finished;
  });
}

void DhtCore::FinishLookup(const std::shared_ptr<Lookup>& lookup) {
  Lookup& l = *lookup;
  if (l.finished) return;
  l.finished = true;
  ++stats_.lookups;
  size_t hops = l.found ? l.found_depth : 0;
  if (!l.found) {
    for (const auto* c : l.Responded(options_.num_replicas)) hops = std::max(hops, c->depth);
  }
  stats_.lookup_hops += hops;
  auto on_done = std::move(l.on_done);
  if (on_done) on_done(l);
}

void DhtCore::FindNodes(DhtId target, Callback<std::vector<Contact>> done) {
  StartLookup({.target = target}, [done](Lookup& l) {
    std::vector<Contact> out;
    for (const auto* c : l.Responded(l.candidates.size())) out.push_back(c->contact);
    done(std::move(out));
  });
}

// ---------------------------------------------------------------------------------------------
// Store

Result<std::string> DhtCore::PrepareValue(const StoreItem& item) const {
  RecordView view{item.key, item.subkey, item.value, item.expiration};
  COLONY_ASSIGN_OR_RETURN(std::string signed_value, validators_.Sign(view));
  view.value = signed_value;
  COLONY_RETURN_IF_ERROR(validators_.ValidateAndStrip(view).status());
  return signed_value;
}

Result<Record> DhtCore::ValidateAndStrip(const std::string& key, const Record& record) const {
  Record out = record;
  Status last = NotFound("no value for key '" + key + "'");
  auto strip = [&](std::optional<std::string_view> sub, ValueEntry& v) {
    auto r = validators_.ValidateAndStrip({key, sub, v.value, v.expiration});
    if (!r.ok()) {
      last = r.status();
      return false;
    }
    v.value = std::move(*r);
    return true;
  };
  if (out.is_dict) {
    for (auto it = out.subkeys.begin(); it != out.subkeys.end();) {
      it = strip(it->first, it->second) ? std::next(it) : out.subkeys.erase(it);
    }
    if (out.subkeys.empty()) return last;
  } else if (out.value.expiration == 0 || !strip(std::nullopt, out.value)) {
    return last;
  }
  return out;
}

void DhtCore::Store(std::vector<StoreItem> items, std::function<void(std::vector<Status>)> done) {
  const size_t n = items.size();
  if (n == 0) {
    done({});
    return;
  }
  auto join = std::make_shared<Join<Status>>(n, std::move(done));
  // Group valid items by key; each key needs one lookup.
  std::map<std::string, std::vector<std::pair<size_t, StoreItem>>> by_key;
  for (size_t i = 0; i < n; ++i) {
    Status st =
        stopped_ ? Closed("DHT node is shut down") : CheckItem(items[i], options_.storage, Wall());
    if (st.ok()) {
      auto signed_value = PrepareValue(items[i]);
      if (signed_value.ok()) {
        items[i].value = std::move(*signed_value);
        by_key[items[i].key].emplace_back(i, std::move(items[i]));
        continue;
      }
      st = signed_value.status();
    }
    join->Set(i, st);
  }
  for (auto& [key, group] : by_key) {
    std::vector<size_t> indices;
    std::vector<StoreItem> group_items;
    for (auto& [i, item] : group) {
      indices.push_back(i);
      group_items.push_back(std::move(item));
    }
    StoreKey(key, std::move(group_items), [join, indices](std::vector<Status> results) {
      for (size_t j = 0; j < indices.size(); ++j) join->Set(indices[j], std::move(results[j]));
    });
  }
}

void DhtCore::StoreKey(std::string key, std::vector<StoreItem> items,
                       std::function<void(std::vector<Status>)> done) {
  const DhtId id = DhtId::ForKey(key);
  auto weak = weak_from_this();
  StartLookup({.target = id}, [weak, id, key, items = std::move(items),
                               done = std::move(done)](Lookup& l) mutable {
    auto self = weak.lock();
    const size_t n = items.size();
    if (!self || self->stopped_) {
      done(std::vector<Status>(n, Closed("DHT node is shut down")));
      return;
    }
    // The num_replicas nearest of: nodes that answered, and us (unless we are a client).
    std::vector<const Contact*> replicas;
    for (const auto* c : l.Responded(self->options_.num_replicas)) replicas.push_back(&c->contact);
    if (!self->options_.client_mode) {
      replicas.push_back(&self->self_);
      std::stable_sort(replicas.begin(), replicas.end(), [&](const Contact* a, const Contact* b) {
        return Closer(id, a->id, b->id);
      });
      if (replicas.size() > self->options_.num_replicas) replicas.pop_back();
    }
    if (replicas.empty()) {
      done(std::vector<Status>(
          n, Unavailable("no DHT node to store on: this node knows no peers (bootstrap from "
                         "initial peers first)")));
      return;
    }
    struct Tally {
      std::vector<bool> stored;
      std::vector<Status> first_error;
      size_t remaining;
    };
    auto tally = std::make_shared<Tally>(
        Tally{std::vector<bool>(n, false), std::vector<Status>(n), replicas.size()});
    auto finish = [tally, done, n]() {
      std::vector<Status> out(n);
      for (size_t i = 0; i < n; ++i) {
        if (tally->stored[i]) continue;
        out[i] = tally->first_error[i].ok() ? Unavailable("no replica accepted the record")
                                            : tally->first_error[i];
      }
      done(std::move(out));
    };
    auto note = [tally](size_t i, const Status& st) {
      if (st.ok()) {
        tally->stored[i] = true;
      } else if (tally->first_error[i].ok()) {
        tally->first_error[i] = st;
      }
    };
    for (const Contact* replica : replicas) {
      if (replica == &self->self_) {
        for (size_t i = 0; i < n; ++i) {
          note(i, self->storage_.Store(id, items[i], self->self_.peer, self->Wall(), false));
        }
        if (--tally->remaining == 0) finish();
        continue;
      }
      StoreRequest request{self->Header(), {}};
      for (const StoreItem& item : items) request.items.push_back({item, false});
      ++self->stats_.requests_sent;
      const Contact contact = *replica;
      self->env_.Store(contact, std::move(request), self->options_.request_timeout,
                       [weak, contact, tally, note, finish, n](Result<StoreResponse> r) {
                         auto me = weak.lock();
                         if (r.ok() && r->results.size() != n) {
                           r = ProtocolError("store reply has the wrong number of results");
                         }
                         if (!r.ok()) {
                           if (me) me->OnFailure(contact, r.status());
                           for (size_t i = 0; i < n; ++i) {
                             note(i, r.status().WithContext("replica " + contact.peer.Short()));
                           }
                         } else {
                           if (me) me->OnSuccess(contact, false);
                           for (size_t i = 0; i < n; ++i) note(i, r->results[i]);
                         }
                         if (--tally->remaining == 0) finish();
                       });
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Get

std::optional<Record> DhtCore::LocalRecord(const DhtId& id, bool* from_cache) {
  const double now = Wall();
  std::optional<Record> out;
  if (const Record* r = storage_.Get(id, now)) out = *r;
  if (const Record* c = cache_.Get(id, now)) {
    if (from_cache) *from_cache = true;
    if (out) {
      MergeRecord(*out, *c);
      // Each fits the limits, their union may not (unsigned entries pushed into the cache
      // before the owner's store): answered whole, readers would drop all of it.
      if (const std::string* key = storage_.KeyOf(id)) TrimToLimits(*key, *out, options_.storage);
    } else {
      out = *c;
    }
  }
  return out;
}

void DhtCore::Get(std::vector<std::string> keys, Freshness freshness,
                  std::function<void(std::vector<Result<Record>>)> done) {
  if (keys.empty()) {
    done({});
    return;
  }
  auto join = std::make_shared<Join<Result<Record>>>(keys.size(), std::move(done));
  for (size_t i = 0; i < keys.size(); ++i) {
    GetOne(std::move(keys[i]), freshness,
           [join, i](Result<Record> r) { join->Set(i, std::move(r)); });
  }
}

void DhtCore::GetOne(std::string key, Freshness freshness,
                     std::function<void(Result<Record>)> done) {
  if (stopped_) {
    done(Closed("DHT node is shut down"));
    return;
  }
  if (key.empty() || key.size() > options_.storage.max_key_bytes) {
    done(InvalidArgument(fmt::format("DHT key must be 1 to {} bytes, got {}",
                                     options_.storage.max_key_bytes, key.size())));
    return;
  }
  const DhtId id = DhtId::ForKey(key);
  if (freshness == Freshness::kAnyCopy) {
    bool from_cache = false;
    if (auto local = LocalRecord(id, &from_cache)) {
      if (from_cache) MarkCacheRead(id);
      done(ValidateAndStrip(key, *local));
      return;
    }
  }
  auto slot = std::make_pair(id, freshness);
  if (auto it = gets_in_flight_.find(slot); it != gets_in_flight_.end()) {
    ++stats_.shared_gets;
    it->second->waiters.push_back(std::move(done));
    return;
  }
  auto op = std::make_shared<GetOp>();
  op->key = key;
  op->id = id;
  op->freshness = freshness;
  op->waiters.push_back(std::move(done));
  gets_in_flight_[slot] = op;
  auto weak = weak_from_this();
  StartLookup({.target = id, .key = key, .freshness = freshness}, [weak, op](Lookup& l) {
    if (auto self = weak.lock()) {
      self->FinishGet(op, l);
    } else {
      for (auto& w : op->waiters) w(Closed("DHT node is shut down"));
    }
  });
}

void DhtCore::FinishGet(const std::shared_ptr<GetOp>& op, Lookup& l) {
  gets_in_flight_.erase({op->id, op->freshness});
  std::optional<Record> merged = LocalRecord(op->id, nullptr);
  if (l.found) {
    if (merged) {
      // This node's copy is one more source; the union is trimmed as the lookup's was.
      if (merged->is_dict && l.vouches) l.vouches->Note("this node", *merged);
      MergeRecord(*merged, *l.found);
      if (l.key) l.Trim(*merged, options_.storage);
    } else {
      merged = *l.found;
    }
    if (!stopped_) {
      // Also when this node stores the key itself but the lookup found more: a replica that
      // joined after some owners stored their subkeys holds a partial dictionary, and its own
      // kAnyCopy reads (storage and cache merged) must not keep hiding the rest.
      if (options_.cache_locally && AddsToStorage(op->id, *l.found)) {
        CacheLocally(op->id, op->key, *l.found);
      }
      // Cache on the nearest node that answered without the value, to spread hot keys' load.
      if (options_.cache_on_nearest) {
        for (const auto* c : l.Responded(options_.beam_size)) {
          if (c->had_value) continue;
          StoreRequest request{Header(), {}};
          for (StoreItem& item : Entries(op->key, *l.found)) {
            if (request.items.size() >= kMaxStoreItems) break;
            request.items.push_back({std::move(item), true});
          }
          ++stats_.requests_sent;
          env_.Store(c->contact, std::move(request), options_.request_timeout,
                     [](Result<StoreResponse>) {});
          break;
        }
      }
    }
  }
  Result<Record> result = stopped_ ? Result<Record>(Closed("DHT node is shut down"))
                          : merged
                              ? ValidateAndStrip(op->key, *merged)
                              : Result<Record>(NotFound(fmt::format(
                                    "no value for key '{}' on the nearest DHT nodes", op->key)));
  for (auto& w : op->waiters) w(result);
}

bool DhtCore::AddsToStorage(const DhtId& id, const Record& found) {
  const Record* stored = storage_.Get(id, Wall());
  if (stored == nullptr) return true;
  Record merged = *stored;
  MergeRecord(merged, found);
  return !(merged == *stored);
}

void DhtCore::CacheLocally(const DhtId& id, const std::string& key, const Record& record) {
  const double now = Wall();
  size_t bytes = 0;
  const auto entries = Entries(key, record);
  for (const StoreItem& e : entries) bytes += StoredBytes(e);  // as the cache counts them
  cache_.MakeRoom(bytes, now);
  for (const StoreItem& e : entries) (void)cache_.Store(id, e, self_.peer, now, false);
  ScheduleCacheRefresh(id, record.Expiration());
}

void DhtCore::MarkCacheRead(const DhtId& id) {
  // Only values this node cached itself have a refresh scheduled (and so an entry); values
  // others pushed into the cache must not grow the map.
  auto it = cache_read_.find(id);
  if (it != cache_read_.end()) it->second.read = true;
}

void DhtCore::ScheduleCacheRefresh(const DhtId& id, double expiration) {
  const double delay = expiration - options_.cache_refresh_before_seconds - Wall();
  if (!(delay > 0)) {
    cache_read_.erase(id);
    return;
  }
  const uint64_t generation = ++cache_generation_;
  cache_read_[id] = {.read = false, .generation = generation};
  auto weak = weak_from_this();
  env_.Schedule(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(delay)),
                [weak, id, generation] {
                  auto self = weak.lock();
                  if (!self || self->stopped_) return;
                  auto read = self->cache_read_.find(id);
                  if (read == self->cache_read_.end() || read->second.generation != generation) {
                    return;  // a later caching owns the entry now
                  }
                  const std::string* key = self->cache_.KeyOf(id);
                  if (!read->second.read || key == nullptr) {
                    self->cache_read_.erase(read);
                    return;
                  }
                  // Someone used this cached value: fetch a fresh copy before it expires.
                  std::string k = *key;
                  self->StartLookup({.target = id, .key = k}, [weak, id, k](Lookup& l) {
                    auto me = weak.lock();
                    if (!me || me->stopped_ || !l.found) return;
                    me->CacheLocally(id, k, *l.found);
                  });
                });
}

// ---------------------------------------------------------------------------------------------
// Serving

Status DhtCore::Admit(const PeerId& from, const std::string& source) {
  if (options_.client_mode) {
    return Unavailable("this DHT node is in client mode and serves no requests");
  }
  if (stopped_) return Unavailable("this DHT node is shutting down");
  if (!TakeToken(rate_, from, options_.max_requests_per_second)) {
    ++stats_.requests_refused;
    return ResourceExhausted("too many DHT requests; slow down");
  }
  if (!source.empty() &&
      !TakeToken(source_rate_, source, options_.max_requests_per_second_per_source)) {
    ++stats_.requests_refused;
    return ResourceExhausted(
        fmt::format("too many DHT requests from address {}; slow down", source));
  }
  ++stats_.requests_served;
  return Status::Ok();
}

Result<PingResponse> DhtCore::HandlePing(const PeerId& from, const PingRequest& request,
                                         const std::string& source) {
  COLONY_RETURN_IF_ERROR(Admit(from, source));
  const double skew = request.wall_time - Wall();
  if (!std::isfinite(skew) || std::abs(skew) > options_.max_clock_skew_seconds + 1.0) {
    return FailedPrecondition(
        fmt::format("your clock differs from this node's by {:.1f} s (at most {:.1f} s allowed); "
                    "synchronize clocks (NTP)",
                    skew, options_.max_clock_skew_seconds));
  }
  NoteSender(from, request.sender);
  return PingResponse{self_.peer, Wall(), options_.client_mode};
}

Result<StoreResponse> DhtCore::HandleStore(const PeerId& from, const StoreRequest& request,
                                           const std::string& source) {
  COLONY_RETURN_IF_ERROR(Admit(from, source));
  NoteSender(from, request.sender);
  StoreResponse response;
  const double now = Wall();
  bool refused = false;  // an item was malformed or forged: the rest are not examined
  for (const StoreRequestItem& ri : request.items) {
    const StoreItem& item = ri.item;
    if (refused) {
      response.results.push_back(
          Status(StatusCode::kAborted,
                 "not examined: an earlier item of this store was malformed or forged"));
      continue;
    }
    Status st = CheckItem(item, options_.storage, now);
    if (st.ok()) {
      st = validators_.ValidateAndStrip({item.key, item.subkey, item.value, item.expiration})
               .status();
    }
    refused = !st.ok();
    if (st.ok()) {
      const DhtId id = DhtId::ForKey(item.key);
      if (ri.in_cache) {
        if (storage_.Get(id, now) == nullptr) {
          st = cache_.Store(id, item, from, now, true, source);
        }
      } else {
        st = storage_.Store(id, item, from, now, true, source);
      }
    }
    response.results.push_back(std::move(st));
  }
  return response;
}

Result<FindResponse> DhtCore::HandleFind(const PeerId& from, const FindRequest& request,
                                         const std::string& source) {
  COLONY_RETURN_IF_ERROR(Admit(from, source));
  NoteSender(from, request.sender);
  FindResponse response;
  for (const DhtId& id : request.ids) {
    FindResult result;
    bool from_cache = false;
    result.record = LocalRecord(id, &from_cache);
    if (from_cache) MarkCacheRead(id);
    result.nearest = routing_.Nearest(id, options_.bucket_size, &from);
    response.results.push_back(std::move(result));
  }
  return response;
}

void DhtCore::Shutdown() {
  stopped_ = true;
  auto gets = std::move(gets_in_flight_);
  gets_in_flight_.clear();
  for (auto& [_, op] : gets) {
    for (auto& w : op->waiters) w(Closed("DHT node is shut down"));
    op->waiters.clear();
  }
}

}  // namespace colony::dht
