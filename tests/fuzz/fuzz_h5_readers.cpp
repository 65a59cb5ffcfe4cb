// libFuzzer target: the readers of existing HDF5 files (sweep --resume and the summary,
// sweep merge's shard check) on mutated sweep outputs. The file is read the way sweep
// reads it: inspect_output here, then check_readable_output in a child process, so that
// a crash inside HDF5 itself (it is not hardened against damaged files) is reported as a
// damaged file. The child gets the default signal handling back (below): it dies as it
// would in sweep rather than through libFuzzer's and ASan's handlers, which would report
// HDF5's own crash as a finding. What is fuzzed is that nothing else fails: no exception
// but InputError, no crash in this process, and read_summary, here in this process, on
// every file the child read whole.
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiments/sweep/config.hpp"
#include "experiments/sweep/h5file.hpp"

namespace {

void die_by_default_signal() {
  std::signal(SIGABRT, SIG_DFL);
  std::abort();
}

void default_signals_in_child() {
  for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(signal, SIG_DFL);
  __sanitizer_set_death_callback(die_by_default_signal);  // an ASan report from HDF5's frees
}

const int kAtFork = pthread_atfork(nullptr, nullptr, default_signals_in_child);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)kAtFork;
  static const std::string path = "/tmp/roundoff-fuzz-h5-" + std::to_string(getpid()) + ".h5";
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return 0;
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  const roundoff::sweep::ExistingOutput existing = roundoff::sweep::inspect_output(path, /*cpu_seconds=*/1);
  if (existing.kind == roundoff::sweep::ExistingOutput::Kind::roundoff) {
    try {
      roundoff::sweep::check_readable_output(path, "sweep", /*cpu_seconds=*/1);  // HDF5 can loop for ever
      (void)roundoff::sweep::read_summary(path);  // checked whole above: must not fail now
    } catch (const roundoff::sweep::InputError&) {
    }
  }
  std::remove(path.c_str());
  return 0;
}
