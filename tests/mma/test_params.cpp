// The block FMA's parameters beyond the presets, and every unit name on hand-worked dot
// products. Expected values are worked out beside the inputs, or come from an oracle
// in Boost.Multiprecision that follows the documented model step by step (emu/mma.hpp:
// align to E, cut each term, add exactly, round once) with its own arithmetic.
#include <catch2/catch.hpp>

#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// GCC 12 reports false -Warray-bounds positives inside Boost.Multiprecision.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_bin_float.hpp>
#pragma GCC diagnostic pop

#include "emu/mma.hpp"

namespace {

using emu::AlignmentRounding;
using emu::Rounding;
using emu::UnitKind;

namespace mp = boost::multiprecision;
// 600 bits hold every sum of fp16 products and fp32 values exactly (2^-200 .. 2^200).
using Big = mp::number<mp::cpp_bin_float<600, mp::digit_base_2, void, std::int32_t, -4000, 4000>, mp::et_off>;

double p2(int e) { return std::ldexp(1.0, e); }
std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }

emu::BlockFmaParams v100_like() {
  emu::BlockFmaParams p;  // block 4, 23 kept bits, truncation, rz: V100 with fp32 output
  p.block_size = 4;
  p.kept_fraction_bits = 23;
  p.final_rounding = Rounding::rz;
  return p;
}

double dot(const emu::BlockFmaParams& p, const std::vector<double>& a, const std::vector<double>& b, double c,
           emu::Flags* flags = nullptr, const emu::Format& in = emu::fp16(), const emu::Format& out = emu::fp32()) {
  const emu::TensorCoreUnit unit(UnitKind::v100, in, out, p);
  emu::Context ctx;
  const double d = unit.dot(ctx, a.size(), a.data(), 1, b.data(), 1, c);
  if (flags) *flags = ctx.status();
  return d;
}

// ---- The oracle ----------------------------------------------------------------------

// x cut to an integer as AlignmentRounding says.
Big cut(const Big& x, AlignmentRounding r) {
  switch (r) {
    case AlignmentRounding::truncate_magnitude: return mp::trunc(x);
    case AlignmentRounding::truncate_twos_complement: return mp::floor(x);
    case AlignmentRounding::nearest_even: {
      const Big f = mp::floor(x);
      const Big rest = x - f;
      const bool odd = mp::fmod(f, Big(2)) != 0;
      return rest > Big(0.5) || (rest == Big(0.5) && odd) ? Big(f + 1) : f;
    }
  }
  return x;
}

// x rounded into a format with `fraction_bits` and `emin` (gradual underflow, no
// overflow in these tests) with mode: the general rule, in Big arithmetic.
double round_into(const Big& x, int fraction_bits, int emin, Rounding mode, bool& inexact) {
  if (x == 0) return 0.0;
  const bool negative = x < 0;
  const Big magnitude = mp::abs(x);
  int e = 0;
  mp::frexp(magnitude, &e);  // magnitude = f 2^e, f in [1/2, 1)
  const int q = std::max(e - 1, emin) - fraction_bits;
  const Big m = mp::ldexp(magnitude, -q);
  const Big n = mp::floor(m);
  const Big rest = m - n;
  const bool odd = mp::fmod(n, Big(2)) != 0;
  bool up = false;
  switch (mode) {
    case Rounding::rne: up = rest > Big(0.5) || (rest == Big(0.5) && odd); break;
    case Rounding::rna: up = rest >= Big(0.5); break;
    case Rounding::rz: break;
    case Rounding::ru: up = rest != 0 && !negative; break;
    case Rounding::rd: up = rest != 0 && negative; break;
    case Rounding::ro: up = rest != 0 && !odd; break;
    case Rounding::sr: FAIL("no sr in the oracle"); break;
  }
  inexact |= rest != 0;
  const double result = mp::ldexp(Big(up ? n + 1 : n), q).convert_to<double>();  // exact: few bits
  return negative ? -result : result;
}

// The exponent the adder aligns with: floor(log2 |x|) clamped at the format's emin.
int exponent(double x, const emu::Format& f) { return std::max(std::ilogb(x), f.emin()); }

