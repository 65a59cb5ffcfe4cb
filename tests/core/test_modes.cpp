// Every rounding mode but sr, every format family, every operation: emu against the exact
// reference of reference.hpp (Boost integers, rounding written from the definitions).
// Compares bit patterns and the flags OFLO UFLO INEXACT INV DIV0.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "reference.hpp"

namespace {

struct FormatCase {
  const char* name;  // emu's preset or eXmY name
  ref::Spec spec;    // the same format from its defining numbers
};

// The OCP and IEEE presets, tf32, and generic layouts at the extremes of the allowed
// fields (e3m2: tiny; e11m20: double's exponent range with fp32-like precision).
// Formats beyond IEEE (their definitions: tests/core/test_small_formats.cpp).
const std::array<FormatCase, 18> kFormats = {{
    {"fp16", {5, 10}},
    {"bf16", {8, 7}},
    {"fp8-e4m3", {4, 3, true}},
    {"fp8-e5m2", {5, 2}},
    {"tf32", {8, 10}},
    {"fp32", {8, 23}},
    {"e4m10", {4, 10}},
    {"e3m2", {3, 2}},
    {"e8m4", {8, 4}},
    {"e11m20", {11, 20}},
    {"fp64", {11, 52}},
    {"fp8-e4m3fnuz", ref::spec_of(4, 3, ref::Nan::negative_zero, 0, 8, true, true)},
    {"fp8-e5m2fnuz", ref::spec_of(5, 2, ref::Nan::negative_zero, 0, 16, true, true)},
    {"fp6-e3m2", ref::spec_of(3, 2, ref::Nan::none, 0, 3, true, true)},
    {"fp4-e2m1", ref::spec_of(2, 1, ref::Nan::none, 0, 1, true, true)},
    {"e8m0", ref::spec_of(8, 0, ref::Nan::largest, 0, 127, false, false)},
    {"ue4m3", ref::spec_of(4, 3, ref::Nan::largest, 0, 7, false, true)},
    {"binary8p3se", ref::spec_of(5, 2, ref::Nan::negative_zero, 1, 16, true, true)},
}};

enum class Op { convert, add, sub, mul, div, fma, sqrt };
const char* const kOpNames[] = {"convert", "add", "sub", "mul", "div", "fma", "sqrt"};

double random_sign(double v, std::mt19937_64& gen) { return (gen() & 1) ? -v : v; }

int uniform_int(int lo, int hi, std::mt19937_64& gen) {
  return lo + static_cast<int>(gen() % static_cast<std::uint64_t>(hi - lo + 1));
}

// Values of the format that sit on its boundaries: zero, the subnormal range, the
// normal boundary, max finite and its half ulp, around one.
std::vector<double> edge_operands(const ref::Spec& f) {
  const double sub = f.min_subnormal(), normal = f.min_normal(), max = f.max_finite();
  const double ulp_one = std::ldexp(1.0, -f.p);
  std::vector<double> v = {0.0, sub, 2 * sub, 3 * sub, normal - sub, normal, normal + sub,
                           std::ldexp(1.0, f.emin() - 1), max, max - std::ldexp(1.0, f.emax() - f.p),
                           std::ldexp(1.0, f.emax()), std::ldexp(1.0, f.emax() - f.p - 1),
                           1.0, 1.0 + ulp_one, 1.0 - ulp_one / 2, 2.0, 0.5, 1.5, 3.0, 0.75};
  return v;
}

// Doubles around the format's rounding boundaries, for conversion: ties and their
// neighbours at min_subnormal / 2, between subnormals, at the normal boundary, at the
// overflow threshold; and doubles far outside the range.
std::vector<double> edge_conversion_inputs(const ref::Spec& f) {
  const double sub = f.min_subnormal(), normal = f.min_normal(), max = f.max_finite();
  const double half_top_ulp = std::ldexp(1.0, f.emax() - f.p - 1);
  const std::vector<double> ties = {sub / 2, 1.5 * sub, 2.5 * sub, normal - sub / 2,
                                    max + half_top_ulp, 1.0 + std::ldexp(1.0, -f.p - 1),
                                    1.0 - std::ldexp(1.0, -f.p - 2), normal + sub / 2};
  std::vector<double> v;
  for (double t : ties)
    for (double x : {t, std::nextafter(t, 0.0), std::nextafter(t, ref::kInf)})
      if (std::isfinite(x)) v.push_back(x);
  for (double x : {sub / 4, 2 * max, std::numeric_limits<double>::max(), std::numeric_limits<double>::min(),
                   std::numeric_limits<double>::denorm_min(), max + 2 * half_top_ulp})
    if (std::isfinite(x)) v.push_back(x);
  return v;
}

struct OperandSource {
  const ref::Spec& f;
  std::vector<double> edges = edge_operands(f);
  std::vector<double> conversion_edges = edge_conversion_inputs(f);

