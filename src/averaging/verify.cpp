// Verification of a finished all-reduce: BTARD's check of the reducers (docs/averaging.md,
// "Verification"; the arithmetic is in verify_math.h).
//
// Once a member holds every result it will get, it takes part in three phases, each a
// statement sent to every other member that accepts connections ("avg.verify/<prefix>"):
//  1. commit: the SHA-256 of 32 random bytes;
//  2. reveal: those bytes, once every member's commitment is in (or part_timeout passed). The
//     check direction's seed is the SHA-256 of the group id and every reveal that matches its
//     commitment: no member could know it while the results it checks were being fixed;
//  3. checks: per span, the runs of parts with the same contributors and, for every
//     contributor, the projection of its input's deviation from the result on the direction.
//     A reducer states them for every contributor (it holds their inputs); every other member
//     for itself, on each span it received whole.
// Then every member judges on its own, from what it received:
//  - a reducer whose own numbers say that its result is not the fixed point of its reduction
//    (CheckFixedPoint) is banned, and its span replaced by our own values (or zeros:
//    AveragerOptions::discard_to_zeros);
//  - a reducer and a contributor whose numbers for the contributor differ dispute: one of them
//    lies. When we are one of the two we know the other lies and ban it; otherwise a member
//    in dispute with more than half of the members it was checked against is banned (with an
//    honest majority, an honest member's disputes are only with liars);
//  - a span we cannot check (its reducer sent no checks on our direction) is replaced by our
//    own values, without a ban the first times (a crash, a lost message); a reducer silent in
//    3 rounds in a row is banned.
// Banned members are refused as group mates, senders, reducers and in matchmaking for the
// averager's lifetime.
#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "averaging/allreduce.h"
#include "averaging/ban_evidence.h"
#include "averaging/verify_math.h"

namespace colony::averaging {

namespace {

size_t PhaseIndex(VerifyPhase p) { return static_cast<size_t>(p) - 1; }

// Rounds in a row without checks after which a reducer is banned.
constexpr int kMaxSilentRounds = 3;

std::string Sha256(std::string_view bytes) {
  std::string out(crypto_hash_sha256_BYTES, '\0');
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(out.data()),
                     reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return out;
}

double Norm(std::span<const float> x) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

int Position(const std::vector<uint32_t>& sorted, uint32_t x) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), x);
  return it != sorted.end() && *it == x ? static_cast<int>(it - sorted.begin()) : -1;
}

const SpanCheck* SpanOf(const VerifyStatement& statement, uint32_t reducer) {
  for (const SpanCheck& span : statement.spans) {
    if (span.reducer == reducer) return &span;
  }
  return nullptr;
}

void AppendEntry(RunCheck& run, const Projection& p) {
  run.projections.insert(run.projections.end(), p.values.begin(), p.values.end());
  run.norms.push_back(p.norm);
}

bool SameNorm(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max({std::abs(a), std::abs(b), 1e-30});
}

// Whether a contributor's statement on a span agrees with its reducer's.
bool Agree(const SpanCheck& reducer, const SpanCheck& other, uint32_t member, double weight) {
  if (reducer.runs.size() != other.runs.size()) return false;
  for (size_t i = 0; i < reducer.runs.size(); ++i) {
    const RunCheck& r = reducer.runs[i];
    const RunCheck& o = other.runs[i];
    if (r.first_part != o.first_part || r.end_part != o.end_part ||
        r.contributors != o.contributors || !SameNorm(r.result_norm, o.result_norm)) {
      return false;
    }
    const int at = Position(r.contributors, member);
    if (at < 0) {
      if (!o.norms.empty()) return false;
      continue;
    }
    if (o.norms.size() != 1 || r.weights[at] != weight ||
        !SameProjection(EntryOf(r, static_cast<size_t>(at)), EntryOf(o, 0))) {
      return false;
    }
  }
  return true;
}

}  // namespace

