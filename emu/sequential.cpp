#include "sequential.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "exact_sum.hpp"
#include "simd.hpp"

// Both passes run a tile of 16 columns of C at once (four AVX2 vectors of doubles), one
// row of A after another, all k steps of an element in registers, with B packed into
// panels of 16 columns. Values of A and B must be fp32 values (fp16, bf16, tf32, fp8 and
// fp32 inputs are), so that every product a*b is exact in double (24 + 24 significant
// bits, and no underflow: |a*b| >= 2^-298).
//
// The sequential pass, one step of one element under round-to-nearest-even (the host's
// rounding, checked once per call, without flushing of subnormals):
//  fp32 fused:    r = fmaf(a, b, c), the hardware's one rounding of a*b + c into fp32.
//  fp32 unfused:  p = (float)(a*b), one rounding of the exact double product; then
//                 r = p + c in float, one rounding.
//  fp16 (fused: x = a*b + c; unfused: x = a*b, then x = p + c): s = fl(x) in double,
//                 then s rounded to the fp16 grid in double (round_to_half): the
//                 nearest fp16 value to x, unless s is an fp16 midpoint and x != s
//                 decides it (a hazard, redone). The unfused sum of two fp16 values is
//                 exact in double; so the running value must start as an fp16 value.
//  Flags: a rounding is exact iff its exact value is a double (a product of fp32
//  values, or a sum s = fl(x + y) that passes Fast2Sum's test) equal to the result;
//  INEXACT otherwise. A result that is finite and normal (|r| > min_normal: the exact
//  value is not tiny before or after rounding) raises nothing else; nor does an exact
//  zero, or an exact subnormal where the format has them. An inexact result below
//  min_normal in magnitude is tiny under both tininess rules: UFLO and INEXACT, where
//  the format has subnormals and UFLO is neither counted nor trapped. The kernel checks
//  the common case (normal and finite, or an exact zero) on every step, and skips the
//  exactness tests once INEXACT is known (without traps, where the order of flags
//  cannot show); a step that fails the check is recomputed with the tests and
//  classified (look_closer). Any other step (results of magnitude min_normal,
//  overflow, NaN or infinite operands, formats without subnormals, hazards) marks its
//  element for the reference, which redoes the whole element from its first step: the
//  overflow policy, tininess, flushing, NaN and flags then come from Context. Each
//  element is the same chain of steps as in the reference, so the kernel's results
//  and flags are the reference's for every element not redone.
//
// The exact pass: every product is a multiple of 2^L, L the sum of the lowest set bits
// over A and over B, and |a*b| <= P = max|A| max|B|. With k P <= 2^(L+118), at most
// three double accumulators ("bins") per element hold the sum exactly:
//  1. Boundaries b_1 = L + 54 - K and b_2 = b_1 + 53 - K, with k <= 2^K. A product is
//     split, from the top boundary down, as h = (x + 1.5*2^(b+52)) - 1.5*2^(b+52), the
//     nearest multiple of 2^b to x (exact while |x| <= 2^(b+51)), and x - h (exact,
//     |x - h| <= 2^(b-1)); the last remainder goes to the lowest bin.
//  2. A bin receives k multiples of 2^b (2^L for the lowest) whose magnitudes add up
//     to at most 2^(b+53): every partial sum is a double, so the bin is exact. The
//     lowest bin gets remainders of at most 2^(b_1-1) (k 2^(b_1-1) <= 2^(L+53)); a
//     middle bin at most 2^(b_1-1) + 2^(b_2-1) <= 2^b_2 ... ; the top bin at most P +
//     2^(b_top-1), fine while P <= 2^(b_top+52-K). One bin suffices where k P <=
//     2^(L+53), two or three otherwise (three reach 2^(L+118) for K <= 20).
//  3. Per element, the bins and c are added as integers times 2^L in 128 bits and
//     exact_from_fixed gives the Exact that ExactSum::value() gives for the same sum
//     (through ExactSum itself where c lies too far from 2^L).
// The exact unit rounds that Exact once under the context, as its dot does.