// One block (n <= block size) of the documented model (products cut to the product grid
// first where product_lsb is set); +0 for an exact zero sum.
double oracle_block(const emu::BlockFmaParams& p, const emu::Format& in, const emu::Format& out, std::size_t n,
                    const double* a, const double* b, double c, bool& inexact) {
  int e = INT_MIN;
  if (c != 0) e = std::max(std::ilogb(c), -126);  // c's binary32 exponent
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != 0 && b[i] != 0) e = std::max(e, exponent(a[i], in) + exponent(b[i], in));
  if (e == INT_MIN) return 0.0;
  e = std::max(e, p.min_alignment_exponent);
  const Big quantum = mp::ldexp(Big(1), e - p.kept_fraction_bits);
  Big sum = 0;
  auto add = [&](const Big& term) {
    const Big t = term / quantum;  // exact: a power of two
    const Big kept = cut(t, p.alignment_rounding);
    inexact |= kept != t;
    sum += kept;
  };
  add(Big(c));
  for (std::size_t i = 0; i < n; ++i) {
    Big product = Big(a[i]) * Big(b[i]);
    if (p.product_lsb > INT_MIN / 8) {  // cut toward zero to the product grid first
      const Big grid = mp::ldexp(Big(1), p.product_lsb);
      const Big on_grid = mp::trunc(product / grid) * grid;
      inexact |= on_grid != product;
      product = on_grid;
    }
    add(product);
  }
  if (sum == 0) return 0.0;
  return round_into(sum * quantum, out.fraction_bits(), out.emin(), p.final_rounding, inexact);
}

double oracle_dot(const emu::BlockFmaParams& p, const emu::Format& in, const emu::Format& out,
                  const std::vector<double>& a, const std::vector<double>& b, double c, bool& inexact) {
  const auto block = static_cast<std::size_t>(p.block_size);
  for (std::size_t j = 0; j < a.size(); j += block)
    c = oracle_block(p, in, out, std::min(block, a.size() - j), a.data() + j, b.data() + j, c, inexact);
  return c;
}

constexpr Rounding kFinalModes[] = {Rounding::rne, Rounding::rna, Rounding::rz,
                                    Rounding::ru,  Rounding::rd,  Rounding::ro};
constexpr AlignmentRounding kAlignments[] = {AlignmentRounding::truncate_magnitude,
                                             AlignmentRounding::truncate_twos_complement,
                                             AlignmentRounding::nearest_even};

}  // namespace

TEST_CASE("final rounding of the block sum: every mode on a hand-worked tie and half-tie", "[mma][params]") {
  // A100-like adder (block 8, 24 kept bits): 1 + 2^-23 + 2^-24 = 1 + 1.5 ulp of fp32 is
  // exact in the adder; 1 + 2^-24 = 1 + 0.5 ulp likewise.
  emu::BlockFmaParams p = v100_like();
  p.block_size = 8;
  p.kept_fraction_bits = 24;
  const double ulp = p2(-23);
  const std::vector<double> a{1, p2(-12), p2(-12)}, b{1, p2(-11), p2(-12)};  // 1 + 2^-23 + 2^-24
  const std::vector<double> neg_a{-1, -p2(-12), -p2(-12)};
  const std::vector<double> half_a{1, p2(-12)}, half_b{1, p2(-12)};  // 1 + 2^-24
  struct Expected {
    Rounding mode;
    double one_and_a_half, minus_one_and_a_half, one_and_a_half_tie;
  };
  // 1.5 ulp: kept significand 2^23 + 1 (odd), remainder exactly half.
  // 0.5 ulp: kept 2^23 (even), remainder exactly half.
  const Expected table[] = {
      {Rounding::rne, 1 + 2 * ulp, -(1 + 2 * ulp), 1.0},
      {Rounding::rna, 1 + 2 * ulp, -(1 + 2 * ulp), 1 + ulp},
      {Rounding::rz, 1 + ulp, -(1 + ulp), 1.0},
      {Rounding::ru, 1 + 2 * ulp, -(1 + ulp), 1 + ulp},
      {Rounding::rd, 1 + ulp, -(1 + 2 * ulp), 1.0},
      {Rounding::ro, 1 + ulp, -(1 + ulp), 1 + ulp},  // odd stays; even goes to the odd neighbour
  };
  for (const Expected& row : table) {
    p.final_rounding = row.mode;
    INFO(emu::rounding_name(row.mode));
    emu::Flags flags = 0;
    CHECK(dot(p, a, b, 0, &flags) == row.one_and_a_half);
    CHECK(flags == emu::INEXACT);
    CHECK(dot(p, neg_a, b, 0) == row.minus_one_and_a_half);
    CHECK(dot(p, half_a, half_b, 0) == row.one_and_a_half_tie);
    // Through gemm as well (the reference adder where the column adder does not apply).
    const emu::TensorCoreUnit unit(UnitKind::a100, emu::fp16(), emu::fp32(), p);
    emu::Context ctx;
    double d = 0;
    unit.gemm(ctx, 1, 1, 3, a.data(), 3, b.data(), 1, &d, 1);
    CHECK(d == row.one_and_a_half);
  }
  p.final_rounding = Rounding::sr;
  CHECK_THROWS_AS(emu::TensorCoreUnit(UnitKind::a100, emu::fp16(), emu::fp32(), p), std::invalid_argument);
}

