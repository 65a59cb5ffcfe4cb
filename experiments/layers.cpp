#include "layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace roundoff::train {

void set_element(emu::Context& ctx, const Shape& s, std::size_t flat) {
  const auto k = static_cast<std::int64_t>(flat);
  const auto n = static_cast<std::int64_t>(flat / s.per_sample());
  const auto c = static_cast<std::int64_t>(flat / s.spatial() % s.c);
  if (s.spatial() == 1) {
    ctx.set_element(k, {n, c});
    return;
  }
  const std::size_t q = flat % s.spatial();
  ctx.set_element(k, {n, c, static_cast<std::int64_t>(q / s.w), static_cast<std::int64_t>(q % s.w)});
}

void set_element(const Emulated& e, const Shape& s, std::size_t flat) {
  if (e.first_sample == 0) return set_element(e.ctx, s, flat);
  set_element(e.ctx, Shape{s.n + e.first_sample, s.c, s.h, s.w}, flat + e.first_sample * s.per_sample());
}

namespace {

void set_channel(emu::Context& ctx, std::size_t c) {
  const auto index = static_cast<std::int64_t>(c);
  ctx.set_element(index, {index});
}

// Whether rounding v into f is exact and raises nothing: a finite value of f. Tensors
// handed from layer to layer are mostly such values already (an activation in fp16 going
// into an fp16 unit), and skipping their conversion keeps results and flags unchanged.
bool finite_value_of(const emu::Format& f, double v) { return std::isfinite(v) && f.representable(v); }

// Every value rounded into f (elements of shape s when given, else flat indices).
std::vector<double> converted(const Emulated& e, const emu::Format& f, const std::vector<double>& v,
                              const Shape* s = nullptr) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (finite_value_of(f, v[i])) {
      r[i] = v[i];
      continue;
    }
    if (s)
      set_element(e, *s, i);
    else
      e.ctx.set_element(static_cast<std::int64_t>(i));
    r[i] = e.ctx.convert(f, v[i]);
  }
  e.ctx.clear_element();
  return r;
}

std::vector<double> transpose(const std::vector<double>& a, std::size_t rows, std::size_t cols) {
  std::vector<double> t(a.size());
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// The patches of image n of x as rows (y, x) of `col` (OH OW x C K K), the reduction
// index r = (c K + ky) K + kx, zeros in the padding.
void im2col(const Tensor& x, std::size_t n, const ConvGeometry& g, std::size_t oh, std::size_t ow, double* col) {
  const Shape& s = x.shape;
  const std::size_t k = g.kernel, kd = s.c * k * k;
  for (std::size_t y = 0; y < oh; ++y)
    for (std::size_t xo = 0; xo < ow; ++xo) {
      double* row = col + (y * ow + xo) * kd;
      for (std::size_t c = 0; c < s.c; ++c)
        for (std::size_t ky = 0; ky < k; ++ky) {
          const std::size_t iy = y * g.stride + ky;  // in the padded input
          for (std::size_t kx = 0; kx < k; ++kx) {
            const std::size_t ix = xo * g.stride + kx;
            const bool inside = iy >= g.pad && iy < g.pad + s.h && ix >= g.pad && ix < g.pad + s.w;
            row[(c * k + ky) * k + kx] =
                inside ? x.v[((n * s.c + c) * s.h + (iy - g.pad)) * s.w + (ix - g.pad)] : 0.0;
          }
        }
    }
}

bool is_amp(const emu::MatrixUnit& unit) {
  return unit.kind() == emu::UnitKind::ipu_amp || unit.kind() == emu::UnitKind::ipu_amp_half;
}

}  // namespace

emu::Conv2dShape conv_shape(const Shape& in, const ConvGeometry& g) {
  emu::Conv2dShape s;
  s.batch = in.n;
  s.in_channels = in.c;
  s.height = in.h;
  s.width = in.w;
  s.out_channels = g.out_channels;
  s.kernel_height = s.kernel_width = g.kernel;
  s.stride_h = s.stride_w = g.stride;
  s.pad_h = s.pad_w = g.pad;
  return s;
}

