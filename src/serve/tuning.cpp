#include "serve/tuning.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in fmt/format.h only before fmt 11)

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "model/checkpoint.h"
#include "model/device.h"
#include "model/safetensors.h"

namespace colony::serve {

PromptTunedImpl::PromptTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                                 PromptTuningOptions options)
    : head_(std::move(head)), remote_(std::move(remote)), options_(options) {
  const int64_t h = head_->config().hidden_size, p = options_.prompt_length;
  for (auto& param : head_->parameters()) param.set_requires_grad(false);
  // Drawn on the CPU (the same values for a seed on every device), kept on the head's device.
  const c10::Device device = model::DeviceOf(*head_);
  prompts = register_parameter("prompts", (at::randn({p, h}) * options_.init_std).to(device));
  if (options_.deep) {
    deep_prompts = register_parameter(
        "deep_prompts",
        (at::randn({remote_->end() - remote_->start(), p, h}) * options_.init_std).to(device));
  }
}

std::vector<at::Tensor> PromptTunedImpl::TrainableParameters() {
  std::vector<at::Tensor> out{prompts};
  if (deep_prompts.defined()) out.push_back(deep_prompts);
  return out;
}

at::Tensor PromptTunedImpl::forward(const at::Tensor& tokens) {
  const int64_t b = tokens.size(0), p = options_.prompt_length;
  at::Tensor x = at::cat(
      {prompts.unsqueeze(0).expand({b, -1, -1}), head_->Embed(tokens.to(prompts.device()))}, 1);
  at::Tensor deep;
  if (deep_prompts.defined()) deep = deep_prompts.unsqueeze(1).expand({-1, b, -1, -1});
  at::Tensor h = remote_->forward(x, deep);
  return head_->Head(h.narrow(1, p, tokens.size(1)));
}

at::Tensor PromptTunedImpl::Loss(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  at::Tensor logits = forward(tokens.narrow(1, 0, t - 1));
  return model::LanguageModelLoss(logits, tokens.narrow(1, 1, t - 1).to(logits.device()));
}

namespace {
// The input and output sizes of projection `name` in the model's blocks; throws for a name that
// takes no adapter there (a mixture-of-experts block's MLP).
std::pair<int64_t, int64_t> ProjectionDims(const model::LlamaConfig& c, const std::string& name) {
  const auto shape = c.ProjectionShape(name);
  if (!shape) {
    throw std::invalid_argument(
        fmt::format("LoRA target {} is not a projection of this model's blocks", name));
  }
  return *shape;
}

// The parameter names of LoraTuned's adapters (absolute block index).
std::string LoraName(int64_t block, const std::string& target, bool a) {
  return fmt::format("lora_{}_{}_{}", block, target, a ? "a" : "b");
}
}  // namespace

LoraTunedImpl::LoraTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                             LoraTuningOptions options)
    : head_(std::move(head)), remote_(std::move(remote)) {
  spec = {options.rank, options.targets, options.scale};
  for (auto& param : head_->parameters()) param.set_requires_grad(false);
  const auto& config = head_->config();
  const c10::Device device = model::DeviceOf(*head_);
  for (int64_t b = remote_->start(); b < remote_->end(); ++b) {
    for (const auto& name : options.targets) {
      auto [in, out] = ProjectionDims(config, name);
      // As in the LoRA paper: A random, B zero, so training starts from the frozen model.
      adapters.push_back(register_parameter(
          LoraName(b, name, true), (at::randn({options.rank, in}) / std::sqrt(in)).to(device)));
      adapters.push_back(register_parameter(LoraName(b, name, false),
                                            at::zeros({out, options.rank}, at::device(device))));
    }
  }
}

model::BlockAdapters LoraTunedImpl::AdaptersOf(int64_t block) const {
  model::BlockAdapters out;
  size_t k = static_cast<size_t>(block - remote_->start()) * 2 * spec.targets.size();
  for (const auto& name : spec.targets) {
    model::LoraAdapter* a = out.Find(name);
    a->a = adapters[k++];
    a->b = adapters[k++];
    a->scale = spec.scale;
  }
  return out;
}

at::Tensor LoraTunedImpl::forward(const at::Tensor& tokens) {
  at::Tensor h =
      remote_->forward(head_->Embed(tokens.to(model::DeviceOf(*head_))), {}, spec, adapters);
  return head_->Head(h);
}

at::Tensor LoraTunedImpl::Loss(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  at::Tensor logits = forward(tokens.narrow(1, 0, t - 1));
  return model::LanguageModelLoss(logits, tokens.narrow(1, 1, t - 1).to(logits.device()));
}

}  // namespace colony::serve

