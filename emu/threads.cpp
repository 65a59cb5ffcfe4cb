#include "threads.hpp"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace emu {

namespace {

std::atomic<int> gemm_threads_setting{0};

// A band of fewer products than this costs more to hand to another thread (tens of
// microseconds) than it saves.
constexpr std::size_t kMinBandProducts = std::size_t{1} << 14;
// Bands per thread: enough that a thread slowed by the load of the machine does not hold
// up the others; few, as each band decodes or packs all of B again. At least this many
// rows a band keeps that repeated work small beside the band's own (where a sweep's
// threads are all busy, the caller runs every band itself).
constexpr std::size_t kBandsPerThread = 4;
constexpr std::size_t kMinBandRows = 16;

// The threads oneTBB gives this caller: its arena's, within a global limit (sweep -j).
std::size_t threads_here() {
  return std::min(static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency())),
                  tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
}

}  // namespace

void set_gemm_threads(int n) {
  if (n < 0) throw std::invalid_argument("the number of GEMM threads must be 0 (all) or at least 1, got " + std::to_string(n));
  gemm_threads_setting.store(n);
}

int gemm_threads() { return gemm_threads_setting.load(); }

void gemm_by_rows(Context& ctx, std::size_t m, std::size_t n, std::size_t k, double* C, std::size_t ldc,
                  const RowBand& band) {
  const std::size_t here = threads_here();
  const auto setting = static_cast<std::size_t>(gemm_threads_setting.load());
  // A setting below what oneTBB gives runs the bands in an arena of that many threads.
  const bool limited = setting != 0 && setting < here;
  const std::size_t threads = limited ? setting : here;
  const std::size_t products = m * n * std::max<std::size_t>(k, 1);
  const std::size_t wanted = std::min({m / kMinBandRows, threads * kBandsPerThread, products / kMinBandProducts});
  if (threads < 2 || wanted < 2 || ctx.control.effective_rounding() == Rounding::sr) {
    band(ctx, 0, m);
    return;
  }
  const std::size_t rows = (m + wanted - 1) / wanted;
  const std::size_t bands = (m + rows - 1) / rows;

  std::vector<double> saved(m * n);
  for (std::size_t i = 0; i < m; ++i) std::copy(C + i * ldc, C + i * ldc + n, saved.begin() + i * n);
  std::vector<Context> parts(bands, ctx);
  for (Context& part : parts) {
    part.clear_status();
    part.clear_counts();
    part.clear_element();
  }
  auto run_bands = [&] {
    // Isolated: a thread waiting for these bands takes no outer task (another sweep run),
    // which would hold this GEMM up for as long as that run lasts.
    tbb::this_task_arena::isolate([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, bands, 1),
          [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t b = r.begin(); b != r.end(); ++b) band(parts[b], b * rows, std::min(rows, m - b * rows));
          },
          tbb::simple_partitioner());
    });
  };
  try {
    if (limited) {
      tbb::task_arena arena(static_cast<int>(threads));  // at most `threads`, the caller included
      arena.execute(run_bands);
    } else {
      run_bands();
    }
  } catch (...) {
    for (std::size_t i = 0; i < m; ++i) std::copy(saved.begin() + i * n, saved.begin() + (i + 1) * n, C + i * ldc);
    band(ctx, 0, m);
    return;
  }

  for (std::size_t b = 0; b < bands; ++b) {
    const auto first = static_cast<std::int64_t>(b * rows);
    for (OpCount count : parts[b].counts()) {
      Element& e = count.first_element;
      if (e.known()) {
        e.flat += first * static_cast<std::int64_t>(n);
        if (e.rank > 0) e.index[0] += first;
      } else {
        e = ctx.element();  // raised outside the elements: the enclosing one, as serially
      }
      ctx.add_count(count);
    }
    // The flags that are not counted (nor trapped, or the band would have thrown).
    if (const Flags rest = parts[b].status() & ~ctx.control.counted) ctx.raise_flags(rest, "gemm", {});
  }
}

}  // namespace emu
