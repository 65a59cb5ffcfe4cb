#include "amp.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "exact_sum.hpp"
#include "threads.hpp"

#include "simd.hpp"

namespace emu {

namespace {

constexpr int kMaxProductsPerPass = 64;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using i128 = __int128;

bool same_layout(const Format& a, const Format& b) { return a == b; }
bool is_fp16(const Format& f) { return same_layout(f, fp16()); }
bool is_fp32(const Format& f) { return same_layout(f, fp32()); }

// The exact sum of n <= 65 finite doubles. Terms whose bits span at most 120 binades
// are summed as integers in 128 bits (65 terms below 2^120 cannot overflow 2^127);
// wider spans go through the long accumulator.
Exact exact_sum_of(const double* t, int n) {
  std::array<OddSignificand, kMaxProductsPerPass + 1> parts;
  std::array<bool, kMaxProductsPerPass + 1> negative;
  int count = 0, lowest = INT_MAX, highest = INT_MIN;
  for (int i = 0; i < n; ++i) {
    if (t[i] == 0) continue;
    const auto slot = static_cast<std::size_t>(count++);
    parts[slot] = odd_significand(t[i]);
    negative[slot] = std::signbit(t[i]);
    lowest = std::min(lowest, parts[slot].e);
    highest = std::max(highest, parts[slot].highest());
  }
  if (count == 0) return {0.0};
  if (highest - lowest < 120) {
    i128 acc = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
      const i128 term = static_cast<i128>(parts[i].m) << (parts[i].e - lowest);
      acc += negative[i] ? -term : term;
    }
    if (acc == 0) return {0.0};
    return exact_from_fixed(acc, lowest);
  }
  ExactSum sum;
  for (int i = 0; i < n; ++i) sum.add(t[i]);
  return sum.value();
}

// Round-to-nearest-even of x into f where the result is a normal finite number of f
// (the common case, kept off the general path for speed): keep the top fraction bits
// of |hi|; the dropped bits decide, and at an exact half the residual lo (its sign
// only: |lo| is below half an ulp of double) or else evenness. Returns false where
// the general rounding is needed (tiny, overflow, NaN, infinity).
bool round_nearest_even_normal(const Format& f, const Exact& x, double& out, bool& inexact) {
  const double magnitude = std::fabs(x.hi);
  const bool negative = std::signbit(x.hi);
  const double away = negative ? -x.lo : x.lo;  // > 0: the exact value lies beyond |hi|
  if (!(magnitude >= f.min_normal() && magnitude <= f.max_finite())) return false;
  if (magnitude == f.min_normal() && away < 0) return false;  // tiny: UFLO rules apply
  const int dropped = 52 - f.fraction_bits();
  if (dropped < 1) return false;
  const auto bits = std::bit_cast<std::uint64_t>(magnitude);
  const std::uint64_t half = std::uint64_t{1} << (dropped - 1);
  const std::uint64_t rest = bits & ((half << 1) - 1);
  std::uint64_t kept = bits >> dropped;
  if (rest > half || (rest == half && (away > 0 || (away == 0 && (kept & 1))))) ++kept;
  const double rounded = std::bit_cast<double>(kept << dropped);
  if (rounded > f.max_finite()) return false;
  inexact = rest != 0 || x.lo != 0;
  out = negative ? -rounded : rounded;
  return true;
}

// Truncates t toward zero to a multiple of 2^quantum.
double truncate_to(double t, int quantum) { return std::ldexp(std::trunc(std::ldexp(t, -quantum)), quantum); }

// floor(log2 |t|) of the largest non-zero term; INT_MIN if all are zero.
int largest_exponent(const double* t, int n) {
  int e = INT_MIN;
  for (int i = 0; i < n; ++i)
    if (t[i] != 0 && std::isfinite(t[i])) e = std::max(e, std::ilogb(t[i]));
  return e;
}

// One AMP dot product under one context: the phases, the passes between them, and
// the roundings with their flags.
class AmpRun {
 public:
  AmpRun(Context& ctx, const AmpConfig& cfg)
      : ctx_(ctx), cfg_(cfg), accumulator_(fp32()),
        defer_inexact_(((ctx.control.counted | ctx.control.traps) & INEXACT) == 0) {}

  Context& context() const { return ctx_; }

  double dot(std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb, double c) {
    const std::size_t per_pass = static_cast<std::size_t>(cfg_.products_per_pass());
    double partial = c;
    if (k == 0) partial = round_into(cfg_.output, Exact{c}, c, 0);
    for (std::size_t start = 0; start < k; start += per_pass) {
      const std::size_t len = std::min(per_pass, k - start);
      const bool last = start + len == k;
      partial = pass(partial, len, a + start * sa, sa, b + start * sb, sb, last ? cfg_.output : cfg_.partials);
    }
    flush_inexact();
    return partial;
  }

  // One phase when cfg.round_each_phase: `count` products added to the running value
  // and rounded into fp32, then into the partials format.
  double phase(double running, std::size_t count, const double* a, std::size_t sa, const double* b,
               std::size_t sb) {
    Terms terms;
    terms.t[0] = running;
    terms.n = 1;
    add_products(terms, count, a, sa, b, sb);
    resolve_specials(terms);
    if (!terms.special) align(terms, 0, 0.0);
    running = settle(terms, accumulator_, running);
    if (cfg_.partials.precision() < accumulator_.precision())
      running = round_into(cfg_.partials, Exact{running}, running, 0);
    return running;
  }

  // The rounding of the running value into a pass's output format at the pass's end.
  double end_pass(double running, const Format& out) { return round_into(out, Exact{running}, running, 0); }

  // For callers that computed correctly rounded results themselves: INEXACT, raised with
  // the next flush.
  void note_inexact() { inexact_pending_ = true; }

  void flush_inexact() {
    if (!inexact_pending_) return;
    inexact_pending_ = false;
    ctx_.raise_flags(INEXACT, "amp", {});
  }

 private:
  // A phase's terms: slot 0 the running value, then the products.
  struct Terms {
    std::array<double, kMaxProductsPerPass + 1> t;
    int n = 0;
    Flags raised = 0;   // INV from inf * 0 or inf - inf
    bool special = false;  // a NaN or infinite term: the IEEE result is in `value`
    double value = 0;
  };

  // Products of one phase (exact: fp16 x fp16 and fp32 x fp32 fit in a double).
  void add_products(Terms& terms, std::size_t count, const double* a, std::size_t sa, const double* b,
                    std::size_t sb) const {
    for (std::size_t i = 0; i < count; ++i) {
      const double x = a[i * sa], y = b[i * sb];
      const double p = x * y;
      if (std::isnan(p) && !std::isnan(x) && !std::isnan(y)) terms.raised |= INV;  // inf * 0
      terms.t[static_cast<std::size_t>(terms.n++)] = p;
    }
  }

  // IEEE 754 results for terms with NaN or infinity: NaN propagates (no flag); +inf and
  // -inf together are invalid.
  static void resolve_specials(Terms& terms) {
    bool nan = false, plus = false, minus = false;
    for (int i = 0; i < terms.n; ++i) {
      const double v = terms.t[static_cast<std::size_t>(i)];
      nan |= std::isnan(v);
      plus |= v == kInf;
      minus |= v == -kInf;
    }
    if (!nan && !plus && !minus) return;
    terms.special = true;
    if (plus && minus && !nan) terms.raised |= INV;
    terms.value = (nan || (plus && minus)) ? kNaN : (plus ? kInf : -kInf);
  }

  // Alignment truncation of terms [from, n): against the largest of them and of the
  // carried running value (`carried`, 0 when the running value is among the terms).
  void align(Terms& terms, int from, double carried) const {
    if (cfg_.alignment_bits == AmpConfig::kExactPhase) return;
    int e = largest_exponent(terms.t.data() + from, terms.n - from);
    if (carried != 0 && std::isfinite(carried)) e = std::max(e, std::ilogb(carried));
    if (e == INT_MIN) return;
    const int quantum = e - cfg_.alignment_bits;
    for (int i = from; i < terms.n; ++i) {
      double& v = terms.t[static_cast<std::size_t>(i)];
      if (v != 0) v = truncate_to(v, quantum);
    }
  }

  // The exact sum of the terms; an exact zero keeps -0 only when every term is -0.
  static Exact sum(const Terms& terms) {
    // Most phases add up exactly in double: then every TwoSum error (Knuth) is zero.
    double running = terms.t[0];
    bool exact_in_double = true;
    for (int i = 1; i < terms.n; ++i) {
      const double term = terms.t[static_cast<std::size_t>(i)];
      const double s = running + term;
      const double back = s - running;
      exact_in_double &= ((running - (s - back)) + (term - back)) == 0;
      running = s;
    }
    if (exact_in_double && running != 0) return {running};
    const Exact x = exact_sum_of(terms.t.data(), terms.n);
    if (x.hi != 0 || x.lo != 0) return x;
    bool all_negative_zero = terms.n > 0;
    for (int i = 0; i < terms.n; ++i) all_negative_zero &= std::signbit(terms.t[static_cast<std::size_t>(i)]);
    return {all_negative_zero ? -0.0 : 0.0};
  }

  // Rounds into f: fp32 with the accumulator's rounding, narrower formats under the
  // context (RNE, or SR when esr is set). RNE results in f's normal range take the fast
  // path, whose only flag, INEXACT, is collected and raised in one go before the next
  // general rounding and at the end of the dot product (the element's), unless the
  // context counts or traps INEXACT: then every rounding raises its own, with its
  // operand and result.
  double round_into(const Format& f, const Exact& x, double operand, Flags raised) {
    const bool accumulator_width = f.precision() >= accumulator_.precision();
    const Rounding mode = accumulator_width && cfg_.accumulator_rounding ? *cfg_.accumulator_rounding
                                                                        : ctx_.control.effective_rounding();
    double result = 0;
    bool inexact = false;
    if (raised == 0 && mode == Rounding::rne && defer_inexact_ && round_nearest_even_normal(f, x, result, inexact)) {
      inexact_pending_ |= inexact;
      return result;
    }
    flush_inexact();
    return ctx_.round_with(mode, f, x, "amp", {operand}, raised);
  }

  double settle(const Terms& terms, const Format& f, double operand) {
    if (terms.special) return round_into(f, Exact{terms.value}, operand, terms.raised);
    return round_into(f, sum(terms), operand, terms.raised);
  }

