// GEMM throughput of every matrix-unit model (emu::make_unit) on fp16 inputs, single
// thread, as GFLOP/s (2 M N K flops per thread CPU second) and as ratios to two
// references measured in the same run: a plain float32 triple loop and OpenBLAS sgemm
// (single-threaded; left out, and said so, in a build without OpenBLAS).
//
// Every measurement is taken the same way: one untimed warm-up call, then the best of N
// timed calls (N = 5 where the calls are quick, fewer for slow ones, at least 1). At
// 1024^3 slow models run a subset of the rows of C (the same matrices, fewer output
// rows: as many as a call of about a second takes at their 256^3 speed), scaled to
// GFLOP/s, and say so. Targets from the issues: ipu-amp (float partials) at least 0.25x
// the float loop, every tensor-core preset and the reference units (exact, fp32-seq,
// fp16-seq, also in their unfused forms) at least 0.05x.
//
// Thread scaling (issue 22: at least 1.8x from 1 to 2 threads): each unit's 1024^3 call
// (the same rows as above) at 1 and 2 GEMM threads (emu::set_gemm_threads), best of 3
// by wall time, with the CPU time of the same calls: the process's (over one thread's:
// the work the bands add) and the calling thread's, from which the busiest thread's
// share gives the speed-up a machine with two free cores would see (the CPU time at one
// thread over the busiest thread's at two), whatever the load; and the load average.
// Arguments: unit names (as in the table, "fp32-seq/u" too) to run only those.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emu/threads.hpp"
#include "emu/unit.hpp"

#ifdef ROUNDOFF_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

// The thread's CPU time: the models and the references are single-threaded, and CPU
// time keeps their ratio meaningful on a machine shared with other work.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The reference: C += A * B in float, i-k-j order (the plain loop a programmer writes for
// row-major data; the compiler vectorises the inner loop).
// noinline and aligned: where the linker places this loop moved its speed by up to
// 1.8x, and every ratio below is measured against it. fp-contract=fast: the loop as gcc
// compiles it by default (one fma per term), though the project builds with contraction
// off.
__attribute__((noinline, aligned(64), optimize("fp-contract=fast"))) void float_triple_loop(std::size_t n, const float* A, const float* B, float* C) {
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

constexpr int kMaxRepeats = 5;
constexpr double kRepeatBudget = 2.5;  // seconds of timed calls per measurement, at most
constexpr double kCallBudget = 1.0;    // seconds per 1024^3 call that decide the rows of slow models

struct Timing {
  double seconds = 0;  // the best timed call
  int repeats = 0;
};

// One untimed warm-up call, then the best of N timed calls, N from the warm-up's time.
// `prepare` runs before each call, untimed (it resets C).
Timing best_of(const std::function<void()>& prepare, const std::function<void()>& call) {
  prepare();
  double start = cpu_seconds();
  call();
  const double warm = cpu_seconds() - start;
  Timing t;
  t.repeats = std::clamp(static_cast<int>(kRepeatBudget / std::max(warm, 1e-9)), 1, kMaxRepeats);
  t.seconds = 1e300;
  for (int r = 0; r < t.repeats; ++r) {
    prepare();
    start = cpu_seconds();
    call();
    t.seconds = std::min(t.seconds, cpu_seconds() - start);
  }
  return t;
}

double time_float_loop(const Problem& p, int& repeats) {
  std::vector<float> C(p.n * p.n);
  const Timing t = best_of([&] { std::fill(C.begin(), C.end(), 0.0f); },
                           [&] { float_triple_loop(p.n, p.Af.data(), p.Bf.data(), C.data()); });
  volatile float sink = C[p.n + 1];  // keep the result alive
  (void)sink;
  repeats = t.repeats;
  return t.seconds;
}

#ifdef ROUNDOFF_HAVE_OPENBLAS
double time_sgemm(const Problem& p, int& repeats) {
  std::vector<float> C(p.n * p.n);
  const int n = static_cast<int>(p.n);
  const Timing t = best_of([&] { std::fill(C.begin(), C.end(), 0.0f); },
                           [&] {
                             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, p.Af.data(), n,
                                         p.Bf.data(), n, 1.0f, C.data(), n);
                           });
  volatile float sink = C[p.n + 1];
  (void)sink;
  repeats = t.repeats;
  return t.seconds;
}
#endif

// `rows` rows of C = A * B through the unit: warm-up and best of N.
struct UnitTiming {
  double gflops;
  std::size_t rows;
  int repeats;
};

