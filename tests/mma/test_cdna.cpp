// AMD's matrix cores (emu/cdna.hpp: mi100, mi250x, mi300x) against an exact model of the
// documented datapaths written here with Boost.Multiprecision: operands drawn as bit
// patterns and decoded by this file's own decoder, products, pairwise sums, the flush,
// the fused groups (truncation below E, the floor against the accumulator, fp8's even
// and odd halves, xf32's truncation of the bit pattern) and fma chains computed on exact
// values and rounded by this file's own round-to-nearest-even. Mixed fp8 inputs decode A
// and B each with its own layout. There is no measured AMD data: the model is the one
// MMA-Sim and MIOpen document, nothing more.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

// GCC 12 reports false -Warray-bounds positives inside Boost.Multiprecision.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_bin_float.hpp>
#pragma GCC diagnostic pop

#include "emu/cdna.hpp"
#include "emu/unit.hpp"
#include "emu/unit_request.hpp"

namespace {

namespace mp = boost::multiprecision;
// Values lie within 2^-300 .. 2^300 and every exact sum here spans fewer than 400 bits.
using Big = mp::number<mp::cpp_bin_float<512, mp::digit_base_2, void, std::int32_t, -4000, 4000>, mp::et_off>;

using emu::UnitKind;

double p2(int e) { return std::ldexp(1.0, e); }
std::uint32_t fp32_bits(double x) { return std::bit_cast<std::uint32_t>(static_cast<float>(x)); }

// ---- This file's own decoder --------------------------------------------------------------

struct Layout {
  int exponent_bits, fraction_bits, bias;
  bool fnuz;  // no infinities, NaN at 0x80 (AMD's fp8); else IEEE
  int emin() const { return 1 - bias; }
  int top() const { return (1 << exponent_bits) - 1; }
};

const Layout kFp16{5, 10, 15, false};
const Layout kBf16{8, 7, 127, false};
const Layout kFp32{8, 23, 127, false};
const Layout kE4M3Fnuz{4, 3, 8, true};
const Layout kE5M2Fnuz{5, 2, 16, true};

struct Value {
  Big v = 0;
  bool negative = false;
  int exponent = 0;  // the aligned exponent: the field's, emin for subnormals (and zeros)
  double as_double() const {
    const double d = v.convert_to<double>();
    return d == 0 && negative ? -0.0 : d;
  }
};

Value decode(const Layout& l, std::uint64_t bits) {
  const std::uint64_t m = bits & ((std::uint64_t{1} << l.fraction_bits) - 1);
  const int e = static_cast<int>((bits >> l.fraction_bits) & static_cast<std::uint64_t>(l.top()));
  Value x;
  x.negative = ((bits >> (l.exponent_bits + l.fraction_bits)) & 1) != 0;
  x.exponent = e == 0 ? l.emin() : e - l.bias;
  const std::uint64_t hidden = e == 0 ? 0 : std::uint64_t{1} << l.fraction_bits;
  const Big significand = Big(static_cast<double>(m + hidden));
  x.v = mp::ldexp(significand, x.exponent - l.fraction_bits);
  if (x.negative) x.v = -x.v;
  return x;
}
bool subnormal_or_zero(const Layout& l, std::uint64_t bits) {
  return ((bits >> l.fraction_bits) & static_cast<std::uint64_t>(l.top())) == 0;
}

int floor_log2(const Big& x) {  // x != 0
  int e = 0;
  mp::frexp(mp::abs(x), &e);
  return e - 1;
}

// x rounded to nearest even into a binary format with `fraction_bits`, exponents from
// emin (gradual underflow) to emax (beyond: infinity). A zero x gives +0 here; the
// callers give zeros their IEEE sign.
double round_ne(const Big& x, int fraction_bits, int emin, int emax) {
  if (x == 0) return 0.0;
  const Big magnitude = mp::abs(x);
  const int q = std::max(floor_log2(magnitude), emin) - fraction_bits;
  const Big scaled = mp::ldexp(magnitude, -q);
  Big n = mp::floor(scaled);
  const Big rest = scaled - n;
  if (rest > Big(0.5) || (rest == Big(0.5) && mp::fmod(n, Big(2)) != 0)) n += 1;
  const Big r = mp::ldexp(n, q);
  if (r >= mp::ldexp(Big(1), emax + 1)) return x < 0 ? -HUGE_VAL : HUGE_VAL;
  const double d = r.convert_to<double>();  // exact: at most fraction_bits + 1 bits
  return x < 0 ? -d : d;
}
double fp32_ne(const Big& x) { return round_ne(x, 23, -126, 127); }

// An IEEE addition or fma's result: the exact x rounded, with the sign IEEE 754 (6.3)
// gives a zero (an exact zero sum of terms with one sign keeps it; else +0 to nearest).
double ieee_result(const Big& x, bool all_terms_negative_zero) {
  if (x == 0) return all_terms_negative_zero ? -0.0 : 0.0;
  const double r = fp32_ne(x);
  return r == 0 && x < 0 ? -0.0 : r;
}

// ---- The oracle: the documented datapaths, step by step ------------------------------------

struct Model {
  enum class Path { pairwise, fused, fma_chain } path;
  int group = 1;
  bool flush = false, halves = false, xf32 = false;
  Layout in;                   // A's layout (and B's, unless in_b is set)
  std::optional<Layout> in_b;  // B's, for mixed inputs
  const Layout& b_layout() const { return in_b ? *in_b : in; }
};

double flushed(double v) { return std::fabs(v) < p2(-126) ? std::copysign(0.0, v) : v; }

// Pairwise: products rounded into fp32, a balanced tree of fp32 additions (left half
// first), flushed where the model flushes. Operands already flushed.
double pairwise_tree(const Model& m, const std::vector<Value>& a, const std::vector<Value>& b, std::size_t first,
                     std::size_t n) {
  if (n == 1) {
    const Big p = a[first].v * b[first].v;
    const double r = p == 0 ? 0.0 : ieee_result(p, false);  // fma(a, b, +0): a zero product is +0
    return m.flush ? flushed(r) : r;
  }
  const std::size_t half = n / 2;
  const double l = pairwise_tree(m, a, b, first, half), r = pairwise_tree(m, a, b, first + half, n - half);
  const double s = ieee_result(Big(l) + Big(r), std::signbit(l) && std::signbit(r) && l == 0 && r == 0);
  return m.flush ? flushed(s) : s;
}

// The cut sum of the non-zero products first, first + step, ... of a group, in units of
// 2^(exp - 24) (truncated toward zero); has is false where all are zero.
Big cut_sum(const std::vector<Value>& a, const std::vector<Value>& b, std::size_t first, std::size_t end,
            std::size_t step, int& exp, bool& has) {
  has = false;
  for (std::size_t i = first; i < end; i += step)
    if (a[i].v != 0 && b[i].v != 0) {
      const int e = a[i].exponent + b[i].exponent;
      exp = has ? std::max(exp, e) : e;
      has = true;
    }
  Big sum = 0;
  if (!has) return sum;
  for (std::size_t i = first; i < end; i += step) sum += mp::trunc(mp::ldexp(a[i].v * b[i].v, 24 - exp));
  return sum;
}

double fused_group(const Model& m, const std::vector<Value>& a, const std::vector<Value>& b, std::size_t first,
                   std::size_t end, double c) {
  int e = 0;
  bool has = false;
  Big s = 0;  // in units of 2^(e - 24)
  if (!m.halves) {
    s = cut_sum(a, b, first, end, 1, e, has);
  } else {
    int e0 = 0, e1 = 0;
    bool h0 = false, h1 = false;
    const Big s0 = cut_sum(a, b, first, end, 2, e0, h0), s1 = cut_sum(a, b, first + 1, end, 2, e1, h1);
    has = h0 || h1;
    e = !h0 ? e1 : !h1 ? e0 : std::max(e0, e1);
    if (h0) s += mp::floor(mp::ldexp(s0, e0 - e));
    if (h1) s += mp::floor(mp::ldexp(s1, e1 - e));
  }
  if (!has) return c == 0 ? 0.0 : c;
  const Value cv = decode(kFp32, fp32_bits(c));
  const int ec = cv.exponent;  // -126 for zeros and subnormals
  const int big_m = std::max(e, ec);
  const Big s_cut = mp::floor(mp::ldexp(s, e - 24 - (big_m - 31)));          // units 2^(M - 31)
  Big c_cut = mp::floor(mp::ldexp(cv.v, 24 - big_m));                         // units 2^(M - 24)
  if (m.halves && ec < big_m - 25) c_cut = 0;
  const Big total = mp::ldexp(s_cut, big_m - 31) + mp::ldexp(c_cut, big_m - 24);
  return total == 0 ? 0.0 : fp32_ne(total);
}

// The model's dot product of k operand bit patterns from c (an fp32 value).
double model_dot(const Model& m, const std::vector<std::uint64_t>& abits, const std::vector<std::uint64_t>& bbits,
                 double c) {
  const std::size_t k = abits.size();
  std::vector<Value> a(k), b(k);
  for (std::size_t i = 0; i < k; ++i) {
    std::uint64_t x = abits[i], y = bbits[i];
    if (m.xf32) {  // the 13 low fraction bits of the binary32 patterns cleared
      x &= ~std::uint64_t{0x1fff};
      y &= ~std::uint64_t{0x1fff};
    }
    a[i] = decode(m.in, x);
    b[i] = decode(m.b_layout(), y);
    if (m.flush) {
      if (subnormal_or_zero(m.in, abits[i])) a[i] = Value{0, false, m.in.emin()};
      if (subnormal_or_zero(m.b_layout(), bbits[i])) b[i] = Value{0, false, m.b_layout().emin()};
    }
  }
  if (m.flush && std::fabs(c) < p2(-126)) c = 0.0;
  const auto g = static_cast<std::size_t>(m.group);
  for (std::size_t first = 0; first < k; first += g) {
    const std::size_t end = std::min(k, first + g);
    switch (m.path) {
      case Model::Path::fma_chain:
        for (std::size_t i = first; i < end; ++i) {
          const bool product_negative_zero = (a[i].v == 0 || b[i].v == 0) && (a[i].negative != b[i].negative);
          c = ieee_result(a[i].v * b[i].v + Big(c), product_negative_zero && c == 0 && std::signbit(c));
        }
        break;
      case Model::Path::pairwise: {
        const double s = pairwise_tree(m, a, b, first, end - first);
        c = ieee_result(Big(c) + Big(s), c == 0 && s == 0 && std::signbit(c) && std::signbit(s));
        if (m.flush) c = flushed(c);
        break;
      }
      case Model::Path::fused: c = fused_group(m, a, b, first, end, c); break;
    }
  }
  return c;
}

// ---- Random operands --------------------------------------------------------------------

struct Draw {
  std::mt19937_64 rng;
  // Bits of a finite value: zeros and subnormals often, exponents either near 1 or spread
  // across `spread` binades of the format's range (capped so that bf16 products stay
  // below 2^128).
  std::uint64_t bits(const Layout& l, int spread) {
    std::uniform_int_distribution<int> pick(0, 9);
    const int kind = pick(rng);
    const std::uint64_t sign = (rng() & 1) << (l.exponent_bits + l.fraction_bits);
    const std::uint64_t frac = rng() & ((std::uint64_t{1} << l.fraction_bits) - 1);
    int e = 0;
    if (kind == 0) return l.fnuz ? 0 : sign;  // a zero (fnuz has no -0)
    if (kind == 1) {
      e = 0;  // subnormal
    } else {
      const int hi = std::min(l.fnuz ? l.top() : l.top() - 1, l.bias + std::min(spread, 60));
      const int lo = std::max(1, l.bias - spread);
      e = std::uniform_int_distribution<int>(lo, hi)(rng);
    }
    const std::uint64_t bits = sign | (static_cast<std::uint64_t>(e) << l.fraction_bits) | frac;
    if (l.fnuz && bits == (std::uint64_t{1} << (l.exponent_bits + l.fraction_bits))) return 0;  // NaN: make it 0
    return bits;
  }
  // c: zero, a subnormal, a value near the products, or one cancelling (most of) the
  // exact dot product.
  double c(double exact_dot) {
    switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
      case 0: return rng() & 1 ? 0.0 : -0.0;
      case 1: return std::bit_cast<float>(static_cast<std::uint32_t>(rng() & 0x807fffffu));
      case 2:
      case 3: return -static_cast<float>(exact_dot);
      default: {
        const int e = std::uniform_int_distribution<int>(-40, 20)(rng);
        return static_cast<float>(std::ldexp(std::uniform_real_distribution<double>(-2, 2)(rng), e));
      }
    }
  }
};