  double pass(double partial, std::size_t len, const double* a, std::size_t sa, const double* b, std::size_t sb,
              const Format& out) {
    const std::size_t per_phase = static_cast<std::size_t>(cfg_.products_per_phase);
    if (cfg_.round_each_phase) {
      double running = partial;
      for (std::size_t start = 0; start < len; start += per_phase)
        running = phase(running, std::min(per_phase, len - start), a + start * sa, sa, b + start * sb, sb);
      return end_pass(running, out);  // f16v4sihoamp's fp16 output
    }
    // Exact through the pass: collect every (aligned) term, round once at the end.
    Terms terms;
    terms.t[0] = partial;
    terms.n = 1;
    for (std::size_t start = 0; start < len; start += per_phase) {
      const int first_product = terms.n;
      add_products(terms, std::min(per_phase, len - start), a + start * sa, sa, b + start * sb, sb);
      resolve_specials(terms);
      if (terms.special) break;
      if (cfg_.alignment_bits != AmpConfig::kExactPhase) {
        // The carried value is not truncated (it is the adder's own register), except
        // the input partial entering the first phase.
        const bool first_phase = first_product == 1;
        const double carried = first_phase ? 0.0 : exact_sum_of(terms.t.data(), first_product).hi;
        align(terms, first_phase ? 0 : first_product, carried);
      }
    }
    return settle(terms, out, partial);
  }

  Context& ctx_;
  const AmpConfig& cfg_;
  const Format& accumulator_;  // the fp32 the running value is rounded into
  const bool defer_inexact_;
  bool inexact_pending_ = false;
};

// ---- The fast GEMM path -------------------------------------------------------------
//
// For the default configurations (fp16 inputs, exact phases of four products rounded
// into fp32 with RNE after every phase, fp32 or fp16 partials rounded with RNE, no
// traps) gemm runs a tile of output channels at once in vectors of doubles (AVX2, or
// AVX-512 where the CPU has it: kernel_body), and proves each phase exact instead of
// summing it exactly:
//  1. fp16 x fp16 products are exact in double (at most 22 significant bits).
//  2. If every term of a phase (the running value c and the products) is a multiple of
//     2^L and their magnitudes add up to M <= 2^(L+53), every partial sum, in any
//     order, is a multiple of 2^L below 2^(L+53) in magnitude, hence a double: the
//     double sum is exact. Sufficient conditions, from bounds packed with the operands:
//     the products' L >= LA + LB, the lowest set bits among the row's and the column's
//     four values (each clamped to at most 37, which also bounds an all-zero group), so
//     with T = 2^(LA+LB+52) and P = max |a_q| * sum |b_q| >= sum |a_q b_q|:
//     (a) P <= T/2, checked for a whole tile of columns from the largest
//         sum |b| / 2^LB among them (else column by column);
//     (b) |c| <= T/2 with the tile's smallest LB: so M <= T (up to the rounding of the
//         check, far below the factor 2 to 2^(L+53)), and |sum| < 2^127: no overflow;
//     (c) c == 0, or |c| >= cmin = P' 2^-27 (1 + 2^-40) + 2^-100 with P' the tile's
//         largest P: then M < |c| 2^28 <= 2^(lsb(c)+52), as lsb(c) >= exponent(c) - 23
//         for an fp32 (or fp16) c; and L >= -124, so a non-zero sum is not tiny in fp32.
//  3. The exact double converted to fp32 by the hardware under round-to-nearest
//     (checked once per call, with no flushing of subnormals) is the model's RNE
//     rounding, INEXACT iff the value changed; fp16 likewise (F16C, RNE given in the
//     instruction), after checking that the fp32 value is zero or a normal fp16 one.
//  4. A lane that fails a check redoes that phase through AmpRun, the exact model,
//     which raises its own flags, with the lane's element (row, column) set first.
//     Without traps flags are a set, so results and flags are those of AmpRun;
//     tests/amp/test_amp_fast.cpp compares the two.
//  5. Counting (FpControl::counted): the kernel visits the elements tile by tile and
//     phase by phase, not in gemm's row-major order, so the lanes it hands to AmpRun
//     raise their flags out of order. With counting on, AmpRun runs on a scratch
//     context; after each lane's call its counts are folded into ElementOrderCounts
//     (each element once per (scope, op, flag), the least element first) and at the
//     end added to the caller's context in the order of their first elements: the
//     counts the row-major exact path records. INEXACT and UFLO cannot be counted
//     this way (the kernel raises INEXACT once per call, without an element): counting
//     either of them takes the exact path; OFLO, DIV0 and INV only ever come from the
//     exact model, so counting them keeps the vectorised path.
//  6. A phase whose four values of A are zeros (padded input channels, zero padding,
//     the zeros a dilated gradient holds) adds four zero products: for a running value
//     that is finite, non-zero and a value of the partials format, R + (+-0) = R exactly
//     and its roundings leave it, so the kernel skips the phase. (A zero R could change
//     sign; a NaN would come back as the model's canonical NaN: those lanes compute.)
//  7. Most phases need none of step 2's checks lane by lane: bounds on the whole tile
//     (one row, its 32 columns) prove them, tracked in scalars from phase to phase
//     (TileProof). The running values are multiples of a quantum Q: at the start of a
//     kernel call the fp32 ulp of the least non-zero |c| (every lane holds an fp32 value;
//     Q = 0, proving nothing, where that is subnormal); after a phase min(Q, 2^(LA+LB)),
//     as a multiple of 2^L stays one when rounded to fp32 or fp16 (a value whose ulp
//     is below 2^L has at most 24 significant bits above 2^L: it is exact). And every
//     |c| is at most Cmax: at the start the largest |c| (infinite where one is NaN or
//     infinite), after a phase M (1 + 2^-20), or (1 + 2^-9) with fp16 partials, with
//     M = (Cmax + P) (1 + 2^-40) >= |c| + sum |a_q b_q| (P with the tile's largest
//     sum |b|). With q = min(Q, 2^(LA+LB)) >= 2^-126 and M <= q 2^52, every partial sum
//     is a multiple of q below 2^(53) q, so the double sum is exact, a non-zero one is
//     not tiny in fp32, and M <= 2^126 rules out overflow: the lanes skip the checks of
//     step 2 (those of step 3 on fp16 values stay). Where the bounds do not hold, the
//     phase checks lane by lane as before; the tracking goes on either way, as every
//     value the kernel keeps is the rounding of an exact sum. Rows go first through
//     proven_rows_body, two at a time on AVX-512 (sharing the panel's loads, with twice
//     the independent chains of latency), as far as every phase of the chunk is proven,
//     then through kernel_body one by one. detail::select_amp_proof turns this off (the
//     reference that tests/amp/test_amp_fast.cpp compares with).
// B is packed once per gemm (PackedColumns: its panels and bounds), and the bands of
// rows that MatrixUnit::gemm's threads take, and amp_conv2d's images, read it.
// Builds without AVX2, FMA and F16C take the exact path.
namespace fast {

// The element that gemm element (i, j) stands for in the caller's operation (amp_conv2d:
// [n, o, y, x]), as counts name it; empty: (i, j) itself.
using ElementNames = std::function<Element(std::size_t i, std::size_t j)>;

#if EMU_SIMD

using simd::every_lane;
using simd::host_rounds_to_nearest;
using simd::magnitude;
using simd::fp16_values;
using simd::to_fp16;

// A tile of 32 output channels: the per-phase work on a row (its bounds and broadcasts)
// is shared by that many lanes (16: about 1.25x slower on AVX-512, 1.1x on AVX2).
constexpr std::size_t kLanes = 4;  // of the AVX2 code outside the kernel
constexpr std::size_t kVectors = 8;
constexpr std::size_t kTile = kLanes * kVectors;  // output channels per tile
constexpr std::size_t kPhase = 4;                 // products per phase (the kernel's only shape)
constexpr std::size_t kPanelRows = kPhase + 2;    // a phase's B rows, then sum |b| and 2^(LB+26)
constexpr std::size_t kChunkPhases = 16;          // phases per chunk: 24 KiB of panel
constexpr int kMaxLowestBit = 37;                 // also the bound of an all-zero group
constexpr double kFloatMax = 0x1.fffffep127;

// Zero, or normal and finite in the format whose limits are given.
__m128 normal_or_zero(__m128 x, float min_normal, float max_finite) {
  const __m128 m = _mm_andnot_ps(_mm_set1_ps(-0.0f), x);
  const __m128 in_range = _mm_and_ps(_mm_cmp_ps(m, _mm_set1_ps(min_normal), _CMP_GE_OQ),
                                     _mm_cmp_ps(m, _mm_set1_ps(max_finite), _CMP_LE_OQ));
  return _mm_or_ps(in_range, _mm_cmp_ps(x, _mm_setzero_ps(), _CMP_EQ_OQ));
}

bool is_fp32_value_or_special(double x) { return !std::isfinite(x) || static_cast<double>(static_cast<float>(x)) == x; }

// 2^(lowest set bit of x + 26) for non-zero x; for zero 2^(kMaxLowestBit + 26), which
// also clamps the result. The lowest set bit's value is |x| minus |x| with that bit
// cleared (bits & (bits - 1), exact), or |x| itself when the fraction field is zero.
__m256d lowest_bit_bounds(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(magnitude(x));
  const __m256d cleared = _mm256_castsi256_pd(_mm256_and_si256(bits, _mm256_sub_epi64(bits, _mm256_set1_epi64x(1))));
  const __m256i fraction = _mm256_and_si256(bits, _mm256_set1_epi64x((std::int64_t{1} << 52) - 1));
  const __m256d power = _mm256_castsi256_pd(_mm256_cmpeq_epi64(fraction, _mm256_setzero_si256()));
  const __m256d lowest = _mm256_blendv_pd(_mm256_sub_pd(magnitude(x), cleared), magnitude(x), power);
  const __m256d sentinel = _mm256_set1_pd(std::ldexp(1.0, kMaxLowestBit));
  const __m256d zero = _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_EQ_OQ);
  return _mm256_mul_pd(_mm256_min_pd(_mm256_blendv_pd(lowest, sentinel, zero), sentinel), _mm256_set1_pd(0x1p26));
}

double min_lane(__m256d x) {
  const __m128d pair = _mm_min_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return std::min(_mm_cvtsd_f64(pair), _mm_cvtsd_f64(_mm_unpackhi_pd(pair, pair)));
}
double max_lane(__m256d x) {
  const __m128d pair = _mm_max_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return std::max(_mm_cvtsd_f64(pair), _mm_cvtsd_f64(_mm_unpackhi_pd(pair, pair)));
}

// One phase of a row of A: its four values (a short last phase padded with -0, whose
// products -0 leave every sum, signed zeros included, as it is), max |a| and the bound.
struct RowPhase {
  double a[kPhase];
  double max_abs;
  double bound;  // 2^(LA+26)
};

// The bounds of one phase over a tile of columns.
struct TilePhase {
  double min_bound;      // min 2^(LB+26)
  double max_sum;        // max sum |b|
  double max_sum_ratio;  // max sum |b| / 2^(LB+26)
};

// The counts of lanes that ran through the exact model, gathered per (scope, op, flag)
// and added to the caller's context in element order (step 5 above).
class ElementOrderCounts {
 public:
  explicit ElementOrderCounts(std::size_t elements) : elements_(elements) {}

