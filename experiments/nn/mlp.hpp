// Low-precision training on emulated arithmetic: update strategies and optimisers for one
// parameter tensor, a small MLP (Linear -> BatchNorm -> ReLU blocks, then Linear and
// softmax cross-entropy) whose forward and backward passes round every operation through
// emu, and a Trainer that runs one optimiser step at a time (with loss scaling) so that
// experiments and benchmarks can drive it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data_parallel.hpp"
#include "datasets.hpp"
#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/unit.hpp"
#include "layers.hpp"
#include "model.hpp"
#include "op_counts.hpp"

namespace roundoff::train {

// How weights are stored and updated (the issue's `update` parameter).
//  fp32:        everything fp32 (the baseline).
//  fp16-rn:     weights in the weight format (fp16 or bf16), updated with rne: swamping.
//  fp16-sr:     the same with stochastic rounding of the weight update (IPU Method 1).
//  fp32-master: low-precision compute copy, fp32 master weights updated in fp32; the
//               copy is rounded from the master after each step (Micikevicius et al.).
//  fp16-kahan:  low-precision weights plus a low-precision Kahan compensation buffer.
enum class UpdateRule { fp32, fp16_rn, fp16_sr, fp32_master, fp16_kahan };
inline constexpr const char* kUpdateRuleNames[] = {"fp32", "fp16-rn", "fp16-sr", "fp32-master", "fp16-kahan"};

enum class OptimizerKind { sgd, momentum, adam };
inline constexpr const char* kOptimizerNames[] = {"sgd", "momentum", "adam"};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  double momentum = 0.9;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
};

// Formats of one parameter tensor.
struct ParamFormats {
  emu::Format storage;  // the values forward and backward read
  emu::Format arith;    // optimiser arithmetic and the update product lr * direction
  emu::Format state;    // optimiser state (momentum buffer, adam m and v)
  emu::Format master;   // fp32-master's master copy
  // Where a division by the loss scale is rounded; nullopt = arith.
  std::optional<emu::Format> unscale = std::nullopt;
};

// Non-zero finite weight updates, and those lost: the update left the stored state of the
// weight unchanged, i.e. the weight for fp32, fp16-rn and fp16-sr, the master weight for
// fp32-master (the compute copy is derived from it), and the weight AND its compensation
// for fp16-kahan (a step that only moves the compensation buffer is kept there and will
// reach the weight later, so it is not lost). Swamping is what loses them.
struct UpdateCounts {
  std::uint64_t updates = 0, lost = 0;
};

// One optimiser and update rule for one tensor. Per element, g is the gradient in `arith`:
// with divisor 1 grad is converted (rounded) into `arith`; otherwise grad / divisor is
// rounded once into the unscaling format (formats.unscale) and then converted into `arith`
// (exact when `arith` is at least as wide):
//  sgd:      d = g
//  momentum: m = fma(mu, m, g) into `state`; d = m
//  adam:     m = fma(b1, m, (1-b1) g), v = fma(b2, v, (1-b2) g g) into `state`;
//            d = (m / c1) / (sqrt(v / c2) + eps) into `arith`, with c1 = 1 - b1^t and
//            c2 = 1 - b2^t computed in fp64 and rounded into `arith`
//  delta = lr * d into `arith`; then the rule applies w - delta (see UpdateRule).
// Constants (mu, b1, 1-b1, b2, 1-b2, eps) are rounded into the format they are used in:
// eps = 1e-8 becomes 0 in fp16 (smallest subnormal 2^-24 ~ 6e-8).
class Updater {
 public:
  Updater(UpdateRule rule, OptimizerSpec opt, ParamFormats formats);
  UpdateRule rule() const { return rule_; }
  const ParamFormats& formats() const { return formats_; }
  // Sets the tensor from fp64 initial values (rounded into master and storage formats).
  void init(Param& p, const std::vector<double>& initial, emu::Context& ctx) const;
  // Step t (1-based). `lr` must already be a value of formats().arith. `ctx` rounds to
  // nearest; `sr_ctx` (stochastic) rounds fp16-sr's weight update.
  void step(Param& p, std::int64_t t, double grad_divisor, double lr, emu::Context& ctx, emu::Context& sr_ctx,
            UpdateCounts& counts) const;