double decoded_double(const Layout& l, std::uint64_t bits) { return decode(l, bits).as_double(); }

// `cases` random dot products through the unit and the model; the number that differ.
int compare_random(const emu::MatrixUnit& unit, const Model& m, int instruction_k, std::uint64_t seed, int cases) {
  Draw draw{std::mt19937_64(seed)};
  const Layout& encoding = m.xf32 ? kFp32 : m.in;
  const Layout& b_encoding = m.xf32 ? kFp32 : m.b_layout();
  int mismatches = 0;
  for (int t = 0; t < cases; ++t) {
    const std::size_t k = std::uniform_int_distribution<std::size_t>(1, 3 * instruction_k)(draw.rng);
    const int spread = std::uniform_int_distribution<int>(0, 3)(draw.rng) == 0 ? 200 : 4;
    std::vector<std::uint64_t> ab(k), bb(k);
    std::vector<double> a(k), b(k);
    double exact = 0;
    for (std::size_t i = 0; i < k; ++i) {
      ab[i] = draw.bits(encoding, spread);
      bb[i] = draw.bits(b_encoding, spread);
      a[i] = decoded_double(encoding, ab[i]);
      b[i] = decoded_double(b_encoding, bb[i]);
      exact += a[i] * b[i];
    }
    const double c = draw.c(exact);
    emu::Context ctx;
    const double got = unit.dot(ctx, k, a.data(), 1, b.data(), 1, c);
    const double want = model_dot(m, ab, bb, c);
    const bool same = std::isnan(want) ? std::isnan(got) : fp32_bits(got) == fp32_bits(want);
    if (!same && ++mismatches <= 5) {
      std::ostringstream ops;
      ops << std::hexfloat;
      for (std::size_t i = 0; i < k; ++i) ops << ' ' << a[i] << '*' << b[i];
      UNSCOPED_INFO(emu::unit_kind_name(unit.kind())
                    << " " << emu::unit_input_name(unit.input_format(), unit.b_input_format()) << " k " << k << " c "
                    << c << ": got " << got << " want " << want << " |" << ops.str());
    }
  }
  return mismatches;
}

