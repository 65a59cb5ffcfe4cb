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

// Where a format keeps its NaNs: IEEE 754 3.4 (exponent all ones, fraction non-zero);
// the largest magnitude pattern (OCP 8-bit FP v1.0 E4M3: S.1111.111; OCP MX v1.0 E8M0:
// 0xff; P3109 unsigned: 2^K - 1); the pattern of -0 (P3109 signed: 2^(K-1), ml_dtypes'
// fnuz types: 0x80); none (OCP MX v1.0 FP6, FP4).
enum class Nan { derived, ieee, largest, negative_zero, none };

// A binary floating-point format from its defining fields. The first four make IEEE
// and OCP fn formats ({5, 10}, {4, 3, true}); the rest (set by name) the others.
struct Spec {
  int exponent_bits = 0;
  int p = 0;  // fraction bits
  bool ocp = false;  // OCP "fn": no inf; S.1111.111 is the only NaN pattern per sign
  bool subnormals = true;
  Nan nan = Nan::derived;  // derived: largest when ocp, else ieee
  int inf = -1;            // -1: derived (IEEE formats have inf, OCP fn not); 0 or 1
  int bias_value = -1;     // -1: IEEE's 2^(exponent_bits - 1) - 1
  bool is_signed = true;
  bool zero = true;        // false: exponent field 0 is the binade 2^-bias (OCP E8M0)

  Nan nan_kind() const { return nan != Nan::derived ? nan : (ocp ? Nan::largest : Nan::ieee); }
  bool has_inf() const { return inf < 0 ? !ocp : inf == 1; }
  bool has_nan() const { return nan_kind() != Nan::none; }
  bool has_negative_zero() const { return is_signed && zero && nan_kind() != Nan::negative_zero; }
  int bias() const { return bias_value >= 0 ? bias_value : (1 << (exponent_bits - 1)) - 1; }
  int emin() const { return zero ? 1 - bias() : -bias(); }
  std::uint64_t all_ones() const { return (std::uint64_t{1} << (exponent_bits + p)) - 1; }  // magnitude bits
  // The largest magnitude code (exponent and fraction fields) of a finite number: below
  // the all-ones exponent (IEEE), else below the NaN and infinity codes, which take the
  // largest magnitudes (OCP E4M3: S.1111.110 = 448; P3109 4.7.2: Inf at 2^(K-1) - 1
  // signed, 2^K - 2 unsigned, NaN at 2^K - 1 unsigned).
  std::uint64_t max_code() const {
    if (nan_kind() == Nan::ieee) return all_ones() - (std::uint64_t{1} << p);
    return all_ones() - (nan_kind() == Nan::largest ? 1 : 0) - (has_inf() ? 1 : 0);
  }
  int emax() const { return static_cast<int>(max_code() >> p) - bias(); }
  // The largest significand (as an integer scaled by 2^p) in the top binade.
  std::uint64_t max_significand() const { return (std::uint64_t{1} << p) | (max_code() & ((std::uint64_t{1} << p) - 1)); }
  double max_finite() const { return std::ldexp(static_cast<double>(max_significand()), emax() - p); }
  double min_normal() const { return std::ldexp(1.0, emin()); }
  double min_subnormal() const { return zero ? std::ldexp(1.0, emin() - p) : min_normal(); }
  double least_value() const { return zero ? 0.0 : min_normal(); }
};

