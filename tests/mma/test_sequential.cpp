// The reference units' GEMM fast passes (emu/sequential.hpp: exact, fp32-seq, fp16-seq,
// fused and unfused) against their dot products, element by element in row-major order
// with the element set (ReferenceUnit::dot: ExactSum rounded once, Context::fma, or
// Context::add of Context::mul, each checked against oracles elsewhere): the same bits,
// sticky flags, per-(scope, op, flag) counts with first element, operands and result,
// trap report and elements written before a trap, and random draws, for every format
// pair, rounding mode, overflow policy, subnormals on and off, tininess before and
// after, on random and awkward data (ties, overflow, subnormal results, cancellation
// to signed zeros, NaN and infinity). Cases where a pass must apply check that it does
// and that it vouches for most elements, so the comparison exercises the kernels.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "emu/sequential.hpp"
#include "emu/unit.hpp"
#include "tests/gemm_problem.hpp"

using namespace emu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
using gemm_test::pick;
using gemm_test::Problem;
using gemm_test::sign;
using gemm_test::simd_build;

// A value of `f` near sign * (1 + u) * 2^e, e in [lo, hi] clamped to f's range
// (rounded into f with rne, saturating).
double value_in(Rng& rng, const Format& f, int lo, int hi) {
  lo = std::max(lo, f.emin() - f.fraction_bits());
  hi = std::min(hi, f.emax());
  const int e = lo + static_cast<int>(pick(rng, static_cast<std::size_t>(std::max(hi - lo + 1, 1))));
  FpControl saturate;
  saturate.overflow = Overflow::saturate;
  Context ctx(saturate);
  return ctx.convert(f, sign(rng) * (1.0 + rng.uniform()) * std::ldexp(1.0, e));
}

enum class Inputs {
  normal,      // a few binades around 1
  wide,        // the input format's whole range: products beyond 2^53 apart, overflow, underflow
  sparse,      // signed zeros and small integers: exact steps, zero results
  cancelling,  // C cancels the first product: zeros with their signs, tiny results
  ties,        // powers of two: ties in the output format, decided by RNE or a tiny term
  tiny,        // results around the output format's min_normal: subnormal, flushed, rounding up to it
  extremes,    // C near the output format's largest value: overflow mid-way
  special,     // NaN or infinity in A, B or C
};
constexpr Inputs kAllInputs[] = {Inputs::normal, Inputs::wide, Inputs::sparse,   Inputs::cancelling,
                                 Inputs::ties,   Inputs::tiny, Inputs::extremes, Inputs::special};
const char* inputs_name(Inputs i) {
  const char* names[] = {"normal", "wide", "sparse", "cancelling", "ties", "tiny", "extremes", "special"};
  return names[static_cast<int>(i)];
}


double input_value(Rng& rng, Inputs kind, const Format& in, const Format& out) {
  switch (kind) {
    case Inputs::wide: return value_in(rng, in, -200, 200);
    case Inputs::sparse: return pick(rng, 3) == 0 ? sign(rng) * 0.0 : sign(rng) * static_cast<double>(pick(rng, 9));
    case Inputs::ties: {  // powers of two (in range): sums land on ties of the output format
      if (pick(rng, 4) == 0) return value_in(rng, in, -20, 10);
      const int e = std::clamp(static_cast<int>(pick(rng, 24)) - 12, in.emin() - in.fraction_bits(), in.emax());
      return sign(rng) * std::ldexp(1.0, e);
    }
    case Inputs::tiny: {  // products near min_normal(out)
      const int half = out.emin() / 2;
      return value_in(rng, in, half - 3, half + 2);
    }
    default: return value_in(rng, in, -4, 3);
  }
}

double output_value(Rng& rng, Inputs kind, const Format& out) {
  switch (kind) {
    case Inputs::sparse: return pick(rng, 2) == 0 ? sign(rng) * 0.0 : sign(rng) * static_cast<double>(pick(rng, 100));
    case Inputs::ties: return pick(rng, 3) == 0 ? 0.0 : sign(rng) * std::ldexp(1.0, static_cast<int>(pick(rng, 40)) - 10);
    case Inputs::tiny: return pick(rng, 2) == 0 ? 0.0 : value_in(rng, out, out.emin() - 2, out.emin() + 1);
    case Inputs::extremes:
      return pick(rng, 2) == 0 ? sign(rng) * out.max_finite() : value_in(rng, out, out.emax() - 3, out.emax());
    default: return pick(rng, 4) == 0 ? 0.0 : value_in(rng, out, -6, 8);
  }
}