Model pairwise(int group, bool flush, const Layout& in) {
  return {Model::Path::pairwise, group, flush, false, false, in, std::nullopt};
}
Model fused(int group, const Layout& in) { return {Model::Path::fused, group, false, false, false, in, std::nullopt}; }

double dot(UnitKind kind, const emu::Format& in, std::vector<double> a, std::vector<double> b, double c) {
  const auto unit = emu::make_unit(kind, in);
  emu::Context ctx;
  return unit->dot(ctx, a.size(), a.data(), 1, b.data(), 1, c);
}

// A unit with mixed inputs as every front end makes it: the name "A:B" parsed and resolved.
std::unique_ptr<emu::MatrixUnit> mixed_unit(UnitKind kind, const char* name) {
  emu::UnitRequest request;
  request.unit = kind;
  request.in = emu::unit_input_by_name(name);
  return emu::resolve_unit(request, {"unit", "in", "out", "scale_rule", "fused"}).unit;
}
double mixed_dot(const char* name, std::vector<double> a, std::vector<double> b, double c) {
  const auto unit = mixed_unit(UnitKind::mi300x, name);
  emu::Context ctx;
  return unit->dot(ctx, a.size(), a.data(), 1, b.data(), 1, c);
}

}  // namespace

TEST_CASE("AMD presets: formats, instructions and refusals", "[cdna]") {
  using emu::fp16;
  CHECK(emu::make_unit(UnitKind::mi300x)->input_format() == fp16());
  CHECK(emu::make_unit(UnitKind::mi250x, emu::fp64())->output_format() == emu::fp64());
  CHECK(emu::cdna_params(UnitKind::mi100, emu::bf16(), emu::fp32()).group_size == 2);
  CHECK(emu::cdna_params(UnitKind::mi250x, emu::bf16(), emu::fp32()).group_size == 4);
  CHECK(emu::cdna_params(UnitKind::mi300x, emu::fp8_e5m2fnuz(), emu::fp32()).instruction_k == 32);
  CHECK_THROWS_WITH(emu::make_unit(UnitKind::mi100, emu::fp64()),
                    "mi100 matrix cores do not take fp64 inputs (they take fp16, bf16, fp32)");
  CHECK_THROWS_WITH(emu::make_unit(UnitKind::mi250x, emu::tf32()),
                    "mi250x matrix cores do not take tf32 inputs (they take fp16, bf16, fp32, fp64)");
  CHECK_THROWS_AS(emu::make_unit(UnitKind::mi300x, emu::fp8_e4m3()), std::invalid_argument);  // OCP, not fnuz
  CHECK_THROWS_WITH(emu::make_unit(UnitKind::mi300x, fp16(), fp16()),
                    "mi300x matrix cores do not give fp16 output for fp16 inputs (fp32)");
  CHECK(emu::block_operands(UnitKind::mi300x) == emu::BlockOperands::none);
}

