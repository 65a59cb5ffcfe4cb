// Differential test of the tensor-core GEMM (TensorCoreUnit::gemm, which runs an integer
// adder across output columns) against dot() per element (the reference adder, validated
// bit for bit on measured GPU data in test_validation.cpp): values bit for bit, status
// flags per element and over the whole product, and the state of C when a trap fires,
// for every preset, input and output format, on random and adversarial matrices.
#include <catch2/catch.hpp>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../fp_counts.hpp"
#include "emu/mma.hpp"
#include "emu/threads.hpp"

namespace {

// moderate_spread: exponents within +-32, where a bf16 row and column together spread
// about as far as the column adder's float products allow (mma.cpp), on both sides.
// lost_bits: exact sums but for at most one small product and one small c, which the
// alignment cuts (the whole product's INEXACT then hangs on them). large_sums: positive
// values in [1, 2), so that a block's sum nears its bound (Hopper's blocks of 16 pass
// 2^30 units of the alignment). sparse: most values zero and c +-0, as after ReLU or
// in padding: whole blocks of zero products against a zero c (a float-products block
// with nothing in it gives +0 without the reference adder).
enum class Scenario {
  normal,
  sparse,
  wide_exponents,
  moderate_spread,
  lost_bits,
  large_sums,
  cancellation,
  subnormals,
  overflow,
  special_values
};
constexpr Scenario kScenarios[] = {Scenario::normal,     Scenario::sparse,         Scenario::wide_exponents,
                                   Scenario::moderate_spread, Scenario::lost_bits,  Scenario::large_sums,
                                   Scenario::cancellation, Scenario::subnormals,     Scenario::overflow,
                                   Scenario::special_values};
const char* scenario_name(Scenario s) {
  switch (s) {
    case Scenario::normal: return "normal";
    case Scenario::sparse: return "sparse";
    case Scenario::wide_exponents: return "wide exponents";
    case Scenario::moderate_spread: return "moderate spread";
    case Scenario::lost_bits: return "lost bits";
    case Scenario::large_sums: return "large sums";
    case Scenario::cancellation: return "cancellation";
    case Scenario::subnormals: return "subnormals";
    case Scenario::overflow: return "overflow";
    case Scenario::special_values: return "NaN and infinity";
  }
  return "?";
}

struct Problem {
  std::size_t m, n, k;
  std::vector<double> A, B, C;  // row-major, lda = k, ldb = ldc = n
};

// A value of f (finite unless `special`) drawn for the scenario.
double draw(std::mt19937_64& gen, const emu::Format& f, Scenario s, bool special) {
  emu::Context ctx;
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  std::uniform_int_distribution<int> coin(0, 1), percent(0, 99);
  const double sign = coin(gen) != 0 && s != Scenario::large_sums ? -1.0 : 1.0;
  if (percent(gen) < (s == Scenario::sparse ? 75 : 8)) return sign * 0.0;
  if (special && percent(gen) < 3) {
    const int which = percent(gen) % 3;
    if (which == 0) return std::numeric_limits<double>::quiet_NaN();
    return which == 1 ? INFINITY : -INFINITY;
  }
  int exponent = std::normal_distribution<double>(0.0, 2.0)(gen) > 0 ? 0 : -1;
  switch (s) {
    case Scenario::large_sums:
      exponent = 0;
      break;
    case Scenario::normal:
    case Scenario::sparse:
    case Scenario::lost_bits:  // (make_problem sets its values)
    case Scenario::cancellation:
    case Scenario::special_values:
      exponent = std::uniform_int_distribution<int>(-3, 3)(gen);
      break;
    case Scenario::wide_exponents:
      exponent = std::uniform_int_distribution<int>(f.emin() - f.fraction_bits(), f.emax())(gen);
      break;
    case Scenario::moderate_spread:
      exponent = std::clamp(std::uniform_int_distribution<int>(-32, 32)(gen), f.emin() - f.fraction_bits(), f.emax());
      break;
    case Scenario::subnormals:
      exponent = std::uniform_int_distribution<int>(f.emin() - f.fraction_bits(), f.emin() + 2)(gen);
      break;
    case Scenario::overflow:
      exponent = std::uniform_int_distribution<int>(f.emax() - 3, f.emax())(gen);
      break;
  }
  const double x = ctx.convert(f, sign * unit(gen) * std::ldexp(1.0, exponent));
  return std::isfinite(x) ? x : sign * f.max_finite();
}

Problem make_problem(std::mt19937_64& gen, std::size_t m, std::size_t n, std::size_t k, const emu::Format& in,
                     const emu::Format& out, Scenario s) {
  Problem p{m, n, k, std::vector<double>(m * k), std::vector<double>(k * n), std::vector<double>(m * n)};
  const bool special = s == Scenario::special_values;
  for (double& x : p.A) x = draw(gen, in, s, special);
  for (double& x : p.B) x = draw(gen, in, s, special);
  for (double& x : p.C) x = draw(gen, out, s == Scenario::subnormals ? s : Scenario::wide_exponents, special);
  if (s == Scenario::sparse)
    for (double& x : p.C) x = std::copysign(0.0, x);
  if (s == Scenario::lost_bits) {
    // A power of two in A's first column and B's first row; at most one smaller product
    // (in any block: c carries the large one), from 2^-44 of theirs up, so that its
    // lowest bit falls on either side of every adder's alignment grid; one small c.
    emu::Context ctx;
    std::uniform_int_distribution<int> coin(0, 1), percent(0, 99), below(in.emax() / 2 - 22, in.emax() / 2 - 1);
    std::uniform_real_distribution<double> significand(1.0, 2.0);
    const double big = std::ldexp(1.0, in.emax() / 2);
    std::fill(p.A.begin(), p.A.end(), 0.0);
    std::fill(p.B.begin(), p.B.end(), 0.0);
    std::fill(p.C.begin(), p.C.end(), 0.0);
    for (std::size_t i = 0; i < m; ++i) p.A[i * k] = coin(gen) != 0 ? big : -big;
    for (std::size_t j = 0; j < n; ++j) p.B[j] = coin(gen) != 0 ? big : -big;
    if (k >= 2 && coin(gen) != 0) {
      const std::size_t q = std::uniform_int_distribution<std::size_t>(1, k - 1)(gen);
      p.A[std::uniform_int_distribution<std::size_t>(0, m - 1)(gen) * k + q] =
          ctx.convert(in, (coin(gen) != 0 ? 1 : -1) * significand(gen) * std::ldexp(1.0, below(gen)));
      p.B[q * n + std::uniform_int_distribution<std::size_t>(0, n - 1)(gen)] =
          ctx.convert(in, (coin(gen) != 0 ? 1 : -1) * std::ldexp(1.0, below(gen)));
    }
    if (percent(gen) < 25)
      p.C[std::uniform_int_distribution<std::size_t>(0, m * n - 1)(gen)] = (coin(gen) != 0 ? 1 : -1) *
                                                                             std::ldexp(1.0, out.emin());
  }
  if (s == Scenario::cancellation) {
    // Pairs of equal products of opposite signs, sometimes nudged by one unit in the last
    // place, beside a term large enough to set the alignment alone.
    emu::Context ctx;
    std::uniform_int_distribution<int> percent(0, 99);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t q = 0; q + 1 < k; q += 2) p.A[i * k + q + 1] = p.A[i * k + q];
    for (std::size_t q = 0; q + 1 < k; q += 2)
      for (std::size_t j = 0; j < n; ++j) {
        double& b = p.B[(q + 1) * n + j];
        b = -p.B[q * n + j];
        if (percent(gen) < 30) b = ctx.convert(in, b * (1.0 + std::ldexp(1.0, -in.fraction_bits())));
      }
    for (std::size_t j = 0; j < n; j += 3) p.B[(k - 1) * n + j] = ctx.convert(in, std::ldexp(1.0, in.emax() / 2));
    for (std::size_t i = 0; i < m * n; i += 2) p.C[i] = 0.0;
  }
  return p;
}

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }

