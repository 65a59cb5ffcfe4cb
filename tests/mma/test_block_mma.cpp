// The block-scaled MMA (emu/block_mma.hpp, Blackwell's kind::mxf8f6f4 and
// kind::mxf4/mxf4nvf4) against an exact model of its documented behaviour written here
// with Boost.Multiprecision: operands decoded from their bit patterns by this file's own
// decoder, terms formed and aligned as the PTX ISA and MMA-Sim describe them (products
// with both scales' exponents; fp4 groups of 16 with the scales' exponents alone),
// truncated to 25 or 35 bits below the largest exponent, added exactly, rounded toward
// zero into fp32, instructions of 32 or 64 chained through fp32. There is no measured
// data for these instructions: the model is the documented one, nothing more. nvfp4's
// tensor-scale epilogue against the host's fp32 rounding and fmaf.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// GCC 12 reports false -Warray-bounds positives inside Boost.Multiprecision.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_bin_float.hpp>
#pragma GCC diagnostic pop

#include "emu/block.hpp"
#include "emu/block_mma.hpp"

namespace {

namespace mp = boost::multiprecision;
// Every value here lies within 2^-700 .. 2^700 and every sum the model forms is of
// terms cut to one grid spanning fewer than 64 bits: 256 bits hold them all exactly.
using Big = mp::number<mp::cpp_bin_float<256, mp::digit_base_2, void, std::int32_t, -4000, 4000>, mp::et_off>;

using emu::BlockFormat;
using emu::BlockMmaKind;
using emu::BlockQuantized;
using emu::Flags;
using emu::UnitKind;

double p2(int e) { return std::ldexp(1.0, e); }
std::uint32_t fp32_bits(double x) { return std::bit_cast<std::uint32_t>(static_cast<float>(x)); }

// ---- This file's own decoder of the element and scale formats --------------------------

struct Layout {
  int exponent_bits, fraction_bits, bias;
  bool is_signed;
  enum class Special { none, ocp_fn, ieee, all_ones } special;  // where NaN (and inf) are
  bool subnormals;                                               // false: e8m0
  int width() const { return (is_signed ? 1 : 0) + exponent_bits + fraction_bits; }
  int emin() const { return subnormals ? 1 - bias : -bias; }     // exponent of the least normal
};

const Layout kE4M3{4, 3, 7, true, Layout::Special::ocp_fn, true};
const Layout kE5M2{5, 2, 15, true, Layout::Special::ieee, true};
const Layout kE2M3{2, 3, 1, true, Layout::Special::none, true};
const Layout kE3M2{3, 2, 3, true, Layout::Special::none, true};
const Layout kE2M1{2, 1, 1, true, Layout::Special::none, true};
const Layout kE8M0{8, 0, 127, false, Layout::Special::all_ones, false};
const Layout kUE4M3{4, 3, 7, false, Layout::Special::all_ones, true};

const Layout& element_layout(const std::string& block_format) {
  if (block_format == "mxfp8-e4m3") return kE4M3;
  if (block_format == "mxfp8-e5m2") return kE5M2;
  if (block_format == "mxfp6-e2m3") return kE2M3;
  if (block_format == "mxfp6-e3m2") return kE3M2;
  return kE2M1;  // mxfp4-e2m1, nvfp4
}
const Layout& scale_layout(const std::string& block_format) { return block_format == "nvfp4" ? kUE4M3 : kE8M0; }
int block_size_of(const std::string& block_format) { return block_format == "nvfp4" ? 16 : 32; }

// A decoded value: NaN and infinity apart, finite values exact.
struct Value {
  bool nan = false, inf = false, negative = false;
  Big magnitude = 0;
};

Value decode(const Layout& l, std::uint64_t bits) {
  const int magnitude_bits = l.exponent_bits + l.fraction_bits;
  const std::uint64_t field = bits & ((std::uint64_t{1} << magnitude_bits) - 1);
  const std::uint64_t e = field >> l.fraction_bits, m = field & ((std::uint64_t{1} << l.fraction_bits) - 1);
  const std::uint64_t all_ones = (std::uint64_t{1} << magnitude_bits) - 1, top = (std::uint64_t{1} << l.exponent_bits) - 1;
  Value v;
  v.negative = l.is_signed && ((bits >> magnitude_bits) & 1) != 0;
  switch (l.special) {
    case Layout::Special::none: break;
    case Layout::Special::ocp_fn:  // S.1111.111 is NaN, no infinities
    case Layout::Special::all_ones: v.nan = field == all_ones; break;
    case Layout::Special::ieee:
      v.inf = e == top && m == 0;
      v.nan = e == top && m != 0;
      break;
  }
  if (v.nan || v.inf) return v;
  if (!l.subnormals) {
    v.magnitude = mp::ldexp(Big(1), static_cast<int>(e) - l.bias);
  } else if (e == 0) {
    v.magnitude = mp::ldexp(Big(static_cast<double>(m)), 1 - l.bias - l.fraction_bits);
  } else {
    v.magnitude = mp::ldexp(Big(static_cast<double>(m + (std::uint64_t{1} << l.fraction_bits))),
                            static_cast<int>(e) - l.bias - l.fraction_bits);
  }
  return v;
}

Big signed_value(const Value& v) { return v.negative ? Big(-v.magnitude) : v.magnitude; }

int floor_log2(const Big& x) {  // x > 0
  int e = 0;
  mp::frexp(x, &e);  // x = f 2^e, f in [1/2, 1)
  return e - 1;
}

// The exponent the documented adder aligns a non-zero value with: its own, clamped at
// its format's emin (subnormals keep emin).
int aligned(const Big& magnitude, const Layout& l) { return std::max(floor_log2(magnitude), l.emin()); }

// ---- Operands: bit patterns, as the unit gets them and as the oracle reads them ---------

struct Operand {
  std::string format;
  std::vector<std::uint64_t> elements;  // bit patterns
  std::vector<std::uint64_t> scales;    // one per block of block_size_of(format)
};

// The BlockQuantized the unit takes: emu's own decoding of the same bits (so that the
// two decoders are compared too).
BlockQuantized quantized(const Operand& o) {
  const BlockFormat& f = emu::block_format_by_name(o.format);
  BlockQuantized q;
  q.element_bits = o.elements;
  for (std::uint64_t bits : o.elements) q.elements.push_back(f.decode_element(bits));
  q.element_flags.assign(o.elements.size(), 0);
  for (std::uint64_t bits : o.scales) {
    emu::BlockScale s;
    s.bits = bits;
    s.value = f.scale().decode(bits);
    q.scales.push_back(s);
  }
  return q;
}

// ---- The oracle: the documented model, step by step ------------------------------------

struct Result {
  double value = 0;
  Flags flags = 0;
};

// x rounded toward zero into fp32 with gradual underflow; past 2^128 infinity with OFLO
// (the documented overflow). UFLO where x is below 2^-126 and bits are lost.
Result fp32_rz(const Big& x) {
  if (x == 0) return {0.0, 0};
  const Big magnitude = mp::abs(x);
  if (magnitude >= mp::ldexp(Big(1), 128))
    return {x < 0 ? -HUGE_VAL : HUGE_VAL, emu::OFLO | emu::INEXACT};
  const int q = std::max(floor_log2(magnitude), -126) - 23;
  const Big kept = mp::ldexp(mp::trunc(mp::ldexp(magnitude, -q)), q);
  Result r;
  r.value = kept.convert_to<double>();  // exact: 24 bits
  if (x < 0) r.value = -r.value;
  if (kept != magnitude) r.flags = magnitude < mp::ldexp(Big(1), -126) ? (emu::UFLO | emu::INEXACT) : emu::INEXACT;
  return r;
}

struct Oracle {
  BlockMmaKind kind;
  int instruction_k() const { return kind == BlockMmaKind::mxf8f6f4 ? 32 : 64; }
  int kept_bits() const { return kind == BlockMmaKind::mxf8f6f4 ? 25 : 35; }
  static constexpr int kGroup = 16;

