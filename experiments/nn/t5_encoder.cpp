#include "t5_encoder.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "emu/exact_sum.hpp"
#include "emu/round.hpp"

namespace roundoff::t5 {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kOpScopes[kOps] = {
    "attn.norm", "attn.q",  "attn.k",   "attn.v",   "attn.scores", "attn.mask_add",   "attn.softmax",
    "attn.context", "attn.o", "attn.residual_add", "ffn.norm", "ffn.wi_0", "ffn.wi_1", "ffn.gelu",
    "ffn.gate_mul", "ffn.wo", "ffn.residual_add", "final_norm",
};
constexpr double kNormEps = 1e-6;                    // T5's layer_norm_epsilon
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi), gelu_new's factor
constexpr double kGeluCubic = 0.044715;              // gelu_new's cubic coefficient
// synthetic_weights' streams: matrix m of block b (q k v o wi_0 wi_1 wo: m = 0..6) on
// lane kFirstBlockLane + kLanesPerBlock b + m, the inputs on lane 1.
constexpr int kLanesPerBlock = 16;
constexpr int kFirstBlockLane = 16;

// A constant of the model (eps, gelu_new's coefficients) as a value of f: rounded once
// (rne, saturating) outside any context, so that it raises no flag of the run.
double constant(const emu::Format& f, double v) {
  emu::Flags ignored = 0;
  return emu::round(f, emu::Exact{v}, emu::RoundSpec{emu::Rounding::rne, emu::Overflow::saturate}, nullptr, ignored);
}

// The double-precision libm value of exp or tanh, rounded once into f under ctx. Beyond
// double's range the result is marked as such (an overflow, not an infinite operand). A
// zero from a non-zero x is exp's underflow in double: a positive value below every
// format's smallest subnormal, for which denorm_min stands (tanh is zero only at zero).
double rounded_libm(emu::Context& ctx, const emu::Format& f, const char* op, double x, double value) {
  if (std::isnan(x)) return x;  // a quiet NaN propagates without a flag
  const bool finite_x = std::isfinite(x);
  if (finite_x && x != 0 && value == 0) value = std::numeric_limits<double>::denorm_min();
  return ctx.round(f, emu::Exact{value, 0.0, finite_x && std::isinf(value)}, op, {x});
}

double exp_in(emu::Context& ctx, const emu::Format& f, double x) { return rounded_libm(ctx, f, "exp", x, std::exp(x)); }
double tanh_in(emu::Context& ctx, const emu::Format& f, double x) {
  return rounded_libm(ctx, f, "tanh", x, std::tanh(x));
}

// x^3 rounded once into f (op "pow", operands x and 3): x * x is exact in double for
// x of a format with at most 26 significant bits, and the long accumulator takes the
// product with x exactly.
double cube(emu::Context& ctx, const emu::Format& f, double x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return ctx.round(f, emu::Exact{x}, "pow", {x, 3.0});  // an exact infinity
  emu::ExactSum sum;
  sum.add_product(x * x, x);
  return ctx.round(f, sum.value(), "pow", {x, 3.0});
}

// NaN if any value is NaN, else the largest (no flag: a max is not an arithmetic op).
double max_of(const double* v, std::size_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) return v[i];
    m = std::max(m, v[i]);
  }
  return m;
}

// Sets the element of a tensor op to (i, j) or, for per-head tensors, (head, i, j) of
// an output of shape (heads,) m x n, for as long as it lives.
class At {
 public:
  At(emu::Context& ctx, int head, std::size_t m, std::size_t n, std::size_t i, std::size_t j) : ctx_(ctx) {
    const auto si = static_cast<std::int64_t>(i), sj = static_cast<std::int64_t>(j);
    if (head < 0) {
      ctx_.set_element(si * static_cast<std::int64_t>(n) + sj, {si, sj});
    } else {
      const auto flat = (static_cast<std::int64_t>(head) * static_cast<std::int64_t>(m) + si) *
                            static_cast<std::int64_t>(n) + sj;
      ctx_.set_element(flat, {head, si, sj});
    }
  }
  ~At() { ctx_.clear_element(); }
  At(const At&) = delete;
  At& operator=(const At&) = delete;

