#include "layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>

#include <malloc.h>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "emu/nearest.hpp"

namespace roundoff::train {

using emu::Double4, emu::load4, emu::store4;

namespace {

// A training step allocates and frees tensors of megabytes by the dozen; glibc hands
// blocks that large back to the kernel (mmap, and trimming the heap's top), so every
// step faults the same memory in again, page by page: a fifth of a convolutional
// model's step on a virtual machine. Freed memory is kept for reuse instead (the
// largest threshold glibc takes: blocks above 32 MiB are still mapped alone).
const bool kKeepFreedMemory = [] {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return true;
}();

}  // namespace

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

namespace {

// Value `flat` of a tensor of shape s whose first sample is sample first_sample of its set.
void set_element(emu::Context& ctx, std::size_t first_sample, const Shape& s, std::size_t flat) {
  if (first_sample == 0) return set_element(ctx, s, flat);
  set_element(ctx, Shape{s.n + first_sample, s.c, s.h, s.w}, flat + first_sample * s.per_sample());
}

}  // namespace

void set_element(const Emulated& e, const Shape& s, std::size_t flat) { set_element(e.ctx, e.first_sample, s, flat); }

namespace {

void set_channel(emu::Context& ctx, std::size_t c) {
  const auto index = static_cast<std::int64_t>(c);
  ctx.set_element(index, {index});
}

// Whether rounding v into f is exact and raises nothing: a finite value of f. Tensors
// handed from layer to layer are mostly such values already (an activation in fp16 going
// into an fp16 unit), and skipping their conversion keeps results and flags unchanged.
bool finite_value_of(const emu::Format& f, double v) { return std::isfinite(v) && f.representable(v); }

// The arithmetic of the layers' loops in two forms with one interface, so that each
// loop is written once. ContextOps: every operation through the context, with the
// element of its flags set. FastOps, where emu::NearestOps applies: its inline
// round-to-nearest, whose INEXACT and UFLO are neither counted nor trapped and need no
// element; an operation it refuses goes through the context, after the flags raised so
// far and with the element set as ContextOps would have set it. Counted and trapped
// flags come only from those operations, in program order, so results, flags, counts
// and trap reports are ContextOps's.
class ContextOps {
 public:
  static constexpr bool kFast = false;
  ContextOps(emu::Context& ctx, std::size_t first_sample) : ctx_(ctx), first_sample_(first_sample) {}
  // The element of the flags raised next: value `flat` of a tensor of shape s (samples
  // counted from first_sample), a channel, a flat index; clear(): none.
  void element(const Shape& s, std::size_t flat) { set_element(ctx_, first_sample_, s, flat); }
  void channel(std::size_t c) { set_channel(ctx_, c); }
  void flat(std::size_t i) { ctx_.set_element(static_cast<std::int64_t>(i)); }
  void clear() { ctx_.clear_element(); }
  double add(const emu::Format& f, double a, double b) { return ctx_.add(f, a, b); }
  double sub(const emu::Format& f, double a, double b) { return ctx_.sub(f, a, b); }
  double mul(const emu::Format& f, double a, double b) { return ctx_.mul(f, a, b); }
  double div(const emu::Format& f, double a, double b) { return ctx_.div(f, a, b); }
  double fma(const emu::Format& f, double a, double b, double c) { return ctx_.fma(f, a, b, c); }
  double sqrt(const emu::Format& f, double a) { return ctx_.sqrt(f, a); }
  double convert(const emu::Format& f, double a) { return ctx_.convert(f, a); }
  template <class Group>
  bool vectorised(const Group&) {
    return false;
  }

