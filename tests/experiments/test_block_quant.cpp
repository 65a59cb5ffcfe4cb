// block_quant, and block formats in matmul_accum and norm_stats: properties that follow
// from the definitions (power-of-two block scales absorb a power-of-two scaling of the
// data exactly; rules that never saturate leave exact stochastic rounding unbiased;
// k-bit stochastic rounding is biased toward zero; the exact unit rounds once), results
// independent of the thread count, the shipped config planned.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <string>

#include "emu/block.hpp"
#include "emu/format.hpp"
#include "tests/run_experiment.hpp"
#include "tests/experiments/sweep_checks.hpp"
#include "tests/sweep/support.hpp"

using roundoff::ParamValue;
using roundoff::testing::run_experiment;

namespace {

using Overrides = std::map<std::string, ParamValue>;

roundoff::RunResult block_quant(Overrides o) {
  if (!o.count("n")) o["n"] = std::int64_t{8192};
  return run_experiment("block_quant", o, emu::StreamId{5, 0, 0, 0});
}

}  // namespace

TEST_CASE("block_quant: MX scales absorb a power-of-two scaling of the data exactly", "[block_quant]") {
  for (const char* format : {"mxfp8-e4m3", "mxfp4-e2m1", "mxint8", "mxfp6-e2m3"})
    for (const char* rule : {"floor", "ceil", "even", "up", "nearest"}) {
      INFO(format << " " << rule);
      const auto one = block_quant({{"format", std::string(format)}, {"scale_rule", std::string(rule)},
                                    {"distribution", std::string("laplace")}});
      const auto scaled = block_quant({{"format", std::string(format)}, {"scale_rule", std::string(rule)},
                                       {"distribution", std::string("laplace")}, {"scale", 0x1p-40}});
      for (const char* m : {"rel_rms_error", "sqnr_db", "max_rel_error", "rel_bias", "frac_flushed", "frac_saturated"})
        CHECK(one.metrics.at(m) == scaled.metrics.at(m));
      CHECK(scaled.metrics.at("rms_error") == std::ldexp(one.metrics.at("rms_error"), -40));
      CHECK(one.metrics.at("sqnr_db") == Approx(-20 * std::log10(one.metrics.at("rel_rms_error"))));
    }
}

TEST_CASE("block_quant: rounding biases", "[block_quant][stochastic]") {
  // rel_bias is the mean of sign(x) (q - x) over rms x: its standard deviation is at
  // most rel_rms_error / sqrt(n) (a variance is at most the second moment).
  auto noise = [](const roundoff::RunResult& r, double n) { return r.metrics.at("rel_rms_error") / std::sqrt(n); };
  const Overrides up = {{"format", std::string("mxfp4-e2m1")}, {"scale_rule", std::string("up")}};
  auto with = [&](Overrides base, const Overrides& more) {
    for (const auto& [k, v] : more) base[k] = v;
    return block_quant(base);
  };
  // rz: toward zero by about half an element ulp. (rne has no such rule: its bias
  // depends on how the values fill the grid.)
  const auto rne = with(up, {});
  CHECK(rne.metrics.at("frac_saturated") == 0);  // up never saturates
  const auto rz = with(up, {{"rounding", std::string("rz")}});
  CHECK(rz.metrics.at("rel_bias") < -0.1);
  // Exact sr under a rule that never saturates: unbiased.
  const auto sr = with(up, {{"rounding", std::string("sr")}, {"n", std::int64_t{131072}}});
  CHECK(std::fabs(sr.metrics.at("rel_bias")) < 5 * noise(sr, 131072));
  // Two random bits: P(up) = floor(4 f) / 4, below f by up to a quarter ulp.
  const auto sr2 = with(up, {{"rounding", std::string("sr")}, {"sr_bits", std::int64_t{2}}, {"n", std::int64_t{131072}}});
  CHECK(sr2.metrics.at("rel_bias") < -10 * noise(sr2, 131072));
  // OCP's floor rule saturates some elements; exact sr is then biased toward zero.
  const auto floor = block_quant({{"format", std::string("mxfp4-e2m1")}, {"rounding", std::string("sr")},
                                  {"n", std::int64_t{131072}}});
  CHECK(floor.metrics.at("frac_saturated") > 0.001);
  CHECK(floor.metrics.at("rel_bias") < -5 * noise(floor, 131072));
}

