// Formats beyond IEEE (fnuz, OCP MX fp6/fp4/e8m0, NVFP4's ue4m3, IEEE P3109) and every
// other format of 8 bits or fewer: every encoding decodes as the format's definition
// says and encodes back; rounding of a dense set of doubles (every value, every tie
// between neighbours and the doubles beside it, quarter points, the overflow threshold,
// the subnormal range) in every deterministic mode, every overflow policy, subnormals
// on and off, tininess before and after, against the exact reference of reference.hpp;
// stochastic rounding with few random bits against its distribution; published values
// with their sources.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/round.hpp"
#include "reference.hpp"

// GCC 12 reports a false -Wmaybe-uninitialized inside Boost's cpp_int destructor where
// ref::real is inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using ref::Nan;
using ref::spec_of;

struct SmallFormat {
  std::string name;  // emu's name
  ref::Spec spec;    // the same format from its defining fields
};

// P3109 interim report v4.0, 3.1 and 4.7.2: signed: K - P exponent bits, bias
// 2^(K-P-1), NaN at 2^(K-1); unsigned: K - P + 1 exponent bits, bias 2^(K-P), NaN at
// 2^K - 1; extended formats have +-inf.
SmallFormat p3109(int k, int p, bool is_signed, bool extended) {
  const int e = is_signed ? k - p : k - p + 1;
  const std::string name = "binary" + std::to_string(k) + "p" + std::to_string(p) + (is_signed ? "s" : "u") +
                           (extended ? "e" : "f");
  return {name, spec_of(e, p - 1, is_signed ? Nan::negative_zero : Nan::largest, extended ? 1 : 0,
                        is_signed ? 1 << (k - p - 1) : 1 << (k - p), is_signed, true)};
}

// Every format of 8 bits or fewer that emu names.
std::vector<SmallFormat> small_formats() {
  std::vector<SmallFormat> v = {
      {"fp8-e4m3", ref::Spec{4, 3, true}},
      {"fp8-e5m2", ref::Spec{5, 2}},
      // bias one more than IEEE, no inf, NaN = 0x80 (StableHLO RFC 20230321-fp8_fnuz).
      {"fp8-e4m3fnuz", spec_of(4, 3, Nan::negative_zero, 0, 8, true, true)},
      {"fp8-e5m2fnuz", spec_of(5, 2, Nan::negative_zero, 0, 16, true, true)},
      // OCP MX v1.0 5.3: no inf, no NaN, IEEE bias.
      {"fp6-e2m3", spec_of(2, 3, Nan::none, 0, 1, true, true)},
      {"fp6-e3m2", spec_of(3, 2, Nan::none, 0, 3, true, true)},
      {"fp4-e2m1", spec_of(2, 1, Nan::none, 0, 1, true, true)},
      // OCP MX v1.0 5.4: E8M0, unsigned, bias 127, NaN 0xff, no zero.
      {"e8m0", spec_of(8, 0, Nan::largest, 0, 127, false, false)},
      // NVFP4's scale: E4M3 with the sign bit 0.
      {"ue4m3", spec_of(4, 3, Nan::largest, 0, 7, false, true)},
      {"e2m1", ref::Spec{2, 1}},
      {"e3m2", ref::Spec{3, 2}},
      {"e4m3", ref::Spec{4, 3}},
      {"e5m2", ref::Spec{5, 2}},
      {"e2m5", ref::Spec{2, 5}},
      {"e6m1", ref::Spec{6, 1}},
  };
  for (int k = 3; k <= 8; ++k)
    for (bool is_signed : {true, false})
      for (int p = 1; p <= (is_signed ? k - 1 : k); ++p)
        for (bool extended : {true, false}) {
          const SmallFormat f = p3109(k, p, is_signed, extended);
          if (f.spec.max_code() >> f.spec.p == 0) continue;  // special values leave no normal binade
          v.push_back(f);
        }
  return v;
}