Problem make_problem(Rng& rng, std::size_t m, std::size_t n, std::size_t k, Inputs kind, const Format& in,
                     const Format& out) {
  Problem p = gemm_test::zero_problem(m, n, k);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t q = 0; q < k; ++q) p.A[i * p.lda() + q] = input_value(rng, kind, in, out);
  for (std::size_t q = 0; q < k; ++q)
    for (std::size_t j = 0; j < n; ++j) p.B[q * p.ldb() + j] = input_value(rng, kind, in, out);
  Context round_out;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double& c = p.C[i * p.ldc() + j];
      c = output_value(rng, kind, out);
      if (kind == Inputs::cancelling) {
        // Minus the first product rounded into the output format: zero or its rounding
        // error; sometimes its exact negation in double (not a value of fp16 outputs).
        const double product = p.A[i * p.lda()] * p.B[j];
        c = pick(rng, 4) == 0 ? -product : round_out.convert(out, -product);
        if (pick(rng, 4) == 0) c = -c;  // then an exact doubling instead
      }
    }
  if (kind == Inputs::special) {
    const double special[] = {kNaN, -kNaN, kInf, -kInf};
    for (int t = 0; t < 2; ++t) switch (pick(rng, 3)) {
        case 0: p.A[pick(rng, m) * p.lda() + pick(rng, k)] = special[pick(rng, 4)]; break;
        case 1: p.B[pick(rng, k) * p.ldb() + pick(rng, n)] = special[pick(rng, 4)]; break;
        default: p.C[pick(rng, m) * p.ldc() + pick(rng, n)] = special[pick(rng, 4)]; break;
      }
  }
  return p;
}

bool same(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (bits(x[i]) != bits(y[i])) return false;
  return true;
}

std::string describe(const OpCount& c) {
  std::ostringstream s;
  s << c.scope << " " << c.op << " " << flag_name(c.flag) << " x" << c.count << " first " << c.first_element.to_string()
    << " result " << c.first_result;
  return s.str();
}

// Runs C = A B + C through gemm and through dot element by element (row-major, element
// set as gemm sets it) under equal contexts and compares everything observable.
struct Outcome {
  std::vector<double> C;
  Flags status = 0;
  std::vector<OpCount> counts;
  bool trapped = false;
  TrapReport trap;
  std::uint64_t next_draw = 0;
};

Outcome run(const MatrixUnit& unit, const FpControl& control, const Problem& p, bool by_gemm) {
  Outcome o;
  o.C = p.C;
  Context ctx(control, Rng(StreamId{91}));
  Scope scope(ctx, "layer");
  try {
    if (by_gemm) {
      unit.gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), o.C.data(), p.ldc());
    } else {
      for (std::size_t i = 0; i < p.m; ++i)
        for (std::size_t j = 0; j < p.n; ++j) {
          ElementGuard element(ctx, static_cast<std::int64_t>(i * p.n + j),
                               {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
          double& c = o.C[i * p.ldc() + j];
          c = unit.dot(ctx, p.k, p.A.data() + i * p.lda(), 1, p.B.data() + j, p.ldb(), c);
        }
    }
  } catch (const FpException& e) {
    o.trapped = true;
    o.trap = e.report();
  }
  CHECK_FALSE(ctx.element().known());  // cleared after the elements, also after a trap
  o.status = ctx.status();
  o.counts = ctx.counts();
  o.next_draw = ctx.rng().next_u64();
  return o;
}

