// Bans: peers that verification caught (verify.cpp), refused for the averager's lifetime, and the
// evidence against reducers shared under "<prefix>.bans" (ban_evidence.h), so that newcomers ban
// them too without trusting whoever published it; and the peers banned after audits, published as
// accusations that readers check with audits of their own.
#include <fmt/format.h>

#include "averaging/internal.h"

namespace colony::averaging {

namespace {
std::string BansKey(const std::string& prefix) { return prefix + ".bans"; }
// Evidence examined per reading of the key: each costs a signature check and a pass over a
// statement, and the key may hold entries from many identities.
constexpr size_t kMaxEvidencePerRead = 64;
// Published bans live a day in the DHT (its limit); they are stored again when a step starts
// after this long.
constexpr double kBansTtl = 23 * 3600.0;
// Accused peers held as suspects: each costs at most one audit of ours. Beyond this many,
// further accusations are not followed (the seed's random audits still are).
constexpr size_t kMaxSuspects = 256;
}  // namespace

int Averager::Impl::NoteReducerSilence(const PeerId& peer, bool silent) {
  constexpr size_t kMaxSilentReducers = 4096;
  std::lock_guard lock(ban_mu_);
  if (!silent) {
    silent_rounds_.erase(peer);
    return 0;
  }
  if (silent_rounds_.size() >= kMaxSilentReducers && !silent_rounds_.contains(peer)) return 1;
  return ++silent_rounds_[peer];
}

bool Averager::Impl::IsBanned(const PeerId& peer) const {
  std::lock_guard lock(ban_mu_);
  return banned_.contains(peer);
}

bool Averager::Impl::IsSuspect(const PeerId& peer) const {
  std::lock_guard lock(ban_mu_);
  auto it = suspects_.find(peer);
  return it != suspects_.end() && !it->second;
}

void Averager::Impl::ClearSuspect(const PeerId& peer) {
  std::lock_guard lock(ban_mu_);
  if (auto it = suspects_.find(peer); it != suspects_.end()) it->second = true;
}

void Averager::Impl::Ban(const PeerId& peer, const std::string& reason, std::string evidence,
                         bool accuse) {
  {
    std::lock_guard lock(ban_mu_);
    if (!banned_.emplace(peer, reason).second) return;
  }
  COLONY_LOG_WARN("averaging: banned {}: {}", peer.ToString(), reason);
  // Not only averaging: the whole host refuses it (its DHT calls, downloads, every protocol).
  host_.Block(peer, fmt::format("it was banned from averaging '{}': {}", options_.prefix, reason));
  {
    std::lock_guard lock(ban_mu_);
    if (!evidence.empty()) {
      evidence_.push_back({peer, std::move(evidence)});
      if (evidence_.size() > kMaxBanEvidence) evidence_.erase(evidence_.begin());
    } else if (accuse) {
      accused_.push_back(peer);
      if (accused_.size() > kMaxAccusations) accused_.erase(accused_.begin());
    } else {
      return;
    }
  }
  auto self = shared_from_this();
  ++ban_tasks_;
  asio::co_spawn(
      strand_,
      [self]() -> asio::awaitable<void> {
        co_await self->PublishBans();
        --self->ban_tasks_;
      },
      asio::detached);
}

void Averager::Impl::StartLearningBans() {
  auto self = shared_from_this();
  ++ban_tasks_;
  asio::co_spawn(
      strand_,
      [self]() -> asio::awaitable<void> {
        co_await self->LearnBans();
        if (dht::Now() - self->bans_published_at_ > kBansTtl / 2) co_await self->PublishBans();
        --self->ban_tasks_;
      },
      asio::detached);
}

asio::awaitable<void> Averager::Impl::PublishBans() {
  std::string value;
  {
    std::lock_guard lock(ban_mu_);
    if (evidence_.empty() && accused_.empty()) co_return;
    value = EncodeBanList({.evidence = evidence_, .accused = accused_});
  }
  if (shut_down_) co_return;
  bans_published_at_ = dht::Now();
  std::optional<std::string> subkey = dht::OwnerMarker(host_.peer_id());
  Status st = co_await node_.Store(BansKey(options_.prefix), std::move(value),
                                   dht::Now() + kBansTtl, std::move(subkey));
  if (!st.ok()) COLONY_LOG_WARN("averaging: publishing bans failed: {}", st.ToString());
}

asio::awaitable<void> Averager::Impl::LearnBans() {
  if (learning_bans_ || shut_down_) co_return;
  learning_bans_ = true;
  auto record = co_await node_.Get(BansKey(options_.prefix), dht::Freshness::kLatest);
  std::vector<BanEvidence> candidates;
  std::vector<PeerId> accused;
  if (record.ok() && record->is_dict) {
    const double now = dht::Now();
    for (const auto& [subkey, entry] : record->subkeys) {
      auto accuser = dht::ParseOwnerMarker(subkey);
      if (entry.expiration <= now || !accuser || *accuser == host_.peer_id()) continue;
      auto bans = DecodeBanList(entry.value);
      if (!bans.ok()) continue;
      for (auto& b : bans->evidence) {
        if (candidates.size() < kMaxEvidencePerRead && b.peer != host_.peer_id() &&
            !IsBanned(b.peer)) {
          candidates.push_back(std::move(b));
        }
      }
      // Only a peer that audits can check an accusation; it bans nobody on one.
      if (options_.audit_targets == 0) continue;
      for (const PeerId& peer : bans->accused) {
        if (peer != host_.peer_id()) accused.push_back(peer);
      }
    }
  }
  if (!accused.empty()) {
    std::lock_guard lock(ban_mu_);
    for (const PeerId& peer : accused) {
      if (suspects_.size() >= kMaxSuspects) break;
      if (!banned_.contains(peer)) suspects_.emplace(peer, false);
    }
  }
  // Checked on the compute pool: signature checks do not belong on an I/O thread.
  auto check = [prefix = options_.prefix, candidates = std::move(candidates)]() {
    std::vector<std::pair<PeerId, std::string>> convicted;
    for (const BanEvidence& b : candidates) {
      if (auto why = CheckBanEvidence(prefix, b); why.ok()) convicted.emplace_back(b.peer, *why);
    }
    return convicted;
  };
  auto convicted =
      co_await RunOn<std::vector<std::pair<PeerId, std::string>>>(PoolExecutor(), std::move(check));
  for (const auto& [peer, why] : convicted) {
    Ban(peer, "a published ban carries its own signed checks: " + why);
  }
  learning_bans_ = false;
}

}  // namespace colony::averaging
