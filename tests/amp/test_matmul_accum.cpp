// The matmul_accum experiment in process: find_experiment("matmul_accum")->run.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "experiments/experiment.hpp"
#include "tests/run_experiment.hpp"

using namespace roundoff;

namespace {

const Experiment& experiment() {
  const Experiment* e = find_experiment("matmul_accum");
  REQUIRE(e != nullptr);
  return *e;
}

Params params(const std::map<std::string, ParamValue>& changes) { return testing::params_with(experiment(), changes); }

RunResult run(const std::map<std::string, ParamValue>& changes, std::uint32_t replica = 0, std::uint32_t point = 0) {
  return testing::run_experiment("matmul_accum", changes, emu::StreamId{2024, point, replica, 0});
}

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }

}  // namespace

TEST_CASE("matmul_accum: declared metrics, parameters checked", "[matmul_accum]") {
  const Experiment& e = experiment();
  CHECK(e.headline_metric == "mean_rel_error");
  const RunResult r = run({{"unit", std::string("fp32-seq")}, {"K", std::int64_t{100}}});
  for (const MetricSpec& m : e.metrics) CHECK(r.metrics.count(m.name) == 1);
  CHECK(r.metrics.at("bound_det") == Approx(100 * 0x1p-24));
  CHECK(r.metrics.at("bound_prob") == Approx(10 * 0x1p-24));
  // ipu-amp-half writes fp16: an fp32 output is refused at check time, with a reason.
  CHECK_FALSE(e.check_point(params({{"unit", std::string("ipu-amp-half")}, {"out_format", std::string("fp32")}}))
                  .empty());
  CHECK(e.check_point(params({{"unit", std::string("ipu-amp")}, {"out_format", std::string("")}})).empty());
}

TEST_CASE("matmul_accum: the exact unit has zero error", "[matmul_accum]") {
  for (const char* distribution : {"uniform01", "normal", "lognormal"}) {
    const RunResult r = run({{"unit", std::string("exact")},
                             {"K", std::int64_t{300}},
                             {"distribution", std::string(distribution)},
                             {"sign", std::string("mixed")},
                             {"out_format", std::string("fp64")}});
    INFO(distribution);
    CHECK(r.metrics.at("max_rel_error") == 0.0);
    CHECK(r.metrics.at("frac_exact") == 1.0);
  }
}

TEST_CASE("matmul_accum: fp16-seq error grows with K", "[matmul_accum]") {
  const double small = run({{"unit", std::string("fp16-seq")}, {"K", std::int64_t{16}}}).metrics.at("mean_rel_error");
  const double large = run({{"unit", std::string("fp16-seq")}, {"K", std::int64_t{4096}}}).metrics.at("mean_rel_error");
  INFO("K=16: " << small << "  K=4096: " << large);
  CHECK(large > 10 * small);
}

TEST_CASE("matmul_accum: ipu-amp-half with sr beats rne at large K; fp32 partials beat both", "[matmul_accum]") {
  const std::int64_t k = 65536;
  const double rne =
      run({{"unit", std::string("ipu-amp-half")}, {"K", k}, {"rounding", std::string("rne")}}).metrics.at("mean_rel_error");
  const double sr =
      run({{"unit", std::string("ipu-amp-half")}, {"K", k}, {"rounding", std::string("sr")}}).metrics.at("mean_rel_error");
  const double fp32 = run({{"unit", std::string("ipu-amp")}, {"K", k}}).metrics.at("mean_rel_error");
  INFO("rne " << rne << "  sr " << sr << "  fp32 partials " << fp32);
  CHECK(sr < rne / 4);
  CHECK(fp32 < sr);
}

