// Bookkeeping shared by the experiments that update one value step after step (swamping's
// x, summation's partial sum): a trace sampled every few steps, and the step at which the
// value stopped changing for good.
#pragma once

#include <cmath>
#include <cstdint>

#include "experiment.hpp"

namespace roundoff {

class RunningValue {
 public:
  // `steps` updates will follow; trace_every 0 records no trace, otherwise the trace holds
  // the value at step 0 (before any update), every trace_every steps, and the last step.
  RunningValue(double initial, std::int64_t steps, std::int64_t trace_every)
      : steps_(steps), trace_every_(trace_every), previous_(initial) {
    if (trace_every_ > 0) record(0, initial);
  }

  // The value after update k (k = 1, 2, ..., steps, in order).
  void update(std::int64_t k, double value) {
    // NaN stays NaN: that is no change either.
    const bool changed = !(value == previous_ || (std::isnan(value) && std::isnan(previous_)));
    // Bit-level: -0 after +0 is a change too (a later rd/ru step can tell them apart).
    if (changed || std::signbit(value) != std::signbit(previous_)) last_change_ = k;
    previous_ = value;
    if (trace_every_ > 0 && (k % trace_every_ == 0 || k == steps_)) record(k, value);
  }

  // The first step from which the value never changed again, i.e. one past the last step
  // that changed it (1 if no step ever changed it); -1 if the last step still changed it.
  // Under deterministic rounding a step that leaves x unchanged repeats for ever, so this
  // is where the sum stagnated; under sr it is only where the changes happened to end.
  std::int64_t stagnation_step() const { return last_change_ == steps_ ? -1 : last_change_ + 1; }

  // How many samples the trace of `steps` updates holds: step 0, every trace_every-th
  // step and the last step (0 when trace_every is 0).
  static std::int64_t trace_length(std::int64_t steps, std::int64_t trace_every) {
    return trace_every == 0 ? 0 : 1 + steps / trace_every + (steps % trace_every != 0 ? 1 : 0);
  }

  bool has_trace() const { return trace_every_ > 0; }
  const Trace& trace() const { return trace_; }

 private:
  void record(std::int64_t k, double value) {
    trace_.x.push_back(static_cast<double>(k));
    trace_.y.push_back(value);
  }

  std::int64_t steps_, trace_every_;
  double previous_;
  std::int64_t last_change_ = 0;
  Trace trace_;
};

}  // namespace roundoff
