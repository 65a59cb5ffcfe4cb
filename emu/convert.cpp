#include "convert.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace emu {

namespace {

__extension__ typedef unsigned __int128 Uint128;

// A 16-bit IEEE-like target reached from float32: E exponent bits, F fraction bits.
// Constants are float32 bit patterns of magnitudes, or target encodings.
template <int E, int F>
struct Target {
  static_assert(E >= 2 && E <= 8 && F >= 1 && F < 23 && 1 + E + F == 16);
  static constexpr int kBias = (1 << (E - 1)) - 1;
  static constexpr int kFrac = F;
  static constexpr int kDrop = 23 - F;  // float32 fraction bits below the kept ones (normal range)
  // Biased float32 exponent of the target's min normal; below it results are subnormal.
  static constexpr std::uint32_t kMinNormalExp = 128 - kBias;
  static constexpr std::uint32_t kMinNormal = kMinNormalExp << 23;
  // Subtracting kRebias turns a float32 pattern into the target's pattern scaled by 2^kDrop.
  static constexpr std::uint32_t kRebias = (127u - kBias) << 23;
  // The target's exponent range equals float32's (bf16): subnormal results come from
  // float32 subnormals by the same shift as normal ones.
  static constexpr bool kSameRange = kMinNormalExp == 1;
  static constexpr std::uint32_t kInf = ((1u << E) - 1) << F;
  static constexpr std::uint32_t kMax = kInf - 1;
  static constexpr std::uint32_t kNaN = kInf | (1u << (F - 1));  // Format::quiet_nan_bits
  static constexpr std::uint32_t kSign = 1u << (E + F);
};
using Fp16 = Target<5, 10>;
using Bf16 = Target<8, 7>;
static_assert(Fp16::kMinNormal == 0x38800000u);  // 2^-14
static_assert(Fp16::kMax == 0b0'11110'1111111111u);  // (2 - 2^-10) * 2^15 = 65504
static_assert(Bf16::kMax == 0b0'11111110'1111111u);  // (2 - 2^-7) * 2^127

constexpr std::uint32_t kF32Inf = 0x7F800000u;
// The flags as 32-bit lanes, for the branch-free selects of the kernels.
constexpr std::uint32_t kOflo = OFLO, kInv = INV, kUflo = UFLO, kInexact = INEXACT;
constexpr std::uint32_t kTie = 1u << 8;  // not a flag: this element needs the exact tie-break

// Lane masks: all ones when b, else zero; and a select by such a mask.
inline std::uint32_t mask_if(bool b) { return b ? ~0u : 0u; }
inline std::uint32_t select(std::uint32_t mask, std::uint32_t if_set, std::uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// lo <= x <= hi by sign masks, not comparisons: after std::min/max gcc specialises the
// code that follows for each case and blends the copies, which multiplies the work of
// the vectorised loop. Needs |x - lo|, |x - hi| < 2^31.
inline std::int32_t clamp_arith(std::int32_t x, std::int32_t lo, std::int32_t hi) {
  const std::int32_t above = x - lo;  // x = lo + max(above, 0)
  x = lo + (above & ~(above >> 31));
  const std::int32_t below = x - hi;  // x = hi + min(below, 0)
  return hi + (below & (below >> 31));
}

// Loop-invariant inputs of the element kernel that are not template parameters.
struct Controls {
  std::uint32_t sr_shift;  // 32 - sr_bits (0 for exact)
  std::uint32_t tie_mask;  // all ones when sr_bits == 0 (ties r == F settled exactly)
};

// One element: float32 pattern u, random word r -> the target's pattern. Sets `raised`
// to the element's flags, plus kTie (sr_bits == 0 only) when r == F and the bits of f
// beyond F are not all zero. `tie_up` is ORed into the decision: the exact tie-break.
// The flags go out per element, not ORed into an accumulator here: gcc turns such an
// accumulator into a conditional reduction that it does not vectorise.
//
// Steps for finite x, |x| = (m / 2^s) * ulp(result):
//  1. bf16, or subnormals off: m = |x|'s pattern - kRebias (the target's pattern scaled
//     by 2^kDrop), s = kDrop. fp16 with subnormals: m = the significand with its hidden
//     bit, s = max(kDrop, kDrop + kMinNormalExp - exponent), and the exponent field
//     (exponent - kMinNormalExp, or 0) added to the result; a carry out of the kept bits
//     increments the exponent field in both cases. kept = m >> s; rem = the s discarded
//     bits.
//  2. rne: up iff rem + (kept & 1) > half = 2^(s-1) (ties to even); for s > 31,
//     m < 2^24 is below half and rounds down.
//     sr:  F = floor(rem * 2^32 / 2^s); up iff (r >> sr_shift) < (F >> sr_shift)
//     (see convert.hpp).
//  3. enc = kept + up; enc > max pattern means overflow (the Overflow policy decides).
//  4. tiny = |x| < min normal (before rounding); with subnormals on UFLO when tiny and
//     inexact, off: a tiny non-zero x flushes to signed zero with UFLO and INEXACT.
// Conditions are lane masks (all ones or zero) and selects bit operations: bools and
// their conversions would leave control flow that gcc does not vectorise.
template <class T, Rounding Mode, Overflow Policy, bool Subnormals>
inline std::uint32_t round_element(std::uint32_t u, std::uint32_t r, const Controls& c,
                                   std::uint32_t& raised, std::uint32_t tie_up = 0) {
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const auto sa = static_cast<std::int32_t>(a);
  const std::uint32_t sign = (u >> 16) & T::kSign;
  const std::uint32_t tiny = mask_if(sa < static_cast<std::int32_t>(T::kMinNormal));
  std::uint32_t kept, rem, frac32 = 0, tie = 0;
  std::uint32_t exponent_field = 0;  // added to kept + up (variable-shift path only)
  std::uint32_t half = 1u << (T::kDrop - 1);  // of the last kept bit, for rne
  if constexpr (T::kSameRange || !Subnormals) {
    // One shift for all: bf16 (float32 subnormals keep their alignment), or subnormals
    // off (tiny results are flushed below, whatever m says).
    const std::uint32_t m = a - T::kRebias;
    kept = m >> T::kDrop;
    rem = m & ((1u << T::kDrop) - 1);
    frac32 = rem << (32 - T::kDrop);
  } else {
    // Subnormal results: s = kDrop + kMinNormalExp - exponent (t below), from kDrop + 1
    // up to beyond 32 bits. Shifts are clamped below 32 (a C++ shift by >= 32 is
    // undefined): m < 2^24, so for s >= 24 kept is 0 and rem is m anyway.
    static_assert(T::kDrop + T::kMinNormalExp - 1 >= 32, "exponent 0 and 1 share the clamped shifts");
    const auto exponent = static_cast<std::int32_t>(a >> 23);
    // The significand with its hidden bit (none for float32 subnormals), rounded at bit
    // s; the exponent is added afterwards, so one formula serves normal and subnormal
    // results: a carry out of the significand increments the exponent field.
    // (Comparisons and min/max here make gcc duplicate the code that follows per case;
    // sign-bit arithmetic does not.) Hidden bit: 0x7fffff - a wraps iff exponent != 0.
    const std::uint32_t m = (a & 0x007FFFFFu) | (((0x007FFFFFu - a) >> 8) & 0x00800000u);
    const std::int32_t t = T::kDrop + static_cast<std::int32_t>(T::kMinNormalExp) - exponent;
    const auto s_kept = static_cast<std::uint32_t>(clamp_arith(t, T::kDrop, 31));
    const std::int32_t above = exponent - static_cast<std::int32_t>(T::kMinNormalExp);
    const auto biased = static_cast<std::uint32_t>(above & ~(above >> 31));  // max(above, 0)
    exponent_field = biased << T::kFrac;
    kept = m >> s_kept;
    rem = m - (kept << s_kept);
    half = 1u << (s_kept - 1);  // with s_kept clamped to 31, 2^30 > m: down, as it must
    if constexpr (Mode == Rounding::sr) {
      // F = rem << (32 - s) for s <= 32, rem >> (s - 32) beyond: (rem << (32 - s_kept)) is
      // rem * 2 once s_kept is clamped to 31, and `right` takes the rest away.
      const auto right = static_cast<std::uint32_t>(clamp_arith(t - 31, 0, 31));
      const std::uint32_t widened = rem << (32 - s_kept);
      frac32 = widened >> right;
      const std::uint32_t beyond = widened - (frac32 << right);  // bits of f below F
      tie = mask_if(r == frac32) & ~mask_if(beyond == 0) & c.tie_mask & kTie;
    }
  }
  std::uint32_t up;
  if constexpr (Mode == Rounding::rne) {
    up = static_cast<std::int32_t>(rem + (kept & 1u)) > static_cast<std::int32_t>(half) ? 1u : 0u;
  } else {
    up = ((r >> c.sr_shift) < (frac32 >> c.sr_shift) ? 1u : 0u) | tie_up;
  }
  const std::uint32_t enc = exponent_field + kept + up;

  const std::uint32_t special = mask_if(sa > 0x7F7FFFFF);  // inf or NaN: no rounding, no flag
  // Tiny x never overflow (with subnormals off their m has wrapped around).
  const std::uint32_t overflow = ~special & ~tiny & mask_if(static_cast<std::int32_t>(enc) > static_cast<std::int32_t>(T::kMax));
  const std::uint32_t inexact = ~special & ~mask_if(rem == 0);
  std::uint32_t result = sign | enc;
  raised = tie | (inexact & kInexact);
  if constexpr (Subnormals) {
    raised |= tiny & inexact & kUflo;
  } else {
    // Tiny x (zero included) give signed zero; non-zero ones raise UFLO and INEXACT.
    result = select(tiny, sign, result);
    raised = (raised & ~tiny) | (tiny & ~mask_if(a == 0) & (kUflo | kInexact));
  }
  std::uint32_t overflow_result;
  std::uint32_t overflow_flags = kOflo | kInexact;
  if constexpr (Policy == Overflow::inf) {
    overflow_result = sign | T::kInf;  // rne and sr round overflow to infinity
  } else if constexpr (Policy == Overflow::saturate) {
    overflow_result = sign | T::kMax;
  } else {
    overflow_result = T::kNaN;  // emu::round's NaN on overflow is the positive quiet NaN
    overflow_flags |= kInv;
  }
  result = select(overflow, overflow_result, result);
  raised |= overflow & overflow_flags;
  result = select(special, sign | select(mask_if(sa > 0x7F800000), T::kNaN, T::kInf), result);
  return result;
}

// Target pattern -> float32 value (exact: every value of the target is a float32).
template <class T>
inline std::uint32_t to_float_bits(std::uint32_t p) {
  if constexpr (T::kSameRange) {
    return p << T::kDrop;
  } else {
    const std::uint32_t sign = (p & T::kSign) << 16;
    const std::uint32_t magnitude = p & (T::kSign - 1);
    // Normal: re-bias the exponent; inf/NaN: the all-ones field becomes float32's.
    const std::uint32_t rebias = magnitude >= T::kInf ? kF32Inf - (T::kInf << T::kDrop) : T::kRebias;
    const std::uint32_t normal = (magnitude << T::kDrop) + rebias;
    // Subnormal: magnitude * 2^(1 - bias - F), a normal float32 here, and the product is
    // exact, so it does not depend on the rounding mode.
    constexpr float kLeast = 1.0f / static_cast<float>(std::uint64_t{1} << (T::kBias - 1 + T::kFrac));
    const float subnormal = static_cast<float>(static_cast<std::int32_t>(magnitude)) * kLeast;
    return sign | (magnitude < (1u << T::kFrac) ? std::bit_cast<std::uint32_t>(subnormal) : normal);
  }
}

// ---- Philox4x32-10 over a tile of 64 counters (eight blocks per AVX2 step; the scalar
// Philox4x32::block elsewhere). Same constants and counter layout as Philox4x32.
constexpr int kBlocksPerTile = 64;
constexpr int kTile = 4 * kBlocksPerTile;  // elements per tile: one 32-bit word each
constexpr std::uint64_t kTieBreakBlocks = std::uint64_t{1} << 47;
// Philox4x32-10's multipliers and Weyl key increments (Salmon et al., as in rng.cpp).
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

std::array<std::uint32_t, 4> counter_of(const StreamId& id, std::uint64_t block) {
  return {static_cast<std::uint32_t>(block),
          static_cast<std::uint32_t>((block >> 32) & 0xFFFFu) | (std::uint32_t{id.lane} << 16), id.point,
          id.replica};
}

std::array<std::uint32_t, 2> key_of(const StreamId& id) {
  return {static_cast<std::uint32_t>(id.seed), static_cast<std::uint32_t>(id.seed >> 32)};
}

// words[w * kBlocksPerTile + j] = word w of block first_block + j.
void philox_tile(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
  const auto key = key_of(id);
  int j = 0;
#ifdef __AVX2__
  // Eight blocks per step in AVX2 lanes: gcc's own vectorisation of the 32x32->64-bit
  // products is shuffle-bound (about 3x slower than this).
  // The round keys, broadcast once per tile.
  __m256i round_key[10][2];
  {
    std::uint32_t k0 = key[0], k1 = key[1];
    for (auto& rk : round_key) {
      rk[0] = _mm256_set1_epi32(static_cast<int>(k0));
      rk[1] = _mm256_set1_epi32(static_cast<int>(k1));
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
  }
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m256i lane_offsets = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // High and low 32 bits of the lane-wise products m * x.
  auto multiply = [](__m256i m, __m256i x, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(x, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0b10101010);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0b10101010);
  };
  for (; j + 8 <= kBlocksPerTile; j += 8) {
    const std::uint64_t block = first_block + static_cast<std::uint64_t>(j);
    if (static_cast<std::uint32_t>(block) > 0xFFFFFFF8u) break;  // the low word wraps: scalar
    const auto c = counter_of(id, block);  // the 8 blocks differ only in the low word
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c[0])), lane_offsets);
    __m256i x1 = _mm256_set1_epi32(static_cast<int>(c[1]));
    __m256i x2 = _mm256_set1_epi32(static_cast<int>(c[2]));
    __m256i x3 = _mm256_set1_epi32(static_cast<int>(c[3]));
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      multiply(m0, x0, hi0, lo0);
      multiply(m1, x2, hi1, lo1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), round_key[round][0]);
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), round_key[round][1]);
      x1 = lo1;
      x3 = lo0;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + j), x0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + kBlocksPerTile + j), x1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 2 * kBlocksPerTile + j), x2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 3 * kBlocksPerTile + j), x3);
  }
