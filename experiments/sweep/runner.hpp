// Runs the work items of a validated plan in parallel (oneTBB) into an output file. Each
// (point, replica) gets the stream (seed, point, replica, lane 0); results are placed by
// index, so the file is the same for any thread count, scheduling or number of MPI ranks.
// Finished points are written as they complete and flushed within 200 ms, by the calling
// thread, the only one touching HDF5.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "config.hpp"
#include "h5file.hpp"

namespace roundoff::sweep {

struct RunOptions {
  int threads = 0;        // 0 = all cores this process may use
  bool progress = false;  // draw a progress bar on stderr
};

// Points here are the file's units of work: a point's runs that this sweep computes (all
// its replicas, or a shard's part of them).
struct RunReport {
  bool complete = false;  // every point of the work is done
  std::size_t points_done = 0, n_points = 0;
  std::size_t failed_runs = 0;  // runs whose own code raised (RunRaised); in /failures
  double seconds = 0;
};

// An experiment misbehaved (threw, or returned metrics its specs do not name): a bug.
class ExperimentFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An experiment reported bad input (roundoff::BadInput) while running: exit status 2.
class ExperimentBadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run whose own code failed (a Python experiment's callable raised, or its worker
// died): that run only fails. It is recorded in the output's /failures, not marked done
// (--resume reruns it), and the sweep goes on; sweep exits 2 at the end.
class RunRaised : public std::runtime_error {
 public:
  RunRaised(const std::string& message, std::string traceback)
      : std::runtime_error(message), traceback_(std::move(traceback)) {}
  const std::string& traceback() const { return traceback_; }

 private:
  std::string traceback_;
};

struct WorkItem {
  std::uint32_t point = 0, replica = 0;
};

// What became of one run. `message` (for bad_input and failure) names the point and replica;
// for raised it is the exception's one line and `traceback` the rest.
struct ItemOutcome {
  enum class Kind : std::uint8_t { ok, cancelled, bad_input, failure, raised };
  WorkItem item;
  Kind kind = Kind::ok;
  RunResult result;  // for ok
  std::string message;
  std::string traceback;
};

// Runs one item of the plan: the experiment with its own stream, `stop` as its cancel flag,
// and the result checked against the experiment's specs. Never throws. A run that lets
// emu::FpException escape (fp_exceptions: trap) is ok, not a failure: metrics NaN,
// RunResult::trap set, flags the status at the trap.
ItemOutcome run_item(const SweepPlan& plan, WorkItem item, const std::atomic<bool>& stop);

// Runs items on `threads` oneTBB threads (0: as many as this process may use), taking them
// from its queue in order. Items can be added while it runs and taken back before they
// start (to hand them to another rank); it stops taking new ones once `stop` is set.
class ComputePool {
 public:
  ComputePool(const SweepPlan& plan, int threads, const std::atomic<bool>& stop);
  ~ComputePool();  // closes the queue and waits for the threads
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  void add(const std::vector<WorkItem>& items);
  // Removes up to n items that have not started, from the front of the queue.
  std::vector<WorkItem> take(std::size_t n);
  // No more items will be added: the threads end once the queue is empty.
  void close();
  // Wakes the threads to see `stop` (call after setting it) and drops the queued items.
  void wake_on_stop();
  // Waits up to `timeout` for outcomes; returns those ready (possibly none).
  std::vector<ItemOutcome> wait_for_outcomes(std::chrono::milliseconds timeout);
  std::size_t threads() const { return threads_; }
  // Items queued or running.
  std::size_t pending() const;
  // Closed, every item run and its outcome taken.
  bool idle() const;

 private:
  void work_loop();
  const SweepPlan& plan_;
  const std::atomic<bool>& stop_;
  std::size_t threads_;
  mutable std::mutex mutex_;
  std::condition_variable wake_workers_, wake_taker_;
  std::deque<WorkItem> queue_;
  std::vector<ItemOutcome> outcomes_;
  std::size_t running_ = 0;
  bool closed_ = false;
  std::thread driver_;  // runs the oneTBB loop
};

// Workers in other processes (MPI ranks) that compute items of the same plan. run_plan
// calls exchange() between its own steps; the workers take items from the pool's queue.
class RemoteWorkers {
 public:
  virtual ~RemoteWorkers() = default;
  // Without blocking: hands items from `pool` to workers that ask for more (none once
  // `stopping`; then tells every worker to stop), and passes each outcome that arrived to
  // `deliver`. Throws ExperimentBadInput when a worker cannot run the plan at all.
  virtual void exchange(ComputePool& pool, bool stopping, const std::function<void(ItemOutcome&&)>& deliver) = 0;
  // Every worker has returned all it was given and left.
  virtual bool finished() const = 0;
  // The wait between exchanges while nothing happens locally.
  virtual std::chrono::milliseconds poll_interval() const { return std::chrono::milliseconds(2); }
};

// Runs the items of `work` (by point; a point is written once all its listed replicas are
// done; those that raised are left out, recorded in /failures, and the sweep goes on). `stop` is polled between runs and handed to experiments as RunEnv::cancel; once it
// is set no new run starts, cancelled runs are dropped, and every point whose listed
// replicas all finished is still written. Throws ExperimentFailure (or ExperimentBadInput)
// after saving what finished.
RunReport run_plan(const SweepPlan& plan, OutputFile& output, const std::vector<PointWork>& work, const RunOptions& options,
                   std::atomic<bool>& stop, RemoteWorkers* remote = nullptr);

}  // namespace roundoff::sweep
