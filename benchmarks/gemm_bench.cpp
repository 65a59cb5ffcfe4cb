// GEMM throughput of every matrix-unit model (emu::make_unit) on fp16 inputs, single
// thread, as GFLOP/s (2 M N K flops) and as a ratio to a plain float32 triple loop timed
// in the same run. OpenBLAS is not a dependency of this project, so no sgemm reference.
// Slow models run a subset of the rows of the large product, scaled, and say so.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/unit.hpp"

namespace {

// The thread's CPU time: the models and the reference are single-threaded, and CPU time
// keeps their ratio meaningful on a machine shared with other work.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The reference: C += A * B in float, i-k-j order (the plain loop a programmer writes for
// row-major data; the compiler vectorises the inner loop).
// noinline and aligned: where the linker places this loop moved its speed by up to
// 1.8x, and every ratio below is measured against it.
__attribute__((noinline, aligned(64))) void float_triple_loop(std::size_t n, const float* A, const float* B, float* C) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < n; ++p) {
      const float a = A[i * n + p];
      for (std::size_t j = 0; j < n; ++j) C[i * n + j] += a * B[p * n + j];
    }
}

struct Problem {
  std::size_t n;
  std::vector<double> A, B;  // fp16 values
  std::vector<float> Af, Bf;
};

Problem make_problem(std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  emu::Context ctx;
  Problem p{n, std::vector<double>(n * n), std::vector<double>(n * n), {}, {}};
  for (double& x : p.A) x = ctx.convert(emu::fp16(), normal(gen));
  for (double& x : p.B) x = ctx.convert(emu::fp16(), normal(gen));
  p.Af.assign(p.A.begin(), p.A.end());
  p.Bf.assign(p.B.begin(), p.B.end());
  return p;
}

double gflops(std::size_t rows, std::size_t n, double seconds) {
  return 2.0 * static_cast<double>(rows) * static_cast<double>(n) * static_cast<double>(n) / seconds / 1e9;
}

// Best of `repeats` runs of the float loop.
double time_float_loop(const Problem& p, int repeats) {
  std::vector<float> C(p.n * p.n);
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    std::fill(C.begin(), C.end(), 0.0f);
    const double start = cpu_seconds();
    float_triple_loop(p.n, p.Af.data(), p.Bf.data(), C.data());
    best = std::min(best, cpu_seconds() - start);
  }
  volatile float sink = C[p.n + 1];  // keep the result alive
  (void)sink;
  return best;
}

// Seconds for `rows` rows of C = A * B through the unit.
double time_unit(const emu::MatrixUnit& unit, const Problem& p, std::size_t rows) {
  std::vector<double> C(rows * p.n, 0.0);
  emu::Context ctx;
  const double start = cpu_seconds();
  unit.gemm(ctx, rows, p.n, p.n, p.A.data(), p.n, p.B.data(), p.n, C.data(), p.n);
  return cpu_seconds() - start;
}

}  // namespace

int main() {
  constexpr double kBudgetSeconds = 3.0;  // per unit on the large product, before scaling
  const Problem small = make_problem(256, 1);
  const Problem large = make_problem(1024, 2);
  const double float_small = time_float_loop(small, 5);
  const double float_large = time_float_loop(large, 2);
  const double ref_small = gflops(256, 256, float_small), ref_large = gflops(1024, 1024, float_large);
  std::printf("GEMM throughput, fp16 inputs, single thread (2*M*N*K flops per thread CPU second)\n");
  std::printf("reference float32 triple loop (i-k-j): 256^3 %.2f GFLOP/s, 1024^3 %.2f GFLOP/s\n", ref_small,
              ref_large);
  std::printf("OpenBLAS sgemm: skipped (libopenblas-dev is not a dependency of this project)\n\n");
  std::printf("%-14s %12s %10s %12s %10s  %s\n", "unit", "256^3 GF/s", "ratio", "1024^3 GF/s", "ratio", "note");

  for (const char* const* name = emu::unit_names(); *name != nullptr; ++name) {
    std::unique_ptr<emu::MatrixUnit> unit;
    try {
      unit = emu::make_unit(emu::unit_kind_by_name(*name), emu::fp16());
    } catch (const std::invalid_argument& e) {
      std::printf("%-14s not available (%s)\n", *name, e.what());
      continue;
    }
    const double t_small = time_unit(*unit, small, 256);
    const double g_small = gflops(256, 256, t_small);
    // Rows of the large product that fit the budget, from the small product's speed
    // (a large row costs 16 small rows).
    const double per_large_row = t_small / 256.0 * 16.0;
    const auto rows = static_cast<std::size_t>(std::clamp(kBudgetSeconds / per_large_row, 8.0, 1024.0));
    const double t_large = time_unit(*unit, large, rows);
    const double g_large = gflops(rows, 1024, t_large);
    char note[64] = "";
    if (rows < 1024) std::snprintf(note, sizeof note, "1024^3: %zu of 1024 rows, scaled", rows);
    std::printf("%-14s %12.4f %10.4f %12.4f %10.4f  %s\n", *name, g_small, g_small / ref_small, g_large,
                g_large / ref_large, note);
  }
  return 0;
}
