// What every trained model shares: its parameter tensors, the formats of its tensors,
// and the interface the Trainer drives, a model whose forward and backward passes round
// every operation through emu (Mlp in mlp.hpp, ConvNet and ResNet in convnets.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "datasets.hpp"
#include "emu/arith.hpp"
#include "emu/format.hpp"

namespace roundoff::train {

struct Shape {
  std::size_t n = 0, c = 0, h = 1, w = 1;  // samples, channels, height, width
  std::size_t spatial() const { return h * w; }
  std::size_t per_sample() const { return c * h * w; }
  std::size_t size() const { return n * c * h * w; }
  friend bool operator==(const Shape&, const Shape&) = default;
};

struct Param {
  std::vector<double> value;         // in storage format
  std::vector<double> master;        // fp32-master only
  std::vector<double> compensation;  // fp16-kahan only
  std::vector<double> m, v;          // optimiser state
  std::vector<double> grad;          // the gradient as backward left it (times the loss scale)
};

// Formats of the model's tensors (parameters have their own ParamFormats).
struct ModelFormats {
  emu::Format act;     // activations (matmul inputs, BN outputs, logits)
  emu::Format grad;    // activation and weight gradients
  emu::Format loss;    // softmax, log-sum-exp, loss and its gradient
  emu::Format bn_fwd;  // batch-norm arithmetic, forward (act, or fp32 with bn_fp32)
  emu::Format bn_bwd;  // batch-norm arithmetic, backward (grad, or fp32 with bn_fp32)
};

struct Evaluation {
  double loss = 0.0, accuracy = 0.0;
};

// Batch norm: eps = 1e-5; running statistics updated as PyTorch does, with momentum 0.1.
inline constexpr double kBnEps = 1e-5, kBnMomentum = 0.1;

// What a trainable tensor is to the Trainer: how it is initialised (weights He-normal
// N(0, 2 / fan_in); biases and batch-norm shifts 0; batch-norm scales 1) and which
// updater takes it (batch-norm parameters have their own under bn_fp32).
enum class ParamRole { weight, bias, bn_scale, bn_shift };

struct ParamRef {
  std::string name;  // e.g. "conv1", "stage2.block1.bn1.gamma", "l3.bias"
  Param* param;
  ParamRole role;
  std::size_t size;    // values
  std::size_t fan_in;  // weights: inputs per output value
};

class Model {
 public:
  virtual ~Model() = default;
  // Forward and backward on a batch (x: rows of the model's inputs, values of the act
  // format). Leaves the gradients of the mean batch loss times `loss_scale` in each
  // Param.grad and returns the mean batch loss as computed in the loss format.
  virtual double forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                                  double loss_scale) = 0;
  // Inference in the model's own arithmetic (batch norm with its running statistics):
  // the logits (rows x classes, values of the act format) of x (rows of inputs, values
  // of the act format); first_row = the index of x's first row in its data set (for the
  // elements of reported flags).
  virtual std::vector<double> logits(emu::Context& ctx, const std::vector<double>& x,
                                     std::size_t first_row) const = 0;
  // Inference on a whole set in the model's arithmetic: inputs rounded into the act
  // format, logits(), then per sample the cross-entropy as training computes it (loss
  // format; exp and log in fp64 rounded once) averaged in fp64, and accuracy = share of
  // samples whose logits are all finite with the first largest at the label. Rows go
  // through logits() rows_per_chunk() at a time (they are independent).
  Evaluation evaluate(emu::Context& ctx, const data::Dataset& d) const;
  // The parameters' current values in fp64 arithmetic on a whole set (the MLP with the
  // set's own batch statistics, the convolutional models with the running statistics).
  virtual Evaluation evaluate_fp64(const data::Dataset& d) const = 0;
  // The trainable tensors, in the order the Trainer updates them (the MLP: the last
  // layer's bias, the weights, the batch-norm scales, the shifts; the convolutional
  // models: forward order). Weights appear in forward order.
  virtual std::vector<ParamRef> params() = 0;
  virtual const ModelFormats& formats() const = 0;
  // The shape of `rows` inputs: [rows, features] (as [rows, features, 1, 1]) for the MLP,
  // [rows, C, H, W] for the convolutional models (elements of reported flags follow it).
  virtual Shape input_shape(std::size_t rows) const = 0;

 protected:
  virtual std::size_t rows_per_chunk() const { return 256; }
};

// Loss and accuracy of fp64 logits (rows x classes): cross-entropy via log-sum-exp in
// fp64; a sample counts as correct when its logits are all finite with the first largest
// at its label.
Evaluation evaluate_logits_fp64(const std::vector<double>& logits, const std::vector<int>& labels,
                                std::size_t classes);

}  // namespace roundoff::train
