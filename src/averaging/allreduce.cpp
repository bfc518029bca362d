// Butterfly all-reduce inside a formed group, with fault tolerance.
//
// The flattened tensors (N values) are cut into one contiguous span per member (GroupInfo::span,
// sized by bandwidth; clients own none), and each span into parts of part_size values. Every
// sender (a member with data: node or client mode, weight > 0) opens one "avg.reduce" stream to
// each other reducer and writes a hello (group id, its index, its weight) followed by its parts of
// that reducer's span, each compressed with the configured codec. The reducer decodes each part,
// rejects non-finite values, and accumulates the weighted sum (or keeps the inputs for
// CenteredClip). Part k is final once every sender still in the round has delivered part k; the
// reducer then computes the mean, encodes it once and writes it back on every sender's stream
// with the list of members whose data it contains. Senders write results straight into their
// tensors as they arrive, so communication, decoding and reduction overlap part by part.
//
// Faults. A reducer excludes a sender that delivers no part for part_timeout (it never
// connected, died, froze or slowed down), that breaks the stream, or that sends malformed or
// non-finite data: the parts not yet final are reduced without it, and it gets no more results.
// A sender whose reducer returns no part for 2 x part_timeout (or whose stream fails) keeps its
// local values for the rest of that span. At the step's deadline everything still open is
// finalised with what has arrived. So every surviving member finishes, and each part of its
// result is exactly the weighted mean of the members listed for it (its PartReport). A member
// whose result holds no other member's data at all fails the step (Aborted) instead.
//
// Threading: a run's state lives on its own strand of the compute pool; stream reads and writes
// hop to their connections' strands; decoding and encoding run anywhere on the pool.
#include "averaging/allreduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <limits>

#include "averaging/reduce.h"
#include "averaging/verify_math.h"
#include "core/finite.h"

namespace colony::averaging {

std::vector<uint64_t> SpanBegins(const GroupInfo& group) {
  std::vector<uint64_t> begins;
  uint64_t at = 0;
  for (const auto& m : group.members) {
    begins.push_back(at);
    at += m.span;
  }
  return begins;
}

AllReduceRun::AllReduceRun(std::shared_ptr<Averager::Impl> impl, GroupInfo group, uint32_t self,
                           double weight, SteadyTime deadline, std::string audit_claim)
    : impl_(std::move(impl)),
      group_(std::move(group)),
      self_(self),
      weight_(weight),
      deadline_(deadline),
      strand_(asio::make_strand(PoolExecutor())),
      changed_(strand_),
      begins_(SpanBegins(group_)),
      part_size_(group_.part_size),
      audit_claim_(std::move(audit_claim)) {
  ++impl_->live_runs_;
  const Mode mode = group_.members[self_].mode;
  wants_results_ = mode != Mode::kAux;
  sends_ = mode != Mode::kAux && weight_ > 0;
  const size_t n = group_.members.size();
  banned_.assign(n, false);
  for (size_t m = 0; m < n; ++m) banned_[m] = m != self_ && impl_->IsBanned(group_.members[m].peer);
  received_.assign(n, {});
  for (auto& phase : board_) phase.assign(n, std::nullopt);
}

size_t AllReduceRun::PartsOf(uint32_t member) const {
  return static_cast<size_t>((group_.members[member].span + part_size_ - 1) / part_size_);
}

std::pair<uint64_t, uint64_t> AllReduceRun::PartRange(uint32_t member, size_t k) const {
  const uint64_t b = begins_[member] + k * part_size_;
  const uint64_t e = std::min(b + part_size_, begins_[member] + group_.members[member].span);
  return {b, e};
}

void AllReduceRun::MaybeFault(Fault when) {
  if (impl_->options_.testing.fault != when || fault_fired_) return;
  fault_fired_ = true;
  COLONY_LOG_WARN("averaging: injecting fault {} (tests only)", static_cast<int>(when));
  switch (when) {
    case Fault::kKillBeforeSending:
    case Fault::kKillWhileSending:
    case Fault::kKillWhileReducing:
      std::raise(SIGKILL);
      break;
    case Fault::kStopWhileSending:
    case Fault::kStopWhileReducing:
      std::raise(SIGSTOP);
      break;
    case Fault::kCancelWhileSending:
      impl_->cancel_requested_ = true;
      Abort(Cancelled("the step was cancelled (injected fault)"));
      break;
    case Fault::kNone:
      break;
  }
}

void AllReduceRun::Abort(Status reason) {
  if (!abort_reason_.ok()) return;
  abort_reason_ = std::move(reason);
  for (auto& s : out_streams_) s->Cancel(abort_reason_);
  for (uint32_t i = 0; i < senders_.size(); ++i) Exclude(i, abort_reason_.message());
  changed_.Notify();
}

void AllReduceRun::Cancel(Status reason) {
  auto self = shared_from_this();
  asio::post(strand_,
             [self, reason = std::move(reason)]() mutable { self->Abort(std::move(reason)); });
}

// ---------------------------------------------------------------------------------------------
// Reducer side.

void AllReduceRun::Exclude(uint32_t s, const std::string& why) {
  Sender& sender = senders_[s];
  if (!sender.expected || sender.excluded || sender.received >= my_parts_) return;
  sender.excluded = true;
  if (abort_reason_.ok()) {
    COLONY_LOG_WARN("averaging: excluded {} from the rest of group {}: {}",
                    group_.members[s].peer.ToString(),
                    HexEncode(AsBytes(group_.group_id)).substr(0, 8), why);
  }
  if (sender.stream)
    sender.stream->Cancel(Status(StatusCode::kAborted, "excluded from the all-reduce: " + why));
  CheckParts();
  changed_.Notify();
}

void AllReduceRun::KeepInput(uint32_t s, size_t k, std::vector<float> values, float max_abs) {
  Reduced& part = parts_[k];
  const double w = senders_[s].weight;
  if (!impl_->options_.centered_clip) {  // verification keeps the input besides the sum
    if (part.acc.empty()) part.acc.assign(values.size(), 0.0f);
    AddScaled(part.acc, values, static_cast<float>(w));
  }
  part.inputs.push_back(std::move(values));
  part.input_weights.push_back(w);
  part.input_senders.push_back(s);
  CountContribution(s, k, max_abs);
}

void AllReduceRun::Accumulate(uint32_t s, size_t k, std::span<const float> values, float max_abs) {
  AccumulateRaw(s, k,
                ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()),
                max_abs);
}