struct Combination {
  emu::UnitKind preset;
  const char* in;
  const char* out;
};

std::vector<Combination> combinations() {
  std::vector<Combination> list;
  for (emu::UnitKind preset : {emu::UnitKind::v100, emu::UnitKind::t4, emu::UnitKind::a100, emu::UnitKind::ada,
                               emu::UnitKind::l40s, emu::UnitKind::h100, emu::UnitKind::h200, emu::UnitKind::b200})
    for (const char* in : {"fp16", "bf16", "tf32", "fp8-e4m3", "fp8-e5m2"})
      for (const char* out : {"fp32", "fp16"}) {
        try {
          emu::make_unit(preset, emu::format_by_name(in), emu::format_by_name(out));
          list.push_back({preset, in, out});
        } catch (const std::invalid_argument&) {
          // the device does not take these formats
        }
      }
  return list;
}

// Every scenario and several k through gemm, against dot() per element.
void check_against_dot(const emu::MatrixUnit& unit, const std::string& label, std::mt19937_64& gen) {
  const emu::Format& in = unit.input_format();
  const emu::Format& out = unit.output_format();
  for (Scenario s : kScenarios)
    for (std::size_t k : {1, 5, 16, 37, 70}) {
      const Problem p = make_problem(gen, 3, 37, k, in, out, s);
      std::vector<double> C = p.C;
      emu::Context gemm_ctx;
      unit.gemm(gemm_ctx, p.m, p.n, p.k, p.A.data(), p.k, p.B.data(), p.n, C.data(), p.n);
      emu::Flags union_of_dots = 0;
      std::size_t value_mismatches = 0, flag_mismatches = 0;
      std::ostringstream report;
      for (std::size_t i = 0; i < p.m; ++i)
        for (std::size_t j = 0; j < p.n; ++j) {
          emu::Context dot_ctx;
          const double expected =
              unit.dot(dot_ctx, p.k, p.A.data() + i * p.k, 1, p.B.data() + j, p.n, p.C[i * p.n + j]);
          union_of_dots |= dot_ctx.status();
          // The same element alone through gemm: its own flags.
          double single = p.C[i * p.n + j];
          std::vector<double> column(p.k);
          for (std::size_t q = 0; q < p.k; ++q) column[q] = p.B[q * p.n + j];
          emu::Context single_ctx;
          unit.gemm(single_ctx, 1, 1, p.k, p.A.data() + i * p.k, p.k, column.data(), 1, &single, 1);
          const double got = C[i * p.n + j];
          if (bits(got) != bits(expected) || bits(single) != bits(expected)) {
            if (++value_mismatches <= 3)
              report << "  (" << i << "," << j << "): dot " << expected << " gemm " << got << " 1x1 gemm " << single
                     << " c " << p.C[i * p.n + j] << "\n";
          }
          if (single_ctx.status() != dot_ctx.status()) {
            if (++flag_mismatches <= 3)
              report << "  (" << i << "," << j << "): dot flags " << int{dot_ctx.status()} << " 1x1 gemm flags "
                     << int{single_ctx.status()} << "\n";
          }
        }
      INFO(label << ", " << scenario_name(s) << ", k = " << k << "\n" << report.str());
      CHECK(value_mismatches == 0);
      CHECK(flag_mismatches == 0);
      CHECK(int{gemm_ctx.status()} == int{union_of_dots});
    }
}

}  // namespace

