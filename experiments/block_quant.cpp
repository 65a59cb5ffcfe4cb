// block_quant: the quantisation error of block formats (OCP MX, NVFP4: emu/block.hpp)
// over distributions with outliers, per format, scale rule and element rounding.
//  - A run draws n values x (normal; normal with a fraction of outliers at +-k sigma;
//    laplace; lognormal magnitudes with random signs; every value times `scale`),
//    quantises them as one array (consecutive blocks; nvfp4 with the array's tensor
//    scale) and compares the dequantised values q with x.
//  - Common random numbers: x = scale * z, z depends only on (seed, replica, n,
//    distribution and its parameters), drawn from the run's stream with lane 1 and the
//    point index replaced by a hash of those parameters, so every format, rule and
//    rounding at a grid point sees the same values, and every scale the same z. Stochastic rounding takes its bits from the run's
//    own stream (lane 2), value by value.
//  - Errors e = q - x are formed exactly and rounded once (TwoSum); statistics over the
//    finite q (non-finite ones, NaN blocks or inf elements, are counted apart).
//  - fp_exceptions: scope quantize, op quantize, element = the value's index (a block's
//    scale flags at its first element).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/block.hpp"
#include "experiment.hpp"

namespace roundoff {

namespace {

constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();

enum class Distribution { normal, outliers, laplace, lognormal };
constexpr const char* kDistributionNames[] = {"normal", "outliers", "laplace", "lognormal"};

// The spellings of scale_rule: default (the format's own rule), then emu's scale rules.
std::vector<std::string> scale_rule_spellings() {
  std::vector<std::string> spellings = {"default"};
  for (const auto& row : emu::scale_rule_table()) spellings.emplace_back(row.name);
  return spellings;
}

// A point's parameters, typed once.
struct Point {
  const emu::BlockFormat& format;
  std::optional<emu::ScaleRule> scale_rule;  // nullopt: the format's default
  emu::FpControl control;
  Distribution distribution;
  double outlier_fraction, outlier_sigma, spread, scale;
  std::size_t n;

