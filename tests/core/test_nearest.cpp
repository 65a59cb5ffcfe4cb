// NearestOps (emu/nearest.hpp), the inline round-to-nearest-even operations of the
// layers' loops, against Context (the exact model, itself tested against the host and
// Boost in this folder): every result NearestOps accepts must be Context's bit for bit,
// signed zeros included, with the same flags under both tininess rules; whatever
// Context answers with OFLO, DIV0 or INV, NaN or infinity NearestOps must refuse. The
// operands are values of the formats the models compute in, drawn to hit the edges: ties
// at the last bit, subnormal and near-min_normal results, results near the largest
// finite value, cancellation to zero, NaN, infinities and zeros.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/nearest.hpp"
#include "emu/rng.hpp"

using namespace emu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

enum class Op { add, sub, mul, div, fma, sqrt, convert };
const char* op_name(Op op) {
  const char* names[] = {"add", "sub", "mul", "div", "fma", "sqrt", "convert"};
  return names[static_cast<int>(op)];
}
constexpr Op kOps[] = {Op::add, Op::sub, Op::mul, Op::div, Op::fma, Op::sqrt, Op::convert};

double apply(Context& ctx, Op op, const Format& f, double a, double b, double c) {
  switch (op) {
    case Op::add: return ctx.add(f, a, b);
    case Op::sub: return ctx.sub(f, a, b);
    case Op::mul: return ctx.mul(f, a, b);
    case Op::div: return ctx.div(f, a, b);
    case Op::fma: return ctx.fma(f, a, b, c);
    case Op::sqrt: return ctx.sqrt(f, a);
    case Op::convert: return ctx.convert(f, a);
  }
  return 0.0;
}

bool apply(NearestOps& ops, Op op, const Format& f, double a, double b, double c, double& r) {
  switch (op) {
    case Op::add: return ops.add(f, a, b, r);
    case Op::sub: return ops.sub(f, a, b, r);
    case Op::mul: return ops.mul(f, a, b, r);
    case Op::div: return ops.div(f, a, b, r);
    case Op::fma: return ops.fma(f, a, b, c, r);
    case Op::sqrt: return ops.sqrt(f, a, r);
    case Op::convert: return ops.convert(f, a, r);
  }
  return false;
}

// A value of `f` (subnormals included where f has them) with a random sign and a binary
// exponent in [lo, hi], or one of the edge values.
double value_of(Rng& rng, const Format& f, int lo, int hi) {
  const std::uint64_t pick = rng.next_u64();
  const double sign = (pick & 1) ? -1.0 : 1.0;
  switch ((pick >> 1) % 32) {
    case 0: return sign * 0.0;
    case 1: return sign * f.max_finite();
    case 2: return sign * f.min_normal();
    case 3: return sign * f.min_positive();
    case 4: return sign * kInf;
    case 5: return std::numeric_limits<double>::quiet_NaN();
    case 6: return sign * (f.min_normal() - f.min_positive());  // the largest subnormal
    default: break;
  }
  const int e = lo + static_cast<int>((pick >> 8) % static_cast<std::uint64_t>(hi - lo + 1));
  Context exact;
  return exact.convert(f, sign * (1.0 + rng.uniform()) * std::ldexp(1.0, e));
}

struct Tally {
  std::uint64_t accepted = 0, refused = 0;
};

// Runs one operation both ways and checks the contract; returns whether NearestOps took it.
bool check(Op op, const Format& out, Tininess tininess, double a, double b, double c) {
  FpControl control;
  control.tininess = tininess;
  Context ctx(control);
  const double want = apply(ctx, op, out, a, b, c);
  NearestOps ops;
  double got = 0;
  if (!apply(ops, op, out, a, b, c, got)) {
    if (ops.flags() != 0) FAIL(op_name(op) << ": a refused operation raised flags");
    return false;
  }
  const bool good = (ctx.status() & (OFLO | DIV0 | INV)) == 0 && std::isfinite(want) && same_bits(got, want) &&
                    ops.flags() == ctx.status();
  if (!good)  // the message only where it fails: these run millions of times
    FAIL(op_name(op) << " into " << out.name() << " (tininess " << (tininess == Tininess::before ? "before" : "after")
                     << ") of " << a << ", " << b << ", " << c << ": Context " << want << " flags "
                     << int{ctx.status()} << ", NearestOps " << got << " flags " << int{ops.flags()});
  return true;
}

}  // namespace

