// The DHT key families of the averaging layer, for dht::KeyFamilyValidator: matchmaking
// declarations under "<prefix>.0b<bits>", state donors' adverts under "<prefix>.state" and
// the evidence of verification's bans under "<prefix>.bans" (ban_evidence.h). Each
// peer writes only its own entry (owner-signed subkey) and every entry must decode as the
// averager decodes it, so no one can wipe a group's or the donors' key or fill it with junk.
#pragma once

#include <vector>

#include "dht/validation.h"

namespace colony::averaging {

dht::KeyFamily GroupKeyFamily();
dht::KeyFamily StateAdvertFamily();
dht::KeyFamily BanListFamily();
// All of the above.
std::vector<dht::KeyFamily> AveragingKeyFamilies();

}  // namespace colony::averaging