TEST_CASE("tensor-core gemm equals dot() per element, bit for bit and flag for flag", "[mma][gemm]") {
  std::mt19937_64 gen(20261122);
  const auto list = combinations();
  REQUIRE(list.size() >= 20);  // every preset, with its formats
  for (const Combination& combo : list) {
    const auto unit = emu::make_unit(combo.preset, emu::format_by_name(combo.in), emu::format_by_name(combo.out));
    check_against_dot(*unit, std::string(emu::unit_kind_name(combo.preset)) + " " + combo.in + " -> " + combo.out,
                      gen);
  }
}

TEST_CASE("tensor-core gemm equals dot() per element for parameters beyond the presets", "[mma][gemm]") {
  // Wide sums with the e8m13 step, an odd block with rne into fp32, a raised alignment
  // exponent, the largest block, and formats without subnormals (flushing goes through
  // the context).
  std::mt19937_64 gen(7);
  struct Custom {
    const char* label;
    int block, kept, result_bits;
    emu::Rounding rounding;
    int min_alignment;
    bool subnormals;
  };
  const Custom customs[] = {
      {"block 16, 25 bits, e8m13 result", 16, 25, 13, emu::Rounding::rz, std::numeric_limits<int>::min() / 4, true},
      {"block 5, 24 bits, rne", 5, 24, 0, emu::Rounding::rne, std::numeric_limits<int>::min() / 4, true},
      {"block 4, alignment at least 2^-20", 4, 23, 0, emu::Rounding::rz, -20, true},
      {"block 64, 23 bits", 64, 23, 0, emu::Rounding::rz, std::numeric_limits<int>::min() / 4, true},
      {"block 8, no subnormals", 8, 24, 0, emu::Rounding::rne, std::numeric_limits<int>::min() / 4, false},
  };
  for (const Custom& custom : customs)
    for (const emu::Format& out : {emu::fp32(), emu::fp16()}) {
      emu::BlockFmaParams params;
      params.block_size = custom.block;
      params.kept_fraction_bits = custom.kept;
      params.result_fraction_bits = custom.result_bits;
      params.final_rounding = custom.rounding;
      params.min_alignment_exponent = custom.min_alignment;
      params.input_subnormals = custom.subnormals;
      const emu::Format in = emu::fp16().with_subnormals(custom.subnormals);
      const emu::TensorCoreUnit unit(emu::UnitKind::h100, in, out.with_subnormals(custom.subnormals), params);
      check_against_dot(unit, std::string(custom.label) + " -> " + out.name(), gen);
    }
}

