// The convolutional models of `train` (model: convnet | resnet) on images [N, C, H, W]:
//  - ConvNet, the simple model of the IPU tutorial's Fashion-MNIST example as issue 10
//    specifies it: (conv 3x3 -> batch norm -> ReLU -> 2x2 max pool) twice, then a dense
//    layer with bias; the convolutions have width1 and width2 output channels, padding 1,
//    no bias (batch norm's beta replaces it). (The tutorial's own script,
//    float32_parameter_updates.py, has conv -> ReLU -> conv -> dense with 32 channels,
//    no batch norm and no pooling.)
//  - ResNet of depth 6N + 2 for small images (He et al. 2016, section 4.2, as the Keras
//    CIFAR-10 example "ResNet v1" builds it, which the IPU tutorial's
//    stochastic_rounding.py follows): a 3x3 stem convolution with `width` channels ->
//    BN -> ReLU; three stages of N basic blocks with width, 2 width and 4 width channels,
//    the first block of stages 2 and 3 with stride 2; a block is conv 3x3 -> BN -> ReLU
//    -> conv 3x3 -> BN, plus the shortcut (the identity, or where the shape changes a
//    1x1 convolution with the block's stride, without batch norm), added, then ReLU;
//    global average pooling; a dense layer with bias. Depth counts the stem, the 6N
//    block convolutions and the dense layer.
// Every layer computes as experiments/nn/layers.hpp describes: convolutions through the
// model's matrix unit, each tensor in its format (ModelFormats), batch norm in its own
// formats; a convolution that feeds a batch norm writes bn_fwd, the others act.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers.hpp"
#include "model.hpp"

namespace roundoff::train {

// The layers with their parameters and what the training pass saves for backward.
struct ConvLayer {
  std::string name;
  ConvGeometry geometry;
  bool feeds_batch_norm = true;
  Param weight;  // O x C x K x K
  std::size_t fan_in = 0;
  Tensor input;  // saved by the training pass
};
struct BatchNormLayer {
  std::string name;
  Param gamma, beta;
  // Values of bn_fwd: starting at 0 and 1, updated by every training pass.
  std::vector<double> running_mean, running_var;
  BatchNormSaved saved;
};
struct ReluLayer {
  Tensor output;  // saved
};
struct PoolLayer {
  std::vector<std::uint32_t> argmax;  // saved
  Shape input;
};
struct DenseLayer {
  std::string name;
  Param weight, bias;  // D x classes, classes
  std::size_t fan_in = 0;
  Tensor input;  // saved
};

struct GlobalPoolLayer {
  Shape input;  // saved
};

// What the two convolutional models share: the input shape, formats, unit, the training
// pass (forward in scope forward.*, softmax cross-entropy in scope loss, backward in
// scope backward.*), inference and the fp64 evaluation; each model supplies its layers'
// forward pass (once, for three arithmetics) and its backward pass.
class ImageModel : public Model {
 public:
  double forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                          double loss_scale) override;
  std::vector<double> logits(emu::Context& ctx, const std::vector<double>& x, std::size_t first_row) const override;
  Evaluation evaluate_fp64(const data::Dataset& d) const override;
  const ModelFormats& formats() const override { return formats_; }
  Shape input_shape(std::size_t rows) const override { return Shape{rows, image_.c, image_.h, image_.w}; }

  // The arithmetics of the forward pass: training (batch statistics, saving what
  // backward needs), inference in the model's arithmetic (running statistics), and
  // Fp64 (layers.hpp; running statistics).
  struct Train {
    Emulated& e;
    const BatchNormConstants& k;
  };
  struct Infer {
    Emulated& e;
    const BatchNormConstants& k;
  };

 protected:
  // Throws std::invalid_argument unless `image` holds images.
  ImageModel(const char* model, const data::Dataset& image, ModelFormats formats, const emu::MatrixUnit& unit);
  virtual Tensor run(Train a, Tensor x) = 0;
  virtual Tensor run(Infer a, Tensor x) const = 0;
  virtual Tensor run(Fp64 a, Tensor x) const = 0;
  // From the gradient at the logits, sets every Param.grad.
  virtual void backward(Emulated& e, Tensor dlogits) = 0;
  std::size_t rows_per_chunk() const override { return 64; }

  Shape image_;  // n = 1
  std::size_t classes_;
  ModelFormats formats_;
  const emu::MatrixUnit& unit_;
  BatchNormConstants bn_constants_;
};

class ConvNet final : public ImageModel {
 public:
  // Throws std::invalid_argument for flat data or images smaller than 4x4.
  ConvNet(const data::Dataset& image, int width1, int width2, ModelFormats formats, const emu::MatrixUnit& unit);
  std::vector<ParamRef> params() override;

 private:
  template <class Self, class Arith>
  static Tensor forward(Self& self, Arith a, Tensor x);
  Tensor run(Train a, Tensor x) override;
  Tensor run(Infer a, Tensor x) const override;
  Tensor run(Fp64 a, Tensor x) const override;
  void backward(Emulated& e, Tensor dlogits) override;

  ConvLayer conv_[2];
  BatchNormLayer bn_[2];
  ReluLayer relu_[2];
  PoolLayer pool_[2];
  DenseLayer dense_;
};

class ResNet final : public ImageModel {
 public:
  // blocks = N (depth 6N + 2), width = the first stage's channels. Throws
  // std::invalid_argument for flat data.
  ResNet(const data::Dataset& image, int blocks, int width, ModelFormats formats, const emu::MatrixUnit& unit);
  std::vector<ParamRef> params() override;

 private:
  struct Block {
    std::string name;  // stage<s>.block<b>
    ConvLayer conv1, conv2;
    BatchNormLayer bn1, bn2;
    ReluLayer relu1, relu_out;
    bool projection = false;
    ConvLayer shortcut;  // 1x1 with the block's stride, where projection
  };
  template <class Self, class Arith>
  static Tensor forward(Self& self, Arith a, Tensor x);
  Tensor run(Train a, Tensor x) override;
  Tensor run(Infer a, Tensor x) const override;
  Tensor run(Fp64 a, Tensor x) const override;
  void backward(Emulated& e, Tensor dlogits) override;

  ConvLayer stem_;
  BatchNormLayer stem_bn_;
  ReluLayer stem_relu_;
  std::vector<Block> blocks_;
  GlobalPoolLayer pool_;
  DenseLayer dense_;
};

}  // namespace roundoff::train