TEST_CASE("pairwise (CDNA1/2), hand-worked: fp32 sums in a balanced tree per group", "[cdna]") {
  const double u = p2(-23);
  // Products 1, 0, 2^-24, 2^-24 (2^-12 * 2^-12), c = 0. Pairwise: (1 + 0) + (2^-24 +
  // 2^-24) = 1 + 2^-23 exactly. In index order each 2^-24 would be half an ulp of 1, a
  // tie to even, lost: 1. Fused (mi300x): 1 + 2^-23 kept within 24 bits: 1 + 2^-23.
  const std::vector<double> a{1, 0, p2(-12), p2(-12)}, b{1, 1, p2(-12), p2(-12)};
  CHECK(dot(UnitKind::mi100, emu::fp16(), a, b, 0.0) == 1 + u);
  CHECK(dot(UnitKind::fp32_seq, emu::fp16(), a, b, 0.0) == 1.0);
  // The same products in order 2^-24, 1, 0, 2^-24: (2^-24 + 1) + (0 + 2^-24) = 1 + 1
  // tie-to-even lost twice: 1.
  CHECK(dot(UnitKind::mi100, emu::fp16(), {p2(-12), 1, 0, p2(-12)}, {p2(-12), 1, 1, p2(-12)}, 0.0) == 1.0);
  // A last group of 3: p0 + (p1 + p2). Products 1, 2^-24, 2^-24: 1 + 2^-23.
  CHECK(dot(UnitKind::mi100, emu::fp16(), {1, p2(-12), p2(-12)}, {1, p2(-12), p2(-12)}, 0.0) == 1 + u);
  // Group size: c = 1, products 0, 2^-24, 2^-24, 0. mi100's bf16 groups are pairs:
  // 1 + (0 + 2^-24) and then 1 + (2^-24 + 0), each a tie to even: 1. mi250x's bf16_1k
  // groups of 4: 1 + ((0 + 2^-24) + (2^-24 + 0)) = 1 + 2^-23.
  const std::vector<double> a4{0, p2(-12), p2(-12), 0}, b4{1, p2(-12), p2(-12), 1};
  CHECK(dot(UnitKind::mi100, emu::bf16(), a4, b4, 1.0) == 1.0);
  CHECK(dot(UnitKind::mi250x, emu::bf16(), a4, b4, 1.0) == 1 + u);
}

