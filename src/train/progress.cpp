#include "train/progress.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/log.h"
#include "dht/validation.h"

namespace colony::train {
namespace {

using Clock = std::chrono::steady_clock;

// Sanity bounds for values read from the DHT (anyone in the swarm may write their own record).
constexpr int64_t kMaxEpoch = int64_t{1} << 40;
constexpr int64_t kMaxSamples = int64_t{1} << 50;
constexpr double kMaxSamplesPerSecond = 1e12;
constexpr size_t kMaxRecordBytes = 1024;

}  // namespace

std::string ProgressTracker::EncodeRecord(const PeerProgress& p) {
  nlohmann::json j = {{"epoch", p.epoch},   {"samples", p.samples}, {"sps", p.samples_per_second},
                      {"time", p.time},     {"client", p.client},   {"aux", p.aux},
                      {"round", p.in_round}};
  return j.dump();
}

Result<PeerProgress> ProgressTracker::ParseRecord(const PeerId& peer, std::string_view value) {
  if (value.size() > kMaxRecordBytes) return InvalidArgument("progress record is too large");
  auto j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("progress record is not a JSON object");
  PeerProgress p;
  p.peer = peer;
  auto get_int = [&](const char* name, int64_t max, int64_t& out) -> Status {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer()) {
      return InvalidArgument(fmt::format("progress record lacks integer '{}'", name));
    }
    out = it->get<int64_t>();
    if (out < 0 || out > max) {
      return InvalidArgument(fmt::format("progress record's '{}' is out of range", name));
    }
    return Status::Ok();
  };
  COLONY_RETURN_IF_ERROR(get_int("epoch", kMaxEpoch, p.epoch));
  COLONY_RETURN_IF_ERROR(get_int("samples", kMaxSamples, p.samples));
  auto sps = j.find("sps");
  auto time = j.find("time");
  if (sps == j.end() || !sps->is_number() || time == j.end() || !time->is_number()) {
    return InvalidArgument("progress record lacks 'sps' or 'time'");
  }
  p.samples_per_second = sps->get<double>();
  p.time = time->get<double>();
  if (!std::isfinite(p.samples_per_second) || p.samples_per_second < 0 ||
      p.samples_per_second > kMaxSamplesPerSecond || !std::isfinite(p.time)) {
    return InvalidArgument("progress record's 'sps' or 'time' is out of range");
  }
  auto flag = [&](const char* name) {
    auto it = j.find(name);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  p.client = flag("client");
  p.aux = flag("aux");
  p.in_round = flag("round");
  return p;
}

class ProgressTracker::Impl {
 public:
  Impl(dht::Node& node, ProgressOptions options)
      : node_(node), options_(std::move(options)), key_(options_.run_id + ".progress") {
    self_.peer = node_.peer_id();
    self_.client = options_.client;
    self_.aux = options_.aux;
    self_.time = dht::Now();
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
    Status st = node_.StoreSync(key_, EncodeRecord(gone), dht::Now() + 0.5,
                                dht::OwnerMarker(node_.peer_id()));
    (void)st;  // best effort: the record expires by itself anyway
  }

  void Report(int64_t epoch, int64_t samples, double sps, bool in_round) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      const bool urgent = epoch != self_.epoch || in_round != self_.in_round;
      self_.in_round = in_round;
      // Wake the thread when there is news to publish: at once for a new epoch, otherwise at
      // most every min_refresh (it sleeps until the next keepalive when nothing changed).
      wake = urgent || !dirty_;
      self_.epoch = epoch;
      self_.samples = samples;
      self_.samples_per_second = sps;
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
      auto it = std::find_if(others_.begin(), others_.end(),
                             [&](const PeerProgress& p) { return p.peer == peer; });
      if (it != others_.end() && it->epoch >= epoch) continue;  // a newer report already
      PeerProgress p;
      p.peer = peer;
      p.epoch = epoch;
      p.samples = 0;
      p.samples_per_second = sps;
      p.time = now;
      if (it != others_.end()) {
        p.client = it->client;
        *it = p;
      } else {
        others_.push_back(p);
      }
    }
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
  // Called with mu_ held: the last fetched view plus this peer's exact report.
  GlobalProgress Merge() const {
    GlobalProgress g;
    g.target_batch_size = options_.target_batch_size;
    g.fetched_at = fetched_at_;
    std::vector<PeerProgress> all;
    all.reserve(others_.size() + 1);
    for (const auto& p : others_) {
      if (p.peer != self_.peer) all.push_back(p);
    }
    all.push_back(self_);
    for (const auto& p : all) g.epoch = std::max(g.epoch, p.epoch);
    // Others' counts are extrapolated from their reported rate to now (at most one refresh
    // period, which bounds the effect of clock skew): every peer then sees the target reached at
    // about the same moment without waiting for the others' next reports, which is what keeps
    // the realized batch close to the target when batches are faster than a DHT round trip.
    const double now = dht::Now();
    const double horizon =
        std::min(1.0, 2 * std::chrono::duration<double>(options_.min_refresh).count());
    for (const auto& p : all) {
      ++g.num_peers;
      if (p.client) ++g.num_clients;
      if (!p.aux) g.samples_per_second += p.samples_per_second;
      if (p.epoch == g.epoch) {
        ++g.num_peers_at_epoch;
        if (p.aux) continue;
        double samples = static_cast<double>(p.samples);
        if (p.peer != self_.peer && !p.in_round) {
          samples += p.samples_per_second * std::clamp(now - p.time, 0.0, horizon);
        }
        g.samples_accumulated += static_cast<int64_t>(samples);
      }
    }
    const int64_t left = std::max<int64_t>(0, g.target_batch_size - g.samples_accumulated);
    g.eta_seconds = left == 0                  ? 0
                    : g.samples_per_second > 0 ? static_cast<double>(left) / g.samples_per_second
                                               : std::numeric_limits<double>::infinity();
    g.peers = std::move(all);
    return g;
  }

