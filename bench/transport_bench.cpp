// Transport benchmark: Colony's encrypted streams vs a plain TCP socket, and unary RPC rate.
//
//   1. Throughput: 1 GiB one way in 4 MiB messages over loopback, through
//        (a) a plain TCP socket (blocking send/recv, one sender and one receiver thread), and
//        (b) a Colony client-streaming call (authenticated, AES-256-GCM, flow-controlled),
//      each repeated and reported as the median.
//   2. Unary calls/s with 64 concurrent callers and small messages, with p50/p99 latency.
// The last lines are RESULT key=value pairs (see scripts/bench).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/log.h"
#include "net/crypto.h"
#include "net/host.h"
#include "net/wire.h"
#include "test_support.h"

namespace {

using namespace colony;
using SteadyClock = std::chrono::steady_clock;

using colony::test::Median;

// What every 4 MiB message carries: floats that repeat every 4099 values (a prime, so a chunk
// delivered at a wrong offset or out of order differs). Both receivers compare every byte they
// get against it, at the same cost, and a difference fails the benchmark.
std::vector<float> Pattern(size_t bytes) {
  std::vector<float> v(bytes / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 4099);
  return v;
}

// Plain TCP: seconds to move `total` bytes in `chunk`-byte writes.
double PlainTcpSeconds(size_t total, size_t chunk, const std::vector<float>& pattern) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(lfd, 1);
  const auto* out = reinterpret_cast<const uint8_t*>(pattern.data());
  bool intact = true;
  std::thread receiver([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    std::vector<uint8_t> in(chunk);
    size_t got = 0;
    while (got < total) {
      const size_t at = got % chunk;  // never past the end of one message
      ssize_t n = ::recv(fd, in.data(), chunk - at, 0);
      if (n <= 0) break;
      intact = intact && std::memcmp(in.data(), out + at, static_cast<size_t>(n)) == 0;
      got += static_cast<size_t>(n);
    }
    intact = intact && got == total;
    ::send(fd, "k", 1, 0);  // acknowledge the end, like Colony's final response
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  auto start = SteadyClock::now();
  for (size_t sent = 0; sent < total;) {
    size_t off = 0;
    while (off < chunk) {
      ssize_t n = ::send(fd, out + off, chunk - off, 0);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    sent += chunk;
  }
  char ack;
  ::recv(fd, &ack, 1, 0);
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  receiver.join();
  ::close(fd);
  ::close(lfd);
  if (!intact) {
    std::fprintf(stderr, "plain TCP reference delivered wrong bytes\n");
    std::exit(1);
  }
  return secs;
}

double ColonySeconds(net::Host& client, const Multiaddr& server, size_t total, size_t chunk,
                     const std::vector<float>& pattern) {
  net::TensorFrame t;
  t.dtype = DType::kFloat32;
  t.shape = {static_cast<int64_t>(pattern.size())};
  t.data = ByteSpan(reinterpret_cast<const uint8_t*>(pattern.data()), chunk);
  net::Message msg("chunk");
  msg.tensors.push_back(t);
  auto run = [&]() -> asio::awaitable<Result<net::Message>> {
    auto s = co_await client.OpenStream(server, "sink",
                                        net::CallOptions{.timeout = std::chrono::minutes(5)});
    if (!s.ok()) co_return s.status();
    for (size_t sent = 0; sent < total; sent += chunk) {
      COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(msg));
    }
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->CloseWrite());
    co_return co_await (*s)->ReadFinal();
  };
  auto start = SteadyClock::now();
  auto fut = asio::co_spawn(client.io_context(), run(), asio::use_future);
  auto reply = fut.get();
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  if (!reply.ok() || reply->meta != std::to_string(total)) {
    std::fprintf(stderr, "colony transfer failed: %s\n",
                 reply.ok() ? reply->meta.c_str() : reply.status().ToString().c_str());
    std::exit(1);
  }
  return secs;
}

// Single-thread AES-256-GCM speed of the record layer (seal, then open), in GB/s.
std::pair<double, double> RecordCipherGbps(size_t total) {
  net::Key32 key{};
  net::RecordSealer sealer(key);
  net::RecordOpener opener(key);
  const size_t n = net::kMaxRecordPlaintext;
  std::vector<uint8_t> plain(n, 0x42);
  std::vector<RawBuffer> sealed(16);
  auto t0 = SteadyClock::now();
  for (size_t done = 0, i = 0; done < total; done += n, ++i) {
    auto& out = sealed[i % sealed.size()];
    out.clear();
    sealer.Begin(n, out);
    sealer.Update(plain, out);
    sealer.Finish(out);
  }
  double seal = static_cast<double>(total) /
                std::chrono::duration<double>(SteadyClock::now() - t0).count() / 1e9;
  // Open as many bytes as were sealed, in batches of 16 fresh records (the opener checks record
  // order, and opening decrypts in place): only the opening is timed, over the same volume as
  // the sealing, so neither side's figure rests on a few milliseconds.
  net::RecordSealer sealer2(key);
  std::vector<RawBuffer> records(sealed.size());
  double open_seconds = 0;
  size_t opened = 0;
  while (opened < total) {
    for (auto& r : records) {
      r.clear();
      sealer2.Begin(n, r);
      sealer2.Update(plain, r);
      sealer2.Finish(r);
    }
    auto t1 = SteadyClock::now();
    for (auto& r : records) {
      if (!opener.Open(ByteSpan(r.data(), 4), MutableByteSpan(r.data() + 4, r.size() - 4)).ok())
        std::exit(1);
    }
    open_seconds += std::chrono::duration<double>(SteadyClock::now() - t1).count();
    for (auto& r : records) {  // untimed: the opened bytes are the sealed ones
      if (std::memcmp(r.data() + 4, plain.data(), n) != 0) {
        std::fprintf(stderr, "an opened record differs from what was sealed\n");
        std::exit(1);
      }
    }
    opened += n * records.size();
  }
  double open = static_cast<double>(opened) / open_seconds / 1e9;
  return {seal, open};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Colony transport benchmark: encrypted streams vs plain TCP, unary RPC rate"};
  double gib = 1.0;
  int repeats = 3;
  double seconds = 3.0;
  int callers = 64;
  bool skip_tcp = false;
  app.add_option("--gib", gib, "GiB moved one way per throughput run")->capture_default_str();
  app.add_option("--repeats", repeats, "throughput runs per transport (median reported)")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "duration of the unary-call run")->capture_default_str();
  app.add_option("--callers", callers, "concurrent unary callers")->capture_default_str();
  app.add_flag(
      "--skip-tcp", skip_tcp,
      "do not measure the plain-TCP reference (for profiling; omits the figures relative to it)");
  CLI11_PARSE(app, argc, argv);
  (void)InitLogging("warn");