TEST_CASE("alignment rounding: each mode on hand-worked terms [the model's step 3]", "[mma][params]") {
  // V100-like: c = 1 sets E = 0, so the quantum is 2^-23 and one product t quanta.
  //   product          t      truncate-magnitude  truncate-twos-complement  nearest-even
  //   -3 * 2^-25   -0.75      0 -> 1              -1 -> 1 - 2^-23           -1 -> 1 - 2^-23
  //   2^-24         0.5       0 -> 1               0 -> 1                    0 (tie, even) -> 1
  //   -2^-24       -0.5       0 -> 1              -1 -> 1 - 2^-23            0 (tie, even) -> 1
  //   3 * 2^-24     1.5       1 -> 1 + 2^-23       1 -> 1 + 2^-23            2 (tie, even) -> 1 + 2^-22
  //   -3 * 2^-24   -1.5      -1 -> 1 - 2^-23      -2 -> 1 - 2^-22           -2 -> 1 - 2^-22
  // (1 - 2^-23 and 1 - 2^-22 are fp32 values: below 1 the ulp is 2^-24; rz is exact.)
  struct Row {
    double a, b;
    double truncate, floor, nearest;
  };
  const Row rows[] = {
      {-3 * p2(-13), p2(-12), 1.0, 1 - p2(-23), 1 - p2(-23)},
      {p2(-12), p2(-12), 1.0, 1.0, 1.0},
      {-p2(-12), p2(-12), 1.0, 1 - p2(-23), 1.0},
      {3 * p2(-13), p2(-11), 1 + p2(-23), 1 + p2(-23), 1 + p2(-22)},
      {-3 * p2(-13), p2(-11), 1 - p2(-23), 1 - p2(-22), 1 - p2(-22)},
  };
  emu::BlockFmaParams p = v100_like();
  CHECK(p.alignment_rounding == AlignmentRounding::truncate_magnitude);  // the measured default
  for (const Row& row : rows) {
    INFO("product " << row.a * row.b);
    p.alignment_rounding = AlignmentRounding::truncate_magnitude;
    emu::Flags flags = 0;
    CHECK(dot(p, {row.a}, {row.b}, 1.0, &flags) == row.truncate);
    CHECK(flags == emu::INEXACT);  // every row drops bits at alignment
    p.alignment_rounding = AlignmentRounding::truncate_twos_complement;
    CHECK(dot(p, {row.a}, {row.b}, 1.0) == row.floor);
    p.alignment_rounding = AlignmentRounding::nearest_even;
    CHECK(dot(p, {row.a}, {row.b}, 1.0) == row.nearest);
  }
  // The names.
  for (AlignmentRounding r : kAlignments) CHECK(emu::alignment_rounding_by_name(emu::alignment_rounding_name(r)) == r);
  CHECK_THROWS_AS(emu::alignment_rounding_by_name("floor"), std::invalid_argument);
}

TEST_CASE("block FMA against an exact oracle: every final rounding x every alignment rounding", "[mma][params]") {
  std::mt19937_64 gen(2024);
  std::uniform_int_distribution<int> percent(0, 99);
  emu::Context round_ctx;
  // A value of f: zero sometimes, else +-(1 + u) 2^e rounded into f.
  auto value = [&](const emu::Format& f, int lo, int hi) {
    if (percent(gen) < 6) return 0.0;
    const double sign = percent(gen) < 50 ? -1.0 : 1.0;
    const int e = std::uniform_int_distribution<int>(lo, hi)(gen);
    return round_ctx.convert(f, sign * std::uniform_real_distribution<double>(1.0, 2.0)(gen) * p2(e));
  };
  struct Shape {
    int block, kept;
    const emu::Format* out;
    int lo, hi;  // input exponents
  };
  const Shape shapes[] = {{4, 23, &emu::fp32(), -10, 8},  {8, 24, &emu::fp32(), -10, 8},
                          {16, 25, &emu::fp32(), -12, 6}, {8, 30, &emu::fp32(), -6, 6},
                          {4, 12, &emu::fp32(), -8, 8},   {4, 23, &emu::fp16(), -9, 3},
                          {16, 25, &emu::fp16(), -12, 1}};
  int compared = 0, rounded = 0, mode_dependent = 0;
  for (const Shape& shape : shapes)
    for (Rounding mode : kFinalModes)
      for (AlignmentRounding alignment : kAlignments) {
        emu::BlockFmaParams p;
        p.block_size = shape.block;
        p.kept_fraction_bits = shape.kept;
        p.final_rounding = mode;
        p.alignment_rounding = alignment;
        if (percent(gen) < 30) p.min_alignment_exponent = std::uniform_int_distribution<int>(-8, 4)(gen);
        const emu::Format& out = *shape.out;
        const emu::TensorCoreUnit unit(UnitKind::h100, emu::fp16(), out, p);
        for (int trial = 0; trial < 120; ++trial) {
          const std::size_t k = 1 + static_cast<std::size_t>(gen() % (2 * shape.block + 3));
          std::vector<double> a(k), b(k);
          for (std::size_t i = 0; i < k; ++i) {
            a[i] = value(emu::fp16(), shape.lo, shape.hi);
            b[i] = value(emu::fp16(), shape.lo, shape.hi);
          }
          // c near the products, or far above or below them.
          const int c_lo = percent(gen) < 25 ? 2 * shape.lo - 12 : 2 * shape.lo;
          const int c_hi = out.emax() < 20 ? 10 : 2 * shape.hi + 6;
          const double c = value(out, c_lo, c_hi);
          bool inexact = false;
          const double want = oracle_dot(p, emu::fp16(), out, a, b, c, inexact);
          emu::Context ctx;
          const double got = unit.dot(ctx, k, a.data(), 1, b.data(), 1, c);
          std::vector<double> column = b;
          double via_gemm = c;
          emu::Context gemm_ctx;
          unit.gemm(gemm_ctx, 1, 1, k, a.data(), k, column.data(), 1, &via_gemm, 1);
          INFO("block " << shape.block << " kept " << shape.kept << " out " << out.name() << " final "
                        << emu::rounding_name(mode) << " alignment " << emu::alignment_rounding_name(alignment)
                        << " min E " << p.min_alignment_exponent << " k " << k << " c " << c << " want " << want
                        << " got " << got);
          REQUIRE(bits(got) == bits(want));
          REQUIRE(bits(via_gemm) == bits(want));
          REQUIRE(((ctx.status() & emu::INEXACT) != 0) == inexact);
          REQUIRE(gemm_ctx.status() == ctx.status());
          ++compared;
          rounded += inexact;
          // How often a mode-dependent decision was taken (the result depends on the mode).
          emu::BlockFmaParams other = p;
          other.final_rounding = mode == Rounding::rz ? Rounding::ru : Rounding::rz;
          other.alignment_rounding = alignment == AlignmentRounding::nearest_even
                                         ? AlignmentRounding::truncate_magnitude
                                         : AlignmentRounding::nearest_even;
          bool ignored = false;
          mode_dependent += oracle_dot(other, emu::fp16(), out, a, b, c, ignored) != want;
        }
      }
  CHECK(compared == 7 * 6 * 3 * 120);
  CHECK(rounded > compared / 2);  // the cases do round
  CHECK(mode_dependent > compared / 4);  // and the modes do change results
}

