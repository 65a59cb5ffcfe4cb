#include "threads.hpp"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace emu {

namespace {

std::atomic<int> gemm_threads_setting{0};

// Bands: every thread takes the next band of rows until none is left. Most units' gemm
// decode or pack B once for all their bands (the AMD units still decode it per band), so
// a band costs little work of its own beside its rows'; several bands per thread then
// bound the time one thread waits for another (a thread that lost its core for a while,
// a slower band) to one band. A caller that no other thread has come to help (every
// thread busy, as in a sweep) takes all the rows left at once.
constexpr std::size_t kBandsPerThread = 4;
// A band of fewer products costs more to hand to another thread (tens of
// microseconds) than it saves.
constexpr std::size_t kMinBandProducts = std::size_t{1} << 14;

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
                  const RowBand& band, std::size_t min_rows) {
  const std::size_t here = threads_here();
  const auto setting = static_cast<std::size_t>(gemm_threads_setting.load());
  // A setting below what oneTBB gives runs the bands in an arena of that many threads.
  const bool limited = setting != 0 && setting < here;
  const std::size_t threads = limited ? setting : here;
  const std::size_t row_products = std::max<std::size_t>(n * k, 1);
  const std::size_t rows = std::max({min_rows, std::size_t{1},
                                     (m + threads * kBandsPerThread - 1) / (threads * kBandsPerThread),
                                     (kMinBandProducts + row_products - 1) / row_products});
  if (threads < 2 || rows >= m || ctx.control.effective_rounding() == Rounding::sr) {
    band(ctx, 0, m);
    return;
  }

  Context fresh = ctx;
  fresh.clear_status();
  fresh.clear_counts();
  fresh.clear_element();
  // Every band starts at a multiple of `rows` (the caller's last one, all the rows left,
  // too): it waits in slot first / rows, so the slots are in row order. A band keeps its
  // rows of C as they were, to restore them after a trap: copied by the band's own
  // thread, so that no copy of the whole of C holds the other threads up.
  struct Band {
    std::optional<Context> ctx;
    std::size_t rows = 0;
    std::vector<double> saved;  // rows x n, row-major
  };
  std::vector<Band> slots((m + rows - 1) / rows);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> helped{false}, failed{false};
  // Takes `want` rows (fewer at the end) and computes them; false when none was left.
  auto take = [&](std::size_t want) {
    const std::size_t first = failed.load() ? m : next.fetch_add(want);
    if (first >= m) return false;
    Band& b = slots[first / rows];
    const std::size_t count = std::min(want, m - first);
    b.saved.resize(count * n);
    for (std::size_t i = 0; i < count; ++i)
      std::copy(C + (first + i) * ldc, C + (first + i) * ldc + n, b.saved.begin() + i * n);
    b.rows = count;  // from here on, the band may have written its rows
    band(b.ctx.emplace(fresh), first, count);
    return true;
  };
  auto run_bands = [&] {
    // Isolated: a thread waiting for the helpers takes no outer task (another sweep
    // run), which would hold this GEMM up for as long as that run lasts.
    tbb::this_task_arena::isolate([&] {
      tbb::task_group helpers;
      for (std::size_t t = 1; t < threads; ++t)
        helpers.run([&] {
          helped.store(true);
          try {
            while (take(rows)) {
            }
          } catch (...) {
            failed.store(true);
            throw;
          }
        });
      // The caller takes a band, then, while no helper has come (every thread busy), all
      // the rows left at once.
      try {
        bool first_band = true;
        while (take(first_band || helped.load() ? rows : m)) first_band = false;
      } catch (...) {
        failed.store(true);
        helpers.wait();  // they write into C: wait for them before the caller's exception goes on
        throw;
      }
      helpers.wait();
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
    for (std::size_t slot = 0; slot < slots.size(); ++slot)
      for (std::size_t i = 0; i < slots[slot].rows; ++i) {
        const auto row = slots[slot].saved.begin() + i * n;
        std::copy(row, row + n, C + (slot * rows + i) * ldc);
      }
    band(ctx, 0, m);
    return;
  }

  for (std::size_t slot = 0; slot < slots.size(); ++slot) {
    if (!slots[slot].ctx) continue;
    const Context& b = *slots[slot].ctx;
    const auto first = static_cast<std::int64_t>(slot * rows);
    for (OpCount count : b.counts()) {
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
    if (const Flags rest = b.status() & ~ctx.control.counted) ctx.raise_flags(rest, "gemm", {});
  }
}

}  // namespace emu
