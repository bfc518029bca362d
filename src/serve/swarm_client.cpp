// Setting up a client of a served model (swarm_client.h).
#include "serve/swarm_client.h"

#include "model/device.h"
#include "serve/records.h"

namespace colony::serve {

std::string DefaultModelName(const std::filesystem::path& model_dir) {
  auto p = std::filesystem::absolute(model_dir);
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

Result<std::unique_ptr<SwarmClient>> ConnectToSwarm(const SwarmClientOptions& options,
                                                    KeyPair identity) {
  if (options.initial_peers.empty()) {
    return InvalidArgument(
        "give the initial peers: the address of any peer of the swarm (a server prints its "
        "address when it starts)");
  }
  COLONY_ASSIGN_OR_RETURN(const c10::Device device, model::ParseDevice(options.device));
  auto c = std::make_unique<SwarmClient>();
  COLONY_ASSIGN_OR_RETURN(c->head, LoadClientModel(options.model_dir, device));
  if (auto tok_path = model::Tokenizer::FindInModelDir(options.model_dir); tok_path.ok()) {
    COLONY_ASSIGN_OR_RETURN(auto tok, model::Tokenizer::Load(*tok_path));
    c->tokenizer = std::move(tok);
  }
  if (options.generates) {
    COLONY_ASSIGN_OR_RETURN(c->generation, model::LoadGenerationConfig(options.model_dir));
  }
  dht::NodeOptions node_options;
  node_options.initial_peers = options.initial_peers;
  node_options.dht.client_mode = true;
  node_options.host.access = options.access;
  node_options.validators = {
      std::make_shared<dht::KeyFamilyValidator>(std::vector{ServerRecordFamily(), ModelsFamily()})};
  COLONY_ASSIGN_OR_RETURN(c->node, dht::Node::Start(std::move(identity), node_options));
  const std::string name =
      options.model_name.empty() ? DefaultModelName(options.model_dir) : options.model_name;
  c->manager = std::make_shared<SequenceManager>(
      *c->node, ClientOptions{.model_name = name, .num_blocks = c->head->config().num_layers});
  return c;
}

}  // namespace colony::serve
