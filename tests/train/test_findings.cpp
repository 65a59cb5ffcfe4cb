// The training findings of the shipped configs, on small, fast versions of them (1024
// synthetic samples, one hidden layer of 16, batch 32 = 25 steps per epoch). Points share
// initial weights and batch order, so differences come from the arithmetic alone. What
// is asserted is what these runs show; where the issue expected more (batch-norm
// gradients lost entirely in fp16 without loss scaling), the test pins what is true
// instead and says so. Final losses and accuracies are evaluated in the model's own
// arithmetic (final_*); the fp64 evaluation (final_*_fp64) is used where a comparison
// of trajectories must not see the inference arithmetic's own rounding.
#include <catch2/catch.hpp>
#include <cmath>

#include "experiments/nn/mlp.hpp"
#include "tests/run_experiment.hpp"

using namespace roundoff;

namespace {

using Overrides = std::map<std::string, ParamValue>;
using Metrics = std::map<std::string, double>;

Overrides small(Overrides extra) {
  Overrides p{{"samples", std::int64_t{1024}}, {"epochs", std::int64_t{4}}, {"width1", std::int64_t{16}},
              {"lr", 0.05}};
  for (auto& [k, v] : extra) p[k] = v;
  return p;
}

Metrics run_train(Overrides extra) { return testing::run_experiment("train", small(std::move(extra))).metrics; }

ParamValue s(const char* text) { return std::string(text); }

}  // namespace

TEST_CASE("bf16 weights: round-to-nearest falls behind, SR/Kahan/fp32-master recover", "[train][findings]") {
  const Overrides bf16{{"weight_format", s("bf16")}, {"act_format", s("bf16")}, {"grad_format", s("bf16")},
                       {"loss_scale", s("128")}};
  auto run = [&](const char* update) {
    Overrides p = bf16;
    p["update"] = s(update);
    return run_train(p);
  };
  const Metrics fp32 = run_train({{"update", s("fp32")}});
  const Metrics rn = run("fp16-rn"), sr = run("fp16-sr"), kahan = run("fp16-kahan"), master = run("fp32-master");
  // Trajectories compared in fp64 evaluation (bf16 inference adds its own rounding).
  const double base = fp32.at("final_train_loss_fp64");
  auto gap = [&](const Metrics& m) { return std::fabs(m.at("final_train_loss_fp64") - base); };
  INFO("fp64 eval: fp32 " << base << " rn " << rn.at("final_train_loss_fp64") << " sr "
                          << sr.at("final_train_loss_fp64") << " kahan " << kahan.at("final_train_loss_fp64")
                          << " master " << master.at("final_train_loss_fp64"));
  INFO("own arithmetic: fp32 " << fp32.at("final_train_loss") << " rn " << rn.at("final_train_loss") << " master "
                               << master.at("final_train_loss"));
  // Measured: fp32 1.3499, rn 1.3748 (32% of updates lost), sr 1.3452, kahan 1.3490,
  // master 1.3493 (fp64 evaluation); in the model's arithmetic fp32 1.3543, rn 1.3750.
  CHECK(rn.at("final_train_loss_fp64") > base + 0.015);
  CHECK(rn.at("final_train_loss") > fp32.at("final_train_loss") + 0.015);
  CHECK(rn.at("frac_lost_updates") > 0.25);
  CHECK(gap(sr) < gap(rn) / 3);
  CHECK(gap(kahan) < gap(rn) / 3);
  CHECK(gap(master) < gap(sr));  // fp32-master closest, SR between it and RN
  CHECK(gap(master) < 0.002 * base);
  CHECK(master.at("frac_lost_updates") == 0.0);
  CHECK(kahan.at("frac_lost_updates") < 0.01);  // kept in the compensation, not lost
}

