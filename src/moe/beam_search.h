// Finding the best live experts for an input (Learning@home's beam search over the expert grid).
//
// A gating network scores every coordinate of every grid dimension; an expert's score is the sum
// of its coordinates' scores. The search walks the DHT's prefix records ("ffn.4." lists the live
// coordinates that follow it) best first: each candidate prefix is ranked by an upper bound on
// the score of any expert below it (its coordinates' scores plus the best score of each remaining
// dimension), each round fetches the `k` best unexplored prefixes of every input together, and
// an expert is final once nothing unexplored can beat it. So the answer is exactly the top k of
// an exhaustive search over the live experts, usually in as many rounds as the grid has
// dimensions (hivemind's beam search keeps k prefixes per dimension and can miss the best).
//
//   moe::BeamSearcher search(node, "ffn", {16, 16});
//   auto best = search.FindBestExperts({scores_dim0, scores_dim1}, 4);  // 4 experts, best first
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "moe/discovery.h"

namespace colony::moe {

struct ScoredExpert {
  RemoteExpertInfo expert;
  double score = 0;
  // The DHT keys whose records led the search to it: its prefixes' (and, on a 1-D grid, its own).
  std::vector<std::string> keys = {};
};

// Fetches the owner entries of DHT keys (ExpertKey of ids and prefixes), e.g. FetchEntries.
using EntryFetcher = std::function<std::map<std::string, std::vector<ServerEntry>>(
    const std::vector<std::string>& keys)>;

// The search itself, over any fetcher. `batch_scores[i][d][c]`: input i's score of coordinate c
// in dimension d (grid_size[d] values, finite or -inf, which rules the coordinate out; at least
// one finite per dimension). Returns each input's best min(k, live) experts that no -inf rules
// out, best first, each with at most kMaxServersPerExpert of its servers (ChooseServers by
// `rank`). After `max_rounds` rounds it returns the best experts found so far.
Result<std::vector<std::vector<ScoredExpert>>> SearchBestExperts(
    const std::string& grid_name, const std::vector<int64_t>& grid_size,
    const std::vector<std::vector<std::vector<float>>>& batch_scores, size_t k,
    const EntryFetcher& fetch, size_t max_rounds = 64, const ServerRank& rank = {});

struct BeamSearchOptions {
  // How long a prefix found empty is not asked for again (hivemind: 300 s).
  std::chrono::milliseconds negative_cache{300'000};
  size_t max_negative_cache_entries = 1u << 16;
  // kAnyCopy, as hivemind reads prefixes: the first replica's copy (or this node's), so that a
  // silent replica does not hold every search for the DHT's request timeout (measured: 3.7 s
  // per step of bench_moe with one of 6 DHT nodes stopped, with kLatest). A copy may lag the
  // newest declarations by a refresh.
  dht::Freshness freshness = dht::Freshness::kAnyCopy;
  size_t max_rounds = 64;
  // A server whose call failed is left out of searches this long (hivemind's servers declare
  // with a 60 s expiration, so a dead server's records are gone by then), and the keys that
  // listed it are read again with kLatest: the copy that named it came from one replica or this
  // node's cache and may lack the declarations of live servers.
  std::chrono::milliseconds avoid_failed_for{60'000};
  size_t max_avoided_servers = 4096;
  // Avoiding is a preference: when it leaves an input no expert, a search may include the
  // avoided servers (MayIncludeAvoided) after this long, doubling up to avoid_failed_for while
  // no call answers.
  std::chrono::milliseconds retry_avoided_after{1'000};
};

// The search over a DHT node, with a negative cache of empty prefixes, leaving out the servers
// whose calls failed (Avoid). Thread-safe.
class BeamSearcher {
 public:
  // Grids have 1 to kMaxGridDims dimensions of 1 to 65536 coordinates.
  static Result<std::unique_ptr<BeamSearcher>> Create(dht::Node& node, std::string grid_name,
                                                      std::vector<int64_t> grid_size,
                                                      BeamSearchOptions options = {});

  Result<std::vector<ScoredExpert>> FindBestExperts(
      const std::vector<std::vector<float>>& grid_scores, size_t k);
  // Many inputs at once: each round's DHT lookups are shared by the whole batch.
  // `include_avoided`: the servers Avoid named are not left out.
  Result<std::vector<std::vector<ScoredExpert>>> BatchFindBestExperts(
      const std::vector<std::vector<std::vector<float>>>& batch_scores, size_t k,
      bool include_avoided = false);

  // The servers of an expert whose call failed, and the keys its search result came from (see
  // BeamSearchOptions::avoid_failed_for).
  void Avoid(const std::vector<PeerId>& servers, const std::vector<std::string>& keys);
  // Whether a search may include the avoided servers now, for inputs that found no expert
  // without them (after this side's own network outage, every server it called is avoided):
  // some server is avoided and retry_avoided_after, doubled per such search since an avoided
  // server last answered (Answered), has passed since the last one.
  bool MayIncludeAvoided();
  // These servers answered calls: they are avoided no longer, and if one was, the wait before
  // including avoided servers starts again from retry_avoided_after. Of an expert's servers,
  // results name those that answered latest first (at most max_avoided_servers remembered).
  void Answered(const std::vector<PeerId>& servers);

  const std::vector<int64_t>& grid_size() const { return grid_size_; }

 private:
  BeamSearcher(dht::Node& node, std::string grid_name, std::vector<int64_t> grid_size,
               BeamSearchOptions options);
  std::map<std::string, std::vector<ServerEntry>> Fetch(const std::vector<std::string>& keys,
                                                        bool include_avoided);

  dht::Node& node_;
  std::string grid_name_;
  std::vector<int64_t> grid_size_;
  BeamSearchOptions options_;
  std::mutex mu_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> empty_until_;
  std::map<PeerId, std::chrono::steady_clock::time_point> avoided_until_;
  std::chrono::steady_clock::time_point include_avoided_at_{};
  std::chrono::milliseconds include_avoided_every_;
  // Keys to read with kLatest next time (at most max_negative_cache_entries).
  std::set<std::string> read_again_;
  // When each server last answered, in answers counted by answers_ (ServerRank of results).
  std::map<PeerId, uint64_t> answered_;
  uint64_t answers_ = 0;
};

}  // namespace colony::moe
