// The options every command that runs a model of the swarm shares (serve, generate, finetune,
// api): the model directory, its name in the DHT, the peers to join through, LibTorch threads, the
// device the model's local part computes on, and a private swarm's access; and starting a client
// of the swarm from them. Part of colony-torch.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"
#include "serve/swarm_client.h"
#include "tools/access_options.h"

namespace colony::cli {

struct SwarmArgs {
  std::string model;
  std::string model_name;
  std::vector<std::string> initial_peers;
  int threads = 0;
  std::string device = "auto";  // model/device.h: cpu, cuda, cuda:N or auto
  AccessArgs access;
};

void AddSwarmOptions(CLI::App* cmd, SwarmArgs& a);

// The prompt's token ids: `tokens` as given ("1,2,3", --tokens), or else `text` (--prompt)
// encoded by `tokenizer` after its BOS (an error naming `model_dir` when it has no tokenizer).
// Not empty, every id in [0, vocab).
Result<std::vector<int64_t>> PromptTokens(const std::string& text, const std::string& tokens,
                                          const model::Tokenizer* tokenizer,
                                          const std::string& model_dir, int64_t vocab);

// --model-name, or the directory's name.
std::string ModelName(const SwarmArgs& a);

// A client of the swarm, with its private-swarm access kept fresh (stopped before the client).
struct StartedClient {
  std::unique_ptr<serve::SwarmClient> client;
  SwarmAccess access;
};

// generates: whether the client generates text (serve::SwarmClientOptions::generates).
Result<StartedClient> StartClient(const SwarmArgs& a, bool generates = true);

}  // namespace colony::cli