#endif
  for (; j < kBlocksPerTile; ++j) {
    const auto b = Philox4x32::block(key, counter_of(id, first_block + static_cast<std::uint64_t>(j)));
    for (int w = 0; w < 4; ++w) words[w * kBlocksPerTile + j] = b[w];
  }
}

// Exact tie-break for element `index`: up with probability (bits of f beyond F) / 2^d,
// d = s - 32, from the 128 random bits of its own block.
template <class T>
std::uint32_t tie_break_up(const StreamId& id, std::uint64_t index, std::uint32_t u) {
  // A tie exists only for results below the least subnormal with s > 32 discarded bits
  // of the significand m (hidden bit included; float32 subnormals have none).
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const std::uint32_t exponent = a >> 23;
  const std::uint32_t m = (a & 0x007FFFFFu) | (exponent != 0 ? 0x00800000u : 0u);
  const std::uint32_t s = T::kDrop + T::kMinNormalExp - std::max(exponent, 1u);
  const std::uint32_t d = s - 32;  // 1..93 bits of f beyond F
  const std::uint32_t beyond = m & ((1u << std::min(d, 31u)) - 1);
  const auto b = Philox4x32::block(key_of(id), counter_of(id, kTieBreakBlocks + index));
  const Uint128 v = (Uint128{b[0]} << 96) | (Uint128{b[1]} << 64) | (Uint128{b[2]} << 32) | b[3];
  const Uint128 threshold = Uint128{beyond} << (128 - d);  // beyond < 2^d: no overflow
  return v < threshold ? 1u : 0u;
}

