// Stochastic rounding, statistically: every result is one of the two neighbours; over
// 10^5 draws the frequency of rounding up is the distance ratio (sr_bits 0) or the
// documented hardware formula floor(f 2^k) / 2^k (sr_bits k), within 5 binomial sigma;
// the exact mode is unbiased. Both random sources (philox, ipu).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/round.hpp"

namespace {

constexpr long kDraws = 100'000;

struct Case {
  const emu::Format* format;
  double down;      // the neighbour toward zero, a value of the format
  double ulp;       // the gap to the neighbour away from zero
  double fraction;  // the distance ratio, in (0, 1), with more bits than any k tested
};

// x = down + fraction * ulp, with down and ulp worked out by hand for each format.
const Case kCases[] = {
    {&emu::fp16(), 1.0 + 5 * 0x1p-10, 0x1p-10, 0.7},
    {&emu::fp16(), 1.0, 0x1p-10, 0.3},
    {&emu::fp16(), -(1.0 + 3 * 0x1p-10), 0x1p-10, 1.0 / 3},
    {&emu::fp16(), 7 * 0x1p-24, 0x1p-24, 0.9},          // subnormal range
    {&emu::fp16(), 0.0, 0x1p-24, 0.01},                 // below the least subnormal
    {&emu::bf16(), 3.0, 0x1p-6, 0.55},
    {&emu::fp8_e4m3(), 416.0, 32.0, 0.2},               // top binade of OCP E4M3
    {&emu::fp8_e5m2(), 0.75, 0.125, 0.123456789},       // 0.75 = 1.5 * 2^-1: ulp 2^-3
};

double expected_up(double fraction, int sr_bits) {
  if (sr_bits == 0) return fraction;
  const double scale = std::ldexp(1.0, sr_bits);
  return std::floor(fraction * scale) / scale;  // emu/round.hpp: P(up) = floor(f 2^k) / 2^k
}

void check_case(const Case& c, emu::RngKind kind, int sr_bits) {
  const double x = c.down + std::copysign(c.fraction * c.ulp, c.down == 0 ? 1.0 : c.down);
  const double away = c.down + std::copysign(c.ulp, c.down == 0 ? 1.0 : c.down);
  // The exact ratio of the double x (fraction * ulp was rounded to a double).
  const double f = std::fabs(x - c.down) / c.ulp;
  REQUIRE(c.format->representable(c.down));
  REQUIRE(c.format->representable(away));
  emu::Rng rng(emu::StreamId{0xC0FFEE, 7, static_cast<std::uint32_t>(sr_bits), 3}, kind);
  const emu::RoundSpec spec{emu::Rounding::sr, emu::Overflow::inf, sr_bits};
  long ups = 0, strays = 0;
  double sum = 0;
  for (long i = 0; i < kDraws; ++i) {
    emu::Flags flags = 0;
    const double r = emu::round(*c.format, x, spec, &rng, flags);
    if (r == away) ++ups;
    else if (r != c.down) ++strays;
    sum += r;
  }
  const double p = expected_up(f, sr_bits);
  const double measured = static_cast<double>(ups) / kDraws;
  const double sigma = std::sqrt(p * (1 - p) / kDraws);
  INFO(c.format->name() << " x = " << x << " f = " << f << " rng " << emu::rng_kind_name(kind) << " sr_bits "
                        << sr_bits << ": P(up) measured " << measured << ", expected " << p);
  CHECK(strays == 0);
  if (p == 0 || p == 1) {
    CHECK(measured == p);
  } else {
    CHECK(std::fabs(measured - p) <= 5 * sigma);
  }
  if (sr_bits == 0) {  // unbiased: the mean result is x
    const double mean = sum / kDraws;
    CHECK(std::fabs(mean - x) <= 5 * sigma * c.ulp);
  }
}

}  // namespace

TEST_CASE("stochastic rounding: neighbours, frequencies and bias, both rngs", "[stochastic]") {
  for (emu::RngKind kind : {emu::RngKind::philox, emu::RngKind::ipu})
    for (int sr_bits : {0, 2, 4, 8, 23})
      for (const Case& c : kCases) check_case(c, kind, sr_bits);
}