 private:
  emu::Context& ctx_;
};

// A strided matrix view: element (i, j) at data[i * row + j * col].
struct View {
  const double* data;
  std::size_t row, col;
};

class Forward {
 public:
  Forward(emu::Context& ctx, const Shape& shape, const Numerics& num, Stats& stats)
      : ctx_(ctx),
        shape_(shape),
        num_(num),
        stats_(stats),
        F_(num.format),
        R_(num.residual_fp32 ? emu::fp32() : num.format),
        convert_(!(num.unit->output_format() == num.format)),
        mask_(attention_mask_value(num.format, num.mask_scale)),
        clamp_(num.clamp_inf && R_ == F_ ? std::optional<double>(clamp_bound(num.format)) : std::nullopt),
        seq_(static_cast<std::size_t>(shape.seq)),
        d_(static_cast<std::size_t>(shape.d_model)),
        dff_(static_cast<std::size_t>(shape.d_ff)),
        inner_(static_cast<std::size_t>(shape.inner())),
        dkv_(static_cast<std::size_t>(shape.d_kv)) {}

  std::vector<double> run(const Weights& w, const std::function<void()>& between_blocks) {
    emu::Scope encoder(ctx_, "encoder");
    std::vector<double> h = w.input;  // values of F, exact in R
    for (std::size_t b = 0; b < w.blocks.size(); ++b) {
      if (between_blocks) between_blocks();
      emu::Scope block(ctx_, "block" + std::to_string(b));
      attention(h, w.blocks[b]);
      feed_forward(h, w.blocks[b]);
    }
    std::vector<double> out(seq_ * d_);
    emu::Scope scope(ctx_, op_scope(Op::final_norm));
    rms_norm(h, w.final_norm, out, stats(Op::final_norm));
    return out;
  }

 private:
  OpStats& stats(Op op) { return stats_[static_cast<int>(op)]; }