namespace emu {

#if EMU_SIMD

namespace {

bool is_float_value(double x) { return static_cast<double>(static_cast<float>(x)) == x; }  // false for NaN
bool same_layout(const Format& f, const Format& preset) { return f.with_subnormals(true) == preset; }

using simd::every_lane;
using simd::magnitude;

constexpr std::size_t kLanes = 4;
constexpr std::size_t kVectors = 4;
constexpr std::size_t kTile = kLanes * kVectors;  // columns of C per tile

__m256d all_ones() { return _mm256_castsi256_pd(_mm256_set1_epi64x(-1)); }

// PassOperand of X (rows x columns, row stride ld).
PassOperand scan(std::size_t rows, std::size_t columns, const double* X, std::size_t ld) {
  PassOperand o;
  o.special_row.assign(rows, false);
  o.special_column.assign(columns, false);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < columns; ++j) {
      const double x = X[i * ld + j];
      if (!std::isfinite(x)) {
        o.special_row[i] = o.special_column[j] = true;
        continue;
      }
      o.floats = o.floats && is_float_value(x);
      if (x == 0) continue;
      o.lowest_bit = std::min(o.lowest_bit, odd_significand(x).e);
      o.largest = std::max(o.largest, std::fabs(x));
    }
  return o;
}

// B by tiles of kTile columns: panel[tile][q][column], zero beyond column n.
std::vector<double> pack_panels(std::size_t n, std::size_t k, const double* B, std::size_t ldb) {
  std::vector<double> panels(((n + kTile - 1) / kTile) * k * kTile, 0.0);
  for (std::size_t q = 0; q < k; ++q)
    for (std::size_t j = 0; j < n; ++j) panels[((j / kTile) * k + q) * kTile + j % kTile] = B[q * ldb + j];
  return panels;
}

// ---- The sequential pass ---------------------------------------------------------------

__m256d is_zero(__m256d x) { return _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_EQ_OQ); }

// All-ones where s = fl(x + y) is x + y exactly. With |x| >= |y|, fl(s - x) is s - x
// exactly (Dekker's Fast2Sum), which equals y iff the sum is exact; then also fl(s - y)
// = x. Symmetrically for |y| >= |x|. (Doubles: no underflow can make it fail.)
__m256d sum_is_exact(__m256d s, __m256d x, __m256d y) {
  return _mm256_and_pd(_mm256_cmp_pd(_mm256_sub_pd(s, x), y, _CMP_EQ_OQ),
                       _mm256_cmp_pd(_mm256_sub_pd(s, y), x, _CMP_EQ_OQ));
}

// One rounding of a step, from the exact value x = s + e (s its nearest double).
//  value:   the rounded result;
//  zero:    x is zero (s = 0 iff x = 0: these doubles are far from underflow);
//  settled: the kernel's rounding is the nearest value (fp16: e = 0, no hazard);
// and, where a step is computed with kExact: exact (x is the result) and hazard (fp16:
// s is a midpoint and e != 0 decides it, which the kernel's rounding cannot see).
struct Rounded {
  __m256d value, zero, settled, exact, hazard;
  __m128 single;  // the value as floats, where the host rounded into fp32
};

