// The swamping experiment against the Graphcore IPU stochastic-rounding tutorial
// (0.0001 added 10,000 times; fp16 round-to-nearest stalls at 0.25, fp16 SR stays near
// 1.0 with finals spread about 0.97..1.03) and against native float and _Float16 loops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "tests/run_experiment.hpp"

using roundoff::testing::run_experiment;

namespace {

// As in configs/swamping.yaml: seed 2026, 20 replicas, grid format [fp16, fp32] x
// rounding [rne, sr], so point = 2 * format index + rounding index (row-major, last key
// fastest). The statistics below hold for any point index; these make the runs the same
// streams as the shipped sweep.
constexpr std::uint64_t kSeed = 2026;
constexpr std::uint32_t kReplicas = 20;
constexpr int kSteps = 10000;

std::vector<double> finals(const char* format, const char* rounding, std::uint32_t point) {
  std::vector<double> out;
  for (std::uint32_t r = 0; r < kReplicas; ++r) {
    const auto result = run_experiment("swamping", {{"format", format}, {"rounding", rounding}},
                                       emu::StreamId{kSeed, point, r, 0});
    out.push_back(result.metrics.at("final"));
  }
  return out;
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }
double stddev(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

// Oracle: the CPU's binary16 (round-to-nearest-even), the tutorial's loop in _Float16.
struct Float16Loop {
  double final = 0;
  int stagnation_step = -1;  // one past the last step that changed x
};
Float16Loop float16_loop() {
  const _Float16 addend = static_cast<_Float16>(1e-4);  // double -> half, rne
  _Float16 x = 0;
  int last_change = 0;
  for (int k = 1; k <= kSteps; ++k) {
    const _Float16 next = x + addend;
    if (next != x) last_change = k;
    x = next;
  }
  return {static_cast<double>(x), last_change == kSteps ? -1 : last_change + 1};
}

}  // namespace

TEST_CASE("swamping fp16 rne: every replica stalls at exactly 0.25 (IPU tutorial)", "[swamping][golden]") {
  const Float16Loop oracle = float16_loop();
  REQUIRE(oracle.final == 0.25);
  for (double f : finals("fp16", "rne", 0)) CHECK(f == 0.25);

  const auto r = run_experiment("swamping", {{"format", "fp16"}, {"rounding", "rne"}}, {kSeed, 0, 0, 0});
  CHECK(r.metrics.at("stagnation_step") == oracle.stagnation_step);
  CHECK(r.metrics.at("stagnation_step") > 1);
  CHECK((r.flags & emu::INEXACT) != 0);
  CHECK((r.flags & (emu::OFLO | emu::INV | emu::DIV0)) == 0);
}

TEST_CASE("swamping fp16 sr: mean within 0.01 of the exact sum, tutorial-like spread", "[swamping][golden]") {
  // The exact sum of the rounded addend: fp16(1e-4) = 1678 * 2^-24, times 10^4, exact in
  // double (24-bit product).
  const double exact = kSteps * static_cast<double>(static_cast<_Float16>(1e-4));
  REQUIRE(exact == 16780000 * 0x1p-24);

  const auto v = finals("fp16", "sr", 1);
  const double m = mean(v), s = stddev(v);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  INFO("fp16 sr: mean " << m << " std " << s << " min " << *lo << " max " << *hi << " exact " << exact);
  CHECK(std::fabs(m - exact) < 0.01);
  // Tutorial: finals between about 0.97 and 1.03. The random walk's standard deviation
  // is about 0.015 (sum over steps of p(1-p) ulp^2, ulp 2^-11 in [0.5, 1)).
  CHECK(*lo > 0.94);
  CHECK(*hi < 1.06);
  CHECK(s > 0.005);
  CHECK(s < 0.03);

  const auto r = run_experiment("swamping", {{"format", "fp16"}, {"rounding", "sr"}}, {kSeed, 1, 0, 0});
  CHECK(r.metrics.at("exact") == exact);
  CHECK(r.metrics.at("abs_error") == std::fabs(r.metrics.at("final") - exact));
}

TEST_CASE("swamping fp32 rne equals the native float loop", "[swamping][golden]") {
  // Oracle: float arithmetic rounds to nearest even; 1e-4f is the rne conversion.
  float x = 0;
  for (int k = 0; k < kSteps; ++k) x += 1e-4f;
  const double oracle = x;  // 1.0000535249710083 (0x3f8001c1)
  CHECK(std::fabs(oracle - 1.0) < 1e-4);
  for (double f : finals("fp32", "rne", 2)) CHECK(f == oracle);

  const auto v = finals("fp32", "sr", 3);
  CHECK(std::fabs(mean(v) - kSteps * static_cast<double>(1e-4f)) < 1e-4);
}

TEST_CASE("swamping trace: x at step 0, every trace_every steps, last = final", "[swamping]") {
  const auto r = run_experiment("swamping", {{"format", "fp16"}, {"rounding", "rne"}, {"trace_every", std::int64_t{100}}},
                                {kSeed, 0, 0, 0});
  const roundoff::Trace& t = r.traces.at("x");
  REQUIRE(t.x.size() == 101);
  REQUIRE(t.y.size() == 101);
  CHECK(t.x.front() == 0);
  CHECK(t.y.front() == 0);
  CHECK(t.x[1] == 100);
  CHECK(t.x.back() == kSteps);
  CHECK(t.y.back() == r.metrics.at("final"));
  CHECK(std::is_sorted(t.y.begin(), t.y.end()));

  const auto no_trace = run_experiment("swamping", {}, {kSeed, 0, 0, 0});
  CHECK(no_trace.traces.empty());
  CHECK_THROWS(run_experiment("swamping", {{"steps", std::int64_t{10}}, {"trace_every", std::int64_t{11}}}, {}));
}

TEST_CASE("swamping is deterministic per stream; sr replicas differ", "[swamping][determinism]") {
  for (const char* rng : {"philox", "ipu"}) {
    const std::map<std::string, roundoff::ParamValue> p = {
        {"rounding", "sr"}, {"rng", rng}, {"trace_every", std::int64_t{1000}}};
    const auto a = run_experiment("swamping", p, {kSeed, 5, 3, 0});
    const auto b = run_experiment("swamping", p, {kSeed, 5, 3, 0});
    CHECK(a.metrics == b.metrics);
    CHECK(a.traces.at("x").y == b.traces.at("x").y);
    CHECK(a.flags == b.flags);
    std::vector<double> replicas;
    for (std::uint32_t r = 0; r < 8; ++r)
      replicas.push_back(run_experiment("swamping", p, {kSeed, 5, r, 0}).metrics.at("final"));
    std::sort(replicas.begin(), replicas.end());
    CHECK(std::unique(replicas.begin(), replicas.end()) - replicas.begin() > 4);
  }
  // The two generators give different bits for the same stream.
  std::vector<double> philox, ipu;
  for (std::uint32_t r = 0; r < 4; ++r) {
    philox.push_back(run_experiment("swamping", {{"rounding", "sr"}}, {kSeed, 5, r, 0}).metrics.at("final"));
    ipu.push_back(run_experiment("swamping", {{"rounding", "sr"}, {"rng", "ipu"}}, {kSeed, 5, r, 0}).metrics.at("final"));
  }
  CHECK(philox != ipu);
}

TEST_CASE("swamping fp16 sr with 2 random bits stalls at exactly 0.5", "[swamping][golden]") {
  // Hardware-style SR with k = 2 bits rounds up with probability floor(4 f) / 4, f the
  // addend in ulps of x. fp16(1e-4) = 1678 * 2^-24: in [0.25, 0.5) f = 0.41 (P = 1/4), in
  // [0.5, 1) f = 0.2048 (P = floor(0.82) / 4 = 0): x climbs to 0.5 (about 6,000 steps
  // expected) and stays there.
  for (std::uint32_t r = 0; r < 4; ++r) {
    const auto result = run_experiment("swamping", {{"rounding", "sr"}, {"sr_bits", std::int64_t{2}}}, {kSeed, 9, r, 0});
    CHECK(result.metrics.at("final") == 0.5);
    CHECK(result.metrics.at("stagnation_step") > 2000);
    CHECK(result.metrics.at("stagnation_step") < kSteps);
  }
}

TEST_CASE("swamping from initial 1.0: fp16 rne never moves", "[swamping]") {
  // At 1.0 the fp16 ulp is 2^-10; 1e-4 is below half of it.
  const auto r = run_experiment("swamping", {{"initial", 1.0}}, {});
  CHECK(r.metrics.at("final") == 1.0);
  CHECK(r.metrics.at("stagnation_step") == 1);
  CHECK(r.metrics.at("exact") == 1.0 + 16780000 * 0x1p-24);
}

TEST_CASE("swamping: a sum that overflows follows the overflow policy", "[swamping]") {
  // fp16 max is 65504: 1000 steps of 100 pass it.
  const std::map<std::string, roundoff::ParamValue> p = {{"addend", 100.0}, {"steps", std::int64_t{1000}}};
  auto with = [&](const char* overflow) {
    auto q = p;
    q["overflow"] = overflow;
    return run_experiment("swamping", q, {});
  };
  const auto inf = with("inf"), sat = with("saturate"), nan = with("nan");
  CHECK(std::isinf(inf.metrics.at("final")));
  CHECK((inf.flags & emu::OFLO) != 0);
  CHECK(sat.metrics.at("final") == 65504);  // rne of 65504 + 100 rounds past max
  CHECK((sat.flags & emu::OFLO) != 0);
  CHECK(std::isnan(nan.metrics.at("final")));
  CHECK((nan.flags & emu::INV) != 0);
}
