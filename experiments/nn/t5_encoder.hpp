// A T5-style encoder stack run forward on emulated arithmetic, every operation under a
// named scope with its element set, so that the FP exception counts and trap reports of
// emu::Context say which operation of which block raised a flag (experiment
// overflow_hunt). The structure is Hugging Face's T5 encoder with FLAN-T5's gated GeLU:
//
//   h = inputs (seq x d_model)
//   per block b:  attention   x = norm(h); q k v = x Wq, x Wk, x Wv; per head
//                             s = q k^T (no 1/sqrt(d_kv): T5 folds it into Wq);
//                             s = s + mask (the mask on padded keys); p = softmax(s);
//                             c = p v; o = c Wo; h = h + o   [clamp_inf]
//                 feed-forward x = norm(h); a = x Wi0; l = x Wi1; g = gelu_new(a);
//                             u = g * l; y = u Wo; h = h + y   [clamp_inf]
//   out = final_norm(h)
//
// norm is T5's RMS norm (no mean, no bias): x * rsqrt(mean(x^2) + eps) * weight.
// gelu_new is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Arithmetic: every matmul goes through a MatrixUnit (inputs: values of `format`; the
// unit's output rounded once into `format` when its own output format differs, op
// "convert", as PyTorch and Poplar write a half result); everything else is emu::Context
// arithmetic in `format`, except what Numerics moves to fp32. exp and tanh are the
// double-precision libm values rounded once into the format (correctly rounded except
// where libm's error, below one double ulp, straddles a rounding boundary of the
// format); x^3 is the exact cube rounded once (op "pow").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/rng.hpp"
#include "emu/unit.hpp"

namespace roundoff::t5 {

// The operations of the model in execution order within a block (final_norm after the
// last block). Scopes: "encoder.block<b>.<op_scope(op)>" and "encoder.final_norm".
enum class Op : int {
  attn_norm,
  attn_q,
  attn_k,
  attn_v,
  attn_scores,
  attn_mask_add,
  attn_softmax,
  attn_context,
  attn_o,
  attn_residual_add,
  ffn_norm,
  ffn_wi_0,
  ffn_wi_1,
  ffn_gelu,
  ffn_gate_mul,
  ffn_wo,
  ffn_residual_add,
  final_norm,
};
inline constexpr int kOps = 18;
const char* op_scope(Op op);        // "attn.norm", ..., "ffn.wo", ..., "final_norm"
std::string op_name(Op op);         // the same with '_' for '.': "attn_norm", "ffn_wo"
inline Op op_at(int index) { return static_cast<Op>(index); }

// Where a scope written by forward() points: its block (-1 for final_norm) and op;
// nullopt for any other scope.
struct Site {
  int block = -1;
  Op op = Op::final_norm;
};
std::optional<Site> parse_scope(std::string_view scope);

struct Shape {
  int d_model = 64;
  int d_ff = 128;
  int n_heads = 4;
  int d_kv = 16;  // per head; the attention's inner width is n_heads * d_kv
  int seq = 32;
  int pad = 8;  // the last `pad` tokens are padding: masked as keys
  int blocks = 4;
  int inner() const { return n_heads * d_kv; }
};

// Scales of the synthetic weights and inputs (every weight a normal draw with std
// gain / sqrt(fan_in); norm weights 1, T5's initial value).
struct Scales {
  double input_std = 1.0;   // the input embeddings (seq x d_model), N(0, input_std^2)
  double qk_gain = 1.0;     // Wq and Wk: scores have std about qk_gain^2 sqrt(d_kv)
  double ffn_gain = 1.0;    // Wi0 and Wi1: the GeLU's inputs have std about ffn_gain
  int outlier_channels = 0;  // residual channels that the FFN's Wo writes large values into
  double outlier_scale = 1.0;  // their Wo columns have std outlier_scale / sqrt(d_ff)
};

// The residual channels that carry outliers: n channels spread evenly over d_model,
// channel i = floor((2i + 1) d_model / (2n)).
std::vector<int> outlier_channel_indices(int d_model, int n);

struct BlockWeights {
  std::vector<double> attn_norm, q, k, v, o;          // q k v: d_model x inner; o: inner x d_model
  std::vector<double> ffn_norm, wi_0, wi_1, wo;      // wi: d_model x d_ff; wo: d_ff x d_model
};

struct Weights {
  std::vector<double> input;  // seq x d_model
  std::vector<BlockWeights> blocks;
  std::vector<double> final_norm;
};

// Synthetic weights and inputs, rounded (rne, saturating) into `format`. Each tensor has
// its own stream: `base` with lane 1 for the inputs and lane 16 + 16 b + m for matrix m
// (q k v o wi_0 wi_1 wo) of block b, so a model with more blocks or other scales keeps
// the same normal draws for what it shares. Needs blocks <= kMaxBlocks.
inline constexpr int kMaxBlocks = 256;
Weights synthetic_weights(const Shape& shape, const Scales& scales, const emu::Format& format, emu::StreamId base);

// What runs in which arithmetic, and the FLAN-T5 port's fixes.
struct Numerics {
  emu::Format format = emu::fp16();  // activations, weights, matmul inputs and outputs
  const emu::MatrixUnit* unit = nullptr;  // takes `format` as input
  bool norm_fp32 = true;     // the RMS norm's statistics and scaling in fp32, then cast
  bool softmax_fp32 = true;  // softmax in fp32 (scores cast up, probabilities cast back)
  double mask_scale = 1.0;   // the mask is mask_scale * -max(format), rounded into format
  bool gelu_clamp = false;   // ReLU where |x| > 39 (the tanh form is never evaluated there)
  bool residual_fp32 = false;  // the residual stream h in fp32
  double wo_scale = 1;       // Wo's input times 1/wo_scale in format, its output times wo_scale in fp32
  // h clamped to +-clamp_bound(format) after each residual add, where h is held in
  // format: Hugging Face clamps fp16 hidden states, never an fp32 stream (residual_fp32).
  bool clamp_inf = false;
};

// Per op: the largest |output| (NaN ignored, inf counts; NaN when every output was NaN),
// and the mean and standard deviation (Welford) of the finite outputs.
struct OpStats {
  double max_abs = std::numeric_limits<double>::quiet_NaN();
  double mean = 0, m2 = 0;
  std::int64_t n = 0, nonfinite = 0;
  void add(double v);
  double std_dev() const;  // population std; NaN when any output was not finite, or none was recorded
};
using Stats = std::array<OpStats, kOps>;

// The forward pass: out (seq x d_model, values of format). `between_blocks` runs before
// each block (e.g. to poll cancellation). Flags, counts and traps go to ctx.
std::vector<double> forward(emu::Context& ctx, const Shape& shape, const Weights& w, const Numerics& num,
                            Stats& stats, const std::function<void()>& between_blocks = {});

// The pieces with published thresholds, for tests.
// T5's additive mask value: mask_scale * -max(format), rounded (rne) into format
// (fp16: 1.0 -> -65504, 0.75 -> -49120, the nearest half to -49128).
double attention_mask_value(const emu::Format& format, double mask_scale);
// Hugging Face's clamp bound, max(format) - 1000 rounded (rne) into format (fp16: 64512,
// the nearest half to 64504).
double clamp_bound(const emu::Format& format);
// gelu_new in format under ctx (ops "pow", "mul", "add", "tanh"); with clamp, ReLU where
// |x| > kGeluClampAt.
inline constexpr double kGeluClampAt = 39;
double gelu_new(emu::Context& ctx, const emu::Format& format, double x, bool clamp);

}  // namespace roundoff::t5
