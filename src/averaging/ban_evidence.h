// Evidence against a reducer that anyone can check without trusting the accuser: the reducer's
// own signed checks (a phase-3 VerifyStatement), whose numbers say that its result was not the
// fixed point of its reduction. An honest reducer's numbers pass on every direction, so a
// signed statement that fails convicts its signer. Members that ban a reducer for this publish
// the statement under "<prefix>.bans" (BanList), and newcomers ban it too (docs/averaging.md,
// "Verification").
//
// An audit's verdict is not such evidence (a third party would need the parameters the audited
// gradient was computed at), so a member that bans after an audit publishes only an accusation:
// the peer's id. Readers ban nobody on it; they audit the accused themselves at their first
// round with it, whatever the round's seed picks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "averaging/verify_math.h"
#include "averaging/wire.h"
#include "core/identity.h"
#include "core/status.h"

namespace colony::averaging {

// The bytes a member signs: a domain tag, the averaging prefix and the statement without its
// signature, canonically encoded.
std::string StatementSigningBytes(std::string_view prefix, const VerifyStatement& statement);
void SignStatement(const KeyPair& key, std::string_view prefix, VerifyStatement& statement);
bool SignedBy(const PeerId& peer, std::string_view prefix, const VerifyStatement& statement);

// Entry `at` of a run's values (its projections on the kDirections directions and its norm).
Projection EntryOf(const RunCheck& run, size_t at);

// Why a checks statement convicts its member as a reducer (its own span's runs, with a weight,
// projections and a norm per contributor, fail CheckFixedPoint for the reduction it names, or
// do not cover its parts from the first with a value per contributor), or an error when it
// does not (no checks of its own span, or checks that pass).
Result<std::string> ReducerConviction(const VerifyStatement& statement);

struct BanEvidence {
  PeerId peer;
  std::string statement;  // the encoded, signed VerifyStatement
};
inline constexpr size_t kMaxBanEvidence = 32;  // per BanList
inline constexpr size_t kMaxAccusations = 32;  // per BanList
// The conviction (ReducerConviction's reason) when the statement decodes, is signed by `peer`
// for `prefix` and convicts it; an error naming what fails otherwise.
Result<std::string> CheckBanEvidence(std::string_view prefix, const BanEvidence& evidence);

// What one peer publishes under "<prefix>.bans".
struct BanList {
  std::vector<BanEvidence> evidence = {};  // convictions anyone can check
  std::vector<PeerId> accused = {};        // banned after an audit: to be audited by readers
};
std::string EncodeBanList(const BanList& bans);
// At most kMaxBanEvidence entries of evidence, each with a valid peer id and a statement within
// kMaxVerifyStatementBytes (the evidence itself is checked by CheckBanEvidence), and at most
// kMaxAccusations valid peer ids.
Result<BanList> DecodeBanList(std::string_view bytes);

}  // namespace colony::averaging