Status AllReduceRun::CheckSummable(float max_abs, double weight) const {
  // Every sender's weighted values within FLT_MAX / n keep the sum of n of them finite.
  const double limit = std::numeric_limits<float>::max() / static_cast<double>(senders_.size());
  if (static_cast<double>(max_abs) * weight <= limit) return Status::Ok();
  return InvalidArgument(fmt::format(
      "it sent values of magnitude {:g} at weight {:g}: the weighted sum of a group of {} could "
      "overflow float32",
      max_abs, weight, senders_.size()));
}

void AllReduceRun::AccumulateRaw(uint32_t s, size_t k, ByteSpan values, float max_abs) {
  Reduced& part = parts_[k];
  const double w = senders_[s].weight;
  const size_t n = values.size() / sizeof(float);
  if (keep_inputs()) {
    std::vector<float> copy(n);
    CopyScaledBytes(copy, values, 1.0f);
    KeepInput(s, k, std::move(copy), max_abs);
    return;
  }
  if (part.acc.empty()) {
    part.acc.resize(n);
    CopyScaledBytes(part.acc, values, static_cast<float>(w));
  } else {
    AddScaledBytes(part.acc, values, static_cast<float>(w));
  }
  CountContribution(s, k, max_abs);
}

Status AllReduceRun::AccumulateEncoded(uint32_t s, size_t k, ByteSpan encoded, float max_abs) {
  Reduced& part = parts_[k];
  if (part.acc.empty()) {
    const auto [b, e] = PartRange(self_, k);
    // Zeros, which the first sender's values are added to. Floats grows without zero-filling:
    // resize() alone left whatever the allocator had there in the sum.
    part.acc.assign(e - b, 0.0f);
  }
  COLONY_RETURN_IF_ERROR(
      compression::DecodeAddScaled(encoded, part.acc, static_cast<float>(senders_[s].weight)));
  CountContribution(s, k, max_abs);
  return Status::Ok();
}

void AllReduceRun::CountContribution(uint32_t s, size_t k, float max_abs) {
  Reduced& part = parts_[k];
  part.max_abs = std::max(part.max_abs, max_abs);
  part.weight += senders_[s].weight;
  part.contributors.push_back(s);
}

net::TensorFrame AllReduceRun::PartFrame(std::shared_ptr<const void> owner, ByteSpan bytes,
                                         bool raw_values) const {
  net::TensorFrame t;
  if (raw_values) {
    t.dtype = DType::kFloat32;
    t.codec = 0;
    t.shape = {static_cast<int64_t>(bytes.size() / sizeof(float))};
  } else {
    t.dtype = DType::kUInt8;
    t.codec = static_cast<uint8_t>(impl_->options_.codec);
    t.shape = {static_cast<int64_t>(bytes.size())};
  }
  t.data = bytes;
  t.owner = std::move(owner);
  return t;
}

std::span<const float> AllReduceRun::Input(uint64_t b, uint64_t e, std::vector<float>& copy) const {
  if (input_) return {input_->data() + b, e - b};
  if (const std::span<const float> view = impl_->View(b, e); !view.empty()) return view;
  copy.resize(e - b);
  impl_->ReadRange(b, copy);
  return copy;
}

void AllReduceRun::CheckParts() {
  while (parts_done_ < my_parts_) {
    const size_t k = parts_done_;
    for (const Sender& s : senders_) {
      if (s.expected && !s.excluded && s.received <= k) return;
    }
    Finalize(k);
    ++parts_done_;
    changed_.Notify();
  }
}