  // Takes the counts of one lane's call (one element) from the scratch context.
  void fold(Context& scratch) {
    for (const OpCount& c : scratch.counts()) {
      auto same = [&](const Entry& e) { return e.first.flag == c.flag && e.first.op == c.op && e.first.scope == c.scope; };
      auto it = std::find_if(entries_.begin(), entries_.end(), same);
      if (it == entries_.end()) {
        entries_.push_back(Entry{c, sequence_++, 0, std::vector<bool>(elements_, false)});
        it = entries_.end() - 1;
      } else if (c.first_element.flat < it->first.first_element.flat) {
        it->first = c;
        it->order = sequence_++;
      }
      const auto flat = static_cast<std::size_t>(c.first_element.flat);
      if (!it->seen[flat]) {
        it->seen[flat] = true;
        ++it->elements;
      }
    }
    scratch.clear_counts();
  }

  // Adds the counts to ctx in the order of their least elements; `names` (for a gemm of
  // n columns) renames each count's first element.
  void commit(Context& ctx, const ElementNames& names, std::size_t n) {
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      if (a.first.first_element.flat != b.first.first_element.flat)
        return a.first.first_element.flat < b.first.first_element.flat;
      return a.order < b.order;  // one element's flags in the order it raised them
    });
    for (Entry& e : entries_) {
      e.first.count = e.elements;
      if (names) {
        const auto flat = static_cast<std::size_t>(e.first.first_element.flat);
        e.first.first_element = names(flat / n, flat % n);
      }
      ctx.add_count(e.first);
    }
    entries_.clear();
  }

 private:
  struct Entry {
    OpCount first;         // the least element's count, as its lane raised it
    std::uint64_t order;   // when `first` was taken
    std::uint64_t elements;
    std::vector<bool> seen;  // per element of the gemm
  };
  std::size_t elements_;
  std::vector<Entry> entries_;
  std::uint64_t sequence_ = 0;
};

// The control of the scratch context that counting lanes run on: the caller's, with
// its scope.
Context scratch_context(const Context& ctx) {
  Context scratch(ctx.control);
  if (!ctx.scope().empty()) scratch.push_scope(ctx.scope());
  return scratch;
}

// ---- The kernel: one body for two instruction sets, over a traits type Isa (Avx2Kernel
// and Avx512Kernel below: Vec, kLanes doubles; Mask, the lanes' results of a
// comparison; Single, kLanes floats; the operations). As in emu/convert.cpp, gcc
// compiles the body for the instruction set of the function it is inlined into, so
// everything here is always_inline and each Isa's run, defined with its operations, is
// the function the body is compiled into.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Where one row's phases over one tile are read and the failed phase's results written.
struct KernelPhases {
  const RowPhase* row;           // the row's phase p
  const TilePhase* tile_bounds;  // the tile's bounds, indexed by phase
  const double* panel;           // the tile's panel of phase p
  double* failed_next;
  double* failed_fine;
  bool prove;  // step 7 (else every phase checks lane by lane)
};

// Whether a phase whose four a values are zeros leaves every lane as it is (step 6).
template <class Isa, bool kHalfPartials, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline bool zero_phase_keeps(const Vec* running) {
  constexpr std::size_t kVectors = kTile / Isa::kLanes;
  auto keeps = Isa::all_set();
  for (std::size_t v = 0; v < kVectors; ++v) {
    const Vec m = Isa::magnitude(running[v]);
    keeps = Isa::both(keeps, Isa::both(Isa::greater(m, Isa::zero()), Isa::at_most(m, Isa::set1(kFloatMax))));
    if constexpr (kHalfPartials) keeps = Isa::both(keeps, Isa::fp16_values(running[v]));
  }
  return Isa::all(keeps);
}

// A phase's checks over a tile (the comment above, steps 2 and 3), as the kernel's
// vectors need them.
template <class Isa>
struct PhaseChecks {
  typename Isa::Vec a0, a1, a2, a3;
  bool products_fit;              // (a) for the whole tile
  typename Isa::Bounds c_bounds;  // (b) and (c): c_max and c_min
  typename Isa::Vec max_abs, half_bound;  // (a) column by column where products_fit is false
};

// Which of step 2's checks a phase makes lane by lane (a branch per phase, not per
// vector): none where the tile's bounds prove them (step 7), those on c where
// checks.products_fit, else those on the products too.
enum class LaneChecks { none, partial, partial_and_products };

// The phase on one vector of lanes (running values c, the panel's columns at col):
// returns the next running values in `result` and `keep` narrowed to the lanes whose
// checks pass. Where every lane of every vector passes, the masks that each vector
// starts from are all-ones, so INEXACT is seen where `keep` admits it.
template <class Isa, bool kHalfPartials, bool kTrackInexact, LaneChecks kChecks, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline typename Isa::Mask phase_vector(const PhaseChecks<Isa>& checks, const double* col,
                                                              const Vec& c, typename Isa::Mask keep, Vec& result,
                                                              typename Isa::Mask& inexact) {
  Vec products = Isa::mul(checks.a0, Isa::load(col));
  products = Isa::fmadd(checks.a1, Isa::load(col + kTile), products);
  products = Isa::fmadd(checks.a2, Isa::load(col + 2 * kTile), products);
  products = Isa::fmadd(checks.a3, Isa::load(col + 3 * kTile), products);
  const Vec sum = Isa::add(c, products);
  if constexpr (kChecks != LaneChecks::none) keep = Isa::exact_sum_where(keep, c, checks.c_bounds);
  if constexpr (kChecks == LaneChecks::partial_and_products) {
    const Vec products_bound = Isa::mul(checks.max_abs, Isa::load(col + kPhase * kTile));
    keep = Isa::at_most_where(keep, products_bound, Isa::mul(checks.half_bound, Isa::load(col + (kPhase + 1) * kTile)));
  }
  const typename Isa::Single single = Isa::to_single(sum);
  result = Isa::widen(single);
  if constexpr (kTrackInexact) inexact = Isa::either(inexact, Isa::both(keep, Isa::differ(result, sum)));
  if constexpr (kHalfPartials) {
    keep = Isa::normal_or_zero_fp16_where(keep, single);
    result = Isa::widen(Isa::to_fp16(single));
    if constexpr (kTrackInexact) inexact = Isa::either(inexact, Isa::both(keep, Isa::differ(result, sum)));
  }
  return keep;
}

// Step 7's bounds on one row's running values over a tile, from phase to phase.
struct TileProof {
  double quantum = 0;  // Q: every running value is a multiple of it (0: unknown)
  double c_max = kInf;  // Cmax: no running value is larger in magnitude (inf: unknown)

  // Whether the tile's bounds prove the phase (row phase r, tile bounds t) exact for
  // every lane, so that no lane needs step 2's checks; and the bounds after the phase,
  // whichever way its lanes are checked.
  template <bool kHalfPartials>
  bool next(const RowPhase& r, const TilePhase& t) {
    quantum = std::min(quantum, r.bound * t.min_bound * 0x1p-52);  // 2^(LA+LB)
    const double magnitudes = (c_max + r.max_abs * t.max_sum) * (1 + 0x1p-40);
    c_max = magnitudes * (kHalfPartials ? 1 + 0x1p-9 : 1 + 0x1p-20);
    return quantum >= 0x1p-126 && magnitudes <= quantum * 0x1p52 && magnitudes <= 0x1p126;
  }
};

// Step 7's bounds on the running values as a kernel call finds them.
template <class Isa, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline TileProof tile_proof(const Vec* running) {
  constexpr std::size_t kVectors = kTile / Isa::kLanes;
  Vec largest = Isa::zero(), least = Isa::set1(kInf);
  auto finite = Isa::all_set();
  for (std::size_t v = 0; v < kVectors; ++v) {
    const Vec m = Isa::magnitude(running[v]);
    finite = Isa::both(finite, Isa::at_most(m, Isa::set1(0x1p126)));  // NaN fails
    largest = Isa::max(largest, m);
    least = Isa::min(least, Isa::nonzero_or_inf(m));
  }
  // The fp32 ulp of the least non-zero |c|, 2^(exponent - 23): inf where every lane is
  // zero, 0 where it is below fp32's normal range.
  const double smallest = Isa::min_lane(least);
  const double power = std::bit_cast<double>(std::bit_cast<std::uint64_t>(smallest) & 0x7FF0000000000000);
  return {smallest >= 0x1p-126 ? power * 0x1p-23 : 0.0, Isa::all(finite) ? Isa::max_lane(largest) : kInf};
}

// The phase on every vector with the lane checks kChecks. Without kEach: one mask
// through them all (a lane that fails anywhere fails the phase). With kEach (after a
// failure): each vector's own checks and INEXACT, for the lanes that passed them, stored
// with the vector's results for the repair.
template <class Isa, bool kHalfPartials, bool kTrackInexact, LaneChecks kChecks, bool kEach,
          class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline typename Isa::Mask phase_vectors(const PhaseChecks<Isa>& checks, const double* panel,
                                                               const Vec* running, Vec* next,
                                                               typename Isa::Mask& inexact,
                                                               const KernelPhases& phases) {
  constexpr std::size_t kLanes = Isa::kLanes, kVectors = kTile / kLanes;
  auto all_fine = Isa::all_set();
  for (std::size_t v = 0; v < kVectors; ++v) {
    const auto fine = phase_vector<Isa, kHalfPartials, kTrackInexact, kChecks>(
        checks, panel + v * kLanes, running[v], kEach ? Isa::all_set() : all_fine, next[v], inexact);
    if constexpr (kEach) {
      Isa::store(phases.failed_next + v * kLanes, next[v]);
      Isa::store_mask(phases.failed_fine + v * kLanes, fine);
    } else {
      all_fine = fine;
    }
  }
  return all_fine;
}

