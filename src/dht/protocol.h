// The DHT protocol core: Kademlia lookups, replication, caching, validation and abuse limits,
// with no I/O of its own. It runs on one thread, talks to the world through an Environment
// (requests to other nodes, timers, a clock), and is driven either by the runner over `net`
// (dht/node.h) or by the in-memory simulation (dht/simulation.h), which runs thousands of nodes
// deterministically in one process.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/identity.h"
#include "core/status.h"
#include "dht/id.h"
#include "dht/messages.h"
#include "dht/record.h"
#include "dht/routing.h"
#include "dht/validation.h"

namespace colony::dht {

template <typename T>
using Callback = std::function<void(Result<T>)>;

// What the core needs from its surroundings. Every callback must be invoked exactly once, later
// (never from inside the call that received it), on the core's thread; a request that gets no
// answer within `timeout` fails with DeadlineExceeded.
class Environment {
 public:
  virtual ~Environment() = default;
  virtual const Clock& clock() const = 0;
  // `to.peer` may be invalid when only an address is known (bootstrap); the response names the
  // peer that answered.
  virtual void Ping(const Contact& to, PingRequest request, Duration timeout,
                    Callback<PingResponse> done) = 0;
  virtual void Store(const Contact& to, StoreRequest request, Duration timeout,
                     Callback<StoreResponse> done) = 0;
  virtual void Find(const Contact& to, FindRequest request, Duration timeout,
                    Callback<FindResponse> done) = 0;
  virtual void Schedule(Duration delay, std::function<void()> fn) = 0;
  // The address group `peer` is capped under in routing tables (RoutingTable): the source
  // address of the connection it answered on, "" when that address is not capped (loopback),
  // nullopt when no connection to it is open (it is then not added). Default: not capped.
  virtual std::optional<std::string> AddressGroupOf(const PeerId& peer) const {
    (void)peer;
    return std::string();
  }
};

struct DhtOptions {
  size_t bucket_size = 20;  // k
  size_t num_replicas = 5;  // nodes that hold each record
  size_t alpha = 3;         // requests in flight per lookup
  size_t beam_size = 20;    // closest candidates a lookup must have heard from to finish
  // Client mode: stores and gets, serves nothing, stays out of others' routing tables.
  bool client_mode = false;
  Duration request_timeout = std::chrono::seconds(3);
  // A lookup (and so any store or get) ends by this deadline with what it has found so far,
  // however many unresponsive nodes it meets.
  Duration lookup_timeout = std::chrono::seconds(20);
  double max_clock_skew_seconds = 5.0;
  // Caching: keep found values locally, and on the nearest node that lacked them.
  bool cache_locally = true;
  bool cache_on_nearest = true;
  size_t cache_capacity_bytes = 64u << 20;
  // Cached values that were read are fetched again this long before they expire.
  double cache_refresh_before_seconds = 5.0;
  // Unresponsive peers are skipped for backoff_base, doubling per failure up to backoff_max.
  Duration backoff_base = std::chrono::seconds(1);
  Duration backoff_max = std::chrono::seconds(60);
  // Requests served per peer per second (token bucket of twice this size).
  double max_requests_per_second = 500;
  // Requests served per second to all the peers at one source address together (identities
  // are free; a bucket of twice this size).
  double max_requests_per_second_per_source = 2000;
  // Buckets not refreshed for this long are refreshed by a lookup of a random id in them.
  Duration bucket_refresh_interval = std::chrono::minutes(10);
  // Buckets with fewer than k contacts are refreshed more often, and once shortly after
  // joining, so that peers that joined at the same moment find each other.
  Duration sparse_bucket_refresh_interval = std::chrono::minutes(5);
  Duration join_refresh_delay = std::chrono::seconds(2);
  Duration maintenance_interval = std::chrono::seconds(15);
  // Contacts at one address a routing table bucket holds at most (0: no cap): identities are
  // free, addresses are not.
  size_t max_contacts_per_address_per_bucket = 2;
  // A lookup counts at most this many answers from one address (the group AddressGroupOf gives;
  // 0: no cap) and ignores the rest, so that one machine's identities, ground next to a key,
  // cannot fill its nearest slots and answer in turn that nothing is there (an eclipse).
  size_t max_answers_per_address = 2;
  // A lookup stops asking the contacts one peer referred once this many of them failed to
  // answer, and more than twice as many as answered (0: never): a referrer of addresses that
  // never answer cannot run the lookup to its deadline.
  size_t max_failed_referrals = 3;
  // Disjoint lookup paths (S/Kademlia; rust-libp2p's disjoint_query_paths), 1 to 8: a lookup
  // splits the nearest contacts it knows among this many paths, each with its own beam of
  // beam_size and its own alpha requests in flight, and a contact belongs to the first path
  // that hears of it (no peer is asked on two paths). Hostile peers that answer with contacts
  // of their own then capture the paths they are on, not the others, and the lookup's answer
  // merges every path's. Costs up to this many times the requests in a large swarm (a swarm
  // smaller than a beam asks each peer once either way). 1: one beam (Kademlia's lookup).
  size_t disjoint_paths = 3;
  StorageLimits storage;
};
inline constexpr size_t kMaxDisjointPaths = 8;

struct DhtStats {
  uint64_t lookups = 0;
  uint64_t lookup_hops = 0;  // sum over lookups of the rounds to the answer
  uint64_t requests_sent = 0;
  uint64_t requests_failed = 0;
  uint64_t requests_served = 0;
  uint64_t requests_refused = 0;  // rate-limited or malformed
  uint64_t shared_gets = 0;       // gets that joined a lookup already running for their key
  // Contacts kept out of the routing table: their address had its share of their bucket.
  uint64_t contacts_refused_for_address = 0;
  // Contacts and answers a lookup did not take: beyond the k nearest of a reply, answers from an
  // address that had its share of the lookup (max_answers_per_address), or contacts only peers
  // whose referrals failed had named (max_failed_referrals).
  uint64_t candidates_refused = 0;
};

class DhtCore : public std::enable_shared_from_this<DhtCore> {
 public:
  // `self.addrs` are the addresses others may dial (empty in client mode). The key pair signs
  // owner-protected records and must outlive the core.
  static std::shared_ptr<DhtCore> Create(const KeyPair& identity, std::vector<std::string> addrs,
                                         DhtOptions options, Environment& env);

