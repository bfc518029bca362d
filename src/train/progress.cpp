#include "train/progress.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/log.h"
#include "dht/validation.h"

namespace colony::train {

dht::KeyFamily RunsFamily() {
  return {.name = "training run announcements",
          .matches = [](std::string_view key) { return key == kRunsKey; },
          .check = [](std::string_view, const PeerId&, std::string_view value) -> Status {
            return ParseRunAnnouncement(value).status();
          }};
}

dht::KeyFamily ProgressFamily() {
  constexpr std::string_view kSuffix = ".progress";
  return {
      .name = "training progress records",
      .matches =
          [kSuffix](std::string_view key) {
            return key.size() > kSuffix.size() && key.ends_with(kSuffix);
          },
      .check = [](std::string_view, const PeerId& owner,
                  std::string_view value) { return ParseProgressRecord(owner, value).status(); }};
}

namespace {

using Clock = std::chrono::steady_clock;

// A peer's report period is at most this long for extrapolation (a batch that takes longer is
// extrapolated as if it reported every 10 minutes).
constexpr double kMaxReportPeriodSeconds = 600;
// A peer missing rounds it claimed samples for is set aside for 1, 2, 4, ... 64 epochs.
constexpr int kMaxNoShowStrikes = 7;

// The least spacing of a peer's reports and fetches: this, plus kPollSpacingPerPeer for every
// live peer, so that the nodes holding the progress key serve about a thousand requests a second
// however large the swarm (and each peer stays under the DHT's per-peer request limit).
constexpr auto kMinPollSpacing = std::chrono::milliseconds(10);
constexpr auto kPollSpacingPerPeer = std::chrono::milliseconds(1);

double Seconds(std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

class ProgressTracker::Impl {
 public:
  Impl(dht::Node& node, ProgressOptions options)
      : node_(node), options_(std::move(options)), key_(options_.run_id + ".progress") {
    self_.peer = node_.peer_id();
    self_.client = options_.client;
    self_.aux = options_.aux;
    self_.version = COLONY_VERSION_STRING;
    self_.phase = options_.aux ? Phase::kWait : Phase::kIdle;
    self_.time = dht::Now();
    last_seen_others_ = Clock::now();
    thread_ = std::thread([this] { Run(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // Withdraw: a record that expires now (newer than our last one) replaces it everywhere.
    PeerProgress gone = self_;
    gone.time = dht::Now();
    Status st = node_.StoreSync(key_, EncodeProgressRecord(gone), dht::Now() + 0.5,
                                dht::OwnerMarker(node_.peer_id()));
    (void)st;  // best effort: the record expires by itself anyway
  }

  void Report(const LocalProgress& r) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      const bool urgent = r.epoch != self_.epoch || r.phase != self_.phase;
      // Starting (or resuming) to compute: look at the swarm at once, others may have started
      // just before.
      if (self_.phase != Phase::kTrain && r.phase == Phase::kTrain) fetch_now_ = true;
      // Wake the thread when there is news to publish: at once for a new epoch or phase,
      // otherwise at most every min_refresh (it sleeps until the next keepalive when nothing
      // changed).
      wake = urgent || !dirty_;
      self_.epoch = r.epoch;
      self_.samples = options_.aux ? 0 : r.samples;
      self_.samples_per_second = r.samples_per_second;
      if (r.batch > 0) self_.batch = r.batch;
      self_.phase = r.phase;
      if (std::isfinite(r.loss)) self_.loss = r.loss;
      if (r.round.epoch >= 0) self_.round = r.round;
      self_.time = dht::Now();
      dirty_ = true;
      if (urgent) publish_now_ = true;
      if (wake) wake_ = true;
    }
    if (wake) cv_.notify_all();
  }

  GlobalProgress Global() const {
    std::lock_guard lock(mu_);
    return Merge();
  }

  void NoteRoundEnd(int64_t epoch, const std::vector<std::pair<PeerId, double>>& members) {
    std::lock_guard lock(mu_);
    const double now = dht::Now();
    for (const auto& [peer, sps] : members) {
      if (peer == self_.peer) continue;
      auto it = others_.find(peer);
      if (it != others_.end() && it->second.p.epoch >= epoch) continue;  // a newer report already
      Seen s;
      s.p.peer = peer;
      s.p.epoch = epoch;
      s.p.samples = 0;
      s.p.samples_per_second = sps;
      s.p.time = now;
      s.p.phase = Phase::kTrain;
      if (it != others_.end()) {
        s.p.client = it->second.p.client;
        s.p.aux = it->second.p.aux;
        s.p.batch = it->second.p.batch;
        if (s.p.aux) s.p.phase = Phase::kWait;
      }
      s.at = now;
      s.fetched_at = now;
      s.expiration = it != others_.end() ? std::max(it->second.expiration, now)
                                         : now + options_.record_ttl_seconds;
      s.noted = true;
      others_[peer] = s;
    }
  }

  void NoteRound(int64_t epoch, const std::vector<PeerId>& members) {
    std::lock_guard lock(mu_);
    const std::set<PeerId> came(members.begin(), members.end());
    for (const PeerId& peer : came) no_shows_.erase(peer);
    for (const auto& [peer, s] : others_) {
      const PeerProgress& p = s.p;
      if (came.count(peer) > 0 || s.noted || p.epoch != epoch || p.aux || p.phase == Phase::kLoad ||
          p.phase == Phase::kIdle) {
        continue;
      }
      if (p.samples <= 0 && p.phase != Phase::kWait && p.phase != Phase::kRound) continue;
      NoShow& n = no_shows_[peer];
      n.strikes = std::min(n.strikes + 1, kMaxNoShowStrikes);
      n.until_epoch = epoch + (int64_t{1} << (n.strikes - 1));
      COLONY_LOG_INFO(
          "progress: peer {} reported {} samples at epoch {} and did not take part in its round; "
          "its records count for nothing until epoch {} ends",
          peer.ToString(), p.samples, epoch, n.until_epoch);
    }
  }

  void Ignore(const PeerId& peer) {
    std::lock_guard lock(mu_);
    if (ignored_.size() < kMaxIgnored) ignored_.insert(peer);
    no_shows_.erase(peer);
  }

  void DistrustEpochsFrom(int64_t epoch, std::chrono::milliseconds period) {
    std::lock_guard lock(mu_);
    distrusted_from_ = epoch;
    distrust_until_ = Clock::now() + period;
  }

  std::chrono::milliseconds PollSpacingMs() const {
    std::lock_guard lock(mu_);
    return std::chrono::duration_cast<std::chrono::milliseconds>(PollSpacing());
  }

  GlobalProgress Refresh(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    const uint64_t want = fetches_ + 1;
    // The fetch in flight may have started before the call: wait for the one after it.
    const uint64_t target = fetch_running_ ? want + 1 : want;
    fetch_now_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, timeout, [&] { return fetches_ >= target || stop_; });
    return Merge();
  }

 private:
  // Another peer's record as this peer knows it.
  struct Seen {
    PeerProgress p;
    double at = 0;          // when it reported, on this peer's clock (skew bounded by fetches)
    double fetched_at = 0;  // when this peer last read it (or learnt it from a round)
    double expiration = 0;  // of its DHT record: it is forgotten then
    bool noted = false;     // from NoteRoundEnd, not yet confirmed by a record
  };
  // A peer that did not come to rounds it claimed samples for (NoteRound).
  struct NoShow {
    int strikes = 0;           // such rounds since it was last seen in one
    int64_t until_epoch = -1;  // its records count for nothing through this epoch
  };
  struct Fetched {
    PeerProgress p;
    double expiration = 0;
  };

  // Called with mu_ held: the last fetched view plus this peer's exact report.
  GlobalProgress Merge() const {
    GlobalProgress g;
    g.target_batch_size = options_.target_batch_size;
    g.fetched_at = fetched_at_;
    g.own_samples_per_second = self_.samples_per_second;
    g.own_batch = self_.batch;
    const double now = dht::Now();
    const double min_period = Seconds(options_.min_refresh);
    // The epoch: the newest any live peer trains at (loading peers announce the epoch they are
    // joining; they do not move the swarm).
    // Auxiliary peers follow the epoch rather than lead it, and epochs that no donor could
    // serve are set aside for a while (DistrustEpochsFrom).
    bool any = false;
    auto consider = [&](const PeerProgress& p) {
      if (p.phase == Phase::kLoad || p.aux) return;
      if (p.peer != self_.peer && Distrusted(p.epoch)) return;
      g.epoch = any ? std::max(g.epoch, p.epoch) : p.epoch;
      any = true;
    };
    consider(self_);
    for (const auto& [peer, s] : others_) {
      if (s.expiration >= now && ignored_.count(peer) == 0) consider(s.p);
    }
    if (!any) g.epoch = self_.epoch;

    // Peers that did not come to a round they claimed samples for are set aside (NoteRound).
    auto set_aside = [&](const PeerId& peer) {
      if (ignored_.count(peer) > 0) return true;
      auto it = no_shows_.find(peer);
      return it != no_shows_.end() && g.epoch <= it->second.until_epoch;
    };
    g.peers.reserve(others_.size() + 1);
    // A report counts for at most the target (sums of untrusted counts cannot overflow).
    const int64_t cap = g.target_batch_size;
    auto count = [&](const PeerProgress& p, bool stalled) {
      ++g.num_peers;
      if (p.client) ++g.num_clients;
      if (!p.aux) g.samples_per_second += p.samples_per_second;
      if (p.epoch != g.epoch) return;
      ++g.num_peers_at_epoch;
      if (p.aux || stalled) return;
      g.samples_reported += std::min(p.samples, cap);
      g.samples_expected += std::min(p.samples, cap);
      g.samples_per_second_at_epoch += p.samples_per_second;
    };
    count(self_, false);
    g.peers.push_back(self_);
    for (const auto& [peer, s] : others_) {
      const PeerProgress& p = s.p;
      if (s.expiration < now || set_aside(peer)) continue;
      g.peers.push_back(p);
      if (p.epoch != g.epoch || p.aux || p.phase != Phase::kTrain) {
        count(p, false);
        if (p.epoch == g.epoch && p.phase == Phase::kRound) g.round_started = true;
        continue;
      }
      // A peer that computes is extrapolated from its rate (this peer's own while it has none
      // yet: it just started), over at most twice its report period past this peer's last read.
      // A peer whose report was overdue when last read stalled, paused or died: neither its
      // samples nor its growth count (if it died they will not be in the round; if it only
      // paused the swarm computes a little more), but it is still expected in the round.
      const double rate =
          p.samples_per_second > 0 ? p.samples_per_second : self_.samples_per_second;
      double period = min_period;
      if (p.batch > 0 && rate > 0) {
        period = std::max(period,
                          std::min(static_cast<double>(p.batch) / rate, kMaxReportPeriodSeconds));
      }
      const double horizon = 2 * period;
      const bool stalled = s.fetched_at - s.at > 2 * horizon;
      count(p, stalled);
      if (stalled) continue;
      // DecideEpoch shares a shortfall by these rates: count a new peer at the assumed one.
      if (p.samples_per_second <= 0) g.samples_per_second_at_epoch += rate;
      ++g.num_growing_at_epoch;
      const double age = std::max(0.0, now - s.at);
      const double growth = rate * std::min(age, horizon + std::max(0.0, now - s.fetched_at));
      g.samples_expected += static_cast<int64_t>(std::min(growth, static_cast<double>(cap)));
    }
    // The ETA counts the peers at the epoch only: those behind add nothing to it.
    const int64_t left = std::max<int64_t>(0, g.target_batch_size - g.samples_expected);
    const double rate = g.samples_per_second_at_epoch;
    g.eta_seconds = left == 0  ? 0
                    : rate > 0 ? static_cast<double>(left) / rate
                               : std::numeric_limits<double>::infinity();
    return g;
  }

  // Called with mu_ held: folds a fetch (records read between fetch_start and fetch_end, both on
  // this peer's wall clock) into others_.
  void Absorb(std::vector<Fetched> fetched, double fetch_start, double fetch_end) {
    std::map<PeerId, Seen> next;
    for (auto& [p, expiration] : fetched) {
      if (p.peer == self_.peer) continue;
      Seen s;
      s.expiration = expiration;
      auto it = others_.find(p.peer);
      if (it != others_.end() && it->second.noted && it->second.p.epoch > p.epoch) {
        next[p.peer] = it->second;  // the round's end is newer than its last record
        next[p.peer].fetched_at = fetch_end;
        next[p.peer].expiration = expiration;
        continue;
      }
      s.fetched_at = fetch_end;
      if (it != others_.end() && !it->second.noted && it->second.p.time == p.time) {
        s.at = it->second.at;  // the same report as before
      } else {
        // A report not seen before was published after the previous fetch began (at least
        // roughly) and before this one ended: that bounds the effect of clock skew.
        const double lower = previous_fetch_start_ > 0 ? previous_fetch_start_
                                                       : fetch_end - options_.record_ttl_seconds;
        s.at = std::clamp(p.time, lower, fetch_end);
      }
      s.p = p;
      next[s.p.peer] = s;
    }
    others_ = std::move(next);
    previous_fetch_start_ = fetch_start;
    // Bounded by the live records: a set-aside peer is forgotten with its record (coming back
    // later is no different from a new identity's coming).
    std::erase_if(no_shows_, [&](const auto& kv) { return others_.count(kv.first) == 0; });
  }

  void Run() {
    Clock::time_point last_publish{}, last_fetch{}, last_run_announce{};
    std::unique_lock lock(mu_);
    while (!stop_) {
      // Due times follow the view: as the swarm nears the target, reports and fetches come
      // closer together (ReportGap, FetchGap).
      const auto now = Clock::now();
      const auto half = HalfEta();  // one merge of the view per pass
      const auto publish_due = last_publish + ReportGap(half);
      const auto keepalive_due = last_publish + Keepalive();
      const auto fetch_due = last_fetch + FetchGap(half);
      const bool publish = publish_now_ || (dirty_ && now >= publish_due) || now >= keepalive_due;
      const bool fetch = fetch_now_ || now >= fetch_due;
      if (!publish && !fetch) {
        // Woken early by reports; at least every min_refresh to follow the view.
        const auto wake =
            std::min({fetch_due, dirty_ ? publish_due : keepalive_due, now + options_.min_refresh});
        wake_ = false;
        cv_.wait_until(lock, wake, [&] { return stop_ || publish_now_ || fetch_now_ || wake_; });
        continue;
      }
      if (publish) {
        PeerProgress p = self_;
        publish_now_ = false;
        dirty_ = false;
        lock.unlock();
        const double expiration = dht::Now() + options_.record_ttl_seconds;
        std::vector<dht::StoreItem> items = {{.key = key_,
                                              .subkey = dht::OwnerMarker(node_.peer_id()),
                                              .value = EncodeProgressRecord(p),
                                              .expiration = expiration}};
        // The run's entry in the swarm's list of runs (what monitors show), at keepalive pace.
        if (Clock::now() >= last_run_announce + Keepalive()) {
          items.push_back(
              {.key = std::string(kRunsKey),
               .subkey = dht::OwnerMarker(node_.peer_id()),
               .value = EncodeRunAnnouncement(
                   {.run = options_.run_id, .target_batch_size = options_.target_batch_size}),
               .expiration = expiration});
          last_run_announce = Clock::now();
        }
        for (const Status& st : node_.StoreManySync(std::move(items))) {
          if (!st.ok()) {
            COLONY_LOG_DEBUG("progress: publishing under {} failed: {}", key_, st.ToString());
          }
        }
        lock.lock();
        last_publish = Clock::now();
      }
      if (fetch) {
        fetch_now_ = false;
        fetch_running_ = true;
        lock.unlock();
        MaybeRejoin();
        const double fetch_start = dht::Now();
        auto record = node_.GetSync(key_, dht::Freshness::kLatest);
        const double fetch_end = dht::Now();
        std::vector<Fetched> peers;
        if (record.ok() && record->is_dict) {
          for (const auto& [subkey, entry] : record->subkeys) {
            auto peer = dht::ParseOwnerMarker(subkey);
            if (!peer || entry.expiration < fetch_end) continue;
            auto p = ParseProgressRecord(*peer, entry.value);
            if (!p.ok()) {
              COLONY_LOG_DEBUG("progress: ignoring {}'s record: {}", peer->ToString(),
                               p.status().ToString());
              continue;
            }
            peers.push_back({*p, entry.expiration});
          }
        }
        lock.lock();
        fetch_running_ = false;
        if (record.ok()) {
          Absorb(std::move(peers), fetch_start, fetch_end);
        } else {
          // A failed lookup (NotFound included: this peer's own record is there) says nothing
          // about the others: keep what is known until it expires.
          std::erase_if(others_, [&](const auto& kv) { return kv.second.expiration < fetch_end; });
          COLONY_LOG_DEBUG("progress: fetching {} failed: {}", key_, record.status().ToString());
        }
        if (!others_.empty()) last_seen_others_ = Clock::now();
        fetched_at_ = fetch_end;
        ++fetches_;
        last_fetch = Clock::now();
        cv_.notify_all();
      }
    }
  }

  // Called without mu_: a peer that has seen nobody for rejoin_after bootstraps its node again.
  void MaybeRejoin() {
    Clock::time_point since;
    {
      std::lock_guard lock(mu_);
      since = last_seen_others_;
    }
    if (options_.rejoin_after.count() <= 0 || Clock::now() - since < options_.rejoin_after) return;
    auto r = node_.Rejoin();
    if (r.ok()) {
      COLONY_LOG_INFO(
          "progress: no peer of run '{}' seen for {:.0f} s; bootstrapped the DHT "
          "again ({} peers known)",
          options_.run_id, Seconds(options_.rejoin_after), *r);
    } else if (r.status().code() != StatusCode::kFailedPrecondition) {
      COLONY_LOG_WARN(
          "progress: no peer of run '{}' seen for {:.0f} s, and bootstrapping the DHT "
          "again failed: {}",
          options_.run_id, Seconds(options_.rejoin_after), r.status().ToString());
    }
    std::lock_guard lock(mu_);
    last_seen_others_ = Clock::now();  // try again after another rejoin_after
  }

  // Called with mu_ held.
  bool Distrusted(int64_t epoch) const {
    return epoch >= distrusted_from_ && Clock::now() < distrust_until_;
  }

  // Called with mu_ held. Half the time the swarm needs to reach the target; nullopt while its
  // throughput is unknown.
  std::optional<Clock::duration> HalfEta() const {
    const double eta = Merge().eta_seconds;
    if (!std::isfinite(eta)) return std::nullopt;
    return std::chrono::microseconds(static_cast<int64_t>(std::min(eta, 1e6) / 2 * 1e6));
  }

  // Called with mu_ held.
  Clock::duration PollSpacing() const {
    return kMinPollSpacing + kPollSpacingPerPeer * static_cast<int64_t>(others_.size() + 1);
  }

  // Called with mu_ held, with `half` = HalfEta(): the time between this peer's reports while it
  // computes: a quarter of the time the swarm needs to reach the target, within [PollSpacing(),
  // min_refresh]. An epoch that is short against min_refresh is then reported several times by
  // every peer; a long one costs no more traffic than min_refresh allows.
  Clock::duration ReportGap(const std::optional<Clock::duration>& half) const {
    if (!options_.follow_target || self_.phase != Phase::kTrain || self_.aux || !half) {
      return options_.min_refresh;
    }
    return std::clamp<Clock::duration>(
        *half / 2, std::min<Clock::duration>(PollSpacing(), options_.min_refresh),
        options_.min_refresh);
  }

  // Called with mu_ held, with `half` = HalfEta(): the time between fetches. While this peer
  // computes, a quarter of the
  // time the swarm needs to reach the target (so that an underestimate corrects itself well
  // before the target), at least PollSpacing(); otherwise half of it, at least min_refresh (a
  // waiting peer polls by itself). At most max_refresh; min_refresh while the swarm's
  // throughput is unknown.
  Clock::duration FetchGap(const std::optional<Clock::duration>& half) const {
    if (!half) return options_.min_refresh;
    if (options_.follow_target && self_.phase == Phase::kTrain && !self_.aux) {
      return std::clamp<Clock::duration>(
          *half / 2, std::min<Clock::duration>(PollSpacing(), options_.min_refresh),
          options_.max_refresh);
    }
    return std::clamp<Clock::duration>(*half, options_.min_refresh, options_.max_refresh);
  }

  Clock::duration Keepalive() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options_.record_ttl_seconds * 1000 / 3));
  }