// phase_vectors with the lane checks chosen at run time.
template <class Isa, bool kHalfPartials, bool kTrackInexact, bool kEach, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline typename Isa::Mask checked_phase(LaneChecks lane_checks, const PhaseChecks<Isa>& checks,
                                                               const double* panel, const Vec* running, Vec* next,
                                                               typename Isa::Mask& inexact,
                                                               const KernelPhases& phases) {
  switch (lane_checks) {
    case LaneChecks::none:
      return phase_vectors<Isa, kHalfPartials, kTrackInexact, LaneChecks::none, kEach>(checks, panel, running, next,
                                                                                      inexact, phases);
    case LaneChecks::partial:
      return phase_vectors<Isa, kHalfPartials, kTrackInexact, LaneChecks::partial, kEach>(checks, panel, running,
                                                                                         next, inexact, phases);
    default:
      return phase_vectors<Isa, kHalfPartials, kTrackInexact, LaneChecks::partial_and_products, kEach>(
          checks, panel, running, next, inexact, phases);
  }
}

// Phases [p, end) (within one chunk) of one row over one tile, without calls so that
// the running values stay in registers. Returns `end`, or the first phase where a lane
// failed a check, with `lanes` as before that phase and the phase's kernel results in
// failed_next and failed_fine (all-ones lanes: fine). Sets `inexact` where a result
// that passed the checks was rounded.
template <class Isa, bool kHalfPartials, bool kTrackInexact, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline std::size_t kernel_body(const KernelPhases& phases, std::size_t p, std::size_t end,
                                                      double* lanes, bool& any_inexact) {
  using Mask = typename Isa::Mask;
  constexpr std::size_t kLanes = Isa::kLanes, kVectors = kTile / kLanes;
  const RowPhase* row = phases.row;  // phases p .. end lie in one chunk: consecutive
  const double* panel = phases.panel;
  Mask inexact = Isa::none();
  Vec running[kVectors];
  for (std::size_t v = 0; v < kVectors; ++v) running[v] = Isa::load(lanes + v * kLanes);
  TileProof proof;
  if (phases.prove) proof = tile_proof<Isa>(running);
  for (; p < end; ++p, ++row, panel += kPanelRows * kTile) {
    const RowPhase& r = *row;
    if (r.max_abs == 0 && zero_phase_keeps<Isa, kHalfPartials>(running)) continue;  // step 6 above
    const TilePhase& t = phases.tile_bounds[p];
    // Conditions (a) to (c) of the comment above, (b) and (c) as bounds on |c|.
    const PhaseChecks<Isa> checks{
        Isa::set1(r.a[0]), Isa::set1(r.a[1]), Isa::set1(r.a[2]), Isa::set1(r.a[3]),
        r.max_abs * t.max_sum_ratio <= 0.5 * r.bound,
        Isa::bounds(0.5 * r.bound * t.min_bound, std::fma(r.max_abs * t.max_sum, 0x1.0000000001p-27, 0x1p-100)),
        Isa::set1(r.max_abs), Isa::set1(0.5 * r.bound)};
    const bool proven = proof.next<kHalfPartials>(r, t);  // never without phases.prove: quantum 0
    const LaneChecks lane_checks = proven                ? LaneChecks::none
                                   : checks.products_fit ? LaneChecks::partial
                                                         : LaneChecks::partial_and_products;
    Vec next[kVectors];
    if (!Isa::all(checked_phase<Isa, kHalfPartials, kTrackInexact, false>(lane_checks, checks, panel, running, next,
                                                                          inexact, phases))) {
      checked_phase<Isa, kHalfPartials, kTrackInexact, true>(lane_checks, checks, panel, running, next, inexact,
                                                             phases);
      break;
    }
    for (std::size_t v = 0; v < kVectors; ++v) running[v] = next[v];
  }
  for (std::size_t v = 0; v < kVectors; ++v) Isa::store(lanes + v * kLanes, running[v]);
  if (kTrackInexact && Isa::any(inexact)) any_inexact = true;
  return p;
}

// Phases [p, end) (within one chunk) of kRows consecutive rows over one tile, as long
// as step 7 proves every phase for every row (and, with fp16 partials, every fp32
// value is zero or normal in fp16): the lanes need no checks, the rows share the
// panel's loads, and their vectors' independent chains of latency fill the pipeline.
// Returns `end`, or the first phase it did not take (lanes as before it), from which
// kernel_body goes on row by row. Sets `inexact` where a result was rounded.
template <class Isa, bool kHalfPartials, bool kTrackInexact, std::size_t kRows, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline std::size_t proven_rows_body(const RowPhase* const* rows, const TilePhase* tile_bounds,
                                                           const double* panel, std::size_t p, std::size_t end,
                                                           double* const* lanes, bool& any_inexact) {
  using Mask = typename Isa::Mask;
  constexpr std::size_t kLanes = Isa::kLanes, kVectors = kTile / kLanes;
  Mask inexact = Isa::none();
  Vec running[kRows][kVectors];
  TileProof proof[kRows];
  for (std::size_t r = 0; r < kRows; ++r) {
    for (std::size_t v = 0; v < kVectors; ++v) running[r][v] = Isa::load(lanes[r] + v * kLanes);
    proof[r] = tile_proof<Isa>(running[r]);
  }
  for (std::size_t phase = 0; p < end; ++p, ++phase, panel += kPanelRows * kTile) {
    bool zeros = true;  // step 6, where it holds for every row (padded input channels)
    for (std::size_t r = 0; r < kRows; ++r)
      zeros = zeros && rows[r][phase].max_abs == 0 && zero_phase_keeps<Isa, kHalfPartials>(running[r]);
    if (zeros) continue;
    bool proven = true;
    for (std::size_t r = 0; r < kRows; ++r) proven &= proof[r].template next<kHalfPartials>(rows[r][phase], tile_bounds[p]);
    if (!proven) break;
    // With fp16 partials a phase can fail its checks after some vectors: the values
    // before it are kept (in memory, not in registers) to go back to.
    alignas(64) double before[kHalfPartials ? kRows : 0][kTile];
    Mask fine = Isa::all_set(), rounded = Isa::none();
    for (std::size_t v = 0; v < kVectors; ++v) {
      Vec b[kPhase];
      for (std::size_t q = 0; q < kPhase; ++q) b[q] = Isa::load(panel + q * kTile + v * kLanes);
      for (std::size_t r = 0; r < kRows; ++r) {
        const RowPhase& row = rows[r][phase];
        // c first: every partial sum is exact, in any order (step 7)
        Vec sum = running[r][v];
        for (std::size_t q = 0; q < kPhase; ++q) sum = Isa::fmadd(Isa::set1(row.a[q]), b[q], sum);
        const typename Isa::Single single = Isa::to_single(sum);
        if constexpr (kHalfPartials) {
          Isa::store(before[r] + v * kLanes, running[r][v]);
          fine = Isa::normal_or_zero_fp16_where(fine, single);
          running[r][v] = Isa::widen(Isa::to_fp16(single));
        } else {
          running[r][v] = Isa::widen(single);
        }
        if constexpr (kTrackInexact) rounded = Isa::either(rounded, Isa::differ(running[r][v], sum));
      }
    }
    if constexpr (kHalfPartials) {
      if (!Isa::all(fine)) {
        for (std::size_t r = 0; r < kRows; ++r)
          for (std::size_t v = 0; v < kVectors; ++v) running[r][v] = Isa::load(before[r] + v * kLanes);
        break;
      }
    }
    inexact = Isa::either(inexact, rounded);
  }
  for (std::size_t r = 0; r < kRows; ++r)
    for (std::size_t v = 0; v < kVectors; ++v) Isa::store(lanes[r] + v * kLanes, running[r][v]);
  if (kTrackInexact && Isa::any(inexact)) any_inexact = true;
  return p;
}

// The kernel's instruction set on four lanes: masks are vectors of all-ones or zero
// lanes.
struct Avx2Kernel {
  using Vec = __m256d;
  using Mask = __m256d;
  using Single = __m128;
  static constexpr std::size_t kLanes = 4;
  static constexpr std::size_t kRows = 1;  // rows of proven_rows_body: two would not fit the 16 registers

  static Vec load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, Vec v) { _mm256_storeu_pd(p, v); }
  static void store_mask(double* p, Mask m) { _mm256_storeu_pd(p, m); }
  static Vec set1(double x) { return _mm256_set1_pd(x); }
  static Vec zero() { return _mm256_setzero_pd(); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_pd(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_pd(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_pd(a, b); }
  static Vec magnitude(Vec x) { return simd::magnitude(x); }
  static Vec max(Vec a, Vec b) { return _mm256_max_pd(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_pd(a, b); }
  static double max_lane(Vec x) { return fast::max_lane(x); }
  static double min_lane(Vec x) { return fast::min_lane(x); }
  static Vec nonzero_or_inf(Vec x) { return _mm256_blendv_pd(x, set1(kInf), equal(x, zero())); }

  static Mask at_least(Vec a, Vec b) { return _mm256_cmp_pd(a, b, _CMP_GE_OQ); }
  static Mask at_most(Vec a, Vec b) { return _mm256_cmp_pd(a, b, _CMP_LE_OQ); }
  static Mask greater(Vec a, Vec b) { return _mm256_cmp_pd(a, b, _CMP_GT_OQ); }
  static Mask equal(Vec a, Vec b) { return _mm256_cmp_pd(a, b, _CMP_EQ_OQ); }
  static Mask differ(Vec a, Vec b) { return _mm256_cmp_pd(a, b, _CMP_NEQ_UQ); }
  static Mask both(Mask a, Mask b) { return _mm256_and_pd(a, b); }
  static Mask either(Mask a, Mask b) { return _mm256_or_pd(a, b); }
  static Mask all_set() { return _mm256_castsi256_pd(_mm256_set1_epi64x(-1)); }
  static Mask none() { return _mm256_setzero_pd(); }
  static bool all(Mask m) { return simd::every_lane(m); }
  static bool any(Mask m) { return _mm256_movemask_pd(m) != 0; }

  // The hardware's roundings to fp32 (MXCSR: round to nearest, checked) and fp16 (RNE in
  // the instruction), and back (exact).
  static Single to_single(Vec x) { return _mm256_cvtpd_ps(x); }
  static Vec widen(Single x) { return _mm256_cvtps_pd(x); }
  static Single to_fp16(Single x) { return simd::to_fp16(x); }
  static Mask normal_or_zero_fp16(Single x) {
    return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(normal_or_zero(x, 0x1p-14f, 65504.0f))));
  }
  static Mask fp16_values(Vec x) { return simd::fp16_values(x); }

  // The checks, each narrowing a mask `keep`.
  struct Bounds {
    Vec c_max, c_min;
  };
  static Bounds bounds(double c_max, double c_min) { return {set1(c_max), set1(c_min)}; }
  // c == 0, or c_min <= |c| <= c_max.
  static Mask exact_sum_where(Mask keep, Vec c, const Bounds& b) {
    const Vec m = magnitude(c);
    return both(keep, either(both(at_least(m, b.c_min), at_most(m, b.c_max)), equal(c, zero())));
  }
  static Mask at_most_where(Mask keep, Vec a, Vec b) { return both(keep, at_most(a, b)); }
  static Mask normal_or_zero_fp16_where(Mask keep, Single x) { return both(keep, normal_or_zero_fp16(x)); }

  template <bool kHalfPartials, bool kTrackInexact>
  static std::size_t run(const KernelPhases& phases, std::size_t p, std::size_t end, double* lanes, bool& inexact) {
    return kernel_body<Avx2Kernel, kHalfPartials, kTrackInexact>(phases, p, end, lanes, inexact);
  }
  template <bool kHalfPartials, bool kTrackInexact>
  static std::size_t run_rows(const RowPhase* const* rows, const TilePhase* tile_bounds, const double* panel,
                              std::size_t p, std::size_t end, double* const* lanes, bool& inexact) {
    return proven_rows_body<Avx2Kernel, kHalfPartials, kTrackInexact, kRows>(rows, tile_bounds, panel, p, end, lanes,
                                                                              inexact);
  }
};

