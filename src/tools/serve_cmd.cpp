// colony serve | generate | finetune: running a model together (Petals-style). Part of
// colony-torch.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "dht/node.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "serve/client.h"
#include "serve/finetune.h"
#include "serve/generation.h"
#include "serve/server.h"
#include "serve/swarm_client.h"
#include "serve/tuning.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/swarm_args.h"

namespace colony::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- serve

struct ServeArgs {
  SwarmArgs swarm;
  std::string blocks;
  int64_t num_blocks = 0;
  std::string listen = "/ip4/0.0.0.0/tcp/0";
  std::vector<std::string> announce;
  std::vector<std::string> relays;
  std::string dtype = "float32";
  std::string quantize = "none";
  int64_t cache_mib = 512;
  size_t max_sessions = 128;
  size_t max_sessions_per_address = 32;
  double cache_share_per_address = 0.25;
  int64_t request_mib = 1024;
  double request_share_per_address = 0.25;
  int64_t max_batch = 64;
  int64_t max_length = 0;
  double throughput = 0;
  double idle_timeout = 60;
  bool no_rebalance = false;
};

int RunServe(const ServeArgs& a) {
  serve::ServerOptions o;
  o.model_dir = a.swarm.model;
  o.model_name = ModelName(a.swarm);
  if (!a.blocks.empty()) {
    auto colon = a.blocks.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      o.first_block = std::stoll(a.blocks.substr(0, colon));
      o.last_block = std::stoll(a.blocks.substr(colon + 1));
    } catch (const std::exception&) {
      return Fail(fmt::format("--blocks {}: expected A:B (blocks A..B-1), e.g. 0:4", a.blocks));
    }
  } else if (a.num_blocks <= 0) {
    return Fail("give --blocks A:B or --num-blocks N");
  }
  o.num_blocks = a.num_blocks;
  o.dtype = a.dtype;
  o.device = a.swarm.device;
  o.quantize = a.quantize;
  o.cache_bytes = a.cache_mib << 20;
  o.max_sessions = a.max_sessions;
  o.max_sessions_per_address = a.max_sessions_per_address;
  o.cache_share_per_address = a.cache_share_per_address;
  o.max_request_bytes = static_cast<uint64_t>(a.request_mib) << 20;
  o.request_share_per_address = a.request_share_per_address;
  o.max_batch = a.max_batch;
  o.max_length = a.max_length;
  o.torch_threads = a.swarm.threads;
  o.throughput_override = a.throughput;
  o.session_idle_timeout = SecondsToMillis(a.idle_timeout);
  o.rebalance = !a.no_rebalance;
  if (a.swarm.threads > 0) at::set_num_threads(a.swarm.threads);

  BlockTerminationSignals();
  dht::NodeOptions node_options;
  node_options.initial_peers = a.swarm.initial_peers;
  node_options.relays = a.relays;
  if (a.relays.empty()) {
    auto listen = Multiaddr::Parse(a.listen);
    if (!listen.ok()) return Fail(listen.status());
    node_options.listen = {*listen};
  }
  auto announce = ParseAnnounce(a.announce);
  if (!announce.ok()) return Fail(announce.status());
  node_options.announce = std::move(*announce);
  auto started = StartSwarmNode(a.swarm.access, std::move(node_options));
  if (!started.ok()) return Fail(started.status());
  std::unique_ptr<dht::Node>& node = started->node;
  auto server = serve::BlockServer::Start(*node, o);
  if (!server.ok()) return Fail(server.status().WithContext("starting the server"));
  auto stats = (*server)->Stats();
  for (const auto& m : node->VisibleAddresses()) std::printf("%s\n", m.ToString().c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "serving blocks [%lld, %lld) of '%s': %.0f tokens/s per block forward, %.1f "
               "inference steps/s per block, %.1f MiB of weights, %lld MiB KV cache\n",
               static_cast<long long>(stats.first), static_cast<long long>(stats.last),
               (*server)->model_name().c_str(), stats.throughput, stats.inference_rps,
               stats.weight_bytes / 1048576.0, static_cast<long long>(a.cache_mib));
  std::string sig = WaitForTerminationSignal();
  COLONY_LOG_INFO("received {}, announcing offline and shutting down", sig);
  (*server)->Shutdown();
  started->access.Stop();
  node->Shutdown();
  return 0;
}

