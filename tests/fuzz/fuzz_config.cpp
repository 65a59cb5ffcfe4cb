// libFuzzer target: the sweep config loader and plan expansion (YAML text to a validated
// plan of grid points). Bad configs are InputError; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "experiments/sweep/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)roundoff::sweep::parse_plan(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml", "out.h5",
                                      /*check_output_folder=*/false);
  } catch (const roundoff::sweep::InputError&) {
  }
  return 0;
}
