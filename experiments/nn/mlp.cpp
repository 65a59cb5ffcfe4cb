#include "mlp.hpp"

#include "convnets.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace roundoff::train {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

// ---------------------------------------------------------------------------------------
// Updater

Updater::Updater(UpdateRule rule, OptimizerSpec opt, ParamFormats formats)
    : rule_(rule), opt_(opt), formats_(std::move(formats)) {
  const emu::Format& st = formats_.state;
  momentum_ = round_constant(st, opt_.momentum);
  beta1_ = round_constant(st, opt_.beta1);
  one_minus_beta1_ = round_constant(st, 1.0 - opt_.beta1);
  beta2_ = round_constant(st, opt_.beta2);
  one_minus_beta2_ = round_constant(st, 1.0 - opt_.beta2);
  eps_ = round_constant(formats_.arith, opt_.eps);
}

void Updater::init(Param& p, const std::vector<double>& initial, emu::Context& ctx) const {
  const std::size_t n = initial.size();
  p.value.resize(n);
  p.grad.assign(n, 0.0);
  p.master.clear();
  p.compensation.clear();
  if (rule_ == UpdateRule::fp32_master) p.master.resize(n);
  if (rule_ == UpdateRule::fp16_kahan) p.compensation.assign(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    ctx.set_element(static_cast<std::int64_t>(i));
    if (rule_ == UpdateRule::fp32_master) {
      p.master[i] = ctx.convert(formats_.master, initial[i]);
      p.value[i] = ctx.convert(formats_.storage, p.master[i]);
    } else {
      p.value[i] = ctx.convert(formats_.storage, initial[i]);
    }
  }
  ctx.clear_element();
  p.m.assign(opt_.kind == OptimizerKind::sgd ? 0 : n, 0.0);
  p.v.assign(opt_.kind == OptimizerKind::adam ? n : 0, 0.0);
}

void Updater::step(Param& p, std::int64_t t, double grad_divisor, double lr, emu::Context& ctx,
                   emu::Context& sr_ctx, UpdateCounts& counts) const {
  const emu::Format& ar = formats_.arith;
  const emu::Format& st = formats_.state;
  const emu::Format& ws = formats_.storage;
  double bias1 = 1.0, bias2 = 1.0;
  if (opt_.kind == OptimizerKind::adam) {
    bias1 = round_constant(ar, 1.0 - std::pow(opt_.beta1, static_cast<double>(t)));
    bias2 = round_constant(ar, 1.0 - std::pow(opt_.beta2, static_cast<double>(t)));
  }
  const bool unscale_same = !formats_.unscale || *formats_.unscale == ar;
  for (std::size_t i = 0; i < p.value.size(); ++i) {
    ctx.set_element(static_cast<std::int64_t>(i));
    sr_ctx.set_element(static_cast<std::int64_t>(i));
    const double g = grad_divisor == 1.0 ? ctx.convert(ar, p.grad[i])
                     : unscale_same ? ctx.div(ar, p.grad[i], grad_divisor)
                                    : ctx.convert(ar, ctx.div(*formats_.unscale, p.grad[i], grad_divisor));
    double direction = g;
    switch (opt_.kind) {
      case OptimizerKind::sgd: break;
      case OptimizerKind::momentum:
        p.m[i] = ctx.fma(st, momentum_, p.m[i], g);
        direction = ctx.convert(ar, p.m[i]);
        break;
      case OptimizerKind::adam: {
        p.m[i] = ctx.fma(st, beta1_, p.m[i], ctx.mul(st, one_minus_beta1_, g));
        p.v[i] = ctx.fma(st, beta2_, p.v[i], ctx.mul(st, one_minus_beta2_, ctx.mul(st, g, g)));
        const double m_hat = ctx.div(ar, p.m[i], bias1);
        const double v_hat = ctx.div(ar, p.v[i], bias2);
        direction = ctx.div(ar, m_hat, ctx.add(ar, ctx.sqrt(ar, v_hat), eps_));
        break;
      }
    }
    const double delta = ctx.mul(ar, lr, direction);
    double& w = p.value[i];
    // The stored state before the update (see UpdateCounts), compared by value.
    const double before = rule_ == UpdateRule::fp32_master ? p.master[i] : w;
    const double c_before = rule_ == UpdateRule::fp16_kahan ? p.compensation[i] : 0.0;
    switch (rule_) {
      case UpdateRule::fp32:
      case UpdateRule::fp16_rn: w = ctx.sub(ws, w, delta); break;
      case UpdateRule::fp16_sr: w = sr_ctx.sub(ws, w, delta); break;
      case UpdateRule::fp32_master:
        p.master[i] = ctx.sub(formats_.master, p.master[i], delta);
        w = ctx.convert(ws, p.master[i]);
        break;
      case UpdateRule::fp16_kahan: {
        // Kahan: y = -delta - c; t = w + y; c = (t - w) - y; w = t, all in the storage format.
        double& c = p.compensation[i];
        const double y = ctx.sub(ws, -delta, c);
        const double sum = ctx.add(ws, w, y);
        c = ctx.sub(ws, ctx.sub(ws, sum, w), y);
        w = sum;
        break;
      }
    }
    if (delta != 0.0 && std::isfinite(delta)) {
      ++counts.updates;
      const double after = rule_ == UpdateRule::fp32_master ? p.master[i] : w;
      const double c_after = rule_ == UpdateRule::fp16_kahan ? p.compensation[i] : 0.0;
      if (after == before && c_after == c_before) ++counts.lost;
    }
  }
  ctx.clear_element();
  sr_ctx.clear_element();
}