  double clamp_to_format(double v) const { return std::fabs(v) > f.max_finite() ? std::copysign(f.max_finite(), v) : v; }

  // A value of the format: an edge, anywhere in the range, or near `base_e` so that
  // sums and fmas cancel and round non-trivially.
  double operand(int base_e, std::mt19937_64& gen) const {
    const auto r = gen() % 8;
    if (r < 2) return random_sign(edges[gen() % edges.size()], gen);
    const int e = r < 5 ? uniform_int(f.emin() - 1, f.emax(), gen)
                        : std::clamp(base_e + uniform_int(-f.p - 2, f.p + 2, gen), f.emin() - 1, f.emax());
    return random_sign(clamp_to_format(ref::grid_value(f, e, gen)), gen);
  }

  // Any double: a grid point of the format's grid extended beyond its range, plus
  // nothing, half an ulp (a tie), a tie's neighbour, or a random part of an ulp.
  double conversion_input(std::mt19937_64& gen) const {
    const auto r = gen() % 16;
    if (r == 0) return random_sign(conversion_edges[gen() % conversion_edges.size()], gen);
    const int e = std::min(uniform_int(f.emin() - f.p - 3, f.emax() + 2, gen), 1023);
    if (e < f.emin() - f.p) {  // below the least subnormal
      const double u = 1.0 + static_cast<double>(gen() >> 11) * 0x1p-53;
      return random_sign(std::ldexp(u, e), gen);
    }
    const double v = ref::grid_value(f, std::max(e, f.emin() - 1), gen);
    const double ulp = std::ldexp(1.0, std::max(e, f.emin()) - f.p);
    double x = v;
    switch (gen() % 4) {
      case 0: break;
      case 1: x = v + ulp / 2; break;
      case 2: x = std::nextafter(v + ulp / 2, (gen() & 1) ? 0.0 : ref::kInf); break;
      case 3: x = v + ulp * (static_cast<double>(gen() >> 11) * 0x1p-53); break;
    }
    if (!std::isfinite(x)) x = std::numeric_limits<double>::max();
    return random_sign(x, gen);
  }
};

// IEEE 754 6.3: an exact zero sum of operands of opposite signs (or cancellation) is +0,
// or -0 when rounding toward -inf; zeros of the same sign keep it.
double zero_sum_sign(double x, double y, emu::Rounding mode) {
  if (x == 0 && y == 0 && std::signbit(x) == std::signbit(y)) return x;
  return mode == emu::Rounding::rd ? -0.0 : 0.0;
}

ref::Result reference(Op op, double a, double b, double c, const ref::Spec& f, emu::Rounding mode,
                      emu::Overflow overflow) {
  using namespace ref;
  auto rounded = [&](const Real& x, double zero) -> Result {
    if (x.num == 0) return ref::zero_result(f, zero, overflow);
    return ref::adapt(f, ref::round(x, f, mode, overflow), overflow);
  };
  switch (op) {
    case Op::convert: return rounded(real(dyadic(a)), a);
    case Op::add: return rounded(real(add(dyadic(a), dyadic(b))), zero_sum_sign(a, b, mode));
    case Op::sub: return rounded(real(add(dyadic(a), dyadic(-b))), zero_sum_sign(a, -b, mode));
    case Op::mul: return rounded(real(mul(dyadic(a), dyadic(b))), std::copysign(1.0, a) * std::copysign(0.0, b));
    case Op::div: return rounded(quotient(a, b), std::copysign(1.0, a) * std::copysign(0.0, b));
    case Op::fma: {
      const double product_sign = (a == 0 || b == 0) ? std::copysign(1.0, a) * std::copysign(0.0, b) : 1.0;
      return rounded(real(add(mul(dyadic(a), dyadic(b)), dyadic(c))), zero_sum_sign(product_sign, c, mode));
    }
    case Op::sqrt: return rounded(square_root(a), a);
  }
  return {};
}

double emu_result(Op op, double a, double b, double c, const emu::Format& f, emu::Context& ctx) {
  switch (op) {
    case Op::convert: return ctx.convert(f, a);
    case Op::add: return ctx.add(f, a, b);
    case Op::sub: return ctx.sub(f, a, b);
    case Op::mul: return ctx.mul(f, a, b);
    case Op::div: return ctx.div(f, a, b);
    case Op::fma: return ctx.fma(f, a, b, c);
    case Op::sqrt: return ctx.sqrt(f, a);
  }
  return 0;
}

bool same_bits(const emu::Format& f, double x, double y) {
  // NaNs compare by sign too: fp8-e4m3 has one NaN pattern per sign (0x7f, 0xff).
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y) && std::signbit(x) == std::signbit(y);
  if (!f.representable(x) || !f.representable(y)) return false;
  return f.encode(x) == f.encode(y);
}