  // One instruction over products [first, first + count) with accumulator c (fp32).
  Result instruction(const Operand& a, const Operand& b, std::size_t first, std::size_t count, double c,
                     Flags& flags) const {
    const Layout &ea = element_layout(a.format), &eb = element_layout(b.format);
    const Layout &sa = scale_layout(a.format), &sb = scale_layout(b.format);
    const std::size_t bsa = block_size_of(a.format), bsb = block_size_of(b.format);
    struct Term {
      Big value;
      int exponent;
    };
    std::vector<Term> terms;
    if (c != 0) terms.push_back({Big(c), std::max(floor_log2(mp::abs(Big(c))), -126)});
    if (kind == BlockMmaKind::mxf8f6f4) {
      // Every non-zero product with its blocks' scales folded into its exponent.
      for (std::size_t i = first; i < first + count; ++i) {
        const Value x = decode(ea, a.elements[i]), y = decode(eb, b.elements[i]);
        const Value s = decode(sa, a.scales[i / bsa]), t = decode(sb, b.scales[i / bsb]);
        if (x.magnitude == 0 || y.magnitude == 0) continue;
        terms.push_back({signed_value(x) * signed_value(y) * s.magnitude * t.magnitude,
                         aligned(x.magnitude, ea) + aligned(y.magnitude, eb) + floor_log2(s.magnitude) +
                             floor_log2(t.magnitude)});
      }
    } else {
      // Each group of 16: its exact sum times its two scales, with the scales' exponents.
      for (std::size_t g = first; g < first + count; g += kGroup) {
        Big sum = 0;
        for (std::size_t i = g; i < std::min(g + kGroup, first + count); ++i)
          sum += signed_value(decode(ea, a.elements[i])) * signed_value(decode(eb, b.elements[i]));
        const Value s = decode(sa, a.scales[g / bsa]), t = decode(sb, b.scales[g / bsb]);
        if (sum == 0 || s.magnitude == 0 || t.magnitude == 0) continue;
        terms.push_back({sum * s.magnitude * t.magnitude, aligned(s.magnitude, sa) + aligned(t.magnitude, sb)});
      }
    }
    if (terms.empty()) return {0.0, 0};
    int e = terms.front().exponent;
    for (const Term& t : terms) e = std::max(e, t.exponent);
    const Big quantum = mp::ldexp(Big(1), e - kept_bits());
    Big sum = 0;
    for (const Term& t : terms) {
      const Big units = t.value / quantum;  // exact: a power of two
      const Big cut = mp::trunc(units);
      if (cut != units) flags |= emu::INEXACT;
      sum += cut;
    }
    return fp32_rz(sum * quantum);
  }

