// colony train: one peer of a collaborative training run (train::Trainer, train/trainer.h). This
// file parses flags and prints; the library does the training.
//
// With --json, stdout carries one JSON line per event (ready, eval, step, done). Otherwise a
// progress line goes to stderr every --progress-interval seconds:
//   epoch 12 (swarm 12) | loss 4.321 | 1530 samples/s (swarm 6120) | 4 peers | step in 1 s | ...
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "compression/codec.h"
#include "core/clock.h"
#include "moe/lm_task.h"
#include "swarm/lm_task.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"
#include "train/lr_schedule.h"
#include "train/powersgd.h"
#include "train/trainer.h"

namespace colony::cli {
namespace {

using Json = nlohmann::json;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GB", static_cast<double>(b) / (1 << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} kB", static_cast<double>(b) / 1024);
}

std::string Duration(const Json& seconds) {
  if (!seconds.is_number()) return "?";
  const double s = seconds.get<double>();
  if (s < 90) return fmt::format("{:.0f} s", s);
  if (s < 5400) return fmt::format("{:.0f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

// What the flags hold before they become TrainerOptions (units and names as on the command
// line).
struct TrainFlags {
  train::TrainerOptions o;
  std::string classifier = "cnn";
  bool client_mode = false, aux = false, json = false;
  std::string grad_codec = "none", diloco_codec = "blockwise8", fault = "none";
  std::string attack = "none";
  int64_t attack_from = 0;
  std::string lr_schedule = "constant";
  int64_t warmup_epochs = 0, lr_decay_epochs = 0;
  double matchmaking_time = 5, averaging_timeout = 60, rejoin_after = 30;
  double bandwidth_mbps = 1000, max_send_mbps = 0;
  std::string moe_grid;
  AccessArgs access;
};

// "8" or "4x4": the size of each dimension of an expert grid.
Result<std::vector<int64_t>> ParseGridSize(const std::string& text) {
  std::vector<int64_t> sizes;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find('x', start);
    const std::string part = text.substr(start, end == std::string::npos ? end : end - start);
    int64_t n = 0;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size() || n < 1 ||
        n > (int64_t{1} << 20) || sizes.size() == 8) {
      return InvalidArgument(fmt::format(
          "--moe-grid '{}': give each dimension's size (1 to 2^20), up to 8 joined by x, as in "
          "8 or 4x4",
          text));
    }
    sizes.push_back(n);
    if (end == std::string::npos) return sizes;
    start = end + 1;
  }
}

// Options that only one task reads are errors with the other (rather than silently ignored).
Status CheckTaskOptions(const CLI::App& cmd, const std::string& task) {
  static const char* kLmOnly[] = {"--corpus-bytes", "--vocab-size",   "--model-size",
                                  "--hidden-size",  "--layers",       "--heads",
                                  "--kv-heads",     "--seq-len",      "--save-model",
                                  "--sample",       "--sample-tokens"};
  static const char* kFashionOnly[] = {"--classifier"};
  static const char* kMoeOnly[] = {
      "--moe-prefix", "--moe-grid", "--moe-k-best", "--moe-k-min", "--moe-timeout-after-k-min",
      "--moe-timeout"};
  // moe-lm and swarm-lm have no Llama checkpoint to save or sample (parts live on servers).
  static const char* kLmModelOnly[] = {"--save-model", "--sample", "--sample-tokens"};
  // swarm-lm's model is its checkpoint's (--swarm-model).
  static const char* kSizes[] = {"--model-size", "--hidden-size", "--layers", "--heads",
                                 "--kv-heads"};
  std::vector<const char*> refused;
  if (task != "fashion-mnist")
    refused.insert(refused.end(), std::begin(kFashionOnly), std::end(kFashionOnly));
  if (task == "fashion-mnist")
    refused.insert(refused.end(), std::begin(kLmOnly), std::end(kLmOnly));
  if (task != "moe-lm") refused.insert(refused.end(), std::begin(kMoeOnly), std::end(kMoeOnly));
  if (task == "moe-lm" || task == "swarm-lm") {
    refused.insert(refused.end(), std::begin(kLmModelOnly), std::end(kLmModelOnly));
  }
  if (task == "swarm-lm") refused.insert(refused.end(), std::begin(kSizes), std::end(kSizes));
  if (task != "swarm-lm") {
    refused.push_back("--swarm-model");
    refused.push_back("--boundary-codec");
  }
  for (const char* name : refused) {
    if (cmd.count(name) > 0) {
      return InvalidArgument(fmt::format("{} does not apply to --task {}", name, task));
    }
  }
  const CLI::Option* audits = cmd.get_option_no_throw("--audit-targets");
  if (cmd.count("--seed") > 0 && audits != nullptr && audits->as<size_t>() > 0) {
    return InvalidArgument(
        "--seed does not apply with --audit-targets: an audited peer trains at each epoch on "
        "the data its run, identity and epoch give it (docs/training.md, \"Among strangers\")");
  }
  return Status::Ok();
}

