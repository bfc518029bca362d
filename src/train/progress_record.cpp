#include "train/progress_record.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace colony::train {
namespace {

// Sanity bounds for values read from the DHT (anyone in the swarm may write their own record).
constexpr int64_t kMaxEpoch = int64_t{1} << 40;
constexpr int64_t kMaxSamples = int64_t{1} << 50;
constexpr double kMaxSamplesPerSecond = 1e12;
constexpr size_t kMaxRecordBytes = 1024;
constexpr double kMaxLoss = 1e9;

bool IsPrintableName(std::string_view name, size_t max) {
  if (name.empty() || name.size() > max) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127; });
}

bool IsHex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// loss, version and round: optional, checked when present.
Status ParseOptionalFields(const nlohmann::json& j, PeerProgress& p) {
  if (auto it = j.find("loss"); it != j.end()) {
    if (!it->is_number() || !std::isfinite(it->get<double>()) ||
        std::abs(it->get<double>()) > kMaxLoss) {
      return ProtocolError("progress record's 'loss' is not a finite number");
    }
    p.loss = it->get<double>();
  }
  if (auto it = j.find("version"); it != j.end()) {
    if (!it->is_string() || !IsPrintableName(it->get_ref<const std::string&>(), 32)) {
      return ProtocolError("progress record's 'version' is not 1-32 printable characters");
    }
    p.version = it->get<std::string>();
  }
  if (auto it = j.find("round"); it != j.end()) {
    const nlohmann::json& r = *it;
    if (!r.is_object() || r.size() != 4 || !r.contains("epoch") || !r.contains("group") ||
        !r.contains("size") || !r.contains("ok") || !r["epoch"].is_number_integer() ||
        !r["group"].is_string() || !r["size"].is_number_integer() || !r["ok"].is_boolean()) {
      return ProtocolError(
          "progress record's 'round' must be {\"epoch\": int, \"group\": hex, \"size\": int, "
          "\"ok\": bool}");
    }
    p.round.epoch = r["epoch"].get<int64_t>();
    p.round.group = r["group"].get<std::string>();
    p.round.size = r["size"].get<int64_t>();
    p.round.ok = r["ok"].get<bool>();
    if (p.round.epoch < 0 || p.round.epoch > kMaxEpoch || p.round.size < 1 ||
        p.round.size > kMaxReportedGroup || p.round.group.size() > 16 || !IsHex(p.round.group)) {
      return ProtocolError("progress record's 'round' is out of range");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kIdle:
      return "idle";
    case Phase::kTrain:
      return "train";
    case Phase::kWait:
      return "wait";
    case Phase::kRound:
      return "round";
    case Phase::kLoad:
      return "load";
  }
  return "?";
}

std::string EncodeProgressRecord(const PeerProgress& p) {
  nlohmann::json j = {{"epoch", p.epoch},
                      {"samples", p.samples},
                      {"sps", p.samples_per_second},
                      {"batch", p.batch},
                      {"time", p.time},
                      {"client", p.client},
                      {"aux", p.aux},
                      {"phase", PhaseName(p.phase)}};
  if (std::isfinite(p.loss)) j["loss"] = p.loss;
  if (!p.version.empty()) j["version"] = p.version;
  if (p.round.epoch >= 0) {
    j["round"] = {{"epoch", p.round.epoch},
                  {"group", p.round.group},
                  {"size", p.round.size},
                  {"ok", p.round.ok}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<PeerProgress> ParseProgressRecord(const PeerId& peer, std::string_view value) {
  if (value.size() > kMaxRecordBytes) return ProtocolError("progress record is too large");
  auto j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ProtocolError("progress record is not a JSON object");
  for (const auto& [key, unused] : j.items()) {
    static constexpr std::string_view kKnown[] = {"epoch", "samples", "sps",  "batch",
                                                  "time",  "client",  "aux",  "phase",
                                                  "loss",  "version", "round"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return ProtocolError(fmt::format("progress record has an unknown field '{}'", key));
    }
  }
  PeerProgress p;
  p.peer = peer;
  auto get_int = [&](const char* name, int64_t max, int64_t& out) -> Status {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer()) {
      return ProtocolError(fmt::format("progress record lacks integer '{}'", name));
    }
    out = it->get<int64_t>();
    if (out < 0 || out > max) {
      return ProtocolError(fmt::format("progress record's '{}' is out of range", name));
    }
    return Status::Ok();
  };
  COLONY_RETURN_IF_ERROR(get_int("epoch", kMaxEpoch, p.epoch));
  COLONY_RETURN_IF_ERROR(get_int("samples", kMaxSamples, p.samples));
  COLONY_RETURN_IF_ERROR(get_int("batch", kMaxSamples, p.batch));
  auto sps = j.find("sps");
  auto time = j.find("time");
  if (sps == j.end() || !sps->is_number() || time == j.end() || !time->is_number()) {
    return ProtocolError("progress record lacks 'sps' or 'time'");
  }
  p.samples_per_second = sps->get<double>();
  p.time = time->get<double>();
  if (!std::isfinite(p.samples_per_second) || p.samples_per_second < 0 ||
      p.samples_per_second > kMaxSamplesPerSecond || !std::isfinite(p.time)) {
    return ProtocolError("progress record's 'sps' or 'time' is out of range");
  }
  auto flag = [&](const char* name, bool& out) -> Status {
    auto it = j.find(name);
    if (it == j.end() || !it->is_boolean()) {
      return ProtocolError(fmt::format("progress record lacks boolean '{}'", name));
    }
    out = it->get<bool>();
    return Status::Ok();
  };
  COLONY_RETURN_IF_ERROR(flag("client", p.client));
  COLONY_RETURN_IF_ERROR(flag("aux", p.aux));
  auto phase = j.find("phase");
  if (phase == j.end() || !phase->is_string()) {
    return ProtocolError("progress record lacks string 'phase'");
  }
  const auto& name = phase->get_ref<const std::string&>();
  bool known = false;
  for (Phase ph : {Phase::kIdle, Phase::kTrain, Phase::kWait, Phase::kRound, Phase::kLoad}) {
    if (name == PhaseName(ph)) {
      p.phase = ph;
      known = true;
    }
  }
  if (!known) {
    return ProtocolError(
        fmt::format("progress record has an unknown phase '{}'", name.substr(0, 32)));
  }
  if (p.aux && p.samples != 0) return ProtocolError("an auxiliary peer reports no samples");
  COLONY_RETURN_IF_ERROR(ParseOptionalFields(j, p));
  return p;
}

std::string EncodeRunAnnouncement(const RunAnnouncement& a) {
  return nlohmann::json{{"run", a.run}, {"target_batch_size", a.target_batch_size}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<RunAnnouncement> ParseRunAnnouncement(std::string_view value) {
  if (value.size() > 512) return ProtocolError("run announcement longer than 512 bytes");
  auto j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ProtocolError("run announcement is not a JSON object");
  for (const auto& [key, unused] : j.items()) {
    if (key != "run" && key != "target_batch_size") {
      return ProtocolError(
          fmt::format("run announcement has an unknown field '{}'", key.substr(0, 32)));
    }
  }
  if (!j.contains("run") || !j["run"].is_string() || !j.contains("target_batch_size") ||
      !j["target_batch_size"].is_number_integer()) {
    return ProtocolError("run announcement needs a string run and an integer target_batch_size");
  }
  RunAnnouncement a{.run = j["run"].get<std::string>(),
                    .target_batch_size = j["target_batch_size"].get<int64_t>()};
  if (!IsPrintableName(a.run, 128)) {
    return ProtocolError("run announcement: the run id must be 1-128 printable ASCII characters");
  }
  if (a.target_batch_size <= 0 || a.target_batch_size > kMaxSamples) {
    return ProtocolError("run announcement: target_batch_size out of range");
  }
  return a;
}

EpochDecision DecideEpoch(const GlobalProgress& g, int64_t local_epoch, int64_t lag,
                          Standing standing) {
  if (g.epoch > local_epoch + lag) return {EpochAction::kCatchUp};
  if (g.epoch > local_epoch) return {EpochAction::kAverage};
  if (g.epoch == local_epoch && (g.round_started || g.samples_reported >= g.target_batch_size)) {
    return {EpochAction::kAverage};
  }
  // This peer's share of the swarm's throughput at the epoch (equal shares while rates are
  // unknown).
  const double total = g.samples_per_second_at_epoch;
  const double share = total > 0 && g.own_samples_per_second > 0
                           ? std::min(1.0, g.own_samples_per_second / total)
                           : 1.0 / static_cast<double>(std::max<size_t>(1, g.num_peers_at_epoch));
  auto quota_of = [&](int64_t gap) {
    const auto q = static_cast<int64_t>(std::ceil(static_cast<double>(gap) * share));
    return EpochDecision{EpochAction::kTrain, std::max<int64_t>(1, q)};
  };
  if (g.num_growing_at_epoch == 0) {
    // Nobody else adds samples: the reports are all there is, and they are short. A peer that
    // computes goes on (its own count is exact); peers that all stopped (rates overstated, or a
    // peer left) each compute their share of the shortfall, by throughput, and then stop again
    // without re-estimating, so that they do not each fill the whole gap.
    if (standing == Standing::kComputing) return {EpochAction::kTrain};
    return quota_of(g.target_batch_size - g.samples_reported);
  }
  // Others still compute: stop when the next batch would more likely overshoot the target than
  // not, and let the reports confirm.
  if (g.samples_expected + g.own_batch / 2 >= g.target_batch_size) return {EpochAction::kWait};
  switch (standing) {
    case Standing::kComputing:
      return {EpochAction::kTrain};
    case Standing::kWaiting:
      // A waiting peer whose estimate fell short resumes. The other waiting peers read about the
      // same view and resume at about the same moment, each seeing the rest as stopped until its
      // next fetch: each computes its share of the estimated gap, then waits again, so that they
      // do not all fill it.
      return quota_of(g.target_batch_size - g.samples_expected);
    case Standing::kWaitingAfterShare:
      // Those that are seen computing may be the others still on their shares, and those seen
      // waiting may have resumed unseen: only reports with nobody computing are exact.
      return {EpochAction::kWait};
  }
  return {EpochAction::kWait};
}

}  // namespace colony::train
