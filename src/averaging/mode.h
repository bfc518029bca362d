// How a peer takes part in averaging (as in hivemind).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace colony::averaging {

enum class Mode : uint8_t {
  kNode = 0,    // sends its data and reduces a span; accepts connections
  kClient = 1,  // sends its data only; never dialed (behind NAT); owns no span, never leads
  kAux = 2,     // reduces a span only (weight 0, no data of its own)
};
std::string_view ModeName(Mode mode);
Result<Mode> ParseMode(std::string_view name);

}  // namespace colony::averaging
