// One butterfly all-reduce of a formed group, as seen by one member (internal; the algorithm is
// described at the top of allreduce.cpp).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "averaging/internal.h"
#include "core/bytes.h"

namespace colony::averaging {

class AllReduceRun : public std::enable_shared_from_this<AllReduceRun> {
 public:
  AllReduceRun(std::shared_ptr<Averager::Impl> impl, GroupInfo group, uint32_t self, double weight,
               SteadyTime deadline, std::string audit_claim = {});
  ~AllReduceRun() { --impl_->live_runs_; }

  // Runs this member's part of the all-reduce; on strand().
  asio::awaitable<Result<StepResult>> Run();
  // Serves one sender's "avg.reduce" stream after its hello was read; on strand().
  asio::awaitable<Status> ServeSender(std::shared_ptr<net::Stream> stream, ReduceHello hello);
  // Stops everything; the run reports `reason` if it is Cancelled. Thread-safe.
  void Cancel(Status reason);
  // Takes another member's verification statement (verify.cpp); on strand().
  Status AddStatement(const PeerId& from, const std::string& bytes);

  const PoolStrand& strand() const { return strand_; }
  const GroupInfo& group() const { return group_; }

 private:
  struct Sender {
    bool expected = false;   // we reduce a span and this member sends data
    bool connected = false;  // its stream arrived (or it is us)
    bool excluded = false;
    double weight = 0;
    size_t received = 0;         // parts delivered
    size_t results_written = 0;  // averaged parts sent back
    // The sender half-closed its stream after reading every result (or the stream ended): the
    // results are delivered, not just queued, so this process may exit.
    bool done_reading = false;
    SteadyTime last_progress;
    std::shared_ptr<net::Stream> stream;
  };
  // Grows without zero-filling: every value is written before it is read.
  using Floats = std::vector<float, DefaultInitAllocator<float>>;
  struct Reduced {
    Floats acc;                              // weighted sum (mean reduction)
    std::vector<std::vector<float>> inputs;  // CenteredClip and verification keep every input
    std::vector<double> input_weights;
    std::vector<uint32_t> input_senders;
    std::shared_ptr<Floats> result;  // the result sent (kept for verification)
    double weight = 0;
    float max_abs = 0;  // bounds every |value| received: the output must not exceed it
    std::vector<uint32_t> contributors;
    // The final part as it goes on the wire (null when nobody contributed): raw float32 when
    // the codec is none, else the encoded bytes.
    std::shared_ptr<const void> result_owner;
    ByteSpan result_bytes;
  };
  struct ReaderState {
    bool done = false;
    SteadyTime last_result;
    // Our parts written to the reducer so far, and whether more may follow: a result for a part
    // we are still to send would be written into the tensors while they are read for it.
    size_t written = 0;
    bool sending = true;
  };

  size_t PartsOf(uint32_t member) const;
  std::pair<uint64_t, uint64_t> PartRange(uint32_t member, size_t k) const;
  void MaybeFault(Fault when);
  void Abort(Status reason);
  void Exclude(uint32_t sender, const std::string& why);
  // Adds a sender's part k to the weighted sum (or keeps it, see keep_inputs). `max_abs`: the
  // values' largest magnitude (MaxAbs) or a bound of it (a blockwise codec's scales), computed
  // where they were checked.
  void Accumulate(uint32_t sender, size_t k, std::span<const float> values, float max_abs);
  // The same from a received raw float32 frame (no copy for the weighted mean).
  void AccumulateRaw(uint32_t sender, size_t k, ByteSpan values, float max_abs);
  // The same from a received encoded part whose codec decodes and adds in one pass
  // (compression::DecodesAddInOnePass), for the weighted mean only (not with keep_inputs): no
  // decoded copy, on the calling thread. Fails, leaving the sum as it was, on a malformed part.
  Status AccumulateEncoded(uint32_t sender, size_t k, ByteSpan encoded, float max_abs);
  // Counts sender's part k, of largest magnitude max_abs, as added to the weighted sum.
  void CountContribution(uint32_t sender, size_t k, float max_abs);
  // Whether a part of largest magnitude max_abs at `weight` keeps the weighted sum of the
  // group's parts finite (a finite part can still overflow it, and a reducer whose output fails
  // its check drops the part for everyone, without knowing whom to blame).
  Status CheckSummable(float max_abs, double weight) const;
  // Keeps a sender's part k besides the sum, for CenteredClip and verification.
  void KeepInput(uint32_t sender, size_t k, std::vector<float> values, float max_abs);
  // The wire form of a part: a raw float32 tensor frame (codec none) or the encoded bytes.
  net::TensorFrame PartFrame(std::shared_ptr<const void> owner, ByteSpan bytes, bool raw) const;
  bool raw() const { return impl_->options_.codec == compression::Codec::kNone; }
  bool keep_inputs() const {
    return impl_->options_.centered_clip.has_value() || impl_->options_.verify;
  }
  // Our values [b, e): from the snapshot when the run keeps one, else straight from the
  // tensors (a range is read before any result overwrites it); copied into `copy` when
  // several tensors hold them.
  std::span<const float> Input(uint64_t b, uint64_t e, std::vector<float>& copy) const;
  void CheckParts();
  void Finalize(size_t k);
  void KeepLocal(uint32_t reducer, size_t from);
  asio::awaitable<void> SenderWatchdog();
  asio::awaitable<void> WriteResults(uint32_t sender, std::shared_ptr<net::Stream> stream);
  asio::awaitable<void> SendTo(uint32_t reducer);
  asio::awaitable<void> ReadResults(uint32_t reducer, std::shared_ptr<net::Stream> stream,
                                    std::shared_ptr<ReaderState> state);