TEST_CASE("min_alignment_exponent clamps E from below (hand-worked)", "[mma][params]") {
  // Product (1 + 2^-10) 2^-12 * 2^-12 = 2^-24 + 2^-34, alone (c = 0).
  const std::vector<double> a{(1 + p2(-10)) * p2(-12)}, b{p2(-12)};
  emu::BlockFmaParams p = v100_like();
  // No clamp: E = -24, the quantum 2^-47 keeps it; an fp32 value (10 fraction bits).
  CHECK(dot(p, a, b, 0) == p2(-24) + p2(-34));
  // E >= -10: the quantum is 2^-33 and the term 2^9 + 1/2 quanta; truncated to 2^9: 2^-24.
  p.min_alignment_exponent = -10;
  emu::Flags flags = 0;
  CHECK(dot(p, a, b, 0, &flags) == p2(-24));
  CHECK(flags == emu::INEXACT);
  // E >= 0: the quantum is 2^-23 and the term below one quantum: +0.
  p.min_alignment_exponent = 0;
  const double zero = dot(p, a, b, 0);
  CHECK(bits(zero) == bits(0.0));
}

TEST_CASE("input_subnormals = false flushes subnormal inputs to zero (hand-worked)", "[mma][params]") {
  // 3 * 2^-24 (fp16 subnormal) * 1 + 2^-14 * 1: E = -14 (a subnormal's exponent is emin,
  // -14); the quantum 2^-37 keeps both: 2^-14 + 3 * 2^-24, an fp32 value.
  const std::vector<double> a{3 * p2(-24), p2(-14)}, b{1, 1};
  emu::BlockFmaParams p = v100_like();
  CHECK(dot(p, a, b, 0) == p2(-14) + 3 * p2(-24));
  p.input_subnormals = false;  // the subnormal factor is zero: 2^-14 exactly
  emu::Flags flags = 0;
  CHECK(dot(p, a, b, 0, &flags) == p2(-14));
  CHECK(flags == 0);
  // Subnormal b flushes too; 2^-24 * 2^10 alone gives +0.
  CHECK(dot(p, {p2(10)}, {p2(-24)}, 0) == 0.0);
}