Shape conv_output(const Shape& in, const ConvGeometry& g) {
  const emu::Conv2dShape s = conv_shape(in, g);
  const Shape out{in.n, g.out_channels, s.out_height(), s.out_width()};
  if (out.h == 0 || out.w == 0 || g.stride == 0 || g.kernel == 0)
    throw std::invalid_argument("a " + std::to_string(g.kernel) + "x" + std::to_string(g.kernel) +
                                " convolution with stride " + std::to_string(g.stride) + " and padding " +
                                std::to_string(g.pad) + " does not fit an input of " + std::to_string(in.h) + "x" +
                                std::to_string(in.w));
  return out;
}

// ---- Matrix products and convolutions --------------------------------------------------

void unit_gemm(emu::Context& ctx, const emu::MatrixUnit& unit, std::size_t m, std::size_t n, std::size_t k,
               std::vector<double> a, std::vector<double> b, const emu::Format& out, std::vector<double>& c) {
  ctx.clear_element();  // the unit reports its own elements, if any
  const emu::Format& in = unit.input_format();
  auto into = [&](const emu::Format& f, std::vector<double>& v) {
    for (double& x : v)
      if (!finite_value_of(f, x)) x = ctx.convert(f, x);
  };
  into(in, a);
  into(in, b);
  const emu::Format& unit_out = unit.output_format();
  c.resize(m * n);
  into(unit_out, c);
  unit.gemm(ctx, m, n, k, a.data(), k, b.data(), n, c.data(), n);
  if (!(unit_out == out)) into(out, c);
}

Tensor conv2d(Emulated& e, const Tensor& x, const std::vector<double>& w, const ConvGeometry& g,
              const emu::Format& out) {
  emu::Context& ctx = e.ctx;
  const Shape ys = conv_output(x.shape, g);
  const emu::Format& in = e.unit.input_format();
  const std::vector<double> xi = converted(e, in, x.v, &x.shape), wi = converted(e, in, w);
  Tensor y(ys);
  const emu::Format& unit_out = e.unit.output_format();
  if (is_amp(e.unit)) {
    const auto partials = e.unit.kind() == emu::UnitKind::ipu_amp_half ? emu::PartialsType::half
                                                                        : emu::PartialsType::float32;
    y.v = emu::amp_conv2d(ctx, emu::amp_config(partials, in, unit_out), conv_shape(x.shape, g), xi, wi);
  } else {
    const std::size_t kd = x.shape.c * g.kernel * g.kernel, positions = ys.spatial(), o_count = ys.c;
    const std::vector<double> wt = transpose(wi, o_count, kd);  // kd x O
    std::vector<double> col(positions * kd), c(positions * o_count);
    Tensor xin(x.shape);
    xin.v = xi;
    for (std::size_t n = 0; n < x.shape.n; ++n) {
      im2col(xin, n, g, ys.h, ys.w, col.data());
      std::fill(c.begin(), c.end(), 0.0);
      e.unit.gemm(ctx, positions, o_count, kd, col.data(), kd, wt.data(), o_count, c.data(), o_count);
      for (std::size_t o = 0; o < o_count; ++o)
        for (std::size_t q = 0; q < positions; ++q) y.v[(n * o_count + o) * positions + q] = c[q * o_count + o];
    }
  }
  if (!(unit_out == out)) y.v = converted(e, out, y.v, &ys);
  return y;
}

