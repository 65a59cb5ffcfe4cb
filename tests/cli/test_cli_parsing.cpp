// The emu calculator's number parsing, number printing and expression parser, against
// Boost.Multiprecision's exact rationals (cpp_rational) and published values.
#include <boost/multiprecision/cpp_int.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "expression.hpp"
#include "number.hpp"

namespace mp = boost::multiprecision;
using emu::cli::parse_number;

namespace {

mp::cpp_int pow10(unsigned k) { return mp::pow(mp::cpp_int(10), k); }

// Decimal text ([-]digits[.digits][e[-]digits]) as an exact rational, independently of
// the code under test.
mp::cpp_rational rational_of_decimal(const std::string& text) {
  std::size_t i = 0;
  const bool negative = text[0] == '-';
  if (negative) ++i;
  mp::cpp_int digits = 0;
  long exponent = 0;
  bool point = false;
  for (; i < text.size() && text[i] != 'e'; ++i) {
    if (text[i] == '.') {
      point = true;
      continue;
    }
    digits = digits * 10 + (text[i] - '0');
    if (point) --exponent;
  }
  if (i < text.size()) exponent += std::stol(text.substr(i + 1));
  mp::cpp_rational r = exponent >= 0 ? mp::cpp_rational(digits * pow10(static_cast<unsigned>(exponent)))
                                     : mp::cpp_rational(digits, pow10(static_cast<unsigned>(-exponent)));
  return negative ? mp::cpp_rational(-r) : r;
}

mp::cpp_rational rational_of_double(double d) {
  int e = 0;
  const double f = std::frexp(d, &e);
  const auto m = static_cast<std::int64_t>(std::ldexp(f, 53));
  e -= 53;
  return e >= 0 ? mp::cpp_rational(mp::cpp_int(m) << e) : mp::cpp_rational(mp::cpp_int(m), mp::cpp_int(1) << -e);
}

// Round-to-nearest-even of a positive rational into a format with `fraction_bits` and
// minimum exponent `emin` (subnormals on, no overflow handling: tests stay in range).
double oracle_rne(const mp::cpp_rational& x, int fraction_bits, int emin) {
  mp::cpp_int num = mp::numerator(x), den = mp::denominator(x);
  // e = floor(log2 x)
  long e = static_cast<long>(mp::msb(num)) - static_cast<long>(mp::msb(den));
  const auto below = [&](long k) {  // x < 2^k ?
    return k >= 0 ? num < (den << k) : (num << -k) < den;
  };
  if (below(e)) --e;
  const long q = std::max<long>(e, emin) - fraction_bits;
  // m = x / 2^q = a / b
  mp::cpp_int a = num, b = den;
  if (q >= 0) b <<= q; else a <<= -q;
  mp::cpp_int n = a / b;
  const mp::cpp_int twice_rest = 2 * (a - n * b);
  if (twice_rest > b || (twice_rest == b && (n & 1) == 1)) ++n;
  return std::ldexp(n.convert_to<double>(), static_cast<int>(q));
}

// The exact decimal expansion of a double (every double has one).
std::string decimal_of_double(double d) {
  const mp::cpp_rational r = rational_of_double(d);
  mp::cpp_int num = mp::numerator(r), den = mp::denominator(r);
  unsigned k = 0;
  while (den != 1) {  // den is a power of two: num/2^k = num*5^k/10^k
    num *= 5;
    den /= 2;
    ++k;
  }
  std::string digits = num.str();
  if (digits.size() <= k) digits = std::string(k - digits.size() + 1, '0') + digits;
  return digits.substr(0, digits.size() - k) + (k ? "." + digits.substr(digits.size() - k) : "");
}

double round_into(const emu::Format& f, const emu::Exact& x, emu::Rounding mode = emu::Rounding::rne) {
  emu::Flags flags = 0;
  return emu::round(f, x, emu::RoundSpec{mode}, nullptr, flags);
}

}  // namespace