TEST_CASE("c_after_products: the products accumulate from zero, c is added after (hand-worked)", "[mma][params]") {
  // Three products 2^-24 and c = 1. Aligned with c (NVIDIA): E = 0, quantum 2^-23, each
  // product 1/2 quantum, truncated: 1. After: the block alone is 3 * 2^-24 (exact, rz),
  // then 1 + 3 * 2^-24 = 1 + 1.5 ulp is rounded with c_rounding: rne 1 + 2^-22, rz 1 + 2^-23.
  const std::vector<double> a(3, p2(-12));
  emu::BlockFmaParams p = v100_like();
  CHECK(dot(p, a, a, 1.0) == 1.0);
  p.c_after_products = true;
  p.c_rounding = Rounding::rne;
  CHECK(dot(p, a, a, 1.0) == 1 + p2(-22));
  p.c_rounding = Rounding::rz;
  CHECK(dot(p, a, a, 1.0) == 1 + p2(-23));
  // With k beyond one block each block (one instruction here) adds c after itself:
  // 8 products 2^-24 in blocks of 4: 1 + 4 * 2^-24 = 1 + 2^-22 twice: 1 + 2^-21 (exact).
  const std::vector<double> eight(8, p2(-12));
  p.c_rounding = Rounding::rne;
  CHECK(dot(p, eight, eight, 1.0) == 1 + p2(-21));
}

TEST_CASE("every unit name gives its documented result on hand-worked dot products", "[mma][amp][units]") {
  // Default formats: fp16 inputs; fp32 output except ipu-amp-half and fp16-seq (fp16).
  // Case 1: c = 0, products 1 then 15 x 2^-25 (2^-12 * 2^-13).
  //  v100 (block 4, 23 bits): every 2^-25 is 1/4 of the quantum 2^-23, truncated: 1.
  //  t4 a100 ada l40s (block 8, 24 bits): 1/2 of the quantum 2^-24, truncated: 1.
  //  h100 h200 b200 (block 16, 25 bits): all kept: 1 + 15 * 2^-25, rz to fp32 (ulp 2^-23,
  //    3.75 ulp): 1 + 3 * 2^-23.
  //  ipu-amp: phase 1 = 1 + 3 * 2^-25 = 1 + 0.75 ulp -> RNE 1 + 2^-23; each further phase
  //    adds exactly 1 ulp: 1 + 4 * 2^-23 = 1 + 2^-21.
  //  ipu-amp-half: each phase's fp32 value (at most 1 + 2^-23) rounds to fp16 1: 1.
  //  exact: 1 + 3.75 ulp -> 1 + 2^-21. fp32-seq, fp16-seq: 1 + 2^-25 -> 1 each step: 1.
  // Case 2: products 1 then 15 x 2^-24.
  //  v100: each 2^-24 is 1/2 quantum, truncated: 1.
  //  block 8, 24 bits: 1 + 7 * 2^-24 -> rz 1 + 3 * 2^-23; then + 8 * 2^-24 exactly:
  //    1 + 7 * 2^-23.
  //  block 16, 25 bits: 1 + 15 * 2^-24 = 1 + 7.5 ulp -> rz 1 + 7 * 2^-23.
  //  ipu-amp: phase 1 = 1 + 1.5 ulp -> RNE (tie to even) 1 + 2 ulp; + 2 ulp per phase:
  //    1 + 8 ulp = 1 + 2^-20.  ipu-amp-half: 1.
  //  exact: 1 + 7.5 ulp -> tie to even: 1 + 2^-20. fp32-seq: 1 + 0.5 ulp ties to 1: 1.
  // Case 3: products 1024, -1024, then 14 x 2^-24.
  //  v100: block 1 truncates its two 2^-24 against 2^10 and gives 0; blocks 2-4 add
  //    12 x 2^-24 exactly: 3 * 2^-22.
  //  block 8: block 1 drops its six 2^-24; block 2 adds 8: 2^-21.
  //  block 16: all dropped: +0.
  //  ipu-amp, ipu-amp-half (fp16 subnormals hold it), exact, fp32-seq, fp16-seq: all
  //    14 x 2^-24 = 7 * 2^-23, exact at every step.
  // mi100 and mi250x (pairwise fp32 sums in groups of 4; nothing here is subnormal):
  //  case 1: (1 + 2^-25) + (2^-25 + 2^-25) = 1 + 2^-24 -> tie to even 1; three groups of
  //    4 * 2^-25 = 2^-23 each: 1 + 3 * 2^-23.
  //  case 2: (1 + 2^-24) = 1, (2^-24 + 2^-24) = 2^-23: 1 + 2^-23; three groups of 2^-22:
  //    1 + 7 * 2^-23.  case 3: (1024 - 1024) + 2^-23, then three 2^-22: 7 * 2^-23.
  // mi300x (fused groups of 8, 24 bits below E, rounded to nearest even):
  //  case 1: group 1 cuts its 2^-25s: 1; group 2 adds 8 * 2^-25 = 2^-22: 1 + 2 * 2^-23.
  //  case 2: 1 + 7 * 2^-24 = 1 + 3.5 ulp -> 1 + 4 ulp; + 8 * 2^-24: 1 + 2^-20.
  //  case 3: group 1 cuts its 2^-24s against 2^10: +0; group 2: 8 * 2^-24 = 2^-21.
  std::vector<double> a1(16, p2(-12)), b1(16, p2(-13)), a2(16, p2(-12)), b2(16, p2(-12));
  a1[0] = b1[0] = a2[0] = b2[0] = 1;
  std::vector<double> a3(16, p2(-12)), b3(16, p2(-12));
  a3[0] = a3[1] = b3[0] = 32;
  b3[1] = -32;
  struct Row {
    const char* unit;
    double case1, case2, case3;
  };
  const double u = p2(-23);
  const Row rows[] = {
      {"v100", 1.0, 1.0, 3 * p2(-22)},
      {"t4", 1.0, 1 + 7 * u, p2(-21)},
      {"a100", 1.0, 1 + 7 * u, p2(-21)},
      {"ada", 1.0, 1 + 7 * u, p2(-21)},
      {"l40s", 1.0, 1 + 7 * u, p2(-21)},
      {"h100", 1 + 3 * u, 1 + 7 * u, 0.0},
      {"h200", 1 + 3 * u, 1 + 7 * u, 0.0},
      {"b200", 1 + 3 * u, 1 + 7 * u, 0.0},
      {"mi100", 1 + 3 * u, 1 + 7 * u, 7 * u},
      {"mi250x", 1 + 3 * u, 1 + 7 * u, 7 * u},
      {"mi300x", 1 + 2 * u, 1 + p2(-20), p2(-21)},
      {"ipu-amp", 1 + p2(-21), 1 + p2(-20), 7 * u},
      {"ipu-amp-half", 1.0, 1.0, 7 * u},
      {"exact", 1 + p2(-21), 1 + p2(-20), 7 * u},
      {"fp32-seq", 1.0, 1.0, 7 * u},
      {"fp16-seq", 1.0, 1.0, 7 * u},
  };
  int names = 0;
  for (const char* const* name = emu::unit_names(); *name != nullptr; ++name) ++names;
  CHECK(names == static_cast<int>(std::size(rows)));  // every unit name has a row
  for (const Row& row : rows) {
    INFO(row.unit);
    const auto unit = emu::make_unit(emu::unit_kind_by_name(row.unit));
    CHECK(std::string(emu::unit_kind_name(unit->kind())) == row.unit);
    emu::Context ctx;
    CHECK(bits(unit->dot(ctx, 16, a1.data(), 1, b1.data(), 1, 0.0)) == bits(row.case1));
    CHECK(bits(unit->dot(ctx, 16, a2.data(), 1, b2.data(), 1, 0.0)) == bits(row.case2));
    CHECK(bits(unit->dot(ctx, 16, a3.data(), 1, b3.data(), 1, 0.0)) == bits(row.case3));
  }
}