// The nearest fp16 value to x = s + e, in double:
//  1. With 2^E = max(2^floor(log2 |s|), 2^-14), the fp16 spacing at s is 2^(E-10).
//  2. t = s + 1.5 * 2^(E+42) lies in [2^(E+42), 2^(E+43)), where doubles are 2^(E-10)
//     apart: the host's RNE puts t on the nearest multiple, ties to even (1.5 * 2^(E+42)
//     is an even multiple), and h = t - 1.5 * 2^(E+42) is exact. Beyond fp16's range h
//     is above max_finite; below 2^-14 it is on the subnormal grid.
//  3. h is the nearest fp16 value to x too, unless s is a midpoint (|s - h| = 2^(E-11))
//     and e != 0 decides it. A zero h takes s's sign (an exact zero sum's sign, or the
//     sign of a result that underflows to zero).
template <bool kExact>
Rounded round_to_half(__m256d s, __m256d exact_in_double) {
  const __m256d exponent_field = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FF0000000000000));
  const __m256d scale = _mm256_max_pd(_mm256_and_pd(s, exponent_field), _mm256_set1_pd(0x1p-14));  // 2^E
  const __m256d shift = _mm256_mul_pd(scale, _mm256_set1_pd(0x1.8p42));
  const __m256d h = _mm256_or_pd(_mm256_sub_pd(_mm256_add_pd(s, shift), shift),
                                 _mm256_and_pd(s, _mm256_set1_pd(-0.0)));
  Rounded r{h, is_zero(s), exact_in_double, {}, {}, {}};
  if constexpr (kExact) {
    const __m256d midpoint =
        _mm256_cmp_pd(magnitude(_mm256_sub_pd(s, h)), _mm256_mul_pd(scale, _mm256_set1_pd(0x1p-11)), _CMP_EQ_OQ);
    r.exact = _mm256_and_pd(exact_in_double, _mm256_cmp_pd(s, h, _CMP_EQ_OQ));
    r.hazard = _mm256_andnot_pd(exact_in_double, midpoint);
  }
  return r;
}

// A rounding by the host into fp32 (single), of x + y with nearest double s.
template <bool kExact>
Rounded hardware_rounding(__m128 single, __m256d s, __m256d x, __m256d y) {
  const __m256d value = _mm256_cvtps_pd(single);
  Rounded r{value, is_zero(s), all_ones(), {}, _mm256_setzero_pd(), single};
  if constexpr (kExact) r.exact = _mm256_and_pd(_mm256_cmp_pd(s, value, _CMP_EQ_OQ), sum_is_exact(s, x, y));
  return r;
}

// The roundings of one step per datapath, from a, b and c (doubles, fp32 values;
// a_single and c_single the floats, for the fp32 datapaths); the last one's value is
// the new running value. kOnGrid: the running value must start as a value of the
// output format (the unfused fp16 sum of two fp16 values is then exact in double).
struct Fp32Fused {
  static constexpr int kRoundings = 1;
  static constexpr bool kOnGrid = false;
  template <bool kExact>
  static void step(__m256d a, __m128 a_single, __m256d b, __m256d c, __m128 c_single, Rounded* r) {
    const __m128 single = _mm_fmadd_ps(a_single, _mm256_cvtpd_ps(b), c_single);
    const __m256d p = _mm256_mul_pd(a, b);
    r[0] = hardware_rounding<kExact>(single, _mm256_add_pd(p, c), p, c);
  }
};

struct Fp32Unfused {
  static constexpr int kRoundings = 2;
  static constexpr bool kOnGrid = false;
  template <bool kExact>
  static void step(__m256d a, __m128, __m256d b, __m256d c, __m128 c_single, Rounded* r) {
    const __m256d p = _mm256_mul_pd(a, b);
    const __m128 product_single = _mm256_cvtpd_ps(p);
    const __m256d product = _mm256_cvtps_pd(product_single);
    r[0] = {product, is_zero(p), all_ones(), _mm256_cmp_pd(product, p, _CMP_EQ_OQ), _mm256_setzero_pd(), product_single};
    r[1] = hardware_rounding<kExact>(_mm_add_ps(c_single, product_single), _mm256_add_pd(c, product), c, product);
  }
};

struct Fp16Fused {
  static constexpr int kRoundings = 1;
  static constexpr bool kOnGrid = false;
  template <bool kExact>
  static void step(__m256d a, __m128, __m256d b, __m256d c, __m128, Rounded* r) {
    const __m256d p = _mm256_mul_pd(a, b), s = _mm256_add_pd(p, c);
    r[0] = round_to_half<kExact>(s, sum_is_exact(s, p, c));
  }
};