// Writes the float32 values of `count` target patterns (exact). fp16 uses the F16C
// instruction where the build has it: widening is exact, and it is the fastest way.
template <class T>
void patterns_to_floats(const std::uint16_t* patterns, float* out, std::size_t count) {
  std::size_t j = 0;
#ifdef __F16C__
  if constexpr (std::is_same_v<T, Fp16>) {
    for (; j + 8 <= count; j += 8)
      _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(patterns + j))));
  }
#endif
  for (; j < count; ++j) out[j] = std::bit_cast<float>(to_float_bits<T>(patterns[j]));
}

#if defined(__F16C__) && defined(__AVX2__)
// fp16 rne with the hardware conversion, which is exact IEEE round-to-nearest-even with
// subnormals and infinities (imm8 rounding, MXCSR default: no DAZ). Integer masks add
// what it lacks: emu's flags (INEXACT when the widened result differs from x, OFLO when
// a finite x gives inf, UFLO when tiny before rounding and inexact), NaN canonicalisation,
// the saturate and nan overflow policies, and the flush of subnormals off; the last three
// are blends done only for vectors that have such a lane. The last n % 8 elements take
// the integer kernel.
template <class Out, Overflow Policy, bool Subnormals>
Flags run_fp16_rne_f16c(const float* in, Out* out, std::size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  const __m256i f32_inf = _mm256_set1_epi32(static_cast<int>(kF32Inf));
  const __m256i min_normal = _mm256_set1_epi32(static_cast<int>(Fp16::kMinNormal));
  __m256i any_inexact = _mm256_setzero_si256(), any_uflo = any_inexact, any_oflo = any_inexact;
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_loadu_ps(in + j);
    __m128i half = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    const __m256i x_bits = _mm256_castps_si256(x);
    const __m256i widened = _mm256_castps_si256(_mm256_cvtph_ps(half));
    const __m256i x_abs = _mm256_and_si256(x_bits, abs_mask);
    const __m256i special = _mm256_cmpgt_epi32(x_abs, max_finite);  // inf or NaN
    const __m256i nan = _mm256_cmpgt_epi32(x_abs, f32_inf);
    const __m256i tiny = _mm256_cmpgt_epi32(min_normal, x_abs);
    // Lanes are all ones or zero; ~special & differs = inexact finite.
    const __m256i inexact = _mm256_andnot_si256(
        _mm256_or_si256(special, _mm256_cmpeq_epi32(widened, x_bits)), _mm256_set1_epi32(-1));
    const __m256i overflow =
        _mm256_andnot_si256(special, _mm256_cmpeq_epi32(_mm256_and_si256(widened, abs_mask), f32_inf));
    any_oflo = _mm256_or_si256(any_oflo, overflow);
    __m256i fix = nan;
    if constexpr (Subnormals) {
      any_inexact = _mm256_or_si256(any_inexact, inexact);
      any_uflo = _mm256_or_si256(any_uflo, _mm256_and_si256(tiny, inexact));
    } else {
      // Tiny non-zero x flush to signed zero with UFLO and INEXACT; exact or not.
      const __m256i flushed = _mm256_andnot_si256(_mm256_cmpeq_epi32(x_abs, _mm256_setzero_si256()), tiny);
      any_inexact = _mm256_or_si256(any_inexact, _mm256_or_si256(_mm256_andnot_si256(tiny, inexact), flushed));
      any_uflo = _mm256_or_si256(any_uflo, flushed);
      fix = _mm256_or_si256(fix, tiny);
    }
    if constexpr (Policy != Overflow::inf) fix = _mm256_or_si256(fix, overflow);
    if (!_mm256_testz_si256(fix, fix)) {
      // Rare: work on 32-bit lanes of the patterns, then pack back to 16 bits.
      __m256i p = _mm256_cvtepu16_epi32(half);
      const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x_bits, 16), _mm256_set1_epi32(Fp16::kSign));
      p = _mm256_blendv_epi8(p, _mm256_or_si256(sign, _mm256_set1_epi32(Fp16::kNaN)), nan);
      if constexpr (!Subnormals) p = _mm256_blendv_epi8(p, sign, tiny);
      if constexpr (Policy == Overflow::saturate)
        p = _mm256_blendv_epi8(p, _mm256_or_si256(sign, _mm256_set1_epi32(Fp16::kMax)), overflow);
      else if constexpr (Policy == Overflow::nan)
        p = _mm256_blendv_epi8(p, _mm256_set1_epi32(Fp16::kNaN), overflow);  // positive, as emu::round
      half = _mm_packus_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    }
    if constexpr (std::is_same_v<Out, float>)
      _mm256_storeu_ps(out + j, _mm256_cvtph_ps(half));
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), half);
  }
  std::uint32_t flags = 0;
  if (!_mm256_testz_si256(any_inexact, any_inexact)) flags |= kInexact;
  if (!_mm256_testz_si256(any_uflo, any_uflo)) flags |= kUflo;
  if (!_mm256_testz_si256(any_oflo, any_oflo)) flags |= kOflo | kInexact | (Policy == Overflow::nan ? kInv : 0u);
  const Controls c{0, 0};
  for (; j < n; ++j) {
    std::uint32_t raised = 0;
    const std::uint32_t p =
        round_element<Fp16, Rounding::rne, Policy, Subnormals>(std::bit_cast<std::uint32_t>(in[j]), 0u, c, raised);
    flags |= raised;
    if constexpr (std::is_same_v<Out, float>)
      out[j] = std::bit_cast<float>(to_float_bits<Fp16>(p));
    else
      out[j] = static_cast<std::uint16_t>(p);
  }
  return static_cast<Flags>(flags);
}
#endif