TEST_CASE("fp32-seq and fp16-seq: fused by name; the unfused form rounds the product first", "[units]") {
  // One step, c = -(1 + 2^-9), a = b = 1 + 2^-10: a b = 1 + 2^-9 + 2^-20.
  //  fused (both): a b + c = 2^-20 exactly (an fp16 subnormal, an fp32 normal).
  //  unfused fp16: a b rounds to 1 + 2^-9 (2^-20 is far below half an ulp, 2^-11), then
  //    (1 + 2^-9) - (1 + 2^-9) = 0. unfused fp32: a b is an fp32 value, so 2^-20 again.
  const double a = 1 + p2(-10), c = -(1 + p2(-9));
  for (emu::UnitKind kind : {emu::UnitKind::fp16_seq, emu::UnitKind::fp32_seq}) {
    INFO(emu::unit_kind_name(kind));
    emu::Context ctx;
    CHECK(emu::make_unit(kind)->dot(ctx, 1, &a, 1, &a, 1, c) == p2(-20));
    CHECK(emu::make_sequential_unit(kind, true)->dot(ctx, 1, &a, 1, &a, 1, c) == p2(-20));
    const double unfused = emu::make_sequential_unit(kind, false)->dot(ctx, 1, &a, 1, &a, 1, c);
    // fp32 holds 1 + 2^-9 + 2^-20 exactly: no rounding of the product, so 2^-20 again.
    CHECK(unfused == (kind == emu::UnitKind::fp16_seq ? 0.0 : p2(-20)));
  }
  // fp32: a = b = 1 + 2^-12 (an fp16 value): a b = 1 + 2^-11 + 2^-24, c = -(1 + 2^-11).
  //  fused: 2^-24. unfused: the product rounds (tie, to even) to 1 + 2^-11: 0.
  const double a32 = 1 + p2(-12), c32 = -(1 + p2(-11));
  emu::Context ctx;
  CHECK(emu::make_sequential_unit(emu::UnitKind::fp32_seq, true)->dot(ctx, 1, &a32, 1, &a32, 1, c32) == p2(-24));
  CHECK(emu::make_sequential_unit(emu::UnitKind::fp32_seq, false)->dot(ctx, 1, &a32, 1, &a32, 1, c32) == 0.0);
  CHECK_THROWS_AS(emu::make_sequential_unit(emu::UnitKind::exact, false), std::invalid_argument);
  CHECK_THROWS_AS(emu::make_sequential_unit(emu::UnitKind::v100, true), std::invalid_argument);
}