 private:
  emu::Context& ctx_;
  std::size_t first_sample_;
};

class FastOps {
 public:
  static constexpr bool kFast = true;
  FastOps(emu::Context& ctx, std::size_t first_sample) : context_(ctx, first_sample), ctx_(ctx) {}
  FastOps(const FastOps&) = delete;
  FastOps& operator=(const FastOps&) = delete;
  ~FastOps() { nearest_.commit(ctx_); }
  // The element is set in the context only for an operation that goes through it.
  void element(const Shape& s, std::size_t flat) { pending_ = {Pending::element, &s, flat}; }
  void channel(std::size_t c) { pending_ = {Pending::channel, nullptr, c}; }
  void flat(std::size_t i) { pending_ = {Pending::flat, nullptr, i}; }
  void clear() {
    pending_.kind = Pending::none;
    ctx_.clear_element();
  }
  double add(const emu::Format& f, double a, double b) {
    double r;
    return nearest_.add(f, a, b, r) ? r : context().add(f, a, b);
  }
  double sub(const emu::Format& f, double a, double b) {
    double r;
    return nearest_.sub(f, a, b, r) ? r : context().sub(f, a, b);
  }
  double mul(const emu::Format& f, double a, double b) {
    double r;
    return nearest_.mul(f, a, b, r) ? r : context().mul(f, a, b);
  }
  double div(const emu::Format& f, double a, double b) {
    double r;
    return nearest_.div(f, a, b, r) ? r : context().div(f, a, b);
  }
  double fma(const emu::Format& f, double a, double b, double c) {
    double r;
    return nearest_.fma(f, a, b, c, r) ? r : context().fma(f, a, b, c);
  }
  double sqrt(const emu::Format& f, double a) {
    double r;
    return nearest_.sqrt(f, a, r) ? r : context().sqrt(f, a);
  }
  double convert(const emu::Format& f, double a) {
    double r;
    return nearest_.convert(f, a, r) ? r : context().convert(f, a);
  }
  // A group of emu::NearestOps::fma4 calls (group(fma4) returns whether every call
  // answered): true where all did; else false with their flags taken back, and the
  // caller runs the group's operations one by one, in order.
  template <class Group>
  bool vectorised(const Group& group) {
    const emu::Flags before = nearest_.flags();
    auto fma4 = [&](const emu::Format& f, Double4 a, Double4 b, Double4 c, Double4& r) {
      return nearest_.fma4(f, a, b, c, r);
    };
    if (group(fma4)) return true;
    nearest_.restore(before);
    return false;
  }

 private:
  // The element set last, and whether the context has it.
  struct Pending {
    enum Kind { none, element, channel, flat } kind = none;
    const Shape* shape = nullptr;
    std::size_t index = 0;
  };

  // The context for a refused operation: the flags so far raised, the element set.
  [[gnu::noinline]] ContextOps& context() {
    nearest_.commit(ctx_);
    switch (pending_.kind) {
      case Pending::none: break;
      case Pending::element: context_.element(*pending_.shape, pending_.index); break;
      case Pending::channel: context_.channel(pending_.index); break;
      case Pending::flat: context_.flat(pending_.index); break;
    }
    pending_.kind = Pending::none;  // set: the element's next refused operations share it
    return context_;
  }

