// overflow_hunt: the FLAN-T5 float16 port's hunt for overflows, on a small T5-style
// encoder (experiments/nn/t5_encoder.hpp) run forward with every operation emulated and
// named, and the port's fixes as parameters.
//  - Published overflows (Graphcore, "Running Flan-T5-XL inference in Float16 for IPU -
//    how we did it", 2023): the additive attention mask (T5 adds finfo(fp16).min =
//    -65504 to masked scores: at mask_scale 1.0 a masked score <= -16 overflows; at
//    0.75 the mask is -49120 and only scores <= -16400 do), the cube of the tanh GeLU
//    (x^3 overflows fp16 for x >= 40.34375), the pre-norm residual adds and the FFN
//    down projection wo (heavy-tailed FFN activations, std about 4400 at wo's output).
//  - Weights and inputs: synthetic (t5::synthetic_weights) from the stream (seed,
//    point 0, replica, lane 1, 16, 17, ...) whatever the grid point, so every point of a
//    config runs the same model on the same inputs (common random numbers): only the
//    arithmetic and the fixes differ between points.
//  - Overflow policy: nanoo false saturates to +-max (the IPU with NANOO off), true
//    gives NaN and raises INV (NANOO on). Either way the overflow raises OFLO.
//  - The exception counts behind the flag metrics: the enabled flags (oflo, div0, inv)
//    are counted per (scope, op) in every fp_exceptions mode; RunResult::fp_counts
//    carries them in mode count (the /counts table), trap ends the run at the first.
//  - Reference: the same weights and inputs through the same code in fp32 (fp32-seq
//    matmuls with fp32 inputs, T5's fp32 mask of -max(fp32), no fixes); the errors
//    compare the final norm's output on the real (unpadded) tokens.
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/unit.hpp"
#include "experiment.hpp"
#include "nn/t5_encoder.hpp"

namespace roundoff {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The IPU's three exception flags, as the metrics name them.
struct FlagName {
  emu::Flag flag;
  const char* param;  // the enable parameter and the metric prefix
};
constexpr FlagName kFlags[] = {{emu::OFLO, "oflo"}, {emu::DIV0, "div0"}, {emu::INV, "inv"}};

std::string unit_list() {
  std::string names;
  for (const char* const* n = emu::unit_names(); *n; ++n) names += std::string(names.empty() ? "" : " ") + *n;
  return names;
}

std::string op_list() {
  std::string list;
  for (int i = 0; i < t5::kOps; ++i)
    list += (i ? ", " : "") + std::to_string(i) + " " + t5::op_name(t5::op_at(i));
  return list;
}

t5::Shape shape_of(const Params& p) {
  t5::Shape s;
  s.d_model = static_cast<int>(p.integer("d_model"));
  s.d_ff = static_cast<int>(p.integer("d_ff"));
  s.n_heads = static_cast<int>(p.integer("n_heads"));
  s.d_kv = static_cast<int>(p.integer("d_kv"));
  s.seq = static_cast<int>(p.integer("seq"));
  s.pad = static_cast<int>(p.integer("pad"));
  s.blocks = static_cast<int>(p.integer("blocks"));
  return s;
}

emu::Flags enabled_flags(const Params& p) {
  emu::Flags enabled = 0;
  for (const FlagName& f : kFlags)
    if (p.boolean(f.param)) enabled |= f.flag;
  return enabled;
}

// ||y - r|| / ||r|| and the cosine of the angle between y and r over the first n values;
// NaN where y holds a non-finite value or a norm is zero.
struct Comparison {
  double rel_error = kNaN, cosine = kNaN, frac_nonfinite = 0;
};
Comparison compare(const std::vector<double>& y, const std::vector<double>& r, std::size_t n) {
  Comparison c;
  double diff = 0, yy = 0, rr = 0, yr = 0;
  std::size_t nonfinite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) {
      ++nonfinite;
      continue;
    }
    diff += (y[i] - r[i]) * (y[i] - r[i]);
    yy += y[i] * y[i];
    rr += r[i] * r[i];
    yr += y[i] * r[i];
  }
  c.frac_nonfinite = static_cast<double>(nonfinite) / static_cast<double>(n);
  if (nonfinite > 0) return c;
  if (rr > 0) c.rel_error = std::sqrt(diff) / std::sqrt(rr);
  if (rr > 0 && yy > 0) c.cosine = yr / (std::sqrt(yy) * std::sqrt(rr));
  return c;
}

