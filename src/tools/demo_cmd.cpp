// colony demo: the main job, end to end on one machine.
//
// The demo starts a small swarm of real peer processes on loopback: a bootstrap peer, then peers
// that join the DHT through it, announce their addresses there as owner-signed records, find
// each other's, and ping each other over authenticated, encrypted connections. It exchanges
// tensors with every peer and lets as many new peer processes average a tensor each in one group
// (checking the exact mean). Then the main job: that many `colony train` processes train a
// Llama-style language model together on the Linux kernel's documentation (collaborative
// optimizer, target global batch), with live progress; the demo plots the loss curve to a PNG,
// prints text sampled from the trained model, and shuts the swarm down cleanly.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "averaging/averager.h"
#include "core/multiaddr.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "model/corpus.h"
#include "model/tokenizer.h"
#include "net/host.h"
#include "tools/commands.h"

namespace colony::cli {

namespace {

struct DemoArgs {
  int peers = 4;
  int tensor_mib = 4;
  bool quick = false;
  double train_seconds = 0;  // 0: 300 (30 with --quick)
  std::string out_dir = "colony-demo";
  std::string cache_dir;
  std::string model_size = "tiny";
};

std::string Fixed(double v, int digits = 3) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : std::string("-");
}

// Plots loss and held-out loss against samples seen (gnuplot's PNG terminal).
Status PlotLoss(const std::filesystem::path& metrics, const std::filesystem::path& png,
                double initial_eval) {
  std::ifstream in(metrics);
  const auto data = png.parent_path() / "loss.dat";
  std::ofstream out(data);
  out << "# epoch samples_seen loss eval_loss\n";
  if (std::isfinite(initial_eval)) out << "0 0 NaN " << initial_eval << "\n";
  std::string line;
  int rows = 0;
  int64_t seen = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("event", "") != "step") continue;
    seen += j.value("realized_batch", int64_t{0});
    const auto num = [&](const char* k) {
      return j.contains(k) && j[k].is_number() ? fmt::format("{}", j[k].get<double>())
                                               : std::string("NaN");
    };
    out << j.value("epoch", 0) << " " << seen << " " << num("loss") << " " << num("eval_loss")
        << "\n";
    ++rows;
  }
  out.close();
  if (rows == 0) return NotFound("no training steps were recorded in " + metrics.string());
  const std::string script = fmt::format(
      "set terminal png size 900,540; set output '{}'; set title 'colony demo: collaborative "
      "training of a Llama-style LM on linux-doc'; set xlabel 'samples seen by the swarm'; "
      "set ylabel 'cross-entropy (nats/token)'; set grid; set key top right; set datafile "
      "missing 'NaN'; plot '{}' using 2:3 with lines lw 2 title 'training loss (peer 0)', '' "
      "using 2:4 with linespoints pt 7 title 'held-out loss'",
      png.string(), data.string());
  auto plot = Subprocess::Spawn({"/usr/bin/gnuplot", "-e", script});
  if (!plot.ok()) return plot.status().WithContext("starting gnuplot (install gnuplot-nox)");
  auto code = plot->Wait(std::chrono::seconds(30));
  if (!code.ok() || *code != 0) return Internal("gnuplot failed to draw " + png.string());
  return Status::Ok();
}

