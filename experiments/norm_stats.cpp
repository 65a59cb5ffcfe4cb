// norm_stats: the mean and variance of activation vectors with a large mean, as a
// normalisation layer (LayerNorm, BatchNorm) computes them in low precision: naive
// E[x^2] - E[x]^2, two-pass (Poplar's use_stable_statistics) or Welford, every operation
// rounded into the accumulation format (norm_stats.hpp has the algorithms, their scopes
// and their error bounds).
//  - A run computes the statistics of `vectors` vectors of `length` values
//    x = mean + spread * z, z standard normal, each rounded once (rne) into `format`;
//    a block format (OCP MX, NVFP4) quantises each vector in blocks along it (its
//    default scale rule, elements rne and saturating; nvfp4 with the vector's own
//    tensor scale) and the statistics take the dequantised values, as a LayerNorm
//    reading MX-stored activations would.
//  - Common random numbers: vector j's z values are the first `length` normals of the
//    stream (seed, 0, replica, lane 1 + j). They depend neither on the point's place in
//    the grid nor on mean, spread, algorithm or accumulation, and a shorter vector is a
//    prefix of a longer one, so every point compares like with like. Stochastic rounding
//    takes its bits from the run's own stream (lane 0).
//  - The reference is the exact mean and variance of the rounded inputs (a long
//    fixed-point accumulator: n sum x^2 - (sum x)^2 = n^2 V without rounding); every
//    error is formed exactly and rounded once.
#include "norm_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/exact_sum.hpp"
#include "emu/format.hpp"
#include "emu/unit_request.hpp"
#include "experiment.hpp"

namespace roundoff {

namespace norm_stats {

namespace {

constexpr const char* kAlgorithmNames[] = {"naive", "two_pass", "welford"};

// sum over i of term(i) (which may compute), added in index order in the accumulation
// format, in scope `name`, each step at element [row, i]: the passes of two_pass.
template <typename Term>
double sequential_sum(emu::Context& ctx, const emu::Format& acc, std::int64_t n, std::int64_t row, const char* name,
                      Term term) {
  emu::Scope scope(ctx, name);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    emu::ElementGuard element(ctx, row * n + i, {row, i});
    sum = ctx.add(acc, sum, term(i));
  }
  return sum;
}

// sum / n (scope "<algorithm>.mean").
double mean_of(emu::Context& ctx, const emu::Format& acc, double sum, std::int64_t n, std::int64_t row) {
  emu::Scope scope(ctx, "mean");
  emu::ElementGuard element(ctx, row, {row});
  return ctx.div(acc, sum, static_cast<double>(n));
}

// One pass, as hardware runs it: the two sums advance together, so that the first
// exception is the one a one-pass kernel would raise first.
Moments naive(emu::Context& ctx, const emu::Format& acc, std::span<const double> x, std::int64_t row) {
  const auto n = static_cast<std::int64_t>(x.size());
  double sum = 0.0, sum_sq = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    emu::ElementGuard element(ctx, row * n + i, {row, i});
    {
      emu::Scope scope(ctx, "sum");
      sum = ctx.add(acc, sum, x[i]);
    }
    emu::Scope scope(ctx, "sum_sq");
    sum_sq = ctx.add(acc, sum_sq, ctx.mul(acc, x[i], x[i]));
  }
  Moments m;
  m.mean = mean_of(ctx, acc, sum, n, row);
  emu::Scope scope(ctx, "var");
  emu::ElementGuard element(ctx, row, {row});
  const double mean_sq = ctx.div(acc, sum_sq, static_cast<double>(n));
  m.var = ctx.sub(acc, mean_sq, ctx.mul(acc, m.mean, m.mean));
  return m;
}

Moments two_pass(emu::Context& ctx, const emu::Format& acc, std::span<const double> x, std::int64_t row) {
  const auto n = static_cast<std::int64_t>(x.size());
  Moments m;
  m.mean = mean_of(ctx, acc, sequential_sum(ctx, acc, n, row, "sum", [&](std::int64_t i) { return x[i]; }), n, row);
  const double sum_sq_dev = sequential_sum(ctx, acc, n, row, "sum_sq_dev", [&](std::int64_t i) {
    const double dev = ctx.sub(acc, x[i], m.mean);
    return ctx.mul(acc, dev, dev);
  });
  emu::Scope scope(ctx, "var");
  emu::ElementGuard element(ctx, row, {row});
  m.var = ctx.div(acc, sum_sq_dev, static_cast<double>(n));
  return m;
}

Moments welford(emu::Context& ctx, const emu::Format& acc, std::span<const double> x, std::int64_t row) {
  const auto n = static_cast<std::int64_t>(x.size());
  Moments m;
  double m2 = 0.0;
  {
    emu::Scope scope(ctx, "update");
    for (std::int64_t i = 0; i < n; ++i) {
      emu::ElementGuard element(ctx, row * n + i, {row, i});
      const double delta = ctx.sub(acc, x[i], m.mean);
      m.mean = ctx.add(acc, m.mean, ctx.div(acc, delta, static_cast<double>(i + 1)));
      m2 = ctx.add(acc, m2, ctx.mul(acc, delta, ctx.sub(acc, x[i], m.mean)));
    }
  }
  emu::Scope scope(ctx, "var");
  emu::ElementGuard element(ctx, row, {row});
  m.var = ctx.div(acc, m2, static_cast<double>(n));
  return m;
}

}  // namespace