TEST_CASE("pairwise flush (CDNA2 fp16 and bf16), hand-worked", "[cdna]") {
  // A subnormal fp16 input: 2^-15 * 2^10 = 2^-5 on mi100; on mi250x 2^-15 is flushed to
  // +0 first: 0.
  CHECK(dot(UnitKind::mi100, emu::fp16(), {p2(-15)}, {p2(10)}, 0.0) == p2(-5));
  CHECK(dot(UnitKind::mi250x, emu::fp16(), {p2(-15)}, {p2(10)}, 0.0) == 0.0);
  // A product below 2^-126: bf16 2^-70 * -2^-70 = -2^-140, an fp32 subnormal on mi100;
  // flushed to -0 on mi250x (a zero of its sign), then c + -0 with c = -0... c = +0
  // here: +0 + -0 = +0.
  CHECK(dot(UnitKind::mi100, emu::bf16(), {p2(-70)}, {-p2(-70)}, 0.0) == -p2(-140));
  const double flushed_product = dot(UnitKind::mi250x, emu::bf16(), {p2(-70)}, {-p2(-70)}, 0.0);
  CHECK((flushed_product == 0 && !std::signbit(flushed_product)));
  // A subnormal c: 2^-130 stays on mi100, becomes +0 on mi250x (zero products).
  CHECK(dot(UnitKind::mi100, emu::fp16(), {0}, {1}, p2(-130)) == p2(-130));
  CHECK(dot(UnitKind::mi250x, emu::fp16(), {0}, {1}, p2(-130)) == 0.0);
  // An accumulator falling below 2^-126: c = 2^-125, product -1.5 * 2^-126 (bf16
  // -1.5 * 2^-63 times 2^-63): c + p = 2^-127, subnormal: mi100 keeps it, mi250x flushes.
  CHECK(dot(UnitKind::mi100, emu::bf16(), {-1.5 * p2(-63)}, {p2(-63)}, p2(-125)) == p2(-127));
  CHECK(dot(UnitKind::mi250x, emu::bf16(), {-1.5 * p2(-63)}, {p2(-63)}, p2(-125)) == 0.0);
  // fp32 and fp64 instructions do not flush: fma(2^-140, 1, 0) = 2^-140.
  CHECK(dot(UnitKind::mi250x, emu::fp32(), {p2(-140)}, {1}, 0.0) == p2(-140));
}

