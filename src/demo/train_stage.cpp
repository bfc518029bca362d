// The demo's main job: `colony train` processes train one Llama-style language model together
// on the Linux kernel's documentation, with live progress from peer 0; the loss curve is plotted
// with gnuplot, and the held-out loss must fall.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "demo/demo.h"
#include "model/corpus.h"
#include "model/tokenizer.h"

namespace colony::demo {
namespace {

std::string Fixed(double v, int digits = 3) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : std::string("-");
}

// Plots loss and held-out loss against samples seen (gnuplot's PNG terminal).
Status PlotLoss(const std::filesystem::path& metrics, const std::filesystem::path& png,
                double initial_eval) {
  std::ifstream in(metrics);
  const auto data = png.parent_path() / "loss.dat";
  std::ofstream dat(data);
  dat << "# epoch samples_seen loss eval_loss\n";
  if (std::isfinite(initial_eval)) dat << "0 0 NaN " << initial_eval << "\n";
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
    dat << j.value("epoch", 0) << " " << seen << " " << num("loss") << " " << num("eval_loss")
        << "\n";
    ++rows;
  }
  dat.close();
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

// The longest peer 0 may go without a line (startup, a step, the final evaluation) before the
// demo gives up on it.
constexpr std::chrono::seconds kQuietLimit{600};

}  // namespace