struct Fp16Unfused {
  static constexpr int kRoundings = 2;
  static constexpr bool kOnGrid = true;
  template <bool kExact>
  static void step(__m256d a, __m128, __m256d b, __m256d c, __m128, Rounded* r) {
    r[0] = round_to_half<kExact>(_mm256_mul_pd(a, b), all_ones());
    // Two fp16 values (multiples of 2^-24 below 2^17 in magnitude) add up exactly.
    r[1] = round_to_half<kExact>(_mm256_add_pd(c, r[0].value), all_ones());
  }
};

struct Limits {
  __m256d min_normal;
  __m256d max_finite;
  __m256d exact_floor;   // exact results up to it in magnitude raise nothing: min_normal, or 0 without subnormals
  __m256d tiny_allowed;  // all-ones: tiny inexact results are the hardware's (subnormals, UFLO neither counted nor trapped)
};

// The common case, checked on every step: every rounding settled, and normal and
// finite or an exact zero.
template <int kRoundings>
__m256d usual(const Rounded* r, const Limits& lim) {
  __m256d ok = all_ones();
  for (int i = 0; i < kRoundings; ++i) {
    const __m256d mag = magnitude(r[i].value);
    const __m256d normal = _mm256_and_pd(_mm256_cmp_pd(mag, lim.min_normal, _CMP_GT_OQ),
                                         _mm256_cmp_pd(mag, lim.max_finite, _CMP_LE_OQ));
    ok = _mm256_and_pd(ok, _mm256_and_pd(r[i].settled, _mm256_or_pd(normal, r[i].zero)));
  }
  return ok;
}

// The rest, for a step (computed with kExact) that failed that check: lanes the kernel
// vouches for (no hazard; finite; normal, or exact and small, or tiny and inexact where
// allowed), and those that raise UFLO (tiny and inexact, before or after rounding
// alike: |result| < min_normal).
template <int kRoundings>
__m256d vouched(const Rounded* r, const Limits& lim, __m256d& underflow) {
  __m256d ok = all_ones();
  underflow = _mm256_setzero_pd();
  for (int i = 0; i < kRoundings; ++i) {
    const __m256d mag = magnitude(r[i].value);
    const __m256d tiny_inexact = _mm256_andnot_pd(r[i].exact, _mm256_cmp_pd(mag, lim.min_normal, _CMP_LT_OQ));
    const __m256d fine = _mm256_or_pd(
        _mm256_or_pd(_mm256_cmp_pd(mag, lim.min_normal, _CMP_GT_OQ), _mm256_and_pd(tiny_inexact, lim.tiny_allowed)),
        _mm256_and_pd(r[i].exact, _mm256_cmp_pd(mag, lim.exact_floor, _CMP_LE_OQ)));
    ok = _mm256_and_pd(ok, _mm256_andnot_pd(r[i].hazard, _mm256_and_pd(fine, _mm256_cmp_pd(mag, lim.max_finite, _CMP_LE_OQ))));
    underflow = _mm256_or_pd(underflow, tiny_inexact);
  }
  return ok;
}

// One tile's lanes for one row: the running values, and all-ones where a step was
// inexact (with kTrackInexact), where one underflowed, and where the kernel cannot vouch.
struct TileLanes {
  alignas(32) double c[kTile];
  alignas(32) double inexact[kTile];
  alignas(32) double underflow[kTile];
  alignas(32) double redo[kTile];
};