  // Validators beyond the built-in OwnerValidator. Call before Bootstrap.
  void AddValidator(std::shared_ptr<const RecordValidator> validator);

  // Pings the initial peers, refuses those whose clocks differ by more than
  // max_clock_skew_seconds, then looks up our own id (and one random id per farther bucket) to
  // fill the routing table. Fails naming every address and why when none answers usefully.
  // An empty list starts a new swarm.
  void Bootstrap(std::vector<std::string> initial_peers, Callback<size_t> done);

  // Stores each item on the num_replicas nodes nearest to its key (this node among them when it
  // is one of the nearest and not a client). One Status per item: OK when at least one replica
  // accepted it, otherwise the replicas' reason.
  void Store(std::vector<StoreItem> items, std::function<void(std::vector<Status>)> done);
  // Gets each key: the record with signatures stripped, or NotFound (see Freshness).
  void Get(std::vector<std::string> keys, Freshness freshness,
           std::function<void(std::vector<Result<Record>>)> done);
  // Nearest known live nodes to `target` after a network lookup.
  void FindNodes(DhtId target, Callback<std::vector<Contact>> done);
  // Replaces the addresses others may dial, e.g. when a router's public address changed; every
  // request from now on carries them, and a lookup of our own id tells the nearest peers at once:
  // `told` runs when it has ended. No addresses (nobody can dial us any more) turn the node into
  // a client (it serves and stores nothing, and others keep it out of their routing tables);
  // addresses given to a client turn it into a server again (only for a node whose transport
  // serves the DHT's methods, one that started as a server).
  void SetAddresses(std::vector<std::string> addrs, std::function<void()> told);

