// The run's stages: how the model's blocks are cut into pipeline stages. `colony swarm-train init
// --stages N` writes them next to the initial checkpoint (swarm.json), every stage peer reads
// them: a peer hosts exactly one stage, and rebalancing (rebalancing.h) moves peers between these
// stages only, so that a stage that lost every peer is still known (by its blocks) and filled.
//
//   {"stages": [[0, 4], [4, 8]]}      blocks [0, 4) and [4, 8); the stages tile the model
//
//   COLONY_ASSIGN_OR_RETURN(auto layout, swarm::ReadLayout("init", /*num_blocks=*/8));
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::swarm {

inline constexpr std::string_view kLayoutFile = "swarm.json";

struct StageLayout {
  std::vector<std::pair<int64_t, int64_t>> stages;  // [first, last) blocks, in order
  // The index of the stage that is exactly [first, last), or nullopt.
  std::optional<size_t> Find(int64_t first, int64_t last) const;
  std::string ToString() const;  // "0:4,4:8"
};

// `count` stages of (nearly) equal numbers of blocks; InvalidArgument unless 1 <= count <= blocks.
Result<StageLayout> EvenLayout(int64_t num_blocks, int64_t count);
Status WriteLayout(const std::filesystem::path& model_dir, const StageLayout& layout);
// Reads and checks swarm.json: a JSON object with only "stages", whose ranges tile [0,
// num_blocks) in order. NotFound (saying how to write one) when the file is missing.
Result<StageLayout> ReadLayout(const std::filesystem::path& model_dir, int64_t num_blocks);

}  // namespace colony::swarm