  // C (m x n) = A B through the unit, each result rounded into F where the unit writes
  // another format; recorded in `st` unless it is null.
  void matmul(int head, std::size_t m, std::size_t n, std::size_t k, View A, View B, double* C, std::size_t c_row,
              OpStats* st) {
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const At at(ctx_, head, m, n, i, j);
        double v = num_.unit->dot(ctx_, k, A.data + i * A.row, A.col, B.data + j * B.col, B.row, 0.0);
        if (convert_) v = ctx_.convert(F_, v);
        C[i * c_row + j] = v;
        if (st) st->add(v);
      }
  }

  // y (seq x n) = x (seq x k) W (k x n), row-major.
  void linear(Op op, const std::vector<double>& x, std::size_t k, const std::vector<double>& W, std::size_t n,
              std::vector<double>& y) {
    emu::Scope scope(ctx_, op_scope(op));
    y.assign(seq_ * n, 0.0);
    matmul(-1, seq_, n, k, {x.data(), k, 1}, {W.data(), n, 1}, y.data(), n, &stats(op));
  }

  // x = T5's RMS norm of h (rows of d), weight applied in F. The per-token steps (mean of
  // squares, eps, rsqrt) report the token alone as their element.
  void rms_norm(const std::vector<double>& h, const std::vector<double>& weight, std::vector<double>& x,
                OpStats& st) {
    const emu::Format& S = num_.norm_fp32 ? emu::fp32() : F_;
    const double eps = constant(S, kNormEps);
    x.assign(h.size(), 0.0);
    const std::size_t rows = h.size() / d_;
    for (std::size_t r = 0; r < rows; ++r) {
      const double* row = h.data() + r * d_;
      double sum_sq = 0;
      for (std::size_t c = 0; c < d_; ++c) {
        const At at(ctx_, -1, rows, d_, r, c);
        sum_sq = ctx_.add(S, sum_sq, ctx_.mul(S, row[c], row[c]));
      }
      double inv_rms = 0;
      {
        const emu::ElementGuard at(ctx_, static_cast<std::int64_t>(r), {static_cast<std::int64_t>(r)});
        const double mean_sq = ctx_.div(S, sum_sq, static_cast<double>(d_));
        inv_rms = ctx_.div(S, 1.0, ctx_.sqrt(S, ctx_.add(S, mean_sq, eps)));
      }
      for (std::size_t c = 0; c < d_; ++c) {
        const At at(ctx_, -1, rows, d_, r, c);
        double v = ctx_.mul(S, row[c], inv_rms);
        if (!(S == F_)) v = ctx_.convert(F_, v);
        v = ctx_.mul(F_, weight[c], v);
        x[r * d_ + c] = v;
        st.add(v);
      }
    }
  }

  // h = h + y in R (one rounding of the exact sum), then Hugging Face's clamp where it
  // applies: to a residual stream held in F (it clamps fp16 hidden states only).
  void residual_add(Op op, std::vector<double>& h, const std::vector<double>& y) {
    emu::Scope scope(ctx_, op_scope(op));
    for (std::size_t r = 0; r < seq_; ++r)
      for (std::size_t c = 0; c < d_; ++c) {
        const At at(ctx_, -1, seq_, d_, r, c);
        double v = ctx_.add(R_, h[r * d_ + c], y[r * d_ + c]);
        stats(op).add(v);
        if (clamp_ && !std::isnan(v)) v = std::clamp(v, -*clamp_, *clamp_);
        h[r * d_ + c] = v;
      }
  }

  void attention(std::vector<double>& h, const BlockWeights& w) {
    const auto heads = static_cast<std::size_t>(shape_.n_heads);
    std::vector<double> x;
    {
      emu::Scope scope(ctx_, op_scope(Op::attn_norm));
      rms_norm(h, w.attn_norm, x, stats(Op::attn_norm));
    }
    std::vector<double> q, k, v;
    linear(Op::attn_q, x, d_, w.q, inner_, q);
    linear(Op::attn_k, x, d_, w.k, inner_, k);
    linear(Op::attn_v, x, d_, w.v, inner_, v);

    std::vector<double> s(heads * seq_ * seq_);
    {
      emu::Scope scope(ctx_, op_scope(Op::attn_scores));
      for (std::size_t hd = 0; hd < heads; ++hd)  // s_h = q_h k_h^T
        matmul(static_cast<int>(hd), seq_, seq_, dkv_, {q.data() + hd * dkv_, inner_, 1},
               {k.data() + hd * dkv_, 1, inner_}, s.data() + hd * seq_ * seq_, seq_, &stats(Op::attn_scores));
    }
    {
      // Every score gets its mask value (0 on real keys: exact, no flag), as the tensor
      // add does on the hardware.
      emu::Scope scope(ctx_, op_scope(Op::attn_mask_add));
      const std::size_t first_pad = seq_ - static_cast<std::size_t>(shape_.pad);
      for (std::size_t hd = 0; hd < heads; ++hd)
        for (std::size_t i = 0; i < seq_; ++i)
          for (std::size_t j = 0; j < seq_; ++j) {
            const At at(ctx_, static_cast<int>(hd), seq_, seq_, i, j);
            double& score = s[(hd * seq_ + i) * seq_ + j];
            score = ctx_.add(F_, score, j >= first_pad ? mask_ : 0.0);
            stats(Op::attn_mask_add).add(score);
          }
    }
    {
      emu::Scope scope(ctx_, op_scope(Op::attn_softmax));
      for (std::size_t hd = 0; hd < heads; ++hd)
        for (std::size_t i = 0; i < seq_; ++i) softmax(static_cast<int>(hd), i, s.data() + (hd * seq_ + i) * seq_);
    }
    std::vector<double> c(seq_ * inner_);
    {
      emu::Scope scope(ctx_, op_scope(Op::attn_context));
      for (std::size_t hd = 0; hd < heads; ++hd)  // c_h = p_h v_h
        matmul(static_cast<int>(hd), seq_, dkv_, seq_, {s.data() + hd * seq_ * seq_, seq_, 1},
               {v.data() + hd * dkv_, inner_, 1}, c.data() + hd * dkv_, inner_, &stats(Op::attn_context));
    }
    std::vector<double> o;
    linear(Op::attn_o, c, inner_, w.o, d_, o);
    residual_add(Op::attn_residual_add, h, o);
  }

  // One row of scores (head hd, query i) replaced by its softmax, in S, cast back to F.
  void softmax(int hd, std::size_t i, double* row) {
    const emu::Format& S = num_.softmax_fp32 ? emu::fp32() : F_;
    const double m = max_of(row, seq_);
    double sum = 0;
    for (std::size_t j = 0; j < seq_; ++j) {
      const At at(ctx_, hd, seq_, seq_, i, j);
      row[j] = exp_in(ctx_, S, ctx_.sub(S, row[j], m));
      sum = ctx_.add(S, sum, row[j]);
    }
    for (std::size_t j = 0; j < seq_; ++j) {
      const At at(ctx_, hd, seq_, seq_, i, j);
      double p = ctx_.div(S, row[j], sum);
      if (!(S == F_)) p = ctx_.convert(F_, p);
      row[j] = p;
      stats(Op::attn_softmax).add(p);
    }
  }

  void feed_forward(std::vector<double>& h, const BlockWeights& w) {
    std::vector<double> x;
    {
      emu::Scope scope(ctx_, op_scope(Op::ffn_norm));
      rms_norm(h, w.ffn_norm, x, stats(Op::ffn_norm));
    }
    std::vector<double> a, l;
    linear(Op::ffn_wi_0, x, d_, w.wi_0, dff_, a);
    linear(Op::ffn_wi_1, x, d_, w.wi_1, dff_, l);
    {
      emu::Scope scope(ctx_, op_scope(Op::ffn_gelu));
      for (std::size_t r = 0; r < seq_; ++r)
        for (std::size_t f = 0; f < dff_; ++f) {
          const At at(ctx_, -1, seq_, dff_, r, f);
          double& v = a[r * dff_ + f];
          v = gelu_new(ctx_, F_, v, num_.gelu_clamp);
          stats(Op::ffn_gelu).add(v);
        }
    }
    {
      emu::Scope scope(ctx_, op_scope(Op::ffn_gate_mul));
      for (std::size_t r = 0; r < seq_; ++r)
        for (std::size_t f = 0; f < dff_; ++f) {
          const At at(ctx_, -1, seq_, dff_, r, f);
          double& v = a[r * dff_ + f];
          v = ctx_.mul(F_, v, l[r * dff_ + f]);
          stats(Op::ffn_gate_mul).add(v);
        }
    }
    std::vector<double> y(seq_ * d_);
    {
      // wo_scale s: the input times 1/s in F (exact but for underflow), the matmul, the
      // output times s in fp32 (exact): the residual add then takes an fp32 operand.
      emu::Scope scope(ctx_, op_scope(Op::ffn_wo));
      const bool scaled = num_.wo_scale != 1;
      if (scaled)
        for (std::size_t r = 0; r < seq_; ++r)
          for (std::size_t f = 0; f < dff_; ++f) {
            const At at(ctx_, -1, seq_, dff_, r, f);
            a[r * dff_ + f] = ctx_.mul(F_, a[r * dff_ + f], 1.0 / num_.wo_scale);
          }
      matmul(-1, seq_, d_, dff_, {a.data(), dff_, 1}, {w.wo.data(), d_, 1}, y.data(), d_,
             scaled ? nullptr : &stats(Op::ffn_wo));
      if (scaled)
        for (std::size_t r = 0; r < seq_; ++r)
          for (std::size_t c = 0; c < d_; ++c) {
            const At at(ctx_, -1, seq_, d_, r, c);
            double& v = y[r * d_ + c];
            v = ctx_.mul(emu::fp32(), v, num_.wo_scale);
            stats(Op::ffn_wo).add(v);
          }
    }
    residual_add(Op::ffn_residual_add, h, y);
  }

  emu::Context& ctx_;
  const Shape& shape_;
  const Numerics& num_;
  Stats& stats_;
  const emu::Format& F_;
  emu::Format R_;
  bool convert_;
  double mask_;
  std::optional<double> clamp_;  // clamp_inf's bound, where it applies
  std::size_t seq_, d_, dff_, inner_, dkv_;
};