  // Request handlers (the sender's PeerId is authenticated by the transport; `source` is its
  // address as net::SourceKey names it, "" when exempt, e.g. loopback). Requests are rate
  // limited per sender and per source; a store is charged to both.
  Result<PingResponse> HandlePing(const PeerId& from, const PingRequest& request,
                                  const std::string& source = {});
  Result<StoreResponse> HandleStore(const PeerId& from, const StoreRequest& request,
                                    const std::string& source = {});
  Result<FindResponse> HandleFind(const PeerId& from, const FindRequest& request,
                                  const std::string& source = {});

  // Stops timers and lookups; pending operations fail with Closed. Idempotent.
  void Shutdown();

  const PeerId& peer_id() const { return self_.peer; }
  const DhtId& id() const { return self_.id; }
  const Contact& self() const { return self_; }
  const RoutingTable& routing_table() const { return routing_; }
  const Storage& storage() const { return storage_; }
  const Storage& cache() const { return cache_; }
  const DhtStats& stats() const { return stats_; }
  const DhtOptions& options() const { return options_; }
  // Signs (for owner records naming us) and validates a record as a store would.
  Result<std::string> PrepareValue(const StoreItem& item) const;
  // The value without signatures, after validating it; errors say why it is invalid.
  Result<Record> ValidateAndStrip(const std::string& key, const Record& record) const;

 private:
  struct Lookup;
  struct GetOp;
  struct StoreOp;
  friend struct Lookup;

  DhtCore(const KeyPair& identity, std::vector<std::string> addrs, DhtOptions options,
          Environment& env);
  double Wall() const { return env_.clock().WallSeconds(); }
  SteadyTime Now() const { return env_.clock().Now(); }
  NodeHeader Header() const;
  void StartMaintenance();
  void Maintain();
  void RefreshBuckets(std::vector<size_t> buckets, std::function<void()> done);
  // Whether a request from `from` at `source` is served at all (client mode, shutdown, rate
  // limits).
  Status Admit(const PeerId& from, const std::string& source);
  void NoteSender(const PeerId& from, const NodeHeader& header);
  // Whether `contact` failed lately at each of its addresses (OnFailure).
  bool BackedOff(const Contact& contact) const;
  // `firsthand`: the contact's addresses are its own (its header) or the one we dialled it at;
  // otherwise another peer referred it, and its addresses never replace those already known
  // (a referrer could point a known contact at addresses where it cannot be reached).
  void OnSuccess(const Contact& contact, bool client_mode, bool firsthand = false);
  // `why`: a busy peer (ResourceExhausted: its rate limits or reply bounds) is backed off like
  // any other, but it answered, so it does not count towards dropping it from the table.
  void OnFailure(const Contact& contact, const Status& why);
  struct LookupSpec {
    DhtId target;
    // Set: also look for this key's value, stopping at the first copy unless `freshness` is
    // kLatest. Unset: only find the nodes nearest to `target`.
    std::optional<std::string> key = std::nullopt;
    Freshness freshness = Freshness::kAnyCopy;
    // Also ask this many random contacts from anywhere in the table, so that a refresh can
    // escape a neighbourhood whose members all lack the same bucket.
    size_t random_probes = 0;
  };
  void StartLookup(LookupSpec spec, std::function<void(Lookup&)> on_done);
  void Step(const std::shared_ptr<Lookup>& lookup);
  void SendFind(const std::shared_ptr<Lookup>& lookup, const Contact& contact, size_t depth);
  void FlushFinds(const PeerId& peer);
  // `first_of_batch`: whether this reply's outcome is counted for the peer (one request carries
  // the ids of several lookups; its failure is one failure).
  void OnFindReply(const std::shared_ptr<Lookup>& lookup, const Contact& contact, size_t depth,
                   Result<FindResponse> reply, bool first_of_batch = true);
  void FinishLookup(const std::shared_ptr<Lookup>& lookup);
  // Takes a find reply's contacts as candidates, within the caps (DhtOptions).
  // A contact new to the lookup joins `path`, the referrer's; one another path holds stays
  // there (the paths are disjoint).
  void AddCandidates(Lookup& l, const PeerId& referrer, std::vector<Contact> contacts, size_t depth,
                     size_t path);
  // Whether `peer`'s answer counts (DhtOptions::max_answers_per_address), grouped by
  // `source_group` (FindResponse), else by where its connection is now.
  bool CountAnswer(Lookup& l, const PeerId& peer, const std::optional<std::string>& source_group);
  static constexpr size_t kMaxReferrers = 8;  // remembered per candidate
  // A contact `referrers` named answered or failed (its state already set: it is not erased).
  // A referrer with at least max_failed_referrals failed and more than twice as many failed as
  // answered is distrusted: the candidates not asked yet that only distrusted peers named are
  // dropped. Erasing is safe here because Environment::Find never completes inline, so no
  // caller up the stack iterates the candidates.
  void CountReferral(Lookup& l, const std::vector<PeerId>& referrers, bool answered);
  void GetOne(std::string key, Freshness freshness, std::function<void(Result<Record>)> done);
  void FinishGet(const std::shared_ptr<GetOp>& op, Lookup& lookup);
  // Drops finished and destroyed lookups from active_lookups_.
  void PruneLookups();
  std::optional<Record> LocalRecord(const DhtId& id, bool* from_cache);
  // Whether merging `found` into this node's stored copy of `id` would change it (true when it
  // stores none).
  bool AddsToStorage(const DhtId& id, const Record& found);
  void CacheLocally(const DhtId& id, const std::string& key, const Record& record);
  void StoreKey(std::string key, std::vector<StoreItem> items,
                std::function<void(std::vector<Status>)> done);
  void ScheduleCacheRefresh(const DhtId& id, double expiration);
  // Notes that a cached value was read, so that its scheduled refresh fetches it again.
  void MarkCacheRead(const DhtId& id);