  emu::NearestOps nearest_;
  ContextOps context_;
  emu::Context& ctx_;
  Pending pending_;
};

// Runs body(ops) with FastOps where emu::NearestOps applies, else with ContextOps.
template <class Body>
void with_ops(emu::Context& ctx, std::size_t first_sample, const Body& body) {
  if (emu::NearestOps::applies(ctx)) {
    FastOps fast(ctx, first_sample);
    body(fast);
  } else {
    ContextOps slow(ctx, first_sample);
    body(slow);
  }
}
template <class Body>
void with_ops(const Emulated& e, const Body& body) {
  with_ops(e.ctx, e.first_sample, body);
}

// Rounds every value of v into f in place, values of f left as they are (elements of
// shape s when given, else flat indices; none with no_elements).
void convert_all(emu::Context& ctx, std::size_t first_sample, const emu::Format& f, std::span<double> v,
                 const Shape* s = nullptr, bool no_elements = false) {
  with_ops(ctx, first_sample, [&](auto& ops) {
    constexpr bool fast = std::remove_reference_t<decltype(ops)>::kFast;
    // FastOps skip the values of f by whole vectors where they can, and give back the
    // others of them as they are, with nothing raised.
    const std::size_t n = v.size();
    for (std::size_t i = fast ? emu::NearestOps::first_not_value(f, v.data(), 0, n) : 0; i < n;
         i = fast ? emu::NearestOps::first_not_value(f, v.data(), i + 1, n) : i + 1) {
      if (!fast && finite_value_of(f, v[i])) continue;
      if (no_elements) {
      } else if (s) {
        ops.element(*s, i);
      } else {
        ops.flat(i);
      }
      v[i] = ops.convert(f, v[i]);
    }
    if (!no_elements) ops.clear();
  });
}

// Every value rounded into f (elements of shape s when given, else flat indices).
std::vector<double> converted(const Emulated& e, const emu::Format& f, std::vector<double> v,
                              const Shape* s = nullptr) {
  convert_all(e.ctx, e.first_sample, f, v, s);
  return v;
}

Double4 splat(double x) { return Double4{x, x, x, x}; }

// A buffer of at least n doubles (contents unspecified) kept by the calling thread, one
// per slot: the layers' large temporaries, which a training step would otherwise
// allocate, and fault in as fresh pages, thousands of times. A slot serves one use at
// a time.
enum class Scratch { col, out, patches, rows, dxhat, count };
std::vector<double>& scratch(Scratch slot, std::size_t n) {
  static thread_local std::array<std::vector<double>, static_cast<std::size_t>(Scratch::count)> buffers;
  std::vector<double>& b = buffers[static_cast<std::size_t>(slot)];
  if (b.size() < n) b.resize(n);
  return b;
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

// Runs body(item, context) for every item in [0, n), in parallel on copies of ctx whose
// status and counts are merged back in item order (Context::absorb), so that the
// result is that of running the items in order on ctx itself. Stochastic rounding needs
// its random bits in order and a trap must stop at the first trapping operation: then
// the items run in order on ctx. Items must write disjoint outputs.
template <class Body>
void for_each_item(emu::Context& ctx, std::size_t n, const Body& body) {
  if (n < 2 || ctx.control.traps != 0 || ctx.control.effective_rounding() == emu::Rounding::sr) {
    for (std::size_t i = 0; i < n; ++i) body(i, ctx);
    return;
  }
  std::vector<emu::Context> parts(n, ctx);
  // Isolated: a thread waiting here takes only these items, never an outer task (another
  // sweep point's training), which would reuse this thread's scratch buffers mid-layer.
  tbb::this_task_arena::isolate([&] {
    tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) {
      parts[i].clear_status();
      parts[i].clear_counts();
      body(i, parts[i]);
    });
  });
  for (const emu::Context& part : parts) ctx.absorb(part);
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
  convert_all(ctx, 0, in, a, nullptr, true);
  convert_all(ctx, 0, in, b, nullptr, true);
  const emu::Format& unit_out = unit.output_format();
  c.resize(m * n);
  convert_all(ctx, 0, unit_out, c, nullptr, true);
  unit.gemm(ctx, m, n, k, a.data(), k, b.data(), n, c.data(), n);
  if (!(unit_out == out)) convert_all(ctx, 0, out, c, nullptr, true);
}

Tensor conv2d(Emulated& e, const Tensor& x, const std::vector<double>& w, const ConvGeometry& g,
              const emu::Format& out) {
  emu::Context& ctx = e.ctx;
  const Shape ys = conv_output(x.shape, g);
  const emu::Format& in = e.unit.input_format();
  Tensor xi(x.shape);
  xi.v = converted(e, in, x.v, &x.shape);
  const std::vector<double> wi = converted(e, in, w);
  Tensor y(ys);
  const emu::Format& unit_out = e.unit.output_format();
  const std::size_t per_in = x.shape.per_sample(), per_out = ys.per_sample();
  // One image per item (images are independent; the unit computes them in order).
  if (is_amp(e.unit)) {
    const auto partials = e.unit.kind() == emu::UnitKind::ipu_amp_half ? emu::PartialsType::half
                                                                        : emu::PartialsType::float32;
    const emu::AmpConfig cfg = emu::amp_config(partials, in, unit_out);
    const emu::Conv2dShape one = conv_shape(Shape{1, x.shape.c, x.shape.h, x.shape.w}, g);
    for_each_item(ctx, x.shape.n, [&](std::size_t n, emu::Context& c) {
      const std::span<const double> image(xi.v.data() + n * per_in, per_in);
      const std::vector<double> out_n = emu::amp_conv2d(c, cfg, one, image, wi);
      std::copy(out_n.begin(), out_n.end(), y.v.begin() + static_cast<std::ptrdiff_t>(n * per_out));
    });
  } else {
    const std::size_t kd = x.shape.c * g.kernel * g.kernel, positions = ys.spatial(), o_count = ys.c;
    const std::vector<double> wt = transpose(wi, o_count, kd);  // kd x O
    for_each_item(ctx, x.shape.n, [&](std::size_t n, emu::Context& c) {
      double* col = scratch(Scratch::col, positions * kd).data();
      double* out_n = scratch(Scratch::out, positions * o_count).data();
      std::fill_n(out_n, positions * o_count, 0.0);
      im2col(xi, n, g, ys.h, ys.w, col);
      e.unit.gemm(c, positions, o_count, kd, col, kd, wt.data(), o_count, out_n, o_count);
      for (std::size_t o = 0; o < o_count; ++o)
        for (std::size_t q = 0; q < positions; ++q) y.v[(n * o_count + o) * positions + q] = out_n[q * o_count + o];
    });
  }
  if (!(unit_out == out)) convert_all(e.ctx, e.first_sample, out, y.v, &ys);
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
  const std::span<double> patches_t(scratch(Scratch::patches, kd * m).data(), kd * m);
  const std::span<double> dy_rows(scratch(Scratch::rows, m * o_count).data(), m * o_count);
  double* col = scratch(Scratch::col, positions * kd).data();
  for (std::size_t n = 0; n < x.shape.n; ++n) {
    im2col(x, n, g, dy.shape.h, dy.shape.w, col);
    for (std::size_t q = 0; q < positions; ++q)
      for (std::size_t r = 0; r < kd; ++r) patches_t[r * m + n * positions + q] = col[q * kd + r];
    for (std::size_t o = 0; o < o_count; ++o)
      for (std::size_t q = 0; q < positions; ++q)
        dy_rows[(n * positions + q) * o_count + o] = dy.v[(n * o_count + o) * positions + q];
  }
  // In row blocks, each one gemm through the unit (rows are independent). Where counts or
  // traps can show the elements the unit reports (relative to its gemm), the blocks are
  // of kGradientRows rows, whatever the threads; otherwise one block per thread, since
  // every element and the set of flags are the same however the rows are cut, and each
  // gemm packs all of dy.
  constexpr std::size_t kGradientRows = 16;
  const bool elements_show = e.ctx.control.counted != 0 || e.ctx.control.traps != 0;
  const auto threads = static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency()));
  const std::size_t block_rows = elements_show ? kGradientRows : (kd + threads - 1) / threads;
  const emu::Format& in = e.unit.input_format();
  convert_all(e.ctx, e.first_sample, in, patches_t);
  convert_all(e.ctx, e.first_sample, in, dy_rows);
  std::vector<double> dw_t(kd * o_count, 0.0);
  for_each_item(e.ctx, (kd + block_rows - 1) / block_rows, [&](std::size_t block, emu::Context& c) {
    const std::size_t first = block * block_rows, rows = std::min(block_rows, kd - first);
    e.unit.gemm(c, rows, o_count, m, patches_t.data() + first * m, m, dy_rows.data(), o_count,
                dw_t.data() + first * o_count, o_count);
  });
  if (!(e.unit.output_format() == e.formats.grad)) convert_all(e.ctx, e.first_sample, e.formats.grad, dw_t);
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
  const Shape& s = z.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample();
  const double count = static_cast<double>(s.n * spatial);
  const emu::Format& bn = e.formats.bn_fwd;
  saved.xhat.resize(z.v.size());
  saved.inv_std.resize(s.c);
  Tensor h(s);
  // One channel per item: channels are independent.
  for_each_item(e.ctx, s.c, [&](std::size_t c, emu::Context& ctx) {
    const double old_mean = running_mean[c], old_var = running_var[c];
    with_ops(ctx, e.first_sample, [&](auto& ops) {
      ops.channel(c);
      double sum = 0.0;
      for (std::size_t n = 0; n < s.n; ++n)
        for (std::size_t q = 0; q < spatial; ++q) sum = ops.add(bn, sum, z.v[n * per + c * spatial + q]);
      const double mean = ops.div(bn, sum, count);
      double squares = 0.0;
      for (std::size_t n = 0; n < s.n; ++n)
        for (std::size_t q = 0; q < spatial; ++q) {
          const double d = ops.sub(bn, z.v[n * per + c * spatial + q], mean);
          squares = ops.fma(bn, d, d, squares);
        }
      const double var = ops.div(bn, squares, count);
      const double inv_std = ops.div(bn, 1.0, ops.sqrt(bn, ops.add(bn, var, k.eps)));
      saved.inv_std[c] = inv_std;
      const double unbiased = count > 1 ? ops.div(bn, squares, count - 1.0) : var;
      running_mean[c] = ops.fma(bn, k.one_minus_momentum, old_mean, ops.mul(bn, k.momentum, mean));
      running_var[c] = ops.fma(bn, k.one_minus_momentum, old_var, ops.mul(bn, k.momentum, unbiased));
      // xhat = (z - mean) inv_std and h = gamma xhat + beta, four elements at a time
      // where they can be.
      auto element = [&](std::size_t i) {
        ops.element(s, i);
        saved.xhat[i] = ops.mul(bn, ops.sub(bn, z.v[i], mean), inv_std);
        h.v[i] = ops.fma(e.formats.act, gamma.value[c], saved.xhat[i], beta.value[c]);
      };
      const Double4 means = splat(mean), inv_stds = splat(inv_std), gammas = splat(gamma.value[c]);
      const Double4 betas = splat(beta.value[c]), minus_ones = splat(-1.0), minus_zeros = splat(-0.0);
      for (std::size_t n = 0; n < s.n; ++n) {
        std::size_t q = 0;
        for (; q + 4 <= spatial; q += 4) {
          const std::size_t i = n * per + c * spatial + q;
          Double4 xhat, h4;
          if (ops.vectorised([&](auto fma4) {
                Double4 centred;
                return fma4(bn, means, minus_ones, load4(&z.v[i]), centred) &&
                       fma4(bn, centred, inv_stds, minus_zeros, xhat) && fma4(e.formats.act, gammas, xhat, betas, h4);
              })) {
            store4(xhat, &saved.xhat[i]);
            store4(h4, &h.v[i]);
            continue;
          }
          for (std::size_t j = 0; j < 4; ++j) element(i + j);
        }
        for (; q < spatial; ++q) element(n * per + c * spatial + q);
      }
      ops.clear();
    });
  });
  return h;
}

