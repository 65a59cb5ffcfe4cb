#include "exact_sum.hpp"

#include <bit>
#include <cmath>
#include <limits>

namespace emu {

namespace {

using i128 = __int128;
using u128 = unsigned __int128;

struct Decomposed {
  std::uint64_t mantissa;  // < 2^53
  int exponent;            // value = mantissa * 2^exponent
};

Decomposed decompose(double x) {
  const auto bits = std::bit_cast<std::uint64_t>(x);
  const int field = static_cast<int>((bits >> 52) & 0x7FF);
  const std::uint64_t fraction = bits & ((std::uint64_t{1} << 52) - 1);
  if (field == 0) return {fraction, -1074};
  return {fraction | (std::uint64_t{1} << 52), field - 1075};
}

// |x| rounded to 53 bits, ties to even: x = kept * 2^shift + rest exactly, with
// |rest| <= 2^(shift - 1).
struct Rounded53 {
  std::uint64_t kept;
  int shift;
  i128 rest;
};
Rounded53 round53(u128 x) {
  const auto top = static_cast<std::uint64_t>(x >> 64);
  const int width = top != 0 ? 128 - std::countl_zero(top) : 64 - std::countl_zero(static_cast<std::uint64_t>(x));
  if (width <= 53) return {static_cast<std::uint64_t>(x), 0, 0};
  const int shift = width - 53;
  u128 kept = x >> shift;
  const u128 dropped = x - (kept << shift);
  const u128 half = u128{1} << (shift - 1);
  i128 rest = static_cast<i128>(dropped);
  if (dropped > half || (dropped == half && (kept & 1))) {
    ++kept;  // may reach 2^53: still exact in a double
    rest -= static_cast<i128>(u128{1} << shift);
  }
  return {static_cast<std::uint64_t>(kept), shift, rest};
}

}  // namespace

OddSignificand odd_significand(double x) {
  const auto bits = std::bit_cast<std::uint64_t>(x);
  const int field = static_cast<int>((bits >> 52) & 0x7FF);
  std::uint64_t m = bits & ((std::uint64_t{1} << 52) - 1);
  int e = -1074;
  if (field != 0) {
    m |= std::uint64_t{1} << 52;
    e = field - 1075;
  }
  const int tz = std::countr_zero(m);
  return {m >> tz, e + tz};
}

Exact exact_from_fixed(i128 v, int lsb) {
  const bool negative = v < 0;
  const u128 magnitude = negative ? -static_cast<u128>(v) : static_cast<u128>(v);
  const Rounded53 hi = round53(magnitude);
  const double hi_value = std::ldexp(static_cast<double>(hi.kept), lsb + hi.shift);
  if (std::isinf(hi_value)) return {negative ? -HUGE_VAL : HUGE_VAL, 0.0, true};
  double lo_value = 0;
  if (hi.rest != 0) {
    const bool rest_negative = hi.rest < 0;
    const Rounded53 lo = round53(rest_negative ? -static_cast<u128>(hi.rest) : static_cast<u128>(hi.rest));
    lo_value = std::ldexp(static_cast<double>(lo.kept), lsb + lo.shift);
    // As ExactSum::value(): an inexact lo on a power of two steps toward the residual
    // (toward zero where rounding went up in magnitude).
    if (lo.rest != 0 && std::has_single_bit(lo.kept))
      lo_value = std::nextafter(lo_value, lo.rest < 0 ? 0.0 : HUGE_VAL);
    if (rest_negative != negative) lo_value = -lo_value;
  }
  return {negative ? -hi_value : hi_value, lo_value};  // a zero lo is +0, as ExactSum's
}

void ExactSum::add_scaled(std::uint64_t mantissa, int exponent, bool negative) {
  const int offset = exponent - kLow;
  const int i = offset >> 5;
  const u128 v = static_cast<u128>(mantissa) << (offset & 31);
  const auto d0 = static_cast<std::int64_t>(v & 0xFFFFFFFFu);
  const auto d1 = static_cast<std::int64_t>((v >> 32) & 0xFFFFFFFFu);
  const auto d2 = static_cast<std::int64_t>(v >> 64);
  if (negative) {
    digits_[i] -= d0, digits_[i + 1] -= d1, digits_[i + 2] -= d2;
  } else {
    digits_[i] += d0, digits_[i + 1] += d1, digits_[i + 2] += d2;
  }
  if (++pending_ >= (1u << 30)) normalise();  // digits stay far from int64 overflow
}

void ExactSum::normalise() {
  for (int i = 0; i + 1 < kDigits; ++i) {
    const std::int64_t carry = digits_[i] >> 32;  // floor division by 2^32
    digits_[i] -= carry * (std::int64_t{1} << 32);
    digits_[i + 1] += carry;
  }
  pending_ = 0;
}

void ExactSum::add(double x) {
  if (!std::isfinite(x)) {
    special_ += x;
    return;
  }
  if (x == 0) return;
  const Decomposed d = decompose(x);
  add_scaled(d.mantissa, d.exponent, std::signbit(x));
}

void ExactSum::add_product(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) {
    special_ += a * b;
    return;
  }
  if (a == 0 || b == 0) return;
  const Decomposed da = decompose(a), db = decompose(b);
  const u128 p = static_cast<u128>(da.mantissa) * db.mantissa;  // < 2^106, exact
  const int e = da.exponent + db.exponent;
  const bool negative = std::signbit(a) != std::signbit(b);
  constexpr std::uint64_t kLow53 = (std::uint64_t{1} << 53) - 1;
  add_scaled(static_cast<std::uint64_t>(p) & kLow53, e, negative);
  add_scaled(static_cast<std::uint64_t>(p >> 53), e + 53, negative);
}