// ---------------------------------------------------------------------------------------
// Histograms and gradient statistics

void add_to_histogram(std::array<std::uint64_t, kHistBins>& counts, double v) {
  if (!std::isfinite(v)) {
    ++counts[kHistBins - 1];
    return;
  }
  if (v == 0.0) {
    ++counts[0];
    return;
  }
  const int e = std::clamp(std::ilogb(std::fabs(v)), kHistLowExponent, kHistHighExponent - 1);
  ++counts[1 + (e - kHistLowExponent)];
}

Histogram normalise(const std::array<std::uint64_t, kHistBins>& counts) {
  const double total = static_cast<double>(std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}));
  Histogram h{};
  for (int i = 0; i < kHistBins; ++i) h[i] = total > 0 ? static_cast<double>(counts[i]) / total : 0.0;
  return h;
}

void GradStats::add(double v) {
  ++count;
  if (v == 0.0) ++zeros;
  sum += v;
  sum_squares += v * v;
}

double GradStats::std_dev() const {
  if (count == 0) return kNaN;
  const double n = static_cast<double>(count);
  const double mean = sum / n;
  const double variance = sum_squares / n - mean * mean;
  if (std::isnan(variance)) return kNaN;  // NaN gradients: no std (max() would hide them as 0)
  return std::sqrt(std::max(0.0, variance));
}

CastLoss cast_loss(const std::vector<double>& values, const emu::Format& f, double scale) {
  std::uint64_t nonzero = 0, underflow = 0, overflow = 0, subnormal = 0;
  for (double v : values) {
    if (v == 0.0 || !std::isfinite(v)) continue;
    ++nonzero;
    const double c = round_constant(f, v * scale);
    if (c == 0.0)
      ++underflow;
    else if (!std::isfinite(c))
      ++overflow;
    else if (std::fabs(c) < f.min_normal())
      ++subnormal;
  }
  const double n = static_cast<double>(nonzero);
  if (nonzero == 0) return CastLoss{kNaN, kNaN, kNaN};
  return CastLoss{static_cast<double>(underflow) / n, static_cast<double>(overflow) / n, static_cast<double>(subnormal) / n};
}

// ---------------------------------------------------------------------------------------
// Mlp

Mlp::Mlp(int inputs, std::vector<int> hidden, int classes, ModelFormats formats, const emu::MatrixUnit& unit)
    : formats_(std::move(formats)), unit_(unit), bn_constants_(BatchNormConstants::in(formats_.bn_fwd)) {
  widths_.push_back(inputs);
  widths_.insert(widths_.end(), hidden.begin(), hidden.end());
  widths_.push_back(classes);
  const int n_layers = static_cast<int>(widths_.size()) - 1;
  weights.resize(n_layers);
  gamma.resize(n_layers - 1);
  beta.resize(n_layers - 1);
  layer_input_.resize(n_layers);
  running_mean.resize(n_layers - 1);
  running_var.resize(n_layers - 1);
  for (int b = 0; b + 1 < n_layers; ++b) {
    running_mean[b].assign(widths_[b + 1], 0.0);
    running_var[b].assign(widths_[b + 1], 1.0);
  }
  bn_saved_.resize(n_layers - 1);
  bn_out_.resize(n_layers - 1);
}

