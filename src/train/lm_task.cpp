// The "lm" task (task.h): a Llama-style decoder trained on the Linux kernel's documentation.
#include <torch/utils.h>

#include <algorithm>

#include "model/checkpoint.h"
#include "model/corpus.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "train/lm_data.h"
#include "train/task.h"

namespace colony::train {
namespace {

class LmTask final : public Task {
 public:
  static Result<std::unique_ptr<LmTask>> Create(const TaskOptions& a) {
    auto t = std::unique_ptr<LmTask>(new LmTask());
    COLONY_ASSIGN_OR_RETURN(t->data_, PrepareLmData(a));
    COLONY_ASSIGN_OR_RETURN(t->config_, LmModelConfig(a));
    t->config_.vocab_size = t->data_.tokenizer->vocab_size();
    COLONY_RETURN_IF_ERROR(t->config_.Validate());
    torch::manual_seed(a.init_seed);
    t->model_ = model::LlamaModel(t->config_);
    t->device_ = a.device;
    t->model_->to(a.device);
    t->data_.valid = t->data_.valid.to(a.device);
    t->batch_size_ = a.batch_size;
    return t;
  }

  std::vector<at::Tensor> Parameters() override { return model_->parameters(); }

  void SetEpoch(int64_t epoch) override {
    if (auto seed = NewEpochStream(epoch))
      *data_.stream = data_.stream->Reseeded(*seed, batch_size_);
  }

  Result<Batch> TrainBatch() override {
    at::Tensor batch = TokensToTensor(data_.stream->Next()).to(device_);
    const double loss = Backward(batch, 1.0);
    return Batch{loss, batch.size(0)};
  }

  std::optional<int64_t> NextBatchIndex() override { return data_.stream->batches(); }

  // Another peer's batch, in pieces of at most this peer's batch size.
  Result<int64_t> ComputeBatchOf(uint64_t seed, int64_t batch_size, int64_t index) override {
    COLONY_RETURN_IF_ERROR(CheckBatchOfStream(batch_size, index));
    if (!audit_stream_ || audit_seed_ != seed || audit_batch_ != batch_size ||
        audit_stream_->batches() > index) {
      audit_stream_ =
          std::make_unique<model::TokenStream>(data_.stream->Reseeded(seed, batch_size));
      audit_seed_ = seed;
      audit_batch_ = batch_size;
    }
    audit_stream_->Skip(index - audit_stream_->batches());
    at::Tensor batch = TokensToTensor(audit_stream_->Next());
    InPieces(batch_size, batch_size_, [&](int64_t first, int64_t rows, double share) {
      Backward(batch.slice(0, first, first + rows).to(device_), share);
    });
    return batch_size;
  }

  double Evaluate() override {
    at::NoGradGuard no_grad;
    auto inputs = data_.valid.slice(1, 0, data_.valid.size(1) - 1);
    auto targets = data_.valid.slice(1, 1, data_.valid.size(1));
    return model::LanguageModelLoss(model_->forward(inputs), targets).item<double>();
  }

  nlohmann::json Describe() override {
    return {{"task", "lm"},
            {"parameters", config_.NumParameters()},
            {"vocab_size", config_.vocab_size},
            {"hidden_size", config_.hidden_size},
            {"layers", config_.num_layers}};
  }

  Status Save(const std::filesystem::path& dir) override {
    COLONY_RETURN_IF_ERROR(model::SaveLlama(dir, model_, config_));
    // The tokenizer travels with the model, as Llama checkpoints carry tokenizer.model.
    return data_.tokenizer->Save(dir / data_.tokenizer->file_name());
  }