 private:
  UpdateRule rule_;
  OptimizerSpec opt_;
  ParamFormats formats_;
  double momentum_, beta1_, one_minus_beta1_, beta2_, one_minus_beta2_, eps_;  // rounded
};

// log2 histogram of magnitudes: bin 0 exact zeros; bins 1..56 |v| in [2^e, 2^(e+1)) for
// e = -40..15, values below 2^-40 counted in bin 1 and at or above 2^16 in bin 56;
// bin 57 non-finite. Counts are fractions of all values.
inline constexpr int kHistLowExponent = -40, kHistHighExponent = 16;
inline constexpr int kHistBins = 2 + (kHistHighExponent - kHistLowExponent);  // 58
using Histogram = std::array<double, kHistBins>;
void add_to_histogram(std::array<std::uint64_t, kHistBins>& counts, double v);
Histogram normalise(const std::array<std::uint64_t, kHistBins>& counts);

// Linear -> BatchNorm -> ReLU per hidden width, then Linear (with bias) and softmax
// cross-entropy, from the layers of layers.hpp (each Linear is a dense layer on rows of
// features). Hidden Linears have no bias (batch norm's beta replaces it) and write
// bn_fwd; the last writes act.
// Training mode (forward_backward) normalises with the statistics of the batch at hand
// and updates the running statistics; inference mode (logits, evaluate) normalises with
// the running statistics, as frameworks evaluate a model.
class Mlp final : public Model {
 public:
  Mlp(int inputs, std::vector<int> hidden, int classes, ModelFormats formats, const emu::MatrixUnit& unit);
  int layers() const { return static_cast<int>(weights.size()); }

  // Scopes (relative to the context's): forward.l<k>, forward.bn<k> (batch norm and
  // ReLU), loss, backward.l<k>.bias|dw|dx, backward.bn<k>; elements are (sample,
  // channel or class) or (channel) indices.
  double forward_backward(emu::Context& ctx, const std::vector<double>& x, const std::vector<int>& y,
                          double loss_scale) override;
  // Every matmul through the unit, batch norm in inference mode in bn_fwd, y = fma(gamma,
  // (z - mean) * (1 / sqrt(var + eps)), beta) rounded into act, with the running mean and
  // variance.
  std::vector<double> logits(emu::Context& ctx, const std::vector<double>& x, std::size_t first_row) const override;
  // The parameters' current values in fp64 arithmetic on a whole set, batch norm with the
  // statistics of the whole set (no running statistics, nothing rounded).
  Evaluation evaluate_fp64(const data::Dataset& d) const override;
  // The last layer's bias (l<L>.bias), the weights (l<k>), the batch-norm scales
  // (bn<k>.gamma), the shifts (bn<k>.beta).
  std::vector<ParamRef> params() override;
  const ModelFormats& formats() const override { return formats_; }
  Shape input_shape(std::size_t rows) const override {
    return Shape{rows, static_cast<std::size_t>(widths_[0]), 1, 1};
  }

  std::vector<Param> weights;  // layer l: inputs x outputs, row-major
  Param bias;                  // of the last layer
  std::vector<Param> gamma, beta;  // per hidden layer
  // Per hidden layer, values of bn_fwd: starting at 0 and 1, after each training-mode
  // forward pass r = fma(1 - momentum, r, momentum * s) in bn_fwd with s the batch mean,
  // or the batch variance with Bessel's correction (sum of squares / (B - 1); B = 1:
  // the biased variance 0) for running_var.
  std::vector<std::vector<double>> running_mean, running_var;