namespace {

// Scope names of layer l (0-based): its Linear "l<l+1>", the batch norm after it "bn<l+1>"
// (append: gcc 12 warns falsely (-Wrestrict) on "l" + std::to_string(...)).
std::string linear_name(int l) { return std::string("l").append(std::to_string(l + 1)); }
std::string bn_name(int l) { return std::string("bn").append(std::to_string(l + 1)); }

}  // namespace

Tensor Mlp::linear(Emulated& e, int l, const Tensor& h) const {
  const emu::Scope scope(e.ctx, linear_name(l));
  const bool last = l == layers() - 1;
  return dense(e, h, weights[l], last ? &bias : nullptr, static_cast<std::size_t>(widths_[l + 1]),
               last ? formats_.act : formats_.bn_fwd);
}

double Mlp::forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                             double loss_scale) {
  const std::size_t batch = y.size();
  const int n_layers = layers();
  Emulated e{ctx, formats_, unit_};

  // Forward: scopes forward.l<k> (Linear), forward.bn<k> (batch norm and ReLU).
  Tensor h(Shape{batch, static_cast<std::size_t>(widths_[0]), 1, 1});
  h.v = x;
  {
    const emu::Scope forward(ctx, "forward");
    for (int l = 0; l < n_layers; ++l) {
      layer_input_[l] = h;
      h = linear(e, l, h);
      if (l == n_layers - 1) break;
      const emu::Scope scope(ctx, bn_name(l));
      h = relu(batch_norm_train(e, h, gamma[l], beta[l], running_mean[l], running_var[l], bn_constants_, bn_saved_[l]));
      bn_out_[l] = h;
    }
  }

  // Softmax cross-entropy in the loss format (scope loss).
  Tensor dz(h.shape);
  double loss = 0.0;
  {
    const emu::Scope loss_scope(ctx, "loss");
    loss = softmax_cross_entropy(ctx, formats_, h.v, y, static_cast<std::size_t>(widths_.back()), loss_scale, dz.v);
  }

  // Backward: dz is the gradient at the output of layer l's Linear. Scopes
  // backward.l<k>.bias (the last layer's bias gradient; element (class)), backward.l<k>.dw
  // (weight gradient), backward.l<k>.dx (gradient at its input), backward.bn<k>
  // (through ReLU and batch norm; elements (sample, channel), or (channel)).
  const emu::Scope backward(ctx, "backward");
  for (int l = n_layers - 1; l >= 0; --l) {
    Tensor dh;
    {
      const emu::Scope layer(ctx, linear_name(l));
      dh = dense_backward(e, layer_input_[l], dz, weights[l], l == n_layers - 1 ? &bias : nullptr, l > 0);
    }
    if (l == 0) break;
    // Gradient at the previous block's output, through ReLU and batch norm.
    const int b = l - 1;
    const emu::Scope scope(ctx, bn_name(b));
    dz = batch_norm_backward(e, relu_backward(bn_out_[b], std::move(dh)), bn_saved_[b], gamma[b], beta[b]);
  }
  return loss;
}

std::vector<double> Mlp::logits(emu::Context& ctx, const std::vector<double>& x, std::size_t first_row) const {
  const std::size_t rows = x.size() / static_cast<std::size_t>(widths_[0]);
  const int n_layers = layers();
  Emulated e{ctx, formats_, unit_, first_row};
  Tensor h(Shape{rows, static_cast<std::size_t>(widths_[0]), 1, 1});
  h.v = x;
  for (int l = 0; l < n_layers; ++l) {
    h = linear(e, l, h);
    if (l == n_layers - 1) break;
    // Batch norm with the running statistics in bn_fwd, output rounded into act, ReLU.
    const emu::Scope scope(ctx, bn_name(l));
    h = relu(batch_norm_infer(e, h, gamma[l], beta[l], running_mean[l], running_var[l], bn_constants_));
  }
  return h.v;
}