Status AllReduceRun::AddStatement(const PeerId& from, const std::string& bytes) {
  if (!impl_->options_.verify) return FailedPrecondition("this peer does not verify its rounds");
  auto statement = DecodeVerifyStatement(bytes, group_.members.size());
  if (!statement.ok()) return statement.status();
  const uint32_t m = statement->member;
  if (statement->group_id != group_.group_id || group_.members[m].peer != from) {
    return PermissionDenied("the statement's member index does not match the authenticated peer");
  }
  if (!SignedBy(from, impl_->options_.prefix, *statement)) {
    return PermissionDenied("the statement's signature is not its member's");
  }
  if (banned_[m]) return PermissionDenied("this peer banned you: verification caught you");
  auto& slot = board_[PhaseIndex(statement->phase)][m];
  if (slot) return AlreadyExists("this member's statement of this phase arrived already");
  slot = std::move(*statement);
  changed_.Notify();
  return {};
}

void AllReduceRun::Broadcast(VerifyStatement statement, const std::vector<bool>& to,
                             SteadyTime until) {
  SignStatement(impl_->host_.identity(), impl_->options_.prefix, statement);
  board_[PhaseIndex(statement.phase)][self_] = statement;
  auto bytes = std::make_shared<const std::string>(EncodeVerifyStatement(statement));
  auto self = shared_from_this();
  for (uint32_t m = 0; m < group_.members.size(); ++m) {
    if (m == self_ || !to[m]) continue;
    auto addr = DialAddress(impl_->host_, group_.members[m].addrs, group_.members[m].peer);
    if (!addr.ok()) continue;
    ++statement_sends_;
    statement_bytes_ += bytes->size();
    auto send = [self, addr = *addr, bytes, until]() -> asio::awaitable<void> {
      // The member may not have formed its run yet (it learned of the group later): retry a
      // refusal for an unknown group until the phase's deadline.
      for (;;) {
        std::string method = self->impl_->MethodName("verify");
        net::Message request(*bytes);
        net::CallOptions options{.timeout = MsUntil(until)};
        auto reply =
            co_await self->impl_->host_.Call(addr, std::move(method), std::move(request), options);
        if (reply.ok() || reply.status().code() != StatusCode::kNotFound ||
            SteadyNow() + std::chrono::milliseconds(50) >= until) {
          if (!reply.ok()) {
            COLONY_LOG_DEBUG("averaging: a verification statement to {} failed: {}",
                             addr.ToString(), reply.status().ToString());
          }
          break;
        }
        asio::steady_timer wait(self->strand_, std::chrono::milliseconds(50));
        co_await wait.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      }
      --self->statement_sends_;
      self->changed_.Notify();
    };
    asio::co_spawn(strand_, std::move(send), asio::detached);
  }
}

asio::awaitable<void> AllReduceRun::AwaitPhase(VerifyPhase phase, const std::vector<bool>& from,
                                               SteadyTime until) {
  const auto& board = board_[PhaseIndex(phase)];
  for (;;) {
    bool all = true;
    for (size_t m = 0; m < from.size(); ++m) all = all && (!from[m] || board[m].has_value());
    if (all || SteadyNow() >= until || !abort_reason_.ok()) co_return;
    co_await changed_.WaitUntil(until);
  }
}

