// Training tasks: a model, its data and its loss, as `colony train` and the benchmarks use them.
//
//   "lm":            a Llama-style decoder (model/llama.h) on the Linux kernel's documentation
//                    (linux-doc-6.1), with a sentencepiece tokenizer trained on first use and
//                    cached (model/corpus.h, model/tokenizer.h); sizes tiny, small, base.
//   "moe-lm":        the same decoder and data with remote experts as feed-forwards; it lives in
//                    the moe layer (moe/lm_task.h, which links train), and a Trainer gets it
//                    through TrainerOptions::make_task.
//   "swarm-lm":      the same decoder and data with the blocks on SWARM stage servers
//                    (swarm/lm_task.h, through make_task likewise).
//   "fashion-mnist": a classifier (model/classifier.h: a small CNN, or logistic regression) on
//                    Debian's dataset-fashion-mnist.
//
// Every peer of a run starts from the same weights (init_seed) and reads its own shuffled data
// stream (seed).
//
//   auto task = Task::Create({.task = "fashion-mnist", .batch_size = 32, .seed = 1});
//   auto [loss, samples] = (*task)->TrainBatch();  // forward and backward: gradients in place
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "model/classifier.h"

namespace colony::train {

struct TaskOptions {
  std::string task = "lm";  // "lm", "moe-lm", "swarm-lm" or "fashion-mnist"
  int64_t batch_size = 16;
  int64_t eval_batch_size = 32;  // the held-out batch (fashion-mnist: 8 of them)
  uint64_t seed = 0;             // this peer's data order
  uint64_t init_seed = 0;        // the initial weights (the same on every peer of a run)
  // Where the model computes (model::ParseDevice); its weights start the same on every device.
  c10::Device device = c10::kCPU;
  // lm: data (the cache defaults to $COLONY_CACHE_DIR, else ~/.cache/colony) and model.
  std::string cache_dir = {};
  uint64_t corpus_bytes = 0;  // 0: the whole corpus
  int vocab_size = 4096;
  std::string model_size = "tiny";                               // tiny, small, base
  int64_t hidden_size = 0, layers = 0, heads = 0, kv_heads = 0;  // > 0: override the size's
  int64_t seq_len = 128;
  // moe-lm (moe/lm_task.h): the experts' grids (one per block, "<moe_prefix><block>"), how many
  // experts each token asks, how many must answer, and how long to wait for the rest.
  std::string moe_prefix = "lm";
  std::vector<int64_t> moe_grid = {8};
  size_t moe_k_best = 2;
  size_t moe_k_min = 1;
  double moe_timeout_after_k_min = 1.0;  // seconds
  double moe_timeout = 30;               // seconds: a forward or backward call's deadline
  // swarm-lm (swarm/lm_task.h): the run's stage servers' name and its initial checkpoint, whose
  // embeddings, norm and head the trainer holds.
  std::string swarm_run = {};
  std::string swarm_model = {};
  std::string swarm_boundary_codec = "none";  // hidden states between stages: serve/wire.h
  // fashion-mnist
  model::FashionArchitecture classifier = model::FashionArchitecture::kCnn;
  // Tests and benchmarks: a Byzantine peer that trains on wrong labels (class c as 9 - c) from
  // this epoch on (-1: never); fashion-mnist only.
  int64_t flip_labels_from_epoch = -1;
};

class Task {
 public:
  // Prepares the data (downloads nothing: Debian's packages) and builds the model.
  static Result<std::unique_ptr<Task>> Create(const TaskOptions& options);
  virtual ~Task() = default;

  // Tasks whose model lives partly in the swarm (moe-lm) find it through the peer's node, which
  // outlives the task; called once, before Parameters().
  virtual Status Connect(dht::Node& node);
  // The model's parameters, on options.device.
  virtual std::vector<at::Tensor> Parameters() = 0;
  // The peer's epoch before each batch (swarm-lm tags its requests to the stages with it).
  virtual void SetEpoch(int64_t /*epoch*/) {}
  struct Batch {
    double loss = 0;
    int64_t samples = 0;
  };
  // One forward and backward pass on the next batch: the gradients are in the parameters. An
  // error (moe-lm: no expert answered) leaves the gradients as they were.
  virtual Result<Batch> TrainBatch() = 0;
  // Audits (CollaborativeOptions::audit_targets): the index of the batch TrainBatch() reads
  // next in this peer's data stream (fixed by its seed and batch size), or nullopt for a task
  // that cannot recompute batches; and one forward and backward pass on batch `index` of the
  // stream (seed, batch_size) of another peer, with true labels, at the current parameters.
  virtual std::optional<int64_t> NextBatchIndex() { return std::nullopt; }
  virtual Result<int64_t> ComputeBatchOf(uint64_t seed, int64_t batch_size, int64_t index);
  // Audits, for a task with NextBatchIndex(): from now on each epoch's data is stream
  // seed_of(epoch) (instead of one stream by TaskOptions::seed), read from its start when
  // SetEpoch() moves to the epoch.
  void DrawDataByEpoch(std::function<uint64_t(int64_t epoch)> seed_of);
  // The loss on a fixed held-out batch (no gradients); NaN, with a warning in the log, when the
  // swarm could not compute it (moe-lm).
  virtual double Evaluate() = 0;
  // The model, for reports: task, parameter count, and task-specific facts.
  virtual nlohmann::json Describe() = 0;
  // lm: writes the model in Hugging Face Llama format, with its tokenizer.
  virtual Status Save(const std::filesystem::path& dir);
  // lm: text sampled from the model after `prompt`.
  virtual Result<std::string> Sample(const std::string& prompt, int64_t tokens);

 protected:
  // For SetEpoch() of a task that can be audited: the seed of the stream to start when data is
  // drawn by epoch and `epoch` is not the one the current stream was drawn for; else nullopt.
  std::optional<uint64_t> NewEpochStream(int64_t epoch);
  // For ComputeBatchOf(): refuses a batch size or index out of any stream's range.
  static Status CheckBatchOfStream(int64_t batch_size, int64_t index);
  // For ComputeBatchOf(): rows [0, rows) in pieces of at most `piece` (the memory this peer
  // trains with): fn(first row, rows of the piece, the piece's share of all rows), so that the
  // pieces' losses weighted by their shares give the whole batch's mean loss.
  static void InPieces(int64_t rows, int64_t piece,
                       const std::function<void(int64_t, int64_t, double)>& fn);

 private:
  std::function<uint64_t(int64_t)> seed_of_;  // DrawDataByEpoch()
  int64_t stream_epoch_ = -1;                 // the epoch the current stream was drawn for
};

}  // namespace colony::train