TEST_CASE("exact: an exact zero keeps a zero c's sign, and a cancelled non-zero c gives +0 (-0 under rd)", "[units]") {
  const auto unit = emu::make_unit(UnitKind::exact);
  const double one = 1, minus_one = -1, zero = 0, minus_zero = -0.0;
  struct Case {
    const char* what;
    double a, b, c;
    Rounding mode;
    double expected;
  };
  const Case cases[] = {
      {"1 + 1 * -1", one, minus_one, one, Rounding::rne, 0.0},      // once returned c = 1
      {"-1 + 1 * 1", one, one, minus_one, Rounding::rne, 0.0},
      {"1 + 1 * -1, rd", one, minus_one, one, Rounding::rd, -0.0},
      {"1 + 1 * -1, ru", one, minus_one, one, Rounding::ru, 0.0},
      {"-0 + 0 * 1", zero, one, minus_zero, Rounding::rne, -0.0},   // zero c: keeps its zero
      {"+0 + -0 * 1, rd", minus_zero, one, zero, Rounding::rd, 0.0},
  };
  for (const Case& t : cases) {
    INFO(t.what);
    emu::FpControl control;
    control.rounding = t.mode;
    emu::Context ctx(control);
    CHECK(bits(unit->dot(ctx, 1, &t.a, 1, &t.b, 1, t.c)) == bits(t.expected));
    CHECK(ctx.status() == 0);
  }
}

// An H100 measured by a user of Khattak and Mikaitis's MATLAB-tensor-core models (that
// repository's GitHub issue #7, cited by roundoff's issue 13): this bf16 inner product
// (k = 16, c = 0, binary32 bit patterns) gave 0x1.6p-146 = 11 * 2^-149, where exact
// products summed and truncated give 0x1.4p-146 (the exact sum is 10.9989 * 2^-149).
// Every product lies below 2^-126; truncating each toward zero to a multiple of 2^-149
// (binary32's subnormal grid) before the sum gives the hardware's 11.
TEST_CASE("H100 bf16 products below binary32's normal range: the measured case (MATLAB-tensor-core #7)",
          "[mma][params][measured]") {
  const std::uint32_t a_bits[] = {0x9b940000, 0x19f30000, 0x9a2e0000, 0x1a670000, 0x9a250000, 0x9b4e0000,
                                  0x9b290000, 0x9a330000, 0x99e00000, 0x1a140000, 0x99140000, 0x99d10000,
                                  0x9ae90000, 0x1b1a0000, 0x9a9c0000, 0x1b3a0000};
  const std::uint32_t b_bits[] = {0x9aaf0000, 0x99f30000, 0x9acc0000, 0x1b7c0000, 0x19ed0000, 0x1b250000,
                                  0x9a1b0000, 0x9a200000, 0x9af70000, 0x9a480000, 0x1ae10000, 0x1b320000,
                                  0x1b120000, 0x1b0e0000, 0x9a680000, 0x17350000};
  std::vector<double> a, b;
  for (std::uint32_t x : a_bits) a.push_back(static_cast<double>(std::bit_cast<float>(x)));
  for (std::uint32_t x : b_bits) b.push_back(static_cast<double>(std::bit_cast<float>(x)));
  const double measured = 0x1.6p-146;
  for (UnitKind device : {UnitKind::h100, UnitKind::h200}) {
    const auto unit = emu::make_tensor_core_unit(device, emu::bf16(), emu::fp32());
    emu::Context ctx;
    CHECK(unit->dot(ctx, a.size(), a.data(), 1, b.data(), 1, 0.0) == measured);
    // Products lost bits below binary32's normal range: UFLO and INEXACT; the sum is exact.
    CHECK(ctx.status() == (emu::UFLO | emu::INEXACT));
    double via_gemm = 0.0;
    emu::Context gemm_ctx;
    unit->gemm(gemm_ctx, 1, 1, a.size(), a.data(), a.size(), b.data(), 1, &via_gemm, 1);
    CHECK(via_gemm == measured);
  }
  // With exact products (the published model, and B200's preset: no measurement) the
  // same adder gives 10 * 2^-149.
  emu::BlockFmaParams exact_products = emu::tensor_core_params(UnitKind::h100, emu::bf16(), emu::fp32());
  exact_products.product_lsb = emu::BlockFmaParams{}.product_lsb;
  CHECK(dot(exact_products, a, b, 0.0, nullptr, emu::bf16()) == 0x1.4p-146);
}

