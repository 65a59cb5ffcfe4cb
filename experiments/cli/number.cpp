#include "number.hpp"

#include <bit>
#include <boost/multiprecision/cpp_int.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace emu::cli {

namespace {

namespace mp = boost::multiprecision;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLeastDouble = std::numeric_limits<double>::denorm_min();  // 2^-1074
// Exponents are clamped here while parsing: far beyond any double, far below overflow.
constexpr long long kExponentClamp = 1'000'000'000'000LL;

// A finite number as written: (-1)^negative * significand * base^exponent, where
// significand is the digit string read as an integer in base 10 or 16 without leading
// or trailing zeros (empty for zero), and base^exponent is 10^exponent (decimal) or
// 2^exponent (hex).
struct Written {
  bool negative = false;
  bool hex = false;
  std::string digits;
  long long exponent = 0;
};

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != b[i]) return false;
  }
  return true;
}

int digit_value(char c, bool hex) {
  if (c >= '0' && c <= '9') return c - '0';
  if (!hex) return -1;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads [+-]digits after an 'e' or 'p'; clamps the magnitude at kExponentClamp.
long long read_exponent(std::string_view s) {
  std::size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) throw NumberError("the exponent has no digits");
  long long value = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') throw NumberError(std::string("unexpected '") + s[i] + "' in the exponent");
    value = std::min(kExponentClamp, value * 10 + (s[i] - '0'));
  }
  return negative ? -value : value;
}

Written read_finite(std::string_view s, bool negative) {
  Written w;
  w.negative = negative;
  w.hex = s.size() >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (w.hex) s.remove_prefix(2);
  const char exponent_letter = w.hex ? 'p' : 'e';
  std::string all_digits;  // integer and fraction digits together
  std::size_t fraction_digits = 0;
  bool seen_point = false, seen_digit = false;
  std::size_t i = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.') {
      if (seen_point) throw NumberError("a second decimal point");
      seen_point = true;
      continue;
    }
    if (c == exponent_letter || c == exponent_letter - 'a' + 'A') break;
    if (digit_value(c, w.hex) < 0) throw NumberError(std::string("unexpected '") + c + "'");
    seen_digit = true;
    all_digits += c;
    if (seen_point) ++fraction_digits;
  }
  if (!seen_digit) throw NumberError(w.hex ? "no hex digits after 0x" : "no digits");
  long long exponent = i < s.size() ? read_exponent(s.substr(i + 1)) : 0;
  // Each hex fraction digit is 4 bits.
  exponent -= static_cast<long long>(fraction_digits) * (w.hex ? 4 : 1);

  std::size_t first = all_digits.find_first_not_of('0');
  if (first == std::string::npos) return w;  // zero
  std::size_t last = all_digits.find_last_not_of('0');
  exponent += static_cast<long long>(all_digits.size() - 1 - last) * (w.hex ? 4 : 1);
  w.digits = all_digits.substr(first, last - first + 1);
  w.exponent = exponent;
  return w;
}

mp::cpp_int integer_of(const std::string& digits, bool hex) {
  mp::cpp_int n = 0;
  const int base = hex ? 16 : 10;
  for (char c : digits) n = n * base + digit_value(c, hex);
  return n;
}

// A residual q * 2^scale / d (q != 0, d > 0) as Exact's lo and lo_scale (value =
// lo * 2^-lo_scale): lo is the residual rounded to the nearest double, except that an
// inexact residual whose nearest double is a power of two is stepped one double toward
// the exact value (emu/round.hpp: an inexact lo never sits on a power of two, or a
// residual of almost exactly half an ulp would look like a tie to the 52-bit formats).
// lo_scale stays 0 unless the residual lies below double's normal range.
void set_residual(const mp::cpp_int& q, const mp::cpp_int& d, long long scale, Exact& x) {
  const bool negative = q < 0;
  const mp::cpp_int a = negative ? mp::cpp_int(-q) : q;
  // a / d lies in [2^(l-1), 2^(l+1)); scaled by 2^k with k = 63 - l it lies in
  // [2^62, 2^64): Q = floor(a * 2^k / d) fits in 64 bits and keeps 10 or more bits beyond
  // a double's 53, and `sticky` says whether anything was left over.
  const long long l = static_cast<long long>(mp::msb(a)) - static_cast<long long>(mp::msb(d));
  const long long k = 63 - l;
  mp::cpp_int num = a, den = d;
  if (k >= 0)
    num <<= static_cast<unsigned>(k);
  else
    den <<= static_cast<unsigned>(-k);
  mp::cpp_int rest;
  mp::cpp_int whole;
  mp::divide_qr(num, den, whole, rest);
  const auto Q = static_cast<std::uint64_t>(whole);
  const bool sticky = rest != 0;
  // Q with its last bit set when sticky (rounding to odd at 64 bits) rounds to the
  // nearest double exactly as the exact quotient would (10 spare bits: no double rounding).
  double r = static_cast<double>(Q | (sticky ? 1u : 0u));
  // Exact value X = Q + (something in (0, 1) when sticky), compared with r (an integer
  // from 2^62 to 2^64; 2^64 only by rounding up, so then X < r).
  const bool r_is_top = r == 0x1p64;
  const std::uint64_t r_int = r_is_top ? 0 : static_cast<std::uint64_t>(r);
  const bool below = r_is_top || Q < r_int;               // X < r
  const bool above = !r_is_top && (Q > r_int || (Q == r_int && sticky));  // X > r
  int r_exponent = 0;
  if ((below || above) && std::frexp(r, &r_exponent) == 0.5)
    r = std::nextafter(r, below ? 0.0 : kInf);
  const long long total = scale - k;  // residual = r * 2^total (up to the step above)
  const long long lo_scale = total < -1000 ? -total : 0;
  const double lo = std::ldexp(r, static_cast<int>(total + lo_scale));  // exact: a normal double
  x.lo = negative ? -lo : lo;
  x.lo_scale = static_cast<int>(lo_scale);
}

