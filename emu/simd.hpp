// AVX2/FMA/F16C helpers shared by emu's vectorised kernels (emu/amp.cpp,
// emu/sequential.cpp, emu/nearest.cpp); internal to emu. EMU_SIMD is 1 in builds with those extensions,
// whose kernels are compiled; other builds take the exact paths.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EMU_SIMD 1
#include <immintrin.h>

#include <cfenv>

namespace emu::simd {

inline __m256d magnitude(__m256d x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }
inline bool every_lane(__m256d mask) { return _mm256_movemask_pd(mask) == 0xF; }

// Floats rounded to the nearest fp16 value (ties to even, set in the instruction) and back.
inline __m128 to_fp16(__m128 x) { return _mm_cvtph_ps(_mm_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// All-ones lanes where x is a finite fp16 value: the round trip through fp16 (F16C)
// gives back exactly the fp16 values, and inf only where |x| > 65504.
inline __m256d fp16_values(__m256d x) {
  const __m256d back = _mm256_cvtps_pd(to_fp16(_mm256_cvtpd_ps(x)));
  return _mm256_and_pd(_mm256_cmp_pd(back, x, _CMP_EQ_OQ),
                       _mm256_cmp_pd(magnitude(x), _mm256_set1_pd(65504.0), _CMP_LE_OQ));
}

// All-ones lanes where x is a finite fp32 value (the round trip through float gives it
// back, and it is not infinite).
inline __m256d fp32_values(__m256d x) {
  const __m256d back = _mm256_cvtps_pd(_mm256_cvtpd_ps(x));
  return _mm256_and_pd(_mm256_cmp_pd(back, x, _CMP_EQ_OQ),
                       _mm256_cmp_pd(magnitude(x), _mm256_set1_pd(0x1.fffffep127), _CMP_LE_OQ));
}

// The host's arithmetic and conversions round as emu's rne only under round-to-nearest,
// without flushing of subnormals (results: FTZ; operands: DAZ).
inline bool host_rounds_to_nearest() {
  constexpr unsigned kRoundingControl = 0x6000, kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  return std::fegetround() == FE_TONEAREST &&
         (_mm_getcsr() & (kRoundingControl | kFlushToZero | kDenormalsAreZero)) == 0;
}

}  // namespace emu::simd

#else
#define EMU_SIMD 0
#endif

// EMU_AVX512 is 1 where emu's AVX-512 sections (emu/amp.cpp, emu/convert.cpp, emu/mma.cpp)
// are compiled: gcc builds with EMU_SIMD. Those sections get AVX-512 from `#pragma GCC
// target` around kernels whose bodies are always_inline templates shared with the AVX2
// kernels; clang ignores that pragma and rejects the sections. A clang build (the fuzz
// build, tests/fuzz) leaves them out: their cpu_has_* report false and their names stand
// for the AVX2 kernels, so it runs the AVX2 kernels, bit-identical to the AVX-512 ones
// (the differential tests of tests/amp, tests/convert and tests/mma).
#if EMU_SIMD && defined(__GNUC__) && !defined(__clang__)
#define EMU_AVX512 1
#else
#define EMU_AVX512 0
#endif
