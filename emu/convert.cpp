#include "convert.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "simd.hpp"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__F16C__) && defined(__AVX2__)
#define EMU_CONVERT_AVX2 1
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
// At most 16 discarded bits in the single-shift cases: 16 random bits decide exactly.
static_assert(Fp16::kDrop == 13 && Bf16::kDrop == 16);

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

// ---- The random bits (layout documented in convert.hpp): Philox4x32-10 over a tile of
// 64 counters, with the same constants and counter layout as Philox4x32.
constexpr int kBlocksPerTile = 64;
constexpr int kWordsPerTile = 4 * kBlocksPerTile;  // 256 32-bit words
constexpr int kTile = 2 * kWordsPerTile;           // elements per tile: 16 bits each
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

// Three implementations of one tile of Philox blocks, with the same output:
// words[w * kBlocksPerTile + j] = word w of block first_block + j, for j < 64.
// first_block is a multiple of 64, so the 64 blocks share the counter's words 1..3 and
// their low words do not wrap.
void philox_tile_portable(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
  const auto key = key_of(id);
  for (int j = 0; j < kBlocksPerTile; ++j) {
    const auto b = Philox4x32::block(key, counter_of(id, first_block + static_cast<std::uint64_t>(j)));
    for (int w = 0; w < 4; ++w) words[w * kBlocksPerTile + j] = b[w];
  }
}

#ifdef __AVX2__
// Eight blocks in the lanes of a vector, and four such groups interleaved: one group
// alone is bound by the latency of its products (about 1.5x slower). gcc's own
// vectorisation of the 32x32->64-bit products is shuffle-bound (about 3x slower).
void philox_tile_avx2(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
  constexpr int kGroups = 4;
  static_assert(kBlocksPerTile % (8 * kGroups) == 0);
  const auto key = key_of(id);
  __m256i round_key[10][2];  // broadcast once per tile
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
  // High and low 32 bits of the lane-wise products m * x: the even and odd lanes' 64-bit
  // products give the high halves, the low halves come from the 32-bit multiply.
  auto multiply = [](__m256i m, __m256i x, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(x, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_shuffle_epi32(x, 0xF5), m);
    hi = _mm256_blend_epi32(_mm256_shuffle_epi32(even, 0xF5), odd, 0b10101010);
    lo = _mm256_mullo_epi32(x, m);
  };
  const auto c = counter_of(id, first_block);
  for (int j = 0; j < kBlocksPerTile; j += 8 * kGroups) {
    __m256i x0[kGroups], x1[kGroups], x2[kGroups], x3[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      x0[g] = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c[0] + static_cast<std::uint32_t>(j + 8 * g))),
                               lane_offsets);
      x1[g] = _mm256_set1_epi32(static_cast<int>(c[1]));
      x2[g] = _mm256_set1_epi32(static_cast<int>(c[2]));
      x3[g] = _mm256_set1_epi32(static_cast<int>(c[3]));
    }
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 4
      for (int g = 0; g < kGroups; ++g) {
        __m256i hi0, lo0, hi1, lo1;
        multiply(m0, x0[g], hi0, lo0);
        multiply(m1, x2[g], hi1, lo1);
        x0[g] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[g]), round_key[round][0]);
        x2[g] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[g]), round_key[round][1]);
        x1[g] = lo1;
        x3[g] = lo0;
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      std::uint32_t* w = words + j + 8 * g;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w), x0[g]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + kBlocksPerTile), x1[g]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + 2 * kBlocksPerTile), x2[g]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + 3 * kBlocksPerTile), x3[g]);
    }
  }
}

#endif

// The 16 random bits r of element e (0..511) of a tile: the low half of word e for the
// first 256 elements, the high half of word e - 256 for the others.
inline std::uint32_t tile_bits(const std::uint32_t* words, std::size_t e) {
  return (words[e % kWordsPerTile] >> (16 * (e / kWordsPerTile))) & 0xFFFFu;
}

// The exact tie-break of element `index` (float32 pattern u, random bits r): 1 iff the
// discarded fraction f of |x| has more than 16 bits (fp16, |x| < 2^-17), its top 16
// bits F16 equal r, and the bits beyond them, beta = f 2^16 - F16 (d bits), decide up
// against the 128-bit number v of block 2^47 + index (word 0 most significant):
//   sr_bits 0:        v / 2^128 < beta, probability beta;
//   sr_bits k > 16:   the top k - 16 bits of both compared: floor(v 2^(k-16) / 2^128) <
//                     floor(beta 2^(k-16)).
// (sr_bits 1..16 never ask.) 0 for everything else: r alone decides there.
template <class T>
std::uint32_t tie_break_up(const StreamId& id, std::uint64_t index, std::uint32_t u, std::uint32_t r,
                           int sr_bits) {
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a >= kF32Inf) return 0;
  const std::uint32_t exponent = a >> 23;
  // The significand with its hidden bit (none for float32 subnormals) and its s discarded
  // bits: kDrop, plus one per binade below the min normal (exponent 0 scales as 1).
  const std::uint32_t m = (a & 0x007FFFFFu) | (exponent != 0 ? 0x00800000u : 0u);
  const std::uint32_t s = T::kDrop + T::kMinNormalExp - std::min(std::max(exponent, 1u), T::kMinNormalExp);
  if (s <= 16) return 0;
  const std::uint32_t rem = s >= 32 ? m : m & ((1u << s) - 1);
  const std::uint32_t d = s - 16;  // 1..109
  const std::uint32_t f16 = d >= 32 ? 0u : rem >> d;
  const std::uint32_t beyond = d >= 32 ? rem : rem & ((1u << d) - 1);  // < 2^min(d, 24)
  if (f16 != r || beyond == 0) return 0;
  const auto b = Philox4x32::block(key_of(id), counter_of(id, kTieBreakBlocks + index));
  const Uint128 v = (Uint128{b[0]} << 96) | (Uint128{b[1]} << 64) | (Uint128{b[2]} << 32) | b[3];
  const Uint128 threshold = Uint128{beyond} << (128 - d);  // beta 2^128, below 2^128
  if (sr_bits == 0) return v < threshold ? 1u : 0u;
  const int kept_bits = sr_bits - 16;  // 1..16
  return (v >> (128 - kept_bits)) < (threshold >> (128 - kept_bits)) ? 1u : 0u;
}

// ---- The portable kernel: one element at a time, integer code on the float32 pattern
// (builds without AVX2 and F16C; the groups of eight that the vector kernels refuse;
// detail::round_to_bits_with 0).

// Loop-invariant inputs of the element kernel that are not template parameters.
struct Controls {
  std::uint32_t low;       // sr: 2^(16 - k) - 1 for k = sr_bits 1..15, else 0 (ORed into r)
  std::uint32_t tie_mask;  // all ones when sr_bits is 0 or above 16 (r == F16 may need more bits)
};