RunResult run(const Params& p, const RunEnv& env) {
  const t5::Shape shape = shape_of(p);
  t5::Scales scales;
  scales.input_std = p.real("input_std");
  scales.qk_gain = p.real("qk_gain");
  scales.ffn_gain = p.real("ffn_gain");
  scales.outlier_channels = static_cast<int>(p.integer("outlier_channels"));
  scales.outlier_scale = p.real("outlier_scale");

  t5::Numerics num;
  num.format = emu::format_by_name(p.string("format"));
  const auto unit = emu::make_unit(emu::unit_kind_by_name(p.string("unit")), num.format);
  num.unit = unit.get();
  num.norm_fp32 = p.boolean("norm_fp32");
  num.softmax_fp32 = p.boolean("softmax_fp32");
  num.mask_scale = p.real("mask_scale");
  num.gelu_clamp = p.boolean("gelu_clamp");
  num.residual_fp32 = p.boolean("residual_fp32");
  num.wo_scale = static_cast<double>(p.integer("wo_scale"));
  num.clamp_inf = p.boolean("clamp_inf");

  emu::StreamId weights_stream = env.stream;
  weights_stream.point = 0;
  const t5::Weights weights = t5::synthetic_weights(shape, scales, num.format, weights_stream);
  auto poll = [&] {
    if (env.cancelled()) throw Cancelled();
  };

  emu::FpControl control;
  control.overflow = emu::Overflow::saturate;  // the IPU with NANOO off
  control = with_fp_exceptions(control, p);
  const emu::Flags enabled = enabled_flags(p);
  control.counted |= enabled;  // the flag metrics, in every mode
  emu::Context ctx(control);
  t5::Stats stats;
  const std::vector<double> out = t5::forward(ctx, shape, weights, num, stats, poll);

  const auto reference_unit = emu::make_unit(emu::UnitKind::fp32_seq, emu::fp32(), emu::fp32());
  t5::Numerics reference_num;
  reference_num.format = emu::fp32();
  reference_num.unit = reference_unit.get();
  emu::Context reference_ctx;
  t5::Stats reference_stats;
  const std::vector<double> reference = t5::forward(reference_ctx, shape, weights, reference_num, reference_stats, poll);

  RunResult result;
  result.flags = ctx.status();
  if (emu::exception_mode_by_name(p.string("fp_exceptions")) == emu::ExceptionMode::count)
    merge_counts(result.fp_counts, ctx.counts());

  // Per flag and op kind (summed over blocks): how many operations raised it; the first.
  std::map<std::string, double> counts;
  std::map<std::string, std::pair<double, double>> first;  // flag -> (op index, block)
  for (const emu::OpCount& c : ctx.counts()) {
    const auto site = t5::parse_scope(c.scope);
    if (!site) continue;
    for (const FlagName& f : kFlags) {
      if (c.flag != f.flag) continue;
      counts[std::string(f.param) + "_" + t5::op_name(site->op)] += static_cast<double>(c.count);
      const double block = site->op == t5::Op::final_norm ? shape.blocks : site->block;
      first.emplace(f.param, std::make_pair(static_cast<double>(static_cast<int>(site->op)), block));
    }
  }
  for (const FlagName& f : kFlags) {
    const bool counted = (enabled & f.flag) != 0;
    double total = 0;
    for (int i = 0; i < t5::kOps; ++i) {
      const std::string name = std::string(f.param) + "_" + t5::op_name(t5::op_at(i));
      const double n = counts.count(name) ? counts[name] : 0.0;
      result.metrics[name] = counted ? n : kNaN;
      total += n;
    }
    result.metrics[std::string(f.param) + "_total"] = counted ? total : kNaN;
    const auto it = first.find(f.param);
    result.metrics[std::string("first_") + f.param + "_op"] = it != first.end() ? it->second.first : kNaN;
    result.metrics[std::string("first_") + f.param + "_block"] = it != first.end() ? it->second.second : kNaN;
  }
  for (int i = 0; i < t5::kOps; ++i) {
    const std::string name = t5::op_name(t5::op_at(i));
    result.metrics["max_abs_" + name] = stats[static_cast<std::size_t>(i)].max_abs;
    result.metrics["std_" + name] = stats[static_cast<std::size_t>(i)].std_dev();
  }
  const std::size_t real_values =
      static_cast<std::size_t>(shape.seq - shape.pad) * static_cast<std::size_t>(shape.d_model);
  const Comparison c = compare(out, reference, real_values);
  result.metrics["rel_error"] = c.rel_error;
  result.metrics["cosine_similarity"] = c.cosine;
  result.metrics["frac_nonfinite"] = c.frac_nonfinite;
  return result;
}