// ---- AVX-512 (F, DQ, VL), compiled for it here (the build asks only for AVX2) and
// chosen at run time: eight lanes, comparisons into mask registers. gcc's AVX-512
// headers trip -W(maybe-)uninitialized under a target pragma: silenced here only.
#if EMU_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct Avx512Kernel {
  using Vec = __m512d;
  using Mask = __mmask8;
  using Single = __m256;
  static constexpr std::size_t kLanes = 8;
  static constexpr std::size_t kRows = 2;  // rows of proven_rows_body

  static Vec load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, Vec v) { _mm512_storeu_pd(p, v); }
  static void store_mask(double* p, Mask m) { _mm512_storeu_pd(p, _mm512_castsi512_pd(_mm512_movm_epi64(m))); }
  static Vec set1(double x) { return _mm512_set1_pd(x); }
  static Vec zero() { return _mm512_setzero_pd(); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_pd(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_pd(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_pd(a, b); }
  static Vec magnitude(Vec x) { return _mm512_abs_pd(x); }
  static Vec max(Vec a, Vec b) { return _mm512_max_pd(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_pd(a, b); }
  static double max_lane(Vec x) { return _mm512_reduce_max_pd(x); }
  static double min_lane(Vec x) { return _mm512_reduce_min_pd(x); }
  static Vec nonzero_or_inf(Vec x) { return _mm512_mask_blend_pd(equal(x, zero()), x, set1(kInf)); }

  static Mask at_least(Vec a, Vec b) { return _mm512_cmp_pd_mask(a, b, _CMP_GE_OQ); }
  static Mask at_most(Vec a, Vec b) { return _mm512_cmp_pd_mask(a, b, _CMP_LE_OQ); }
  static Mask greater(Vec a, Vec b) { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
  static Mask equal(Vec a, Vec b) { return _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ); }
  static Mask differ(Vec a, Vec b) { return _mm512_cmp_pd_mask(a, b, _CMP_NEQ_UQ); }
  static Mask both(Mask a, Mask b) { return static_cast<Mask>(a & b); }
  static Mask either(Mask a, Mask b) { return static_cast<Mask>(a | b); }
  static Mask all_set() { return 0xFF; }
  static Mask none() { return 0; }
  static bool all(Mask m) { return m == 0xFF; }
  static bool any(Mask m) { return m != 0; }

  static Single to_single(Vec x) { return _mm512_cvtpd_ps(x); }
  static Vec widen(Single x) { return _mm512_cvtps_pd(x); }
  static Single to_fp16(Single x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }
  // The checks as comparisons masked by `keep` (no mask arithmetic). On the patterns of
  // magnitudes, ordered as the values: c == 0 or c_min <= |c| <= c_max is
  // |c| - 1 >= c_min - 1 (unsigned: 0 - 1 is the largest) and |c| <= c_max; NaN fails.
  struct Bounds {
    __m512i c_max, c_min_less_one;
  };
  static Bounds bounds(double c_max, double c_min) {
    return {_mm512_set1_epi64(std::bit_cast<std::int64_t>(c_max)), _mm512_set1_epi64(std::bit_cast<std::int64_t>(c_min) - 1)};
  }
  static Mask exact_sum_where(Mask keep, Vec c, const Bounds& b) {
    const __m512i m = _mm512_castpd_si512(magnitude(c));
    keep = _mm512_mask_cmp_epu64_mask(keep, _mm512_sub_epi64(m, _mm512_set1_epi64(1)), b.c_min_less_one, _MM_CMPINT_NLT);
    return _mm512_mask_cmp_epu64_mask(keep, m, b.c_max, _MM_CMPINT_LE);
  }
  static Mask at_most_where(Mask keep, Vec a, Vec b) { return _mm512_mask_cmp_pd_mask(keep, a, b, _CMP_LE_OQ); }
  // Zero, or normal and finite in fp16, as exact_sum_where on 32-bit patterns.
  static Mask normal_or_zero_fp16_where(Mask keep, Single x) {
    const __m256i m = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF));
    keep = _mm256_mask_cmp_epu32_mask(keep, _mm256_sub_epi32(m, _mm256_set1_epi32(1)),
                                      _mm256_set1_epi32(std::bit_cast<std::int32_t>(0x1p-14f) - 1), _MM_CMPINT_NLT);
    return _mm256_mask_cmp_epu32_mask(keep, m, _mm256_set1_epi32(std::bit_cast<std::int32_t>(65504.0f)), _MM_CMPINT_LE);
  }
  // Finite fp16 values (simd::fp16_values on eight lanes).
  static Mask fp16_values(Vec x) {
    const Vec back = widen(to_fp16(to_single(x)));
    return static_cast<Mask>(equal(back, x) & at_most(magnitude(x), set1(65504.0)));
  }

  template <bool kHalfPartials, bool kTrackInexact>
  static std::size_t run(const KernelPhases& phases, std::size_t p, std::size_t end, double* lanes, bool& inexact) {
    return kernel_body<Avx512Kernel, kHalfPartials, kTrackInexact>(phases, p, end, lanes, inexact);
  }
  template <bool kHalfPartials, bool kTrackInexact>
  static std::size_t run_rows(const RowPhase* const* rows, const TilePhase* tile_bounds, const double* panel,
                              std::size_t p, std::size_t end, double* const* lanes, bool& inexact) {
    return proven_rows_body<Avx512Kernel, kHalfPartials, kTrackInexact, kRows>(rows, tile_bounds, panel, p, end,
                                                                                lanes, inexact);
  }
};
#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
using Avx512Kernel = Avx2Kernel;  // never chosen: cpu_has_avx512_kernel() is false where EMU_AVX512 is 0 (simd.hpp)
#endif
#pragma GCC diagnostic pop  // -Wpsabi

// The kernel detail::select_amp_kernel chose: -1 for the fastest.
std::atomic<int> selected_kernel{-1};

