#include "convnets.hpp"

#include <stdexcept>
#include <utility>

namespace roundoff::train {

namespace {

using Train = ImageModel::Train;
using Infer = ImageModel::Infer;

// A scope on the emulated context; nothing in fp64.
class NameScope {
 public:
  NameScope(emu::Context* ctx, std::string_view name) : ctx_(ctx) {
    if (ctx_) ctx_->push_scope(name);
  }
  ~NameScope() {
    if (ctx_) ctx_->pop_scope();
  }
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;

 private:
  emu::Context* ctx_;
};
emu::Context* context_of(const Train& a) { return &a.e.ctx; }
emu::Context* context_of(const Infer& a) { return &a.e.ctx; }
emu::Context* context_of(Fp64) { return nullptr; }

const emu::Format& output_format(const Emulated& e, const ConvLayer& l) {
  return l.feeds_batch_norm ? e.formats.bn_fwd : e.formats.act;
}

// ---- One layer's forward pass per arithmetic ------------------------------------------

Tensor apply(Train a, ConvLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  l.input = x;
  return conv2d(a.e, x, l.weight.value, l.geometry, output_format(a.e, l));
}
Tensor apply(Infer a, const ConvLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  return conv2d(a.e, x, l.weight.value, l.geometry, output_format(a.e, l));
}
Tensor apply(Fp64 a, const ConvLayer& l, const Tensor& x) { return conv2d(a, x, l.weight.value, l.geometry); }

Tensor apply(Train a, BatchNormLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  return batch_norm_train(a.e, x, l.gamma, l.beta, l.running_mean, l.running_var, a.k, l.saved);
}
Tensor apply(Infer a, const BatchNormLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  return batch_norm_infer(a.e, x, l.gamma, l.beta, l.running_mean, l.running_var, a.k);
}
Tensor apply(Fp64 a, const BatchNormLayer& l, const Tensor& x) {
  return batch_norm_infer(a, x, l.gamma, l.beta, l.running_mean, l.running_var);
}

Tensor apply(Train, ReluLayer& l, const Tensor& x) {
  l.output = relu(x);
  return l.output;
}
Tensor apply(Infer, const ReluLayer&, const Tensor& x) { return relu(x); }
Tensor apply(Fp64, const ReluLayer&, const Tensor& x) { return relu(x); }

Tensor apply(Train, PoolLayer& l, const Tensor& x) {
  l.input = x.shape;
  return max_pool(x, &l.argmax);
}
Tensor apply(Infer, const PoolLayer&, const Tensor& x) { return max_pool(x); }
Tensor apply(Fp64, const PoolLayer&, const Tensor& x) { return max_pool(x); }

Tensor apply(Train a, GlobalPoolLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, "pool");
  l.input = x.shape;
  return global_avg_pool(a.e, x);
}
Tensor apply(Infer a, const GlobalPoolLayer&, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, "pool");
  return global_avg_pool(a.e, x);
}
Tensor apply(Fp64 a, const GlobalPoolLayer&, const Tensor& x) { return global_avg_pool(a, x); }

Tensor apply(Train a, DenseLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  l.input = x;
  return dense(a.e, x, l.weight, &l.bias, l.bias.value.size(), a.e.formats.act);
}
Tensor apply(Infer a, const DenseLayer& l, const Tensor& x) {
  const emu::Scope scope(a.e.ctx, l.name);
  return dense(a.e, x, l.weight, &l.bias, l.bias.value.size(), a.e.formats.act);
}
Tensor apply(Fp64 a, const DenseLayer& l, const Tensor& x) { return dense(a, x, l.weight, &l.bias, l.bias.value.size()); }

// The residual addition, in act.
Tensor residual_add(Train a, const Tensor& x, const Tensor& y) {
  const emu::Scope scope(a.e.ctx, "add");
  return add(a.e, x, y, a.e.formats.act);
}
Tensor residual_add(Infer a, const Tensor& x, const Tensor& y) {
  const emu::Scope scope(a.e.ctx, "add");
  return add(a.e, x, y, a.e.formats.act);
}
Tensor residual_add(Fp64 a, const Tensor& x, const Tensor& y) { return add(a, x, y); }

// ---- Backward passes ---------------------------------------------------------------------