std::string check_point(const Params& p) {
  const std::string& unit = p.string("unit");
  const std::string& format = p.string("format");
  const emu::Format input = emu::format_by_name(format);
  try {
    (void)emu::make_unit(emu::unit_kind_by_name(unit), input);
  } catch (const std::invalid_argument& e) {
    return "unit " + unit + " does not take format " + format + " (its matmul input format): " + e.what();
  }
  if (input.precision() > 26)
    return "format " + format + " has more than 26 significant bits (the model runs in formats up to fp32)";
  if (p.integer("pad") >= p.integer("seq")) return "pad must be less than seq (every query needs a real key)";
  if (p.integer("outlier_channels") > p.integer("d_model")) return "outlier_channels must be at most d_model";
  const std::int64_t wo_scale = p.integer("wo_scale");
  if ((wo_scale & (wo_scale - 1)) != 0) return "wo_scale must be a power of two (1, 2, 4, 8, ...)";
  return "";
}

std::vector<ParamSpec> params() {
  std::vector<ParamSpec> specs = {
      string_param("unit", "ipu-amp",
                   "matrix unit of every matmul (inputs in format; its output rounded into format where it "
                   "writes another): " + unit_list(),
                   {}, check_unit_name),
      string_param("format", "fp16",
                   "activations and weights (the unit must take it as input; at most fp32's 24 bits)", {},
                   check_format_name),
      int_param("blocks", 4, "encoder blocks", 1, t5::kMaxBlocks),
      int_param("d_model", 64, "width of the residual stream", 1, 4096),
      int_param("d_ff", 128, "width of the gated FFN (wi_0, wi_1 outputs)", 1, 16384),
      int_param("n_heads", 4, "attention heads", 1, 64),
      int_param("d_kv", 16, "width of each head's queries, keys and values", 1, 1024),
      int_param("seq", 32, "tokens", 2, 4096),
      int_param("pad", 8, "the last pad tokens are padding, masked as keys (the errors leave them out)", 0, 4095),
      real_param("input_std", 1.0, "std of the synthetic input embeddings", 0, 1e4),
      real_param("qk_gain", 1.5,
                 "Wq and Wk have std qk_gain / sqrt(d_model): scores have std about qk_gain^2 sqrt(d_kv)", 0, 1e4),
      real_param("ffn_gain", 12, "wi_0 and wi_1 have std ffn_gain / sqrt(d_model): the GeLU's input has std about "
                                 "ffn_gain", 0, 1e4),
      int_param("outlier_channels", 2,
                "residual channels, spread evenly over d_model, that wo writes large values into (T5's "
                "heavy-tailed FFN outputs)",
                0, 4096),
      real_param("outlier_scale", 240, "wo's columns into the outlier channels have std outlier_scale / sqrt(d_ff)",
                 0, 1e6),
      bool_param("norm_fp32", true, "the RMS norm's statistics and scaling in fp32, cast to format after (the port)"),
      bool_param("softmax_fp32", true, "softmax in fp32: scores cast up, probabilities cast back (the port)"),
      real_param("mask_scale", 1.0,
                 "fix: the attention mask is mask_scale * -max(format) rounded into format (1.0: T5's finfo.min; "
                 "the port's 0.75: -49120 in fp16)",
                 0, 1),
      bool_param("gelu_clamp", false, "fix: GeLU is ReLU where |x| > 39 (the tanh form, whose cube overflows fp16 "
                                      "from 40.34375 on, is not evaluated there)"),
      bool_param("residual_fp32", false,
                 "fix: the residual stream in fp32 (norm outputs cast to format, sublayer outputs added in fp32)"),
      int_param("wo_scale", 1,
                "fix: a power of two s; wo's input times 1/s in format, its output times s in fp32 (1: off)", 1,
                1 << 20),
      bool_param("clamp_inf", false,
                 "fix (Hugging Face's, treats the symptom): the residual clamped to +-(max(format) - 1000) after each "
                 "residual add, where the residual is in format (not with residual_fp32: HF clamps fp16 only)"),
  };
  for (ParamSpec& s : fp_exception_params()) {
    if (s.name == "fp_exceptions") s.default_value = std::string("count");
    if (s.name == "nanoo")
      s.meaning = "true: an overflow gives NaN and raises INV (the IPU's $FP_CTL.NANOO); false: it saturates to "
                  "+-max(format) (the IPU with NANOO off); OFLO either way";
    specs.push_back(std::move(s));
  }
  return specs;
}