Evaluation Mlp::evaluate_fp64(const data::Dataset& d) const {
  const std::size_t n = d.size();
  Tensor h(Shape{n, static_cast<std::size_t>(d.features), 1, 1});
  h.v.assign(d.x.begin(), d.x.end());
  const int n_layers = layers();
  for (int l = 0; l < n_layers; ++l) {
    const std::size_t out = widths_[l + 1];
    const bool last = l == n_layers - 1;
    h = dense(Fp64{}, h, weights[l], last ? &bias : nullptr, out);
    if (last) break;
    // Batch norm with the statistics of the whole set.
    std::vector<double>& z = h.v;
    for (std::size_t j = 0; j < out; ++j) {
      double mean = 0.0, var = 0.0;
      for (std::size_t i = 0; i < n; ++i) mean += z[i * out + j];
      mean /= static_cast<double>(n);
      for (std::size_t i = 0; i < n; ++i) var += (z[i * out + j] - mean) * (z[i * out + j] - mean);
      var /= static_cast<double>(n);
      const double inv_std = 1.0 / std::sqrt(var + kBnEps);
      for (std::size_t i = 0; i < n; ++i) z[i * out + j] = gamma[l].value[j] * (z[i * out + j] - mean) * inv_std + beta[l].value[j];
    }
    h = relu(h);
  }
  return evaluate_logits_fp64(h.v, d.y, static_cast<std::size_t>(widths_.back()));
}

std::vector<ParamRef> Mlp::params() {
  std::vector<ParamRef> out;
  const int n_layers = layers();
  auto width = [&](int i) { return static_cast<std::size_t>(widths_[i]); };
  out.push_back({linear_name(n_layers - 1) + ".bias", &bias, ParamRole::bias, width(n_layers), 0});
  for (int l = 0; l < n_layers; ++l)
    out.push_back({linear_name(l), &weights[l], ParamRole::weight, width(l) * width(l + 1), width(l)});
  for (int b = 0; b + 1 < n_layers; ++b)
    out.push_back({bn_name(b) + ".gamma", &gamma[b], ParamRole::bn_scale, width(b + 1), 0});
  for (int b = 0; b + 1 < n_layers; ++b)
    out.push_back({bn_name(b) + ".beta", &beta[b], ParamRole::bn_shift, width(b + 1), 0});
  return out;
}

// ---------------------------------------------------------------------------------------
// Trainer

void parse_loss_scale(const std::string& text, TrainSpec& spec) {
  if (text == "none") {
    spec.loss_scale = LossScaleKind::none;
    spec.scale = 1.0;
    return;
  }
  if (text == "dynamic") {
    spec.loss_scale = LossScaleKind::dynamic;
    return;
  }
  char* end = nullptr;
  const double s = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(s > 0) || !std::isfinite(s))
    throw std::invalid_argument("loss_scale must be none, dynamic or a positive number, not '" + text + "'");
  spec.loss_scale = LossScaleKind::constant;
  spec.scale = s;
}

namespace {

// The run's exception settings with a given rounding.
emu::FpControl control_with(emu::FpControl control, emu::Rounding rounding, bool esr = false) {
  control.rounding = rounding;
  control.esr = esr;
  return control;
}

// The streams of stochastic rounding beside the update rule's (the rounding stream
// itself, lane 3 from train): the training context's under esr (lane 4), and the
// all-reduce's under replica_identical_only (lane 5).
emu::StreamId stream_lane(emu::StreamId rounding_stream, std::uint16_t lane) {
  rounding_stream.lane = lane;
  return rounding_stream;
}
constexpr std::uint16_t kEsrLane = 4, kCollectiveLane = 5;

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

}  // namespace

