// RunDemo: the demo's stages in order, and the summary (see demo.h).
#include "demo/demo.h"

#include <fmt/format.h>

#include <chrono>

namespace colony::demo {

std::string ColonyExecutable(const DemoOptions& o) {
  return o.colony.empty() ? SelfExecutable() : o.colony;
}

Status RunDemo(const DemoOptions& o, const Output& out) {
  using namespace std::chrono;
  if (o.peers < 2 || o.peers > 32) return InvalidArgument("the demo runs 2 to 32 peers");
  if (o.tensor_mib < 1 || o.tensor_mib > 256) {
    return InvalidArgument("the demo's tensor is 1 to 256 MiB");
  }
  const auto t0 = steady_clock::now();
  COLONY_ASSIGN_OR_RETURN(LocalSwarm swarm, StartLocalSwarm(o, out));
  auto echoes = EchoThroughEveryPeer(o, swarm.addresses, out);
  if (!echoes.ok()) {
    StopLocalSwarm(swarm, out);
    return echoes.status();
  }
  auto averaged = AverageAcrossProcesses(o, swarm.bootstrap, out);
  if (!averaged.ok()) {
    StopLocalSwarm(swarm, out);
    return averaged.status();
  }
  auto trained = TrainTogether(o, swarm.bootstrap, out);
  Result<std::string> served = Unavailable("not run: training failed");
  if (trained.ok()) served = ServeTrained(o, out);
  const int clean = StopLocalSwarm(swarm, out);

  const double total = duration<double>(steady_clock::now() - t0).count();
  const size_t n = swarm.peers.size();
  out(fmt::format(
      "\nSummary: {} peers; {} of {} discovery pings answered; {} of {} tensor echoes verified; "
      "{} of {} averaged tensors exact; {}; {}; {:.1f} MB sent, {:.1f} MB received by the demo; "
      "{} of {} peers shut down cleanly; {:.1f} s\n",
      o.peers, swarm.pings_answered, swarm.pings_expected, echoes->verified, n, *averaged, o.peers,
      trained.ok() ? *trained : trained.status().ToString(),
      served.ok() ? *served : served.status().ToString(),
      static_cast<double>(echoes->bytes_sent) / 1e6,
      static_cast<double>(echoes->bytes_received) / 1e6, clean, n, total));
  const bool success = swarm.pings_answered == swarm.pings_expected &&
                       echoes->verified == static_cast<int>(n) && *averaged == o.peers &&
                       clean == static_cast<int>(n) && trained.ok() && served.ok();
  if (!success) return Internal("demo finished with failures (see above)");
  out("Demo finished successfully.\n");
  return Status::Ok();
}

}  // namespace colony::demo