TEST_CASE("few random bits are measurably biased toward zero", "[stochastic]") {
  // f = 0.7 with k = 2: P(up) = floor(2.8) / 4 = 0.5, far (> 40 sigma) from 0.7.
  const double x = 1.0 + 0.7 * 0x1p-10;
  emu::Rng rng(emu::StreamId{42});
  long ups = 0;
  for (long i = 0; i < kDraws; ++i) {
    emu::Flags flags = 0;
    ups += emu::round(emu::fp16(), x, {emu::Rounding::sr, emu::Overflow::inf, 2}, &rng, flags) > 1.0;
  }
  const double bias_ulps = 0.7 - static_cast<double>(ups) / kDraws;  // expected 0.2 ulp toward zero
  std::printf("sr_bits 2, f = 0.7: measured bias %.4f ulp toward zero (formula 0.2)\n", bias_ulps);
  CHECK(std::fabs(bias_ulps - 0.2) <= 5 * std::sqrt(0.25 / kDraws));
}

TEST_CASE("esr makes a context round stochastically; values on the grid stay exact", "[stochastic]") {
  emu::FpControl control;
  control.esr = true;
  emu::Context ctx(control, emu::Rng(emu::StreamId{1}));
  CHECK(ctx.spec().mode == emu::Rounding::sr);
  long ups = 0;
  for (int i = 0; i < 1000; ++i) ups += ctx.add(emu::fp16(), 1.0, 0x1p-12) > 1.0;  // f = 1/4
  CHECK(ups > 150);
  CHECK(ups < 350);
  ctx.clear_status();
  CHECK(ctx.add(emu::fp16(), 1.0, 0x1p-10) == 1.0 + 0x1p-10);  // exact: no draw changes it
  CHECK(ctx.status() == 0);
}

TEST_CASE("sr_bits: the residual counts, also where it holds every discarded bit (fp64)", "[stochastic]") {
  // fp64 sums of two doubles: the nearest double hi is one of the two fp64 neighbours and
  // all the discarded fraction f lies in the residual lo. With k random bits the result
  // is up iff the top k bits of the next 64-bit word are below floor(f 2^k) (the
  // documented hardware rule, emu/round.hpp); the word is read from a copy of the rng.
  struct Sum {
    double a, b;
    std::uint64_t f_num;  // f = f_num / 16 exactly
  };
  const Sum sums[] = {
      {1.0, 0x1.4p-54, 5},   // 1 + 0.3125 ulp: hi = 1, lo > 0
      {1.0, 0x1.8p-53, 12},  // 1 + 0.75 ulp: hi = 1 + ulp, lo < 0
      {-4.0, -0x1.cp-51, 14},  // -(4 + 0.875 ulp): hi = -(4 + ulp), lo > 0 (toward zero)
  };
  for (const Sum& s : sums) {
    for (int k : {1, 2, 3, 4, 5, 8, 33, 64}) {
      emu::FpControl control;
      control.rounding = emu::Rounding::sr;
      control.sr_bits = k;
      emu::Context ctx(control, emu::Rng(emu::StreamId{static_cast<std::uint64_t>(k), 9}));
      // floor(f 2^k) = floor(f_num 2^k / 16), exactly, for k up to 64.
      const unsigned __int128 threshold = (static_cast<unsigned __int128>(s.f_num) << k) >> 4;
      const double down = s.a, away = std::nextafter(s.a, s.a > 0 ? HUGE_VAL : -HUGE_VAL);
      long ups = 0;
      for (int i = 0; i < 2000; ++i) {
        emu::Rng copy = ctx.rng();
        const std::uint64_t word = copy.next_u64();
        const bool expect_up = (word >> (64 - k)) < threshold;
        const double r = ctx.add(emu::fp64(), s.a, s.b);
        INFO(s.a << " + " << s.b << " k " << k << " draw " << i);
        REQUIRE(r == (expect_up ? away : down));
        ups += expect_up;
      }
      // The predictions themselves follow floor(f 2^k) / 2^k (not a tautology: the words
      // come from the generator).
      const double p = static_cast<double>(threshold) / std::ldexp(1.0, k);
      CHECK(std::fabs(ups / 2000.0 - p) <= 5 * std::sqrt(p * (1 - p) / 2000) + 1e-12);
    }
  }
}
