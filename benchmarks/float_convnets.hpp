// Plain float32 training of the convolutional models of experiments/nn/convnets.hpp (the
// same layers and shapes, He initialisation, plain SGD, softmax cross-entropy): the
// reference bench_train measures the emulated models against. Convolutions are im2col
// (per image, C K K x OH OW) and single-threaded sgemm, from OpenBLAS where the build
// has it (ROUNDOFF_HAVE_OPENBLAS), else plain loops; the input gradient is sgemm then
// col2im.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#ifdef ROUNDOFF_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace floatref {

// C (m x n) = op(A) op(B) + beta C, row-major; op(A) is m x k, op(B) k x n.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, const float* b, float beta,
                 float* c) {
#ifdef ROUNDOFF_HAVE_OPENBLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
              a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
#else
  for (int i = 0; i < m * n; ++i) c[i] *= beta;
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const float av = trans_a ? a[p * m + i] : a[i * k + p];
      for (int j = 0; j < n; ++j) c[i * n + j] += av * (trans_b ? b[j * k + p] : b[p * n + j]);
    }
#endif
}

// OpenBLAS on `threads` threads: one, as the emulated models' single-thread figures
// (and thread CPU time) assume, or as many as the emulated run is given.
inline void use_threads(int threads) {
#ifdef ROUNDOFF_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
}

inline const char* gemm_name() {
#ifdef ROUNDOFF_HAVE_OPENBLAS
  return "im2col + OpenBLAS sgemm";
#else
  return "im2col + plain loops (built without OpenBLAS)";
#endif
}

struct Tensor {
  int n = 0, c = 0, h = 1, w = 1;
  std::vector<float> v;
  Tensor() = default;
  Tensor(int n_, int c_, int h_, int w_) : n(n_), c(c_), h(h_), w(w_), v(static_cast<std::size_t>(n_) * c_ * h_ * w_) {}
  int spatial() const { return h * w; }
};

inline std::vector<float> he_normal(std::size_t size, int fan_in, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
  std::vector<float> w(size);
  for (float& x : w) x = dist(gen);
  return w;
}

struct Conv {
  int cin, cout, k, stride, pad;
  std::vector<float> w, dw;
  Tensor input;
  std::vector<float> col;  // C K K x OH OW of one image
  Conv(int cin_, int cout_, int k_, int stride_, int pad_, std::mt19937& gen)
      : cin(cin_), cout(cout_), k(k_), stride(stride_), pad(pad_),
        w(he_normal(static_cast<std::size_t>(cout_) * cin_ * k_ * k_, cin_ * k_ * k_, gen)), dw(w.size()) {}
  int out_size(int size) const { return (size + 2 * pad - k) / stride + 1; }
  void im2col(const Tensor& x, int n, int oh, int ow) {
    col.assign(static_cast<std::size_t>(cin) * k * k * oh * ow, 0.0f);
    for (int c = 0; c < cin; ++c)
      for (int ky = 0; ky < k; ++ky)
        for (int kx = 0; kx < k; ++kx) {
          float* row = &col[static_cast<std::size_t>((c * k + ky) * k + kx) * oh * ow];
          for (int y = 0; y < oh; ++y) {
            const int iy = y * stride + ky - pad;
            if (iy < 0 || iy >= x.h) continue;
            for (int xo = 0; xo < ow; ++xo) {
              const int ix = xo * stride + kx - pad;
              if (ix >= 0 && ix < x.w) row[y * ow + xo] = x.v[((static_cast<std::size_t>(n) * x.c + c) * x.h + iy) * x.w + ix];
            }
          }
        }
  }
  Tensor forward(const Tensor& x) {
    input = x;
    const int oh = out_size(x.h), ow = out_size(x.w), kd = cin * k * k;
    Tensor y(x.n, cout, oh, ow);
    for (int n = 0; n < x.n; ++n) {
      im2col(x, n, oh, ow);
      gemm(false, false, cout, oh * ow, kd, w.data(), col.data(), 0.0f, &y.v[static_cast<std::size_t>(n) * cout * oh * ow]);
    }
    return y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) {
    const int oh = dy.h, ow = dy.w, kd = cin * k * k, p = oh * ow;
    std::fill(dw.begin(), dw.end(), 0.0f);
    Tensor dx;
    if (need_dx) dx = Tensor(input.n, input.c, input.h, input.w);
    std::vector<float> dcol(static_cast<std::size_t>(kd) * p);
    for (int n = 0; n < input.n; ++n) {
      im2col(input, n, oh, ow);
      const float* g = &dy.v[static_cast<std::size_t>(n) * cout * p];
      gemm(false, true, cout, kd, p, g, col.data(), 1.0f, dw.data());
      if (!need_dx) continue;
      gemm(true, false, kd, p, cout, w.data(), g, 0.0f, dcol.data());
      for (int c = 0; c < cin; ++c)  // col2im
        for (int ky = 0; ky < k; ++ky)
          for (int kx = 0; kx < k; ++kx) {
            const float* row = &dcol[static_cast<std::size_t>((c * k + ky) * k + kx) * p];
            for (int y = 0; y < oh; ++y) {
              const int iy = y * stride + ky - pad;
              if (iy < 0 || iy >= input.h) continue;
              for (int xo = 0; xo < ow; ++xo) {
                const int ix = xo * stride + kx - pad;
                if (ix >= 0 && ix < input.w)
                  dx.v[((static_cast<std::size_t>(n) * cin + c) * input.h + iy) * input.w + ix] += row[y * ow + xo];
              }
            }
          }
    }
    return dx;
  }
  void update(float lr) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * dw[i];
  }
};