TEST_CASE("tensor-core gemm traps on overflow where the element-by-element product does", "[mma][gemm]") {
  // bf16 products overflow binary32; with OFLO trapping, gemm must throw at the same
  // element as dot() in row-major order, leaving the earlier elements written and the
  // later ones untouched.
  const emu::Format in = emu::bf16();
  const auto unit = emu::make_unit(emu::UnitKind::a100, in, emu::fp32());
  const std::size_t m = 4, n = 20, k = 8;
  std::vector<double> A(m * k, 1.0), B(k * n, 1.0), C(m * n, 0.5);
  A[2 * k + 3] = in.max_finite();
  B[3 * n + 17] = in.max_finite();  // element (2, 17) overflows
  emu::FpControl control;
  control.traps = emu::OFLO;

  std::vector<double> expected = C;
  emu::Context dot_ctx(control);
  bool dot_threw = false;
  try {
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        expected[i * n + j] = unit->dot(dot_ctx, k, A.data() + i * k, 1, B.data() + j, n, C[i * n + j]);
  } catch (const emu::FpException&) {
    dot_threw = true;
  }
  REQUIRE(dot_threw);

  emu::Context gemm_ctx(control);
  CHECK_THROWS_AS(unit->gemm(gemm_ctx, m, n, k, A.data(), k, B.data(), n, C.data(), n), emu::FpException);
  for (std::size_t e = 0; e < m * n; ++e) {
    INFO("element " << e);
    CHECK(bits(C[e]) == bits(expected[e]));
  }
  CHECK((gemm_ctx.status() & emu::OFLO) != 0);
}

TEST_CASE("tensor-core gemm rejects inputs outside the input format as dot() does", "[mma][gemm]") {
  const auto unit = emu::make_unit(emu::UnitKind::v100, emu::fp16(), emu::fp32());
  std::vector<double> A(4 * 4, 1.0), B(4 * 4, 0.5), C(4 * 4, 0.0);
  B[5] = 1.0 + std::ldexp(1.0, -12);  // needs 12 fraction bits; fp16 has 10
  emu::Context ctx;
  CHECK_THROWS_AS(unit->dot(ctx, 4, A.data(), 1, B.data() + 1, 4, 0.0), std::invalid_argument);
  CHECK_THROWS_AS(unit->gemm(ctx, 4, 4, 4, A.data(), 4, B.data(), 4, C.data(), 4), std::invalid_argument);
  B[5] = 1e6;  // above fp16's largest finite value
  CHECK_THROWS_AS(unit->gemm(ctx, 4, 4, 4, A.data(), 4, B.data(), 4, C.data(), 4), std::invalid_argument);
  B[5] = std::ldexp(1.0, -26);  // below fp16's least subnormal
  CHECK_THROWS_AS(unit->gemm(ctx, 4, 4, 4, A.data(), 4, B.data(), 4, C.data(), 4), std::invalid_argument);
}

