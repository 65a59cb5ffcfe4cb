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
#include <cstring>

#include "arith.hpp"
#include "format.hpp"
#include "simd.hpp"

namespace emu {

// Four doubles as one GCC vector (an AVX register in AVX2 builds), for NearestOps::fma4:
// built from scalars in registers (an array written lane by lane and read as a vector
// stalls on store forwarding).
using Double4 = double __attribute__((vector_size(32)));
inline Double4 load4(const double* p) {
  Double4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(const Double4& v, double* p) { std::memcpy(p, &v, sizeof v); }

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
  // Puts the flags back to an earlier flags(): a group of operations its caller abandons
  // to run them again one by one.
  void restore(Flags earlier) { flags_ = earlier; }

  // The first index i in [from, n) where v[i] is not a finite value of f (n if none):
  // the values a conversion into f leaves as they are, with nothing raised. Vectorised
  // for fp16 and fp32; for other formats it returns `from` (the caller converts).
  static std::size_t first_not_value(const Format& f, const double* v, std::size_t from, std::size_t n);

  // Each operation sets r to Context's result and returns true, or returns false
  // (nothing raised, r unspecified) where Context must compute it.
  bool add(const Format& f, double a, double b, double& r) {
    if (binary32(f) && float_value(a) && float_value(b)) {
      const float x = static_cast<float>(a), y = static_cast<float>(b), sum = x + y;
      return finish32(sum, [&] { return two_sum_error(x, y, sum) == 0; }, r);
    }
    const double s = a + b;
    return round(f, s, two_sum_error(a, b, s), r);
  }
  bool sub(const Format& f, double a, double b, double& r) { return add(f, a, -b, r); }
  bool mul(const Format& f, double a, double b, double& r) {
    if (binary32(f) && float_value(a) && float_value(b)) {
      const double p = a * b;  // exact: 48 bits
      const float product = static_cast<float>(p);
      return finish32(product, [&] { return static_cast<double>(product) == p; }, r);
    }
    const double p = a * b;
    if (!(std::fabs(p) > kTiny) && a != 0 && b != 0) return false;  // underflow in double, or NaN
    return round(f, p, std::fma(a, b, -p), r);
  }
  bool fma(const Format& f, double a, double b, double c, double& r) {
    if (binary32(f) && float_value(a) && float_value(b) && float_value(c)) {
      const float result = std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c));
      return finish32(result, [&] {
        const double p = a * b, sum = p + c;  // p exact
        return two_sum_error(p, c, sum) == 0 && static_cast<double>(result) == sum;
      }, r);
    }
    const double p = a * b;
    if (!(std::fabs(p) > kTiny) && a != 0 && b != 0) return false;
    if (std::fma(a, b, -p) != 0) return false;  // an inexact product: three terms
    const double s = p + c;
    return round(f, s, two_sum_error(p, c, s), r);
  }
  bool div(const Format& f, double a, double b, double& r) {
    if (!(std::fabs(b) > kTiny) || !(std::fabs(a) > kTiny || a == 0)) return false;  // b = 0: DIV0
    if (binary32(f) && float_value(a) && float_value(b)) {
      const float q = static_cast<float>(a) / static_cast<float>(b);
      return finish32(q, [&] { return std::fma(static_cast<double>(q), b, -a) == 0; }, r);
    }
    const double q = a / b;
    const double rest = std::fma(-q, b, a);
    return round(f, q, rest == 0 ? 0.0 : (std::signbit(rest) != std::signbit(b) ? -1.0 : 1.0), r);
  }
  bool sqrt(const Format& f, double a, double& r) {
    if (!(a > kTiny || a == 0)) return false;  // negative: INV
    if (binary32(f) && float_value(a)) {
      const float root = std::sqrt(static_cast<float>(a));
      return finish32(root, [&] { return std::fma(static_cast<double>(root), static_cast<double>(root), -a) == 0; }, r);
    }
    const double s = std::sqrt(a);
    return round(f, s, std::fma(-s, s, a), r);
  }
  bool convert(const Format& f, double a, double& r) { return round(f, a, 0.0, r); }

  // Four independent fmas r[i] = a[i] * b[i] + c[i] into an fp16 or fp32 format (as
  // binary16() and binary32() below), vectorised: true, with r set and the flags of the
  // four raised, where every lane's product is exact in double and its result is an
  // exact zero, normal and finite, or (fp16) tiny under both tininess rules, away from
  // the midpoints where rounding through float would round twice; false with nothing raised otherwise, and in builds without
  // AVX2 (the caller then runs its operations one by one). add(x, y) is fma(y, 1, x),
  // sub(x, y) fma(y, -1, x) and mul(x, y) fma(x, y, -0), signed zeros included.
  [[gnu::always_inline]] bool fma4(const Format& f, Double4 a, Double4 b, Double4 c, Double4& r) {
#if EMU_SIMD
    const bool half = binary16(f);
    if (!half && !binary32(f)) return false;
    const __m256d va = a, vb = b, vc = c;
    const __m256d zero = _mm256_setzero_pd();
    const __m256d p = _mm256_mul_pd(va, vb);
    // The product exact: no error, and not below kTiny (where fma's error could vanish)
    // unless a factor is zero. False for NaN.
    const __m256d product_ok = _mm256_and_pd(
        _mm256_cmp_pd(_mm256_fmsub_pd(va, vb, p), zero, _CMP_EQ_OQ),
        _mm256_or_pd(_mm256_cmp_pd(simd::magnitude(p), _mm256_set1_pd(kTiny), _CMP_GT_OQ),
                     _mm256_or_pd(_mm256_cmp_pd(va, zero, _CMP_EQ_OQ), _mm256_cmp_pd(vb, zero, _CMP_EQ_OQ))));
    const __m256d s = _mm256_add_pd(p, vc);
    const __m256d bb = _mm256_sub_pd(s, p);
    const __m256d residual = _mm256_add_pd(_mm256_sub_pd(p, _mm256_sub_pd(s, bb)), _mm256_sub_pd(vc, bb));
    const __m256d magnitude = simd::magnitude(s);
    const __m256d exact_zero = _mm256_cmp_pd(s, zero, _CMP_EQ_OQ);  // p + c = 0 only where exact
    const __m128 single = _mm256_cvtpd_ps(s);
    const __m256d single_wide = _mm256_cvtps_pd(single);
    const __m256d first_exact =
        _mm256_and_pd(_mm256_cmp_pd(single_wide, s, _CMP_EQ_OQ), _mm256_cmp_pd(residual, zero, _CMP_EQ_OQ));
    const __m256d all_ones = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    __m256d result, inexact, ok, tiny = _mm256_setzero_pd();
    if (half) {
      // s then float then fp16 (ties to even) is one rounding unless the float lies on an
      // fp16 midpoint and came from an inexact s: in the normal range its 13 dropped bits
      // are 1000000000000; below it, half fp16's least subnormal from the result.
      const __m128i low_bits = _mm_and_si128(_mm_castps_si128(single), _mm_set1_epi32(0x1fff));
      const __m256d midpoint =
          _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_cmpeq_epi32(low_bits, _mm_set1_epi32(0x1000))));
      result = _mm256_cvtps_pd(simd::to_fp16(single));
      const __m256d tiny_midpoint =
          _mm256_cmp_pd(simd::magnitude(_mm256_sub_pd(single_wide, result)), _mm256_set1_pd(0x1p-25), _CMP_EQ_OQ);
      const __m256d normal = _mm256_and_pd(_mm256_cmp_pd(magnitude, _mm256_set1_pd(0x1p-14), _CMP_GT_OQ),
                                           _mm256_cmp_pd(magnitude, _mm256_set1_pd(65504.0), _CMP_LE_OQ));
      // Tiny under both tininess rules: below min_normal (1 - 2^-11) (as round() does).
      tiny = _mm256_cmp_pd(magnitude, _mm256_set1_pd(0x1p-14 - 0x1p-25), _CMP_LT_OQ);
      ok = _mm256_or_pd(_mm256_and_pd(normal, _mm256_or_pd(first_exact, _mm256_xor_pd(midpoint, all_ones))),
                        _mm256_and_pd(tiny, _mm256_or_pd(first_exact, _mm256_xor_pd(tiny_midpoint, all_ones))));
      inexact = _mm256_or_pd(_mm256_xor_pd(first_exact, all_ones), _mm256_cmp_pd(result, single_wide, _CMP_NEQ_UQ));
    } else {
      // s to float is one rounding unless s is on a float midpoint (its 29 dropped bits
      // 1 followed by zeros) and inexact; the float must be finite and normal.
      const __m256i low_bits = _mm256_and_si256(_mm256_castpd_si256(s), _mm256_set1_epi64x(0x1fffffff));
      const __m256d midpoint = _mm256_castsi256_pd(_mm256_cmpeq_epi64(low_bits, _mm256_set1_epi64x(0x10000000)));
      result = single_wide;
      ok = _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(magnitude, _mm256_set1_pd(0x1p-126), _CMP_GT_OQ),
                                       _mm256_cmp_pd(simd::magnitude(single_wide), _mm256_set1_pd(0x1.fffffep127),
                                                     _CMP_LE_OQ)),
                         _mm256_or_pd(first_exact, _mm256_xor_pd(midpoint, all_ones)));
      inexact = _mm256_xor_pd(first_exact, all_ones);
    }
    ok = _mm256_and_pd(product_ok, _mm256_or_pd(ok, exact_zero));
    if (!simd::every_lane(ok)) return false;
    r = result;  // exact zeros come through the conversions with their IEEE signs
    if (_mm256_movemask_pd(_mm256_andnot_pd(exact_zero, inexact)) != 0) flags_ |= INEXACT;
    if (_mm256_movemask_pd(_mm256_and_pd(tiny, _mm256_andnot_pd(exact_zero, inexact))) != 0) flags_ |= UFLO;
    return true;