// The exact value of w (a positive finite number) as hi + residual, for a given double
// hi (the nearest double, or DBL_MAX just below 2^1024), computed with big integers.
Exact with_residual(const Written& w, double hi) {
  int hi_exponent = 0;
  const double fraction = std::frexp(hi, &hi_exponent);
  const mp::cpp_int m = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
  const long long e = hi_exponent - 53;  // hi = m * 2^e

  // w = num * 2^e2 / den
  mp::cpp_int num = integer_of(w.digits, w.hex), den = 1;
  long long e2 = 0;
  if (w.hex)
    e2 = w.exponent;
  else if (w.exponent >= 0)
    num *= mp::pow(mp::cpp_int(10), static_cast<unsigned>(w.exponent));
  else
    den = mp::pow(mp::cpp_int(10), static_cast<unsigned>(-w.exponent));

  // w - hi = 2^s * (num * 2^(e2 - s) - m * den * 2^(e - s)) / den, s = min(e2, e).
  const long long s = std::min(e2, e);
  const mp::cpp_int q = (num << static_cast<unsigned>(e2 - s)) - ((m * den) << static_cast<unsigned>(e - s));
  Exact x{hi};
  if (q != 0) set_residual(q, den, s, x);
  return x;
}

// The common case: n <= 2^53 and |exponent| <= 22, so that n and 10^|exponent| are
// doubles. Division and multiplication by 10^k are then correctly rounded, and their
// residuals are exact (TwoProduct) or exactly computable (the remainder of a correctly
// rounded quotient is a double).
Exact small_decimal(std::uint64_t n, long long exponent) {
  const double m = static_cast<double>(n);  // exact
  double power = 1.0;
  for (long long k = 0; k < std::llabs(exponent); ++k) power *= 10.0;  // exact up to 1e22
  if (exponent >= 0) {
    const double hi = m * power;
    return {hi, std::fma(m, power, -hi)};
  }
  const double hi = m / power;
  // The remainder m - hi * power is a double (that of a correctly rounded quotient), and
  // lo is its quotient by power, rounded once. An inexact lo on a power of two is
  // stepped one double toward the exact value, as emu::Exact requires; the sign of
  // lo * power - remainder, from one fma, says which way.
  const double remainder = -std::fma(hi, power, -m);
  double lo = remainder / power;
  int lo_exponent = 0;
  if (lo != 0 && std::frexp(lo, &lo_exponent) == (lo < 0 ? -0.5 : 0.5)) {
    const double excess = std::fma(lo, power, -remainder);  // sign of lo - exact residual
    if (excess != 0) lo = std::nextafter(lo, excess > 0 ? -kInf : kInf);
  }
  return {hi, lo};
}

bool is_small_decimal(std::uint64_t n, long long exponent) {
  return n <= (std::uint64_t{1} << 53) && exponent <= 22 && exponent >= -22;
}

bool try_small_decimal(const Written& w, Exact& out) {
  if (w.hex || w.digits.size() > 16) return false;
  std::uint64_t n = 0;
  for (char c : w.digits) n = n * 10 + static_cast<std::uint64_t>(c - '0');
  if (!is_small_decimal(n, w.exponent)) return false;
  out = small_decimal(n, w.exponent);
  if (w.negative) out = {-out.hi, -out.lo};
  return true;
}