std::string describe(const char* format, bool subnormals, emu::Rounding mode, emu::Overflow overflow, Op op,
                     double a, double b, double c, double got, emu::Flags got_flags, const ref::Result& want) {
  char buf[400];
  std::snprintf(buf, sizeof buf, "%s%s %s overflow=%s %s(%a, %a, %a): emu %a flags 0x%x, reference %a flags 0x%x",
                format, subnormals ? "" : " (no subnormals)", emu::rounding_name(mode), emu::overflow_name(overflow),
                kOpNames[static_cast<int>(op)], a, b, c, got, got_flags, want.value, want.flags);
  return buf;
}

// `samples` operations under `mode`, spread over every format, operation, overflow
// policy and subnormals on/off. Returns the first mismatches (all of them counted).
void check_mode(emu::Rounding mode, long samples) {
  std::mt19937_64 gen(0x5eed0000u + static_cast<unsigned>(mode));
  std::vector<emu::Format> formats_on, formats_off;
  std::vector<OperandSource> sources;
  for (const auto& fc : kFormats) {
    formats_on.push_back(emu::format_by_name(fc.name));
    formats_off.push_back(formats_on.back().with_subnormals(false));
    sources.push_back(OperandSource{fc.spec});
  }
  long mismatches = 0;
  std::vector<std::string> first;
  std::array<long, 7> per_op{};
  long overflow_seen = 0, ties_seen = 0, tiny_seen = 0;
  for (long i = 0; i < samples; ++i) {
    const std::size_t k = gen() % kFormats.size();
    ref::Spec spec = kFormats[k].spec;
    spec.subnormals = gen() % 4 != 0 && spec.zero;  // no zero (e8m0): no subnormals
    const emu::Format& format = spec.subnormals ? formats_on[k] : formats_off[k];
    const auto overflow = static_cast<emu::Overflow>(gen() % 3);
    // fp64 conversion is the identity on doubles: the other operations carry fp64.
    const bool is_fp64 = spec.p == 52;
    const auto op = static_cast<Op>(is_fp64 ? 1 + gen() % 6 : gen() % 7);
    const OperandSource& src = sources[k];
    const int base_e = uniform_int(spec.emin() - 1, spec.emax(), gen);
    double a = op == Op::convert ? src.conversion_input(gen) : src.operand(base_e, gen);
    double b = src.operand(base_e, gen);
    const double c = src.operand(base_e + uniform_int(-2, 2, gen), gen);
    if (op == Op::div && b == 0) b = spec.min_subnormal();  // x/0 is checked in test_status
    if (op == Op::sqrt) a = std::fabs(a);                     // sqrt(-x) likewise
    if (op == Op::mul && (gen() & 1)) b = std::ldexp(1.0, -uniform_int(1, spec.p + 2, gen));  // halves: ties

    emu::FpControl control;
    control.rounding = mode;
    control.overflow = overflow;
    emu::Context ctx(control);
    const double got = emu_result(op, a, b, c, format, ctx);
    const ref::Result want = reference(op, a, b, c, spec, mode, overflow);
    ++per_op[static_cast<int>(op)];
    overflow_seen += (want.flags & emu::OFLO) != 0;
    ties_seen += want.tie;
    tiny_seen += (want.flags & emu::UFLO) != 0;
    if (!same_bits(format, got, want.value) || ctx.status() != want.flags) {
      ++mismatches;
      if (first.size() < 12)
        first.push_back(describe(kFormats[k].name, spec.subnormals, mode, overflow, op, a, b, c, got,
                                 ctx.status(), want));
    }
  }
  for (const auto& m : first) UNSCOPED_INFO(m);
  INFO(emu::rounding_name(mode) << ": " << samples << " samples, " << mismatches << " mismatches");
  CHECK(mismatches == 0);
  // The generator must reach every operation, overflow, exact ties and tiny results.
  for (long n : per_op) CHECK(n > samples / 20);
  CHECK(overflow_seen > samples / 1000);
  CHECK(ties_seen > samples / 1000);
  CHECK(tiny_seen > samples / 1000);
  std::printf("  %s: %ld overflows, %ld exact ties, %ld tiny inexact results\n", emu::rounding_name(mode),
              overflow_seen, ties_seen, tiny_seen);
}