// Lanes of a step that failed the common-case check: recomputed with the exactness
// tests and classified; those the kernel cannot vouch for are marked in lanes.redo
// and returned all-ones, underflows recorded in lanes.underflow. Out of line: rare.
template <class Path>
[[gnu::noinline]] void look_closer(__m256d a, __m128 a_single, const double* panel, const double* c, const Limits& lim,
                                   TileLanes& lanes, double* failed) {
  constexpr int kRoundings = Path::kRoundings;
  for (std::size_t v = 0; v < kVectors; ++v) {
    Rounded r[kRoundings];
    const __m256d c_double = _mm256_load_pd(c + v * kLanes);
    Path::template step<true>(a, a_single, _mm256_loadu_pd(panel + v * kLanes), c_double, _mm256_cvtpd_ps(c_double), r);
    __m256d underflow;
    const __m256d failed_now = _mm256_andnot_pd(vouched<kRoundings>(r, lim, underflow), all_ones());
    double* redo = lanes.redo + v * kLanes;
    double* underflowed = lanes.underflow + v * kLanes;
    _mm256_store_pd(redo, _mm256_or_pd(_mm256_load_pd(redo), failed_now));
    _mm256_store_pd(underflowed, _mm256_or_pd(_mm256_load_pd(underflowed), underflow));
    _mm256_store_pd(failed + v * kLanes, failed_now);
  }
}

// The k steps of one row of A (a) over one tile of B (panel), from the values in
// lanes.c. Without kTrackInexact the steps skip the exactness tests, except in the
// rare steps that need a closer look.
template <class Path, bool kTrackInexact>
void sequential_tile_row(const double* a, std::size_t k, const double* panel, const Limits& lim, TileLanes& lanes) {
  constexpr int kRoundings = Path::kRoundings;
  __m256d c[kVectors], exact[kVectors];
  __m128 c_single[kVectors];  // for the fp32 datapaths: c as floats
  for (std::size_t v = 0; v < kVectors; ++v) {
    c[v] = _mm256_load_pd(lanes.c + v * kLanes);
    c_single[v] = _mm256_cvtpd_ps(c[v]);
    exact[v] = all_ones();
  }
  for (std::size_t q = 0; q < k; ++q, panel += kTile) {
    const __m256d a_double = _mm256_set1_pd(a[q]);
    const __m128 a_single = _mm_set1_ps(static_cast<float>(a[q]));
    __m256d next[kVectors];
    __m128 next_single[kVectors];
    __m256d all_usual = all_ones();
    for (std::size_t v = 0; v < kVectors; ++v) {
      Rounded r[kRoundings];
      Path::template step<kTrackInexact>(a_double, a_single, _mm256_loadu_pd(panel + v * kLanes), c[v], c_single[v], r);
      if constexpr (kTrackInexact)
        for (int i = 0; i < kRoundings; ++i) exact[v] = _mm256_and_pd(exact[v], r[i].exact);
      all_usual = _mm256_and_pd(all_usual, usual<kRoundings>(r, lim));
      next[v] = r[kRoundings - 1].value;
      next_single[v] = r[kRoundings - 1].single;
    }
    if (!every_lane(all_usual)) [[unlikely]] {
      // The lanes the kernel cannot vouch for get a running value of zero, so that the
      // garbage they would carry does not fail every later step.
      alignas(32) double before[kTile], failed[kTile];
      for (std::size_t v = 0; v < kVectors; ++v) _mm256_store_pd(before + v * kLanes, c[v]);
      look_closer<Path>(a_double, a_single, panel, before, lim, lanes, failed);
      for (std::size_t v = 0; v < kVectors; ++v) {
        next[v] = _mm256_andnot_pd(_mm256_load_pd(failed + v * kLanes), next[v]);
        next_single[v] = _mm256_cvtpd_ps(next[v]);
      }
    }
    for (std::size_t v = 0; v < kVectors; ++v) {
      c[v] = next[v];
      c_single[v] = next_single[v];
    }
  }
  for (std::size_t v = 0; v < kVectors; ++v) {
    _mm256_store_pd(lanes.c + v * kLanes, c[v]);
    _mm256_store_pd(lanes.inexact + v * kLanes, _mm256_andnot_pd(exact[v], all_ones()));
  }
}

bool lane_set(double mask) { return std::bit_cast<std::uint64_t>(mask) != 0; }