  // The whole dot product: NaN where a factor or c is NaN (finite cases only otherwise).
  Result dot(const Operand& a, const Operand& b, double c) const {
    Flags flags = 0;
    const std::size_t k = a.elements.size();
    for (std::size_t first = 0; first < k && std::isfinite(c); first += instruction_k()) {
      const Result r = instruction(a, b, first, std::min<std::size_t>(instruction_k(), k - first), c, flags);
      c = r.value;
      flags |= r.flags;
    }
    return {c, flags};
  }
};

// ---- Random operands ---------------------------------------------------------------------

struct Generator {
  std::mt19937_64 rng;
  explicit Generator(std::uint64_t seed) : rng(seed) {}

  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng); }

  // A finite element: zeros, subnormals and the largest magnitude often; any sign.
  std::uint64_t element(const Layout& l) {
    const int magnitude_bits = l.exponent_bits + l.fraction_bits;
    const std::uint64_t sign = std::uint64_t{1} << magnitude_bits;
    std::uint64_t largest = (std::uint64_t{1} << magnitude_bits) - 1;  // E4M3: 0x7f is NaN
    if (l.special == Layout::Special::ocp_fn) largest -= 1;
    if (l.special == Layout::Special::ieee) largest = ((std::uint64_t{1} << l.exponent_bits) - 2) << l.fraction_bits | ((std::uint64_t{1} << l.fraction_bits) - 1);
    std::uint64_t field = 0;
    const int pick = uniform(0, 99);
    if (pick < 18) field = 0;
    else if (pick < 28) field = largest;
    else if (pick < 42) field = static_cast<std::uint64_t>(uniform(1, (1 << l.fraction_bits) - 1));  // subnormal
    else field = static_cast<std::uint64_t>(uniform(0, static_cast<int>(largest)));
    return field | (chance(0.5) ? sign : 0);
  }

  // A scale: narrow (terms overlap), wide or extreme E8M0 exponents; UE4M3 anywhere but NaN.
  std::uint64_t scale(const Layout& l, int mode) {
    if (l.exponent_bits == 4) {  // UE4M3
      const int pick = uniform(0, 9);
      if (pick == 0) return 0;                              // zero scale
      if (pick == 1) return static_cast<std::uint64_t>(uniform(1, 7));  // subnormal
      if (pick == 2) return 0x7e;                           // 448
      return static_cast<std::uint64_t>(uniform(0, 0x7e));
    }
    switch (mode) {
      case 0: return static_cast<std::uint64_t>(127 + uniform(-6, 6));
      case 1: return static_cast<std::uint64_t>(uniform(0, 254));
      default: {
        const int extremes[] = {0, 1, 2, 252, 253, 254};
        return static_cast<std::uint64_t>(chance(0.5) ? extremes[uniform(0, 5)] : 127 + uniform(-40, 40));
      }
    }
  }

  Operand operand(const std::string& format, std::size_t k, int scale_mode) {
    Operand o;
    o.format = format;
    for (std::size_t i = 0; i < k; ++i) o.elements.push_back(element(element_layout(format)));
    const std::size_t bs = block_size_of(format);
    for (std::size_t b = 0; b < (k + bs - 1) / bs; ++b) o.scales.push_back(scale(scale_layout(format), scale_mode));
    return o;
  }

  // c: zero, an fp32 value near 2^near, a subnormal, or any finite fp32 pattern.
  double c(int near) {
    const int pick = uniform(0, 9);
    if (pick < 3) return 0.0;
    if (pick < 7) {
      const int e = std::clamp(near + uniform(-30, 5), -149, 127);
      const double x = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), e);
      return (chance(0.5) ? -1 : 1) * static_cast<double>(static_cast<float>(x));  // an fp32 value
    }
    if (pick < 8) return std::ldexp(static_cast<double>(uniform(1, (1 << 23) - 1)), -149) * (chance(0.5) ? -1 : 1);
    std::uint32_t bits = 0;
    do bits = static_cast<std::uint32_t>(rng()); while (((bits >> 23) & 0xff) == 0xff);
    return std::bit_cast<float>(bits);
  }
};

// c rounded to fp32 (rne) from a Big, for c that cancels the products.
double nearest_fp32(const Big& x) { return static_cast<double>(static_cast<float>(x.convert_to<double>())); }

Big exact_dot(const Operand& a, const Operand& b) {
  Big sum = 0;
  for (std::size_t i = 0; i < a.elements.size(); ++i)
    sum += signed_value(decode(element_layout(a.format), a.elements[i])) *
           decode(scale_layout(a.format), a.scales[i / block_size_of(a.format)]).magnitude *
           signed_value(decode(element_layout(b.format), b.elements[i])) *
           decode(scale_layout(b.format), b.scales[i / block_size_of(b.format)]).magnitude;
  return sum;
}