std::uint64_t pattern_count(const ref::Spec& s) { return std::uint64_t{1} << ((s.is_signed ? 1 : 0) + s.exponent_bits + s.p); }

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// The results of emu and the reference are the same bit pattern (NaN: both NaN; their
// signs matter where the format has a NaN per sign).
bool same_result(const emu::Format& f, double got, double want) {
  if (std::isnan(got) || std::isnan(want)) {
    if (!(std::isnan(got) && std::isnan(want))) return false;
    return f.nan_encoding() != emu::NanEncoding::top || !f.is_signed() || std::signbit(got) == std::signbit(want);
  }
  if (!f.representable(got) || !f.representable(want)) return false;
  return f.encode(got) == f.encode(want);
}

const emu::Rounding kDeterministic[] = {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::rz,
                                        emu::Rounding::ru,  emu::Rounding::rd,  emu::Rounding::ro};
const emu::Overflow kPolicies[] = {emu::Overflow::inf, emu::Overflow::saturate, emu::Overflow::nan};

// The finite non-negative values of the format, ascending (subnormals on).
std::vector<double> nonnegative_values(const ref::Spec& s) {
  std::set<double> values;
  for (std::uint64_t bits = 0; bits < pattern_count(s); ++bits) {
    const double v = ref::decode(s, bits);
    if (std::isfinite(v) && v >= 0) values.insert(v);
  }
  return {values.begin(), values.end()};
}

// Doubles around every rounding boundary of the format: each value, each midpoint
// between neighbours and the doubles either side of it, quarter points, the overflow
// threshold max + half the top ulp and beyond, and below the least value.
std::vector<double> dense_inputs(const ref::Spec& s) {
  const std::vector<double> v = nonnegative_values(s);
  std::vector<double> in;
  for (std::size_t i = 0; i < v.size(); ++i) {
    in.push_back(v[i]);
    const double next = i + 1 < v.size() ? v[i + 1] : v[i] + std::ldexp(1.0, s.emax() - s.p);  // past max: the tie
    const double mid = (v[i] + next) / 2;  // exact: neighbours differ in few bits
    for (double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, ref::kInf), v[i] + (next - v[i]) / 4,
                     v[i] + 3 * (next - v[i]) / 4})
      in.push_back(x);
  }
  const double least = v.front() == 0 ? v[1] : v.front();
  for (double x : {least / 2, least / 4, std::nextafter(least / 2, 0.0), std::nextafter(least / 2, 1.0),
                   std::numeric_limits<double>::denorm_min(), 2 * s.max_finite(), std::numeric_limits<double>::max(),
                   s.max_finite() + std::ldexp(1.0, s.emax() - s.p)})
    in.push_back(x);
  std::vector<double> both;
  for (double x : in) {
    both.push_back(x);
    both.push_back(-x);
  }
  return both;
}

struct Mismatches {
  long count = 0, checked = 0;
  void note(const std::string& what) {
    if (++count <= 8) UNSCOPED_INFO(what);
  }
};

void compare(const emu::Format& f, const ref::Spec& spec, double x, emu::Rounding mode, emu::Overflow overflow,
             emu::Tininess tininess, Mismatches& m) {
  emu::Flags flags = 0;
  const double got = emu::round(f, x, emu::RoundSpec{mode, overflow, 0, tininess}, nullptr, flags);
  const auto ref_tininess = tininess == emu::Tininess::after ? ref::Tininess::after : ref::Tininess::before;
  ref::Real exact = ref::real(ref::dyadic(x));
  exact.negative = std::signbit(x);  // dyadic() keeps no sign of zero
  const ref::Result want = ref::round_in(exact, spec, mode, overflow, ref_tininess);
  ++m.checked;
  if (!same_result(f, got, want.value) || flags != want.flags) {
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s%s %s %s tininess %s: round(%a) = %a flags 0x%x, reference %a flags 0x%x",
                  f.name().c_str(), f.subnormals() ? "" : " (no subnormals)", emu::rounding_name(mode),
                  emu::overflow_name(overflow), emu::tininess_name(tininess), x, got, flags, want.value, want.flags);
    m.note(buf);
  }
}

}  // namespace

