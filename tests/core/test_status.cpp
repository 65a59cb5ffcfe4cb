// FP status and control: traps, sticky flags, IEEE 754 NaN/inf semantics (clause 7),
// signed zeros of exact results (6.3), the overflow policies, flushing without
// subnormals.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "emu/arith.hpp"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_neg_zero(double x) { return x == 0 && std::signbit(x); }
bool is_pos_zero(double x) { return x == 0 && !std::signbit(x); }

emu::Context context(emu::Rounding mode = emu::Rounding::rne, emu::Overflow overflow = emu::Overflow::inf) {
  emu::FpControl c;
  c.rounding = mode;
  c.overflow = overflow;
  return emu::Context(c);
}

}  // namespace

TEST_CASE("an enabled trap throws FpException naming flag, op and operands; status keeps the flag", "[status]") {
  struct Trap {
    emu::Flag flag;
    const char* op;
    double (*run)(emu::Context&);
  };
  const Trap traps[] = {
      {emu::OFLO, "mul", [](emu::Context& c) { return c.mul(emu::fp16(), 60000.0, 2.0); }},
      {emu::DIV0, "div", [](emu::Context& c) { return c.div(emu::fp16(), 3.0, 0.0); }},
      {emu::INV, "sqrt", [](emu::Context& c) { return c.sqrt(emu::fp16(), -1.0); }},
      {emu::INV, "sub", [](emu::Context& c) { return c.sub(emu::fp16(), kInf, kInf); }},
  };
  for (const Trap& t : traps) {
    emu::FpControl control;
    control.traps = emu::OFLO | emu::DIV0 | emu::INV;
    emu::Context ctx(control);
    INFO(t.op);
    try {
      t.run(ctx);
      FAIL("no exception");
    } catch (const emu::FpException& e) {
      CHECK(e.flag() == t.flag);
      CHECK(e.op() == t.op);
      CHECK(std::string(e.what()).find(emu::flag_name(t.flag)) != std::string::npos);
      CHECK(std::string(e.what()).find(t.op) != std::string::npos);
      CHECK_FALSE(e.operands().empty());
    }
    CHECK((ctx.status() & t.flag) != 0);
    ctx.clear_status();
    CHECK(ctx.status() == 0);
  }
  // The operands as given, and in the message.
  emu::FpControl control;
  control.traps = emu::OFLO;
  emu::Context ctx(control);
  try {
    ctx.mul(emu::fp16(), 60000.0, 2.0);
    FAIL("no exception");
  } catch (const emu::FpException& e) {
    CHECK(e.operands() == std::vector<double>{60000.0, 2.0});
    CHECK(std::string(e.what()).find("60000") != std::string::npos);
  }
  // A flag that is not enabled does not trap, but is recorded.
  control.traps = emu::DIV0;
  emu::Context quiet(control);
  CHECK(std::isinf(quiet.mul(emu::fp16(), 60000.0, 2.0)));
  CHECK(quiet.status() == (emu::OFLO | emu::INEXACT));
}

TEST_CASE("flags are sticky until cleared", "[status]") {
  auto ctx = context();
  ctx.add(emu::fp16(), 1.0, 0x1p-20);  // INEXACT
  ctx.add(emu::fp16(), 1.0, 1.0);      // exact: does not clear
  CHECK(ctx.status() == emu::INEXACT);
  ctx.div(emu::fp16(), 1.0, 0.0);
  CHECK(ctx.status() == (emu::INEXACT | emu::DIV0));
  ctx.clear_status();
  CHECK(ctx.status() == 0);
}

