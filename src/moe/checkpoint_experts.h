// A Hugging Face mixture-of-experts checkpoint (Mixtral: config.json with num_local_experts)
// whose experts live on expert servers: a server hosts some of the checkpoint's experts with
// their weights, and a client runs the rest of the model (embeddings, attention, routers, head)
// and calls the experts its routers choose. Expert ids are "<grid>.<layer>.<expert>", a grid of
// [num_hidden_layers, num_local_experts]: "mixtral.1.3" is layer 1's expert 3.
//
//   // server: colony experts serve --model DIR --pattern 'mixtral.[0:2].[0:4]' --num-experts 4
//   auto experts = moe::ReadCheckpointExperts(dir, "mixtral", {"mixtral.0.1", "mixtral.1.3"});
//   // client: the model without its experts' weights, its experts called on the servers
//   auto model = moe::LoadWithRemoteExperts(dir, node, {.grid = "mixtral"}).value();
//   auto tokens = model::Generate(model, prompt, {.max_new_tokens = 24});
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "model/llama.h"
#include "moe/expert.h"

namespace colony::moe {

struct CheckpointExperts {
  ExpertOptions expert;  // kind swiglu, the checkpoint's hidden and intermediate sizes
  std::map<std::string, std::vector<at::Tensor>> weights;  // by id: w1, w2, w3
  int64_t layers = 0, experts_per_layer = 0;
};

// Reads the experts `uids` (ids of `grid`) from the checkpoint in `dir`, and only them. Errors: a
// checkpoint without experts, an id of another grid or outside [layers, experts].
Result<CheckpointExperts> ReadCheckpointExperts(const std::filesystem::path& dir,
                                                const std::string& grid,
                                                const std::vector<std::string>& uids);

struct RemoteExpertsOptions {
  std::string grid = "mixtral";
  std::chrono::milliseconds timeout{30'000};  // each expert call
  // Free the model's own expert weights (a client need not hold them).
  bool release_local_experts = true;
};

// Makes every mixture-of-experts block of `model` call its experts on the servers that declare
// them in the DHT (found once, looked up again after a failure, and a call retried once on
// another server). A forward fails (c10::Error) with a message naming the expert when no server
// answers for it. `node` must outlive the model's use.
Status UseRemoteExperts(model::LlamaModel& model, dht::Node& node, RemoteExpertsOptions options);

// The checkpoint in `dir` without its experts (LlamaConfig::remote_experts: their weights are
// neither read nor allocated, so a client needs memory for the rest of the model only), its
// experts called on the servers as UseRemoteExperts sets up. A checkpoint without
// mixture-of-experts blocks is refused.
Result<model::LlamaModel> LoadWithRemoteExperts(const std::filesystem::path& dir, dht::Node& node,
                                                RemoteExpertsOptions options);

}  // namespace colony::moe
