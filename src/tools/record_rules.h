// The record rules of every layer, for the DHT nodes the commands start: any node may store
// records for the whole swarm (server records, progress reports, averaging groups, state donors,
// relays), so each one refuses entries that break any layer's rules, not only its own.
#pragma once

#include <memory>

#include "dht/validation.h"

namespace colony::cli {

std::shared_ptr<const dht::RecordValidator> SwarmRecordRules();

}  // namespace colony::cli
