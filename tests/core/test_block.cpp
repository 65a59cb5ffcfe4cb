// Block formats (emu/block.hpp): scales and elements of every block format, scale rule
// and rounding mode against an exact model written from the definitions (OCP MX v1.0
// section 6.3; NVIDIA's NVFP4 two-level scaling) on the reference of reference.hpp;
// worked examples; stochastic rounding's mean; MXINT8's two's complement elements.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emu/block.hpp"
#include "reference.hpp"

// GCC 12 reports a false -Wmaybe-uninitialized inside Boost's cpp_int destructor where
// the reference's functions are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

using emu::ScaleRule;
using ref::Nan;
using ref::spec_of;

// The element grids from their definitions (OCP OFP8 v1.0; OCP MX v1.0 5.3; MXINT8:
// k/64 for |k| <= 127, written as 1 exponent bit with bias 1 and 6 fraction bits).
ref::Spec element_spec(const std::string& block) {
  if (block == "mxfp8-e4m3") return ref::Spec{4, 3, true};
  if (block == "mxfp8-e5m2") return ref::Spec{5, 2};
  if (block == "mxfp6-e2m3") return spec_of(2, 3, Nan::none, 0, 1, true, true);
  if (block == "mxfp6-e3m2") return spec_of(3, 2, Nan::none, 0, 3, true, true);
  if (block == "mxint8") return spec_of(1, 6, Nan::none, 0, 1, true, true);
  return spec_of(2, 1, Nan::none, 0, 1, true, true);  // mxfp4-e2m1, nvfp4
}
const ref::Spec kE8m0 = spec_of(8, 0, Nan::largest, 0, 127, false, false);
const ref::Spec kUe4m3 = spec_of(4, 3, Nan::largest, 0, 7, false, true);
const ref::Spec kFp32{8, 23};

ref::Real exact_quotient(double x, double y) {
  ref::Real r = ref::quotient(x, y);
  if (x == 0) r.negative = std::signbit(x) != std::signbit(y);
  return r;
}

struct Expected {
  double scale;
  double tensor_scale = 1;
  std::vector<double> elements;
  std::vector<emu::Flags> element_flags;
  emu::Flags block_flags = 0;
  emu::Flags scale_flags = 0;
};

// The exact model of one block: the scale by the rule's definition, every element x/X
// rounded once into the element grid.
Expected model_block(const std::string& name, const std::vector<double>& block, ScaleRule rule,
                     emu::Rounding mode, emu::Overflow overflow, double tensor_scale) {
  const ref::Spec el = element_spec(name);
  const bool nvfp4 = name == "nvfp4";
  const bool integer = name == "mxint8";
  Expected e;
  e.tensor_scale = tensor_scale;
  double amax = 0;
  bool nan = false, inf = false;
  for (double x : block) {
    nan = nan || std::isnan(x);
    inf = inf || std::isinf(x);
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  }
  const double elem_max = el.max_finite();
  if (nan || inf) {
    e.scale = NAN;
    e.block_flags = inf ? emu::INV : 0;
  } else if (amax == 0) {
    e.scale = nvfp4 ? 0.0 : 0x1p-127;
  } else if (rule == ScaleRule::up || rule == ScaleRule::nearest) {
    const emu::Rounding m = rule == ScaleRule::up ? emu::Rounding::ru : emu::Rounding::rne;
    const emu::Overflow o = nvfp4 || overflow == emu::Overflow::saturate ? emu::Overflow::saturate : emu::Overflow::nan;
    const ref::Result r = ref::round_in(ref::quotient(amax, elem_max * tensor_scale), nvfp4 ? kUe4m3 : kE8m0, m, o);
    e.scale = r.value;
    if (r.flags & emu::OFLO) e.block_flags = r.flags & (emu::OFLO | emu::INEXACT | emu::INV);
  } else {
    const ref::Real a = ref::real(ref::dyadic(amax));
    int k = ref::floor_log2(a.num, a.den);
    const bool power_of_two = amax == std::ldexp(1.0, k);
    if (rule == ScaleRule::ceil && !power_of_two) ++k;
    if (rule == ScaleRule::even) {
      // amax rounded to the element's precision, ties away, at an unbounded exponent.
      const ref::Spec wide{11, el.p};
      const double r = ref::round(a, wide, emu::Rounding::rna, emu::Overflow::inf).value;
      k = ref::floor_log2(ref::real(ref::dyadic(r)).num, ref::real(ref::dyadic(r)).den);
    }
    k -= el.emax();
    k = std::max(k, -127);
    e.scale = std::ldexp(1.0, std::min(k, 127));
    if (k > 127) {
      e.block_flags = emu::OFLO | emu::INEXACT;
      if (overflow != emu::Overflow::saturate) {
        e.block_flags |= emu::INV;
        e.scale = NAN;
      }
    }
  }
  const double total = e.scale * tensor_scale;
  e.scale_flags = e.block_flags;
  for (double x : block) {
    ref::Result r{0.0, 0};
    if (std::isnan(e.scale)) {
      r = {0.0, 0};
    } else if (total == 0) {
      r = {x == 0 ? x : std::copysign(0.0, x), static_cast<emu::Flags>(x == 0 ? 0 : emu::UFLO | emu::INEXACT)};
    } else {
      r = ref::round_in(exact_quotient(x, total), el, mode, overflow);
      if (integer) r.flags &= ~emu::UFLO;
      if (integer && r.value == 0) r.value = 0.0;  // two's complement: no -0
    }
    e.elements.push_back(r.value);
    e.element_flags.push_back(r.flags);
    e.block_flags |= r.flags;
  }
  return e;
}