TEST_CASE("matmul_accum: common random numbers: the matrices do not depend on the unit or the point", "[matmul_accum]") {
  // t4 and a100 are the same adder for fp16 inputs (block 8, one extra bit), as are ada
  // and l40s: at different points of a grid they see the same matrices, so their metrics
  // agree bit for bit.
  auto at_point = [](const char* unit, std::uint32_t point) {
    return run({{"unit", std::string(unit)},
                {"K", std::int64_t{512}},
                {"distribution", std::string("normal")},
                {"sign", std::string("mixed")}},
               0, point);
  };
  for (const auto& [first, second] : {std::pair{"t4", "a100"}, std::pair{"ada", "l40s"}}) {
    const RunResult x = at_point(first, 3);
    const RunResult y = at_point(second, 11);
    INFO(first << " vs " << second);
    CHECK(bits(x.metrics.at("mean_rel_error")) == bits(y.metrics.at("mean_rel_error")));
    CHECK(bits(x.metrics.at("max_rel_error")) == bits(y.metrics.at("max_rel_error")));
    CHECK(x.metrics.at("mean_rel_error") > 0);
  }
  // The data does change with the replica, K, the distribution and the input format.
  const std::map<std::string, ParamValue> base{{"unit", std::string("a100")}, {"K", std::int64_t{512}}};
  const double reference = run(base).metrics.at("mean_rel_error");
  CHECK(run(base, 1).metrics.at("mean_rel_error") != reference);
  auto changed = [&](const std::string& name, ParamValue value) {
    auto p = base;
    p[name] = std::move(value);
    return run(p).metrics.at("mean_rel_error");
  };
  CHECK(changed("K", std::int64_t{513}) != reference);
  CHECK(changed("distribution", std::string("normal")) != reference);
  CHECK(changed("in_format", std::string("bf16")) != reference);
  // spread is read by lognormal only: it does not change uniform01 data.
  CHECK(changed("spread", 3.0) == reference);
}

TEST_CASE("matmul_accum: non-finite results are counted apart; the errors cover the finite ones", "[matmul_accum]") {
  // fp16-seq on lognormal data with spread 4: some sums overflow fp16 (inf), others stay
  // finite.
  const RunResult r = run({{"unit", std::string("fp16-seq")},
                           {"K", std::int64_t{64}},
                           {"M", std::int64_t{16}},
                           {"N", std::int64_t{16}},
                           {"distribution", std::string("lognormal")},
                           {"spread", 4.0}});
  const double nonfinite = r.metrics.at("frac_nonfinite");
  INFO("frac_nonfinite " << nonfinite);
  CHECK(nonfinite > 0);
  CHECK(nonfinite < 1);
  CHECK(std::isfinite(r.metrics.at("max_rel_error")));
  CHECK(std::isfinite(r.metrics.at("mean_rel_error")));
  CHECK(r.metrics.at("mean_rel_error") <= r.metrics.at("max_rel_error"));
  CHECK((r.flags & emu::OFLO) != 0);
  // Everything overflows: no finite element, both errors NaN (undefined), not inf.
  const RunResult all = run({{"unit", std::string("fp16-seq")},
                             {"K", std::int64_t{64}},
                             {"distribution", std::string("lognormal")},
                             {"spread", 20.0}});
  CHECK(all.metrics.at("frac_nonfinite") == 1.0);
  CHECK(std::isnan(all.metrics.at("max_rel_error")));
  CHECK(std::isnan(all.metrics.at("mean_rel_error")));
  CHECK(run({{"unit", std::string("fp32-seq")}}).metrics.at("frac_nonfinite") == 0.0);
}

TEST_CASE("matmul_accum: fused = false rounds each product first (fp32-seq and fp16-seq only)", "[matmul_accum]") {
  const std::map<std::string, ParamValue> base{
      {"unit", std::string("fp16-seq")}, {"K", std::int64_t{256}}, {"sign", std::string("mixed")}};
  auto unfused = base;
  unfused["fused"] = false;
  const double fused_error = run(base).metrics.at("mean_rel_error");
  const double unfused_error = run(unfused).metrics.at("mean_rel_error");
  INFO("fused " << fused_error << " unfused " << unfused_error);
  CHECK(fused_error != unfused_error);
  CHECK(experiment().check_point(params(unfused)).empty());
  CHECK_THAT(experiment().check_point(params({{"unit", std::string("v100")}, {"fused", false}})),
             Catch::Contains("fp32-seq and fp16-seq"));
}
