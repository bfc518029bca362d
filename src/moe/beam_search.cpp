#include "moe/beam_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>

namespace colony::moe {
namespace {

constexpr int64_t kMaxSearchGridSize = 1 << 16;
constexpr size_t kMaxK = 4096;

// A cell of the grid the search may still visit: an unexplored prefix (or, on a 1-D grid, an id
// not yet looked up), or a live expert with its servers.
struct Candidate {
  double bound = 0;    // no expert below scores more; an expert's exact score
  double partial = 0;  // the scores of the fixed coordinates
  std::vector<int64_t> coords;
  bool expert = false;
  std::vector<const ServerEntry*> servers = {};
  std::vector<std::string> keys = {};  // the keys fetched on the way here
};

struct ByBound {
  bool operator()(const Candidate& a, const Candidate& b) const { return a.bound < b.bound; }
};

using Frontier = std::priority_queue<Candidate, std::vector<Candidate>, ByBound>;

std::string Text(const std::string& name, const std::vector<int64_t>& coords, bool prefix) {
  ExpertUid uid{.name = name, .coords = coords};
  return prefix ? uid.Prefix(coords.size()) : uid.ToString();
}

ScoredExpert Finish(const std::string& name, const Candidate& c, const ServerRank& rank) {
  ScoredExpert out{
      .expert = {.uid = Text(name, c.coords, false)}, .score = c.bound, .keys = c.keys};
  for (const ServerEntry* s : ChooseServers(c.servers, rank)) {
    out.expert.servers.push_back(s->server);
    out.expert.addrs.push_back(s->entry.addrs);
  }
  return out;
}

// Remembers each of `items` until `until` in `map`, which holds at most `cap` entries (expired
// ones are dropped first when it would overflow; beyond that, the rest is not remembered).
template <typename Map, typename Items>
void RememberUntil(Map& map, const Items& items, std::chrono::steady_clock::time_point now,
                   std::chrono::steady_clock::time_point until, size_t cap) {
  if (map.size() + items.size() > cap) {
    std::erase_if(map, [now](const auto& e) { return e.second <= now; });
  }
  for (const auto& item : items) {
    if (map.size() >= cap) break;
    map[item] = until;
  }
}

}  // namespace

Result<std::vector<std::vector<ScoredExpert>>> SearchBestExperts(
    const std::string& grid_name, const std::vector<int64_t>& grid_size,
    const std::vector<std::vector<std::vector<float>>>& batch_scores, size_t k,
    const EntryFetcher& fetch, size_t max_rounds, const ServerRank& rank) {
  const size_t dims = grid_size.size();
  if (dims == 0 || dims > kMaxGridDims) {
    return InvalidArgument(fmt::format("an expert grid has 1 to {} dimensions", kMaxGridDims));
  }
  for (int64_t n : grid_size) {
    if (n < 1 || n > kMaxSearchGridSize) {
      return InvalidArgument(
          fmt::format("grid dimension of size {} outside [1, {}]", n, kMaxSearchGridSize));
    }
  }
  if (k == 0 || k > kMaxK) return InvalidArgument(fmt::format("k={} outside [1, {}]", k, kMaxK));
  const size_t batch = batch_scores.size();
  // suffix_best[i][d]: the best score input i can add in dimensions d and later.
  std::vector<std::vector<double>> suffix_best(batch, std::vector<double>(dims + 1, 0.0));
  for (size_t i = 0; i < batch; ++i) {
    if (batch_scores[i].size() != dims) {
      return InvalidArgument(fmt::format("input {} scores {} grid dimensions, the grid has {}", i,
                                         batch_scores[i].size(), dims));
    }
    for (size_t d = dims; d-- > 0;) {
      const auto& s = batch_scores[i][d];
      if (static_cast<int64_t>(s.size()) != grid_size[d]) {
        return InvalidArgument(fmt::format("input {} has {} scores for dimension {} of size {}", i,
                                           s.size(), d, grid_size[d]));
      }
      // -inf rules a coordinate out (e.g. grid dropout); NaN and +inf are errors.
      if (!std::all_of(s.begin(), s.end(), [](float v) { return std::isfinite(v) || v < 0; })) {
        return InvalidArgument(
            fmt::format("input {} has a score of NaN or +infinity in dimension {}", i, d));
      }
      const float best = *std::max_element(s.begin(), s.end());
      if (!std::isfinite(best)) {
        return InvalidArgument(
            fmt::format("input {} rules out every coordinate of dimension {}", i, d));
      }
      suffix_best[i][d] = suffix_best[i][d + 1] + best;
    }
  }

  std::vector<Frontier> frontier(batch);
  std::vector<std::vector<ScoredExpert>> results(batch);
  for (size_t i = 0; i < batch; ++i) {
    for (int64_t c = 0; c < grid_size[0]; ++c) {
      const double s = batch_scores[i][0][static_cast<size_t>(c)];
      if (std::isinf(s)) continue;  // ruled out
      frontier[i].push({.bound = s + suffix_best[i][1], .partial = s, .coords = {c}});
    }
  }
  // Entries fetched in earlier rounds stay here: candidates point into them.
  std::map<std::string, std::vector<ServerEntry>> known;
  for (size_t round = 0; round < max_rounds; ++round) {
    std::vector<std::vector<Candidate>> pending(batch);
    std::set<std::string> wanted;
    for (size_t i = 0; i < batch; ++i) {
      std::vector<Candidate> held;  // experts that an explored prefix might still beat
      while (!frontier[i].empty() && results[i].size() < k && pending[i].size() < k) {
        Candidate top = frontier[i].top();
        frontier[i].pop();
        if (!top.expert) {
          const std::string key =
              ExpertKey(Text(grid_name, top.coords, /*prefix=*/top.coords.size() < dims));
          if (!known.contains(key)) wanted.insert(key);
          pending[i].push_back(std::move(top));
        } else if (pending[i].empty()) {
          results[i].push_back(Finish(grid_name, top, rank));
        } else {
          held.push_back(std::move(top));
        }
      }
      for (auto& h : held) frontier[i].push(std::move(h));
    }
    if (std::all_of(pending.begin(), pending.end(), [](const auto& p) { return p.empty(); })) break;
    if (!wanted.empty()) {
      auto fetched = fetch({wanted.begin(), wanted.end()});
      for (const auto& key : wanted) {
        auto it = fetched.find(key);
        known[key] = it == fetched.end() ? std::vector<ServerEntry>{} : std::move(it->second);
      }
    }
    for (size_t i = 0; i < batch; ++i) {
      for (const Candidate& p : pending[i]) {
        const size_t fixed = p.coords.size();
        const std::string key = ExpertKey(Text(grid_name, p.coords, fixed < dims));
        const std::vector<ServerEntry>& entries = known.at(key);
        if (entries.empty()) continue;
        std::vector<std::string> keys = p.keys;
        keys.push_back(key);
        if (fixed == dims) {  // an id of a 1-D grid, now known to be live
          Candidate e = p;
          e.expert = true;
          e.bound = p.partial;
          e.keys = std::move(keys);
          for (const auto& s : entries) e.servers.push_back(&s);
          frontier[i].push(std::move(e));
          continue;
        }
        std::map<int64_t, std::vector<const ServerEntry*>> next;
        for (const auto& s : entries) {
          for (int64_t c : s.entry.next) {
            if (c < grid_size[fixed]) next[c].push_back(&s);
          }
        }
        for (auto& [c, servers] : next) {
          if (std::isinf(batch_scores[i][fixed][static_cast<size_t>(c)])) continue;  // ruled out
          Candidate child{.partial = p.partial + batch_scores[i][fixed][static_cast<size_t>(c)],
                          .coords = p.coords,
                          .keys = keys};
          child.coords.push_back(c);
          if (fixed + 1 == dims) {
            child.expert = true;
            child.bound = child.partial;
            child.servers = std::move(servers);
          } else {
            child.bound = child.partial + suffix_best[i][fixed + 1];
          }
          frontier[i].push(std::move(child));
        }
      }
    }
  }
  // Out of rounds (or done): the best experts found, in order.
  for (size_t i = 0; i < batch; ++i) {
    while (!frontier[i].empty() && results[i].size() < k) {
      if (frontier[i].top().expert) {
        results[i].push_back(Finish(grid_name, frontier[i].top(), rank));
      }
      frontier[i].pop();
    }
  }
  return results;
}

Result<std::unique_ptr<BeamSearcher>> BeamSearcher::Create(dht::Node& node, std::string grid_name,
                                                           std::vector<int64_t> grid_size,
                                                           BeamSearchOptions options) {
  ExpertUid probe{.name = grid_name, .coords = std::vector<int64_t>(grid_size.size(), 0)};
  COLONY_RETURN_IF_ERROR(ParseExpertUid(probe.ToString()).status());
  for (int64_t n : grid_size) {
    if (n < 1 || n > kMaxSearchGridSize) {
      return InvalidArgument(
          fmt::format("grid dimension of size {} outside [1, {}]", n, kMaxSearchGridSize));
    }
  }
  if (options.retry_avoided_after.count() <= 0 ||
      options.retry_avoided_after > options.avoid_failed_for) {
    return InvalidArgument(fmt::format(
        "retry_avoided_after must be positive and at most avoid_failed_for ({} ms); got {} ms",
        options.avoid_failed_for.count(), options.retry_avoided_after.count()));
  }
  return std::unique_ptr<BeamSearcher>(
      new BeamSearcher(node, std::move(grid_name), std::move(grid_size), options));
}

BeamSearcher::BeamSearcher(dht::Node& node, std::string grid_name, std::vector<int64_t> grid_size,
                           BeamSearchOptions options)
    : node_(node),
      grid_name_(std::move(grid_name)),
      grid_size_(std::move(grid_size)),
      options_(options),
      include_avoided_every_(options.retry_avoided_after) {}

std::map<std::string, std::vector<ServerEntry>> BeamSearcher::Fetch(
    const std::vector<std::string>& keys, bool include_avoided) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> ask, ask_latest;
  std::set<PeerId> avoided;
  {
    std::lock_guard lock(mu_);
    std::erase_if(avoided_until_, [now](const auto& a) { return a.second <= now; });
    if (!include_avoided) {
      for (const auto& [server, _] : avoided_until_) avoided.insert(server);
    }
    for (const auto& key : keys) {
      if (read_again_.erase(key) > 0) {
        ask_latest.push_back(key);
        continue;
      }
      auto it = empty_until_.find(key);
      if (it != empty_until_.end() && it->second > now) continue;
      ask.push_back(key);
    }
  }
  std::vector<std::string> absent;
  auto found = FetchEntries(node_, ask, options_.freshness, &absent);
  for (auto& [key, entries] : FetchEntries(node_, ask_latest, dht::Freshness::kLatest, &absent)) {
    found[key] = std::move(entries);
  }
  for (auto& [_, entries] : found) {
    std::erase_if(entries, [&](const ServerEntry& e) { return avoided.contains(e.server); });
  }
  std::lock_guard lock(mu_);
  RememberUntil(empty_until_, absent, now, now + options_.negative_cache,
                options_.max_negative_cache_entries);
  return found;
}

