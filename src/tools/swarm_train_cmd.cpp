// colony swarm-train init|stage|trainer: SWARM parallelism (docs/swarm.md). init writes the run's
// initial model, stage hosts and trains a range of its blocks, trainer (train_cmd.cpp) streams
// data through the stages. src/swarm does the work. Part of colony-torch.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>

#include "core/clock.h"
#include "core/log.h"
#include "dht/node.h"
#include "model/config.h"
#include "swarm/layout.h"
#include "swarm/rebalancing.h"
#include "swarm/stage.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "train/powersgd.h"
#include "train/task.h"

namespace colony::cli {
namespace {

struct InitArgs {
  train::TaskOptions task;
  std::string out;
  int64_t stages = 2;
};

// The run's initial model: the lm task's decoder (train/task.h) from --init-seed, in Hugging Face
// format with its tokenizer, as every stage and trainer of the run loads it.
int RunInit(const InitArgs& a) {
  if (std::filesystem::exists(a.out) && !std::filesystem::is_empty(a.out)) {
    return Fail(fmt::format("--out {} exists and is not empty; choose a new directory", a.out));
  }
  auto task = train::Task::Create(a.task);
  if (!task.ok()) return Fail(task.status());
  if (Status st = (*task)->Save(a.out); !st.ok()) return Fail(st.WithContext("--out"));
  auto config = model::LoadLlamaConfig(a.out);
  if (!config.ok()) return Fail(config.status());
  auto layout = swarm::EvenLayout(config->num_layers, a.stages);
  if (!layout.ok()) return Fail(layout.status().WithContext("--stages"));
  if (Status st = swarm::WriteLayout(a.out, *layout); !st.ok()) return Fail(st);
  std::printf("%s\n", Dump({{"event", "initialized"},
                            {"model", a.out},
                            {"stages", layout->ToString()},
                            {"description", (*task)->Describe()}})
                          .c_str());
  return 0;
}

struct StageArgs {
  std::vector<std::string> initial_peers;
  std::string listen = "/ip4/0.0.0.0/tcp/0";
  std::vector<std::string> announce;
  AccessArgs access;
  std::string model;
  std::string run = "colony.swarm";
  std::string blocks;
  std::string optimizer = "adam";
  double lr = 1e-3;
  double weight_decay = 0;
  int64_t target_batch_size = 256;
  double matchmaking_time = 5;
  double averaging_timeout = 60;
  std::string grad_codec = "none";
  int powersgd_rank = 0;
  int64_t max_batch = 64;
  double throughput = 0;
  int threads = 0;
  double rebalance_period = 60;
  double balance_quality = 0.75;
  double record_ttl = 20;
};

nlohmann::json StatsJson(const swarm::StageTrainingStats& t) {
  return {{"epoch", t.epoch},     {"forwards", t.forwards}, {"backwards", t.backwards},
          {"samples", t.samples}, {"rounds", t.rounds},     {"averaged", t.averaged},
          {"stale", t.stale},     {"refused", t.refused},   {"state_loads", t.state_loads},
          {"dropped", t.dropped}};
}

int RunStage(const StageArgs& a) {
  swarm::StagePeerOptions p;
  swarm::StageOptions& o = p.stage;
  o.run = a.run;
  o.model_dir = a.model;
  auto config = model::LoadLlamaConfig(a.model);
  if (!config.ok()) return Fail(config.status().WithContext("--model"));
  auto layout = swarm::ReadLayout(a.model, config->num_layers);
  if (!layout.ok()) return Fail(layout.status());
  p.layout = *layout;
  o.first_block = o.last_block = -1;
  if (!a.blocks.empty()) {
    try {
      const auto colon = a.blocks.find(':');
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      o.first_block = std::stoll(a.blocks.substr(0, colon));
      o.last_block = std::stoll(a.blocks.substr(colon + 1));
    } catch (const std::exception&) {
      return Fail(fmt::format("--blocks '{}': expected A:B, one of the run's stages ({})", a.blocks,
                              layout->ToString()));
    }
  }
  p.rebalance.period = SecondsToMillis(a.rebalance_period);
  p.rebalance.balance_quality = a.balance_quality;
  o.server.record_ttl_seconds = a.record_ttl;
  o.server.announce_period = SecondsToMillis(a.record_ttl / 4);
  o.server.max_batch = a.max_batch;
  o.server.throughput_override = a.throughput;
  o.server.torch_threads = a.threads;
  o.training.optimizer = a.optimizer;
  o.training.optimizer_config.lr = a.lr;
  o.training.optimizer_config.weight_decay = a.weight_decay;
  auto& c = o.training.collaborative;
  c.target_batch_size = a.target_batch_size;
  c.matchmaking_time = SecondsToMillis(a.matchmaking_time);
  c.averaging_timeout = SecondsToMillis(a.averaging_timeout);
  c.load_state_timeout = SecondsToMillis(a.averaging_timeout);
  auto codec = compression::ParseCodec(a.grad_codec);
  if (!codec.ok()) return Fail(codec.status().WithContext("--grad-codec"));
  c.grad_codec = *codec;
  c.powersgd_rank = a.powersgd_rank;
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
  p.on_move = [](const swarm::StageMove& m) {
    nlohmann::json e = {{"event", "moved"},
                        {"from", {m.from.first, m.from.second}},
                        {"to", {m.to.first, m.to.second}},
                        {"ok", m.status.ok()},
                        {"capacity_before", m.capacity_now},
                        {"capacity_after", m.capacity_after},
                        {"left", StatsJson(m.left)}};
    if (!m.status.ok()) e["error"] = m.status.ToString();
    std::printf("%s\n", Dump(e).c_str());
    std::fflush(stdout);
  };
  auto stage = swarm::StagePeer::Start(*node, std::move(p));
  if (!stage.ok()) return Fail(stage.status().WithContext("starting the stage"));
  nlohmann::json addrs = nlohmann::json::array();
  for (const auto& m : node->VisibleAddresses()) addrs.push_back(m.ToString());
  const auto s = (*stage)->stats();
  std::printf("%s\n", Dump({{"event", "ready"},
                            {"peer", node->peer_id().ToString()},
                            {"addrs", addrs},
                            {"run", a.run},
                            {"stage", swarm::StageRunId(a.run, s.first)},
                            {"blocks", {s.first, s.last}},
                            {"epoch", s.training.epoch},
                            {"throughput", s.server.throughput}})
                          .c_str());
  std::fflush(stdout);
  const std::string sig = WaitForTerminationSignal();
  const auto t = (*stage)->stats();
  COLONY_LOG_INFO("received {}; leaving the stage at epoch {}", sig, t.training.epoch);
  (*stage)->Shutdown();
  nlohmann::json done = StatsJson(t.training);
  done["event"] = "done";
  done["blocks"] = {t.first, t.last};
  done["moves"] = t.moves;
  done["failed_moves"] = t.failed_moves;
  done["rejoins"] = t.rejoins;
  done["stageless"] = t.stageless;
  std::printf("%s\n", Dump(done).c_str());
  started->access.Stop();
  node->Shutdown();
  return 0;
}

}  // namespace

void AddSwarmTrainCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto* swarm = app.add_subcommand(
      "swarm-train",
      "SWARM parallelism: train a model cut into pipeline stages, each hosted by a swarm of "
      "peers (init the model, host a stage, or run a trainer)");
  swarm->require_subcommand(1);

