#include "round.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace emu {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double overflow_result(const Format& f, bool negative, const RoundSpec& spec, Flags& flags) {
  flags |= OFLO | INEXACT;
  const double max = negative ? -f.max_finite() : f.max_finite();
  // A format without NaN (OCP fp6, fp4) has nothing beyond max: every policy saturates.
  if (!f.has_nan()) return max;
  switch (spec.overflow) {
    case Overflow::saturate:
      return max;
    case Overflow::nan:
      flags |= INV;
      return kNaN;
    case Overflow::inf:
      break;
  }
  bool to_infinity = true;  // rne, rna, sr
  switch (spec.mode) {
    case Rounding::rz:
    case Rounding::ro: to_infinity = false; break;
    case Rounding::ru: to_infinity = !negative; break;
    case Rounding::rd: to_infinity = negative; break;
    default: break;
  }
  if (!to_infinity) return max;
  // Where inf would go: +-inf, or in a format without inf (OCP fp8-e4m3, fnuz) its NaN
  // (OCP: S.1111.111 of the same sign; fnuz: the one NaN 0x80).
  if (f.has_infinity()) return negative ? -kInf : kInf;
  return negative ? -kNaN : kNaN;
}

// True with probability p (in [0, 1]), exactly: compares p with an infinite uniform bit
// string 64 bits at a time; a word equal to p's leading bits defers the decision to the
// next word (probability 2^-64 each time).
bool bernoulli_exact(double p, Rng& rng) {
  while (true) {
    if (p >= 1.0) return true;
    if (p <= 0.0) return false;
    const double t = std::ldexp(p, 64);  // exact; t < 2^64
    const double whole = std::floor(t);
    const auto w = static_cast<std::uint64_t>(whole);
    const std::uint64_t r = rng.next_u64();
    if (r != w) return r < w;
    p = t - whole;
  }
}

// floor(g + h) exactly, for doubles g in [0, 1) and h in (-1, 1).
double floor_of_sum(double g, double h) {
  // TwoSum: s + err == g + h exactly. If s is not an integer, s + err lies strictly
  // between the integers around s (|err| <= ulp(s) / 2 and s is a multiple of ulp(s));
  // if it is, err's sign says on which side the exact sum lies.
  const double s = g + h;
  const double hb = s - g;
  const double err = (g - (s - hb)) + (h - hb);
  const double fl = std::floor(s);
  return s == fl && err < 0 ? fl - 1 : fl;
}

// Stochastic rounding decision for a discarded fraction frac (in [0, 1], with 1 meaning
// "just below the next value") plus a residual ls (the exact fraction is frac + ls, in
// (0, 1)). Draws one 64-bit word (sr_bits 0: rarely more).
bool stochastic_round_up(double frac, double ls, int sr_bits, Rng* rng) {
  if (rng == nullptr) throw std::logic_error("stochastic rounding needs a random source");
  if (sr_bits == 0) return bernoulli_exact(frac + ls, *rng);
  // Hardware: truncate the fraction to k bits, add k random bits, round up on carry:
  // up iff r < floor((frac + ls) * 2^k). The residual counts in full (frac may be 0 with
  // ls near 1/2 in the 52-bit formats, where lo carries all the discarded bits):
  // frac * 2^k = whole + g and ls * 2^k = ls_whole + ls_part, split exactly, so the
  // threshold is whole + ls_whole + floor(g + ls_part).
  const double scaled = std::ldexp(frac, sr_bits);  // <= 2^64
  const double whole = std::floor(scaled);
  __int128 threshold = static_cast<__int128>(whole);
  if (ls != 0) {
    const double ls_scaled = std::ldexp(ls, sr_bits);  // |ls| < 1: |ls_scaled| < 2^64
    const double ls_whole = std::trunc(ls_scaled);
    threshold += static_cast<__int128>(ls_whole) +
                 static_cast<__int128>(floor_of_sum(scaled - whole, ls_scaled - ls_whole));
  }
  const std::uint64_t r = rng->next_u64() >> (64 - sr_bits);
  return static_cast<__int128>(r) < threshold;
}