// Batch norm in training mode (batch statistics over samples and positions, eps 1e-5).
struct BatchNorm {
  std::vector<float> gamma, beta, dgamma, dbeta, inv_std;
  Tensor xhat;
  explicit BatchNorm(int channels)
      : gamma(channels, 1.0f), beta(channels, 0.0f), dgamma(channels), dbeta(channels), inv_std(channels) {}
  Tensor forward(const Tensor& z) {
    xhat = Tensor(z.n, z.c, z.h, z.w);
    Tensor y = xhat;
    const int p = z.spatial();
    const float count = static_cast<float>(z.n * p);
    for (int c = 0; c < z.c; ++c) {
      float mean = 0.0f, var = 0.0f;
      for (int n = 0; n < z.n; ++n)
        for (int q = 0; q < p; ++q) mean += z.v[(static_cast<std::size_t>(n) * z.c + c) * p + q];
      mean /= count;
      for (int n = 0; n < z.n; ++n)
        for (int q = 0; q < p; ++q) {
          const float d = z.v[(static_cast<std::size_t>(n) * z.c + c) * p + q] - mean;
          var += d * d;
        }
      inv_std[c] = 1.0f / std::sqrt(var / count + 1e-5f);
      for (int n = 0; n < z.n; ++n)
        for (int q = 0; q < p; ++q) {
          const std::size_t i = (static_cast<std::size_t>(n) * z.c + c) * p + q;
          xhat.v[i] = (z.v[i] - mean) * inv_std[c];
          y.v[i] = gamma[c] * xhat.v[i] + beta[c];
        }
    }
    return y;
  }
  Tensor backward(const Tensor& dy) {
    Tensor dz(dy.n, dy.c, dy.h, dy.w);
    const int p = dy.spatial();
    const float count = static_cast<float>(dy.n * p);
    for (int c = 0; c < dy.c; ++c) {
      float dg = 0.0f, db = 0.0f;
      for (int n = 0; n < dy.n; ++n)
        for (int q = 0; q < p; ++q) {
          const std::size_t i = (static_cast<std::size_t>(n) * dy.c + c) * p + q;
          dg += dy.v[i] * xhat.v[i];
          db += dy.v[i];
        }
      dgamma[c] = dg;
      dbeta[c] = db;
      for (int n = 0; n < dy.n; ++n)
        for (int q = 0; q < p; ++q) {
          const std::size_t i = (static_cast<std::size_t>(n) * dy.c + c) * p + q;
          dz.v[i] = inv_std[c] * gamma[c] / count * (count * dy.v[i] - db - xhat.v[i] * dg);
        }
    }
    return dz;
  }
  void update(float lr) {
    for (std::size_t c = 0; c < gamma.size(); ++c) {
      gamma[c] -= lr * dgamma[c];
      beta[c] -= lr * dbeta[c];
    }
  }
};

struct Relu {
  Tensor out;
  Tensor forward(Tensor x) {
    for (float& v : x.v) v = std::max(v, 0.0f);
    out = x;
    return x;
  }
  Tensor backward(Tensor dy) const {
    for (std::size_t i = 0; i < dy.v.size(); ++i)
      if (!(out.v[i] > 0.0f)) dy.v[i] = 0.0f;
    return dy;
  }
};