#if defined(__F16C__) && defined(__AVX2__)
// sr for a tile whose results are all normal and finite: the discarded part of |x| is
// then exactly kDrop bits (rem; 13 for fp16, 16 for bf16), F = rem << (32 - kDrop), and
// the rule of convert.hpp, up iff (r >> (32 - k)) < (F >> (32 - k)), is up iff R < rem
// with R = (r >> (32 - kDrop)) | low_mask, low_mask = 2^(kDrop - k) - 1 for k = sr_bits
// 1..kDrop-1 and 0 otherwise (k = 0 has no tie here). So adding 2^kDrop - 1 - R to
// |x|'s pattern carries into the kept bits exactly when the magnitude rounds up, and
// truncation gives the result: the hardware conversion with rounding toward zero for
// fp16, the top half of the pattern for bf16.
// Returns false, having written garbage, when some lane is tiny, may overflow, is inf
// or NaN, or count is not a multiple of 8: the caller then uses the integer kernel.
template <class T>
bool sr_tile_truncating(const float* in, const std::uint32_t* r, std::size_t count, std::uint32_t low_mask,
                        std::uint16_t* patterns, std::uint32_t& flags) {
  if (count % 8 != 0) return false;
  constexpr std::uint32_t kDropped = (1u << T::kDrop) - 1;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i dropped = _mm256_set1_epi32(static_cast<int>(kDropped));
  const __m256i low = _mm256_set1_epi32(static_cast<int>(low_mask));
  const __m256i min_normal = _mm256_set1_epi32(static_cast<int>(T::kMinNormal));
  // The largest float32 pattern that truncates to a finite result.
  const __m256i max_truncated = _mm256_set1_epi32(static_cast<int>((T::kMax << T::kDrop) + T::kRebias + kDropped));
  __m256i inexact = _mm256_setzero_si256();
  for (std::size_t j = 0; j < count; j += 8) {
    const __m256i x_bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
    const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + j));
    const __m256i a = _mm256_and_si256(x_bits, abs_mask);
    const __m256i complement =
        _mm256_andnot_si256(_mm256_or_si256(_mm256_srli_epi32(words, 32 - T::kDrop), low), dropped);
    const __m256i perturbed = _mm256_add_epi32(a, complement);
    // Tiny, or overflow, inf or NaN (a > max_truncated also catches a wrapped perturbed):
    // give up at once, so that tiles with such lanes waste little work here.
    const __m256i needs_kernel = _mm256_or_si256(
        _mm256_cmpgt_epi32(min_normal, a),
        _mm256_or_si256(_mm256_cmpgt_epi32(perturbed, max_truncated), _mm256_cmpgt_epi32(a, max_truncated)));
    if (!_mm256_testz_si256(needs_kernel, needs_kernel)) return false;
    inexact = _mm256_or_si256(inexact, _mm256_and_si256(a, dropped));
    const __m256i signed_perturbed = _mm256_or_si256(perturbed, _mm256_andnot_si256(abs_mask, x_bits));
    __m128i result;
    if constexpr (T::kSameRange) {  // bf16: the top half
      const __m256i top = _mm256_srli_epi32(signed_perturbed, 16);
      result = _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
    } else {
      result = _mm256_cvtps_ph(_mm256_castsi256_ps(signed_perturbed), _MM_FROUND_TO_ZERO);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(patterns + j), result);
  }
  if (!_mm256_testz_si256(inexact, inexact)) flags |= kInexact;
  return true;
}
#endif