// ---------------------------------------------------------------- generate

struct GenerateArgs {
  SwarmArgs swarm;
  std::string prompt;
  std::string tokens;
  int64_t max_new_tokens = 32;
  // Sampling: what the flags given say, the model's generation_config.json for the others.
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0;
  bool temperature_given = false, top_k_given = false, top_p_given = false,
       repetition_penalty_given = false;
  uint64_t seed = 0;
  int64_t num_beams = 1;
  int64_t max_length = 0;
  std::string tuned;
  bool json = false;
};

int RunGenerate(const GenerateArgs& a) {
  if (a.swarm.threads > 0) at::set_num_threads(a.swarm.threads);
  auto started = StartClient(a.swarm);
  if (!started.ok()) return Fail(started.status());
  serve::SwarmClient* client = started->client.get();
  const auto& config = client->head->config();
  auto prompt_ids =
      PromptTokens(a.prompt, a.tokens, client->tokenizer ? &*client->tokenizer : nullptr,
                   a.swarm.model, config.vocab_size);
  if (!prompt_ids.ok()) return Fail(prompt_ids.status());
  const std::vector<int64_t>& prompt = *prompt_ids;
  serve::TunedWeights tuned;
  if (!a.tuned.empty()) {
    auto t = serve::LoadTuned(a.tuned, config);
    if (!t.ok()) return Fail(t.status().WithContext("--tuned"));
    tuned = std::move(*t);
  }
  // The servers' caches also hold the shallow prompt's positions.
  const int64_t prompt_tokens = tuned.prompts.defined() ? tuned.prompts.size(0) : 0;
  const int64_t max_length =
      prompt_tokens + (a.max_length > 0 ? a.max_length
                                        : std::min<int64_t>(config.max_seq_len - prompt_tokens,
                                                            static_cast<int64_t>(prompt.size()) +
                                                                a.max_new_tokens));
  serve::RemoteSequential remote(client->manager);
  auto session = remote.OpenSession(tuned.Session(max_length, a.num_beams));
  serve::RemoteBackend backend(client->head, *session, max_length, tuned.prompts);
  const int eos = client->tokenizer ? client->tokenizer->eos_id() : -1;
  std::vector<int64_t> out;
  const auto t0 = Clock::now();
  if (!a.json && client->tokenizer) std::printf("%s", a.prompt.c_str());
  if (a.num_beams > 1) {
    // The generation config's end tokens end a beam as the tokenizer's EOS does.
    std::vector<int64_t> ends = client->generation.eos_token_ids;
    if (eos >= 0) ends.push_back(eos);
    // The repetition penalty applies to beams as transformers' beam search applies it.
    const double penalty = a.repetition_penalty_given
                               ? a.repetition_penalty
                               : client->generation.Defaults().repetition_penalty;
    auto beams = serve::BeamSearch(backend, prompt, a.num_beams, a.max_new_tokens, ends,
                                   /*length_penalty=*/1.0, penalty);
    if (!beams.ok()) return Fail(beams.status().WithContext("beam search"));
    out = beams->front().tokens;
    if (!a.json) {
      if (client->tokenizer) {
        std::vector<int32_t> ids(out.begin(), out.end());
        std::printf("%s", client->tokenizer->Decode(ids).c_str());
      } else {
        for (int64_t t : out) std::printf("%lld ", static_cast<long long>(t));
      }
    }
  } else {
    model::SamplingDefaults d = client->generation.Defaults();
    if (d != model::SamplingDefaults{} && !a.json) {
      std::fprintf(stderr,
                   "generation_config.json: temperature %g, top-k %lld, top-p %g, repetition "
                   "penalty %g, unless the flags say otherwise\n",
                   d.temperature, static_cast<long long>(d.top_k), d.top_p, d.repetition_penalty);
    }
    if (a.temperature_given) d.temperature = a.temperature;
    if (a.top_k_given) d.top_k = a.top_k;
    if (a.top_p_given) d.top_p = a.top_p;
    if (a.repetition_penalty_given) d.repetition_penalty = a.repetition_penalty;
    model::SamplingOptions so{.max_new_tokens = a.max_new_tokens,
                              .temperature = d.temperature,
                              .top_k = d.top_k,
                              .top_p = d.top_p,
                              .repetition_penalty = d.repetition_penalty,
                              .seed = a.seed};
    // The generation config's end tokens end the text as the tokenizer's EOS does.
    const std::vector<int64_t>& ends = client->generation.eos_token_ids;
    bool ended = false;
    std::vector<int32_t> decoded;
    std::string printed;
    auto r = serve::GenerateWith(
        backend, prompt, so, eos,
        [&](int64_t t) {
          ended = std::ranges::find(ends, t) != ends.end();
          if (a.json) return;
          if (client->tokenizer) {
            // Print the text as it grows (pieces can merge with the next token's bytes).
            decoded.push_back(static_cast<int32_t>(t));
            std::string text = client->tokenizer->Decode(decoded);
            if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
              std::printf("%s", text.substr(printed.size()).c_str());
              printed = text;
            }
          } else {
            std::printf("%lld ", static_cast<long long>(t));
          }
          std::fflush(stdout);
        },
        [&] { return ended; });
    if (!r.ok()) return Fail(r.status().WithContext("generating"));
    out = *r;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto& stats = session->stats();
  if (a.json) {
    Json j = {{"tokens", out},
              {"prompt_tokens", prompt},
              {"seconds", secs},
              {"failovers", stats.failovers},
              {"replayed_tokens", stats.replayed_tokens}};
    if (client->tokenizer) {
      std::vector<int32_t> ids(out.begin(), out.end());
      j["text"] = client->tokenizer->Decode(ids);
    }
    Json route = Json::array();
    for (const auto& s : stats.route) {
      route.push_back({{"peer", s.server.peer.ToString()}, {"start", s.start}, {"end", s.end}});
    }
    j["route"] = route;
    std::printf("%s\n", Dump(j).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%zu tokens in %.2f s (%.2f tokens/s) through %zu servers; %lld failovers\n",
                 out.size(), secs, out.size() / std::max(secs, 1e-9), stats.route.size(),
                 static_cast<long long>(stats.failovers));
  }
  session->Close();
  started->access.Stop();
  client->node->Shutdown();
  return 0;
}