void check_size(const std::vector<double>& v, std::size_t n, const char* what) {
  if (v.size() != n) throw std::invalid_argument(std::string("t5::forward: ") + what + " has the wrong size");
}

}  // namespace

const char* op_scope(Op op) { return kOpScopes[static_cast<int>(op)]; }

std::string op_name(Op op) {
  std::string name = op_scope(op);
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

std::optional<Site> parse_scope(std::string_view scope) {
  constexpr std::string_view kEncoder = "encoder.", kBlock = "block";
  if (!scope.starts_with(kEncoder)) return std::nullopt;
  scope.remove_prefix(kEncoder.size());
  if (scope == op_scope(Op::final_norm)) return Site{-1, Op::final_norm};
  if (!scope.starts_with(kBlock)) return std::nullopt;
  scope.remove_prefix(kBlock.size());
  int block = 0;
  std::size_t digits = 0;
  while (digits < scope.size() && digits < 6 && scope[digits] >= '0' && scope[digits] <= '9')
    block = block * 10 + (scope[digits++] - '0');
  if (digits == 0 || digits >= scope.size() || scope[digits] != '.') return std::nullopt;
  scope.remove_prefix(digits + 1);
  for (int i = 0; i < kOps; ++i)
    if (op_at(i) != Op::final_norm && scope == kOpScopes[i]) return Site{block, op_at(i)};
  return std::nullopt;
}

std::vector<int> outlier_channel_indices(int d_model, int n) {
  std::vector<int> channels;
  for (int i = 0; i < n; ++i) channels.push_back(static_cast<int>((2LL * i + 1) * d_model / (2LL * n)));
  return channels;
}

Weights synthetic_weights(const Shape& shape, const Scales& scales, const emu::Format& format, emu::StreamId base) {
  if (shape.blocks < 0 || shape.blocks > kMaxBlocks)
    throw std::invalid_argument("t5::synthetic_weights: blocks must be 0.." + std::to_string(kMaxBlocks));
  const auto seq = static_cast<std::size_t>(shape.seq), d = static_cast<std::size_t>(shape.d_model),
             dff = static_cast<std::size_t>(shape.d_ff), inner = static_cast<std::size_t>(shape.inner());
  const std::vector<int> outliers = outlier_channel_indices(shape.d_model, scales.outlier_channels);
  // rows x cols normal draws from `lane`, times std (times col_scale in the columns
  // listed), rounded into the format.
  auto draw = [&](int lane, std::size_t rows, std::size_t cols, double std_dev, const std::vector<int>& scaled = {},
                  double col_scale = 1) {
    emu::StreamId id = base;
    id.lane = static_cast<std::uint16_t>(lane);
    emu::Rng rng(id);
    std::vector<double> m(rows * cols);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        double sd = std_dev;
        if (std::find(scaled.begin(), scaled.end(), static_cast<int>(c)) != scaled.end()) sd *= col_scale;
        m[r * cols + c] = constant(format, sd * rng.normal());
      }
    return m;
  };
  Weights w;
  w.input = draw(1, seq, d, scales.input_std);
  for (int b = 0; b < shape.blocks; ++b) {
    const int lane = kFirstBlockLane + kLanesPerBlock * b;
    const double in_d = 1 / std::sqrt(static_cast<double>(d));
    BlockWeights bw;
    bw.attn_norm.assign(d, 1.0);
    bw.q = draw(lane + 0, d, inner, scales.qk_gain * in_d);
    bw.k = draw(lane + 1, d, inner, scales.qk_gain * in_d);
    bw.v = draw(lane + 2, d, inner, in_d);
    bw.o = draw(lane + 3, inner, d, 1 / std::sqrt(static_cast<double>(inner)));
    bw.ffn_norm.assign(d, 1.0);
    bw.wi_0 = draw(lane + 4, d, dff, scales.ffn_gain * in_d);
    bw.wi_1 = draw(lane + 5, d, dff, scales.ffn_gain * in_d);
    bw.wo = draw(lane + 6, dff, d, 1 / std::sqrt(static_cast<double>(dff)), outliers, scales.outlier_scale);
    w.blocks.push_back(std::move(bw));
  }
  w.final_norm.assign(d, 1.0);
  return w;
}