template <class Path>
void sequential_kernel(const Context& ctx, const Format& out, std::size_t m, std::size_t n, std::size_t k,
                       const double* A, std::size_t lda, const std::vector<double>& panels, const double* C,
                       std::size_t ldc, SequentialPass& pass) {
  const Flags watched = ctx.control.counted | ctx.control.traps;
  const Limits lim{_mm256_set1_pd(out.min_normal()), _mm256_set1_pd(out.max_finite()),
                   _mm256_set1_pd(out.subnormals() ? out.min_normal() : 0.0),
                   out.subnormals() && !(watched & UFLO) ? all_ones() : _mm256_setzero_pd()};
  // With traps, the flags of each element must be known in order (a trap report
  // carries the status); without, once INEXACT is known the kernel stops looking for it.
  const bool per_element = ctx.control.traps != 0;
  TileLanes lanes;
  for (std::size_t first = 0; first < n; first += kTile) {
    const std::size_t width = std::min(kTile, n - first);
    const double* panel = panels.data() + (first / kTile) * k * kTile;
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t l = 0; l < kTile; ++l) {
        const double c = l < width ? C[i * ldc + first + l] : 0.0;
        // Finite fp32 values (fmaf takes the float), and values of `out` where kOnGrid.
        const bool usable = is_float_value(c) && (!Path::kOnGrid || out.representable(c));
        lanes.c[l] = usable ? c : 0.0;
        lanes.redo[l] = usable ? 0.0 : std::bit_cast<double>(~std::uint64_t{0});
        lanes.underflow[l] = 0.0;
      }
      if (per_element || !(pass.raised & INEXACT))
        sequential_tile_row<Path, true>(A + i * lda, k, panel, lim, lanes);
      else
        sequential_tile_row<Path, false>(A + i * lda, k, panel, lim, lanes);
      for (std::size_t l = 0; l < width; ++l) {
        const std::size_t at = i * n + first + l;
        pass.value[at] = lanes.c[l];
        if (lane_set(lanes.redo[l])) {
          pass.flags[at] = SequentialPass::kRedo;
          continue;
        }
        // UFLO comes with INEXACT; INEXACT is known only while tracked.
        const Flags flags = (lane_set(lanes.underflow[l]) ? UFLO | INEXACT : 0) |
                            (lane_set(lanes.inexact[l]) && !(pass.raised & INEXACT) ? INEXACT : 0);
        if (per_element) pass.flags[at] = flags;
        else pass.raised |= flags;
      }
    }
  }
}

// ---- The exact pass --------------------------------------------------------------------

using i128 = __int128;

// A multiple of 2^lsb as an integer (x * 2^-lsb), exact for |x| < 2^(lsb + 127).
i128 to_fixed(double x, int lsb) {
  if (x == 0) return 0;
  const OddSignificand o = odd_significand(x);
  const i128 v = static_cast<i128>(o.m) << (o.e - lsb);
  return std::signbit(x) ? -v : v;
}

struct Bins {
  int count = 1;
  int lsb = 0;                  // L: every product is a multiple of 2^L
  double split[2] = {0.0, 0.0};  // 1.5 * 2^(b + 52) for the boundaries b_2 (if any), b_1
};

template <int kBins>
void exact_tile_row(const double* a, std::size_t k, const double* panel, const Bins& bins, double* sums) {
  __m256d acc[kBins][kVectors];
  for (auto& bin : acc)
    for (auto& v : bin) v = _mm256_setzero_pd();
  __m256d split[2];
  for (int j = 0; j < 2; ++j) split[j] = _mm256_set1_pd(bins.split[j]);
  for (std::size_t q = 0; q < k; ++q, panel += kTile) {
    const __m256d a_q = _mm256_set1_pd(a[q]);
    for (std::size_t v = 0; v < kVectors; ++v) {
      __m256d rest = _mm256_mul_pd(a_q, _mm256_loadu_pd(panel + v * kLanes));
      // From the top boundary down: bin j (j >= 1) takes the multiple of 2^b_j.
      for (int j = kBins - 1; j >= 1; --j) {
        const __m256d magic = split[2 - j];  // split[0] for b_2, split[1] for b_1
        const __m256d high = _mm256_sub_pd(_mm256_add_pd(rest, magic), magic);
        rest = _mm256_sub_pd(rest, high);
        acc[j][v] = _mm256_add_pd(acc[j][v], high);
      }
      acc[0][v] = _mm256_add_pd(acc[0][v], rest);
    }
  }
  for (int j = 0; j < kBins; ++j)
    for (std::size_t v = 0; v < kVectors; ++v) _mm256_storeu_pd(sums + j * kTile + v * kLanes, acc[j][v]);
}