TEST_CASE("tensor-core gemm at the edges of its integer sums", "[mma][gemm]") {
  // Block sums whose leading bits are all ones (the largest fp16 products, 2047/1024
  // squared, topped up by c to 2^(kept+2) - 1 quanta), and a full h100 block of them
  // plus c = 1.5, above 2^31 quanta. Expected: the exact sum (exact in double here)
  // truncated to fp32, as the adder's rz rounding gives for fp32 output.
  auto truncated_to_fp32 = [](double exact) {
    float f = static_cast<float>(exact);
    if (std::fabs(static_cast<double>(f)) > std::fabs(exact)) f = std::nextafter(f, 0.0f);
    return static_cast<double>(f);
  };
  const double largest = 2047.0 / 1024.0;
  struct Edge {
    emu::UnitKind preset;
    int kept;      // the preset's kept fraction bits (Khattak and Mikaitis: 23 + 0, 1, 2)
    int products;  // how many largest products
    double c;
  };
  const Edge edges[] = {
      {emu::UnitKind::v100, 23, 1, 32759 * std::ldexp(1.0, -23)},    // 4190209 * 8 + 32759 = 2^25 - 1
      {emu::UnitKind::a100, 24, 1, 65519 * std::ldexp(1.0, -24)},    // 4190209 * 16 + 65519 = 2^26 - 1
      {emu::UnitKind::h100, 25, 1, 131039 * std::ldexp(1.0, -25)},   // 4190209 * 32 + 131039 = 2^27 - 1
      {emu::UnitKind::h100, 25, 16, 1.5},                            // 16 * 4190209 * 32 + 1.5 * 2^25 > 2^31
      {emu::UnitKind::v100, 23, 4, -32759 * std::ldexp(1.0, -23)},  // negative c
  };
  for (const Edge& edge : edges) {
    const auto unit = emu::make_unit(edge.preset, emu::fp16(), emu::fp32());
    const std::size_t k = static_cast<std::size_t>(edge.products), n = 9;  // n: not a whole panel
    std::vector<double> A(k, largest), B(k * n, largest), C(n, edge.c);
    const double exact = edge.products * largest * largest + edge.c;
    emu::Context gemm_ctx, dot_ctx;
    unit->gemm(gemm_ctx, 1, n, k, A.data(), k, B.data(), n, C.data(), n);
    const double expected = unit->dot(dot_ctx, k, A.data(), 1, B.data(), n, edge.c);
    INFO(emu::unit_kind_name(edge.preset) << ", " << edge.products << " products, c = " << edge.c);
    CHECK(expected == truncated_to_fp32(exact));
    for (double d : C) CHECK(bits(d) == bits(expected));
    CHECK(int{gemm_ctx.status()} == int{dot_ctx.status()});
  }
}

namespace {

// gemm against dot() per element under one control, each dot as its gemm element
// (fp_counts::gemm_element): values, status, counts and the trap report.
void check_elements_against_dot(const emu::MatrixUnit& unit, const emu::FpControl& control, const Problem& p,
                                const std::string& label) {
  std::vector<double> C = p.C, expected = p.C;
  emu::Context gemm_ctx(control), dot_ctx(control);
  std::optional<emu::TrapReport> gemm_trap, dot_trap;
  try {
    const emu::Scope scope(gemm_ctx, "layer.wo");
    unit.gemm(gemm_ctx, p.m, p.n, p.k, p.A.data(), p.k, p.B.data(), p.n, C.data(), p.n);
  } catch (const emu::FpException& e) {
    gemm_trap = e.report();
  }
  try {
    const emu::Scope scope(dot_ctx, "layer.wo");
    for (std::size_t i = 0; i < p.m; ++i)
      for (std::size_t j = 0; j < p.n; ++j) {
        const auto element = fp_counts::gemm_element(dot_ctx, i, j, p.n);
        expected[i * p.n + j] =
            unit.dot(dot_ctx, p.k, p.A.data() + i * p.k, 1, p.B.data() + j, p.n, p.C[i * p.n + j]);
      }
  } catch (const emu::FpException& e) {
    dot_trap = e.report();
  }
  INFO(label);
  REQUIRE(gemm_trap.has_value() == dot_trap.has_value());
  if (gemm_trap) fp_counts::check_same_report(*gemm_trap, *dot_trap);
  for (std::size_t e = 0; e < p.m * p.n; ++e) CHECK(fp_counts::same_value(C[e], expected[e]));
  CHECK(int{gemm_ctx.status()} == int{dot_ctx.status()});
  fp_counts::check_same_counts(gemm_ctx.counts(), dot_ctx.counts());
}

}  // namespace

