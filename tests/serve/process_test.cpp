// Serving with real `colony serve` processes on loopback: A serves blocks 0:2 (and is the DHT
// bootstrap), B and C both serve 2:4. An in-process client generates through the swarm and, after
// the 6th token, SIGKILLs whichever of B and C its session routes through. The session must fail
// over to the other one (replaying the dead server's inputs) and produce exactly the tokens that
// model::Generate produces locally, greedy and with seeded sampling. (A variant kills a server in
// the middle of a chain instead: A 0:2, B and C 2:3, D 3:4.) Every client timeout is a few
// seconds, so no test can hang.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/files.h"
#include "core/identity.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "serve/client.h"
#include "serve/generation.h"
#include "serve/tuning.h"
#include "small_model.h"
#include "test_support.h"

namespace colony::serve {
namespace {

using namespace std::chrono_literals;
using colony::test::ColonyBinary;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

model::LlamaConfig SmallConfig() { return test::SmallLlamaConfig(/*tie_word_embeddings=*/true); }

// The last `max_chars` characters of a server's stderr, for failure messages.
std::string Tail(const std::string& path, size_t max_chars = 2000) {
  const std::string text = colony::test::ReadFile(path);
  return text.size() <= max_chars ? text : text.substr(text.size() - max_chars);
}

struct ServerProcess {
  std::string label;
  int64_t first = 0, last = 0;
  std::string stderr_path;
  std::optional<Subprocess> process;
  std::string address;  // the first printed multiaddr
  std::string peer;     // its /p2p/ part
};

class ServeProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);  // as the servers (--threads 1): the same kernels, the same sums
    dir_ = colony::test::TempPath("serve-process-test");
    fs::create_directories(dir_);
    servers_.reserve(8);  // StartServer hands out pointers into it
    model_dir_ = dir_ / "model";
    model_name_ = "serve-process-test-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
    at::manual_seed(7);
    model::LlamaModel m(SmallConfig());
    ASSERT_TRUE(model::SaveLlama(model_dir_, m).ok());
  }

  void TearDown() override {
    session_.reset();
    if (node_) node_->Shutdown();
    for (auto& s : servers_) {
      if (!s.process || !s.process->running()) continue;
      s.process->Signal(SIGTERM);
      if (!s.process->Wait(15s).ok()) {
        ADD_FAILURE() << s.label << " did not exit after SIGTERM\n" << Tail(s.stderr_path);
        s.process->Signal(SIGKILL);
        (void)s.process->Wait(5s);
      }
    }
    servers_.clear();
    RemoveTree(dir_);
  }

  // Starts `colony serve` for blocks [first, last) (joining through the first server, if any)
  // and reads the address it prints once it serves.
  ServerProcess* StartServer(const std::string& label, int64_t first, int64_t last) {
    ServerProcess s;
    s.label = label;
    s.first = first;
    s.last = last;
    s.stderr_path = (dir_ / (label + ".err")).string();
    std::vector<std::string> argv = {
        ColonyBinary(), "--log-level",
        "info",         "serve",
        "--model",      model_dir_.string(),
        "--model-name", model_name_,
        "--blocks",     std::to_string(first) + ":" + std::to_string(last),
        "--listen",     "/ip4/127.0.0.1/tcp/0",
        "--threads",    "1"};
    if (!servers_.empty()) {
      argv.push_back("--initial-peers");
      argv.push_back(servers_.front().address);
    }
    auto p = Subprocess::Spawn(argv, s.stderr_path);
    EXPECT_TRUE(p.ok()) << label << ": " << p.status().ToString();
    if (!p.ok()) return nullptr;
    s.process.emplace(std::move(*p));
    auto line = s.process->ReadLine(60s);
    EXPECT_TRUE(line.ok()) << label << " printed no address: " << line.status().ToString() << "\n"
                           << Tail(s.stderr_path);
    if (!line.ok()) return nullptr;
    s.address = *line;
    const auto at = s.address.find("/p2p/");
    EXPECT_NE(at, std::string::npos) << label << " printed " << s.address;
    if (at == std::string::npos) return nullptr;
    s.peer = s.address.substr(at + 5);
    servers_.push_back(std::move(s));
    return &servers_.back();
  }

  // Runs `colony COMMAND --model ... --initial-peers FIRST-SERVER ARGS...` (args[0] is the
  // command) to its exit, expecting 0, and returns the first line it printed.
  std::string RunClientCommand(const std::string& label, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {
        ColonyBinary(), args[0],     "--model",         model_dir_.string(),
        "--model-name", model_name_, "--initial-peers", servers_.front().address,
        "--threads",    "1"};
    argv.insert(argv.end(), args.begin() + 1, args.end());
    const std::string err = (dir_ / (label + ".err")).string();
    auto p = Subprocess::Spawn(argv, err);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return {};
    auto line = p->ReadLine(120s);
    auto code = p->Wait(30s);
    EXPECT_TRUE(code.ok() && *code == 0) << label << " failed\n" << Tail(err) << ServerLogs();
    EXPECT_TRUE(line.ok()) << label << " printed nothing\n" << Tail(err);
    return line.ok() ? *line : std::string();
  }

  // Every server's recent stderr, for failure messages.
  std::string ServerLogs() const {
    std::string out;
    for (const auto& s : servers_) out += "\n--- " + s.label + " stderr:\n" + Tail(s.stderr_path);
    return out;
  }

  // A client-mode DHT node and a SequenceManager whose timeouts bound every step.
  bool StartClient() {
    dht::NodeOptions o;
    o.initial_peers = {servers_.front().address};
    o.dht.client_mode = true;
    o.dht.request_timeout = 2s;
    o.dht.lookup_timeout = 5s;
    auto node = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    if (!node.ok()) return false;
    node_ = std::move(*node);
    manager_ = std::make_shared<SequenceManager>(
        *node_, ClientOptions{.model_name = model_name_,
                              .num_blocks = SmallConfig().num_layers,
                              .request_timeout = 10s,
                              .step_timeout = 5s,
                              .session_lifetime = 120s,
                              .refresh_period = 2s,
                              .max_attempts = 5,
                              .retry_backoff = 50ms,
                              .ban_base = 60s,  // a killed server stays out of the routes
                              .ban_max = 120s});
    return true;
  }

  // Every server's online record is visible to the client (or 60 s pass).
  bool WaitForServers() {
    const auto deadline = Clock::now() + 60s;
    while (Clock::now() < deadline) {
      (void)manager_->Refresh();
      const auto known = manager_->Servers();
      size_t found = 0;
      for (const auto& s : servers_) {
        for (const auto& r : known) {
          if (r.peer.ToString() == s.peer && r.start == s.first && r.end == s.last) {
            ++found;
            break;
          }
        }
      }
      if (found == servers_.size()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  // The swarm's servers: replicas B and C serve the same blocks [victim_first, victim_last).
  struct Layout {
    std::vector<std::tuple<std::string, int64_t, int64_t>> servers;  // label, first, last
    int64_t victim_first = 0, victim_last = 0;
  };
  // A serves 0:2 and is the bootstrap; B and C (last in the chain) both serve 2:4.
  static Layout LastHopLayout() {
    return {
        .servers = {{"A", 0, 2}, {"B", 2, 4}, {"C", 2, 4}}, .victim_first = 2, .victim_last = 4};
  }

  // Generates through the swarm, SIGKILLing whichever of B and C the session routes through
  // after the 6th token, and checks the tokens against model::Generate on the whole model
  // loaded locally.
  void RunFailover(const model::SamplingOptions& options, const Layout& layout = LastHopLayout()) {
    for (const auto& [label, first, last] : layout.servers) {
      ASSERT_NE(StartServer(label, first, last), nullptr);
    }
    ASSERT_TRUE(StartClient());
    ASSERT_TRUE(WaitForServers()) << "the servers' records did not all appear in the DHT";
    auto is_replica = [&](const ServerProcess& s) {
      return s.first == layout.victim_first && s.last == layout.victim_last;
    };

    auto local = model::LoadLlama(model_dir_);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    (*local)->eval();
    const std::vector<int64_t> prompt = {1, 17, 42, 99, 5, 3, 200, 77};
    const std::vector<int64_t> expected = model::Generate(*local, prompt, options);
    ASSERT_EQ(expected.size(), static_cast<size_t>(options.max_new_tokens));

    auto head = LoadClientModel(model_dir_);
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    RemoteSequential remote(manager_);
    const int64_t max_length = static_cast<int64_t>(prompt.size()) + options.max_new_tokens + 1;
    session_ = remote.OpenSession({.max_length = max_length, .batch_size = 1});
    RemoteBackend backend(*head, *session_, max_length);

    ServerProcess* killed = nullptr;
    int count = 0;
    const auto t0 = Clock::now();
    auto tokens = GenerateWith(backend, prompt, options, -1, [&](int64_t) {
      if (++count != 6) return;
      for (const auto& span : session_->stats().route) {
        for (auto& s : servers_) {
          if (is_replica(s) && s.peer == span.server.peer.ToString()) killed = &s;
        }
      }
      if (killed == nullptr) return;
      killed->process->Signal(SIGKILL);
      (void)killed->process->Wait(5s);  // dead before the next step
    });
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString() << ServerLogs();
    ASSERT_NE(killed, nullptr) << "neither replica was in the route after 6 tokens";
    const ServerProcess* survivor = nullptr;
    for (const auto& s : servers_) {
      if (is_replica(s) && &s != killed) survivor = &s;
    }
    ASSERT_NE(survivor, nullptr);
    EXPECT_EQ(*tokens, expected);
    const auto& stats = session_->stats();
    EXPECT_EQ(stats.failovers, 1);
    EXPECT_GT(stats.replayed_tokens, 0);
    ASSERT_EQ(stats.route.size(), layout.servers.size() - 1);
    bool survivor_routed = false;
    for (const auto& span : stats.route) {
      survivor_routed |= span.server.peer.ToString() == survivor->peer;
    }
    EXPECT_TRUE(survivor_routed) << "the session should end on the surviving replica";
    EXPECT_LT(secs, 60) << "generation with one failover took too long";
    session_->Close();
  }

  fs::path dir_, model_dir_;
  std::string model_name_;
  // Destroyed in reverse: the session, then the manager and the node, then the servers.
  std::vector<ServerProcess> servers_;
  std::unique_ptr<dht::Node> node_;
  std::shared_ptr<SequenceManager> manager_;
  std::unique_ptr<InferenceSession> session_;
};

TEST_F(ServeProcessTest, GreedyGenerationSurvivesKilledServer) {
  RunFailover({.max_new_tokens = 24});
}

TEST_F(ServeProcessTest, SeededSamplingSurvivesKilledServer) {
  RunFailover({.max_new_tokens = 24, .temperature = 0.8, .top_k = 20, .seed = 7});
}

// The killed server is in the middle of the chain: its replacement must rebuild its cache without
// disturbing the next server (D): the replay is not pushed on to D (a regression test: it once
// was, and D's extra answer made the client ban the healthy D).
TEST_F(ServeProcessTest, GreedyGenerationSurvivesKilledMiddleServer) {
  RunFailover({.max_new_tokens = 24},
              {.servers = {{"A", 0, 2}, {"B", 2, 3}, {"C", 2, 3}, {"D", 3, 4}},
               .victim_first = 2,
               .victim_last = 3});
}

// `colony finetune --lora --save` then `colony generate --tuned`, as a user runs them: the tokens
// printed are the greedy continuation of the model with the saved adapters, computed here apart
// (the adapters loaded from the file, full forward passes without a cache, argmax).
// colony generate reads the model's generation_config.json as transformers' generate() does:
// do_sample with its temperature, top-k, top-p and repetition penalty when no flag says
// otherwise, and its eos_token_id list ends the text. The reference is model::Generate on the
// whole model with the file's settings, cut after the first token of the list.
TEST_F(ServeProcessTest, GenerateFollowsTheModelsGenerationConfig) {
  ASSERT_NE(StartServer("A", 0, 4), nullptr);
  ASSERT_TRUE(StartClient());
  ASSERT_TRUE(WaitForServers()) << "the server's record did not appear in the DHT";
  auto local = model::LoadLlama(model_dir_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  (*local)->eval();
  const std::vector<int64_t> prompt = {1, 17, 42, 99};
  model::SamplingOptions file{.max_new_tokens = 10,
                              .temperature = 0.8,
                              .top_k = 5,
                              .top_p = 0.9,
                              .repetition_penalty = 1.1,
                              .seed = 3};
  const std::vector<int64_t> sampled = model::Generate(*local, prompt, file);
  ASSERT_EQ(sampled.size(), 10u);
  const int64_t end = sampled[4];
  nlohmann::json g = {{"do_sample", true},
                      {"temperature", 0.8},
                      {"top_k", 5},
                      {"top_p", 0.9},
                      {"repetition_penalty", 1.1},
                      {"eos_token_id", {end}},
                      {"bos_token_id", 1},
                      {"transformers_version", "5.17.0"}};
  colony::test::WriteFile((model_dir_ / "generation_config.json").string(), g.dump());
  auto tokens = [&](const std::string& label, std::vector<std::string> args) {
    args.insert(args.begin(), {"generate", "--tokens", "1,17,42,99", "--max-new-tokens", "10",
                               "--seed", "3", "--json"});
    const auto out = nlohmann::json::parse(RunClientCommand(label, args), nullptr, false);
    EXPECT_TRUE(out.is_object() && out.contains("tokens")) << label << ": " << out;
    return out.is_object() ? out.value("tokens", std::vector<int64_t>{}) : std::vector<int64_t>{};
  };
  auto until_end = [&](std::vector<int64_t> t) {
    if (auto it = std::ranges::find(t, end); it != t.end()) t.erase(it + 1, t.end());
    return t;
  };
  EXPECT_EQ(tokens("sampled", {}), until_end(sampled));
  // A flag wins over the file: --temperature 0 is greedy, with the file's repetition penalty.
  model::SamplingOptions greedy = file;
  greedy.temperature = 0;
  EXPECT_EQ(tokens("greedy", {"--temperature", "0"}),
            until_end(model::Generate(*local, prompt, greedy)));
}

TEST_F(ServeProcessTest, FinetuneSavesAdaptersThatGenerateTunedApplies) {
  ASSERT_NE(StartServer("A", 0, 4), nullptr);
  ASSERT_TRUE(StartClient());
  ASSERT_TRUE(WaitForServers()) << "the server's record did not appear in the DHT";
  const fs::path tuned_file = dir_ / "lora.safetensors";
  auto run = [&](const std::string& label, const std::vector<std::string>& args) {
    return RunClientCommand(label, args);
  };
  // Fine-tuning generates nothing: a generation config that colony generate refuses is no
  // concern of it.
  const fs::path generation_config = model_dir_ / "generation_config.json";
  colony::test::WriteFile(generation_config.string(), R"({"typical_p": 0.9})");
  const std::string trained = run("finetune", {"finetune", "--lora", "2", "--steps", "6", "--lr",
                                               "0.2", "--save", tuned_file.string()});
  fs::remove(generation_config);
  const auto report = nlohmann::json::parse(trained, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object()) << trained;
  EXPECT_EQ(report.value("method", ""), "lora");
  EXPECT_EQ(report.value("steps", 0), 6);
  EXPECT_LT(report.value("final_loss", 1e9), report.value("initial_loss", 0.0)) << trained;

  const std::vector<int64_t> prompt = {1, 17, 42, 99};
  const int64_t n = 6;
  const std::string generated =
      run("generate", {"generate", "--tuned", tuned_file.string(), "--tokens", "1,17,42,99",
                       "--max-new-tokens", std::to_string(n), "--json"});
  const auto out = nlohmann::json::parse(generated, nullptr, false);
  ASSERT_TRUE(out.is_object() && out.contains("tokens")) << generated;

  // The reference: the local model with the file's adapters on every block.
  auto weights = LoadTuned(tuned_file, SmallConfig());
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ASSERT_FALSE(weights->adapters.empty());
  auto local = model::LoadLlama(model_dir_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  (*local)->eval();
  at::NoGradGuard no_grad;
  const auto& spec = weights->lora;
  std::vector<model::BlockAdapters> per_block(SmallConfig().num_layers);
  size_t k = 0;
  for (auto& ad : per_block) {
    for (const auto& name : spec.targets) {
      ad.Find(name)->a = weights->adapters[k++];
      ad.Find(name)->b = weights->adapters[k++];
      ad.Find(name)->scale = spec.scale;
    }
  }
  std::vector<int64_t> tokens = prompt, expected;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor h = (*local)->Embed(at::tensor(tokens, at::kLong).unsqueeze(0));
    for (int64_t b = 0; b < SmallConfig().num_layers; ++b) {
      h = (*local)->block(b)->forward(h, 0, nullptr, &per_block[static_cast<size_t>(b)]);
    }
    const int64_t next = (*local)->Head(h)[0][-1].argmax().item<int64_t>();
    expected.push_back(next);
    tokens.push_back(next);
  }
  EXPECT_EQ(out["tokens"].get<std::vector<int64_t>>(), expected) << generated;
  // Generation that ignored --tuned would print the untuned model's tokens.
  EXPECT_NE(expected, model::Generate(*local, prompt, {.max_new_tokens = n}));
}

}  // namespace
}  // namespace colony::serve