#else
    (void)f, (void)a, (void)b, (void)c, (void)r;
    return false;
#endif
  }

 private:
  static constexpr double kTiny = 0x1p-900;

  template <class T>
  static T two_sum_error(T a, T b, T s) {
    const T bb = s - a;
    return (a - (s - bb)) + (b - bb);
  }
  static double pow2(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

  // binary32 (IEEE fp32 with its subnormals): the host's float arithmetic rounds as
  // Context does, each operation once; the operands must be fp32 values.
  static bool binary32(const Format& f) {
    return f.fraction_bits() == 23 && f.emin() == -126 && f.subnormals() && f.max_finite() == 0x1.fffffep127;
  }
  static bool binary16(const Format& f) {
    return f.fraction_bits() == 10 && f.emin() == -14 && f.subnormals() && f.max_finite() == 65504.0;
  }
  // A finite fp32 value (false for NaN and infinities).
  static bool float_value(double x) {
    return static_cast<double>(static_cast<float>(x)) == x && std::fabs(x) <= 0x1.fffffep127;
  }

  // Step 3 for a float result r of the host's arithmetic; exact() says whether it is the
  // exact result, asked only where it matters (INEXACT not yet raised, or r tiny).
  template <class Exact>
  bool finish32(float r, const Exact& exact, double& out) {
    const float m = std::fabs(r);
    if (m > 0x1p-126f && m <= 0x1.fffffep127f) {
      if (!(flags_ & INEXACT) && !exact()) flags_ |= INEXACT;
    } else if (!(m <= 0x1p-126f)) {
      return false;  // overflow or NaN
    } else if (!exact()) {
      // |exact| < |r| + half the least subnormal: tiny under both rules below the
      // largest subnormal; at it and at min_normal the rules may differ.
      if (m >= 0x1.fffffcp-127f) return false;
      flags_ |= UFLO | INEXACT;
    }
    out = r;
    return true;
  }

  // s plus a residual of the given sign (zero: s is exact) rounded into f: binary16's
  // common case inline, the rest out of line.
  [[gnu::always_inline]] bool round(const Format& f, double s, double residual, double& result) {
    if (binary16(f) && round16(s, residual, result)) return true;
    return round_general(f, s, residual, result);
  }
  [[gnu::noinline]] bool round_general(const Format& f, double s, double residual, double& result) {
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

  // round() into binary16 for the common case, by the host's conversions: s to float
  // (round to nearest), then to fp16 (F16C, ties to even). The two roundings are one
  // where the first is exact, and otherwise unless the float lies on an fp16 midpoint
  // (its 13 dropped bits 1000000000000, in fp16's normal range), which the general path
  // decides. False, with nothing raised, for |s| outside (min_normal, max_finite].
  [[gnu::always_inline]] bool round16(double s, double residual, double& result) {
    const double a = std::fabs(s);
    if (!(a > 0x1p-14 && a <= 65504.0)) return false;  // (the exact value lies beyond min_normal too)
    const float single = static_cast<float>(s);
    const bool first_exact = static_cast<double>(single) == s && residual == 0;
    if (!first_exact && (std::bit_cast<std::uint32_t>(single) & 0x1fff) == 0x1000) return false;
    const float half = to_half(single);
    if (!(std::fabs(half) <= 65504.0f)) return false;
    if (!first_exact || half != single) flags_ |= INEXACT;
    result = half;
    return true;
  }
  // RNE into fp16 and back.
  static float to_half(float x) {
#if EMU_SIMD
    return _mm_cvtss_f32(simd::to_fp16(_mm_set_ss(x)));
#else
    return static_cast<float>(static_cast<_Float16>(x));
#endif
  }

  Flags flags_ = 0;
};

}  // namespace emu