void AllReduceRun::Finalize(size_t k) {
  Reduced& part = parts_[k];
  const auto [b, e] = PartRange(self_, k);
  std::sort(part.contributors.begin(), part.contributors.end());
  if (part.weight > 0) {
    auto mean = std::make_shared<Floats>();
    bool converged = true;
    bool in_tensors = false;  // the result was decoded straight into the tensors
    if (impl_->options_.centered_clip) {
      mean->resize(e - b);
      std::vector<std::span<const float>> views(part.inputs.begin(), part.inputs.end());
      CenteredClipOptions clip = *impl_->options_.centered_clip;
      // Verified results must be the fixed point, to the tolerance the members check.
      if (impl_->options_.verify) clip.tolerance = kReducerTolerance;
      converged = CenteredClip(views, part.input_weights, clip, *mean);
    } else {
      *mean = std::move(part.acc);
      Scale(*mean, static_cast<float>(1.0 / part.weight));
    }
    if (impl_->options_.testing.WrongResult() && sends_) {  // tests: a reducer that lies
      std::vector<float> copy;
      const std::span<const float> own = Input(b, e, copy);
      std::copy(own.begin(), own.end(), mean->begin());
    }
    // A reducer checks its own output before anyone gets it: a mean never leaves the range of
    // its inputs, so one that does (an overflow of the weighted sums, a bug) is not sent, and
    // every member keeps its own values for this part.
    if (!converged) {
      COLONY_LOG_WARN(
          "averaging: CenteredClip did not reach its fixed point for the part [{}, {}) of group "
          "{}; the part is not sent, and the members keep their own values for it",
          b, e, HexEncode(AsBytes(group_.group_id)).substr(0, 8));
      part.contributors.clear();
    } else if (!OutputWithinInputs(*mean, part.max_abs)) {
      COLONY_LOG_ERROR(
          "averaging: the reduced part [{}, {}) of group {} is not finite or exceeds its "
          "inputs' largest magnitude {:g}; it is not sent, and the members keep their own "
          "values for it",
          b, e, HexEncode(AsBytes(group_.group_id)).substr(0, 8), part.max_abs);
      part.contributors.clear();
    } else if (raw()) {
      part.result_bytes =
          ByteSpan(reinterpret_cast<const uint8_t*>(mean->data()), mean->size() * sizeof(float));
      part.result_owner = mean;
    } else {
      auto encoded = std::make_shared<Bytes>();
      Status st = compression::Encode(impl_->options_.codec, *mean, *encoded,
                                      impl_->options_.codec_options);
      if (!st.ok()) {
        COLONY_LOG_ERROR("averaging: encoding a reduced part failed: {}", st.ToString());
        part.contributors.clear();
      } else {
        part.result_bytes = ByteSpan(encoded->data(), encoded->size());
        part.result_owner = std::move(encoded);
        // This peer keeps what every other member receives, not the exact mean, so that a
        // lossy codec leaves all members with the same values: decoded straight into the
        // tensors when one holds the part and verification does not need the values.
        std::span<float> into = *mean;
        if (wants_results_ && !impl_->options_.verify) {
          if (const std::span<float> view = impl_->View(b, e); !view.empty()) into = view;
        }
        const auto writes =
            into.data() == mean->data() ? compression::Writes::kCached : impl_->TensorWrites();
        st = compression::Decode(part.result_bytes, into, 0, writes);  // writes nothing if it fails
        if (!st.ok()) {
          COLONY_LOG_ERROR("averaging: decoding a reduced part failed: {}", st.ToString());
          part.contributors.clear();
          part.result_bytes = {};  // a result listing no contributors carries no values
          part.result_owner.reset();
        }
        in_tensors = st.ok() && into.data() != mean->data();
      }
    }
    if (wants_results_ && !part.contributors.empty()) {
      if (!in_tensors) impl_->Scatter(b, *mean);
      reports_.push_back({b, e, part.contributors});
    }
    if (impl_->options_.verify && !part.contributors.empty()) part.result = mean;
  }
  if (part.contributors.empty() || part.weight <= 0) {
    part.contributors.clear();
    if (wants_results_) {
      reports_.push_back({b, e, sends_ ? std::vector<uint32_t>{self_} : std::vector<uint32_t>{}});
    }
  }
  part.acc = {};
  if (!impl_->options_.verify) {  // verification checks the inputs against the result later
    part.inputs = {};
    part.input_weights = {};
    part.input_senders = {};
  }
}

asio::awaitable<void> AllReduceRun::SenderWatchdog() {
  const auto timeout = impl_->options_.part_timeout;
  while (parts_done_ < my_parts_) {
    const SteadyTime now = SteadyNow();
    SteadyTime next = deadline_;
    if (now >= deadline_) {
      for (uint32_t s = 0; s < senders_.size(); ++s) {
        Exclude(s, "the step's deadline passed");
      }
      break;
    }
    for (uint32_t s = 0; s < senders_.size(); ++s) {
      Sender& sender = senders_[s];
      if (!sender.expected || sender.excluded || sender.received >= my_parts_) continue;
      if (now - sender.last_progress >= timeout) {
        Exclude(s, fmt::format("it delivered no part for {:.1f} s ({} of {} parts received)",
                               Seconds(timeout), sender.received, my_parts_));
      } else {
        next = std::min(next, sender.last_progress + timeout);
      }
    }
    if (parts_done_ >= my_parts_) break;
    co_await changed_.WaitUntil(next);
  }
}

