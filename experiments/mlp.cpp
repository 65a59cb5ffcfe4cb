#include "mlp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace roundoff::train {

namespace {

template <std::size_t N>
int index_by_name(const char* const (&names)[N], std::string_view name, const char* what) {
  std::string known;
  for (std::size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<int>(i);
    known += std::string(i ? " " : "") + names[i];
  }
  throw std::invalid_argument("unknown " + std::string(what) + " '" + std::string(name) + "' (known: " + known + ")");
}

double round_constant(const emu::Format& f, double v) {
  emu::Flags ignored = 0;
  return emu::round(f, v, emu::RoundSpec{}, nullptr, ignored);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

UpdateRule update_rule_by_name(std::string_view name) {
  return static_cast<UpdateRule>(index_by_name(kUpdateRuleNames, name, "update rule"));
}
OptimizerKind optimizer_by_name(std::string_view name) {
  return static_cast<OptimizerKind>(index_by_name(kOptimizerNames, name, "optimizer"));
}

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
    : inputs_(inputs), classes_(classes), formats_(std::move(formats)), unit_(unit) {
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
  momentum_ = round_constant(formats_.bn_fwd, kBnMomentum);
  one_minus_momentum_ = round_constant(formats_.bn_fwd, 1.0 - kBnMomentum);
  eps_ = round_constant(formats_.bn_fwd, kBnEps);
  xhat_.resize(n_layers - 1);
  inv_std_.resize(n_layers - 1);
  bn_out_.resize(n_layers - 1);
}

// c (m x n, values of `out`) = a (m x k) * b (k x n) through the unit, operands rounded
// into the unit's input format, the unit's output rounded into `out`.
void Mlp::gemm(emu::Context& ctx, std::size_t m, std::size_t n, std::size_t k, const std::vector<double>& a,
               const std::vector<double>& b, const emu::Format& out, std::vector<double>& c) const {
  ctx.clear_element();  // the unit reports its own elements, if any
  const emu::Format& in = unit_.input_format();
  auto as_input = [&](const std::vector<double>& v) {
    std::vector<double> r(v);
    for (double& x : r) x = ctx.convert(in, x);
    return r;
  };
  const std::vector<double> ai = as_input(a), bi = as_input(b);
  const emu::Format& unit_out = unit_.output_format();
  c.resize(m * n);
  for (double& x : c) x = ctx.convert(unit_out, x);
  unit_.gemm(ctx, m, n, k, ai.data(), k, bi.data(), n, c.data(), n);
  if (!(unit_out == out))
    for (double& x : c) x = ctx.convert(out, x);
}

namespace {

// Sets the element (i, j) of a tensor with `cols` columns, or (j) of a vector.
void set_element_2d(emu::Context& ctx, std::size_t i, std::size_t j, std::size_t cols) {
  const auto row = static_cast<std::int64_t>(i), col = static_cast<std::int64_t>(j);
  ctx.set_element(row * static_cast<std::int64_t>(cols) + col, {row, col});
}
void set_element_1d(emu::Context& ctx, std::size_t j) {
  const auto index = static_cast<std::int64_t>(j);
  ctx.set_element(index, {index});
}

// Softmax cross-entropy of one sample in the loss format `lf`: e[j] = exp(logit_j - max)
// (emu has no exp or log: computed in fp64 and rounded once into lf), their sum, and the
// loss lse - logit_label with lse = max + log(sum). Elements: (sample, class) for the
// exponentials and their sum, (sample) for the rest.
struct SoftmaxTerms {
  double loss, sum;
};
SoftmaxTerms softmax_terms(emu::Context& ctx, const emu::Format& lf, const double* logits, std::size_t classes,
                           int label, std::vector<double>& e, std::size_t sample) {
  double max = logits[0];
  for (std::size_t j = 1; j < classes; ++j) max = std::max(max, logits[j]);
  e.resize(classes);
  double sum = 0.0;
  for (std::size_t j = 0; j < classes; ++j) {
    set_element_2d(ctx, sample, j, classes);
    e[j] = ctx.convert(lf, std::exp(ctx.sub(lf, logits[j], max)));
    sum = ctx.add(lf, sum, e[j]);
  }
  set_element_1d(ctx, sample);
  const double lse = ctx.add(lf, max, ctx.convert(lf, std::log(sum)));
  return {ctx.sub(lf, lse, logits[label]), sum};
}

// Scope names of layer l (0-based): its Linear "l<l+1>", the batch norm after it "bn<l+1>"
// (append: gcc 12 warns falsely (-Wrestrict) on "l" + std::to_string(...)).
std::string linear_name(int l) { return std::string("l").append(std::to_string(l + 1)); }
std::string bn_name(int l) { return std::string("bn").append(std::to_string(l + 1)); }

std::vector<double> transpose(const std::vector<double>& a, std::size_t rows, std::size_t cols) {
  std::vector<double> t(a.size());
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

}  // namespace

std::vector<double> Mlp::linear(emu::Context& ctx, int l, std::size_t rows, const std::vector<double>& h) const {
  const emu::Scope scope(ctx, linear_name(l));
  const std::size_t in = widths_[l], out = widths_[l + 1];
  const bool last = l == layers() - 1;
  std::vector<double> z(rows * out, 0.0);
  if (last)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < out; ++j) z[i * out + j] = bias.value[j];
  gemm(ctx, rows, out, in, h, weights[l].value, last ? formats_.act : formats_.bn_fwd, z);
  return z;
}

double Mlp::forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                             double loss_scale) {
  const std::size_t batch = y.size();
  const int n_layers = layers();
  const ModelFormats& f = formats_;
  const double batch_size = static_cast<double>(batch);

  // Forward: scopes forward.l<k> (Linear), forward.bn<k> (batch norm and ReLU).
  std::vector<double> h = x;
  {
    const emu::Scope forward(ctx, "forward");
    for (int l = 0; l < n_layers; ++l) {
      const std::size_t out = widths_[l + 1];
      layer_input_[l] = h;
      std::vector<double> z = linear(ctx, l, batch, h);
      if (l == n_layers - 1) {
        h = std::move(z);
        break;
      }
      // Batch norm (batch statistics) in bn_fwd, output rounded into act, then ReLU.
      // Elements: (sample, channel), or (channel) for the statistics.
      const emu::Scope scope(ctx, bn_name(l));
      const emu::Format& bn = f.bn_fwd;
      std::vector<double>& xhat = xhat_[l];
      std::vector<double>& inv_std = inv_std_[l];
      xhat.resize(batch * out);
      inv_std.resize(out);
      h.assign(batch * out, 0.0);
      for (std::size_t j = 0; j < out; ++j) {
        set_element_1d(ctx, j);
        double sum = 0.0;
        for (std::size_t i = 0; i < batch; ++i) sum = ctx.add(bn, sum, z[i * out + j]);
        const double mean = ctx.div(bn, sum, batch_size);
        double squares = 0.0;
        for (std::size_t i = 0; i < batch; ++i) {
          const double c = ctx.sub(bn, z[i * out + j], mean);
          squares = ctx.fma(bn, c, c, squares);
        }
        const double var = ctx.div(bn, squares, batch_size);
        inv_std[j] = ctx.div(bn, 1.0, ctx.sqrt(bn, ctx.add(bn, var, eps_)));
        const double unbiased = batch > 1 ? ctx.div(bn, squares, batch_size - 1.0) : var;
        running_mean[l][j] = ctx.fma(bn, one_minus_momentum_, running_mean[l][j], ctx.mul(bn, momentum_, mean));
        running_var[l][j] = ctx.fma(bn, one_minus_momentum_, running_var[l][j], ctx.mul(bn, momentum_, unbiased));
        for (std::size_t i = 0; i < batch; ++i) {
          const std::size_t k = i * out + j;
          set_element_2d(ctx, i, j, out);
          xhat[k] = ctx.mul(bn, ctx.sub(bn, z[k], mean), inv_std[j]);
          const double bn_y = ctx.fma(f.act, gamma[l].value[j], xhat[k], beta[l].value[j]);
          h[k] = bn_y > 0 ? bn_y : 0.0;  // ReLU (NaN propagates)
          if (std::isnan(bn_y)) h[k] = bn_y;
        }
      }
      ctx.clear_element();
      bn_out_[l] = h;
    }
  }

  // Softmax cross-entropy in the loss format; dlogits = (p - onehot) * S / B (scope loss;
  // elements (sample, class), or (sample)).
  const std::size_t classes = classes_;
  std::vector<double> dz(batch * classes);
  double loss = 0.0;
  {
    const emu::Scope loss_scope(ctx, "loss");
    const emu::Format& lf = f.loss;
    const double scale_over_batch = round_constant(lf, loss_scale / batch_size);
    double loss_sum = 0.0;
    std::vector<double> e;
    for (std::size_t i = 0; i < batch; ++i) {
      const SoftmaxTerms t = softmax_terms(ctx, lf, &h[i * classes], classes, y[i], e, i);
      loss_sum = ctx.add(lf, loss_sum, t.loss);
      for (std::size_t j = 0; j < classes; ++j) {
        set_element_2d(ctx, i, j, classes);
        const double p = ctx.div(lf, e[j], t.sum);
        const double d = ctx.sub(lf, p, static_cast<int>(j) == y[i] ? 1.0 : 0.0);
        dz[i * classes + j] = ctx.convert(f.grad, ctx.mul(lf, d, scale_over_batch));
      }
    }
    ctx.clear_element();
    loss = ctx.div(lf, loss_sum, batch_size);
  }

  // Backward: dz is the gradient at the output of layer l's Linear. Scopes
  // backward.l<k>.bias (the last layer's bias gradient; element (class)), backward.l<k>.dw
  // (weight gradient), backward.l<k>.dx (gradient at its input), backward.bn<k>
  // (through ReLU and batch norm; elements (sample, channel), or (channel)).
  const emu::Scope backward(ctx, "backward");
  for (int l = n_layers - 1; l >= 0; --l) {
    const std::size_t in = widths_[l], out = widths_[l + 1];
    std::vector<double> dh(batch * in, 0.0);
    {
      const emu::Scope layer(ctx, linear_name(l));
      if (l == n_layers - 1) {
        const emu::Scope scope(ctx, "bias");
        for (std::size_t j = 0; j < out; ++j) {
          set_element_1d(ctx, j);
          double s = 0.0;
          for (std::size_t i = 0; i < batch; ++i) s = ctx.add(f.grad, s, dz[i * out + j]);
          bias.grad[j] = s;
        }
        ctx.clear_element();
      }
      std::vector<double> dw(in * out, 0.0);
      {
        const emu::Scope scope(ctx, "dw");
        gemm(ctx, in, out, batch, transpose(layer_input_[l], batch, in), dz, f.grad, dw);
      }
      weights[l].grad = std::move(dw);
      if (l == 0) break;
      const emu::Scope scope(ctx, "dx");
      gemm(ctx, batch, in, out, dz, transpose(weights[l].value, in, out), f.grad, dh);
    }
    // Gradient at the previous block's output, through ReLU and batch norm.
    const int b = l - 1;
    const emu::Scope scope(ctx, bn_name(b));
    const emu::Format& bn = f.bn_bwd;
    const std::vector<double>& xhat = xhat_[b];
    std::vector<double> dz_prev(batch * in);
    std::vector<double> dxhat(batch);
    for (std::size_t j = 0; j < in; ++j) {
      double dgamma = 0.0, dbeta = 0.0, sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
      for (std::size_t i = 0; i < batch; ++i) {
        const std::size_t k = i * in + j;
        set_element_2d(ctx, i, j, in);
        const double dy = bn_out_[b][k] > 0 ? dh[k] : 0.0;
        dgamma = ctx.fma(bn, dy, xhat[k], dgamma);
        dbeta = ctx.add(bn, dbeta, dy);
        dxhat[i] = ctx.mul(bn, dy, gamma[b].value[j]);
        sum_dxhat = ctx.add(bn, sum_dxhat, dxhat[i]);
        sum_dxhat_xhat = ctx.fma(bn, dxhat[i], xhat[k], sum_dxhat_xhat);
      }
      gamma[b].grad[j] = dgamma;
      beta[b].grad[j] = dbeta;
      set_element_1d(ctx, j);
      const double mean_dxhat = ctx.div(bn, sum_dxhat, batch_size);
      const double mean_dxhat_xhat = ctx.div(bn, sum_dxhat_xhat, batch_size);
      // dz = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
      for (std::size_t i = 0; i < batch; ++i) {
        const std::size_t k = i * in + j;
        set_element_2d(ctx, i, j, in);
        const double centred = ctx.sub(bn, ctx.sub(bn, dxhat[i], mean_dxhat), ctx.mul(bn, xhat[k], mean_dxhat_xhat));
        dz_prev[k] = ctx.mul(f.grad, inv_std_[b][j], centred);
      }
    }
    ctx.clear_element();
    dz = std::move(dz_prev);
  }
  return loss;
}

std::vector<double> Mlp::logits(emu::Context& ctx, const std::vector<double>& x, std::size_t first_row) const {
  const std::size_t rows = x.size() / static_cast<std::size_t>(inputs_);
  const int n_layers = layers();
  const ModelFormats& f = formats_;
  std::vector<double> h = x;
  for (int l = 0; l < n_layers; ++l) {
    const std::size_t out = widths_[l + 1];
    std::vector<double> z = linear(ctx, l, rows, h);
    if (l == n_layers - 1) return z;
    // Batch norm with the running statistics in bn_fwd, output rounded into act, ReLU.
    const emu::Scope scope(ctx, bn_name(l));
    const emu::Format& bn = f.bn_fwd;
    h.assign(rows * out, 0.0);
    for (std::size_t j = 0; j < out; ++j) {
      set_element_1d(ctx, j);
      const double inv_std = ctx.div(bn, 1.0, ctx.sqrt(bn, ctx.add(bn, running_var[l][j], eps_)));
      for (std::size_t i = 0; i < rows; ++i) {
        const std::size_t k = i * out + j;
        set_element_2d(ctx, first_row + i, j, out);
        const double xhat = ctx.mul(bn, ctx.sub(bn, z[k], running_mean[l][j]), inv_std);
        const double bn_y = ctx.fma(f.act, gamma[l].value[j], xhat, beta[l].value[j]);
        h[k] = bn_y > 0 || std::isnan(bn_y) ? bn_y : 0.0;  // ReLU (NaN propagates)
      }
    }
    ctx.clear_element();
  }
  return h;  // not reached: the last layer returns
}

Evaluation Mlp::evaluate(emu::Context& ctx, const data::Dataset& d) const {
  constexpr std::size_t kChunk = 256;  // rows per pass, to bound memory (rows are independent)
  const std::size_t n = d.size(), features = inputs_, classes = classes_;
  double loss_sum = 0.0;
  std::size_t correct = 0;
  std::vector<double> e;
  for (std::size_t first = 0; first < n; first += kChunk) {
    const std::size_t rows = std::min(kChunk, n - first);
    std::vector<double> x(rows * features);
    {
      const emu::Scope scope(ctx, "input");
      for (std::size_t k = 0; k < x.size(); ++k) {
        set_element_2d(ctx, first + k / features, k % features, features);
        x[k] = ctx.convert(formats_.act, d.x[first * features + k]);
      }
      ctx.clear_element();
    }
    const std::vector<double> z = logits(ctx, x, first);
    const emu::Scope scope(ctx, "loss");
    for (std::size_t i = 0; i < rows; ++i) {
      const double* row = &z[i * classes];
      const int label = d.y[first + i];
      loss_sum += softmax_terms(ctx, formats_.loss, row, classes, label, e, first + i).loss;
      bool all_finite = true;
      for (std::size_t j = 0; j < classes; ++j) all_finite = all_finite && std::isfinite(row[j]);
      const auto best = std::max_element(row, row + classes) - row;
      if (all_finite && best == label) ++correct;
    }
    ctx.clear_element();
  }
  return Evaluation{loss_sum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n)};
}

