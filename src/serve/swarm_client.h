// SwarmClient: what a client of a served model needs, set up from a model directory and the
// swarm's address: the model's local parts (embeddings and head on the chosen device,
// tokenizer.model or tokenizer.json when the directory has one), a client-mode DHT node, and a
// SequenceManager routing over the swarm's servers. `colony generate` and `colony finetune` start
// with it.
//
//   auto client = serve::ConnectToSwarm({.model_dir = "llama", .initial_peers = {addr}});
//   serve::RemoteSequential remote((*client)->manager);
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "model/generation_config.h"
#include "model/tokenizer.h"
#include "serve/generation.h"
#include "serve/routing.h"

namespace colony::serve {

struct SwarmClientOptions {
  std::filesystem::path model_dir;
  std::string model_name = {};  // in the DHT; default: DefaultModelName(model_dir)
  std::vector<std::string> initial_peers = {};
  // A private swarm's policy with this client's token (net/access_control.h); null: public.
  std::shared_ptr<net::AccessControl> access = nullptr;
  // Where the embeddings and head compute (model/device.h): cpu, cuda, cuda:N or auto.
  std::string device = "cpu";
  // Whether the client generates text: then the directory's generation_config.json is read
  // (and refused when it asks for what Colony does not do). A fine-tuning client leaves it.
  bool generates = true;
};

struct SwarmClient {
  std::unique_ptr<dht::Node> node;
  std::shared_ptr<SequenceManager> manager;
  ClientModel head{nullptr};
  std::optional<model::Tokenizer> tokenizer;
  // The model directory's generation_config.json (empty unless options.generates).
  model::GenerationConfig generation;
};

// The name servers and clients of a model directory share by default: the directory's name.
std::string DefaultModelName(const std::filesystem::path& model_dir);

// `identity`: the client's key (the one its access token names, in a private swarm).
Result<std::unique_ptr<SwarmClient>> ConnectToSwarm(const SwarmClientOptions& options,
                                                    KeyPair identity = KeyPair::Generate());

}  // namespace colony::serve