void OpStats::add(double v) {
  if (!std::isnan(v)) max_abs = std::isnan(max_abs) ? std::fabs(v) : std::max(max_abs, std::fabs(v));
  if (!std::isfinite(v)) {
    ++nonfinite;
    return;
  }
  ++n;  // Welford
  const double delta = v - mean;
  mean += delta / static_cast<double>(n);
  m2 += delta * (v - mean);
}

double OpStats::std_dev() const {
  if (nonfinite > 0 || n == 0) return kNaN;
  return std::sqrt(m2 / static_cast<double>(n));
}

std::vector<double> forward(emu::Context& ctx, const Shape& shape, const Weights& w, const Numerics& num,
                            Stats& stats, const std::function<void()>& between_blocks) {
  if (!num.unit) throw std::invalid_argument("t5::forward: no matrix unit");
  if (!(num.unit->input_format() == num.format))
    throw std::invalid_argument("t5::forward: the unit's input format is " + num.unit->input_format().name() +
                                ", not " + num.format.name());
  if (num.format.precision() > 26)
    throw std::invalid_argument("t5::forward: formats beyond 26 significant bits are not supported");
  if (shape.pad < 0 || shape.pad >= shape.seq)
    throw std::invalid_argument("t5::forward: pad must be 0 .. seq - 1 (every query needs a real key)");
  const auto seq = static_cast<std::size_t>(shape.seq), d = static_cast<std::size_t>(shape.d_model),
             dff = static_cast<std::size_t>(shape.d_ff), inner = static_cast<std::size_t>(shape.inner());
  check_size(w.input, seq * d, "the input");
  check_size(w.final_norm, d, "the final norm weight");
  if (w.blocks.size() != static_cast<std::size_t>(shape.blocks))
    throw std::invalid_argument("t5::forward: the weights have another number of blocks");
  for (const BlockWeights& b : w.blocks) {
    check_size(b.attn_norm, d, "a norm weight");
    check_size(b.ffn_norm, d, "a norm weight");
    for (const auto* m : {&b.q, &b.k, &b.v}) check_size(*m, d * inner, "an attention projection");
    check_size(b.o, inner * d, "an attention output projection");
    for (const auto* m : {&b.wi_0, &b.wi_1}) check_size(*m, d * dff, "an FFN input projection");
    check_size(b.wo, dff * d, "an FFN output projection");
  }
  return Forward(ctx, shape, num, stats).run(w, between_blocks);
}

double attention_mask_value(const emu::Format& format, double mask_scale) {
  emu::Flags ignored = 0;
  return emu::round(format, emu::exact_mul(mask_scale, -format.max_finite()),
                    emu::RoundSpec{emu::Rounding::rne, emu::Overflow::saturate}, nullptr, ignored);
}

double clamp_bound(const emu::Format& format) { return constant(format, format.max_finite() - 1000); }

double gelu_new(emu::Context& ctx, const emu::Format& format, double x, bool clamp) {
  if (clamp && std::fabs(x) > kGeluClampAt) return x > 0 ? x : 0.0;  // ReLU, no arithmetic
  const double cubic = ctx.mul(format, constant(format, kGeluCubic), cube(ctx, format, x));
  const double t = tanh_in(ctx, format, ctx.mul(format, constant(format, kSqrt2OverPi), ctx.add(format, x, cubic)));
  return ctx.mul(format, ctx.mul(format, 0.5, x), ctx.add(format, 1.0, t));
}

}  // namespace roundoff::t5