Algorithm algorithm_by_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kAlgorithmNames); ++i)
    if (name == kAlgorithmNames[i]) return static_cast<Algorithm>(i);
  throw std::invalid_argument("unknown norm_stats algorithm '" + std::string(name) + "' (naive, two_pass, welford)");
}

const char* algorithm_name(Algorithm a) { return kAlgorithmNames[static_cast<int>(a)]; }

Moments compute(emu::Context& ctx, Algorithm algorithm, const emu::Format& accumulation, std::span<const double> x,
                std::int64_t row) {
  if (x.empty()) throw std::invalid_argument("norm_stats::compute: an empty vector has no mean");
  emu::Scope scope(ctx, algorithm_name(algorithm));
  switch (algorithm) {
    case Algorithm::naive: return naive(ctx, accumulation, x, row);
    case Algorithm::two_pass: return two_pass(ctx, accumulation, x, row);
    case Algorithm::welford: return welford(ctx, accumulation, x, row);
  }
  throw std::logic_error("norm_stats::compute: unknown algorithm");
}

}  // namespace norm_stats

namespace {

constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Inputs of at most this many significand bits times a length of at most 2^16 stay
// within double's 53 bits, which the exact reference relies on (n * x exact).
constexpr int kMaxInputPrecision = 24;
constexpr std::int64_t kMaxLength = std::int64_t{1} << 16;
constexpr std::int64_t kMaxVectors = 4096;

// The exact mean and variance of one vector of finite doubles, held unrounded:
// sum = sum x_i and n2_var = n sum x_i^2 - (sum x)^2 = n^2 V.
struct ExactMoments {
  bool known = false;  // false: an input is not finite (or the sum does not fit two doubles)
  double n = 0;
  emu::ExactSum sum;
  emu::ExactSum n2_var;

  explicit ExactMoments(std::span<const double> x) : n(static_cast<double>(x.size())) {
    for (double v : x) {
      if (!std::isfinite(v)) return;
      sum.add(v);
      n2_var.add_product(n * v, v);  // n * v exact: <= 24 + 16 significant bits
    }
    // (sum x)^2 exactly, from sum x = hi + lo when that pair is exact (it always is for
    // fp16 inputs: their sums fit in one double).
    const emu::Exact s = sum.value();
    emu::ExactSum rest = sum;
    rest.add(-s.hi);
    rest.add(-s.lo);
    if (s.lo_scale != 0 || !rest.is_zero()) return;
    n2_var.add_product(-s.hi, s.hi);
    n2_var.add_product(-2 * s.hi, s.lo);
    n2_var.add_product(-s.lo, s.lo);
    known = true;
  }

  double mean() const { return sum.value().hi / n; }
  double var() const { return n2_var.value().hi / (n * n); }

  // |computed - exact| / |exact| from the exactly formed error n (computed - exact),
  // rounded once; inf when computed is not finite, and when the exact value is 0 and
  // computed is not (0 when both are).
  static double relative(const emu::ExactSum& exact_scaled, double computed, double scale) {
    if (!std::isfinite(computed)) return kInf;
    emu::ExactSum error = exact_scaled;
    error.add_product(-computed, scale);
    const double e = std::fabs(error.value().hi);
    const double x = std::fabs(exact_scaled.value().hi);
    if (e == 0) return 0.0;
    return x == 0 ? kInf : e / x;
  }
  double mean_rel_error(double computed) const { return relative(sum, computed, n); }
  double var_rel_error(double computed) const { return relative(n2_var, computed, n * n); }
};

double max_of(const std::vector<double>& v) {
  return v.empty() ? kUndefined : *std::max_element(v.begin(), v.end());
}

double median_of(std::vector<double> v) {
  if (v.empty()) return kUndefined;
  const std::size_t half = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + half, v.end());
  const double upper = v[half];
  if (v.size() % 2) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + half);
  return lower / 2 + upper / 2;
}