// The whole array, tile by tile. Results go to a local tile first, so `out` may be `in`.
template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals>
Flags run(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first_index) {
#if defined(__F16C__) && defined(__AVX2__)
  if constexpr (std::is_same_v<T, Fp16> && Mode == Rounding::rne)
    return run_fp16_rne_f16c<Out, Policy, Subnormals>(in, out, n);
#endif
  const std::uint32_t sr_bits = how.sr_bits() == 0 ? 32u : static_cast<std::uint32_t>(how.sr_bits());
  const Controls c{32u - sr_bits, how.sr_bits() == 0 ? ~0u : 0u};
  // For sr_tile_truncating: the bits below the k random ones of its kDrop-bit word.
  [[maybe_unused]] const std::uint32_t truncating_low_mask =
      sr_bits < T::kDrop ? (1u << (T::kDrop - sr_bits)) - 1 : 0u;
  std::uint32_t flags = 0;
  alignas(32) std::uint32_t words[kTile];
  alignas(32) std::uint32_t raised[kTile];
  // 32-bit patterns first: with 16-bit results in the same loop, gcc would process 16
  // elements per step in pairs of registers and spill.
  alignas(32) std::uint32_t wide_patterns[kTile];
  alignas(32) std::uint16_t tile_patterns[kTile];
  std::size_t done = 0;
  while (done < n) {
    const std::uint64_t index = first_index + done;
    const std::size_t offset = static_cast<std::size_t>(index % kTile);  // within the tile
    const std::size_t count = std::min<std::size_t>(kTile - offset, n - done);
    const float* src = in + done;
    const std::uint32_t* r = words + offset;
    if constexpr (Mode == Rounding::sr) philox_tile(how.stream(), index / kTile * kBlocksPerTile, words);
    // Bit patterns go straight to `out`; float results via a local tile, since `out`
    // may be `in`.
    std::uint16_t* patterns;
    if constexpr (std::is_same_v<Out, float>)
      patterns = tile_patterns;
    else
      patterns = out + done;
#if defined(__F16C__) && defined(__AVX2__)
    if constexpr (Mode == Rounding::sr) {
      if (sr_tile_truncating<T>(src, r, count, truncating_low_mask, patterns, flags)) {
        if constexpr (std::is_same_v<Out, float>) patterns_to_floats<T>(patterns, out + done, count);
        done += count;
        continue;
      }
    }
#endif
    // Flags per element, ORed in a second loop: gcc does not vectorise the OR inside the
    // first (it becomes a conditional reduction).
    for (std::size_t j = 0; j < count; ++j)
      wide_patterns[j] = round_element<T, Mode, Policy, Subnormals>(std::bit_cast<std::uint32_t>(src[j]),
                                                                    Mode == Rounding::sr ? r[j] : 0u, c, raised[j]);
    std::uint32_t tile_flags = 0;
    for (std::size_t j = 0; j < count; ++j) tile_flags |= raised[j];
    if ((tile_flags & kTie) != 0) {  // rare (2^-32 per deep-tiny fp16 element): settle exactly
      for (std::size_t j = 0; j < count; ++j) {
        if ((raised[j] & kTie) == 0) continue;
        const auto u = std::bit_cast<std::uint32_t>(src[j]);
        const std::uint32_t up = tie_break_up<T>(how.stream(), index + j, u);
        wide_patterns[j] = round_element<T, Mode, Policy, Subnormals>(u, r[j], c, raised[j], up);
      }
    }
    flags |= tile_flags & ~kTie;
    for (std::size_t j = 0; j < count; ++j) patterns[j] = static_cast<std::uint16_t>(wide_patterns[j]);
    if constexpr (std::is_same_v<Out, float>) patterns_to_floats<T>(patterns, out + done, count);
    done += count;
  }
  return static_cast<Flags>(flags);
}