std::vector<MetricSpec> metrics() {
  std::vector<MetricSpec> m;
  for (const FlagName& f : kFlags) {
    const std::string flag = f.param;
    for (int i = 0; i < t5::kOps; ++i) {
      const std::string op = t5::op_name(t5::op_at(i));
      m.push_back({flag + "_" + op, "operations in " + std::string(t5::op_scope(t5::op_at(i))) + " (all blocks) that raised " +
                                        flag + " (NaN when " + flag + " is off)"});
    }
    m.push_back({flag + "_total", "operations of the whole model that raised " + flag + " (NaN when " + flag +
                                      " is off)"});
    m.push_back({"first_" + flag + "_op", "the op that raised " + flag + " first, as its index: " + op_list() +
                                              " (NaN: none)"});
    m.push_back({"first_" + flag + "_block",
                 "the block of that op, 0-based (the final norm: blocks; NaN: none)"});
  }
  for (int i = 0; i < t5::kOps; ++i) {
    const std::string op = t5::op_name(t5::op_at(i));
    const std::string scope = t5::op_scope(t5::op_at(i));
    m.push_back({"max_abs_" + op, "largest |output| of " + scope + " over all blocks (NaN ignored)"});
    m.push_back({"std_" + op,
                 "standard deviation of the outputs of " + scope + " over all blocks (NaN if any is not finite)"});
  }
  m.push_back({"rel_error", "||out - ref|| / ||ref|| over the real tokens, ref the fp32 run (NaN if out is not "
                            "finite)"});
  m.push_back({"cosine_similarity", "cosine of the angle between out and the fp32 ref over the real tokens"});
  m.push_back({"frac_nonfinite", "fraction of the output (real tokens) that is inf or NaN"});
  return m;
}

Experiment make_overflow_hunt() {
  Experiment e;
  e.name = "overflow_hunt";
  e.description =
      "FLAN-T5's fp16 overflows (mask add, GeLU cube, residual adds, wo) on a T5-style encoder, with the port's fixes";
  e.params = params();
  e.metrics = metrics();
  e.headline_metric = "oflo_total";
  e.run = run;
  e.check_point = check_point;
  e.fp_exceptions_note =
      "scopes: encoder.block<b>.attn.<op> and encoder.block<b>.ffn.<op> (the op list of configs/README.md: "
      "attn.norm ... ffn.residual_add), encoder.final_norm; element = [row, column] of the op's output, "
      "[head, query, key] for per-head tensors, [row] for a norm's per-row statistics; the fp32 reference run is "
      "not counted. nanoo: false saturates to +-max (the IPU with NANOO off)";
  return e;
}

const Registration registration(make_overflow_hunt());

}  // namespace

}  // namespace roundoff