void compare(const MatrixUnit& unit, const FpControl& control, const Problem& p, const std::string& what) {
  const Outcome fast = run(unit, control, p, true), ref = run(unit, control, p, false);
  INFO(what << ": m " << p.m << " n " << p.n << " k " << p.k);
  REQUIRE(fast.trapped == ref.trapped);
  if (fast.trapped) {
    INFO("trap " << flag_name(ref.trap.flag) << " in " << ref.trap.op << " at " << ref.trap.element.to_string());
    CHECK(fast.trap.flag == ref.trap.flag);
    CHECK(fast.trap.scope == ref.trap.scope);
    CHECK(fast.trap.op == ref.trap.op);
    CHECK(fast.trap.element == ref.trap.element);
    CHECK(same(fast.trap.operands, ref.trap.operands));
    CHECK(bits(fast.trap.result) == bits(ref.trap.result));
    CHECK(fast.trap.status == ref.trap.status);
  }
  for (std::size_t i = 0; i < p.m; ++i)
    for (std::size_t j = 0; j < p.n; ++j) {
      const std::size_t at = i * p.ldc() + j;
      INFO("element (" << i << ", " << j << "): gemm " << fast.C[at] << " dot " << ref.C[at] << " C " << p.C[at]);
      REQUIRE(bits(fast.C[at]) == bits(ref.C[at]));
    }
  INFO("flags: gemm " << static_cast<int>(fast.status) << " dot " << static_cast<int>(ref.status));
  REQUIRE(fast.status == ref.status);
  REQUIRE(fast.counts.size() == ref.counts.size());
  for (std::size_t c = 0; c < ref.counts.size(); ++c) {
    INFO("count " << c << ": gemm " << describe(fast.counts[c]) << "; dot " << describe(ref.counts[c]));
    CHECK(fast.counts[c].scope == ref.counts[c].scope);
    CHECK(fast.counts[c].op == ref.counts[c].op);
    CHECK(fast.counts[c].flag == ref.counts[c].flag);
    CHECK(fast.counts[c].count == ref.counts[c].count);
    CHECK(fast.counts[c].first_element == ref.counts[c].first_element);
    CHECK(same(fast.counts[c].first_operands, ref.counts[c].first_operands));
    CHECK(bits(fast.counts[c].first_result) == bits(ref.counts[c].first_result));
  }
  CHECK(fast.next_draw == ref.next_draw);  // stochastic rounding drew the same bits
}

// One unit configuration: its kind and formats, and whether the sequential form is fused.
struct UnitCase {
  UnitKind kind;
  bool fused;
  Format in, out;
  std::unique_ptr<MatrixUnit> make() const {
    return kind == UnitKind::exact ? make_unit(kind, in, out) : make_sequential_unit(kind, fused, in, out);
  }
  std::string name() const {
    return std::string(unit_kind_name(kind)) + (kind == UnitKind::exact ? "" : fused ? " fused" : " unfused") + " " +
           in.name() + " -> " + out.name() + (out.subnormals() ? "" : " (no subnormals)");
  }
};

// Which elements the pass vouches for (fraction), or -1 where it does not apply.
double vouched_fraction(const UnitCase& u, const FpControl& control, const Problem& p) {
  std::size_t vouched = 0;
  if (u.kind == UnitKind::exact) {
    ExactPass pass;
    if (!exact_pass(p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), p.C.data(), p.ldc(), pass)) return -1;
    for (bool redo : pass.redo) vouched += redo ? 0 : 1;
  } else {
    SequentialPass pass;
    if (!sequential_pass(Context(control), u.out, u.fused, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(),
                         p.C.data(), p.ldc(), pass))
      return -1;
    for (Flags f : pass.flags) vouched += f == SequentialPass::kRedo ? 0 : 1;
  }
  return static_cast<double>(vouched) / static_cast<double>(p.m * p.n);
}

// Whether the pass must apply to fp32-valued inputs under this control.
bool must_apply(const UnitCase& u, const FpControl& control) {
  if (!simd_build()) return false;
  if (u.kind == UnitKind::exact) return true;
  const bool out_ok = u.out.with_subnormals(true) == fp32() || u.out.with_subnormals(true) == fp16();
  return out_ok && control.effective_rounding() == Rounding::rne && !((control.counted | control.traps) & INEXACT);
}

