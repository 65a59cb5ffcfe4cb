#include "runner.hpp"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

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

ItemOutcome run_item(const SweepPlan& plan, WorkItem item, const std::atomic<bool>& stop) {
  ItemOutcome outcome;
  outcome.item = item;
  const RunEnv env{emu::StreamId{plan.seed, item.point, item.replica, 0}, &stop};
  const std::string where = "point " + std::to_string(item.point) + " replica " + std::to_string(item.replica) + ": ";
  try {
    outcome.result = plan.experiment->run(plan.points[item.point], env);
    check_result(*plan.experiment, plan.trace_lengths.empty() ? -1 : plan.trace_lengths[item.point], outcome.result);
  } catch (const Cancelled&) {
    outcome.kind = ItemOutcome::Kind::cancelled;
  } catch (const emu::FpException& e) {
    outcome.result = trapped_run(*plan.experiment, e.report());  // the run's outcome, not a failure
  } catch (const RunRaised& e) {
    outcome.kind = ItemOutcome::Kind::raised;
    outcome.message = e.what();
    outcome.traceback = e.traceback();
  } catch (const BadInput& e) {
    outcome.kind = ItemOutcome::Kind::bad_input;
    outcome.message = plan.config_path + ": " + where + e.what();
  } catch (const std::exception& e) {
    outcome.kind = ItemOutcome::Kind::failure;
    outcome.message = where + e.what();
  }
  if (outcome.kind != ItemOutcome::Kind::ok) outcome.result = RunResult{};
  return outcome;
}

namespace {

// -j N: at most N threads run experiments (oneTBB counts the calling thread in this limit).
std::optional<tbb::global_control> thread_limit(int threads) {
  if (threads <= 0) return std::nullopt;
  return std::optional<tbb::global_control>(std::in_place, tbb::global_control::max_allowed_parallelism,
                                            static_cast<std::size_t>(threads));
}

}  // namespace

ComputePool::ComputePool(const SweepPlan& plan, int threads, const std::atomic<bool>& stop)
    : plan_(plan), stop_(stop),
      threads_(threads > 0 ? static_cast<std::size_t>(threads) : static_cast<std::size_t>(tbb::this_task_arena::max_concurrency())) {
  driver_ = std::thread([this, threads] {
    const auto limit = thread_limit(threads);
    // One long-lived task per thread, each taking items from the queue in order until it
    // is closed and empty, so that runs start in the order they were added whatever
    // oneTBB's scheduling, and a point's replicas finish close together.
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, threads_, 1),
        [this](const tbb::blocked_range<std::size_t>& range) {
          for (std::size_t i = range.begin(); i != range.end(); ++i) work_loop();
        },
        tbb::simple_partitioner());
  });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    queue_.clear();
  }
  wake_workers_.notify_all();
  driver_.join();
}

void ComputePool::work_loop() {
  for (;;) {
    WorkItem item;
    {
      std::unique_lock lock(mutex_);
      // A signal handler sets stop_ without notifying: look again every 100 ms.
      while (!stop_.load() && queue_.empty() && !closed_) wake_workers_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_.load() || queue_.empty()) return;
      item = queue_.front();
      queue_.pop_front();
      ++running_;
    }
    ItemOutcome outcome = run_item(plan_, item, stop_);
    {
      std::lock_guard lock(mutex_);
      --running_;
      outcomes_.push_back(std::move(outcome));
    }
    wake_taker_.notify_one();
  }
}

void ComputePool::add(const std::vector<WorkItem>& items) {
  {
    std::lock_guard lock(mutex_);
    if (closed_ || stop_.load()) return;
    queue_.insert(queue_.end(), items.begin(), items.end());
  }
  wake_workers_.notify_all();
}

std::vector<WorkItem> ComputePool::take(std::size_t n) {
  std::lock_guard lock(mutex_);
  n = std::min(n, queue_.size());
  std::vector<WorkItem> items(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  return items;
}

void ComputePool::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  wake_workers_.notify_all();
}

void ComputePool::wake_on_stop() {
  {
    std::lock_guard lock(mutex_);
    queue_.clear();
  }
  wake_workers_.notify_all();
}

std::vector<ItemOutcome> ComputePool::wait_for_outcomes(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  wake_taker_.wait_for(lock, timeout, [&] { return !outcomes_.empty(); });
  return std::exchange(outcomes_, {});
}

std::size_t ComputePool::pending() const {
  std::lock_guard lock(mutex_);
  return queue_.size() + running_;
}

bool ComputePool::idle() const {
  std::lock_guard lock(mutex_);
  return (closed_ || stop_.load()) && queue_.empty() && running_ == 0 && outcomes_.empty();
}