bool cpu_has_avx512_kernel() {
  static const bool has = EMU_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

bool use_avx512_kernel() { return selected_kernel.load(std::memory_order_relaxed) != 0 && cpu_has_avx512_kernel(); }

// Whether the kernel proves phases for whole tiles (step 7): detail::select_amp_proof.
std::atomic<bool> proof_selected{true};
bool use_proof() { return proof_selected.load(std::memory_order_relaxed); }

// B packed for the kernel (once per gemm, however many bands of rows read it).
class PackedColumns {
 public:
  // Per tile of kTile columns and per phase: the phase's rows of B (zero-padded), then
  // per column sum |b| (exact: fp16 values within 2^-24 .. 2^16) and the bound, and
  // the bounds over the tile (padding columns, all zero, change none of them).
  bool pack(const double* B, std::size_t ldb, std::size_t n, std::size_t k) {
    n_ = n;
    k_ = k;
    phases_ = (k + kPhase - 1) / kPhase;
    tiles_ = (n + kTile - 1) / kTile;
    panels_.assign(tiles_ * phases_ * kPanelRows * kTile, 0.0);
    tile_bounds_.resize(tiles_ * phases_);
    __m256d valid = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    for (std::size_t tile = 0; tile < tiles_; ++tile)
      for (std::size_t p = 0; p < phases_; ++p) {
        double* panel = panels_.data() + (tile * phases_ + p) * kPanelRows * kTile;
        const std::size_t first_column = tile * kTile, width = std::min(kTile, n_ - first_column);
        for (std::size_t q = 0; q < std::min(kPhase, k_ - p * kPhase); ++q) {
          const double* b = B + (p * kPhase + q) * ldb + first_column;
          if (width == kTile) {  // a short fixed-size copy, which std::copy would not unroll
            for (std::size_t v = 0; v < kVectors; ++v)
              _mm256_storeu_pd(panel + q * kTile + v * kLanes, _mm256_loadu_pd(b + v * kLanes));
          } else {
            std::copy(b, b + width, panel + q * kTile);
          }
        }
        __m256d min_bound = _mm256_set1_pd(std::numeric_limits<double>::infinity());
        __m256d max_sum = _mm256_setzero_pd(), max_sum_ratio = _mm256_setzero_pd();
        for (std::size_t v = 0; v < kVectors; ++v) {
          __m256d sum = _mm256_setzero_pd();
          __m256d bound = _mm256_set1_pd(std::numeric_limits<double>::infinity());
          for (std::size_t q = 0; q < kPhase; ++q) {
            const __m256d b = _mm256_loadu_pd(panel + q * kTile + v * kLanes);
            valid = _mm256_and_pd(valid, fp16_values(b));
            sum = _mm256_add_pd(sum, magnitude(b));
            bound = _mm256_min_pd(bound, lowest_bit_bounds(b));
          }
          _mm256_storeu_pd(panel + kPhase * kTile + v * kLanes, sum);
          _mm256_storeu_pd(panel + (kPhase + 1) * kTile + v * kLanes, bound);
          min_bound = _mm256_min_pd(min_bound, bound);
          max_sum = _mm256_max_pd(max_sum, sum);
          max_sum_ratio = _mm256_max_pd(max_sum_ratio, _mm256_div_pd(sum, bound));  // exact: bound is 2^e
        }
        tile_bounds_[tile * phases_ + p] = {min_lane(min_bound), max_lane(max_sum), max_lane(max_sum_ratio)};
      }
    return every_lane(valid);
  }


  std::size_t n() const { return n_; }
  std::size_t k() const { return k_; }
  std::size_t phases() const { return phases_; }
  std::size_t tiles() const { return tiles_; }
  // The tile's panel of phase p, and the tile's bounds indexed by phase.
  const double* panel(std::size_t tile, std::size_t p) const {
    return panels_.data() + (tile * phases_ + p) * kPanelRows * kTile;
  }
  const TilePhase* tile_bounds(std::size_t tile) const { return tile_bounds_.data() + tile * phases_; }

 private:
  std::size_t n_ = 0, k_ = 0, phases_ = 0, tiles_ = 0;
  std::vector<double> panels_;
  std::vector<TilePhase> tile_bounds_;
};

class Gemm {
 public:
  // B's values are those packed in `columns`.
  Gemm(Context& ctx, const AmpConfig& cfg, std::size_t m, const PackedColumns& columns, ElementNames names = {})
      : cfg_(cfg), ctx_(ctx), names_(std::move(names)),
        scratch_(ctx.control.counted != 0 ? std::optional<Context>(scratch_context(ctx)) : std::nullopt),
        counts_(ctx.control.counted != 0 ? m * columns.n() : 0), run_(scratch_ ? *scratch_ : ctx, cfg),
        columns_(columns), m_(m), n_(columns.n()), k_(columns.k()), phases_(columns.phases()), tiles_(columns.tiles()),
        chunk_(static_cast<std::size_t>(cfg.phases_per_pass) *
               ((kChunkPhases + static_cast<std::size_t>(cfg.phases_per_pass) - 1) /
                static_cast<std::size_t>(cfg.phases_per_pass))) {}

  // False, with nothing done, where an operand is not what the kernel takes (A's values
  // not fp16 values, a finite partial that is not an fp32 value). B (for the lanes that
  // the exact model computes) holds the values packed.
  bool run(const double* A, std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) {
    for (std::size_t i = 0; i < m_; ++i)
      for (std::size_t j = 0; j < n_; ++j)
        if (!is_fp32_value_or_special(C[i * ldc + j])) return false;
    if (!pack_rows(A, lda)) return false;
    // Tiles of columns, each over chunks of whole passes, each chunk over all rows: the
    // chunk's panel stays in the L1 cache, the rows' values stream in order.
    std::vector<Channels> channels(m_);
    for (std::size_t tile = 0; tile < tiles_; ++tile) {
      const std::size_t first_column = tile * kTile, width = std::min(kTile, n_ - first_column);
      for (std::size_t i = 0; i < m_; ++i) {
        channels[i] = Channels{};
        std::copy(C + i * ldc + first_column, C + i * ldc + first_column + width, channels[i].running);
      }
      for (std::size_t start = 0; start < phases_; start += chunk_) {
        // Rows in groups through proven_rows as far as it goes, then row by row.
        const std::size_t end = std::min(phases_, start + chunk_), rows = proven_rows();
        std::size_t i = 0;
        for (; rows != 0 && i + rows <= m_; i += rows) {
          const std::size_t from = proven_phases(tile, i, start, end, channels);
          for (std::size_t r = i; r < i + rows; ++r) advance(tile, r, from, end, channels[r].running, A, lda, B, ldb);
        }
        for (; i < m_; ++i) advance(tile, i, start, end, channels[i].running, A, lda, B, ldb);
      }
      for (std::size_t i = 0; i < m_; ++i)
        std::copy(channels[i].running, channels[i].running + width, C + i * ldc + first_column);
    }
    if (inexact_) run_.note_inexact();
    run_.flush_inexact();
    if (scratch_) {  // the scratch's flags and counts into the caller's context
      counts_.commit(ctx_, names_, n_);
      if (const Flags rest = scratch_->status() & ~ctx_.control.counted) ctx_.raise_flags(rest, "amp", {});
    }
    return true;
  }

 private:
  std::size_t phase_length(std::size_t phase) const { return std::min(kPhase, k_ - phase * kPhase); }

  // Chunk by chunk, row by row: the order in which the kernel reads them.
  RowPhase& row_phase(std::size_t i, std::size_t p) { return rows_[((p / chunk_) * m_ + i) * chunk_ + p % chunk_]; }

  // False where a value is not a finite fp16 value.
  bool pack_rows(const double* A, std::size_t lda) {
    rows_.resize(m_ * ((phases_ + chunk_ - 1) / chunk_) * chunk_);
    __m256d valid = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    for (std::size_t i = 0; i < m_; ++i)
      for (std::size_t p = 0; p < phases_; ++p) {
        RowPhase& r = row_phase(i, p);
        for (std::size_t q = 0; q < kPhase; ++q) r.a[q] = q < phase_length(p) ? A[i * lda + p * kPhase + q] : -0.0;
        const __m256d a = _mm256_loadu_pd(r.a);
        valid = _mm256_and_pd(valid, fp16_values(a));
        r.max_abs = max_lane(magnitude(a));
        r.bound = min_lane(lowest_bit_bounds(a));
      }
    return every_lane(valid);
  }

  // The running values of one row over one tile of columns.
  struct Channels {
    alignas(32) double running[kTile];
  };

  std::size_t pass_end(std::size_t phase) const {
    const auto per_pass = static_cast<std::size_t>(cfg_.phases_per_pass);
    return std::min(phases_, (phase / per_pass + 1) * per_pass);
  }

  // Phases [begin, end) (whole passes) of row i over one tile: the kernel, the exact
  // model for the lanes that fail a check, the passes' ends.
  void advance(std::size_t tile, std::size_t i, std::size_t begin, std::size_t end, double* running,
               const double* A, std::size_t lda, const double* B, std::size_t ldb) {
    const std::size_t first_column = tile * kTile, width = std::min(kTile, n_ - first_column);
    const bool half = is_fp16(cfg_.partials);
    // Values from the kernel are zero or normal in the partials format, for which a
    // pass's final rounding is the identity: it is needed only after a repair, and at
    // the end for an output format other than the partials'.
    bool repaired = false, output_rounded = false;
    for (std::size_t p = begin; p < end;) {
      const std::size_t stop = repaired ? pass_end(p) : end;
      // Once INEXACT is known, the kernel stops looking for it.
      p = half ? (inexact_ ? kernel<true, false>(tile, i, p, stop, running) : kernel<true, true>(tile, i, p, stop, running))
               : (inexact_ ? kernel<false, false>(tile, i, p, stop, running) : kernel<false, true>(tile, i, p, stop, running));
      if (p < stop) {
        repair(p, i, first_column, width, running, A, lda, B, ldb);
        repaired = true;
        ++p;
      }
      if (repaired && p == pass_end(p - 1)) {
        output_rounded = p == phases_;
        end_pass(running, i, first_column, width, output_rounded ? cfg_.output : cfg_.partials);
        repaired = false;
      }
    }
    if (end == phases_ && !output_rounded && !same_layout(cfg_.output, cfg_.partials))
      end_pass(running, i, first_column, width, cfg_.output);
  }

  // Runs one lane's call of the exact model as element (i, j), and collects its counts.
  template <typename Call>
  double exact_lane(std::size_t i, std::size_t j, Call call) {
    Context& ctx = run_.context();
    double result;
    {
      const ElementGuard element(ctx, static_cast<std::int64_t>(i * n_ + j),
                                 {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
      result = call();
    }
    if (scratch_ && !scratch_->counts().empty()) counts_.fold(*scratch_);
    return result;
  }

  // Phases [p, end) (within one chunk) of row i over one tile through kernel_body, on
  // AVX-512 where the CPU has it. Returns `end`, or the first phase where a lane failed
  // a check, with `lanes` as before that phase and the phase's kernel results in
  // failed_next_ and failed_fine_.
  template <bool kHalfPartials, bool kTrackInexact>
  std::size_t kernel(std::size_t tile, std::size_t i, std::size_t p, std::size_t end, double* lanes) {
    const KernelPhases phases{&row_phase(i, p), columns_.tile_bounds(tile), columns_.panel(tile, p), failed_next_,
                              failed_fine_, use_proof()};
    bool inexact = false;
    p = use_avx512_kernel() ? Avx512Kernel::run<kHalfPartials, kTrackInexact>(phases, p, end, lanes, inexact)
                            : Avx2Kernel::run<kHalfPartials, kTrackInexact>(phases, p, end, lanes, inexact);
    if (inexact) inexact_ = true;
    return p;
  }

  // Rows that proven_phases takes at once; 0 where step 7 is off.
  static std::size_t proven_rows() {
    if (!use_proof()) return 0;
    return use_avx512_kernel() ? Avx512Kernel::kRows : Avx2Kernel::kRows;
  }

  // Phases [p, end) (within one chunk) of rows i .. i + proven_rows() over one tile
  // through proven_rows_body, as far as step 7 proves them. Returns the first phase not
  // taken.
  std::size_t proven_phases(std::size_t tile, std::size_t i, std::size_t p, std::size_t end,
                            std::vector<Channels>& channels) {
    const bool half = is_fp16(cfg_.partials);
    return half ? (inexact_ ? proven_phases<true, false>(tile, i, p, end, channels)
                            : proven_phases<true, true>(tile, i, p, end, channels))
                : (inexact_ ? proven_phases<false, false>(tile, i, p, end, channels)
                            : proven_phases<false, true>(tile, i, p, end, channels));
  }
  template <bool kHalfPartials, bool kTrackInexact>
  std::size_t proven_phases(std::size_t tile, std::size_t i, std::size_t p, std::size_t end,
                            std::vector<Channels>& channels) {
    const RowPhase* rows[Avx512Kernel::kRows];
    double* lanes[Avx512Kernel::kRows];
    for (std::size_t r = 0; r < proven_rows(); ++r) {
      rows[r] = &row_phase(i + r, p);
      lanes[r] = channels[i + r].running;
    }
    const TilePhase* bounds = columns_.tile_bounds(tile);
    const double* panel = columns_.panel(tile, p);
    bool inexact = false;
    p = use_avx512_kernel()
            ? Avx512Kernel::run_rows<kHalfPartials, kTrackInexact>(rows, bounds, panel, p, end, lanes, inexact)
            : Avx2Kernel::run_rows<kHalfPartials, kTrackInexact>(rows, bounds, panel, p, end, lanes, inexact);
    if (inexact) inexact_ = true;
    return p;
  }

  // The lanes of phase p that failed a check, through the exact model; the others
  // take the kernel's results.
  void repair(std::size_t p, std::size_t i, std::size_t first_column, std::size_t width, double* running,
              const double* A, std::size_t lda, const double* B, std::size_t ldb) {
    const std::size_t start = p * kPhase;
    for (std::size_t l = 0; l < width; ++l)
      running[l] = std::bit_cast<std::uint64_t>(failed_fine_[l]) != 0
                       ? failed_next_[l]
                       : exact_lane(i, first_column + l, [&] {
                           return run_.phase(running[l], phase_length(p), A + i * lda + start, 1,
                                             B + start * ldb + first_column + l, ldb);
                         });
  }

  // The rounding into the pass's output format: the identity on values of the partials
  // format that are zero or normal, fp32 to fp16 for an f16v4sihoamp last pass, the
  // exact model for the rest.
  void end_pass(double* values, std::size_t i, std::size_t first_column, std::size_t width, const Format& out) {
    const bool to_half = is_fp16(out) && !is_fp16(cfg_.partials);
    const auto min_normal = static_cast<float>(out.min_normal()), max_finite = static_cast<float>(out.max_finite());
    for (std::size_t start = 0; start < width; start += kLanes) {
      const __m128 single = _mm256_cvtpd_ps(_mm256_load_pd(values + start));  // exact: fp32 values
      const int fine = _mm_movemask_ps(normal_or_zero(single, min_normal, max_finite));
      alignas(16) float half[kLanes];
      _mm_store_ps(half, to_fp16(single));
      for (std::size_t l = start; l < std::min(width, start + kLanes); ++l) {
        if ((fine >> (l - start) & 1) == 0) {
          values[l] = exact_lane(i, first_column + l, [&] { return run_.end_pass(values[l], out); });
        } else if (to_half) {
          inexact_ |= half[l - start] != values[l];
          values[l] = half[l - start];
        }
      }
    }
  }

  const AmpConfig& cfg_;
  Context& ctx_;
  ElementNames names_;
  std::optional<Context> scratch_;  // where AmpRun runs when the caller counts (step 5)
  ElementOrderCounts counts_;
  AmpRun run_;
  const PackedColumns& columns_;
  std::size_t m_, n_, k_, phases_, tiles_;
  std::size_t chunk_;  // phases per chunk: whole passes, at least kChunkPhases
  // A's packed rows, in a buffer kept per thread: a training step runs thousands of
  // gemms of the same shapes, and fresh allocations of megabytes cost page faults.
  static std::vector<RowPhase>& row_buffer() {
    static thread_local std::vector<RowPhase> rows;
    return rows;
  }
  std::vector<RowPhase>& rows_ = row_buffer();
  bool inexact_ = false;
  // The kernel's results and checks (zero: failed) for the phase it stopped at.
  alignas(32) double failed_next_[kTile];
  alignas(32) double failed_fine_[kTile];
};

bool applies(const Context& ctx, const AmpConfig& cfg) {
  const Rounding context_rounding = ctx.control.effective_rounding();
  const bool narrow = is_fp16(cfg.partials) || is_fp16(cfg.output);
  return is_fp16(cfg.input) && cfg.alignment_bits == AmpConfig::kExactPhase && cfg.round_each_phase &&
         cfg.products_per_phase == static_cast<int>(kPhase) &&
         cfg.accumulator_rounding.value_or(context_rounding) == Rounding::rne &&
         (!narrow || context_rounding == Rounding::rne) && ctx.control.traps == 0 &&
         (ctx.control.counted & (INEXACT | UFLO)) == 0 && host_rounds_to_nearest();
}

// Packed columns kept per thread (fresh allocations of megabytes cost page faults), for
// the calls of one thread in turn; `slot` tells apart those that are in use at once.
enum class ColumnsSlot { gemm, conv };
PackedColumns& columns_buffer(ColumnsSlot slot) {
  static thread_local PackedColumns buffers[2];
  return buffers[static_cast<int>(slot)];
}

// Packs B (k x n) into `columns` where the fast path applies; false, with nothing
// packed, where it does not (or B holds a value that is not a finite fp16 value).
bool pack_columns(const Context& ctx, const AmpConfig& cfg, std::size_t n, std::size_t k, const double* B,
                  std::size_t ldb, PackedColumns& columns) {
  return n != 0 && k != 0 && applies(ctx, cfg) && columns.pack(B, ldb, n, k);
}

// C = A B + C through the fast path, B (as packed in `columns`) shared by other calls;
// false, with nothing done, where it does not apply.
bool gemm_packed(Context& ctx, const AmpConfig& cfg, std::size_t m, const PackedColumns& columns, const double* A,
                 std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc,
                 ElementNames names = {}) {
  if (m == 0 || !applies(ctx, cfg)) return false;
  return Gemm(ctx, cfg, m, columns, std::move(names)).run(A, lda, B, ldb, C, ldc);
}
bool select_proof(bool whole_tiles) {
  proof_selected.store(whole_tiles, std::memory_order_relaxed);
  return true;
}
bool select_kernel(int implementation) {
  if (implementation != 0 && implementation != 1) return false;
  if (implementation == 1 && !cpu_has_avx512_kernel()) return false;
  selected_kernel.store(implementation, std::memory_order_relaxed);
  return true;
}
#else
struct PackedColumns {};
enum class ColumnsSlot { gemm, conv };
PackedColumns& columns_buffer(ColumnsSlot) {
  static thread_local PackedColumns none;
  return none;
}
bool select_kernel(int) { return false; }
bool select_proof(bool) { return false; }
bool applies(const Context&, const AmpConfig&) { return false; }
bool pack_columns(const Context&, const AmpConfig&, std::size_t, std::size_t, const double*, std::size_t,
                  PackedColumns&) {
  return false;
}
bool gemm_packed(Context&, const AmpConfig&, std::size_t, const PackedColumns&, const double*, std::size_t,
                 const double*, std::size_t, double*, std::size_t, ElementNames = {}) {
  return false;
}
#endif

}  // namespace fast

class AmpUnit final : public MatrixUnit {
 public:
  explicit AmpUnit(AmpConfig cfg) : cfg_(std::move(cfg)) {}
  UnitKind kind() const override {
    return is_fp16(cfg_.partials) ? UnitKind::ipu_amp_half : UnitKind::ipu_amp;
  }
  const Format& input_format() const override { return cfg_.input; }
  const Format& output_format() const override { return cfg_.output; }
  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb,
             double c) const override {
    return AmpRun(ctx, cfg_).dot(k, a, sa, b, sb, c);
  }
  // MatrixUnit::gemm's bands of rows, where the vectorised path applies with B packed
  // once for all of them.
  void gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
            const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    fast::PackedColumns& columns = fast::columns_buffer(fast::ColumnsSlot::gemm);
    if (!fast::pack_columns(ctx, cfg_, n, k, B, ldb, columns)) {
      MatrixUnit::gemm(ctx, m, n, k, A, lda, B, ldb, C, ldc);
      return;
    }
    gemm_by_rows(ctx, m, n, k, C, ldc, [&](Context& band_ctx, std::size_t first, std::size_t rows) {
      if (!fast::gemm_packed(band_ctx, cfg_, rows, columns, A + first * lda, lda, B, ldb, C + first * ldc, ldc))
        exact_gemm(band_ctx, rows, n, k, A + first * lda, lda, B, ldb, C + first * ldc, ldc);
    });
  }

  // The vectorised path where it applies (see namespace fast), else exact_gemm.
  void serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                   const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    fast::PackedColumns& columns = fast::columns_buffer(fast::ColumnsSlot::gemm);
    if (fast::pack_columns(ctx, cfg_, n, k, B, ldb, columns) &&
        fast::gemm_packed(ctx, cfg_, m, columns, A, lda, B, ldb, C, ldc))
      return;
    exact_gemm(ctx, m, n, k, A, lda, B, ldb, C, ldc);
  }

 private:
  // The same dot products in the same order as the default serial_gemm (so stochastic
  // rounding draws the same random bits), with B transposed once so that every dot
  // product reads contiguous memory.
  void exact_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                  const double* B, std::size_t ldb, double* C, std::size_t ldc) const {
    std::vector<double> columns(n * k);
    for (std::size_t q = 0; q < k; ++q)
      for (std::size_t j = 0; j < n; ++j) columns[j * k + q] = B[q * ldb + j];
    AmpRun run(ctx, cfg_);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const ElementGuard element(ctx, static_cast<std::int64_t>(i * n + j),
                                   {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
        C[i * ldc + j] = run.dot(k, A + i * lda, 1, columns.data() + j * k, 1, C[i * ldc + j]);
      }
  }

  AmpConfig cfg_;
};

