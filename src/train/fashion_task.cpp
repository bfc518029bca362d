// The "fashion-mnist" task (task.h): a classifier on Debian's dataset-fashion-mnist.
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>

#include "model/classifier.h"
#include "model/fashion_mnist.h"
#include "train/task.h"

namespace colony::train {
namespace {

class FashionTask final : public Task {
 public:
  static Result<std::unique_ptr<FashionTask>> Create(const TaskOptions& a) {
    auto t = std::unique_ptr<FashionTask>(new FashionTask());
    COLONY_ASSIGN_OR_RETURN(auto train, model::LoadFashionMnist(true));
    COLONY_ASSIGN_OR_RETURN(auto test, model::LoadFashionMnist(false));
    t->train_ = std::make_shared<const model::ImageDataset>(std::move(train));
    t->stream_ = std::make_unique<model::ImageBatchStream>(t->train_, a.seed, a.batch_size);
    t->batch_size_ = a.batch_size;
    const int64_t n = std::min<int64_t>(a.eval_batch_size * 8, test.size);
    t->device_ = a.device;
    t->flip_labels_from_ = a.flip_labels_from_epoch;
    t->test_images_ = at::from_blob(test.images.data(), {n, 1, 28, 28}, at::kFloat)
                          .to(a.device, /*non_blocking=*/false, /*copy=*/true);
    t->test_labels_ = at::from_blob(test.labels.data(), {n}, at::kLong)
                          .to(a.device, /*non_blocking=*/false, /*copy=*/true);
    torch::manual_seed(a.init_seed);
    t->model_ = model::FashionClassifier(a.classifier);
    t->model_->to(a.device);
    return t;
  }

  std::vector<at::Tensor> Parameters() override { return model_->parameters(); }
  void SetEpoch(int64_t epoch) override {
    epoch_ = epoch;
    if (auto seed = NewEpochStream(epoch)) {
      stream_ = std::make_unique<model::ImageBatchStream>(train_, *seed, batch_size_);
    }
  }

  Result<Batch> TrainBatch() override {
    auto b = stream_->Next();
    const bool flip = flip_labels_from_ >= 0 && epoch_ >= flip_labels_from_;
    return Batch{Backward(b, 0, b.batch_size, flip, 1.0), b.batch_size};
  }

  std::optional<int64_t> NextBatchIndex() override { return stream_->position() / batch_size_; }

  Result<int64_t> ComputeBatchOf(uint64_t seed, int64_t batch_size, int64_t index) override {
    COLONY_RETURN_IF_ERROR(CheckBatchOfStream(batch_size, index));
    if (!audit_stream_ || audit_seed_ != seed || audit_batch_ != batch_size) {
      audit_stream_ = std::make_unique<model::ImageBatchStream>(train_, seed, batch_size);
      audit_seed_ = seed;
      audit_batch_ = batch_size;
    }
    audit_stream_->Seek(index * batch_size);
    auto b = audit_stream_->Next();
    InPieces(b.batch_size, batch_size_, [&](int64_t first, int64_t rows, double share) {
      Backward(b, first, rows, /*flip_labels=*/false, share);
    });
    return b.batch_size;
  }

  double Evaluate() override {
    at::NoGradGuard no_grad;
    auto logits = model_->forward(test_images_);
    accuracy_ = logits.argmax(1).eq(test_labels_).to(at::kFloat).mean().item<double>();
    return torch::nn::functional::cross_entropy(logits, test_labels_).item<double>();
  }

  nlohmann::json Describe() override {
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

  // Forward and backward of rows [first, first + rows) of a batch: the gradients of `scale`
  // times their mean loss into the parameters; returns the mean loss.
  double Backward(model::ImageBatchStream::Batch& b, int64_t first, int64_t rows, bool flip_labels,
                  double scale) {
    auto images =
        at::from_blob(b.images.data() + first * 28 * 28, {rows, 1, 28, 28}, at::kFloat).to(device_);
    auto labels = at::from_blob(b.labels.data() + first, {rows}, at::kLong).to(device_);
    if (flip_labels) labels = (model::kFashionMnistClasses - 1) - labels;
    auto loss = torch::nn::functional::cross_entropy(model_->forward(images), labels);
    loss.mul(scale).backward();
    return loss.item<double>();
  }

  std::shared_ptr<const model::ImageDataset> train_;
  int64_t batch_size_ = 1;
  std::unique_ptr<model::ImageBatchStream> audit_stream_;  // another peer's, for audits
  uint64_t audit_seed_ = 0;
  int64_t audit_batch_ = 0;
  std::unique_ptr<model::ImageBatchStream> stream_;
  at::Tensor test_images_, test_labels_;
  model::FashionClassifier model_{nullptr};
  c10::Device device_ = c10::kCPU;
  double accuracy_ = 0;
  int64_t flip_labels_from_ = -1, epoch_ = 0;
};

}  // namespace

Result<std::unique_ptr<Task>> MakeFashionTask(const TaskOptions& options) {
  COLONY_ASSIGN_OR_RETURN(auto t, FashionTask::Create(options));
  return std::unique_ptr<Task>(std::move(t));
}

}  // namespace colony::train