TEST_CASE("fused (CDNA3), hand-worked: 24 bits below E, floored against c, fp8 halves, xf32", "[cdna]") {
  const double u = p2(-23);
  // Round-down alignment. Products -2^-24 (-2^-12 * 2^-12) and 2^-40 (2^-20 * 2^-20,
  // fp16 subnormals: exponents -14 each, E -28 for it), c = 1 + 2^-23. Within the
  // group E = -24, both kept: S = -2^-24 + 2^-40. Against c, M = 0: S floored to a
  // multiple of 2^-31: -2^-24 (toward zero it would be -2^-24 + 2^-31). S + c =
  // 1 + 2^-24, a tie: to even, 1. Exact: 1 + 2^-24 + 2^-40 -> 1 + 2^-23.
  CHECK(dot(UnitKind::mi300x, emu::fp16(), {-p2(-12), p2(-20)}, {p2(-12), p2(-20)}, 1 + u) == 1.0);
  CHECK(dot(UnitKind::exact, emu::fp16(), {-p2(-12), p2(-20)}, {p2(-12), p2(-20)}, 1 + u) == 1 + u);
  // c floored against the products: product 1, c = -2^-100: c floored to a multiple of
  // 2^-24: -2^-24. 1 - 2^-24 is an fp32 value: the result, where exact rounding gives 1.
  CHECK(dot(UnitKind::mi300x, emu::bf16(), {1}, {1}, -p2(-100)) == 1 - p2(-24));
  // Truncation toward zero within the group: products 1 and -2^-30 (bf16 -2^-15 *
  // 2^-15): E = 0, -2^-30 is cut to a multiple of 2^-24 toward zero: 0. Result 1.
  CHECK(dot(UnitKind::mi300x, emu::bf16(), {1, -p2(-15)}, {1, p2(-15)}, 0.0) == 1.0);
  // A group of 8 rounds once: products 1 and seven 2^-24: 1 + 7 * 2^-24 = 1 + 3.5 ulp ->
  // to even 1 + 4 ulp. The ninth product starts a new group against c.
  std::vector<double> a(8, p2(-12)), b(8, p2(-12));
  a[0] = b[0] = 1;
  CHECK(dot(UnitKind::mi300x, emu::fp16(), a, b, 0.0) == 1 + 4 * u);

  // fp8 halves (e5m2fnuz: subnormals down to 2^-17). Products 1 (index 0) and
  // -2^-34 (-2^-17 * 2^-17) at index 1, the odd half: S1 = -2^-34 alone, floored to a
  // multiple of 2^(E - 24) = 2^-24: -2^-24. S = 1 - 2^-24, an fp32 value. In one fused
  // sum (or halves by position, index 1 beside index 0) it is cut toward zero: 1.
  const emu::Format& e5 = emu::fp8_e5m2fnuz();
  std::vector<double> fa(16, 0.0), fb(16, 0.0);
  fa[0] = fb[0] = 1;
  fa[1] = -p2(-17);
  fb[1] = p2(-17);
  CHECK(dot(UnitKind::mi300x, e5, fa, fb, 0.0) == 1 - p2(-24));
  // The same product at index 8 (even, with index 0): cut toward zero: 1.
  std::swap(fa[1], fa[8]);
  std::swap(fb[1], fb[8]);
  CHECK(dot(UnitKind::mi300x, e5, fa, fb, 0.0) == 1.0);
  // fp8's c: below 2^(M - 25) it is dropped, not floored: c = -2^-100, product 1: 1;
  // c = -2^-25 (e_c = M - 25) is floored to -2^-24: 1 - 2^-24.
  CHECK(dot(UnitKind::mi300x, e5, {1}, {1}, -p2(-100)) == 1.0);
  CHECK(dot(UnitKind::mi300x, e5, {1}, {1}, -p2(-25)) == 1 - p2(-24));

  // xf32: a = 1 + 2^-11 + 2^-23 (an fp32 value) truncated to tf32 is 1 (rounded to
  // nearest it would be 1 + 2^-10): 1 * 1 = 1.
  const auto xf32 = emu::make_unit(UnitKind::mi300x, emu::tf32());
  emu::Context ctx;
  const double x = 1 + p2(-11) + p2(-23), one = 1;
  CHECK(xf32->dot(ctx, 1, &x, 1, &one, 1, 0.0) == 1.0);
  CHECK(xf32->input_format() == emu::tf32());
}