TEST_CASE("every unit's gemm reports elements: counts and traps equal dot() per element in row-major order",
          "[mma][gemm][provenance]") {
  // Counting OFLO and INV keeps the tensor cores' column adder (INEXACT and UFLO gather
  // per gemm); counting or trapping INEXACT or UFLO raises them per element. The other
  // units (AMP, exact, sequential) go through their own gemm.
  emu::FpControl count_ieee_traps, count_all, trap_oflo_inv, trap_uflo;
  count_ieee_traps.counted = emu::OFLO | emu::DIV0 | emu::INV;
  count_all.counted = emu::OFLO | emu::DIV0 | emu::INV | emu::UFLO | emu::INEXACT;
  trap_oflo_inv.traps = emu::OFLO | emu::INV;
  trap_uflo.traps = emu::UFLO;
  std::mt19937_64 gen(99);
  struct Case {
    emu::UnitKind kind;
    const char* in;
    const char* out;
  };
  const Case cases[] = {
      {emu::UnitKind::v100, "fp16", "fp32"},     {emu::UnitKind::a100, "bf16", "fp32"},
      {emu::UnitKind::h100, "fp8-e4m3", "fp16"}, {emu::UnitKind::ada, "fp8-e5m2", "fp32"},
      {emu::UnitKind::t4, "fp16", "fp16"},       {emu::UnitKind::ipu_amp, "fp16", "fp32"},
      {emu::UnitKind::ipu_amp_half, "fp16", "fp16"}, {emu::UnitKind::exact, "fp16", "fp16"},
      {emu::UnitKind::fp16_seq, "fp16", "fp16"}, {emu::UnitKind::fp32_seq, "bf16", "fp32"},
  };
  for (const Case& c : cases) {
    const auto unit = emu::make_unit(c.kind, emu::format_by_name(c.in), emu::format_by_name(c.out));
    for (Scenario s : {Scenario::overflow, Scenario::subnormals, Scenario::special_values, Scenario::normal})
      for (const emu::FpControl& control : {count_ieee_traps, count_all, trap_oflo_inv, trap_uflo}) {
        const Problem p = make_problem(gen, 3, 21, 19, unit->input_format(), unit->output_format(), s);
        check_elements_against_dot(*unit, control, p,
                                   std::string(emu::unit_kind_name(c.kind)) + " " + c.in + " -> " + c.out + ", " +
                                       scenario_name(s) + ", counted " + std::to_string(control.counted) +
                                       ", traps " + std::to_string(control.traps));
      }
  }
}

TEST_CASE("tensor-core gemm: an overflowing element is counted and reported as [row, col]", "[mma][gemm][provenance]") {
  const emu::Format in = emu::bf16();
  const auto unit = emu::make_unit(emu::UnitKind::a100, in, emu::fp32());
  const std::size_t m = 4, n = 20, k = 8;
  std::vector<double> A(m * k, 1.0), B(k * n, 1.0), C(m * n, 0.5);
  A[2 * k + 3] = in.max_finite();
  B[3 * n + 17] = in.max_finite();  // element (2, 17) overflows binary32
  emu::FpControl control;
  control.counted = emu::OFLO;
  emu::Context ctx(control);
  unit->gemm(ctx, m, n, k, A.data(), k, B.data(), n, C.data(), n);
  REQUIRE(ctx.counts().size() == 1);
  CHECK(ctx.counts()[0].op == "mma");
  CHECK(ctx.counts()[0].count == 1);
  CHECK(ctx.counts()[0].first_element.to_string() == "[2, 17]");
  CHECK(ctx.counts()[0].first_element.flat == 2 * 20 + 17);
  CHECK(std::isinf(ctx.counts()[0].first_result));
}

// One GEMM's outcome under `control`: C, status, counts and the trap report, if one fired.
struct Outcome {
  std::vector<double> C;
  emu::Flags status = 0;
  std::vector<emu::OpCount> counts;
  std::optional<emu::TrapReport> trap;
};

Outcome run_gemm(const emu::MatrixUnit& unit, const emu::FpControl& control, const Problem& p) {
  Outcome o{p.C, 0, {}, std::nullopt};
  emu::Context ctx(control);
  try {
    unit.gemm(ctx, p.m, p.n, p.k, p.A.data(), p.k, p.B.data(), p.n, o.C.data(), p.n);
  } catch (const emu::FpException& e) {
    o.trap = e.report();
  }
  o.status = ctx.status();
  o.counts = ctx.counts();
  return o;
}