// Sets the weight gradient (scope <name>.dw) and returns the gradient at the input
// (scope <name>.dx) unless need_dx is false.
Tensor backward_conv(Emulated& e, ConvLayer& l, const Tensor& dy, bool need_dx) {
  const emu::Scope scope(e.ctx, l.name);
  {
    const emu::Scope dw(e.ctx, "dw");
    l.weight.grad = conv2d_grad_weights(e, l.input, dy, l.geometry);
  }
  if (!need_dx) return {};
  const emu::Scope dx(e.ctx, "dx");
  return conv2d_grad_input(e, dy, l.weight.value, l.geometry, l.input.shape);
}

Tensor backward_bn(Emulated& e, BatchNormLayer& l, const Tensor& dy) {
  const emu::Scope scope(e.ctx, l.name);
  return batch_norm_backward(e, dy, l.saved, l.gamma, l.beta);
}

// ---- Construction --------------------------------------------------------------------------

ConvLayer conv_layer(std::string name, std::size_t in_channels, ConvGeometry g, bool feeds_batch_norm) {
  ConvLayer l;
  l.name = std::move(name);
  l.geometry = g;
  l.feeds_batch_norm = feeds_batch_norm;
  l.fan_in = in_channels * g.kernel * g.kernel;
  l.weight.value.assign(g.out_channels * l.fan_in, 0.0);
  l.weight.grad.assign(l.weight.value.size(), 0.0);
  return l;
}

BatchNormLayer bn_layer(std::string name, std::size_t channels) {
  BatchNormLayer l;
  l.name = std::move(name);
  for (Param* p : {&l.gamma, &l.beta}) {
    p->value.assign(channels, 0.0);
    p->grad.assign(channels, 0.0);
  }
  l.running_mean.assign(channels, 0.0);
  l.running_var.assign(channels, 1.0);
  return l;
}

DenseLayer dense_layer(std::size_t inputs, std::size_t classes) {
  DenseLayer l;
  l.name = "dense";
  l.fan_in = inputs;
  l.weight.value.assign(inputs * classes, 0.0);
  l.weight.grad.assign(inputs * classes, 0.0);
  l.bias.value.assign(classes, 0.0);
  l.bias.grad.assign(classes, 0.0);
  return l;
}

void add_params(std::vector<ParamRef>& out, const std::string& prefix, ConvLayer& l) {
  out.push_back({prefix + l.name, &l.weight, ParamRole::weight, l.weight.value.size(), l.fan_in});
}
void add_params(std::vector<ParamRef>& out, const std::string& prefix, BatchNormLayer& l) {
  out.push_back({prefix + l.name + ".gamma", &l.gamma, ParamRole::bn_scale, l.gamma.value.size(), 0});
  out.push_back({prefix + l.name + ".beta", &l.beta, ParamRole::bn_shift, l.beta.value.size(), 0});
}
void add_params(std::vector<ParamRef>& out, DenseLayer& l) {
  out.push_back({l.name, &l.weight, ParamRole::weight, l.weight.value.size(), l.fan_in});
  out.push_back({l.name + ".bias", &l.bias, ParamRole::bias, l.bias.value.size(), 0});
}

}  // namespace

// ---- ImageModel -----------------------------------------------------------------------------

ImageModel::ImageModel(const char* model, const data::Dataset& image, ModelFormats formats,
                       const emu::MatrixUnit& unit)
    : classes_(static_cast<std::size_t>(image.classes)),
      formats_(std::move(formats)),
      unit_(unit),
      bn_constants_(BatchNormConstants::in(formats_.bn_fwd)) {
  if (!image.is_image())
    throw std::invalid_argument(std::string("model ") + model + " needs images x [N, C, H, W], not samples of " +
                                image.sample_shape() + " values");
  image_ = Shape{1, static_cast<std::size_t>(image.channels), static_cast<std::size_t>(image.height),
                 static_cast<std::size_t>(image.width)};
}

double ImageModel::forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                                    double loss_scale) {
  Emulated e{ctx, formats_, unit_};
  Tensor out;
  {
    const emu::Scope scope(ctx, "forward");
    Tensor input(input_shape(y.size()));
    input.v = x;
    out = run(Train{e, bn_constants_}, std::move(input));
  }
  Tensor dlogits(out.shape);
  double loss = 0.0;
  {
    const emu::Scope scope(ctx, "loss");
    loss = softmax_cross_entropy(ctx, formats_, out.v, y, classes_, loss_scale, dlogits.v);
  }
  const emu::Scope scope(ctx, "backward");
  backward(e, std::move(dlogits));
  return loss;
}