TEST_CASE("mixed fp8 (mi300x fp8-e4m3fnuz:fp8-e5m2fnuz), hand-worked: each factor at its own format's emin",
          "[cdna]") {
  // A in e4m3fnuz (emin -7, subnormals down to 2^-10), B in e5m2fnuz (emin -15, down to
  // 2^-17). Product 0: 2^7 * 2^-8, exponents 7 and -8 (2^-8 is a normal e5m2fnuz; in
  // e4m3fnuz it would be subnormal, its exponent clamped at -7): E = -1, so products
  // are cut to multiples of 2^(E - 24) = 2^-25.
  // Product 2 (the even half, with product 0): 2^-8 * -2^-17 = -2^-25 (2^-8 an e4m3fnuz
  // subnormal, exponent -7; 2^-17 an e5m2fnuz subnormal, -15): on the grid, kept.
  // S = 2^-1 - 2^-25 = (2^24 - 1) * 2^-25, c = 0: M = E, nothing more is cut, and S has
  // 24 bits: the result is 0.5 - 2^-25 exactly. Had B's 2^-8 been clamped at A's emin
  // -7, E would be 0 and -2^-25 cut toward zero on the 2^-24 grid: 0.5.
  const std::vector<double> a{p2(7), 0, p2(-8)}, b{p2(-8), 0, -p2(-17)};
  CHECK(mixed_dot("fp8-e4m3fnuz:fp8-e5m2fnuz", a, b, 0.0) == 0.5 - p2(-25));
  // The same product at index 1, the odd half: S1 = -2^-25 alone (E1 = -7 - 15 = -22),
  // floored onto E's 2^-25 grid: -2^-25, kept. With E = 0 it would floor to -2^-24:
  // 0.5 - 2^-24.
  CHECK(mixed_dot("fp8-e4m3fnuz:fp8-e5m2fnuz", {p2(7), p2(-8)}, {p2(-8), -p2(-17)}, 0.0) == 0.5 - p2(-25));
  // The reverse pair, A e5m2fnuz and B e4m3fnuz, takes the factors the other way round:
  // the same products, the same sum.
  CHECK(mixed_dot("fp8-e5m2fnuz:fp8-e4m3fnuz", b, a, 0.0) == 0.5 - p2(-25));
  // Each operand is checked against its own format: as A of fp8-e4m3fnuz:fp8-e5m2fnuz,
  // -2^-17 is refused (below e4m3fnuz's least subnormal, 2^-10).
  CHECK_THROWS_WITH(mixed_dot("fp8-e4m3fnuz:fp8-e5m2fnuz", b, a, 0.0),
                    Catch::Contains("is not an fp8-e4m3fnuz value"));
  // The formats the unit reports: A's, then B's.
  const auto unit = mixed_unit(UnitKind::mi300x, "fp8-e5m2fnuz:fp8-e4m3fnuz");
  CHECK(unit->input_format() == emu::fp8_e5m2fnuz());
  CHECK(unit->b_input_format() == emu::fp8_e4m3fnuz());
}

TEST_CASE("mixed fp8 (mi300x) against the documented model on random instructions", "[cdna]") {
  // As the one-format fp8 path, A's bits drawn and decoded in A's layout, B's in B's.
  Model mixed = fused(16, kE4M3Fnuz);
  mixed.halves = true;
  mixed.in_b = kE5M2Fnuz;
  CHECK(compare_random(*mixed_unit(UnitKind::mi300x, "fp8-e4m3fnuz:fp8-e5m2fnuz"), mixed, 32, 13, 3000) == 0);
  mixed.in = kE5M2Fnuz;
  mixed.in_b = kE4M3Fnuz;
  CHECK(compare_random(*mixed_unit(UnitKind::mi300x, "fp8-e5m2fnuz:fp8-e4m3fnuz"), mixed, 32, 14, 3000) == 0);
}

TEST_CASE("mixed inputs: which units and pairs take them", "[cdna]") {
  const emu::CdnaParams p = emu::cdna_params(UnitKind::mi300x, emu::fp8_e4m3fnuz(), emu::fp8_e5m2fnuz(), emu::fp32());
  CHECK((p.path == emu::CdnaPath::fused && p.group_size == 16 && p.split_halves && p.instruction_k == 32));
  CHECK_THROWS_WITH(emu::cdna_params(UnitKind::mi300x, emu::fp8_e4m3fnuz(), emu::fp16(), emu::fp32()),
                    "mi300x matrix cores mix fp8-e4m3fnuz with fp8-e5m2fnuz only (either as A), not fp8-e4m3fnuz "
                    "with fp16");
  CHECK_THROWS_WITH(emu::cdna_params(UnitKind::mi250x, emu::fp16(), emu::bf16(), emu::fp32()),
                    "mi250x matrix cores take one input format for A and B");
  CHECK(emu::mixed_input_names(UnitKind::mi300x) ==
        std::vector<std::string>{"fp8-e4m3fnuz:fp8-e5m2fnuz", "fp8-e5m2fnuz:fp8-e4m3fnuz"});
  for (const auto& row : emu::unit_table())
    if (row.value != UnitKind::mi300x) CHECK(emu::mixed_input_names(row.value).empty());
  // OCP fp8 (with infinities) is not the MI300X's: refused as the one-format fp8 is.
  CHECK_THROWS_AS(mixed_unit(UnitKind::mi300x, "fp8-e4m3:fp8-e5m2"), std::invalid_argument);
  CHECK_THROWS_WITH(mixed_unit(UnitKind::h100, "fp8-e4m3:fp8-e5m2"),
                    "in fp8-e4m3:fp8-e5m2 on unit h100: mixed inputs (A:B) are taken by mi300x "
                    "(fp8-e4m3fnuz:fp8-e5m2fnuz and fp8-e5m2fnuz:fp8-e4m3fnuz) only; h100 takes one input format "
                    "for A and B");
}

