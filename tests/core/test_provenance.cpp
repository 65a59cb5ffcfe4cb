// Provenance of floating-point exceptions (emu/arith.hpp, emu/status.hpp): scopes,
// elements, per-(scope, op, flag) counts, trap reports with every field, $FP_STS; and
// the flags of division by zero and infinity against IEEE 754 7.3 with the host's
// exception flags as the oracle.
#include <catch2/catch.hpp>

#include <bit>
#include <cfenv>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "host_flags.hpp"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

emu::Context context(emu::Flags counted, emu::Flags traps = 0, emu::Overflow overflow = emu::Overflow::inf) {
  emu::FpControl c;
  c.counted = counted;
  c.traps = traps;
  c.overflow = overflow;
  return emu::Context(c);
}

// The report of the trap that op throws, or nullopt if it returns.
template <typename Op>
std::optional<emu::TrapReport> trap_of(Op op) {
  try {
    op();
  } catch (const emu::FpException& e) {
    return e.report();
  }
  return std::nullopt;
}

bool same(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

emu::Element element(std::int64_t flat, std::initializer_list<std::int64_t> index = {}) {
  emu::Context ctx;
  ctx.set_element(flat, index);
  return ctx.element();
}

}  // namespace

TEST_CASE("scopes nest, pop in reverse order and unwind with their RAII guards", "[provenance]") {
  emu::Context ctx;
  CHECK(ctx.scope().empty());
  {
    emu::Scope encoder(ctx, "encoder");
    CHECK(ctx.scope() == "encoder");
    {
      emu::Scope block(ctx, "block3");
      emu::Scope ffn(ctx, "ffn");
      CHECK(ctx.scope() == "encoder.block3.ffn");
      ctx.push_scope("wo");
      CHECK(ctx.scope() == "encoder.block3.ffn.wo");
      ctx.pop_scope();
      CHECK(ctx.scope() == "encoder.block3.ffn");
    }
    CHECK(ctx.scope() == "encoder");
    // A name may itself hold dots: it pops as one.
    ctx.push_scope("attention.scores");
    CHECK(ctx.scope() == "encoder.attention.scores");
    ctx.pop_scope();
    CHECK(ctx.scope() == "encoder");
  }
  CHECK(ctx.scope().empty());
  CHECK_THROWS_AS(ctx.pop_scope(), std::logic_error);
  CHECK_THROWS_AS(ctx.push_scope(""), std::logic_error);
  // A trap unwinds the guards: the report keeps the scope, the context is back at the top.
  emu::FpControl control;
  control.traps = emu::OFLO;
  emu::Context trapping(control);
  const auto report = trap_of([&] {
    emu::Scope a(trapping, "layer1");
    emu::Scope b(trapping, "mlp");
    trapping.mul(emu::fp16(), 300.0, 300.0);
  });
  REQUIRE(report);
  CHECK(report->scope == "layer1.mlp");
  CHECK(trapping.scope().empty());
}

TEST_CASE("elements: set, guarded, restored; their text forms", "[provenance]") {
  emu::Context ctx;
  CHECK_FALSE(ctx.element().known());
  CHECK(ctx.element().to_string().empty());
  {
    emu::ElementGuard outer(ctx, 41);
    CHECK(ctx.element().flat == 41);
    CHECK(ctx.element().rank == 0);
    CHECK(ctx.element().to_string() == "#41");
    {
      emu::ElementGuard inner(ctx, 7 * 16 + 3, {7, 3});
      CHECK(ctx.element().to_string() == "[7, 3]");
      CHECK(ctx.element().flat == 115);
    }
    CHECK(ctx.element() == element(41));  // the enclosing element is back
  }
  CHECK_FALSE(ctx.element().known());
  CHECK(element(0, {0}).to_string() == "[0]");
  CHECK(element(1234, {1, 2, 3, 4}).to_string() == "[1, 2, 3, 4]");
  CHECK(element(0).to_string() == "#0");
  CHECK_THROWS_AS(ctx.set_element(0, {1, 2, 3, 4, 5}), std::logic_error);
  ctx.set_element(3, {0, 3});
  ctx.clear_element();
  CHECK_FALSE(ctx.element().known());
}

