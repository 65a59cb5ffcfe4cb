// Rounding of an exact real number into a Format, once, under one rounding mode and
// overflow policy. Every arithmetic result in emu goes through round().
#pragma once

#include <stdexcept>

#include "format.hpp"
#include "rng.hpp"
#include "status.hpp"

namespace emu {

// An exact real number x = hi + lo: hi is x rounded to the nearest double (for
// 0 < |x| <= 2^-1075 it may instead be +-2^-1074, the least double, with the residual in
// lo), and lo is the residual x - hi, exact where it is a double (TwoSum, TwoProduct) and
// otherwise (division, square root, decimal input) correct in sign and accurate to
// double precision. Rounding into a format with fewer than 52 fraction bits looks at lo
// only for its sign, except for the probability of stochastic rounding; 52-bit formats
// also ask whether lo is exactly half an ulp of hi, so an inexact lo is never left on a
// power of two (the exact_* functions, ExactSum and the calculator's number parser step
// it one double toward the true residual).
// `beyond_double` marks a finite x with |x| >= 2^1024 (the sum or product of two large
// fp64 values); hi then holds +-inf for its sign. An x between the largest double and
// 2^1024 has hi = +-DBL_MAX and lo = x - hi instead (it rounds to inf in double, yet rz
// gives DBL_MAX without overflow).
// `lo_scale` lets a residual below double's range be held: the residual is
// lo * 2^-lo_scale (0 unless set for tiny residuals by exact_*, ExactSum and the parser).
struct Exact {
  double hi = 0.0;
  double lo = 0.0;
  bool beyond_double = false;
  int lo_scale = 0;
};

struct RoundSpec {
  Rounding mode = Rounding::rne;
  Overflow overflow = Overflow::inf;
  int sr_bits = 0;  // see below
  Tininess tininess = Tininess::before;  // see step 5 below
};

// The rounding decision of every deterministic mode, the one table emu uses: whether the
// truncated significand n (of sign `negative`) becomes n + 1, given what was discarded.
//   discarded   zero  below_half  half        above_half
//   rne         no    no          if n odd    yes
//   rna         no    no          yes         yes
//   rz          no    no          no          no
//   ru          no    if positive if positive if positive
//   rd          no    if negative if negative if negative
//   ro          no    if n even   if n even   if n even   (the result is odd)
// sr is decided from random bits by the caller; passing it is a logic error.
// (Inline: the tensor-core adder calls it per block.)
enum class Discarded { zero, below_half, half, above_half };
inline bool round_up(Rounding mode, bool negative, bool n_odd, Discarded discarded) {
  if (discarded == Discarded::zero) return false;
  switch (mode) {
    case Rounding::rne: return discarded == Discarded::above_half || (discarded == Discarded::half && n_odd);
    case Rounding::rna: return discarded != Discarded::below_half;
    case Rounding::rz: return false;
    case Rounding::ru: return !negative;
    case Rounding::rd: return negative;
    case Rounding::ro: return !n_odd;
    case Rounding::sr: break;
  }
  throw std::logic_error("round_up: stochastic rounding is decided from random bits");
}

// Rounds x into f; ORs the raised flags (OFLO, INV, UFLO, INEXACT) into `flags` and
// returns the result as a double (exactly a value of f). `rng` is read only when
// spec.mode == Rounding::sr, and must then be non-null.
//
// Steps, for finite non-zero x:
//  1. q = max(exponent(x), emin) - fraction_bits: the weight of the last kept bit.
//  2. m = |x| * 2^-q (exact); n = floor(m), the truncated significand; the discarded
//     fraction is f = m - n (in [0, 1)), with lo deciding exact halves and zeros.
//  3. Whether n becomes n + 1:
//       rne  f > 1/2, or f == 1/2 and n odd      rna  f >= 1/2
//       rz   never                                ru/rd  f > 0 and the direction is up
//       ro   f > 0 and n even (the result is odd, so a later rounding cannot double-round)
//       sr   with probability f: exact (sr_bits 0; the comparison with random bits
//            extends until it is decided) or, with k = sr_bits in 1..64, as hardware with
//            k random bits does: the discarded fraction is truncated to k bits, a k-bit
//            random number is added, and a carry rounds up. P(up) = floor(f 2^k) / 2^k,
//            so the expected result is below |x| by (f - floor(f 2^k) / 2^k) ulp,
//            between 0 and 2^-k ulp (a bias toward zero).
//  4. Overflow when the rounded magnitude exceeds max_finite (rounding with unbounded
//     exponent, so rz of a value just above max is not an overflow): the Overflow policy.
//  5. Tininess, by spec.tininess. `before` (the default): x is tiny when |x| <
//     min_normal, the exact value. `after` (IEEE 754 7.5's other choice, x86 and
//     SoftFloat): x is tiny when x rounded to the format's precision with an unbounded
//     exponent range (the same mode) lies below min_normal; the two differ only for x
//     just below min_normal that rounds up to it. Under sr, `after` looks at the
//     delivered result with subnormals on, and with subnormals off rounds x once with
//     an unbounded exponent (one random draw) to see whether it reaches min_normal. With
//     subnormals, UFLO is raised when x is tiny and inexact; without, a tiny x flushes
//     to signed zero and raises UFLO and INEXACT, and a non-tiny x below min_normal
//     (only under `after`) gives +-min_normal with INEXACT. So with subnormals off and
//     `before`, a value just below min_normal that would round up to min_normal still
//     flushes to zero. `before` with subnormals off follows Arm's flush-to-zero rule
//     (Arm ARM, FPRoundBase pseudocode with FPCR.FZ = 1 and FPCR.AH = 0: the exponent
//     of the unrounded value is compared with the minimum, before rounding; gem5's Arm
//     model, src/arch/arm/insts/fplib.cc, does the same); the flags do not: Arm raises
//     only its underflow flag there, emu raises INEXACT too, as the result differs from
//     the exact value. `after` with subnormals off is x86's FTZ, which flushes results
//     that are tiny after rounding. The IPU's documents do not say, so for the IPU it is
//     a choice.
// Special operands and results:
//  - NaN gives NaN of the same sign, no flag. A format without NaN (OCP fp6, fp4) has
//    no value for it: +0 with INV (the OCP MX spec leaves the conversion of NaN to
//    these formats to the implementation; emu's choice).
//  - +-inf gives +-inf. In a format without inf (OCP fp8-e4m3, fnuz) an infinite
//    operand has no value: its NaN with INV (as IEEE 754 7.2 does for converting inf to
//    an integer format, which has no inf either), or +-max with OFLO under
//    Overflow::saturate and in formats without NaN.
//  - A finite x that overflows raises OFLO and INEXACT (IEEE 754 7.4), whatever it
//    becomes: under Overflow::inf +-inf, or +-max where the mode rounds toward zero, or
//    in a format without inf its NaN (fp8-e4m3: 0x7f or 0xff, the OCP S.1111.111
//    patterns of x's sign; fnuz: 0x80, as ml_dtypes' float8_e4m3fnuz does); under
//    Overflow::saturate +-max; under Overflow::nan (the IPU's NANOO) the canonical
//    positive quiet NaN, with INV as well. Graphcore's documentation says NANOO gives "a
//    Not-a-Number result" and sets INV, not which NaN; emu gives the same positive NaN
//    for either sign (the array kernels of emu/convert.hpp do too). A format without
//    NaN (OCP fp6, fp4) saturates to +-max under every policy (OFLO and INEXACT): the
//    OCP MX spec v1.0 has its conversions clamp to the largest magnitude. P3109's
//    saturation modes map as: SatFinite = saturate; SatPropagate and SatNone = inf for
//    its extended formats (+-inf); for its finite formats SatNone gives +-max, emu's
//    inf policy their NaN (use saturate for P3109's result).
//  - Formats without -0 (fnuz, P3109 signed): a zero result is +0 (the one zero).
//  - Unsigned formats (e8m0, ue4m3, P3109 unsigned): a result that would be negative
//    and non-zero (a negative x that does not round to zero, -inf) is invalid: INV
//    alone, and NaN, or the least value (0, or e8m0's 2^-127) under Overflow::saturate
//    and in formats without NaN (P3109: SatNone gives NaN, SatFinite its least value).
//    A negative x that rounds to zero gives +0 with the usual UFLO and INEXACT.
//  - Formats without zero (e8m0): a result that would be zero (x = 0, or a tiny x
//    flushed: such formats have no subnormals) is the least value 2^-bias, the nearest
//    there is, with UFLO and INEXACT.
//  - Formats without fraction bits (e8m0, P3109 P = 1): the significand of every value
//    is 1 (odd), so an exact tie between 2^e and 2^(e+1) goes up under rne (1 + 1 = 2 =
//    1 * 2^(e+1), even), as under rna.
double round(const Format& f, const Exact& x, const RoundSpec& spec, Rng* rng, Flags& flags);

// Convenience for exact doubles.
inline double round(const Format& f, double x, const RoundSpec& spec, Rng* rng, Flags& flags) {
  return round(f, Exact{x}, spec, rng, flags);
}

}  // namespace emu