TEST_CASE("NearestOps equals Context wherever it answers, in fp16, fp32, bf16 and fp8 (random edge-heavy operands)",
          "[nearest]") {
  const Format formats[] = {fp16(), fp32(), bf16(), fp8_e4m3(), fp8_e5m2(), fp16().with_subnormals(false)};
  Rng rng(StreamId{2026, 41});
  for (const Format& out : formats)
    for (Tininess tininess : {Tininess::before, Tininess::after})
      for (Op op : kOps) {
        // Operands from the output format, from fp16 and fp32 (mixed precision), with
        // exponents around the output's range and around 1.
        Tally tally;
        for (int i = 0; i < 20000; ++i) {
          const Format& from = i % 3 == 0 ? out : (i % 3 == 1 ? fp16() : fp32());
          const int lo = std::max(from.emin() - from.fraction_bits(), out.emin() - out.fraction_bits() - 2);
          const int hi = std::min(from.emax(), out.emax() + 1);
          const bool near_one = i % 2 == 0;
          double a = value_of(rng, from, near_one ? -6 : lo, near_one ? 6 : hi);
          if (op == Op::sqrt) a = std::fabs(a);
          double b = value_of(rng, from, near_one ? -6 : lo, near_one ? 6 : hi);
          double c = value_of(rng, from, near_one ? -6 : lo, near_one ? 6 : hi);
          if (i % 7 == 0) b = -a;                // cancellation: exact zeros and their signs
          if (i % 11 == 0) c = -(a * b);         // fma cancelling (when a*b is a value)
          if (i % 13 == 0) b = a * 0x1p-11;      // a tie at fp16's last bit
          if (i % 17 == 0) b = a * 0x1p-24 * 3;  // ties and near-ties at fp32's last bit
          ++(check(op, out, tininess, a, b, c) ? tally.accepted : tally.refused);
        }
        INFO(op_name(op) << " into " << out.name());
        CHECK(tally.accepted > tally.refused);  // the common case is taken
      }
}

