// Reference for bench_allreduce: MPI_Allreduce(MPI_SUM) of COUNT float32 values, one warm-up and
// R timed rounds, each after an MPI_Barrier. Run it under mpirun (bench_allreduce does, forcing
// the TCP transport: --mca pml ob1 --mca btl tcp,self). Rank 0 prints one line per round:
//   MPI_ROUND <round> <seconds>     (the slowest rank's time, MPI_Reduce with MPI_MAX)
// then "MPI_OK" if every rank got the expected sums, or "MPI_BAD ..." if not.
//
// Usage: bench_mpi_allreduce COUNT ROUNDS
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 3) {
    if (rank == 0) std::fprintf(stderr, "usage: bench_mpi_allreduce COUNT ROUNDS\n");
    MPI_Finalize();
    return 2;
  }
  const long long count = std::atoll(argv[1]);
  const int rounds = std::atoi(argv[2]);
  if (count <= 0 || count > (1LL << 31) - 1 || rounds <= 0) {
    if (rank == 0) std::fprintf(stderr, "bench_mpi_allreduce: bad COUNT or ROUNDS\n");
    MPI_Finalize();
    return 2;
  }
  const auto n = static_cast<size_t>(count);
  std::vector<float> in(n, static_cast<float>(rank + 1)), out(n, 0.0f);
  const float expected = static_cast<float>(size) * static_cast<float>(size + 1) / 2;
  int bad = 0;
  for (int r = -1; r < rounds; ++r) {  // round -1 is the warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    double elapsed = MPI_Wtime() - start, slowest = 0;
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (out[0] != expected || out[n / 2] != expected || out[n - 1] != expected) bad = 1;
    out[0] = out[n / 2] = out[n - 1] = 0;
    if (rank == 0 && r >= 0) {
      std::printf("MPI_ROUND %d %.6f\n", r, slowest);
      std::fflush(stdout);
    }
  }
  int any_bad = 0;
  MPI_Reduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    if (any_bad != 0) {
      std::printf("MPI_BAD wrong sums\n");
    } else {
      std::printf("MPI_OK\n");
    }
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
