// SIGINT and SIGTERM ask the sweep to stop: they set one process-wide flag that the runner
// polls (and hands to experiments as their cancel flag).
#pragma once

#include <atomic>
#include <csignal>

namespace roundoff::sweep {

// The flag SIGINT and SIGTERM set while a StopSignals exists.
std::atomic<bool>& stop_requested();

// Clears the flag and catches SIGINT and SIGTERM into it for its lifetime (the previous
// handlers are restored afterwards): a signal at any moment, while the config is parsed or
// the output created too, stops the sweep through the same path.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_int_ {}, previous_term_ {};
};

}  // namespace roundoff::sweep
