// Command-line options of the emu calculator: a small strict parser (unknown options,
// missing values and repeated options are errors) and the rounding setup shared by the
// subcommands.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"

namespace emu::cli {

// Bad input from the user (arguments, data files): one line, exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  std::string_view name;  // "--format"
  bool takes_value;
};

struct ParsedOptions {
  std::map<std::string, std::string, std::less<>> values;  // "--format" -> "fp16"; flags -> ""
  std::vector<std::string> positionals;
  bool has(std::string_view name) const { return values.find(name) != values.end(); }
  std::optional<std::string> get(std::string_view name) const;
};

// Reads `--name value`, `--name=value`, flags, and positionals (anything not starting
// with "--"; so "-", "-0.5" and "-inf" are values). "--" ends the options. Throws
// UsageError naming the command for an unknown option, a missing value or a repeat.
ParsedOptions parse_options(std::string_view command, const std::vector<std::string>& args,
                            const std::vector<OptionSpec>& known);

// --format F (required) with --subnormals on|off.
Format format_option(const ParsedOptions& o, std::string_view option = "--format");
// A format named by an option value, as UsageError when unknown (listing the known ones).
Format format_named(std::string_view option, const std::string& name);
// parse() (a name looked up in one of emu's tables, ...), its std::invalid_argument as
// UsageError "OPTION: message": how every option value becomes a typed value, once.
template <class Parse>
auto option_value(std::string_view option, Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(option) + ": " + e.what());
  }
}
// parse(), its std::invalid_argument as UsageError with the same message (for messages
// that name their options themselves, as emu::resolve_unit's do).
template <class Parse>
auto usage_checked(Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}
// A decimal integer in [lo, hi], all of it; else integer_out_of_range.
std::uint64_t integer_option(std::string_view option, const std::string& value, std::uint64_t lo, std::uint64_t hi);
// UsageError "OPTION: expected an integer from LO to HI, got 'TEXT'".
[[noreturn]] void integer_out_of_range(std::string_view option, std::uint64_t lo, std::uint64_t hi,
                                       const std::string& text);

// The rounding options, typed: --rounding --seed --sr-bits --overflow --rng --tininess
// and --trap. seed: --rng philox: the stream (seed S, point 0, replica 0, lane 0), S up
// to 2^64 - 1; --rng ipu: the xoroshiro128aox state that the IPU's $PRNG_SEED
// expansion of S (0..2^32 - 1, checked by the parser) gives.
struct RoundingOptions {
  emu::Rounding rounding = emu::Rounding::rne;
  std::uint64_t seed = 0;
  int sr_bits = 0;
  emu::Overflow overflow = emu::Overflow::inf;
  emu::RngKind rng = emu::RngKind::philox;
  emu::Tininess tininess = emu::Tininess::before;
  Flags traps = 0;
};
RoundingOptions rounding_options_from(const ParsedOptions& o);
Context make_context(const RoundingOptions& r);
// make_context(rounding_options_from(o)). Without --seed, S = 0.
Context context_from(const ParsedOptions& o);
// The rounding mode's name as given (default rne).
std::string rounding_from(const ParsedOptions& o);
// --trap's comma-separated flag names (oflo,div0,inv; also uflo, inexact; any case).
Flags trap_flags(const std::string& list);

// The options every rounding subcommand takes (--tininess among them).
std::vector<OptionSpec> rounding_options();

}  // namespace emu::cli