VerifyStatement AllReduceRun::OwnChecks(uint64_t seed, const std::string& seed_bytes) const {
  const auto& options = impl_->options_;
  const double tau = options.centered_clip ? options.centered_clip->tau : 0.0;
  VerifyStatement out;
  out.group_id = group_.group_id;
  out.member = self_;
  out.phase = VerifyPhase::kChecks;
  out.seed = seed_bytes;
  out.clip_tau = tau;
  out.weight = sends_ ? weight_ : 0.0;
  std::vector<float> z;
  // Our own span: every contributor's projection, from the inputs we kept.
  if (my_parts_ > 0) {
    SpanCheck span{self_, {}};
    for (size_t k = 0; k < my_parts_;) {
      size_t end = k + 1;
      while (end < my_parts_ && parts_[end].contributors == parts_[k].contributors) ++end;
      RunCheck run;
      run.first_part = static_cast<uint32_t>(k);
      run.end_part = static_cast<uint32_t>(end);
      run.contributors = parts_[k].contributors;
      for (uint32_t c : run.contributors) run.weights.push_back(senders_[c].weight);
      std::vector<Projection> sums(run.contributors.size());
      for (size_t q = k; q < end; ++q) {
        const Reduced& part = parts_[q];
        if (part.contributors.empty() || !part.result) continue;
        const auto [b, e] = PartRange(self_, q);
        z.resize(kDirections * (e - b));
        CheckDirections(seed, b, z);
        run.result_norm += Norm(*part.result);
        for (size_t i = 0; i < part.inputs.size(); ++i) {
          const int at = Position(run.contributors, part.input_senders[i]);
          if (at < 0) continue;
          sums[static_cast<size_t>(at)] = sums[static_cast<size_t>(at)] +
                                          ProjectDeviation(z, part.inputs[i], *part.result, tau);
        }
      }
      for (const Projection& p : sums) AppendEntry(run, p);
      span.runs.push_back(std::move(run));
      k = end;
    }
    out.spans.push_back(std::move(span));
  }
  // Every other span we received whole: our own projection where we contributed.
  std::vector<float> result;
  for (uint32_t j = 0; j < group_.members.size(); ++j) {
    const auto& parts = received_[j];
    if (j == self_ || group_.members[j].span == 0 || parts.size() != PartsOf(j)) continue;
    SpanCheck span{j, {}};
    for (size_t k = 0; k < parts.size();) {
      size_t end = k + 1;
      while (end < parts.size() && parts[end] == parts[k]) ++end;
      RunCheck run;
      run.first_part = static_cast<uint32_t>(k);
      run.end_part = static_cast<uint32_t>(end);
      run.contributors = parts[k];
      const bool mine = Position(run.contributors, self_) >= 0 && input_;
      Projection own;
      for (size_t q = k; q < end && !run.contributors.empty(); ++q) {
        const auto [b, e] = PartRange(j, q);
        result.resize(e - b);
        impl_->ReadRange(b, result);
        run.result_norm += Norm(result);
        if (!mine) continue;
        z.resize(kDirections * (e - b));
        CheckDirections(seed, b, z);
        own = own +
              ProjectDeviation(z, std::span<const float>(input_->data() + b, e - b), result, tau);
      }
      if (mine) {
        if (options.testing.WrongProjections()) {
          for (double& v : own.values) v = -v + own.norm + 1.0;
        }
        AppendEntry(run, own);
      }
      span.runs.push_back(std::move(run));
      k = end;
    }
    out.spans.push_back(std::move(span));
  }
  return out;
}

void AllReduceRun::DiscardSpan(uint32_t r) {
  if (!wants_results_) return;
  const uint64_t b = begins_[r];
  const uint64_t e = b + group_.members[r].span;
  if (impl_->options_.discard_to_zeros) {
    const std::vector<float> zeros(e - b, 0.0f);
    impl_->Scatter(b, zeros);
  } else if (input_) {
    impl_->Scatter(b, std::span<const float>(input_->data() + b, e - b));
  }
  std::erase_if(reports_, [&](const PartReport& p) { return p.begin >= b && p.end <= e; });
  KeepLocal(r, 0);
}