asio::awaitable<Status> AllReduceRun::ServeSender(std::shared_ptr<net::Stream> stream,
                                                  ReduceHello hello) {
  const uint32_t s = hello.sender_index;
  if (s >= group_.members.size() || group_.members[s].peer != stream->peer()) {
    co_return PermissionDenied("the sender index does not match the authenticated peer");
  }
  if (my_parts_ == 0) co_return FailedPrecondition("this peer reduces no span in this group");
  Sender& sender = senders_[s];
  if (banned_[s]) co_return PermissionDenied("this peer banned you: verification caught you");
  if (!sender.expected) co_return FailedPrecondition("this member sends no data");
  if (sender.connected) co_return AlreadyExists("this sender is already connected");
  if (sender.excluded)
    co_return Status(StatusCode::kAborted, "this sender was excluded from the all-reduce");
  if (hello.weight > impl_->options_.max_weight) {
    const std::string why = fmt::format("it declared a weight of {:g}, above max_weight {:g}",
                                        hello.weight, impl_->options_.max_weight);
    Exclude(s, why);
    co_return InvalidArgument(why);
  }
  sender.connected = true;
  sender.stream = stream;
  sender.weight = hello.weight;
  sender.last_progress = SteadyNow();
  if (hello.weight == 0) {
    sender.received = my_parts_;  // nothing to send; it only wants the results
    CheckParts();
  }
  ++active_writers_;
  auto self = shared_from_this();
  auto writer = [self, s, stream]() -> asio::awaitable<void> {
    co_await self->WriteResults(s, stream);
    // Done when the sender confirms that it read every result (see ServeSender), so that a
    // reducer that exits right after its step does not cut results off in flight.
    Sender& me = self->senders_[s];
    while (!me.done_reading && !me.excluded && self->abort_reason_.ok()) {
      co_await self->changed_.WaitUntil(self->deadline_ + self->impl_->options_.part_timeout);
      if (SteadyNow() >= self->deadline_ + self->impl_->options_.part_timeout) break;
    }
    --self->active_writers_;
    self->changed_.Notify();
  };
  asio::co_spawn(strand_, std::move(writer), asio::detached);

  const auto codec_limit = compression::MaxEncodedSize(compression::Codec::kNone, part_size_) +
                           compression::MaxEncodedSize(compression::Codec::kTopK, part_size_) +
                           4096;
  while (sender.received < my_parts_ && !sender.excluded) {
    auto msg = co_await stream->Read();
    if (sender.excluded) break;
    if (!msg.ok()) {
      Exclude(s, "its stream failed: " + msg.status().ToString());
      break;
    }
    if (!msg->has_value()) {
      Exclude(s, "it closed its stream early");
      break;
    }
    net::Message& m = **msg;
    auto header = DecodePartHeader(m.meta, group_.members.size());
    const size_t k = sender.received;
    if (!header.ok() || header->index != k || m.tensors.size() != 1 ||
        m.tensors[0].data.size() > codec_limit) {
      Exclude(s, "it sent a malformed part");
      break;
    }
    const auto [b, e] = PartRange(self_, k);
    net::TensorFrame frame = std::move(m.tensors[0]);
    if (frame.codec == 0) {  // raw float32: checked and reduced straight from the receive buffer
      if (frame.dtype != DType::kFloat32 || frame.data.size() != (e - b) * sizeof(float)) {
        Exclude(s, "it sent a part of the wrong size");
        break;
      }
      const float max_abs = MaxAbsBytes(frame.data);
      if (max_abs < 0) {
        Exclude(s, "it sent non-finite values (NaN or Inf)");
        break;
      }
      if (Status st = CheckSummable(max_abs, sender.weight); !st.ok()) {
        Exclude(s, st.message());
        break;
      }
      AccumulateRaw(s, k, frame.data, max_abs);
      ++sender.received;
      sender.last_progress = SteadyNow();
      CheckParts();
      continue;
    }
    // Blockwise parts for the weighted mean: checked by their scales (a bound of every value
    // they decode to; set only for the codecs that DecodesAddInOnePass), then decoded and added
    // in one pass, here: no decoded copy, and no hand-off to the pool and back per part.
    const std::optional<float> scale_bound = compression::MaxAbsBound(frame.data);
    if (scale_bound && !keep_inputs()) {
      if (Status st = CheckSummable(*scale_bound, sender.weight); !st.ok()) {
        Exclude(s, st.message());
        break;
      }
      if (Status st = AccumulateEncoded(s, k, frame.data, *scale_bound); !st.ok()) {
        Exclude(s, st.message());
        break;
      }
      ++sender.received;
      sender.last_progress = SteadyNow();
      CheckParts();
      continue;
    }
    struct Decoded {
      std::unique_ptr<float[]> values;  // not zeroed first: the decoder writes every value
      float max_abs = 0;
    };
    auto decode = [frame, n = e - b]() -> Result<Decoded> {
      Decoded d{std::make_unique_for_overwrite<float[]>(n)};
      const std::span<float> values(d.values.get(), n);
      COLONY_RETURN_IF_ERROR(compression::Decode(frame.data, values));
      // Blockwise codecs bound their values by their block scales, which spares a pass over
      // them (their values are finite, too); the others are measured.
      const std::optional<float> bound = compression::MaxAbsBound(frame.data);
      d.max_abs = bound ? *bound : MaxAbs(values);
      if (d.max_abs < 0) return InvalidArgument("it sent non-finite values (NaN or Inf)");
      return d;
    };
    auto decoded = co_await RunOn<Result<Decoded>>(PoolExecutor(), std::move(decode));
    if (sender.excluded) break;
    if (!decoded.ok()) {
      Exclude(s, decoded.status().message());
      break;
    }
    if (Status st = CheckSummable(decoded->max_abs, sender.weight); !st.ok()) {
      Exclude(s, st.message());
      break;
    }
    Accumulate(s, k, std::span<const float>(decoded->values.get(), e - b), decoded->max_abs);
    ++sender.received;
    sender.last_progress = SteadyNow();
    CheckParts();
  }
  // The sender half-closes its stream once it has read every result: that end of stream is
  // its receipt. Anything else ends the wait too (Run cancels streams that owe one too long).
  if (!sender.excluded) {
    auto end = co_await stream->Read();
    if (end.ok() && end->has_value()) {
      COLONY_LOG_WARN("averaging: sender {} sent more than its parts", stream->peer().Short());
      stream->Cancel(ProtocolError("unexpected message after the last part"));
    }
  }
  sender.done_reading = true;
  changed_.Notify();
  // The writer ends once every result is written or the sender is excluded.
  while (!sender.excluded && sender.results_written < my_parts_) {
    co_await changed_.WaitUntil(deadline_ + impl_->options_.part_timeout);
    if (SteadyNow() >= deadline_ + impl_->options_.part_timeout) break;
  }
  co_return sender.excluded ? Status(StatusCode::kAborted, "excluded from the all-reduce")
                            : Status();
}

