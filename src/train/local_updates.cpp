// Local updates: every peer steps its optimizer on each of its own batches, and when the swarm
// has the target batch (target_batch.cpp) the peers at the epoch average their parameters,
// weighted by the samples each contributed. Cheaper in latency than gradient rounds (nobody
// waits for an all-reduce before its next step); the peers' models agree only after each
// averaging.
#include "core/log.h"
#include "train/internal.h"

namespace colony::train {
namespace {

class LocalUpdates final : public TargetBatchStepping {
 public:
  explicit LocalUpdates(CollaborativeOptimizer::Impl& peer) : TargetBatchStepping(peer) {}

  Status Init() {
    // Newcomers find donors under "<run>.grads.state", as in gradient rounds: the averager only
    // serves the state, its tensor is never averaged.
    unused_.assign(1, 0.0f);
    auto a = peer_.AveragerDefaults();
    a.prefix = peer_.options_.run_id + ".grads";
    COLONY_ASSIGN_OR_RETURN(sharing_, averaging::Averager::Create(peer_.node_, {unused_}, a));
    COLONY_ASSIGN_OR_RETURN(params_, ParameterAveraging::Create(peer_));
    return Status::Ok();
  }

  Status Contribute(int64_t batch_size, StepReport&) override {
    {
      std::lock_guard lock(peer_.state_mu_);
      peer_.StepOptimizer(peer_.epoch_);
    }
    peer_.ZeroGrads();
    Counted(batch_size);
    return Status::Ok();
  }

  averaging::Averager& Sharing() override { return *sharing_; }

  void Shutdown() override {
    sharing_->Shutdown();
    params_->Shutdown();
  }

 private:
  Status Average(StepReport& report) override {
    const int64_t samples = peer_.local_samples_;
    const int64_t round_epoch = peer_.epoch_;
    const size_t expected = peer_.PeersAtEpoch(round_epoch);
    report.realized_batch = samples;
    if (!params_->Average(samples, round_epoch, expected, report) && expected > 1) {
      peer_.diverged_ = true;  // stepped on its own batches only: take the swarm's parameters
      peer_.counters_.failed_rounds++;
    }
    {
      std::lock_guard lock(peer_.state_mu_);
      peer_.params_epoch_ = round_epoch + 1;  // stepped on every batch; now averaged (or alone)
    }
    NextEpoch(report);
    return AfterRound(report);
  }

  std::vector<float> unused_;
  std::unique_ptr<averaging::Averager> sharing_;
  std::unique_ptr<ParameterAveraging> params_;
};

}  // namespace

std::unique_ptr<Stepping> MakeLocalUpdates(CollaborativeOptimizer::Impl& peer, Status& status) {
  auto s = std::make_unique<LocalUpdates>(peer);
  status = s->Init();
  return s;
}

}  // namespace colony::train
