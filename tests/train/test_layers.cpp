// The layers of the convolutional models (experiments/nn/layers.hpp) and the models built
// from them (experiments/nn/convnets.hpp).
//  - Gradient checks: with every format fp64 and the exact unit, each layer's backward
//    pass against central finite differences of its forward pass (an oracle independent
//    of the backward code), and the same for ConvNet and ResNet end to end.
//  - Convolutions through every unit against the exact unit, within the unit's
//    documented accumulation error, forward and both gradients.
//  - The direct fp64 forward pass (Fp64) against the emulated one in fp64.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

#include "experiments/nn/convnets.hpp"
#include "experiments/nn/layers.hpp"

using namespace roundoff;
using namespace roundoff::train;

namespace {

const ModelFormats kFp64{emu::fp64(), emu::fp64(), emu::fp64(), emu::fp64(), emu::fp64()};

struct Fp64Setup {
  std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  emu::Context ctx;
  Emulated e{ctx, kFp64, *unit};
};

std::vector<double> normals(std::size_t n, std::uint64_t seed, double mean = 0.0, double sd = 1.0) {
  emu::Rng rng(emu::StreamId{seed, 0, 0, 0});
  std::vector<double> v(n);
  for (double& x : v) x = mean + sd * rng.normal();
  return v;
}

Tensor random_tensor(Shape s, std::uint64_t seed) {
  Tensor t(s);
  t.v = normals(s.size(), seed);
  return t;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f with respect to every value of `values` (restored after),
// against `analytic`.
template <class F>
void check_against_differences(std::vector<double>& values, const std::vector<double>& analytic, F f,
                               const char* what, double h = 1e-6) {
  REQUIRE(analytic.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double saved = values[i];
    values[i] = saved + h;
    const double up = f();
    values[i] = saved - h;
    const double down = f();
    values[i] = saved;
    const double numeric = (up - down) / (2 * h);
    INFO(what << "[" << i << "] analytic " << analytic[i] << " numeric " << numeric);
    CHECK(analytic[i] == Approx(numeric).margin(1e-7).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("convolution gradients equal finite differences (fp64, exact unit)", "[train][layers]") {
  // L = sum r * conv(x, w): dL/dw and dL/dx from the backward functions.
  struct Case {
    Shape x;
    ConvGeometry g;
  };
  for (const Case& c : {Case{{2, 2, 5, 5}, {3, 3, 1, 1}}, Case{{2, 3, 7, 6}, {2, 3, 2, 1}},
                        Case{{1, 2, 6, 6}, {4, 1, 2, 0}}, Case{{2, 1, 4, 5}, {2, 3, 1, 0}}}) {
    Fp64Setup s;
    Tensor x = random_tensor(c.x, 1);
    std::vector<double> w = normals(c.g.out_channels * c.x.c * c.g.kernel * c.g.kernel, 2);
    const Shape ys = conv_output(c.x, c.g);
    const Tensor r = random_tensor(ys, 3);
    auto loss = [&] { return dot(r.v, conv2d(s.e, x, w, c.g, emu::fp64()).v); };
    INFO("input " << c.x.n << "x" << c.x.c << "x" << c.x.h << "x" << c.x.w << ", kernel " << c.g.kernel
                  << ", stride " << c.g.stride << ", pad " << c.g.pad);
    check_against_differences(w, conv2d_grad_weights(s.e, x, r, c.g), loss, "dw");
    check_against_differences(x.v, conv2d_grad_input(s.e, r, w, c.g, c.x).v, loss, "dx");
    // The direct fp64 convolution agrees with the emulated one.
    const Tensor direct = conv2d(Fp64{}, x, w, c.g), emulated = conv2d(s.e, x, w, c.g, emu::fp64());
    for (std::size_t i = 0; i < direct.v.size(); ++i) CHECK(direct.v[i] == Approx(emulated.v[i]).margin(1e-12));
  }
}

TEST_CASE("convolution layout: a hand-worked 1-channel example", "[train][layers]") {
  // x = 1..9 on a 3x3 grid, w = [[1, 0], [0, -1]] (2x2, stride 1, no padding):
  // out[y][x] = x[y][x] - x[y+1][x+1] = -4 everywhere.
  Fp64Setup s;
  Tensor x(Shape{1, 1, 3, 3});
  for (int i = 0; i < 9; ++i) x.v[i] = i + 1;
  const Tensor y = conv2d(s.e, x, {1, 0, 0, -1}, ConvGeometry{1, 2, 1, 0}, emu::fp64());
  CHECK(y.shape == Shape{1, 1, 2, 2});
  CHECK(y.v == std::vector<double>{-4, -4, -4, -4});
  // Padding 1, stride 2, 3x3 kernel of ones: sums of the 3x3 windows centred on (0,0),
  // (0,2), (2,0), (2,2), zeros outside: 1+2+4+5, 2+3+5+6, 4+5+7+8, 5+6+8+9.
  const Tensor z = conv2d(s.e, x, std::vector<double>(9, 1.0), ConvGeometry{1, 3, 2, 1}, emu::fp64());
  CHECK(z.v == std::vector<double>{12, 16, 24, 28});
}

TEST_CASE("dense, batch norm, pooling, ReLU and the loss: gradients equal finite differences", "[train][layers]") {
  Fp64Setup s;
  SECTION("dense") {
    Tensor x = random_tensor(Shape{3, 2, 2, 2}, 4);
    Param w, b;
    w.value = normals(8 * 3, 5);
    b.value = normals(3, 6);
    w.grad.resize(w.value.size());
    b.grad.resize(3);
    const Tensor r = random_tensor(Shape{3, 3, 1, 1}, 7);
    auto loss = [&] { return dot(r.v, dense(s.e, x, w, &b, 3, emu::fp64()).v); };
    const Tensor dx = dense_backward(s.e, x, r, w, &b, true);
    check_against_differences(w.value, w.grad, loss, "dw");
    check_against_differences(b.value, b.grad, loss, "dbias");
    check_against_differences(x.v, dx.v, loss, "dx");
  }
  SECTION("batch norm in training mode (batch statistics over samples and positions)") {
    for (Shape shape : {Shape{3, 2, 2, 3}, Shape{5, 3, 1, 1}}) {
      Tensor z = random_tensor(shape, 8);
      Param gamma, beta;
      gamma.value = normals(shape.c, 9, 1.0, 0.3);
      beta.value = normals(shape.c, 10);
      gamma.grad.resize(shape.c);
      beta.grad.resize(shape.c);
      std::vector<double> mean(shape.c, 0.0), var(shape.c, 1.0);
      const BatchNormConstants k = BatchNormConstants::in(emu::fp64());
      const Tensor r = random_tensor(shape, 11);
      BatchNormSaved saved;
      auto loss = [&] {
        BatchNormSaved scratch;
        return dot(r.v, batch_norm_train(s.e, z, gamma, beta, mean, var, k, scratch).v);
      };
      (void)batch_norm_train(s.e, z, gamma, beta, mean, var, k, saved);
      const Tensor dz = batch_norm_backward(s.e, r, saved, gamma, beta);
      check_against_differences(gamma.value, gamma.grad, loss, "dgamma");
      check_against_differences(beta.value, beta.grad, loss, "dbeta");
      check_against_differences(z.v, dz.v, loss, "dz", 1e-5);
    }
  }
  SECTION("ReLU and 2x2 max pooling (odd sizes drop the last row and column)") {
    Tensor x = random_tensor(Shape{2, 2, 5, 4}, 12);
    const Tensor r = random_tensor(Shape{2, 2, 2, 2}, 13);
    auto loss = [&] { return dot(r.v, max_pool(relu(x)).v); };
    std::vector<std::uint32_t> argmax;
    const Tensor out = relu(x);
    (void)max_pool(out, &argmax);
    const Tensor dx = relu_backward(out, max_pool_backward(r, argmax, x.shape));
    check_against_differences(x.v, dx.v, loss, "dx");
    // Row 4 (the fifth) of every map is dropped: no gradient reaches it.
    for (std::size_t p = 0; p < 4; ++p)
      for (std::size_t col = 0; col < 4; ++col) CHECK(dx.v[(p * 5 + 4) * 4 + col] == 0.0);
  }
  SECTION("global average pooling and the residual addition") {
    Tensor x = random_tensor(Shape{2, 3, 3, 2}, 14), y = random_tensor(Shape{2, 3, 3, 2}, 15);
    const Tensor r = random_tensor(Shape{2, 3, 1, 1}, 16);
    auto loss = [&] { return dot(r.v, global_avg_pool(s.e, add(s.e, x, y, emu::fp64())).v); };
    const Tensor dx = global_avg_pool_backward(s.e, r, x.shape);
    check_against_differences(x.v, dx.v, loss, "dx");
    check_against_differences(y.v, dx.v, loss, "dy");
    const Tensor direct = global_avg_pool(Fp64{}, x), emulated = global_avg_pool(s.e, x);
    for (std::size_t i = 0; i < direct.v.size(); ++i) CHECK(direct.v[i] == Approx(emulated.v[i]).epsilon(1e-15));
  }
  SECTION("softmax cross-entropy: dz = (softmax - onehot) S / B") {
    std::vector<double> logits = normals(4 * 5, 17);
    const std::vector<int> labels{0, 4, 2, 2};
    std::vector<double> dz;
    (void)softmax_cross_entropy(s.ctx, kFp64, logits, labels, 5, 8.0, dz);
    for (double& g : dz) g /= 8.0;
    std::vector<double> scratch;
    check_against_differences(logits, dz, [&] { return softmax_cross_entropy(s.ctx, kFp64, logits, labels, 5, 1.0, scratch); },
                              "dlogits");
  }
}

TEST_CASE("max pooling propagates NaN and takes the first maximum", "[train][layers]") {
  Tensor x(Shape{1, 1, 2, 4});
  x.v = {1, 3, 2, std::nan(""), 3, 0, 5, 5};
  std::vector<std::uint32_t> argmax;
  const Tensor y = max_pool(x, &argmax);
  CHECK(y.v[0] == 3);
  CHECK(argmax[0] == 1);  // the first 3 in row-major order
  CHECK(std::isnan(y.v[1]));
  CHECK(argmax[1] == 3);
  CHECK(relu(x).v[3] != relu(x).v[3]);  // NaN passes ReLU
}

namespace {

// A tiny image set: n images of 2 x side x side, 3 classes.
data::Dataset tiny_images(std::size_t n = 4, int side = 8) {
  data::Dataset d;
  d.channels = 2;
  d.height = d.width = side;
  d.features = 2 * side * side;
  d.classes = 3;
  const std::vector<double> v = normals(n * d.features, 21);
  d.x.assign(v.begin(), v.end());
  for (std::size_t i = 0; i < n; ++i) d.y.push_back(static_cast<int>(i % 3));
  return d;
}

void randomise(Model& m, std::uint64_t seed) {
  std::uint64_t k = seed;
  for (const ParamRef& p : m.params()) {
    const double mean = p.role == ParamRole::bn_scale ? 1.0 : 0.0;
    const double sd = p.role == ParamRole::weight ? std::sqrt(2.0 / static_cast<double>(p.fan_in)) : 0.2;
    p.param->value = normals(p.size, ++k, mean, sd);
  }
}

// The model's gradients against central differences of its batch loss, for up to
// `per_tensor` values of every parameter tensor (spread over the tensor).
void check_model_gradients(Model& m, const data::Dataset& d, std::size_t per_tensor) {
  emu::Context ctx;
  const std::vector<double> x(d.x.begin(), d.x.end());
  auto loss = [&] { return m.forward_backward(ctx, x, d.y, 1.0); };
  loss();
  std::vector<std::vector<double>> gradients;  // at the unperturbed point
  for (const ParamRef& p : m.params()) gradients.push_back(p.param->grad);
  std::size_t tensor = 0;
  for (const ParamRef& p : m.params()) {
    const std::vector<double>& analytic = gradients[tensor++];
    const std::size_t step = std::max<std::size_t>(1, p.size / per_tensor);
    for (std::size_t i = 0; i < p.size; i += step) {
      std::vector<double>& values = p.param->value;
      const double saved = values[i], h = 1e-6;
      values[i] = saved + h;
      const double up = loss();
      values[i] = saved - h;
      const double down = loss();
      values[i] = saved;
      const double numeric = (up - down) / (2 * h);
      INFO(p.name << "[" << i << "] analytic " << analytic[i] << " numeric " << numeric);
      CHECK(analytic[i] == Approx(numeric).margin(1e-7).epsilon(1e-5));
    }
  }
}

}  // namespace

TEST_CASE("ConvNet and ResNet: end-to-end gradients equal finite differences (fp64, exact unit)", "[train][layers]") {
  const data::Dataset d = tiny_images();
  const std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  SECTION("convnet") {
    ConvNet m(d, 3, 2, kFp64, *unit);
    randomise(m, 30);
    check_model_gradients(m, d, 4);
  }
  SECTION("resnet, N = 1 (ResNet-8), with projection shortcuts") {
    const data::Dataset small = tiny_images(4, 6);  // 6 -> 3 -> 2 through the stages
    ResNet m(small, 1, 2, kFp64, *unit);
    randomise(m, 40);
    std::size_t projections = 0;
    for (const ParamRef& p : m.params()) projections += p.name.find("shortcut") != std::string::npos;
    CHECK(projections == 2);  // into stages 2 and 3
    check_model_gradients(m, small, 3);
  }
}

TEST_CASE("the models' parameters, depth and shapes", "[train][layers]") {
  const data::Dataset d = tiny_images(4, 28);
  const std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  ConvNet c(d, 4, 6, kFp64, *unit);
  std::vector<std::string> names;
  for (const ParamRef& p : c.params()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"conv1", "bn1.gamma", "bn1.beta", "conv2", "bn2.gamma", "bn2.beta", "dense",
                                          "dense.bias"});
  CHECK(c.params()[6].size == 6u * 7 * 7 * 3);  // 28 -> 14 -> 7
  for (int n : {1, 2, 3}) {
    ResNet r(d, n, 2, kFp64, *unit);
    std::size_t convs = 0, bns = 0;
    for (const ParamRef& p : r.params()) {
      const bool shortcut = p.name.find("shortcut") != std::string::npos;
      if (p.role == ParamRole::weight && !shortcut) ++convs;
      if (p.role == ParamRole::bn_scale) ++bns;
    }
    CHECK(convs == static_cast<std::size_t>(6 * n + 2));  // depth 6N + 2: stem, 6N, dense
    CHECK(bns == static_cast<std::size_t>(6 * n + 1));
    CHECK(r.params().back().size == 3u);  // dense bias: classes
  }
  data::Dataset flat = data::make_synthetic({10, 4, 2, 1.0, 1});
  CHECK_THROWS_WITH(ConvNet(flat, 2, 2, kFp64, *unit), Catch::Contains("model convnet needs images x [N, C, H, W]"));
  CHECK_THROWS_WITH(ResNet(flat, 1, 2, kFp64, *unit), Catch::Contains("model resnet needs images"));
  CHECK_THROWS_WITH(ConvNet(tiny_images(2, 3), 2, 2, kFp64, *unit), Catch::Contains("at least 4x4"));
}

TEST_CASE("the fp64 evaluation equals the emulated inference in fp64", "[train][layers]") {
  const data::Dataset d = tiny_images(6);
  const std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  ResNet m(d, 1, 2, kFp64, *unit);
  randomise(m, 50);
  emu::Context ctx;
  const std::vector<double> x(d.x.begin(), d.x.end());
  m.forward_backward(ctx, x, d.y, 1.0);  // moves the running statistics off 0 and 1
  const Evaluation emulated = m.evaluate(ctx, d), direct = m.evaluate_fp64(d);
  CHECK(emulated.loss == Approx(direct.loss).epsilon(1e-12));
  CHECK(emulated.accuracy == direct.accuracy);
}

namespace {

// The unit roundoff of the format a unit accumulates in, and a factor for its error
// bound: |unit - exact| <= factor K u sum |a_i b_i| (Higham's gamma_K bound for K
// sequential roundings; the tensor cores truncate at alignment and round their fp32
// sums toward zero, which costs up to one ulp per block instead of half, hence 2 more).
struct UnitError {
  double u, factor;
};
UnitError unit_error(emu::UnitKind kind) {
  switch (kind) {
    case emu::UnitKind::ipu_amp_half:
    case emu::UnitKind::fp16_seq: return {0x1p-11, 1.0};
    case emu::UnitKind::ipu_amp:
    case emu::UnitKind::fp32_seq:
    case emu::UnitKind::exact: return {0x1p-24, 1.0};
    default: return {0x1p-24, 4.0};  // tensor cores
  }
}

double random_half(emu::Rng& rng) { return static_cast<double>(static_cast<_Float16>(rng.normal())); }

}  // namespace

TEST_CASE("convolutions through every unit stay within the unit's error bound of the exact unit", "[train][layers]") {
  // fp16 inputs (exact in every unit's input format), two geometries (3x3 stride 1 pad 1
  // and 3x3 stride 2 pad 1); forward, input gradient (a convolution of K = O 9 terms) and
  // weight gradient (K = N OH OW terms). The bound: factor K u sum |a b| + u |exact| (the
  // result rounded into the unit's output format), with sum |a b| computed by the same
  // layer in fp64 on |a| and |b|.
  const ModelFormats f32{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32()};
  emu::Rng rng(emu::StreamId{60, 0, 0, 0});
  Tensor x(Shape{2, 20, 6, 6}), dy_s1(Shape{2, 5, 6, 6}), dy_s2(Shape{2, 5, 3, 3});
  std::vector<double> w(5 * 20 * 9);
  for (Tensor* t : {&x, &dy_s1, &dy_s2})
    for (double& v : t->v) v = random_half(rng);
  for (double& v : w) v = random_half(rng);
  auto magnitude = [](Tensor t) {
    for (double& v : t.v) v = std::fabs(v);
    return t;
  };
  std::vector<double> abs_w(w);
  for (double& v : abs_w) v = std::fabs(v);
  const std::unique_ptr<emu::MatrixUnit> exact = emu::make_unit(emu::UnitKind::exact, emu::fp16(), emu::fp32());
  const std::unique_ptr<emu::MatrixUnit> fp64_unit = emu::make_unit(emu::UnitKind::exact, emu::fp64(), emu::fp64());
  emu::Context plain;
  Emulated bound_arith{plain, kFp64, *fp64_unit};
  for (const char* const* name = emu::unit_names(); *name; ++name) {
    const emu::UnitKind kind = emu::unit_kind_by_name(*name);
    const std::unique_ptr<emu::MatrixUnit> unit = emu::make_unit(kind, emu::fp16());
    const UnitError err = unit_error(kind);
    for (std::size_t stride : {1, 2}) {
      const ConvGeometry g{5, 3, stride, 1};
      const Tensor& dy = stride == 1 ? dy_s1 : dy_s2;
      emu::Context ctx, exact_ctx;
      Emulated e{ctx, f32, *unit}, ex{exact_ctx, f32, *exact};
      auto check = [&](const std::vector<double>& got, const std::vector<double>& want,
                       const std::vector<double>& abs_sum, double terms, const char* what) {
        double worst = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double bound = err.factor * terms * err.u * abs_sum[i] + err.u * std::fabs(want[i]);
          worst = std::max(worst, std::fabs(got[i] - want[i]) / bound);
          INFO(*name << " stride " << stride << " " << what << "[" << i << "]: " << got[i] << " vs " << want[i]);
          REQUIRE(std::fabs(got[i] - want[i]) <= bound);
        }
        INFO(*name << " " << what << " largest error / bound " << worst);
        CHECK(worst <= 1.0);
      };
      check(conv2d(e, x, w, g, emu::fp32()).v, conv2d(ex, x, w, g, emu::fp32()).v,
            conv2d(bound_arith, magnitude(x), abs_w, g, emu::fp64()).v, 20 * 9, "forward");
      check(conv2d_grad_input(e, dy, w, g, x.shape).v, conv2d_grad_input(ex, dy, w, g, x.shape).v,
            conv2d_grad_input(bound_arith, magnitude(dy), abs_w, g, x.shape).v, 5 * 9, "input gradient");
      check(conv2d_grad_weights(e, x, dy, g), conv2d_grad_weights(ex, x, dy, g),
            conv2d_grad_weights(bound_arith, magnitude(x), magnitude(dy), g), 2.0 * dy.shape.spatial(),
            "weight gradient");
    }
  }
}