namespace colony::serve {

namespace {
constexpr const char* kTuningKey = "colony.tuning";
}  // namespace

SessionOptions TunedWeights::Session(int64_t max_length, int64_t batch_size) const {
  SessionOptions o{.max_length = max_length, .batch_size = batch_size};
  if (deep_prompts.defined()) o.prompts = deep_prompts.unsqueeze(1);
  o.lora = lora;
  o.adapters = adapters;
  return o;
}

Status SaveTuned(const std::filesystem::path& file, PromptTunedImpl& tuned) {
  model::NamedTensors named{{"prompts", tuned.prompts}};
  if (tuned.deep_prompts.defined()) named.emplace_back("deep_prompts", tuned.deep_prompts);
  return model::SaveModule(file, named,
                           {{kTuningKey, tuned.deep_prompts.defined() ? "deep-prompt" : "prompt"}});
}

Status SaveTuned(const std::filesystem::path& file, LoraTunedImpl& tuned) {
  model::NamedTensors named;
  for (const auto& item : tuned.named_parameters()) named.emplace_back(item.key(), item.value());
  std::string targets;
  for (const auto& t : tuned.spec.targets) targets += (targets.empty() ? "" : ",") + t;
  return model::SaveModule(file, named,
                           {{kTuningKey, "lora"},
                            {"lora.rank", std::to_string(tuned.spec.rank)},
                            {"lora.targets", targets},
                            {"lora.scale", fmt::format("{}", tuned.spec.scale)}});
}

Result<TunedWeights> LoadTuned(const std::filesystem::path& file,
                               const model::LlamaConfig& config) {
  COLONY_ASSIGN_OR_RETURN(model::SafetensorsFile f, model::SafetensorsFile::Open(file));
  // Every tensor as float32, copied in by LoadModule (which checks the file against the names).
  model::NamedTensors named;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& info : f.header().tensors) {
    at::Tensor t = at::empty(info.shape, at::kFloat);
    named.emplace_back(info.name, t);
    by_name[info.name] = t;
  }
  COLONY_RETURN_IF_ERROR(model::LoadModule(file, named));
  const auto& meta = f.header().metadata;
  const auto kind_it = meta.find(kTuningKey);
  const std::string kind = kind_it != meta.end()         ? kind_it->second
                           : by_name.contains("prompts") ? "prompt"
                                                         : "lora";
  const int64_t h = config.hidden_size, blocks = config.num_layers;
  auto bad = [&](const std::string& why) {
    return InvalidArgument(
        fmt::format("{} is not a tuned model of this one ({} blocks, hidden "
                    "size {}): {}",
                    file.string(), blocks, h, why));
  };
  TunedWeights out;
  if (kind == "prompt" || kind == "deep-prompt") {
    auto p = by_name.find("prompts");
    if (p == by_name.end() || p->second.dim() != 2 || p->second.size(1) != h) {
      return bad(fmt::format("it needs 'prompts' [P, {}]", h));
    }
    out.prompts = p->second;
    auto d = by_name.find("deep_prompts");
    if (d != by_name.end()) {
      if (d->second.dim() != 3 || d->second.size(0) != blocks ||
          d->second.size(1) != out.prompts.size(0) || d->second.size(2) != h) {
        return bad(
            fmt::format("'deep_prompts' must be [{}, {}, {}]", blocks, out.prompts.size(0), h));
      }
      out.deep_prompts = d->second;
    }
    if (by_name.size() != (out.deep_prompts.defined() ? 2u : 1u)) {
      return bad("it has tensors besides the prompts");
    }
    return out;
  }
  if (kind != "lora") return bad(fmt::format("unknown tuning '{}'", kind.substr(0, 32)));
  // The targets and scale from the metadata, or (older files) the targets from block 0's names
  // in file order and the default scale.
  auto targets_it = meta.find("lora.targets");
  if (targets_it != meta.end()) {
    std::stringstream ss(targets_it->second);
    for (std::string t; std::getline(ss, t, ',');) out.lora.targets.push_back(t);
  } else {
    for (const auto& info : f.header().tensors) {
      const std::string prefix = "lora_0_";
      if (info.name.starts_with(prefix) && info.name.ends_with("_a")) {
        out.lora.targets.push_back(
            info.name.substr(prefix.size(), info.name.size() - prefix.size() - 2));
      }
    }
  }
  if (auto s = meta.find("lora.scale"); s != meta.end()) {
    try {
      out.lora.scale = std::stod(s->second);
    } catch (const std::exception&) {
      return bad("malformed lora.scale");
    }
  }
  if (out.lora.targets.empty()) return bad("no prompts and no LoRA adapters in it");
  auto first = by_name.find(LoraName(0, out.lora.targets.front(), true));
  if (first == by_name.end() || first->second.dim() != 2) return bad("no adapters of block 0");
  out.lora.rank = first->second.size(0);
  for (const auto& target : out.lora.targets) {
    if (!config.ProjectionShape(target)) {
      return bad(fmt::format("unknown projection '{}'", target.substr(0, 32)));
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    for (const auto& target : out.lora.targets) {
      auto [in, o] = ProjectionDims(config, target);
      for (bool a : {true, false}) {
        const std::string name = LoraName(b, target, a);
        auto it = by_name.find(name);
        const std::vector<int64_t> shape =
            a ? std::vector<int64_t>{out.lora.rank, in} : std::vector<int64_t>{o, out.lora.rank};
        if (it == by_name.end() || !it->second.sizes().equals(shape)) {
          return bad(fmt::format("'{}' must be [{}]", name, fmt::join(shape, ", ")));
        }
        out.adapters.push_back(it->second);
      }
    }
  }
  if (by_name.size() != out.adapters.size()) return bad("it has tensors besides the adapters");
  return out;
}

}  // namespace colony::serve