// Every bit of C, the status, the counts and the trap report of `fast` equal those of
// `reference` (INFO says which run they are).
void check_same_outcome(const Outcome& fast, const Outcome& reference) {
  std::size_t mismatches = 0, first = 0;
  for (std::size_t e = 0; e < fast.C.size(); ++e)
    if (bits(fast.C[e]) != bits(reference.C[e]) && mismatches++ == 0) first = e;
  if (mismatches != 0)
    FAIL_CHECK(mismatches << " of " << fast.C.size() << " elements differ, the first at index " << first << ": "
                          << std::hexfloat << fast.C[first] << ", reference " << reference.C[first]);
  CHECK(int{fast.status} == int{reference.status});
  fp_counts::check_same_counts(fast.counts, reference.counts);
  REQUIRE(fast.trap.has_value() == reference.trap.has_value());
  if (fast.trap) fp_counts::check_same_report(*fast.trap, *reference.trap);
}

// Plain, counting everything (the reference adder per element), trapping OFLO and INV
// (the column adder, the reference for the elements that overflow), trapping UFLO.
std::vector<emu::FpControl> adder_controls() {
  emu::FpControl plain, count_all, trap_oflo_inv, trap_uflo;
  count_all.counted = emu::OFLO | emu::DIV0 | emu::INV | emu::UFLO | emu::INEXACT;
  trap_oflo_inv.traps = emu::OFLO | emu::INV;
  trap_uflo.traps = emu::UFLO;
  return {plain, count_all, trap_oflo_inv, trap_uflo};
}

std::string describe(const Combination& combo, Scenario s, const Problem& p, const emu::FpControl& control) {
  std::ostringstream out;
  out << emu::unit_kind_name(combo.preset) << " " << combo.in << " -> " << combo.out << ", " << scenario_name(s)
      << ", " << p.m << "x" << p.n << "x" << p.k << ", counted " << int{control.counted} << ", traps "
      << int{control.traps};
  return out.str();
}

TEST_CASE("tensor-core gemm: the AVX-512 column adder equals the AVX2 one (values, flags, counts, traps)",
          "[mma][gemm]") {
  // The column adder runs on 64-byte vectors where the CPU has AVX-512 (the default) and
  // on 32-byte ones otherwise (detail::select_panel_adder); the two must not differ in a
  // bit. Random shapes (partial panels of 16 columns, k across block boundaries), every
  // preset and format pair, every scenario, plain, counting everything and trapping.
  if (!emu::detail::select_panel_adder(1)) {
    WARN("no AVX-512 on this CPU: only the AVX2 column adder runs here");
    return;
  }
  struct Restore {
    ~Restore() { emu::detail::select_panel_adder(1); }
  } restore;
  std::mt19937_64 gen(512);
  std::uniform_int_distribution<std::size_t> rows(1, 7), cols(1, 53), depth(1, 90);
  std::size_t problems = 0;
  for (const Combination& combo : combinations()) {
    const auto unit = emu::make_unit(combo.preset, emu::format_by_name(combo.in), emu::format_by_name(combo.out));
    for (Scenario s : kScenarios)
      for (const emu::FpControl& control : adder_controls()) {
        const Problem p = make_problem(gen, rows(gen), cols(gen), depth(gen), unit->input_format(),
                                       unit->output_format(), s);
        REQUIRE(emu::detail::select_panel_adder(1));
        const Outcome wide = run_gemm(*unit, control, p);
        REQUIRE(emu::detail::select_panel_adder(0));
        const Outcome narrow = run_gemm(*unit, control, p);
        ++problems;
        INFO(describe(combo, s, p, control) << "; AVX-512 against AVX2");
        check_same_outcome(wide, narrow);
      }
  }
  CHECK(problems >= 20 * 6 * 4);
}

