#include "signals.hpp"

namespace roundoff::sweep {
namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void request_stop(int) { g_stop_requested.store(true); }

}  // namespace

std::atomic<bool>& stop_requested() { return g_stop_requested; }

StopSignals::StopSignals() {
  g_stop_requested.store(false);
  struct sigaction action {};
  action.sa_handler = request_stop;
  action.sa_flags = SA_RESTART;  // file reads and writes go on
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int_);
  sigaction(SIGTERM, &action, &previous_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
}

}  // namespace roundoff::sweep