// The runtime choice, once per array.
template <class Out, class T, Rounding Mode, Overflow Policy>
Flags pick_subnormals(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first) {
  return how.subnormals() ? run<Out, T, Mode, Policy, true>(how, in, out, n, first)
                          : run<Out, T, Mode, Policy, false>(how, in, out, n, first);
}

template <class Out, class T, Rounding Mode>
Flags pick_overflow(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first) {
  switch (how.overflow()) {
    case Overflow::inf: return pick_subnormals<Out, T, Mode, Overflow::inf>(how, in, out, n, first);
    case Overflow::saturate: return pick_subnormals<Out, T, Mode, Overflow::saturate>(how, in, out, n, first);
    case Overflow::nan: return pick_subnormals<Out, T, Mode, Overflow::nan>(how, in, out, n, first);
  }
  throw std::logic_error("round_to_bits: unknown overflow policy");
}

template <class Out, class T>
Flags pick_mode(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first) {
  return how.mode() == Rounding::rne ? pick_overflow<Out, T, Rounding::rne>(how, in, out, n, first)
                                     : pick_overflow<Out, T, Rounding::sr>(how, in, out, n, first);
}

template <class Out>
Flags dispatch(const HalfRounding& how, std::span<const float> in, std::span<Out> out, std::uint64_t first) {
  if (in.size() != out.size()) throw std::invalid_argument("round_to_bits: input and output sizes differ");
  return how.is_bf16() ? pick_mode<Out, Bf16>(how, in.data(), out.data(), in.size(), first)
                       : pick_mode<Out, Fp16>(how, in.data(), out.data(), in.size(), first);
}