// Hex significands of up to 53 bits whose value is a double: exact.
bool try_exact_hex(const Written& w, Exact& out) {
  if (!w.hex || w.digits.size() > 13 || w.exponent > 1100 || w.exponent < -1200) return false;
  std::uint64_t n = 0;
  for (char c : w.digits) n = n * 16 + static_cast<std::uint64_t>(digit_value(c, true));
  const int e = static_cast<int>(w.exponent);
  const double hi = std::ldexp(static_cast<double>(n), e);
  if (!std::isfinite(hi) || hi == 0 || std::ldexp(hi, -e) != static_cast<double>(n)) return false;
  out = Exact{w.negative ? -hi : hi};
  return true;
}

}  // namespace

Exact parse_number(std::string_view text) {
  if (text.empty()) throw NumberError("empty");
  if (text.size() > kMaxNumberLength)
    throw NumberError("longer than " + std::to_string(kMaxNumberLength) + " characters (the limit)");
  std::string_view s = text;
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (equals_ignoring_case(s, "inf") || equals_ignoring_case(s, "infinity")) return {negative ? -kInf : kInf};
  if (equals_ignoring_case(s, "nan")) return {negative ? -kNaN : kNaN};
  if (s.empty()) throw NumberError("a sign without digits");

  const Written w = read_finite(s, negative);
  if (w.digits.empty()) return {negative ? -0.0 : 0.0};
  Exact fast;
  if (try_small_decimal(w, fast) || try_exact_hex(w, fast)) return fast;

  // Decimal digits or hex bits before the point, beyond which the value exceeds 2^1024
  // or lies below 2^-1075 for certain (cheap to test before any big-integer work).
  const long long magnitude_digits =
      static_cast<long long>(w.digits.size()) * (w.hex ? 4 : 1) + w.exponent;  // hex: bits
  const bool far_above = w.hex ? magnitude_digits > 1030 : magnitude_digits > 310;
  const Exact beyond{negative ? -kInf : kInf, 0.0, true};
  if (far_above) return beyond;

  // strtod of the canonical spelling is the nearest double (glibc rounds correctly).
  const std::string canonical = (w.hex ? "0x" : "") + w.digits + (w.hex ? "p" : "e") + std::to_string(w.exponent);
  const double magnitude = std::strtod(canonical.c_str(), nullptr);
  Written positive = w;
  positive.negative = false;
  Exact x;
  if (magnitude == 0) {
    // Nonzero, at most half the least double 2^-1074. Down to 2^-1127: hi = 2^-1074 and
    // lo = x - 2^-1074 (scaled), so that exactly 2^-1075 is a tie and stochastic rounding
    // into fp64 sees the true probability x / 2^-1074 (lo's 53 bits hold x from 2^-1127
    // up; below that x would collapse onto lo's last bit). Below (x < 10^-339 written in
    // decimal, x < 2^-1127 in hex): hi = 0 with lo holding the sign (round() then treats
    // x as tiny, only its sign mattering; an sr probability below 2^-52 is taken as 0).
    // x < 10^magnitude_digits (decimal) or < 2^bits (hex), and at least a tenth / half.
    const long long bits = magnitude_digits - 4 + std::bit_width(static_cast<unsigned>(digit_value(w.digits[0], true)));
    const bool far_below = w.hex ? bits < -1126 : magnitude_digits < -338;
    if (far_below) return {negative ? -0.0 : 0.0, negative ? -kLeastDouble : kLeastDouble};
    x = with_residual(positive, kLeastDouble);
  } else if (std::isinf(magnitude)) {
    // Between DBL_MAX + half its ulp and 2^1024 the value is finite in an unbounded
    // exponent range (rz gives DBL_MAX without overflow): hi = DBL_MAX, lo = the rest.
    x = with_residual(positive, std::numeric_limits<double>::max());
    if (x.lo >= 0x1p971) return beyond;  // 2^1024 - DBL_MAX = 2^971
  } else {
    x = with_residual(positive, magnitude);
  }
  return negative ? Exact{-x.hi, -x.lo, false, x.lo_scale} : x;
}

double round_nearest(const Format& f, const Exact& x) {
  Flags ignored = 0;
  return emu::round(f, x, RoundSpec{}, nullptr, ignored);
}

std::string hex_bits(const Format& f, std::uint64_t bits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", (f.width() + 3) / 4, static_cast<unsigned long long>(bits));
  return buf;
}

