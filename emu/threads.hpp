// How many threads emu's GEMMs use, and the driver that runs a GEMM on them in bands of
// rows (MatrixUnit::gemm, BlockMmaUnit::gemm) with results, status flags, counts and
// traps that do not depend on the number of threads.
#pragma once

#include <cstddef>
#include <functional>

#include "arith.hpp"

namespace emu {

// The most threads one GEMM uses: n >= 1 (1: the calling thread alone, the serial
// path), or 0, the default: as many as oneTBB lets the caller have (every core; in a
// sweep, the threads -j allows that no other run is using). Process-wide; throws
// std::invalid_argument for n < 0.
void set_gemm_threads(int n);
int gemm_threads();

// Rows [first, first + rows) of a GEMM's m x n output, computed on the calling thread
// under `ctx` (a unit's serial GEMM on those rows of A and C), with the elements
// numbered within the band: flat (i - first) * n + j, index [i - first, j].
using RowBand = std::function<void(Context& ctx, std::size_t first, std::size_t rows)>;

// Runs band() over rows [0, m) of the output C (row stride ldc; k products per element,
// to judge the work), as band(ctx, 0, m) would, on up to gemm_threads() threads:
//  1. Serial (band(ctx, 0, m) itself) where one thread is asked for, where the work is
//     too small to share, and under stochastic rounding (its random bits are drawn in
//     element order).
//  2. Otherwise bands of whole rows, each on a copy of ctx with no status and no counts,
//     taken in turn by the caller and by oneTBB tasks that help it (isolated: a waiting
//     thread takes no outer work); where the bands fall depends on timing, which
//     changes nothing below.
//  3. The copies' counts are renumbered to the whole GEMM's elements and added to ctx,
//     and their status joined, in row order: rows are row-major order, so the counts,
//     their first elements and their order are the serial ones.
//  4. A trap or an error in any band: C is restored and the GEMM runs serially on ctx,
//     which throws the first exception in element order, with the status, counts and
//     elements written before it of the serial run.
// So band() must compute each element of a band as it does within the whole GEMM
// (results and flags per element independent of the other rows).
// min_rows: the fewest rows a band takes where there are more (kGemmBandRows for a
// GEMM; a caller whose rows are heavy, as amp_conv2d's images, asks for fewer).
inline constexpr std::size_t kGemmBandRows = 64;
void gemm_by_rows(Context& ctx, std::size_t m, std::size_t n, std::size_t k, double* C, std::size_t ldc,
                  const RowBand& band, std::size_t min_rows = kGemmBandRows);

}  // namespace emu