  Contact self_;
  DhtOptions options_;
  Environment& env_;
  ValidatorChain validators_;
  RoutingTable routing_;
  Storage storage_;
  Storage cache_;
  DhtStats stats_;
  std::mt19937_64 rng_;
  bool stopped_ = false;
  bool maintenance_started_ = false;
  bool joined_refresh_done_ = false;

  struct Backoff {
    size_t failures = 0;
    SteadyTime until;
    std::vector<std::string> addrs;  // the kMaxBackoffAddrs it failed at last
  };
  static constexpr size_t kMaxBackoffAddrs = 16;
  std::unordered_map<PeerId, Backoff> backoff_;
  struct Bucket {
    double tokens = 0;
    SteadyTime last;
  };
  // Takes a token from `key`'s bucket (refilled at `rate` per second, holding at most twice
  // that); false when it is empty.
  template <typename Key>
  bool TakeToken(std::unordered_map<Key, Bucket>& buckets, const Key& key, double rate);
  std::unordered_map<PeerId, Bucket> rate_;
  std::unordered_map<std::string, Bucket> source_rate_;
  // Gets in flight, so that concurrent gets of one key share one lookup.
  std::map<std::pair<DhtId, Freshness>, std::shared_ptr<GetOp>> gets_in_flight_;
  // Finds queued for a peer during the current event: lookups running at the same time (a
  // get_many, or concurrent gets) share requests, up to kMaxFindIds ids each.
  struct QueuedFind {
    std::shared_ptr<Lookup> lookup;
    size_t depth;
  };
  struct FindBatch {
    Contact contact;
    std::vector<QueuedFind> queued;
  };
  std::unordered_map<PeerId, FindBatch> find_batches_;
  // Lookups in progress: a request to a peer also carries the ids of other lookups that have the
  // peer among their candidates not yet asked (hivemind's joint traversal of many keys).
  std::vector<std::weak_ptr<Lookup>> active_lookups_;
  // Ids this node cached itself: whether they were read since, and the refresh timer that owns
  // the entry (each caching schedules one; an older timer that fires finds another generation
  // and leaves the entry to the newest).
  struct CacheRefresh {
    bool read = false;
    uint64_t generation = 0;
  };
  std::unordered_map<DhtId, CacheRefresh> cache_read_;
  uint64_t cache_generation_ = 0;
};

}  // namespace colony::dht