// Runs `cases` random dot products of `formats` pairs through the preset unit and the
// oracle; returns how many differed (the first few are reported).
int compare_random(BlockMmaKind kind, const std::vector<std::pair<std::string, std::string>>& formats,
                   std::uint64_t seed, int cases, bool preset = true) {
  Generator gen(seed);
  const Oracle oracle{kind};
  const std::size_t ks[] = {32, 64, 96, 128, 40, 17, 1};
  int mismatches = 0;
  for (int n = 0; n < cases; ++n) {
    const auto& [fa, fb] = formats[static_cast<std::size_t>(gen.uniform(0, static_cast<int>(formats.size()) - 1))];
    const std::size_t k = ks[gen.uniform(0, 6)];
    const int scale_mode = gen.uniform(0, 2);
    Operand a = gen.operand(fa, k, scale_mode), b = gen.operand(fb, k, scale_mode);
    // Cancellation: pairs of products of opposite signs within one block (B's element
    // negated where A's repeats), and c against the exact sum.
    if (gen.chance(0.3) && fa == fb) {
      const Layout& l = element_layout(fa);
      const std::uint64_t sign = std::uint64_t{1} << (l.exponent_bits + l.fraction_bits);
      for (std::size_t i = 1; i < k; i += 2)
        if ((i - 1) / block_size_of(fa) == i / block_size_of(fa) && gen.chance(0.8)) {
          a.elements[i] = a.elements[i - 1];
          b.elements[i] = b.elements[i - 1] ^ sign;
        }
    }
    const Big exact = exact_dot(a, b);
    double c = 0;
    const double approx = exact.convert_to<double>();
    if (gen.chance(0.2) && std::isfinite(approx) && std::fabs(approx) < 0x1p127) c = -nearest_fp32(exact);
    else c = gen.c(approx != 0 && std::isfinite(approx) ? std::clamp(std::ilogb(approx), -149, 127) : 0);

    const BlockFormat &bfa = emu::block_format_by_name(fa), &bfb = emu::block_format_by_name(fb);
    const emu::BlockMmaParams params =
        preset ? emu::block_mma_params(UnitKind::b200, bfa, bfb)
               : emu::BlockMmaParams{kind, kind == BlockMmaKind::mxf8f6f4 ? 32 : 64,
                                     kind == BlockMmaKind::mxf8f6f4 ? 1 : 16, kind == BlockMmaKind::mxf8f6f4 ? 25 : 35,
                                     emu::Rounding::rz};
    const emu::BlockMmaUnit unit(UnitKind::b200, bfa, bfb, params);
    emu::Context ctx;
    const double got = unit.dot(ctx, quantized(a), quantized(b), c);
    const Result want = oracle.dot(a, b, c);
    const bool same = (std::isnan(got) && std::isnan(want.value)) ||
                      (got == want.value && std::signbit(got) == std::signbit(want.value));
    if (!same || ctx.status() != want.flags) {
      if (++mismatches <= 5) {
        std::string elements;
        for (std::size_t i = 0; i < k; ++i)
          elements += std::to_string(a.elements[i]) + "*" + std::to_string(b.elements[i]) + " ";
        std::string scales;
        for (std::size_t i = 0; i < a.scales.size(); ++i) scales += std::to_string(a.scales[i]) + " ";
        scales += "| ";
        for (std::size_t i = 0; i < b.scales.size(); ++i) scales += std::to_string(b.scales[i]) + " ";
        UNSCOPED_INFO(fa << " x " << fb << " k " << k << " c " << c << ": got " << got << " flags "
                         << ctx.status() << ", documented model " << want.value << " flags " << want.flags
                         << "; elements " << elements << "; scales " << scales);
      }
    }
  }
  return mismatches;
}

// Operands from values: elements and scales given as values (encoded by emu's formats).
Operand operand_of(const std::string& format, const std::vector<double>& elements, const std::vector<double>& scales) {
  const BlockFormat& f = emu::block_format_by_name(format);
  Operand o;
  o.format = format;
  for (double x : elements) o.elements.push_back(f.encode_element(x));
  for (double s : scales) o.scales.push_back(f.scale().encode(s));
  return o;
}

Result run_preset(const Operand& a, const Operand& b, double c) {
  const auto unit = emu::make_block_mma_unit(UnitKind::b200, emu::block_format_by_name(a.format),
                                             emu::block_format_by_name(b.format));
  emu::Context ctx;
  const double d = unit->dot(ctx, quantized(a), quantized(b), c);
  return {d, ctx.status()};
}

std::vector<double> zeros_but(std::size_t k, std::vector<std::pair<std::size_t, double>> set) {
  std::vector<double> v(k, 0.0);
  for (const auto& [i, x] : set) v[i] = x;
  return v;
}

const std::vector<std::string> kMxFloat = {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4-e2m1"};

}  // namespace

TEST_CASE("b200 block-scaled presets: the kind follows the block formats", "[block_mma]") {
  using emu::block_format_by_name;
  for (const std::string& a : kMxFloat)
    for (const std::string& b : kMxFloat) {
      const emu::BlockMmaParams p = emu::block_mma_params(UnitKind::b200, block_format_by_name(a), block_format_by_name(b));
      INFO(a << " x " << b);
      if (a == "mxfp4-e2m1" && b == "mxfp4-e2m1") {
        CHECK(p.kind == BlockMmaKind::mxf4nvf4);  // kind::mxf4
        CHECK(p.instruction_k == 64);
        CHECK(p.group_size == 16);
        CHECK(p.kept_fraction_bits == 35);
      } else {
        CHECK(p.kind == BlockMmaKind::mxf8f6f4);
        CHECK(p.instruction_k == 32);
        CHECK(p.group_size == 1);
        CHECK(p.kept_fraction_bits == 25);
      }
      CHECK(p.final_rounding == emu::Rounding::rz);
    }
  const emu::BlockMmaParams nv =
      emu::block_mma_params(UnitKind::b200, block_format_by_name("nvfp4"), block_format_by_name("nvfp4"));
  CHECK(nv.kind == BlockMmaKind::mxf4nvf4);
  CHECK(nv.instruction_k == 64);
  CHECK(nv.group_size == 16);
  CHECK(nv.kept_fraction_bits == 35);
  CHECK(std::string(emu::block_mma_kind_name(nv.kind)) == "mxf4nvf4");

  const BlockFormat &mx8 = block_format_by_name("mxfp8-e4m3"), &nv4 = block_format_by_name("nvfp4"),
                    &int8 = block_format_by_name("mxint8");
  for (UnitKind other : {UnitKind::h100, UnitKind::a100, UnitKind::exact, UnitKind::ipu_amp})
    CHECK_THROWS_WITH(emu::block_mma_params(other, mx8, mx8), Catch::Contains("b200"));
  CHECK_THROWS_WITH(emu::block_mma_params(UnitKind::b200, int8, int8), Catch::Contains("mxint8"));
  CHECK_THROWS_WITH(emu::block_mma_params(UnitKind::b200, mx8, int8), Catch::Contains("mxint8"));
  CHECK_THROWS_WITH(emu::block_mma_params(UnitKind::b200, nv4, mx8), Catch::Contains("one type"));
  // The model refuses what it cannot run.
  emu::BlockMmaParams p = emu::block_mma_params(UnitKind::b200, mx8, mx8);
  CHECK_THROWS(emu::BlockMmaUnit(UnitKind::b200, nv4, nv4, p));  // mxf8f6f4 with UE4M3 scales
  p.final_rounding = emu::Rounding::sr;
  CHECK_THROWS(emu::BlockMmaUnit(UnitKind::b200, mx8, mx8, p));
  p = nv;
  CHECK_THROWS(emu::BlockMmaUnit(UnitKind::b200, mx8, mx8, p));  // mxf4nvf4 with fp8 elements
  p.group_size = 32;                                              // more than nvfp4's block of 16
  CHECK_THROWS(emu::BlockMmaUnit(UnitKind::b200, nv4, nv4, p));
  p = nv;
  p.kept_fraction_bits = 40;  // 4 groups of up to 2304 * 2^40: beyond 2^53
  CHECK_THROWS(emu::BlockMmaUnit(UnitKind::b200, nv4, nv4, p));
}

