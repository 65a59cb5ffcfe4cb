// Oracles for the AMP tests, built without the model's code: exact sums in
// Boost.Multiprecision, rounding into fp32 by comparing the exact value with the
// neighbouring floats, and rounding into fp16 by the CPU's own _Float16 conversion.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// GCC 12 reports false -Warray-bounds positives inside Boost.Multiprecision.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_bin_float.hpp>
#pragma GCC diagnostic pop

namespace amp_oracle {

namespace mp = boost::multiprecision;
// 1,200 bits hold any sum of a few fp32 values and fp32 products exactly.
using Big = mp::number<mp::cpp_bin_float<1200, mp::digit_base_2, void, std::int32_t, -4000, 4000>, mp::et_off>;

// x rounded to the nearest float, ties to the even significand (finite, in range).
inline float nearest_float(const Big& x) {
  const float guess = static_cast<float>(x.convert_to<double>());
  float best = guess;
  Big best_distance = abs(x - Big(guess));
  for (float candidate : {std::nextafter(guess, -std::numeric_limits<float>::infinity()),
                          std::nextafter(guess, std::numeric_limits<float>::infinity())}) {
    const Big d = abs(x - Big(candidate));
    const bool even = (std::bit_cast<std::uint32_t>(candidate) & 1u) == 0;
    if (d < best_distance || (d == best_distance && even)) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

inline double to_half(float x) { return static_cast<double>(static_cast<_Float16>(x)); }

enum class Partials { fp32, fp16 };

// The documented AMP accumulation for fp16 inputs: the products in blocks of four
// (passes of 16 are multiples of 4, so blocks never straddle a pass), each block added
// exactly to the running value and rounded once into fp32; with fp16 partials the
// fp32 result is then rounded into fp16 (RNE).
inline double amp_reference(const std::vector<double>& a, const std::vector<double>& b, double c, Partials partials) {
  double running = c;
  for (std::size_t start = 0; start < a.size(); start += 4) {
    Big s(running);
    for (std::size_t i = start; i < std::min(a.size(), start + 4); ++i) s += Big(a[i]) * Big(b[i]);
    const float r32 = nearest_float(s);
    running = partials == Partials::fp16 ? to_half(r32) : static_cast<double>(r32);
  }
  return running;
}

}  // namespace amp_oracle