// Random problems of every kind: many small ones (one or two tiles, k up to 40) and a
// few with several tiles and longer chains.
void sweep(const UnitCase& u, const FpControl& control, std::uint64_t seed, int small_trials) {
  const auto unit = u.make();
  Rng rng(StreamId{seed});
  const bool float_inputs = u.in.precision() <= 24 && u.in.emax() <= 127;
  for (Inputs kind : kAllInputs) {
    for (int trial = 0; trial < small_trials + 1; ++trial) {
      const bool large = trial == small_trials;
      const std::size_t k_sizes[] = {1, 2, 3, 7, 16, 40};
      const Problem p = large ? make_problem(rng, 3, 33 + pick(rng, 8), 60 + pick(rng, 40), kind, u.in, u.out)
                              : make_problem(rng, 1 + pick(rng, 2), 1 + pick(rng, 20), k_sizes[pick(rng, 6)], kind,
                                             u.in, u.out);
      const std::string what = u.name() + ", " + inputs_name(kind) + (large ? " large" : " small") + " trial " +
                               std::to_string(trial);
      compare(*unit, control, p, what);
      if (float_inputs && must_apply(u, control) && kind == Inputs::normal && large) {
        INFO(what);
        const double fraction = vouched_fraction(u, control, p);
        CHECK(fraction >= 0.9);  // applies (not -1), and the kernel decides nearly all
      }
    }
  }
}

FpControl with_rounding(Rounding r) {
  FpControl c;
  c.rounding = r;
  return c;
}

}  // namespace

TEST_CASE("sequential units' gemm equals dot under every rounding, overflow policy and tininess", "[units][fast]") {
  std::vector<FpControl> controls;
  for (Rounding r : {Rounding::rne, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::rna, Rounding::ro})
    controls.push_back(with_rounding(r));
  FpControl esr, esr_bits, saturate, nanoo, after;
  esr.esr = true;
  esr_bits.rounding = Rounding::sr;
  esr_bits.sr_bits = 13;
  saturate.overflow = Overflow::saturate;
  nanoo.overflow = Overflow::nan;
  after.tininess = Tininess::after;
  for (const FpControl& c : {esr, esr_bits, saturate, nanoo, after}) controls.push_back(c);

  const Format fp32_flush = fp32().with_subnormals(false), fp16_flush = fp16().with_subnormals(false);
  const UnitCase units[] = {
      {UnitKind::fp32_seq, true, fp16(), fp32()},     {UnitKind::fp32_seq, false, fp16(), fp32()},
      {UnitKind::fp16_seq, true, fp16(), fp16()},     {UnitKind::fp16_seq, false, fp16(), fp16()},
      {UnitKind::fp32_seq, true, fp32(), fp32()},     {UnitKind::fp32_seq, false, bf16(), fp32()},
      {UnitKind::fp16_seq, true, bf16(), fp16()},     {UnitKind::fp16_seq, false, fp32(), fp16()},
      {UnitKind::fp32_seq, true, fp16(), fp32_flush}, {UnitKind::fp16_seq, false, fp16(), fp16_flush},
      {UnitKind::fp32_seq, true, fp16(), fp16()},     {UnitKind::fp32_seq, true, fp8_e4m3(), fp32()},
      {UnitKind::fp16_seq, true, fp16(), bf16()},
  };
  std::uint64_t seed = 1000;
  for (const UnitCase& u : units)
    for (const FpControl& control : controls) {
      INFO(u.name() << ", rounding " << rounding_name(control.effective_rounding()) << ", overflow "
                    << overflow_name(control.overflow) << ", tininess " << tininess_name(control.tininess));
      // The rne default in depth; the other controls (mostly the reference path) lighter.
      const bool rne_default = control.effective_rounding() == Rounding::rne && control.overflow == Overflow::inf;
      sweep(u, control, seed++, rne_default ? 6 : 1);
    }
}

TEST_CASE("exact unit's gemm equals dot for every input and output format and rounding", "[units][fast]") {
  FpControl esr, saturate, after;
  esr.esr = true;
  saturate.overflow = Overflow::saturate;
  after.tininess = Tininess::after;
  const FpControl controls[] = {FpControl{}, with_rounding(Rounding::rz), with_rounding(Rounding::rd), esr, saturate, after};
  const UnitCase units[] = {
      {UnitKind::exact, true, fp16(), fp32()}, {UnitKind::exact, true, bf16(), fp32()},
      {UnitKind::exact, true, fp32(), fp32()}, {UnitKind::exact, true, fp16(), fp16()},
      {UnitKind::exact, true, fp8_e4m3(), fp16().with_subnormals(false)}, {UnitKind::exact, true, tf32(), bf16()},
      {UnitKind::exact, true, fp16(), fp64()}, {UnitKind::exact, true, fp64(), fp32()},
  };
  std::uint64_t seed = 2000;
  for (const UnitCase& u : units)
    for (const FpControl& control : controls) {
      INFO(u.name() << ", rounding " << rounding_name(control.effective_rounding()));
      sweep(u, control, seed++, control.effective_rounding() == Rounding::rne ? 6 : 2);
    }
}