bool has_layout(const Format& f, int exponent_bits, int fraction_bits) {
  return f.encoding() == Encoding::ieee && f.exponent_bits() == exponent_bits && f.fraction_bits() == fraction_bits;
}

}  // namespace

bool HalfRounding::supports(const Format& format, const RoundSpec& spec) {
  return (has_layout(format, 5, 10) || has_layout(format, 8, 7)) &&
         (spec.mode == Rounding::rne || spec.mode == Rounding::sr) && spec.sr_bits >= 0 && spec.sr_bits <= 32;
}

HalfRounding::HalfRounding(const Format& format, const RoundSpec& spec, StreamId stream)
    : bf16_(has_layout(format, 8, 7)),
      subnormals_(format.subnormals()),
      mode_(spec.mode),
      overflow_(spec.overflow),
      sr_bits_(spec.sr_bits),
      stream_(stream) {
  if (!supports(format, spec))
    throw std::invalid_argument(std::string("fast array rounding supports fp16 and bf16 layouts with rne or sr ") +
                                "(sr_bits 0..32), not " + format.name() + " " + rounding_name(spec.mode));
}

Flags round_to_bits(const HalfRounding& how, std::span<const float> in, std::span<std::uint16_t> out,
                    std::uint64_t first_index) {
  return dispatch<std::uint16_t>(how, in, out, first_index);
}

Flags round_to_float(const HalfRounding& how, std::span<const float> in, std::span<float> out,
                     std::uint64_t first_index) {
  return dispatch<float>(how, in, out, first_index);
}

Flags round_array(const Format& format, const RoundSpec& spec, std::span<const double> in, std::span<double> out,
                  Rng* rng) {
  if (in.size() != out.size()) throw std::invalid_argument("round_array: input and output sizes differ");
  Flags flags = 0;
  for (std::size_t j = 0; j < in.size(); ++j) out[j] = round(format, in[j], spec, rng, flags);
  return flags;
}

}  // namespace emu
