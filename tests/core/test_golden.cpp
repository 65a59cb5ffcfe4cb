// Golden values from the literature, each recomputed here two ways: with emu and with
// gcc's _Float16 (the CPU's binary16 under round-to-nearest-even).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
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

// ---- FLAN-T5 in float16 -------------------------------------------------------------
// Harry Mellor, "Running Flan-T5-XL inference in Float16 for IPU - how we did it",
// Graphcore blog, 30 May 2023 (graphcore.ai/posts/running-flan-t5-xl-inference-in-
// float16-for-ipu-how-we-did-it): the attention mask of finfo(float16).min = -65504
// overflows when added to a negative score, fixed by scaling it by 0.75; the tanh GeLU's
// cube x^3 overflows float16 just above 40, fixed by using ReLU for |x| > 39. Each value
// here is computed with emu (flags included) and with gcc's _Float16 (the CPU, rne).

namespace {

struct Fp16Result {
  double value;
  emu::Flags flags;
};

Fp16Result emu_add(double a, double b) {
  emu::Context ctx;
  const double r = ctx.add(emu::fp16(), a, b);
  return {r, ctx.status()};
}

double cpu_add(double a, double b) {
  volatile _Float16 x = static_cast<_Float16>(a), y = static_cast<_Float16>(b);
  return static_cast<double>(static_cast<_Float16>(x + y));
}

// x^3 as (x * x) * x, each product rounded into fp16.
Fp16Result emu_cube(double x) {
  emu::Context ctx;
  const emu::Format& h = emu::fp16();
  const double r = ctx.mul(h, ctx.mul(h, x, x), x);
  return {r, ctx.status()};
}

double cpu_cube(double x) {
  volatile _Float16 v = static_cast<_Float16>(x);
  volatile _Float16 square = v * v;
  return static_cast<double>(static_cast<_Float16>(square * v));
}

double fp16_next_down(double x) { return emu::fp16().decode(emu::fp16().encode(x) + (x < 0 ? 1 : -1)); }

}  // namespace

TEST_CASE("FLAN-T5 fp16: -65504 - 10 stays -65504, -65504 - 100 is -inf", "[golden]") {
  // fp16's top binade has spacing 32; -65504 - 10 = -65514 is nearer -65504 than the
  // overflow midpoint -65520: INEXACT only. -65604 lies past it: -inf with OFLO.
  const Fp16Result minus_ten = emu_add(-65504, -10);
  CHECK(minus_ten.value == -65504);
  CHECK(minus_ten.flags == emu::INEXACT);
  CHECK(cpu_add(-65504, -10) == -65504);
  const Fp16Result minus_hundred = emu_add(-65504, -100);
  CHECK(minus_hundred.value == -std::numeric_limits<double>::infinity());
  CHECK(minus_hundred.flags == (emu::OFLO | emu::INEXACT));
  CHECK(cpu_add(-65504, -100) == -std::numeric_limits<double>::infinity());
}

TEST_CASE("FLAN-T5 fp16: the GeLU cube x^3 overflows from x = 40.34375 on", "[golden]") {
  // Derivation: fp16 spacing at 40 is 2^-5. 40.3125^2 = 1625.0977 rounds to 1625 (spacing
  // 1), 1625 * 40.3125 = 65507.8 rounds to 65504 (below the overflow midpoint 65520):
  // finite. The next value, 40.34375: 40.34375^2 = 1627.61 rounds to 1628, and
  // 1628 * 40.34375 = 65679.6 overflows. (The exact cube crosses 65520 at 40.3175, so
  // one rounding of the exact cube gives the same threshold.)
  double first_overflow = 0;
  for (std::uint64_t bits = emu::fp16().encode(32.0); bits < emu::fp16().encode(64.0); ++bits) {
    const double x = emu::fp16().decode(bits);
    const Fp16Result cube = emu_cube(x);
    INFO(x);
    CHECK(cube.value == cpu_cube(x));
    if (std::isinf(cube.value)) {
      CHECK((cube.flags & emu::OFLO) != 0);
      if (first_overflow == 0) first_overflow = x;
    } else {
      CHECK((cube.flags & emu::OFLO) == 0);
    }
  }
  CHECK(first_overflow == 40.34375);
  CHECK(emu_cube(40.3125).value == 65504);
  CHECK(emu_cube(40.3125).flags == emu::INEXACT);
  CHECK(emu_cube(-40.34375).value == -std::numeric_limits<double>::infinity());
  CHECK(emu_cube(-40.34375).flags == (emu::OFLO | emu::INEXACT));
  // The fix clamps at 39: 39^3 = 59319 is finite (59328 in fp16, spacing 32).
  CHECK(emu_cube(39).value == 59328);
  CHECK(emu_cube(39).flags == emu::INEXACT);
}

TEST_CASE("FLAN-T5 fp16: the attention mask at 1.0 and 0.75 of -65504, the exact safe score", "[golden]") {
  emu::Context ctx;
  const emu::Format& h = emu::fp16();
  // 0.75 * -65504 = -49128 is not an fp16 value (spacing 32 there): rne gives -49120.
  const double mask = ctx.mul(h, 0.75, -65504);
  CHECK(mask == -49120);
  CHECK(ctx.convert(h, -49128) == -49120);
  // s + mask overflows when the exact sum reaches -65520 (the midpoint to -65536, which
  // ties to the even -65536: overflow). So s must be above -65520 + 49120 = -16400; the
  // most negative fp16 score that is safe is -16384 (s + mask = -65504 exactly), one
  // ulp beyond (spacing 16 below -16384) is -16400, which overflows. (The write-up's
  // "about -16,376" is 65504 / 4, before the mask is rounded into fp16.)
  const double safe = -16384;
  const double beyond = fp16_next_down(safe);
  CHECK(beyond == -16400);
  CHECK(emu_add(safe, mask).value == -65504);
  CHECK(emu_add(safe, mask).flags == 0);
  CHECK(cpu_add(safe, mask) == -65504);
  CHECK(emu_add(beyond, mask).value == -std::numeric_limits<double>::infinity());
  CHECK(emu_add(beyond, mask).flags == (emu::OFLO | emu::INEXACT));
  CHECK(std::isinf(cpu_add(beyond, mask)));
  // Every fp16 score from -16384 up is safe (checked over the whole range to -1).
  for (double s = safe; s <= -1; s = -fp16_next_down(-s)) CHECK((emu_add(s, mask).flags & emu::OFLO) == 0);
  // At 1.0 of -65504 a score of -16 already overflows (-65520 ties to -65536); the most
  // negative safe one is the fp16 value next to -16, -15.9921875 (spacing 2^-7 below 16).
  CHECK(emu_add(-16, -65504).flags == (emu::OFLO | emu::INEXACT));
  CHECK(emu_add(-15.9921875, -65504).value == -65504);
  CHECK((emu_add(-15.9921875, -65504).flags & emu::OFLO) == 0);
  CHECK(fp16_next_down(-15.9921875) == -16);
}