  dht::Node& node_;
  const ProgressOptions options_;
  const std::string key_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  PeerProgress self_;
  std::map<PeerId, Seen> others_;
  std::map<PeerId, NoShow> no_shows_;
  static constexpr size_t kMaxIgnored = 4096;
  std::set<PeerId> ignored_;  // banned by verification (Ignore)
  double fetched_at_ = 0;
  double previous_fetch_start_ = 0;
  Clock::time_point last_seen_others_;
  int64_t distrusted_from_ = 0;
  Clock::time_point distrust_until_{};
  uint64_t fetches_ = 0;
  bool fetch_running_ = false;
  bool dirty_ = true;
  bool publish_now_ = true;
  bool fetch_now_ = true;
  bool wake_ = false;
  bool stop_ = false;
  std::thread thread_;
};

Result<std::unique_ptr<ProgressTracker>> ProgressTracker::Create(dht::Node& node,
                                                                 ProgressOptions options) {
  if (options.run_id.empty()) return InvalidArgument("progress tracking needs a run id");
  if (options.target_batch_size <= 0) {
    return InvalidArgument("the target batch size must be positive");
  }
  if (options.min_refresh.count() <= 0 || options.max_refresh < options.min_refresh ||
      !(options.record_ttl_seconds >= 1) || options.rejoin_after.count() < 0) {
    return InvalidArgument("progress refresh periods, record TTL or rejoin period are invalid");
  }
  return std::unique_ptr<ProgressTracker>(
      new ProgressTracker(std::make_unique<Impl>(node, std::move(options))));
}

ProgressTracker::ProgressTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProgressTracker::~ProgressTracker() = default;

void ProgressTracker::Report(const LocalProgress& progress) { impl_->Report(progress); }
GlobalProgress ProgressTracker::Global() const { return impl_->Global(); }
GlobalProgress ProgressTracker::Refresh(std::chrono::milliseconds timeout) {
  return impl_->Refresh(timeout);
}
std::chrono::milliseconds ProgressTracker::PollSpacing() const { return impl_->PollSpacingMs(); }
void ProgressTracker::DistrustEpochsFrom(int64_t epoch, std::chrono::milliseconds period) {
  impl_->DistrustEpochsFrom(epoch, period);
}
void ProgressTracker::NoteRound(int64_t epoch, const std::vector<PeerId>& members) {
  impl_->NoteRound(epoch, members);
}
void ProgressTracker::Ignore(const PeerId& peer) { impl_->Ignore(peer); }
void ProgressTracker::NoteRoundEnd(int64_t epoch,
                                   const std::vector<std::pair<PeerId, double>>& members) {
  impl_->NoteRoundEnd(epoch, members);
}

}  // namespace colony::train