TEST_CASE("parse_number: decimal residuals are exact in sign and accurate", "[cli]") {
  std::mt19937_64 gen(20261122);
  std::uniform_int_distribution<int> digit(0, 9), length(1, 30), exponent(-40, 40);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text;
    const int n = length(gen);
    for (int i = 0; i < n; ++i) text += static_cast<char>('0' + digit(gen));
    if (text[0] == '0') text[0] = '7';
    text += 'e';
    text += std::to_string(exponent(gen));
    const emu::Exact x = parse_number(text);
    const mp::cpp_rational exact = rational_of_decimal(text);
    INFO(text);
    REQUIRE(x.hi == std::strtod(text.c_str(), nullptr));  // nearest double
    const mp::cpp_rational residual = exact - rational_of_double(x.hi);
    REQUIRE((residual > 0) == (x.lo > 0));
    REQUIRE((residual < 0) == (x.lo < 0));
    if (x.lo != 0) {
      const mp::cpp_rational error = (rational_of_double(x.lo) - residual) / residual;
      const double relative = std::fabs(error.convert_to<double>());
      REQUIRE(relative < 1e-15);
    }
  }
}

TEST_CASE("parse_number: decimals are rounded once, never through double", "[cli]") {
  // For fp16 and bf16: decimals just above a tie whose nearest double IS the tie (so
  // strtod-then-round goes to even, the wrong way), and just below one that rounds up to
  // even. The correct result comes from the cpp_rational oracle; the test also checks
  // that rounding through double gives something else, so each case is a real trap.
  const emu::Format formats[] = {emu::fp16(), emu::bf16()};
  std::mt19937_64 gen(7);
  for (const auto& f : formats) {
    std::uniform_int_distribution<std::uint64_t> pattern(1, (f.exponent_mask() | f.fraction_mask()) - 2);
    int checked = 0;
    for (int trial = 0; trial < 2000; ++trial) {
      const double v = f.decode(pattern(gen));
      const double next = f.decode(f.encode(v) + 1);
      if (!std::isfinite(next)) continue;
      const double tie = (v + next) / 2;  // exact in double
      const bool v_even = (f.encode(v) & 1) == 0;
      // Nudge away from the even neighbour by 10^-(digits + 25): far below double's ulp.
      const std::string tie_text = decimal_of_double(tie);
      const std::size_t decimals = tie_text.find('.') == std::string::npos ? 0 : tie_text.size() - tie_text.find('.') - 1;
      const std::string nudge = "e-" + std::to_string(decimals + 25);
      const mp::cpp_rational delta = 1 / mp::cpp_rational(pow10(static_cast<unsigned>(decimals + 25)));
      const mp::cpp_rational x = v_even ? rational_of_decimal(tie_text) + delta : rational_of_decimal(tie_text) - delta;
      // Write x exactly as a decimal: tie_text with the nudge appended in its digits.
      const mp::cpp_rational scaled_x = x * mp::cpp_rational(pow10(static_cast<unsigned>(decimals + 25)));
      const mp::cpp_int scaled = mp::numerator(scaled_x);
      const std::string text = scaled.str() + nudge;
      INFO(f.name() << " " << text);
      REQUIRE(rational_of_decimal(text) == x);
      const double expected = oracle_rne(x, f.fraction_bits(), f.emin());
      REQUIRE(expected == (v_even ? next : v));
      REQUIRE(std::strtod(text.c_str(), nullptr) == tie);  // the trap is real:
      REQUIRE(round_into(f, emu::Exact{tie}) != expected);  // double rounding goes wrong
      REQUIRE(round_into(f, parse_number(text)) == expected);
      ++checked;
    }
    REQUIRE(checked > 1000);
  }
}

TEST_CASE("parse_number: a hand-checked double-rounding trap in fp16", "[cli]") {
  // 1 + 2^-11 is the tie between fp16's 1 (0x3c00) and 1 + 2^-10 (0x3c01); the decimal
  // 1.00048828125000000000000000001 lies just above it, and its nearest double is the tie.
  const emu::Exact x = parse_number("1.00048828125000000000000000001");
  CHECK(x.hi == 1.00048828125);
  CHECK(x.lo > 0);
  CHECK(emu::fp16().encode(round_into(emu::fp16(), x)) == 0x3c01);
  CHECK(emu::fp16().encode(round_into(emu::fp16(), emu::Exact{x.hi})) == 0x3c00);
}