const emu::Rounding kModes[] = {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::rz,
                                emu::Rounding::ru, emu::Rounding::rd, emu::Rounding::ro};

void check_all_modes(long samples_per_mode) {
  for (emu::Rounding mode : kModes) {
    const auto start = std::chrono::steady_clock::now();
    check_mode(mode, samples_per_mode);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::printf("modes vs Boost reference: %s, %ld samples in %.1f s\n", emu::rounding_name(mode),
                samples_per_mode, took.count());
  }
}

}  // namespace

TEST_CASE("reference rounding reproduces textbook cases", "[modes]") {
  // The reference itself, on cases worked out by hand (fp16: p = 10, emin = -14).
  const ref::Spec fp16{5, 10};
  auto rounded = [&](double x, emu::Rounding mode) {
    return ref::round(ref::real(ref::dyadic(x)), fp16, mode, emu::Overflow::inf);
  };
  CHECK(rounded(1.0 + 0x1p-11, emu::Rounding::rne).value == 1.0);               // tie to even
  CHECK(rounded(1.0 + 3 * 0x1p-11, emu::Rounding::rne).value == 1.0 + 0x1p-9);  // tie to even, up
  CHECK(rounded(1.0 + 0x1p-11, emu::Rounding::rna).value == 1.0 + 0x1p-10);     // tie away
  CHECK(rounded(-1.0 - 0x1p-20, emu::Rounding::rd).value == -1.0 - 0x1p-10);
  CHECK(rounded(-1.0 - 0x1p-20, emu::Rounding::ru).value == -1.0);
  CHECK(rounded(1.0 + 0x1p-20, emu::Rounding::ro).value == 1.0 + 0x1p-10);      // 1 is even: to odd
  CHECK(rounded(65520.0, emu::Rounding::rne).value == ref::kInf);               // the overflow tie
  CHECK(rounded(65519.0, emu::Rounding::rne).value == 65504.0);
  CHECK(rounded(65536.0, emu::Rounding::rz).value == 65504.0);
  CHECK(rounded(0x1p-25, emu::Rounding::rne).value == 0.0);                     // min_sub / 2 ties to 0
  CHECK(rounded(0x1p-25, emu::Rounding::rne).flags == (emu::UFLO | emu::INEXACT));
  CHECK(rounded(0x1.8p-25, emu::Rounding::rne).value == 0x1p-24);
  const auto root2 = ref::round(ref::square_root(2.0), fp16, emu::Rounding::rne, emu::Overflow::inf);
  CHECK(root2.value == 1.4140625);  // sqrt(2) = 1.41421..., fp16 neighbours 1.4140625, 1.4150390625
  const auto third = ref::round(ref::quotient(1.0, 3.0), fp16, emu::Rounding::rne, emu::Overflow::inf);
  CHECK(third.value == 0x1.554p-2);  // 1/3 = 0x1.5555...p-2
}

TEST_CASE("all modes and formats against the Boost reference, 10^5 per mode", "[modes]") {
  check_all_modes(100'000);
}

TEST_CASE("all modes and formats against the Boost reference, 5 * 10^6 per mode", "[.][exhaustive-modes]") {
  check_all_modes(5'000'000);
}
