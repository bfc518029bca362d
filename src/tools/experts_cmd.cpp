// colony experts serve: host mixture-of-experts experts for the swarm (Learning@home); colony
// experts generate: generate with a checkpoint whose experts they host. src/moe does the work.
// Part of colony-torch.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cstdio>
#include <optional>
#include <random>

#include "core/clock.h"
#include "core/log.h"
#include "dht/node.h"
#include "model/tokenizer.h"
#include "moe/checkpoint_experts.h"
#include "moe/discovery.h"
#include "moe/expert_server.h"
#include "moe/expert_uid.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/swarm_args.h"
#include "train/lr_schedule.h"

namespace colony::cli {
namespace {

struct ExpertsServeArgs {
  std::vector<std::string> initial_peers;
  std::string listen = "/ip4/0.0.0.0/tcp/0";
  std::vector<std::string> announce;
  AccessArgs access;
  std::string pattern;
  std::vector<std::string> expert_ids;
  int64_t num_experts = 1;
  int64_t hidden = 0;
  int64_t ffn_hidden = 0;
  std::string optimizer = "adam";
  double lr = 1e-3;
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0, total_steps = 0;
  double clip_grad_norm = 0;
  uint64_t seed = 0;
  int64_t max_batch = 4096;
  int threads = 0;
  std::string checkpoint_dir;
  double checkpoint_every = 60;
  std::string model;  // a Hugging Face mixture-of-experts checkpoint to serve the experts of
};

// --num-experts ids of the pattern that nobody in the DHT declares yet (hivemind skips taken
// ids too), drawn in a few rounds of candidates.
Result<std::vector<std::string>> FreeIds(dht::Node& node, const moe::ExpertPattern& pattern,
                                         int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed ^ std::random_device{}());
  std::vector<moe::ExpertUid> taken;
  std::vector<std::string> out;
  for (int round = 0; round < 8 && static_cast<int64_t>(out.size()) < count; ++round) {
    const auto want = static_cast<size_t>(count) - out.size();
    std::vector<moe::ExpertUid> candidates = pattern.Sample(2 * want, taken, rng);
    if (candidates.empty()) break;
    std::vector<std::string> ids;
    for (const auto& c : candidates) ids.push_back(c.ToString());
    const auto found = moe::GetExperts(node, ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      taken.push_back(candidates[i]);
      if (!found[i].has_value() && static_cast<int64_t>(out.size()) < count) out.push_back(ids[i]);
    }
  }
  if (static_cast<int64_t>(out.size()) < count) {
    return ResourceExhausted(fmt::format(
        "only {} of the {} experts asked for are free in {} (the others are served already)",
        out.size(), count, pattern.name));
  }
  return out;
}

// Each expert's learning-rate schedule by its own steps, as the flags give it.
Result<train::LrSchedule> ExpertSchedule(const ExpertsServeArgs& a) {
  auto kind = train::ParseLrScheduleKind(a.lr_schedule);
  if (!kind.ok()) return kind.status().WithContext("--lr-schedule");
  train::LrSchedule s{
      .kind = *kind, .warmup_epochs = a.warmup_steps, .total_epochs = a.total_steps};
  COLONY_RETURN_IF_ERROR(
      s.Check({.kind = "--lr-schedule", .warmup = "--warmup-steps", .total = "--total-steps"}));
  return s;
}

int RunExpertsServe(const ExpertsServeArgs& a) {
  if (a.pattern.empty() == a.expert_ids.empty()) {
    return Fail("give either --pattern (with --num-experts) or --expert-ids");
  }
  if (a.model.empty() == (a.hidden == 0)) {
    return Fail(
        "give either --hidden-dim (new experts) or --model (a checkpoint's experts, with its "
        "sizes)");
  }
  if (!a.model.empty() && a.ffn_hidden != 0) {
    return Fail("--ffn-dim does not apply with --model (the checkpoint sets the experts' sizes)");
  }
  auto schedule = ExpertSchedule(a);
  if (!schedule.ok()) return Fail(schedule.status());
  if (a.threads > 0) at::set_num_threads(a.threads);
  BlockTerminationSignals();
  dht::NodeOptions node_options;
  node_options.initial_peers = a.initial_peers;
  auto listen = Multiaddr::Parse(a.listen);
  if (!listen.ok()) return Fail(listen.status());
  node_options.listen = {*listen};
  auto announce = ParseAnnounce(a.announce);
  if (!announce.ok()) return Fail(announce.status());
  node_options.announce = std::move(*announce);
  auto started = StartSwarmNode(a.access, std::move(node_options));
  if (!started.ok()) return Fail(started.status());
  std::unique_ptr<dht::Node>& node = started->node;

  moe::ExpertServerOptions o;
  if (!a.pattern.empty()) {
    auto pattern = moe::ParseExpertPattern(a.pattern);
    if (!pattern.ok()) return Fail(pattern.status().WithContext("--pattern"));
    auto ids = FreeIds(*node, *pattern, a.num_experts, a.seed);
    if (!ids.ok()) return Fail(ids.status());
    o.uids = std::move(*ids);
  } else {
    o.uids = a.expert_ids;
  }
  o.expert = {.hidden = a.hidden,
              .ffn_hidden = a.ffn_hidden,
              .optimizer = a.optimizer,
              .lr = a.lr,
              .schedule = *schedule,
              .clip_grad_norm = a.clip_grad_norm,
              .seed = a.seed};
  if (!a.model.empty()) {
    // The checkpoint's experts, with its weights and sizes; the ids name layer and expert.
    const std::string grid = moe::ParseExpertUid(o.uids.at(0)).ok()
                                 ? moe::ParseExpertUid(o.uids[0])->name
                                 : std::string();
    auto read = moe::ReadCheckpointExperts(a.model, grid, o.uids);
    if (!read.ok()) return Fail(read.status().WithContext("--model"));
    o.expert.kind = read->expert.kind;
    o.expert.hidden = read->expert.hidden;
    o.expert.ffn_hidden = read->expert.ffn_hidden;
    o.initial_weights = std::move(read->weights);
  }
  o.max_batch = a.max_batch;
  o.checkpoint_dir = a.checkpoint_dir;
  o.checkpoint_interval = SecondsToMillis(a.checkpoint_every);
  auto server = moe::ExpertServer::Start(*node, o);
  if (!server.ok()) return Fail(server.status().WithContext("starting the expert server"));
  nlohmann::json addrs = nlohmann::json::array();
  for (const auto& m : node->VisibleAddresses()) addrs.push_back(m.ToString());
  std::printf("%s\n", Dump({{"event", "ready"},
                            {"peer", node->peer_id().ToString()},
                            {"addrs", addrs},
                            {"experts", o.uids},
                            {"restored", (*server)->restored()}})
                          .c_str());
  std::fflush(stdout);
  std::string sig = WaitForTerminationSignal();
  COLONY_LOG_INFO("received {}, saving checkpoints and shutting down", sig);
  (*server)->Shutdown();
  started->access.Stop();
  node->Shutdown();
  return 0;
}

struct ExpertsGenerateArgs {
  std::vector<std::string> initial_peers;
  AccessArgs access;
  std::string model;
  std::string grid = "mixtral";
  std::string prompt;
  std::string tokens;
  int64_t max_new_tokens = 32;
  double temperature = 0;
  uint64_t seed = 0;
  double timeout = 30;
  int threads = 0;
  bool json = false;
};

int RunExpertsGenerate(const ExpertsGenerateArgs& a) {
  if (a.prompt.empty() == a.tokens.empty()) return Fail("give --prompt or --tokens");
  if (a.initial_peers.empty()) {
    return Fail("give --initial-peers: the address of any peer of the swarm");
  }
  if (a.threads > 0) at::set_num_threads(a.threads);
  dht::NodeOptions node_options;
  node_options.initial_peers = a.initial_peers;
  node_options.dht.client_mode = true;
  auto started = StartSwarmNode(a.access, std::move(node_options));
  if (!started.ok()) return Fail(started.status());
  std::unique_ptr<dht::Node>& node = started->node;
  auto model = moe::LoadWithRemoteExperts(a.model, *node,
                                          {.grid = a.grid, .timeout = SecondsToMillis(a.timeout)});
  if (!model.ok()) return Fail(model.status().WithContext("--model"));
  (*model)->eval();
  std::optional<model::Tokenizer> tokenizer;
  if (auto path = model::Tokenizer::FindInModelDir(a.model); path.ok()) {
    auto tok = model::Tokenizer::Load(*path);
    if (!tok.ok()) return Fail(tok.status());
    tokenizer = std::move(*tok);
  }
  auto prompt = PromptTokens(a.prompt, a.tokens, tokenizer ? &*tokenizer : nullptr, a.model,
                             (*model)->config().vocab_size);
  if (!prompt.ok()) return Fail(prompt.status());
  std::vector<int64_t> out;
  try {
    at::NoGradGuard no_grad;
    out = model::Generate(
        *model, *prompt,
        {.max_new_tokens = a.max_new_tokens, .temperature = a.temperature, .seed = a.seed},
        tokenizer ? tokenizer->eos_id() : -1);
  } catch (const c10::Error& e) {
    return Fail(fmt::format("generation failed: {}", e.what_without_backtrace()));
  }
  std::string text;
  if (tokenizer) text = tokenizer->Decode(std::vector<int32_t>(out.begin(), out.end()));
  if (a.json) {
    std::printf("%s\n",
                Dump({{"prompt_tokens", *prompt}, {"tokens", out}, {"text", text}}).c_str());
  } else if (tokenizer && !a.prompt.empty()) {
    std::printf("%s%s\n", a.prompt.c_str(), text.c_str());
  } else {
    for (int64_t t : out) std::printf("%lld ", static_cast<long long>(t));
    std::printf("\n");
  }
  started->access.Stop();
  node->Shutdown();
  return 0;
}

}  // namespace

void AddExpertsCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto* experts = app.add_subcommand(
      "experts",
      "decentralized mixture-of-experts: host experts for the swarm, or generate with a "
      "checkpoint whose experts they host (Learning@home)");
  experts->require_subcommand(1);
  auto a = std::make_shared<ExpertsServeArgs>();
  auto* serve = experts->add_subcommand(
      "serve",
      "host experts (Linear, GELU, Linear, or a checkpoint's with --model; each with its own "
      "optimizer): answer forward and backward calls, train on backward, declare them in the "
      "DHT; prints a JSON ready line");
  serve->add_option("--initial-peers", a->initial_peers, "multiaddr of a DHT peer (repeatable)")
      ->check(MultiaddrCheck());
  serve->add_option("--listen", a->listen, "address to listen on")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  AddAnnounceOption(serve, a->announce);
  AddAccessOptions(serve, a->access);
  serve->add_option("--pattern", a->pattern,
                    "the grid to take free expert ids from, e.g. 'ffn.[0:16].[0:16]'");
  serve->add_option("--num-experts", a->num_experts, "how many experts to host with --pattern")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  serve->add_option("--expert-ids", a->expert_ids,
                    "exact expert ids to host (instead of --pattern)");
  serve->add_option("--hidden-dim", a->hidden, "the experts' input and output size")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  serve->add_option("--model", a->model,
                    "serve the experts of this Hugging Face mixture-of-experts checkpoint "
                    "(Mixtral) with their weights: ids <grid>.<layer>.<expert>, e.g. --pattern "
                    "'mixtral.[0:32].[0:8]' (instead of --hidden-dim)");
  serve->add_option("--ffn-dim", a->ffn_hidden, "the experts' inner size (default 4 x hidden)")
      ->check(CLI::Range(int64_t{0}, int64_t{262144}));
  serve->add_option("--optimizer", a->optimizer, "the experts' optimizer")
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  serve->add_option("--lr", a->lr, "the experts' learning rate")
      ->check(CLI::Range(0.0, 1e3))
      ->capture_default_str();
  serve
      ->add_option("--lr-schedule", a->lr_schedule,
                   "each expert's rate by its own optimizer steps: constant, linear or cosine "
                   "(both decay to 0 at --total-steps, as transformers' schedules with warmup)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}))
      ->capture_default_str();
  serve
      ->add_option("--warmup-steps", a->warmup_steps,
                   "grow each expert's rate linearly from 0 over its first this many steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve
      ->add_option("--total-steps", a->total_steps,
                   "linear, cosine: the expert's step at which its rate reaches 0")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve
      ->add_option("--clip-grad-norm", a->clip_grad_norm,
                   "clip each expert's gradients to this L2 norm before its step (0: off)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  serve->add_option("--seed", a->seed, "seed of the experts' initial weights")
      ->capture_default_str();
  serve
      ->add_option("--max-batch", a->max_batch,
                   "largest batch a request may carry, and rows the server computes in one batch "
                   "of requests")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  serve->add_option("--threads", a->threads, "LibTorch threads (default: LibTorch's)");
  serve->add_option("--checkpoint-dir", a->checkpoint_dir,
                    "read each expert's checkpoint from here at start, write it every "
                    "--checkpoint-every seconds and at exit");
  serve->add_option("--checkpoint-every", a->checkpoint_every, "seconds between checkpoints")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  commands.emplace_back(serve, [a]() { return RunExpertsServe(*a); });

  auto g = std::make_shared<ExpertsGenerateArgs>();
  auto* generate = experts->add_subcommand(
      "generate",
      "generate text with a Hugging Face mixture-of-experts checkpoint (Mixtral) whose experts "
      "are hosted by 'colony experts serve --model': this process reads and runs the rest of "
      "the model, never the experts' weights");
  generate->add_option("--initial-peers", g->initial_peers, "multiaddr of a DHT peer (repeatable)")
      ->check(MultiaddrCheck());
  AddAccessOptions(generate, g->access);
  generate->add_option("--model", g->model, "the checkpoint directory")->required();
  generate->add_option("--grid", g->grid, "the experts' grid name (ids <grid>.<layer>.<expert>)")
      ->capture_default_str();
  generate->add_option("--prompt", g->prompt,
                       "text to continue (needs tokenizer.model or tokenizer.json)");
  generate->add_option("--tokens", g->tokens, "the prompt as token ids: 1,2,3");
  generate->add_option("--max-new-tokens", g->max_new_tokens, "tokens to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  generate->add_option("--temperature", g->temperature, "0: greedy")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  generate->add_option("--seed", g->seed, "sampling seed")->capture_default_str();
  generate->add_option("--timeout", g->timeout, "seconds each expert call may take")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  generate->add_option("--threads", g->threads, "LibTorch threads (default: LibTorch's)");
  generate->add_flag("--json", g->json, "print one JSON object: prompt tokens, tokens, text");
  commands.emplace_back(generate, [g]() { return RunExpertsGenerate(*g); });
}

}  // namespace colony::cli