Trainer::Trainer(const TrainSpec& spec, std::shared_ptr<const data::Split> data, std::uint64_t seed,
                 std::uint32_t replica, emu::StreamId rounding_stream)
    : spec_(spec),
      data_(std::move(data)),
      formats_{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32()},
      accum_format_(emu::fp32()),
      allreduce_format_(emu::fp32()),
      order_rng_(emu::StreamId{seed, 0, replica, 2}) {
  if (spec.dp_replicas < 1 || spec.grad_accum < 1)
    throw std::invalid_argument("dp_replicas and grad_accum must be at least 1");
  if (spec.batch % (spec.dp_replicas * spec.grad_accum) != 0)
    throw std::invalid_argument("batch must be a multiple of dp_replicas x grad_accum");
  const bool baseline = spec.rule == UpdateRule::fp32;
  ParamFormats weight_formats{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32()};
  if (!baseline) {
    const emu::Format &act = spec.act_format, &grad = spec.grad_format;
    const bool bn_arith_fp32 = spec.bn_fp32 || spec.bn_arith_fp32;
    formats_ = ModelFormats{act, grad, spec.loss_format, bn_arith_fp32 ? emu::fp32() : act,
                            bn_arith_fp32 ? emu::fp32() : grad};
    const emu::Format arith = spec.rule == UpdateRule::fp32_master ? spec.master_format : spec.weight_format;
    weight_formats = ParamFormats{spec.weight_format, arith, spec.state_format.value_or(arith), spec.master_format};
    accum_format_ = spec.accum_format;
    allreduce_format_ = spec.allreduce_format;
  }
  // The unscaling format of a tensor whose gradient is computed in `computed`.
  auto unscale_format = [&](const emu::Format& computed) -> std::optional<emu::Format> {
    switch (spec.unscale_format) {
      case UnscaleFormat::arith: break;
      case UnscaleFormat::fp32: return emu::fp32();
      case UnscaleFormat::compute: return computed;
    }
    return std::nullopt;
  };
  weight_formats.unscale = unscale_format(formats_.grad);
  // The baseline computes plain fp32 sequential dot products whatever `unit` says.
  unit_ = baseline ? emu::make_unit(emu::UnitKind::fp32_seq, emu::fp32(), emu::fp32())
                   : emu::make_unit(spec.unit, formats_.act);
  weight_updater_ = std::make_unique<Updater>(spec.rule, spec.optimizer, weight_formats);
  ParamFormats bn_formats = weight_formats;
  if (spec.bn_fp32 && !baseline)
    bn_formats = ParamFormats{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32(), unscale_format(formats_.bn_bwd)};
  bn_updater_ = std::make_unique<Updater>(spec.bn_fp32 && !baseline ? UpdateRule::fp32 : spec.rule, spec.optimizer,
                                          bn_formats);

  // The replicas, their models and contexts (streams: see the class comment).
  const data::Dataset& train = data_->train;
  const bool esr_on = spec.esr == EsrMode::on, identical_only = spec.esr == EsrMode::replica_identical_only;
  for (int r = 0; r < spec.dp_replicas; ++r) {
    const auto own = [&](emu::StreamId s) { return esr_on ? replica_stream(s, static_cast<std::uint32_t>(r)) : s; };
    Replica rep{nullptr,
                {},
                emu::Context(control_with(spec.fp_control, emu::Rounding::rne, esr_on),
                             emu::Rng(own(stream_lane(rounding_stream, kEsrLane)))),
                emu::Context(control_with(spec.fp_control, emu::Rounding::sr), emu::Rng(own(rounding_stream))),
                std::nullopt,
                {}};
    if (identical_only)
      rep.update_ctx.emplace(control_with(spec.fp_control, emu::Rounding::rne, true),
                             emu::Rng(stream_lane(rounding_stream, kEsrLane)));
    switch (spec.model) {
      case ModelKind::mlp:
        rep.model = std::make_unique<Mlp>(train.features, spec.hidden, train.classes, formats_, *unit_);
        break;
      case ModelKind::convnet:
        rep.model = std::make_unique<ConvNet>(train, spec.conv_width1, spec.conv_width2, formats_, *unit_);
        break;
      case ModelKind::resnet:
        rep.model = std::make_unique<ResNet>(train, spec.resnet_blocks, spec.resnet_width, formats_, *unit_);
        break;
    }
    rep.params = rep.model->params();
    replicas_.push_back(std::move(rep));
  }
  if (identical_only && spec.dp_replicas > 1)
    collective_ctx_.emplace(control_with(spec.fp_control, emu::Rounding::rne, true),
                            emu::Rng(stream_lane(rounding_stream, kCollectiveLane)));

  Replica& first = replicas_[0];
  emu::Context& ctx = first.ctx;
  {
    const emu::Scope init(ctx, "init");
    // He initialisation N(0, 2 / fan_in) in forward order; gamma 1, beta and bias 0.
    emu::Rng init_rng(emu::StreamId{seed, 0, replica, 1});
    for (const ParamRef& p : first.params) {
      const bool bn = p.role == ParamRole::bn_scale || p.role == ParamRole::bn_shift;
      std::vector<double> initial(p.size, p.role == ParamRole::bn_scale ? 1.0 : 0.0);
      if (p.role == ParamRole::weight) {
        const double sd = std::sqrt(2.0 / static_cast<double>(p.fan_in));
        for (double& v : initial) v = sd * init_rng.normal();
      }
      (bn ? *bn_updater_ : *weight_updater_).init(*p.param, initial, ctx);
    }
  }
  // Every replica starts from replica 0's state, as data-parallel training broadcasts it.
  for (std::size_t r = 1; r < replicas_.size(); ++r)
    for (std::size_t t = 0; t < first.params.size(); ++t) *replicas_[r].params[t].param = *first.params[t].param;
  if (spec.grad_accum > 1)
    for (Replica& rep : replicas_)
      for (const ParamRef& p : rep.params) rep.accum.emplace_back(p.size);

  for (const ParamRef& p : first.params)
    if (p.role == ParamRole::weight) {
      layer_names_.push_back(std::string("l").append(std::to_string(layer_names_.size() + 1)));
      layer_params_.push_back(p.param);
    }
  int bn_layers = 0;
  for (const ParamRef& p : first.params)
    if (p.role == ParamRole::bn_scale) {
      layer_names_.push_back(std::string("bn").append(std::to_string(++bn_layers)));
      layer_params_.push_back(p.param);
    }
  for (const ParamRef& p : first.params)
    initial_state_.push_back(p.param->master.empty() ? p.param->value : p.param->master);
  run_stats.resize(layer_names_.size());
  window_stats.resize(layer_names_.size());

  {
    const emu::Scope init(ctx, "init");
    train_x_.resize(train.x.size());
    const Shape inputs = first.model->input_shape(train.size());
    for (std::size_t i = 0; i < train.x.size(); ++i) {
      set_element(ctx, inputs, i);
      train_x_[i] = ctx.convert(formats_.act, train.x[i]);
    }
    ctx.clear_element();
  }
  steps_per_epoch_ = static_cast<std::int64_t>(train.size()) / spec.batch;
  if (steps_per_epoch_ < 1) throw std::invalid_argument("batch is larger than the training split");
  order_.resize(train.size());
  std::iota(order_.begin(), order_.end(), 0);
  scale_ = spec.loss_scale == LossScaleKind::none ? 1.0 : spec.scale;
}

