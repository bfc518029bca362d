// The "fashion-mnist" task (task.h): a classifier on Debian's dataset-fashion-mnist.
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

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
    t->stream_ = std::make_unique<model::ImageBatchStream>(
        std::make_shared<const model::ImageDataset>(std::move(train)), a.seed, a.batch_size);
    const int64_t n = std::min<int64_t>(a.eval_batch_size * 8, test.size);
    t->device_ = a.device;
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

  Result<Batch> TrainBatch() override {
    auto b = stream_->Next();
    auto images = at::from_blob(b.images.data(), {b.batch_size, 1, 28, 28}, at::kFloat).to(device_);
    auto labels = at::from_blob(b.labels.data(), {b.batch_size}, at::kLong).to(device_);
    auto loss = torch::nn::functional::cross_entropy(model_->forward(images), labels);
    loss.backward();
    return Batch{loss.item<double>(), b.batch_size};
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
  std::unique_ptr<model::ImageBatchStream> stream_;
  at::Tensor test_images_, test_labels_;
  model::FashionClassifier model_{nullptr};
  c10::Device device_ = c10::kCPU;
  double accuracy_ = 0;
};

}  // namespace

Result<std::unique_ptr<Task>> MakeFashionTask(const TaskOptions& options) {
  COLONY_ASSIGN_OR_RETURN(auto t, FashionTask::Create(options));
  return std::unique_ptr<Task>(std::move(t));
}

}  // namespace colony::train