[[noreturn]] void reject(const std::string& what) { throw std::invalid_argument("AMP config: " + what); }

}  // namespace

namespace {

constexpr Named<PartialsType> kPartialsTypes[] = {
    {PartialsType::half, "half", "fp16 partials"},
    {PartialsType::float32, "float", "fp32 partials"},
};
static_assert(in_enum_order(kPartialsTypes));

}  // namespace

NameTable<PartialsType> partials_type_table() { return kPartialsTypes; }
const char* partials_type_name(PartialsType p) { return kPartialsTypes[static_cast<int>(p)].name; }
PartialsType partials_type_by_name(std::string_view name) {
  return value_by_name(partials_type_table(), name, "partials type");
}

void validate(const AmpConfig& cfg) {
  if (!is_fp16(cfg.input) && !is_fp32(cfg.input))
    reject("input format " + cfg.input.name() + " (the AMP takes fp16 or fp32)");
  if (!is_fp16(cfg.partials) && !is_fp32(cfg.partials))
    reject("partials format " + cfg.partials.name() + " (partialsType is half or float)");
  if (!is_fp16(cfg.output) && !is_fp32(cfg.output))
    reject("output format " + cfg.output.name() + " (the AMP writes fp16 or fp32)");
  if (is_fp32(cfg.input) && !(is_fp32(cfg.partials) && is_fp32(cfg.output)))
    reject("fp32 inputs need fp32 partials and output (f32sisoamp is fp32 throughout)");
  if (is_fp16(cfg.partials) && !is_fp16(cfg.output))
    reject("fp16 partials give an fp16 output (f16v4hihoamp)");
  if (cfg.products_per_phase < 1 || cfg.phases_per_pass < 1 || cfg.products_per_pass() > kMaxProductsPerPass)
    reject("products_per_phase and phases_per_pass must be >= 1 with at most " +
           std::to_string(kMaxProductsPerPass) + " products per pass");
  if (cfg.alignment_bits < AmpConfig::kExactPhase || cfg.alignment_bits > 200)
    reject("alignment_bits must be -1 (exact) or 0..200");
}

