// The fp_exceptions parameters of the shipped experiments, run in-process: counting
// changes no result (metrics, traces and flags equal those of `off` bit for bit), a trap
// stops at the operation the counts name first, and the counts of cases whose answer is
// known in advance (every gradient overflowing) are exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "emu/status.hpp"
#include "tests/run_experiment.hpp"

using roundoff::ParamValue;
using roundoff::RunResult;
using roundoff::testing::run_experiment;

namespace {

using Overrides = std::map<std::string, ParamValue>;
const emu::StreamId kStream{2026, 3, 1, 0};

Overrides with(Overrides p, const std::string& mode) {
  p["fp_exceptions"] = mode;
  return p;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Metrics, traces and flags equal bit for bit.
void check_same_results(const RunResult& a, const RunResult& b) {
  REQUIRE(a.metrics.size() == b.metrics.size());
  for (const auto& [name, value] : a.metrics) {
    INFO("metric " << name << ": " << value << " vs " << b.metrics.at(name));
    CHECK(same_bits(value, b.metrics.at(name)));
  }
  REQUIRE(a.traces.size() == b.traces.size());
  for (const auto& [name, trace] : a.traces) {
    const auto& other = b.traces.at(name);
    REQUIRE(trace.y.size() == other.y.size());
    bool same = true;
    for (std::size_t i = 0; i < trace.y.size(); ++i) same = same && same_bits(trace.y[i], other.y[i]);
    INFO("trace " << name);
    CHECK(same);
  }
  CHECK(a.flags == b.flags);
}

struct Case {
  const char* experiment;
  Overrides params;
  bool exceptions;  // whether the case raises an enabled flag (so count and trap have work)
};

// Small runs of every experiment that takes the parameters, most of them overflowing.
std::vector<Case> cases() {
  return {
      {"swamping", {{"addend", 1000.0}, {"steps", std::int64_t{200}}, {"rounding", "sr"}, {"trace_every", std::int64_t{10}}}, true},
      {"swamping", {{"addend", 1e-4}, {"steps", std::int64_t{2000}}}, false},
      {"summation", {{"series", "normal"}, {"format", "fp16"}, {"algorithm", "kahan"}, {"n", std::int64_t{3000}},
                     {"rounding", "sr"}, {"trace_every", std::int64_t{100}}}, false},
      {"summation", {{"series", "constant"}, {"value", 700.0}, {"n", std::int64_t{300}}, {"algorithm", "pairwise"}}, true},
      {"matmul_accum", {{"unit", "ipu-amp-half"}, {"K", std::int64_t{4096}}, {"M", std::int64_t{40}}, {"N", std::int64_t{20}},
                        {"distribution", "lognormal"}, {"spread", 3.0}}, true},
      {"matmul_accum", {{"unit", "fp16-seq"}, {"K", std::int64_t{512}}, {"distribution", "lognormal"}, {"spread", 3.0}}, true},
      {"matmul_accum", {{"unit", "a100"}, {"K", std::int64_t{512}}, {"in_format", "bf16"},
                        {"distribution", "lognormal"}, {"spread", 20.0}}, true},
      {"updates", {{"update", "fp16-sr"}, {"n", std::int64_t{50}}, {"steps", std::int64_t{20}}, {"mu", 70000.0}}, true},
      {"updates", {{"update", "fp16-kahan"}, {"n", std::int64_t{50}}, {"steps", std::int64_t{20}}}, false},
      {"train", {{"update", "fp16-rn"}, {"samples", std::int64_t{256}}, {"features", std::int64_t{8}}, {"epochs", std::int64_t{1}},
                 {"width1", std::int64_t{8}}, {"loss_scale", "1e9"}, {"unit", "ipu-amp"}}, true},
      {"train", {{"update", "fp32-master"}, {"samples", std::int64_t{256}}, {"features", std::int64_t{8}},
                 {"epochs", std::int64_t{1}}, {"width1", std::int64_t{8}}, {"loss_scale", "dynamic"}, {"ls_init", 1e9},
                 {"unit", "a100"}}, true},
  };
}

}  // namespace

TEST_CASE("fp_exceptions: count changes no result; off counts nothing", "[fp_exceptions]") {
  for (const Case& c : cases()) {
    INFO(c.experiment << " " << roundoff::to_string(c.params.begin()->second));
    const RunResult off = run_experiment(c.experiment, c.params, kStream);
    const RunResult counted = run_experiment(c.experiment, with(c.params, "count"), kStream);
    check_same_results(off, counted);
    CHECK(off.fp_counts.empty());
    CHECK(counted.fp_counts.empty() == !c.exceptions);
    for (const emu::OpCount& row : counted.fp_counts) {
      CHECK(row.count > 0);
      CHECK((row.flag == emu::OFLO || row.flag == emu::DIV0 || row.flag == emu::INV));  // the bundle's flags only
      CHECK((counted.flags & row.flag));  // a counted flag is a raised one
    }
  }
}

TEST_CASE("fp_exceptions: trap stops at the operation the counts name first", "[fp_exceptions]") {
  for (const Case& c : cases()) {
    if (!c.exceptions) continue;
    // The IPU units' vectorised path counts in its own order (tiles of columns); the
    // exact model the trap runs on goes element by element: compare the others.
    if (c.experiment == std::string("matmul_accum") && std::get<std::string>(c.params.at("unit")) == "ipu-amp-half") continue;
    if (c.experiment == std::string("train") && std::get<std::string>(c.params.at("unit")) == "ipu-amp") continue;
    INFO(c.experiment);
    const RunResult counted = run_experiment(c.experiment, with(c.params, "count"), kStream);
    REQUIRE_FALSE(counted.fp_counts.empty());
    const emu::OpCount& first = counted.fp_counts.front();
    try {
      (void)run_experiment(c.experiment, with(c.params, "trap"), kStream);
      FAIL("no trap");
    } catch (const emu::FpException& e) {
      const emu::TrapReport& t = e.report();
      INFO(e.what());
      CHECK(t.flag == first.flag);
      CHECK(t.scope == first.scope);
      CHECK(t.op == first.op);
      CHECK(t.element == first.first_element);
      CHECK(t.operands == first.first_operands);
      CHECK(same_bits(t.result, first.first_result));
    }
  }
}

TEST_CASE("fp_exceptions: updates counts every overflowing gradient, from element 0", "[fp_exceptions]") {
  // mu = 1e5 and sigma = 0: every gradient is 1e5, above fp16's 65504, and overflows as it
  // is rounded into grad_format: n x steps conversions. The weights become -inf at step 1
  // (w - lr * inf) without another flag: an infinite operand is exact.
  const Overrides p{{"update", "fp16-rn"}, {"n", std::int64_t{30}}, {"steps", std::int64_t{7}}, {"mu", 1e5},
                    {"sigma", 0.0}, {"fp_exceptions", "count"}};
  const RunResult r = run_experiment("updates", p, kStream);
  REQUIRE(r.fp_counts.size() == 1);
  const emu::OpCount& row = r.fp_counts.front();
  CHECK(row.scope == "grad");
  CHECK(row.op == "convert");
  CHECK(row.flag == emu::OFLO);
  CHECK(row.count == 30 * 7);
  CHECK(row.first_element.flat == 0);
  CHECK(row.first_operands == std::vector<double>{1e5});
  CHECK(std::isinf(row.first_result));
  // oflo: false counts nothing; nanoo: the same overflow gives NaN and INV (both counted).
  CHECK(run_experiment("updates", [&] { auto q = p; q["oflo"] = false; return q; }(), kStream).fp_counts.empty());
  auto q = p;
  q["nanoo"] = true;
  const RunResult nan = run_experiment("updates", q, kStream);
  REQUIRE(nan.fp_counts.size() >= 2);
  CHECK(nan.fp_counts[0].flag == emu::OFLO);
  CHECK(nan.fp_counts[1].flag == emu::INV);
  CHECK(nan.fp_counts[1].count == 30 * 7);
  CHECK(std::isnan(nan.fp_counts[1].first_result));
}

TEST_CASE("fp_exceptions: train names its scopes as documented", "[fp_exceptions]") {
  for (const Case& c : cases()) {
    if (c.experiment != std::string("train")) continue;
    const RunResult r = run_experiment("train", with(c.params, "count"), kStream);
    const std::regex documented(
        "init|forward\\.(l[0-9]|bn[0-9])|loss|backward\\.(l[0-9]\\.(bias|dw|dx)|bn[0-9])|"
        "update\\.(l[0-9]|l[0-9]\\.bias|bn[0-9]\\.(gamma|beta))|evaluate\\.(train|test)\\.(input|l[0-9]|bn[0-9]|loss)");
    std::map<std::string, int> scopes;
    for (const emu::OpCount& row : r.fp_counts) {
      INFO(row.scope << " " << row.op);
      CHECK(std::regex_match(row.scope, documented));
      ++scopes[row.scope];
      if (row.first_element.known() && row.first_element.rank == 2)  // (sample or channel, column): flat is row-major
        CHECK(row.first_element.flat >= row.first_element.index[1]);
    }
    INFO(std::get<std::string>(c.params.at("update")));
    CHECK(scopes.size() >= 2);
  }
}

TEST_CASE("fp_exceptions: the tininess parameter sets the control, and after-rounding tininess changes UFLO",
          "[fp_exceptions]") {
  using roundoff::ParamValue;
  std::map<std::string, ParamValue> values{{"fp_exceptions", std::string("off")}, {"oflo", true}, {"div0", true},
                                           {"inv", true},  {"nanoo", false}, {"tininess", std::string("after")}};
  const emu::FpControl after = roundoff::with_fp_exceptions(emu::FpControl{}, roundoff::Params(values));
  CHECK(after.tininess == emu::Tininess::after);
  values["tininess"] = std::string("before");
  const emu::FpControl before = roundoff::with_fp_exceptions(emu::FpControl{}, roundoff::Params(values));
  CHECK(before.tininess == emu::Tininess::before);
  // (1 - 2^-12) * 2^-14 rounds (rne) up to fp16's smallest normal 2^-14: tiny before
  // rounding, not after (x86 raises no underflow for it).
  const double x = (1.0 - 0x1p-12) * 0x1p-14;
  emu::Context ctx_after(after), ctx_before(before);
  CHECK(ctx_after.convert(emu::fp16(), x) == 0x1p-14);
  CHECK(ctx_before.convert(emu::fp16(), x) == 0x1p-14);
  CHECK((ctx_after.status() & emu::UFLO) == 0);
  CHECK((ctx_before.status() & emu::UFLO) != 0);
}