Evaluation Mlp::evaluate_fp64(const data::Dataset& d) const {
  const std::size_t n = d.size();
  std::vector<double> h(d.x.begin(), d.x.end());
  const int n_layers = layers();
  for (int l = 0; l < n_layers; ++l) {
    const std::size_t in = widths_[l], out = widths_[l + 1];
    const bool last = l == n_layers - 1;
    std::vector<double> z(n * out, 0.0);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < out; ++j) {
        double s = last ? bias.value[j] : 0.0;
        for (std::size_t k = 0; k < in; ++k) s += h[i * in + k] * weights[l].value[k * out + j];
        z[i * out + j] = s;
      }
    if (!last) {
      for (std::size_t j = 0; j < out; ++j) {
        double mean = 0.0, var = 0.0;
        for (std::size_t i = 0; i < n; ++i) mean += z[i * out + j];
        mean /= static_cast<double>(n);
        for (std::size_t i = 0; i < n; ++i) var += (z[i * out + j] - mean) * (z[i * out + j] - mean);
        var /= static_cast<double>(n);
        const double inv_std = 1.0 / std::sqrt(var + kBnEps);
        for (std::size_t i = 0; i < n; ++i) {
          const double v = gamma[l].value[j] * (z[i * out + j] - mean) * inv_std + beta[l].value[j];
          z[i * out + j] = std::isnan(v) ? v : std::max(v, 0.0);
        }
      }
    }
    h = std::move(z);
  }
  Evaluation e;
  const std::size_t classes = classes_;
  std::size_t correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double* logits = &h[i * classes];
    const std::size_t best = static_cast<std::size_t>(std::max_element(logits, logits + classes) - logits);
    double sum = 0.0;
    for (std::size_t j = 0; j < classes; ++j) sum += std::exp(logits[j] - logits[best]);
    e.loss += logits[best] + std::log(sum) - logits[d.y[i]];
    bool all_finite = true;
    for (std::size_t j = 0; j < classes; ++j) all_finite = all_finite && std::isfinite(logits[j]);
    if (all_finite && static_cast<int>(best) == d.y[i]) ++correct;
  }
  e.loss /= static_cast<double>(n);
  e.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return e;
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

