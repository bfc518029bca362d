#include "moe/checkpoint_experts.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <memory>
#include <mutex>

#include "model/checkpoint.h"
#include "moe/discovery.h"
#include "moe/expert_uid.h"
#include "moe/remote_expert.h"

namespace colony::moe {

Result<CheckpointExperts> ReadCheckpointExperts(const std::filesystem::path& dir,
                                                const std::string& grid,
                                                const std::vector<std::string>& uids) {
  COLONY_ASSIGN_OR_RETURN(model::LlamaConfig config, model::LoadLlamaConfig(dir));
  if (config.num_experts < 1) {
    return InvalidArgument(fmt::format(
        "{} holds no mixture of experts (its config has no num_local_experts)", dir.string()));
  }
  CheckpointExperts out;
  out.expert = {
      .kind = "swiglu", .hidden = config.hidden_size, .ffn_hidden = config.intermediate_size};
  out.layers = config.num_layers;
  out.experts_per_layer = config.num_experts;
  model::NamedTensors named;
  for (const auto& uid : uids) {
    COLONY_ASSIGN_OR_RETURN(ExpertUid parsed, ParseExpertUid(uid));
    if (parsed.name != grid || parsed.coords.size() != 2 || parsed.coords[0] >= out.layers ||
        parsed.coords[1] >= out.experts_per_layer) {
      return InvalidArgument(fmt::format(
          "expert id '{}' is not one of this checkpoint's: {}.<layer 0..{}>.<expert 0..{}>", uid,
          grid, out.layers - 1, out.experts_per_layer - 1));
    }
    const int64_t h = config.hidden_size, f = config.intermediate_size;
    std::vector<at::Tensor> w = {at::empty({f, h}), at::empty({h, f}), at::empty({f, h})};
    for (int i = 0; i < 3; ++i) {
      named.emplace_back(fmt::format("model.layers.{}.block_sparse_moe.experts.{}.w{}.weight",
                                     parsed.coords[0], parsed.coords[1], i + 1),
                         w[static_cast<size_t>(i)]);
    }
    out.weights[uid] = std::move(w);
  }
  COLONY_RETURN_IF_ERROR(model::LoadLlamaTensors(dir, named));
  return out;
}

namespace {

// The servers of each expert, found in the DHT on first use and again after a failure.
class ExpertDirectory {
 public:
  ExpertDirectory(dht::Node& node, RemoteExpertsOptions options)
      : node_(node), options_(std::move(options)) {}

  at::Tensor Call(int64_t layer, int64_t expert, const at::Tensor& rows) {
    const std::string uid = fmt::format("{}.{}.{}", options_.grid, layer, expert);
    const at::Tensor x = rows.to(at::kFloat).contiguous();
    std::string last_error = "no server declares it in the DHT";
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::shared_ptr<RemoteExpert> remote = Find(uid, /*refresh=*/attempt > 0);
      if (!remote) continue;
      auto y = remote->Forward(x, options_.timeout);
      if (y.ok()) return *y;
      last_error = y.status().ToString();
    }
    TORCH_CHECK(false, fmt::format("expert {} did not answer: {}", uid, last_error));
  }

 private:
  std::shared_ptr<RemoteExpert> Find(const std::string& uid, bool refresh) {
    {
      std::lock_guard lock(mu_);
      auto it = cache_.find(uid);
      if (it != cache_.end() && !refresh) return it->second;
    }
    auto found = GetExperts(node_, {uid});
    std::lock_guard lock(mu_);
    if (!found.at(0).has_value()) {
      cache_.erase(uid);
      return nullptr;
    }
    auto remote = std::make_shared<RemoteExpert>(node_.host(), *found[0]);
    cache_[uid] = remote;
    return remote;
  }

  dht::Node& node_;
  const RemoteExpertsOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<RemoteExpert>> cache_;
};

}  // namespace

Status UseRemoteExperts(model::LlamaModel& model, dht::Node& node, RemoteExpertsOptions options) {
  COLONY_RETURN_IF_ERROR(ParseExpertUid(options.grid + ".0.0").status().WithContext("grid name"));
  auto directory = std::make_shared<ExpertDirectory>(node, options);
  int64_t mixtures = 0;
  for (int64_t l = 0; l < model->num_blocks(); ++l) {
    model::SparseMoE moe = model->block(l)->block_sparse_moe;
    if (!moe) continue;
    ++mixtures;
    moe->set_expert_fn([directory, l](int64_t expert, const torch::Tensor& rows) {
      return directory->Call(l, expert, rows);
    });
    if (options.release_local_experts) {
      at::NoGradGuard no_grad;
      for (auto& p : moe->experts->parameters()) p.set_data(at::empty({0}, p.options()));
    }
  }
  if (mixtures == 0) {
    return InvalidArgument("the model has no mixture-of-experts blocks to serve remotely");
  }
  return Status::Ok();
}

Result<model::LlamaModel> LoadWithRemoteExperts(const std::filesystem::path& dir, dht::Node& node,
                                                RemoteExpertsOptions options) {
  COLONY_ASSIGN_OR_RETURN(model::LlamaConfig config, model::LoadLlamaConfig(dir));
  if (!config.mixture_of_experts()) {
    return InvalidArgument(fmt::format(
        "{} is not a mixture-of-experts checkpoint (config.json has no num_local_experts)",
        dir.string()));
  }
  config.remote_experts = true;
  model::LlamaModel m(config);
  COLONY_RETURN_IF_ERROR(model::LoadLlamaTensors(dir, m->NamedParametersHF()));
  COLONY_RETURN_IF_ERROR(UseRemoteExperts(m, node, std::move(options)));
  return m;
}

}  // namespace colony::moe