TEST_CASE("fp16 weights: RN costs nothing at lr 0.05 but falls behind at lr 0.005; SR, Kahan, master do not",
          "[train][findings]") {
  // The update_strategies config's lr axis, smaller: 2048 samples, 8 epochs (408 steps).
  auto run = [](const char* update, double lr) {
    return run_train({{"update", s(update)}, {"lr", lr}, {"samples", std::int64_t{2048}}, {"epochs", std::int64_t{8}},
                  {"loss_scale", s("128")}});
  };
  const Metrics fp32_big = run("fp32", 0.05), rn_big = run("fp16-rn", 0.05);
  const Metrics fp32 = run("fp32", 0.005), rn = run("fp16-rn", 0.005), sr = run("fp16-sr", 0.005),
                kahan = run("fp16-kahan", 0.005), master = run("fp32-master", 0.005);
  INFO("lr 0.05: fp32 " << fp32_big.at("final_train_loss") << " rn " << rn_big.at("final_train_loss") << " (lost "
                        << rn_big.at("frac_lost_updates") << ")");
  INFO("lr 0.005: fp32 " << fp32.at("final_train_loss") << " rn " << rn.at("final_train_loss") << " (lost "
                         << rn.at("frac_lost_updates") << ") sr " << sr.at("final_train_loss") << " kahan "
                         << kahan.at("final_train_loss") << " master " << master.at("final_train_loss"));
  // lr 0.05: updates are large next to an fp16 ulp of the weights: few lost, no cost.
  CHECK(rn_big.at("final_train_loss") == Approx(fp32_big.at("final_train_loss")).epsilon(0.005));
  // lr 0.005: ten times smaller updates, a large share swamped, and RN falls behind.
  // Measured: fp32 1.9349, rn 1.9418 (36% of updates lost; 5.9% at lr 0.05), sr 1.9343,
  // kahan 1.9347, master 1.9348.
  CHECK(rn.at("frac_lost_updates") > 3 * rn_big.at("frac_lost_updates"));
  CHECK(rn.at("frac_lost_updates") > 0.25);
  const double base = fp32.at("final_train_loss"), rn_gap = rn.at("final_train_loss") - base;
  CHECK(rn_gap > 0.004);
  for (const Metrics* m : {&sr, &kahan, &master}) CHECK(std::fabs(m->at("final_train_loss") - base) < rn_gap / 5);
}

TEST_CASE("fp32-master with loss scale 128 tracks fp32", "[train][findings]") {
  const Metrics fp32 = run_train({{"update", s("fp32")}});
  const Metrics master = run_train({{"update", s("fp32-master")}, {"loss_scale", s("128")}});
  CHECK(master.at("final_train_loss_fp64") == Approx(fp32.at("final_train_loss_fp64")).epsilon(0.001));
  CHECK(master.at("final_train_loss") == Approx(fp32.at("final_train_loss")).epsilon(0.003));
  CHECK(master.at("final_test_acc") == Approx(fp32.at("final_test_acc")).margin(0.02));
}

TEST_CASE("batch-norm gradients do not underflow in fp16 here; fp8-e5m2 gradients lose a few, loss scaling "
          "and bn_fp32 restore them",
          "[train][findings]") {
  // NOT the finding. The issue expected pure fp16 without loss scaling to lose
  // batch-norm weight gradients to underflow (gradient std exactly 0) and bn_fp32 to
  // restore them. On this MLP it does not reproduce: weight-gradient magnitudes sit in
  // about 2^-11 .. 2^-4 (std 0.02-0.03), far above fp16's least subnormal 2^-24, and no
  // bn1 gradient is ever zero, with or without loss scaling. Longer training on easy
  // data, batch 256, 3 layers, loss in fp16 and the teacher data were tried (see the
  // closing note of issue 5 and the comments in configs/loss_scaling.yaml): at most
  // ~1e-4 of the weight gradients were zero, and loss scaling changed the final loss by
  // less than 0.1%. fp8-e5m2 gradients (least subnormal 2^-16), the format fp8 training
  // uses for gradients together with loss scaling, do lose some.
  const Metrics fp16 = run_train({{"update", s("fp16-rn")}});
  const Metrics fp16_scaled = run_train({{"update", s("fp16-rn")}, {"loss_scale", s("1024")}});
  CHECK(fp16.at("frac_zero_grad_bn1") == 0.0);
  CHECK(fp16.at("grad_std_bn1") > 0.01);
  CHECK(fp16_scaled.at("grad_std_bn1") == Approx(fp16.at("grad_std_bn1")).epsilon(0.01));
  CHECK(fp16_scaled.at("final_train_loss") == Approx(fp16.at("final_train_loss")).epsilon(0.002));

  // Well-separated clusters (noise 0.5), lr 0.1, 10 epochs: as examples become well fit
  // their gradients shrink towards e5m2's least subnormal. Measured: 0.19% of l1 and
  // 0.03% of bn1 gradients zero without scaling; none with S = 1024 (l1) and none in bn1
  // under bn_fp32; the final loss is the same either way (0.0205).
  const Overrides e5m2{{"update", s("fp32-master")}, {"grad_format", s("fp8-e5m2")}, {"epochs", std::int64_t{10}},
                       {"noise", 0.5}, {"lr", 0.1}};
  auto with = [&](Overrides extra) {
    Overrides p = e5m2;
    for (auto& [k, v] : extra) p[k] = v;
    return run_train(p);
  };
  const Metrics none = with({}), scaled = with({{"loss_scale", s("1024")}}), bn32 = with({{"bn_fp32", true}});
  INFO("e5m2 zeros l1/bn1: none " << none.at("frac_zero_grad_l1") << "/" << none.at("frac_zero_grad_bn1")
                                  << ", S=1024 " << scaled.at("frac_zero_grad_l1") << "/"
                                  << scaled.at("frac_zero_grad_bn1") << ", bn_fp32 " << bn32.at("frac_zero_grad_l1")
                                  << "/" << bn32.at("frac_zero_grad_bn1"));
  CHECK(none.at("frac_zero_grad_l1") > 1e-3);
  CHECK(none.at("frac_zero_grad_bn1") > 1e-4);
  CHECK(scaled.at("frac_zero_grad_l1") < none.at("frac_zero_grad_l1") / 10);
  CHECK(scaled.at("frac_zero_grad_bn1") < none.at("frac_zero_grad_bn1") / 3);
  CHECK(bn32.at("frac_zero_grad_bn1") == 0.0);
  CHECK(none.at("grad_std_bn1") > 0.0);  // a few lost, not all: the std is not 0
}