std::vector<double> ImageModel::logits(emu::Context& ctx, const std::vector<double>& x, std::size_t first_row) const {
  Emulated e{ctx, formats_, unit_, first_row};
  Tensor input(input_shape(x.size() / image_.per_sample()));
  input.v = x;
  return run(Infer{e, bn_constants_}, std::move(input)).v;
}

Evaluation ImageModel::evaluate_fp64(const data::Dataset& d) const {
  const std::size_t per = image_.per_sample(), chunk = rows_per_chunk();
  std::vector<double> all;
  for (std::size_t first = 0; first < d.size(); first += chunk) {
    const std::size_t rows = std::min(chunk, d.size() - first);
    Tensor input(input_shape(rows));
    input.v.assign(d.x.begin() + static_cast<std::ptrdiff_t>(first * per),
                   d.x.begin() + static_cast<std::ptrdiff_t>((first + rows) * per));
    const Tensor z = run(Fp64{}, std::move(input));
    all.insert(all.end(), z.v.begin(), z.v.end());
  }
  return evaluate_logits_fp64(all, d.y, classes_);
}

// ---- ConvNet ------------------------------------------------------------------------------

ConvNet::ConvNet(const data::Dataset& image, int width1, int width2, ModelFormats formats,
                 const emu::MatrixUnit& unit)
    : ImageModel("convnet", image, std::move(formats), unit) {
  if (image_.h < 4 || image_.w < 4)
    throw std::invalid_argument("model convnet needs images of at least 4x4 (two 2x2 poolings), not " +
                                std::to_string(image_.h) + "x" + std::to_string(image_.w));
  const std::size_t widths[2] = {static_cast<std::size_t>(width1), static_cast<std::size_t>(width2)};
  std::size_t channels = image_.c;
  for (int b = 0; b < 2; ++b) {
    const std::string k = std::to_string(b + 1);
    conv_[b] = conv_layer(std::string("conv").append(k), channels, ConvGeometry{widths[b], 3, 1, 1}, true);
    bn_[b] = bn_layer(std::string("bn").append(k), widths[b]);
    channels = widths[b];
  }
  dense_ = dense_layer(channels * (image_.h / 2 / 2) * (image_.w / 2 / 2), classes_);
}

template <class Self, class Arith>
Tensor ConvNet::forward(Self& self, Arith a, Tensor x) {
  for (int b = 0; b < 2; ++b) {
    x = apply(a, self.conv_[b], x);
    x = apply(a, self.bn_[b], x);
    x = apply(a, self.relu_[b], x);
    x = apply(a, self.pool_[b], x);
  }
  return apply(a, self.dense_, x);
}

Tensor ConvNet::run(Train a, Tensor x) { return forward(*this, a, std::move(x)); }
Tensor ConvNet::run(Infer a, Tensor x) const { return forward(*this, a, std::move(x)); }
Tensor ConvNet::run(Fp64 a, Tensor x) const { return forward(*this, a, std::move(x)); }

void ConvNet::backward(Emulated& e, Tensor d) {
  {
    const emu::Scope scope(e.ctx, dense_.name);
    d = dense_backward(e, dense_.input, d, dense_.weight, &dense_.bias, true);
  }
  for (int b = 1; b >= 0; --b) {
    d = max_pool_backward(d, pool_[b].argmax, pool_[b].input);
    d = relu_backward(relu_[b].output, std::move(d));
    d = backward_bn(e, bn_[b], d);
    d = backward_conv(e, conv_[b], d, b > 0);
  }
}

std::vector<ParamRef> ConvNet::params() {
  std::vector<ParamRef> out;
  for (int b = 0; b < 2; ++b) {
    add_params(out, "", conv_[b]);
    add_params(out, "", bn_[b]);
  }
  add_params(out, dense_);
  return out;
}

// ---- ResNet -------------------------------------------------------------------------------