TEST_CASE("invalid operations give NaN and INV; x/0 gives signed inf and DIV0", "[status]") {
  const emu::Format& h = emu::fp16();
  auto invalid = [](double (*op)(emu::Context&)) {
    auto ctx = context();
    const double r = op(ctx);
    return std::isnan(r) && ctx.status() == emu::INV;
  };
  CHECK(invalid([](emu::Context& c) { return c.add(emu::fp16(), kInf, -kInf); }));
  CHECK(invalid([](emu::Context& c) { return c.sub(emu::fp16(), -kInf, -kInf); }));
  CHECK(invalid([](emu::Context& c) { return c.mul(emu::fp16(), 0.0, kInf); }));
  CHECK(invalid([](emu::Context& c) { return c.mul(emu::fp16(), -kInf, -0.0); }));
  CHECK(invalid([](emu::Context& c) { return c.div(emu::fp16(), 0.0, -0.0); }));
  CHECK(invalid([](emu::Context& c) { return c.div(emu::fp16(), kInf, -kInf); }));
  CHECK(invalid([](emu::Context& c) { return c.sqrt(emu::fp16(), -1.0); }));
  CHECK(invalid([](emu::Context& c) { return c.sqrt(emu::fp16(), -kInf); }));
  CHECK(invalid([](emu::Context& c) { return c.fma(emu::fp16(), 0.0, kInf, 1.0); }));
  CHECK(invalid([](emu::Context& c) { return c.fma(emu::fp16(), kInf, 1.0, -kInf); }));

  auto ctx = context();
  CHECK(ctx.div(h, 1.0, 0.0) == kInf);
  CHECK(ctx.div(h, -1.0, 0.0) == -kInf);
  CHECK(ctx.div(h, 1.0, -0.0) == -kInf);
  CHECK(ctx.status() == emu::DIV0);
  ctx.clear_status();
  // Quiet NaN operands propagate with no flag; sqrt(-0) = -0 (IEEE 754 5.4.1).
  CHECK(std::isnan(ctx.add(h, std::nan(""), 1.0)));
  CHECK(std::isnan(ctx.mul(h, std::nan(""), kInf)));
  CHECK(is_neg_zero(ctx.sqrt(h, -0.0)));
  CHECK(ctx.sqrt(h, kInf) == kInf);
  CHECK(ctx.add(h, kInf, 1.0) == kInf);
  CHECK(ctx.div(h, 1.0, -kInf) == 0.0);
  CHECK(ctx.status() == 0);
  // Ordered comparison with NaN is invalid; equality is quiet.
  CHECK_FALSE(ctx.equal(std::nan(""), 1.0));
  CHECK(ctx.status() == 0);
  CHECK_FALSE(ctx.less(std::nan(""), 1.0));
  CHECK(ctx.status() == emu::INV);
  CHECK(ctx.compare(std::nan(""), 1.0) == std::partial_ordering::unordered);
  CHECK(ctx.compare(1.0, 2.0) == std::partial_ordering::less);
}

TEST_CASE("exact zeros: +0 from cancellation, -0 under rd, zeros keep a shared sign", "[status]") {
  const emu::Format& h = emu::fp16();
  for (emu::Rounding mode : {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::rz, emu::Rounding::ru,
                             emu::Rounding::ro, emu::Rounding::sr}) {
    auto ctx = context(mode);
    INFO(emu::rounding_name(mode));
    CHECK(is_pos_zero(ctx.add(h, 1.0, -1.0)));
    CHECK(is_pos_zero(ctx.sub(h, 0.5, 0.5)));
    CHECK(is_pos_zero(ctx.add(h, 0.0, -0.0)));
    CHECK(is_neg_zero(ctx.add(h, -0.0, -0.0)));
    CHECK(is_pos_zero(ctx.fma(h, 1.0, 1.0, -1.0)));
    CHECK(is_neg_zero(ctx.fma(h, -0.0, 1.0, -0.0)));
    CHECK(ctx.status() == 0);
  }
  auto rd = context(emu::Rounding::rd);
  CHECK(is_neg_zero(rd.add(h, 1.0, -1.0)));
  CHECK(is_neg_zero(rd.sub(h, 0.5, 0.5)));
  CHECK(is_neg_zero(rd.add(h, 0.0, -0.0)));
  CHECK(is_pos_zero(rd.add(h, 0.0, 0.0)));
  CHECK(is_neg_zero(rd.fma(h, 1.0, 1.0, -1.0)));
  auto rne = context();
  CHECK(is_neg_zero(rne.mul(h, -0.0, 5.0)));
  CHECK(is_neg_zero(rne.mul(h, -0x1p-20, 0x1p-20)));  // underflows to -0
  CHECK(rne.status() == (emu::UFLO | emu::INEXACT));
}

