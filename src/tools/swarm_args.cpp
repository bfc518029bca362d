// The model and swarm options of the commands that run a model, and starting their swarm client.
#include "tools/swarm_args.h"

#include <fmt/format.h>

#include <sstream>

#include "tools/commands.h"

namespace colony::cli {

void AddSwarmOptions(CLI::App* cmd, SwarmArgs& a) {
  cmd->add_option("--model", a.model,
                  "Hugging Face-format Llama checkpoint directory (config.json + safetensors)")
      ->required();
  cmd->add_option("--model-name", a.model_name,
                  "name of the model in the DHT, shared by its servers and clients (default: the "
                  "directory's name)");
  cmd->add_option("--initial-peers", a.initial_peers,
                  "multiaddr of a peer in the swarm (repeatable)")
      ->check(MultiaddrCheck());
  cmd->add_option("--threads", a.threads, "LibTorch threads (0: default)");
  cmd->add_option("--device", a.device,
                  "where this peer computes: cpu, cuda, cuda:N, or auto (the first GPU when "
                  "LibTorch has CUDA and sees one, else the CPU)")
      ->capture_default_str();
  AddAccessOptions(cmd, a.access);
}

Result<std::vector<int64_t>> PromptTokens(const std::string& text, const std::string& tokens,
                                          const model::Tokenizer* tokenizer,
                                          const std::string& model_dir, int64_t vocab) {
  std::vector<int64_t> out;
  if (!tokens.empty()) {
    std::stringstream ss(tokens);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        out.push_back(std::stoll(item));
      } catch (const std::exception&) {
        return InvalidArgument(fmt::format("--tokens: '{}' is not a token id", item));
      }
    }
  } else {
    if (tokenizer == nullptr) {
      return InvalidArgument(fmt::format(
          "{} has no tokenizer.model or tokenizer.json: give the prompt as --tokens 1,2,3",
          model_dir));
    }
    if (tokenizer->bos_id() >= 0) out.push_back(tokenizer->bos_id());
    for (int32_t id : tokenizer->Encode(text)) out.push_back(id);
  }
  if (out.empty()) return InvalidArgument("the prompt is empty");
  for (int64_t t : out) {
    if (t < 0 || t >= vocab) {
      return InvalidArgument(fmt::format("token {} is outside the vocabulary [0, {})", t, vocab));
    }
  }
  return out;
}

std::string ModelName(const SwarmArgs& a) {
  return a.model_name.empty() ? serve::DefaultModelName(a.model) : a.model_name;
}

Result<StartedClient> StartClient(const SwarmArgs& a, bool generates) {
  if (a.initial_peers.empty()) {
    return InvalidArgument(
        "give --initial-peers: the address of any peer of the swarm (a server prints its address "
        "when it starts)");
  }
  COLONY_ASSIGN_OR_RETURN(KeyPair identity, LoadOrGenerateIdentity(a.access.identity));
  COLONY_ASSIGN_OR_RETURN(SwarmAccess access, MakeSwarmAccess(a.access, identity.peer_id()));
  StartedClient started;
  COLONY_ASSIGN_OR_RETURN(started.client, serve::ConnectToSwarm({.model_dir = a.model,
                                                                 .model_name = a.model_name,
                                                                 .initial_peers = a.initial_peers,
                                                                 .access = access.control,
                                                                 .device = a.device,
                                                                 .generates = generates},
                                                                std::move(identity)));
  started.access = std::move(access);
  started.access.Attach(*started.client->node);
  return started;
}

}  // namespace colony::cli