namespace {

// digits (no leading zeros) * 10^exponent, printed as %g would print it but choosing
// fixed notation for decimal exponents -4..15 (65504, 0.0004883) and d.ddde-XX beyond,
// as Python's repr does.
std::string format_decimal(bool negative, std::string digits, int exponent) {
  while (digits.size() > 1 && digits.back() == '0') {
    digits.pop_back();
    ++exponent;
  }
  const int leading = exponent + static_cast<int>(digits.size()) - 1;  // of the first digit
  std::string out = negative ? "-" : "";
  if (leading >= -4 && leading <= 15) {
    if (leading < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-leading - 1), '0') + digits;
    } else if (exponent >= 0) {
      out += digits + std::string(static_cast<std::size_t>(exponent), '0');
    } else {
      const std::size_t whole = static_cast<std::size_t>(leading + 1);
      out += digits.substr(0, whole) + "." + digits.substr(whole);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", leading < 0 ? '-' : '+', std::abs(leading));
  return out + e;
}

// The shortest decimal d * 10^exponent (d > 0) accepted by reads_back, printed; at
// most 17 digits are needed for any double.
// The accepted k-digit decimal nearest to the value, printed, or "" if there is none.
template <class ReadsBack>
std::string accepted_with_digits(int k, bool negative, double magnitude, ReadsBack& reads_back) {
  // The k-digit decimals nearest to the value from below and from above: the accepted
  // ones form an interval around the value, so if any k-digit decimal is accepted, one
  // of these two is. %.*e gives the nearest one; its neighbour is one unit away (one
  // unit of the next lower decade when the nearest is a power of ten).
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*e", k - 1, magnitude);
  std::string mantissa;
  const char* p = buf;
  for (; *p && *p != 'e'; ++p)
    if (*p != '.') mantissa += *p;
  const int exponent = std::atoi(p + 1) - (k - 1);
  const std::uint64_t d = std::stoull(mantissa);
  if (reads_back(d, exponent)) return format_decimal(negative, std::to_string(d), exponent);
  std::uint64_t power = 1;
  for (int i = 1; i < k; ++i) power *= 10;
  const bool lowest = d == power;
  const std::pair<std::uint64_t, int> neighbours[] = {
      lowest ? std::pair{power * 10 - 1, exponent - 1} : std::pair{d - 1, exponent}, {d + 1, exponent}};
  std::string best;
  double best_distance = kInf;
  for (const auto& [candidate, e] : neighbours) {
    if (candidate == 0 || !reads_back(candidate, e)) continue;
    const std::string text = std::to_string(candidate) + "e" + std::to_string(e);
    const double distance = std::fabs(std::strtod(text.c_str(), nullptr) - magnitude);
    if (distance < best_distance) {
      best = format_decimal(negative, std::to_string(candidate), e);
      best_distance = distance;
    }
  }
  return best;
}

// The shortest decimal accepted by reads_back(d, exponent) (meaning d * 10^exponent),
// printed. A k-digit decimal is also a (k+1)-digit one, so "some k-digit decimal is
// accepted" is monotone in k: binary search over 1..17 (17 digits identify any double).
template <class ReadsBack>
std::string shortest_accepted(bool negative, double magnitude, ReadsBack reads_back) {
  int lo = 1, hi = 17;
  std::string best = accepted_with_digits(hi, negative, magnitude, reads_back);
  if (best.empty()) throw std::logic_error("shortest_accepted: no decimal of 17 digits reads back");
  while (lo < hi) {  // invariant: hi digits suffice, and best has hi digits
    const int mid = (lo + hi) / 2;
    std::string found = accepted_with_digits(mid, negative, magnitude, reads_back);
    if (found.empty()) {
      lo = mid + 1;
    } else {
      hi = mid;
      best = std::move(found);
    }
  }
  return best;
}

}  // namespace

std::string json_number(double value) {
  if (std::isnan(value)) return "\"nan\"";
  if (std::isinf(value)) return value < 0 ? "\"-inf\"" : "\"inf\"";
  const bool negative = std::signbit(value);
  if (value == 0) return negative ? "-0.0" : "0.0";
  const double magnitude = std::fabs(value);
  return shortest_accepted(negative, magnitude, [&](std::uint64_t d, int exponent) {
    return std::strtod((std::to_string(d) + "e" + std::to_string(exponent)).c_str(), nullptr) == magnitude;
  });
}

std::string shortest_decimal(const Format& f, double value) {
  if (std::isnan(value)) return std::signbit(value) ? "-nan" : "nan";  // as the bits say
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  const bool negative = std::signbit(value);
  if (value == 0) return negative ? "-0" : "0";
  const double magnitude = std::fabs(value);
  return shortest_accepted(negative, magnitude, [&](std::uint64_t d, int exponent) {
    const Exact x = is_small_decimal(d, exponent) ? small_decimal(d, exponent)
                                                  : parse_number(std::to_string(d) + "e" + std::to_string(exponent));
    return round_nearest(f, x) == magnitude;
  });
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace emu::cli