TEST_CASE("overflow policies: inf (by direction), saturate, nan", "[status]") {
  const emu::Format& h = emu::fp16();
  struct Expect {
    emu::Rounding mode;
    emu::Overflow overflow;
    double x;
    double result;  // NaN: expect NaN
    emu::Flags flags;
  };
  const double nan = std::nan("");
  const Expect cases[] = {
      {emu::Rounding::rne, emu::Overflow::inf, 1e6, kInf, emu::OFLO | emu::INEXACT},
      {emu::Rounding::rz, emu::Overflow::inf, 1e6, 65504, emu::OFLO | emu::INEXACT},
      {emu::Rounding::ru, emu::Overflow::inf, -1e6, -65504, emu::OFLO | emu::INEXACT},
      {emu::Rounding::rd, emu::Overflow::inf, -1e6, -kInf, emu::OFLO | emu::INEXACT},
      {emu::Rounding::rne, emu::Overflow::saturate, -1e6, -65504, emu::OFLO | emu::INEXACT},
      {emu::Rounding::rne, emu::Overflow::nan, 1e6, nan, emu::OFLO | emu::INV | emu::INEXACT},
      // 65519.99 rounds (unbounded exponent) to 65504: no overflow; 65520 ties up: overflow.
      {emu::Rounding::rne, emu::Overflow::inf, 65519.99, 65504, emu::INEXACT},
      {emu::Rounding::rne, emu::Overflow::inf, 65520, kInf, emu::OFLO | emu::INEXACT},
      {emu::Rounding::rz, emu::Overflow::inf, 65535.99, 65504, emu::INEXACT},
      // Infinity itself is exact and not an overflow; saturate maps it to max with OFLO
      // only in formats without inf (emu/round.hpp).
      {emu::Rounding::rne, emu::Overflow::saturate, kInf, kInf, 0},
  };
  for (const Expect& e : cases) {
    auto ctx = context(e.mode, e.overflow);
    const double r = ctx.convert(h, e.x);
    INFO(emu::rounding_name(e.mode) << " " << emu::overflow_name(e.overflow) << " " << e.x << " -> " << r);
    if (std::isnan(e.result))
      CHECK(std::isnan(r));
    else
      CHECK(r == e.result);
    CHECK(ctx.status() == e.flags);
  }
  // OCP E4M3 has no inf: overflow and inf give NaN, or 448 when saturating.
  const emu::Format& e4m3 = emu::fp8_e4m3();
  auto inf_policy = context();
  CHECK(std::isnan(inf_policy.convert(e4m3, 1000.0)));
  CHECK(inf_policy.convert(e4m3, 460.0) == 448.0);  // below the 464 tie: rounds to max
  auto saturate = context(emu::Rounding::rne, emu::Overflow::saturate);
  CHECK(saturate.convert(e4m3, 1000.0) == 448.0);
  CHECK(saturate.convert(e4m3, -kInf) == -448.0);
  CHECK(saturate.status() == (emu::OFLO | emu::INEXACT));  // from the finite 1000; inf adds OFLO
}