TEST_CASE("tensor-core gemm: the column adder's float products equal its integer shifts at 1, 2 and 3 threads",
          "[mma][gemm]") {
  // The column adder sums a block's products in float where the operands' exponents
  // allow (the default) and by integer shifts otherwise (detail::select_product_adder:
  // the reference); at either vector width and any number of GEMM threads the two must
  // not differ in a bit. Random shapes, up to 300 rows so that 2 and 3 threads take
  // bands; every preset and format pair, every scenario (moderate_spread puts bf16 rows
  // and columns on both sides of the float products' limit); plain, counting everything
  // and trapping. Inside an arena of 4 threads (oneTBB limited to 4), so that 3 threads
  // run even on fewer cores.
  struct Restore {
    ~Restore() {
      emu::detail::select_product_adder(1);
      emu::detail::select_panel_adder(1);
      emu::set_gemm_threads(0);
    }
  } restore;
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);
  std::mt19937_64 gen(2022);
  std::uniform_int_distribution<std::size_t> rows(1, 300), cols(1, 53), depth(1, 90);
  std::uniform_int_distribution<int> threads(1, 3), width(0, 1);
  std::size_t problems = 0, threaded = 0;
  for (const Combination& combo : combinations()) {
    const auto unit = emu::make_unit(combo.preset, emu::format_by_name(combo.in), emu::format_by_name(combo.out));
    for (Scenario s : kScenarios)
      for (const emu::FpControl& control : adder_controls()) {
        const Problem p = make_problem(gen, rows(gen), cols(gen), depth(gen), unit->input_format(),
                                       unit->output_format(), s);
        const int fast_threads = threads(gen), reference_threads = threads(gen);
        // The 64-byte width where the CPU has it (false and unchanged where not).
        emu::detail::select_panel_adder(width(gen));
        Outcome fast, reference;
        arena.execute([&] {
          REQUIRE(emu::detail::select_product_adder(1));
          emu::set_gemm_threads(fast_threads);
          fast = run_gemm(*unit, control, p);
          REQUIRE(emu::detail::select_product_adder(0));
          emu::set_gemm_threads(reference_threads);
          reference = run_gemm(*unit, control, p);
        });
        ++problems;
        if (p.m > 128 && std::max(fast_threads, reference_threads) > 1) ++threaded;
        INFO(describe(combo, s, p, control) << "; float products on " << fast_threads
                                            << " threads against integer shifts on " << reference_threads);
        check_same_outcome(fast, reference);
      }
  }
  CHECK(problems >= 20 * 9 * 4);
  CHECK(threaded >= problems / 4);
}

TEST_CASE("tensor-core gemm equals dot() per element on many rows, at 1, 2 and 3 threads", "[mma][gemm]") {
  // The column adder takes rows in groups (several at once), in chunks (each through
  // every panel and then written to C) and in bands (threads), with B decoded once for
  // all bands: 130 rows cross each of those boundaries, with a remainder. Values bit for
  // bit and the whole product's status, against dot() per element.
  struct Restore {
    ~Restore() { emu::set_gemm_threads(0); }
  } restore;
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);
  std::mt19937_64 gen(130);
  for (const Combination& combo : combinations()) {
    const auto unit = emu::make_unit(combo.preset, emu::format_by_name(combo.in), emu::format_by_name(combo.out));
    for (Scenario s : {Scenario::normal, Scenario::sparse, Scenario::moderate_spread, Scenario::lost_bits,
                       Scenario::subnormals, Scenario::special_values}) {
      const Problem p = make_problem(gen, 130, 19, 50, unit->input_format(), unit->output_format(), s);
      const int threads = std::uniform_int_distribution<int>(1, 3)(gen);
      std::vector<double> C = p.C;
      emu::Context gemm_ctx;
      arena.execute([&] {
        emu::set_gemm_threads(threads);
        unit->gemm(gemm_ctx, p.m, p.n, p.k, p.A.data(), p.k, p.B.data(), p.n, C.data(), p.n);
      });
      emu::Context dot_ctx;
      std::size_t mismatches = 0, first = 0;
      for (std::size_t i = 0; i < p.m; ++i)
        for (std::size_t j = 0; j < p.n; ++j) {
          const double expected =
              unit->dot(dot_ctx, p.k, p.A.data() + i * p.k, 1, p.B.data() + j, p.n, p.C[i * p.n + j]);
          if (bits(C[i * p.n + j]) != bits(expected) && mismatches++ == 0) first = i * p.n + j;
        }
      INFO(describe(combo, s, p, {}) << " on " << threads << " threads; first mismatch at " << first);
      CHECK(mismatches == 0);
      CHECK(int{gemm_ctx.status()} == int{dot_ctx.status()});
    }
  }
}