  explicit Point(const Params& p)
      : format(emu::block_format_by_name(p.string("format"))),
        scale_rule(p.string("scale_rule") == "default"
                       ? std::nullopt
                       : std::optional(emu::scale_rule_by_name(p.string("scale_rule")))),
        control(with_fp_exceptions(emu::FpControl{.rounding = emu::rounding_by_name(p.string("rounding")),
                                                  .overflow = emu::overflow_by_name(p.string("overflow")),
                                                  .sr_bits = static_cast<int>(p.integer("sr_bits"))},
                                   p)),
        distribution(p.choice<Distribution>("distribution", kDistributionNames)),
        outlier_fraction(p.real("outlier_fraction")),
        outlier_sigma(p.real("outlier_sigma")),
        spread(p.real("spread")),
        scale(p.real("scale")),
        n(static_cast<std::size_t>(p.integer("n"))) {}
};

// The data's point index: a hash of exactly the parameters the values depend on.
std::uint32_t data_point(const Point& p) {
  auto bits = [](double v) { return std::to_string(std::bit_cast<std::uint64_t>(v)); };
  std::string key = "block_quant data;n=" + std::to_string(p.n) +
                    ";distribution=" + kDistributionNames[static_cast<int>(p.distribution)];
  if (p.distribution == Distribution::outliers)
    key += ";fraction=" + bits(p.outlier_fraction) + ";k=" + bits(p.outlier_sigma);
  if (p.distribution == Distribution::lognormal) key += ";spread=" + bits(p.spread);
  return stable_hash32(key);
}

// Unit variance for normal, laplace and outliers' bulk; lognormal: exp(spread N(0, 1)).
double draw(emu::Rng& rng, const Point& p) {
  switch (p.distribution) {
    case Distribution::normal: return rng.normal();
    case Distribution::outliers: {
      const double z = rng.normal();
      if (rng.uniform() < p.outlier_fraction) return std::copysign(p.outlier_sigma, z);
      return z;
    }
    case Distribution::laplace: {
      // Inverse CDF with b = 1/sqrt(2) (variance 2 b^2 = 1); u in (-1/2, 1/2).
      const double u = rng.uniform() - 0.5;
      const double b = 1 / std::sqrt(2.0);
      return -b * std::copysign(std::log1p(-2 * std::fabs(u)), u);
    }
    case Distribution::lognormal: break;
  }
  const double magnitude = std::exp(p.spread * rng.normal());
  return (rng.next_u64() & 1) ? -magnitude : magnitude;
}

emu::BlockSpec block_spec(const Point& p, const emu::FpControl& control) {
  emu::BlockSpec spec = emu::default_block_spec(p.format);
  if (p.scale_rule) spec.rule = *p.scale_rule;
  spec.element = emu::RoundSpec{control.rounding, control.overflow, control.sr_bits, control.tininess};
  return spec;
}

RunResult run_block_quant(const Params& params, const RunEnv& env) {
  const Point point(params);
  const emu::BlockFormat& f = point.format;
  const std::size_t n = point.n;

  emu::StreamId data_stream = env.stream;  // seed and replica
  data_stream.point = data_point(point);
  data_stream.lane = 1;
  emu::Rng data(data_stream);
  std::vector<double> x(n);
  for (double& v : x) v = point.scale * draw(data, point);
  if (env.cancelled()) throw Cancelled();

  emu::StreamId rounding_stream = env.stream;
  rounding_stream.lane = 2;
  emu::Context ctx(point.control, emu::Rng(rounding_stream));
  const emu::BlockQuantized q = emu::quantize(f, x, block_spec(point, ctx.control), &ctx.rng());

  // Flags through the context, value by value, so that count and trap name the value.
  {
    const emu::Scope scope(ctx, "quantize");
    for (std::size_t i = 0; i < n; ++i) {
      emu::Flags raised = q.element_flags[i];
      if (i % static_cast<std::size_t>(f.block_size()) == 0) raised |= q.scales[q.block_of(i, f)].scale_flags;
      if (raised == 0) continue;
      const emu::ElementGuard element(ctx, static_cast<std::int64_t>(i));
      ctx.raise_flags(raised, "quantize", {x[i]}, q.value(i, f));
    }
  }

  double sum_sq_x = 0, sum_sq_e = 0, sum_aligned = 0, max_abs = 0, max_rel = 0;
  std::size_t finite = 0, nonfinite = 0, flushed = 0, saturated = 0, nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = q.value(i, f);
    if (q.element_flags[i] & emu::OFLO) ++saturated;
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    ++finite;
    const double e = emu::exact_add(v, -x[i]).hi;  // q - x rounded once
    sum_sq_x += x[i] * x[i];
    sum_sq_e += e * e;
    sum_aligned += std::copysign(1.0, x[i]) * e;  // > 0: away from zero
    max_abs = std::max(max_abs, std::fabs(e));
    if (x[i] != 0) {
      ++nonzero;
      max_rel = std::max(max_rel, std::fabs(e) / std::fabs(x[i]));
      if (v == 0) ++flushed;
    }
  }
  const double count = static_cast<double>(finite);
  const double rms_x = finite ? std::sqrt(sum_sq_x / count) : kUndefined;
  const double rms_e = finite ? std::sqrt(sum_sq_e / count) : kUndefined;
  RunResult r;
  r.metrics = {
      {"rms_error", rms_e},
      {"rel_rms_error", finite && rms_x > 0 ? rms_e / rms_x : kUndefined},
      {"sqnr_db", finite && sum_sq_e > 0 ? 10 * std::log10(sum_sq_x / sum_sq_e) : kUndefined},
      {"max_abs_error", finite ? max_abs : kUndefined},
      {"max_rel_error", nonzero ? max_rel : kUndefined},
      {"rel_bias", finite && rms_x > 0 ? sum_aligned / count / rms_x : kUndefined},
      {"frac_flushed", nonzero ? static_cast<double>(flushed) / static_cast<double>(nonzero) : kUndefined},
      {"frac_saturated", static_cast<double>(saturated) / static_cast<double>(n)},
      {"frac_nonfinite", static_cast<double>(nonfinite) / static_cast<double>(n)},
  };
  r.flags = ctx.status();
  r.fp_counts = ctx.counts();
  return r;
}

Experiment make_block_quant() {
  Experiment e;
  e.name = "block_quant";
  e.description = "quantisation error (RMS, max, relative, bias) of OCP MX and NVFP4 block formats over "
                  "distributions with outliers, per scale rule and element rounding";
  e.params = {
      string_param("format", "mxfp8-e4m3",
                   "block format: mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2 mxfp4-e2m1 mxint8 (OCP MX v1.0: 32 "
                   "elements, E8M0 scale) or nvfp4 (16 E2M1 elements, UE4M3 scale, fp32 tensor scale)",
                   {}, check_block_format_name),
      string_param("scale_rule", "default",
                   "how a block's scale follows from its largest magnitude: default (floor for MX, nearest for "
                   "nvfp4), floor (OCP), ceil, even (torchao), up (NVIDIA), nearest; nvfp4 takes up and nearest",
                   scale_rule_spellings()),
      string_param("rounding", "rne",
                   "rounding of the elements: " + emu::name_list(emu::rounding_table()) + " (bits from lane 2)", {},
                   check_rounding_name),
      int_param("sr_bits", 0, "random bits of stochastic rounding: 0 = exact probabilities, k = hardware-style k-bit",
                0, 64),
      string_param("overflow", "saturate",
                   "what an element beyond the element format's range becomes: saturate (OCP MX), nan or inf (as "
                   "emu::round: E5M2 inf, E4M3 NaN; FP6, FP4, INT8 saturate whatever the policy)",
                   {"saturate", "nan", "inf"}),
      string_param("distribution", "normal",
                   "values: normal N(0,1); outliers: N(0,1) with a fraction outlier_fraction replaced by "
                   "+-outlier_sigma; laplace (unit variance); lognormal: +-exp(spread N(0,1)), random sign",
                   names_of(kDistributionNames)),
      real_param("outlier_fraction", 0.001, "outliers: probability of each value to be an outlier", 0, 1),
      real_param("outlier_sigma", 20.0, "outliers: their magnitude in standard deviations (k)", 0),
      real_param("spread", 1.0, "lognormal: sigma of the log", 0, 20),
      real_param("scale", 1.0, "every value is multiplied by this (to move the data across the formats' ranges)"),
      int_param("n", 65536, "number of values, quantised as one array (consecutive blocks)", 1, 1 << 24),
  };
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  e.metrics = {
      {"rms_error", "sqrt(mean (q - x)^2) over the finite dequantised values q"},
      {"rel_rms_error", "rms_error / sqrt(mean x^2) (the inverse of the signal-to-noise amplitude ratio)"},
      {"sqnr_db", "10 log10(sum x^2 / sum (q - x)^2), signal-to-quantisation-noise ratio in dB"},
      {"max_abs_error", "largest |q - x| over the finite q"},
      {"max_rel_error", "largest |q - x| / |x| over x != 0 with finite q (1 where a value was flushed to 0)"},
      {"rel_bias", "mean of sign(x) (q - x) over the finite q, / sqrt(mean x^2): < 0 toward zero (rz, few-bit "
                   "sr; exact sr only where elements saturate); rne's depends on how the values fill the grid"},
      {"frac_flushed", "fraction of the non-zero x whose q is 0 (below the element grid of their block)"},
      {"frac_saturated", "fraction of the values whose element overflowed (saturated, or inf/NaN by the policy)"},
      {"frac_nonfinite", "fraction of the values whose q is inf or NaN (left out of the errors)"},
  };
  e.headline_metric = "rel_rms_error";
  e.run = run_block_quant;
  e.check_point = [](const Params& p) -> std::string {
    const Point point(p);
    const emu::BlockFormat& f = point.format;
    if (point.scale_rule && !f.accepts(*point.scale_rule))
      return "scale_rule " + p.string("scale_rule") + " needs a power-of-two scale; " + f.name() + "'s scale is " +
             f.scale().name() + " (take up, nearest or default)";
    if (p.boolean("nanoo") && p.string("overflow") != "nan")
      return "nanoo: true (NaN on overflow) contradicts overflow: " + p.string("overflow") +
             "; nanoo: true goes with overflow: nan, or leave nanoo false";
    if (!std::isfinite(point.scale) || point.scale == 0) return "scale must be finite and non-zero";
    return "";
  };
  e.fp_exceptions_note =
      "scope: quantize (op quantize; element = the value's index; a block's scale flags, OFLO for a scale "
      "beyond E8M0 and INV for an infinite value, are raised at its first element)";
  return e;
}

const Registration registration(make_block_quant());

}  // namespace

}  // namespace roundoff