  auto i = std::make_shared<InitArgs>();
  auto* init = swarm->add_subcommand(
      "init",
      "write the run's initial model (the lm task's decoder, Hugging Face format, with its "
      "tokenizer) for its stages and trainers to load");
  init->add_option("--out", i->out, "the directory to write")->required();
  init->add_option("--model-size", i->task.model_size, "tiny (0.4M), small (3M) or base (25M)")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str();
  init->add_option("--hidden-size", i->task.hidden_size, "override the size's hidden size");
  init->add_option("--layers", i->task.layers, "override the size's number of blocks");
  init->add_option("--heads", i->task.heads, "override the size's attention heads");
  init->add_option("--kv-heads", i->task.kv_heads, "override the size's key/value heads");
  init->add_option("--vocab-size", i->task.vocab_size, "tokenizer vocabulary")
      ->check(CLI::Range(256, 65535))
      ->capture_default_str();
  init->add_option("--seq-len", i->task.seq_len, "tokens per training sequence")
      ->capture_default_str();
  init->add_option("--corpus-bytes", i->task.corpus_bytes,
                   "train the tokenizer on this much text (0: all)")
      ->capture_default_str();
  init->add_option("--cache-dir", i->task.cache_dir,
                   "where the corpus and tokenizer are cached (default: $COLONY_CACHE_DIR or "
                   "~/.cache/colony)");
  init->add_option("--init-seed", i->task.init_seed, "seed of the initial weights")
      ->capture_default_str();
  init->add_option("--stages", i->stages,
                   "pipeline stages: the blocks cut into this many ranges of (nearly) equal "
                   "length, written to swarm.json")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  commands.emplace_back(init, [i]() { return RunInit(*i); });