Tensor conv2d_grad_input(Emulated& e, const Tensor& dy, const std::vector<double>& w, const ConvGeometry& g,
                         const Shape& x_shape) {
  const std::size_t k = g.kernel, s = g.stride, o_count = dy.shape.c, c_count = x_shape.c;
  if (g.pad + 1 > k) throw std::invalid_argument("conv2d_grad_input needs pad <= kernel - 1");
  const std::size_t left = k - 1 - g.pad;
  Tensor dilated(Shape{dy.shape.n, o_count, x_shape.h + k - 1, x_shape.w + k - 1});
  const Shape& d = dilated.shape;
  for (std::size_t n = 0; n < dy.shape.n; ++n)
    for (std::size_t o = 0; o < o_count; ++o)
      for (std::size_t y = 0; y < dy.shape.h; ++y)
        for (std::size_t x = 0; x < dy.shape.w; ++x)
          dilated.v[((n * o_count + o) * d.h + left + y * s) * d.w + left + x * s] =
              dy.v[((n * o_count + o) * dy.shape.h + y) * dy.shape.w + x];
  std::vector<double> flipped(w.size());
  for (std::size_t o = 0; o < o_count; ++o)
    for (std::size_t c = 0; c < c_count; ++c)
      for (std::size_t ky = 0; ky < k; ++ky)
        for (std::size_t kx = 0; kx < k; ++kx)
          flipped[((c * o_count + o) * k + ky) * k + kx] = w[((o * c_count + c) * k + (k - 1 - ky)) * k + (k - 1 - kx)];
  return conv2d(e, dilated, flipped, ConvGeometry{c_count, k, 1, 0}, e.formats.grad);
}

std::vector<double> conv2d_grad_weights(Emulated& e, const Tensor& x, const Tensor& dy, const ConvGeometry& g) {
  const std::size_t kd = x.shape.c * g.kernel * g.kernel, positions = dy.shape.spatial(), o_count = dy.shape.c;
  const std::size_t m = x.shape.n * positions;
  // dW^T (C K K x O) = patches^T (C K K x N OH OW) times dy (N OH OW x O): the same
  // products in the same order per element as dy^T times the patches, in the
  // orientation the units' gemms run faster (few columns, long rows).
  std::vector<double> col(positions * kd), patches_t(kd * m), dy_rows(m * o_count);
  for (std::size_t n = 0; n < x.shape.n; ++n) {
    im2col(x, n, g, dy.shape.h, dy.shape.w, col.data());
    for (std::size_t q = 0; q < positions; ++q)
      for (std::size_t r = 0; r < kd; ++r) patches_t[r * m + n * positions + q] = col[q * kd + r];
    for (std::size_t o = 0; o < o_count; ++o)
      for (std::size_t q = 0; q < positions; ++q)
        dy_rows[(n * positions + q) * o_count + o] = dy.v[(n * o_count + o) * positions + q];
  }
  std::vector<double> dw_t(kd * o_count, 0.0);
  unit_gemm(e.ctx, e.unit, kd, o_count, m, std::move(patches_t), std::move(dy_rows), e.formats.grad, dw_t);
  return transpose(dw_t, kd, o_count);
}

Tensor conv2d(Fp64, const Tensor& x, const std::vector<double>& w, const ConvGeometry& g) {
  const Shape ys = conv_output(x.shape, g);
  const std::size_t kd = x.shape.c * g.kernel * g.kernel, positions = ys.spatial();
  Tensor y(ys);
  std::vector<double> col(positions * kd);
  for (std::size_t n = 0; n < x.shape.n; ++n) {
    im2col(x, n, g, ys.h, ys.w, col.data());
    for (std::size_t o = 0; o < ys.c; ++o)
      for (std::size_t q = 0; q < positions; ++q) {
        double sum = 0.0;
        for (std::size_t r = 0; r < kd; ++r) sum += col[q * kd + r] * w[o * kd + r];
        y.v[(n * ys.c + o) * positions + q] = sum;
      }
  }
  return y;
}

// ---- Dense ---------------------------------------------------------------------------

Tensor dense(Emulated& e, const Tensor& x, const Param& weight, const Param* bias, std::size_t outputs,
             const emu::Format& out) {
  const std::size_t rows = x.shape.n, in = x.shape.per_sample();
  Tensor z(Shape{rows, outputs, 1, 1});
  if (bias)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < outputs; ++j) z.v[i * outputs + j] = bias->value[j];
  unit_gemm(e.ctx, e.unit, rows, outputs, in, x.v, weight.value, out, z.v);
  return z;
}