TEST_CASE("dynamic loss scaling: 2^16 never overflows here; 2^32 skips early, then settles", "[train][findings]") {
  const Metrics from_16 = run_train({{"update", s("fp16-rn")}, {"loss_scale", s("dynamic")}});
  CHECK(from_16.at("skipped_steps") == 0.0);
  CHECK(from_16.at("final_loss_scale") == 65536.0);  // 100 steps < ls_interval 2000

  const RunResult r = testing::run_experiment(
      "train", small({{"update", s("fp16-rn")}, {"loss_scale", s("dynamic")}, {"ls_init", 4294967296.0},
                      {"ls_interval", std::int64_t{20}}}));
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
  const Metrics bad = run_train(tiny), good = run_train(safe);
  CHECK(bad.at("frac_nonfinite_weights") == 1.0);
  CHECK(std::isnan(bad.at("grad_std_l1")));  // NaN gradients, not a zero spread
  CHECK(bad.at("final_test_acc") == 0.0);    // NaN logits count as wrong
  CHECK(good.at("frac_nonfinite_weights") == 0.0);
  CHECK(good.at("final_train_loss") < std::log(10.0) - 0.2);
}

TEST_CASE("unscale: lr folds 1/S into an fp16 learning rate, which underflows, and the weights stop moving",
          "[train][findings]") {
  using namespace roundoff::train;
  // lr 0.001 and S = 2^16: lr / S = 1.5e-8 is below half of fp16's least subnormal 2^-24
  // (5.96e-8), so it rounds to 0. Driven through the Trainer to look at the weights.
  auto trainer_for = [](UpdateRule rule, bool unscale_lr, UnscaleFormat unscale_format) {
    TrainSpec spec;
    spec.hidden = {16};
    spec.rule = rule;
    spec.lr = 0.001;
    spec.loss_scale = LossScaleKind::constant;
    spec.scale = 65536.0;
    spec.unscale_lr = unscale_lr;
    spec.unscale_format = unscale_format;
    auto data = std::make_shared<data::Split>(data::split(data::make_synthetic({1024, 32, 10, 1.5, 1}), 0.2, 1));
    data::standardise(*data);
    return std::make_unique<Trainer>(spec, data, 1, 0, emu::StreamId{1, 0, 0, 3});
  };
  auto state = [](const Trainer& t) {
    std::vector<double> all;
    auto add = [&](const Param& p) {
      const std::vector<double>& v = p.master.empty() ? p.value : p.master;
      all.insert(all.end(), v.begin(), v.end());
    };
    for (const ParamRef& p : t.params()) add(*p.param);
    return all;
  };
  auto steps = [](Trainer& t, int n) {
    for (int i = 0; i < n; ++i) t.step();
  };
  // fp16 weights, lr / S folded in fp16: nothing moves in 50 steps, not one value.
  auto frozen = trainer_for(UpdateRule::fp16_rn, true, UnscaleFormat::arith);
  const std::vector<double> before = state(*frozen);
  steps(*frozen, 50);
  CHECK(frozen->effective_lr() == 0.0);
  CHECK(frozen->effective_lr_error_max() == 1.0);
  CHECK(state(*frozen) == before);
  CHECK(frozen->frac_values_changed() == 0.0);
  // The same with the gradients divided instead: the weights move.
  auto divided = trainer_for(UpdateRule::fp16_rn, false, UnscaleFormat::arith);
  steps(*divided, 50);
  CHECK(divided->effective_lr() == static_cast<double>(static_cast<_Float16>(0.001)));
  CHECK(divided->frac_values_changed() > 0.5);
  // fp32-master folds lr / S in fp32 (1.5e-8 is a normal fp32 number) and moves; computed
  // in the compute format (fp16) it underflows and freezes the master weights too.
  auto master = trainer_for(UpdateRule::fp32_master, true, UnscaleFormat::arith);
  auto master_fp16 = trainer_for(UpdateRule::fp32_master, true, UnscaleFormat::compute);
  const std::vector<double> master_before = state(*master_fp16);
  steps(*master, 50);
  steps(*master_fp16, 50);
  CHECK(master->effective_lr() == static_cast<double>(static_cast<float>(0.001 / 65536)));
  CHECK(master->frac_values_changed() > 0.5);
  CHECK(master_fp16->effective_lr() == 0.0);
  CHECK(state(*master_fp16) == master_before);

  // The experiment's metric says the same.
  const Metrics m = run_train({{"update", s("fp16-rn")}, {"lr", 0.001}, {"loss_scale", s("65536")},
                           {"unscale", s("lr")}, {"epochs", std::int64_t{1}}});
  CHECK(m.at("frac_values_changed") == 0.0);
  CHECK(m.at("effective_lr") == 0.0);
}

