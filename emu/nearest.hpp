// Context's scalar operations (add sub mul div fma sqrt convert) in inline double
// arithmetic, for the loops of tensor operations that run millions of them (batch norm,
// conversions between layers): where the rounding is round-to-nearest-even and the
// result is finite and not near the edges of its format, NearestOps gives the result
// Context gives, and the flags it raises (INEXACT, and UFLO with INEXACT for tiny
// results); everything else (NaN or infinite operands or results, overflow, results
// between the tininess rules' thresholds, division by zero, formats wider than fp32's
// exponent range) it refuses, and the caller computes through Context. Internal to
// emu and experiments' layers; tested against Context in tests/core/test_nearest.cpp.
//
// Each operation:
//  1. computes a double s and a residual whose sign is that of (exact result - s), zero
//     iff s is exact: add and sub by TwoSum (Knuth), mul by p = a*b with the error
//     fma(a, b, -p), fma by p = a*b (refused unless exact: operands of at most 26
//     significant bits, as every format up to fp32 has) and TwoSum(p, c), div by
//     q = a/b and the remainder fma(-q, b, a) (the error's sign is the remainder's
//     times b's), sqrt by s = sqrt(a) and the remainder fma(-s, s, a); these transforms
//     are exact for the magnitudes allowed (operands' products above 2^-900);
//  2. rounds s into the format: with q the weight of the format's last bit at s's
//     exponent (floored at emin, for subnormals), s 2^-q is exact and its nearest
//     integer (the host's rint: ties to even) is the result; at an exact tie a
//     non-zero residual decides, toward it; the result is inexact iff s 2^-q was not an
//     integer or the residual is non-zero (|residual| < half an ulp of s in double,
//     far below half an ulp of the format, so it changes nothing else);
//  3. flags: INEXACT if inexact; an inexact result with |s| below min_normal (1 -
//     2^-(fraction_bits + 1)), which is tiny both before and after rounding, raises
//     UFLO as well (formats without subnormals refuse it); inexact results of |s|
//     between that bound and min_normal, where emu's tininess setting decides, are
//     refused, as are results beyond max_finite.
// Exact zero results keep IEEE 754's signs, which the host's arithmetic gives under
// round-to-nearest: x + (-x) = +0, -0 + -0 = -0, products and quotients by sign.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "arith.hpp"
#include "format.hpp"

namespace emu {

class NearestOps {
 public:
  // Whether ctx's operations round as these do, and whether what these do not report
  // (the elements of INEXACT and UFLO) cannot show: effective rounding rne, INEXACT and
  // UFLO neither counted nor trapped, and the host rounding to nearest without flushing
  // subnormals.
  static bool applies(const Context& ctx);

  // The flags the operations raised (INEXACT, UFLO) since the last commit.
  Flags flags() const { return flags_; }
  // Raises them into ctx's status (under applies(): neither counted nor trapped).
  void commit(Context& ctx);

  // The first index i in [from, n) where v[i] is not a finite value of f (n if none):
  // the values a conversion into f leaves as they are, with nothing raised. Vectorised
  // for fp16 and fp32; for other formats it returns `from` (the caller converts).
  static std::size_t first_not_value(const Format& f, const double* v, std::size_t from, std::size_t n);

  // Each operation sets r to Context's result and returns true, or returns false
  // (nothing raised, r unspecified) where Context must compute it.
  bool add(const Format& f, double a, double b, double& r) {
    const double s = a + b;
    return round(f, s, two_sum_error(a, b, s), r);
  }
  bool sub(const Format& f, double a, double b, double& r) { return add(f, a, -b, r); }
  bool mul(const Format& f, double a, double b, double& r) {
    const double p = a * b;
    if (!(std::fabs(p) > kTiny) && a != 0 && b != 0) return false;  // underflow in double, or NaN
    return round(f, p, std::fma(a, b, -p), r);
  }
  bool fma(const Format& f, double a, double b, double c, double& r) {
    const double p = a * b;
    if (!(std::fabs(p) > kTiny) && a != 0 && b != 0) return false;
    if (std::fma(a, b, -p) != 0) return false;  // an inexact product: three terms
    const double s = p + c;
    return round(f, s, two_sum_error(p, c, s), r);
  }
  bool div(const Format& f, double a, double b, double& r) {
    if (!(std::fabs(b) > kTiny) || !(std::fabs(a) > kTiny || a == 0)) return false;  // b = 0: DIV0
    const double q = a / b;
    const double rest = std::fma(-q, b, a);
    return round(f, q, rest == 0 ? 0.0 : (std::signbit(rest) != std::signbit(b) ? -1.0 : 1.0), r);
  }
  bool sqrt(const Format& f, double a, double& r) {
    if (!(a > kTiny || a == 0)) return false;  // negative: INV
    const double s = std::sqrt(a);
    return round(f, s, std::fma(-s, s, a), r);
  }
  bool convert(const Format& f, double a, double& r) { return round(f, a, 0.0, r); }

 private:
  static constexpr double kTiny = 0x1p-900;

  static double two_sum_error(double a, double b, double s) {
    const double bb = s - a;
    return (a - (s - bb)) + (b - bb);
  }
  static double pow2(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

  // s plus a residual of the given sign (zero: s is exact) rounded into f.
  bool round(const Format& f, double s, double residual, double& result) {
    const double a = std::fabs(s);
    if (!(a <= f.max_finite()) || f.fraction_bits() > 52 || f.emin() < -900 || f.emax() > 900) return false;
    if (a == 0) {
      result = s;
      return residual == 0;
    }
    if (a < f.min_normal() && !f.subnormals()) return false;  // flushed: Context's tininess rules
    const int e = static_cast<int>(std::bit_cast<std::uint64_t>(a) >> 52) - 1023;
    const int q = (e > f.emin() ? e : f.emin()) - f.fraction_bits();
    const double scaled = a * pow2(-q);  // exact: a power of two within range
    double n = std::rint(scaled);
    const double d = scaled - n;  // exact
    if ((d == 0.5 || d == -0.5) && residual != 0)
      n = std::floor(scaled) + ((residual > 0) == (s > 0) ? 1.0 : 0.0);  // the residual breaks the tie
    const double r = n * pow2(q);
    if (r > f.max_finite()) return false;
    if (d != 0 || residual != 0) {
      if (a <= f.min_normal()) {
        if (a >= f.min_normal() * (1 - pow2(-f.fraction_bits() - 1))) return false;
        flags_ |= UFLO;
      }
      flags_ |= INEXACT;
    }
    result = std::copysign(r, s);
    return true;
  }

  Flags flags_ = 0;
};

}  // namespace emu