TEST_CASE("parse_number: hex-floats, specials, extremes", "[cli]") {
  CHECK(parse_number("0x1.8p-3").hi == 0.1875);
  CHECK(parse_number("0x1.8p-3").lo == 0);
  CHECK(parse_number("-0X1P+4").hi == -16.0);
  CHECK(parse_number("0x.8").hi == 0.5);
  // 1 + 2^-80 needs 81 bits: hi = 1, lo = 2^-80.
  const emu::Exact h = parse_number("0x1.00000000000000000001p0");
  CHECK(h.hi == 1.0);
  CHECK(h.lo == std::ldexp(1.0, -80));
  CHECK(round_into(emu::fp16(), h, emu::Rounding::ru) == 1.0 + std::ldexp(1.0, -10));
  CHECK(std::isinf(parse_number("inf").hi));
  CHECK(parse_number("-Infinity").hi < 0);
  CHECK(std::isnan(parse_number("NaN").hi));
  CHECK(std::signbit(parse_number("-0.000").hi));
  CHECK(parse_number(".5").hi == 0.5);
  CHECK(parse_number("5.").hi == 5.0);
  const emu::Exact big = parse_number("1e400");
  CHECK(big.beyond_double);
  CHECK(std::isinf(big.hi));
  // Nonzero but below half the least double: rounds like the tiny value it is.
  const emu::Exact tiny = parse_number("1e-400");
  CHECK(round_into(emu::fp16(), tiny) == 0.0);
  CHECK(round_into(emu::fp16(), tiny, emu::Rounding::ru) == emu::fp16().min_subnormal());
  CHECK(round_into(emu::fp64(), tiny, emu::Rounding::ru) == std::ldexp(1.0, -1074));
  CHECK(round_into(emu::fp64(), tiny, emu::Rounding::rz) == 0.0);
  // A hair above the least double: rounds once in fp64 too (the residual, about 2^-1129,
  // is held scaled in lo_scale).
  const std::string least = decimal_of_double(std::ldexp(1.0, -1074));
  const emu::Exact above_least = parse_number(least + "00000000000000001");
  CHECK(above_least.hi == std::ldexp(1.0, -1074));
  CHECK(round_into(emu::fp64(), above_least, emu::Rounding::ru) == std::ldexp(1.0, -1073));
  CHECK(round_into(emu::fp64(), above_least, emu::Rounding::rz) == std::ldexp(1.0, -1074));
  CHECK(round_into(emu::fp64(), above_least) == std::ldexp(1.0, -1074));
  // Between DBL_MAX + ulp/2 and 2^1024: finite in an unbounded exponent range, so rz
  // gives DBL_MAX without overflow, and rne overflows (IEEE 754 overflow rule).
  const emu::Exact near_top = parse_number("1.7976931348623159e308");
  CHECK_FALSE(near_top.beyond_double);
  emu::Flags flags = 0;
  CHECK(emu::round(emu::fp64(), near_top, emu::RoundSpec{emu::Rounding::rz}, nullptr, flags) ==
        std::numeric_limits<double>::max());
  CHECK(flags == emu::INEXACT);
  flags = 0;
  CHECK(std::isinf(emu::round(emu::fp64(), near_top, emu::RoundSpec{}, nullptr, flags)));
  CHECK(flags == (emu::OFLO | emu::INEXACT));
  CHECK(parse_number("1.797693134862315908e308").beyond_double);  // above 2^1024
  CHECK(parse_number("1e999999999999999999999").beyond_double);   // no big-integer blow-up
  CHECK(round_into(emu::fp16(), parse_number("1e-999999999999999999999"), emu::Rounding::ru) ==
        emu::fp16().min_subnormal());
  for (const char* bad : {"", "-", "+", ".", "e5", "1e", "1e+", "0x", "0xp1", "1..2", "1.2.3", "abc", "1,5", "1 2",
                          "nan(1)", "infinit", "--1", "1e5.5", "0x1.8e-3p", " 1"})
    CHECK_THROWS_AS(parse_number(bad), emu::cli::NumberError);
}