 private:
  // Linear layer l through the unit (scope l<k>): z = h W_l (+ bias for the last layer),
  // rounded into act for the last layer and into bn_fwd for the others.
  Tensor linear(Emulated& e, int l, const Tensor& h) const;

  std::vector<int> widths_;  // inputs, hidden..., classes
  ModelFormats formats_;
  const emu::MatrixUnit& unit_;
  BatchNormConstants bn_constants_;
  // Saved by the forward pass for the backward pass, per layer.
  std::vector<Tensor> layer_input_, bn_out_;
  std::vector<BatchNormSaved> bn_saved_;
};

enum class LossScaleKind { none, constant, dynamic };

// The IPU's stochastic rounding during training (train's esr; Graphcore's
// StochasticRoundingBehaviour OFF, ON, REPLICA_IDENTICAL_ONLY):
//  off: round to nearest (the update rule fp16-sr still rounds its weight update
//       stochastically, from a stream all data-parallel replicas share);
//  on:  every operation of the training steps rounds stochastically, each data-parallel
//       replica drawing from its own stream, so replicas drift apart;
//  replica_identical_only: stochastic rounding only where every replica computes the
//       same operation on the same inputs: the all-reduce (its sum is what every replica
//       receives) and the update after it (unscaling, optimiser, weight update), from
//       streams all replicas share; round to nearest in the forward and backward passes
//       and the accumulation, whose inputs are each replica's own data. The replicas stay
//       bit-identical.
enum class EsrMode { off, on, replica_identical_only };
inline constexpr const char* kEsrModeNames[] = {"off", "on", "replica_identical_only"};

// The trained model (train's `model` parameter): the MLP of this file, or the
// convolutional models of convnets.hpp.
enum class ModelKind { mlp, convnet, resnet };
inline constexpr const char* kModelNames[] = {"mlp", "convnet", "resnet"};

// Where the division by the loss scale S (of each gradient, or of the learning rate) is
// rounded before the result is converted into the update arithmetic's format (train's
// unscale_format): arith ("auto") = that format itself (fp32 for fp32 and fp32-master,
// the weight format for fp16-*), fp32, or compute = the format the gradient was computed
// in (grad_format; fp32 for batch-norm parameters under bn_fp32).
enum class UnscaleFormat { arith, fp32, compute };
inline constexpr const char* kUnscaleFormatNames[] = {"auto", "fp32", "compute"};

struct TrainSpec {
  ModelKind model = ModelKind::mlp;
  std::vector<int> hidden = {32};      // mlp: hidden widths
  int conv_width1 = 32, conv_width2 = 32;  // convnet: output channels of its two convolutions
  int resnet_blocks = 1, resnet_width = 16;  // resnet: N (depth 6N + 2) and the first stage's channels
  emu::UnitKind unit = emu::UnitKind::fp32_seq;  // built with input format act_format
  UpdateRule rule = UpdateRule::fp32;
  OptimizerSpec optimizer;
  double lr = 0.01;
  int epochs = 5, batch = 32;
  emu::Format weight_format = emu::fp16(), act_format = emu::fp16(), grad_format = emu::fp16();
  std::optional<emu::Format> state_format;  // nullopt ("auto"): the update arithmetic's format
  emu::Format master_format = emu::fp32(), loss_format = emu::fp32();
  bool bn_fp32 = false;  // batch-norm arithmetic, parameters and running statistics in fp32
  // Batch-norm arithmetic (statistics, normalisation, backward reductions) in fp32, its
  // parameters in their usual formats (bn_format: fp32).
  bool bn_arith_fp32 = false;
  LossScaleKind loss_scale = LossScaleKind::none;
  double scale = 1.0;  // constant S, or dynamic's initial S
  std::int64_t scale_interval = 2000;
  double scale_growth = 2.0, scale_backoff = 0.5;
  bool unscale_lr = false;  // fold 1/S into the learning rate instead of dividing gradients
  UnscaleFormat unscale_format = UnscaleFormat::arith;
  // What every context of the run (training and evaluation) does with floating-point
  // exceptions: traps, counted and overflow (with_fp_exceptions); its rounding and esr
  // are ignored (round to nearest, stochastic where the update rule or `esr` says so).
  emu::FpControl fp_control{};
  // The IPU's $FP_CTL.ESR during training (EsrMode): stochastic rounding
  // (emu::FpControl::esr) draws from the rounding stream's lane 4 (see Trainer for the
  // replicas' streams); evaluation rounds to nearest.
  EsrMode esr = EsrMode::off;
  // Data-parallel replicas R: each computes the gradients of its contiguous share of the
  // batch on its own copy of the model; the gradients are all-reduced in
  // allreduce_format and allreduce_order; each replica updates its own copy.
  int dp_replicas = 1;
  emu::Format allreduce_format = emu::fp32();
  AllReduceOrder allreduce_order = AllReduceOrder::ring;
  // Micro-batches M per optimiser step: each replica's share is cut into M contiguous
  // micro-batches of batch / (R M) samples whose gradients (times the loss scale) are
  // summed in a buffer of accum_format (none when M = 1).
  int grad_accum = 1;
  emu::Format accum_format = emu::fp32();
};

