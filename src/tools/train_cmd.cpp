// colony train: one peer of a collaborative training run (train::CollaborativeOptimizer).
//
// Tasks: "lm" (a Llama-style decoder on the Linux kernel's documentation, with a sentencepiece
// tokenizer trained on first use and cached) and "fashion-mnist" (a small CNN). Every peer
// starts from the same initial weights (--init-seed) and reads its own shuffled data stream
// (--seed); a peer that joins a run in progress downloads the swarm's state first.
//
// Progress goes to stderr every --progress-interval seconds:
//   epoch 12 (swarm 12) | loss 4.321 | 1530 samples/s (swarm 6120) | 4 peers | step in 1.2 s | ...
// With --json, stdout carries one JSON line per event (ready, step, eval, done) for scripts.
// --metrics FILE appends one JSON line per global step.
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>

#include "core/log.h"
#include "core/multiaddr.h"
#include "dht/node.h"
#include "model/checkpoint.h"
#include "model/classifier.h"
#include "model/corpus.h"
#include "model/fashion_mnist.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "tools/commands.h"
#include "train/collaborative.h"
#include "train/optimizers.h"

namespace colony::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void Emit(bool json, const Json& j) {
  if (!json) return;
  std::printf("%s\n", Dump(j).c_str());
  std::fflush(stdout);
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GB", static_cast<double>(b) / (1 << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} kB", static_cast<double>(b) / 1024);
}