TEST_CASE("json_number: shortest round trip, as Python's repr", "[cli]") {
  using emu::cli::json_number;
  // Expected strings are CPython's repr() of the same doubles.
  CHECK(json_number(0.00048828125) == "0.00048828125");
  CHECK(json_number(std::ldexp(1.0, -24)) == "5.960464477539063e-08");
  CHECK(json_number(std::ldexp(1.0, -14)) == "6.103515625e-05");
  CHECK(json_number(0.1) == "0.1");
  CHECK(json_number(65504.0) == "65504");
  CHECK(json_number(1e22) == "1e+22");
  CHECK(json_number(-0.0) == "-0.0");
  CHECK(json_number(std::numeric_limits<double>::infinity()) == "\"inf\"");
  CHECK(json_number(-std::numeric_limits<double>::infinity()) == "\"-inf\"");
  CHECK(json_number(std::nan("")) == "\"nan\"");
  std::mt19937_64 gen(3);
  for (int i = 0; i < 20000; ++i) {
    double d;
    const std::uint64_t bits = gen();
    std::memcpy(&d, &bits, sizeof d);
    if (!std::isfinite(d)) continue;
    const std::string s = json_number(d);
    INFO(s);
    REQUIRE(std::strtod(s.c_str(), nullptr) == d);
  }
}

TEST_CASE("hex_bits and shortest_decimal", "[cli]") {
  using emu::cli::hex_bits;
  using emu::cli::shortest_decimal;
  CHECK(hex_bits(emu::fp16(), 0x1000) == "0x1000");
  CHECK(hex_bits(emu::fp8_e4m3(), 0x7e) == "0x7e");
  CHECK(hex_bits(emu::fp8_e4m3(), 0x1) == "0x01");
  CHECK(hex_bits(emu::tf32(), 0x3f800 >> 0) == "0x3f800");
  CHECK(hex_bits(emu::tf32(), 0x1) == "0x00001");
  CHECK(hex_bits(emu::fp64(), 1) == "0x0000000000000001");
  CHECK(shortest_decimal(emu::fp16(), 0.00048828125) == "0.0004883");
  CHECK(shortest_decimal(emu::fp16(), 0.0999755859375) == "0.1");
  CHECK(shortest_decimal(emu::fp16(), 65504) == "65500");  // fp16 spacing there is 32
  CHECK(shortest_decimal(emu::fp16(), -2.0) == "-2");
  CHECK(shortest_decimal(emu::fp16(), std::ldexp(1.0, -24)) == "6e-08");
  CHECK(shortest_decimal(emu::fp64(), 0.1) == "0.1");
  CHECK(shortest_decimal(emu::fp32(), 16777216.0) == "16777216");
  // Every positive finite fp16 value: the printed decimal reads back exactly (oracle:
  // cpp_rational rounding), and no decimal with one digit fewer does (checked on the two
  // nearest such decimals, which bracket the value).
  const emu::Format& f = emu::fp16();
  for (std::uint64_t b = 1; b < 0x7c00; ++b) {
    const double v = f.decode(b);
    const std::string s = shortest_decimal(f, v);
    INFO(s << " for " << v);
    REQUIRE(oracle_rne(rational_of_decimal(s), f.fraction_bits(), f.emin()) == v);
    // Significant digits: without leading and trailing zeros.
    std::string all_digits;
    for (char c : s.substr(0, s.find('e')))
      if (c >= '0' && c <= '9') all_digits += c;
    const auto first = all_digits.find_first_not_of('0'), last = all_digits.find_last_not_of('0');
    const std::size_t digits = last - first + 1;
    if (digits > 1) {
      char buf[64];
      for (int sign : {-1, 1}) {
        // The (digits-1)-digit decimals just below and above v.
        std::snprintf(buf, sizeof buf, "%.*e", static_cast<int>(digits) - 2, v);
        mp::cpp_rational d = rational_of_decimal(buf);
        const int exp10 = std::atoi(std::strchr(buf, 'e') + 1) - (static_cast<int>(digits) - 2);
        const mp::cpp_rational unit = exp10 >= 0 ? mp::cpp_rational(pow10(static_cast<unsigned>(exp10)))
                                                 : mp::cpp_rational(1, pow10(static_cast<unsigned>(-exp10)));
        if ((sign < 0 && d > rational_of_double(v)) || (sign > 0 && d < rational_of_double(v))) d += sign * unit;
        if (d > 0 && d < 65520) REQUIRE(oracle_rne(d, f.fraction_bits(), f.emin()) != v);
      }
    }
  }
}

