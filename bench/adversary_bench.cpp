// The red-team summary (issue 15): runs every test that plays an attacker against real sockets,
// processes and servers (the `adversary` suite, and the attack tests of the transport, DHT,
// serving, averaging, HTTP, monitor and expert suites), each with its own honest workload and
// its own bounds, and reports how many attacks were tried and survived, the worst slowdown of an
// honest workload beside an attack, and the peak memory of an attacked process, as the tests
// record them (tests/adversary/attack_measurements.h) in gtest's JSON output.
//
// An attack is survived when its test passes: the attack failed the way the test states and the
// honest workload kept working within the test's bounds. The benchmark fails when one was not,
// or when a test binary crashed or is missing. Ends with RESULT adversary_survived=<n>/<n>.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_support.h"

namespace {

using namespace colony;
using Json = nlohmann::json;

// A test binary (next to this one in the build's bin/) and the attack tests to run from it.
struct Suite {
  std::string area;
  std::string binary;
  std::string filter;
};

const std::vector<Suite>& Suites() {
  static const std::vector<Suite> suites = {
      {"transport", "net_hostile_tests", "Hostile.*"},
      {"transport", "net_relay_tests", "Relay.Garbage*:Reachability.Malformed*"},
      {"private swarms", "net_access_tests", "PrivateSwarm.*"},
      {"private swarms", "adversary_private_swarm_tests", "*"},
      {"slots", "adversary_slot_tests", "*"},
      {"reflection", "adversary_reflection_tests", "*"},
      {"slots", "adversary_state_donor_tests", "*"},
      {"dht records", "adversary_dht_tests", "*"},
      {"dht", "adversary_routing_tests", "*"},
      {"dht", "dht_node_tests", "TenNodes.Malformed*"},
      {"memory", "adversary_memory_tests", "*"},
      {"serving", "serve_test",
       "ServeTest.Hostile*:ServeTest.OneAddress*:ServeTest.FakeRecords*:ServeTest.LoraRequests*"},
      {"averaging", "averaging_tests",
       "Averager.CenteredClip*:Averager.NonFinite*:Averager.AHugeDeclared*:Averager.Hostile*:"
       "Averager.LoadStateRefuses*:Averager.Mismatched*:Averager.ADonorsWrongState*:Averager."
       "ASilentDonor*"},
      {"averaging", "averaging_process_tests",
       "AveragingFaults.ARoundThatAveraged*:AveragingFaults.AReducerReturningAWrongResult*"},
      {"byzantine", "averaging_verify_tests", "Verification.A*"},
      {"http", "http_server_test", "HttpServer.Junk*:HttpServer.ConnectionsOverTheLimit*"},
      {"http", "http_tls_test",
       "HttpsServer.PlainHttpAndJunk*:HttpsServer.AHandshakeThatNeverComes*:"
       "HttpsServer/HttpsHandshakeRate.*"},
      {"monitor", "monitor_collector_test", "MonitoredSwarm.ARecordNaming*"},
      {"training", "adversary_training_tests", "*"},
      {"experts", "moe_expert_test", "ExpertServers.Hostile*"},
  };
  return suites;
}

struct Outcome {
  std::string area, name;
  bool survived = false;
  std::string failure;  // the first failure's first line
  double slowdown = -1;
  double peak_mib = -1;
};

double Property(const Json& test, const char* key) {
  if (!test.contains(key) || !test[key].is_string()) return -1;
  try {
    return std::stod(test[key].get<std::string>());
  } catch (const std::exception&) {
    return -1;
  }
}

// Runs one suite; its outcomes, or an error when the binary is missing, crashed or wrote no
// report.
Result<std::vector<Outcome>> Run(const Suite& suite, const std::filesystem::path& bin_dir,
                                 const std::filesystem::path& work) {
  const auto binary = bin_dir / suite.binary;
  if (!std::filesystem::exists(binary)) {
    return NotFound(fmt::format("{} is not built (cmake --build build --target {})",
                                binary.string(), suite.binary));
  }
  const auto report = work / (suite.binary + ".json");
  const auto log = work / (suite.binary + ".log");
  std::filesystem::remove(report);
  auto code = Subprocess::Run(
      {binary.string(), "--gtest_filter=" + suite.filter, "--gtest_output=json:" + report.string()},
      log.string(), std::chrono::minutes(20));
  if (!code.ok()) return code.status().WithContext(suite.binary);
  std::ifstream in(report);
  if (!in) {
    return Internal(fmt::format("{} exited with {} and wrote no report; its output: {}{}",
                                suite.binary, *code, log.string(), bench::Tail(log.string())));
  }
  Json j;
  try {
    j = Json::parse(in);
  } catch (const std::exception& e) {
    return Internal(
        fmt::format("{}'s report {} does not parse: {}", suite.binary, report.string(), e.what()));
  }
  std::vector<Outcome> out;
  for (const auto& group : j.value("testsuites", Json::array())) {
    for (const auto& test : group.value("testsuite", Json::array())) {
      if (test.value("result", "") == "SKIPPED" || test.value("status", "") != "RUN") continue;
      Outcome o;
      o.area = suite.area;
      o.name = group.value("name", "?") + "." + test.value("name", "?");
      const auto failures = test.value("failures", Json::array());
      o.survived = failures.empty();
      if (!failures.empty()) {
        const std::string text = failures[0].value("failure", "");
        o.failure = text.substr(0, text.find('\n', text.find('\n') + 1));
      }
      o.slowdown = Property(test, "honest_slowdown");
      o.peak_mib = Property(test, "victim_peak_mib");
      out.push_back(std::move(o));
    }
  }
  if (out.empty()) {
    return Internal(fmt::format("{} ran no test matching {}", suite.binary, suite.filter));
  }
  if (*code != 0 && std::all_of(out.begin(), out.end(), [](const auto& o) { return o.survived; })) {
    return Internal(fmt::format("{} exited with {} although its tests passed; its output: {}",
                                suite.binary, *code, log.string()));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs every attack test and summarizes what survived (scripts/bench adversary)"};
  std::vector<std::string> areas;
  app.add_option("--area", areas, "run only these areas (repeatable), e.g. slots, serving");
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path bin_dir = std::filesystem::path(SelfExecutable()).parent_path();
  bench::TempDir work("bench-adversary");
  std::vector<Outcome> outcomes;
  std::vector<std::string> errors;
  for (const auto& suite : Suites()) {
    if (!areas.empty() && std::find(areas.begin(), areas.end(), suite.area) == areas.end()) {
      continue;
    }
    std::fprintf(stderr, "running %s (%s)...\n", suite.binary.c_str(), suite.area.c_str());
    auto r = Run(suite, bin_dir, work.path());
    if (!r.ok()) {
      errors.push_back(r.status().ToString());
      continue;
    }
    outcomes.insert(outcomes.end(), r->begin(), r->end());
  }

  auto figure = [](double v, const char* format) {
    return v < 0 ? std::string("-") : fmt::format(fmt::runtime(format), v);
  };
  std::printf("%-15s %-82s %-8s %9s %10s\n", "area", "attack (test)", "result", "slowdown",
              "victim MiB");
  size_t survived = 0;
  const Outcome* slowest = nullptr;
  const Outcome* heaviest = nullptr;
  for (const auto& o : outcomes) {
    survived += o.survived;
    if (o.slowdown >= 0 && (!slowest || o.slowdown > slowest->slowdown)) slowest = &o;
    if (o.peak_mib >= 0 && (!heaviest || o.peak_mib > heaviest->peak_mib)) heaviest = &o;
    std::printf("%-15s %-82s %-8s %9s %10s\n", o.area.c_str(), o.name.c_str(),
                o.survived ? "survived" : "FAILED", figure(o.slowdown, "{:.2f}x").c_str(),
                figure(o.peak_mib, "{:.0f}").c_str());
    if (!o.survived) std::printf("    %s\n", o.failure.c_str());
  }
  for (const auto& e : errors) std::printf("ERROR %s\n", e.c_str());
  std::printf("\n%zu attacks tried, %zu survived", outcomes.size(), survived);
  if (slowest) {
    std::printf("; worst honest slowdown %.2fx (%s)", slowest->slowdown, slowest->name.c_str());
  }
  if (heaviest) {
    std::printf("; peak victim memory %.0f MiB (%s)", heaviest->peak_mib, heaviest->name.c_str());
  }
  std::printf("\n");
  if (slowest) std::printf("RESULT adversary_worst_slowdown=%.3f\n", slowest->slowdown);
  if (heaviest) std::printf("RESULT adversary_peak_victim_mib=%.0f\n", heaviest->peak_mib);
  std::printf("RESULT adversary_survived=%zu/%zu\n", survived, outcomes.size());
  const bool ok = survived == outcomes.size() && errors.empty() && !outcomes.empty();
  std::fflush(stdout);
  if (!ok) {
    work.keep();
    std::fprintf(stderr, "the tests' reports and output are kept in %s\n", work.path().c_str());
  }
  return ok ? 0 : 1;
}
