// libFuzzer target: the number reader (decimal, hex-float, specials) and the printing of
// what it read.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "number.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const emu::Exact x = emu::cli::parse_number(std::string_view(reinterpret_cast<const char*>(data), size));
    const double value = emu::cli::round_nearest(emu::fp16(), x);
    (void)emu::cli::shortest_decimal(emu::fp16(), value);
    (void)emu::cli::json_number(x.hi);
  } catch (const emu::cli::NumberError&) {
  }
  return 0;
}
