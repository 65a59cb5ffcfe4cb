// An exact reference for emu's rounding, written from the definitions (IEEE 754-2019
// clause 4 and 7, OCP 8-bit FP v1.0) on Boost.Multiprecision integers. It shares no code
// with emu: only emu's enum names (Rounding, Overflow, Flag) are reused to say which
// mode and flag is meant.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_int.hpp>
#pragma GCC diagnostic pop

#include "emu/status.hpp"

namespace ref {

using Int = boost::multiprecision::cpp_int;
using emu::Overflow;
using emu::Rounding;

// A binary floating-point format from its defining fields.
struct Spec {
  int exponent_bits = 0;
  int p = 0;  // fraction bits
  bool ocp = false;  // OCP "fn": no inf; S.1111.111 is the only NaN pattern per sign
  bool subnormals = true;

  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int emin() const { return 1 - bias(); }
  int emax() const { return (1 << exponent_bits) - (ocp ? 1 : 2) - bias(); }
  // The largest significand (as an integer scaled by 2^p) in the top binade: all ones,
  // or all ones but the last where 1.11..1 is NaN.
  std::uint64_t max_significand() const { return (std::uint64_t{2} << p) - (ocp ? 2 : 1); }
  double max_finite() const { return std::ldexp(static_cast<double>(max_significand()), emax() - p); }
  double min_normal() const { return std::ldexp(1.0, emin()); }
  double min_subnormal() const { return std::ldexp(1.0, emin() - p); }
  bool has_inf() const { return !ocp; }
};

// An exact real number: (-1)^negative * num / den, or its square root when `root`.
struct Real {
  bool negative = false;
  Int num = 0;  // >= 0
  Int den = 1;  // > 0
  bool root = false;
};

// m * 2^e, exact, for finite doubles.
struct Dyadic {
  Int m = 0;  // signed
  int e = 0;
};

inline Dyadic dyadic(double x) {
  int exp = 0;
  const double frac = std::frexp(x, &exp);  // x = frac * 2^exp, |frac| in [0.5, 1)
  const auto m = static_cast<std::int64_t>(std::ldexp(frac, 53));  // exact: 53 bits
  return {Int(m), exp - 53};
}

inline Dyadic add(const Dyadic& a, const Dyadic& b) {
  const int e = std::min(a.e, b.e);
  return {(a.m << (a.e - e)) + (b.m << (b.e - e)), e};
}
inline Dyadic mul(const Dyadic& a, const Dyadic& b) { return {a.m * b.m, a.e + b.e}; }

inline Real real(const Dyadic& d) {
  Real r;
  r.negative = d.m < 0;
  r.num = abs(d.m);
  if (d.e >= 0)
    r.num <<= d.e;
  else
    r.den = Int(1) << -d.e;
  return r;
}

inline Real quotient(double a, double b) {  // b != 0
  const Dyadic da = dyadic(a), db = dyadic(b);
  Real r;
  r.negative = (da.m < 0) != (db.m < 0);
  r.num = abs(da.m);
  r.den = abs(db.m);
  if (da.e >= db.e)
    r.num <<= (da.e - db.e);
  else
    r.den <<= (db.e - da.e);
  return r;
}

inline Real square_root(double a) {  // a >= 0
  Real r = real(dyadic(a));
  r.root = true;
  return r;
}

inline int msb(const Int& v) { return static_cast<int>(boost::multiprecision::msb(v)); }

// floor(log2(num / den)) for num, den > 0.
inline int floor_log2(const Int& num, const Int& den) {
  int l = msb(num) - msb(den);
  const bool below = l >= 0 ? num < (den << l) : (num << -l) < den;
  return below ? l - 1 : l;
}

// |x| * 2^-q split into n = floor(.) and how the rest compares with 1/2.
struct Scaled {
  Int n;
  int half_cmp = 0;  // -1, 0, +1: rest below, at, above one half
  bool exact = true;
};

inline Scaled scale(const Real& x, int q) {
  Scaled s;
  const int shift = x.root ? 2 * q : q;  // sqrt(y) * 2^-q = sqrt(y * 2^-2q)
  Int num = x.num, den = x.den;
  if (shift >= 0)
    den <<= shift;
  else
    num <<= -shift;
  if (!x.root) {
    s.n = num / den;
    const Int rest = num - s.n * den;
    s.exact = rest == 0;
    const Int twice = rest * 2;
    s.half_cmp = twice < den ? -1 : (twice == den ? 0 : 1);
    return s;
  }
  s.n = boost::multiprecision::sqrt(Int(num / den));  // floor(sqrt(floor(y))) = floor(sqrt(y))
  s.exact = s.n * s.n * den == num;
  // sqrt(y) vs n + 1/2  <=>  4 y vs (2n + 1)^2
  const Int lhs = 4 * num, rhs = (2 * s.n + 1) * (2 * s.n + 1) * den;
  s.half_cmp = lhs < rhs ? -1 : (lhs == rhs ? 0 : 1);
  return s;
}

struct Result {
  double value = 0.0;
  emu::Flags flags = 0;
  bool tie = false;  // x was exactly halfway between two neighbours (for coverage counts)
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Whether the truncated significand s.n of an x of sign `neg` goes up by one unit.
inline bool rounds_up(const Scaled& s, bool neg, Rounding mode) {
  const bool odd = bit_test(s.n, 0);
  switch (mode) {
    case Rounding::rne: return s.half_cmp > 0 || (s.half_cmp == 0 && odd);
    case Rounding::rna: return s.half_cmp >= 0;
    case Rounding::rz: return false;
    case Rounding::ru: return !s.exact && !neg;
    case Rounding::rd: return !s.exact && neg;
    case Rounding::ro: return !s.exact && !odd;
    case Rounding::sr: break;
  }
  throw std::logic_error("the reference has no stochastic rounding");
}

// When x counts as tiny (IEEE 754 7.5): before rounding, |x| < 2^emin; after rounding,
// x rounded to p fraction bits with an unbounded exponent range is below 2^emin.
enum class Tininess { before, after };

// Rounds a non-zero exact x into the format (IEEE 754 7.4: overflow is decided on the
// result rounded as if the exponent range were unbounded; tininess before rounding by
// default, as emu/round.hpp documents). Without subnormals a tiny x flushes to signed
// zero (UFLO, INEXACT); a non-tiny x below 2^emin (only after rounding) becomes
// +-2^emin with INEXACT.
inline Result round(const Real& x, const Spec& f, Rounding mode, Overflow overflow,
                    Tininess tininess = Tininess::before) {
  const bool neg = x.negative;
  const int e = x.root ? static_cast<int>(std::floor(floor_log2(x.num, x.den) / 2.0))
                       : floor_log2(x.num, x.den);
  bool tiny = e < f.emin();
  if (tiny && tininess == Tininess::after) {
    // Round at x's own exponent e (unbounded range): m 2^(e - p) with m <= 2^(p+1).
    const Scaled u = scale(x, e - f.p);
    const Int m = u.n + (rounds_up(u, neg, mode) ? 1 : 0);
    tiny = m < (Int(1) << (f.emin() - e + f.p));
  }
  if (tiny && !f.subnormals) return {neg ? -0.0 : 0.0, emu::UFLO | emu::INEXACT};
  if (e < f.emin() && !f.subnormals) return {neg ? -f.min_normal() : f.min_normal(), emu::INEXACT};

  const int q = std::max(e, f.emin()) - f.p;
  const Scaled s = scale(x, q);
  const Int m = s.n + (rounds_up(s, neg, mode) ? 1 : 0);

  const int d = q - (f.emax() - f.p);  // compare m * 2^q with max_significand * 2^(emax - p)
  const Int max_m = Int(f.max_significand());
  const bool overflows = d >= 0 ? (m << d) > max_m : m > (max_m << -d);
  if (overflows) {
    const double max = neg ? -f.max_finite() : f.max_finite();
    // Without inf (OCP E4M3) the value inf would take is the NaN of the same sign:
    // S.1111.111 exists for both signs.
    const double inf = f.has_inf() ? (neg ? -kInf : kInf) : (neg ? -kNaN : kNaN);
    const emu::Flags flags = emu::OFLO | emu::INEXACT;
    switch (overflow) {
      case Overflow::saturate: return {max, flags};
      case Overflow::nan: return {kNaN, flags | emu::INV};  // emu/status.hpp: the positive NaN
      case Overflow::inf: break;
    }
    // IEEE 754 7.4: rounding toward zero (and to odd) carries to max, the directed
    // modes carry to max on the side they point away from.
    switch (mode) {
      case Rounding::rz:
      case Rounding::ro: return {max, flags};
      case Rounding::ru: return {neg ? max : inf, flags};
      case Rounding::rd: return {neg ? inf : max, flags};
      default: return {inf, flags};
    }
  }
  emu::Flags flags = 0;
  if (!s.exact) flags |= tiny ? (emu::INEXACT | emu::UFLO) : emu::INEXACT;
  const double magnitude = std::ldexp(m.convert_to<double>(), q);  // m < 2^54: exact
  return {neg ? -magnitude : magnitude, flags, s.half_cmp == 0};
}

// A random value of the format's grid, with the exponent drawn from [lo, hi] (values past
// emax are off the format: used for conversion inputs), or a subnormal when e < emin.
inline double grid_value(const Spec& f, int e, std::mt19937_64& gen) {
  const std::uint64_t frac = gen() & ((std::uint64_t{1} << f.p) - 1);
  if (e < f.emin()) return std::ldexp(static_cast<double>(frac), f.emin() - f.p);
  return std::ldexp(static_cast<double>(frac | (std::uint64_t{1} << f.p)), e - f.p);
}

}  // namespace ref
