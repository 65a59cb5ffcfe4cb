// Array rounding: float32 arrays into fp16 or bf16 with fast, vectorisable kernels, and
// a generic loop over emu::round for any format and mode.
//
// The fast kernels give the same bits and flags as emu::round (see round.hpp): rne,
// and sr with exact probabilities or with k random bits, under every Overflow policy,
// with subnormals on or off, tininess decided before rounding. The runtime choice
// (format, mode, policy, subnormals) is made once per call. In builds with AVX2 and
// F16C the elements go through branch-free vector code, eight lanes at a time whatever
// mix of normal, subnormal, zero and overflowing results they hold: fp16 rne with the
// hardware conversion (exact) for the values and integer masks for the flags, overflow
// policies and the flush of subnormals off; bf16 (rne and sr) and fp16 sr with integer
// code on the float32 bit patterns (per-lane shifts for fp16's subnormal results), where
// a group of eight with an inf or NaN input (or with an element whose first 16 random
// bits may not decide, see below) takes the portable kernel. On CPUs with AVX-512F
// (chosen at run time) the random words and every kernel use it, sixteen lanes at a
// time. Other builds take the portable element-wise kernel throughout. All give the same
// results (detail::round_to_bits_with; the tests compare them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "format.hpp"
#include "rng.hpp"
#include "round.hpp"
#include "status.hpp"

namespace emu {

// A validated configuration for the fast kernels: the only type they accept.
//
// Stochastic rounding (spec.mode == sr) takes its random bits from the Philox4x32-10
// stream `stream` (same key and counter layout as emu::Philox4x32), as a pure function
// of the element's index, so results do not depend on threads or on how an array is cut
// into calls. Element i (its index counted from `first_index` of the call) has a random
// fraction rho in [0, 1) of 144 bits, most significant first:
//   r, 16 bits:  tile t = i / 512, e = i % 512, q = e % 256, h = e / 256:
//                r = bits 16h .. 16h + 15 of word (q / 64) of block (64 t + q % 64),
//                i.e. elements 0..255 of a tile take the low halves of its 256 words,
//                elements 256..511 the high halves;
//   then 128 bits: words 0, 1, 2, 3 of block 2^47 + i.
// With f the discarded fraction of |x| (in ulps of the result, 0 <= f < 1), the
// magnitude rounds up iff
//     sr_bits == 0 (exact):  rho < f, so P(up) == f;
//     sr_bits == k, 1..32:   floor(rho 2^k) < floor(f 2^k), P(up) = floor(f 2^k) / 2^k:
// k random bits are added (as their complement) below the kept bits and the sum is
// truncated, as emu::round documents for sr_bits = k. rho has enough bits: f has at
// most 125 (fp16 results of float32 subnormals). The first 16 bits decide unless
// r == floor(f 2^16), f has bits beyond its first 16 (more than 16 discarded bits: only
// fp16 with |x| < 2^-17, whose results are subnormal; never bf16, always 16 discarded
// bits, nor fp16 normal results, 13) and sr_bits is 0 or above 16; only then
// (probability 2^-16 per such element) is block 2^47 + i generated. Main bits come from
// blocks below 2^44 and tie-break blocks from 2^47 + i, so indices must stay below
// 2^47. Give the kernel a lane of its own (StreamId::lane) if the same stream also
// feeds an emu::Rng.
class HalfRounding {
 public:
  // Throws std::invalid_argument unless `format` has fp16's or bf16's layout (IEEE
  // encoding, 5+10 or 8+7 bits; subnormals on or off), spec.mode is rne or sr,
  // spec.sr_bits is 0..32 and spec.tininess is before (the kernels decide UFLO and the
  // flush before rounding; round_array honours `after`).
  HalfRounding(const Format& format, const RoundSpec& spec, StreamId stream = {});
  // Whether the constructor would accept these.
  static bool supports(const Format& format, const RoundSpec& spec);

  bool is_bf16() const { return bf16_; }
  bool subnormals() const { return subnormals_; }
  Rounding mode() const { return mode_; }
  Overflow overflow() const { return overflow_; }
  int sr_bits() const { return sr_bits_; }
  const StreamId& stream() const { return stream_; }

 private:
  bool bf16_;
  bool subnormals_;
  Rounding mode_;
  Overflow overflow_;
  int sr_bits_;
  StreamId stream_;
};

// Rounds in[j] and writes its bit pattern (sign, exponent, fraction of the 16-bit
// format) to out[j]; in.size() must equal out.size() (std::invalid_argument otherwise).
// NaN gives the canonical quiet NaN with the input's sign (Format::quiet_nan_bits), as
// emu::round followed by Format::encode does. first_index = the index of in[0] in the
// random stream (sr only): rounding an array in pieces with their offsets equals one
// call. Returns the OR of the raised flags (OFLO, INV, UFLO, INEXACT).
Flags round_to_bits(const HalfRounding& how, std::span<const float> in, std::span<std::uint16_t> out,
                    std::uint64_t first_index = 0);
// The same, writing the rounded values as float32 (every fp16 and bf16 value is one; NaN
// as the float quiet NaN 0x7fc00000 with its sign). `out` may be `in` itself.
Flags round_to_float(const HalfRounding& how, std::span<const float> in, std::span<float> out,
                     std::uint64_t first_index = 0);

namespace detail {
// For tests, which check every implementation this build and CPU offer (round_to_bits
// and round_to_float take the fastest): round_to_bits / round_to_float through the
// kernels of implementation 0 (portable, element by element: builds without AVX2 and
// F16C), 1 (AVX2 and F16C: CPUs without AVX-512F) or 2 (1 with AVX-512F for the random
// words and the rounding, chosen at run time where the CPU has it); all give the same
// results. nullopt where this build or CPU lacks the implementation.
std::optional<Flags> round_to_bits_with(int implementation, const HalfRounding& how, std::span<const float> in,
                                        std::span<std::uint16_t> out, std::uint64_t first_index = 0);
std::optional<Flags> round_to_float_with(int implementation, const HalfRounding& how, std::span<const float> in,
                                         std::span<float> out, std::uint64_t first_index = 0);
// The Philox words of tile `tile` (words[w * 64 + j] = word w of block 64 tile + j) from
// implementation 0 (portable), 1 (AVX2) or 2 (AVX-512F); false, leaving `words` alone,
// where this build or CPU lacks it.
bool philox_tile_words(int implementation, const StreamId& stream, std::uint64_t tile,
                       std::span<std::uint32_t, 256> words);
}  // namespace detail

// Any format, any mode: out[j] = round(format, in[j], spec, rng, flags), element by
// element through the scalar emu::round, in index order (so sr consumes `rng`
// sequentially; rng may be null unless spec.mode == sr). `out` may be `in` itself.
// Returns the OR of the raised flags.
Flags round_array(const Format& format, const RoundSpec& spec, std::span<const double> in,
                  std::span<double> out, Rng* rng);

}  // namespace emu
