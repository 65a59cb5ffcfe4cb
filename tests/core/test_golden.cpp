// Golden values from the literature, each recomputed here two ways: with emu and with
// gcc's _Float16 (the CPU's binary16 under round-to-nearest-even).
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "emu/arith.hpp"

namespace {

std::string shortest(double x) {  // the shortest %g that reads back to x
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::stod(buf) == x) break;
  }
  return buf;
}

// "v + 0.25 - 0.25" in fp16: every literal rounded into fp16, every operation rounded,
// left to right (as `emu eval` does).
double plus_minus_quarter_emu(double v) {
  emu::Context ctx;
  const emu::Format& h = emu::fp16();
  return ctx.sub(h, ctx.add(h, ctx.convert(h, v), 0.25), 0.25);
}

double plus_minus_quarter_cpu(double v) {
  volatile _Float16 x = static_cast<_Float16>(v);
  volatile _Float16 q = static_cast<_Float16>(0.25);
  volatile _Float16 s = x + q;
  volatile _Float16 d = s - q;
  return static_cast<double>(d);
}

}  // namespace

TEST_CASE("v + 0.25 - 0.25 in fp16: the worked examples' true values", "[golden]") {
  // Graphcore, "Half-precision floating point" / stochastic rounding tutorial examples
  // (one printing misquotes the first as 0.0004833; the exact fp16 value is 2^-11).
  struct Golden {
    double v;
    const char* published;  // as the examples print it (a prefix where they truncate)
  };
  const Golden cases[] = {{0.0004, "0.00048828125"}, {0.2, "0.199951171875"}, {0.02, "0.0200195"},
                          {0.002, "0.001953125"},    {0.0002, "0.000244140625"}};
  for (const Golden& g : cases) {
    const double by_emu = plus_minus_quarter_emu(g.v);
    const double by_cpu = plus_minus_quarter_cpu(g.v);
    INFO(g.v << ": emu " << shortest(by_emu) << ", _Float16 " << shortest(by_cpu));
    CHECK(by_emu == by_cpu);
    CHECK(shortest(by_emu).rfind(g.published, 0) == 0);
  }
  CHECK(emu::fp16().encode(plus_minus_quarter_emu(0.0004)) == 0x1000);  // 2^-11
  CHECK(plus_minus_quarter_emu(0.02) == 0.0200195312500);                // 82 * 2^-12
}

TEST_CASE("0.0001 added 10,000 times in fp16 rne gives 0.25", "[golden]") {
  // Graphcore IPU tutorial on stochastic rounding (numpy float16 gives the same).
  emu::Context ctx;
  const emu::Format& h = emu::fp16();
  const double term = ctx.convert(h, 0.0001);
  double sum = 0;
  volatile _Float16 cpu_sum = 0;
  const _Float16 cpu_term = static_cast<_Float16>(0.0001);
  for (int i = 0; i < 10'000; ++i) {
    sum = ctx.add(h, sum, term);
    cpu_sum = cpu_sum + cpu_term;
  }
  CHECK(sum == 0.25);
  CHECK(static_cast<double>(cpu_sum) == 0.25);
}

TEST_CASE("the fp16 harmonic series stagnates at 7.0859375 after 513 terms", "[golden]") {
  // Malone, "To what does the harmonic series converge?", Irish Math. Soc. Bulletin 71
  // (2013) 59-66; Connolly, Higham and Mary, "Stochastic rounding and its probabilistic
  // backward error analysis", SIAM J. Sci. Comput. 43(1), 2021: in fp16 with round to
  // nearest the sum of 1/k stops growing at 7.0859375, the 513th term changing nothing.
  auto stagnation = [](auto add, auto reciprocal) {
    double sum = 0;
    for (int k = 1; k < 100'000; ++k) {
      const double next = add(sum, reciprocal(k));
      if (next == sum) return std::pair{k, sum};
      sum = next;
    }
    return std::pair{0, sum};
  };
  emu::Context ctx;
  const emu::Format& h = emu::fp16();
  const auto by_emu = stagnation([&](double s, double t) { return ctx.add(h, s, t); },
                                 [&](int k) { return ctx.div(h, 1.0, k); });
  const auto by_cpu = stagnation(
      [](double s, double t) {
        volatile _Float16 a = static_cast<_Float16>(s), b = static_cast<_Float16>(t);
        return static_cast<double>(static_cast<_Float16>(a + b));
      },
      [](int k) {
        volatile _Float16 one = 1, kk = static_cast<_Float16>(k);
        return static_cast<double>(static_cast<_Float16>(one / kk));
      });
  CHECK(by_emu.first == 513);
  CHECK(by_emu.second == 7.0859375);
  CHECK(by_cpu == by_emu);
  // With stochastic rounding the sum keeps growing past the stagnation point (Connolly
  // et al., Fig. 1): after 2,000 terms it is well above 7.0859375 (exact H_2000 = 8.18).
  emu::FpControl sr;
  sr.rounding = emu::Rounding::sr;
  emu::Context sctx(sr, emu::Rng(emu::StreamId{2021}));
  double s = 0;
  for (int k = 1; k <= 2000; ++k) s = sctx.add(h, s, sctx.div(h, 1.0, k));
  CHECK(s > 7.6);
}
