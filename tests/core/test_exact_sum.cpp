// ExactSum against exact Boost integer sums: random sums and sums of products with
// exponents spread over double's whole range, and cancellation to tiny or zero results.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "emu/exact_sum.hpp"
#include "reference.hpp"

namespace {

const ref::Spec kFp64{11, 52};

// hi: the nearest double to the exact sum (ties to even), via the reference rounding.
struct Expected {
  double hi = 0;
  bool beyond = false;
  ref::Dyadic rest{0, 0};  // sum - hi, exactly
};

Expected expected_of(const ref::Dyadic& sum) {
  if (sum.m == 0) return {};
  const ref::Result hi = ref::round(ref::real(sum), kFp64, emu::Rounding::rne, emu::Overflow::inf);
  if (std::isinf(hi.value)) return {hi.value, true};
  return {hi.value, false, ref::add(sum, ref::dyadic(-hi.value))};
}

// lo * 2^-lo_scale must be the residual to within one ulp of lo, with its sign (never
// zero for a non-zero residual), and exactly it when lo is a power of two (an inexact
// power of two could fake a half-ulp tie).
bool residual_ok(const emu::Exact& got, const ref::Dyadic& rest) {
  if (rest.m == 0) return got.lo == 0;
  if (got.lo == 0 || (got.lo < 0) != (rest.m < 0)) return false;
  ref::Dyadic lo = ref::dyadic(got.lo);  // lo is normal: its ulp is 2^lo.e
  lo.e -= got.lo_scale;
  const ref::Dyadic diff = ref::add(rest, ref::Dyadic{-lo.m, lo.e});
  int e = 0;
  if (std::fabs(std::frexp(got.lo, &e)) == 0.5) return diff.m == 0;
  const ref::Int size = abs(diff.m);
  return lo.e >= diff.e ? size <= (ref::Int(1) << (lo.e - diff.e)) : (size << (diff.e - lo.e)) <= 1;
}

double random_double(std::mt19937_64& gen, int min_exp, int max_exp) {
  const double m = 1.0 + static_cast<double>(gen() >> 11) * 0x1p-53;
  const int e = min_exp + static_cast<int>(gen() % static_cast<std::uint64_t>(max_exp - min_exp + 1));
  const double v = std::ldexp(m, e);  // below -1022: a subnormal, rounded by ldexp: still a double
  return (gen() & 1) ? -v : v;
}

}  // namespace

TEST_CASE("ExactSum equals the exact sum of random terms and products", "[exact_sum]") {
  std::mt19937_64 gen(2024);
  int mismatches = 0, zero_results = 0, tiny_results = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    emu::ExactSum s;
    ref::Dyadic exact{0, 0};
    const int terms = 1 + static_cast<int>(gen() % 60);
    // Spread: sometimes the whole range, sometimes a narrow window (heavy cancellation).
    const bool wide = trial % 3 == 0;
    const int centre = static_cast<int>(gen() % 1800) - 900;
    std::vector<double> added;
    for (int i = 0; i < terms; ++i) {
      if (gen() % 3 == 0) {
        const double a = wide ? random_double(gen, -1074, 500) : random_double(gen, centre / 2 - 30, centre / 2 + 30);
        const double b = wide ? random_double(gen, -1074, 500) : random_double(gen, centre / 2 - 30, centre / 2 + 30);
        s.add_product(a, b);
        exact = ref::add(exact, ref::mul(ref::dyadic(a), ref::dyadic(b)));
      } else {
        const double x = wide ? random_double(gen, -1074, 1000) : random_double(gen, centre - 60, centre + 60);
        s.add(x);
        added.push_back(x);
        exact = ref::add(exact, ref::dyadic(x));
      }
    }
    // Cancellation: take back every plain term in a third of the trials.
    if (trial % 3 == 1)
      for (double x : added) {
        s.add(-x);
        exact = ref::add(exact, ref::dyadic(-x));
      }
    const Expected want = expected_of(exact);
    const emu::Exact got = s.value();
    zero_results += exact.m == 0;
    tiny_results += exact.m != 0 && std::fabs(want.hi) < 0x1p-1000;
    const bool ok = got.hi == want.hi && got.beyond_double == want.beyond &&
                    (want.beyond || residual_ok(got, want.rest)) && s.is_zero() == (exact.m == 0);
    if (!ok && ++mismatches < 6)
      UNSCOPED_INFO("trial " << trial << ": got " << got.hi << " + " << got.lo << " * 2^-" << got.lo_scale
                             << ", expected hi " << want.hi);
  }
  CHECK(mismatches == 0);
  CHECK(zero_results > 0);  // the cancellation trials with no products reach exactly zero
}