asio::awaitable<void> AllReduceRun::WriteResults(uint32_t s, std::shared_ptr<net::Stream> stream) {
  Sender& sender = senders_[s];
  for (size_t k = 0; k < my_parts_; ++k) {
    while (parts_done_ <= k && !sender.excluded) {
      co_await changed_.WaitUntil(deadline_ + impl_->options_.part_timeout);
      if (SteadyNow() >= deadline_ + impl_->options_.part_timeout) Exclude(s, "deadline");
    }
    if (sender.excluded) co_return;
    const Reduced& part = parts_[k];
    std::vector<uint32_t> contributors = part.contributors;
    if (impl_->options_.testing.claim_everyone && !contributors.empty()) {
      contributors.resize(group_.members.size());
      for (uint32_t m = 0; m < contributors.size(); ++m) contributors[m] = m;
    }
    net::Message msg(EncodePartHeader({static_cast<uint32_t>(k), std::move(contributors)}));
    if (part.result_owner)
      msg.tensors.push_back(PartFrame(part.result_owner, part.result_bytes, raw()));
    Status st = co_await stream->Write(msg);
    if (!st.ok()) {
      Exclude(s, "writing its results failed: " + st.ToString());
      co_return;
    }
    ++sender.results_written;
    changed_.Notify();
    if (sender.results_written == std::max<size_t>(1, my_parts_ / 2)) {
      MaybeFault(Fault::kKillWhileReducing);
      MaybeFault(Fault::kStopWhileReducing);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sender side.

void AllReduceRun::KeepLocal(uint32_t r, size_t from) {
  for (size_t k = from; k < PartsOf(r); ++k) {
    const auto [b, e] = PartRange(r, k);
    reports_.push_back({b, e, sends_ ? std::vector<uint32_t>{self_} : std::vector<uint32_t>{}});
  }
}

asio::awaitable<void> AllReduceRun::SendTo(uint32_t r) {
  const MemberInfo& reducer = group_.members[r];
  const size_t n = PartsOf(r);
  auto dial = DialAddress(impl_->host_, reducer.addrs, reducer.peer);
  if (!dial.ok()) {
    COLONY_LOG_WARN("averaging: reducer {} cannot be dialed ({}); keeping local values",
                    reducer.peer.ToString(), dial.status().message());
    KeepLocal(r, 0);
    co_return;
  }
  std::string method = impl_->MethodName("reduce");
  net::CallOptions call_options{.timeout = MsUntil(deadline_)};
  auto opened = co_await impl_->host_.OpenStream(*dial, std::move(method), call_options);
  if (!opened.ok() || !abort_reason_.ok()) {
    if (!opened.ok()) {
      COLONY_LOG_WARN(
          "averaging: could not reach reducer {}: {}; keeping local values for its span",
          reducer.peer.ToString(), opened.status().ToString());
    } else {
      (*opened)->Cancel(abort_reason_);
    }
    KeepLocal(r, 0);
    co_return;
  }
  auto stream = *opened;
  out_streams_.push_back(stream);
  // Temporaries never appear inside co_await expressions (g++ 12 destroys them twice).
  const net::Message hello(EncodeReduceHello({group_.group_id, self_, sends_ ? weight_ : 0.0}));
  Status st = co_await stream->Write(hello);

  // Results arrive while we keep sending.
  auto self = shared_from_this();
  auto state = std::make_shared<ReaderState>();
  auto reader = [self, r, stream, state]() -> asio::awaitable<void> {
    co_await self->ReadResults(r, stream, state);
    state->done = true;
    self->changed_.Notify();
  };
  auto watchdog = [self, r, stream, state]() -> asio::awaitable<void> {
    const auto limit = 2 * self->impl_->options_.part_timeout;
    while (!state->done) {
      const SteadyTime due = state->last_result + limit;
      if (SteadyNow() >= due) {
        COLONY_LOG_WARN("averaging: reducer {} returned no part for {:.1f} s; keeping local values",
                        self->group_.members[r].peer.ToString(), Seconds(limit));
        stream->Cancel(DeadlineExceeded("the reducer returned no part in time"));
        break;
      }
      co_await self->changed_.WaitUntil(std::min(due, self->deadline_));
      if (SteadyNow() >= self->deadline_ && !state->done) {
        stream->Cancel(DeadlineExceeded("the step's deadline passed"));
        break;
      }
    }
  };
  state->last_result = SteadyNow();
  asio::co_spawn(strand_, std::move(reader), asio::detached);
  asio::co_spawn(strand_, std::move(watchdog), asio::detached);

  const auto& options = impl_->options_;
  ++tensor_users_;  // until the last part's write completes
  for (size_t k = 0; st.ok() && sends_ && k < n && abort_reason_.ok(); ++k) {
    const auto [b, e] = PartRange(r, k);
    ByteSpan bytes;
    std::shared_ptr<const void> owner;
    if (raw()) {  // sent straight from the tensors (or the snapshot, kept alive by the run)
      std::vector<float> copy;
      const std::span<const float> values = Input(b, e, copy);
      bytes = ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes());
      owner = copy.empty() ? std::shared_ptr<const void>(self)
                           : std::make_shared<const std::vector<float>>(std::move(copy));
    } else {
      auto encode = [self, b = b, e = e]() -> Result<std::shared_ptr<Bytes>> {
        auto out = std::make_shared<Bytes>();
        std::vector<float> copy;
        const std::span<const float> values = self->Input(b, e, copy);
        COLONY_RETURN_IF_ERROR(compression::Encode(self->impl_->options_.codec, values, *out,
                                                   self->impl_->options_.codec_options));
        if (self->impl_->options_.testing.corrupt_encoded_parts && !out->empty()) {
          out->back() = 0x80;
        }
        return out;
      };
      auto encoded =
          co_await RunOn<Result<std::shared_ptr<Bytes>>>(PoolExecutor(), std::move(encode));
      if (!encoded.ok()) {
        st = encoded.status();
        break;
      }
      bytes = ByteSpan((*encoded)->data(), (*encoded)->size());
      owner = std::move(*encoded);
    }
    if (options.max_send_rate > 0) {  // pace: reserve this part's airtime on a shared schedule
      const SteadyTime start = std::max(SteadyNow(), next_send_);
      next_send_ = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(bytes.size()) /
                                                             options.max_send_rate));
      while (SteadyNow() < start && abort_reason_.ok()) co_await changed_.WaitUntil(start);
    }
    net::Message msg(EncodePartHeader({static_cast<uint32_t>(k), {}}));
    msg.tensors.push_back(PartFrame(std::move(owner), bytes, raw()));
    st = co_await stream->Write(msg);
    if (st.ok()) {
      state->written = k + 1;
      changed_.Notify();  // ReadResults may wait for it
    }
    if (st.ok() && k + 1 == std::max<size_t>(1, n / 2)) {
      MaybeFault(Fault::kKillWhileSending);
      MaybeFault(Fault::kStopWhileSending);
      MaybeFault(Fault::kCancelWhileSending);
    }
  }
  --tensor_users_;
  state->sending = false;
  changed_.Notify();
  if (!st.ok() && abort_reason_.ok()) {
    COLONY_LOG_DEBUG("averaging: sending to {} stopped: {}", reducer.peer.Short(), st.ToString());
    stream->Cancel(st);
  }
  while (!state->done) co_await changed_.WaitUntil(deadline_ + options.part_timeout);
  // Half-close only now: the reducer takes the end of this stream as the receipt for its
  // results and may exit once it has one.
  if (st.ok() && abort_reason_.ok()) (void)co_await stream->CloseWrite();
}