void BeamSearcher::Avoid(const std::vector<PeerId>& servers, const std::vector<std::string>& keys) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  RememberUntil(avoided_until_, servers, now, now + options_.avoid_failed_for,
                options_.max_avoided_servers);
  for (const auto& key : keys) {
    if (read_again_.size() >= options_.max_negative_cache_entries) break;
    read_again_.insert(key);
    empty_until_.erase(key);
  }
}

bool BeamSearcher::MayIncludeAvoided() {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  std::erase_if(avoided_until_, [now](const auto& a) { return a.second <= now; });
  if (avoided_until_.empty() || now < include_avoided_at_) return false;
  include_avoided_at_ = now + include_avoided_every_;
  include_avoided_every_ = std::min(include_avoided_every_ * 2, options_.avoid_failed_for);
  return true;
}

void BeamSearcher::Answered(const std::vector<PeerId>& servers) {
  std::lock_guard lock(mu_);
  for (const PeerId& s : servers) {
    if (answered_.size() >= options_.max_avoided_servers && !answered_.contains(s)) {
      answered_.clear();  // bounded; the servers that answer keep answering
    }
    answered_[s] = ++answers_;
  }
  bool was_avoided = false;
  for (const PeerId& s : servers) was_avoided = avoided_until_.erase(s) > 0 || was_avoided;
  if (!was_avoided) return;
  include_avoided_at_ = {};
  include_avoided_every_ = options_.retry_avoided_after;
}

Result<std::vector<ScoredExpert>> BeamSearcher::FindBestExperts(
    const std::vector<std::vector<float>>& grid_scores, size_t k) {
  COLONY_ASSIGN_OR_RETURN(auto batch, BatchFindBestExperts({grid_scores}, k));
  return std::move(batch.at(0));
}

Result<std::vector<std::vector<ScoredExpert>>> BeamSearcher::BatchFindBestExperts(
    const std::vector<std::vector<std::vector<float>>>& batch_scores, size_t k,
    bool include_avoided) {
  return SearchBestExperts(
      grid_name_, grid_size_, batch_scores, k,
      [this, include_avoided](const std::vector<std::string>& keys) {
        return Fetch(keys, include_avoided);
      },
      options_.max_rounds,
      [this](const PeerId& server) -> uint64_t {
        std::lock_guard lock(mu_);
        auto it = answered_.find(server);
        return it == answered_.end() ? 0 : it->second;
      });
}

}  // namespace colony::moe