TEST_CASE("reference units' gemm counts and traps as dot does", "[units][fast]") {
  // Counting or trapping flags other than INEXACT keeps the fast passes on: the elements
  // that raise them are redone by dot, in order; INEXACT counted or trapped turns the
  // sequential pass off.
  FpControl count_all, count_rare, trap_ipu, trap_underflow, trap_and_count;
  count_all.counted = OFLO | DIV0 | INV | UFLO | INEXACT;
  count_rare.counted = OFLO | INV | UFLO;
  trap_ipu.traps = OFLO | DIV0 | INV;
  trap_underflow.traps = UFLO;
  trap_and_count.traps = OFLO;
  trap_and_count.counted = UFLO | INV;
  const UnitCase units[] = {
      {UnitKind::exact, true, fp16(), fp32()},    {UnitKind::fp32_seq, true, fp16(), fp32()},
      {UnitKind::fp32_seq, false, bf16(), fp32()}, {UnitKind::fp16_seq, true, fp16(), fp16()},
      {UnitKind::fp16_seq, false, fp16(), fp16()}, {UnitKind::fp16_seq, true, fp32(), fp16()},
  };
  std::uint64_t seed = 3000;
  for (const UnitCase& u : units)
    for (const FpControl& control : {count_all, count_rare, trap_ipu, trap_underflow, trap_and_count}) {
      INFO(u.name() << ", counted " << static_cast<int>(control.counted) << ", traps " << static_cast<int>(control.traps));
      sweep(u, control, seed++, 4);
    }
}

TEST_CASE("reference units' gemm: a trap mid-matrix leaves the elements before it written, as dot does",
          "[units][fast]") {
  // Row 1, column 5 overflows at its third step; the elements before it are finished
  // (INEXACT raised by some), the ones after it untouched.
  for (const UnitCase& u : {UnitCase{UnitKind::fp16_seq, true, fp16(), fp16()},
                            UnitCase{UnitKind::fp32_seq, false, bf16(), fp32()},
                            UnitCase{UnitKind::exact, true, fp16(), fp16()}}) {
    INFO(u.name());
    Rng rng(StreamId{4000});
    Problem p = make_problem(rng, 3, 20, 9, Inputs::normal, u.in, u.out);
    // A product above half an ulp of max_finite: (max + it) rounds beyond max.
    const double big = std::ldexp(1.0, (u.out.emax() - u.out.fraction_bits()) / 2 + 2);
    p.C[1 * p.ldc() + 5] = u.out.max_finite();
    p.A[1 * p.lda() + 2] = big;
    p.B[2 * p.ldb() + 5] = big;
    FpControl trap;
    trap.traps = OFLO;
    const Outcome fast = run(*u.make(), trap, p, true);
    REQUIRE(fast.trapped);
    CHECK(fast.trap.element.flat == 25);
    CHECK(fast.C[2 * p.ldc() + 7] == p.C[2 * p.ldc() + 7]);
    compare(*u.make(), trap, p, "overflow at (1, 5)");
  }
}

