// The `sweep` command line, callable in-process (tests register their own experiments and
// call it). Exit status: 0 ok, 1 internal error (a bug), 2 bad input, 130 interrupted.
#pragma once

#include <memory>
#include <string>

namespace roundoff::sweep {

struct SweepPlan;
class RemoteWorkers;

// Other processes that compute runs for this one (under mpirun: the ranks other than 0).
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  // Hands the plan to the workers (each runs `threads` threads, 0: all it may use); they
  // compute the items the returned object gives them.
  virtual std::unique_ptr<RemoteWorkers> start(const SweepPlan& plan, int threads) = 0;
};

// `workers`: where a sweep also computes (null: this process alone).
int sweep_main(int argc, char** argv, WorkerGroup* workers = nullptr);

// The summary table of an output file on stdout (per point: the varied parameters and
// statistics of the headline metric over the replicas written).
void print_summary(const std::string& path);

}  // namespace roundoff::sweep