TEST_CASE("block_quant: checks, flags and counts", "[block_quant]") {
  CHECK_THROWS_WITH(block_quant({{"format", std::string("nvfp4")}, {"scale_rule", std::string("floor")}}),
                    Catch::Contains("power-of-two"));
  CHECK_NOTHROW(block_quant({{"format", std::string("nvfp4")}, {"scale_rule", std::string("up")}}));
  // 2^200 times the data: E8M0 cannot hold the scales; saturate gives 2^127 and
  // saturated elements, nan gives NaN blocks (frac_nonfinite 1, errors NaN).
  const auto huge = block_quant({{"scale", 0x1p200}, {"overflow", std::string("nan")}});
  CHECK(huge.metrics.at("frac_nonfinite") == 1);
  CHECK(std::isnan(huge.metrics.at("rms_error")));
  CHECK((huge.flags & emu::OFLO) != 0);
  const auto saturated = block_quant({{"scale", 0x1p200}});
  CHECK(saturated.metrics.at("frac_nonfinite") == 0);
  CHECK(saturated.metrics.at("frac_saturated") > 0.99);
  // Counted per value: OFLO of saturating elements under scope quantize.
  const auto counted = block_quant({{"format", std::string("mxfp4-e2m1")}, {"fp_exceptions", std::string("count")}});
  bool found = false;
  for (const emu::OpCount& c : counted.fp_counts)
    if (c.scope == "quantize" && c.op == "quantize" && c.flag == emu::OFLO) {
      found = true;
      CHECK(c.count == static_cast<std::uint64_t>(std::llround(counted.metrics.at("frac_saturated") * 8192)));
      CHECK(c.first_element.known());
    }
  CHECK(found);
}

TEST_CASE("block formats as operands of matmul_accum and inputs of norm_stats", "[block_quant][matmul_accum]") {
  // The exact unit rounds the exact product of the dequantised operands once into fp32.
  for (const char* format : {"mxfp8-e4m3", "mxfp4-e2m1", "mxint8", "nvfp4"}) {
    INFO(format);
    const auto r = run_experiment("matmul_accum", {{"unit", std::string("exact")}, {"in_format", std::string(format)},
                                                   {"K", std::int64_t{100}}, {"distribution", std::string("normal")},
                                                   {"sign", std::string("mixed")}});
    CHECK(r.metrics.at("max_rel_error") <= 0x1p-24);
    CHECK(r.metrics.at("frac_nonfinite") == 0);
  }
  // Tensor cores other than b200 (test_matmul_accum_blocks.cpp) and the IPU take scalar
  // formats only.
  CHECK_THROWS_WITH(run_experiment("matmul_accum", {{"unit", std::string("h100")}, {"in_format", std::string("nvfp4")}}),
                    Catch::Contains("block format"));
  const auto ns = run_experiment("norm_stats", {{"format", std::string("mxfp8-e4m3")}, {"mean", 0.0},
                                                {"algorithm", std::string("two_pass")}, {"vectors", std::int64_t{4}}});
  CHECK(ns.metrics.at("var_rel_error") < 1e-5);  // fp32 accumulation of 512 few-bit values
}

TEST_CASE("block_quant through sweep: -j1 and -j2 give the same file; the shipped config plans", "[block_quant][sweep]") {
  sweep_test::TempDir dir;
  experiments_test::check_threads_agree_and_shipped_config_plans(
      dir,
      "experiment: block_quant\nseed: 3\nreplicas: 2\ngrid:\n  n: 2000\n"
      "  distribution: [outliers, lognormal]\n  rounding: [rne, sr]\n"
      "zip:\n  format: [mxfp4-e2m1, nvfp4]\n  scale_rule: [even, up]\n",
      "block_quant.yaml");
}

// Whether `word` occurs in `text` as a whole name (not inside a longer one: fp8-e4m3 in
// fp8-e4m3fnuz does not count).
bool names(const std::string& text, const std::string& word) {
  auto part_of_name = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; };
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const std::size_t end = at + word.size();
    if ((at == 0 || !part_of_name(text[at - 1])) && (end == text.size() || !part_of_name(text[end]))) return true;
  }
  return false;
}

TEST_CASE("configs/README.md names every format and block format emu knows", "[block_quant][docs]") {
  const char* root = std::getenv("ROUNDOFF_ROOT");
  if (!root) FAIL("set ROUNDOFF_ROOT (meson test does)");
  const std::string readme = sweep_test::read_file(std::string(root) + "/configs/README.md");
  for (const char* const* n : {emu::format_names(), emu::block_format_names()})
    for (; *n != nullptr; ++n) {
      INFO(*n);
      CHECK(names(readme, *n));
    }
  CHECK_FALSE(names("fp8-e4m3fnuz", "fp8-e4m3"));
}