struct MaxPool {  // 2x2, stride 2
  std::vector<std::uint32_t> argmax;
  Tensor in_shape;
  Tensor forward(const Tensor& x) {
    in_shape = Tensor(x.n, x.c, x.h, x.w);
    Tensor y(x.n, x.c, x.h / 2, x.w / 2);
    argmax.resize(y.v.size());
    for (int p = 0; p < x.n * x.c; ++p)
      for (int oy = 0; oy < y.h; ++oy)
        for (int ox = 0; ox < y.w; ++ox) {
          std::size_t best = (static_cast<std::size_t>(p) * x.h + 2 * oy) * x.w + 2 * ox;
          for (int dy = 0; dy < 2; ++dy)
            for (int dx = 0; dx < 2; ++dx) {
              const std::size_t i = (static_cast<std::size_t>(p) * x.h + 2 * oy + dy) * x.w + 2 * ox + dx;
              if (x.v[i] > x.v[best]) best = i;
            }
          const std::size_t o = (static_cast<std::size_t>(p) * y.h + oy) * y.w + ox;
          y.v[o] = x.v[best];
          argmax[o] = static_cast<std::uint32_t>(best);
        }
    return y;
  }
  Tensor backward(const Tensor& dy) const {
    Tensor dx = in_shape;
    for (std::size_t o = 0; o < dy.v.size(); ++o) dx.v[argmax[o]] = dy.v[o];
    return dx;
  }
};

struct Dense {
  int in, out;
  std::vector<float> w, b, dw, db;
  Tensor input;
  Dense(int in_, int out_, std::mt19937& gen)
      : in(in_), out(out_), w(he_normal(static_cast<std::size_t>(in_) * out_, in_, gen)), b(out_, 0.0f), dw(w.size()),
        db(out_) {}
  Tensor forward(const Tensor& x) {
    input = x;
    Tensor z(x.n, out, 1, 1);
    for (int i = 0; i < x.n; ++i) std::copy(b.begin(), b.end(), z.v.begin() + static_cast<std::ptrdiff_t>(i) * out);
    gemm(false, false, x.n, out, in, x.v.data(), w.data(), 1.0f, z.v.data());
    return z;
  }
  Tensor backward(const Tensor& dz) {
    std::fill(db.begin(), db.end(), 0.0f);
    for (int i = 0; i < dz.n; ++i)
      for (int j = 0; j < out; ++j) db[j] += dz.v[static_cast<std::size_t>(i) * out + j];
    gemm(true, false, in, out, dz.n, input.v.data(), dz.v.data(), 0.0f, dw.data());
    Tensor dx(input.n, input.c, input.h, input.w);
    gemm(false, true, dz.n, in, out, dz.v.data(), w.data(), 0.0f, dx.v.data());
    return dx;
  }
  void update(float lr) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * dw[i];
    for (int j = 0; j < out; ++j) b[j] -= lr * db[j];
  }
};

// Softmax cross-entropy: the mean loss; logits become dlogits = (softmax - onehot) / B.
inline float softmax_cross_entropy(Tensor& logits, const int* y) {
  float loss = 0.0f;
  const int classes = logits.c;
  for (int i = 0; i < logits.n; ++i) {
    float* l = &logits.v[static_cast<std::size_t>(i) * classes];
    const float top = *std::max_element(l, l + classes);
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) sum += std::exp(l[c] - top);
    loss += std::log(sum) + top - l[y[i]];
    for (int c = 0; c < classes; ++c) l[c] = std::exp(l[c] - top) / sum / static_cast<float>(logits.n);
    l[y[i]] -= 1.0f / static_cast<float>(logits.n);
  }
  return loss / static_cast<float>(logits.n);
}

class Net {
 public:
  virtual ~Net() = default;
  // One SGD step on a batch of images [batch, C, H, W]; returns the mean batch loss.
  virtual float step(const float* x, const int* y, int batch, float lr) = 0;
};

class ConvNet final : public Net {
 public:
  ConvNet(int channels, int height, int width, int classes, int width1, int width2, unsigned seed)
      : gen_(seed), c_(channels), h_(height), w_(width), conv1_(channels, width1, 3, 1, 1, gen_),
        conv2_(width1, width2, 3, 1, 1, gen_), bn1_(width1), bn2_(width2),
        dense_(width2 * (height / 4) * (width / 4), classes, gen_) {}
  float step(const float* x, const int* y, int batch, float lr) override {
    Tensor t(batch, c_, h_, w_);
    std::copy(x, x + t.v.size(), t.v.begin());
    t = pool1_.forward(relu1_.forward(bn1_.forward(conv1_.forward(t))));
    t = pool2_.forward(relu2_.forward(bn2_.forward(conv2_.forward(t))));
    Tensor logits = dense_.forward(t);
    const float loss = softmax_cross_entropy(logits, y);
    Tensor d = dense_.backward(logits);
    d = bn2_.backward(relu2_.backward(pool2_.backward(d)));
    d = conv2_.backward(d, true);
    d = bn1_.backward(relu1_.backward(pool1_.backward(d)));
    conv1_.backward(d, false);
    for (Conv* c : {&conv1_, &conv2_}) c->update(lr);
    for (BatchNorm* b : {&bn1_, &bn2_}) b->update(lr);
    dense_.update(lr);
    return loss;
  }