Tensor dense(Fp64, const Tensor& x, const Param& weight, const Param* bias, std::size_t outputs) {
  const std::size_t rows = x.shape.n, in = x.shape.per_sample();
  Tensor z(Shape{rows, outputs, 1, 1});
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < outputs; ++j) {
      double s = bias ? bias->value[j] : 0.0;
      for (std::size_t k = 0; k < in; ++k) s += x.v[i * in + k] * weight.value[k * outputs + j];
      z.v[i * outputs + j] = s;
    }
  return z;
}

Tensor dense_backward(Emulated& e, const Tensor& x, const Tensor& dz, Param& weight, Param* bias, bool need_dx) {
  emu::Context& ctx = e.ctx;
  const std::size_t rows = x.shape.n, in = x.shape.per_sample(), out = dz.shape.c;
  if (bias) {
    const emu::Scope scope(ctx, "bias");
    for (std::size_t j = 0; j < out; ++j) {
      set_channel(ctx, j);
      double s = 0.0;
      for (std::size_t i = 0; i < rows; ++i) s = ctx.add(e.formats.grad, s, dz.v[i * out + j]);
      bias->grad[j] = s;
    }
    ctx.clear_element();
  }
  {
    const emu::Scope scope(ctx, "dw");
    std::vector<double> dw(in * out, 0.0);
    unit_gemm(ctx, e.unit, in, out, rows, transpose(x.v, rows, in), dz.v, e.formats.grad, dw);
    weight.grad = std::move(dw);
  }
  Tensor dx;
  if (!need_dx) return dx;
  const emu::Scope scope(ctx, "dx");
  dx = Tensor(x.shape);
  unit_gemm(ctx, e.unit, rows, in, out, dz.v, transpose(weight.value, in, out), e.formats.grad, dx.v);
  return dx;
}

// ---- Batch norm ------------------------------------------------------------------------

double round_constant(const emu::Format& f, double v) {
  emu::Flags ignored = 0;
  return emu::round(f, v, emu::RoundSpec{}, nullptr, ignored);
}

BatchNormConstants BatchNormConstants::in(const emu::Format& bn_fwd) {
  return {round_constant(bn_fwd, kBnMomentum), round_constant(bn_fwd, 1.0 - kBnMomentum),
          round_constant(bn_fwd, kBnEps)};
}

Tensor batch_norm_train(Emulated& e, const Tensor& z, const Param& gamma, const Param& beta,
                        std::vector<double>& running_mean, std::vector<double>& running_var,
                        const BatchNormConstants& k, BatchNormSaved& saved) {
  emu::Context& ctx = e.ctx;
  const Shape& s = z.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample();
  const double count = static_cast<double>(s.n * spatial);
  const emu::Format& bn = e.formats.bn_fwd;
  saved.xhat.resize(z.v.size());
  saved.inv_std.resize(s.c);
  Tensor h(s);
  for (std::size_t c = 0; c < s.c; ++c) {
    set_channel(ctx, c);
    double sum = 0.0;
    for (std::size_t n = 0; n < s.n; ++n)
      for (std::size_t q = 0; q < spatial; ++q) sum = ctx.add(bn, sum, z.v[n * per + c * spatial + q]);
    const double mean = ctx.div(bn, sum, count);
    double squares = 0.0;
    for (std::size_t n = 0; n < s.n; ++n)
      for (std::size_t q = 0; q < spatial; ++q) {
        const double d = ctx.sub(bn, z.v[n * per + c * spatial + q], mean);
        squares = ctx.fma(bn, d, d, squares);
      }
    const double var = ctx.div(bn, squares, count);
    const double inv_std = ctx.div(bn, 1.0, ctx.sqrt(bn, ctx.add(bn, var, k.eps)));
    saved.inv_std[c] = inv_std;
    const double unbiased = count > 1 ? ctx.div(bn, squares, count - 1.0) : var;
    running_mean[c] = ctx.fma(bn, k.one_minus_momentum, running_mean[c], ctx.mul(bn, k.momentum, mean));
    running_var[c] = ctx.fma(bn, k.one_minus_momentum, running_var[c], ctx.mul(bn, k.momentum, unbiased));
    for (std::size_t n = 0; n < s.n; ++n)
      for (std::size_t q = 0; q < spatial; ++q) {
        const std::size_t i = n * per + c * spatial + q;
        set_element(e, s, i);
        saved.xhat[i] = ctx.mul(bn, ctx.sub(bn, z.v[i], mean), inv_std);
        h.v[i] = ctx.fma(e.formats.act, gamma.value[c], saved.xhat[i], beta.value[c]);
      }
  }
  ctx.clear_element();
  return h;
}