emu::Format format_or(const std::string& name, const emu::Format& fallback) {
  return name == "auto" ? fallback : emu::format_by_name(name);
}

// The run's exception settings with a given rounding.
emu::FpControl control_with(emu::FpControl control, emu::Rounding rounding) {
  control.rounding = rounding;
  return control;
}

}  // namespace

Trainer::Trainer(const TrainSpec& spec, std::shared_ptr<const data::Split> data, std::uint64_t seed,
                 std::uint32_t replica, emu::StreamId rounding_stream)
    : spec_(spec),
      data_(std::move(data)),
      formats_{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32()},
      ctx_(control_with(spec.fp_control, emu::Rounding::rne)),
      sr_ctx_(control_with(spec.fp_control, emu::Rounding::sr), emu::Rng(rounding_stream)),
      order_rng_(emu::StreamId{seed, 0, replica, 2}) {
  const bool baseline = spec.rule == UpdateRule::fp32;
  ParamFormats weight_formats{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32()};
  if (!baseline) {
    const emu::Format act = emu::format_by_name(spec.act_format), grad = emu::format_by_name(spec.grad_format);
    formats_ = ModelFormats{act, grad, emu::format_by_name(spec.loss_format), spec.bn_fp32 ? emu::fp32() : act,
                            spec.bn_fp32 ? emu::fp32() : grad};
    const emu::Format storage = emu::format_by_name(spec.weight_format);
    const emu::Format master = emu::format_by_name(spec.master_format);
    const emu::Format arith = spec.rule == UpdateRule::fp32_master ? master : storage;
    weight_formats = ParamFormats{storage, arith, format_or(spec.state_format, arith), master};
  }
  // The unscaling format of a tensor whose gradient is computed in `computed`.
  auto unscale_format = [&](const emu::Format& computed) -> std::optional<emu::Format> {
    if (spec.unscale_format == "fp32") return emu::fp32();
    if (spec.unscale_format == "compute") return computed;
    if (spec.unscale_format == "auto") return std::nullopt;
    throw std::invalid_argument("unknown unscale_format '" + spec.unscale_format + "'");
  };
  weight_formats.unscale = unscale_format(formats_.grad);
  // The baseline computes plain fp32 sequential dot products whatever `unit` says.
  unit_ = baseline ? emu::make_unit(emu::UnitKind::fp32_seq, emu::fp32(), emu::fp32())
                   : emu::make_unit(emu::unit_kind_by_name(spec.unit), formats_.act);
  weight_updater_ = std::make_unique<Updater>(spec.rule, spec.optimizer, weight_formats);
  ParamFormats bn_formats = weight_formats;
  if (spec.bn_fp32 && !baseline)
    bn_formats = ParamFormats{emu::fp32(), emu::fp32(), emu::fp32(), emu::fp32(), unscale_format(formats_.bn_bwd)};
  bn_updater_ = std::make_unique<Updater>(spec.bn_fp32 && !baseline ? UpdateRule::fp32 : spec.rule, spec.optimizer,
                                          bn_formats);

  const data::Dataset& train = data_->train;
  model_ = std::make_unique<Mlp>(train.features, spec.hidden, train.classes, formats_, *unit_);
  const emu::Scope init(ctx_, "init");
  // He initialisation N(0, 2 / fan_in); gamma 1, beta and bias 0.
  emu::Rng init_rng(emu::StreamId{seed, 0, replica, 1});
  std::vector<int> widths{train.features};
  widths.insert(widths.end(), spec.hidden.begin(), spec.hidden.end());
  widths.push_back(train.classes);
  Mlp& m = *model_;
  for (int l = 0; l < m.layers(); ++l) {
    std::vector<double> w(static_cast<std::size_t>(widths[l]) * widths[l + 1]);
    const double sd = std::sqrt(2.0 / widths[l]);
    for (double& v : w) v = sd * init_rng.normal();
    weight_updater_->init(m.weights[l], w, ctx_);
    layer_names_.push_back(linear_name(l));
    layer_params_.push_back(&m.weights[l]);
  }
  weight_updater_->init(m.bias, std::vector<double>(train.classes, 0.0), ctx_);
  for (std::size_t b = 0; b < m.gamma.size(); ++b) {
    bn_updater_->init(m.gamma[b], std::vector<double>(spec.hidden[b], 1.0), ctx_);
    bn_updater_->init(m.beta[b], std::vector<double>(spec.hidden[b], 0.0), ctx_);
    layer_names_.push_back(bn_name(static_cast<int>(b)));
    layer_params_.push_back(&m.gamma[b]);
  }
  for (const Param* p : all_params())
    initial_state_.push_back(p->master.empty() ? p->value : p->master);
  run_stats.resize(layer_names_.size());
  window_stats.resize(layer_names_.size());

  train_x_.resize(train.x.size());
  for (std::size_t i = 0; i < train.x.size(); ++i) {
    set_element_2d(ctx_, i / train.features, i % train.features, train.features);
    train_x_[i] = ctx_.convert(formats_.act, train.x[i]);
  }
  ctx_.clear_element();
  steps_per_epoch_ = static_cast<std::int64_t>(train.size()) / spec.batch;
  if (steps_per_epoch_ < 1) throw std::invalid_argument("batch is larger than the training split");
  order_.resize(train.size());
  std::iota(order_.begin(), order_.end(), 0);
  scale_ = spec.loss_scale == LossScaleKind::none ? 1.0 : spec.scale;
}