// --attack: a Byzantine peer for benchmarks and tests (docs/training.md, "Among strangers").
Status ApplyAttack(const std::string& attack, int64_t from, train::TrainerOptions& o) {
  auto& t = o.collaborative.testing;
  t.attack_from_epoch = from;
  if (attack == "none") return Status::Ok();
  if (o.collaborative.diloco_inner_steps > 0 || o.collaborative.local_updates) {
    return InvalidArgument(
        "--attack plays a peer of gradient rounds: not with DiLoCo or "
        "--local-updates");
  }
  if (attack == "sign-flip") {
    t.gradient_attack = train::GradientAttack::kSignFlip;
  } else if (attack == "constant") {
    t.gradient_attack = train::GradientAttack::kConstant;
  } else if (attack == "stale") {
    t.gradient_attack = train::GradientAttack::kStale;
  } else if (attack == "label-flip") {
    if (o.task.task != "fashion-mnist") {
      return InvalidArgument("--attack label-flip needs a classifier: --task fashion-mnist");
    }
    o.task.flip_labels_from_epoch = from;
  } else if (attack == "wrong-result") {
    t.wrong_result = true;
  } else if (attack == "false-accusation") {
    if (!o.collaborative.verify_rounds) {
      return InvalidArgument(
          "--attack false-accusation lies in verification's checks: it needs "
          "--verify-rounds");
    }
    t.wrong_projections = true;
  } else {
    return InvalidArgument(fmt::format(
        "--attack must be none, sign-flip, label-flip, constant, stale, wrong-result or "
        "false-accusation, not '{}'",
        attack));
  }
  return Status::Ok();
}