TEST_CASE("product grid: h100 and h200 bf16 and tf32 against the exact oracle, products near 2^-149",
          "[mma][params]") {
  std::mt19937_64 gen(149);
  std::uniform_int_distribution<int> percent(0, 99);
  emu::Context round_ctx;
  auto value = [&](const emu::Format& f, int lo, int hi) {
    if (percent(gen) < 5) return 0.0;
    const double sign = percent(gen) < 50 ? -1.0 : 1.0;
    const int e = std::uniform_int_distribution<int>(lo, hi)(gen);
    return round_ctx.convert(f, sign * std::uniform_real_distribution<double>(1.0, 2.0)(gen) * p2(e));
  };
  int compared = 0, cut = 0, differs_from_exact_products = 0;
  for (UnitKind device : {UnitKind::h100, UnitKind::h200})
    for (const emu::Format* in : {&emu::bf16(), &emu::tf32()}) {
      const emu::BlockFmaParams p = emu::tensor_core_params(device, *in, emu::fp32());
      REQUIRE(p.product_lsb == -149);
      emu::BlockFmaParams exact_products = p;
      exact_products.product_lsb = emu::BlockFmaParams{}.product_lsb;
      const auto unit = emu::make_tensor_core_unit(device, *in, emu::fp32());
      for (int trial = 0; trial < 300; ++trial) {
        // Products around 2^-150 .. 2^-120, sometimes one far above (then the alignment
        // cuts them all coarser than the grid), c zero or tiny.
        const std::size_t k = 1 + static_cast<std::size_t>(gen() % 40);
        std::vector<double> a(k), b(k);
        for (std::size_t i = 0; i < k; ++i) {
          a[i] = value(*in, -80, -60);
          b[i] = value(*in, -80, -60);
          if (percent(gen) < 4) a[i] = value(*in, -10, 10);
        }
        const double c = percent(gen) < 50 ? 0.0 : value(emu::fp32(), -149, -120);
        bool inexact = false;
        const double want = oracle_dot(p, *in, emu::fp32(), a, b, c, inexact);
        emu::Context ctx;
        const double got = unit->dot(ctx, k, a.data(), 1, b.data(), 1, c);
        INFO(emu::unit_kind_name(device) << " " << in->name() << " k " << k << " c " << c << " want " << want
                                         << " got " << got);
        REQUIRE(bits(got) == bits(want));
        REQUIRE(((ctx.status() & emu::INEXACT) != 0) == inexact);
        bool ignored = false;
        differs_from_exact_products += oracle_dot(exact_products, *in, emu::fp32(), a, b, c, ignored) != want;
        ++compared;
        cut += inexact;
      }
      // gemm: rows and columns mixing tiny and ordinary values, so that some elements
      // go to the reference adder (products off the grid) and others stay on the
      // integer adder; each element equals dot().
      const std::size_t m = 5, n = 19, k = 24;
      std::vector<double> A(m * k), B(k * n), C(m * n), D(m * n);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t q = 0; q < k; ++q) A[i * k + q] = i % 2 == 0 ? value(*in, -80, -60) : value(*in, -8, 8);
      for (std::size_t q = 0; q < k; ++q)
        for (std::size_t j = 0; j < n; ++j) B[q * n + j] = j % 3 == 0 ? value(*in, -80, -60) : value(*in, -8, 8);
      for (double& x : C) x = percent(gen) < 50 ? 0.0 : value(emu::fp32(), -140, 4);
      D = C;
      emu::Context gemm_ctx;
      unit->gemm(gemm_ctx, m, n, k, A.data(), k, B.data(), n, D.data(), n);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
          std::vector<double> row(A.begin() + static_cast<std::ptrdiff_t>(i * k),
                                  A.begin() + static_cast<std::ptrdiff_t>((i + 1) * k));
          std::vector<double> column(k);
          for (std::size_t q = 0; q < k; ++q) column[q] = B[q * n + j];
          bool ignored = false;
          INFO("gemm element " << i << ", " << j);
          REQUIRE(bits(D[i * n + j]) == bits(oracle_dot(p, *in, emu::fp32(), row, column, C[i * n + j], ignored)));
        }
    }
  CHECK(compared == 4 * 300);
  CHECK(cut > compared / 2);
  CHECK(differs_from_exact_products > compared / 10);  // the grid does change results
}

TEST_CASE("product grid: only Hopper's bf16 and tf32 presets set it", "[mma][params]") {
  const emu::BlockFmaParams exact{};
  for (UnitKind device : {UnitKind::a100, UnitKind::ada, UnitKind::l40s, UnitKind::b200})
    for (const emu::Format* in : {&emu::bf16(), &emu::tf32(), &emu::fp16()})
      CHECK(emu::tensor_core_params(device, *in, emu::fp32()).product_lsb == exact.product_lsb);
  for (UnitKind device : {UnitKind::h100, UnitKind::h200}) {
    CHECK(emu::tensor_core_params(device, emu::fp16(), emu::fp32()).product_lsb == exact.product_lsb);
    CHECK(emu::tensor_core_params(device, emu::fp8_e4m3(), emu::fp32()).product_lsb == exact.product_lsb);
  }
}