StepResult Trainer::step() {
  const data::Dataset& train = data_->train;
  const std::int64_t in_epoch = steps_ % steps_per_epoch_;
  if (in_epoch == 0)  // a fresh order each epoch (Fisher-Yates)
    for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[order_rng_.next_u64() % (i + 1)]);
  const std::size_t batch = spec_.batch, features = train.features;
  std::vector<double> x(batch * features);
  std::vector<int> y(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    const std::size_t s = order_[in_epoch * batch + i];
    y[i] = train.y[s];
    std::copy_n(train_x_.begin() + static_cast<std::ptrdiff_t>(s * features), features, x.begin() + static_cast<std::ptrdiff_t>(i * features));
  }
  ++steps_;
  StepResult result;
  result.scale = scale_;
  Mlp& m = *model_;
  result.loss = m.forward_backward(ctx_, x, y, scale_);

  bool finite = true;
  for (const Param* p : all_params())
    for (double g : p->grad) finite = finite && std::isfinite(g);
  if (!finite && spec_.loss_scale == LossScaleKind::dynamic) {
    result.skipped = true;
    ++skipped_;
    scale_ *= spec_.scale_backoff;
    clean_run_ = 0;
    return result;
  }

  for (std::size_t l = 0; l < layer_params_.size(); ++l)
    for (double g : layer_params_[l]->grad) {
      run_stats[l].add(g / scale_);
      window_stats[l].add(g / scale_);
    }

  ++applied_;
  const emu::Scope update(ctx_, "update"), sr_update(sr_ctx_, "update");
  auto apply = [&](const Updater& u, Param& p, const std::string& name, bool track_lr) {
    const emu::Scope scope(ctx_, name), sr_scope(sr_ctx_, name);
    const emu::Format& ar = u.formats().arith;
    double lr, divisor = 1.0;
    if (spec_.unscale_lr) {
      // lr / S rounded once into the unscaling format, then into the update arithmetic's.
      const std::optional<emu::Format>& un = u.formats().unscale;
      lr = !un || *un == ar ? ctx_.div(ar, spec_.lr, scale_) : ctx_.convert(ar, ctx_.div(*un, spec_.lr, scale_));
      if (track_lr) {
        const double exact = spec_.lr / scale_;
        effective_lr_ = lr;
        effective_lr_error_max_ = std::max(effective_lr_error_max_, std::fabs(lr - exact) / exact);
      }
    } else {
      lr = ctx_.convert(ar, spec_.lr);
      divisor = scale_;
      if (track_lr) effective_lr_ = lr;
    }
    u.step(p, applied_, divisor, lr, ctx_, sr_ctx_, counts_);
  };
  apply(*weight_updater_, m.bias, linear_name(m.layers() - 1) + ".bias", false);
  for (int l = 0; l < m.layers(); ++l) apply(*weight_updater_, m.weights[l], linear_name(l), l == 0);
  for (std::size_t b = 0; b < m.gamma.size(); ++b)
    apply(*bn_updater_, m.gamma[b], bn_name(static_cast<int>(b)) + ".gamma", false);
  for (std::size_t b = 0; b < m.beta.size(); ++b)
    apply(*bn_updater_, m.beta[b], bn_name(static_cast<int>(b)) + ".beta", false);

  if (spec_.loss_scale == LossScaleKind::dynamic && ++clean_run_ >= spec_.scale_interval) {
    scale_ *= spec_.scale_growth;
    clean_run_ = 0;
  }
  return result;
}