TEST_CASE("reference units' gemm: the passes apply where they should and step aside elsewhere", "[units][fast]") {
  Rng rng(StreamId{5000});
  const Problem p = make_problem(rng, 2, 21, 17, Inputs::normal, fp16(), fp32());
  FpControl count_inexact, trap_inexact, toward_zero, esr;
  count_inexact.counted = INEXACT;
  trap_inexact.traps = INEXACT;
  toward_zero.rounding = Rounding::rz;
  esr.esr = true;
  const UnitCase fp32_fused{UnitKind::fp32_seq, true, fp16(), fp32()};
  const UnitCase exact{UnitKind::exact, true, fp16(), fp32()};
  for (const FpControl& control : {FpControl{}, count_inexact, trap_inexact, toward_zero, esr}) {
    INFO("counted " << static_cast<int>(control.counted) << " traps " << static_cast<int>(control.traps)
                    << " rounding " << rounding_name(control.effective_rounding()));
    CHECK((vouched_fraction(fp32_fused, control, p) >= 0) == must_apply(fp32_fused, control));
    CHECK((vouched_fraction(exact, control, p) >= 0) == simd_build());  // rounds under ctx afterwards
  }
  // A finite operand that is not an fp32 value turns both off; C is checked per element.
  for (double odd : {1.0 + 0x1p-30, 0x1p200}) {
    Problem q = p;
    q.B[3 * q.ldb() + 4] = odd;
    CHECK(vouched_fraction(fp32_fused, FpControl{}, q) == -1);
    CHECK(vouched_fraction(exact, FpControl{}, q) == -1);
    compare(*fp32_fused.make(), FpControl{}, q, "B holds a non-fp32 value");
    q = p;
    q.C[4] = odd;
    CHECK(vouched_fraction(fp32_fused, FpControl{}, q) < 1);
    compare(*fp32_fused.make(), FpControl{}, q, "C holds a non-fp32 value");
    compare(*exact.make(), FpControl{}, q, "C holds a non-fp32 value");
  }
  // Products more than 2^118 apart: no 128-bit sums for the exact pass.
  Problem wide = p;
  wide.A[0] = 0x1p100;
  wide.A[1] = 0x1p-100;
  CHECK(vouched_fraction(exact, FpControl{}, wide) == -1);
  compare(*exact.make(), FpControl{}, wide, "products 2^200 apart");
}

TEST_CASE("reference units' gemm: hand-worked steps that random data rarely reaches", "[units][fast]") {
  struct Step {
    const char* what;
    UnitCase unit;
    double a, b, c;
    Tininess tininess;
    double expected;
    Flags flags;
  };
  const double p2_22 = std::ldexp(1.0, -22);
  const Step steps[] = {
      // a b = 3 * 2^-11 (1 - 2^-44): 1 + a b lies 3 * 2^-55 below the fp16 midpoint 1 +
      // 3 * 2^-11, so its nearest double is the midpoint (a tie, to even: 1 + 2^-9) while
      // the exact value rounds down to 1 + 2^-10.
      {"fp16 midpoint after double rounding", {UnitKind::fp16_seq, true, fp32(), fp16()}, std::ldexp(1 + p2_22, -11),
       3 * (1 - p2_22), 1.0, Tininess::before, 1 + std::ldexp(1.0, -10), INEXACT},
      {"fp16 midpoint after double rounding, negative", {UnitKind::fp16_seq, true, fp32(), fp16()},
       -std::ldexp(1 + p2_22, -11), 3 * (1 - p2_22), -1.0, Tininess::before, -1 - std::ldexp(1.0, -10), INEXACT},
      // 2^-14 - 2^-26 rounds up to fp16's min_normal: tiny before rounding, not after.
      {"fp16 rounds up to min_normal", {UnitKind::fp16_seq, true, fp16(), fp16()}, -0x1p-13, 0x1p-13, 0x1p-14,
       Tininess::before, 0x1p-14, UFLO | INEXACT},
      {"fp16 rounds up to min_normal, after", {UnitKind::fp16_seq, true, fp16(), fp16()}, -0x1p-13, 0x1p-13, 0x1p-14,
       Tininess::after, 0x1p-14, INEXACT},
      // 2^-126 - 2^-152 likewise in fp32 (bf16 inputs reach it).
      {"fp32 rounds up to min_normal", {UnitKind::fp32_seq, true, bf16(), fp32()}, -0x1p-76, 0x1p-76, 0x1p-126,
       Tininess::before, 0x1p-126, UFLO | INEXACT},
      {"fp32 rounds up to min_normal, after", {UnitKind::fp32_seq, true, bf16(), fp32()}, -0x1p-76, 0x1p-76,
       0x1p-126, Tininess::after, 0x1p-126, INEXACT},
      // An fp32 c that is no fp16 value, 2^-147 below 2^14 + c's last bit: the unfused
      // fp16 sum is inexact even in double.
      {"fp16 unfused: c off the fp16 grid", {UnitKind::fp16_seq, false, fp16(), fp16()}, 0x1p7, 0x1p7, 0x1.8p-148,
       Tininess::before, 0x1p14, INEXACT},
      // Unfused, the product -2^-152 underflows to -0 first (UFLO either way): 2^-126 + -0.
      {"fp32 unfused: the product underflows", {UnitKind::fp32_seq, false, bf16(), fp32()}, -0x1p-76, 0x1p-76,
       0x1p-126, Tininess::after, 0x1p-126, UFLO | INEXACT},
  };
  for (const Step& t : steps) {
    INFO(t.what);
    // Two rows and 17 columns of the same step (two tiles, the second one lane wide).
    Problem p{2, 17, 1, {}, {}, {}};
    p.A.assign(2 * p.lda(), t.a);
    p.B.assign(p.ldb(), t.b);
    p.C.assign(2 * p.ldc(), t.c);
    FpControl control;
    control.tininess = t.tininess;
    const auto unit = t.unit.make();
    Context ctx(control);
    std::vector<double> C = p.C;
    unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C.data(), p.ldc());
    CHECK(bits(C[p.ldc() + 16]) == bits(t.expected));
    CHECK(ctx.status() == t.flags);
    compare(*unit, control, p, t.what);
  }
}

