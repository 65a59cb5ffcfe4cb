// The training findings of the shipped configs, on small, fast versions of them (1024
// synthetic samples, one hidden layer of 16, 4 epochs of batch 32 = 100 SGD steps at
// lr 0.05). Points share initial weights and batch order, so differences come from the
// arithmetic alone. What is asserted is what these runs show; where the issue expected
// more (batch-norm gradients lost entirely in fp16), the test pins what is true instead.
#include <catch2/catch.hpp>
#include <cmath>

#include "tests/run_experiment.hpp"

using namespace roundoff;

namespace {

using Overrides = std::map<std::string, ParamValue>;

std::map<std::string, double> train(Overrides extra) {
  Overrides p{{"samples", std::int64_t{1024}}, {"epochs", std::int64_t{4}}, {"width1", std::int64_t{16}},
              {"lr", 0.05}};
  for (auto& [k, v] : extra) p[k] = v;
  return testing::run_experiment("train", p).metrics;
}

ParamValue s(const char* text) { return std::string(text); }

}  // namespace

TEST_CASE("bf16 weights: round-to-nearest falls behind, SR/Kahan/fp32-master recover", "[train][findings]") {
  const Overrides bf16{{"weight_format", s("bf16")}, {"act_format", s("bf16")}, {"grad_format", s("bf16")},
                       {"loss_scale", s("128")}};
  auto run = [&](const char* update) {
    Overrides p = bf16;
    p["update"] = s(update);
    return train(p);
  };
  const double fp32 = train({{"update", s("fp32")}}).at("final_train_loss");
  const auto rn = run("fp16-rn"), sr = run("fp16-sr"), kahan = run("fp16-kahan"), master = run("fp32-master");
  auto gap = [&](const std::map<std::string, double>& m) { return std::fabs(m.at("final_train_loss") - fp32); };
  INFO("fp32 " << fp32 << " rn " << rn.at("final_train_loss") << " sr " << sr.at("final_train_loss") << " kahan "
               << kahan.at("final_train_loss") << " master " << master.at("final_train_loss"));
  CHECK(rn.at("final_train_loss") > fp32 + 0.01);  // measured: 1.3748 vs 1.3499
  CHECK(rn.at("frac_lost_updates") > 0.25);        // measured: 0.32
  CHECK(gap(sr) < gap(rn) / 3);
  CHECK(gap(kahan) < gap(rn) / 3);
  CHECK(gap(master) < gap(sr));  // fp32-master closest, SR between it and RN
  CHECK(gap(master) < 0.002 * fp32);
  CHECK(master.at("frac_lost_updates") == 0.0);
}

TEST_CASE("fp16 weights: RN loses updates; fp32-master with loss scale 128 tracks fp32", "[train][findings]") {
  const auto fp32 = train({{"update", s("fp32")}});
  const auto rn = train({{"update", s("fp16-rn")}});
  const auto master = train({{"update", s("fp32-master")}, {"loss_scale", s("128")}});
  INFO("fp32 " << fp32.at("final_train_loss") << " rn " << rn.at("final_train_loss") << " master "
               << master.at("final_train_loss"));
  CHECK(rn.at("frac_lost_updates") > 0.03);  // measured 0.045; fp32 loses none here
  CHECK(fp32.at("frac_lost_updates") < 1e-3);
  // At this learning rate the lost fp16 updates cost nothing measurable yet (measured
  // 1.34948 vs 1.34986): the loss stays within 0.5% of fp32.
  CHECK(rn.at("final_train_loss") == Approx(fp32.at("final_train_loss")).epsilon(0.005));
  CHECK(master.at("final_train_loss") == Approx(fp32.at("final_train_loss")).epsilon(0.001));
}

TEST_CASE("batch-norm gradients: none underflow in fp16 here; fp8-e4m3 gradients lose some, bn_fp32 restores",
          "[train][findings]") {
  const auto fp16 = train({{"update", s("fp16-rn")}});
  CHECK(fp16.at("frac_zero_grad_bn1") == 0.0);
  CHECK(fp16.at("grad_std_bn1") > 0.01);
  const auto e4m3 = train({{"update", s("fp16-rn")}, {"grad_format", s("fp8-e4m3")}});
  const auto e4m3_bn32 = train({{"update", s("fp16-rn")}, {"grad_format", s("fp8-e4m3")}, {"bn_fp32", true}});
  CHECK(e4m3.at("frac_zero_grad_bn1") > 0.005);  // measured 0.017
  CHECK(e4m3_bn32.at("frac_zero_grad_bn1") == 0.0);
  CHECK(e4m3.at("grad_std_bn1") > 0.0);  // not all lost: the std is not 0
}