std::vector<const Param*> Trainer::all_params() const {
  std::vector<const Param*> all;
  for (const Param& p : model_->weights) all.push_back(&p);
  all.push_back(&model_->bias);
  for (const Param& p : model_->gamma) all.push_back(&p);
  for (const Param& p : model_->beta) all.push_back(&p);
  return all;
}

double Trainer::frac_values_changed() const {
  const std::vector<const Param*> all = all_params();
  std::uint64_t values = 0, changed = 0;
  for (std::size_t t = 0; t < all.size(); ++t) {
    const std::vector<double>& now = all[t]->master.empty() ? all[t]->value : all[t]->master;
    for (std::size_t i = 0; i < now.size(); ++i) {
      ++values;
      if (!(now[i] == initial_state_[t][i])) ++changed;  // NaN counts as changed
    }
  }
  return values ? static_cast<double>(changed) / static_cast<double>(values) : 0.0;
}

Evaluation Trainer::evaluate(const data::Dataset& d, const char* scope) {
  emu::Context ctx(control_with(spec_.fp_control, emu::Rounding::rne));
  const emu::Scope evaluate(ctx, "evaluate"), split(ctx, scope);
  const Evaluation e = model_->evaluate(ctx, d);
  merge_counts(evaluation_counts_, ctx.counts());
  return e;
}

Evaluation Trainer::evaluate_train() { return evaluate(data_->train, "train"); }
Evaluation Trainer::evaluate_test() { return evaluate(data_->test, "test"); }

std::vector<emu::OpCount> Trainer::fp_counts() const {
  std::vector<emu::OpCount> counts = ctx_.counts();
  merge_counts(counts, sr_ctx_.counts());
  merge_counts(counts, evaluation_counts_);
  return counts;
}

}  // namespace roundoff::train
