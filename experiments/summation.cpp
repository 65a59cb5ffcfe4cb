// summation: n terms of a series summed in a format, recursively (one running sum),
// pairwise or with Kahan's compensation, every operation rounded in the format. The
// classic experiment behind the error growth of round-to-nearest (~ n u, and stagnation)
// versus stochastic rounding (~ sqrt(n) u).
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/exact_sum.hpp"
#include "emu/format.hpp"
#include "experiment.hpp"
#include "running_value.hpp"

namespace roundoff {

namespace {

constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();
constexpr std::int64_t kPollMask = 4095;  // poll cancellation every 4096 terms
// Random data comes from this lane of the run's stream; stochastic rounding uses lane 0
// (RunEnv::stream as given), so the terms do not depend on the rounding mode.
constexpr std::uint16_t kDataLane = 1;

enum class Series { harmonic, uniform01, normal, constant };
constexpr const char* kSeriesNames[] = {"harmonic", "uniform01", "normal", "constant"};
enum class Algorithm { recursive, pairwise, kahan };
constexpr const char* kAlgorithmNames[] = {"recursive", "pairwise", "kahan"};  // also the sum's scope

// A point's parameters, typed once.
struct Point {
  Series series;
  std::int64_t n;
  double value;  // series constant
  emu::Format format;
  emu::FpControl control;
  Algorithm algorithm;
  std::int64_t trace_every;