RunResult run_norm_stats(const Params& p, const RunEnv& env) {
  using namespace norm_stats;
  const emu::OperandFormat input = emu::operand_format_by_name(p.string("format"));
  const emu::Format accumulation = emu::format_by_name(p.string("accumulation"));
  const Algorithm algorithm = algorithm_by_name(p.string("algorithm"));
  const auto length = static_cast<std::size_t>(p.integer("length"));
  const std::int64_t vectors = p.integer("vectors");
  const double mean = p.real("mean");
  const double spread = p.real("spread");

  emu::FpControl control;
  control.rounding = emu::rounding_by_name(p.string("rounding"));
  control.overflow = emu::overflow_by_name(p.string("overflow"));
  control = with_fp_exceptions(control, p);
  emu::Context ctx(control, emu::Rng(env.stream));

  std::vector<double> x(length);
  std::vector<double> mean_errors, var_errors, exact_vars;
  std::int64_t negative = 0, nonfinite_var = 0, nonfinite_mean = 0, oflo = 0, inv = 0;
  emu::Flags run_flags = 0;
  for (std::int64_t row = 0; row < vectors; ++row) {
    if (env.cancelled()) throw Cancelled();
    emu::Rng data(emu::StreamId{env.stream.seed, 0, env.stream.replica, static_cast<std::uint16_t>(1 + row)});
    {
      // The inputs enter the format once with rne whatever the rounding under test; an
      // input beyond the format's range follows the overflow policy (and is counted).
      emu::Scope scope(ctx, "input");
      if (input.block) {
        for (double& v : x) v = mean + spread * data.normal();
        const emu::BlockQuantized q = emu::quantize(*input.block, x, emu::default_block_spec(*input.block), nullptr);
        for (std::size_t i = 0; i < length; ++i) {
          emu::ElementGuard element(ctx, row * static_cast<std::int64_t>(length) + static_cast<std::int64_t>(i),
                                    {row, static_cast<std::int64_t>(i)});
          const double value = x[i];
          x[i] = q.value(i, *input.block);
          // The element's flags, and at a block's first element what its scale raised.
          emu::Flags raised = q.element_flags[i];
          if (i % static_cast<std::size_t>(input.block->block_size()) == 0)
            raised |= q.scales[q.block_of(i, *input.block)].scale_flags;
          if (raised) ctx.raise_flags(raised, "quantize", {value}, x[i]);
        }
      } else {
        for (std::size_t i = 0; i < length; ++i) {
          emu::ElementGuard element(ctx, row * static_cast<std::int64_t>(length) + static_cast<std::int64_t>(i),
                                    {row, static_cast<std::int64_t>(i)});
          const double value = mean + spread * data.normal();
          x[i] = ctx.round_with(emu::Rounding::rne, *input.scalar, emu::Exact{value}, "convert", {value});
        }
      }
    }
    // Each vector's statistics start from a clear status, so that its flags are its own
    // (a trap report's status shows the flags raised since this vector began).
    run_flags |= ctx.status();
    ctx.clear_status();

    const Moments m = compute(ctx, algorithm, accumulation, x, row);
    const emu::Flags flags = ctx.status();
    run_flags |= flags;
    ctx.clear_status();
    if (flags & emu::OFLO) ++oflo;
    if (flags & emu::INV) ++inv;
    if (m.var < 0) ++negative;
    if (!std::isfinite(m.var)) ++nonfinite_var;
    if (!std::isfinite(m.mean)) ++nonfinite_mean;

    const ExactMoments exact(x);
    if (!exact.known) continue;
    mean_errors.push_back(exact.mean_rel_error(m.mean));
    var_errors.push_back(exact.var_rel_error(m.var));
    exact_vars.push_back(exact.var());
  }

  const auto fraction = [vectors](std::int64_t count) { return static_cast<double>(count) / static_cast<double>(vectors); };
  RunResult r;
  r.metrics = {
      {"frac_negative_var", fraction(negative)},
      {"frac_nonfinite_var", fraction(nonfinite_var)},
      {"frac_nonfinite_mean", fraction(nonfinite_mean)},
      {"frac_oflo", fraction(oflo)},
      {"frac_inv", fraction(inv)},
      {"mean_rel_error", max_of(mean_errors)},
      {"mean_rel_error_median", median_of(mean_errors)},
      {"var_rel_error", max_of(var_errors)},
      {"var_rel_error_median", median_of(var_errors)},
      {"exact_var_median", median_of(exact_vars)},
  };
  r.flags = run_flags;
  r.fp_counts = ctx.counts();
  return r;
}