double Trainer::replica_gradients(Replica& rep, std::span<const std::size_t> share, bool& buffer_overflow) {
  const data::Dataset& train = data_->train;
  const std::size_t micro = static_cast<std::size_t>(spec_.batch / (spec_.dp_replicas * spec_.grad_accum));
  const std::size_t features = train.features;
  std::vector<double> x(micro * features);
  std::vector<int> y(micro);
  double losses = 0.0;
  bool inputs_finite = true, buffer_finite = true;
  for (int m = 0; m < spec_.grad_accum; ++m) {
    for (std::size_t i = 0; i < micro; ++i) {
      const std::size_t s = share[static_cast<std::size_t>(m) * micro + i];
      y[i] = train.y[s];
      std::copy_n(train_x_.begin() + static_cast<std::ptrdiff_t>(s * features), features,
                  x.begin() + static_cast<std::ptrdiff_t>(i * features));
    }
    losses += rep.model->forward_backward(rep.ctx, x, y, scale_);
    if (spec_.grad_accum == 1) break;
    // The buffer holds the sum of the micro-batches' gradients (times S) in accum_format.
    const emu::Scope accumulate(rep.ctx, "accumulate");
    for (std::size_t t = 0; t < rep.params.size(); ++t) {
      const emu::Scope scope(rep.ctx, rep.params[t].name);
      const std::vector<double>& g = rep.params[t].param->grad;
      std::vector<double>& buffer = rep.accum[t];
      inputs_finite = inputs_finite && all_finite(g);
      for (std::size_t i = 0; i < g.size(); ++i) {
        rep.ctx.set_element(static_cast<std::int64_t>(i));
        buffer[i] = m == 0 ? rep.ctx.convert(accum_format_, g[i]) : rep.ctx.add(accum_format_, buffer[i], g[i]);
      }
      rep.ctx.clear_element();
    }
  }
  if (spec_.grad_accum > 1)
    for (std::size_t t = 0; t < rep.params.size(); ++t) {
      buffer_finite = buffer_finite && all_finite(rep.accum[t]);
      rep.params[t].param->grad = rep.accum[t];
    }
  buffer_overflow = inputs_finite && !buffer_finite;
  return losses;
}