TEST_CASE("ExactSum: classic cancellations and range ends", "[exact_sum]") {
  emu::ExactSum s;
  s.add(0x1p1000);
  s.add(1.0);
  s.add(-0x1p1000);
  CHECK(s.value().hi == 1.0);
  CHECK(s.value().lo == 0.0);

  emu::ExactSum tiny;  // 2^-1074 * 2^-1074 = 2^-2148, far below double: kept exactly
  tiny.add_product(0x1p-1074, 0x1p-1074);
  CHECK_FALSE(tiny.is_zero());
  tiny.add_product(-0x1p-1074, 0x1p-1074);
  CHECK(tiny.is_zero());

  emu::ExactSum huge;  // beyond double's range
  huge.add(0x1.fffffffffffffp1023);
  huge.add(0x1.fffffffffffffp1023);
  CHECK(huge.value().beyond_double);
  huge.add(-0x1.fffffffffffffp1023);
  CHECK(huge.value().hi == 0x1.fffffffffffffp1023);

  emu::ExactSum many;  // 10^6 terms of 0.1: the exact sum of the double 0.1, 10^6 times
  for (int i = 0; i < 1'000'000; ++i) many.add(0.1);
  ref::Dyadic exact = ref::mul(ref::dyadic(0.1), ref::dyadic(1e6));
  CHECK(many.value().hi == expected_of(exact).hi);
  CHECK(residual_ok(many.value(), expected_of(exact).rest));
}

TEST_CASE("ExactSum: a residual far below double's range still steers directed rounding", "[exact_sum]") {
  emu::ExactSum s;  // 1 + 2^-2148
  s.add(1.0);
  s.add_product(0x1p-1074, 0x1p-1074);
  const emu::Exact x = s.value();
  CHECK(x.hi == 1.0);
  CHECK(x.lo > 0);
  emu::Flags flags = 0;
  CHECK(emu::round(emu::fp16(), x, {emu::Rounding::ru}, nullptr, flags) == 1.0 + 0x1p-10);
  CHECK(emu::round(emu::fp16(), x, {emu::Rounding::rd}, nullptr, flags) == 1.0);
  CHECK(emu::round(emu::fp64(), x, {emu::Rounding::ru}, nullptr, flags) == 1.0 + 0x1p-52);
  CHECK(flags == emu::INEXACT);
  // 1 + 2^-53 (an exact fp64 tie) minus 2^-2148: below the tie, so rne and rna give 1.
  emu::ExactSum t;
  t.add(1.0);
  t.add(0x1p-53);
  t.add_product(-0x1p-1074, 0x1p-1074);
  CHECK(emu::round(emu::fp64(), t.value(), {emu::Rounding::rna}, nullptr, flags) == 1.0);
  CHECK(emu::round(emu::fp64(), t.value(), {emu::Rounding::rne}, nullptr, flags) == 1.0);
  emu::ExactSum u;  // the exact tie itself: rna goes away, rne to even
  u.add(1.0);
  u.add(0x1p-53);
  CHECK(emu::round(emu::fp64(), u.value(), {emu::Rounding::rna}, nullptr, flags) == 1.0 + 0x1p-52);
  CHECK(emu::round(emu::fp64(), u.value(), {emu::Rounding::rne}, nullptr, flags) == 1.0);
}

TEST_CASE("exact_from_fixed gives ExactSum::value()'s hi, lo and lo_scale", "[exact_sum]") {
  // v * 2^lsb summed into an ExactSum in three exact pieces of 43 bits; v built from a
  // few signed powers of two and random low bits, so that hi and lo meet ties (bit 53
  // of v alone) and residuals that round onto powers of two.
  std::mt19937_64 gen(5);
  auto below = [&](int n) { return static_cast<int>(gen() % static_cast<unsigned>(n)); };
  int checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    __int128 v = 0;
    const int terms = 1 + below(4);
    for (int t = 0; t < terms; ++t) {
      const __int128 bit = static_cast<__int128>(1) << below(125);
      v += (gen() & 1) ? bit : -bit;
    }
    if (below(2)) v += static_cast<__int128>(gen() >> below(64)) * ((gen() & 1) ? 1 : -1);
    if (v == 0) continue;
    const int lsb = below(2) ? -1022 + below(200) : -300 + below(1000);
    emu::ExactSum sum;
    const bool negative = v < 0;
    unsigned __int128 magnitude = negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
    for (int piece = 0; piece < 3; ++piece) {
      const auto bits = static_cast<std::uint64_t>(magnitude & ((static_cast<unsigned __int128>(1) << 43) - 1));
      sum.add(std::ldexp(negative ? -static_cast<double>(bits) : static_cast<double>(bits), lsb + 43 * piece));
      magnitude >>= 43;
    }
    const emu::Exact want = sum.value(), got = emu::exact_from_fixed(v, lsb);
    INFO("trial " << trial << " lsb " << lsb << " hi " << want.hi << " lo " << want.lo);
    REQUIRE(got.hi == want.hi);
    REQUIRE(std::signbit(got.lo) == std::signbit(want.lo));
    REQUIRE(got.lo == want.lo);
    REQUIRE(got.lo_scale == want.lo_scale);
    REQUIRE(got.beyond_double == want.beyond_double);
    ++checked;
  }
  CHECK(checked > 19000);
}
