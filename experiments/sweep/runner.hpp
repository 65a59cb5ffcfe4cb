// Runs a validated plan in parallel (oneTBB) into an output file. Each (point, replica)
// gets the stream (seed, point, replica, lane 0); results are placed by index, so the file
// is the same for any thread count and scheduling. Finished points are written as they
// complete and flushed within 200 ms, by the calling thread, the only one touching HDF5.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "config.hpp"
#include "h5file.hpp"

namespace roundoff::sweep {

struct RunOptions {
  int threads = 0;        // 0 = all cores
  bool progress = false;  // draw a progress bar on stderr
};

struct RunReport {
  bool complete = false;  // every point is done
  std::size_t points_done = 0, n_points = 0;
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

// Runs the points whose `done` entry is 0. `stop` is polled between runs and handed to
// experiments as RunEnv::cancel; once it is set no new run starts, cancelled runs are
// dropped, and every point whose replicas all finished is still written. A run that lets
// emu::FpException escape (fp_exceptions: trap) is recorded, not a failure: metrics NaN,
// RunResult::trap set, flags the status at the trap. Throws ExperimentFailure (or
// ExperimentBadInput) after saving what finished.
RunReport run_plan(const SweepPlan& plan, OutputFile& output, const std::vector<std::uint8_t>& done,
                   const RunOptions& options, std::atomic<bool>& stop);

}  // namespace roundoff::sweep