Experiment make_norm_stats() {
  Experiment e;
  e.name = "norm_stats";
  e.description =
      "mean and variance of vectors with a large mean (LayerNorm statistics): naive E[x^2]-E[x]^2, two-pass or "
      "Welford, fp16 or fp32 accumulation; errors vs the exact values";
  e.params = {
      string_param("algorithm", "naive",
                   "naive (E[x^2] - E[x]^2), two_pass (subtract the mean first: Poplar's use_stable_statistics) "
                   "or welford (running mean and sum of squared deviations)",
                   {"naive", "two_pass", "welford"}),
      string_param("accumulation", "fp32",
                   "format of every operation of the statistics (fp16: half partials; fp32: float partials; "
                   "any format emu knows)",
                   {}, check_format_name),
      string_param("format", "fp16",
                   "format the inputs are rounded into (rne); at most 24 significand bits (fp32 and narrower); a "
                   "block format (mxfp8-e4m3 ... nvfp4) quantises each vector in blocks along it",
                   {}, check_operand_format_name),
      real_param("mean", 1000.0, "mean of the inputs' distribution (finite, within the input format's range)"),
      real_param("spread", 1.0, "standard deviation of the inputs' distribution (normal)", 0.0),
      int_param("length", 512, "number of values per vector (n; the variance divides by n)", 1,
                static_cast<double>(kMaxLength)),
      int_param("vectors", 16,
                "vectors per run; vector j draws from lane 1 + j of stream (seed, 0, replica): the same values "
                "at every point",
                1, static_cast<double>(kMaxVectors)),
      string_param("rounding", "rne",
                   "rounding of every operation of the statistics (inputs enter with rne): " +
                       emu::name_list(emu::rounding_table()) + "; sr takes its bits from the run's stream",
                   {}, check_rounding_name),
      string_param("overflow", "inf",
                   "what an overflowing result becomes: inf (IEEE) or saturate (to +-max, as the IPU does with "
                   "NANOO off); nanoo: true gives NaN instead",
                   {"inf", "saturate"}),
  };
  for (ParamSpec& spec : fp_exception_params()) e.params.push_back(std::move(spec));
  e.metrics = {
      {"frac_negative_var", "fraction of the run's vectors whose computed variance is < 0"},
      {"frac_nonfinite_var", "fraction of vectors whose computed variance is inf or NaN"},
      {"frac_nonfinite_mean", "fraction of vectors whose computed mean is inf or NaN"},
      {"frac_oflo", "fraction of vectors whose statistics raised OFLO (the inputs' conversion not included)"},
      {"frac_inv", "fraction of vectors whose statistics raised INV"},
      {"mean_rel_error", "largest |mean - exact| / |exact| over the vectors (exact: of the rounded inputs; inf "
                         "where the mean is not finite, or exact is 0 and the mean is not; NaN if no vector has "
                         "finite inputs)"},
      {"mean_rel_error_median", "median over the vectors of |mean - exact| / |exact|"},
      {"var_rel_error", "largest |var - exact| / exact over the vectors (population variance of the rounded "
                        "inputs; inf as for mean_rel_error)"},
      {"var_rel_error_median", "median over the vectors of |var - exact| / exact"},
      {"exact_var_median", "median over the vectors of the exact variance of the rounded inputs (0 where they "
                           "all rounded to one value)"},
  };
  e.headline_metric = "var_rel_error";
  e.run = run_norm_stats;
  e.check_point = [](const Params& p) -> std::string {
    const emu::OperandFormat input = emu::operand_format_by_name(p.string("format"));
    // Block formats: MX values have at most 8 significand bits, NVFP4's at most
    // 2 + 4 + 24 (element, UE4M3 scale, fp32 tensor scale), within what the exact
    // reference takes (53 - 16); their range (scales up to 2^127) holds any finite mean.
    if (input.scalar && input.scalar->precision() > kMaxInputPrecision)
      return "format " + p.string("format") + " has " + std::to_string(input.scalar->precision()) +
             " significand bits; norm_stats takes inputs of at most " + std::to_string(kMaxInputPrecision) +
             " (fp32 and narrower), which its exact reference needs";
    const double mean = p.real("mean");
    const double max = input.scalar ? input.scalar->max_finite() : std::numeric_limits<double>::max();
    if (!std::isfinite(mean) || std::fabs(mean) > max)
      return "mean must be finite and within the range of " + p.string("format") + " (|mean| <= " +
             std::to_string(max) + ")";
    if (!std::isfinite(p.real("spread"))) return "spread must be finite";
    return "";
  };
  e.fp_exceptions_note =
      "scopes: input (the inputs' rounding: op convert, or quantize for a block format), naive.sum, naive.sum_sq, naive.mean, naive.var, two_pass.sum, "
      "two_pass.mean, two_pass.sum_sq_dev, two_pass.var, welford.update, welford.var; element = [vector, i] in "
      "the loops, [vector] for the final operations";
  return e;
}

const Registration registration(make_norm_stats());

}  // namespace

}  // namespace roundoff
