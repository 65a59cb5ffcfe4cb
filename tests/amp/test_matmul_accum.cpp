// The matmul_accum experiment in process: find_experiment("matmul_accum")->run.
#include <catch2/catch.hpp>

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

RunResult run(const std::map<std::string, ParamValue>& changes, std::uint32_t replica = 0) {
  return testing::run_experiment("matmul_accum", changes, emu::StreamId{2024, 0, replica, 0});
}

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
