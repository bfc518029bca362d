// Fine-tuning through frozen remote blocks (finetune.h).
#include "serve/finetune.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <fstream>
#include <random>

#include "model/llama.h"
#include "serve/tuning.h"

namespace colony::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `fn`, turning the exceptions LibTorch modules throw (RemoteSequential included, when
// the swarm cannot serve) into a Status.
template <typename F>
Result<double> Catching(const char* what, F fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Unavailable(fmt::format("{} through the swarm failed: {}", what, e.what()));
  }
}

}  // namespace

std::string_view MethodName(FineTuneMethod method) {
  switch (method) {
    case FineTuneMethod::kPrompt:
      return "prompt";
    case FineTuneMethod::kDeepPrompt:
      return "deep-prompt";
    case FineTuneMethod::kLora:
      return "lora";
  }
  return "?";
}

Result<FineTuneResult> FineTune(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                                const std::vector<std::vector<int64_t>>& sequences,
                                const FineTuneOptions& options) {
  if (sequences.empty()) return InvalidArgument("no sequences to fine-tune on");
  if (options.steps < 0 || options.batch_size < 1 || !(options.lr > 0)) {
    return InvalidArgument("fine-tuning needs steps >= 0, batch_size >= 1 and lr > 0");
  }
  if (options.prompt_length < 1 || options.lora_rank < 1) {
    return InvalidArgument("fine-tuning needs prompt_length >= 1 and lora_rank >= 1");
  }
  const bool use_lora = options.method == FineTuneMethod::kLora;
  PromptTuned tuned(head, remote,
                    PromptTuningOptions{.prompt_length = options.prompt_length,
                                        .deep = options.method == FineTuneMethod::kDeepPrompt});
  LoraTuned lora(head, remote, LoraTuningOptions{.rank = use_lora ? options.lora_rank : 1});
  torch::optim::Adam opt(use_lora ? lora->TrainableParameters() : tuned->TrainableParameters(),
                         torch::optim::AdamOptions(options.lr));
  // Pad the sequences to one length with -100 targets (ignored by the loss).
  size_t len = 0;
  for (const auto& s : sequences) len = std::max(len, s.size());
  auto batch_of = [&](size_t first, size_t count) {
    at::Tensor tokens =
        at::zeros({static_cast<int64_t>(count), static_cast<int64_t>(len)}, at::kLong);
    at::Tensor targets =
        at::full({static_cast<int64_t>(count), static_cast<int64_t>(len)}, -100, at::kLong);
    for (size_t i = 0; i < count; ++i) {
      const auto& s = sequences[(first + i) % sequences.size()];
      for (size_t t = 0; t < s.size(); ++t) {
        tokens[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = s[t];
        targets[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = s[t];
      }
    }
    return std::make_pair(tokens, targets);
  };
  auto loss_on = [&](const at::Tensor& tokens, const at::Tensor& targets) {
    const int64_t t = tokens.size(1);
    at::Tensor input = tokens.narrow(1, 0, t - 1);
    at::Tensor logits = use_lora ? lora->forward(input) : tuned->forward(input);
    return model::LanguageModelLoss(logits, targets.narrow(1, 1, t - 1).to(logits.device()));
  };
  auto [all_tokens, all_targets] = batch_of(0, sequences.size());
  auto evaluate = [&]() -> double {
    at::NoGradGuard no_grad;
    return loss_on(all_tokens, all_targets).item<double>();
  };
  FineTuneResult result;
  COLONY_ASSIGN_OR_RETURN(result.initial_loss, Catching("evaluating", evaluate));
  const auto t0 = Clock::now();
  const auto batch = static_cast<size_t>(
      std::min<int64_t>(options.batch_size, static_cast<int64_t>(sequences.size())));
  for (int64_t step = 0; step < options.steps; ++step) {
    auto [tokens, targets] = batch_of(static_cast<size_t>(step * options.batch_size), batch);
    auto one_step = [&]() -> double {
      opt.zero_grad();
      at::Tensor loss = loss_on(tokens, targets);
      loss.backward();
      opt.step();
      return loss.item<double>();
    };
    COLONY_ASSIGN_OR_RETURN(const double loss, Catching("a training step", one_step));
    if (options.on_step &&
        (step % std::max<int64_t>(1, options.report_every) == 0 || step + 1 == options.steps)) {
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      options.on_step({.step = step + 1,
                       .steps = options.steps,
                       .loss = loss,
                       .steps_per_second = static_cast<double>(step + 1) / secs});
    }
  }
  result.steps = options.steps;
  COLONY_ASSIGN_OR_RETURN(result.final_loss, Catching("evaluating", evaluate));
  if (!options.save.empty()) {
    COLONY_RETURN_IF_ERROR(use_lora ? SaveTuned(options.save, *lora)
                                    : SaveTuned(options.save, *tuned));
  }
  return result;
}

Result<std::vector<std::vector<int64_t>>> FineTuneSequences(const model::Tokenizer* tokenizer,
                                                            int64_t vocab,
                                                            const std::filesystem::path& data) {
  std::vector<std::vector<int64_t>> seqs;
  if (tokenizer == nullptr) {
    if (!data.empty()) {
      return FailedPrecondition(fmt::format(
          "the fine-tuning data {} needs a tokenizer, and the model has none", data.string()));
    }
    if (vocab < 1) return InvalidArgument("the vocabulary is empty");
    std::mt19937_64 rng(1234);
    for (int i = 0; i < 8; ++i) {
      std::vector<int64_t> s;
      const int64_t base = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
      for (int t = 0; t < 16; ++t) s.push_back((base + 3 * t) % vocab);
      seqs.push_back(std::move(s));
    }
    return seqs;
  }
  std::vector<std::string> lines;
  if (!data.empty()) {
    std::ifstream in(data);
    if (!in) return NotFound(fmt::format("cannot read the fine-tuning data {}", data.string()));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  } else {
    lines = {"Colony peers find each other through a distributed hash table.",
             "Servers host ranges of transformer blocks for the swarm.",
             "Clients route inference sessions through chains of servers.",
             "When a server dies, the client replays its inputs to a replacement.",
             "Gradients are averaged in groups with compressed all-reduce.",
             "Every connection is authenticated and encrypted."};
  }
  for (const auto& l : lines) {
    std::vector<int64_t> s;
    if (tokenizer->bos_id() >= 0) s.push_back(tokenizer->bos_id());
    for (int32_t id : tokenizer->Encode(l)) s.push_back(id);
    if (s.size() >= 2) seqs.push_back(std::move(s));
  }
  if (seqs.empty()) return InvalidArgument("the fine-tuning data has no usable lines");
  return seqs;
}

}  // namespace colony::serve