 private:
  std::mt19937 gen_;
  int c_, h_, w_;
  Conv conv1_, conv2_;
  BatchNorm bn1_, bn2_;
  Relu relu1_, relu2_;
  MaxPool pool1_, pool2_;
  Dense dense_;
};

class ResNet final : public Net {
 public:
  ResNet(int channels, int height, int width, int classes, int blocks, int base, unsigned seed)
      : gen_(seed), c_(channels), h_(height), w_(width), stem_(channels, base, 3, 1, 1, gen_), stem_bn_(base),
        dense_(4 * base, classes, gen_) {
    int in = base;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < blocks; ++b) {
        const int out = base << stage, stride = stage > 0 && b == 0 ? 2 : 1;
        blocks_.push_back(std::make_unique<Block>(in, out, stride, gen_));
        in = out;
      }
  }
  float step(const float* x, const int* y, int batch, float lr) override {
    Tensor t(batch, c_, h_, w_);
    std::copy(x, x + t.v.size(), t.v.begin());
    t = stem_relu_.forward(stem_bn_.forward(stem_.forward(t)));
    for (auto& b : blocks_) t = b->forward(t);
    pooled_ = Tensor(t.n, t.c, t.h, t.w);
    Tensor g(t.n, t.c, 1, 1);
    for (int p = 0; p < t.n * t.c; ++p) {
      float s = 0.0f;
      for (int q = 0; q < t.spatial(); ++q) s += t.v[static_cast<std::size_t>(p) * t.spatial() + q];
      g.v[p] = s / static_cast<float>(t.spatial());
    }
    Tensor logits = dense_.forward(g);
    const float loss = softmax_cross_entropy(logits, y);
    Tensor dg = dense_.backward(logits);
    Tensor d = pooled_;
    for (int p = 0; p < d.n * d.c; ++p)
      std::fill_n(d.v.begin() + static_cast<std::ptrdiff_t>(p) * d.spatial(), d.spatial(),
                  dg.v[p] / static_cast<float>(d.spatial()));
    for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) d = (*b)->backward(d);
    stem_.backward(stem_bn_.backward(stem_relu_.backward(d)), false);
    stem_.update(lr);
    stem_bn_.update(lr);
    for (auto& b : blocks_) b->update(lr);
    dense_.update(lr);
    return loss;
  }

 private:
  struct Block {
    Conv conv1, conv2;
    BatchNorm bn1, bn2;
    Relu relu1, relu_out;
    std::unique_ptr<Conv> shortcut;
    Block(int in, int out, int stride, std::mt19937& gen)
        : conv1(in, out, 3, stride, 1, gen), conv2(out, out, 3, 1, 1, gen), bn1(out), bn2(out) {
      if (stride != 1 || in != out) shortcut = std::make_unique<Conv>(in, out, 1, stride, 0, gen);
    }
    Tensor forward(const Tensor& x) {
      Tensor h = bn2.forward(conv2.forward(relu1.forward(bn1.forward(conv1.forward(x)))));
      const Tensor s = shortcut ? shortcut->forward(x) : x;
      for (std::size_t i = 0; i < h.v.size(); ++i) h.v[i] += s.v[i];
      return relu_out.forward(h);
    }
    Tensor backward(const Tensor& dy) {
      const Tensor d = relu_out.backward(dy);
      Tensor m = conv1.backward(bn1.backward(relu1.backward(conv2.backward(bn2.backward(d), true))), true);
      const Tensor s = shortcut ? shortcut->backward(d, true) : d;
      for (std::size_t i = 0; i < m.v.size(); ++i) m.v[i] += s.v[i];
      return m;
    }
    void update(float lr) {
      conv1.update(lr);
      conv2.update(lr);
      bn1.update(lr);
      bn2.update(lr);
      if (shortcut) shortcut->update(lr);
    }
  };
  std::mt19937 gen_;
  int c_, h_, w_;
  Conv stem_;
  BatchNorm stem_bn_;
  Relu stem_relu_;
  std::vector<std::unique_ptr<Block>> blocks_;
  Tensor pooled_;
  Dense dense_;
};

}  // namespace floatref