std::string Duration(double s) {
  if (!std::isfinite(s)) return "?";
  if (s < 90) return fmt::format("{:.0f} s", s);
  if (s < 5400) return fmt::format("{:.0f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

struct TrainTaskArgs {
  std::string task = "lm";
  std::string run_id = "colony.run";
  std::vector<std::string> initial_peers;
  std::string listen = "/ip4/127.0.0.1/tcp/0";
  bool client_mode = false;
  std::vector<std::string> relays;
  bool aux = false;
  // data and model
  std::string cache_dir;
  uint64_t corpus_bytes = 0;
  int vocab_size = 4096;
  std::string model_size = "tiny";
  std::string classifier = "cnn";
  int64_t hidden_size = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t seq_len = 128;
  int64_t batch_size = 16;
  int64_t eval_batch_size = 32;
  uint64_t seed = 0;
  uint64_t init_seed = 0;
  int threads = 1;
  double batch_delay_ms = 0;
  // optimization
  std::string optimizer = "adam";
  double lr = 1e-3;
  double weight_decay = 0;
  double momentum = 0;
  double max_grad_norm = 1.0;
  int64_t target_batch_size = 256;
  std::string grad_codec = "none";
  int average_state_every = 0;
  bool delay_averaging = false;
  bool local_updates = false;
  int diloco_inner_steps = 0;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string diloco_codec = "blockwise8";
  int diloco_fragments = 1;
  double matchmaking_time = 5;
  double averaging_timeout = 60;
  double bandwidth_mbps = 1000;
  double max_send_mbps = 0;
  // run
  int min_peers = 0;
  int64_t join_at_epoch = 0;
  double rejoin_after = 30;
  int64_t max_epochs = 0;
  double max_seconds = 0;
  double stop_at = 0;
  int eval_every = 0;
  std::string metrics;
  std::string checkpoint;
  int checkpoint_every = 0;
  std::string save_model;
  std::string sample_prompt;
  int64_t sample_tokens = 48;
  double progress_interval = 5;
  bool json = false;
  // tests
  std::string fault = "none";
  int64_t nan_gradients_every = 0;
};

model::LlamaConfig LmConfig(const TrainTaskArgs& a) {
  model::LlamaConfig c;
  if (a.model_size == "small") {
    c.hidden_size = 256, c.num_layers = 4, c.num_heads = 8, c.num_kv_heads = 4;
  } else if (a.model_size == "base") {
    c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8, c.num_kv_heads = 4;
  } else {  // tiny
    c.hidden_size = 128, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2;
  }
  if (a.hidden_size > 0) c.hidden_size = a.hidden_size;
  if (a.layers > 0) c.num_layers = a.layers;
  if (a.heads > 0) c.num_heads = a.heads;
  if (a.kv_heads > 0) c.num_kv_heads = a.kv_heads;
  // SwiGLU width: about 8/3 of the hidden size, rounded up to a multiple of 32.
  c.intermediate_size = (c.hidden_size * 8 / 3 + 31) / 32 * 32;
  c.max_seq_len = std::max<int64_t>(a.seq_len, 64);
  return c;
}

// A task: a model, its data and its loss.
class Task {
 public:
  virtual ~Task() = default;
  virtual std::vector<at::Tensor> Parameters() = 0;
  // One forward/backward pass on the next batch; returns the loss and the sample count.
  virtual std::pair<double, int64_t> TrainBatch() = 0;
  // Loss on a fixed held-out batch (no gradients).
  virtual double Evaluate() = 0;
  virtual Json Describe() = 0;
  virtual Status Save(const std::filesystem::path&) { return Status::Ok(); }
  virtual std::string Sample(const std::string&, int64_t) { return {}; }
};

class LmTask final : public Task {
 public:
  static Result<std::unique_ptr<LmTask>> Create(const TrainTaskArgs& a) {
    auto t = std::unique_ptr<LmTask>(new LmTask());
    model::CorpusOptions co;
    if (!a.cache_dir.empty()) co.cache_dir = a.cache_dir;
    co.max_bytes = a.corpus_bytes;
    COLONY_ASSIGN_OR_RETURN(auto corpus, model::PrepareCorpus(co));
    const auto cache =
        a.cache_dir.empty() ? model::DefaultCacheDir() : std::filesystem::path(a.cache_dir);
    COLONY_ASSIGN_OR_RETURN(auto tok, model::Tokenizer::TrainOrLoad(corpus, cache, a.vocab_size));
    t->tokenizer_ = std::make_unique<model::Tokenizer>(std::move(tok));
    const auto shard_dir = cache / ("shards-" + t->tokenizer_->hash());
    COLONY_ASSIGN_OR_RETURN(auto shards,
                            model::PrepareTokenShards(corpus, *t->tokenizer_, shard_dir));
    COLONY_ASSIGN_OR_RETURN(auto stream,
                            model::TokenStream::Open(shards, a.seed, a.batch_size, a.seq_len));
    t->stream_ = std::make_unique<model::TokenStream>(std::move(stream));
    COLONY_ASSIGN_OR_RETURN(
        auto valid, model::TokenStream::ValidationBatch(shards, a.eval_batch_size, a.seq_len));
    t->valid_ = ToTensor(valid);
    t->config_ = LmConfig(a);
    t->config_.vocab_size = t->tokenizer_->vocab_size();
    COLONY_RETURN_IF_ERROR(t->config_.Validate());
    torch::manual_seed(a.init_seed);
    t->model_ = model::LlamaModel(t->config_);
    return t;
  }

  std::vector<at::Tensor> Parameters() override { return model_->parameters(); }

  std::pair<double, int64_t> TrainBatch() override {
    at::Tensor batch = ToTensor(stream_->Next());
    auto inputs = batch.slice(1, 0, batch.size(1) - 1);
    auto targets = batch.slice(1, 1, batch.size(1));
    auto loss = model::LanguageModelLoss(model_->forward(inputs), targets);
    loss.backward();
    return {loss.item<double>(), batch.size(0)};
  }

  double Evaluate() override {
    torch::NoGradGuard no_grad;
    auto inputs = valid_.slice(1, 0, valid_.size(1) - 1);
    auto targets = valid_.slice(1, 1, valid_.size(1));
    return model::LanguageModelLoss(model_->forward(inputs), targets).item<double>();
  }

  Json Describe() override {
    return {{"task", "lm"},
            {"parameters", config_.NumParameters()},
            {"vocab_size", config_.vocab_size},
            {"hidden_size", config_.hidden_size},
            {"layers", config_.num_layers}};
  }

  Status Save(const std::filesystem::path& dir) override {
    COLONY_RETURN_IF_ERROR(model::SaveLlama(dir, model_, config_));
    // The tokenizer travels with the model, as Llama checkpoints carry tokenizer.model.
    return tokenizer_->Save(dir / "tokenizer.model");
  }

  std::string Sample(const std::string& prompt, int64_t tokens) override {
    torch::NoGradGuard no_grad;
    auto ids = tokenizer_->Encode(prompt);
    std::vector<int64_t> p(ids.begin(), ids.end());
    if (tokenizer_->bos_id() >= 0) p.insert(p.begin(), tokenizer_->bos_id());
    model::SamplingOptions so;
    so.max_new_tokens = tokens;
    so.temperature = 0.8;
    so.top_k = 40;
    so.repetition_penalty = 1.1;
    so.seed = 1;
    auto out = model::Generate(model_, p, so, tokenizer_->eos_id());
    std::vector<int32_t> all(out.begin(), out.end());
    return tokenizer_->Decode(all);
  }

 private:
  LmTask() = default;
  static at::Tensor ToTensor(const model::TokenBatch& b) {
    return torch::from_blob(const_cast<int32_t*>(b.tokens.data()), {b.batch_size, b.seq_len + 1},
                            torch::kInt32)
        .to(torch::kInt64);
  }
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::TokenStream> stream_;
  at::Tensor valid_;
  model::LlamaConfig config_;
  model::LlamaModel model_{nullptr};
};

class FashionTask final : public Task {
 public:
  static Result<std::unique_ptr<FashionTask>> Create(const TrainTaskArgs& a) {
    auto t = std::unique_ptr<FashionTask>(new FashionTask());
    COLONY_ASSIGN_OR_RETURN(auto train, model::LoadFashionMnist(true));
    COLONY_ASSIGN_OR_RETURN(auto test, model::LoadFashionMnist(false));
    t->stream_ = std::make_unique<model::ImageBatchStream>(
        std::make_shared<const model::ImageDataset>(std::move(train)), a.seed, a.batch_size);
    const int64_t n = std::min<int64_t>(a.eval_batch_size * 8, test.size);
    t->test_images_ = torch::from_blob(test.images.data(), {n, 1, 28, 28}, torch::kFloat).clone();
    t->test_labels_ = torch::from_blob(test.labels.data(), {n}, torch::kInt64).clone();
    torch::manual_seed(a.init_seed);
    t->model_ =
        model::FashionClassifier(a.classifier == "linear" ? model::FashionArchitecture::kLinear
                                                          : model::FashionArchitecture::kCnn);
    return t;
  }

  std::vector<at::Tensor> Parameters() override { return model_->parameters(); }

  std::pair<double, int64_t> TrainBatch() override {
    auto b = stream_->Next();
    auto images = torch::from_blob(b.images.data(), {b.batch_size, 1, 28, 28}, torch::kFloat);
    auto labels = torch::from_blob(b.labels.data(), {b.batch_size}, torch::kInt64);
    auto loss = torch::nn::functional::cross_entropy(model_->forward(images), labels);
    loss.backward();
    return {loss.item<double>(), b.batch_size};
  }

  double Evaluate() override {
    torch::NoGradGuard no_grad;
    auto logits = model_->forward(test_images_);
    accuracy_ = logits.argmax(1).eq(test_labels_).to(torch::kFloat).mean().item<double>();
    return torch::nn::functional::cross_entropy(logits, test_labels_).item<double>();
  }

  Json Describe() override {
    int64_t n = 0;
    for (auto& p : model_->parameters()) n += p.numel();
    return {{"task", "fashion-mnist"},
            {"classifier",
             model_->architecture == model::FashionArchitecture::kLinear ? "linear" : "cnn"},
            {"parameters", n},
            {"accuracy", accuracy_}};
  }

 private:
  FashionTask() = default;
  std::unique_ptr<model::ImageBatchStream> stream_;
  at::Tensor test_images_, test_labels_;
  model::FashionClassifier model_{nullptr};
  double accuracy_ = 0;
};

Result<std::unique_ptr<Task>> MakeTask(const TrainTaskArgs& a) {
  if (a.task == "lm") {
    COLONY_ASSIGN_OR_RETURN(auto t, LmTask::Create(a));
    return std::unique_ptr<Task>(std::move(t));
  }
  if (a.task == "fashion-mnist") {
    COLONY_ASSIGN_OR_RETURN(auto t, FashionTask::Create(a));
    return std::unique_ptr<Task>(std::move(t));
  }
  return InvalidArgument(fmt::format("unknown task '{}'; use lm or fashion-mnist", a.task));
}

// FNV-1a over the parameters' bytes: peers of a run that end at the same epoch print the same
// hash exactly when they hold bit-identical models.
std::string ParamsHash(const std::vector<at::Tensor>& params) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : params) {
    const at::Tensor c = p.detach().contiguous();
    const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

int Run(const TrainTaskArgs& a) {
  torch::set_num_threads(a.threads);
  auto mode = a.aux ? averaging::Mode::kAux
                    : (a.client_mode ? averaging::Mode::kClient : averaging::Mode::kNode);
  auto grad_codec = compression::ParseCodec(a.grad_codec);
  if (!grad_codec.ok()) return Fail(grad_codec.status());
  auto diloco_codec = compression::ParseCodec(a.diloco_codec);
  if (!diloco_codec.ok()) return Fail(diloco_codec.status());
  auto fault = averaging::ParseFault(a.fault);
  if (!fault.ok()) return Fail(fault.status());

  if (mode != averaging::Mode::kNode && a.initial_peers.empty()) {
    return Fail("--client-mode and --aux peers join an existing swarm: give --initial-peers");
  }
  const auto t0 = Clock::now();
  auto task = MakeTask(a);
  if (!task.ok()) return Fail(task.status().WithContext("preparing the task"));
  const double prepare_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  dht::NodeOptions node_options;
  node_options.initial_peers = a.initial_peers;
  node_options.relays = a.relays;
  if (mode == averaging::Mode::kClient || !a.relays.empty()) {
    node_options.dht.client_mode = true;
  } else {
    auto listen = Multiaddr::Parse(a.listen);
    if (!listen.ok()) return Fail(listen.status());
    node_options.listen = {*listen};
  }
  auto node = dht::Node::Start(KeyPair::Generate(), node_options);
  if (!node.ok()) return Fail(node.status().WithContext("joining the DHT"));

  train::OptimizerConfig oc;
  oc.lr = a.lr;
  oc.weight_decay = a.weight_decay;
  oc.momentum = a.momentum;
  auto params = (*task)->Parameters();
  auto inner = train::MakeOptimizer(a.optimizer, params, oc);
  if (!inner.ok()) return Fail(inner.status());
  std::shared_ptr<torch::optim::Optimizer> optimizer = std::move(*inner);

  train::CollaborativeOptions o;
  o.run_id = a.run_id;
  o.target_batch_size = a.target_batch_size;
  o.mode = mode;
  o.matchmaking_time = Ms(a.matchmaking_time);
  o.averaging_timeout = Ms(a.averaging_timeout);
  o.grad_codec = *grad_codec;
  o.average_state_every = a.average_state_every;
  o.delay_grad_averaging = a.delay_averaging;
  o.local_updates = a.local_updates;
  o.max_grad_norm = a.max_grad_norm;
  o.diloco_inner_steps = a.diloco_inner_steps;
  o.outer_lr = a.outer_lr;
  o.outer_momentum = a.outer_momentum;
  o.diloco_codec = *diloco_codec;
  o.diloco_fragments = a.diloco_fragments;
  o.load_state_timeout = Ms(a.averaging_timeout);
  o.bandwidth = a.bandwidth_mbps * 1e6 / 8;
  o.max_send_rate = a.max_send_mbps * 1e6 / 8;
  o.testing.fault = *fault;
  o.testing.unchecked_local_gradients = a.nan_gradients_every > 0;
  o.interrupt = &g_stop;
  o.rejoin_after = Ms(a.rejoin_after);
  auto co = train::CollaborativeOptimizer::Create(**node, params, optimizer, o);
  if (!co.ok()) return Fail(co.status());
  auto& opt = **co;

  Json ready = {{"event", "ready"},
                {"peer", (*node)->peer_id().ToString()},
                {"prepare_seconds", prepare_seconds},
                {"model", (*task)->Describe()}};
  Json addrs = Json::array();
  for (const auto& m : (*node)->VisibleAddresses()) addrs.push_back(m.ToString());
  ready["addrs"] = addrs;
  Emit(a.json, ready);
  COLONY_LOG_INFO("train: peer {} ready ({} parameters, prepared in {:.1f} s){}",
                  (*node)->peer_id().ToString(), ready["model"]["parameters"].dump(),
                  prepare_seconds, addrs.empty() ? "" : "; listening on " + addrs[0].dump());

  // Resume: a local checkpoint first, then the swarm's state if the swarm is ahead.
  if (!a.checkpoint.empty() && std::filesystem::exists(a.checkpoint)) {
    Status st = opt.LoadCheckpoint(a.checkpoint);
    if (!st.ok()) return Fail(st.WithContext("loading checkpoint " + a.checkpoint));
    COLONY_LOG_INFO("train: resumed from {} at epoch {}", a.checkpoint, opt.local_epoch());
  }
  std::ofstream metrics;
  if (!a.metrics.empty()) {
    metrics.open(a.metrics, std::ios::app);
    if (!metrics) return Fail("could not open the metrics file " + a.metrics);
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  if (mode == averaging::Mode::kAux) {
    const auto deadline = Clock::now() + Ms(a.max_seconds > 0 ? a.max_seconds : 1e9);
    Status st = opt.RunAuxiliary([&] { return g_stop.load() || Clock::now() >= deadline; });
    Emit(a.json, {{"event", "done"}, {"ok", st.ok()}});
    return st.ok() ? 0 : Fail(st);
  }

  if (a.min_peers > 1) {
    // Wait (bounded) until the swarm has the peers asked for, so that a run starts together.
    Status st = opt.WaitForPeers(static_cast<size_t>(a.min_peers), std::chrono::seconds(120));
    if (!st.ok() && !g_stop) {
      return Fail(
          fmt::format("{} within 120 s (--min-peers); check that the others use the same "
                      "--run-id and --initial-peers",
                      st.message()));
    }
  }
  if (a.join_at_epoch > 0) {
    // Stand by (training nothing) until the swarm reaches the epoch asked for, then join it.
    const auto deadline = Clock::now() + std::chrono::minutes(30);
    while (opt.global().epoch < a.join_at_epoch && !g_stop && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the tracker refreshes
    }
    if (opt.global().epoch < a.join_at_epoch && !g_stop) {
      return Fail(fmt::format("run '{}' did not reach epoch {} (--join-at-epoch) within 30 min",
                              a.run_id, a.join_at_epoch));
    }
  }
  {
    // Join a run in progress: wait briefly for the swarm's view, then catch up.
    const auto g = [&] {
      for (int i = 0; i < 3; ++i) {
        auto gp = opt.global();
        if (gp.fetched_at > 0) return gp;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the tracker's first fetch
      }
      return opt.global();
    }();
    if (g.epoch > opt.local_epoch()) {
      Status st = opt.LoadStateFromPeers();
      if (!st.ok()) {
        COLONY_LOG_WARN(
            "train: the swarm is at epoch {} but its state could not be downloaded "
            "({}); starting from epoch {}",
            g.epoch, st.ToString(), opt.local_epoch());
      }
    }
  }

  if (a.eval_every > 0) {
    const double initial = (*task)->Evaluate();
    Emit(a.json, {{"event", "eval"}, {"epoch", opt.local_epoch()}, {"eval_loss", initial}});
  }
  const auto start = Clock::now();
  auto last_print = start;
  double loss_sum = 0;
  int64_t loss_count = 0;
  double last_loss = std::nan("");
  double last_eval = std::nan("");
  int64_t batches = 0;
  auto epoch_start = Clock::now();
  double epoch_seconds = 0;  // moving average of the time per global step
  const int64_t first_epoch = opt.local_epoch();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto done = [&] {
    return g_stop.load() || (a.max_epochs > 0 && opt.local_epoch() >= a.max_epochs) ||
           (a.max_seconds > 0 && elapsed() >= a.max_seconds) ||
           (a.stop_at > 0 && dht::Now() >= a.stop_at);
  };
  while (!done()) {
    auto [loss, n] = (*task)->TrainBatch();
    ++batches;
    if (a.batch_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(
          static_cast<int64_t>(a.batch_delay_ms * 1000)));  // --batch-delay: a slower device
    }
    if (a.nan_gradients_every > 0 && batches % a.nan_gradients_every == 0) {
      for (auto& p : params) {
        if (p.grad().defined()) p.mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
      }
    }
    if (std::isfinite(loss)) {
      loss_sum += loss;
      ++loss_count;
    }
    auto r = opt.Step(n);
    if (!r.ok()) return Fail(r.status());
    if (r->stepped || r->loaded_state) {
      const double took = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      epoch_start = Clock::now();
      epoch_seconds = epoch_seconds == 0 ? took : 0.7 * epoch_seconds + 0.3 * took;
      last_loss = loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : std::nan("");
      loss_sum = 0;
      loss_count = 0;
      const bool eval = a.eval_every > 0 && opt.local_epoch() % a.eval_every == 0;
      if (eval) last_eval = (*task)->Evaluate();
      const auto g = opt.global();
      const auto c = opt.counters();
      Json j = {{"event", "step"},
                {"time", dht::Now()},
                {"elapsed", elapsed()},
                {"epoch", opt.local_epoch()},
                {"loss", std::isfinite(last_loss) ? Json(last_loss) : Json(nullptr)},
                {"realized_batch", r->realized_batch},
                {"group_size", r->group_size},
                {"averaged", r->averaged},
                {"loaded_state", r->loaded_state},
                {"samples", c.local_samples},
                {"samples_per_second", opt.samples_per_second()},
                {"swarm_samples_per_second", g.samples_per_second},
                {"peers", g.num_peers},
                {"skipped_batches", c.skipped_batches},
                {"missed_rounds", c.missed_rounds},
                {"state_loads", c.state_loads},
                {"bytes_sent", c.bytes_sent},
                {"bytes_received", c.bytes_received}};
      if (eval) j["eval_loss"] = last_eval;
      if (!r->note.empty()) j["note"] = r->note;
      Emit(a.json, j);
      if (metrics) metrics << Dump(j) << "\n" << std::flush;
      if (!a.checkpoint.empty() && a.checkpoint_every > 0 &&
          opt.local_epoch() % a.checkpoint_every == 0) {
        Status st = opt.SaveCheckpoint(a.checkpoint);
        if (!st.ok()) COLONY_LOG_WARN("train: checkpoint failed: {}", st.ToString());
      }
    }
    if (!a.json && a.progress_interval > 0 &&
        std::chrono::duration<double>(Clock::now() - last_print).count() >= a.progress_interval) {
      last_print = Clock::now();
      const auto g = opt.global();
      const auto c = opt.counters();
      std::string eta;
      if (a.max_epochs > 0 && epoch_seconds > 0) {
        eta = " | done in " +
              Duration(epoch_seconds * static_cast<double>(a.max_epochs - opt.local_epoch()));
      }
      const double shown_loss =
          loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : last_loss;
      std::fprintf(stderr,
                   "epoch %lld (swarm %lld) | loss %.3f | %.0f samples/s (swarm %.0f) | %zu "
                   "peer%s | step in %s%s | sent %s, received %s\n",
                   static_cast<long long>(opt.local_epoch()), static_cast<long long>(g.epoch),
                   shown_loss, opt.samples_per_second(), g.samples_per_second, g.num_peers,
                   g.num_peers == 1 ? "" : "s", Duration(g.eta_seconds).c_str(), eta.c_str(),
                   Bytes(c.bytes_sent).c_str(), Bytes(c.bytes_received).c_str());
    }
  }

  const double final_eval = (*task)->Evaluate();
  const auto c = opt.counters();
  Json summary = {{"event", "done"},
                  {"ok", true},
                  {"epoch", opt.local_epoch()},
                  {"epochs_trained", opt.local_epoch() - first_epoch},
                  {"batches", batches},
                  {"samples", c.local_samples},
                  {"seconds", elapsed()},
                  {"final_loss", std::isfinite(last_loss) ? Json(last_loss) : Json(nullptr)},
                  {"eval_loss", final_eval},
                  {"skipped_batches", c.skipped_batches},
                  {"failed_rounds", c.failed_rounds},
                  {"missed_rounds", c.missed_rounds},
                  {"dropped_samples", c.dropped_samples},
                  {"state_loads", c.state_loads},
                  {"bytes_sent", c.bytes_sent},
                  {"bytes_received", c.bytes_received},
                  {"params_hash", ParamsHash(params)},
                  {"model", (*task)->Describe()}};
  if (!a.checkpoint.empty()) {
    Status st = opt.SaveCheckpoint(a.checkpoint);
    if (!st.ok()) COLONY_LOG_WARN("train: checkpoint failed: {}", st.ToString());
  }
  if (!a.save_model.empty()) {
    Status st = (*task)->Save(a.save_model);
    if (!st.ok()) return Fail(st.WithContext("saving the model to " + a.save_model));
    summary["saved_model"] = a.save_model;
  }
  if (!a.sample_prompt.empty()) {
    summary["sample"] = (*task)->Sample(a.sample_prompt, a.sample_tokens);
  }
  Emit(a.json, summary);
  if (!a.json) {
    std::fprintf(stderr,
                 "done: %lld epochs in %.0f s, %lld samples here, eval loss %.3f, %lld skipped "
                 "batches, %lld failed rounds, sent %s, received %s\n",
                 static_cast<long long>(opt.local_epoch() - first_epoch), elapsed(),
                 static_cast<long long>(c.local_samples), final_eval,
                 static_cast<long long>(c.skipped_batches), static_cast<long long>(c.failed_rounds),
                 Bytes(c.bytes_sent).c_str(), Bytes(c.bytes_received).c_str());
    if (summary.contains("sample")) {
      std::fprintf(stderr, "sample: %s\n", summary["sample"].get<std::string>().c_str());
    }
  }
  return 0;
}

// Options that only one task reads are errors with the other (rather than silently ignored).
Status CheckTaskOptions(const CLI::App& cmd, const std::string& task) {
  static const char* kLmOnly[] = {"--corpus-bytes", "--vocab-size",   "--model-size",
                                  "--hidden-size",  "--layers",       "--heads",
                                  "--kv-heads",     "--seq-len",      "--save-model",
                                  "--sample",       "--sample-tokens"};
  static const char* kFashionOnly[] = {"--classifier"};
  for (const char* name : task == "lm" ? std::span<const char* const>(kFashionOnly)
                                       : std::span<const char* const>(kLmOnly)) {
    if (cmd.count(name) > 0) {
      return InvalidArgument(fmt::format("{} does not apply to --task {}", name, task));
    }
  }
  return Status::Ok();
}

}  // namespace

void AddTrainCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto a = std::make_shared<TrainTaskArgs>();
  auto* cmd = app.add_subcommand(
      "train",
      "train a model together with peers found in the DHT (hivemind-style collaborative "
      "optimizer, or DiLoCo with --diloco-inner-steps)");
  cmd->add_option("--task", a->task, "lm (a Llama-style decoder on linux-doc) or fashion-mnist")
      ->capture_default_str();
  cmd->add_option("--run-id", a->run_id, "name shared by the peers of one run")
      ->capture_default_str();
  cmd->add_option("--initial-peers", a->initial_peers,
                  "multiaddr of a peer in the swarm (repeatable; none: start a new swarm)");
  cmd->add_option("--listen", a->listen, "address to listen on")->capture_default_str();
  cmd->add_flag("--client-mode", a->client_mode,
                "accept no connections (behind NAT): average as a client peer");
  cmd->add_option("--relay", a->relays,
                  "behind NAT: accept connections through this relay peer (repeatable); "
                  "without it a peer that others cannot dial back picks a relay by itself");
  cmd->add_flag("--aux", a->aux, "auxiliary peer: lend bandwidth to averaging, train nothing");
  cmd->add_option("--cache-dir", a->cache_dir,
                  "where the corpus, tokenizer and token shards are cached (default: "
                  "$COLONY_CACHE_DIR or ~/.cache/colony)");
  cmd->add_option("--corpus-bytes", a->corpus_bytes, "lm: use this much text (0: all)")
      ->capture_default_str();
  cmd->add_option("--vocab-size", a->vocab_size, "lm: tokenizer vocabulary")
      ->check(CLI::Range(256, 65535))
      ->capture_default_str();
  cmd->add_option("--model-size", a->model_size, "lm: tiny (0.4M), small (3M) or base (25M)")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str();
  cmd->add_option("--classifier", a->classifier,
                  "fashion-mnist: cnn (19k parameters) or linear (logistic regression, 7.9k)")
      ->check(CLI::IsMember({"cnn", "linear"}))
      ->capture_default_str();
  cmd->add_option("--hidden-size", a->hidden_size, "lm: override the hidden size");
  cmd->add_option("--layers", a->layers, "lm: override the number of blocks");
  cmd->add_option("--heads", a->heads, "lm: override the attention heads");
  cmd->add_option("--kv-heads", a->kv_heads, "lm: override the key/value heads (GQA)");
  cmd->add_option("--seq-len", a->seq_len, "lm: tokens per sequence")
      ->check(CLI::Range(int64_t{8}, int64_t{8192}))
      ->capture_default_str();
  cmd->add_option("--batch-size", a->batch_size, "samples per local batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--eval-batch-size", a->eval_batch_size, "samples in the held-out batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "this peer's data order")->capture_default_str();
  cmd->add_option("--init-seed", a->init_seed, "initial weights (the same on every peer of a run)")
      ->capture_default_str();
  cmd->add_option("--batch-delay", a->batch_delay_ms,
                  "milliseconds to pause after each batch, as a slower device would (tests use it "
                  "to set a pace that does not depend on the machine)")
      ->check(CLI::Range(0.0, 600'000.0))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "LibTorch intra-op threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--optimizer", a->optimizer, "sgd, adam, adamw, lamb, adam8bit or adamw8bit")
      ->capture_default_str();
  cmd->add_option("--lr", a->lr, "learning rate (of the inner optimizer with DiLoCo)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", a->weight_decay, "weight decay")->capture_default_str();
  cmd->add_option("--momentum", a->momentum, "sgd momentum")->capture_default_str();
  cmd->add_option("--max-grad-norm", a->max_grad_norm,
                  "clip the averaged gradient to this L2 norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--target-batch-size", a->target_batch_size,
                  "samples the swarm accumulates per optimizer step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--grad-codec", a->grad_codec, "compression of averaged gradients")
      ->capture_default_str();
  cmd->add_option("--average-state-every", a->average_state_every,
                  "also average parameters every this many epochs (0: never)")
      ->capture_default_str();
  cmd->add_flag("--delay-averaging", a->delay_averaging,
                "average in the background while the next batch is computed");
  cmd->add_flag("--local-updates", a->local_updates,
                "step on every local batch and average parameters at each epoch");
  cmd->add_option("--diloco-inner-steps", a->diloco_inner_steps,
                  "DiLoCo: local steps between syncs (0: synchronous training)")
      ->capture_default_str();
  cmd->add_option("--outer-lr", a->outer_lr, "DiLoCo: outer Nesterov learning rate")
      ->capture_default_str();
  cmd->add_option("--outer-momentum", a->outer_momentum, "DiLoCo: outer momentum")
      ->capture_default_str();
  cmd->add_option("--diloco-codec", a->diloco_codec,
                  "DiLoCo: pseudo-gradient compression (blockwise8, blockwise4, ...)")
      ->capture_default_str();
  cmd->add_option("--diloco-fragments", a->diloco_fragments,
                  "DiLoCo: sync the parameters in this many fragments, in turn (streaming)")
      ->capture_default_str();
  cmd->add_option("--matchmaking-time", a->matchmaking_time,
                  "seconds a group leader waits for missing peers")
      ->capture_default_str();
  cmd->add_option("--averaging-timeout", a->averaging_timeout, "seconds per averaging round")
      ->capture_default_str();
  cmd->add_option("--bandwidth-mbps", a->bandwidth_mbps, "announced upload bandwidth")
      ->capture_default_str();
  cmd->add_option("--max-send-mbps", a->max_send_mbps, "cap on this peer's sending rate")
      ->capture_default_str();
  cmd->add_option("--min-peers", a->min_peers,
                  "wait until this many peers (this one included) are in the run before training")
      ->capture_default_str();
  cmd->add_option("--join-at-epoch", a->join_at_epoch,
                  "stand by until the swarm reaches this epoch, then join it (0: at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--rejoin-after", a->rejoin_after,
                  "seconds without seeing another peer of the run before bootstrapping the DHT "
                  "again (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-epochs", a->max_epochs, "stop at this global epoch (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--max-seconds", a->max_seconds, "stop after this long (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--stop-at", a->stop_at, "stop at this wall-clock time (Unix seconds)");
  cmd->add_option("--eval-every", a->eval_every, "held-out loss every this many epochs")
      ->capture_default_str();
  cmd->add_option("--metrics", a->metrics, "append one JSON line per global step to this file");
  cmd->add_option("--checkpoint", a->checkpoint,
                  "resume from this file when it exists, and save to it at the end");
  cmd->add_option("--checkpoint-every", a->checkpoint_every, "also save every this many epochs")
      ->capture_default_str();
  cmd->add_option("--save-model", a->save_model,
                  "lm: write the trained model here (Hugging Face Llama format + tokenizer)");
  cmd->add_option("--sample", a->sample_prompt,
                  "lm: print text sampled from this prompt at the end");
  cmd->add_option("--sample-tokens", a->sample_tokens, "lm: tokens to sample")
      ->capture_default_str();
  cmd->add_option("--progress-interval", a->progress_interval, "seconds between progress lines")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print JSON lines (ready, step, done) on stdout");
  cmd->add_option("--inject-fault", a->fault, "tests: an averaging fault (see colony average)");
  cmd->add_option("--nan-gradients-every", a->nan_gradients_every,
                  "tests: every Nth batch, send NaN gradients to the group (unchecked)");
  commands.emplace_back(cmd, [a, cmd]() {
    Status st = CheckTaskOptions(*cmd, a->task);
    return st.ok() ? Run(*a) : Fail(st);
  });
}

}  // namespace colony::cli
