// Base58 (Bitcoin alphabet), as used by libp2p peer ids and multiaddrs.
#pragma once

#include <string>
#include <string_view>

#include "core/bytes.h"
#include "core/status.h"

namespace colony {

std::string Base58Encode(ByteSpan bytes);
// Rejects characters outside the alphabet (naming the first bad one) and inputs over 256 chars.
Result<Bytes> Base58Decode(std::string_view text);

}  // namespace colony