TEST_CASE("mxf8f6f4, hand-worked: 25 bits below E, scales folded into the exponents", "[block_mma]") {
  SECTION("c one unit of 2^(E-25) survives, three quarters of one do not") {
    // a = (1, -1), b = (1, 1), scales 1: products +1 and -1 (E = 0, units of 2^-25).
    // c = 2^-25 is one unit: kept; sum 2^-25 exactly.
    const Operand a = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 1}, {1, -1}}), {1});
    const Operand b = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 1}, {1, 1}}), {1});
    Result r = run_preset(a, b, p2(-25));
    CHECK(r.value == p2(-25));
    CHECK(r.flags == 0);
    // c = 3 * 2^-27 is 0.75 of a unit: truncated to 0; +0 (not 2.2e-8) with INEXACT.
    r = run_preset(a, b, 3 * p2(-27));
    CHECK(r.value == 0.0);
    CHECK(!std::signbit(r.value));
    CHECK(r.flags == emu::INEXACT);
  }
  SECTION("scale exponents add to the product's") {
    // a0 = 1.5 (exponent 0), b0 = 448 = 1.75 * 2^8, X_A = 2^-100, X_B = 2^-20:
    // product 2.625 * 2^(0 + 8 - 120) = 1.3125 * 2^-111; E = -112, units 2^-137.
    // c = 2^-140 (an fp32 subnormal) is 1/8 unit: cut. d = 1.3125 * 2^-111, INEXACT.
    const Operand a = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 1.5}}), {p2(-100)});
    const Operand b = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 448}}), {p2(-20)});
    const Result r = run_preset(a, b, p2(-140));
    CHECK(r.value == 1.3125 * p2(-111));
    CHECK(r.flags == emu::INEXACT);
  }
  SECTION("mixed element formats: e2m1 times e3m2") {
    // a0 = 6 (e2m1), b0 = -28 (e3m2 max = 1.75 * 2^4), scales 2^3 and 2^-1:
    // -168 * 4 = -672 exactly, c = 0.5 adds: -671.5.
    const Operand a = operand_of("mxfp4-e2m1", zeros_but(32, {{0, 6}}), {p2(3)});
    const Operand b = operand_of("mxfp6-e3m2", zeros_but(32, {{0, -28}}), {p2(-1)});
    const Result r = run_preset(a, b, 0.5);
    CHECK(r.value == -671.5);
    CHECK(r.flags == 0);
  }
  SECTION("instructions of 32 chain through fp32 (rz)") {
    // e5m2, k = 64, scales 1. Instruction 1: 2 * 1 + (-2^-12) * 2^-12 = 2 - 2^-24,
    // exact in the adder (E = 1, units 2^-24), rz into fp32: 2 - 2^-23 (INEXACT).
    // Instruction 2: c = 2 - 2^-23 plus 2^-12 * 2^-12: 2 - 2^-24 again, rz: 2 - 2^-23.
    // One fused sum of all 64 would give 2 exactly.
    const Operand a = operand_of("mxfp8-e5m2", zeros_but(64, {{0, 2}, {1, -p2(-12)}, {32, p2(-12)}}), {1, 1});
    const Operand b = operand_of("mxfp8-e5m2", zeros_but(64, {{0, 1}, {1, p2(-12)}, {32, p2(-12)}}), {1, 1});
    const Result r = run_preset(a, b, 0.0);
    CHECK(r.value == 2 - p2(-23));
    CHECK(r.flags == emu::INEXACT);
  }
  SECTION("overflow past fp32 is infinity, a subnormal result keeps 2^-149's grid") {
    // 448 * 448 * 2^127 * 2^127 = 1.53 * 2^271: +inf with OFLO and INEXACT.
    const Operand big = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 448}}), {p2(127)});
    Result r = run_preset(big, big, 0.0);
    CHECK(r.value == HUGE_VAL);
    CHECK(r.flags == (emu::OFLO | emu::INEXACT));
    // 1.125 * 1.125 * 2^-75 * 2^-75 = 1.265625 * 2^-150 = 0.6328125 * 2^-149: rz on
    // fp32's grid of 2^-149 gives +0, with UFLO and INEXACT. With c = 2^-149 (its
    // exponent clamped at -126: E = -126, units of 2^-151): c is 4 units, the product
    // 2.53 units cut to 2; 6 * 2^-151 = 1.5 * 2^-149, rz: 2^-149 (UFLO, INEXACT).
    const Operand tiny = operand_of("mxfp8-e4m3", zeros_but(32, {{0, 1.125}}), {p2(-75)});
    r = run_preset(tiny, tiny, 0.0);
    CHECK(r.value == 0.0);
    CHECK(r.flags == (emu::UFLO | emu::INEXACT));
    r = run_preset(tiny, tiny, p2(-149));
    CHECK(r.value == p2(-149));
    CHECK(r.flags == (emu::UFLO | emu::INEXACT));
  }
}