Controls controls_for(const HalfRounding& how) {
  const int k = how.sr_bits();
  return {k >= 1 && k < 16 ? (1u << (16 - k)) - 1 : 0u, k == 0 || k > 16 ? ~0u : 0u};
}

// One element: float32 pattern u, random bits r (16, sr only) -> the target's pattern.
// Sets `raised` to the element's flags, plus kTie when r == F16 and the fraction has
// bits beyond F16 that the tie-break must weigh (fp16 with |x| < 2^-17 only). `tie_up`
// is ORed into the decision: the exact tie-break.
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
//     sr:  F16 = floor(rem * 2^16 / 2^s); up iff (r | low) < F16, where low fills the
//     bits below the k used ones (convert.hpp: floor(rho 2^k) < floor(f 2^k)).
//  3. enc = kept + up; enc > max pattern means overflow (the Overflow policy decides).
//  4. tiny = |x| < min normal (before rounding); with subnormals on UFLO when tiny and
//     inexact, off: a tiny non-zero x flushes to signed zero with UFLO and INEXACT.
template <class T, Rounding Mode, Overflow Policy, bool Subnormals>
inline std::uint32_t round_element(std::uint32_t u, std::uint32_t r, const Controls& c, std::uint32_t& raised,
                                   std::uint32_t tie_up = 0) {
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const auto sa = static_cast<std::int32_t>(a);
  const std::uint32_t sign = (u >> 16) & T::kSign;
  const std::uint32_t tiny = mask_if(sa < static_cast<std::int32_t>(T::kMinNormal));
  std::uint32_t kept, rem, f16 = 0, tie = 0;
  std::uint32_t exponent_field = 0;  // added to kept + up (variable-shift path only)
  std::uint32_t half = 1u << (T::kDrop - 1);  // of the last kept bit, for rne
  if constexpr (T::kSameRange || !Subnormals) {
    // One shift for all: bf16 (float32 subnormals keep their alignment), or subnormals
    // off (tiny results are flushed below, whatever m says).
    const std::uint32_t m = a - T::kRebias;
    kept = m >> T::kDrop;
    rem = m & ((1u << T::kDrop) - 1);
    f16 = rem << (16 - T::kDrop);
  } else {
    // Subnormal results: s = kDrop + kMinNormalExp - exponent (t below), from kDrop + 1
    // up to beyond 32 bits. Shifts are clamped below 32 (a C++ shift by >= 32 is
    // undefined): m < 2^24, so for s >= 24 kept is 0 and rem is m anyway.
    static_assert(T::kDrop + T::kMinNormalExp - 1 >= 16 + 31, "exponent 0 and 1 share the clamped shifts");
    const auto exponent = static_cast<std::int32_t>(a >> 23);
    const std::uint32_t m = (a & 0x007FFFFFu) | (exponent != 0 ? 0x00800000u : 0u);
    const std::int32_t t = T::kDrop + static_cast<std::int32_t>(T::kMinNormalExp) - exponent;
    const auto s_kept = static_cast<std::uint32_t>(clamp_arith(t, T::kDrop, 31));
    const std::int32_t above = exponent - static_cast<std::int32_t>(T::kMinNormalExp);
    const auto biased = static_cast<std::uint32_t>(above & ~(above >> 31));  // max(above, 0)
    exponent_field = biased << T::kFrac;
    kept = m >> s_kept;
    rem = m - (kept << s_kept);
    half = 1u << (s_kept - 1);  // with s_kept clamped to 31, 2^30 > m: down, as it must
    if constexpr (Mode == Rounding::sr) {
      // F16 = rem << (16 - s) for s <= 16, rem >> (s - 16) beyond (0 once s - 16 >= 24).
      const auto left = static_cast<std::uint32_t>(clamp_arith(16 - t, 0, 16 - T::kDrop));
      const auto right = static_cast<std::uint32_t>(clamp_arith(t - 16, 0, 31));
      f16 = (rem << left) >> right;
      const std::uint32_t beyond = rem & ((1u << right) - 1);  // bits of f below F16
      tie = mask_if(r == f16) & ~mask_if(beyond == 0) & c.tie_mask & kTie;
    }
  }
  std::uint32_t up;
  if constexpr (Mode == Rounding::rne) {
    up = static_cast<std::int32_t>(rem + (kept & 1u)) > static_cast<std::int32_t>(half) ? 1u : 0u;
  } else {
    up = ((r | c.low) < f16 ? 1u : 0u) | tie_up;
  }
  const std::uint32_t enc = exponent_field + kept + up;

  const std::uint32_t special = mask_if(sa > 0x7F7FFFFF);  // inf or NaN: no rounding, no flag
  // Tiny x never overflow (with subnormals off their m has wrapped around).
  const std::uint32_t overflow =
      ~special & ~tiny & mask_if(static_cast<std::int32_t>(enc) > static_cast<std::int32_t>(T::kMax));
  const std::uint32_t inexact = ~special & ~mask_if(rem == 0);
  std::uint32_t result = sign | enc;
  raised = (tie & ~special) | (inexact & kInexact);
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

// Elements [j, j + count) of a tile (in[0] has index `first`) by the portable kernel,
// with the exact tie-break: the groups that the vector kernels refuse (an inf or NaN
// lane, or a tie candidate). Reads in[e] before it writes out[e]: `out` may be `in`.
template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals>
[[gnu::noinline, gnu::cold]] void portable_group(const HalfRounding& how, std::uint64_t first, const float* in,
                                                 Out* out, const std::uint32_t* words, int j, int count,
                                                 std::uint32_t& flags) {
  const Controls c = controls_for(how);
  for (int e = j; e < j + count; ++e) {
    const auto u = std::bit_cast<std::uint32_t>(in[e]);
    const std::uint32_t r = Mode == Rounding::sr ? tile_bits(words, static_cast<std::size_t>(e)) : 0u;
    std::uint32_t raised = 0;
    std::uint32_t p = round_element<T, Mode, Policy, Subnormals>(u, r, c, raised);
    if ((raised & kTie) != 0) {
      const std::uint64_t index = first + static_cast<std::uint64_t>(e);
      p = round_element<T, Mode, Policy, Subnormals>(u, r, c, raised,
                                                     tie_break_up<T>(how.stream(), index, u, r, how.sr_bits()));
    }
    flags |= raised & ~kTie;
    if constexpr (std::is_same_v<Out, float>)
      out[e] = std::bit_cast<float>(to_float_bits<T>(p));
    else
      out[e] = static_cast<std::uint16_t>(p);
  }
}

// Prefetch hints (they never fault, so addresses beyond the array are harmless).
inline void prefetch(const void* p) { __builtin_prefetch(p, 0); }
inline void prefetch_for_write(const void* p) { __builtin_prefetch(p, 1); }

#ifdef EMU_CONVERT_AVX2
// ---- The vector kernels of bf16 and fp16 (rne and sr): one body for every
// instruction set, over a traits type Isa (Avx2 and Avx512 below: the vector and mask
// types, kLanes lanes of 32 bits, and the operations). Branch-free over the finite lane
// classes (normal, subnormal, zero, overflowing results) by masks and selects; a vector
// with an inf or NaN lane, or with a tie candidate, goes to the portable kernel.
//
// gcc compiles a function for the instruction set in force where it is defined, not
// where it is instantiated. So every function here is always_inline, and each Isa's
// round_tile, defined in that instruction set's section with the traits' operations,
// is the function the body (round_tile_body) is compiled into. Nothing here is compiled
// on its own, and vectors go in and out by reference: no function here has a vector ABI.
// gcc still warns where AVX-512 vectors come back from the traits into code outside
// their section: silenced for this section only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// Flags of many vectors, accumulated lane-wise: a lane that ends non-zero raises. (No
// default member initialisers: gcc would compile the implicit constructor for the
// build's instruction set.)
template <class Isa>
struct VectorFlags {
  typename Isa::Vec inexact;  // OR of rem (INEXACT)
  typename Isa::Vec uflo;     // OR of the rem of tiny lanes (UFLO), subnormals on
  typename Isa::Vec flush;    // OR of |x| of tiny lanes (UFLO, INEXACT), subnormals off
  typename Isa::Vec max_enc;  // the largest rounded magnitude, never negative: OFLO when above max

  template <class T, Overflow Policy>
  [[gnu::always_inline]] std::uint32_t raised() const {
    std::uint32_t flags = 0;
    if (Isa::any_nonzero(inexact)) flags |= kInexact;
    if (Isa::any_nonzero(uflo)) flags |= kUflo;
    if (Isa::any_nonzero(flush)) flags |= kUflo | kInexact;
    if (Isa::any(Isa::greater(max_enc, Isa::splat(T::kMax))))
      flags |= kOflo | kInexact | (Policy == Overflow::nan ? kInv : 0u);
    return flags;
  }
};

// What all finite lanes need once the rounded magnitude enc (the target's pattern,
// possibly beyond max) and the discarded bits rem are known:
//  1. The overflow policy on enc > max: inf: min(enc, inf pattern); saturate: min(enc,
//     max); nan: the positive quiet NaN. Then the sign.
//  2. Subnormals off: tiny lanes (|x| < min normal; their enc has wrapped around) become
//     signed zero.
//  3. Flags: INEXACT from rem (not of tiny lanes with subnormals off); UFLO from
//     `tiny_rem` (non-zero iff tiny and inexact) or, subnormals off, from tiny non-zero
//     |x|; OFLO from the largest enc.
template <class Isa, class T, Overflow Policy, bool Subnormals, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline void finish(const Vec& x, const Vec& a, const Vec& enc, const Vec& rem,
                                          const Vec& tiny_rem, VectorFlags<Isa>& flags, Vec& result) {
  const Vec sign = Isa::bit_and(Isa::shift_right(x, 16), Isa::splat(T::kSign));
  if constexpr (Policy == Overflow::inf)
    result = Isa::bit_or(sign, Isa::min(enc, Isa::splat(T::kInf)));
  else if constexpr (Policy == Overflow::saturate)
    result = Isa::bit_or(sign, Isa::min(enc, Isa::splat(T::kMax)));
  else  // positive, as emu::round
    result = Isa::select(Isa::greater(enc, Isa::splat(T::kMax)), Isa::splat(T::kNaN), Isa::bit_or(sign, enc));
  if constexpr (Subnormals) {
    flags.inexact = Isa::bit_or(flags.inexact, rem);
    flags.uflo = Isa::bit_or(flags.uflo, tiny_rem);
    flags.max_enc = Isa::max(flags.max_enc, enc);
  } else {
    const auto tiny = Isa::greater(Isa::splat(T::kMinNormal), a);
    result = Isa::select(tiny, sign, result);
    flags.inexact = Isa::or_unless(tiny, flags.inexact, rem);
    flags.flush = Isa::or_where(tiny, flags.flush, a);
    flags.max_enc = Isa::max_unless(tiny, flags.max_enc, enc);
  }
}

// bf16, rne or sr: |x|'s pattern a has exactly 16 discarded bits (float32 subnormals
// give bf16 subnormals by the same shift), so rounding is adding a 16-bit c to a and
// keeping the top half: the sum carries into the kept bits exactly when the magnitude
// rounds up.
//   rne: c = 0x7FFF + (kept & 1): carries iff rem > 1/2 ulp, or rem == 1/2 and kept odd.
//   sr:  c = 0xFFFF - r (r with the low bits filled): carries iff rem > r, i.e. r < F16.
// a + c stays below 2^31 for finite a, and enc = (a + c) >> 16 is at most the inf pattern.
// Returns false (having accumulated nothing) when a lane is inf or NaN.
template <class Isa, Rounding Mode, Overflow Policy, bool Subnormals, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline bool bf16_vector(const Vec& x, const Vec& r, VectorFlags<Isa>& flags, Vec& result) {
  const Vec a = Isa::bit_and(x, Isa::splat(0x7FFFFFFF));
  if (Isa::any(Isa::greater(a, Isa::splat(0x7F7FFFFF)))) return false;
  Vec c;
  if constexpr (Mode == Rounding::rne)
    c = Isa::add(Isa::splat(0x7FFF), Isa::bit_and(Isa::shift_right(a, 16), Isa::splat(1)));
  else
    c = Isa::bit_xor(r, Isa::splat(0xFFFF));
  const Vec enc = Isa::shift_right(Isa::add(a, c), 16);
  const Vec rem = Isa::bit_and(a, Isa::splat(0xFFFF));
  Vec tiny_rem = Isa::zero();
  if constexpr (Subnormals) tiny_rem = Isa::keep_where(Isa::greater(Isa::splat(Bf16::kMinNormal), a), rem);
  finish<Isa, Bf16, Policy, Subnormals>(x, a, enc, rem, tiny_rem, flags, result);
  return true;
}

// fp16 sr. Every finite lane first as a normal result, like bf16 with 13 discarded bits
// (v = a - kRebias is the target's pattern scaled by 2^13; tiny lanes wrap around, and
// with subnormals off finish flushes them). Subnormals on, a vector with a tiny lane
// (|x| < 2^-14) is done one of two ways, by the instruction set:
// (a) With mask registers (AVX-512), the tiny lanes are redone in units of the least
//     subnormal 2^-24 by exact float32 arithmetic, merged by masked moves (about 25%
//     fewer instructions than (b) there):
//  1. y = |x| 2^40 by adding 40 to a's exponent field: exact for normal x, below 2^26.
//     (Float32 subnormals get exponent 40 with their fraction, below 2^-86 like the
//     true product, so their kept and F16 are 0 all the same.)
//  2. t = trunc(y) (below 2^26: an int32); kept = t >> 16, F16 = t's low 16 bits.
//  3. Inexact iff y differs from its multiple of 2^16, t with the low 16 bits cleared,
//     converted back (exact below 2^26): their patterns' difference, non-zero exactly
//     then, stands for rem; min(rem, a) makes it 0 for x = 0 (whose y is not). Integer
//     differences, truncation and exact conversions: nothing depends on MXCSR's
//     rounding mode or its flushing of subnormals.
// (b) Without them (AVX2: a merge is a blend, and (a) was slower there), one formula for
//     every finite lane, with per-lane shifts (a count of 32 or more gives 0, which the
//     formulas below rely on):
//  1. c = min(max(exponent - 1, 0), 112): scaled = a - c 2^23 is v for normal results
//     (c = 112 = 127 - 15), and the significand with its hidden bit for subnormal ones,
//     with s = 125 - c discarded bits (13 + d, d = 112 - c binades below 2^-14; float32
//     subnormals scale as exponent 1).
//  2. kept = scaled >> s, rem = its low s bits; F16 = (rem << 3) >> d (rem < 2^24: no bit
//     lost to the left shift).
//  3. min(rem, d) is non-zero iff the lane is tiny (d > 0) and inexact.
// Then for every lane: up iff r < F16 (r with the low bits filled for sr_bits 1..15;
// both below 2^16, so the signed comparison is the unsigned one); enc = kept + up (a
// carry into the exponent field is the right result: the next binade, or the min normal
// from the largest subnormal). Tiny lanes' rem raises UFLO.
// Returns false (having accumulated nothing) when a lane is inf or NaN or, with Ties, a
// lane of a vector with a tiny lane has r == F16 (a tiny one may need the tie-break;
// probability 2^-16 per lane).
template <class Isa, Overflow Policy, bool Subnormals, bool Ties, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline bool fp16_sr_vector(const Vec& x, const Vec& r, VectorFlags<Isa>& flags, Vec& result) {
  const Vec a = Isa::bit_and(x, Isa::splat(0x7FFFFFFF));
  auto rare = Isa::greater(a, Isa::splat(0x7F7FFFFF));
  // (No lambda for the normal lanes: it would be compiled for the build's instruction
  // set, not this Isa's, and call the traits' operations.)
  const Vec v = Isa::sub(a, Isa::splat(Fp16::kRebias));
  Vec kept = Isa::shift_right(v, Fp16::kDrop);
  Vec rem = Isa::bit_and(v, Isa::splat((1u << Fp16::kDrop) - 1));
  Vec f16 = Isa::shift_left(rem, 16 - Fp16::kDrop);
  Vec tiny_rem = Isa::zero();
  bool subnormal_results = false;
  auto tiny = rare;
  if constexpr (Subnormals) {
    tiny = Isa::greater(Isa::splat(Fp16::kMinNormal), a);
    subnormal_results = Isa::any(tiny);
  }
  if (!subnormal_results) {
    // the normal lanes' results above
  } else if constexpr (Isa::kMaskRegisters) {
    const Vec y = Isa::add(a, Isa::splat(40u << 23));
    const Vec t = Isa::truncate_float(y);
    const Vec multiple = Isa::int_to_float(Isa::bit_and(t, Isa::splat(0xFFFF0000u)));
    kept = Isa::select(tiny, Isa::shift_right(t, 16), kept);
    f16 = Isa::select(tiny, Isa::bit_and(t, Isa::splat(0xFFFF)), f16);
    tiny_rem = Isa::keep_where(tiny, Isa::min_unsigned(Isa::sub(y, multiple), a));
    rem = Isa::select(tiny, tiny_rem, rem);
  } else {
    const Vec exponent = Isa::shift_right(a, 23);
    const Vec c = Isa::min(Isa::max(Isa::sub(exponent, Isa::splat(1)), Isa::zero()), Isa::splat(112));
    const Vec scaled = Isa::sub(a, Isa::shift_left(c, 23));
    const Vec s = Isa::sub(Isa::splat(125), c);
    const Vec d = Isa::sub(Isa::splat(112), c);
    kept = Isa::shift_right_each(scaled, s);
    rem = Isa::and_not(Isa::shift_left_each(Isa::splat(~0u), s), scaled);
    f16 = Isa::shift_right_each(Isa::shift_left(rem, 3), d);
    tiny_rem = Isa::min_unsigned(rem, d);
  }
  if constexpr (Ties)
    if (subnormal_results) rare = Isa::either(rare, Isa::equal(f16, r));
  if (Isa::any(rare)) return false;
  const Vec enc = Isa::increment_where(Isa::greater(f16, r), kept);
  finish<Isa, Fp16, Policy, Subnormals>(x, a, enc, rem, tiny_rem, flags, result);
  return true;
}

// fp16 rne by the hardware conversion (Isa::fp16_rne), exact IEEE round-to-nearest-even
// with subnormals and overflow to infinity: enc is its magnitude (the inf pattern, above
// max, where x overflows: finish applies the policy and raises OFLO), and x differs from
// the widened result exactly where it was inexact, so their XOR stands for rem. Returns
// false (having accumulated nothing) when a lane is inf or NaN (NaN canonicalisation is
// the portable kernel's).
template <class Isa, Overflow Policy, bool Subnormals, class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline bool fp16_rne_vector(const Vec& x, VectorFlags<Isa>& flags, Vec& result) {
  const Vec a = Isa::bit_and(x, Isa::splat(0x7FFFFFFF));
  if (Isa::any(Isa::greater(a, Isa::splat(0x7F7FFFFF)))) return false;
  Vec patterns, widened;
  Isa::fp16_rne(x, patterns, widened);
  const Vec enc = Isa::bit_and(patterns, Isa::splat(0x7FFF));
  const Vec rem = Isa::bit_xor(widened, x);
  Vec tiny_rem = Isa::zero();
  if constexpr (Subnormals) tiny_rem = Isa::keep_where(Isa::greater(Isa::splat(Fp16::kMinNormal), a), rem);
  finish<Isa, Fp16, Policy, Subnormals>(x, a, enc, rem, tiny_rem, flags, result);
  return true;
}

// Stores the patterns of p (32-bit lanes) as Out at `out`.
template <class Isa, class Out, class T>
[[gnu::always_inline]] inline void store_patterns(Out* out, const typename Isa::Vec& p) {
  if constexpr (std::is_same_v<Out, float> && T::kSameRange)
    Isa::store(out, Isa::shift_left(p, 16));  // bf16 values are their patterns in the top half of a float32
  else if constexpr (std::is_same_v<Out, float>)
    Isa::store_fp16_as_floats(out, p);
  else
    Isa::store_low_halves(out, p);
}

// The vector at j of a tile, with the random bits of the tile's low (elements 0..255:
// the low halves of the words) or high half (256..511: the high halves); stores its
// results and returns true, or false, storing nothing, where the vector kernel refuses it.
template <class Isa, class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals, bool Ties, bool High,
          class Vec = typename Isa::Vec>
[[gnu::always_inline]] inline bool round_vector(const float* in, Out* out, const std::uint32_t* words, const Vec& low2,
                                                int j, VectorFlags<Isa>& flags) {
  // The next tile's lines: with this much work per element, the hardware prefetchers
  // alone leave the loop waiting for memory (about 2x slower on arrays beyond the caches).
  prefetch(in + j + kTile);
  prefetch_for_write(out + j + kTile);
  const Vec x = Isa::load(in + j);
  Vec r = Isa::zero();
  if constexpr (Mode == Rounding::sr) {
    const Vec w = Isa::bit_or(Isa::load_aligned(words + j % kWordsPerTile), low2);
    r = High ? Isa::shift_right(w, 16) : Isa::bit_and(w, Isa::splat(0xFFFF));
  }
  Vec p;
  bool vectorised;
  if constexpr (std::is_same_v<T, Bf16>) {
    vectorised = bf16_vector<Isa, Mode, Policy, Subnormals>(x, r, flags, p);
  } else if constexpr (Mode == Rounding::sr) {
    vectorised = fp16_sr_vector<Isa, Policy, Subnormals, Ties>(x, r, flags, p);
  } else {
    vectorised = fp16_rne_vector<Isa, Policy, Subnormals>(x, flags, p);
  }
  if (vectorised) [[likely]]
    store_patterns<Isa, Out, T>(out + j, p);
  return vectorised;
}

// One tile (elements [begin, end) of kTile from `in`, multiples of kLanes; index of
// in[0] = `first`, random words `words`, `low` = the low-bit filler of r); returns the
// flags raised. Vectors that the vector kernels refuse are left unwritten and redone by
// the portable kernel after the loops, so that the loops themselves have no call (a call
// would make every vector register caller-saved: gcc then keeps the accumulators in
// memory and rebuilds the constants in every iteration, about 1.5x slower). A vector's
// results are stored after it is loaded and the refused ones are not stored at all:
// `out` may be `in`.
template <class Isa, class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals, bool Ties>
[[gnu::always_inline]] inline std::uint32_t round_tile_body(const HalfRounding& how, const float* in, Out* out,
                                                            const std::uint32_t* words, std::uint32_t low,
                                                            std::uint64_t first, int begin, int end) {
  constexpr int kLanes = Isa::kLanes;
  static_assert(kTile / kLanes <= 64, "one bit per vector of the tile");
  const typename Isa::Vec low2 = Isa::splat(low | (low << 16));
  VectorFlags<Isa> flags{Isa::zero(), Isa::zero(), Isa::zero(), Isa::zero()};
  std::uint64_t refused = 0;  // bit j / kLanes: the vector at j
  for (int j = begin; j < std::min(end, kWordsPerTile); j += kLanes)
    if (!round_vector<Isa, Out, T, Mode, Policy, Subnormals, Ties, false>(in, out, words, low2, j, flags))
      refused |= std::uint64_t{1} << (j / kLanes);
  for (int j = std::max(begin, kWordsPerTile); j < end; j += kLanes)
    if (!round_vector<Isa, Out, T, Mode, Policy, Subnormals, Ties, true>(in, out, words, low2, j, flags))
      refused |= std::uint64_t{1} << (j / kLanes);
  std::uint32_t raised = flags.template raised<T, Policy>();
  for (; refused != 0; refused &= refused - 1)
    portable_group<Out, T, Mode, Policy, Subnormals>(how, first, in, out, words, kLanes * std::countr_zero(refused),
                                                     kLanes, raised);
  return raised;
}

#pragma GCC diagnostic pop
#endif  // EMU_CONVERT_AVX2

#ifdef __AVX2__
bool cpu_has_avx512f() {
  static const bool has = EMU_AVX512 && __builtin_cpu_supports("avx512f");
  return has;
}

// ---- AVX-512F code, compiled for that instruction set here (the build asks only for
// AVX2) and chosen at run time on CPUs that have it. Only inline functions take or
// return 512-bit vectors: such an argument would change the ABI of a function compiled
// without AVX-512. gcc 12's AVX-512 headers trip -W(maybe-)uninitialized (their
// _mm512_undefined placeholders) when the instruction set comes from a pragma rather
// than the command line; silenced for this section only.
#if EMU_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Philox: sixteen blocks per vector, the whole tile's four groups at once, and three-way
// XORs in one instruction; about 2.4x the words per second of the AVX2 version on the
// benchmark machine (AMD Zen 5).
void philox_tile_avx512(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
  constexpr int kGroups = kBlocksPerTile / 16;
  const auto key = key_of(id);
  const auto c = counter_of(id, first_block);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  const __m512i lane_offsets = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // High and low halves of the lane-wise products m * x. The 32-bit multiply
  // (vpmulld) would take two multiplier uops per vector, the shuffles none: on Intel
  // cores the multiplier port bounds this loop.
  auto multiply = [](__m512i m, __m512i x, __m512i& hi, __m512i& lo) {
    const __m512i even = _mm512_mul_epu32(x, m);                           // lanes 0, 2, ..
    const __m512i odd = _mm512_mul_epu32(_mm512_shuffle_epi32(x, _MM_PERM_DDBB), m);  // lanes 1, 3, ..
    hi = _mm512_mask_shuffle_epi32(odd, 0x5555, even, _MM_PERM_DDBB);  // even lanes: their top half
    lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CCAA);  // odd lanes: their bottom half
  };
  __m512i x0[kGroups], x1[kGroups], x2[kGroups], x3[kGroups];
  for (int g = 0; g < kGroups; ++g) {
    x0[g] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c[0] + static_cast<std::uint32_t>(16 * g))),
                             lane_offsets);
    x1[g] = _mm512_set1_epi32(static_cast<int>(c[1]));
    x2[g] = _mm512_set1_epi32(static_cast<int>(c[2]));
    x3[g] = _mm512_set1_epi32(static_cast<int>(c[3]));
  }
  std::uint32_t k0 = key[0], k1 = key[1];
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    const __m512i round_key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i round_key1 = _mm512_set1_epi32(static_cast<int>(k1));
#pragma GCC unroll 4
    for (int g = 0; g < kGroups; ++g) {
      // Both halves of the products from the even and odd lanes' 64-bit products, each
      // gathered by one masked shuffle; then x0 = hi1 ^ x1 ^ k0, x2 = hi0 ^ x3 ^ k1.
      __m512i hi0, lo0, hi1, lo1;
      multiply(m0, x0[g], hi0, lo0);
      multiply(m1, x2[g], hi1, lo1);
      x0[g] = _mm512_ternarylogic_epi32(hi1, x1[g], round_key0, 0x96);  // 0x96: a ^ b ^ c
      x2[g] = _mm512_ternarylogic_epi32(hi0, x3[g], round_key1, 0x96);
      x1[g] = lo1;
      x3[g] = lo0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int g = 0; g < kGroups; ++g) {
    std::uint32_t* w = words + 16 * g;
    _mm512_storeu_si512(w, x0[g]);
    _mm512_storeu_si512(w + kBlocksPerTile, x1[g]);
    _mm512_storeu_si512(w + 2 * kBlocksPerTile, x2[g]);
    _mm512_storeu_si512(w + 3 * kBlocksPerTile, x3[g]);
  }
}

