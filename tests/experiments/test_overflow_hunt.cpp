// overflow_hunt: the FLAN-T5 float16 port's thresholds against the CPU's binary16
// (_Float16, round-to-nearest-even) over every fp16 value, and the shipped config's
// settings run in-process: which ops raise which flag with and without each fix.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "experiments/nn/t5_encoder.hpp"
#include "tests/run_experiment.hpp"

namespace t5 = roundoff::t5;
using roundoff::ParamValue;
using roundoff::testing::run_experiment;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every finite fp16 value, by bit pattern.
template <typename F>
void for_each_finite_fp16(F f) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double x = emu::fp16().decode(bits);
    if (std::isfinite(x)) f(x);
  }
}

double half(double x) { return static_cast<double>(static_cast<_Float16>(x)); }  // rne, correctly rounded

emu::Context ieee_context() {
  emu::FpControl c;
  c.overflow = emu::Overflow::inf;
  return emu::Context(c);
}

// The shipped config's model (configs/overflow_hunt.yaml) on replica 0 of seed 2026: the
// weights depend only on seed and replica, so this is the model of every point there.
roundoff::RunResult hunt(std::map<std::string, ParamValue> p, std::uint32_t point = 0) {
  p.emplace("qk_gain", 1.5);
  p.emplace("ffn_gain", 12.0);
  p.emplace("outlier_channels", std::int64_t{2});
  p.emplace("outlier_scale", 240.0);
  return run_experiment("overflow_hunt", p, emu::StreamId{2026, point, 0, 0});
}

const std::map<std::string, ParamValue> kAllFixes = {{"mask_scale", 0.75},
                                                     {"gelu_clamp", true},
                                                     {"residual_fp32", true},
                                                     {"wo_scale", std::int64_t{8}},
                                                     {"clamp_inf", true}};

// The op scopes ("attn.mask_add", ...) whose counts hold `flag`, from the per-(scope, op)
// counts the run returns; every scope must be one the model writes.
std::set<std::string> sites(const roundoff::RunResult& r, emu::Flag flag) {
  std::set<std::string> out;
  for (const emu::OpCount& c : r.fp_counts) {
    const auto site = t5::parse_scope(c.scope);
    REQUIRE(site.has_value());
    if (c.flag == flag) out.insert(t5::op_scope(site->op));
  }
  return out;
}

// The emu ops ("add", "pow", ...) counted for `flag` under one model op.
std::set<std::string> emu_ops(const roundoff::RunResult& r, emu::Flag flag, t5::Op op) {
  std::set<std::string> out;
  for (const emu::OpCount& c : r.fp_counts)
    if (c.flag == flag && t5::parse_scope(c.scope)->op == op) out.insert(c.op);
  return out;
}

// Equal metric maps, NaN equal to NaN.
bool same_metrics(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, value] : a) {
    const auto it = b.find(name);
    if (it == b.end() || !(value == it->second || (std::isnan(value) && std::isnan(it->second)))) return false;
  }
  return true;
}

const std::set<std::string> kPublished = {"attn.mask_add", "ffn.gelu", "ffn.wo", "ffn.residual_add"};

std::set<std::string> without(std::set<std::string> s, const std::string& gone) {
  s.erase(gone);
  return s;
}

}  // namespace

TEST_CASE("fp16 rne: -65504 - 10 stays -65504, -65504 - 100 is -inf (the write-up's example)", "[overflow_hunt][golden]") {
  const volatile _Float16 m = -65504, ten = 10, hundred = 100;
  REQUIRE(static_cast<double>(static_cast<_Float16>(m - ten)) == -65504);
  REQUIRE(static_cast<double>(static_cast<_Float16>(m - hundred)) == -kInf);
  emu::Context ctx = ieee_context();
  CHECK(ctx.sub(emu::fp16(), -65504, 10) == -65504);
  CHECK((ctx.status() & emu::OFLO) == 0);
  CHECK(ctx.sub(emu::fp16(), -65504, 100) == -kInf);
  CHECK((ctx.status() & emu::OFLO) != 0);
}

