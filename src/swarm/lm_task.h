// The "swarm-lm" training task (SWARM parallelism): the lm task's decoder and data
// (train/task.h) with the blocks on stage servers (stage.h) and the embeddings, final norm and
// head on the trainer (pipeline.h), which averages them with the run's other trainers like any
// task's parameters. Every peer starts from the run's initial checkpoint (TaskOptions::
// swarm_model, as `colony swarm-train init` writes it, with its tokenizer). A microbatch whose
// stage has no live peer is kept and tried again at the next TrainBatch, so none is skipped.
//
//   train::TrainerOptions o;
//   o.task = {.task = "swarm-lm", .swarm_run = "run1", .swarm_model = "init", ...};
//   o.make_task = swarm::MakeSwarmLmTask;
//   auto trainer = train::Trainer::Create(o, events);
#pragma once

#include <memory>

#include "core/status.h"
#include "train/task.h"

namespace colony::swarm {

Result<std::unique_ptr<train::Task>> MakeSwarmLmTask(const train::TaskOptions& options);

}  // namespace colony::swarm