asio::awaitable<void> AllReduceRun::ReadResults(uint32_t r, std::shared_ptr<net::Stream> stream,
                                                std::shared_ptr<ReaderState> state) {
  const size_t n = PartsOf(r);
  size_t next = 0;
  while (next < n) {
    auto msg = co_await stream->Read();
    if (!msg.ok() || !msg->has_value()) {
      if (abort_reason_.ok()) {
        COLONY_LOG_DEBUG("averaging: results from {} ended after {} of {} parts: {}",
                         group_.members[r].peer.Short(), next, n,
                         msg.ok() ? "end of stream" : msg.status().ToString());
      }
      break;
    }
    net::Message& m = **msg;
    auto header = DecodePartHeader(m.meta, group_.members.size());
    if (!header.ok() || header->index != next ||
        m.tensors.size() != (header->contributors.empty() ? 0u : 1u)) {
      COLONY_LOG_WARN("averaging: reducer {} sent a malformed result; keeping local values",
                      group_.members[r].peer.ToString());
      stream->Cancel(ProtocolError("malformed result part"));
      break;
    }
    // A result may overtake the completion of our write of its part (an honest reducer's on a
    // busy machine, or a liar's on purpose): it waits for it, so that nothing is written into a
    // range while it is still read for sending, and the check below knows what we sent.
    while (sends_ && state->sending && next >= state->written && abort_reason_.ok() &&
           SteadyNow() < deadline_ + impl_->options_.part_timeout) {
      co_await changed_.WaitUntil(deadline_ + impl_->options_.part_timeout);
    }
    // The list must be one the reducer can know: not us for a part we did not send, nor an aux
    // member (they send nothing).
    const bool sent = sends_ && next < state->written;
    std::string lie;
    if (sends_ && state->sending && !sent) lie = "a result for a part it did not receive yet";
    for (uint32_t c : header->contributors) {
      if (c == self_ && !sent) lie = "a result that lists this peer, which sent no such part";
      if (group_.members[c].mode == Mode::kAux) lie = "a result that lists an aux member";
    }
    if (!lie.empty()) {
      COLONY_LOG_WARN("averaging: reducer {} sent {}; keeping local values",
                      group_.members[r].peer.ToString(), lie);
      stream->Cancel(ProtocolError(lie));
      break;
    }
    const auto [b, e] = PartRange(r, next);
    if (header->contributors.empty()) {
      if (impl_->options_.verify) received_[r].emplace_back();
      reports_.push_back({b, e, sends_ ? std::vector<uint32_t>{self_} : std::vector<uint32_t>{}});
    } else {
      net::TensorFrame frame = std::move(m.tensors[0]);
      auto self = shared_from_this();
      auto decode = [self, frame, b = b, e = e]() -> Status {
        if (frame.codec == 0) {  // raw float32: checked, then copied straight into the tensors
          if (frame.dtype != DType::kFloat32 || frame.data.size() != (e - b) * sizeof(float)) {
            return InvalidArgument("the reducer sent a part of the wrong size");
          }
          if (!AllFiniteBytes(frame.data)) {
            return InvalidArgument("the reducer sent non-finite values");
          }
          self->impl_->ScatterBytes(b, frame.data);
          return {};
        }
        // Codecs whose values are finite whatever the input are decoded straight into the
        // tensor that holds the part, if one does (a failed decode writes nothing).
        const auto info = compression::PeekHeader(frame.data);
        if (info.ok() && compression::DecodesFinite(info->codec)) {
          if (const std::span<float> view = self->impl_->View(b, e); !view.empty()) {
            return compression::Decode(frame.data, view, 0, self->impl_->TensorWrites());
          }
        }
        const auto buffer = std::make_unique_for_overwrite<float[]>(e - b);
        const std::span<float> values(buffer.get(), e - b);  // the decoder writes every value
        COLONY_RETURN_IF_ERROR(compression::Decode(frame.data, values));
        if (!AllFinite(values)) return InvalidArgument("the reducer sent non-finite values");
        self->impl_->Scatter(b, values);
        return {};
      };
      // A result that arrived as the step ended (its stream's cancellation still on the way)
      // is dropped: the tensors are the caller's again.
      if (tensors_released_) break;
      ++tensor_users_;
      Status st = co_await RunOn<Status>(PoolExecutor(), std::move(decode));
      --tensor_users_;
      changed_.Notify();
      if (!st.ok()) {
        COLONY_LOG_WARN("averaging: bad result from reducer {}: {}; keeping local values",
                        group_.members[r].peer.ToString(), st.ToString());
        stream->Cancel(ProtocolError(st.message()));
        break;
      }
      if (impl_->options_.verify) received_[r].push_back(header->contributors);
      reports_.push_back({b, e, std::move(header->contributors)});
    }
    ++next;
    state->last_result = SteadyNow();
    changed_.Notify();
  }
  KeepLocal(r, next);
}