// Parses `loss_scale`: "none", "dynamic" or a positive number. Throws std::invalid_argument.
void parse_loss_scale(const std::string& text, TrainSpec& spec);

// Per-layer statistics of weight gradients (divided by the loss scale in fp64).
struct GradStats {
  std::uint64_t count = 0, zeros = 0;
  double sum = 0.0, sum_squares = 0.0;
  void add(double v);
  double std_dev() const;
};

struct StepResult {
  double loss = 0.0;    // mean batch loss as computed (the mean of the micro-batches' losses)
  double scale = 1.0;   // loss scale used in this step
  bool skipped = false; // dynamic scaling found inf/NaN in a gradient
};

// Trains a model (TrainSpec::model) with update rules, optimiser and loss scaling. Data order: a fresh
// permutation of the training split per epoch; the last incomplete batch is dropped.
// Random streams: initial weights (seed, 0, replica, 1) and batch order (seed, 0,
// replica, 2) do not depend on the grid point, so points differ only in arithmetic;
// stochastic rounding uses `rounding_stream` (lane 3 for the update rule, lane 4 for
// esr). Initialisation: weights He-normal N(0,
// 2 / fan_in) drawn in forward order, batch-norm scales 1, shifts and biases 0.
// Scopes of the counts and traps: init, forward.*, loss, backward.* (the model's
// forward_backward), accumulate.<tensor> (grad_accum > 1), allreduce.<tensor>
// (dp_replicas > 1), update.<tensor> (the model's parameter names: l<k>, l<L>.bias,
// bn<k>.gamma, bn<k>.beta for the MLP; element = the value's flat index), and
// evaluate.train.* / evaluate.test.* (input, the model's layers, loss).
//
// Data parallelism and gradient accumulation (TrainSpec::dp_replicas R, grad_accum M):
// a step's batch of B samples is cut into R contiguous shares, replica r's share into M
// contiguous micro-batches of B / (R M) samples (B must be a multiple of R M). Each
// replica holds its own model (weights, optimiser state, batch-norm running statistics,
// all starting as replica 0's after initialisation) and contexts. For each micro-batch it
// runs forward and backward (the gradient of the micro-batch's mean loss times S) and,
// with M > 1, adds the gradient into its buffer, rounded into accum_format (the first
// micro-batch's gradient is converted into it). With R > 1 the buffers (or gradients) are
// all-reduced (all_reduce in data_parallel.hpp). The sum of the R M gradients then enters
// the update with the division by S R M in place of the division by S (one rounding, or
// lr / (S R M) under unscale: lr); with R M = 1 nothing changes. Dynamic scaling skips
// the step on an inf/NaN in that sum, on every replica. Each replica updates its own
// weights. The update: fp32 baseline accumulates and all-reduces in fp32 whatever the
// format parameters say. Replica r's stochastic rounding (esr: on) draws from lanes
// 3 + 256 r (the update rule) and 4 + 256 r (esr) of the rounding stream; under off and
// replica_identical_only the update rule's lane 3 is shared by all replicas, and under
// replica_identical_only the update draws from lane 4 and the all-reduce from lane 5,
// both shared. Replica 0 is the one that the accessors below, the evaluations and the
// gradient statistics describe.
class Trainer {
 public:
  Trainer(const TrainSpec& spec, std::shared_ptr<const data::Split> data, std::uint64_t seed,
          std::uint32_t replica, emu::StreamId rounding_stream);
  // One optimiser step on the next batch: the benchmark's unit of work.
  StepResult step();
  // One optimiser step on the given rows of the training split (batch of them; replica r
  // takes rows [r B / R, (r + 1) B / R), cut into its micro-batches in order). Counts as a
  // step of the epoch's order. Throws std::invalid_argument for a wrong count or row.
  StepResult step_on(std::span<const std::size_t> rows);
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t steps_taken() const { return steps_; }

