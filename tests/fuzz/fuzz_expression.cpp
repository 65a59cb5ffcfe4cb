// libFuzzer target: emu eval's expression parser and evaluator (every input that parses
// is evaluated in fp16, with round-to-nearest and with stochastic rounding).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "emu/arith.hpp"
#include "expression.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto tree = emu::cli::parse_expression(text);
    emu::Context ctx;
    emu::cli::RaisedBy raised_by;
    emu::cli::evaluate(*tree, emu::fp16(), ctx, raised_by);
    (void)emu::cli::to_string(*tree);
  } catch (const emu::cli::SyntaxError&) {
  }
  return 0;
}