#ifdef EMU_CONVERT_AVX2
// The vector kernels' instruction set (see round_tile_body) on sixteen lanes, with
// comparisons into mask registers and masked operations for the selects.
struct Avx512 {
  using Vec = __m512i;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;

  static Vec splat(std::uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
  static Vec zero() { return _mm512_setzero_si512(); }
  static Vec load(const float* p) { return _mm512_loadu_si512(p); }
  static Vec load_aligned(const std::uint32_t* p) { return _mm512_load_si512(p); }
  static void store(float* p, Vec v) { _mm512_storeu_si512(p, v); }
  // The lanes' low 16 bits (patterns below 2^16), as they are or as the float32 values
  // of fp16 patterns (the F16C conversion: exact).
  static void store_low_halves(std::uint16_t* p, Vec v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  static void store_fp16_as_floats(float* p, Vec v) { _mm512_storeu_ps(p, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))); }
  // The fp16 patterns of the float32 lanes x by the hardware's rne (MXCSR default: no
  // DAZ), zero-extended, and their float32 values.
  static void fp16_rne(Vec x, Vec& patterns, Vec& widened) {
    const __m256i half = _mm512_cvtps_ph(_mm512_castsi512_ps(x), _MM_FROUND_TO_NEAREST_INT);
    patterns = _mm512_cvtepu16_epi32(half);
    widened = _mm512_castps_si512(_mm512_cvtph_ps(half));
  }