ResNet::ResNet(const data::Dataset& image, int blocks, int width, ModelFormats formats, const emu::MatrixUnit& unit)
    : ImageModel("resnet", image, std::move(formats), unit) {
  const std::size_t w = static_cast<std::size_t>(width);
  stem_ = conv_layer("conv", image_.c, ConvGeometry{w, 3, 1, 1}, true);
  stem_bn_ = bn_layer("bn", w);
  std::size_t channels = w;
  for (int stage = 0; stage < 3; ++stage) {
    const std::size_t out = w << stage;
    for (int b = 0; b < blocks; ++b) {
      const std::size_t stride = stage > 0 && b == 0 ? 2 : 1;
      Block block;
      block.name = "stage" + std::to_string(stage + 1) + ".block" + std::to_string(b + 1);
      block.conv1 = conv_layer("conv1", channels, ConvGeometry{out, 3, stride, 1}, true);
      block.bn1 = bn_layer("bn1", out);
      block.conv2 = conv_layer("conv2", out, ConvGeometry{out, 3, 1, 1}, true);
      block.bn2 = bn_layer("bn2", out);
      block.projection = stride != 1 || channels != out;
      if (block.projection) block.shortcut = conv_layer("shortcut", channels, ConvGeometry{out, 1, stride, 0}, false);
      blocks_.push_back(std::move(block));
      channels = out;
    }
  }
  dense_ = dense_layer(channels, classes_);
}

template <class Self, class Arith>
Tensor ResNet::forward(Self& self, Arith a, Tensor x) {
  {
    const NameScope stem(context_of(a), "stem");
    x = apply(a, self.stem_, x);
    x = apply(a, self.stem_bn_, x);
    x = apply(a, self.stem_relu_, x);
  }
  for (auto& b : self.blocks_) {
    const NameScope block(context_of(a), b.name);
    Tensor h = apply(a, b.conv1, x);
    h = apply(a, b.bn1, h);
    h = apply(a, b.relu1, h);
    h = apply(a, b.conv2, h);
    h = apply(a, b.bn2, h);
    const Tensor shortcut = b.projection ? apply(a, b.shortcut, x) : x;
    x = apply(a, b.relu_out, residual_add(a, h, shortcut));
  }
  x = apply(a, self.pool_, x);
  return apply(a, self.dense_, x);
}

Tensor ResNet::run(Train a, Tensor x) { return forward(*this, a, std::move(x)); }
Tensor ResNet::run(Infer a, Tensor x) const { return forward(*this, a, std::move(x)); }
Tensor ResNet::run(Fp64 a, Tensor x) const { return forward(*this, a, std::move(x)); }

void ResNet::backward(Emulated& e, Tensor d) {
  {
    const emu::Scope scope(e.ctx, dense_.name);
    d = dense_backward(e, dense_.input, d, dense_.weight, &dense_.bias, true);
  }
  {
    const emu::Scope scope(e.ctx, "pool");
    d = global_avg_pool_backward(e, d, pool_.input);
  }
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) {
    const emu::Scope scope(e.ctx, b->name);
    d = relu_backward(b->relu_out.output, std::move(d));
    Tensor main = backward_bn(e, b->bn2, d);
    main = backward_conv(e, b->conv2, main, true);
    main = relu_backward(b->relu1.output, std::move(main));
    main = backward_bn(e, b->bn1, main);
    main = backward_conv(e, b->conv1, main, true);
    const Tensor shortcut = b->projection ? backward_conv(e, b->shortcut, d, true) : std::move(d);
    const emu::Scope add_scope(e.ctx, "add");
    d = add(e, main, shortcut, e.formats.grad);  // the block input feeds both paths
  }
  const emu::Scope scope(e.ctx, "stem");
  d = relu_backward(stem_relu_.output, std::move(d));
  d = backward_bn(e, stem_bn_, d);
  backward_conv(e, stem_, d, false);
}

std::vector<ParamRef> ResNet::params() {
  std::vector<ParamRef> out;
  add_params(out, "stem.", stem_);
  add_params(out, "stem.", stem_bn_);
  for (Block& b : blocks_) {
    const std::string prefix = b.name + ".";
    add_params(out, prefix, b.conv1);
    add_params(out, prefix, b.bn1);
    add_params(out, prefix, b.conv2);
    add_params(out, prefix, b.bn2);
    if (b.projection) add_params(out, prefix, b.shortcut);
  }
  add_params(out, dense_);
  return out;
}

}  // namespace roundoff::train
