// grad_underflow: the weight gradients of one fp32 training run (every step, every layer
// including batch-norm gammas), and the fraction of them that a cast into a low-precision
// format after scaling by S turns into zero or inf/NaN: the figure behind loss scaling.
// The training run depends on (seed, replica, data and run parameters) only, so it is
// computed once and shared by the (format, scale) points that use it. The cache keeps
// recent runs up to kGradientCacheBytes (training.hpp; a run is a few MB), so memory stays
// bounded in large sweeps; a run evicted before its last point is recomputed (the same
// result).
#include <algorithm>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>

#include "training.hpp"

namespace roundoff::train {

namespace {

struct GradientSample {
  std::vector<double> values;
  Histogram histogram{};
};

std::shared_ptr<const GradientSample> record_gradients(const Params& p, const RunEnv& env) {
  TrainSpec spec;  // update fp32: all fp32, no loss scaling
  read_run_params(p, spec);
  Trainer trainer(spec, prepare_data(p, env.stream.seed, Standardisation::per_feature), env.stream.seed, env.stream.replica, env.stream);
  auto sample = std::make_shared<GradientSample>();
  std::array<std::uint64_t, kHistBins> counts{};
  const std::int64_t total = trainer.steps_per_epoch() * spec.epochs;
  for (std::int64_t s = 0; s < total; ++s) {
    if (env.cancelled()) throw Cancelled();
    trainer.step();
    for (const Param* layer : trainer.layer_params())
      for (double g : layer->grad) {
        sample->values.push_back(g);
        add_to_histogram(counts, g);
      }
  }
  sample->histogram = normalise(counts);
  return sample;
}

struct GradientCache {
  struct Entry {
    std::shared_future<std::shared_ptr<const GradientSample>> future;
    std::uint64_t used = 0;
    std::size_t bytes = 0;  // 0 while the run is computed
  };
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  std::uint64_t clock = 0;
  std::size_t bytes = 0, budget = kGradientCacheBytes;

  // Forgets the least recently used finished runs other than `keep` while over budget
  // (whoever still waits on one keeps its shared_future). Called with `mutex` held.
  void evict(const std::string& keep) {
    while (bytes > budget) {
      auto victim = entries.end();
      for (auto it = entries.begin(); it != entries.end(); ++it)
        if (it->second.bytes > 0 && it->first != keep && (victim == entries.end() || it->second.used < victim->second.used))
          victim = it;
      if (victim == entries.end()) return;
      bytes -= victim->second.bytes;
      entries.erase(victim);
    }
  }
};

GradientCache& gradient_cache() {
  static GradientCache cache;
  return cache;
}

// One training run per key, shared by parallel points; a run that throws is not cached.
std::shared_ptr<const GradientSample> cached_gradients(const Params& p, const RunEnv& env) {
  std::string key = std::to_string(env.stream.seed) + "/" + std::to_string(env.stream.replica);
  for (const auto& [name, value] : p.values())
    if (name != "format" && name != "scale") key += "/" + name + "=" + to_string(value);
  GradientCache& cache = gradient_cache();
  std::promise<std::shared_ptr<const GradientSample>> promise;
  std::shared_future<std::shared_ptr<const GradientSample>> future;
  bool compute = false;
  {
    const std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.entries.find(key);
    if (it == cache.entries.end()) {
      future = promise.get_future().share();
      cache.entries.emplace(key, GradientCache::Entry{future, ++cache.clock});
      compute = true;
    } else {
      it->second.used = ++cache.clock;
      future = it->second.future;
    }
  }
  if (compute) {
    try {
      std::shared_ptr<const GradientSample> sample = record_gradients(p, env);
      {
        const std::lock_guard<std::mutex> lock(cache.mutex);
        if (auto it = cache.entries.find(key); it != cache.entries.end()) {
          it->second.bytes = std::max<std::size_t>(1, sample->values.size() * sizeof(double));
          cache.bytes += it->second.bytes;
          cache.evict(key);
        }
      }
      promise.set_value(std::move(sample));
    } catch (...) {
      {
        const std::lock_guard<std::mutex> lock(cache.mutex);
        cache.entries.erase(key);
      }
      promise.set_exception(std::current_exception());
    }
  }
  return future.get();
}

RunResult run_grad_underflow(const Params& p, const RunEnv& env) {
  const emu::Format format = emu::format_by_name(p.string("format"));
  const std::shared_ptr<const GradientSample> sample = cached_gradients(p, env);
  const CastLoss loss = cast_loss(sample->values, format, p.real("scale"));
  RunResult result;
  result.metrics["frac_underflow"] = loss.underflow;
  result.metrics["frac_overflow"] = loss.overflow;
  result.metrics["frac_subnormal"] = loss.subnormal;
  std::uint64_t zeros = 0;
  for (double g : sample->values) zeros += g == 0.0;
  result.metrics["frac_zero_fp32"] = static_cast<double>(zeros) / static_cast<double>(sample->values.size());
  Trace hist;
  for (int b = 0; b < kHistBins; ++b) {
    hist.x.push_back(b == 0 ? kHistLowExponent - 1 : (b == kHistBins - 1 ? kHistHighExponent : kHistLowExponent + b - 1));
    hist.y.push_back(sample->histogram[b]);
  }
  result.traces["grad_hist"] = std::move(hist);
  return result;
}

Experiment make_grad_underflow() {
  Experiment e;
  e.name = "grad_underflow";
  e.description = "gradients of an fp32 training run cast to a low-precision format after scaling by S";
  e.params = data_param_specs();
  for (ParamSpec& s : run_param_specs()) e.params.push_back(std::move(s));
  e.params.push_back(string_param("format", "fp16", "format the scaled gradients are cast to", {}, check_format_name));
  e.params.push_back(real_param("scale", 1.0, "loss scale S multiplying the gradients before the cast", 0.0));
  e.metrics = {
      {"frac_underflow", "non-zero fp32 gradients that become 0 in the format after scaling by S"},
      {"frac_overflow", "non-zero fp32 gradients that become inf or NaN"},
      {"frac_subnormal", "non-zero fp32 gradients that land on a subnormal (precision lost)"},
      {"frac_zero_fp32", "gradients exactly zero already in fp32 (dead ReLUs and the like)"},
  };
  e.headline_metric = "frac_underflow";
  e.traces = {{"grad_hist",
               "fractions of fp32 gradient magnitudes per log2 bin: x = e for [2^e, 2^(e+1)) (e = -40..15, "
               "clamped at both ends), x = -41 exact zeros, x = 16 non-finite",
               "log2_bin"}};
  e.run = run_grad_underflow;
  e.check_point = check_data_and_batch;
  e.trace_length = [](const Params&) -> std::int64_t { return kHistBins; };
  e.fp_exceptions_note =
      "why: its training run is the fp32 reference, shared by every (format, "
      "scale) point, and the overflows and underflows of the cast are what its metrics count exactly "
      "(frac_overflow, frac_underflow); a trap would end the measurement at the first one";
  return e;
}

const Registration registration(make_grad_underflow());

}  // namespace

std::size_t gradient_cache_bytes() {
  GradientCache& cache = gradient_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.bytes;
}

void set_gradient_cache_budget(std::size_t bytes) {
  GradientCache& cache = gradient_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  cache.budget = bytes;
  cache.evict("");
}

}  // namespace roundoff::train