Tensor batch_norm_infer(Emulated& e, const Tensor& z, const Param& gamma, const Param& beta,
                        const std::vector<double>& running_mean, const std::vector<double>& running_var,
                        const BatchNormConstants& k) {
  emu::Context& ctx = e.ctx;
  const Shape& s = z.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample();
  const emu::Format& bn = e.formats.bn_fwd;
  Tensor h(s);
  for (std::size_t c = 0; c < s.c; ++c) {
    set_channel(ctx, c);
    const double inv_std = ctx.div(bn, 1.0, ctx.sqrt(bn, ctx.add(bn, running_var[c], k.eps)));
    for (std::size_t n = 0; n < s.n; ++n)
      for (std::size_t q = 0; q < spatial; ++q) {
        const std::size_t i = n * per + c * spatial + q;
        set_element(e, s, i);
        const double xhat = ctx.mul(bn, ctx.sub(bn, z.v[i], running_mean[c]), inv_std);
        h.v[i] = ctx.fma(e.formats.act, gamma.value[c], xhat, beta.value[c]);
      }
  }
  ctx.clear_element();
  return h;
}

Tensor batch_norm_infer(Fp64, const Tensor& z, const Param& gamma, const Param& beta,
                        const std::vector<double>& running_mean, const std::vector<double>& running_var) {
  const Shape& s = z.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample();
  Tensor h(s);
  for (std::size_t c = 0; c < s.c; ++c) {
    const double inv_std = 1.0 / std::sqrt(running_var[c] + kBnEps);
    for (std::size_t n = 0; n < s.n; ++n)
      for (std::size_t q = 0; q < spatial; ++q) {
        const std::size_t i = n * per + c * spatial + q;
        h.v[i] = gamma.value[c] * (z.v[i] - running_mean[c]) * inv_std + beta.value[c];
      }
  }
  return h;
}

Tensor batch_norm_backward(Emulated& e, const Tensor& dy, const BatchNormSaved& saved, Param& gamma, Param& beta) {
  emu::Context& ctx = e.ctx;
  const Shape& s = dy.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample(), count = s.n * spatial;
  const double batch_size = static_cast<double>(count);
  const emu::Format& bn = e.formats.bn_bwd;
  Tensor dz(s);
  std::vector<double> dxhat(count);
  auto at = [&](std::size_t c, std::size_t m) { return m / spatial * per + c * spatial + m % spatial; };
  for (std::size_t c = 0; c < s.c; ++c) {
    double dgamma = 0.0, dbeta = 0.0, sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::size_t m = 0; m < count; ++m) {
      const std::size_t i = at(c, m);
      set_element(e, s, i);
      dgamma = ctx.fma(bn, dy.v[i], saved.xhat[i], dgamma);
      dbeta = ctx.add(bn, dbeta, dy.v[i]);
      dxhat[m] = ctx.mul(bn, dy.v[i], gamma.value[c]);
      sum_dxhat = ctx.add(bn, sum_dxhat, dxhat[m]);
      sum_dxhat_xhat = ctx.fma(bn, dxhat[m], saved.xhat[i], sum_dxhat_xhat);
    }
    gamma.grad[c] = dgamma;
    beta.grad[c] = dbeta;
    set_channel(ctx, c);
    const double mean_dxhat = ctx.div(bn, sum_dxhat, batch_size);
    const double mean_dxhat_xhat = ctx.div(bn, sum_dxhat_xhat, batch_size);
    // dz = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    for (std::size_t m = 0; m < count; ++m) {
      const std::size_t i = at(c, m);
      set_element(e, s, i);
      const double centred =
          ctx.sub(bn, ctx.sub(bn, dxhat[m], mean_dxhat), ctx.mul(bn, saved.xhat[i], mean_dxhat_xhat));
      dz.v[i] = ctx.mul(e.formats.grad, saved.inv_std[c], centred);
    }
  }
  ctx.clear_element();
  return dz;
}