UnitTiming time_unit(const emu::MatrixUnit& unit, const Problem& p, std::size_t rows) {
  std::vector<double> C(rows * p.n, 0.0);
  emu::Context ctx;
  const Timing t = best_of([&] { std::fill(C.begin(), C.end(), 0.0); },
                           [&] { unit.gemm(ctx, rows, p.n, p.n, p.A.data(), p.n, p.B.data(), p.n, C.data(), p.n); });
  return {gflops(rows, p.n, t.seconds), rows, t.repeats};
}

// One call's wall and process CPU seconds at `threads` GEMM threads: warm-up, then the
// best of 3 by wall time.
struct Scaling {
  double wall = 1e300, cpu = 0, busiest = 0;  // busiest: the larger of the caller's and the others' CPU time
};

Scaling time_threads(const emu::MatrixUnit& unit, const Problem& p, std::size_t rows, int threads) {
  emu::set_gemm_threads(threads);
  std::vector<double> C(rows * p.n, 0.0);
  emu::Context ctx;
  auto call = [&] { unit.gemm(ctx, rows, p.n, p.n, p.A.data(), p.n, p.B.data(), p.n, C.data(), p.n); };
  call();
  Scaling best;
  for (int r = 0; r < 3; ++r) {
    std::fill(C.begin(), C.end(), 0.0);
    timespec cpu0{}, cpu1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    const double caller0 = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    call();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double caller = cpu_seconds() - caller0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    const double cpu =
        static_cast<double>(cpu1.tv_sec - cpu0.tv_sec) + 1e-9 * static_cast<double>(cpu1.tv_nsec - cpu0.tv_nsec);
    if (wall < best.wall) best = {wall, cpu, std::max(caller, cpu - caller)};
  }
  emu::set_gemm_threads(1);
  return best;
}

double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef ROUNDOFF_HAVE_OPENBLAS
  openblas_set_num_threads(1);  // single-threaded, as the models (and thread CPU time) assume
#endif
  emu::set_gemm_threads(1);  // the table: one thread (the scaling below sets its own)
  const std::vector<std::string> only(argv + 1, argv + argc);
  const Problem problems[] = {make_problem(256, 1), make_problem(1024, 2)};
  double loop_gf[2] = {}, blas_gf[2] = {};
  std::printf("GEMM throughput, fp16 inputs, single thread (2*M*N*K flops per thread CPU second)\n");
  std::printf("every figure: one warm-up call, then the best of N timed calls (N in brackets)\n\n");
  for (int s = 0; s < 2; ++s) {
    const Problem& p = problems[s];
    int repeats = 0;
    loop_gf[s] = gflops(p.n, p.n, time_float_loop(p, repeats));
    std::printf("reference float32 triple loop (i-k-j), %4zu^3: %8.2f GFLOP/s  [%d]\n", p.n, loop_gf[s], repeats);
#ifdef ROUNDOFF_HAVE_OPENBLAS
    blas_gf[s] = gflops(p.n, p.n, time_sgemm(p, repeats));
    std::printf("reference OpenBLAS sgemm,             %4zu^3: %8.2f GFLOP/s  [%d]\n", p.n, blas_gf[s], repeats);
#endif
  }
#ifdef ROUNDOFF_HAVE_OPENBLAS
  // The kernel OpenBLAS chose for this CPU (its DYNAMIC_ARCH build picks one at run time;
  // a CPU it does not recognise gets a generic one, several times slower).
  std::printf("sgemm from%s(threads in use: %d, kernel for %s)\n", OPENBLAS_VERSION, openblas_get_num_threads(),
              openblas_get_corename());
#else
  std::printf("OpenBLAS sgemm: not measured (built without OpenBLAS: install libopenblas-dev, scripts/setup)\n");