bool ExactSum::is_zero() const {
  ExactSum c = *this;
  c.normalise();
  for (std::int64_t d : c.digits_)
    if (d != 0) return false;
  return true;
}

// The double nearest to the sum (ties to even); +-inf beyond double's range.
double nearest_double(ExactSum s) { return nearest_double_scaled(s, 0); }

double nearest_double_scaled(ExactSum s, int scale) {
  s.normalise();
  auto& d = s.digits_;
  const bool negative = d[ExactSum::kDigits - 1] < 0;
  if (negative) {
    for (auto& x : d) x = -x;
    s.normalise();
  }
  int top = ExactSum::kDigits - 1;
  while (top >= 0 && d[top] == 0) --top;
  if (top < 0) return 0.0;
  // The leading 96 bits, and whether anything below them is non-zero.
  const int base = std::max(top - 2, 0);
  u128 v = 0;
  for (int i = top; i >= base; --i) v = (v << 32) | static_cast<std::uint64_t>(d[i]);
  bool sticky = false;
  for (int i = 0; i < base; ++i) sticky |= d[i] != 0;
  const int length = 128 - (static_cast<std::uint64_t>(v >> 64) ? std::countl_zero(static_cast<std::uint64_t>(v >> 64))
                                                                 : 64 + std::countl_zero(static_cast<std::uint64_t>(v)));
  int exponent = 32 * base + ExactSum::kLow + scale;
  // Keep 53 bits, or fewer where the result is a double subnormal (lsb 2^-1074), so that
  // this is the only rounding.
  const int lsb = std::max(exponent + length - 53, -1074);
  const int shift = lsb - exponent;
  if (shift > 128) {
    v = 0;  // below half of 2^-1074
    exponent = lsb;
  } else if (shift > 0) {
    const u128 kept = shift == 128 ? 0 : v >> shift;
    const u128 rest = shift == 128 ? v : v & ((u128{1} << shift) - 1);
    const u128 half = u128{1} << (shift - 1);
    const bool up = rest > half || (rest == half && (sticky || (kept & 1)));
    v = kept + (up ? 1 : 0);
    exponent = lsb;
  }
  // v <= 2^53: ldexp is exact (or overflows to inf beyond double's range).
  const double magnitude = std::ldexp(static_cast<double>(static_cast<std::uint64_t>(v)), exponent);
  return negative ? -magnitude : magnitude;
}

Exact ExactSum::value() const {
  if (special_ != 0 || std::isnan(special_)) return {special_};
  const double hi = nearest_double(*this);
  if (std::isinf(hi)) return {hi, 0.0, true};
  ExactSum rest = *this;
  rest.add(-hi);
  double lo = nearest_double(rest);
  // A residual below the normal range is held scaled (Exact::lo_scale), so that a
  // non-zero residual never reads as zero and keeps its bits.
  constexpr int kResidualScale = 1300;
  int scale = 0;
  if (std::fabs(lo) < std::numeric_limits<double>::min() && !rest.is_zero()) {
    scale = kResidualScale;
    lo = nearest_double_scaled(rest, scale);
  }
  // An inexact lo that lands on a power of two may sit exactly on half an ulp of hi and
  // fake a tie for 52-bit formats: step it one double toward the true residual.
  int e = 0;
  if (lo != 0 && std::fabs(std::frexp(lo, &e)) == 0.5 && e - 1 - scale >= kLow) {
    ExactSum beyond = rest;
    beyond.add_scaled(1, e - 1 - scale, lo > 0);  // rest - lo * 2^-scale
    if (!beyond.is_zero()) lo = std::nextafter(lo, std::signbit(nearest_double(beyond)) ? -HUGE_VAL : HUGE_VAL);
  }
  return {hi, lo, false, scale};
}

}  // namespace emu
