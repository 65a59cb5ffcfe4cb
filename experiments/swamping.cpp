// swamping: a small addend added again and again to a growing sum, as in Graphcore's
// stochastic-rounding tutorial (0.0001 added 10,000 times in fp16: round-to-nearest stalls
// at 0.25, stochastic rounding stays near the true 1.0).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "emu/arith.hpp"
#include "emu/exact_sum.hpp"
#include "emu/format.hpp"
#include "experiment.hpp"
#include "running_value.hpp"

namespace roundoff {

namespace {

constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();
// Cancellation is polled this often (a power of two: a mask, not a division).
constexpr std::int64_t kPollMask = 4095;

RunResult run_swamping(const Params& p, const RunEnv& env) {
  const emu::Format format = emu::format_by_name(p.string("format")).with_subnormals(p.boolean("subnormals"));
  const std::int64_t steps = p.integer("steps");

  emu::FpControl control;
  control.rounding = emu::rounding_by_name(p.string("rounding"));
  control.overflow = emu::overflow_by_name(p.string("overflow"));
  control.sr_bits = static_cast<int>(p.integer("sr_bits"));
  control = with_fp_exceptions(control, p);  // nanoo: true goes with overflow: nan only (check_point)
  // rng: ipu seeds xoroshiro128aox through $PRNG_SEED = emu::ipu_prng_seed(env.stream)
  // (emu/rng.hpp), a per-run 32-bit value, as the hardware would be seeded.
  emu::Context ctx(control, emu::Rng(env.stream, emu::rng_kind_by_name(p.string("rng"))));

  // The inputs enter the format once, with rne whatever the rounding under test, as
  // numpy.float16(0.0001) and the tutorial's casts do; their flags count (the status
  // describes everything done in the format).
  auto to_format = [&](double v) { return ctx.round_with(emu::Rounding::rne, format, emu::Exact{v}, "convert", {v}); };
  double addend = 0, initial = 0;
  {
    const emu::Scope inputs(ctx, "inputs");
    addend = to_format(p.real("addend"));
    initial = to_format(p.real("initial"));
  }

  RunningValue x_history(initial, steps, p.integer("trace_every"));
  double x = initial;
  {
    const emu::Scope sum(ctx, "sum");
    for (std::int64_t k = 1; k <= steps; ++k) {
      ctx.set_element(k);  // the step, as the trace's x axis counts it
      x = ctx.add(format, x, addend);
      x_history.update(k, x);
      if ((k & kPollMask) == 0 && env.cancelled()) throw Cancelled();
    }
    ctx.clear_element();
  }

  // steps * addend + initial, exactly: the long accumulator holds the product of two
  // doubles (steps < 2^53 is a double) and the sum without any rounding. The metric is its
  // nearest double, which is the exact value itself for every shipped config (fp16/fp32
  // addends have <= 24 significant bits and steps < 2^29).
  emu::ExactSum exact;
  exact.add_product(static_cast<double>(steps), addend);
  exact.add(initial);
  const double exact_value = exact.value().hi;
  emu::ExactSum error = exact;  // final - exact, rounded once
  error.add(-x);
  const double abs_error = std::fabs(error.value().hi);

  RunResult r;
  r.metrics = {
      {"final", x},
      {"exact", exact_value},
      {"abs_error", abs_error},
      {"rel_error", exact_value != 0 ? abs_error / std::fabs(exact_value) : kUndefined},
      {"stagnation_step", static_cast<double>(x_history.stagnation_step())},
  };
  if (x_history.has_trace()) r.traces["x"] = x_history.trace();
  r.flags = ctx.status();
  r.fp_counts = ctx.counts();
  return r;
}

Experiment make_swamping() {
  Experiment e;
  e.name = "swamping";
  e.description = "x <- round(x + addend) repeated: small addends swamped by a growing sum (IPU SR tutorial)";
  e.params = {
      string_param("format", "fp16",
                   "number format of x and the addend: " + emu::format_list_text(), {},
                   check_format_name),
      string_param("rounding", "rne", "rounding of each addition: " + emu::name_list(emu::rounding_table()), {},
                   check_rounding_name),
      real_param("addend", 1e-4, "value added at each step; rounded into the format first with rne"),
      int_param("steps", 10000, "number of additions", 1, 1e9),
      real_param("initial", 0.0, "starting value of x; rounded into the format first with rne"),
      int_param("sr_bits", 0, "random bits of stochastic rounding: 0 = exact probabilities, k = hardware-style k-bit",
                0, 64),
      bool_param("subnormals", true, "whether the format keeps subnormals (false: flush to zero)"),
      string_param("overflow", "inf", "what an overflowing sum becomes: inf, saturate (to max) or nan (IPU NANOO)",
                   {"inf", "saturate", "nan"}),
      string_param("rng", "philox",
                   "random source of stochastic rounding: philox (the run's stream) or ipu (xoroshiro128aox "
                   "seeded as the hardware is, by the $PRNG_SEED expansion of a 32-bit value derived from the "
                   "run's stream: emu::ipu_prng_seed)",
                   {"philox", "ipu"}),
      int_param("trace_every", 0, "record x every this many steps (and at steps 0 and the last); 0 = no trace", 0),
  };
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  e.metrics = {
      {"final", "x after the last step"},
      {"exact", "steps * addend + initial computed exactly (addend and initial as rounded into the format)"},
      {"abs_error", "|final - exact|"},
      {"rel_error", "|final - exact| / |exact| (NaN when exact is 0)"},
      {"stagnation_step", "first step from which x never changed again (one past the last change); -1 if the "
                          "last step still changed x"},
  };
  e.headline_metric = "final";
  e.traces = {{"x", "the running value x; x axis = step index (0 = before the first addition)", "step"}};
  e.run = run_swamping;
  e.check_point = [](const Params& p) -> std::string {
    if (p.integer("trace_every") > p.integer("steps")) return "trace_every must not exceed steps";
    // nanoo: true is the IPU's name for overflow: nan; with another overflow policy the
    // point would say two things at once.
    if (p.boolean("nanoo") && p.string("overflow") != "nan")
      return "nanoo: true (NaN on overflow) contradicts overflow: " + p.string("overflow") +
             "; nanoo: true goes with overflow: nan (the same policy), or leave nanoo false";
    return "";
  };
  e.trace_length = [](const Params& p) -> std::int64_t {
    return RunningValue::trace_length(p.integer("steps"), p.integer("trace_every"));
  };
  e.fp_exceptions_note =
      "scopes: inputs (addend and initial rounded into the format; no element), sum (the additions; element = "
      "the step k, as the trace's x axis counts it). nanoo: true goes with overflow: nan only (the same policy; "
      "with inf or saturate the point is refused)";
  return e;
}

const Registration registration(make_swamping());

}  // namespace

}  // namespace roundoff