TEST_CASE("NearestOps on results at the edges: ties, the tininess band, underflow and the largest values",
          "[nearest]") {
  const Format& h = fp16();
  // Ties at fp16's last bit broken by a residual, both ways, and by evenness.
  CHECK(check(Op::add, h, Tininess::before, 1.0, 0x1p-11, 0));                // tie: stays 1 (even)
  CHECK(check(Op::add, h, Tininess::before, 1.0 + 0x1p-10, 0x1p-11, 0));      // tie: up to even
  CHECK(check(Op::fma, fp32(), Tininess::before, 1.0 + 0x1p-23, 1.0 + 0x1p-23, 0x1p-60));  // residual above
  CHECK(check(Op::fma, fp32(), Tininess::before, 1.0 + 0x1p-23, 1.0 - 0x1p-24, -0x1p-70));
  // Exact values that round to a float on an fp16 midpoint: rounding through float
  // first would round twice (1 + 2^-11 + 2^-30 is above the midpoint, so up).
  for (double sign : {1.0, -1.0}) {
    CHECK(check(Op::add, h, Tininess::before, sign * (1.0 + 0x1p-11), sign * 0x1p-30, 0));
    CHECK(check(Op::add, h, Tininess::before, sign * (1.0 + 0x1p-11), sign * -0x1p-30, 0));
    CHECK(check(Op::fma, h, Tininess::before, sign * (1.0 + 0x1p-12), 1.0 + 0x1p-12, sign * -0x1p-24));
  }
  CHECK(check(Op::div, h, Tininess::before, 1.0, 3.0, 0));
  CHECK(check(Op::sqrt, h, Tininess::before, 2.0, 0, 0));
  // Exact results: no flags; exact zeros with IEEE signs.
  CHECK(check(Op::add, h, Tininess::before, 0.5, -0.5, 0));
  CHECK(check(Op::add, h, Tininess::before, -0.0, -0.0, 0));
  CHECK(check(Op::mul, h, Tininess::before, -0.0, 3.0, 0));
  CHECK(check(Op::fma, h, Tininess::before, -0.0, 3.0, -0.0));
  CHECK(check(Op::fma, h, Tininess::before, 2.0, 3.0, -6.0));
  CHECK(check(Op::div, h, Tininess::before, -0.0, 3.0, 0));
  CHECK(check(Op::sqrt, h, Tininess::before, -0.0, 0, 0));
  // Tiny inexact results well below min_normal: UFLO and INEXACT under both rules.
  for (Tininess t : {Tininess::before, Tininess::after}) {
    CHECK(check(Op::mul, h, t, 0x1p-14, 0.3, 0));
    CHECK(check(Op::mul, h, t, 0x1p-20, 0x1p-10, 0));  // rounds to zero
    CHECK(check(Op::mul, h, t, 0x1p-24, 0.5, 0));      // half the least subnormal: a tie, to zero
  }
  // Just below min_normal, where the rules differ: refused.
  CHECK_FALSE(check(Op::mul, h, Tininess::after, 0x1p-14 * (1 - 0x1p-12), 1.0 + 0x1p-30, 0));
  CHECK_FALSE(check(Op::convert, h, Tininess::before, 0x1p-14 * (1 - 0x1p-13), 0, 0));
  // Overflow, division by zero, invalid operations and NaN: refused.
  CHECK_FALSE(check(Op::add, h, Tininess::before, 65504.0, 16.0, 0));
  CHECK_FALSE(check(Op::add, h, Tininess::before, 65504.0, 32.0, 0));
  CHECK_FALSE(check(Op::div, h, Tininess::before, 1.0, 0.0, 0));
  CHECK_FALSE(check(Op::sqrt, h, Tininess::before, -1.0, 0, 0));
  CHECK_FALSE(check(Op::mul, h, Tininess::before, kInf, 0.0, 0));
  CHECK_FALSE(check(Op::add, h, Tininess::before, std::numeric_limits<double>::quiet_NaN(), 1.0, 0));
  CHECK_FALSE(check(Op::convert, h, Tininess::before, kInf, 0, 0));
  // fma with an inexact double product (operands beyond 26 bits): refused.
  CHECK_FALSE(check(Op::fma, fp32(), Tininess::before, 1.0 + 0x1p-40, 1.0 + 0x1p-40, 1.0));
  // Formats beyond fp32's exponent range are left to Context.
  CHECK_FALSE(check(Op::add, fp64(), Tininess::before, 1.0, 0x1p-60, 0));
}

TEST_CASE("NearestOps applies under round-to-nearest with INEXACT and UFLO neither counted nor trapped; commit "
          "raises its flags into the status",
          "[nearest]") {
  FpControl control;
  CHECK(NearestOps::applies(Context(control)));
  control.counted = OFLO | INV | DIV0;
  CHECK(NearestOps::applies(Context(control)));
  control.traps = OFLO | INV | DIV0;  // what NearestOps answers raises none of them
  CHECK(NearestOps::applies(Context(control)));
  FpControl esr;
  esr.esr = true;
  CHECK_FALSE(NearestOps::applies(Context(esr)));
  FpControl rz;
  rz.rounding = Rounding::rz;
  CHECK_FALSE(NearestOps::applies(Context(rz)));
  FpControl trap;
  trap.traps = UFLO;
  CHECK_FALSE(NearestOps::applies(Context(trap)));
  FpControl inexact;
  inexact.counted = INEXACT;
  CHECK_FALSE(NearestOps::applies(Context(inexact)));
  FpControl uflo;
  uflo.counted = UFLO;
  CHECK_FALSE(NearestOps::applies(Context(uflo)));

  Context ctx;
  NearestOps ops;
  double r = 1;
  CHECK(ops.mul(fp16(), 0x1p-20, 0x1p-10, r));
  CHECK(r == 0.0);
  CHECK(ops.flags() == (UFLO | INEXACT));
  ops.commit(ctx);
  CHECK(ctx.status() == (UFLO | INEXACT));
  CHECK(ops.flags() == 0);
  CHECK(ctx.counts().empty());
}

