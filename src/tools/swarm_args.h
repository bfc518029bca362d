// The options every command that runs a model of the swarm shares (serve, generate, finetune,
// api): the model directory, its name in the DHT, the peers to join through, LibTorch threads and
// a private swarm's access; and starting a client of the swarm from them. Part of colony-torch.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/swarm_client.h"
#include "tools/access_options.h"

namespace colony::cli {

struct SwarmArgs {
  std::string model;
  std::string model_name;
  std::vector<std::string> initial_peers;
  int threads = 0;
  AccessArgs access;
};

void AddSwarmOptions(CLI::App* cmd, SwarmArgs& a);

// A prompt given as token ids: "1,2,3" (--tokens).
Result<std::vector<int64_t>> ParseTokens(const std::string& text);

// --model-name, or the directory's name.
std::string ModelName(const SwarmArgs& a);

// A client of the swarm, with its private-swarm access kept fresh (stopped before the client).
struct StartedClient {
  std::unique_ptr<serve::SwarmClient> client;
  SwarmAccess access;
};

Result<StartedClient> StartClient(const SwarmArgs& a);

}  // namespace colony::cli
