// updates: a parameter vector updated with a stream of small gradient steps under one
// update strategy (no model), compared with the fp64 trajectory of the same gradients.
// Shows swamping (fp16-rn loses updates smaller than half an ulp of the weight) and
// what stochastic rounding, Kahan compensation and fp32 master weights recover.
#include <cmath>
#include <limits>

#include "training.hpp"

namespace roundoff::train {

namespace {

RunResult run_updates(const Params& p, const RunEnv& env) {
  const UpdateRule rule = p.choice<UpdateRule>("update", kUpdateRuleNames);
  const bool baseline = rule == UpdateRule::fp32;
  const emu::Format storage = baseline ? emu::fp32() : emu::format_by_name(p.string("weight_format"));
  const emu::Format grad_format = baseline ? emu::fp32() : emu::format_by_name(p.string("grad_format"));
  const emu::Format master = emu::fp32();
  const emu::Format arith = rule == UpdateRule::fp32_master ? master : storage;
  const Updater updater(rule, OptimizerSpec{}, ParamFormats{storage, arith, arith, master});

  const auto n = static_cast<std::size_t>(p.integer("n"));
  const std::int64_t steps = p.integer("steps"), trace_every = p.integer("trace_every");
  const double lr = p.real("lr"), mu = p.real("mu"), sigma = p.real("sigma"), w0 = p.real("w0");

  emu::Context ctx(with_fp_exceptions(emu::FpControl{}, p));
  emu::Context sr_ctx(with_fp_exceptions(emu::FpControl{.rounding = emu::Rounding::sr}, p),
                      emu::Rng(emu::StreamId{env.stream.seed, env.stream.point, env.stream.replica, 3}));
  // Gradients depend on (seed, replica) only, so every strategy sees the same stream.
  emu::Rng grad_rng(emu::StreamId{env.stream.seed, 0, env.stream.replica, 1});
  Param w;
  double lr_rounded = 0;
  {
    const emu::Scope init(ctx, "init");
    updater.init(w, std::vector<double>(n, w0), ctx);
    lr_rounded = ctx.convert(arith, lr);
  }
  const std::vector<double> start = rule == UpdateRule::fp32_master ? w.master : w.value;
  std::vector<double> reference(start);  // fp64 trajectory from the same start
  UpdateCounts counts;
  RunResult result;
  Trace error_trace;
  auto current = [&]() -> const std::vector<double>& { return rule == UpdateRule::fp32_master ? w.master : w.value; };
  auto mean_abs_error = [&] {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += std::fabs(current()[i] - reference[i]);
    return s / static_cast<double>(n);
  };
  for (std::int64_t t = 1; t <= steps; ++t) {
    if (env.cancelled()) throw Cancelled();
    {
      const emu::Scope grad(ctx, "grad");
      for (std::size_t i = 0; i < n; ++i) {
        ctx.set_element(static_cast<std::int64_t>(i));
        w.grad[i] = ctx.convert(grad_format, mu + sigma * grad_rng.normal());
        reference[i] -= lr * w.grad[i];
      }
      ctx.clear_element();
    }
    {
      const emu::Scope update(ctx, "update"), sr_update(sr_ctx, "update");
      updater.step(w, t, 1.0, lr_rounded, ctx, sr_ctx, counts);
    }
    if (trace_every > 0 && t % trace_every == 0) {
      error_trace.x.push_back(static_cast<double>(t));
      error_trace.y.push_back(mean_abs_error());
    }
  }
  double moved = 0.0, off = 0.0, mean = 0.0, mean_reference = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    moved += std::fabs(reference[i] - start[i]);
    off += std::fabs(current()[i] - reference[i]);
    mean += current()[i];
    mean_reference += reference[i];
  }
  auto& m = result.metrics;
  m["drift"] = moved > 0 ? off / moved : std::numeric_limits<double>::quiet_NaN();
  m["frac_lost"] = counts.updates ? static_cast<double>(counts.lost) / static_cast<double>(counts.updates)
                                  : std::numeric_limits<double>::quiet_NaN();
  m["final"] = mean / static_cast<double>(n);
  m["final_fp64"] = mean_reference / static_cast<double>(n);
  m["mean_abs_error"] = mean_abs_error();
  if (trace_every > 0) result.traces["error"] = std::move(error_trace);
  result.flags = ctx.status() | sr_ctx.status();
  result.fp_counts = ctx.counts();
  merge_counts(result.fp_counts, sr_ctx.counts());
  return result;
}

Experiment make_updates() {
  Experiment e;
  e.name = "updates";
  e.description = "small SGD steps on a weight vector under an update strategy, against the fp64 trajectory";
  e.params = {
      string_param("update", "fp16-rn", "update strategy", names_of(kUpdateRuleNames)),
      string_param("weight_format", "fp16", "weights (fp16-*) or compute copy (fp32-master)", {}, check_format_name),
      string_param("grad_format", "fp16", "format the gradients arrive in", {}, check_format_name),
      int_param("n", 1000, "weights in the vector", 1, 1e8),
      int_param("steps", 1000, "update steps", 1, 1e9),
      real_param("lr", 0.01, "learning rate"),
      real_param("mu", -0.01, "mean of the gradient N(mu, sigma)"),
      real_param("sigma", 0.01, "standard deviation of the gradient", 0.0),
      real_param("w0", 1.0, "initial value of every weight"),
      int_param("trace_every", 0, "record the mean absolute error every k steps (0 = never)", 0, 1e9),
  };
  for (ParamSpec& s : fp_exception_params()) e.params.push_back(std::move(s));
  e.metrics = {
      {"drift", "sum |w - w_fp64| / sum |w_fp64 - w0| at the end (1 = as if no update happened)"},
      {"frac_lost", "non-zero updates that left the stored state unchanged: the weight, the master weight "
                    "(fp32-master), or both the weight and its compensation (fp16-kahan)"},
      {"final", "mean final weight (master weight for fp32-master)"},
      {"final_fp64", "mean final weight of the fp64 trajectory"},
      {"mean_abs_error", "mean |w - w_fp64| at the end"},
  };
  e.headline_metric = "drift";
  e.traces = {{"error", "mean |w - w_fp64| every trace_every steps"}};
  e.run = run_updates;
  e.trace_length = [](const Params& p) -> std::int64_t {
    const std::int64_t every = p.integer("trace_every");
    return every == 0 ? 0 : p.integer("steps") / every;
  };
  e.fp_exceptions_note =
      "scopes: init (initial weights and lr rounded into their formats), grad (each gradient rounded into "
      "grad_format; element = the weight's index), update (the update rule; element = the weight's index); "
      "counts add up over all steps and keep the first element";
  return e;
}

const Registration registration(make_updates());

}  // namespace

}  // namespace roundoff::train