TEST_CASE("every pattern of every small format decodes as its definition and encodes back", "[formats][small]") {
  for (const SmallFormat& sf : small_formats()) {
    const emu::Format f = emu::format_by_name(sf.name);
    INFO(sf.name);
    REQUIRE(f.width() <= 8);
    CHECK(f.width() == (sf.spec.is_signed ? 1 : 0) + sf.spec.exponent_bits + sf.spec.p);
    for (bool subnormals : {true, false}) {
      if (subnormals && !sf.spec.zero) continue;
      ref::Spec spec = sf.spec;
      spec.subnormals = subnormals;
      const emu::Format g = sf.spec.zero ? f.with_subnormals(subnormals) : f;
      std::uint64_t finite = 0, wrong_value = 0, wrong_bits = 0;
      std::set<double> values;
      for (std::uint64_t bits = 0; bits < pattern_count(spec); ++bits) {
        const double want = ref::decode(spec, bits);
        const double v = g.decode(bits);
        if (!same_value(v, want)) {
          if (++wrong_value < 5) UNSCOPED_INFO("decode 0x" << std::hex << bits << " = " << v << ", expected " << want);
          continue;
        }
        // Back: NaN to the canonical NaN (of its sign where there is one per sign);
        // a subnormal pattern flushed to zero, and -0 where there is no -0, to that zero.
        std::uint64_t expected = bits;
        if (std::isnan(v)) expected = g.encode(std::numeric_limits<double>::quiet_NaN()) | (std::signbit(v) ? g.sign_mask() : 0);
        else if (v == 0) expected = std::signbit(v) ? g.sign_mask() : 0;
        if (g.encode(v) != expected && ++wrong_bits < 5)
          UNSCOPED_INFO("encode(decode(0x" << std::hex << bits << ")) = 0x" << g.encode(v) << ", expected 0x" << expected);
        if (std::isfinite(v)) {
          ++finite;
          values.insert(v);
        }
      }
      INFO((subnormals ? "subnormals on" : "subnormals off"));
      CHECK(wrong_value == 0);
      CHECK(wrong_bits == 0);
      CHECK(finite == g.finite_encodings());
      CHECK(values.size() == g.finite_values());
      CHECK(g.max_finite() == *values.rbegin());
      // The descriptor's fields against the definition's.
      CHECK(g.has_infinity() == spec.has_inf());
      CHECK(g.has_nan() == spec.has_nan());
      CHECK(g.is_signed() == spec.is_signed);
      CHECK(g.has_zero() == spec.zero);
      CHECK(g.has_negative_zero() == spec.has_negative_zero());
      CHECK(g.bias() == spec.bias());
      CHECK(g.emin() == spec.emin());
      CHECK(g.emax() == spec.emax());
    }
  }
}