AmpConfig amp_config(PartialsType partials, const Format& in, std::optional<Format> out) {
  AmpConfig cfg;
  cfg.input = in;
  cfg.partials = partials == PartialsType::half ? fp16() : fp32();
  cfg.output = out.value_or(cfg.partials);
  if (is_fp32(in)) {  // f32sisoamp: one fp32 input per phase, 8 phases per pass
    cfg.products_per_phase = 1;
    cfg.phases_per_pass = 8;
  }
  validate(cfg);
  return cfg;
}

double amp_dot(Context& ctx, const AmpConfig& cfg, std::size_t k, const double* a, std::size_t sa, const double* b,
               std::size_t sb, double c) {
  return AmpRun(ctx, cfg).dot(k, a, sa, b, sb, c);
}

bool amp_gemm_is_vectorised(const Context& ctx, const AmpConfig& cfg) { return fast::applies(ctx, cfg); }

namespace detail {
bool select_amp_kernel(int implementation) { return fast::select_kernel(implementation); }
bool select_amp_proof(bool whole_tiles) { return fast::select_proof(whole_tiles); }
}  // namespace detail

std::size_t Conv2dShape::out_height() const {
  const std::size_t padded = height + 2 * pad_h;
  return stride_h == 0 || padded < kernel_height ? 0 : (padded - kernel_height) / stride_h + 1;
}

std::size_t Conv2dShape::out_width() const {
  const std::size_t padded = width + 2 * pad_w;
  return stride_w == 0 || padded < kernel_width ? 0 : (padded - kernel_width) / stride_w + 1;
}

std::vector<double> amp_conv2d(Context& ctx, const AmpConfig& cfg, const Conv2dShape& shape,
                               std::span<const double> input, std::span<const double> weights,
                               std::span<const double> partials_in) {
  validate(cfg);
  const Conv2dShape& s = shape;
  auto refuse = [](const std::string& what) { throw std::invalid_argument("amp_conv2d: " + what); };
  if (s.batch == 0 || s.in_channels == 0 || s.height == 0 || s.width == 0 || s.out_channels == 0 ||
      s.kernel_height == 0 || s.kernel_width == 0)
    refuse("every dimension must be >= 1");
  if (s.stride_h == 0 || s.stride_w == 0) refuse("strides must be >= 1");
  if (s.height + 2 * s.pad_h < s.kernel_height || s.width + 2 * s.pad_w < s.kernel_width)
    refuse("the kernel is larger than the padded input");
  if (input.size() != s.input_size()) refuse("input needs N*C*H*W = " + std::to_string(s.input_size()) + " values");
  if (weights.size() != s.weights_size())
    refuse("weights need O*C*KH*KW = " + std::to_string(s.weights_size()) + " values");
  if (!partials_in.empty() && partials_in.size() != s.output_size())
    refuse("partials_in needs N*O*OH*OW = " + std::to_string(s.output_size()) + " values (or none)");

  const std::size_t per_pass = static_cast<std::size_t>(cfg.products_per_pass());
  const std::size_t groups = (s.in_channels + per_pass - 1) / per_pass;
  const std::size_t kernel = s.kernel_height * s.kernel_width;
  const std::size_t k = groups * kernel * per_pass;  // the reduction length, padded channels included
  const std::size_t oh = s.out_height(), ow = s.out_width();
  // Position r of the reduction for channel c at kernel position (ky, kx).
  auto position = [&](std::size_t c, std::size_t ky, std::size_t kx) {
    return ((c / per_pass * s.kernel_height + ky) * s.kernel_width + kx) * per_pass + c % per_pass;
  };
  // The weights of every output channel in reduction order (zeros for padded channels).
  std::vector<double> w(s.out_channels * k, 0.0);
  for (std::size_t o = 0; o < s.out_channels; ++o)
    for (std::size_t c = 0; c < s.in_channels; ++c)
      for (std::size_t ky = 0; ky < s.kernel_height; ++ky)
        for (std::size_t kx = 0; kx < s.kernel_width; ++kx)
          w[o * k + position(c, ky, kx)] =
              weights[((o * s.in_channels + c) * s.kernel_height + ky) * s.kernel_width + kx];

  // Image by image, the convolution is the AMP gemm of the im2col problem: row q = y ow
  // + x holds the input values in the order r, zeros in the padding and the padded
  // channels; column o the weights w[o] (w_columns, k x O, packed once for every image);
  // C the partials. Its row-major order is y, x, then o: that of the outputs computed one
  // by one, image after image.
  const std::size_t positions = oh * ow, channels = s.out_channels, per_image = channels * positions;
  std::vector<double> w_columns(k * channels);
  for (std::size_t o = 0; o < channels; ++o)
    for (std::size_t r = 0; r < k; ++r) w_columns[r * channels + o] = w[o * k + r];
  fast::PackedColumns& packed = fast::columns_buffer(fast::ColumnsSlot::conv);
  const bool vectorised = fast::pack_columns(ctx, cfg, channels, k, w_columns.data(), channels, packed);
  std::vector<double> out(s.output_size());

  // Images [first, first + count) under band_ctx, into out: each through the vectorised
  // path (its counts renamed to the convolution's elements), or where it does not take
  // the image's values, and everywhere without it, output by output through amp_dot.
  // Elements are numbered within the band (image n - first), as gemm_by_rows expects.
  auto band = [&](Context& band_ctx, std::size_t first, std::size_t count) {
    // Image n is laid out as rows x columns x channels with its zero padding and padded
    // channels (`padded`, for `padded_image`), so that each (group, ky, kx) of a reduction
    // row is one contiguous copy. Temporaries in buffers kept per thread (a training step
    // convolves image after image).
    static thread_local std::vector<double> padded, patches, c;
    const std::size_t padded_rows = s.height + 2 * s.pad_h, padded_cols = s.width + 2 * s.pad_w;
    const std::size_t padded_channels = groups * per_pass;
    padded.resize(padded_rows * padded_cols * padded_channels);
    std::size_t padded_image = s.batch;  // none yet
    auto fill_patch = [&](std::size_t n, std::size_t y, std::size_t x, double* patch) {
      if (padded_image != n) {
        std::fill(padded.begin(), padded.end(), 0.0);
        for (std::size_t c = 0; c < s.in_channels; ++c)
          for (std::size_t row = 0; row < s.height; ++row)
            for (std::size_t col = 0; col < s.width; ++col)
              padded[((row + s.pad_h) * padded_cols + col + s.pad_w) * padded_channels + c] =
                  input[((n * s.in_channels + c) * s.height + row) * s.width + col];
        padded_image = n;
      }
      for (std::size_t g = 0; g < groups; ++g)
        for (std::size_t ky = 0; ky < s.kernel_height; ++ky)
          for (std::size_t kx = 0; kx < s.kernel_width; ++kx) {
            const double* from = padded.data() +
                                 ((y * s.stride_h + ky) * padded_cols + x * s.stride_w + kx) * padded_channels +
                                 g * per_pass;
            std::copy(from, from + per_pass, patch + ((g * s.kernel_height + ky) * s.kernel_width + kx) * per_pass);
          }
    };
    auto element = [&](std::size_t n, std::size_t o, std::size_t y, std::size_t x) {
      Element e;
      e.flat = static_cast<std::int64_t>((((n - first) * channels + o) * oh + y) * ow + x);
      e.rank = 4;
      e.index = {static_cast<std::int64_t>(n - first), static_cast<std::int64_t>(o), static_cast<std::int64_t>(y),
                 static_cast<std::int64_t>(x)};
      return e;
    };
    auto partial = [&](std::size_t at) { return partials_in.empty() ? 0.0 : partials_in[at]; };
    AmpRun run(band_ctx, cfg);
    auto by_dot = [&](std::size_t n) {
      patches.resize(k);
      for (std::size_t y = 0; y < oh; ++y)
        for (std::size_t x = 0; x < ow; ++x) {
          fill_patch(n, y, x, patches.data());
          for (std::size_t o = 0; o < channels; ++o) {
            const Element e = element(n, o, y, x);
            const auto at = n * per_image + o * positions + y * ow + x;
            const ElementGuard guard(band_ctx, e.flat, {e.index[0], e.index[1], e.index[2], e.index[3]});
            out[at] = run.dot(k, patches.data(), 1, w.data() + o * k, 1, partial(at));
          }
        }
    };
    for (std::size_t n = first; n < first + count; ++n) {
      if (!vectorised) {
        by_dot(n);
        continue;
      }
      patches.resize(positions * k);
      c.resize(positions * channels);
      for (std::size_t q = 0; q < positions; ++q) {
        fill_patch(n, q / ow, q % ow, patches.data() + q * k);
        for (std::size_t o = 0; o < channels; ++o) c[q * channels + o] = partial(n * per_image + o * positions + q);
      }
      const auto names = [&, n](std::size_t q, std::size_t o) { return element(n, o, q / ow, q % ow); };
      if (!fast::gemm_packed(band_ctx, cfg, positions, packed, patches.data(), k, w_columns.data(), channels,
                             c.data(), channels, names)) {
        by_dot(n);
        continue;
      }
      for (std::size_t o = 0; o < channels; ++o)
        for (std::size_t q = 0; q < positions; ++q) out[n * per_image + o * positions + q] = c[q * channels + o];
    }
  };
  // Bands of images on gemm_threads() threads where the vectorised path applies (no
  // traps, no stochastic rounding: everything but the speed as on one thread), else one
  // band on ctx. An image is heavy: a band may be a single one.
  if (vectorised)
    gemm_by_rows(ctx, s.batch, per_image, k, out.data(), per_image, band, 1);
  else
    band(ctx, 0, s.batch);
  return out;
}

std::unique_ptr<MatrixUnit> make_amp_unit(const AmpConfig& cfg) {
  validate(cfg);
  return std::make_unique<AmpUnit>(cfg);
}

std::unique_ptr<MatrixUnit> make_ipu_amp_unit(bool half_partials, std::optional<Format> in,
                                              std::optional<Format> out) {
  return make_amp_unit(amp_config(half_partials ? PartialsType::half : PartialsType::float32,
                                  in.value_or(fp16()), std::move(out)));
}

}  // namespace emu