  Result<std::string> Sample(const std::string& prompt, int64_t tokens) override {
    at::NoGradGuard no_grad;
    auto ids = data_.tokenizer->Encode(prompt);
    std::vector<int64_t> p(ids.begin(), ids.end());
    if (data_.tokenizer->bos_id() >= 0) p.insert(p.begin(), data_.tokenizer->bos_id());
    model::SamplingOptions so;
    so.max_new_tokens = tokens;
    so.temperature = 0.8;
    so.top_k = 40;
    so.repetition_penalty = 1.1;
    so.seed = 1;
    auto out = model::Generate(model_, p, so, data_.tokenizer->eos_id());
    std::vector<int32_t> all(out.begin(), out.end());
    return data_.tokenizer->Decode(all);
  }

 private:
  LmTask() = default;

  // Forward and backward of rows [batch, seq_len + 1]: the gradients of `scale` times their
  // mean loss into the parameters; returns the mean loss.
  double Backward(const at::Tensor& batch, double scale) {
    auto inputs = batch.slice(1, 0, batch.size(1) - 1);
    auto targets = batch.slice(1, 1, batch.size(1));
    auto loss = model::LanguageModelLoss(model_->forward(inputs), targets);
    loss.mul(scale).backward();
    return loss.item<double>();
  }

  LmData data_;
  int64_t batch_size_ = 1;
  std::unique_ptr<model::TokenStream> audit_stream_;  // another peer's, for audits
  uint64_t audit_seed_ = 0;
  int64_t audit_batch_ = 0;
  model::LlamaConfig config_;
  model::LlamaModel model_{nullptr};
  c10::Device device_ = c10::kCPU;
};

}  // namespace

// The decoder of a size (tiny 0.4M, small 3M, base 25M parameters without embeddings), with
// the options' overrides.
Result<model::LlamaConfig> LmModelConfig(const TaskOptions& a) {
  model::LlamaConfig c;
  if (a.model_size == "small") {
    c.hidden_size = 256, c.num_layers = 4, c.num_heads = 8, c.num_kv_heads = 4;
  } else if (a.model_size == "base") {
    c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8, c.num_kv_heads = 4;
  } else if (a.model_size == "tiny") {
    c.hidden_size = 128, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2;
  } else {
    return InvalidArgument("unknown model size '" + a.model_size + "'; use tiny, small or base");
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

Result<LmData> PrepareLmData(const TaskOptions& a) {
  LmData d;
  model::CorpusOptions co;
  if (!a.cache_dir.empty()) co.cache_dir = a.cache_dir;
  co.max_bytes = a.corpus_bytes;
  COLONY_ASSIGN_OR_RETURN(auto corpus, model::PrepareCorpus(co));
  const auto cache =
      a.cache_dir.empty() ? model::DefaultCacheDir() : std::filesystem::path(a.cache_dir);
  COLONY_ASSIGN_OR_RETURN(auto tok, model::Tokenizer::TrainOrLoad(corpus, cache, a.vocab_size));
  d.tokenizer = std::make_unique<model::Tokenizer>(std::move(tok));
  const auto shard_dir = cache / ("shards-" + d.tokenizer->hash());
  COLONY_ASSIGN_OR_RETURN(auto shards, model::PrepareTokenShards(corpus, *d.tokenizer, shard_dir));
  COLONY_ASSIGN_OR_RETURN(auto stream,
                          model::TokenStream::Open(shards, a.seed, a.batch_size, a.seq_len));
  d.stream = std::make_unique<model::TokenStream>(std::move(stream));
  COLONY_ASSIGN_OR_RETURN(
      auto valid, model::TokenStream::ValidationBatch(shards, a.eval_batch_size, a.seq_len));
  d.valid = TokensToTensor(valid);
  return d;
}

at::Tensor TokensToTensor(const model::TokenBatch& b) {
  return at::from_blob(const_cast<int32_t*>(b.tokens.data()), {b.batch_size, b.seq_len + 1},
                       at::kInt)
      .to(at::kLong);
}

Result<std::unique_ptr<Task>> MakeLmTask(const TaskOptions& options) {
  COLONY_ASSIGN_OR_RETURN(auto t, LmTask::Create(options));
  return std::unique_ptr<Task>(std::move(t));
}

}  // namespace colony::train