// 2^e as a double, for e in double's normal exponent range.
double pow2(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

// The common case on integers: x is a normal double with no residual, and the result's
// last kept bit lies 1..63 bits into x's significand (or x needs no rounding). Same
// decisions as the general path below, without libm calls. Returns false when x is not
// such a case.
bool round_fast(const Format& f, double ax, bool negative, bool tiny, const RoundSpec& spec, Rng* rng,
                Flags& flags, double& result) {
  const auto bits = std::bit_cast<std::uint64_t>(ax);
  const int field = static_cast<int>(bits >> 52);
  if (field == 0) return false;  // double subnormal
  const int e = field - 1023;
  const int q = std::max(e, f.emin()) - f.fraction_bits();  // weight of the last kept bit
  if (q < -1022) return false;
  const std::uint64_t significand = (bits & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1} << 52);
  const int shift = q - (e - 52);  // bits of the significand below the last kept bit
  if (shift <= 0) {  // representable to the last bit; only the range can fail
    if (ax > f.max_finite()) result = overflow_result(f, negative, spec, flags);
    else result = negative ? -ax : ax;
    return true;
  }
  if (shift > 63) return false;
  const std::uint64_t n = significand >> shift;
  const std::uint64_t rest = significand & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  const bool inexact = rest != 0;
  bool up = false;
  if (spec.mode == Rounding::sr) {
    up = inexact && stochastic_round_up(static_cast<double>(rest) * pow2(-shift), 0.0, spec.sr_bits, rng);
  } else {
    const Discarded d = !inexact      ? Discarded::zero
                        : rest < half ? Discarded::below_half
                        : rest == half ? Discarded::half
                                       : Discarded::above_half;
    up = round_up(spec.mode, negative, (n & 1) != 0, d);
  }
  const double magnitude = static_cast<double>(n + (up ? 1 : 0)) * pow2(q);  // exact: n + 1 <= 2^53
  if (magnitude > f.max_finite()) {
    result = overflow_result(f, negative, spec, flags);
    return true;
  }
  if (tiny && spec.tininess == Tininess::after && spec.mode == Rounding::sr) tiny = magnitude < f.min_normal();
  if (inexact) flags |= tiny ? (INEXACT | UFLO) : INEXACT;
  result = negative ? -magnitude : magnitude;
  return true;
}

// Tininess after rounding (IEEE 754 7.5): whether x, 0 < |x| <= min_normal with |x| =
// ax + lo (lo scaled as in Exact, positive away from zero) and below min_normal, rounds
// to min_normal at the format's precision with an unbounded exponent range. Only values
// in the last half-binade below min_normal can: there the unbounded grid has spacing
// 2^(emin - 1 - fraction_bits) and x must lie above its largest point below min_normal.
// Under sr this draws the random decision (one rounding of x with unbounded exponent).
bool rounds_to_min_normal(const Format& f, double ax, double lo, int lo_scale, const RoundSpec& spec, bool negative,
                          Rng* rng) {
  const int q = f.emin() - 1 - f.fraction_bits();
  if (ax < std::ldexp(1.0, f.emin() - 1)) return false;
  const double m = std::ldexp(ax, -q);  // exact: ax has 53 bits, m < 2^(fraction_bits + 2)
  double n = std::floor(m);
  double frac = m - n;
  double ls = lo == 0 ? 0.0 : std::ldexp(lo, -q - lo_scale);
  if (ls == 0 && lo != 0) ls = std::copysign(std::numeric_limits<double>::denorm_min(), lo);
  if (frac == 0 && ls < 0) {  // just below the grid point n
    n -= 1;
    frac = 1.0;
  }
  if (n != std::ldexp(1.0, f.fraction_bits() + 1) - 1) return false;  // not the last point below min_normal
  if (frac == 0 && ls == 0) return false;                               // x is that point exactly
  if (spec.mode == Rounding::sr) return stochastic_round_up(frac, ls, spec.sr_bits, rng);
  const double from_half = (frac - 0.5) + ls;  // exact sign, as in round()
  const Discarded d = from_half > 0 ? Discarded::above_half : from_half == 0 ? Discarded::half : Discarded::below_half;
  return round_up(spec.mode, negative, true, d);  // n = 2^(p+1) - 1 is odd
}

