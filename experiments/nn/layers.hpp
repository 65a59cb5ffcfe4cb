// The layers of the convolutional models (experiments/nn/convnets.hpp): tensors in NCHW
// layout, and each layer's passes in two arithmetics:
//  - emulated (struct Emulated): every operation rounded through emu under one context,
//    matrix products and convolutions through the model's matrix unit, each tensor in
//    its format of ModelFormats, as the MLP computes (experiments/nn/mlp.hpp);
//  - native fp64 (struct Fp64): the reference of the fp64 evaluation.
// Elementwise operations set the context's element: (sample, channel, row, column) for
// images, (sample, channel) where a tensor has one value per channel, (channel) for
// per-channel statistics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/amp.hpp"
#include "emu/arith.hpp"
#include "emu/unit.hpp"
#include "model.hpp"

namespace roundoff::train {

struct Tensor {
  Shape shape;
  std::vector<double> v;  // row-major: ((n C + c) H + y) W + x
  Tensor() = default;
  explicit Tensor(Shape s, double fill = 0.0) : shape(s), v(s.size(), fill) {}
};

// A convolution without bias: square kernel, the same stride and zero padding on every
// side; weights O x C x K x K (OIHW), the cross-correlation of neural networks.
struct ConvGeometry {
  std::size_t out_channels = 1, kernel = 3, stride = 1, pad = 1;
};
emu::Conv2dShape conv_shape(const Shape& in, const ConvGeometry& g);
Shape conv_output(const Shape& in, const ConvGeometry& g);  // throws std::invalid_argument if empty

// The emulated arithmetic of one model. first_sample: the index in its data set of the
// first sample of the tensors at hand, added to the sample index of reported elements.
struct Emulated {
  emu::Context& ctx;
  const ModelFormats& formats;
  const emu::MatrixUnit& unit;
  std::size_t first_sample = 0;
};

// The native fp64 arithmetic (no rounding beyond double's, no flags).
struct Fp64 {};

// A constant rounded into f (round to nearest even, no flags).
double round_constant(const emu::Format& f, double v);

// ---- Matrix products and convolutions through the unit ------------------------------

// c (m x n, values of `out`) = a (m x k) * b (k x n) + c through the unit, row-major:
// a and b rounded into the unit's input format, c into its output format, the unit's
// result rounded into `out` (each conversion under the context).
void unit_gemm(emu::Context& ctx, const emu::MatrixUnit& unit, std::size_t m, std::size_t n, std::size_t k,
               std::vector<double> a, std::vector<double> b, const emu::Format& out, std::vector<double>& c);

// y = conv(x, w), rounded into `out`. x and w are rounded into the unit's input format
// first. ipu-amp and ipu-amp-half: emu::amp_conv2d with the unit's AMP configuration
// (partialsType float or half; esr, NANOO and traps from the context), channels in
// groups of 16 per AMP pass. Every other unit: the convolution lowered to a matrix
// product (im2col): per image, row (y, x) holds the input patch in the order
// r = (c K + ky) K + kx, column o holds w[o] in the same order, through the unit's gemm.
Tensor conv2d(Emulated& e, const Tensor& x, const std::vector<double>& w, const ConvGeometry& g,
              const emu::Format& out);
// The gradient at the input of y = conv(x, w) from dy, in the grad format, as a
// convolution through the unit (as Poplar computes it): dy dilated by the stride
// (stride - 1 zeros between its values) and zero-padded by K - 1 - pad (plus what the
// input's size needs at the end), convolved with stride 1 with the weights flipped in
// both kernel directions and transposed (C x O x K x K). Needs pad <= K - 1.
Tensor conv2d_grad_input(Emulated& e, const Tensor& dy, const std::vector<double>& w, const ConvGeometry& g,
                         const Shape& x_shape);
// The gradient of the weights, dW[o][r] = sum over (n, y, x) of dy[n][o][y][x] times
// patch(n, y, x)[r] (r as in conv2d's im2col), in the grad format: one gemm through the
// unit, (C K K) x O = the patches transposed (C K K x N OH OW) times dy (N OH OW x O),
// the reduction over samples and positions in the order n, y, x.
std::vector<double> conv2d_grad_weights(Emulated& e, const Tensor& x, const Tensor& dy, const ConvGeometry& g);

Tensor conv2d(Fp64, const Tensor& x, const std::vector<double>& w, const ConvGeometry& g);

// ---- Dense layer: [N, D] (any shape, flattened per sample) -> [N, outputs] ------------

// z = x W (+ bias) through the unit (W: D x outputs, row-major), rounded into `out`.
Tensor dense(Emulated& e, const Tensor& x, const Param& weight, const Param* bias, std::size_t outputs,
             const emu::Format& out);
Tensor dense(Fp64, const Tensor& x, const Param& weight, const Param* bias, std::size_t outputs);
// Sets weight.grad (D x outputs) and bias->grad (outputs) from dz [N, outputs] and returns
// dx (the shape of x), all in the grad format: dbias_j = sum over samples in index order
// (scope bias), dW = x^T dz (scope dw) and dx = dz W^T (scope dx) through the unit.
// need_dx false: dx is not computed (empty).
Tensor dense_backward(Emulated& e, const Tensor& x, const Tensor& dz, Param& weight, Param* bias, bool need_dx);

// ---- Batch norm over (samples, positions) per channel --------------------------------

// momentum, 1 - momentum and eps (kBnMomentum, kBnEps) rounded into the forward format.
struct BatchNormConstants {
  double momentum, one_minus_momentum, eps;
  static BatchNormConstants in(const emu::Format& bn_fwd);
};
struct BatchNormSaved {
  std::vector<double> xhat;     // normalised input, values of bn_fwd
  std::vector<double> inv_std;  // per channel
};
// Training mode, in bn_fwd (every sum in index order n, then position): mean = sum / B,
// var = sum (z - mean)^2 / B (two-pass, fma), inv_std = 1 / sqrt(var + eps), xhat =
// (z - mean) * inv_std, y = fma(gamma, xhat, beta) rounded into act; running statistics
// r = fma(1 - momentum, r, momentum * s), s = mean or the unbiased variance (sum / (B - 1);
// B = 1: var). B = samples x positions.
Tensor batch_norm_train(Emulated& e, const Tensor& z, const Param& gamma, const Param& beta,
                        std::vector<double>& running_mean, std::vector<double>& running_var,
                        const BatchNormConstants& k, BatchNormSaved& saved);
// Inference mode with the running statistics: xhat = (z - mean) * (1 / sqrt(var + eps))
// in bn_fwd, y = fma(gamma, xhat, beta) rounded into act.
Tensor batch_norm_infer(Emulated& e, const Tensor& z, const Param& gamma, const Param& beta,
                        const std::vector<double>& running_mean, const std::vector<double>& running_var,
                        const BatchNormConstants& k);
Tensor batch_norm_infer(Fp64, const Tensor& z, const Param& gamma, const Param& beta,
                        const std::vector<double>& running_mean, const std::vector<double>& running_var);
// Backward in bn_bwd from dy (the gradient at the output): dgamma = sum dy xhat (fma),
// dbeta = sum dy, dxhat = dy gamma, dz = inv_std (dxhat - mean(dxhat) - xhat
// mean(dxhat xhat)) rounded into grad. Sets gamma.grad and beta.grad.
Tensor batch_norm_backward(Emulated& e, const Tensor& dy, const BatchNormSaved& saved, Param& gamma, Param& beta);

// Sets the context's element to value `flat` of a tensor of shape s: (n, c, y, x), or
// (n, c) where the tensor has one value per channel (or per feature).
void set_element(emu::Context& ctx, const Shape& s, std::size_t flat);
// The same with the sample index counted from e.first_sample.
void set_element(const Emulated& e, const Shape& s, std::size_t flat);

// ---- Exact elementwise layers --------------------------------------------------------

Tensor relu(const Tensor& x);  // max(x, 0); NaN propagates
// dy where the ReLU's output is positive, else 0.
Tensor relu_backward(const Tensor& out, Tensor dy);
// 2x2 max pooling with stride 2 (an odd last row or column is dropped, as PyTorch's
// default). NaN propagates (the window's first NaN). argmax (optional) receives the
// input index of each output (the first maximum in row-major order).
Tensor max_pool(const Tensor& x, std::vector<std::uint32_t>* argmax = nullptr);
Tensor max_pool_backward(const Tensor& dy, const std::vector<std::uint32_t>& argmax, const Shape& x_shape);

// ---- Global average pooling and residual addition -----------------------------------

// Per (sample, channel): the sum of its positions in index order, divided by H W, in
// act. Output [N, C, 1, 1].
Tensor global_avg_pool(Emulated& e, const Tensor& x);
Tensor global_avg_pool(Fp64, const Tensor& x);
// dx = dy / (H W) rounded into grad, the same for every position.
Tensor global_avg_pool_backward(Emulated& e, const Tensor& dy, const Shape& x_shape);
// a + b elementwise, rounded into `f`.
Tensor add(Emulated& e, const Tensor& a, const Tensor& b, const emu::Format& f);
Tensor add(Fp64, const Tensor& a, const Tensor& b);

// ---- Loss -------------------------------------------------------------------------------

// Softmax cross-entropy of one sample in the loss format `lf`: e[j] = exp(logit_j - max)
// (emu has no exp or log: computed in fp64 and rounded once into lf), their sum, and the
// loss lse - logit_label with lse = max + log(sum). Elements: (sample, class) for the
// exponentials and their sum, (sample) for the rest.
struct SoftmaxTerms {
  double loss, sum;
};
SoftmaxTerms softmax_terms(emu::Context& ctx, const emu::Format& lf, const double* logits, std::size_t classes,
                           int label, std::vector<double>& e, std::size_t sample);
// The mean loss of a batch of logits [B, classes] in the loss format, and in dz its
// gradient times `loss_scale`: (softmax - onehot) * (S / B) (S / B rounded into the loss
// format), rounded into the grad format. Elements (sample, class), or (sample).
double softmax_cross_entropy(emu::Context& ctx, const ModelFormats& f, const std::vector<double>& logits,
                             const std::vector<int>& labels, std::size_t classes, double loss_scale,
                             std::vector<double>& dz);

}  // namespace roundoff::train