RunReport run_plan(const SweepPlan& plan, OutputFile& output, const std::vector<PointWork>& work, const RunOptions& options,
                   std::atomic<bool>& stop, RemoteWorkers* remote) {
  const std::size_t replicas = plan.replicas;
  const auto start = Clock::now();

  // The runs still to do, by point: those the file does not yet mark done.
  const std::vector<std::uint8_t>& done = output.done_replicas();
  std::vector<PointWork> pending;
  for (const PointWork& w : work) {
    PointWork rest{w.point, {}};
    for (std::uint32_t r : w.replicas)
      if (!done[w.point * replicas + r]) rest.replicas.push_back(r);
    if (!rest.replicas.empty()) pending.push_back(std::move(rest));
  }
  RunReport report;
  report.n_points = work.size();
  report.points_done = work.size() - pending.size();

  // Results wait per point until all its pending replicas are in.
  struct Slot {
    std::vector<RunResult> results;
    std::vector<bool> arrived, raised;
    std::size_t left = 0;
  };
  std::vector<Slot> slots(pending.size());
  std::vector<std::int64_t> slot_of_point(plan.points.size(), -1);
  std::vector<WorkItem> items;
  for (std::size_t s = 0; s < pending.size(); ++s) {
    slot_of_point[pending[s].point] = static_cast<std::int64_t>(s);
    slots[s].left = pending[s].replicas.size();
    slots[s].arrived.assign(pending[s].replicas.size(), false);
    slots[s].raised.assign(pending[s].replicas.size(), false);
    for (std::uint32_t r : pending[s].replicas) items.push_back({pending[s].point, r});
  }

  std::string failure;  // the first experiment failure
  bool failure_is_bad_input = false;
  bool unflushed = false;
  const auto deliver = [&](ItemOutcome&& outcome) {
    if (outcome.kind == ItemOutcome::Kind::cancelled) return;
    if (outcome.kind != ItemOutcome::Kind::ok && outcome.kind != ItemOutcome::Kind::raised) {
      if (failure.empty()) {
        failure = outcome.message;
        failure_is_bad_input = outcome.kind == ItemOutcome::Kind::bad_input;
      }
      stop.store(true);
      return;
    }
    const WorkItem item = outcome.item;
    const auto unexpected = [&] {
      return std::logic_error("a result arrived for point " + std::to_string(item.point) + " replica " +
                              std::to_string(item.replica) + ", which was not handed out or arrived twice");
    };
    if (item.point >= slot_of_point.size() || slot_of_point[item.point] < 0) throw unexpected();
    const auto s = static_cast<std::size_t>(slot_of_point[item.point]);
    Slot& slot = slots[s];
    const std::vector<std::uint32_t>& wanted = pending[s].replicas;
    const auto at = std::lower_bound(wanted.begin(), wanted.end(), item.replica);
    const auto index = static_cast<std::size_t>(at - wanted.begin());
    if (at == wanted.end() || *at != item.replica || slot.arrived[index]) throw unexpected();
    if (slot.results.empty()) slot.results.resize(wanted.size());
    slot.arrived[index] = true;
    if (outcome.kind == ItemOutcome::Kind::raised) {
      output.record_failure(item.point, item.replica, outcome.message, outcome.traceback);
      slot.raised[index] = true;
      ++report.failed_runs;
      unflushed = true;
    } else {
      slot.results[index] = std::move(outcome.result);
    }
    if (--slot.left == 0) {
      // The replicas that raised stay unwritten (not done): --resume reruns them.
      PointWork written{pending[s].point, {}};
      std::vector<RunResult> results;
      for (std::size_t i = 0; i < wanted.size(); ++i)
        if (!slot.raised[i]) written.replicas.push_back(wanted[i]), results.push_back(std::move(slot.results[i]));
      if (!written.replicas.empty()) output.write_point(written, results);
      if (written.replicas.size() == wanted.size()) ++report.points_done;
      slot.results = {};
      unflushed = true;
    }
  };

  ProgressBar bar(options.progress, report.n_points, report.points_done);
  // Flushing costs a few milliseconds: at most every 200 ms, at a stop (an MPI job is
  // killed a second after its ranks are asked to stop) and once at the end.
  constexpr auto kFlushInterval = std::chrono::milliseconds(200);
  auto last_flush = Clock::now();
  ComputePool pool(plan, options.threads, stop);
  pool.add(items);
  pool.close();
  try {
    for (bool stop_seen = false;;) {
      for (ItemOutcome& outcome : pool.wait_for_outcomes(remote ? remote->poll_interval() : std::chrono::milliseconds(100)))
        deliver(std::move(outcome));
      if (remote) remote->exchange(pool, stop.load(), deliver);
      const bool stop_now = stop.load() && !stop_seen;
      if (stop_now) {
        stop_seen = true;
        pool.wake_on_stop();
      }
      if (unflushed && (stop_now || Clock::now() - last_flush >= kFlushInterval)) {
        output.flush();
        last_flush = Clock::now();
        unflushed = false;
      }
      bar.update(report.points_done);
      if (pool.idle() && (!remote || remote->finished())) break;
    }
    if (unflushed) output.flush();
  } catch (...) {
    stop.store(true);
    pool.wake_on_stop();
    bar.finish(report.points_done);
    throw;
  }
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