// The Exact of c plus the bins of one element (multiples of 2^L whose sum lies below
// 2^(L+119) in magnitude).
Exact exact_of(const double* bins, int count, std::ptrdiff_t stride, int lsb, double c) {
  i128 total = 0;
  for (int j = 0; j < count; ++j) total += to_fixed(bins[j * stride], lsb);
  if (total == 0) return c == 0 ? Exact{0.0} : Exact{c};  // c alone, as ExactSum has it
  if (c == 0) return exact_from_fixed(total, lsb);
  // With c's lowest bit at most 6 below 2^L and c below 2^(L+120), the sum is held as a
  // multiple of 2^(L - shift) below 2^127; otherwise (rare) through ExactSum.
  const OddSignificand o = odd_significand(c);
  const int shift = std::max(0, lsb - o.e);
  if (shift > 6 || o.highest() - lsb >= 120) {
    ExactSum sum;
    sum.add(c);
    for (int j = 0; j < count; ++j) sum.add(bins[j * stride]);
    return sum.value();
  }
  total = total * (i128{1} << shift) + to_fixed(c, lsb - shift);
  if (total == 0) return {0.0};
  return exact_from_fixed(total, lsb - shift);
}

// The bins for products of A's and B's finite values; count 0 where they need more
// than three or the sums would leave 128 bits.
Bins plan_bins(std::size_t k, const PassOperand& a, const PassOperand& b) {
  const double max_a = a.largest, max_b = b.largest;
  Bins bins;
  if (max_a == 0 || max_b == 0) return bins;  // every finite product is zero
  bins.lsb = a.lowest_bit + b.lowest_bit;
  const int K = std::max(1, static_cast<int>(std::bit_width(k - 1)));  // k <= 2^K
  // k P 2^-L, rounded up a little (k < 2^21 and P = max_a max_b is exact).
  const double span = std::ldexp(max_a * max_b, -bins.lsb) * static_cast<double>(k) * (1 + 0x1p-50);
  if (K > 20 || span > 0x1p118) {
    bins.count = 0;
    return bins;
  }
  if (span <= 0x1p53) return bins;
  const int b1 = bins.lsb + 54 - K, b2 = b1 + 53 - K;
  const double max_product = max_a * max_b;
  bins.count = max_product <= std::ldexp(1.0, b1 + 52 - K) ? 2 : 3;
  bins.split[1] = std::ldexp(1.5, b1 + 52);
  bins.split[0] = std::ldexp(1.5, b2 + 52);
  return bins;
}

template <int kBins>
void exact_kernel(std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                  const std::vector<double>& panels, const Bins& bins, const double* C, std::size_t ldc,
                  const std::vector<bool>& special_row, const std::vector<bool>& special_column,
                  ExactPass& pass) {
  alignas(32) double sums[kBins * kTile];
  for (std::size_t first = 0; first < n; first += kTile) {
    const std::size_t width = std::min(kTile, n - first);
    const double* panel = panels.data() + (first / kTile) * k * kTile;
    for (std::size_t i = 0; i < m; ++i) {
      exact_tile_row<kBins>(A + i * lda, k, panel, bins, sums);
      for (std::size_t l = 0; l < width; ++l) {
        const std::size_t at = i * n + first + l;
        const double c = C[i * ldc + first + l];
        if (special_row[i] || special_column[first + l] || !std::isfinite(c)) {
          pass.redo[at] = true;
          continue;
        }
        pass.sum[at] = exact_of(sums + l, kBins, kTile, bins.lsb, c);
      }
    }
  }
}

}  // namespace

