// The MLP's forward and backward passes. With every format fp64 and the exact unit, the
// backward pass must match central finite differences of the forward loss (an oracle
// independent of the backward code), and the batch loss must match the separate fp64
// evaluation path when the batch is the whole set.
#include <catch2/catch.hpp>
#include <cmath>

#include "experiments/mlp.hpp"

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
  CHECK(batch_loss == Approx(f.mlp->evaluate(f.data).loss).epsilon(1e-12));
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