TEST_CASE("mxf4nvf4, hand-worked: groups of 16 aligned by their scales, 35 bits", "[block_mma]") {
  SECTION("a group's exponent is its scales' (kind::mxf4, mxfp4-e2m1)") {
    // Block 0 (scales 1, 1), group 0: 6*6 + 6*(-6) + 0.5*0.5 = 0.25, exponent 0 + 0 = 0
    // (not 0.25's own -2). c = -0.25 cancels it. Block 1 (scales 2^-20, 2^-15),
    // group 2: 1.5 * 0.5 = 0.75, term 0.75 * 2^-35 = 0.75 units of 2^(0 - 35): cut.
    // d = +0 with INEXACT (exact: 3 * 2^-37; aligned to -2 it would survive).
    const Operand a = operand_of("mxfp4-e2m1", zeros_but(64, {{0, 6}, {1, 6}, {2, 0.5}, {32, 1.5}}), {1, p2(-20)});
    const Operand b = operand_of("mxfp4-e2m1", zeros_but(64, {{0, 6}, {1, -6}, {2, 0.5}, {32, 0.5}}), {1, p2(-15)});
    Result r = run_preset(a, b, -0.25);
    CHECK(r.value == 0.0);
    CHECK(r.flags == emu::INEXACT);
    // Group 2 of 0.5 * 0.5 = 0.25 with scales 2^-20 * 2^-13: 2^-35, one unit: kept.
    const Operand a2 = operand_of("mxfp4-e2m1", zeros_but(64, {{0, 6}, {1, 6}, {2, 0.5}, {32, 0.5}}), {1, p2(-20)});
    const Operand b2 = operand_of("mxfp4-e2m1", zeros_but(64, {{0, 6}, {1, -6}, {2, 0.5}, {32, 0.5}}), {1, p2(-13)});
    r = run_preset(a2, b2, -0.25);
    CHECK(r.value == p2(-35));
    CHECK(r.flags == 0);
  }
  SECTION("nvfp4: UE4M3 scales keep their significands; the tensor scale is not applied") {
    // Group 0: 6 * 6 = 36 with scales 1.5 and 0.625 (values of UE4M3): 36 * 0.9375 =
    // 33.75, exponent 0 + -1. Group 1: 3 * -2 = -6 with scales 448 and 2^-9 (UE4M3's
    // least subnormal, exponent clamped at -6): -6 * 0.875 = -5.25, exponent 8 + -6.
    // c = 1. E = 2, units of 2^-33 hold every term: d = 29.5 exactly.
    const Operand a = operand_of("nvfp4", zeros_but(32, {{0, 6}, {16, 3}}), {1.5, 448});
    const Operand b = operand_of("nvfp4", zeros_but(32, {{0, 6}, {16, -2}}), {0.625, p2(-9)});
    const Result r = run_preset(a, b, 1.0);
    CHECK(r.value == 29.5);
    CHECK(r.flags == 0);
    BlockQuantized qa = quantized(a);
    qa.tensor_scale = 1024;
    const auto unit = emu::make_block_mma_unit(UnitKind::b200, emu::block_format_by_name("nvfp4"),
                                               emu::block_format_by_name("nvfp4"));
    emu::Context ctx;
    CHECK(unit->dot(ctx, qa, quantized(b), 1.0) == 29.5);
  }
  SECTION("a zero UE4M3 scale makes its group no term") {
    // Group 0 has scale 0 on A: no term, though its products are 36. d = c = 0.75.
    const Operand a = operand_of("nvfp4", zeros_but(16, {{0, 6}}), {0.0});
    const Operand b = operand_of("nvfp4", zeros_but(16, {{0, 6}}), {448});
    const Result r = run_preset(a, b, 0.75);
    CHECK(r.value == 0.75);
    CHECK(r.flags == 0);
  }
}

TEST_CASE("block-scaled MMA: NaN and infinity", "[block_mma]") {
  const auto run = [](const std::string& format, BlockQuantized a, BlockQuantized b, double c) {
    const BlockFormat& f = emu::block_format_by_name(format);
    const auto unit = emu::make_block_mma_unit(UnitKind::b200, f, f);
    emu::Context ctx;
    const double d = unit->dot(ctx, a, b, c);
    return Result{d, ctx.status()};
  };
  const Operand ones = operand_of("mxfp8-e4m3", std::vector<double>(32, 1.0), {1});
  // E8M0 0xff is NaN: the whole dot product is NaN, quietly (no flag).
  Operand nan_scale = ones;
  nan_scale.scales[0] = 0xff;
  Result r = run("mxfp8-e4m3", quantized(nan_scale), quantized(ones), 1.0);
  CHECK(std::isnan(r.value));
  CHECK(r.flags == 0);
  // ... even where its block's elements are all zero.
  Operand zeros = operand_of("mxfp8-e4m3", std::vector<double>(32, 0.0), {1});
  zeros.scales[0] = 0xff;
  r = run("mxfp8-e4m3", quantized(zeros), quantized(ones), 1.0);
  CHECK(std::isnan(r.value));
  // A NaN c, a NaN E4M3 element (0x7f).
  r = run("mxfp8-e4m3", quantized(ones), quantized(ones), std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(r.value));
  CHECK(r.flags == 0);
  Operand nan_element = ones;
  nan_element.elements[5] = 0x7f;
  r = run("mxfp8-e4m3", quantized(nan_element), quantized(ones), 0.0);
  CHECK(std::isnan(r.value));
  // UE4M3 0x7f is NaN too (nvfp4).
  const Operand nv = operand_of("nvfp4", std::vector<double>(16, 1.0), {1.0});
  Operand nv_nan = nv;
  nv_nan.scales[0] = 0x7f;
  r = run("nvfp4", quantized(nv), quantized(nv_nan), 0.0);
  CHECK(std::isnan(r.value));
  CHECK(r.flags == 0);
  // E5M2 infinities: inf * 2 * scales = inf; inf * 0 is invalid; inf - inf is invalid;
  // c = -inf with finite products stays -inf.
  Operand inf_a = operand_of("mxfp8-e5m2", zeros_but(32, {{0, 2}}), {1});
  inf_a.elements[0] = 0x7c;  // +inf
  const Operand two = operand_of("mxfp8-e5m2", zeros_but(32, {{0, 2}, {1, 1}}), {p2(-127)});
  r = run("mxfp8-e5m2", quantized(inf_a), quantized(two), 1.0);
  CHECK(r.value == HUGE_VAL);
  CHECK(r.flags == 0);
  const Operand zero_b = operand_of("mxfp8-e5m2", std::vector<double>(32, 0.0), {1});
  r = run("mxfp8-e5m2", quantized(inf_a), quantized(zero_b), 1.0);
  CHECK(std::isnan(r.value));
  CHECK(r.flags == emu::INV);
  r = run("mxfp8-e5m2", quantized(inf_a), quantized(two), -HUGE_VAL);
  CHECK(std::isnan(r.value));
  CHECK(r.flags == emu::INV);
  r = run("mxfp8-e5m2", quantized(two), quantized(two), -HUGE_VAL);
  CHECK(r.value == -HUGE_VAL);
  CHECK(r.flags == 0);
}

