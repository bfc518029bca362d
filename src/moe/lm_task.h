// The "moe-lm" training task (Learning@home): the lm task's decoder (train/task.h) with every
// block's feed-forward a mixture of remote experts (mixture.h) served by `colony experts serve`
// processes. The grid of block l is named "<moe_prefix><l>" (experts "lm0.3", "lm1.5", ...);
// attention, norms, embeddings, head and the gatings are the trainer's parameters (averaged with
// the other trainers like any task's), and the experts train on their servers through the
// mixtures' backward. A token whose experts all failed keeps its residual stream; a batch in
// which no expert answered is an error that says which servers to start.
//
//   train::TrainerOptions o;
//   o.task = {.task = "moe-lm", ...};
//   o.make_task = moe::MakeMoeLmTask;
//   auto trainer = train::Trainer::Create(o, events);
#pragma once

#include <memory>

#include "core/status.h"
#include "train/task.h"

namespace colony::moe {

Result<std::unique_ptr<train::Task>> MakeMoeLmTask(const train::TaskOptions& options);

}  // namespace colony::moe