// ---- Exact elementwise layers ------------------------------------------------------------

Tensor relu(const Tensor& x) {
  Tensor y(x.shape);
  for (std::size_t i = 0; i < x.v.size(); ++i) y.v[i] = x.v[i] > 0 || std::isnan(x.v[i]) ? x.v[i] : 0.0;
  return y;
}

Tensor relu_backward(const Tensor& out, Tensor dy) {
  for (std::size_t i = 0; i < dy.v.size(); ++i)
    if (!(out.v[i] > 0)) dy.v[i] = 0.0;
  return dy;
}

Tensor max_pool(const Tensor& x, std::vector<std::uint32_t>* argmax) {
  const Shape& s = x.shape;
  const Shape ys{s.n, s.c, s.h / 2, s.w / 2};
  if (ys.h == 0 || ys.w == 0)
    throw std::invalid_argument("2x2 max pooling needs an input of at least 2x2, not " + std::to_string(s.h) + "x" +
                                std::to_string(s.w));
  Tensor y(ys);
  if (argmax) argmax->resize(ys.size());
  for (std::size_t p = 0; p < s.n * s.c; ++p)
    for (std::size_t oy = 0; oy < ys.h; ++oy)
      for (std::size_t ox = 0; ox < ys.w; ++ox) {
        std::size_t best = (p * s.h + 2 * oy) * s.w + 2 * ox;
        for (std::size_t dy = 0; dy < 2; ++dy)
          for (std::size_t dx = 0; dx < 2; ++dx) {
            const std::size_t i = (p * s.h + 2 * oy + dy) * s.w + 2 * ox + dx;
            if (std::isnan(x.v[best])) continue;
            if (std::isnan(x.v[i]) || x.v[i] > x.v[best]) best = i;
          }
        const std::size_t o = (p * ys.h + oy) * ys.w + ox;
        y.v[o] = x.v[best];
        if (argmax) (*argmax)[o] = static_cast<std::uint32_t>(best);
      }
  return y;
}

Tensor max_pool_backward(const Tensor& dy, const std::vector<std::uint32_t>& argmax, const Shape& x_shape) {
  Tensor dx(x_shape);
  for (std::size_t o = 0; o < dy.v.size(); ++o) dx.v[argmax[o]] = dy.v[o];  // windows do not overlap
  return dx;
}

// ---- Global average pooling and residual addition ----------------------------------------

Tensor global_avg_pool(Emulated& e, const Tensor& x) {
  emu::Context& ctx = e.ctx;
  const Shape& s = x.shape;
  const Shape ys{s.n, s.c, 1, 1};
  const double positions = static_cast<double>(s.spatial());
  Tensor y(ys);
  for (std::size_t p = 0; p < s.n * s.c; ++p) {
    set_element(e, ys, p);
    double sum = 0.0;
    for (std::size_t q = 0; q < s.spatial(); ++q) sum = ctx.add(e.formats.act, sum, x.v[p * s.spatial() + q]);
    y.v[p] = ctx.div(e.formats.act, sum, positions);
  }
  ctx.clear_element();
  return y;
}