TEST_CASE("mxf8f6f4 against the documented model on random blocks", "[block_mma]") {
  std::vector<std::pair<std::string, std::string>> same, mixed;
  for (const std::string& a : kMxFloat)
    for (const std::string& b : kMxFloat) {
      if (a == "mxfp4-e2m1" && b == "mxfp4-e2m1") continue;  // the preset takes kind::mxf4
      (a == b ? same : mixed).emplace_back(a, b);
    }
  CHECK(compare_random(BlockMmaKind::mxf8f6f4, same, 1, 3000) == 0);
  CHECK(compare_random(BlockMmaKind::mxf8f6f4, mixed, 2, 1500) == 0);
  // kind::mxf8f6f4 also takes e2m1 on both sides (not the preset's choice).
  CHECK(compare_random(BlockMmaKind::mxf8f6f4, {{"mxfp4-e2m1", "mxfp4-e2m1"}}, 3, 500, false) == 0);
}

TEST_CASE("mxf4nvf4 against the documented model on random blocks", "[block_mma]") {
  CHECK(compare_random(BlockMmaKind::mxf4nvf4, {{"nvfp4", "nvfp4"}}, 4, 3000) == 0);
  CHECK(compare_random(BlockMmaKind::mxf4nvf4, {{"mxfp4-e2m1", "mxfp4-e2m1"}}, 5, 2000) == 0);
}

TEST_CASE("block-scaled MMA from quantize(): gemm equals dot per element, flags per element", "[block_mma]") {
  std::mt19937_64 rng(6);
  std::normal_distribution<double> normal(0, 1);
  for (const std::string name : {"mxfp8-e4m3", "mxfp6-e2m3", "mxfp4-e2m1", "nvfp4"}) {
    INFO(name);
    const BlockFormat& f = emu::block_format_by_name(name);
    const std::size_t m = 3, n = 4, k = 96;
    std::vector<BlockQuantized> rows, cols;
    for (std::size_t i = 0; i < m; ++i) {
      std::vector<double> v(k);
      for (double& x : v) x = normal(rng) * (i == 2 ? 1e-30 : 1.0);  // row 2 far below
      rows.push_back(emu::quantize(f, v, emu::default_block_spec(f), nullptr));
    }
    for (std::size_t j = 0; j < n; ++j) {
      std::vector<double> v(k);
      for (double& x : v) x = normal(rng) * 1e3;
      cols.push_back(emu::quantize(f, v, emu::default_block_spec(f), nullptr));
    }
    const auto unit = emu::make_block_mma_unit(UnitKind::b200, f, f);
    std::vector<double> C(m * n);
    for (std::size_t e = 0; e < m * n; ++e) C[e] = static_cast<float>(normal(rng));
    std::vector<double> D = C;
    emu::FpControl control;
    control.counted = emu::INEXACT;
    emu::Context gemm_ctx(control);
    unit->gemm(gemm_ctx, rows, cols, D.data(), n);
    Flags all = 0;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        emu::Context ctx;
        const double d = unit->dot(ctx, rows[i], cols[j], C[i * n + j]);
        CHECK(fp32_bits(d) == fp32_bits(D[i * n + j]));
        all |= ctx.status();
        // The oracle, on the quantised operands' bits.
        Operand a{name, rows[i].element_bits, {}}, b{name, cols[j].element_bits, {}};
        for (const emu::BlockScale& s : rows[i].scales) a.scales.push_back(s.bits);
        for (const emu::BlockScale& s : cols[j].scales) b.scales.push_back(s.bits);
        const Result want = Oracle{emu::block_mma_params(UnitKind::b200, f, f).kind}.dot(a, b, C[i * n + j]);
        CHECK(fp32_bits(d) == fp32_bits(want.value));
        CHECK(ctx.status() == want.flags);
      }
    CHECK(gemm_ctx.status() == all);
    // INEXACT counted once per element that raised it.
    std::uint64_t inexact_elements = 0;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        emu::Context ctx;
        unit->dot(ctx, rows[i], cols[j], C[i * n + j]);
        inexact_elements += (ctx.status() & emu::INEXACT) != 0;
      }
    std::uint64_t counted = 0;
    for (const auto& c : gemm_ctx.counts()) counted += c.flag == emu::INEXACT ? c.count : 0;
    CHECK(counted == inexact_elements);
  }
  // Bad shapes and c outside fp32.
  const BlockFormat& f = emu::block_format_by_name("mxfp8-e4m3");
  const auto unit = emu::make_block_mma_unit(UnitKind::b200, f, f);
  const std::vector<double> v32(32, 1.0), v33(33, 1.0);
  const BlockQuantized q32 = emu::quantize(f, v32, emu::default_block_spec(f), nullptr);
  const BlockQuantized q33 = emu::quantize(f, v33, emu::default_block_spec(f), nullptr);
  emu::Context ctx;
  CHECK_THROWS_WITH(unit->dot(ctx, q32, q33, 0.0), Catch::Contains("33"));
  CHECK_THROWS_WITH(unit->dot(ctx, q32, q32, 0.1), Catch::Contains("fp32"));
  CHECK(unit->dot(ctx, q32, q32, 0.0) == 32.0);
}