TEST_CASE("the mask add overflows fp16 from score -16 at mask_scale 1.0 and from -16400 at 0.75", "[overflow_hunt][golden]") {
  CHECK(t5::attention_mask_value(emu::fp16(), 1.0) == -65504);
  CHECK(t5::attention_mask_value(emu::fp16(), 0.75) == half(0.75 * -65504));
  CHECK(t5::attention_mask_value(emu::fp16(), 0.75) == -49120);  // the nearest half to -49128
  // The exact thresholds under rne: -65504 + s reaches the midpoint -65520 (a tie that
  // rounds to the even 2^16, i.e. overflows) at s = -16; -49120 + s at s = -16400. The
  // fp16 value just above each is safe (-15.984375; -16384, which gives -65504 exactly).
  for (const double scale : {1.0, 0.75}) {
    const double mask = t5::attention_mask_value(emu::fp16(), scale);
    const double threshold = scale == 1.0 ? -16 : -16400;
    std::int64_t checked = 0;
    for_each_finite_fp16([&](double score) {
      emu::Context ctx = ieee_context();
      const double sum = ctx.add(emu::fp16(), score, mask);
      const bool overflows = (ctx.status() & emu::OFLO) != 0;
      CHECK(sum == half(score + mask));  // exact in double, rounded once
      CHECK(overflows == std::isinf(half(score + mask)));
      CHECK(overflows == (score <= threshold));
      ++checked;
    });
    CHECK(checked == 63488);  // every finite fp16 value (2 x 31744)
  }
  CHECK(half(-65504 - 15.984375) == -65504);
  CHECK(half(-49120 - 16384.0) == -65504);
}

TEST_CASE("gelu_new in fp16 matches a _Float16 evaluation step by step, for every fp16 x", "[overflow_hunt][golden]") {
  // Oracle: each step exact in double (sums and products of halves fit 53 bits; x^3 of
  // an 11-bit x fits 33), then rounded once by the CPU; tanh from libm, rounded once.
  const double k3 = half(0.044715), k = half(0.7978845608028654);
  for_each_finite_fp16([&](double x) {
    const double cube = half(x * x * x);
    const double expected = half(half(0.5 * x) * half(1 + half(std::tanh(half(k * half(x + half(k3 * cube)))))));
    emu::Context ctx = ieee_context();
    const double got = t5::gelu_new(ctx, emu::fp16(), x, false);
    if (std::isnan(expected)) {
      CHECK(std::isnan(got));
    } else {
      INFO("x = " << x);
      CHECK(got == expected);
      CHECK(std::signbit(got) == std::signbit(expected));
    }
  });
}

TEST_CASE("the GeLU cube overflows fp16 from |x| = 40.34375 on; gelu_clamp never evaluates it there", "[overflow_hunt][golden]") {
  REQUIRE(half(40.3125 * 40.3125 * 40.3125) == 65504);  // 65511.5..., below the midpoint 65520
  REQUIRE(std::isinf(half(40.34375 * 40.34375 * 40.34375)));  // 65664.5...
  for_each_finite_fp16([&](double x) {
    INFO("x = " << x);
    emu::Context plain = ieee_context();
    (void)t5::gelu_new(plain, emu::fp16(), x, false);
    CHECK(((plain.status() & emu::OFLO) != 0) == (std::fabs(x) >= 40.34375));
    CHECK(((plain.status() & emu::OFLO) != 0) == std::isinf(half(x * x * x)));

    emu::Context clamped = ieee_context();
    const double g = t5::gelu_new(clamped, emu::fp16(), x, true);
    CHECK((clamped.status() & emu::OFLO) == 0);
    if (std::fabs(x) > t5::kGeluClampAt) {
      CHECK(g == (x > 0 ? x : 0.0));  // ReLU
      CHECK(clamped.status() == 0);   // no arithmetic at all
    } else {
      emu::Context again = ieee_context();
      CHECK(g == t5::gelu_new(again, emu::fp16(), x, false));
    }
  });
}

TEST_CASE("Hugging Face's clamp bound in fp16 is 64512, the nearest half to 65504 - 1000", "[overflow_hunt][golden]") {
  CHECK(t5::clamp_bound(emu::fp16()) == 64512);
  CHECK(t5::clamp_bound(emu::fp16()) == half(65504 - 1000));
}

TEST_CASE("scopes of the model parse back to their block and op", "[overflow_hunt]") {
  for (int i = 0; i < t5::kOps; ++i) {
    const t5::Op op = t5::op_at(i);
    const std::string scope = op == t5::Op::final_norm ? "encoder.final_norm" : "encoder.block12." + std::string(t5::op_scope(op));
    const auto site = t5::parse_scope(scope);
    REQUIRE(site.has_value());
    CHECK(site->op == op);
    CHECK(site->block == (op == t5::Op::final_norm ? -1 : 12));
  }
  for (const char* bad : {"", "encoder", "encoder.block.attn.q", "encoder.block3", "encoder.block3.attn", "block3.attn.q",
                          "encoder.block3.attn.q.x", "encoder.block3.final_norm", "encoder.block-1.attn.q"})
    CHECK_FALSE(t5::parse_scope(bad).has_value());
}

