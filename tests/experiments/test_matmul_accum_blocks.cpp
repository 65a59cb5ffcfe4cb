// matmul_accum with a block format on b200: Blackwell's block-scaled MMA on the quantised
// rows of A and columns of B. The test draws the experiment's matrices itself (its
// documented data stream), quantises them, runs BlockMmaUnit::gemm with nvfp4's alpha
// applied by the host's fp32 fma, and computes the metrics against exact sums of the
// dequantised values (tests/core/reference.hpp, Boost integers); the exact unit at the
// same point must see the same dequantised matrices. Also: the refusals, and -j1 = -j2
// through build/sweep with the shipped config planned.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/reference.hpp"
#include "emu/block.hpp"
#include "emu/block_mma.hpp"
#include "emu/cdna.hpp"
#include "emu/round.hpp"
#include "emu/rng.hpp"
#include "experiments/experiment.hpp"
#include "tests/run_experiment.hpp"
#include "tests/experiments/sweep_checks.hpp"
#include "tests/sweep/support.hpp"

using roundoff::ParamValue;
using roundoff::testing::run_experiment;

namespace {

using Overrides = std::map<std::string, ParamValue>;

constexpr std::uint64_t kSeed = 2024;
constexpr std::size_t kRows = 8, kCols = 8;  // M and N: the experiment's defaults

struct Case {
  std::string format;
  std::string distribution;
  double spread;
  std::string sign;
  std::size_t k;
};

Overrides overrides(const Case& c, const std::string& unit) {
  return {{"unit", unit},
          {"in_format", c.format},
          {"K", static_cast<std::int64_t>(c.k)},
          {"distribution", c.distribution},
          {"spread", c.spread},
          {"sign", c.sign}};
}

roundoff::RunResult run(const Case& c, const std::string& unit) {
  return run_experiment("matmul_accum", overrides(c, unit), emu::StreamId{kSeed, 7, 0, 0});
}

// One entry as matmul_accum draws it (its header: uniform01, normal magnitudes,
// lognormal; a random sign for mixed).
double draw(emu::Rng& rng, const Case& c) {
  double magnitude = c.distribution == "uniform01" ? rng.uniform()
                     : c.distribution == "normal"  ? std::fabs(rng.normal())
                                                   : std::exp(c.spread * rng.normal());
  if (c.sign == "mixed" && (rng.next_u64() & 1)) magnitude = -magnitude;
  return magnitude;
}

// The data stream: the run's seed and replica, lane 1, the point replaced by the hash
// of the parameters the matrices depend on.
emu::Rng data_rng(const Case& c) {
  std::string key = "matmul_accum data;M=" + std::to_string(kRows) + ";N=" + std::to_string(kCols) +
                    ";K=" + std::to_string(c.k) + ";distribution=" + c.distribution + ";sign=" + c.sign +
                    ";in=" + c.format;
  if (c.distribution == "lognormal") key += ";spread=" + std::to_string(std::bit_cast<std::uint64_t>(c.spread));
  return emu::Rng(emu::StreamId{kSeed, roundoff::stable_hash32(key), 0, 1});
}

// `values` (rows of k) quantised row by row with the format's default rule and, for
// nvfp4, the one tensor scale of all of them.
std::vector<emu::BlockQuantized> quantized(const emu::BlockFormat& f, const std::vector<double>& values,
                                           std::size_t k) {
  emu::BlockSpec spec = emu::default_block_spec(f);
  if (f.has_tensor_scale()) spec.tensor_scale = emu::default_tensor_scale(f, values);
  std::vector<emu::BlockQuantized> out;
  for (std::size_t first = 0; first < values.size(); first += k)
    out.push_back(emu::quantize(f, std::span<const double>(values).subspan(first, k), spec, nullptr));
  return out;
}

const ref::Spec kFp32{8, 23}, kFp64{11, 52};

// |n| / |d| rounded to the nearest double (d != 0).
double ratio(const ref::Dyadic& n, const ref::Dyadic& d) {
  if (n.m == 0) return 0;
  ref::Real r;
  r.num = abs(n.m);
  r.den = abs(d.m);
  if (n.e >= d.e)
    r.num <<= n.e - d.e;
  else
    r.den <<= d.e - n.e;
  return ref::round(r, kFp64, emu::Rounding::rne, emu::Overflow::inf).value;
}

struct Metrics {
  double max_rel = 0, mean_rel = 0, frac_exact = 0;
};

// The metrics of results C against exact sums (finite results, exact sums not zero).
Metrics metrics_of(const std::vector<double>& C, const std::vector<ref::Dyadic>& exact) {
  Metrics m;
  double sum = 0;
  std::size_t counted = 0, exact_results = 0;
  for (std::size_t e = 0; e < C.size(); ++e) {
    REQUIRE(std::isfinite(C[e]));
    const ref::Dyadic diff = ref::add(ref::dyadic(C[e]), ref::mul(exact[e], ref::Dyadic{-1, 0}));
    if (diff.m == 0) ++exact_results;
    if (exact[e].m == 0) continue;
    const double rel = ratio(diff, exact[e]);
    m.max_rel = std::max(m.max_rel, rel);
    sum += rel;
    ++counted;
  }
  REQUIRE(counted > 0);
  m.mean_rel = sum / static_cast<double>(counted);
  m.frac_exact = static_cast<double>(exact_results) / static_cast<double>(C.size());
  return m;
}

void check_metrics(const roundoff::RunResult& r, const Metrics& expected) {
  CHECK(r.metrics.at("frac_nonfinite") == 0);
  CHECK(r.metrics.at("frac_exact") == expected.frac_exact);
  CHECK(r.metrics.at("max_rel_error") == Approx(expected.max_rel).epsilon(1e-12).margin(0));
  CHECK(r.metrics.at("mean_rel_error") == Approx(expected.mean_rel).epsilon(1e-12).margin(0));
}

}  // namespace