Result<std::string> TrainTogether(const DemoOptions& a, const std::string& bootstrap,
                                  const Output& out) {
  using namespace std::chrono;
  const std::string self = ColonyExecutable(a);
  const bool quick = a.quick;
  const int64_t steps = a.train_steps > 0 ? a.train_steps : (quick ? 30 : 200);
  const uint64_t corpus_bytes = quick ? 3'000'000 : 0;
  const int vocab = quick ? 1024 : 4096;
  const std::filesystem::path dir = std::filesystem::absolute(a.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("cannot create " + dir.string() + ": " + ec.message());

  out(fmt::format("\nTraining a language model together ({} peer processes, {}):\n", a.peers,
                  quick ? "quick" : "full"));
  // Prepare the data once here, so the peers find it cached.
  const auto t0 = steady_clock::now();
  model::CorpusOptions co;
  if (!a.cache_dir.empty()) co.cache_dir = a.cache_dir;
  co.max_bytes = corpus_bytes;
  out(fmt::format("  corpus: the Linux kernel's documentation (linux-doc-6.1){}\n",
                  quick ? ", first 3 MB" : ""));
  COLONY_ASSIGN_OR_RETURN(auto corpus, model::PrepareCorpus(co));
  const auto cache =
      a.cache_dir.empty() ? model::DefaultCacheDir() : std::filesystem::path(a.cache_dir);
  out(fmt::format("  tokenizer: sentencepiece BPE, {} tokens (trained once, cached in {})\n", vocab,
                  cache.string()));
  COLONY_ASSIGN_OR_RETURN(auto tok, model::Tokenizer::TrainOrLoad(corpus, cache, vocab));
  COLONY_ASSIGN_OR_RETURN(auto shards,
                          model::PrepareTokenShards(corpus, tok, cache / ("shards-" + tok.hash())));
  COLONY_ASSIGN_OR_RETURN(auto manifest, model::ReadShardManifest(shards));
  out(fmt::format("  data ready in {:.1f} s: {} training tokens in {} shards\n",
                  duration<double>(steady_clock::now() - t0).count(), manifest.train_tokens,
                  manifest.shard_files.size()));

  const int64_t batch = 8, seq = 64;
  const int64_t target = batch * 8 * a.peers;  // about 8 local batches per peer per step
  const std::string run_id = fmt::format("demo-{}", ::getpid());
  std::vector<Subprocess> trainers;
  for (int i = 0; i < a.peers; ++i) {
    std::filesystem::remove(dir / fmt::format("peer{}.jsonl", i), ec);
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
                                     "--max-epochs",
                                     std::to_string(steps),
                                     "--matchmaking-time",
                                     "3",
                                     "--min-peers",
                                     std::to_string(a.peers),
                                     "--eval-every",
                                     quick ? "5" : "20",
                                     "--metrics",
                                     (dir / fmt::format("peer{}.jsonl", i)).string()};
    if (i == 0) {
      argv.insert(argv.end(),
                  {"--json", "--sample", "The kernel", "--save-model", (dir / "model").string()});
    }
    COLONY_ASSIGN_OR_RETURN(Subprocess p,
                            Subprocess::Spawn(argv, (dir / fmt::format("peer{}.log", i)).string()));
    trainers.push_back(std::move(p));
  }
  out(fmt::format(
      "  {} peers, global batch {} sequences of {} tokens, training for {} global steps; logs in "
      "{}\n",
      a.peers, target, seq, steps, dir.string()));

  // Peer 0 reports every global step; print a line every few seconds.
  double initial_eval = std::nan(""), eval = std::nan(""), loss = std::nan("");
  int64_t epoch = 0, peers_seen = 0, seen = 0;
  std::string sample;
  bool done = false;
  auto last_print = steady_clock::now() - seconds(10);
  const double print_every = quick ? 3 : 10;
  while (!done) {
    // A hang guard, not a schedule: the run ends after `steps` global steps however long they
    // take, but peer 0 reports at least once per step.
    auto line = trainers[0].ReadLine(kQuietLimit);
    if (!line.ok()) {
      return line.status().WithContext(fmt::format("training peer 0, silent for {} s (see {})",
                                                   kQuietLimit.count(),
                                                   (dir / "peer0.log").string()));
    }
    auto j = nlohmann::json::parse(*line, nullptr, false);
    if (!j.is_object()) continue;
    const std::string event = j.value("event", "");
    if (event == "ready") {
      out(fmt::format("  model: {} parameters (Llama-style: RMSNorm, rotary, SwiGLU, GQA)\n",
                      j["model"].value("parameters", nlohmann::json(0)).dump()));
    } else if (event == "eval") {
      initial_eval = j.value("eval_loss", std::nan(""));
      out(fmt::format("  initial held-out loss {:.3f} (ln {} = {:.3f})\n", initial_eval, vocab,
                      std::log(vocab)));
    } else if (event == "step") {
      epoch = j.value("epoch", int64_t{0});
      seen += j.value("realized_batch", int64_t{0});
      peers_seen = j.value("peers", int64_t{0});
      if (j.contains("loss") && j["loss"].is_number()) loss = j["loss"].get<double>();
      if (j.contains("eval_loss")) eval = j["eval_loss"].get<double>();
      if (duration<double>(steady_clock::now() - last_print).count() >= print_every) {
        last_print = steady_clock::now();
        out(fmt::format(
            "  epoch {:4} | loss {} | held-out {} | {} peers | {:5.0f} samples/s in the swarm "
            "| last step: {} samples from {} peers | sent {:.1f} MB | step {} of {}\n",
            epoch, Fixed(loss), Fixed(eval), peers_seen, j.value("swarm_samples_per_second", 0.0),
            j.value("realized_batch", int64_t{0}), j.value("group_size", int64_t{0}),
            static_cast<double>(j.value("bytes_sent", uint64_t{0})) / 1e6, epoch, steps));
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
  const auto png = dir / "loss.png";
  Status plotted = PlotLoss(dir / "peer0.jsonl", png, initial_eval);
  out(fmt::format(
      "  final held-out loss {} after {} global steps ({} samples); {} of {} trainers exited "
      "cleanly\n",
      Fixed(eval), epoch, seen, clean, a.peers));
  out(fmt::format("  loss curve: {}\n", plotted.ok() ? png.string() : plotted.ToString()));
  out(fmt::format("  trained model: {} (Hugging Face Llama format)\n", (dir / "model").string()));
  out(fmt::format("  sample from the trained model:\n\n    {}\n", sample));
  if (clean != a.peers) {
    return Internal("some training peers failed; see their logs in " + dir.string());
  }
  if (!(eval < initial_eval - 0.5)) {
    return Internal(fmt::format("the model did not learn (held-out loss {} -> {})",
                                Fixed(initial_eval), Fixed(eval)));
  }
  if (!plotted.ok()) return plotted;
  return fmt::format("LM trained by {} peers for {} steps, held-out loss {} -> {}", a.peers, epoch,
                     Fixed(initial_eval), Fixed(eval));
}

}  // namespace colony::demo