// ---------------------------------------------------------------------------------------------

asio::awaitable<Result<StepResult>> AllReduceRun::Run() {
  const SteadyTime started = SteadyNow();
  MaybeFault(Fault::kKillBeforeSending);
  // Verification may give a span back to our own values after the round: only it needs a
  // snapshot (kept even when we send nothing). Otherwise parts are sent from the tensors.
  if (impl_->options_.verify && (sends_ || wants_results_)) {
    // One step runs at a time, so only a finished run (still winding down) may share it.
    if (impl_->snapshot_ && impl_->snapshot_.use_count() == 1) {
      input_ = impl_->snapshot_;
    } else {
      input_ = std::make_shared<std::vector<float>>();
      impl_->snapshot_ = input_;
    }
    input_->resize(group_.total);
    impl_->Gather(*input_);
  }
  my_parts_ = PartsOf(self_);
  senders_.assign(group_.members.size(), {});
  parts_.assign(my_parts_, {});
  for (uint32_t m = 0; m < group_.members.size(); ++m) {
    senders_[m].expected = my_parts_ > 0 && group_.members[m].mode != Mode::kAux && !banned_[m];
  }
  if (!abort_reason_.ok()) {
    // Cancelled before it started: Abort found no senders to exclude then. None may join now,
    // and nothing of this run touches the tensors.
    for (uint32_t i = 0; i < senders_.size(); ++i) Exclude(i, abort_reason_.message());
    tensors_released_ = true;
    co_return abort_reason_;
  }
  if (my_parts_ > 0 && senders_[self_].expected) {
    Sender& me = senders_[self_];
    me.connected = true;
    me.weight = sends_ ? weight_ : 0;
    // This peer's own data is held to the same rule as everyone else's: when it is not finite
    // (a diverged peer), the span is reduced without it rather than poisoned for the group.
    // Each part is checked and added while it is in cache; a bad part takes back the parts
    // added before it (nothing else has reached them yet: senders are heard only below).
    size_t added = 0;
    std::vector<float> copy;
    for (; sends_ && added < my_parts_; ++added) {
      const auto [b, e] = PartRange(self_, added);
      const std::span<const float> values = Input(b, e, copy);
      const float max_abs = MaxAbs(values);
      if (!(max_abs >= 0) || !CheckSummable(max_abs, me.weight).ok()) break;
      AccumulateRaw(self_, added,
                    ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()),
                    max_abs);
    }
    if (sends_ && added < my_parts_) {
      COLONY_LOG_WARN(
          "averaging: this peer's own values are not finite (or too large to sum in float32); "
          "its span is reduced without them");
      for (size_t k = 0; k < added; ++k) parts_[k] = Reduced{};
    }
    me.received = my_parts_;
  }
  CheckParts();
  // Part timeouts run from here, when this reducer starts listening: reducing its own span above
  // can take longer than part_timeout on a slow or busy machine, and then every sender was
  // excluded before it could have sent anything.
  const SteadyTime listening = SteadyNow();
  for (Sender& s : senders_) s.last_progress = listening;

  auto self = shared_from_this();
  // A task may run to its end inside co_spawn (which dispatches: we are on its strand), e.g.
  // SendTo to a reducer with no address we can dial, so each is counted before it starts.
  // Counting them after spawning lost those that had already ended, and the round then waited
  // for its deadline.
  pending_tasks_ = 0;
  auto spawn = [&](auto fn) {
    ++pending_tasks_;
    auto wrapped = [self, fn = std::move(fn)]() mutable -> asio::awaitable<void> {
      co_await fn();
      --self->pending_tasks_;
      self->changed_.Notify();
    };
    asio::co_spawn(strand_, std::move(wrapped), asio::detached);
  };
  if (wants_results_) {
    for (uint32_t r = 0; r < group_.members.size(); ++r) {
      if (r == self_ || group_.members[r].span == 0) continue;
      if (banned_[r]) {  // a reducer we banned gets none of our data: its span stays ours
        KeepLocal(r, 0);
        continue;
      }
      spawn([self, r]() { return self->SendTo(r); });
    }
  }
  if (my_parts_ > 0) spawn([self]() { return self->SenderWatchdog(); });

  while (pending_tasks_ > 0 || parts_done_ < my_parts_) {
    if (SteadyNow() >= deadline_ + impl_->options_.part_timeout) {
      Abort(DeadlineExceeded("the step's deadline passed during the all-reduce"));
      break;
    }
    co_await changed_.WaitUntil(deadline_ + impl_->options_.part_timeout);
  }
  // Let our reducer's result writers deliver the last parts (a process may exit right after
  // its step), but not wait on a sender that stopped reading.
  const SteadyTime writers_until =
      std::min(deadline_, SteadyNow() + 2 * impl_->options_.part_timeout);
  while (active_writers_ > 0 && SteadyNow() < writers_until) {
    co_await changed_.WaitUntil(writers_until);
  }
  for (Sender& s : senders_) {
    if (s.stream && (s.results_written < my_parts_ || !s.done_reading)) {
      s.stream->Cancel(DeadlineExceeded("the sender did not take its results in time"));
    }
  }
  for (auto& s : out_streams_) s->Cancel(Cancelled("the all-reduce is over"));
  out_streams_.clear();
  // Sending and reading tasks still running (the deadline passed) end promptly now that their
  // streams are cancelled; each reports the parts it did not get before it ends, so the result
  // lists every part.
  const SteadyTime tasks_until = SteadyNow() + impl_->options_.part_timeout;
  while (pending_tasks_ > 0 && SteadyNow() < tasks_until) co_await changed_.WaitUntil(tasks_until);
  // The caller owns the tensors again once we return: our writes borrowing them and our
  // decodes into them end first (promptly once their streams are cancelled; by the streams'
  // deadlines at the latest).
  while (tensor_users_ > 0) co_await changed_.WaitUntil(SteadyNow() + std::chrono::seconds(1));
  tensors_released_ = true;
  if (impl_->cancel_requested_) co_return Cancelled("the averaging step was cancelled");
  if (abort_reason_.code() == StatusCode::kCancelled) co_return abort_reason_;
  Verification verification;
  if (impl_->options_.verify && abort_reason_.ok()) verification = co_await Verify();

  // A round whose result holds no other member's data averaged nothing, whatever the group's
  // size: every other member was excluded or returned nothing in time. Reporting it as a
  // successful round of the full group would be silently wrong.
  if (wants_results_) {
    bool others_hold_data = false;
    for (uint32_t m = 0; m < group_.members.size(); ++m) {
      others_hold_data = others_hold_data || (m != self_ && group_.members[m].mode != Mode::kAux);
    }
    const bool averaged_with_someone =
        std::any_of(reports_.begin(), reports_.end(), [this](const PartReport& p) {
          return std::any_of(p.contributors.begin(), p.contributors.end(),
                             [this](uint32_t c) { return c != self_; });
        });
    if (others_hold_data && !averaged_with_someone) {
      co_return Status(StatusCode::kAborted,
                       fmt::format("the all-reduce of a group of {} averaged with nobody: "
                                   "no part of the result holds another member's data (they "
                                   "were excluded or returned nothing within the part timeout); "
                                   "this peer keeps its own values",
                                   group_.members.size()));
    }
  }
  StepResult result;
  result.group_id = group_.group_id;
  result.self_index = self_;
  for (const auto& m : group_.members) result.members.push_back({m.peer, m.mode, m.gathered});
  std::sort(reports_.begin(), reports_.end(),
            [](const PartReport& a, const PartReport& b) { return a.begin < b.begin; });
  result.parts = std::move(reports_);
  result.allreduce_seconds = Seconds(SteadyNow() - started);
  result.verification = std::move(verification);
  co_return result;
}

}  // namespace colony::averaging