emu::BlockSpec block_spec(ScaleRule rule, emu::RoundSpec element = {emu::Rounding::rne, emu::Overflow::saturate}) {
  emu::BlockSpec s;
  s.rule = rule;
  s.element = element;
  return s;
}

bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// Blocks with outliers, zeros, tiny and huge values, ties, non-finite values.
std::vector<double> test_values(std::mt19937_64& gen, int kind, std::size_t n) {
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(-1, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(gen);
  switch (kind) {
    case 0: break;
    case 1: v[gen() % n] *= 1000; break;             // an outlier
    case 2: for (auto& x : v) x = std::ldexp(x, -140); break;  // below E8M0's least scale
    case 3: for (auto& x : v) x = std::ldexp(x, 200); break;   // above its largest
    case 4: for (auto& x : v) x = 0; v[0] = -0.0; break;
    case 5: for (auto& x : v) x = std::ldexp(std::round(uniform(gen) * 64) + 0.5, -6); break;  // ties of fine grids
    case 6: v[gen() % n] = NAN; break;
    case 7: v[gen() % n] = -INFINITY; break;
    case 8: for (auto& x : v) x = std::ldexp(uniform(gen), static_cast<int>(gen() % 40) - 20); break;  // wide range
    case 9: v[0] = 6.0; v[1] = 7.0; v[2] = -7.5; break;  // near FP4's max
  }
  return v;
}

}  // namespace

TEST_CASE("block quantisation matches the exact model: every format, rule, mode, policy", "[block]") {
  std::mt19937_64 gen(2026);
  long blocks = 0, mismatches = 0;
  const emu::Rounding modes[] = {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::rz, emu::Rounding::ru,
                                 emu::Rounding::rd,  emu::Rounding::ro};
  for (const char* const* name = emu::block_format_names(); *name != nullptr; ++name) {
    const emu::BlockFormat& f = emu::block_format_by_name(*name);
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::up, ScaleRule::nearest}) {
      if (!f.accepts(rule)) {
        CHECK_THROWS_AS(emu::quantize(f, std::vector<double>{1.0}, block_spec(rule), nullptr),
                        std::invalid_argument);
        continue;
      }
      for (emu::Rounding mode : modes)
        for (emu::Overflow overflow : {emu::Overflow::saturate, emu::Overflow::nan, emu::Overflow::inf})
          for (int kind = 0; kind < 10; ++kind) {
            // Three blocks and a short one.
            const std::size_t n = 3 * static_cast<std::size_t>(f.block_size()) + 5;
            const std::vector<double> v = test_values(gen, kind, n);
            const emu::BlockSpec spec = block_spec(rule, emu::RoundSpec{mode, overflow});
            const emu::BlockQuantized q = emu::quantize(f, v, spec, nullptr);
            double t = 1;
            if (f.has_tensor_scale()) {
              double a = 0;
              for (double x : v)
                if (std::isfinite(x)) a = std::max(a, std::fabs(x));
              t = a == 0 ? 1.0
                         : ref::round(ref::quotient(a, 6.0 * 448.0), kFp32, emu::Rounding::ru, emu::Overflow::saturate).value;
            }
            CHECK(q.tensor_scale == t);
            REQUIRE(q.scales.size() == 4);
            for (std::size_t b = 0; b < q.scales.size(); ++b) {
              ++blocks;
              const std::size_t first = b * static_cast<std::size_t>(f.block_size());
              const std::vector<double> block(v.begin() + static_cast<long>(first),
                                              v.begin() + static_cast<long>(std::min(n, first + f.block_size())));
              const Expected want = model_block(*name, block, rule, mode, overflow, t);
              bool ok = same(q.scales[b].value, want.scale) && q.scales[b].flags == want.block_flags &&
                        q.scales[b].scale_flags == want.scale_flags &&
                        q.scales[b].bits == f.scale().encode(want.scale);
              for (std::size_t i = 0; i < block.size(); ++i) {
                ok = ok && same(q.elements[first + i], want.elements[i]) &&
                     q.element_flags[first + i] == want.element_flags[i] &&
                     q.element_bits[first + i] == f.encode_element(want.elements[i]);
                // Dequantisation is exact: element * scale * tensor scale.
                const double value = q.value(first + i, f);
                ok = ok && same(value, want.elements[i] * want.scale * t);
              }
              if (!ok && ++mismatches < 6)
                UNSCOPED_INFO(*name << " " << emu::scale_rule_name(rule) << " " << emu::rounding_name(mode) << " "
                                    << emu::overflow_name(overflow) << " kind " << kind << " block " << b << ": scale "
                                    << q.scales[b].value << " flags " << int(q.scales[b].flags) << ", model "
                                    << want.scale << " flags " << int(want.block_flags));
            }
          }
    }
  }
  INFO(blocks << " blocks");
  CHECK(mismatches == 0);
  CHECK(blocks > 5000);
}

