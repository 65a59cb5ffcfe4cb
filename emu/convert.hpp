// Array rounding: float32 arrays into fp16 or bf16 with fast, vectorisable kernels, and
// a generic loop over emu::round for any format and mode.
//
// The fast kernels give the same bits and flags as emu::round (see round.hpp): rne,
// and sr with exact probabilities or with k random bits, under every Overflow policy,
// with subnormals on or off, tininess decided before rounding. The runtime choice
// (format, mode, policy, subnormals) is made once per call; the loop is branch-free
// integer code on the float32 bit patterns, except fp16 rne in builds with F16C and
// AVX2: the hardware conversion (exact) gives the values, integer masks the flags,
// NaN canonicalisation, overflow policies and the flush of subnormals off; and sr in
// builds with F16C and AVX2, for runs of 256 elements whose results are all normal and
// finite: the random bits are added below the kept bits and the sum truncated (F16C for
// fp16), which is the same decision as the rule below; other runs take the integer code.
#pragma once

#include <cstddef>
#include <cstdint>
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
// into calls. Element i (its index counted from `first_index` of the call) uses one
// 32-bit word r:
//     tile t = i / 256, e = i % 256:  r = word (e / 64) of block (64 t + e % 64).
// With f the discarded fraction of |x| (in ulps of the result, 0 <= f < 1) and
// F = floor(f * 2^32), the magnitude rounds up iff
//     sr_bits == 0 (exact):  r < F, or r == F and a tie-break below says up;
//     sr_bits == k, 1..32:   (r >> (32 - k)) < (F >> (32 - k)),
// i.e. k random bits are added (as their complement) below the kept bits and the sum is
// truncated: P(up) = floor(f 2^k) / 2^k, as emu::round documents for sr_bits = k.
// F == f * 2^32 exactly whenever the discarded part has at most 32 bits: always for
// bf16 (16 discarded bits), and for fp16 whenever |x| >= 2^-33 (13 bits for normal
// results, 14..32 for subnormal ones). Below 2^-33 (fp16 only; such x round to 0 or to
// the least subnormal 2^-24) f has up to 125 bits: with sr_bits == 0 the rare case
// r == F (probability 2^-32) is settled exactly by the 128 bits of block 2^47 + i of the
// same stream, so P(up) == f; with sr_bits == 32 it rounds down, a bias toward zero of
// less than 2^-32 ulp. Main words come from blocks below 2^45 and tie-breaks from
// blocks 2^47 + i, so indices must stay below 2^47. Give the kernel a lane of its own
// (StreamId::lane) if the same stream also feeds an emu::Rng.
class HalfRounding {
 public:
  // Throws std::invalid_argument unless `format` has fp16's or bf16's layout (IEEE
  // encoding, 5+10 or 8+7 bits; subnormals on or off), spec.mode is rne or sr, and
  // spec.sr_bits is 0..32.
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

// Any format, any mode: out[j] = round(format, in[j], spec, rng, flags), element by
// element through the scalar emu::round, in index order (so sr consumes `rng`
// sequentially; rng may be null unless spec.mode == sr). `out` may be `in` itself.
// Returns the OR of the raised flags.
Flags round_array(const Format& format, const RoundSpec& spec, std::span<const double> in,
                  std::span<double> out, Rng* rng);

}  // namespace emu