TEST_CASE("reference units' gemm: the exact pass's bins and c far below the products' lowest bit", "[units][fast]") {
  // Products spread over 2^span with k = 40: one bin (bf16 inputs, 8-bit significands,
  // span 10), two (fp32 inputs, span 20) and three (fp32, span 55; products of 48
  // bits at the top and at the bottom). Into fp64 under directed and stochastic
  // rounding the residual below the sum's top 53 bits shows, with its sign and size: a
  // bin that lost low bits would change the result. And c with a lowest bit far below
  // the products' (through ExactSum) or far above them.
  FpControl down, up, esr;
  down.rounding = Rounding::rd;
  up.rounding = Rounding::ru;
  esr.esr = true;
  struct Spread {
    Format in;
    int span;
  };
  Rng rng(StreamId{6000});
  for (const Format& out : {fp32(), fp64()})
    for (const Spread& spread : {Spread{bf16(), 10}, Spread{fp32(), 20}, Spread{fp32(), 55}}) {
      const int span = spread.span;
      const UnitCase exact{UnitKind::exact, true, spread.in, out};
      for (int trial = 0; trial < 4; ++trial) {
        Problem p = make_problem(rng, 2, 19, 40, Inputs::normal, spread.in, out);
        for (std::size_t i = 0; i < p.m; ++i)
          for (std::size_t q = 0; q < p.k; ++q)
            p.A[i * p.lda() + q] =
                value_in(rng, spread.in, -span / 2, -span / 2 + 2) * (q % 3 == 0 ? std::ldexp(1.0, span) : 1.0);
        p.C[0] = value_in(rng, fp32(), -149, -130);  // lowest bit far below the products'
        p.C[1] = value_in(rng, fp32(), 110, 127);    // far above
        INFO(spread.in.name() << " -> " << out.name() << ", span 2^" << span);
        CHECK(vouched_fraction(exact, FpControl{}, p) >= 0.9);
        for (const FpControl& control : {FpControl{}, down, up, esr})
          compare(*exact.make(), control, p, "span 2^" + std::to_string(span));
      }
    }
}

TEST_CASE("reference units' gemm: a host rounding mode other than to-nearest turns the passes off", "[units][fast]") {
  Rng rng(StreamId{7000});
  const Problem p = make_problem(rng, 2, 7, 9, Inputs::normal, fp16(), fp32());
  const UnitCase units[] = {{UnitKind::fp32_seq, true, fp16(), fp32()}, {UnitKind::exact, true, fp16(), fp32()}};
  {
    struct RestoreNearest {
      ~RestoreNearest() { std::fesetround(FE_TONEAREST); }
    } restore;
    REQUIRE(std::fesetround(FE_UPWARD) == 0);
    for (const UnitCase& u : units) {
      CHECK(vouched_fraction(u, FpControl{}, p) == -1);
      compare(*u.make(), FpControl{}, p, u.name() + ", host rounding upward");
    }
  }
  for (const UnitCase& u : units) CHECK((vouched_fraction(u, FpControl{}, p) >= 0) == simd_build());
}