TEST_CASE("block scale rules on worked examples", "[block]") {
  const emu::BlockFormat& fp4 = emu::block_format_by_name("mxfp4-e2m1");
  auto scale = [&](ScaleRule rule, double amax) {
    return emu::quantize(fp4, std::vector<double>{amax, 0.5}, block_spec(rule), nullptr).scales[0].value;
  };
  // FP4 E2M1: max 6 = 1.5 * 2^2, emax_elem 2 (OCP MX v1.0 6.3: X = 2^(floor(log2 amax) - 2)).
  CHECK(scale(ScaleRule::floor, 6.0) == 1.0);
  CHECK(scale(ScaleRule::floor, 7.0) == 1.0);    // 7 saturates to 6
  CHECK(scale(ScaleRule::ceil, 7.0) == 2.0);     // 2^(3 - 2)
  CHECK(scale(ScaleRule::ceil, 4.0) == 1.0);     // a power of two: ceil = floor
  CHECK(scale(ScaleRule::even, 7.0) == 2.0);     // 7 = 1.75 * 4 rounds (1 bit, ties away) to 8
  CHECK(scale(ScaleRule::even, 5.0) == 1.0);     // 1.25 * 4 rounds to 1.5 * 4
  CHECK(scale(ScaleRule::up, 6.0) == 1.0);       // 6 / 6 = 1 exactly
  CHECK(scale(ScaleRule::up, 6.5) == 2.0);       // 6.5 / 6 rounded up to a power of two
  CHECK(scale(ScaleRule::nearest, 8.9) == 1.0);  // 8.9 / 6 = 1.48: nearer 1
  CHECK(scale(ScaleRule::nearest, 9.0) == 2.0);  // 1.5 exactly: ties go up (significand 1 is odd)
  const emu::BlockQuantized q = emu::quantize(fp4, std::vector<double>{7.0, -3.2, 0.2}, emu::BlockSpec{}, nullptr);
  CHECK(q.elements[0] == 6.0);
  CHECK((q.element_flags[0] & emu::OFLO) != 0);
  CHECK(q.elements[1] == -3.0);
  CHECK(q.elements[2] == 0.0);  // 0.2 is below half the least subnormal 0.5: rne gives 0
  CHECK(q.element_bits[1] == 0b1'10'1);
  CHECK(q.scales[0].bits == 0x7f);  // E8M0 127 = 2^0

  // NVFP4 (16 elements, UE4M3 scale, fp32 tensor scale amax / (6 * 448)): an array of
  // 2688 = 6 * 448 has tensor scale 1; a block with amax 3 has scale 3 / 6 = 0.5.
  const emu::BlockFormat& nv = emu::block_format_by_name("nvfp4");
  std::vector<double> v(32, 0.0);
  v[0] = 2688;
  v[16] = 3;
  v[17] = 1.1;
  const emu::BlockQuantized n = emu::quantize(nv, v, emu::default_block_spec(nv), nullptr);
  CHECK(n.tensor_scale == 1.0);
  CHECK(n.scales[0].value == 448);
  CHECK(n.scales[1].value == 0.5);
  CHECK(n.scales[1].bits == 0x30);  // 0b0110'000 = 2^(6 - 7)
  CHECK(n.elements[16] == 6.0);
  CHECK(n.elements[17] == 2.0);  // 1.1 / 0.5 = 2.2 -> 2
  CHECK(n.value(17, nv) == 1.0);
  CHECK_THROWS_AS(emu::quantize(nv, v, block_spec(ScaleRule::floor), nullptr), std::invalid_argument);
  emu::BlockSpec given = emu::default_block_spec(nv);
  given.tensor_scale = 0.1;  // not an fp32 value
  CHECK_THROWS_AS(emu::quantize(nv, v, given, nullptr), std::invalid_argument);
  given.tensor_scale = 2.0;
  CHECK(emu::quantize(nv, v, given, nullptr).tensor_scale == 2.0);
  emu::BlockSpec mx_with_tensor_scale;
  mx_with_tensor_scale.tensor_scale = 1.0;
  CHECK_THROWS_AS(emu::quantize(fp4, v, mx_with_tensor_scale, nullptr), std::invalid_argument);
}