TEST_CASE("AMD presets: NaN and infinity", "[cdna]") {
  const double inf = HUGE_VAL, nan = std::numeric_limits<double>::quiet_NaN();
  for (UnitKind kind : {UnitKind::mi100, UnitKind::mi250x, UnitKind::mi300x}) {
    INFO(emu::unit_kind_name(kind));
    emu::Context ctx;
    const auto unit = emu::make_unit(kind, emu::bf16());
    const double a[] = {inf, 0}, b[] = {0, 1}, a2[] = {inf, 1}, b2[] = {1, 1};
    CHECK(std::isnan(unit->dot(ctx, 2, a, 1, b, 1, 0.0)));  // inf * 0
    CHECK((ctx.status() & emu::INV) != 0);
    CHECK(unit->dot(ctx, 2, a2, 1, b2, 1, 1.0) == inf);
    CHECK(std::isnan(unit->dot(ctx, 2, a2, 1, b2, 1, -inf)));
    CHECK(std::isnan(unit->dot(ctx, 2, a2, 1, b2, 1, nan)));
    // bf16 products of 2^128 and more are infinities: 2^64 * 2^64.
    const double big[] = {p2(64), -p2(64)}, one[] = {p2(64), p2(64)};
    CHECK(std::isnan(unit->dot(ctx, 2, big, 1, one, 1, 0.0)));
    CHECK(unit->dot(ctx, 1, big, 1, one, 1, 0.0) == inf);
  }
}

TEST_CASE("AMD presets against the documented model on random instructions", "[cdna]") {
  // Each: random k from 1 to 3 instructions, operands with zeros, subnormals, exponents
  // near 1 or spread over 200 binades, c zero, subnormal, near or cancelling the dot.
  CHECK(compare_random(*emu::make_unit(UnitKind::mi100, emu::fp16()), pairwise(4, false, kFp16), 16, 1, 2000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi100, emu::bf16()), pairwise(2, false, kBf16), 8, 2, 2000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi250x, emu::fp16()), pairwise(4, true, kFp16), 16, 3, 2000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi250x, emu::bf16()), pairwise(4, true, kBf16), 16, 4, 2000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi300x, emu::fp16()), fused(8, kFp16), 16, 5, 2000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi300x, emu::bf16()), fused(8, kBf16), 16, 6, 2000) == 0);
  Model xf32 = fused(4, kFp32);
  xf32.xf32 = true;
  CHECK(compare_random(*emu::make_unit(UnitKind::mi300x, emu::tf32()), xf32, 8, 7, 2000) == 0);
  Model fp8 = fused(16, kE4M3Fnuz);
  fp8.halves = true;
  CHECK(compare_random(*emu::make_unit(UnitKind::mi300x, emu::fp8_e4m3fnuz()), fp8, 32, 8, 2000) == 0);
  fp8.in = kE5M2Fnuz;
  CHECK(compare_random(*emu::make_unit(UnitKind::mi300x, emu::fp8_e5m2fnuz()), fp8, 32, 9, 2000) == 0);
  const Model chain{Model::Path::fma_chain, 1, false, false, false, kFp32, std::nullopt};
  CHECK(compare_random(*emu::make_unit(UnitKind::mi100, emu::fp32()), chain, 4, 10, 1000) == 0);
  CHECK(compare_random(*emu::make_unit(UnitKind::mi250x, emu::fp32()), chain, 4, 11, 1000) == 0);
}

TEST_CASE("fp64 MFMA (mi250x, mi300x): an fma chain, against the host's fma", "[cdna]") {
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> mantissa(-2, 2);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (UnitKind kind : {UnitKind::mi250x, UnitKind::mi300x}) {
    const auto unit = emu::make_unit(kind, emu::fp64());
    for (int t = 0; t < 500; ++t) {
      const std::size_t k = 1 + rng() % 12;
      std::vector<double> a(k), b(k);
      double want = std::ldexp(mantissa(rng), exponent(rng)), c = want;
      for (std::size_t i = 0; i < k; ++i) {
        a[i] = std::ldexp(mantissa(rng), exponent(rng));
        b[i] = std::ldexp(mantissa(rng), exponent(rng));
        want = std::fma(a[i], b[i], want);
      }
      emu::Context ctx;
      CHECK(std::bit_cast<std::uint64_t>(unit->dot(ctx, k, a.data(), 1, b.data(), 1, c)) ==
            std::bit_cast<std::uint64_t>(want));
    }
  }
}

TEST_CASE("AMD presets round to nearest even whatever the context's rounding", "[cdna]") {
  const auto unit = emu::make_unit(UnitKind::mi100, emu::fp16());
  emu::Context ctx;
  ctx.control.rounding = emu::Rounding::rz;
  const double a[] = {1, p2(-12)}, b[] = {1, 1.5 * p2(-12)};  // 1 + 1.5 * 2^-24 -> 1 + 2^-23
  CHECK(unit->dot(ctx, 2, a, 1, b, 1, 0.0) == 1 + p2(-23));
  CHECK(ctx.control.rounding == emu::Rounding::rz);
}
