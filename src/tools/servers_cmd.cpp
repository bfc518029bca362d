// colony servers: who serves which blocks of a model, from the DHT (no LibTorch: reads records).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "dht/node.h"
#include "dht/validation.h"
#include "serve/records.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

struct ServersArgs {
  std::string model;
  std::string model_name;
  int64_t num_blocks = 0;
  std::vector<std::string> initial_peers;
  bool json = false;
  AccessArgs access;
};

Result<int64_t> BlocksFromConfig(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  if (!in) return NotFound(fmt::format("cannot read {}/config.json", dir));
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("num_hidden_layers") ||
      !j["num_hidden_layers"].is_number_integer()) {
    return InvalidArgument(fmt::format("{}/config.json has no num_hidden_layers", dir));
  }
  return j["num_hidden_layers"].get<int64_t>();
}

int Run(const ServersArgs& a) {
  std::string name = a.model_name;
  int64_t blocks = a.num_blocks;
  if (!a.model.empty()) {
    auto n = BlocksFromConfig(a.model);
    if (!n.ok()) return Fail(n.status());
    blocks = *n;
    if (name.empty()) {
      auto p = std::filesystem::absolute(a.model);
      name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    }
  }
  if (name.empty() || blocks <= 0 || blocks > 4096) {
    return Fail("give --model DIR, or --model-name NAME and --num-blocks N");
  }
  dht::NodeOptions options;
  options.initial_peers = a.initial_peers;
  options.dht.client_mode = true;
  auto started = StartSwarmNode(a.access, std::move(options));
  if (!started.ok()) return Fail(started.status());
  const std::unique_ptr<dht::Node>& node = started->node;
  std::vector<std::string> keys;
  for (int64_t b = 0; b < blocks; ++b) keys.push_back(serve::BlockKey(name, b));
  auto results = node->GetManySync(keys, dht::Freshness::kLatest);
  std::map<std::string, serve::ServerRecord> servers;
  const double now = dht::Now();
  for (auto& r : results) {
    if (!r.ok() || !r->is_dict) continue;
    for (auto& [subkey, entry] : r->subkeys) {
      auto peer = dht::ParseOwnerMarker(subkey);
      if (!peer || entry.expiration < now) continue;
      auto rec = serve::ParseServerRecord(*peer, entry.value, blocks);
      if (rec.ok()) servers[peer->ToString()] = std::move(*rec);
    }
  }
  std::vector<int> count(static_cast<size_t>(blocks), 0);
  std::vector<double> throughput(static_cast<size_t>(blocks), 0.0);
  for (const auto& [id, s] : servers) {
    if (s.state != serve::ServerState::kOnline) continue;
    for (int64_t b = s.start; b < s.end; ++b) {
      ++count[static_cast<size_t>(b)];
      throughput[static_cast<size_t>(b)] += s.throughput;
    }
  }
  if (a.json) {
    nlohmann::json j = {{"model", name}, {"num_blocks", blocks}};
    auto list = nlohmann::json::array();
    for (const auto& [id, s] : servers) {
      list.push_back({{"peer", id},
                      {"state", serve::StateName(s.state)},
                      {"start", s.start},
                      {"end", s.end},
                      {"throughput", s.throughput},
                      {"inference_rps", s.inference_rps},
                      {"cache_tokens_left", s.cache_tokens_left},
                      {"addresses", s.addresses},
                      {"version", s.version},
                      {"dtype", s.dtype},
                      {"quantization", s.quantization}});
    }
    j["servers"] = list;
    j["servers_per_block"] = count;
    j["throughput_per_block"] = throughput;
    std::printf("%s\n", Dump(j).c_str());
  } else {
    std::printf("model '%s': %lld blocks, %zu servers\n", name.c_str(),
                static_cast<long long>(blocks), servers.size());
    std::printf("%-54s %-9s %-9s %12s %10s %12s  %-15s %s\n", "peer", "state", "blocks", "tokens/s",
                "steps/s", "cache tok", "weights", "version");
    for (const auto& [id, s] : servers) {
      // The record's parser let only printable ASCII through.
      const std::string weights =
          s.dtype +
          (s.quantization.empty() || s.quantization == "none" ? "" : "," + s.quantization);
      std::printf("%-54s %-9s %-9s %12.0f %10.1f %12lld  %-15s %s\n", id.c_str(),
                  std::string(serve::StateName(s.state)).c_str(),
                  fmt::format("{}:{}", s.start, s.end).c_str(), s.throughput, s.inference_rps,
                  static_cast<long long>(s.cache_tokens_left), weights.c_str(), s.version.c_str());
    }
    std::printf("coverage (online servers per block):");
    for (int64_t b = 0; b < blocks; ++b) std::printf(" %d", count[static_cast<size_t>(b)]);
    std::printf("\n");
    const auto missing = std::count(count.begin(), count.end(), 0);
    if (missing > 0) {
      std::printf("%lld blocks have no server: generation cannot run until someone serves them\n",
                  static_cast<long long>(missing));
    }
  }
  started->access.Stop();
  node->Shutdown();
  return 0;
}

}  // namespace

void AddServersCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto a = std::make_shared<ServersArgs>();
  auto* cmd = app.add_subcommand(
      "servers", "list the servers of a model in the swarm: blocks, state, throughput, cache");
  cmd->add_option("--model", a->model, "the model's checkpoint directory (reads config.json)");
  cmd->add_option("--model-name", a->model_name, "the model's name in the DHT");
  cmd->add_option("--num-blocks", a->num_blocks, "blocks in the model (without --model)");
  cmd->add_option("--initial-peers", a->initial_peers, "multiaddr of a peer in the swarm")
      ->check(MultiaddrCheck())
      ->required();
  cmd->add_flag("--json", a->json, "print one JSON object");
  AddAccessOptions(cmd, a->access);
  commands.emplace_back(cmd, [a] { return Run(*a); });
}

}  // namespace colony::cli