std::vector<uint32_t> AllReduceRun::AuditTargets(const std::string& seed_bytes) const {
  // Every member that may have sent values, ranked by a hash of (seed, member): the first
  // audit_targets of them.
  std::vector<std::pair<std::string, uint32_t>> ranked;
  for (uint32_t m = 0; m < group_.members.size(); ++m) {
    if (group_.members[m].mode == Mode::kAux) continue;
    std::string input = seed_bytes + "audit";
    for (int i = 0; i < 4; ++i) input.push_back(static_cast<char>((m >> (8 * i)) & 0xff));
    ranked.emplace_back(Sha256(input), m);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<uint32_t> out;
  for (size_t i = 0; i < ranked.size() && i < impl_->options_.audit_targets; ++i) {
    out.push_back(ranked[i].second);
  }
  return out;
}

std::vector<float> AllReduceRun::InputOf(uint32_t t) const {
  std::vector<float> out;
  for (size_t q = 0; q < my_parts_; ++q) {
    const Reduced& part = parts_[q];
    const auto it = std::find(part.input_senders.begin(), part.input_senders.end(), t);
    if (it == part.input_senders.end()) return {};
    const auto& in = part.inputs[static_cast<size_t>(it - part.input_senders.begin())];
    out.insert(out.end(), in.begin(), in.end());
  }
  return out;
}

asio::awaitable<std::string> AllReduceRun::Audit(uint32_t t, std::string* note) {
  const auto& commit = board_[PhaseIndex(VerifyPhase::kCommit)][t];
  if (!commit) {
    *note = "it sent no commitment";
    co_return std::string();
  }
  std::vector<float> sent = InputOf(t);
  if (sent.empty()) {
    *note = "this peer did not get its values for every part of its span";
    co_return std::string();
  }
  if (commit->audit_claim.empty()) {
    co_return std::string(
        "it was picked for an audit and claimed no data its values can be "
        "recomputed from");
  }
  auto recomputed = std::make_shared<std::vector<float>>(impl_->total_);
  auto work = [self = shared_from_this(), recomputed, member = group_.members[t].peer,
               claim = commit->audit_claim, weight = senders_[t].weight]() {
    return self->impl_->options_.recompute(member, claim, weight, *recomputed);
  };
  const Status st = co_await RunOn<Status>(PoolExecutor(), std::move(work));
  if (st.code() == StatusCode::kFailedPrecondition) {
    *note = st.message();
    co_return std::string();
  }
  if (!st.ok()) co_return fmt::format("its audit claim is invalid: {}", st.message());
  const uint64_t b = begins_[self_];
  const auto c = CompareAudited(
      sent, std::span<const float>(recomputed->data() + b, group_.members[self_].span));
  if (c.ok) co_return std::string();
  co_return fmt::format(
      "an audit recomputed its values from the data it claimed, and they differ from what it "
      "sent (relative error {:.3g})",
      c.relative_error);
}

asio::awaitable<Verification> AllReduceRun::Verify() {
  Verification out;
  out.performed = true;
  const size_t n = group_.members.size();
  const auto timeout = impl_->options_.part_timeout;
  std::vector<bool> party(n);
  for (size_t m = 0; m < n; ++m) party[m] = group_.members[m].mode != Mode::kClient && !banned_[m];

  // 1. Commit.
  std::string secret(kVerifyRevealBytes, '\0');
  randombytes_buf(secret.data(), secret.size());
  VerifyStatement commit;
  commit.group_id = group_.group_id;
  commit.member = self_;
  commit.phase = VerifyPhase::kCommit;
  commit.commitment = Sha256(secret);
  if (sends_) commit.audit_claim = audit_claim_;
  SteadyTime until = SteadyNow() + 2 * timeout;
  Broadcast(commit, party, until);
  co_await AwaitPhase(VerifyPhase::kCommit, party, until);
  std::vector<bool> committed(n);
  for (size_t m = 0; m < n; ++m) committed[m] = party[m] && board_[0][m].has_value();

  // 2. Reveal; the seed.
  VerifyStatement reveal;
  reveal.group_id = group_.group_id;
  reveal.member = self_;
  reveal.phase = VerifyPhase::kReveal;
  reveal.reveal = secret;
  until = SteadyNow() + timeout;
  Broadcast(reveal, party, until);
  co_await AwaitPhase(VerifyPhase::kReveal, committed, until);
  std::string seed_input = group_.group_id;
  std::vector<bool> revealed(n);
  for (uint32_t m = 0; m < n; ++m) {
    const auto& r = board_[1][m];
    if (!committed[m] || !r || Sha256(r->reveal) != board_[0][m]->commitment) continue;
    revealed[m] = true;
    for (int i = 0; i < 4; ++i) seed_input.push_back(static_cast<char>((m >> (8 * i)) & 0xff));
    seed_input += r->reveal;
  }
  const std::string seed_bytes = Sha256(seed_input);
  uint64_t seed = 0;
  for (int i = 0; i < 8; ++i) seed |= uint64_t{static_cast<uint8_t>(seed_bytes[i])} << (8 * i);

  // 3. Checks.
  if (const auto delay = impl_->options_.testing.checks_delay; delay.count() > 0) {
    asio::steady_timer wait(strand_, delay);
    co_await wait.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  auto self = shared_from_this();
  auto compute = [self, seed, seed_bytes]() { return self->OwnChecks(seed, seed_bytes); };
  VerifyStatement checks = co_await RunOn<VerifyStatement>(PoolExecutor(), std::move(compute));
  until = SteadyNow() + timeout;
  Broadcast(checks, impl_->options_.testing.withhold_checks ? std::vector<bool>(n, false) : party,
            until);
  co_await AwaitPhase(VerifyPhase::kChecks, revealed, until);

  // Audits, on our span: first of the members a published verdict accused (ban_evidence.h),
  // then of those the seed picked.
  std::vector<std::pair<uint32_t, std::string>> audit_failures;
  if (impl_->options_.audit_targets > 0 && my_parts_ > 0) {
    std::vector<uint32_t> targets;
    for (uint32_t m = 0; m < n; ++m) {
      if (group_.members[m].mode != Mode::kAux && impl_->IsSuspect(group_.members[m].peer)) {
        targets.push_back(m);
        out.audited_on_accusation.push_back(m);
      }
    }
    for (uint32_t t : AuditTargets(seed_bytes)) {
      if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
    }
    for (uint32_t t : targets) {
      if (t == self_ || banned_[t]) continue;
      std::string note;
      std::string guilty = co_await Audit(t, &note);
      if (!guilty.empty()) {
        audit_failures.emplace_back(t, std::move(guilty));
      } else if (!note.empty()) {
        out.reasons.push_back(
            fmt::format("member {} ({}) was picked for an audit that this peer "
                        "could not make: {}",
                        t, group_.members[t].peer.Short(), note));
      } else {
        out.audited.push_back(t);
        impl_->ClearSuspect(group_.members[t].peer);
      }
    }
  }

  // Judge, from the checks made on our direction.
  auto checks_of = [&](uint32_t m) -> const VerifyStatement* {
    const auto& s = board_[2][m];
    return s && s->seed == seed_bytes ? &*s : nullptr;
  };
  const double tau = impl_->options_.centered_clip ? impl_->options_.centered_clip->tau : 0.0;
  const char* replaced_by = impl_->options_.discard_to_zeros ? "zeros" : "this peer's own values";
  std::vector<bool> discard(n), ban(n);
  std::vector<std::string> why(n), evidence(n);
  std::set<std::pair<uint32_t, uint32_t>> disputes;  // (reducer, contributor)
  std::vector<size_t> counterparts(n), disputed(n);
  auto convict = [&](uint32_t m, std::string reason) {
    if (m == self_ || ban[m]) return;
    ban[m] = true;
    why[m] = std::move(reason);
  };
  for (uint32_t j = 0; j < n; ++j) {
    if (group_.members[j].span == 0 || banned_[j]) continue;
    const VerifyStatement* rs = checks_of(j);
    const SpanCheck* reduced = rs ? SpanOf(*rs, j) : nullptr;
    if (!reduced) {
      if (j != self_ && !received_[j].empty()) {
        discard[j] = true;
        out.reasons.push_back(fmt::format(
            "member {} ({}) sent no checks of its span on this round's direction; its results "
            "are replaced by {}",
            j, group_.members[j].peer.Short(), replaced_by));
        // Once may be a crash or a lost message; round after round, it is a reducer that
        // hands out results it will not let anyone check.
        const int silent = impl_->NoteReducerSilence(group_.members[j].peer, true);
        if (silent >= kMaxSilentRounds) {
          convict(j, fmt::format("it sent no checks of its results in {} rounds in a row", silent));
        }
      }
      continue;
    }
    if (j != self_) impl_->NoteReducerSilence(group_.members[j].peer, false);
    if (rs->clip_tau != tau) {  // another reduction than ours: a misconfigured peer
      discard[j] = j != self_;
      out.reasons.push_back(fmt::format(
          "member {} ({}) checked its span as a reduction with tau {:g}, this peer uses {:g}; its "
          "results are replaced by {}",
          j, group_.members[j].peer.Short(), rs->clip_tau, tau, replaced_by));
      continue;
    }
    if (reduced->runs.empty() || reduced->runs.back().end_part != PartsOf(j)) {
      convict(j, "its checks of its own span do not cover its parts");
      continue;
    }
    // Its own numbers convict it: the statement is evidence anyone can check.
    if (auto conviction = ReducerConviction(*rs); conviction.ok()) {
      convict(j, *conviction);
      evidence[j] = EncodeVerifyStatement(*rs);
      continue;
    }
    for (uint32_t c = 0; c < n; ++c) {
      if (c == j) continue;
      const VerifyStatement* cs = checks_of(c);
      const SpanCheck* theirs = cs ? SpanOf(*cs, j) : nullptr;
      if (!theirs) continue;
      ++counterparts[j];
      ++counterparts[c];
      if (!Agree(*reduced, *theirs, c, cs->weight)) {
        disputes.insert({j, c});
        ++disputed[j];
        ++disputed[c];
      }
    }
  }
  for (const auto& [j, c] : disputes) {
    if (j == self_) {
      convict(c, "its projections of this peer's span differ from what the data it sent gives");
    } else if (c == self_) {
      convict(j, "its checks of this peer's data differ from this peer's own");
    }
  }
  for (uint32_t m = 0; m < n; ++m) {
    if (disputed[m] * 2 > counterparts[m]) {
      convict(m, fmt::format("its checks contradict {} of the {} members it was checked against",
                             disputed[m], counterparts[m]));
    }
  }
  // A member convicted by an audit only lied about its own data: the span it reduced passed
  // its checks, and is kept (which keeps the honest members' results, and so their parameters,
  // alike: the next rounds' audits compare parameters).
  std::vector<bool> audit_only(n);
  for (auto& [t, reason] : audit_failures) {
    audit_only[t] = !ban[t];
    convict(t, std::move(reason));
  }
  // Our statements must reach the others before we ban anyone: a ban closes our connections to
  // the banned peer, and with them our checks still on their way to it. Otherwise a liar that
  // judges last convicts the honest members and cuts them off from the very checks that would
  // convict it. They must also reach the others before the step returns (a process may exit).
  while (statement_sends_ > 0 && SteadyNow() < until) co_await changed_.WaitUntil(until);
  for (uint32_t m = 0; m < n; ++m) {
    if (ban[m]) {
      impl_->Ban(group_.members[m].peer, why[m], std::move(evidence[m]), audit_only[m]);
      out.banned.push_back(m);
      out.reasons.push_back(
          fmt::format("member {} ({}) is banned: {}", m, group_.members[m].peer.Short(), why[m]));
      if (group_.members[m].span > 0 && !audit_only[m]) discard[m] = true;
    }
    if (discard[m] && m != self_) {
      DiscardSpan(m);
      out.discarded.push_back(m);
    }
  }
  out.bytes_sent = statement_bytes_;
  co_return out;
}

asio::awaitable<Result<net::Message>> Averager::Impl::HandleVerify(PeerId from,
                                                                   net::Message request) {
  if (request.meta.size() > kMaxVerifyStatementBytes) {
    co_return ProtocolError("a verification statement is over the size limit");
  }
  auto probe = DecodeVerifyStatement(request.meta, kMaxGroupSize);
  if (!probe.ok()) co_return probe.status();
  auto find = [self = shared_from_this(),
               id = probe->group_id]() -> asio::awaitable<std::shared_ptr<AllReduceRun>> {
    auto it = self->runs_.find(id);
    co_return it == self->runs_.end() ? nullptr : it->second;
  };
  auto run = co_await OnStrand<std::shared_ptr<AllReduceRun>>(strand_, std::move(find));
  if (!run) co_return NotFound("no all-reduce of that group is running here");
  auto add = [run, from, bytes = std::move(request.meta)]() -> asio::awaitable<Status> {
    co_return run->AddStatement(from, bytes);
  };
  Status st = co_await OnStrand<Status>(run->strand(), std::move(add));
  if (!st.ok()) co_return st;
  co_return net::Message();
}

}  // namespace colony::averaging
