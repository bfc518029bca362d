// API benchmark: greedy generation through `colony api` (curl, non-streaming and streaming)
// against `colony generate` on the same swarm, measured in the same run.
//
// A seeded random Llama checkpoint (hidden 256, 8 layers, 8 heads, 4 KV heads, intermediate 768;
// the vocabulary of tests/data/hf's byte-level BPE tokenizer.json, copied beside it) is written to
// a temporary directory; two `colony serve` processes split its blocks (0:4 and 4:8) and
// `colony api` joins them as a client. Then, --rounds times, alternately:
//   - `colony generate --json` (its own "seconds": from before the session opens to the last
//     token; process start-up and joining the swarm are not counted),
//   - a curl POST /v1/completions (temperature 0, the same prompt and --tokens): curl's
//     time_total, from connecting to the last byte,
//   - the same with stream: true: time to the first event (read line by line here, so curl's
//     own start-up, a few ms, is included) and to the last one.
// Every round checks that the API's text, whole and streamed, equals colony generate's text, and
// fails otherwise. RESULT api_vs_generate is the ratio of the medians (goal <= 1.05), and
// api_tokens_per_s, generate_tokens_per_s, api_ttft_ms go with it.
#include <ATen/ATen.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/subprocess.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace {

using namespace colony;
using namespace std::chrono_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string ColonyBinary() {
  return (fs::path(SelfExecutable()).parent_path() / "colony").string();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs a program to its end; its stdout lines.
std::vector<std::string> RunLines(const std::vector<std::string>& argv, const std::string& err) {
  std::vector<std::string> lines;
  auto p = Subprocess::Spawn(argv, err);
  if (!p.ok()) return lines;
  for (;;) {
    auto line = p->ReadLine(300s);
    if (!line.ok()) break;
    lines.push_back(*line);
  }
  (void)p->Wait(30s);
  return lines;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "bench_api: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"colony api vs colony generate on the same swarm"};
  int rounds = 5;
  int64_t tokens = 48;
  std::string prompt = "The kernel schedules";
  app.add_option("--rounds", rounds)->capture_default_str();
  app.add_option("--tokens", tokens, "tokens per generation")->capture_default_str();
  app.add_option("--prompt", prompt)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  at::set_num_threads(1);
  const fs::path dir = fs::temp_directory_path() / ("colony-bench-api-" + std::to_string(getpid()));
  const fs::path model_dir = dir / "model";
  fs::create_directories(model_dir);
  fs::copy_file(
      fs::path(COLONY_SOURCE_DIR) / "tests/data/hf/tokenizer-bytelevel-bpe/tokenizer.json",
      model_dir / "tokenizer.json");
  auto tok = model::Tokenizer::Load(model_dir / "tokenizer.json");
  if (!tok.ok()) return Fail(tok.status().ToString());
  model::LlamaConfig c;
  c.vocab_size = tok->vocab_size();
  c.hidden_size = 256;
  c.intermediate_size = 768;
  c.num_layers = 8;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.max_seq_len = 256;
  at::manual_seed(3);
  model::LlamaModel weights(c);
  if (auto st = model::SaveLlama(model_dir, weights); !st.ok()) {
    return Fail(st.ToString());
  }
  const std::string name = "bench-api-" + std::to_string(getpid());
  std::vector<Subprocess> procs;
  auto start = [&](const std::string& label, std::vector<std::string> args) -> std::string {
    args.insert(args.begin(), {ColonyBinary(), "--log-level", "warn"});
    auto p = Subprocess::Spawn(args, (dir / (label + ".err")).string());
    if (!p.ok()) return {};
    auto line = p->ReadLine(120s);
    procs.push_back(std::move(*p));
    return line.ok() ? *line : std::string();
  };
  auto cleanup = [&] {
    for (auto it = procs.rbegin(); it != procs.rend(); ++it) {
      it->Signal(SIGTERM);
      (void)it->Wait(15s);
    }
    RemoveTree(dir);
  };
  const std::vector<std::string> serve = {
      "serve", "--model",  model_dir.string(),     "--model-name",
      name,    "--listen", "/ip4/127.0.0.1/tcp/0", "--threads",
      "1"};
  std::vector<std::string> a_args = serve, b_args = serve;
  a_args.insert(a_args.end(), {"--blocks", "0:4"});
  const std::string boot = start("A", a_args);
  b_args.insert(b_args.end(), {"--blocks", "4:8", "--initial-peers", boot});
  const std::string second = start("B", b_args);
  const std::string url =
      start("api", {"api", "--model", model_dir.string(), "--model-name", name, "--initial-peers",
                    boot, "--http", "127.0.0.1:0", "--threads", "1"});
  if (boot.empty() || second.empty() || url.empty()) {
    cleanup();
    return Fail("the swarm or colony api did not start (logs in " + dir.string() + ")");
  }

  const std::string body =
      json({{"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}}).dump();
  const std::string stream_body =
      json({{"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}, {"stream", true}})
          .dump();
  std::vector<double> gen_s, api_s, stream_s, ttft_s;
  int64_t generated = 0;
  for (int round = -1; round < rounds; ++round) {  // round -1 warms up (and waits for the swarm)
    const auto gen =
        RunLines({ColonyBinary(), "--log-level", "warn", "generate", "--model", model_dir.string(),
                  "--model-name", name, "--initial-peers", boot, "--prompt", prompt,
                  "--max-new-tokens", std::to_string(tokens), "--threads", "1", "--json"},
                 (dir / "generate.err").string());
    const json g = gen.empty() ? json() : json::parse(gen.back(), nullptr, false);
    if (!g.is_object() || !g.contains("text")) {
      cleanup();
      return Fail("colony generate failed");
    }
    const auto api = RunLines(
        {"/usr/bin/curl", "-sS", "--max-time", "300", "-H", "Content-Type: application/json",
         "--data-binary", body, "-w", "\n%{time_total}\n", url + "/completions"},
        (dir / "curl.err").string());
    const json a = api.size() < 2 ? json() : json::parse(api[0], nullptr, false);
    if (!a.is_object() || !a.contains("choices") || a["choices"][0]["text"] != g["text"]) {
      cleanup();
      return Fail("the API's text differs from colony generate's: " +
                  (api.empty() ? std::string("(no answer)") : api[0]) + " vs " + g.dump());
    }
    const auto t0 = Clock::now();
    auto s = Subprocess::Spawn(
        {"/usr/bin/curl", "-sS", "-N", "--max-time", "300", "-H", "Content-Type: application/json",
         "--data-binary", stream_body, url + "/completions"},
        (dir / "curl.err").string());
    std::string streamed;
    double first = -1;
    bool done = false;
    for (; s.ok();) {
      auto line = s->ReadLine(300s);
      if (!line.ok()) break;
      if (line->starts_with("data: {")) {
        if (first < 0) first = std::chrono::duration<double>(Clock::now() - t0).count();
        const json e = json::parse(line->substr(6), nullptr, false);
        if (e.is_object() && e.contains("choices") && !e["choices"].empty()) {
          streamed += e["choices"][0].value("text", "");
        }
      }
      done |= *line == "data: [DONE]";
    }
    const double stream_total = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s.ok()) (void)s->Wait(10s);
    if (!done || streamed != g["text"]) {
      cleanup();
      return Fail("the streamed text differs from colony generate's: '" + streamed + "'");
    }
    if (round < 0) continue;
    generated = static_cast<int64_t>(a["usage"]["completion_tokens"]);
    gen_s.push_back(g["seconds"].get<double>());
    api_s.push_back(std::stod(api[1]));
    stream_s.push_back(stream_total);
    ttft_s.push_back(first);
    std::printf("round %d: generate %.3f s, api %.3f s, api stream %.3f s (first event %.1f ms)\n",
                round, gen_s.back(), api_s.back(), stream_total, first * 1000);
    std::fflush(stdout);
  }
  cleanup();
  const double ratio = Median(api_s) / Median(gen_s);
  std::printf(
      "%lld tokens per generation, %d rounds, medians: generate %.3f s, api %.3f s, "
      "api streamed %.3f s\n",
      static_cast<long long>(generated), rounds, Median(gen_s), Median(api_s), Median(stream_s));
  std::printf("RESULT generate_tokens_per_s=%.1f\n", generated / Median(gen_s));
  std::printf("RESULT api_tokens_per_s=%.1f\n", generated / Median(api_s));
  std::printf("RESULT api_stream_vs_generate=%.3f\n", Median(stream_s) / Median(gen_s));
  std::printf("RESULT api_ttft_ms=%.1f\n", Median(ttft_s) * 1000);
  std::printf("RESULT api_vs_generate=%.3f\n", ratio);
  return 0;
}
