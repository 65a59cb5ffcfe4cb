#include "runner.hpp"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

namespace roundoff::sweep {
namespace {

using Clock = std::chrono::steady_clock;

// declared_samples: the point's trace_length from the plan (-1 when the experiment
// declares none).
void check_result(const Experiment& experiment, std::int64_t declared_samples, const RunResult& result) {
  for (const MetricSpec& spec : experiment.metrics)
    if (!result.metrics.count(spec.name))
      throw ExperimentFailure("experiment '" + experiment.name + "' returned no metric '" + spec.name + "'");
  for (const auto& [name, value] : result.metrics) {
    (void)value;
    bool known = false;
    for (const MetricSpec& spec : experiment.metrics) known = known || spec.name == name;
    if (!known) throw ExperimentFailure("experiment '" + experiment.name + "' returned metric '" + name + "' that its specs do not name");
  }
  for (const auto& [name, trace] : result.traces) {
    bool known = false;
    for (const TraceSpec& spec : experiment.traces) known = known || spec.name == name;
    if (!known) throw ExperimentFailure("experiment '" + experiment.name + "' returned trace '" + name + "' that its specs do not name");
    if (trace.x.size() != trace.y.size())
      throw ExperimentFailure("experiment '" + experiment.name + "' returned trace '" + name + "' with x and y of different lengths");
  }
  // The trace limits were checked against trace_length when the sweep was planned.
  if (declared_samples >= 0) {
    std::size_t samples = 0;
    for (const auto& [name, trace] : result.traces) samples += trace.y.size();
    if (samples > static_cast<std::uint64_t>(declared_samples))
      throw ExperimentFailure("experiment '" + experiment.name + "' recorded " + std::to_string(samples) +
                              " trace samples, more than its trace_length " + std::to_string(declared_samples));
  }
}

// The result of a run that an enabled floating-point exception stopped: every metric NaN,
// no traces, the report, and the sticky status at the trap.
RunResult trapped_run(const Experiment& experiment, const emu::TrapReport& report) {
  RunResult result;
  for (const MetricSpec& spec : experiment.metrics) result.metrics[spec.name] = std::numeric_limits<double>::quiet_NaN();
  result.flags = report.status;
  result.trap = report;
  return result;
}

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// "  37/80 points [#########-----------]  46%  0:03 elapsed  ETA 0:04  11.2 points/s"
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::size_t total, std::size_t already_done)
      : enabled_(enabled), total_(total), first_(already_done), start_(Clock::now()) {}

  void update(std::size_t done, bool force = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(done - first_) / elapsed : 0;
    const double fraction = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '-');
    const std::string eta = rate > 0 ? clock_text(static_cast<double>(total_ - done) / rate) : "?";
    std::fprintf(stderr, "\r%6zu/%zu points [%s] %3d%%  %s elapsed  ETA %s  %.1f points/s ", done, total_, bar.c_str(),
                 static_cast<int>(fraction * 100), clock_text(elapsed).c_str(), eta.c_str(), rate);
    std::fflush(stderr);
  }
  void finish(std::size_t done) {
    if (!enabled_) return;
    update(done, true);
    std::fputc('\n', stderr);
  }

 private:
  bool enabled_;
  std::size_t total_, first_;
  Clock::time_point start_, last_draw_{};
};

}  // namespace

