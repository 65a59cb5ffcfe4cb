// The MLP's forward and backward passes. With every format fp64 and the exact unit, the
// backward pass must match central finite differences of the forward loss (an oracle
// independent of the backward code), and the batch loss must match the separate fp64
// evaluation path when the batch is the whole set.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "experiments/training.hpp"
#include "tests/run_experiment.hpp"

using namespace roundoff;
using namespace roundoff::train;

namespace {

struct Fixture {
  data::Dataset data = data::make_synthetic({12, 5, 3, 1.0, 4});
  std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  ModelFormats formats{emu::fp64(), emu::fp64(), emu::fp64(), emu::fp64(), emu::fp64()};
  std::unique_ptr<Mlp> mlp;
  std::vector<double> x;
  emu::Context ctx;

  explicit Fixture(std::vector<int> hidden) {
    mlp = std::make_unique<Mlp>(data.features, hidden, data.classes, formats, *unit);
    const Updater init(UpdateRule::fp32, {}, ParamFormats{emu::fp64(), emu::fp64(), emu::fp64(), emu::fp64()});
    emu::Rng rng(emu::StreamId{9, 0, 0, 0});
    auto random = [&](std::size_t n, double mean) {
      std::vector<double> v(n);
      for (double& e : v) e = mean + 0.5 * rng.normal();
      return v;
    };
    std::vector<int> widths{data.features};
    widths.insert(widths.end(), hidden.begin(), hidden.end());
    widths.push_back(data.classes);
    for (int l = 0; l < mlp->layers(); ++l) init.init(mlp->weights[l], random(std::size_t(widths[l]) * widths[l + 1], 0.0), ctx);
    init.init(mlp->bias, random(data.classes, 0.0), ctx);
    for (std::size_t b = 0; b < hidden.size(); ++b) {
      init.init(mlp->gamma[b], random(hidden[b], 1.0), ctx);
      init.init(mlp->beta[b], random(hidden[b], 0.0), ctx);
    }
    x.assign(data.x.begin(), data.x.end());
  }
  double loss() { return mlp->forward_backward(ctx, x, data.y, 1.0); }
};

void check_gradients(Fixture& f, Param& p, const char* name) {
  f.loss();
  const std::vector<double> analytic = p.grad;
  for (std::size_t i = 0; i < p.value.size(); ++i) {
    const double saved = p.value[i], h = 1e-6;
    p.value[i] = saved + h;
    const double up = f.loss();
    p.value[i] = saved - h;
    const double down = f.loss();
    p.value[i] = saved;
    const double numeric = (up - down) / (2 * h);
    INFO(name << "[" << i << "] analytic " << analytic[i] << " numeric " << numeric);
    CHECK(analytic[i] == Approx(numeric).margin(1e-7).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("fp64 backward equals finite differences (2 and 3 layers, batch norm)", "[train][mlp]") {
  for (auto hidden : {std::vector<int>{4}, std::vector<int>{4, 3}}) {
    Fixture f(hidden);
    for (int l = 0; l < f.mlp->layers(); ++l) check_gradients(f, f.mlp->weights[l], "w");
    check_gradients(f, f.mlp->bias, "bias");
    for (std::size_t b = 0; b < hidden.size(); ++b) {
      check_gradients(f, f.mlp->gamma[b], "gamma");
      check_gradients(f, f.mlp->beta[b], "beta");
    }
  }
}

TEST_CASE("fp64 batch loss equals the fp64 evaluation over the same whole set", "[train][mlp]") {
  Fixture f({6, 5});
  const double batch_loss = f.loss();
  CHECK(batch_loss == Approx(f.mlp->evaluate_fp64(f.data).loss).epsilon(1e-12));
}

TEST_CASE("the loss scale multiplies every gradient exactly when nothing rounds", "[train][mlp]") {
  Fixture f({4});
  f.loss();
  const std::vector<double> g1 = f.mlp->weights[0].grad;
  f.mlp->forward_backward(f.ctx, f.x, f.data.y, 1024.0);
  for (std::size_t i = 0; i < g1.size(); ++i) CHECK(f.mlp->weights[0].grad[i] == Approx(1024.0 * g1[i]).epsilon(1e-12));
}

TEST_CASE("gradient histogram bins and cast losses agree with hardware binary16", "[train][mlp]") {
  std::array<std::uint64_t, kHistBins> counts{};
  for (double v : {0.0, 1.0, -1.5, 0x1p-50, 0x1p20, std::nan("")}) add_to_histogram(counts, v);
  CHECK(counts[0] == 1);                        // zero
  CHECK(counts[1 + (0 - kHistLowExponent)] == 2);  // [1, 2)
  CHECK(counts[1] == 1);                        // below 2^-40, clamped
  CHECK(counts[kHistBins - 2] == 1);            // above 2^16, clamped
  CHECK(counts[kHistBins - 1] == 1);            // non-finite

  // Values spread over 2^-40 .. 2^20 (several per binade, both signs): the fractions that
  // fp16 flushes to zero, overflows and makes subnormal, counted with _Float16 casts.
  std::vector<double> values;
  emu::Rng rng(emu::StreamId{5, 0, 0, 0});
  for (int i = 0; i < 20000; ++i) values.push_back((i % 2 ? 1 : -1) * std::ldexp(1.0 + rng.uniform(), -40 + i % 60));
  for (double scale : {1.0, 128.0, 32768.0}) {
    double zero = 0, inf = 0, sub = 0;
    for (double v : values) {
      const _Float16 h = static_cast<_Float16>(v * scale);
      const double d = static_cast<double>(h);
      if (d == 0) ++zero;
      else if (std::isinf(d)) ++inf;
      else if (std::fabs(d) < 0x1p-14) ++sub;
    }
    const CastLoss loss = cast_loss(values, emu::fp16(), scale);
    const double n = static_cast<double>(values.size());
    INFO("scale " << scale);
    CHECK(loss.underflow == zero / n);
    CHECK(loss.overflow == inf / n);
    CHECK(loss.subnormal == sub / n);
  }
}

TEST_CASE("running statistics follow r = 0.9 r + 0.1 s (PyTorch's momentum) in fp64", "[train][mlp]") {
  // The same whole batch k times with unchanged weights: the batch mean m and unbiased
  // variance v of the first Linear's outputs are the same each time, so after k passes
  // running_mean = (1 - 0.9^k) m and running_var = 0.9^k + (1 - 0.9^k) v (closed form).
  Fixture f({4});
  const std::size_t n = f.data.size(), d = f.data.features, w = 4;
  std::vector<double> mean(w, 0.0), var(w, 0.0);
  for (std::size_t j = 0; j < w; ++j) {
    std::vector<double> z(n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < d; ++k) z[i] += f.x[i * d + k] * f.mlp->weights[0].value[k * w + j];
    for (double v : z) mean[j] += v / static_cast<double>(n);
    for (double v : z) var[j] += (v - mean[j]) * (v - mean[j]) / static_cast<double>(n - 1);
  }
  for (int k = 1; k <= 5; ++k) {
    f.loss();
    const double decay = std::pow(0.9, k);
    for (std::size_t j = 0; j < w; ++j) {
      INFO("pass " << k << " unit " << j);
      CHECK(f.mlp->running_mean[0][j] == Approx((1 - decay) * mean[j]).epsilon(1e-12).margin(1e-15));
      CHECK(f.mlp->running_var[0][j] == Approx(decay + (1 - decay) * var[j]).epsilon(1e-12));
    }
  }
}

namespace {

_Float16 h16(double v) { return static_cast<_Float16>(v); }
_Float16 h16f(float v) { return static_cast<_Float16>(v); }

// fp16 fma, exact: gamma * xhat is exact in double (22 significant bits); the sum is
// checked to be exact (TwoSum error 0) and then rounded once into binary16.
_Float16 fma16(_Float16 a, _Float16 b, _Float16 c) {
  const double p = static_cast<double>(a) * static_cast<double>(b), s = p + static_cast<double>(c);
  const double bb = s - p, err = (p - (s - bb)) + (static_cast<double>(c) - bb);
  REQUIRE(err == 0.0);
  return h16(s);
}

}  // namespace

TEST_CASE("inference in fp16 equals an independent binary16/float32 computation", "[train][mlp]") {
  // act, batch norm and gradients in fp16, matmuls on fp32-seq (fp16 inputs, fp32 fma
  // accumulation), loss in fp32. Oracle: the CPU's float fma (std::fmaf) for the
  // accumulation, _Float16 casts for every rounding into fp16 (via float for + - * / sqrt:
  // 24 >= 2 * 11 + 2 bits, so the double rounding is innocuous), fp64 exp/log rounded once.
  const data::Dataset data = data::make_synthetic({40, 5, 3, 1.0, 4});
  const std::vector<int> hidden{6, 4};
  const auto unit = emu::make_unit(emu::UnitKind::fp32_seq, emu::fp16(), emu::fp32());
  const ModelFormats formats{emu::fp16(), emu::fp16(), emu::fp32(), emu::fp16(), emu::fp16()};
  Mlp mlp(data.features, hidden, data.classes, formats, *unit);
  const Updater init(UpdateRule::fp16_rn, {}, ParamFormats{emu::fp16(), emu::fp16(), emu::fp16(), emu::fp32()});
  emu::Context ctx;
  emu::Rng rng(emu::StreamId{21, 0, 0, 0});
  auto random = [&](std::size_t n, double mean, double sd) {
    std::vector<double> v(n);
    for (double& e : v) e = mean + sd * rng.normal();
    return v;
  };
  std::vector<int> widths{data.features, 6, 4, data.classes};
  for (int l = 0; l < 3; ++l) init.init(mlp.weights[l], random(std::size_t(widths[l]) * widths[l + 1], 0.0, 0.6), ctx);
  init.init(mlp.bias, random(data.classes, 0.0, 0.3), ctx);
  for (int b = 0; b < 2; ++b) {
    init.init(mlp.gamma[b], random(hidden[b], 1.0, 0.3), ctx);
    init.init(mlp.beta[b], random(hidden[b], 0.0, 0.3), ctx);
    for (double& v : mlp.running_mean[b] = random(hidden[b], 0.2, 0.5)) v = double(h16(v));
    for (double& v : mlp.running_var[b] = random(hidden[b], 2.0, 0.5)) v = double(h16(std::fabs(v)));
  }

  // The oracle, layer by layer on fp16 values.
  const std::size_t n = data.size();
  std::vector<_Float16> h(n * data.features);
  for (std::size_t k = 0; k < h.size(); ++k) h[k] = h16(data.x[k]);
  for (int l = 0; l < 3; ++l) {
    const std::size_t in = widths[l], out = widths[l + 1];
    std::vector<_Float16> z(n * out);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < out; ++j) {
        float acc = l == 2 ? static_cast<float>(mlp.bias.value[j]) : 0.0f;
        for (std::size_t k = 0; k < in; ++k)
          acc = std::fmaf(static_cast<float>(h[i * in + k]), static_cast<float>(mlp.weights[l].value[k * out + j]),
                          acc);
        z[i * out + j] = h16f(acc);
      }
    if (l < 2) {
      const _Float16 eps = h16(1e-5);
      for (std::size_t j = 0; j < out; ++j) {
        const _Float16 rm = h16(mlp.running_mean[l][j]), rv = h16(mlp.running_var[l][j]);
        const _Float16 var_eps = h16f(float(rv) + float(eps));
        const _Float16 inv = h16f(1.0f / static_cast<float>(h16f(std::sqrt(static_cast<float>(var_eps)))));
        for (std::size_t i = 0; i < n; ++i) {
          const _Float16 xhat = h16f(static_cast<float>(h16f(float(z[i * out + j]) - float(rm))) * float(inv));
          const _Float16 y = fma16(h16(mlp.gamma[l].value[j]), xhat, h16(mlp.beta[l].value[j]));
          z[i * out + j] = y > 0 ? y : _Float16(0);
        }
      }
    }
    h = std::move(z);
  }
  std::vector<double> x(data.x.begin(), data.x.end());
  for (double& v : x) v = double(h16(v));
  const std::vector<double> logits = mlp.logits(ctx, x, 0);
  REQUIRE(logits.size() == h.size());
  for (std::size_t k = 0; k < h.size(); ++k) {
    INFO("logit " << k);
    CHECK(logits[k] == static_cast<double>(h[k]));
  }

  // evaluate(): per-sample cross-entropy in fp32 from these logits, averaged in fp64.
  double loss = 0.0;
  std::size_t correct = 0;
  const std::size_t c = data.classes;
  for (std::size_t i = 0; i < n; ++i) {
    const _Float16* row = &h[i * c];
    std::size_t best = 0;
    for (std::size_t j = 1; j < c; ++j)
      if (row[j] > row[best]) best = j;
    float sum = 0.0f;
    for (std::size_t j = 0; j < c; ++j)
      sum += static_cast<float>(std::exp(static_cast<double>(static_cast<float>(double(row[j]) - double(row[best])))));
    const float lse = static_cast<float>(row[best]) + static_cast<float>(std::log(static_cast<double>(sum)));
    loss += static_cast<double>(lse - static_cast<float>(row[data.y[i]]));
    correct += static_cast<int>(best) == data.y[i];
  }
  const Evaluation e = mlp.evaluate(ctx, data);
  CHECK(e.loss == Approx(loss / static_cast<double>(n)).epsilon(1e-15));
  CHECK(e.accuracy == static_cast<double>(correct) / static_cast<double>(n));
}

TEST_CASE("grad_underflow keeps training runs up to a byte budget and recomputes evicted ones alike",
          "[train][grad_underflow]") {
  auto run = [](double lr) {
    return testing::run_experiment("grad_underflow", {{"samples", std::int64_t{40}}, {"epochs", std::int64_t{1}},
                                                      {"width1", std::int64_t{4}}, {"batch", std::int64_t{8}},
                                                      {"lr", lr}, {"format", std::string("fp8-e4m3")}})
        .metrics;
  };
  set_gradient_cache_budget(0);  // forget runs of earlier tests
  REQUIRE(gradient_cache_bytes() == 0);
  set_gradient_cache_budget(kGradientCacheBytes);
  const auto first = run(0.01);
  const std::size_t one_run = gradient_cache_bytes();  // only this run is cached so far
  REQUIRE(one_run > 0);
  // Room for three runs: the fourth distinct run evicts the least recently used.
  set_gradient_cache_budget(3 * one_run);
  for (int k = 1; k <= 8; ++k) {
    (void)run(0.01 + 0.001 * k);  // a distinct training run each, of the same size
    CHECK(gradient_cache_bytes() <= 3 * one_run);
    CHECK(gradient_cache_bytes() >= std::min<std::size_t>(k + 1, 3) * one_run);
  }
  const auto again = run(0.01);  // evicted long ago: recomputed
  CHECK(again.at("frac_underflow") == first.at("frac_underflow"));
  CHECK(again.at("frac_subnormal") == first.at("frac_subnormal"));
  set_gradient_cache_budget(kGradientCacheBytes);
}