TEST_CASE("counts per (scope, op, flag): how many, the first element, its operands and result", "[provenance]") {
  const emu::Format& h = emu::fp16();
  auto ctx = context(emu::OFLO | emu::DIV0 | emu::INV);
  {
    emu::Scope s(ctx, "attn");
    ctx.add(h, 1.0, 2.0);                // no flag
    ctx.mul(h, 300.0, 300.0);            // OFLO (and INEXACT, not counted)
    ctx.mul(h, -400.0, 200.0);           // OFLO again: the first stays
    ctx.div(h, 1.0, 0.0);                // DIV0
    ctx.sub(h, kInf, kInf);              // INV
    {
      emu::Scope inner(ctx, "softmax");
      ctx.mul(h, 1000.0, 1000.0);        // OFLO in another scope
    }
  }
  ctx.mul(h, 70000.0, 1.0);  // OFLO at the top level (70000 is not an fp16 value: mixed precision)
  const auto& c = ctx.counts();
  REQUIRE(c.size() == 5);
  CHECK(c[0].scope == "attn");
  CHECK(c[0].op == "mul");
  CHECK(c[0].flag == emu::OFLO);
  CHECK(c[0].count == 2);
  CHECK(c[0].first_operands == std::vector<double>{300.0, 300.0});
  CHECK(c[0].first_result == kInf);
  CHECK_FALSE(c[0].first_element.known());  // scalar operations
  CHECK((c[1].op == "div" && c[1].flag == emu::DIV0 && c[1].count == 1));
  CHECK(c[1].first_operands == std::vector<double>{1.0, 0.0});
  CHECK((c[2].op == "sub" && c[2].flag == emu::INV && c[2].count == 1 && std::isnan(c[2].first_result)));
  CHECK((c[3].scope == "attn.softmax" && c[3].op == "mul" && c[3].count == 1));
  CHECK((c[4].scope.empty() && c[4].op == "mul" && c[4].count == 1));
  // The sticky status has everything, the uncounted INEXACT included.
  CHECK(ctx.status() == (emu::OFLO | emu::DIV0 | emu::INV | emu::INEXACT));
  ctx.clear_counts();
  CHECK(ctx.counts().empty());
  ctx.mul(h, 300.0, 300.0);
  REQUIRE(ctx.counts().size() == 1);
  CHECK(ctx.counts()[0].count == 1);
}

TEST_CASE("counts: several flags of one operation, per element once, the first element kept", "[provenance]") {
  const emu::Format& h = emu::fp16();
  auto ctx = context(emu::OFLO | emu::INEXACT | emu::UFLO);
  for (std::int64_t i = 0; i < 6; ++i) {
    emu::ElementGuard e(ctx, i, {i / 3, i % 3});
    if (i >= 2) ctx.mul(h, 300.0, 300.0);   // OFLO + INEXACT from element 2 on
    if (i == 4) ctx.mul(h, 300.0, 300.0);   // a second raise in the same element: not counted again
    ctx.mul(h, 0x1p-20, 0x1.8p-10);         // UFLO + INEXACT in every element
  }
  const auto& c = ctx.counts();
  REQUIRE(c.size() == 3);  // (mul, UFLO), (mul, INEXACT), (mul, OFLO) in the order first raised
  CHECK((c[0].flag == emu::UFLO && c[0].count == 6 && c[0].first_element == element(0, {0, 0})));
  CHECK((c[1].flag == emu::INEXACT && c[1].count == 6 && c[1].first_element == element(0, {0, 0})));
  CHECK(c[1].first_operands == std::vector<double>{0x1p-20, 0x1.8p-10});
  CHECK((c[2].flag == emu::OFLO && c[2].count == 4));
  CHECK(c[2].first_element == element(2, {0, 2}));
  CHECK(c[2].first_element.to_string() == "[0, 2]");
  // Scalar operations count every time.
  auto scalar = context(emu::OFLO);
  for (int i = 0; i < 3; ++i) scalar.mul(h, 300.0, 300.0);
  CHECK(scalar.counts().at(0).count == 3);
}

TEST_CASE("add_count merges counts gathered elsewhere and raises their flags", "[provenance]") {
  auto ctx = context(emu::OFLO);
  ctx.mul(emu::fp16(), 300.0, 300.0);
  emu::OpCount same{"", "mul", emu::OFLO, 5, element(9), {1.0, 2.0}, 3.0};
  emu::OpCount other{"gemm", "amp", emu::INV, 2, element(4, {1, 1}), {}, std::nan("")};
  ctx.add_count(same);
  ctx.add_count(other);
  REQUIRE(ctx.counts().size() == 2);
  CHECK(ctx.counts()[0].count == 6);
  CHECK(ctx.counts()[0].first_operands == std::vector<double>{300.0, 300.0});  // the first stays
  CHECK((ctx.counts()[1].scope == "gemm" && ctx.counts()[1].count == 2));
  CHECK(ctx.status() == (emu::OFLO | emu::INEXACT | emu::INV));
}

