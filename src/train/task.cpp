// Choosing a task by name (task.h); the tasks are in lm_task.cpp and fashion_task.cpp.
#include "train/task.h"

#include <fmt/format.h>

#include <algorithm>

namespace colony::train {

Result<std::unique_ptr<Task>> MakeLmTask(const TaskOptions& options);
Result<std::unique_ptr<Task>> MakeFashionTask(const TaskOptions& options);

Result<std::unique_ptr<Task>> Task::Create(const TaskOptions& options) {
  if (options.batch_size <= 0 || options.eval_batch_size <= 0) {
    return InvalidArgument("a task needs positive batch sizes");
  }
  if (options.flip_labels_from_epoch >= 0 && options.task != "fashion-mnist") {
    return InvalidArgument("label flipping needs a classifier: the fashion-mnist task");
  }
  if (options.task == "lm") return MakeLmTask(options);
  if (options.task == "moe-lm") {
    return InvalidArgument(
        "the moe-lm task is built by moe::MakeMoeLmTask (moe/lm_task.h): pass it as "
        "TrainerOptions::make_task");
  }
  if (options.task == "fashion-mnist") return MakeFashionTask(options);
  return InvalidArgument(
      fmt::format("unknown task '{}'; use lm, moe-lm or fashion-mnist", options.task));
}

Status Task::Connect(dht::Node&) { return Status::Ok(); }

Result<int64_t> Task::ComputeBatchOf(uint64_t, int64_t, int64_t) {
  return Unimplemented("this task cannot recompute another peer's batches");
}

void Task::DrawDataByEpoch(std::function<uint64_t(int64_t)> seed_of) {
  seed_of_ = std::move(seed_of);
  stream_epoch_ = -1;
}

std::optional<uint64_t> Task::NewEpochStream(int64_t epoch) {
  if (!seed_of_ || epoch == stream_epoch_) return std::nullopt;
  stream_epoch_ = epoch;
  return seed_of_(epoch);
}

Status Task::CheckBatchOfStream(int64_t batch_size, int64_t index) {
  if (batch_size < 1 || batch_size > (int64_t{1} << 16) || index < 0 ||
      index > (int64_t{1} << 40) / batch_size) {
    return InvalidArgument(fmt::format("batch {} of size {} is out of range", index, batch_size));
  }
  return Status::Ok();
}

void Task::InPieces(int64_t rows, int64_t piece,
                    const std::function<void(int64_t, int64_t, double)>& fn) {
  for (int64_t first = 0; first < rows; first += piece) {
    const int64_t n = std::min(piece, rows - first);
    fn(first, n, static_cast<double>(n) / static_cast<double>(rows));
  }
}

Status Task::Save(const std::filesystem::path&) {
  return Unimplemented("only the lm task saves its model");
}

Result<std::string> Task::Sample(const std::string&, int64_t) {
  return Unimplemented("only the lm task samples text");
}

}  // namespace colony::train
