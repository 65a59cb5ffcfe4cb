// libFuzzer target: the readers of existing HDF5 files (sweep --resume and the summary,
// sweep merge's shard check) on mutated sweep outputs. The file is read the way sweep
// reads it: in a child process, so that a crash inside HDF5 itself (it is not hardened
// against damaged files) is reported as a damaged file; what is fuzzed is that nothing
// else fails (no exit 1, no crash in sweep's own code, which the child shares).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "experiments/sweep/config.hpp"
#include "experiments/sweep/h5file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/roundoff-fuzz-h5-" + std::to_string(getpid()) + ".h5";
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return 0;
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  const roundoff::sweep::ExistingOutput existing = roundoff::sweep::inspect_output(path);
  if (existing.kind == roundoff::sweep::ExistingOutput::Kind::roundoff) {
    try {
      roundoff::sweep::check_readable_output(path);
      (void)roundoff::sweep::read_summary(path);  // checked whole above: must not fail now
    } catch (const roundoff::sweep::InputError&) {
    }
  }
  std::remove(path.c_str());
  return 0;
}