Result<train::TrainerOptions> ToOptions(const TrainFlags& f) {
  train::TrainerOptions o = f.o;
  o.dht_validators = {SwarmRecordRules()};
  if (o.task.task == "moe-lm") {
    o.make_task = moe::MakeMoeLmTask;
    if (o.device == "auto") o.device = "cpu";  // its experts' replies combine in host memory
  }
  if (o.task.task == "swarm-lm") {
    if (o.task.swarm_model.empty()) {
      return InvalidArgument(
          "--task swarm-lm needs --swarm-model, the run's initial checkpoint (colony swarm-train "
          "init)");
    }
    o.make_task = swarm::MakeSwarmLmTask;
    o.task.swarm_run = o.collaborative.run_id;
    if (o.device == "auto") o.device = "cpu";  // its trainers compute on the CPU for now
  }
  // An auxiliary peer computes nothing: its model need not take a GPU.
  if (f.aux && o.device == "auto") o.device = "cpu";
  if (!f.moe_grid.empty()) {
    COLONY_ASSIGN_OR_RETURN(o.task.moe_grid, ParseGridSize(f.moe_grid));
  }
  o.task.classifier = f.classifier == "linear" ? model::FashionArchitecture::kLinear
                                               : model::FashionArchitecture::kCnn;
  auto& c = o.collaborative;
  c.mode = f.aux ? averaging::Mode::kAux
                 : (f.client_mode ? averaging::Mode::kClient : averaging::Mode::kNode);
  COLONY_ASSIGN_OR_RETURN(c.grad_codec, compression::ParseCodec(f.grad_codec));
  COLONY_ASSIGN_OR_RETURN(c.diloco_codec, compression::ParseCodec(f.diloco_codec));
  COLONY_ASSIGN_OR_RETURN(c.testing.fault, averaging::ParseFault(f.fault));
  COLONY_RETURN_IF_ERROR(ApplyAttack(f.attack, f.attack_from, o));
  COLONY_ASSIGN_OR_RETURN(c.lr_schedule.kind, train::ParseLrScheduleKind(f.lr_schedule));
  c.lr_schedule.warmup_epochs = f.warmup_epochs;
  c.lr_schedule.total_epochs = f.lr_decay_epochs > 0 ? f.lr_decay_epochs : o.max_epochs;
  COLONY_RETURN_IF_ERROR(
      c.lr_schedule.Check({.kind = "--lr-schedule",
                           .warmup = "--warmup-epochs",
                           .total = f.lr_decay_epochs > 0 ? "--lr-decay-epochs" : "--max-epochs"}));
  c.matchmaking_time = SecondsToMillis(f.matchmaking_time);
  c.averaging_timeout = SecondsToMillis(f.averaging_timeout);
  c.load_state_timeout = SecondsToMillis(f.averaging_timeout);
  c.rejoin_after = SecondsToMillis(f.rejoin_after);
  c.bandwidth = f.bandwidth_mbps * 1e6 / 8;
  c.max_send_rate = f.max_send_mbps * 1e6 / 8;
  o.stop = &g_stop;
  if (f.json) o.progress_interval = 0;
  return o;
}

void PrintProgress(const Json& e) {
  const auto peers = e["peers"].get<size_t>();
  std::string eta;
  if (e.contains("done_in_seconds")) eta = " | done in " + Duration(e["done_in_seconds"]);
  std::fprintf(stderr,
               "epoch %lld (swarm %lld) | loss %.3f | %.0f samples/s (swarm %.0f) | %zu peer%s | "
               "step in %s%s | sent %s, received %s\n",
               static_cast<long long>(e["epoch"].get<int64_t>()),
               static_cast<long long>(e["swarm_epoch"].get<int64_t>()),
               e["loss"].is_number() ? e["loss"].get<double>() : std::nan(""),
               e["samples_per_second"].get<double>(), e["swarm_samples_per_second"].get<double>(),
               peers, peers == 1 ? "" : "s", Duration(e["eta_seconds"]).c_str(), eta.c_str(),
               Bytes(e["bytes_sent"].get<uint64_t>()).c_str(),
               Bytes(e["bytes_received"].get<uint64_t>()).c_str());
}

void PrintDone(const Json& e) {
  if (!e.contains("epochs_trained")) return;  // an auxiliary peer
  std::fprintf(stderr,
               "done: %lld epochs in %.0f s, %lld samples here, eval loss %.3f, %lld skipped "
               "batches, %lld failed rounds, sent %s, received %s\n",
               static_cast<long long>(e["epochs_trained"].get<int64_t>()),
               e["seconds"].get<double>(), static_cast<long long>(e["samples"].get<int64_t>()),
               e["eval_loss"].get<double>(),
               static_cast<long long>(e["skipped_batches"].get<int64_t>()),
               static_cast<long long>(e["failed_rounds"].get<int64_t>()),
               Bytes(e["bytes_sent"].get<uint64_t>()).c_str(),
               Bytes(e["bytes_received"].get<uint64_t>()).c_str());
  if (e.contains("sample")) {
    std::fprintf(stderr, "sample: %s\n", e["sample"].get<std::string>().c_str());
  }
}