TEST_CASE("matmul_accum on b200 with a block format is BlockMmaUnit::gemm on the quantised operands",
          "[matmul_accum][block_mma]") {
  std::vector<Case> cases;
  for (const char* format : {"mxfp8-e4m3", "mxfp6-e2m3", "mxfp4-e2m1", "nvfp4"}) {
    cases.push_back({format, "uniform01", 1.0, "positive", 200});  // a last short instruction and block
    cases.push_back({format, "lognormal", 4.0, "mixed", 1000});     // scales that differ from block to block
  }
  bool some_error = false;
  for (const Case& c : cases) {
    INFO(c.format << ", " << c.distribution << " " << c.sign << ", K = " << c.k);
    const emu::BlockFormat& f = emu::block_format_by_name(c.format);
    emu::Rng rng = data_rng(c);
    std::vector<double> A(kRows * c.k), B(c.k * kCols), Bt(kCols * c.k);
    for (double& x : A) x = draw(rng, c);
    for (double& x : B) x = draw(rng, c);  // row-major, k x n
    for (std::size_t q = 0; q < c.k; ++q)
      for (std::size_t j = 0; j < kCols; ++j) Bt[j * c.k + q] = B[q * kCols + j];
    const std::vector<emu::BlockQuantized> rows = quantized(f, A, c.k), cols = quantized(f, Bt, c.k);

    // The block-scaled MMA from zero; nvfp4: d = fp32(alpha * r + 0), alpha =
    // fp32(ts_a * ts_b) (the double product of two fp32 values is exact; the host
    // rounds each once, to nearest even).
    const auto unit = emu::make_block_mma_unit(emu::UnitKind::b200, f, f);
    emu::Context ctx;
    std::vector<double> C(kRows * kCols, 0.0);
    unit->gemm(ctx, rows, cols, C.data(), kCols);
    if (f.has_tensor_scale()) {
      const float alpha = static_cast<float>(rows[0].tensor_scale * cols[0].tensor_scale);
      for (double& v : C) v = std::fmaf(alpha, static_cast<float>(v), 0.0f);
    }

    // The exact sums of the dequantised values, and the exact unit's results: each sum
    // rounded once into fp32.
    std::vector<ref::Dyadic> exact(kRows * kCols);
    std::vector<double> exact_unit(kRows * kCols);
    for (std::size_t i = 0; i < kRows; ++i)
      for (std::size_t j = 0; j < kCols; ++j) {
        ref::Dyadic sum;
        for (std::size_t q = 0; q < c.k; ++q)
          sum = ref::add(sum, ref::mul(ref::dyadic(rows[i].value(q, f)), ref::dyadic(cols[j].value(q, f))));
        exact[i * kCols + j] = sum;
        exact_unit[i * kCols + j] =
            ref::round_in(ref::real(sum), kFp32, emu::Rounding::rne, emu::Overflow::inf).value;
      }

    const Metrics b200 = metrics_of(C, exact);
    some_error = some_error || b200.max_rel > 0;
    check_metrics(run(c, "b200"), b200);
    check_metrics(run(c, "exact"), metrics_of(exact_unit, exact));
  }
  CHECK(some_error);  // the comparison is not between zeros only
}

TEST_CASE("matmul_accum: nvfp4's epilogue rounds under the run's rounding; the MX MMA ignores it",
          "[matmul_accum][block_mma]") {
  auto mean_error = [](const std::string& format, const std::string& rounding) {
    return run_experiment("matmul_accum", {{"unit", std::string("b200")}, {"in_format", format},
                                           {"K", std::int64_t{512}}, {"rounding", rounding}})
        .metrics.at("mean_rel_error");
  };
  CHECK(mean_error("nvfp4", "ru") != mean_error("nvfp4", "rd"));
  CHECK(mean_error("mxfp8-e4m3", "ru") == mean_error("mxfp8-e4m3", "rd"));
}