  void Run() {
    auto next_publish = Clock::now();
    auto next_fetch = Clock::now();
    std::unique_lock lock(mu_);
    while (!stop_) {
      const auto now = Clock::now();
      const bool publish =
          publish_now_ || (dirty_ && now >= next_publish) || now >= next_publish + Keepalive();
      const bool fetch = fetch_now_ || now >= next_fetch;
      if (!publish && !fetch) {
        auto wake = std::min(next_fetch, dirty_ ? next_publish : next_publish + Keepalive());
        wake_ = false;
        cv_.wait_until(lock, wake, [&] { return stop_ || publish_now_ || fetch_now_ || wake_; });
        continue;
      }
      if (publish) {
        PeerProgress p = self_;
        publish_now_ = false;
        dirty_ = false;
        lock.unlock();
        Status st = node_.StoreSync(key_, EncodeRecord(p), dht::Now() + options_.record_ttl_seconds,
                                    dht::OwnerMarker(node_.peer_id()));
        if (!st.ok())
          COLONY_LOG_DEBUG("progress: publishing under {} failed: {}", key_, st.ToString());
        lock.lock();
        next_publish = Clock::now() + options_.min_refresh;
      }
      if (fetch) {
        fetch_now_ = false;
        fetch_running_ = true;
        lock.unlock();
        auto record = node_.GetSync(key_, /*latest=*/true);
        std::vector<PeerProgress> peers;
        if (record.ok() && record->is_dict) {
          const double now_wall = dht::Now();
          for (const auto& [subkey, entry] : record->subkeys) {
            auto peer = dht::ParseOwnerMarker(subkey);
            if (!peer || entry.expiration < now_wall) continue;
            auto p = ParseRecord(*peer, entry.value);
            if (!p.ok()) {
              COLONY_LOG_DEBUG("progress: ignoring {}'s record: {}", peer->ToString(),
                               p.status().ToString());
              continue;
            }
            peers.push_back(std::move(*p));
          }
        }
        lock.lock();
        fetch_running_ = false;
        if (record.ok() || record.status().code() == StatusCode::kNotFound) others_ = peers;
        fetched_at_ = dht::Now();
        ++fetches_;
        const GlobalProgress g = Merge();
        // Until the swarm's throughput is known, look often (peers report within min_refresh).
        const double half_eta = std::isfinite(g.eta_seconds) ? g.eta_seconds / 2 : 0;
        const auto wait = std::clamp(
            std::chrono::milliseconds(static_cast<int64_t>(std::min(half_eta, 1e6) * 1000)),
            options_.min_refresh, options_.max_refresh);
        next_fetch = Clock::now() + wait;
        cv_.notify_all();
      }
    }
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
  std::vector<PeerProgress> others_;
  double fetched_at_ = 0;
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
      !(options.record_ttl_seconds >= 1)) {
    return InvalidArgument("progress refresh periods or record TTL are invalid");
  }
  return std::unique_ptr<ProgressTracker>(
      new ProgressTracker(std::make_unique<Impl>(node, std::move(options))));
}

ProgressTracker::ProgressTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProgressTracker::~ProgressTracker() = default;

void ProgressTracker::Report(int64_t epoch, int64_t samples_accumulated, double samples_per_second,
                             bool in_round) {
  impl_->Report(epoch, samples_accumulated, samples_per_second, in_round);
}
GlobalProgress ProgressTracker::Global() const { return impl_->Global(); }
GlobalProgress ProgressTracker::Refresh(std::chrono::milliseconds timeout) {
  return impl_->Refresh(timeout);
}
void ProgressTracker::NoteRoundEnd(int64_t epoch,
                                   const std::vector<std::pair<PeerId, double>>& members) {
  impl_->NoteRoundEnd(epoch, members);
}
bool ProgressTracker::ReadyToUpdateEpoch(int64_t local_epoch) const {
  const GlobalProgress g = Global();
  return g.epoch > local_epoch || g.samples_accumulated >= g.target_batch_size;
}

}  // namespace colony::train