// The main job: `peers` processes train one language model together.
Result<std::string> TrainTogether(const DemoArgs& a, const std::string& self,
                                  const std::string& bootstrap) {
  using namespace std::chrono;
  const bool quick = a.quick;
  const double seconds_budget = a.train_seconds > 0 ? a.train_seconds : (quick ? 30 : 300);
  const uint64_t corpus_bytes = quick ? 3'000'000 : 0;
  const int vocab = quick ? 1024 : 4096;
  const std::filesystem::path out = std::filesystem::absolute(a.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return Internal("cannot create " + out.string() + ": " + ec.message());

  std::printf("\nTraining a language model together (%d peer processes, %s):\n", a.peers,
              quick ? "quick" : "full");
  // Prepare the data once here, so the peers find it cached.
  const auto t0 = steady_clock::now();
  model::CorpusOptions co;
  if (!a.cache_dir.empty()) co.cache_dir = a.cache_dir;
  co.max_bytes = corpus_bytes;
  std::printf("  corpus: the Linux kernel's documentation (linux-doc-6.1)%s\n",
              quick ? ", first 3 MB" : "");
  std::fflush(stdout);
  COLONY_ASSIGN_OR_RETURN(auto corpus, model::PrepareCorpus(co));
  const auto cache =
      a.cache_dir.empty() ? model::DefaultCacheDir() : std::filesystem::path(a.cache_dir);
  std::printf("  tokenizer: sentencepiece BPE, %d tokens (trained once, cached in %s)\n", vocab,
              cache.c_str());
  std::fflush(stdout);
  COLONY_ASSIGN_OR_RETURN(auto tok, model::Tokenizer::TrainOrLoad(corpus, cache, vocab));
  COLONY_ASSIGN_OR_RETURN(auto shards,
                          model::PrepareTokenShards(corpus, tok, cache / ("shards-" + tok.hash())));
  COLONY_ASSIGN_OR_RETURN(auto manifest, model::ReadShardManifest(shards));
  std::printf("  data ready in %.1f s: %llu training tokens in %zu shards\n",
              duration<double>(steady_clock::now() - t0).count(),
              static_cast<unsigned long long>(manifest.train_tokens), manifest.shard_files.size());

  const int64_t batch = 8, seq = 64;
  const int64_t target = batch * 8 * a.peers;  // about 8 local batches per peer per step
  const double stop_at = dht::Now() + seconds_budget + 3;
  const std::string run_id = fmt::format("demo-{}", ::getpid());
  std::vector<Subprocess> trainers;
  for (int i = 0; i < a.peers; ++i) {
    std::filesystem::remove(out / fmt::format("peer{}.jsonl", i), ec);
    std::vector<std::string> argv = {self,
                                     "--log-level",
                                     "warn",
                                     "train",
                                     "--task",
                                     "lm",
                                     "--run-id",
                                     run_id,
                                     "--initial-peers",
                                     bootstrap,
                                     "--cache-dir",
                                     cache.string(),
                                     "--corpus-bytes",
                                     std::to_string(corpus_bytes),
                                     "--vocab-size",
                                     std::to_string(vocab),
                                     "--model-size",
                                     a.model_size,
                                     "--seq-len",
                                     std::to_string(seq),
                                     "--batch-size",
                                     std::to_string(batch),
                                     "--target-batch-size",
                                     std::to_string(target),
                                     "--optimizer",
                                     "adam",
                                     "--lr",
                                     "3e-3",
                                     "--seed",
                                     std::to_string(i),
                                     "--stop-at",
                                     fmt::format("{:.3f}", stop_at),
                                     "--matchmaking-time",
                                     "3",
                                     "--min-peers",
                                     std::to_string(a.peers),
                                     "--eval-every",
                                     quick ? "5" : "20",
                                     "--metrics",
                                     (out / fmt::format("peer{}.jsonl", i)).string()};
    if (i == 0) {
      for (const char* arg : {"--json", "--sample", "The kernel", "--save-model"}) {
        argv.push_back(arg);
      }
      argv.push_back((out / "model").string());
    }
    auto p = Subprocess::Spawn(argv, (out / fmt::format("peer{}.log", i)).string());
    if (!p.ok()) return p.status();
    trainers.push_back(std::move(*p));
  }
  std::printf(
      "  %d peers, global batch %lld sequences of %lld tokens, training for %.0f s; "
      "logs in %s\n",
      a.peers, static_cast<long long>(target), static_cast<long long>(seq), seconds_budget,
      out.c_str());
  std::fflush(stdout);

  // Peer 0 reports every global step; print a line every few seconds.
  double initial_eval = std::nan(""), eval = std::nan(""), loss = std::nan("");
  int64_t epoch = 0, peers_seen = 0, seen = 0;
  std::string sample;
  bool done = false;
  auto last_print = steady_clock::now() - seconds(10);
  const double print_every = quick ? 3 : 10;
  while (!done) {
    auto line = trainers[0].ReadLine(seconds(static_cast<int64_t>(seconds_budget) + 120));
    if (!line.ok()) {
      return line.status().WithContext("training peer 0 (see " + (out / "peer0.log").string() +
                                       ")");
    }
    auto j = nlohmann::json::parse(*line, nullptr, false);
    if (!j.is_object()) continue;
    const std::string event = j.value("event", "");
    if (event == "ready") {
      std::printf("  model: %s parameters (Llama-style: RMSNorm, rotary, SwiGLU, GQA)\n",
                  j["model"].value("parameters", nlohmann::json(0)).dump().c_str());
    } else if (event == "eval") {
      initial_eval = j.value("eval_loss", std::nan(""));
      std::printf("  initial held-out loss %.3f (ln %d = %.3f)\n", initial_eval, vocab,
                  std::log(vocab));
    } else if (event == "step") {
      epoch = j.value("epoch", int64_t{0});
      seen += j.value("realized_batch", int64_t{0});
      peers_seen = j.value("peers", int64_t{0});
      if (j.contains("loss") && j["loss"].is_number()) loss = j["loss"].get<double>();
      if (j.contains("eval_loss")) eval = j["eval_loss"].get<double>();
      if (duration<double>(steady_clock::now() - last_print).count() >= print_every) {
        last_print = steady_clock::now();
        std::printf(
            "  epoch %4lld | loss %s | held-out %s | %lld peers | %5.0f samples/s in the swarm "
            "| last step: %lld samples from %lld peers | sent %.1f MB | %.0f s left\n",
            static_cast<long long>(epoch), Fixed(loss).c_str(), Fixed(eval).c_str(),
            static_cast<long long>(peers_seen), j.value("swarm_samples_per_second", 0.0),
            static_cast<long long>(j.value("realized_batch", int64_t{0})),
            static_cast<long long>(j.value("group_size", int64_t{0})),
            static_cast<double>(j.value("bytes_sent", uint64_t{0})) / 1e6,
            std::max(0.0, stop_at - dht::Now()));
        std::fflush(stdout);
      }
    } else if (event == "done") {
      eval = j.value("eval_loss", std::nan(""));
      sample = j.value("sample", std::string());
      done = true;
    }
  }
  int clean = 0;
  for (auto& t : trainers) {
    auto code = t.Wait(seconds(60));
    clean += code.ok() && *code == 0;
  }
  const auto png = out / "loss.png";
  Status plotted = PlotLoss(out / "peer0.jsonl", png, initial_eval);
  std::printf(
      "  final held-out loss %s after %lld global steps (%lld samples); %d of %d "
      "trainers exited cleanly\n",
      Fixed(eval).c_str(), static_cast<long long>(epoch), static_cast<long long>(seen), clean,
      a.peers);
  std::printf("  loss curve: %s\n", plotted.ok() ? png.c_str() : plotted.ToString().c_str());
  std::printf("  trained model: %s (Hugging Face Llama format)\n", (out / "model").c_str());
  std::printf("  sample from the trained model:\n\n    %s\n", sample.c_str());
  std::fflush(stdout);
  if (clean != a.peers)
    return Internal("some training peers failed; see their logs in " + out.string());
  if (!(eval < initial_eval - 0.5)) {
    return Internal(fmt::format("the model did not learn (held-out loss {} -> {})",
                                Fixed(initial_eval), Fixed(eval)));
  }
  if (!plotted.ok()) return plotted;
  return fmt::format("LM trained by {} peers for {} steps, held-out loss {} -> {}", a.peers, epoch,
                     Fixed(initial_eval), Fixed(eval));
}

// Then run the trained model together (Petals-style): block servers host its layers and a client
// generates text through them; then the server it used for the last blocks is killed and the
// client generates again through the replacement, which must give the same (seeded) text.
Result<std::string> ServeTrained(const DemoArgs& a, const std::string& self) {
  using namespace std::chrono;
  const std::filesystem::path out = std::filesystem::absolute(a.out_dir);
  const std::string model = (out / "model").string();
  std::ifstream cfg(out / "model" / "config.json");
  auto config = nlohmann::json::parse(cfg, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.value("num_hidden_layers", 0)) {
    return DataLoss("the trained model's config.json is unreadable");
  }
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  const int64_t split = std::max<int64_t>(1, layers / 2);
  std::printf("\nRunning the trained model together (Petals-style block servers):\n");
  std::vector<Subprocess> servers;
  std::vector<std::string> addrs;
  struct Span {
    int64_t first, last;
  };
  // Blocks [0, split) on one server; [split, layers) on two (a replacement for failover).
  for (const Span span : {Span{0, split}, Span{split, layers}, Span{split, layers}}) {
    std::vector<std::string> argv = {self,           "serve",
                                     "--model",      model,
                                     "--model-name", "demo-lm",
                                     "--blocks",     fmt::format("{}:{}", span.first, span.last),
                                     "--listen",     "/ip4/127.0.0.1/tcp/0",
                                     "--threads",    "1",
                                     "--cache-mib",  "64"};
    if (!addrs.empty()) {
      argv.push_back("--initial-peers");
      argv.push_back(addrs.front());
    }
    auto p = Subprocess::Spawn(argv, (out / fmt::format("server{}.log", servers.size())).string());
    if (!p.ok()) return p.status();
    auto line = p->ReadLine(seconds(60));
    if (!line.ok()) {
      return line.status().WithContext(
          fmt::format("block server {} did not start; see {}", servers.size(),
                      (out / fmt::format("server{}.log", servers.size())).string()));
    }
    std::printf("  server %zu  blocks %lld:%lld  %s\n", servers.size(),
                static_cast<long long>(span.first), static_cast<long long>(span.last),
                line->c_str());
    addrs.push_back(*line);
    servers.push_back(std::move(*p));
  }
  std::fflush(stdout);
  auto run = [&](std::vector<std::string> argv) -> Result<std::string> {
    argv.insert(argv.begin(), self);
    COLONY_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Spawn(argv, (out / "client.log").string()));
    std::string text;
    while (true) {
      auto line = p.ReadLine(seconds(120));
      if (!line.ok()) break;
      text += *line + "\n";
    }
    COLONY_ASSIGN_OR_RETURN(int code, p.Wait(seconds(30)));
    if (code != 0) {
      return Internal(fmt::format("'colony {}' failed (exit code {}); see {}", argv[1], code,
                                  (out / "client.log").string()));
    }
    return text;
  };
  // Wait until the client sees every server in the DHT.
  std::string table;
  for (int attempt = 0; attempt < 50; ++attempt) {
    COLONY_ASSIGN_OR_RETURN(table, run({"servers", "--model", model, "--model-name", "demo-lm",
                                        "--initial-peers", addrs.front()}));
    if (table.find("3 servers") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  std::printf("%s", table.c_str());
  // Seeded sampling: the same text on every run through any servers.
  auto generate = [&]() -> Result<nlohmann::json> {
    COLONY_ASSIGN_OR_RETURN(std::string printed,
                            run({"generate",   "--model",          model,         "--model-name",
                                 "demo-lm",    "--initial-peers",  addrs.front(), "--prompt",
                                 "The kernel", "--max-new-tokens", "32",          "--threads",
                                 "1",          "--temperature",    "0.8",         "--top-k",
                                 "40",         "--seed",           "1",           "--json"}));
    auto j = nlohmann::json::parse(printed, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return Internal("colony generate printed no result");
    return j;
  };
  COLONY_ASSIGN_OR_RETURN(nlohmann::json j, generate());
  auto one_line = [](std::string t) {
    for (char& c : t) {
      if (c == '\n' || c == '\t' || c == '\r') c = ' ';
    }
    return t;
  };
  const std::string text = one_line(j.value("text", std::string()));
  std::printf("  generated through %zu servers: The kernel%s\n", j["route"].size(), text.c_str());
  // Kill (SIGKILL) the server that held the last blocks; the replacement takes over.
  size_t victim = 0;
  for (size_t i = 1; i < addrs.size(); ++i) {
    for (const auto& hop : j["route"]) {
      if (addrs[i].ends_with(hop.value("peer", std::string("?")))) victim = i;
    }
  }
  if (victim == 0) return Internal("the route used none of the servers of the last blocks");
  servers[victim].Signal(SIGKILL);
  (void)servers[victim].Wait(seconds(10));
  std::printf("  killed server %zu (SIGKILL); generating again:\n", victim);
  std::fflush(stdout);
  COLONY_ASSIGN_OR_RETURN(nlohmann::json j2, generate());
  std::printf("  generated through the replacement: The kernel%s\n",
              one_line(j2.value("text", std::string())).c_str());
  std::fflush(stdout);
  int clean = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    if (i == victim) continue;
    servers[i].Signal(SIGTERM);
    auto code = servers[i].Wait(seconds(20));
    clean += code.ok() && *code == 0;
  }
  if (clean != static_cast<int>(servers.size()) - 1) {
    return Internal("some block servers did not shut down cleanly; see server*.log in " +
                    out.string());
  }
  if (j2["tokens"] != j["tokens"]) {
    return Internal("generation through the replacement server differs from the first run");
  }
  return fmt::format("{} tokens generated through {} block servers, the same after one was killed",
                     j["tokens"].size(), j["route"].size());
}

}  // namespace

void AddDemoCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto args = std::make_shared<DemoArgs>();
  auto* demo = app.add_subcommand(
      "demo",
      "run a local swarm of peer processes that find each other, exchange and average tensors, "
      "then train a language model together (loss curve PNG and sampled text in --out-dir) and "
      "serve it from block servers, surviving a killed server");
  demo->add_option("--peers", args->peers, "number of peer processes")
      ->check(CLI::Range(2, 32))
      ->capture_default_str();
  demo->add_option("--tensor-mib", args->tensor_mib, "size of the tensor echoed by each peer (MiB)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  demo->add_flag("--quick", args->quick,
                 "a one-minute version: less text, a smaller vocabulary, 30 s of training");
  demo->add_option("--train-seconds", args->train_seconds,
                   "seconds of collaborative training (default 300, 30 with --quick)");
  demo->add_option("--out-dir", args->out_dir,
                   "where the loss curve, metrics, logs and the trained model are written")
      ->capture_default_str();
  demo->add_option("--cache-dir", args->cache_dir,
                   "corpus/tokenizer cache (default: $COLONY_CACHE_DIR or ~/.cache/colony)");
  demo->add_option("--model-size", args->model_size, "tiny, small or base")
      ->check(CLI::IsMember({"tiny", "small", "base"}))
      ->capture_default_str();
  commands.emplace_back(demo, [args]() -> int {
    using namespace std::chrono;
    const auto t0 = steady_clock::now();
    const std::string self = SelfExecutable();
    std::printf("Colony demo: starting %d peers on loopback as separate processes\n", args->peers);

    std::vector<Subprocess> peers;
    std::vector<Multiaddr> addrs;
    std::string bootstrap;
    int found = 0, expected_found = 0;
    for (int i = 0; i < args->peers; ++i) {
      std::vector<std::string> argv = {self,     "--log-level", "warn",
                                       "listen", "--listen",    "/ip4/127.0.0.1/tcp/0"};
      if (i > 0) {
        argv.push_back("--initial-peers");
        argv.push_back(bootstrap);
      }
      auto p = Subprocess::Spawn(argv);
      if (!p.ok()) return Fail(p.status());
      auto line = p->ReadLine(seconds(10));
      if (!line.ok())
        return Fail(line.status().WithContext("peer " + std::to_string(i) + " did not start"));
      auto addr = Multiaddr::Parse(*line);
      if (!addr.ok()) return Fail(addr.status());
      std::printf("  peer %d  %s\n", i, line->c_str());
      if (i == 0) bootstrap = *line;
      // Peer i learns about the i peers before it from the bootstrap peer and pings each.
      for (int k = 0; k < i; ++k) {
        auto f = p->ReadLine(seconds(15));
        if (!f.ok()) return Fail(f.status().WithContext("peer " + std::to_string(i)));
        std::printf("          %s\n", f->c_str());
        found += f->find(": rtt ") != std::string::npos;
      }
      expected_found += i;
      addrs.push_back(*addr);
      peers.push_back(std::move(*p));
    }
    std::fflush(stdout);

    // Exchange a tensor with every peer: it is encrypted, echoed and checked byte for byte.
    std::printf(
        "\nEchoing a %d MiB float32 tensor through every peer (authenticated, AES-256-GCM):\n",
        args->tensor_mib);
    net::Host host(KeyPair::Generate(), net::HostOptions{});
    if (Status st = host.Start(); !st.ok()) return Fail(st);
    std::vector<float> data(static_cast<size_t>(args->tensor_mib) << 18);
    std::iota(data.begin(), data.end(), 0.0f);
    int ok_echoes = 0;
    for (size_t i = 0; i < addrs.size(); ++i) {
      auto ping = host.PingSync(addrs[i]);
      if (!ping.ok()) return Fail(ping.status());
      net::Message msg("demo");
      net::TensorFrame t;
      t.dtype = DType::kFloat32;
      t.shape = {static_cast<int64_t>(data.size())};
      t.data = ByteSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
      msg.tensors.push_back(t);
      auto start = steady_clock::now();
      auto reply = host.CallSync(addrs[i], "colony.echo", msg);
      double secs = duration<double>(steady_clock::now() - start).count();
      bool same = reply.ok() && reply->tensors.size() == 1 &&
                  reply->tensors[0].data.size() == t.data.size() &&
                  std::equal(t.data.begin(), t.data.end(), reply->tensors[0].data.begin());
      ok_echoes += same;
      std::printf("  peer %zu  %s  rtt %.3f ms  echo %s, %.0f MB/s round trip\n", i,
                  ping->peer.ToString().c_str(), static_cast<double>(ping->rtt.count()) / 1e6,
                  same ? "verified" : (reply.ok() ? "MISMATCH" : reply.status().ToString().c_str()),
                  2.0 * static_cast<double>(t.data.size()) / 1e6 / secs);
    }
    auto stats = host.TotalStats();
    host.Shutdown();

    // Average one tensor per peer across the swarm: every peer process joins the DHT through
    // the bootstrap peer, they form a group there and run the fault-tolerant butterfly
    // all-reduce; the demo checks every result against the exact mean.
    const uint64_t values = static_cast<uint64_t>(args->tensor_mib) << 18;
    std::printf(
        "\nAveraging a %d MiB float32 tensor across %d new peer processes (DHT matchmaking, "
        "butterfly all-reduce):\n",
        args->tensor_mib, args->peers);
    char start_at[32];
    std::snprintf(start_at, sizeof(start_at), "%.3f",
                  dht::Now() + 2.0 + 0.2 * static_cast<double>(args->peers));
    const std::string tmp = std::filesystem::temp_directory_path().string() + "/colony_demo_" +
                            std::to_string(::getpid()) + "_";
    std::vector<Subprocess> averagers;
    for (int i = 0; i < args->peers; ++i) {
      auto p = Subprocess::Spawn(
          {self, "--log-level", "warn", "average", "--initial-peers", bootstrap, "--values",
           std::to_string(values), "--seed", std::to_string(i), "--target-group-size",
           std::to_string(args->peers), "--min-group-size", std::to_string(args->peers),
           "--start-at", start_at, "--output", tmp + std::to_string(i) + ".bin"});
      if (!p.ok()) return Fail(p.status());
      averagers.push_back(std::move(*p));
    }
    std::vector<double> mean(values, 0.0);
    {
      std::vector<float> v(values);
      for (int i = 0; i < args->peers; ++i) {
        averaging::SyntheticValues(static_cast<uint64_t>(i), 0, v);
        for (uint64_t k = 0; k < values; ++k) mean[k] += v[k] / args->peers;
      }
    }
    int averaged = 0;
    for (int i = 0; i < args->peers; ++i) {
      std::string report = "no result";
      for (;;) {
        auto line = averagers[static_cast<size_t>(i)].ReadLine(seconds(60));
        if (!line.ok()) {
          report = line.status().ToString();
          break;
        }
        auto j = nlohmann::json::parse(*line, nullptr, false);
        if (j.is_discarded() || j.value("event", "") != "round") continue;
        if (!j.value("ok", false)) {
          report = "failed: " + j.value("error", std::string("?"));
          break;
        }
        std::ifstream in(tmp + std::to_string(i) + ".bin", std::ios::binary);
        std::vector<float> out(values);
        in.read(reinterpret_cast<char*>(out.data()),
                static_cast<std::streamsize>(values * sizeof(float)));
        double worst = in ? 0.0 : 1e9;
        for (uint64_t k = 0; k < values && in; ++k) {
          worst = std::max(worst, std::abs(out[k] - mean[k]));
        }
        const bool exact = worst < 1e-5;
        averaged += exact;
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "group of %d, all-reduce %.3f s, %.1f MB sent; %s (max error %.1e)",
                      j.value("group_size", 0), j.value("allreduce_s", 0.0),
                      static_cast<double>(j.value("bytes_sent", uint64_t{0})) / 1e6,
                      exact ? "exact mean verified" : "WRONG MEAN", worst);
        report = buf;
        break;
      }
      std::remove((tmp + std::to_string(i) + ".bin").c_str());
      std::printf("  averager %d  %s\n", i, report.c_str());
    }
    for (auto& a : averagers) (void)a.Wait(seconds(10));

    auto trained = TrainTogether(*args, self, bootstrap);
    Result<std::string> served = Unavailable("not run: training failed");
    if (trained.ok()) served = ServeTrained(*args, self);

    std::printf("\nStopping the swarm (SIGTERM):\n");
    int clean = 0;
    for (size_t i = 0; i < peers.size(); ++i) peers[i].Signal(SIGTERM);
    for (size_t i = 0; i < peers.size(); ++i) {
      auto code = peers[i].Wait(seconds(10));
      bool ok = code.ok() && *code == 0;
      clean += ok;
      std::printf("  peer %zu  %s\n", i,
                  ok ? "exited cleanly"
                     : (code.ok() ? ("exit code " + std::to_string(*code)).c_str()
                                  : code.status().ToString().c_str()));
    }
    double total = duration<double>(steady_clock::now() - t0).count();
    std::printf(
        "\nSummary: %d peers; %d of %d discovery pings answered; %d of %zu tensor echoes verified; "
        "%d of %d averaged tensors exact; %s; %s; "
        "%.1f MB sent, %.1f MB received by the demo; %d of %zu peers shut down cleanly; %.1f s\n",
        args->peers, found, expected_found, ok_echoes, addrs.size(), averaged, args->peers,
        trained.ok() ? trained->c_str() : trained.status().ToString().c_str(),
        served.ok() ? served->c_str() : served.status().ToString().c_str(),
        static_cast<double>(stats.bytes_sent) / 1e6,
        static_cast<double>(stats.bytes_received) / 1e6, clean, peers.size(), total);
    bool success = found == expected_found && ok_echoes == static_cast<int>(addrs.size()) &&
                   averaged == args->peers && clean == static_cast<int>(peers.size()) &&
                   trained.ok() && served.ok();
    if (!success) return Fail("demo finished with failures (see above)");
    std::printf("Demo finished successfully.\n");
    return 0;
  });
}

}  // namespace colony::cli