TEST_CASE("no fixes: the four published overflow sites, and no other", "[overflow_hunt]") {
  const auto r = hunt({});
  CHECK(sites(r, emu::OFLO) == kPublished);
  CHECK(sites(r, emu::INV).empty());
  CHECK(sites(r, emu::DIV0).empty());
  // The emu ops behind them: the mask and residual adds, the cube, wo's result rounded
  // from the AMP's fp32 into fp16.
  CHECK(emu_ops(r, emu::OFLO, t5::Op::attn_mask_add) == std::set<std::string>{"add"});
  CHECK(emu_ops(r, emu::OFLO, t5::Op::ffn_gelu) == std::set<std::string>{"pow"});
  CHECK(emu_ops(r, emu::OFLO, t5::Op::ffn_wo) == std::set<std::string>{"convert"});
  CHECK(emu_ops(r, emu::OFLO, t5::Op::ffn_residual_add) == std::set<std::string>{"add"});
  // The metrics are the counts summed per op kind; the first overflow is the mask add
  // of block 0, on a padded key, with a score at or below -16, saturated (NANOO off).
  double mask_adds = 0;
  const emu::OpCount* first = nullptr;
  for (const emu::OpCount& c : r.fp_counts)
    if (c.flag == emu::OFLO && t5::parse_scope(c.scope)->op == t5::Op::attn_mask_add) {
      mask_adds += static_cast<double>(c.count);
      if (!first) first = &c;
    }
  CHECK(r.metrics.at("oflo_attn_mask_add") == mask_adds);
  CHECK(mask_adds > 0);
  CHECK(r.metrics.at("first_oflo_op") == static_cast<int>(t5::Op::attn_mask_add));
  CHECK(r.metrics.at("first_oflo_block") == 0);
  REQUIRE(first != nullptr);
  CHECK(first->scope == "encoder.block0.attn.mask_add");
  CHECK(first->first_element.rank == 3);  // (head, query, key)
  CHECK(first->first_element.index[2] >= 32 - 8);
  REQUIRE(first->first_operands.size() == 2);
  CHECK(first->first_operands[0] <= -16);
  CHECK(first->first_operands[1] == -65504);
  CHECK(first->first_result == -65504);
  CHECK(r.metrics.at("oflo_total") > 0);
  CHECK(r.metrics.at("inv_total") == 0);
  CHECK(std::isnan(r.metrics.at("first_inv_op")));
  CHECK(r.metrics.at("frac_nonfinite") == 0);
  CHECK(r.metrics.at("rel_error") > 0.05);  // saturated wo outputs and residuals
  CHECK(r.metrics.at("max_abs_ffn_wo") == 65504);
}

TEST_CASE("each fix removes its own overflow; clamp_inf and wo_scale alone leave the residual adds", "[overflow_hunt]") {
  CHECK(sites(hunt({{"mask_scale", 0.75}}), emu::OFLO) == without(kPublished, "attn.mask_add"));
  CHECK(sites(hunt({{"gelu_clamp", true}}), emu::OFLO) == without(kPublished, "ffn.gelu"));
  CHECK(sites(hunt({{"residual_fp32", true}}), emu::OFLO) == without(kPublished, "ffn.residual_add"));
  const auto wo = hunt({{"wo_scale", std::int64_t{8}}});
  CHECK(sites(wo, emu::OFLO) == without(kPublished, "ffn.wo"));
  CHECK(wo.metrics.at("max_abs_ffn_wo") > 65504);  // the unscaled output, in fp32
  // The clamp treats the symptom: the overflows stay.
  CHECK(sites(hunt({{"clamp_inf", true}}), emu::OFLO) == kPublished);
}