TEST_CASE("NearestOps on every fp16 value against 48 random fp16 partners: add, mul and fma into fp16 and fp32",
          "[nearest]") {
  Rng rng(StreamId{2026, 42});
  std::uint64_t accepted = 0, total = 0;
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double a = fp16().decode(bits);
    for (int j = 0; j < 48; ++j) {
      const double b = fp16().decode(rng.next_u64() & 0xFFFF), c = fp16().decode(rng.next_u64() & 0xFFFF);
      const Format& out = j % 2 ? fp16() : fp32();
      const Tininess t = j % 4 < 2 ? Tininess::before : Tininess::after;
      for (Op op : {Op::add, Op::mul, Op::fma}) {
        accepted += check(op, out, t, a, b, c);
        ++total;
      }
    }
  }
  CHECK(accepted > total / 2);
}

namespace {

// fma4 on four lanes against four Context operations (fma, or add, sub and mul in the
// forms fma4 stands for): where it answers, every lane bit for bit and the flags of the
// four together; where it refuses, nothing raised. Returns whether it answered.
bool check4(Op op, const Format& out, const double (&x)[4], const double (&y)[4], const double (&z)[4]) {
  double a[4], b[4], c[4], want[4];
  Flags flags = 0;
  bool clean = true;
  for (int i = 0; i < 4; ++i) {
    Context ctx;
    switch (op) {
      case Op::add: a[i] = y[i], b[i] = 1.0, c[i] = x[i]; break;
      case Op::sub: a[i] = y[i], b[i] = -1.0, c[i] = x[i]; break;
      case Op::mul: a[i] = x[i], b[i] = y[i], c[i] = -0.0; break;
      default: a[i] = x[i], b[i] = y[i], c[i] = z[i]; break;
    }
    want[i] = apply(ctx, op, out, x[i], y[i], z[i]);
    flags |= ctx.status();
    clean = clean && (ctx.status() & (OFLO | DIV0 | INV)) == 0 && std::isfinite(want[i]);
  }
  NearestOps ops;
  Double4 got;
  if (!ops.fma4(out, load4(a), load4(b), load4(c), got)) {
    if (ops.flags() != 0) FAIL(op_name(op) << "4: a refused operation raised flags");
    return false;
  }
  bool good = clean && ops.flags() == flags;
  for (int i = 0; i < 4; ++i) good = good && same_bits(got[i], want[i]);
  if (!good)
    FAIL(op_name(op) << "4 into " << out.name() << " of lanes (" << x[0] << ", " << y[0] << ", " << z[0] << ") ... ("
                     << x[3] << ", " << y[3] << ", " << z[3] << "): flags Context " << int{flags} << ", fma4 "
                     << int{ops.flags()});
  return true;
}

}  // namespace