TEST_CASE("count and trap together: the count is taken, then the trap throws", "[provenance]") {
  auto ctx = context(emu::OFLO | emu::DIV0, emu::OFLO);
  ctx.div(emu::fp16(), 1.0, 0.0);  // counted, not trapped
  const auto report = trap_of([&] { ctx.mul(emu::fp16(), 300.0, 300.0); });
  REQUIRE(report);
  CHECK(report->flag == emu::OFLO);
  REQUIRE(ctx.counts().size() == 2);
  CHECK((ctx.counts()[1].op == "mul" && ctx.counts()[1].flag == emu::OFLO && ctx.counts()[1].count == 1));
}

TEST_CASE("trap reports: flag, scope, op, element, operands, would-be result per overflow policy, status, $FP_STS",
          "[provenance]") {
  struct Policy {
    emu::Overflow overflow;
    double result;  // NaN: a NaN
    emu::Flags status;
  };
  const Policy policies[] = {
      {emu::Overflow::inf, kInf, emu::OFLO | emu::INEXACT},
      {emu::Overflow::saturate, 65504.0, emu::OFLO | emu::INEXACT},
      {emu::Overflow::nan, std::nan(""), emu::OFLO | emu::INV | emu::INEXACT},  // the IPU's NANOO
  };
  for (const Policy& p : policies) {
    INFO(emu::overflow_name(p.overflow));
    // OFLO and INV both trap: under NANOO the overflow is the cause, INV its consequence.
    auto ctx = context(0, emu::OFLO | emu::DIV0 | emu::INV, p.overflow);
    ctx.div(emu::fp16(), 1.0, 3.0);  // INEXACT before: in the status
    const auto report = trap_of([&] {
      emu::Scope s(ctx, "encoder");
      emu::Scope b(ctx, "block3.ffn");
      emu::ElementGuard e(ctx, 2 * 512 + 17, {2, 17});
      ctx.mul(emu::fp16(), 256.0, 256.0);  // 65536: past 65504 + 16
    });
    REQUIRE(report);
    CHECK(report->flag == emu::OFLO);
    CHECK(report->scope == "encoder.block3.ffn");
    CHECK(report->op == "mul");
    CHECK(report->element == element(1041, {2, 17}));
    CHECK(report->operands == std::vector<double>{256.0, 256.0});
    if (std::isnan(p.result))
      CHECK(std::isnan(report->result));
    else
      CHECK(report->result == p.result);
    CHECK(report->status == p.status);
    // $FP_STS: bit 0 INV, bit 1 DIV0, bit 2 OFLO (emu/status.hpp); no UFLO or INEXACT.
    CHECK(report->fp_sts() == (p.overflow == emu::Overflow::nan ? 0b101u : 0b100u));
    CHECK(ctx.status() == p.status);  // the sticky status holds the trapping flag
    CHECK(ctx.scope().empty());
    CHECK_FALSE(ctx.element().known());
  }
  // The message names everything.
  auto ctx = context(0, emu::DIV0);
  try {
    emu::Scope s(ctx, "norm");
    emu::ElementGuard e(ctx, 3);
    ctx.div(emu::fp16(), -2.0, 0.0);
    FAIL("no trap");
  } catch (const emu::FpException& e) {
    CHECK(std::string(e.what()) == "floating-point trap: DIV0 in norm: div(-2, 0) at element #3 = -inf");
    CHECK(e.report().fp_sts() == 0b010u);
    CHECK(e.result() == -kInf);
    CHECK(e.scope() == "norm");
    CHECK(e.element() == element(3));
  }
  // Each flag on its own, and the cause first where one operation raises several:
  // x/0 in fp8-e4m3 (no inf) raises DIV0 and INV; DIV0 is reported.
  CHECK(emu::fp_sts(emu::INV) == 1u);
  CHECK(emu::fp_sts(emu::DIV0) == 2u);
  CHECK(emu::fp_sts(emu::OFLO) == 4u);
  CHECK(emu::fp_sts(emu::UFLO | emu::INEXACT) == 0u);
  auto e4m3 = context(0, emu::DIV0 | emu::INV);
  const auto report = trap_of([&] { e4m3.div(emu::fp8_e4m3(), 1.0, 0.0); });
  REQUIRE(report);
  CHECK(report->flag == emu::DIV0);
  CHECK(report->status == (emu::DIV0 | emu::INV));
  CHECK(report->fp_sts() == 0b011u);
  // UFLO and INEXACT trap too when enabled (not IPU flags, but emu has them).
  auto uflo = context(0, emu::UFLO);
  const auto tiny = trap_of([&] { uflo.mul(emu::fp16(), 0x1.004p-10, 0x1p-10); });
  REQUIRE(tiny);
  CHECK(tiny->flag == emu::UFLO);
  CHECK(tiny->result == 0x1p-20);  // 2^-20 + 2^-28: a sixteenth of the subnormal spacing 2^-24 above
}

