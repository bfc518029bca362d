// Group keys for matchmaking and their Moshpit updates.
//
// Peers that may average together declare themselves under "<prefix>.0b<bits>". With d bits,
// peers fall into 2^d buckets; after each round every member of a group draws its next bits
// from a permutation of the buckets seeded by the group id (the same for all members) and
// indexed by its position in the group, so group mates land in different buckets. With
// N = M^(d+1)... peers in groups of M = 2^d, every new group holds one peer of each old group,
// and the exact global mean is reached in a few rounds (Moshpit SGD).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace colony::averaging {

// Group bits are a string of '0' and '1' of at most 32 characters (possibly empty).
Status CheckGroupBits(std::string_view bits);
std::string GroupKey(std::string_view prefix, std::string_view bits);
// The bits of the next round for the member at `index` of the group `group_id`.
std::string NextGroupBits(std::string_view bits, std::string_view group_id, size_t index);

}  // namespace colony::averaging