bool Trainer::all_reduce_gradients() {
  const std::size_t replicas = replicas_.size();
  std::vector<emu::Context*> contexts;
  for (Replica& rep : replicas_) contexts.push_back(collective_ctx_ ? &*collective_ctx_ : &rep.ctx);
  std::vector<emu::Context*> distinct = contexts;
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  bool inputs_finite = true, output_finite = true;
  std::vector<std::vector<double>*> copies(replicas);
  for (std::size_t t = 0; t < replicas_[0].params.size(); ++t) {
    for (std::size_t r = 0; r < replicas; ++r) {
      copies[r] = &replicas_[r].params[t].param->grad;
      inputs_finite = inputs_finite && all_finite(*copies[r]);
    }
    {
      std::deque<emu::Scope> scopes;
      for (emu::Context* c : distinct) {
        scopes.emplace_back(*c, "allreduce");
        scopes.emplace_back(*c, replicas_[0].params[t].name);
      }
      all_reduce(copies, allreduce_format_, spec_.allreduce_order, contexts);
      while (!scopes.empty()) scopes.pop_back();  // inner scope first
    }
    output_finite = output_finite && all_finite(*copies[0]);
  }
  return inputs_finite && !output_finite;
}

StepResult Trainer::step() {
  const std::int64_t in_epoch = steps_ % steps_per_epoch_;
  if (in_epoch == 0)  // a fresh order each epoch (Fisher-Yates)
    for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[order_rng_.next_u64() % (i + 1)]);
  const std::size_t batch = static_cast<std::size_t>(spec_.batch);
  return step_on(std::span<const std::size_t>(order_).subspan(static_cast<std::size_t>(in_epoch) * batch, batch));
}

StepResult Trainer::step_on(std::span<const std::size_t> rows) {
  const std::size_t batch = static_cast<std::size_t>(spec_.batch), replicas = replicas_.size();
  if (rows.size() != batch)
    throw std::invalid_argument("Trainer::step_on: " + std::to_string(rows.size()) + " rows for a batch of " +
                                std::to_string(batch));
  for (std::size_t row : rows)
    if (row >= data_->train.size())
      throw std::invalid_argument("Trainer::step_on: row " + std::to_string(row) + " is not in the training split");
  const std::size_t share = batch / replicas;
  ++steps_;
  StepResult result;
  result.scale = scale_;

  // Each replica's gradients, then their all-reduce.
  double losses = 0.0;
  bool accum_overflow = false;
  for (std::size_t r = 0; r < replicas; ++r) {
    bool overflow = false;
    losses += replica_gradients(replicas_[r], rows.subspan(r * share, share), overflow);
    accum_overflow = accum_overflow || overflow;
  }
  const std::size_t micro_batches = replicas * static_cast<std::size_t>(spec_.grad_accum);
  result.loss = losses / static_cast<double>(micro_batches);
  const bool allreduce_overflow = replicas > 1 && all_reduce_gradients();

  std::vector<ParamRef>& params = replicas_[0].params;
  bool finite = true;
  for (const ParamRef& p : params) finite = finite && all_finite(p.param->grad);
  if (!finite) {
    ++nonfinite_steps_;
    accum_overflow_steps_ += accum_overflow;
    allreduce_overflow_steps_ += allreduce_overflow;
  }
  if (!finite && spec_.loss_scale == LossScaleKind::dynamic) {
    result.skipped = true;
    ++skipped_;
    scale_ *= spec_.scale_backoff;
    clean_run_ = 0;
    return result;
  }

  // The sum of R M micro-batch gradients is divided by S R M (exactly S when R M = 1).
  const double divisor = scale_ * static_cast<double>(micro_batches);
  for (std::size_t l = 0; l < layer_params_.size(); ++l)
    for (double g : layer_params_[l]->grad) {
      run_stats[l].add(g / divisor);
      window_stats[l].add(g / divisor);
    }

  ++applied_;
  for (std::size_t r = 0; r < replicas; ++r) {
    Replica& rep = replicas_[r];
    emu::Context& ctx = rep.update_context();
    const emu::Scope update(ctx, "update"), sr_update(rep.sr_ctx, "update");
    auto apply = [&](const Updater& u, Param& p, const std::string& name, bool track_lr) {
      const emu::Scope scope(ctx, name), sr_scope(rep.sr_ctx, name);
      const emu::Format& ar = u.formats().arith;
      double lr, grad_divisor = 1.0;
      if (spec_.unscale_lr) {
        // lr / (S R M) rounded once into the unscaling format, then into the update arithmetic's.
        const std::optional<emu::Format>& un = u.formats().unscale;
        lr = !un || *un == ar ? ctx.div(ar, spec_.lr, divisor) : ctx.convert(ar, ctx.div(*un, spec_.lr, divisor));
        if (track_lr) {
          const double exact = spec_.lr / divisor;
          effective_lr_ = lr;
          effective_lr_error_max_ = std::max(effective_lr_error_max_, std::fabs(lr - exact) / exact);
        }
      } else {
        lr = ctx.convert(ar, spec_.lr);
        grad_divisor = divisor;
        if (track_lr) effective_lr_ = lr;
      }
      u.step(p, applied_, grad_divisor, lr, ctx, rep.sr_ctx, counts_);
    };
    bool first_weight = r == 0;  // replica 0's first weight tensor: its learning rate is effective_lr()
    for (const ParamRef& p : rep.params) {
      const bool bn = p.role == ParamRole::bn_scale || p.role == ParamRole::bn_shift;
      apply(bn ? *bn_updater_ : *weight_updater_, *p.param, p.name, first_weight && p.role == ParamRole::weight);
      if (p.role == ParamRole::weight) first_weight = false;
    }
  }

  if (spec_.loss_scale == LossScaleKind::dynamic && ++clean_run_ >= spec_.scale_interval) {
    scale_ *= spec_.scale_growth;
    clean_run_ = 0;
  }
  return result;
}