TEST_CASE("expression parser: precedence, associativity, signs", "[cli]") {
  using emu::cli::parse_expression;
  const auto tree = [](const char* text) { return emu::cli::to_string(*parse_expression(text)); };
  CHECK(tree("1 + 2 * 3") == "(1 + (2 * 3))");
  CHECK(tree("1 - 2 - 3") == "((1 - 2) - 3)");
  CHECK(tree("8 / 4 / 2") == "((8 / 4) / 2)");
  CHECK(tree("8 / 4 * 2") == "((8 / 4) * 2)");
  CHECK(tree("(1 + 2) * 3") == "((1 + 2) * 3)");
  CHECK(tree("-(1 + 2)") == "-((1 + 2))");
  CHECK(tree("-1 * 2") == "(-1 * 2)");
  CHECK(tree("2 * -3") == "(2 * -3)");
  CHECK(tree("2--3") == "(2 - -3)");
  CHECK(tree("--1") == "-(-1)");
  CHECK(tree("1e-3-1") == "(1e-3 - 1)");
  CHECK(tree("0x1.8p-3*2") == "(0x1.8p-3 * 2)");
  CHECK(tree("0xe-1") == "(0xe - 1)");
  CHECK(tree(" inf - -nan ") == "(inf - -nan)");
  CHECK(tree("0.0004 + 0.25 - 0.25") == "((0.0004 + 0.25) - 0.25)");

  const auto column_of = [](const char* text) {
    try {
      parse_expression(text);
    } catch (const emu::cli::SyntaxError& e) {
      return e.column();
    }
    return 0;
  };
  CHECK(column_of("") == 1);
  CHECK(column_of("1 +") == 4);
  CHECK(column_of("1 + (2 * 3") == 11);
  CHECK(column_of("2 ** 3") == 4);
  CHECK(column_of("1 2") == 3);
  CHECK(column_of("1 + abc") == 5);
  CHECK(column_of("1 + 2)") == 6);
  CHECK(column_of("1.2.3") == 1);
  CHECK(column_of("()") == 2);
  CHECK(column_of("1 % 2") == 3);
}

TEST_CASE("expression evaluation: every literal and operation rounded once", "[cli]") {
  const auto eval = [](const char* text, const emu::Format& f, emu::Flags& flags) {
    emu::Context ctx;
    const double v = emu::cli::evaluate(*emu::cli::parse_expression(text), f, ctx);
    flags = ctx.status();
    return v;
  };
  emu::Flags flags = 0;
  // The seeds' worked examples (issue 2): true values, not the misprinted 0.0004833.
  CHECK(eval("0.0004 + 0.25 - 0.25", emu::fp16(), flags) == 0.00048828125);
  CHECK(flags == emu::INEXACT);
  CHECK(eval("0.2 + 0.25 - 0.25", emu::fp16(), flags) == 0.199951171875);
  CHECK(eval("0.002 + 0.25 - 0.25", emu::fp16(), flags) == 0.001953125);
  CHECK(eval("0.0002 + 0.25 - 0.25", emu::fp16(), flags) == 0.000244140625);
  // Parentheses change the order: 0.25 - 0.25 is 0, then 0.0004 rounded once.
  CHECK(eval("0.0004 + (0.25 - 0.25)", emu::fp16(), flags) ==
        oracle_rne(rational_of_decimal("0.0004"), 10, -14));
  CHECK(eval("1 / 0", emu::fp16(), flags) == std::numeric_limits<double>::infinity());
  CHECK(flags == emu::DIV0);
  CHECK(std::isnan(eval("0 / 0", emu::fp16(), flags)));
  CHECK(flags == emu::INV);
  CHECK(eval("60000 + 60000", emu::fp16(), flags) == std::numeric_limits<double>::infinity());
  CHECK(flags == (emu::OFLO | emu::INEXACT));
  CHECK(eval("-(0.5)", emu::fp16(), flags) == -0.5);
  CHECK(eval("3 * (1 + 2) / 4", emu::fp16(), flags) == 2.25);
  CHECK(flags == 0);
}