  explicit Point(const Params& p)
      : series(p.choice<Series>("series", kSeriesNames)),
        n(p.integer("n")),
        value(p.real("value")),
        format(emu::format_by_name(p.string("format"))),
        control(with_fp_exceptions(emu::FpControl{.rounding = emu::rounding_by_name(p.string("rounding")),
                                                  .sr_bits = static_cast<int>(p.integer("sr_bits"))},
                                   p)),
        algorithm(p.choice<Algorithm>("algorithm", kAlgorithmNames)),
        trace_every(p.integer("trace_every")) {}
};

// Fills `terms` with exact_term(k), k = 1..n, each rounded once (rne) into the format
// (element k).
template <typename ExactTerm>
void fill_terms(std::vector<double>& terms, const emu::Format& format, emu::Context& ctx, ExactTerm exact_term) {
  for (std::size_t k = 1; k <= terms.size(); ++k) {
    const emu::Exact exact = exact_term(k);
    ctx.set_element(static_cast<std::int64_t>(k));
    terms[k - 1] = ctx.round_with(emu::Rounding::rne, format, exact, "convert", {exact.hi});
  }
}

// The n terms in the format: harmonic 1/k from its exact quotient, uniform01 and normal
// from their double samples (53-bit uniforms; Box-Muller normals), constant = value.
std::vector<double> make_terms(const Point& point, emu::Context& ctx, const RunEnv& env) {
  const emu::Format& format = point.format;
  emu::StreamId data_stream = env.stream;
  data_stream.lane = kDataLane;
  emu::Rng data(data_stream);
  std::vector<double> terms(static_cast<std::size_t>(point.n));
  switch (point.series) {
    case Series::harmonic:
      fill_terms(terms, format, ctx, [](std::size_t k) { return emu::exact_div(1.0, static_cast<double>(k)); });
      break;
    case Series::uniform01:
      fill_terms(terms, format, ctx, [&data](std::size_t) { return emu::Exact{data.uniform()}; });
      break;
    case Series::normal:
      fill_terms(terms, format, ctx, [&data](std::size_t) { return emu::Exact{data.normal()}; });
      break;
    case Series::constant:
      fill_terms(terms, format, ctx, [value = point.value](std::size_t) { return emu::Exact{value}; });
      break;
  }
  ctx.clear_element();
  return terms;
}

// Pairwise (cascade) summation: halve, sum each half, add the two sums.
double pairwise_sum(emu::Context& ctx, const emu::Format& format, std::span<const double> terms, const RunEnv& env) {
  if (terms.size() == 1) return terms[0];
  if (terms.size() > 4096 && env.cancelled()) throw Cancelled();
  const std::size_t half = terms.size() / 2;
  const double left = pairwise_sum(ctx, format, terms.first(half), env);
  const double right = pairwise_sum(ctx, format, terms.subspan(half), env);
  return ctx.add(format, left, right);
}

RunResult run_summation(const Params& p, const RunEnv& env) {
  const Point point(p);
  const emu::Format& format = point.format;
  emu::Context ctx(point.control, emu::Rng(env.stream));

  const std::vector<double> terms = [&] {
    const emu::Scope scope(ctx, "terms");
    return make_terms(point, ctx, env);
  }();
  const auto n = static_cast<std::int64_t>(terms.size());
  const Algorithm algorithm = point.algorithm;

  // The running sum s_k after term k (recursive and kahan); pairwise has none.
  RunningValue partial(0.0, n, algorithm == Algorithm::pairwise ? 0 : point.trace_every);
  double sum = 0.0;
  const emu::Scope sum_scope(ctx, kAlgorithmNames[static_cast<int>(algorithm)]);
  if (algorithm == Algorithm::pairwise) {
    sum = pairwise_sum(ctx, format, terms, env);
  } else if (algorithm == Algorithm::kahan) {
    // Kahan: c carries what the last addition lost; every operation is in the format.
    double compensation = 0.0;
    for (std::int64_t k = 1; k <= n; ++k) {
      ctx.set_element(k);
      const double corrected = ctx.sub(format, terms[k - 1], compensation);
      const double next = ctx.add(format, sum, corrected);
      compensation = ctx.sub(format, ctx.sub(format, next, sum), corrected);
      sum = next;
      partial.update(k, sum);
      if ((k & kPollMask) == 0 && env.cancelled()) throw Cancelled();
    }
  } else {
    for (std::int64_t k = 1; k <= n; ++k) {
      ctx.set_element(k);
      sum = ctx.add(format, sum, terms[k - 1]);
      partial.update(k, sum);
      if ((k & kPollMask) == 0 && env.cancelled()) throw Cancelled();
    }
  }
  ctx.clear_element();

  // The exact sum of the rounded terms (a long fixed-point accumulator: no rounding at
  // all), reported as its nearest double; the error is formed exactly, then rounded once.
  emu::ExactSum exact;
  for (double t : terms) exact.add(t);
  const double exact_value = exact.value().hi;
  emu::ExactSum error = exact;
  error.add(-sum);
  const double abs_error = std::fabs(error.value().hi);

  RunResult r;
  r.metrics = {
      {"final", sum},
      {"exact", exact_value},
      {"abs_error", abs_error},
      {"rel_error", exact_value != 0 ? abs_error / std::fabs(exact_value) : kUndefined},
      {"stagnation_step",
       algorithm == Algorithm::pairwise ? kUndefined : static_cast<double>(partial.stagnation_step())},
      {"n", static_cast<double>(n)},
  };
  if (partial.has_trace()) r.traces["sum"] = partial.trace();
  r.flags = ctx.status();
  r.fp_counts = ctx.counts();
  return r;
}

Experiment make_summation() {
  Experiment e;
  e.name = "summation";
  e.description = "sum of n terms of a series in a format: recursive, pairwise or Kahan; error vs the exact sum";
  e.params = {
      string_param("series", "harmonic",
                   "terms: harmonic (1/k, k = 1..n), uniform01 (uniform in [0,1)), normal (standard), "
                   "constant (every term = value); random terms come from lane 1 of the run's stream, "
                   "stochastic rounding from lane 0",
                   names_of(kSeriesNames)),
      int_param("n", 1000, "number of terms", 1, 1e8),
      string_param("format", "fp16",
                   "format of the terms and of every operation: " + emu::format_list_text(), {},
                   check_format_name),
      string_param("rounding", "rne",
                   "rounding of every addition (terms enter the format with rne): " + emu::name_list(emu::rounding_table()),
                   {},
                   check_rounding_name),
      string_param("algorithm", "recursive",
                   "recursive (s += t_k), pairwise (recursive halving) or kahan (compensated)",
                   names_of(kAlgorithmNames)),
      int_param("sr_bits", 0, "random bits of stochastic rounding: 0 = exact probabilities, k = hardware-style k-bit",
                0, 64),
      real_param("value", 1.0, "the term of series=constant (rounded into the format with rne)"),
      int_param("trace_every", 0,
                "record the running sum every this many terms (and at 0 and n); 0 = none; "
                "pairwise has no running sum and records none",
                0),
  };
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  e.metrics = {
      {"final", "the computed sum"},
      {"exact", "the exact sum of the rounded terms (nearest double)"},
      {"abs_error", "|final - exact|"},
      {"rel_error", "|final - exact| / |exact| (NaN when exact is 0)"},
      {"stagnation_step", "recursive and kahan: first k from which the running sum never changed again (one "
                          "past the last term that changed it; 1 if none did); -1 if term n changed it; NaN "
                          "for pairwise"},
      {"n", "number of terms"},
  };
  e.headline_metric = "rel_error";
  e.traces = {{"sum", "the running sum after k terms; x axis = k (0 = before the first term)", "k"}};
  e.run = run_summation;
  e.check_point = [](const Params& p) -> std::string {
    if (p.integer("trace_every") > p.integer("n")) return "trace_every must not exceed n";
    return "";
  };
  // Pairwise summation has no running sum and records nothing.
  e.trace_length = [](const Params& p) -> std::int64_t {
    if (p.choice<Algorithm>("algorithm", kAlgorithmNames) == Algorithm::pairwise) return 0;
    return RunningValue::trace_length(p.integer("n"), p.integer("trace_every"));
  };
  e.fp_exceptions_note =
      "scopes: terms (each term rounded into the format; element = k, the term's index 1..n), then the "
      "algorithm's name: recursive or kahan (element = k, the term being added, as the trace's x axis) or "
      "pairwise (no element)";
  return e;
}

const Registration registration(make_summation());

}  // namespace

}  // namespace roundoff
