// The stochastic rounding rule of emu/convert.hpp, written again from its documentation
// for the tests: which random bits element i gets, and whether its magnitude rounds up.
// Built on emu::Philox4x32::block and exact double arithmetic, with Boost's cpp_int for
// the 144-bit comparison; it shares no code with the kernels.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include <boost/multiprecision/cpp_int.hpp>

#include "emu/format.hpp"
#include "emu/rng.hpp"
#include "emu/round.hpp"
#include "emu/status.hpp"

namespace documented {

inline emu::Philox4x32::Block block(const emu::StreamId& id, std::uint64_t index) {
  const emu::Philox4x32::Block counter = {static_cast<std::uint32_t>(index),
                                          static_cast<std::uint32_t>(index >> 32) | (std::uint32_t{id.lane} << 16),
                                          id.point, id.replica};
  const auto key = std::array<std::uint32_t, 2>{static_cast<std::uint32_t>(id.seed),
                                                static_cast<std::uint32_t>(id.seed >> 32)};
  return emu::Philox4x32::block(key, counter);
}

// r: tile t = i / 512, e = i % 512, q = e % 256, h = e / 256: bits 16h..16h+15 of word
// q / 64 of block 64 t + q % 64.
inline std::uint32_t r_bits(const emu::StreamId& id, std::uint64_t i) {
  const std::uint64_t t = i / 512, e = i % 512, q = e % 256, h = e / 256;
  return (block(id, 64 * t + q % 64)[q / 64] >> (16 * h)) & 0xFFFFu;
}

// The same for a whole tile at once (the exhaustive test): r of elements 512 t .. 512 t + 511.
inline std::array<std::uint16_t, 512> tile_r_bits(const emu::StreamId& id, std::uint64_t t) {
  std::array<std::uint16_t, 512> out{};
  for (std::uint64_t b = 0; b < 64; ++b) {
    const auto words = block(id, 64 * t + b);
    for (std::uint64_t w = 0; w < 4; ++w)
      for (std::uint64_t h = 0; h < 2; ++h)
        out[256 * h + 64 * w + b] = static_cast<std::uint16_t>(words[w] >> (16 * h));
  }
  return out;
}

// An integer-valued double (|y| < 2^1024) as a cpp_int, exactly.
inline boost::multiprecision::cpp_int exact_integer(double y) {
  int exponent = 0;
  const double mantissa = std::frexp(y, &exponent);  // y = mantissa 2^exponent, |mantissa| in [0.5, 1)
  boost::multiprecision::cpp_int m = static_cast<std::int64_t>(std::ldexp(mantissa, 53));
  if (exponent >= 53) return m << (exponent - 53);
  return m >> (53 - exponent);  // y is an integer: no bit lost
}

// Whether element i (random bits r = r_bits(id, i)) with discarded fraction f (an exact
// double in [0, 1), in ulps of the result) rounds up: rho = r 2^-16 + v 2^-144 with v the
// 128 bits of block 2^47 + i (word 0 most significant); up iff floor(rho 2^K) <
// floor(f 2^K), K = sr_bits, or 144 for sr_bits 0. The 128 bits are read only when the
// first 16 do not decide (as the documentation says the kernel does).
inline bool rounds_up(const emu::StreamId& id, std::uint64_t i, std::uint32_t r, double f, int sr_bits) {
  const int k = sr_bits == 0 ? 144 : sr_bits;
  const double scaled = std::ldexp(f, 16);
  const auto f16 = static_cast<std::uint32_t>(std::floor(scaled));  // exact: f has at most 53 bits
  if (k <= 16) return (r >> (16 - k)) < (f16 >> (16 - k));
  if (r != f16) return r < f16;
  if (scaled == f16) return false;  // rho >= r 2^-16 = f
  using boost::multiprecision::cpp_int;
  const auto b = block(id, (std::uint64_t{1} << 47) + i);
  cpp_int rho = r;
  for (std::uint32_t w : b) rho = (rho << 32) | w;
  const cpp_int f144 = exact_integer(std::ldexp(f, 144));  // f has bits down to 2^-125 at most
  return (rho >> (144 - k)) < (f144 >> (144 - k));
}

// ulp of the result next to `down` (|x| rounded toward zero, finite) in `format`.
inline double ulp_at(const emu::Format& format, double down) {
  const int min_exponent = std::ilogb(format.min_normal());
  const int exponent = down == 0.0 ? min_exponent : std::max(std::ilogb(down), min_exponent);
  return std::ldexp(1.0, exponent - format.fraction_bits());
}

// The expected result of sr for x (element i, random bits r): its magnitude rounded
// toward zero, or away from zero when rounds_up says so; with the bits and flags
// emu::round gives for that direction. Beyond max + ulp every direction overflows, and
// sr too, whatever the random bits.
struct Expected {
  std::uint16_t bits;
  emu::Flags flags;
};

inline Expected expected_sr(const emu::Format& format, const emu::RoundSpec& sr, float x, const emu::StreamId& id,
                            std::uint64_t i, std::uint32_t r) {
  const emu::RoundSpec toward_zero{.mode = emu::Rounding::rz, .overflow = sr.overflow};
  emu::Flags down_flags = 0;
  const double down = emu::round(format, x, toward_zero, nullptr, down_flags);
  bool round_up = (down_flags & emu::OFLO) != 0;
  if (!round_up && std::isfinite(x) && (down_flags & emu::INEXACT) != 0) {  // (under saturate down == up can be)
    const double magnitude = std::fabs(static_cast<double>(x)), kept = std::fabs(down);
    const double f = (magnitude - kept) / ulp_at(format, kept);  // exact
    round_up = rounds_up(id, i, r, f, sr.sr_bits);
  }
  if (!round_up) return {static_cast<std::uint16_t>(format.encode(down)), down_flags};
  const emu::RoundSpec away{.mode = std::signbit(x) ? emu::Rounding::rd : emu::Rounding::ru, .overflow = sr.overflow};
  emu::Flags up_flags = 0;
  const double up = emu::round(format, x, away, nullptr, up_flags);
  return {static_cast<std::uint16_t>(format.encode(up)), up_flags};
}

}  // namespace documented