TEST_CASE("every small format rounds a dense set of doubles as the exact reference, every mode and policy",
          "[formats][small]") {
  Mismatches m;
  long formats = 0;
  for (const SmallFormat& sf : small_formats()) {
    const emu::Format f = emu::format_by_name(sf.name);
    ++formats;
    const std::vector<double> inputs = dense_inputs(sf.spec);
    const double max = sf.spec.max_finite(), near_tiny = 2 * sf.spec.min_normal();
    for (double x : inputs) {
      const double a = std::fabs(x);
      for (emu::Rounding mode : kDeterministic) {
        compare(f, sf.spec, x, mode, emu::Overflow::inf, emu::Tininess::before, m);
        if (a > max / 2)  // overflow: every policy
          for (emu::Overflow policy : {emu::Overflow::saturate, emu::Overflow::nan})
            compare(f, sf.spec, x, mode, policy, emu::Tininess::before, m);
        if (a < near_tiny) {  // underflow: subnormals off, tininess after
          compare(f, sf.spec, x, mode, emu::Overflow::inf, emu::Tininess::after, m);
          if (sf.spec.zero) {
            ref::Spec flushing = sf.spec;
            flushing.subnormals = false;
            const emu::Format g = f.with_subnormals(false);
            for (emu::Tininess t : {emu::Tininess::before, emu::Tininess::after})
              compare(g, flushing, x, mode, emu::Overflow::inf, t, m);
          }
        }
      }
    }
  }
  INFO(formats << " formats, " << m.checked << " roundings compared, " << m.count << " mismatches");
  CHECK(m.count == 0);
  CHECK(formats > 60);
  CHECK(m.checked > 500'000);
}

TEST_CASE("special operands in every small format: NaN, infinities, zeros, negatives", "[formats][small]") {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  for (const SmallFormat& sf : small_formats()) {
    const emu::Format f = emu::format_by_name(sf.name);
    INFO(sf.name);
    for (emu::Overflow policy : kPolicies) {
      INFO(emu::overflow_name(policy));
      const emu::RoundSpec spec{emu::Rounding::rne, policy};
      emu::Flags flags = 0;
      // NaN: NaN, no flag; no NaN: +0 (or the least value) with INV.
      double r = emu::round(f, kNaN, spec, nullptr, flags);
      if (f.has_nan()) CHECK((std::isnan(r) && flags == 0));
      else CHECK((r == sf.spec.least_value() && flags == emu::INV));
      // +inf: inf; without inf NaN with INV, or max with OFLO (saturate, or no NaN).
      flags = 0;
      r = emu::round(f, kInf, spec, nullptr, flags);
      if (f.has_infinity()) CHECK((r == kInf && flags == 0));
      else if (policy == emu::Overflow::saturate || !f.has_nan()) CHECK((r == f.max_finite() && flags == emu::OFLO));
      else CHECK((std::isnan(r) && flags == emu::INV));
      // -inf and -1 in unsigned formats: invalid.
      if (!f.is_signed()) {
        for (double negative : {-kInf, -1.0, -f.max_finite()}) {
          flags = 0;
          r = emu::round(f, negative, spec, nullptr, flags);
          CHECK(flags == emu::INV);
          if (policy == emu::Overflow::saturate || !f.has_nan()) CHECK(r == sf.spec.least_value());
          else CHECK(std::isnan(r));
        }
      }
      // Zeros: -0 stays -0 only where the format has it; without zero the least value.
      for (double zero : {0.0, -0.0}) {
        flags = 0;
        r = emu::round(f, zero, spec, nullptr, flags);
        if (!f.has_zero()) {
          CHECK((r == f.min_normal() && flags == (emu::UFLO | emu::INEXACT)));
        } else {
          CHECK((r == 0 && flags == 0));
          CHECK(std::signbit(r) == (std::signbit(zero) && f.has_negative_zero()));
          CHECK(f.encode(r) == (std::signbit(r) ? f.sign_mask() : 0));
        }
      }
    }
  }
}

TEST_CASE("exact zero results of operations in formats without -0 or without zero", "[formats][small]") {
  // IEEE 754 6.3 gives x - x = -0 under rd; fnuz and P3109 have one zero, e8m0 none.
  emu::FpControl control;
  control.rounding = emu::Rounding::rd;
  for (const char* name : {"fp8-e4m3fnuz", "binary8p3se", "ue4m3"}) {
    emu::Context ctx(control);
    const emu::Format f = emu::format_by_name(name);
    const double r = ctx.sub(f, 1.0, 1.0);
    INFO(name);
    CHECK(r == 0);
    CHECK_FALSE(std::signbit(r));
    CHECK(f.encode(r) == 0);
    CHECK(ctx.status() == 0);
    CHECK_FALSE(std::signbit(ctx.fma(f, 0.0, -1.0, 0.0)));
    CHECK_FALSE(std::signbit(ctx.add(f, -0.0, -0.0)));
  }
  emu::Context ctx(control);
  CHECK(ctx.sub(emu::e8m0(), 1.0, 1.0) == 0x1p-127);  // no zero: the least value
  CHECK(ctx.status() == (emu::UFLO | emu::INEXACT));
  CHECK(emu::fp8_e4m3().encode(ctx.sub(emu::fp8_e4m3(), 1.0, 1.0)) == 0x80);  // fp8-e4m3 keeps -0
}

TEST_CASE("stochastic rounding with few random bits in the small formats", "[formats][small][stochastic]") {
  // Every result is one of the two neighbours of x; with k random bits the probability
  // of the upper one is floor(f 2^k) / 2^k (emu/round.hpp), f the distance to the lower
  // one in its ulps; checked within 5 binomial standard deviations, fixed seeds.
  constexpr int kDraws = 400;
  long cases = 0, off_grid = 0, outside_bound = 0;
  for (const SmallFormat& sf : small_formats()) {
    const emu::Format f = emu::format_by_name(sf.name);
    const std::vector<double> inputs = dense_inputs(sf.spec);
    emu::Rng rng(emu::StreamId{static_cast<std::uint64_t>(cases) + 1});
    for (std::size_t i = 0; i < inputs.size(); i += 7) {
      const double x = inputs[i];
      ref::Real real = ref::real(ref::dyadic(x));
      real.negative = std::signbit(x);
      const ref::Result down = ref::round_in(real, sf.spec, emu::Rounding::rz, emu::Overflow::inf);
      const ref::Result away = x < 0 ? ref::round_in(real, sf.spec, emu::Rounding::rd, emu::Overflow::inf)
                                     : ref::round_in(real, sf.spec, emu::Rounding::ru, emu::Overflow::inf);
      for (int k : {0, 2, 3, 5}) {
        ++cases;
        int ups = 0;
        for (int d = 0; d < kDraws; ++d) {
          emu::Flags flags = 0;
          const double r = emu::round(f, x, emu::RoundSpec{emu::Rounding::sr, emu::Overflow::inf, k}, &rng, flags);
          if (same_result(f, r, away.value) && !same_result(f, r, down.value)) ++ups;
          else if (!same_result(f, r, down.value)) ++off_grid;
        }
        // The probability of rounding away, where both neighbours are finite values.
        if (!std::isfinite(down.value) || !std::isfinite(away.value) || down.value == away.value) continue;
        const double lo = std::fabs(down.value), hi = std::fabs(away.value);
        if (lo == 0 && !sf.spec.zero) continue;
        const double frac = (std::fabs(x) - lo) / (hi - lo);  // exact enough: few bits
        const double p = k == 0 ? frac : std::floor(std::ldexp(frac, k)) / std::ldexp(1.0, k);
        const double sd = std::sqrt(kDraws * p * (1 - p));
        if (std::fabs(ups - kDraws * p) > 5 * sd + 1) {
          if (++outside_bound < 5)
            UNSCOPED_INFO(sf.name << " sr_bits " << k << " x " << x << ": " << ups << " of " << kDraws << " up, p " << p);
        }
      }
    }
  }
  INFO(cases << " (input, sr_bits) cases");
  CHECK(off_grid == 0);
  CHECK(outside_bound == 0);
  CHECK(cases > 10'000);
}

TEST_CASE("small formats match their published values", "[formats][small]") {
  // OCP 8-bit Floating Point Specification (OFP8) v1.0, Table 1, and OCP Microscaling
  // Formats (MX) v1.0 Specification, section 5.3 (FP8/FP6/FP4 element tables) and 5.4
  // (E8M0): max normal, min normal, max and min subnormal.
  struct Published {
    const char* name;
    double max, min_normal, max_subnormal, min_subnormal;
  };
  const Published ocp[] = {
      {"fp8-e4m3", 448, 0x1p-6, 0.875 * 0x1p-6, 0x1p-9},
      {"fp8-e5m2", 57344, 0x1p-14, 0.75 * 0x1p-14, 0x1p-16},
      {"fp6-e2m3", 7.5, 1.0, 0.875, 0.125},
      {"fp6-e3m2", 28, 0.25, 0.1875, 0.0625},
      {"fp4-e2m1", 6, 1.0, 0.5, 0.5},
      // ml_dtypes float8_e4m3fnuz / float8_e5m2fnuz (StableHLO RFC 20230321-fp8_fnuz;
      // Noune et al., "8-bit Numerical Formats for Deep Neural Networks", 2022).
      {"fp8-e4m3fnuz", 240, 0x1p-7, 0.875 * 0x1p-7, 0x1p-10},
      {"fp8-e5m2fnuz", 57344, 0x1p-15, 0.75 * 0x1p-15, 0x1p-17},
      // NVFP4's scale: the positive half of OCP E4M3.
      {"ue4m3", 448, 0x1p-6, 0.875 * 0x1p-6, 0x1p-9},
  };
  for (const auto& p : ocp) {
    const emu::Format f = emu::format_by_name(p.name);
    INFO(p.name);
    CHECK(f.max_finite() == p.max);
    CHECK(f.min_normal() == p.min_normal);
    CHECK(f.min_normal() - f.min_subnormal() == p.max_subnormal);
    CHECK(f.min_subnormal() == p.min_subnormal);
  }
  CHECK_FALSE(emu::fp6_e2m3().has_nan());
  CHECK_FALSE(emu::fp4_e2m1().has_infinity());
  CHECK(emu::fp4_e2m1().decode(0b1'00'0) == 0);  // OCP MX keeps -0 in FP6 and FP4
  CHECK(std::signbit(emu::fp4_e2m1().decode(0b1'00'0)));
  CHECK(emu::fp4_e2m1().decode(0b0'11'1) == 6.0);  // 1.5 * 2^(3 - 1)
  // fnuz: NaN is 0x80 (the -0 pattern), no inf, no -0.
  for (const emu::Format* f : {&emu::fp8_e4m3fnuz(), &emu::fp8_e5m2fnuz()}) {
    CHECK(std::isnan(f->decode(0x80)));
    CHECK(f->quiet_nan_bits() == 0x80);
    CHECK(f->encode(-std::numeric_limits<double>::quiet_NaN()) == 0x80);
    CHECK(f->encode(-0.0) == 0x00);
    CHECK_FALSE(f->has_infinity());
    CHECK(f->finite_values() == 255);
  }
  CHECK(emu::fp8_e4m3fnuz().decode(0x7f) == 240.0);  // 0b0'1111'111 = 1.875 * 2^(15 - 8)
  CHECK(emu::fp8_e5m2fnuz().decode(0x7f) == 57344.0);  // 0b0'11111'11 = 1.75 * 2^(31 - 16)
  // OCP MX v1.0 5.4: E8M0 encodes 2^-127 .. 2^127, 0xff is NaN, there is no zero.
  const emu::Format& e8 = emu::e8m0();
  CHECK(e8.decode(0x00) == 0x1p-127);
  CHECK(e8.decode(0x7f) == 1.0);
  CHECK(e8.decode(0xfe) == 0x1p127);
  CHECK(std::isnan(e8.decode(0xff)));
  CHECK(e8.max_finite() == 0x1p127);
  CHECK(e8.min_normal() == 0x1p-127);
  CHECK_FALSE(e8.has_zero());
  CHECK(e8.width() == 8);
  CHECK(e8.finite_values() == 255);
  CHECK_THROWS_AS(e8.encode(0.0), std::invalid_argument);
  CHECK_THROWS_AS(e8.with_subnormals(true), std::invalid_argument);
  // ue4m3: 7 bits (NVFP4 stores it in a byte with the top bit 0), NaN 0x7f.
  CHECK(emu::ue4m3().width() == 7);
  CHECK(std::isnan(emu::ue4m3().decode(0x7f)));
  CHECK(emu::ue4m3().decode(0x7e) == 448.0);
}

TEST_CASE("P3109 formats: the interim report's definitions and value tables", "[formats][small][p3109]") {
  // IEEE WG P3109 Interim Report v4.0 (26 June 2026), github.com/P3109/Public.
  // Annex A.5: emax of each format, and 1.0 encodes to the midway code point 2^(K-2)
  // (signed) or 2^(K-1) (unsigned).
  for (int k = 3; k <= 8; ++k)
    for (bool is_signed : {true, false})
      for (int p = 1; p <= (is_signed ? k - 1 : k); ++p)
        for (bool extended : {true, false}) {
          const SmallFormat sf = p3109(k, p, is_signed, extended);
          if (sf.spec.max_code() >> sf.spec.p == 0) continue;
          const emu::Format f = emu::format_by_name(sf.name);
          INFO(sf.name);
          int emax;
          if (p == 1 && !is_signed) emax = (1 << (k - 1)) - (extended ? 3 : 2);
          else if (p == 1 && is_signed && extended) emax = (1 << (k - 2)) - 2;
          else if (p == 2 && !is_signed && extended) emax = (1 << (k - 2)) - 2;
          else emax = is_signed ? (1 << (k - p - 1)) - 1 : (1 << (k - p)) - 1;
          CHECK(f.emax() == emax);
          CHECK(f.encode(1.0) == (is_signed ? 1u << (k - 2) : 1u << (k - 1)));
          // 4.7.2: one NaN (2^(K-1) signed, 2^K - 1 unsigned), Inf at 2^(K-1) - 1 and
          // 2^K - 1 (signed) or 2^K - 2 (unsigned) in extended formats.
          CHECK(std::isnan(f.decode(is_signed ? 1u << (k - 1) : (1u << k) - 1)));
          if (extended) {
            CHECK(f.decode(is_signed ? (1u << (k - 1)) - 1 : (1u << k) - 2) == std::numeric_limits<double>::infinity());
            if (is_signed) CHECK(f.decode((1u << k) - 1) == -std::numeric_limits<double>::infinity());
          }
          CHECK_FALSE(f.has_negative_zero());
        }
  // 3.1's example: 2.0 in Binary8p4se is 0x48, Inf is 0x7F.
  const emu::Format p4 = emu::format_by_name("binary8p4se");
  CHECK(p4.encode(2.0) == 0x48);
  CHECK(p4.infinity_bits() == 0x7f);
  // Value tables (Value Tables/Hexadecimal/K8/P3/signed/Binary8p3se.csv and
  // .../P4/signed/Binary8p4sf.csv): least subnormal, least normal, max.
  const emu::Format p3 = emu::format_by_name("binary8p3se");
  CHECK(p3.decode(0x01) == 0x0.8p-16);
  CHECK(p3.decode(0x04) == 0x1p-15);
  CHECK(p3.decode(0x7e) == 0x1.8p+15);
  CHECK(p3.max_finite() == 49152);
  const emu::Format p4f = emu::format_by_name("binary8p4sf");
  CHECK(p4f.decode(0x01) == 0x0.4p-8);
  CHECK(p4f.decode(0x08) == 0x1p-7);
  CHECK(p4f.decode(0x7f) == 0x1.ep+7);
  // Binary8p4sf and fp8-e4m3fnuz, Binary8p3sf and fp8-e5m2fnuz are the same formats.
  CHECK(p4f == emu::fp8_e4m3fnuz());
  CHECK(emu::format_by_name("binary8p3sf") == emu::fp8_e5m2fnuz());
  CHECK(emu::format_by_name("binary8p5se").max_finite() == 15);  // 0x7e = 0b0'111'1110 = 1.875 * 2^(7 - 4)
  // Names: suffix required, no leading zeros, P within range.
  CHECK_THROWS_WITH(emu::format_by_name("binary8p3"), Catch::Contains("binary8p3se"));
  CHECK_THROWS_WITH(emu::format_by_name("binary08p3se"), Catch::Contains("write it binary8p3se"));
  CHECK_THROWS_AS(emu::format_by_name("binary8p8se"), std::invalid_argument);
  CHECK_THROWS_AS(emu::format_by_name("binary8p3xe"), std::invalid_argument);
  CHECK_THROWS_AS(emu::format_by_name("binary2p1se"), std::invalid_argument);
  CHECK(emu::format_by_name("binary8p8ue").width() == 8);
}