  Model& model() { return *replicas_[0].model; }
  const Model& model() const { return *replicas_[0].model; }
  // The model's trainable tensors (Model::params), in update order.
  const std::vector<ParamRef>& params() const { return replicas_[0].params; }
  // Data-parallel replica r's model and trainable tensors (0 <= r < dp_replicas).
  std::size_t replica_count() const { return replicas_.size(); }
  const std::vector<ParamRef>& replica_params(std::size_t r) const { return replicas_.at(r).params; }
  // Layer names: l1.. for the weight tensors in forward order (Linear, convolution or
  // dense), bn1.. for the batch-norm scales (gammas) in forward order.
  const std::vector<std::string>& layer_names() const { return layer_names_; }
  const std::vector<const Param*>& layer_params() const { return layer_params_; }
  double loss_scale() const { return scale_; }
  std::int64_t skipped_steps() const { return skipped_; }
  // Steps whose gradient entering the update (after accumulation and all-reduce) held an
  // inf or NaN (under dynamic scaling: the skipped steps; otherwise applied as they are),
  // and of those, the steps where the accumulation buffer of some replica, or the
  // all-reduce, turned gradients that were all finite into an inf or NaN.
  std::int64_t nonfinite_grad_steps() const { return nonfinite_steps_; }
  std::int64_t accum_overflow_steps() const { return accum_overflow_steps_; }
  std::int64_t allreduce_overflow_steps() const { return allreduce_overflow_steps_; }
  // The update counts of every replica together.
  const UpdateCounts& update_counts() const { return counts_; }
  // The learning rate as the weights' update arithmetic holds it last step (lr / S
  // under unscale: lr), and the largest relative error of that rounding seen so far
  // (1 = underflow to zero).
  double effective_lr() const { return effective_lr_; }
  double effective_lr_error_max() const { return effective_lr_error_max_; }
  // Sticky FP status of the training steps, every replica's (evaluation has its own context).
  emu::Flags flags() const;
  // The counted flags of training (the replicas' in replica order, then the all-reduce's
  // under replica_identical_only) and of the evaluations so far (TrainSpec::fp_control).
  std::vector<emu::OpCount> fp_counts() const;
  // Gradient statistics per layer over all applied steps, and over a window the caller
  // resets (e.g. at the start of the last epoch): of the gradient that enters the
  // update, divided by S R M (the mean gradient of the batch, unscaled).
  std::vector<GradStats> run_stats, window_stats;
  void reset_window() { window_stats.assign(window_stats.size(), GradStats{}); }