// round() for a signed format with zero and -0: the IEEE rules. round() below adapts
// its result to formats without -0, without zero or without a sign.
double round_signed(const Format& f, const Exact& x, const RoundSpec& spec, Rng* rng, Flags& flags) {
  const double hi = x.hi;
  const bool negative = std::signbit(hi);
  if (x.beyond_double) return overflow_result(f, negative, spec, flags);
  if (std::isinf(hi)) {
    if (f.has_infinity()) return hi;
    if (spec.overflow == Overflow::saturate || !f.has_nan()) {
      flags |= OFLO;
      return negative ? -f.max_finite() : f.max_finite();
    }
    flags |= INV;  // an infinite operand has no value in the format: invalid, not overflow
    return negative ? -kNaN : kNaN;
  }
  if (hi == 0.0) {
    if (x.lo == 0.0) return hi;
    // A non-zero x known only by its sign, in lo, far below double's least subnormal
    // (the calculator's parser gives this for |x| below 2^-1127 or 10^-339; exact_* and
    // values nearer 2^-1074 use hi = +-2^-1074 with a scaled lo instead). It is tiny and
    // inexact in every format; only rounding away from zero (ru, rd by sign, ro) gives
    // the least subnormal. Stochastic rounding would round up with probability
    // |x| / min_subnormal < 2^-52: taken as zero.
    const bool neg = std::signbit(x.lo);
    flags |= UFLO | INEXACT;
    const bool away = f.subnormals() && (spec.mode == Rounding::ro || (spec.mode == Rounding::ru && !neg) ||
                                         (spec.mode == Rounding::rd && neg));
    const double magnitude = away ? f.min_subnormal() : 0.0;
    return neg ? -magnitude : magnitude;
  }

  const double ax = std::fabs(hi);
  const double lo = negative ? -x.lo : x.lo;  // residual, positive = away from zero
  bool tiny = ax < f.min_normal() || (ax == f.min_normal() && lo < 0);
  // Tininess after rounding: decided here, except under sr with subnormals, where the
  // delivered result decides (below).
  const bool after = spec.tininess == Tininess::after;
  if (tiny && after && (spec.mode != Rounding::sr || !f.subnormals()) &&
      rounds_to_min_normal(f, ax, lo, x.lo_scale, spec, negative, rng)) {
    tiny = false;
    if (!f.subnormals()) {  // x rounds to min_normal, which the format has
      flags |= INEXACT;
      return negative ? -f.min_normal() : f.min_normal();
    }
  }
  if (tiny && !f.subnormals()) {
    flags |= UFLO | INEXACT;
    return negative ? -0.0 : 0.0;
  }
  if (lo == 0) {
    double result;
    if (round_fast(f, ax, negative, tiny, spec, rng, flags, result)) return result;
  }

  const int p = f.fraction_bits();
  const int e = std::ilogb(ax);
  int q = std::max(e, f.emin()) - p;  // weight of the last kept bit
  double n = std::floor(std::ldexp(ax, -q));
  double frac = std::ldexp(ax, -q) - n;  // exact
  double ls = lo == 0 ? 0.0 : std::ldexp(lo, -q - x.lo_scale);
  // A residual far below the last kept bit may underflow when scaled; only its sign
  // matters then (frac is a multiple of a far larger power of two).
  if (ls == 0 && lo != 0) ls = std::copysign(std::numeric_limits<double>::denorm_min(), lo);
  if (frac == 0 && ls < 0) {
    // x lies just below the grid point hi. Below a power of two the grid is twice as
    // fine, so step down a binade first (not at emin: subnormal spacing equals emin's).
    if (n == std::ldexp(1.0, p) && e > f.emin()) {
      --q;
      n *= 2;
      ls *= 2;
    }
    n -= 1;
    frac = 1.0;  // "just below n + 1"; ls < 0 says by how little
  }
  const bool inexact = frac != 0 || ls != 0;
  // Sign of (frac + ls - 1/2), exactly: frac - 1/2 is exact and a rounded sum of two
  // doubles has the sign of the exact sum (zero only when it is exactly zero).
  const double from_half = (frac - 0.5) + ls;
  const bool above_half = from_half > 0;
  const bool exact_half = from_half == 0;
  const bool n_odd = (static_cast<std::uint64_t>(n) & 1) != 0;  // n < 2^54: an exact integer

  bool up = false;
  if (spec.mode == Rounding::sr) {
    up = inexact && stochastic_round_up(frac, ls, spec.sr_bits, rng);
  } else {
    const Discarded d = !inexact     ? Discarded::zero
                        : above_half ? Discarded::above_half
                        : exact_half ? Discarded::half
                                     : Discarded::below_half;
    up = round_up(spec.mode, negative, n_odd, d);
  }
  const double magnitude = std::ldexp(n + (up ? 1.0 : 0.0), q);
  if (magnitude > f.max_finite()) return overflow_result(f, negative, spec, flags);
  if (tiny && after && spec.mode == Rounding::sr) tiny = magnitude < f.min_normal();
  if (inexact) flags |= tiny ? (INEXACT | UFLO) : INEXACT;
  return negative ? -magnitude : magnitude;
}

}  // namespace

double round(const Format& f, const Exact& x, const RoundSpec& spec, Rng* rng, Flags& flags) {
  if (std::isnan(x.hi)) {
    if (f.has_nan()) return x.hi;
    flags |= INV;  // no NaN to give: the value is lost
    return f.has_zero() ? 0.0 : f.min_normal();
  }
  if (f.has_negative_zero()) return round_signed(f, x, spec, rng, flags);  // signed, with zero and -0: IEEE
  Flags raised = 0;
  double r = round_signed(f, x, spec, rng, raised);
  if (!f.is_signed() && std::signbit(r) && r != 0) {
    // A negative result (finite, infinite or a NaN of x's sign) has no value in an
    // unsigned format: invalid. NaN, or the least value under saturate (P3109's
    // SatFinite gives its least value, zero) and in formats without NaN.
    raised = INV;
    r = spec.overflow == Overflow::saturate || !f.has_nan() ? (f.has_zero() ? 0.0 : f.min_normal())
                                                             : std::numeric_limits<double>::quiet_NaN();
  } else if (r == 0) {
    if (f.has_zero()) {
      r = 0.0;  // no -0: the one zero
    } else {
      // No zero (e8m0): a result that would be zero (x zero or tiny, flushed) is the
      // least value, the nearest there is, with UFLO and INEXACT.
      raised |= UFLO | INEXACT;
      r = std::copysign(f.min_normal(), f.is_signed() ? r : 1.0);
    }
  }
  flags |= raised;
  return r;
}

}  // namespace emu