TEST_CASE("NearestOps::fma4 equals four Context operations (fma, add, sub, mul) in fp16 and fp32", "[nearest]") {
  Rng rng(StreamId{2026, 43});
  for (const Format& out : {fp16(), fp32()})
    for (Op op : {Op::fma, Op::add, Op::sub, Op::mul}) {
      Tally tally;
      for (int i = 0; i < 40000; ++i) {
        double x[4], y[4], z[4];
        for (int lane = 0; lane < 4; ++lane) {
          // Mostly ordinary lanes (so that all four often pass), with the edges of
          // check()'s operands in one lane in sixteen.
          const bool edges = rng.next_u64() % 16 == 0;
          const Format& from = lane % 2 ? fp16() : out;
          const int lo = std::max(from.emin() - from.fraction_bits(), out.emin() - out.fraction_bits() - 2);
          const int hi = std::min(from.emax(), out.emax() + 1);
          auto operand = [&] {
            if (edges) return value_of(rng, from, lo, hi);
            Context exact;
            return exact.convert(from, (rng.next_u64() & 1 ? -1.0 : 1.0) * (1.0 + rng.uniform()) *
                                           std::ldexp(1.0, static_cast<int>(rng.next_u64() % 9) - 4));
          };
          x[lane] = operand();
          y[lane] = operand();
          z[lane] = operand();
          if (i % 7 == lane) y[lane] = op == Op::sub ? x[lane] : -x[lane];  // exact zeros and their signs
          if (i % 11 == lane) z[lane] = -(x[lane] * y[lane]);
          if (i % 13 == lane) y[lane] = x[lane] * 0x1p-11;  // ties at fp16's last bit
          if (i % 17 == lane) y[lane] = x[lane] * 0x1p-24 * 3;
          if (i % 19 == lane) y[lane] = x[lane] * (1 + 0x1p-40);  // inexact double products
        }
        ++(check4(op, out, x, y, z) ? tally.accepted : tally.refused);
      }
      INFO(op_name(op) << "4 into " << out.name());
#if EMU_SIMD
      CHECK(tally.accepted > tally.refused);
#endif
    }
  // Signed zeros: x + (-x) = +0, -0 + -0 = -0, -0 * 3 = -0, (-0) * 3 + (-0) = -0.
  CHECK(check4(Op::add, fp16(), {0.5, -0.0, 1.0, 2.0}, {-0.5, -0.0, -1.0, -2.0}, {0, 0, 0, 0}));
  CHECK(check4(Op::mul, fp16(), {-0.0, 0.0, -0.0, 0.0}, {3.0, -3.0, -3.0, 3.0}, {0, 0, 0, 0}));
  CHECK(check4(Op::fma, fp32(), {-0.0, 2.0, 1.0, 0.0}, {3.0, 3.0, 1.0, 1.0}, {-0.0, -6.0, -1.0, -0.0}));
  // Midpoints reached through float (fp16) and through double (fp32): refused, never wrong.
  CHECK_FALSE(check4(Op::add, fp16(), {1.0 + 0x1p-11, 1, 1, 1}, {0x1p-30, 1, 1, 1}, {0, 0, 0, 0}));
  CHECK_FALSE(check4(Op::fma, fp32(), {1.0 + 0x1p-24, 1, 1, 1}, {1.0 + 0x1p-52, 1, 1, 1}, {0x1p-80, 1, 1, 1}));
  // fp16 results below min_normal: subnormal and zero results with UFLO and INEXACT, an
  // exact tie at the least subnormal (3 * 2^-25: up to even), exact subnormals without
  // flags; a value rounded by float onto a subnormal midpoint, and one between the
  // tininess rules' thresholds, refused.
  CHECK(check4(Op::mul, fp16(), {0x1p-14, 0x1p-20, 0x1p-24, 3 * 0x1p-24}, {0.3, 0x1p-10, 0.5, 0.5}, {0, 0, 0, 0}));
  CHECK(check4(Op::add, fp16(), {0x1p-24, -0x1p-20, 0x1p-15, 1.0}, {0x1p-24, 0x1p-21, -0x1p-16, -1.0}, {0, 0, 0, 0}));
  CHECK_FALSE(check4(Op::add, fp16(), {0x1p-25, 1, 1, 1}, {0x1p-60, 1, 1, 1}, {0, 0, 0, 0}));
  CHECK_FALSE(check4(Op::add, fp16(), {0x1p-14, 1, 1, 1}, {-0x1p-26, 1, 1, 1}, {0, 0, 0, 0}));
  // Overflow and NaN in one lane: refused.
  CHECK_FALSE(check4(Op::add, fp16(), {65504.0, 1, 1, 1}, {32.0, 1, 1, 1}, {0, 0, 0, 0}));
  CHECK_FALSE(check4(Op::mul, fp32(), {1, 1, std::numeric_limits<double>::quiet_NaN(), 1}, {1, 1, 1, 1}, {0, 0, 0, 0}));
}