Tensor global_avg_pool(Fp64, const Tensor& x) {
  const Shape& s = x.shape;
  Tensor y(Shape{s.n, s.c, 1, 1});
  for (std::size_t p = 0; p < s.n * s.c; ++p) {
    double sum = 0.0;
    for (std::size_t q = 0; q < s.spatial(); ++q) sum += x.v[p * s.spatial() + q];
    y.v[p] = sum / static_cast<double>(s.spatial());
  }
  return y;
}

Tensor global_avg_pool_backward(Emulated& e, const Tensor& dy, const Shape& x_shape) {
  emu::Context& ctx = e.ctx;
  Tensor dx(x_shape);
  const std::size_t spatial = x_shape.spatial();
  for (std::size_t p = 0; p < dy.v.size(); ++p) {
    set_element(e, dy.shape, p);
    const double g = ctx.div(e.formats.grad, dy.v[p], static_cast<double>(spatial));
    std::fill_n(dx.v.begin() + static_cast<std::ptrdiff_t>(p * spatial), spatial, g);
  }
  ctx.clear_element();
  return dx;
}

Tensor add(Emulated& e, const Tensor& a, const Tensor& b, const emu::Format& f) {
  Tensor y(a.shape);
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    set_element(e, a.shape, i);
    y.v[i] = e.ctx.add(f, a.v[i], b.v[i]);
  }
  e.ctx.clear_element();
  return y;
}

Tensor add(Fp64, const Tensor& a, const Tensor& b) {
  Tensor y(a.shape);
  for (std::size_t i = 0; i < a.v.size(); ++i) y.v[i] = a.v[i] + b.v[i];
  return y;
}

// ---- Loss ------------------------------------------------------------------------------------

SoftmaxTerms softmax_terms(emu::Context& ctx, const emu::Format& lf, const double* logits, std::size_t classes,
                           int label, std::vector<double>& e, std::size_t sample) {
  const Shape per_class{sample + 1, classes, 1, 1};
  double max = logits[0];
  for (std::size_t j = 1; j < classes; ++j) max = std::max(max, logits[j]);
  e.resize(classes);
  double sum = 0.0;
  for (std::size_t j = 0; j < classes; ++j) {
    set_element(ctx, per_class, sample * classes + j);
    e[j] = ctx.convert(lf, std::exp(ctx.sub(lf, logits[j], max)));
    sum = ctx.add(lf, sum, e[j]);
  }
  set_channel(ctx, sample);
  const double lse = ctx.add(lf, max, ctx.convert(lf, std::log(sum)));
  return {ctx.sub(lf, lse, logits[label]), sum};
}

double softmax_cross_entropy(emu::Context& ctx, const ModelFormats& f, const std::vector<double>& logits,
                             const std::vector<int>& labels, std::size_t classes, double loss_scale,
                             std::vector<double>& dz) {
  const std::size_t batch = labels.size();
  const double batch_size = static_cast<double>(batch);
  const Shape shape{batch, classes, 1, 1};
  const emu::Format& lf = f.loss;
  const double scale_over_batch = round_constant(lf, loss_scale / batch_size);
  dz.resize(batch * classes);
  double loss_sum = 0.0;
  std::vector<double> e;
  for (std::size_t i = 0; i < batch; ++i) {
    const SoftmaxTerms t = softmax_terms(ctx, lf, &logits[i * classes], classes, labels[i], e, i);
    loss_sum = ctx.add(lf, loss_sum, t.loss);
    for (std::size_t j = 0; j < classes; ++j) {
      set_element(ctx, shape, i * classes + j);
      const double p = ctx.div(lf, e[j], t.sum);
      const double d = ctx.sub(lf, p, static_cast<int>(j) == labels[i] ? 1.0 : 0.0);
      dz[i * classes + j] = ctx.convert(f.grad, ctx.mul(lf, d, scale_over_batch));
    }
  }
  ctx.clear_element();
  return ctx.div(lf, loss_sum, batch_size);
}

}  // namespace roundoff::train