  // The model as it would be deployed: inference in its own arithmetic (Mlp::evaluate).
  // Their contexts' counts join fp_counts().
  Evaluation evaluate_train();
  Evaluation evaluate_test();
  Evaluation evaluate_train_fp64() const { return model().evaluate_fp64(data_->train); }
  Evaluation evaluate_test_fp64() const { return model().evaluate_fp64(data_->test); }
  // Fraction of the trainable values (weights, biases, batch-norm gamma and beta)
  // whose stored state (the master copy for fp32-master) differs from its initial value.
  double frac_values_changed() const;
  // The number of one tensor's values whose stored state differs from its initial value
  // (NaN counts as changed). Throws std::logic_error for a tensor not in params().
  std::uint64_t values_changed(const Param& p) const;
  // How far the replicas' stored states (the master copy for fp32-master) of the
  // trainable values have drifted apart, in their formats (all zero for one replica).
  ReplicaDivergence replica_divergence() const;

 private:
  // One data-parallel replica: its model, contexts and accumulation buffers.
  struct Replica {
    std::unique_ptr<Model> model;
    std::vector<ParamRef> params;  // model->params()
    emu::Context ctx;              // forward, backward, accumulation; the update unless update_ctx
    emu::Context sr_ctx;           // the update rule's stochastic rounding (fp16-sr)
    std::optional<emu::Context> update_ctx;       // replica_identical_only: the update's
    std::vector<std::vector<double>> accum;       // per tensor, grad_accum > 1
    emu::Context& update_context() { return update_ctx ? *update_ctx : ctx; }
  };

  // Runs a replica's micro-batches of this step (its share of the rows), leaving their
  // gradients' sum in its params' grad; returns the sum of their losses; sets
  // buffer_overflow when its buffer turned finite gradients into an inf or NaN.
  double replica_gradients(Replica& rep, std::span<const std::size_t> share, bool& buffer_overflow);
  // All-reduces every tensor's gradient across the replicas; true when the sum of
  // finite gradients came out inf or NaN.
  bool all_reduce_gradients();
  // The state format of a tensor (master or storage format of its updater).
  const emu::Format& state_format(const ParamRef& p) const;

  TrainSpec spec_;
  std::shared_ptr<const data::Split> data_;
  ModelFormats formats_;
  emu::Format accum_format_, allreduce_format_;
  std::unique_ptr<emu::MatrixUnit> unit_;
  std::vector<Replica> replicas_;
  std::optional<emu::Context> collective_ctx_;  // the all-reduce's under replica_identical_only
  std::unique_ptr<Updater> weight_updater_, bn_updater_;
  emu::Rng order_rng_;
  std::vector<double> train_x_;  // standardised inputs rounded into the act format
  std::vector<std::size_t> order_;
  std::int64_t steps_per_epoch_ = 0, steps_ = 0, applied_ = 0, skipped_ = 0, clean_run_ = 0;
  std::int64_t nonfinite_steps_ = 0, accum_overflow_steps_ = 0, allreduce_overflow_steps_ = 0;
  double scale_ = 1.0, effective_lr_ = 0.0, effective_lr_error_max_ = 0.0;
  UpdateCounts counts_;
  std::vector<std::string> layer_names_;
  std::vector<const Param*> layer_params_;
  std::vector<std::vector<double>> initial_state_;  // per trainable tensor, see frac_values_changed
  std::uint64_t changed_values(std::size_t tensor) const;  // of params()[tensor]
  std::vector<emu::OpCount> evaluation_counts_;
  Evaluation evaluate(const data::Dataset& d, const char* scope);
};

// The fraction of non-zero finite values that a cast into `f` after scaling by `scale`
// (x * scale rounded once, rne, IEEE overflow) turns into zero, into inf/NaN, and into
// subnormals (precision lost); the denominator is the count of non-zero finite values.
struct CastLoss {
  double underflow = 0.0, overflow = 0.0, subnormal = 0.0;
};
CastLoss cast_loss(const std::vector<double>& values, const emu::Format& f, double scale);

}  // namespace roundoff::train