  const size_t chunk = 4u << 20;
  const size_t total = static_cast<size_t>(gib * (1u << 30)) / chunk * chunk;

  net::HostOptions server_options;
  server_options.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  if (const char* w = std::getenv("BENCH_WINDOW_MIB")) {
    server_options.connection.limits.stream_window = static_cast<uint32_t>(std::atoi(w)) << 20;
    server_options.connection.limits.connection_window =
        4ull * (static_cast<uint64_t>(std::atoi(w)) << 20);
  }
  const std::vector<float> pattern = Pattern(chunk);
  net::Host server(KeyPair::Generate(), server_options);
  server.RegisterClientStreaming(
      "sink", [&pattern](net::CallContext& ctx) -> asio::awaitable<Result<net::Message>> {
        size_t bytes = 0;
        for (;;) {
          auto m = co_await ctx.stream().Read();
          if (!m.ok()) co_return m.status();
          if (!m->has_value()) break;
          for (const auto& t : (*m)->tensors) {
            if (t.data.size() != pattern.size() * sizeof(float) ||
                std::memcmp(t.data.data(), pattern.data(), t.data.size()) != 0) {
              co_return DataLoss("the sink received a message whose bytes differ from those sent");
            }
            bytes += t.data.size();
          }
        }
        co_return net::Message(std::to_string(bytes));
      });
  server.RegisterUnary(
      "echo", [](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
        co_return m;
      });
  if (auto st = server.Start(); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  net::Host client(KeyPair::Generate(), net::HostOptions{});
  (void)client.Start();
  const Multiaddr addr = server.ListenAddresses().at(0);
  if (auto p = client.PingSync(addr); !p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
    return 1;
  }

  std::printf("transport benchmark on loopback: %.2f GiB one way in 4 MiB messages, %d runs each\n",
              gib, repeats);
  std::vector<double> tcp, colony_runs;
  for (int i = 0; i < repeats; ++i) {
    if (!skip_tcp) {
      tcp.push_back(static_cast<double>(total) / PlainTcpSeconds(total, chunk, pattern) / 1e9);
    }
    colony_runs.push_back(static_cast<double>(total) /
                          ColonySeconds(client, addr, total, chunk, pattern) / 1e9);
    if (skip_tcp) {
      std::printf("  run %d: Colony encrypted %.2f GB/s\n", i + 1, colony_runs.back());
    } else {
      std::printf("  run %d: plain TCP %.2f GB/s, Colony encrypted %.2f GB/s\n", i + 1, tcp.back(),
                  colony_runs.back());
    }
    std::fflush(stdout);
  }
  const double colony_gbs = Median(colony_runs);
  auto [seal_gbs, open_gbs] = RecordCipherGbps(std::min<size_t>(total, 512u << 20));
  std::printf(
      "  median: Colony encrypted %.2f GB/s; AES-256-GCM on one core: seal %.2f GB/s, "
      "open %.2f GB/s\n",
      colony_gbs, seal_gbs, open_gbs);
  // What encryption costs on this machine: both cores already carry the TCP copies, so each byte
  // also needs one seal and one open. With T = TCP throughput (two busy cores) and S, O the
  // single-core seal/open speeds, an encrypted stream can reach at most 2 / (2/T + 1/S + 1/O).
  const double tcp_gbs = skip_tcp ? 0.0 : Median(tcp);
  const double ceiling = skip_tcp ? 0.0 : 2.0 / (2.0 / tcp_gbs + 1.0 / seal_gbs + 1.0 / open_gbs);
  if (!skip_tcp) {
    std::printf(
        "  median plain TCP %.2f GB/s -> encrypted ceiling on 2 cores %.2f GB/s (%.2f of TCP); "
        "Colony reaches %.0f%% of that ceiling\n",
        tcp_gbs, ceiling, ceiling / tcp_gbs, 100.0 * colony_gbs / ceiling);
  }

  // Unary calls: `callers` coroutines call "echo" back to back for `seconds`.
  std::printf("unary calls: %d concurrent callers, 64-byte requests, %.1f s\n", callers, seconds);
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(callers));
  std::atomic<int> failures{0};
  std::vector<std::future<void>> done;
  const std::string payload(64, 'x');
  auto start = SteadyClock::now();
  for (int c = 0; c < callers; ++c) {
    auto caller = [&, c]() -> asio::awaitable<void> {
      auto& lat = latencies[static_cast<size_t>(c)];
      while (!stop.load(std::memory_order_relaxed)) {
        auto t0 = SteadyClock::now();
        auto r = co_await client.Call(addr, "echo", net::Message(payload));
        if (!r.ok() || r->meta != payload) {  // a wrong echo counts as a failure
          ++failures;
          continue;
        }
        lat.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
      }
    };
    done.push_back(asio::co_spawn(client.io_context(), caller(), asio::use_future));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));  // the measurement window
  stop = true;
  for (auto& d : done) d.get();
  double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  double rps = static_cast<double>(all.size()) / elapsed;
  double p50 = all.empty() ? 0 : all[all.size() / 2];
  double p99 = all.empty() ? 0 : all[all.size() * 99 / 100];
  std::printf("  %zu calls in %.2f s: %.0f calls/s, p50 %.0f us, p99 %.0f us, %d failures\n",
              all.size(), elapsed, rps, p50, p99, failures.load());

  client.Shutdown();
  server.Shutdown();
  // With --skip-tcp, no figure that needs the TCP reference is printed at all.
  if (!skip_tcp) std::printf("RESULT transport_tcp_gbps=%.3f\n", tcp_gbs);
  std::printf("RESULT transport_encrypted_gbps=%.3f\n", colony_gbs);
  std::printf("RESULT transport_aes_gcm_seal_gbps=%.3f\n", seal_gbs);
  if (!skip_tcp) {
    std::printf("RESULT transport_encrypted_ceiling_vs_tcp=%.3f\n", ceiling / tcp_gbs);
  }
  std::printf("RESULT transport_unary_p50_us=%.1f\n", p50);
  std::printf("RESULT transport_unary_p99_us=%.1f\n", p99);
  std::printf("RESULT transport_unary_rps=%.0f\n", rps);
  if (!skip_tcp) {
    std::printf("RESULT transport_encrypted_vs_ceiling=%.3f\n", colony_gbs / ceiling);
    std::printf("RESULT transport_encrypted_vs_tcp=%.3f\n", colony_gbs / tcp_gbs);
  }
  return failures.load() == 0 ? 0 : 1;
}