// ---------------------------------------------------------------- finetune

struct FinetuneArgs {
  SwarmArgs swarm;
  int64_t prompt_length = 8;
  bool deep = false;
  int64_t lora_rank = 0;
  int64_t steps = 30;
  double lr = 0.05;
  int64_t batch_size = 4;
  std::string data;
  std::string save;
  uint64_t seed = 0;
};

int RunFinetune(const FinetuneArgs& a) {
  if (a.deep && a.lora_rank > 0) return Fail("--deep and --lora are different methods: give one");
  if (a.swarm.threads > 0) at::set_num_threads(a.swarm.threads);
  at::manual_seed(a.seed);
  // Fine-tuning generates nothing: the model's generation_config.json is not its concern.
  auto client = StartClient(a.swarm, /*generates=*/false);
  if (!client.ok()) return Fail(client.status());
  const auto& c = *client->client;
  auto data = serve::FineTuneSequences(c.tokenizer ? &*c.tokenizer : nullptr,
                                       c.head->config().vocab_size, a.data);
  if (!data.ok()) return Fail(data.status().WithContext("--data"));
  serve::FineTuneOptions o;
  o.method = a.lora_rank > 0
                 ? serve::FineTuneMethod::kLora
                 : (a.deep ? serve::FineTuneMethod::kDeepPrompt : serve::FineTuneMethod::kPrompt);
  o.prompt_length = a.prompt_length;
  o.lora_rank = a.lora_rank;
  o.steps = a.steps;
  o.lr = a.lr;
  o.batch_size = a.batch_size;
  o.save = a.save;
  o.on_step = [](const serve::FineTuneStep& s) {
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  %.1f steps/s\n",
                 static_cast<long long>(s.step), static_cast<long long>(s.steps), s.loss,
                 s.steps_per_second);
  };
  if (o.method == serve::FineTuneMethod::kLora) {
    std::fprintf(stderr,
                 "LoRA (rank %lld on q_proj, v_proj of every remote block) on %zu sequences\n",
                 static_cast<long long>(a.lora_rank), data->size());
  } else {
    std::fprintf(stderr, "prompt tuning (%s, %lld prompt tokens) on %zu sequences\n",
                 a.deep ? "deep" : "shallow", static_cast<long long>(a.prompt_length),
                 data->size());
  }
  auto remote = std::make_shared<serve::RemoteSequential>(c.manager);
  auto r = serve::FineTune(c.head, remote, *data, o);
  if (!r.ok()) return Fail(r.status());
  Json j = {{"initial_loss", r->initial_loss},
            {"final_loss", r->final_loss},
            {"steps", r->steps},
            {"method", serve::MethodName(o.method)}};
  std::printf("%s\n", Dump(j).c_str());
  std::fprintf(stderr, "loss %.4f -> %.4f\n", r->initial_loss, r->final_loss);
  client->access.Stop();
  c.node->Shutdown();
  return 0;
}

}  // namespace

void AddServeCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  {
    auto a = std::make_shared<ServeArgs>();
    auto* cmd = app.add_subcommand(
        "serve", "host a range of a model's transformer blocks for the swarm (Petals-style)");
    AddSwarmOptions(cmd, a->swarm);
    cmd->add_option("--blocks", a->blocks, "serve blocks A..B-1, as A:B");
    cmd->add_option("--num-blocks", a->num_blocks,
                    "serve this many blocks where the swarm is weakest (instead of --blocks)");
    cmd->add_option("--listen", a->listen, "address to listen on")
        ->check(MultiaddrCheck())
        ->capture_default_str();
    AddAnnounceOption(cmd, a->announce);
    cmd->add_option("--relay", a->relays,
                    "behind NAT: serve through this relay peer (repeatable); without it a server "
                    "that others cannot dial back picks a relay by itself")
        ->check(MultiaddrCheck());
    cmd->add_option("--dtype", a->dtype, "weights and compute: float32 or bfloat16")
        ->check(CLI::IsMember({"float32", "bfloat16"}))
        ->capture_default_str();
    cmd->add_option("--quantize", a->quantize,
                    "store the blocks' projections as int8 (4x less memory than float32) or nf4 "
                    "(4-bit NormalFloat with double-quantized scales, as Petals: 7.75x less)")
        ->check(CLI::IsMember({"none", "int8", "nf4"}))
        ->capture_default_str();
    cmd->add_option("--cache-mib", a->cache_mib, "KV cache budget in MiB")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    cmd->add_option("--max-sessions", a->max_sessions, "inference sessions open at once")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    cmd->add_option("--max-sessions-per-address", a->max_sessions_per_address,
                    "inference sessions one client address may hold (loopback exempt)")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    cmd->add_option("--cache-share-per-address", a->cache_share_per_address,
                    "share of the KV cache one client address may hold (loopback exempt)")
        ->check(CLI::Range(0.001, 1.0))
        ->capture_default_str();
    cmd->add_option("--request-mib", a->request_mib,
                    "MiB of forward and backward requests held while they wait and run")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    cmd->add_option("--request-share-per-address", a->request_share_per_address,
                    "share of those MiB and of the request queue one client address may hold "
                    "(loopback exempt)")
        ->check(CLI::Range(0.001, 1.0))
        ->capture_default_str();
    cmd->add_option("--max-batch", a->max_batch, "largest batch per request")
        ->capture_default_str();
    cmd->add_option("--max-length", a->max_length,
                    "longest inference session in tokens (0: the model's limit)");
    cmd->add_option("--throughput", a->throughput,
                    "announce this throughput (tokens/s per block) instead of measuring it");
    cmd->add_option("--idle-timeout", a->idle_timeout, "seconds an inference session may stay idle")
        ->capture_default_str();
    cmd->add_flag("--no-rebalance", a->no_rebalance,
                  "with --num-blocks: keep the first choice of blocks");
    commands.emplace_back(cmd, [a] { return RunServe(*a); });
  }
  {
    auto a = std::make_shared<GenerateArgs>();
    auto* cmd = app.add_subcommand(
        "generate", "generate text with a model whose blocks are served by the swarm");
    AddSwarmOptions(cmd, a->swarm);
    cmd->add_option("--prompt", a->prompt,
                    "text to continue (needs tokenizer.model or tokenizer.json)");
    cmd->add_option("--tokens", a->tokens, "the prompt as token ids: 1,2,3");
    cmd->add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate")
        ->capture_default_str();
    cmd->add_option("--temperature", a->temperature,
                    "0: greedy (default: the model's generation_config.json's, as transformers "
                    "generates: greedy unless it says do_sample)");
    cmd->add_option("--top-k", a->top_k,
                    "sample among the k likeliest (0: off; default: generation_config.json's)");
    cmd->add_option("--top-p", a->top_p,
                    "nucleus sampling (1: off; default: generation_config.json's)");
    cmd->add_option("--repetition-penalty", a->repetition_penalty,
                    "1: off (default: generation_config.json's)");
    cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
    cmd->add_option("--num-beams", a->num_beams, "beam search with this many beams")
        ->check(CLI::Range(int64_t{1}, int64_t{64}));
    cmd->add_option("--max-length", a->max_length,
                    "tokens to reserve in the servers' caches (default: prompt + new tokens)");
    cmd->add_option("--tuned", a->tuned,
                    "generate with a tuned model: what 'colony finetune --save' wrote (shallow "
                    "or deep prompts, or LoRA adapters that the servers apply)");
    cmd->add_flag("--json", a->json, "print one JSON object instead of streaming text");
    commands.emplace_back(cmd, [a, cmd] {
      if (a->prompt.empty() == a->tokens.empty()) return Fail("give --prompt or --tokens");
      a->temperature_given = cmd->count("--temperature") > 0;
      a->top_k_given = cmd->count("--top-k") > 0;
      a->top_p_given = cmd->count("--top-p") > 0;
      a->repetition_penalty_given = cmd->count("--repetition-penalty") > 0;
      return RunGenerate(*a);
    });
  }
  {
    auto a = std::make_shared<FinetuneArgs>();
    auto* cmd = app.add_subcommand(
        "finetune",
        "prompt-tune (or LoRA-tune) a model through the swarm's frozen blocks (demonstration "
        "task: learn a few sentences, or --data FILE with one per line)");
    AddSwarmOptions(cmd, a->swarm);
    cmd->add_option("--prompt-length", a->prompt_length, "trainable prompt tokens")
        ->capture_default_str();
    cmd->add_flag("--deep", a->deep, "deep prompt tuning: prompts before every block");
    cmd->add_option("--lora", a->lora_rank,
                    "train LoRA adapters of this rank (on q_proj and v_proj of every remote "
                    "block; the servers apply them) instead of prompts")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--steps", a->steps, "optimizer steps")->capture_default_str();
    cmd->add_option("--lr", a->lr, "Adam learning rate")->capture_default_str();
    cmd->add_option("--batch-size", a->batch_size, "sequences per step")->capture_default_str();
    cmd->add_option("--data", a->data, "text file, one training sequence per line");
    cmd->add_option("--save", a->save,
                    "write the trained prompts or adapters here (safetensors; 'colony generate "
                    "--tuned' reads it)");
    cmd->add_option("--seed", a->seed, "initialization seed")->capture_default_str();
    commands.emplace_back(cmd, [a] { return RunFinetune(*a); });
  }
}

}  // namespace colony::cli