Tensor batch_norm_infer(Emulated& e, const Tensor& z, const Param& gamma, const Param& beta,
                        const std::vector<double>& running_mean, const std::vector<double>& running_var,
                        const BatchNormConstants& k) {
  const Shape& s = z.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample();
  const emu::Format& bn = e.formats.bn_fwd;
  Tensor h(s);
  for_each_item(e.ctx, s.c, [&](std::size_t c, emu::Context& ctx) {
    with_ops(ctx, e.first_sample, [&](auto& ops) {
      ops.channel(c);
      const double inv_std = ops.div(bn, 1.0, ops.sqrt(bn, ops.add(bn, running_var[c], k.eps)));
      for (std::size_t n = 0; n < s.n; ++n)
        for (std::size_t q = 0; q < spatial; ++q) {
          const std::size_t i = n * per + c * spatial + q;
          ops.element(s, i);
          const double xhat = ops.mul(bn, ops.sub(bn, z.v[i], running_mean[c]), inv_std);
          h.v[i] = ops.fma(e.formats.act, gamma.value[c], xhat, beta.value[c]);
        }
      ops.clear();
    });
  });
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
  const Shape& s = dy.shape;
  const std::size_t spatial = s.spatial(), per = s.per_sample(), count = s.n * spatial;
  const double batch_size = static_cast<double>(count);
  const emu::Format& bn = e.formats.bn_bwd;
  Tensor dz(s);
  for_each_item(e.ctx, s.c, [&](std::size_t c, emu::Context& ctx) {
    double* dxhat = scratch(Scratch::dxhat, count).data();  // [m], m = n spatial + q
    with_ops(ctx, e.first_sample, [&](auto& ops) {
      // The four sums of a channel as the lanes of one fma per element:
      // [dgamma, dbeta, sum_dxhat, sum_dxhat_xhat] += [dy, dy, dxhat, dxhat] * [xhat, 1, 1, xhat],
      // four elements at a time after their dxhat = dy gamma; where a group cannot be
      // taken so, its elements' operations one by one, in the order below.
      Double4 sums = {0.0, 0.0, 0.0, 0.0};
      const Double4 gammas = splat(gamma.value[c]), minus_zeros = splat(-0.0);
      auto sums_element = [&](std::size_t i, std::size_t m) {
        ops.element(s, i);
        sums[0] = ops.fma(bn, dy.v[i], saved.xhat[i], sums[0]);
        sums[1] = ops.add(bn, sums[1], dy.v[i]);
        dxhat[m] = ops.mul(bn, dy.v[i], gamma.value[c]);
        sums[2] = ops.add(bn, sums[2], dxhat[m]);
        sums[3] = ops.fma(bn, dxhat[m], saved.xhat[i], sums[3]);
      };
      for (std::size_t n = 0, m = 0; n < s.n; ++n) {
        std::size_t q = 0;
        for (; q + 4 <= spatial; q += 4, m += 4) {
          const std::size_t i = n * per + c * spatial + q;
          Double4 group_sums = sums, dxhats;
          if (ops.vectorised([&](auto fma4) {
                if (!fma4(bn, load4(&dy.v[i]), gammas, minus_zeros, dxhats)) return false;
                for (std::size_t j = 0; j < 4; ++j) {
                  const double g = dy.v[i + j], xhat = saved.xhat[i + j], d = dxhats[j];
                  if (!fma4(bn, Double4{g, g, d, d}, Double4{xhat, 1.0, 1.0, xhat}, group_sums, group_sums))
                    return false;
                }
                return true;
              })) {
            store4(dxhats, dxhat + m);
            sums = group_sums;
            continue;
          }
          for (std::size_t j = 0; j < 4; ++j) sums_element(i + j, m + j);
        }
        for (; q < spatial; ++q, ++m) sums_element(n * per + c * spatial + q, m);
      }
      gamma.grad[c] = sums[0];
      beta.grad[c] = sums[1];
      ops.channel(c);
      const double mean_dxhat = ops.div(bn, sums[2], batch_size);
      const double mean_dxhat_xhat = ops.div(bn, sums[3], batch_size);
      // dz = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), four elements
      // at a time where they can be.
      const double inv_std = saved.inv_std[c];
      const Double4 means = splat(mean_dxhat), means_xhat = splat(mean_dxhat_xhat), inv_stds = splat(inv_std);
      const Double4 minus_ones = splat(-1.0), minus_zeros4 = splat(-0.0);
      auto dz_element = [&](std::size_t i, std::size_t m) {
        ops.element(s, i);
        const double centred =
            ops.sub(bn, ops.sub(bn, dxhat[m], mean_dxhat), ops.mul(bn, saved.xhat[i], mean_dxhat_xhat));
        dz.v[i] = ops.mul(e.formats.grad, inv_std, centred);
      };
      for (std::size_t n = 0, m = 0; n < s.n; ++n) {
        std::size_t q = 0;
        for (; q + 4 <= spatial; q += 4, m += 4) {
          const std::size_t i = n * per + c * spatial + q;
          Double4 dz4;
          if (ops.vectorised([&](auto fma4) {
                // sub(dxhat, mean), mul(xhat, mean_xhat), their difference, times inv_std.
                Double4 centred_part, scaled_xhat, centred;
                return fma4(bn, means, minus_ones, load4(dxhat + m), centred_part) &&
                       fma4(bn, load4(&saved.xhat[i]), means_xhat, minus_zeros4, scaled_xhat) &&
                       fma4(bn, scaled_xhat, minus_ones, centred_part, centred) &&
                       fma4(e.formats.grad, inv_stds, centred, minus_zeros4, dz4);
              })) {
            store4(dz4, &dz.v[i]);
            continue;
          }
          for (std::size_t j = 0; j < 4; ++j) dz_element(n * per + c * spatial + q + j, m + j);
        }
        for (; q < spatial; ++q, ++m) dz_element(n * per + c * spatial + q, m);
      }
      ops.clear();
    });
  });
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
  const Shape& s = x.shape;
  const Shape ys{s.n, s.c, 1, 1};
  const double positions = static_cast<double>(s.spatial());
  Tensor y(ys);
  with_ops(e, [&](auto& ops) {
    for (std::size_t p = 0; p < s.n * s.c; ++p) {
      ops.element(ys, p);
      double sum = 0.0;
      for (std::size_t q = 0; q < s.spatial(); ++q) sum = ops.add(e.formats.act, sum, x.v[p * s.spatial() + q]);
      y.v[p] = ops.div(e.formats.act, sum, positions);
    }
    ops.clear();
  });
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
  Tensor dx(x_shape);
  const std::size_t spatial = x_shape.spatial();
  with_ops(e, [&](auto& ops) {
    for (std::size_t p = 0; p < dy.v.size(); ++p) {
      ops.element(dy.shape, p);
      const double g = ops.div(e.formats.grad, dy.v[p], static_cast<double>(spatial));
      std::fill_n(dx.v.begin() + static_cast<std::ptrdiff_t>(p * spatial), spatial, g);
    }
    ops.clear();
  });
  return dx;
}

Tensor add(Emulated& e, const Tensor& a, const Tensor& b, const emu::Format& f) {
  Tensor y(a.shape);
  with_ops(e, [&](auto& ops) {
    for (std::size_t i = 0; i < a.v.size(); ++i) {
      ops.element(a.shape, i);
      y.v[i] = ops.add(f, a.v[i], b.v[i]);
    }
    ops.clear();
  });
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