int Run(const TrainFlags& flags) {
  auto options = ToOptions(flags);
  if (!options.ok()) return Fail(options.status());
  const bool json = flags.json;
  auto print = [json](const Json& e) {
    const std::string& event = e["event"].get_ref<const std::string&>();
    if (json) {
      if (event == "progress") return;
      std::printf("%s\n", Dump(e).c_str());
      std::fflush(stdout);
    } else if (event == "progress") {
      PrintProgress(e);
    } else if (event == "done") {
      PrintDone(e);
    }
  };
  auto identity = LoadOrGenerateIdentity(flags.access.identity);
  if (!identity.ok()) return Fail(identity.status());
  auto access = MakeSwarmAccess(flags.access, identity->peer_id());
  if (!access.ok()) return Fail(access.status());
  options->identity = std::make_shared<KeyPair>(std::move(*identity));
  options->access = access->control;
  auto trainer = train::Trainer::Create(std::move(*options), print);
  if (!trainer.ok()) return Fail(trainer.status());
  // Token renewal and revocations run on the trainer's node, and stop before it goes.
  access->Attach((*trainer)->node());
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  auto done = (*trainer)->Run();
  access->Stop();
  return done.ok() ? 0 : Fail(done.status());
}

}  // namespace

namespace {

// The train command's flags, on `cmd` (colony train, and colony swarm-train trainer).
void AddTrainFlags(CLI::App* cmd, const std::shared_ptr<TrainFlags>& f) {
  auto& o = f->o;
  auto& t = o.task;
  auto& c = o.collaborative;
  cmd->add_option("--task", t.task,
                  "lm (a Llama-style decoder on linux-doc), moe-lm (the same with remote experts "
                  "as feed-forwards, served by colony experts serve), swarm-lm (the same with the "
                  "blocks on SWARM stages, served by colony swarm-train stage) or fashion-mnist")
      ->check(CLI::IsMember({"lm", "moe-lm", "swarm-lm", "fashion-mnist"}))
      ->capture_default_str();
  cmd->add_option("--swarm-model", t.swarm_model,
                  "swarm-lm: the run's initial checkpoint (colony swarm-train init), whose "
                  "embeddings, norm and head this trainer holds");
  cmd->add_option("--boundary-codec", t.swarm_boundary_codec,
                  "swarm-lm: how hidden states and their gradients cross stage boundaries: none, "
                  "fp16, bf16 or blockwise8 (8-bit, about a quarter of the bytes; lossy)")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "blockwise8"}))
      ->capture_default_str();
  cmd->add_option("--run-id", c.run_id, "name shared by the peers of one run")
      ->capture_default_str();
  cmd->add_option("--initial-peers", o.initial_peers,
                  "multiaddr of a peer in the swarm (repeatable; none: start a new swarm)")
      ->check(MultiaddrCheck());
  cmd->add_option("--listen", o.listen, "address to listen on")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  AddAnnounceOption(cmd, o.announce);
  cmd->add_flag("--client-mode", f->client_mode,
                "accept no connections (behind NAT): average as a client peer");
  AddAccessOptions(cmd, f->access);
  cmd->add_option("--relay", o.relays,
                  "behind NAT: accept connections through this relay peer (repeatable); "
                  "without it a peer that others cannot dial back picks a relay by itself")
      ->check(MultiaddrCheck());
  cmd->add_flag("--aux", f->aux, "auxiliary peer: lend bandwidth to averaging, train nothing");
  cmd->add_option("--cache-dir", t.cache_dir,
                  "where the corpus, tokenizer and token shards are cached (default: "
                  "$COLONY_CACHE_DIR or ~/.cache/colony)");
  cmd->add_option("--corpus-bytes", t.corpus_bytes, "lm: use this much text (0: all)")
      ->capture_default_str();
  cmd->add_option("--vocab-size", t.vocab_size, "lm: tokenizer vocabulary")
      ->check(CLI::Range(256, 65535))
      ->capture_default_str();
  cmd->add_option("--model-size", t.model_size, "lm: tiny (0.4M), small (3M) or base (25M)")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str();
  cmd->add_option("--classifier", f->classifier,
                  "fashion-mnist: cnn (19k parameters) or linear (logistic regression, 7.9k)")
      ->check(CLI::IsMember({"cnn", "linear"}))
      ->capture_default_str();
  cmd->add_option("--moe-prefix", t.moe_prefix,
                  "moe-lm: block l's experts form the grid named <prefix><l> (lm0.3, lm1.5, ...)")
      ->capture_default_str();
  cmd->add_option("--moe-grid", f->moe_grid,
                  "moe-lm: each block's grid, e.g. 8 or 4x4 (default 8); serve it with colony "
                  "experts serve --pattern 'lm0.[0:8]' --hidden-dim <the model's hidden size>");
  cmd->add_option("--moe-k-best", t.moe_k_best, "moe-lm: experts each token asks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--moe-k-min", t.moe_k_min,
                  "moe-lm: answers a token waits for before the rest get "
                  "--moe-timeout-after-k-min more")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--moe-timeout-after-k-min", t.moe_timeout_after_k_min,
                  "moe-lm: seconds to wait for the other experts once k-min answered")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--moe-timeout", t.moe_timeout, "moe-lm: seconds an expert call may take at most")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  cmd->add_option("--hidden-size", t.hidden_size, "lm: override the hidden size");
  cmd->add_option("--layers", t.layers, "lm: override the number of blocks");
  cmd->add_option("--heads", t.heads, "lm: override the attention heads");
  cmd->add_option("--kv-heads", t.kv_heads, "lm: override the key/value heads (GQA)");
  cmd->add_option("--seq-len", t.seq_len, "lm: tokens per sequence")
      ->check(CLI::Range(int64_t{8}, int64_t{8192}))
      ->capture_default_str();
  cmd->add_option("--batch-size", t.batch_size, "samples per local batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--eval-batch-size", t.eval_batch_size, "samples in the held-out batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  cmd->add_option("--seed", t.seed,
                  "this peer's data order (not with --audit-targets, where the run sets it)")
      ->capture_default_str();
  cmd->add_option("--init-seed", t.init_seed, "initial weights (the same on every peer of a run)")
      ->capture_default_str();
  cmd->add_option("--batch-delay", o.batch_delay_ms,
                  "milliseconds to pause after each batch, as a slower device would (tests use it "
                  "to set a pace that does not depend on the machine)")
      ->check(CLI::Range(0.0, 600'000.0))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "LibTorch intra-op threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  o.device = "auto";
  cmd->add_option("--device", o.device,
                  "where the model computes: cpu, cuda, cuda:N, or auto (the first GPU when "
                  "LibTorch has CUDA and sees one, else the CPU; moe-lm: the CPU)")
      ->capture_default_str();
  cmd->add_flag("--offload-optimizer", o.offload_optimizer,
                "on a GPU, keep the optimizer, its state and the accumulated gradients in host "
                "memory (float32 copies of the parameters), which saves GPU memory but copies "
                "every batch's gradients over the bus");
  cmd->add_option("--optimizer", o.optimizer, "sgd, adam, adamw, lamb, adam8bit or adamw8bit")
      ->capture_default_str();
  cmd->add_option("--lr", o.optimizer_config.lr,
                  "learning rate (of the inner optimizer with DiLoCo)")
      ->capture_default_str();
  cmd->add_option("--lr-schedule", f->lr_schedule,
                  "the rate by global epoch: constant, linear or cosine (both decay to 0 at "
                  "--lr-decay-epochs, as transformers' schedules with warmup)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}))
      ->capture_default_str();
  cmd->add_option("--warmup-epochs", f->warmup_epochs,
                  "grow the rate linearly from 0 over this many global epochs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--lr-decay-epochs", f->lr_decay_epochs,
                  "linear, cosine: the global epoch at which the rate reaches 0 (0: --max-epochs)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.optimizer_config.weight_decay, "weight decay")
      ->capture_default_str();
  cmd->add_option("--momentum", o.optimizer_config.momentum, "sgd momentum")->capture_default_str();
  cmd->add_option("--max-grad-norm", c.max_grad_norm,
                  "clip the averaged gradient to this L2 norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--target-batch-size", c.target_batch_size,
                  "samples the swarm accumulates per optimizer step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--grad-codec", f->grad_codec, "compression of averaged gradients")
      ->capture_default_str();
  cmd->add_option("--powersgd-rank", c.powersgd_rank,
                  "average gradient matrices as PowerSGD factors of this rank, with error "
                  "feedback (hivemind's PowerSGDGradientAverager; 0: whole)")
      ->check(CLI::Range(0, train::kMaxPowerSgdRank))
      ->capture_default_str();
  cmd->add_option("--centered-clip-tau", c.centered_clip_tau,
                  "reduce gradients with CenteredClip of this radius instead of the mean "
                  "(Byzantine-tolerant; 0: the mean)")
      ->capture_default_str();
  cmd->add_flag("--verify-rounds", c.verify_rounds,
                "check every reducer's result with the group after each round and ban cheaters "
                "(BTARD; needs --grad-codec none)");
  cmd->add_option("--audit-targets", c.audit_targets,
                  "with --verify-rounds: members each round's shared seed picks, whose gradients "
                  "every reducer recomputes from the data they claim, banning those whose "
                  "gradients are not what their data gives (BTARD's audits; fashion-mnist and lm)")
      ->capture_default_str();
  cmd->add_option("--average-state-every", c.average_state_every,
                  "also average parameters every this many epochs (0: never)")
      ->capture_default_str();
  cmd->add_flag("--delay-averaging", c.delay_grad_averaging,
                "average in the background while the next batch is computed");
  cmd->add_flag("--local-updates", c.local_updates,
                "step on every local batch and average parameters at each epoch");
  cmd->add_option("--diloco-inner-steps", c.diloco_inner_steps,
                  "DiLoCo: local steps between syncs (0: synchronous training)")
      ->capture_default_str();
  cmd->add_option("--outer-lr", c.outer_lr, "DiLoCo: outer Nesterov learning rate")
      ->capture_default_str();
  cmd->add_option("--outer-momentum", c.outer_momentum, "DiLoCo: outer momentum")
      ->capture_default_str();
  cmd->add_option("--diloco-codec", f->diloco_codec,
                  "DiLoCo: pseudo-gradient compression (blockwise8, blockwise4, ...)")
      ->capture_default_str();
  cmd->add_option("--diloco-fragments", c.diloco_fragments,
                  "DiLoCo: sync the parameters in this many fragments, in turn (streaming)")
      ->capture_default_str();
  cmd->add_option("--matchmaking-time", f->matchmaking_time,
                  "seconds a group leader waits for missing peers")
      ->capture_default_str();
  cmd->add_option("--averaging-timeout", f->averaging_timeout, "seconds per averaging round")
      ->capture_default_str();
  cmd->add_option("--target-group-size", c.target_group_size,
                  "largest averaging group: more peers at one epoch average in several groups, "
                  "which mix as the groups change from round to round (hivemind's "
                  "target_group_size)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{2}, size_t{256}));
  cmd->add_option("--bandwidth-mbps", f->bandwidth_mbps, "announced upload bandwidth")
      ->capture_default_str();
  cmd->add_option("--max-send-mbps", f->max_send_mbps, "cap on this peer's sending rate")
      ->capture_default_str();
  cmd->add_option("--min-peers", o.min_peers,
                  "wait until this many peers (this one included) are in the run, and start "
                  "together")
      ->capture_default_str();
  cmd->add_option("--join-at-epoch", o.join_at_epoch,
                  "stand by until the swarm reaches this epoch, then join it (0: at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--rejoin-after", f->rejoin_after,
                  "seconds without seeing another peer of the run before bootstrapping the DHT "
                  "again (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-epochs", o.max_epochs, "stop at this global epoch (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--max-seconds", o.max_seconds, "stop after this long (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--stop-at", o.stop_at, "stop at this wall-clock time (Unix seconds)");
  cmd->add_option("--eval-every", o.eval_every, "held-out loss every this many epochs")
      ->capture_default_str();
  cmd->add_option("--metrics", o.metrics, "append one JSON line per global step to this file");
  cmd->add_option("--checkpoint", o.checkpoint,
                  "resume from this file when it exists, and save to it at the end");
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "also save every this many epochs")
      ->capture_default_str();
  cmd->add_option("--save-model", o.save_model,
                  "lm: write the trained model here (Hugging Face Llama format + tokenizer)");
  cmd->add_option("--sample", o.sample_prompt,
                  "lm: print text sampled from this prompt at the end");
  cmd->add_option("--sample-tokens", o.sample_tokens, "lm: tokens to sample")
      ->capture_default_str();
  cmd->add_option("--progress-interval", o.progress_interval, "seconds between progress lines")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "print JSON lines (ready, eval, step, done) on stdout");
  cmd->add_option("--inject-fault", f->fault, "tests: an averaging fault (see colony average)");
  cmd->add_option("--nan-gradients-every", o.testing.nan_gradients_every,
                  "tests: every Nth batch, send NaN gradients to the group (unchecked)");
  cmd->add_option("--attack", f->attack,
                  "benchmarks and tests: play a Byzantine peer from --attack-from on: sign-flip, "
                  "label-flip (fashion-mnist), constant or stale gradients; wrong-result (a "
                  "cheating reducer) or false-accusation (lying checks; with --verify-rounds)")
      ->capture_default_str();
  cmd->add_option("--attack-from", f->attack_from, "the epoch --attack starts at")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace

void AddTrainCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto f = std::make_shared<TrainFlags>();
  f->o.collaborative.run_id = "colony.run";
  f->o.collaborative.target_batch_size = 256;
  f->o.optimizer_config.lr = 1e-3;
  f->o.collaborative.max_grad_norm = 1.0;
  auto* cmd = app.add_subcommand(
      "train",
      "train a model together with peers found in the DHT (hivemind-style collaborative "
      "optimizer, or DiLoCo with --diloco-inner-steps)");
  AddTrainFlags(cmd, f);
  commands.emplace_back(cmd, [f, cmd]() {
    Status st = CheckTaskOptions(*cmd, f->o.task.task);
    return st.ok() ? Run(*f) : Fail(st);
  });
}

void AddSwarmTrainerCommand(CLI::App* swarm_train,
                            std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto f = std::make_shared<TrainFlags>();
  f->o.task.task = "swarm-lm";
  f->o.collaborative.run_id = "colony.swarm";
  f->o.collaborative.target_batch_size = 256;
  f->o.optimizer_config.lr = 1e-3;
  // A global norm would need every stage's gradients: SWARM runs clip nothing by default.
  f->o.collaborative.max_grad_norm = 0;
  auto* cmd = swarm_train->add_subcommand(
      "trainer",
      "a SWARM trainer: hold the embeddings and head, stream data, push microbatches through "
      "one peer per stage (colony train --task swarm-lm, with the train command's flags)");
  AddTrainFlags(cmd, f);
  commands.emplace_back(cmd, [f, cmd]() {
    if (f->o.task.task != "swarm-lm") {
      return Fail("colony swarm-train trainer trains --task swarm-lm only; use colony train");
    }
    Status st = CheckTaskOptions(*cmd, f->o.task.task);
    return st.ok() ? Run(*f) : Fail(st);
  });
}

}  // namespace colony::cli