PassColumns pass_columns(std::size_t n, std::size_t k, const double* B, std::size_t ldb) {
  PassColumns columns{scan(k, n, B, ldb), {}};
  if (columns.scan.floats) columns.panels = pack_panels(n, k, B, ldb);
  return columns;
}

bool sequential_pass(const Context& ctx, const Format& out, bool fused, std::size_t m, std::size_t n, std::size_t k,
                     const double* A, std::size_t lda, const double* B, std::size_t ldb, const double* C,
                     std::size_t ldc, SequentialPass& pass, const PassColumns* columns) {
  const bool fp32_out = same_layout(out, fp32()), fp16_out = same_layout(out, fp16());
  if (m == 0 || n == 0 || k == 0 || (!fp32_out && !fp16_out) || ctx.control.effective_rounding() != Rounding::rne ||
      ((ctx.control.counted | ctx.control.traps) & INEXACT) || !simd::host_rounds_to_nearest())
    return false;
  if (!scan(m, k, A, lda).floats) return false;
  const PassColumns own = columns != nullptr ? PassColumns{} : pass_columns(n, k, B, ldb);
  const PassColumns& b = columns != nullptr ? *columns : own;
  if (!b.scan.floats) return false;
  pass.value.assign(m * n, 0.0);
  pass.flags.assign(m * n, 0);
  pass.raised = 0;
  if (fp32_out) {
    if (fused) sequential_kernel<Fp32Fused>(ctx, out, m, n, k, A, lda, b.panels, C, ldc, pass);
    else sequential_kernel<Fp32Unfused>(ctx, out, m, n, k, A, lda, b.panels, C, ldc, pass);
  } else {
    if (fused) sequential_kernel<Fp16Fused>(ctx, out, m, n, k, A, lda, b.panels, C, ldc, pass);
    else sequential_kernel<Fp16Unfused>(ctx, out, m, n, k, A, lda, b.panels, C, ldc, pass);
  }
  return true;
}

bool exact_pass(std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda, const double* B,
                std::size_t ldb, const double* C, std::size_t ldc, ExactPass& pass, const PassColumns* columns) {
  if (m == 0 || n == 0 || k == 0 || !simd::host_rounds_to_nearest()) return false;
  const PassOperand a = scan(m, k, A, lda);
  if (!a.floats) return false;
  const PassColumns own = columns != nullptr ? PassColumns{} : pass_columns(n, k, B, ldb);
  const PassColumns& b = columns != nullptr ? *columns : own;
  if (!b.scan.floats) return false;
  const Bins bins = plan_bins(k, a, b.scan);
  if (bins.count == 0) return false;
  pass.sum.assign(m * n, Exact{});
  pass.redo.assign(m * n, false);
  const std::vector<bool>& special_column = b.scan.special_column;
  switch (bins.count) {
    case 1: exact_kernel<1>(m, n, k, A, lda, b.panels, bins, C, ldc, a.special_row, special_column, pass); break;
    case 2: exact_kernel<2>(m, n, k, A, lda, b.panels, bins, C, ldc, a.special_row, special_column, pass); break;
    default: exact_kernel<3>(m, n, k, A, lda, b.panels, bins, C, ldc, a.special_row, special_column, pass); break;
  }
  return true;
}

#else

PassColumns pass_columns(std::size_t, std::size_t, const double*, std::size_t) { return {}; }

bool sequential_pass(const Context&, const Format&, bool, std::size_t, std::size_t, std::size_t, const double*,
                     std::size_t, const double*, std::size_t, const double*, std::size_t, SequentialPass&,
                     const PassColumns*) {
  return false;
}

bool exact_pass(std::size_t, std::size_t, std::size_t, const double*, std::size_t, const double*, std::size_t,
                const double*, std::size_t, ExactPass&, const PassColumns*) {
  return false;
}

#endif

}  // namespace emu