TEST_CASE("nvfp4's tensor-scale epilogue: alpha = fp32(ts_a ts_b), then one fp32 fma; MX has none", "[block_mma]") {
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal(0, 1);
  const BlockFormat& f = emu::block_format_by_name("nvfp4");
  const auto unit = emu::make_block_mma_unit(UnitKind::b200, f, f);
  // Tensor scales whose product is no fp32 value (alpha rounds), as quantize takes them.
  const double ts_a = static_cast<float>(0.0013), ts_b = static_cast<float>(3.7e-3);
  REQUIRE(static_cast<double>(static_cast<float>(ts_a * ts_b)) != ts_a * ts_b);
  emu::BlockSpec spec_a = emu::default_block_spec(f), spec_b = spec_a;
  spec_a.tensor_scale = ts_a;
  spec_b.tensor_scale = ts_b;
  const std::size_t m = 3, n = 3, k = 160;
  std::vector<BlockQuantized> rows, cols;
  for (std::size_t i = 0; i < m; ++i) {
    std::vector<double> v(k);
    for (double& x : v) x = normal(rng) * 10;
    rows.push_back(emu::quantize(f, v, spec_a, nullptr));
  }
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> v(k);
    for (double& x : v) x = normal(rng) * 10;
    cols.push_back(emu::quantize(f, v, spec_b, nullptr));
  }
  const emu::TensorScaleEpilogue epilogue = unit->tensor_scale_epilogue(ts_a, ts_b);
  CHECK(epilogue.applies);
  // The host rounds the exact double product of two fp32 values once, to nearest even.
  CHECK(epilogue.alpha == static_cast<float>(ts_a * ts_b));
  CHECK(epilogue.alpha_flags == emu::INEXACT);

  std::vector<double> C(m * n), D(m * n);
  for (double& c : C) c = static_cast<float>(normal(rng) * 1e-4);
  D = C;
  emu::Context gemm_ctx;
  unit->gemm(gemm_ctx, rows, cols, D.data(), n, epilogue);
  Flags all = 0;
  bool some_inexact_epilogue = false;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const double c = C[i * n + j];
      emu::Context mma_ctx;
      const double r = unit->dot(mma_ctx, rows[i], cols[j], 0.0);  // the MMA from zero
      // One fp32 fma with one rounding (glibc's fmaf rounds once, to nearest even).
      const float want = std::fmaf(static_cast<float>(epilogue.alpha), static_cast<float>(r), static_cast<float>(c));
      emu::Context ctx;
      const double d = unit->dot(ctx, rows[i], cols[j], c, epilogue);
      CHECK(fp32_bits(d) == std::bit_cast<std::uint32_t>(want));
      CHECK(fp32_bits(D[i * n + j]) == fp32_bits(d));
      all |= ctx.status();
      // alpha * r is exact in double: the fma's rounding shows where the sum is no fp32 value.
      some_inexact_epilogue = some_inexact_epilogue || static_cast<double>(want) != epilogue.alpha * r + c;
      // The fma rounds under the context: ru and rd bracket rne.
      emu::FpControl up, down;
      up.rounding = emu::Rounding::ru;
      down.rounding = emu::Rounding::rd;
      emu::Context ctx_up(up), ctx_down(down);
      const double d_up = unit->dot(ctx_up, rows[i], cols[j], c, epilogue);
      const double d_down = unit->dot(ctx_down, rows[i], cols[j], c, epilogue);
      CHECK(d_down <= d);
      CHECK(d <= d_up);
      CHECK(d_down < d_up);  // alpha * r + c is no fp32 value with these data
    }
  CHECK(gemm_ctx.status() == all);
  CHECK(some_inexact_epilogue);

  // An alpha beyond fp32 is infinity, with OFLO among alpha's flags.
  const emu::TensorScaleEpilogue huge = unit->tensor_scale_epilogue(p2(100), p2(100));
  CHECK(huge.alpha == INFINITY);
  CHECK(huge.alpha_flags == (emu::OFLO | emu::INEXACT));
  // MX formats have no tensor scale: no epilogue, c is the MMA's accumulator.
  const BlockFormat& mx = emu::block_format_by_name("mxfp8-e4m3");
  const auto mx_unit = emu::make_block_mma_unit(UnitKind::b200, mx, mx);
  const emu::TensorScaleEpilogue none = mx_unit->tensor_scale_epilogue(1.0, 1.0);
  CHECK_FALSE(none.applies);
  std::vector<double> v(64);
  for (double& x : v) x = normal(rng);
  const BlockQuantized q = emu::quantize(mx, v, emu::default_block_spec(mx), nullptr);
  emu::Context a, b;
  CHECK(fp32_bits(mx_unit->dot(a, q, q, 0.25, none)) == fp32_bits(mx_unit->dot(b, q, q, 0.25)));
}