#endif
  std::printf("\n%-13s %11s %8s %8s %11s %8s %8s  %s\n", "unit", "256^3 GF/s", "x loop", "x sgemm", "1024^3 GF/s",
              "x loop", "x sgemm", "note");

  struct Target {
    std::string unit;
    double ratio[2];
    double need;
  };
  std::vector<Target> targets;
  // Every unit by name, then the sequential units' unfused forms.
  struct Entry {
    std::string name;
    emu::UnitKind kind;
    bool unfused;
  };
  std::vector<Entry> entries;
  for (const char* const* name = emu::unit_names(); *name != nullptr; ++name)
    entries.push_back({*name, emu::unit_kind_by_name(*name), false});
  for (emu::UnitKind kind : {emu::UnitKind::fp32_seq, emu::UnitKind::fp16_seq})
    entries.push_back({std::string(emu::unit_kind_name(kind)) + "/u", kind, true});
  struct Scaled {
    std::string unit;
    std::size_t rows;
    Scaling one, two;
  };
  std::vector<Scaled> scaled;
  for (const Entry& entry : entries) {
    if (!only.empty() && std::find(only.begin(), only.end(), entry.name) == only.end()) continue;
    const char* const name = entry.name.c_str();
    std::unique_ptr<emu::MatrixUnit> unit;
    try {
      unit = entry.unfused ? emu::make_sequential_unit(entry.kind, false, emu::fp16())
                           : emu::make_unit(entry.kind, emu::fp16());
    } catch (const std::invalid_argument& e) {
      std::printf("%-13s not available (%s)\n", name, e.what());
      continue;
    }
    UnitTiming t[2];
    t[0] = time_unit(*unit, problems[0], problems[0].n);
    // Rows of the large product whose call fits the budget, from the small product's
    // speed (a large row costs 16 small rows): all 1024 for the fast models.
    const double per_large_row = 2.0 * 1024.0 * 1024.0 / (t[0].gflops * 1e9);
    t[1] = time_unit(*unit, problems[1],
                     static_cast<std::size_t>(std::clamp(kCallBudget / per_large_row, 8.0, 1024.0)));
    std::string note;
    for (int s = 0; s < 2; ++s) {
      char part[96];
      if (t[s].rows < problems[s].n)
        std::snprintf(part, sizeof part, "%s%zu^3 [%d] %zu rows, scaled", s ? "; " : "", problems[s].n,
                      t[s].repeats, t[s].rows);
      else
        std::snprintf(part, sizeof part, "%s%zu^3 [%d]", s ? "; " : "", problems[s].n, t[s].repeats);
      note += part;
    }
    // "-" without OpenBLAS: a 0.0000 would read as a measurement.
    auto blas_ratio = [&](int s) {
      char text[16] = "-";
      if (blas_gf[s] > 0) std::snprintf(text, sizeof text, "%.4f", t[s].gflops / blas_gf[s]);
      return std::string(text);
    };
    std::printf("%-13s %11.4f %8.4f %8s %11.4f %8.4f %8s  %s\n", name, t[0].gflops, t[0].gflops / loop_gf[0],
                blas_ratio(0).c_str(), t[1].gflops, t[1].gflops / loop_gf[1], blas_ratio(1).c_str(), note.c_str());
    scaled.push_back({entry.name, t[1].rows, time_threads(*unit, problems[1], t[1].rows, 1),
                      time_threads(*unit, problems[1], t[1].rows, 2)});
    const emu::UnitKind kind = unit->kind();
    if (kind != emu::UnitKind::ipu_amp_half)
      targets.push_back({entry.name + (kind == emu::UnitKind::ipu_amp ? " (float partials)" : "") +
                             (entry.unfused ? " (unfused)" : ""),
                         {t[0].gflops / loop_gf[0], t[1].gflops / loop_gf[1]},
                         kind == emu::UnitKind::ipu_amp ? 0.25 : 0.05});
  }
  std::printf("(/u: the unfused form, c <- c + round(a b))\n");

  std::printf("\ntargets (ratio to the float32 triple loop at 256^3 and 1024^3)\n");
  for (const Target& target : targets) {
    const bool met = target.ratio[0] >= target.need && target.ratio[1] >= target.need;
    std::printf("  %-26s >= %.2fx: %.3fx, %.3fx  %s\n", target.unit.c_str(), target.need, target.ratio[0],
                target.ratio[1], met ? "met" : "NOT MET");
  }

  std::printf("\nthread scaling, 1024^3 (rows as above), 1 and 2 GEMM threads: wall seconds (best of 3) and "
              "speed-up; process CPU time at 2 over 1 (the bands' extra work); CPU time at 1 over the busiest "
              "thread's at 2 (the speed-up on two free cores)\n");
  std::printf("load average (1 min) now: %.2f, on %d hardware threads\n", load_average(),
              static_cast<int>(std::thread::hardware_concurrency()));
  std::printf("%-13s %6s %9s %9s %9s %9s %9s  %s\n", "unit", "rows", "1 thread", "2 threads", "speed-up", "CPU x",
              "free x", "target >= 1.8x (speed-up; free cores)");
  for (const Scaled& u : scaled) {
    const double speedup = u.one.wall / u.two.wall, free = u.one.cpu / u.two.busiest;
    std::printf("%-13s %6zu %9.3f %9.3f %8.2fx %8.2fx %8.2fx  %s; %s\n", u.unit.c_str(), u.rows, u.one.wall,
                u.two.wall, speedup, u.two.cpu / u.one.cpu, free, speedup >= 1.8 ? "met" : "NOT MET",
                free >= 1.8 ? "met" : "NOT MET");
  }
  std::printf("load average (1 min) after: %.2f\n", load_average());
  return 0;
}