TEST_CASE("matmul_accum: block formats on units that cannot take them are refused, naming b200",
          "[matmul_accum][block_mma]") {
  const roundoff::Experiment* e = roundoff::find_experiment("matmul_accum");
  REQUIRE(e != nullptr);
  auto problem = [&](const Overrides& o) { return e->check_point(roundoff::testing::params_with(*e, o)); };
  const std::string mxint8 = problem({{"unit", std::string("b200")}, {"in_format", std::string("mxint8")}});
  CHECK_THAT(mxint8, Catch::Contains("mxint8") && Catch::Contains("integer"));
  for (const char* unit : {"h100", "a100", "ipu-amp"}) {
    INFO(unit);
    CHECK_THAT(problem({{"unit", std::string(unit)}, {"in_format", std::string("nvfp4")}}),
               Catch::Contains("b200") && Catch::Contains(unit));
  }
  CHECK_THAT(problem({{"unit", std::string("b200")}, {"in_format", std::string("mxfp8-e4m3")},
                      {"out_format", std::string("fp16")}}),
             Catch::Contains("fp32 output only"));
  CHECK_THAT(problem({{"unit", std::string("b200")}, {"in_format", std::string("nvfp4")}, {"fused", false}}),
             Catch::Contains("fp32-seq and fp16-seq"));
  for (const char* out : {"default", "fp32"})
    CHECK(problem({{"unit", std::string("b200")}, {"in_format", std::string("mxfp6-e3m2")},
                   {"out_format", std::string(out)}})
              .empty());
  // mxint8's dequantised values still go to the reference units.
  CHECK(problem({{"unit", std::string("exact")}, {"in_format", std::string("mxint8")}}).empty());
}

TEST_CASE("matmul_accum with mixed inputs A:B (mi300x): A rounded into A's format, B into B's",
          "[matmul_accum][mixed]") {
  const emu::Format &e4m3 = emu::fp8_e4m3fnuz(), &e5m2 = emu::fp8_e5m2fnuz();
  for (const auto& [pair, a_format, b_format] :
       {std::tuple{"fp8-e4m3fnuz:fp8-e5m2fnuz", &e4m3, &e5m2}, std::tuple{"fp8-e5m2fnuz:fp8-e4m3fnuz", &e5m2, &e4m3}}) {
    INFO(pair);
    const Case c{pair, "lognormal", 3.0, "mixed", 100};
    emu::Rng rng = data_rng(c);
    std::vector<double> A(kRows * c.k), B(c.k * kCols);
    const emu::RoundSpec saturating{emu::Rounding::rne, emu::Overflow::saturate, 0};
    for (auto [v, f] : {std::pair{&A, a_format}, std::pair{&B, b_format}})
      for (double& x : *v) {
        emu::Flags ignored = 0;
        x = emu::round(*f, draw(rng, c), saturating, nullptr, ignored);
      }
    const auto unit = emu::make_cdna_unit(emu::UnitKind::mi300x, *a_format, *b_format, std::nullopt);
    emu::Context ctx;
    std::vector<double> C(kRows * kCols, 0.0);
    unit->gemm(ctx, kRows, kCols, c.k, A.data(), c.k, B.data(), kCols, C.data(), kCols);
    std::vector<ref::Dyadic> exact(kRows * kCols);
    for (std::size_t i = 0; i < kRows; ++i)
      for (std::size_t j = 0; j < kCols; ++j)
        for (std::size_t q = 0; q < c.k; ++q)
          exact[i * kCols + j] =
              ref::add(exact[i * kCols + j], ref::mul(ref::dyadic(A[i * c.k + q]), ref::dyadic(B[q * kCols + j])));
    const Metrics want = metrics_of(C, exact);
    CHECK(want.max_rel > 0);
    check_metrics(run(c, "mi300x"), want);
  }
  const roundoff::Experiment* e = roundoff::find_experiment("matmul_accum");
  REQUIRE(e != nullptr);
  CHECK_THAT(e->check_point(roundoff::testing::params_with(
                 *e, {{"unit", std::string("h100")}, {"in_format", std::string("fp8-e4m3fnuz:fp8-e5m2fnuz")}})),
             Catch::Contains("in_format fp8-e4m3fnuz:fp8-e5m2fnuz on unit h100") && Catch::Contains("mi300x"));
  CHECK_THAT(e->check_point(roundoff::testing::params_with(
                 *e, {{"unit", std::string("mi300x")}, {"in_format", std::string("fp8-e4m3fnuz:fp16")}})),
             Catch::Contains("in_format") && Catch::Contains("fp8-e5m2fnuz"));
}

TEST_CASE("matmul_accum on b200 through sweep: -j1 and -j2 give the same file; configs/block_mma.yaml plans",
          "[matmul_accum][block_mma][sweep]") {
  sweep_test::TempDir dir;
  experiments_test::check_threads_agree_and_shipped_config_plans(
      dir,
      "experiment: matmul_accum\nseed: 3\nreplicas: 2\ngrid:\n  K: [96, 640]\n"
      "  distribution: normal\n  sign: mixed\n  rounding: [rne, ru]\n"
      "zip:\n  unit: [b200, b200, b200, exact]\n"
      "  in_format: [mxfp8-e5m2, mxfp4-e2m1, nvfp4, nvfp4]\n",
      "block_mma.yaml");
}