  static Vec bit_and(Vec a, Vec b) { return _mm512_and_si512(a, b); }
  static Vec bit_or(Vec a, Vec b) { return _mm512_or_si512(a, b); }
  static Vec bit_xor(Vec a, Vec b) { return _mm512_xor_si512(a, b); }
  static Vec and_not(Vec a, Vec b) { return _mm512_andnot_si512(a, b); }  // ~a & b
  static Vec add(Vec a, Vec b) { return _mm512_add_epi32(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_epi32(a, b); }
  static Vec shift_left(Vec v, unsigned n) { return _mm512_slli_epi32(v, n); }
  static Vec shift_right(Vec v, unsigned n) { return _mm512_srli_epi32(v, n); }
  static Vec min(Vec a, Vec b) { return _mm512_min_epi32(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_epi32(a, b); }
  static Vec min_unsigned(Vec a, Vec b) { return _mm512_min_epu32(a, b); }
  static constexpr bool kMaskRegisters = true;  // selects are single masked moves
  // Float32 lanes (patterns) truncated to int32, and int32 lanes to float32 patterns.
  static Vec truncate_float(Vec v) { return _mm512_cvttps_epi32(_mm512_castsi512_ps(v)); }
  static Vec int_to_float(Vec v) { return _mm512_castps_si512(_mm512_cvtepi32_ps(v)); }

  static Mask greater(Vec a, Vec b) { return _mm512_cmpgt_epi32_mask(a, b); }  // signed
  static Mask equal(Vec a, Vec b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static Mask either(Mask a, Mask b) { return static_cast<Mask>(a | b); }
  static bool any(Mask m) { return m != 0; }
  static bool any_nonzero(Vec v) { return _mm512_test_epi32_mask(v, v) != 0; }
  static Vec select(Mask m, Vec if_set, Vec if_clear) { return _mm512_mask_mov_epi32(if_clear, m, if_set); }
  static Vec keep_where(Mask m, Vec v) { return _mm512_maskz_mov_epi32(m, v); }  // 0 where m is clear
  static Vec increment_where(Mask m, Vec v) { return _mm512_mask_add_epi32(v, m, v, splat(1)); }
  static Vec or_where(Mask m, Vec acc, Vec v) { return _mm512_mask_or_epi32(acc, m, acc, v); }
  static Vec or_unless(Mask m, Vec acc, Vec v) { return _mm512_mask_or_epi32(acc, static_cast<Mask>(~m), acc, v); }
  static Vec max_unless(Mask m, Vec acc, Vec v) { return _mm512_mask_max_epi32(acc, static_cast<Mask>(~m), acc, v); }

  // The kernel of one tile and the random words, compiled here for AVX-512F.
  template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals, bool Ties>
  static std::uint32_t round_tile(const HalfRounding& how, const float* in, Out* out, const std::uint32_t* words,
                                  std::uint32_t low, std::uint64_t first, int begin, int end) {
    return round_tile_body<Avx512, Out, T, Mode, Policy, Subnormals, Ties>(how, in, out, words, low, first, begin, end);
  }
  static void philox_tile(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
    philox_tile_avx512(id, first_block, words);
  }
};
#endif  // EMU_CONVERT_AVX2

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
// never chosen: cpu_has_avx512f() is false where EMU_AVX512 is 0 (simd.hpp)
constexpr auto philox_tile_avx512 = philox_tile_avx2;
#ifdef EMU_CONVERT_AVX2
struct Avx2;
using Avx512 = Avx2;
#endif
#endif  // EMU_AVX512
#endif  // __AVX2__

// The whole array with the portable kernel, tile by tile. Results go to a local tile
// first, so `out` may be `in`.
template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals>
Flags run_scalar(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first_index) {
  const Controls c = controls_for(how);
  std::uint32_t flags = 0;
  alignas(32) std::uint32_t words[kWordsPerTile];
  alignas(32) std::uint32_t bits[kTile];
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
    if constexpr (Mode == Rounding::sr) {
      philox_tile_portable(how.stream(), index / kTile * kBlocksPerTile, words);
      for (std::size_t j = 0; j < count; ++j) bits[j] = tile_bits(words, offset + j);
    } else {
      std::fill(bits, bits + count, 0u);  // rne reads no random bits
    }
    std::uint16_t* patterns;
    if constexpr (std::is_same_v<Out, float>)
      patterns = tile_patterns;
    else
      patterns = out + done;
    // Flags per element, ORed in a second loop: gcc does not vectorise the OR inside the
    // first (it becomes a conditional reduction).
    for (std::size_t j = 0; j < count; ++j)
      wide_patterns[j] = round_element<T, Mode, Policy, Subnormals>(std::bit_cast<std::uint32_t>(src[j]), bits[j], c,
                                                                    raised[j]);
    std::uint32_t tile_flags = 0;
    for (std::size_t j = 0; j < count; ++j) tile_flags |= raised[j];
    if ((tile_flags & kTie) != 0) {  // rare (2^-16 per fp16 element below 2^-17): settle exactly
      for (std::size_t j = 0; j < count; ++j) {
        if ((raised[j] & kTie) == 0) continue;
        const auto u = std::bit_cast<std::uint32_t>(src[j]);
        const std::uint32_t up = tie_break_up<T>(how.stream(), index + j, u, bits[j], how.sr_bits());
        wide_patterns[j] = round_element<T, Mode, Policy, Subnormals>(u, bits[j], c, raised[j], up);
      }
    }
    flags |= tile_flags & ~kTie;
    for (std::size_t j = 0; j < count; ++j) patterns[j] = static_cast<std::uint16_t>(wide_patterns[j]);
    if constexpr (std::is_same_v<Out, float>) patterns_to_floats<T>(patterns, out + done, count);
    done += count;
  }
  return static_cast<Flags>(flags);
}

#ifdef EMU_CONVERT_AVX2
// ---- The AVX2 and F16C kernels, eight elements per vector: the vector kernels above,
// on AVX2 or (run_vector) on AVX-512F.

// The vector kernels' instruction set (see round_tile_body) on eight lanes; masks are
// vectors of all-ones or zero lanes.
struct Avx2 {
  using Vec = __m256i;
  using Mask = __m256i;
  static constexpr int kLanes = 8;

  static Vec splat(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static Vec zero() { return _mm256_setzero_si256(); }
  static Vec load(const float* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vec load_aligned(const std::uint32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(float* p, Vec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  // The lanes' low 16 bits (patterns below 2^16: the unsigned saturation of the pack
  // keeps them), as they are or as the float32 values of fp16 patterns (F16C: exact).
  static __m128i low_halves(Vec v) {
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  }
  static void store_low_halves(std::uint16_t* p, Vec v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), low_halves(v));
  }
  static void store_fp16_as_floats(float* p, Vec v) { _mm256_storeu_ps(p, _mm256_cvtph_ps(low_halves(v))); }
  static void fp16_rne(Vec x, Vec& patterns, Vec& widened) {
    const __m128i half = _mm256_cvtps_ph(_mm256_castsi256_ps(x), _MM_FROUND_TO_NEAREST_INT);
    patterns = _mm256_cvtepu16_epi32(half);
    widened = _mm256_castps_si256(_mm256_cvtph_ps(half));
  }

  static Vec bit_and(Vec a, Vec b) { return _mm256_and_si256(a, b); }
  static Vec bit_or(Vec a, Vec b) { return _mm256_or_si256(a, b); }
  static Vec bit_xor(Vec a, Vec b) { return _mm256_xor_si256(a, b); }
  static Vec and_not(Vec a, Vec b) { return _mm256_andnot_si256(a, b); }  // ~a & b
  static Vec add(Vec a, Vec b) { return _mm256_add_epi32(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_epi32(a, b); }
  static Vec shift_left(Vec v, int n) { return _mm256_slli_epi32(v, n); }
  static Vec shift_right(Vec v, int n) { return _mm256_srli_epi32(v, n); }
  static Vec min(Vec a, Vec b) { return _mm256_min_epi32(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_epi32(a, b); }
  static Vec min_unsigned(Vec a, Vec b) { return _mm256_min_epu32(a, b); }
  static constexpr bool kMaskRegisters = false;  // selects are blends
  static Vec shift_left_each(Vec v, Vec n) { return _mm256_sllv_epi32(v, n); }
  static Vec shift_right_each(Vec v, Vec n) { return _mm256_srlv_epi32(v, n); }

  static Mask greater(Vec a, Vec b) { return _mm256_cmpgt_epi32(a, b); }  // signed
  static Mask equal(Vec a, Vec b) { return _mm256_cmpeq_epi32(a, b); }
  static Mask either(Mask a, Mask b) { return _mm256_or_si256(a, b); }
  static bool any(Mask m) { return !_mm256_testz_si256(m, m); }
  static bool any_nonzero(Vec v) { return !_mm256_testz_si256(v, v); }
  static Vec select(Mask m, Vec if_set, Vec if_clear) { return _mm256_blendv_epi8(if_clear, if_set, m); }
  static Vec keep_where(Mask m, Vec v) { return _mm256_and_si256(m, v); }  // 0 where m is clear
  static Vec increment_where(Mask m, Vec v) { return _mm256_sub_epi32(v, m); }  // m's lanes are -1 or 0
  static Vec or_where(Mask m, Vec acc, Vec v) { return _mm256_or_si256(acc, _mm256_and_si256(m, v)); }
  static Vec or_unless(Mask m, Vec acc, Vec v) { return _mm256_or_si256(acc, _mm256_andnot_si256(m, v)); }
  // acc is never negative (VectorFlags::max_enc), so the 0 of a masked lane changes nothing.
  static Vec max_unless(Mask m, Vec acc, Vec v) { return _mm256_max_epi32(acc, _mm256_andnot_si256(m, v)); }

  // The kernel of one tile and the random words, compiled for the build's AVX2.
  template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals, bool Ties>
  static std::uint32_t round_tile(const HalfRounding& how, const float* in, Out* out, const std::uint32_t* words,
                                  std::uint32_t low, std::uint64_t first, int begin, int end) {
    return round_tile_body<Avx2, Out, T, Mode, Policy, Subnormals, Ties>(how, in, out, words, low, first, begin, end);
  }
  static void philox_tile(const StreamId& id, std::uint64_t first_block, std::uint32_t* words) {
    philox_tile_avx2(id, first_block, words);
  }
};

// The whole array, tile by tile, with Isa's kernels and random words. A tile that the
// array covers only in part (at most the first and the last) goes through a local copy,
// its vectors padded with zeros (which raise nothing).
template <class Isa, class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals, bool Ties>
Flags run_vector(const HalfRounding& how, const float* in, Out* out, std::size_t n, std::uint64_t first_index) {
  constexpr int kLanes = Isa::kLanes;
  const std::uint32_t low = controls_for(how).low;
  std::uint32_t flags = 0;
  alignas(64) std::uint32_t words[kWordsPerTile];
  alignas(64) float local_in[kTile];
  alignas(64) Out local_out[kTile];
  auto round_tile = [&](const float* tile_in, Out* tile_out, std::uint64_t tile_first, int begin, int end) {
    flags |= Isa::template round_tile<Out, T, Mode, Policy, Subnormals, Ties>(how, tile_in, tile_out, words, low,
                                                                             tile_first, begin, end);
  };
  std::size_t done = 0;
  while (done < n) {
    const std::uint64_t index = first_index + done;
    const std::size_t offset = static_cast<std::size_t>(index % kTile);  // within the tile
    const std::size_t count = std::min<std::size_t>(kTile - offset, n - done);
    if constexpr (Mode == Rounding::sr) Isa::philox_tile(how.stream(), index / kTile * kBlocksPerTile, words);
    const std::uint64_t tile_first = index - offset;
    if (count == kTile) {
      round_tile(in + done, out + done, tile_first, 0, kTile);
    } else {
      // Only the vectors that hold the array's elements.
      const int begin = static_cast<int>(offset) / kLanes * kLanes;
      const int end = (static_cast<int>(offset + count) + kLanes - 1) / kLanes * kLanes;
      std::fill(local_in + begin, local_in + end, 0.0f);
      std::copy(in + done, in + done + count, local_in + offset);
      round_tile(local_in, local_out, tile_first, begin, end);
      std::copy(local_out + offset, local_out + offset + count, out + done);
    }
    done += count;
  }
  return static_cast<Flags>(flags);
}
#endif  // EMU_CONVERT_AVX2

// Which kernels: the portable one (and Philox), the AVX2 and F16C ones (and Philox), or
// those with AVX-512F for Philox and the rounding.
enum class Kernels { portable, avx2, avx512 };

bool available(Kernels kernels) {
#ifdef EMU_CONVERT_AVX2
  return kernels != Kernels::avx512 || cpu_has_avx512f();
#else
  return kernels == Kernels::portable;
#endif
}

Kernels fastest_kernels() {
  return available(Kernels::avx512) ? Kernels::avx512 : available(Kernels::avx2) ? Kernels::avx2 : Kernels::portable;
}

template <class Out, class T, Rounding Mode, Overflow Policy, bool Subnormals>
Flags run(Kernels kernels, const HalfRounding& how, const float* in, Out* out, std::size_t n,
          std::uint64_t first_index) {
#ifdef EMU_CONVERT_AVX2
  if (kernels != Kernels::portable) {
    auto with = [&](auto isa) {
      using Isa = decltype(isa);
      // Ties need the tie-break only for fp16 with subnormal results and sr_bits 0 or > 16.
      if constexpr (std::is_same_v<T, Fp16> && Mode == Rounding::sr && Subnormals) {
        if (controls_for(how).tie_mask != 0)
          return run_vector<Isa, Out, T, Mode, Policy, Subnormals, true>(how, in, out, n, first_index);
      }
      return run_vector<Isa, Out, T, Mode, Policy, Subnormals, false>(how, in, out, n, first_index);
    };
    return kernels == Kernels::avx512 ? with(Avx512{}) : with(Avx2{});
  }
#endif
  return run_scalar<Out, T, Mode, Policy, Subnormals>(how, in, out, n, first_index);
}

// The runtime choice, once per array.
template <class Out, class T, Rounding Mode, Overflow Policy>
Flags pick_subnormals(Kernels kernels, const HalfRounding& how, const float* in, Out* out, std::size_t n,
                      std::uint64_t first) {
  return how.subnormals() ? run<Out, T, Mode, Policy, true>(kernels, how, in, out, n, first)
                          : run<Out, T, Mode, Policy, false>(kernels, how, in, out, n, first);
}

template <class Out, class T, Rounding Mode>
Flags pick_overflow(Kernels kernels, const HalfRounding& how, const float* in, Out* out, std::size_t n,
                    std::uint64_t first) {
  switch (how.overflow()) {
    case Overflow::inf: return pick_subnormals<Out, T, Mode, Overflow::inf>(kernels, how, in, out, n, first);
    case Overflow::saturate:
      return pick_subnormals<Out, T, Mode, Overflow::saturate>(kernels, how, in, out, n, first);
    case Overflow::nan: return pick_subnormals<Out, T, Mode, Overflow::nan>(kernels, how, in, out, n, first);
  }
  throw std::logic_error("round_to_bits: unknown overflow policy");
}

template <class Out, class T>
Flags pick_mode(Kernels kernels, const HalfRounding& how, const float* in, Out* out, std::size_t n,
                std::uint64_t first) {
  return how.mode() == Rounding::rne ? pick_overflow<Out, T, Rounding::rne>(kernels, how, in, out, n, first)
                                     : pick_overflow<Out, T, Rounding::sr>(kernels, how, in, out, n, first);
}

template <class Out>
Flags dispatch(Kernels kernels, const HalfRounding& how, std::span<const float> in, std::span<Out> out,
               std::uint64_t first) {
  if (in.size() != out.size()) throw std::invalid_argument("round_to_bits: input and output sizes differ");
  return how.is_bf16() ? pick_mode<Out, Bf16>(kernels, how, in.data(), out.data(), in.size(), first)
                       : pick_mode<Out, Fp16>(kernels, how, in.data(), out.data(), in.size(), first);
}

bool has_layout(const Format& f, int exponent_bits, int fraction_bits) {
  return f.ieee_like() && f.exponent_bits() == exponent_bits && f.fraction_bits() == fraction_bits;
}

}  // namespace

bool HalfRounding::supports(const Format& format, const RoundSpec& spec) {
  return (has_layout(format, 5, 10) || has_layout(format, 8, 7)) &&
         (spec.mode == Rounding::rne || spec.mode == Rounding::sr) && spec.sr_bits >= 0 && spec.sr_bits <= 32 &&
         spec.tininess == Tininess::before;
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
                                "(sr_bits 0..32) and tininess before rounding, not " + format.name() + " " +
                                rounding_name(spec.mode) + " tininess " + tininess_name(spec.tininess) +
                                " (round_array takes every spec)");
}

Flags round_to_bits(const HalfRounding& how, std::span<const float> in, std::span<std::uint16_t> out,
                    std::uint64_t first_index) {
  return dispatch<std::uint16_t>(fastest_kernels(), how, in, out, first_index);
}

Flags round_to_float(const HalfRounding& how, std::span<const float> in, std::span<float> out,
                     std::uint64_t first_index) {
  return dispatch<float>(fastest_kernels(), how, in, out, first_index);
}

namespace detail {

std::optional<Flags> round_to_bits_with(int implementation, const HalfRounding& how, std::span<const float> in,
                                        std::span<std::uint16_t> out, std::uint64_t first_index) {
  if (implementation < 0 || implementation > 2) return std::nullopt;
  const auto kernels = static_cast<Kernels>(implementation);
  if (!available(kernels)) return std::nullopt;
  return dispatch<std::uint16_t>(kernels, how, in, out, first_index);
}

std::optional<Flags> round_to_float_with(int implementation, const HalfRounding& how, std::span<const float> in,
                                         std::span<float> out, std::uint64_t first_index) {
  if (implementation < 0 || implementation > 2) return std::nullopt;
  const auto kernels = static_cast<Kernels>(implementation);
  if (!available(kernels)) return std::nullopt;
  return dispatch<float>(kernels, how, in, out, first_index);
}

bool philox_tile_words(int implementation, const StreamId& stream, std::uint64_t tile,
                       std::span<std::uint32_t, 256> words) {
  static_assert(kWordsPerTile == 256);
  const std::uint64_t first_block = tile * kBlocksPerTile;
  switch (implementation) {
    case 0: philox_tile_portable(stream, first_block, words.data()); return true;
#ifdef __AVX2__
    case 1: philox_tile_avx2(stream, first_block, words.data()); return true;
    case 2:
      if (!cpu_has_avx512f()) return false;
      philox_tile_avx512(stream, first_block, words.data());
      return true;
#endif
    default: return false;
  }
}

}  // namespace detail

Flags round_array(const Format& format, const RoundSpec& spec, std::span<const double> in, std::span<double> out,
                  Rng* rng) {
  if (in.size() != out.size()) throw std::invalid_argument("round_array: input and output sizes differ");
  Flags flags = 0;
  for (std::size_t j = 0; j < in.size(); ++j) out[j] = round(format, in[j], spec, rng, flags);
  return flags;
}

}  // namespace emu
