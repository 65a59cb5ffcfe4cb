// The emu calculator's subcommands. Each takes the arguments after its name, writes its
// results to `out` (one line per result) and throws UsageError for bad input.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "emu/arith.hpp"
#include "emu/block.hpp"
#include "emu/block_mma.hpp"
#include "emu/unit.hpp"
#include "options.hpp"

namespace emu::cli {

// Writing the results failed (disk full, closed file): what() is the system's reason.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Buffered output: results are collected and written in large blocks (100,000 lines
// must not cost 100,000 writes).
class Output {
 public:
  explicit Output(std::FILE* file) : file_(file) {}
  // Flushes what is left, ignoring errors (call flush() first to hear of them).
  ~Output();
  void line(const std::string& text);
  void text(const std::string& text) { buffer_ += text; }  // as it is, no newline added
  // Writes the buffer and flushes the file; throws WriteError if either fails.
  void flush();

 private:
  std::FILE* file_;
  std::string buffer_;
};

// Usage text of a subcommand ("" = the program), or nullptr for an unknown one.
const char* help_text(const std::string& command);

// Runs `emu COMMAND ARGS...`; returns the exit status. Throws UsageError (exit 2);
// any other exception is a bug (exit 1).
int run_command(const std::string& command, const std::vector<std::string>& args, Output& out);

// The pieces of the subcommands that the Python module (python/roundoff) reuses, so that
// both take the same options, give the same errors and compute the same way.

// The options a subcommand accepts: "info", "round", "eval", "dot", "gemm", "quantize".
std::vector<OptionSpec> command_options(std::string_view command);

// `emu info`'s fields in order, each value as JSON text; info_json joins them into the
// one object `emu info --json` prints.
std::vector<std::pair<std::string, std::string>> info_fields(const Format& f);
std::string info_json(const Format& f);

// The matrix unit that --unit, --in and --out name (UsageError for a bad one).
struct UnitSetup {
  std::unique_ptr<MatrixUnit> unit;
  std::string fixed_json;  // "unit", "in", "out", "format" (= out), "rounding" fields
};
UnitSetup unit_from(const ParsedOptions& o, std::string_view command);

// emu quantize's block format (--format), spec (--scale-rule, --tensor-scale, the
// elements' rounding, saturating unless --overflow says otherwise) and context (its sr
// stream), with the checks and messages of the command (UsageError).
struct QuantizeSetup {
  const BlockFormat* format = nullptr;
  BlockSpec spec;
  Context ctx;
};
QuantizeSetup quantize_from(const ParsedOptions& o);

// Rounds x into f with rne (how inputs enter a unit), collecting the flags; tininess as
// the context says.
double convert_input(const Format& f, const Exact& x, const Context& ctx, Flags& flags);

// emu dot and emu gemm with a block format (--in): b200's block-scaled MMA for it, the
// quantisation spec of the operands (the format's default scale rule or --scale-rule;
// elements rne, saturating, as emu quantize) and the fixed JSON fields. Empty where --in
// names no block format; UsageError for a unit other than b200, mxint8, --out other than
// fp32 or a scale rule the format does not take.
struct BlockMmaSetup {
  const BlockFormat* format = nullptr;
  std::unique_ptr<BlockMmaUnit> unit;
  BlockSpec spec;
  std::string fixed_json;   // unit, in, out, format, rounding, kind
  std::string description;  // the same for people
};
std::optional<BlockMmaSetup> block_mma_from(const ParsedOptions& o, std::string_view command);

// c + sum a_i b_i as emu dot computes it with a block format: a and b each quantised
// along k (nvfp4: each with its default tensor scale), c rounded into fp32 (rne), the
// MMA under ctx, and nvfp4's tensor scales applied by the epilogue (emu/block_mma.hpp).
struct BlockDotResult {
  double value = 0;
  Flags input_flags = 0;  // the quantisation's, alpha's and c's rounding's
  TensorScaleEpilogue epilogue;
};
BlockDotResult block_dot(const BlockMmaSetup& s, Context& ctx, std::span<const double> a, std::span<const double> b,
                         const Exact& c);

// A B + C (A m x k, B k x n, row-major; C m x n, or empty for zeros) as emu gemm
// computes it with a block format: A's rows and B's columns quantised along k (nvfp4:
// one tensor scale for all of A, one for all of B), each element's C rounded into fp32
// (rne), then one block-scaled dot product with the epilogue per element, row-major.
struct BlockGemmResult {
  std::vector<double> values;     // m x n, row-major
  std::vector<Flags> flags;       // per element: the unit's (ctx's status, cleared before each)
  std::vector<Flags> input_flags; // per element: its row's, its column's, alpha's and its C's
  TensorScaleEpilogue epilogue;
};
BlockGemmResult block_gemm(const BlockMmaSetup& s, Context& ctx, std::size_t m, std::size_t n, std::size_t k,
                           const double* A, const double* B, std::span<const Exact> C);

}  // namespace emu::cli