// A format beyond IEEE and OCP fn from all its fields; no zero implies no subnormals.
inline Spec spec_of(int exponent_bits, int p, Nan nan, int inf, int bias, bool is_signed, bool zero) {
  Spec s{exponent_bits, p};
  s.nan = nan;
  s.inf = inf;
  s.bias_value = bias;
  s.is_signed = is_signed;
  s.zero = zero;
  s.subnormals = zero;
  return s;
}

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The value of bit pattern `bits`, from the definitions: (-1)^S 2^(E - bias) (1 + T/2^p),
// or (-1)^S 2^(1 - bias) T/2^p for E = 0 where the format has a zero (IEEE 754 3.4, OCP
// 8-bit FP v1.0 section 5, P3109 4.7.2); E8M0 (no zero): 2^(E - 127) for every E.
// NaN patterns give NaN (with the pattern's sign bit); subnormal patterns with
// subnormals off give signed zero (+0 without -0).
inline double decode(const Spec& f, std::uint64_t bits) {
  const std::uint64_t mask = (std::uint64_t{1} << f.p) - 1;
  const bool negative = f.is_signed && ((bits >> (f.exponent_bits + f.p)) & 1);
  const std::uint64_t code = bits & f.all_ones();
  const std::uint64_t e = code >> f.p, t = code & mask;
  const std::uint64_t e_ones = (std::uint64_t{1} << f.exponent_bits) - 1;
  const double nan = negative ? -std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::quiet_NaN();
  switch (f.nan_kind()) {
    case Nan::ieee:
      if (e == e_ones) return t != 0 ? nan : (negative ? -kInfinity : kInfinity);
      break;
    case Nan::largest:
      if (code == f.all_ones()) return nan;
      break;
    case Nan::negative_zero:
      if (negative && code == 0) return std::numeric_limits<double>::quiet_NaN();
      break;
    default: break;
  }
  if (f.has_inf() && f.nan_kind() != Nan::ieee && code == f.max_code() + 1) return negative ? -kInfinity : kInfinity;
  double magnitude;
  if (e == 0 && f.zero)
    magnitude = f.subnormals ? std::ldexp(static_cast<double>(t), f.emin() - f.p) : 0.0;
  else
    magnitude = std::ldexp(static_cast<double>((std::uint64_t{1} << f.p) | t), static_cast<int>(e) - f.bias() - f.p);
  if (magnitude == 0 && !f.has_negative_zero()) return 0.0;
  return negative ? -magnitude : magnitude;
}

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
    // Without inf (OCP E4M3, fnuz) the value inf would take is the NaN (OCP: of the
    // same sign, S.1111.111 exists for both).
    const double inf = f.has_inf() ? (neg ? -kInf : kInf) : (neg ? -kNaN : kNaN);
    const emu::Flags flags = emu::OFLO | emu::INEXACT;
    // No NaN (OCP MX FP6, FP4): nothing lies past max (the MX spec clamps).
    if (!f.has_nan()) return {max, flags};
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

// The rules of emu/round.hpp for formats beyond IEEE, applied to the result `r` (with
// its flags) of rounding as if the format were signed with zero and -0 (what round()
// above does): no -0 gives +0; unsigned formats make a negative non-zero result invalid
// (INV alone; NaN, or the least value under saturate and without NaN); no zero makes a
// zero result the least value 2^-bias with UFLO and INEXACT.
inline Result adapt(const Spec& f, Result r, Overflow overflow) {
  if (f.has_negative_zero()) return r;
  if (!f.is_signed && std::signbit(r.value) && r.value != 0) {
    const bool least = overflow == Overflow::saturate || !f.has_nan();
    return {least ? f.least_value() : kNaN, emu::INV, r.tie};
  }
  if (r.value == 0) {
    if (f.zero) return {0.0, r.flags, r.tie};
    return {f.is_signed ? std::copysign(f.min_normal(), r.value) : f.min_normal(),
            static_cast<emu::Flags>(r.flags | emu::UFLO | emu::INEXACT), r.tie};
  }
  return r;
}

// An exact zero result of an operation (IEEE 754 6.3's sign in `zero`) in the format.
inline Result zero_result(const Spec& f, double zero, Overflow overflow) { return adapt(f, {zero, 0}, overflow); }

// round() with the rules for formats beyond IEEE.
inline Result round_in(const Real& x, const Spec& f, Rounding mode, Overflow overflow,
                       Tininess tininess = Tininess::before) {
  if (x.num == 0) return zero_result(f, x.negative ? -0.0 : 0.0, overflow);
  return adapt(f, round(x, f, mode, overflow, tininess), overflow);
}

// A random value of the format's grid, with the exponent drawn from [lo, hi] (values past
// emax are off the format: used for conversion inputs), or a subnormal when e < emin.
inline double grid_value(const Spec& f, int e, std::mt19937_64& gen) {
  const std::uint64_t frac = gen() & ((std::uint64_t{1} << f.p) - 1);
  if (e < f.emin()) return std::ldexp(static_cast<double>(frac), f.emin() - f.p);
  return std::ldexp(static_cast<double>(frac | (std::uint64_t{1} << f.p)), e - f.p);
}

}  // namespace ref