TEST_CASE("fp8-e4m3 overflow and inf keep the sign in the NaN; flags tell overflow from inf", "[status]") {
  // OCP 8-bit FP v1.0: E4M3 has no inf and the NaN pattern S.1111.111 for both signs.
  // Overflow of a finite value raises OFLO and INEXACT (IEEE 754 7.4); an infinite
  // operand has no value in the format and raises INV (emu/round.hpp).
  const emu::Format& e4m3 = emu::fp8_e4m3();
  struct Expect {
    double x;
    emu::Rounding mode;
    std::uint64_t bits;
    emu::Flags flags;
  };
  const Expect cases[] = {
      {1000.0, emu::Rounding::rne, 0x7f, emu::OFLO | emu::INEXACT},
      {-1000.0, emu::Rounding::rne, 0xff, emu::OFLO | emu::INEXACT},
      {-464.0, emu::Rounding::rna, 0xff, emu::OFLO | emu::INEXACT},  // the tie, away: past max
      {-1000.0, emu::Rounding::rd, 0xff, emu::OFLO | emu::INEXACT},  // toward -inf: the NaN
      {-1000.0, emu::Rounding::ru, 0xfe, emu::OFLO | emu::INEXACT},  // toward zero: -448
      {kInf, emu::Rounding::rne, 0x7f, emu::INV},
      {-kInf, emu::Rounding::rne, 0xff, emu::INV},
      {-kInf, emu::Rounding::rz, 0xff, emu::INV},  // not an overflow: no rounding direction
  };
  for (const Expect& e : cases) {
    auto ctx = context(e.mode);
    const double r = ctx.convert(e4m3, e.x);
    INFO(e.x << " " << emu::rounding_name(e.mode));
    CHECK(e4m3.encode(r) == e.bits);
    CHECK(ctx.status() == e.flags);
  }
  // NaN on overflow (the IPU's NANOO) gives the one positive NaN for both signs, in every
  // format (emu/status.hpp): fp16 0x7e00, e4m3 0x7f.
  auto nanoo = context(emu::Rounding::rne, emu::Overflow::nan);
  CHECK(emu::fp16().encode(nanoo.convert(emu::fp16(), -70000.0)) == 0x7e00);
  CHECK(e4m3.encode(nanoo.convert(e4m3, -1000.0)) == 0x7f);
  CHECK(nanoo.status() == (emu::OFLO | emu::INV | emu::INEXACT));
}

TEST_CASE("without subnormals tiny results flush to signed zero with UFLO", "[status]") {
  const emu::Format flush = emu::fp16().with_subnormals(false);
  auto ctx = context();
  CHECK(is_pos_zero(ctx.convert(flush, 1e-6)));
  CHECK(ctx.status() == (emu::UFLO | emu::INEXACT));
  CHECK(is_neg_zero(ctx.mul(flush, -0x1p-10, 0x1p-5)));  // -2^-15 < min normal 2^-14
  CHECK(ctx.convert(flush, 0x1p-14) == 0x1p-14);
  auto with = context();
  CHECK(with.convert(emu::fp16(), 0x1p-15) == 0x1p-15);  // exact subnormal: no flag
  CHECK(with.status() == 0);
  CHECK(with.convert(emu::fp16(), 0x1.0000001p-15) == 0x1p-15);  // tiny and inexact: UFLO
  CHECK(with.status() == (emu::UFLO | emu::INEXACT));
  // Tininess before rounding (emu/round.hpp, as Arm's FZ): 2^-14 - 2^-26 is below min
  // normal 2^-14 although rne, ru and rna would round it up to 2^-14: it flushes.
  for (emu::Rounding mode : {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::ru}) {
    auto m = context(mode);
    CHECK(is_pos_zero(m.convert(flush, 0x1p-14 - 0x1p-26)));
    CHECK(m.status() == (emu::UFLO | emu::INEXACT));
    CHECK(m.convert(emu::fp16(), 0x1p-14 - 0x1p-26) == 0x1p-14);  // with subnormals: rounds up
  }
}

TEST_CASE("names of flags, modes, policies and rngs round-trip; bad names throw", "[status]") {
  CHECK(emu::flag_names(emu::OFLO | emu::INEXACT) == std::vector<std::string>{"OFLO", "INEXACT"});
  for (const char* name : {"rne", "rna", "rz", "ru", "rd", "ro", "sr"})
    CHECK(std::string(emu::rounding_name(emu::rounding_by_name(name))) == name);
  for (const char* name : {"inf", "saturate", "nan"})
    CHECK(std::string(emu::overflow_name(emu::overflow_by_name(name))) == name);
  CHECK(emu::rng_kind_by_name("ipu") == emu::RngKind::ipu);
  CHECK_THROWS_AS(emu::rounding_by_name("nearest"), std::invalid_argument);
  CHECK_THROWS_AS(emu::overflow_by_name("wrap"), std::invalid_argument);
}