TEST_CASE("MXINT8 elements are two's complement k/64", "[block]") {
  // OCP MX v1.0 5.3.3: 8-bit two's complement with an implicit scale of 2^-6.
  const emu::BlockFormat& f = emu::block_format_by_name("mxint8");
  CHECK(f.element_emax() == 0);
  CHECK(f.element().max_finite() == 127.0 / 64);
  CHECK(f.element_width() == 8);
  CHECK(f.encode_element(-1.0) == 0xc0);
  CHECK(f.encode_element(127.0 / 64) == 0x7f);
  CHECK(f.encode_element(-127.0 / 64) == 0x81);
  CHECK(f.decode_element(0x80) == -2.0);  // valid, never produced
  for (std::uint64_t bits = 0; bits < 256; ++bits)
    if (bits != 0x80) CHECK(f.encode_element(f.decode_element(bits)) == bits);
  // 1.999 in a block of amax 1.999: X = 2^0, 1.999 rounds to 2 and saturates to 127/64.
  const emu::BlockQuantized q = emu::quantize(f, std::vector<double>{1.999, -1.999, 0.01}, emu::BlockSpec{}, nullptr);
  CHECK(q.elements[0] == 127.0 / 64);
  CHECK(q.elements[1] == -127.0 / 64);
  CHECK(q.element_bits[1] == 0x81);
  CHECK(q.elements[2] == 1.0 / 64);
  CHECK((q.element_flags[2] & emu::UFLO) == 0);  // no underflow on a fixed-point grid
}

TEST_CASE("stochastic rounding of block elements is unbiased; with few bits biased toward zero", "[block][stochastic]") {
  const emu::BlockFormat& f = emu::block_format_by_name("mxfp4-e2m1");
  std::vector<double> v(32);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.37 + 0.19 * static_cast<double>(i);  // amax 6.26 -> X = 1
  constexpr int kDraws = 4000;
  for (int bits : {0, 2}) {
    emu::Rng rng(emu::StreamId{7});
    const emu::BlockSpec spec = block_spec(ScaleRule::floor, emu::RoundSpec{emu::Rounding::sr, emu::Overflow::saturate, bits});
    std::vector<double> sum(v.size(), 0.0);
    for (int d = 0; d < kDraws; ++d) {
      const std::vector<double> r = emu::dequantize(f, emu::quantize(f, v, spec, &rng));
      for (std::size_t i = 0; i < v.size(); ++i) sum[i] += r[i];
    }
    for (std::size_t i = 0; i + 2 < v.size(); ++i) {  // the last two exceed 6 and saturate
      const double mean = sum[i] / kDraws;
      // The two neighbours of x: their spacing bounds the standard deviation.
      const double x = v[i], ulp = x < 1 ? 0.5 : (x < 2 ? 0.5 : (x < 4 ? 1.0 : 2.0));
      const double sd = ulp / 2 / std::sqrt(kDraws);
      INFO("sr_bits " << bits << " x " << x << " mean " << mean);
      if (bits == 0) {
        CHECK(std::fabs(mean - x) < 5 * sd);
      } else {
        // P(up) = floor(f 4) / 4: the mean lies below x by (f - floor(4 f) / 4) ulp.
        const double lo = std::floor(x / ulp) * ulp, frac = (x - lo) / ulp;
        const double expected = lo + std::floor(4 * frac) / 4 * ulp;
        CHECK(std::fabs(mean - expected) < 5 * sd);
      }
    }
  }
}