TEST_CASE("unscale_format matters only where dividing by S rounds differently", "[train][findings]") {
  // fp16-rn, S = 1024 (a power of two): g / S is exact in fp32 and rounded once into fp16
  // either way, so auto (fp16), fp32 and compute (fp16) give the same bits.
  auto loss_trace = [](Overrides extra) {
    return testing::run_experiment("train", small(std::move(extra))).traces.at("loss").y;
  };
  const Overrides rn{{"update", s("fp16-rn")}, {"loss_scale", s("1024")}};
  auto with = [](Overrides base, const char* format) {
    base["unscale_format"] = s(format);
    return base;
  };
  const auto rn_auto = loss_trace(with(rn, "auto"));
  CHECK(loss_trace(with(rn, "fp32")) == rn_auto);
  CHECK(loss_trace(with(rn, "compute")) == rn_auto);
  // fp32-master, S = 2^16: fp32 unscaling keeps every gradient; fp16 unscaling rounds the
  // gradients below 2^-14 into fp16 subnormals (or 0), so the fp32 master weights differ.
  // (Measured: the differences are so small that in 100 steps they never change the fp16
  // compute copy, so even the loss trace is the same: it matters in the master's bits.)
  using namespace roundoff::train;
  auto masters = [](UnscaleFormat format) {
    TrainSpec spec;
    spec.hidden = {16};
    spec.rule = UpdateRule::fp32_master;
    spec.lr = 0.05;
    spec.loss_scale = LossScaleKind::constant;
    spec.scale = 65536.0;
    spec.unscale_format = format;
    auto data = std::make_shared<data::Split>(data::split(data::make_synthetic({1024, 32, 10, 1.5, 1}), 0.2, 1));
    data::standardise(*data);
    Trainer t(spec, data, 1, 0, emu::StreamId{1, 0, 0, 3});
    for (int i = 0; i < 100; ++i) t.step();
    std::vector<double> all;
    for (const ParamRef& p : t.params())
      if (p.role == ParamRole::weight) all.insert(all.end(), p.param->master.begin(), p.param->master.end());
    return all;
  };
  const std::vector<double> by_auto = masters(UnscaleFormat::arith), by_fp32 = masters(UnscaleFormat::fp32),
                            by_compute = masters(UnscaleFormat::compute);
  CHECK(by_fp32 == by_auto);  // auto is fp32 for fp32-master
  std::size_t differ = 0;
  for (std::size_t i = 0; i < by_auto.size(); ++i) differ += by_compute[i] != by_auto[i];
  INFO(differ << " of " << by_auto.size() << " master weights differ");
  CHECK(differ > 0);
}

TEST_CASE("evaluation in the model's arithmetic: close to fp64 for fp32, NaN weights score 0", "[train][findings]") {
  const Metrics fp32 = run_train({{"update", s("fp32")}});
  // Running statistics (momentum 0.1) instead of the split's own: close, not equal.
  CHECK(fp32.at("final_train_loss") == Approx(fp32.at("final_train_loss_fp64")).epsilon(0.02));
  CHECK(fp32.at("final_test_acc") == Approx(fp32.at("final_test_acc_fp64")).margin(0.06));
  CHECK(fp32.at("final_train_loss") != fp32.at("final_train_loss_fp64"));
}

TEST_CASE("grad_underflow: loss scaling moves fp16/fp8 gradients out of underflow and into overflow",
          "[train][findings]") {
  auto run = [](const char* format, double scale) {
    return testing::run_experiment("grad_underflow", {{"samples", std::int64_t{512}}, {"epochs", std::int64_t{2}},
                                                      {"width1", std::int64_t{16}}, {"format", s(format)},
                                                      {"scale", scale}})
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