TEST_CASE("flag names in either case", "[provenance]") {
  for (emu::Flag f : emu::kAllFlags) CHECK(emu::flag_by_name(emu::flag_name(f)) == f);
  CHECK(emu::flag_by_name("oflo") == emu::OFLO);
  CHECK(emu::flag_by_name("Div0") == emu::DIV0);
  CHECK_THROWS_AS(emu::flag_by_name("overflow"), std::invalid_argument);
  for (const char* name : {"before", "after"})
    CHECK(std::string(emu::tininess_name(emu::tininess_by_name(name))) == name);
  for (const char* name : {"off", "count", "trap"})
    CHECK(std::string(emu::exception_mode_name(emu::exception_mode_by_name(name))) == name);
  CHECK_THROWS_AS(emu::tininess_by_name("during"), std::invalid_argument);
}

namespace {

// The host's IEEE 754 division: result and flags (fenv; SSE division of doubles).
double host_div(double a, double b, emu::Flags& flags) {
  volatile double x = a, y = b;
  std::feclearexcept(FE_ALL_EXCEPT);
  volatile double q = x / y;
  flags = host_flags::from_fenv(std::fetestexcept(FE_ALL_EXCEPT));
  return q;
}

}  // namespace

TEST_CASE("division by zero and by infinity: IEEE 754 7.3 flags, the host as oracle, also when DIV0 traps",
          "[provenance]") {
  // divideByZero only for an exact infinite result from finite operands: x/0 for finite
  // non-zero x; inf/0 is an exact infinity (no flag), 0/0 and inf/inf are invalid.
  const double values[] = {kInf, -kInf, 0.0, -0.0, 1.5, -1.5, 65504.0, -3.0};
  const double divisors[] = {0.0, -0.0, kInf, -kInf, 2.0, -4.0};  // finite quotients exact in fp16
  int div0_cases = 0;
  for (const emu::Format* f : {&emu::fp16(), &emu::fp32(), &emu::fp64()})
    for (double a : values)
      for (double b : divisors) {
        INFO(f->name() << ": " << a << " / " << b);
        emu::Flags want = 0;
        const double host = host_div(a, b, want);
        emu::Context quiet;
        const double got = quiet.div(*f, a, b);
        CHECK((same(got, host) || (std::isnan(got) && std::isnan(host))));
        CHECK(quiet.status() == want);
        div0_cases += (want & emu::DIV0) != 0;
        // With DIV0 (and INV) trapping: exactly the flagged ones trap, with their flag.
        for (const emu::Flags traps : {emu::Flags{emu::DIV0}, emu::Flags(emu::DIV0 | emu::INV)}) {
          auto trapping = context(0, traps);
          const auto report = trap_of([&] { trapping.div(*f, a, b); });
          const emu::Flags trapped = want & traps;
          CHECK(report.has_value() == (trapped != 0));
          if (report) {
            CHECK(report->flag == (trapped & emu::DIV0 ? emu::DIV0 : emu::INV));
            CHECK(report->op == "div");
            CHECK(report->operands == std::vector<double>{a, b});
            CHECK((same(report->result, host) || (std::isnan(report->result) && std::isnan(host))));
          }
        }
      }
  CHECK(div0_cases == 3 * 4 * 2);  // 1.5 -1.5 65504 -3 over +-0, in three formats
  // The cases of the issue, spelled out.
  emu::FpControl control;
  control.traps = emu::DIV0;
  emu::Context ctx(control);
  CHECK(same(ctx.div(emu::fp16(), kInf, 0.0), kInf));
  CHECK(same(ctx.div(emu::fp16(), -kInf, -0.0), kInf));
  CHECK(same(ctx.div(emu::fp16(), kInf, -0.0), -kInf));
  CHECK(same(ctx.div(emu::fp16(), -kInf, 0.0), -kInf));
  CHECK(ctx.status() == 0);
  CHECK(std::isnan(ctx.div(emu::fp16(), 0.0, 0.0)));
  CHECK(ctx.status() == emu::INV);
  CHECK_THROWS_AS(ctx.div(emu::fp16(), 5.0, -0.0), emu::FpException);
}
