// Choosing a task by name (task.h); the tasks are in lm_task.cpp and fashion_task.cpp.
#include "train/task.h"

#include <fmt/format.h>

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

Status Task::DrawDataByEpoch(std::function<uint64_t(int64_t)>) {
  return Unimplemented("this task cannot draw its data by epoch");
}

Status Task::Save(const std::filesystem::path&) {
  return Unimplemented("only the lm task saves its model");
}

Result<std::string> Task::Sample(const std::string&, int64_t) {
  return Unimplemented("only the lm task samples text");
}

}  // namespace colony::train