  // ---- Verification (verify.cpp).
  asio::awaitable<Verification> Verify();
  // Sends our statement of a phase to every member taking part, and keeps it on our board.
  void Broadcast(VerifyStatement statement, const std::vector<bool>& to, SteadyTime until);
  // Waits until every member in `from` has a statement of `phase` on the board, or `until`.
  asio::awaitable<void> AwaitPhase(VerifyPhase phase, const std::vector<bool>& from,
                                   SteadyTime until);
  // Our phase-3 checks: of our own span as its reducer, of every span we received whole.
  VerifyStatement OwnChecks(uint64_t seed, const std::string& seed_bytes) const;
  // Replaces span `reducer`'s values with our own, and says so in the reports.
  void DiscardSpan(uint32_t reducer);
  // The members this round's seed picks for audits (every member picks the same ones).
  std::vector<uint32_t> AuditTargets(const std::string& seed_bytes) const;
  // What target t sent us for our span (every part), or empty when we lack a part of it.
  std::vector<float> InputOf(uint32_t t) const;
  // Audits target t (see AveragerOptions::audit_targets): empty when it passes or cannot be
  // judged, else why it is banned; `note` says why it could not be judged.
  asio::awaitable<std::string> Audit(uint32_t t, std::string* note);

  std::shared_ptr<Averager::Impl> impl_;
  const GroupInfo group_;
  const uint32_t self_;
  const double weight_;
  const SteadyTime deadline_;
  PoolStrand strand_;
  Event changed_;  // any progress: parts, exclusions, tasks ending
  const std::vector<uint64_t> begins_;
  const uint64_t part_size_;
  const std::string audit_claim_;  // StepOptions::audit_claim
  bool wants_results_ = true;      // not an aux peer
  bool sends_ = true;              // has data with a positive weight

  // Everything below lives on strand_.
  // Snapshot of our flattened tensors, taken only with verification, which gives spans back
  // to our own values after the round (null otherwise: parts are sent from the tensors).
  // Reused from step to step (Averager::Impl::snapshot_) to avoid a large allocation per step.
  std::shared_ptr<std::vector<float>> input_;
  // Writes borrowing the tensors' memory and decodes writing into them, in flight: Run waits
  // for them before returning, after which the caller owns the tensors again.
  size_t tensor_users_ = 0;
  bool tensors_released_ = false;  // Run is done with the tensors: no decode into them starts
  size_t my_parts_ = 0;
  std::vector<Sender> senders_;
  std::vector<Reduced> parts_;
  size_t parts_done_ = 0;
  size_t pending_tasks_ = 0;
  size_t active_writers_ = 0;
  std::vector<PartReport> reports_;
  std::vector<std::shared_ptr<net::Stream>> out_streams_;
  SteadyTime next_send_{};
  Status abort_reason_;
  bool fault_fired_ = false;

  // Verification state (only with options.verify), on strand_.
  std::vector<bool> banned_;  // members this averager banned before the round
  // Contributors of each result part received, per reducer (in order; a prefix of its parts).
  std::vector<std::vector<std::vector<uint32_t>>> received_;
  // Statements per phase (index phase - 1), per member.
  std::array<std::vector<std::optional<VerifyStatement>>, 3> board_;
  size_t statement_sends_ = 0;    // verification calls in flight
  uint64_t statement_bytes_ = 0;  // verification statements sent
};

}  // namespace colony::averaging