TEST_CASE("all fixes: no flag anywhere and an output close to the fp32 run", "[overflow_hunt]") {
  const auto r = hunt(kAllFixes);
  CHECK(r.fp_counts.empty());
  CHECK((r.flags & (emu::OFLO | emu::INV | emu::DIV0)) == 0);
  CHECK(r.metrics.at("oflo_total") == 0);
  CHECK(std::isnan(r.metrics.at("first_oflo_op")));
  CHECK(r.metrics.at("rel_error") < 0.01);  // measured 0.0070
  CHECK(r.metrics.at("cosine_similarity") > 0.9999);
  CHECK(r.metrics.at("std_ffn_wo") > 3500);  // the outliers are there, unharmed
  const auto none = hunt({});
  CHECK(r.metrics.at("rel_error") < none.metrics.at("rel_error") / 10);
}

TEST_CASE("nanoo: the first overflow gives NaN and INV and hides every later one", "[overflow_hunt]") {
  const auto r = hunt({{"nanoo", true}});
  CHECK(sites(r, emu::INV).count("attn.mask_add") == 1);
  CHECK(r.metrics.at("first_oflo_op") == static_cast<int>(t5::Op::attn_mask_add));
  CHECK(r.metrics.at("first_inv_op") == static_cast<int>(t5::Op::attn_mask_add));
  CHECK(r.metrics.at("first_inv_block") == 0);
  CHECK(r.metrics.at("frac_nonfinite") == 1);
  CHECK(std::isnan(r.metrics.at("rel_error")));
  CHECK(sites(r, emu::OFLO).count("ffn.residual_add") == 0);  // NaN operands raise nothing
  // With the mask fixed, the hunt moves on to the GeLU.
  const auto next = hunt({{"nanoo", true}, {"mask_scale", 0.75}});
  CHECK(next.metrics.at("first_inv_op") == static_cast<int>(t5::Op::ffn_gelu));
  auto fixed = kAllFixes;
  fixed.emplace("nanoo", true);
  CHECK(hunt(fixed).metrics.at("frac_nonfinite") == 0);
}

TEST_CASE("trap: the first overflow stops the run with its report", "[overflow_hunt]") {
  try {
    (void)hunt({{"fp_exceptions", "trap"}});
    FAIL("no trap");
  } catch (const emu::FpException& e) {
    const emu::TrapReport& t = e.report();
    CHECK(t.flag == emu::OFLO);
    CHECK(t.scope == "encoder.block0.attn.mask_add");
    CHECK(t.op == "add");
    CHECK(t.element.rank == 3);
    CHECK(t.element.index[2] >= 32 - 8);
    REQUIRE(t.operands.size() == 2);
    CHECK(t.operands[0] <= -16);
    CHECK(t.operands[1] == -65504);
    CHECK(t.result == -65504);  // saturated: NANOO off
    CHECK((t.fp_sts() & emu::fp_sts(emu::OFLO)) != 0);
  }
  // oflo off: the overflows are not trapped (nor counted), the run ends normally.
  const auto r = hunt({{"fp_exceptions", "trap"}, {"oflo", false}});
  CHECK(std::isnan(r.metrics.at("oflo_total")));
  CHECK(r.metrics.at("inv_total") == 0);
}

TEST_CASE("the counts reach RunResult in mode count only; the metrics in every mode", "[overflow_hunt]") {
  const auto off = hunt({{"fp_exceptions", "off"}});
  const auto count = hunt({{"fp_exceptions", "count"}});
  CHECK(off.fp_counts.empty());
  CHECK(!count.fp_counts.empty());
  CHECK(same_metrics(off.metrics, count.metrics));
}

TEST_CASE("every grid point runs the same model: the weights ignore the point index", "[overflow_hunt]") {
  CHECK(same_metrics(hunt({}, 0).metrics, hunt({}, 17).metrics));
}

TEST_CASE("overflow_hunt refuses what it cannot run, before running", "[overflow_hunt]") {
  const roundoff::Experiment& e = *roundoff::find_experiment("overflow_hunt");
  auto problem = [&](std::map<std::string, ParamValue> p) {
    return e.check_point(roundoff::testing::params_with(e, p));
  };
  CHECK(problem({}).empty());
  CHECK(problem({{"format", "bf16"}}).find("ipu-amp does not take format bf16") != std::string::npos);
  CHECK(problem({{"format", "bf16"}, {"unit", "a100"}}).empty());
  CHECK(problem({{"wo_scale", std::int64_t{3}}}).find("power of two") != std::string::npos);
  CHECK(problem({{"pad", std::int64_t{32}}}).find("pad") != std::string::npos);
  CHECK(problem({{"outlier_channels", std::int64_t{65}}}).find("outlier_channels") != std::string::npos);
}
