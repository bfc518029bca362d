// Reference for bench_allreduce: Gloo's all-reduce (gloo::allreduce, ring algorithm, as PyTorch's
// ProcessGroupGloo uses it) of COUNT float32 values over Gloo's TCP transport on loopback. Ranks
// meet through a gloo::rendezvous::FileStore in STORE_DIR. One warm-up and R timed rounds, each
// after a gloo::barrier. Rank 0 prints one line per round:
//   GLOO_ROUND <round> <seconds>    (the slowest rank's time: a second, one-value all-reduce)
// then "GLOO_OK" if every rank got the expected sums, or "GLOO_BAD ..." if not.
//
// Usage: bench_gloo_allreduce RANK SIZE COUNT ROUNDS STORE_DIR
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kDataTag = 1;
constexpr uint32_t kTimeTag = 2;
constexpr uint32_t kCheckTag = 3;
constexpr uint32_t kBarrierTag = 4;

void Barrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierOptions opts(context);
  opts.setTag(kBarrierTag);
  gloo::barrier(opts);
}

// Max over ranks of one double (in place).
void MaxOverRanks(const std::shared_ptr<gloo::Context>& context, double* value, uint32_t tag) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(value, 1);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
  opts.setTag(tag);
  gloo::allreduce(opts);
}

int Run(int rank, int size, size_t count, int rounds, const std::string& store_dir) {
  gloo::transport::tcp::attr attr;
  attr.iface = "lo";
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::seconds(120));
  context->connectFullMesh(store, device);

  std::vector<float> in(count, static_cast<float>(rank + 1)), out(count, 0.0f);
  const float expected = static_cast<float>(size) * static_cast<float>(size + 1) / 2;
  double bad = 0;
  for (int r = -1; r < rounds; ++r) {  // round -1 is the warm-up
    Barrier(context);
    const auto start = std::chrono::steady_clock::now();
    gloo::AllreduceOptions opts(context);
    opts.setInput(in.data(), count);
    opts.setOutput(out.data(), count);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(kDataTag);
    gloo::allreduce(opts);
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MaxOverRanks(context, &elapsed, kTimeTag);
    if (out[0] != expected || out[count / 2] != expected || out[count - 1] != expected) bad = 1;
    out[0] = out[count / 2] = out[count - 1] = 0;
    if (rank == 0 && r >= 0) {
      std::printf("GLOO_ROUND %d %.6f\n", r, elapsed);
      std::fflush(stdout);
    }
  }
  MaxOverRanks(context, &bad, kCheckTag);
  if (rank == 0) {
    std::printf(bad != 0 ? "GLOO_BAD wrong sums\n" : "GLOO_OK\n");
    std::fflush(stdout);
  }
  Barrier(context);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: bench_gloo_allreduce RANK SIZE COUNT ROUNDS STORE_DIR\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const long long count = std::atoll(argv[3]);
  const int rounds = std::atoi(argv[4]);
  if (size < 1 || rank < 0 || rank >= size || count <= 0 || rounds <= 0) {
    std::fprintf(stderr, "bench_gloo_allreduce: bad arguments\n");
    return 2;
  }
  try {
    return Run(rank, size, static_cast<size_t>(count), rounds, argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gloo_allreduce rank %d: %s\n", rank, e.what());
    return 1;
  }
}