RunReport run_plan(const SweepPlan& plan, OutputFile& output, const std::vector<std::uint8_t>& done,
                   const RunOptions& options, std::atomic<bool>& stop) {
  const Experiment& experiment = *plan.experiment;
  const std::size_t replicas = plan.replicas;
  const auto start = Clock::now();

  std::vector<std::uint32_t> pending;  // point indices still to run
  for (std::size_t p = 0; p < plan.points.size(); ++p)
    if (!done[p]) pending.push_back(static_cast<std::uint32_t>(p));
  RunReport report;
  report.n_points = plan.points.size();
  report.points_done = plan.points.size() - pending.size();

  std::vector<RunResult> results(pending.size() * replicas);  // [pending slot][replica]
  std::vector<std::atomic<std::uint32_t>> replicas_left(pending.size());
  for (auto& left : replicas_left) left.store(static_cast<std::uint32_t>(replicas));

  std::mutex mutex;
  std::condition_variable wake_writer;
  std::vector<std::size_t> finished_slots;  // points whose replicas all finished, not yet written
  bool compute_over = false;
  std::string failure;  // the first experiment failure
  bool failure_is_bad_input = false;

  std::optional<tbb::global_control> thread_limit;
  if (options.threads > 0)
    thread_limit.emplace(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(options.threads));

  std::thread compute([&] {
    const auto fail = [&](const std::string& message, bool bad_input = false) {
      std::lock_guard lock(mutex);
      if (failure.empty()) {
        failure = message;
        failure_is_bad_input = bad_input;
      }
      stop.store(true);
    };
    try {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, results.size()), [&](const tbb::blocked_range<std::size_t>& range) {
        for (std::size_t task = range.begin(); task != range.end(); ++task) {
          if (stop.load(std::memory_order_relaxed)) return;
          const std::size_t slot = task / replicas;
          const std::uint32_t point = pending[slot];
          const auto replica = static_cast<std::uint32_t>(task % replicas);
          const RunEnv env{emu::StreamId{plan.seed, point, replica, 0}, &stop};
          try {
            RunResult result = experiment.run(plan.points[point], env);
            check_result(experiment, plan.trace_lengths.empty() ? -1 : plan.trace_lengths[point], result);
            results[task] = std::move(result);
          } catch (const Cancelled&) {
            return;
          } catch (const emu::FpException& e) {
            results[task] = trapped_run(experiment, e.report());  // the run's outcome, not a failure
          } catch (const BadInput& e) {
            fail(plan.config_path + ": point " + std::to_string(point) + " replica " + std::to_string(replica) + ": " +
                     e.what(),
                 true);
            return;
          } catch (const std::exception& e) {
            fail("point " + std::to_string(point) + " replica " + std::to_string(replica) + ": " + e.what());
            return;
          }
          if (replicas_left[slot].fetch_sub(1) == 1) {
            std::lock_guard lock(mutex);
            finished_slots.push_back(slot);
            wake_writer.notify_one();
          }
        }
      });
    } catch (const std::exception& e) {
      fail(e.what());
    }
    std::lock_guard lock(mutex);
    compute_over = true;
    wake_writer.notify_one();
  });

  ProgressBar bar(options.progress, report.n_points, report.points_done);
  // Flushing costs a few milliseconds: at most every 200 ms, and once at the end.
  constexpr auto kFlushInterval = std::chrono::milliseconds(200);
  auto last_flush = Clock::now();
  bool unflushed = false;
  try {
    for (bool over = false; !over;) {
      std::vector<std::size_t> batch;
      {
        std::unique_lock lock(mutex);
        wake_writer.wait_for(lock, std::chrono::milliseconds(100), [&] { return !finished_slots.empty() || compute_over; });
        batch.swap(finished_slots);
        over = compute_over;  // then nothing more can arrive after this batch
      }
      for (std::size_t slot : batch) {
        const auto first = results.begin() + static_cast<std::ptrdiff_t>(slot * replicas);
        output.write_point(pending[slot], std::vector<RunResult>(std::make_move_iterator(first),
                                                                 std::make_move_iterator(first + static_cast<std::ptrdiff_t>(replicas))));
        ++report.points_done;
        unflushed = true;
      }
      if (unflushed && (over || Clock::now() - last_flush >= kFlushInterval)) {
        output.flush();
        last_flush = Clock::now();
        unflushed = false;
      }
      bar.update(report.points_done);
    }
  } catch (...) {
    stop.store(true);
    compute.join();
    bar.finish(report.points_done);
    throw;
  }
  compute.join();
  bar.finish(report.points_done);

  report.complete = report.points_done == report.n_points;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!failure.empty()) {
    if (failure_is_bad_input) throw ExperimentBadInput(failure);
    throw ExperimentFailure(failure);
  }
  return report;
}

}  // namespace roundoff::sweep
