// libFuzzer target: the block-format quantiser's options and values, through `emu
// quantize` itself (its option parser, block format, scale rule, element rounding and
// overflow, tensor scale, the values, the quantisation and both printings). The input is
// the command line, one argument per line. Bad input is UsageError; nothing else may
// escape.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args;
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    args.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  for (const auto& a : args)
    if (a == "-") return 0;  // the values from standard input: not the fuzzer's
  static std::FILE* const sink = std::fopen("/dev/null", "w");
  emu::cli::Output out(sink);
  try {
    (void)emu::cli::run_command("quantize", args, out);
    out.flush();
  } catch (const emu::cli::UsageError&) {
  }
  return 0;
}