  auto a = std::make_shared<StageArgs>();
  auto* stage = swarm->add_subcommand(
      "stage",
      "host and train one stage of the run's model (its blocks, from swarm.json) as a peer of "
      "that stage: forward and backward for trainers, rounds with the stage's other peers, and "
      "a move to a weaker stage when that lifts the pipeline's throughput clearly; prints JSON "
      "ready, moved and done lines");
  stage->add_option("--model", a->model, "the run's initial checkpoint (colony swarm-train init)")
      ->required();
  stage->add_option("--run-id", a->run, "the run's name (the trainers' --run-id)")
      ->capture_default_str();
  stage->add_option("--blocks", a->blocks,
                    "start with the stage of blocks A..B-1, as A:B (default: the weakest stage)");
  stage->add_option("--initial-peers", a->initial_peers, "multiaddr of a DHT peer (repeatable)")
      ->check(MultiaddrCheck());
  stage->add_option("--listen", a->listen, "address to listen on")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  AddAnnounceOption(stage, a->announce);
  AddAccessOptions(stage, a->access);
  stage->add_option("--optimizer", a->optimizer, "sgd, adam, adamw, lamb, adam8bit or adamw8bit")
      ->capture_default_str();
  stage->add_option("--lr", a->lr, "learning rate")->capture_default_str();
  stage->add_option("--weight-decay", a->weight_decay, "weight decay")->capture_default_str();
  stage
      ->add_option("--target-batch-size", a->target_batch_size,
                   "the trainers' --target-batch-size (paces the stage's progress reports)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  stage
      ->add_option("--matchmaking-time", a->matchmaking_time,
                   "seconds a stage's round waits for its missing peers")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  stage->add_option("--averaging-timeout", a->averaging_timeout, "seconds per round")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  stage->add_option("--grad-codec", a->grad_codec, "compression of the averaged gradients")
      ->capture_default_str();
  stage
      ->add_option("--powersgd-rank", a->powersgd_rank,
                   "average the blocks' gradient matrices as PowerSGD factors of this rank, with "
                   "error feedback (as colony train's; 0: whole)")
      ->check(CLI::Range(0, train::kMaxPowerSgdRank))
      ->capture_default_str();
  stage->add_option("--max-batch", a->max_batch, "largest microbatch a request may carry")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  stage->add_option("--throughput", a->throughput,
                    "announce this throughput instead of measuring it (tests)");
  stage->add_option("--threads", a->threads, "LibTorch threads (default: LibTorch's)");
  stage
      ->add_option("--rebalance-period", a->rebalance_period,
                   "seconds between checks of the stages' balance (0: never move)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  stage
      ->add_option("--balance-quality", a->balance_quality,
                   "move a peer when the pipeline's throughput is below this fraction of what "
                   "the stage peers could give at best (their throughputs spread evenly)")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  stage
      ->add_option("--record-ttl", a->record_ttl,
                   "seconds the stage's DHT records live (re-announced every quarter of it): how "
                   "soon trainers and other stage peers forget a peer that died")
      ->check(CLI::Range(2.0, 3600.0))
      ->capture_default_str();
  commands.emplace_back(stage, [a]() { return RunStage(*a); });

  AddSwarmTrainerCommand(swarm, commands);
}

}  // namespace colony::cli