std::uint64_t Trainer::changed_values(std::size_t t) const {
  const Param& p = *params()[t].param;
  const std::vector<double>& now = p.master.empty() ? p.value : p.master;
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < now.size(); ++i)
    if (!(now[i] == initial_state_[t][i])) ++changed;  // NaN counts as changed
  return changed;
}

double Trainer::frac_values_changed() const {
  std::uint64_t values = 0, changed = 0;
  for (std::size_t t = 0; t < params().size(); ++t) {
    values += params()[t].size;
    changed += changed_values(t);
  }
  return values ? static_cast<double>(changed) / static_cast<double>(values) : 0.0;
}

std::uint64_t Trainer::values_changed(const Param& p) const {
  for (std::size_t t = 0; t < params().size(); ++t)
    if (params()[t].param == &p) return changed_values(t);
  throw std::logic_error("Trainer::values_changed: not a parameter of this model");
}

const emu::Format& Trainer::state_format(const ParamRef& p) const {
  const bool bn = p.role == ParamRole::bn_scale || p.role == ParamRole::bn_shift;
  const Updater& u = bn ? *bn_updater_ : *weight_updater_;
  return u.rule() == UpdateRule::fp32_master ? u.formats().master : u.formats().storage;
}

ReplicaDivergence Trainer::replica_divergence() const {
  ReplicaDivergence d;
  std::vector<const std::vector<double>*> copies(replicas_.size());
  for (std::size_t t = 0; t < params().size(); ++t) {
    for (std::size_t r = 0; r < replicas_.size(); ++r) {
      const Param& p = *replicas_[r].params[t].param;
      copies[r] = p.master.empty() ? &p.value : &p.master;
    }
    d.add(state_format(params()[t]), copies);
  }
  return d;
}

Evaluation Trainer::evaluate(const data::Dataset& d, const char* scope) {
  emu::Context ctx(control_with(spec_.fp_control, emu::Rounding::rne));
  const emu::Scope evaluate(ctx, "evaluate"), split(ctx, scope);
  const Evaluation e = model().evaluate(ctx, d);
  merge_counts(evaluation_counts_, ctx.counts());
  return e;
}

Evaluation Trainer::evaluate_train() { return evaluate(data_->train, "train"); }
Evaluation Trainer::evaluate_test() { return evaluate(data_->test, "test"); }

emu::Flags Trainer::flags() const {
  emu::Flags f = collective_ctx_ ? collective_ctx_->status() : 0;
  for (const Replica& rep : replicas_)
    f |= rep.ctx.status() | rep.sr_ctx.status() | (rep.update_ctx ? rep.update_ctx->status() : 0);
  return f;
}

std::vector<emu::OpCount> Trainer::fp_counts() const {
  std::vector<emu::OpCount> counts;
  for (const Replica& rep : replicas_) {
    merge_counts(counts, rep.ctx.counts());
    merge_counts(counts, rep.sr_ctx.counts());
    if (rep.update_ctx) merge_counts(counts, rep.update_ctx->counts());
  }
  if (collective_ctx_) merge_counts(counts, collective_ctx_->counts());
  merge_counts(counts, evaluation_counts_);
  return counts;
}

}  // namespace roundoff::train
