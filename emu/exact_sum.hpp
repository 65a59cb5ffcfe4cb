// An exact accumulator for sums of doubles and of products of doubles (a Kulisch-style
// long fixed-point register covering double's whole range), for reference results:
// the `exact` matrix unit, the matmul-accumulation experiment's exact product, exact
// sums of series.
#pragma once

#include <array>
#include <cstdint>

#include "round.hpp"

namespace emu {

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
