// An exact accumulator for sums of doubles and of products of doubles (a Kulisch-style
// long fixed-point register covering double's whole range), for reference results:
// the `exact` matrix unit, the matmul-accumulation experiment's exact product, exact
// sums of series.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

#include "round.hpp"

namespace emu {

// A finite non-zero double as +-m * 2^e with m odd (m < 2^53).
struct OddSignificand {
  std::uint64_t m;
  int e;  // weight of the lowest set bit
  int highest() const { return e + static_cast<int>(std::bit_width(m)) - 1; }  // floor(log2 |x|)
};
OddSignificand odd_significand(double x);

// The exact value v * 2^lsb of a non-zero 128-bit fixed-point sum as an Exact, the
// same hi, lo and lo_scale as ExactSum::value() gives for that sum (hi the nearest
// double, ties to even; lo the nearest double to the residual, stepped one double
// toward the true residual where an inexact lo lands on a power of two); hi = +-inf
// with beyond_double where v * 2^lsb rounds beyond double's range. For lsb >= -1022
// (every residual is then a normal double or zero).
Exact exact_from_fixed(__int128 v, int lsb);

class ExactSum {
 public:
  void add(double x);  // finite x; NaN/inf are recorded and returned as such
  void add_product(double a, double b);  // exactly, for any finite a and b
  void clear() { *this = ExactSum{}; }

  // The sum as an Exact (nearest double plus residual), ready for emu::round().
  Exact value() const;
  bool is_zero() const;

 private:
  // 32-bit digits held in int64 with lazy carries: digit i weighs 2^(32 i + kLow).
  // Products of doubles reach down to 2^-2148 and up to 2^2048.
  static constexpr int kLow = -2176;
  static constexpr int kDigits = 140;  // up to 2^2304: headroom for carries
  void add_scaled(std::uint64_t mantissa, int exponent, bool negative);
  void normalise();
  std::array<std::int64_t, kDigits> digits_{};
  std::uint32_t pending_ = 0;  // adds since the last carry propagation
  double special_ = 0.0;       // sum of the NaN/inf terms (0 if none)
  friend double nearest_double(ExactSum s);
  // The nearest double to the sum times 2^scale (for residuals below double's range).
  friend double nearest_double_scaled(ExactSum s, int scale);
};

}  // namespace emu