TEST_CASE("dynamic loss scaling: 2^16 never overflows here; 2^32 skips early, then settles", "[train][findings]") {
  const auto from_16 = train({{"update", s("fp16-rn")}, {"loss_scale", s("dynamic")}});
  CHECK(from_16.at("skipped_steps") == 0.0);
  CHECK(from_16.at("final_loss_scale") == 65536.0);  // 100 steps < ls_interval 2000

  Overrides p{{"samples", std::int64_t{1024}}, {"epochs", std::int64_t{4}}, {"width1", std::int64_t{16}},
              {"lr", 0.05}, {"update", s("fp16-rn")}, {"loss_scale", s("dynamic")},
              {"ls_init", 4294967296.0}, {"ls_interval", std::int64_t{20}}};
  const RunResult r = testing::run_experiment("train", p);
  const std::vector<double>& scale = r.traces.at("loss_scale").y;
  REQUIRE(scale.size() == 100);
  // Early: every step overflows and halves S until the gradients fit.
  int halvings = 0;
  while (halvings + 1 < 100 && scale[halvings + 1] == scale[halvings] / 2) ++halvings;
  CHECK(halvings >= 8);
  // Then it settles: S stays within a factor 4 of where the descent ended, probing one
  // growth per 20 clean steps.
  const double settled = scale[halvings];
  for (int i = halvings; i < 100; ++i) CHECK((scale[i] >= settled / 4 && scale[i] <= settled * 4));
  const double skipped = r.metrics.at("skipped_steps");
  CHECK(skipped >= halvings);
  CHECK(skipped < 30);
  CHECK(std::isfinite(r.metrics.at("final_train_loss")));
}

TEST_CASE("adam in fp16: eps 1e-8 rounds to 0 and the weights become NaN; eps 1e-4 trains", "[train][findings]") {
  const Overrides adam{{"update", s("fp16-rn")}, {"optimizer", s("adam")}, {"lr", 0.001}};
  Overrides tiny = adam, safe = adam;
  tiny["eps"] = 1e-8;
  safe["eps"] = 1e-4;
  const auto bad = train(tiny), good = train(safe);
  CHECK(bad.at("frac_nonfinite_weights") == 1.0);
  CHECK(std::isnan(bad.at("grad_std_l1")));  // NaN gradients, not a zero spread
  CHECK(good.at("frac_nonfinite_weights") == 0.0);
  CHECK(good.at("final_train_loss") < std::log(10.0) - 0.2);
}

TEST_CASE("unscale: lr folds 1/S into an fp16 learning rate, which can underflow to 0", "[train][findings]") {
  const Overrides base{{"update", s("fp16-rn")}, {"lr", 0.001}, {"loss_scale", s("65536")}, {"epochs", std::int64_t{1}}};
  Overrides lr = base, grads = base;
  lr["unscale"] = s("lr");
  grads["unscale"] = s("grads");
  const auto folded = train(lr), divided = train(grads);
  // 0.001 / 2^16 = 1.5e-8 is below half of fp16's least subnormal 2^-24 (5.96e-8).
  CHECK(folded.at("effective_lr") == 0.0);
  CHECK(folded.at("effective_lr_rel_err") == 1.0);
  CHECK(divided.at("effective_lr") == static_cast<double>(static_cast<_Float16>(0.001)));
}

TEST_CASE("grad_underflow: loss scaling moves fp16/fp8 gradients out of underflow and into overflow",
          "[train][findings]") {
  auto run = [](const char* format, double scale) {
    return testing::run_experiment("grad_underflow", {{"samples", std::int64_t{512}}, {"epochs", std::int64_t{2}},
                                                   {"width1", std::int64_t{16}}, {"format", s(format)}, {"scale", scale}})
        .metrics;
  };
  double previous = 2.0;
  for (double scale : {1.0, 8.0, 128.0, 1024.0, 32768.0}) {
    const auto m = run("fp8-e4m3", scale);
    INFO("e4m3 scale " << scale << " underflow " << m.at("frac_underflow"));
    CHECK(m.at("frac_underflow") <= previous);
    previous = m.at("frac_underflow");
  }
  const auto e4m3 = run("fp8-e4m3", 1.0), e5m2 = run("fp8-e5m2", 1.0), fp16 = run("fp16", 1.0);
  const auto bf16 = run("bf16", 1.0), fp16_big = run("fp16", 32768.0), e4m3_big = run("fp8-e4m3", 32768.0);
  INFO("S=1: e4m3 " << e4m3.at("frac_underflow") << " e5m2 " << e5m2.at("frac_underflow") << " fp16 "
                    << fp16.at("frac_underflow") << " bf16 " << bf16.at("frac_underflow"));
  // Measured: e4m3 0.027, e5m2 0.00036, fp16 and bf16 0: this small MLP's gradients
  // (std ~0.03) sit well inside fp16's range; fp8 is where scaling matters.
  CHECK(e4m3.at("frac_underflow") > 0.01);
  CHECK(e4m3.at("frac_underflow") > e5m2.at("frac_underflow"));
  CHECK(e5m2.at("frac_underflow") > fp16.at("frac_underflow"));
  CHECK(fp16.at("frac_underflow") == 0.0);
  CHECK(bf16.at("frac_underflow") == 0.0);  // bf16 has fp32's exponent range
  CHECK(fp16.at("frac_overflow") == 0.0);
  CHECK(e4m3_big.at("frac_overflow") > 0.0);  // 448 is e4m3's largest value
  CHECK(e4m3_big.at("frac_overflow") >= fp16_big.at("frac_overflow"));
}
