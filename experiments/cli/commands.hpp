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
#include "emu/unit_request.hpp"
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

// The unit that --unit, --in, --out and --scale-rule name, each parsed once into its
// typed value (UsageError naming the option). --unit is required: `hint` completes the
// message when it is missing.
UnitRequest unit_request_from(const ParsedOptions& o, std::string_view command);

// The request resolved by emu::resolve_unit (which says which unit takes which
// operand format; its messages name the calculator's options, as UsageError), with the
// fixed JSON fields (unit, in, out, format = out, rounding; the block-scaled MMA adds
// kind) and the same for people.
struct UnitSetup {
  ReadyUnit ready;
  std::string fixed_json;
  std::string description;  // "unit U, in F, out G", "unit b200 block-scaled kind::K, in F, out fp32"
};
UnitSetup unit_setup(const UnitRequest& request, const std::string& rounding);

// emu quantize's block format (--format), spec (--scale-rule, --tensor-scale, the
// elements' rounding, saturating unless --overflow is given) and context (its sr
// stream), with the checks and messages of the command (UsageError). quantize_setup
// takes the typed values (tensor_scale_text: the value as the user wrote it, for the
// message).
struct QuantizeSetup {
  const BlockFormat* format = nullptr;
  BlockSpec spec;
  Context ctx;
};
QuantizeSetup quantize_setup(const BlockFormat& f, std::optional<ScaleRule> rule, const RoundingOptions& rounding,
                             bool overflow_given, std::optional<double> tensor_scale,
                             const std::string& tensor_scale_text);
QuantizeSetup quantize_from(const ParsedOptions& o);

// Rounds x into f with rne (how inputs enter a unit), collecting the flags; tininess as
// the context says.
double convert_input(const Format& f, const Exact& x, const Context& ctx, Flags& flags);

// c + sum a_i b_i as emu dot computes it. Scalar formats: a and b rounded into the
// unit's input format, c into its output format (rne, convert_input), then the unit's
// dot. A block format: a and b rounded to the nearest double, then each quantised along
// k (ReadyUnit::quantize_operands; nvfp4 each with its default tensor scale), c rounded
// into the output format (rne), then the block-scaled MMA under ctx with nvfp4's
// epilogue (emu/block_mma.hpp), or the reference unit on the dequantised values.
struct DotResult {
  double value = 0;
  Flags input_flags = 0;  // the inputs' rounding or quantisation, alpha's, c's rounding
  TensorScaleEpilogue epilogue;
};
DotResult unit_dot(const UnitSetup& s, Context& ctx, std::span<const Exact> a, std::span<const Exact> b,
                   const Exact& c);

// The largest matrix, operand or product, that roundoff allocates from a size it was
// given (emu gemm's files and product, roundoff.matmul's product, matmul_accum's M x K
// and K x N): 2^24 = 16,777,216 elements, 4096 x 4096 (128 MiB of float64). A product
// through an emulated unit stays far below it; a mistyped size is refused before
// anything is allocated.
inline constexpr std::size_t kMaxMatrixElements = std::size_t{1} << 24;
// Throws UsageError naming the matrix `what` when rows x cols is over kMaxMatrixElements
// (inline: the experiments check their own matrices with it and do not link the CLI).
inline void check_matrix_size(const std::string& what, std::size_t rows, std::size_t cols) {
  if (cols == 0 || rows <= kMaxMatrixElements / cols) return;
  throw UsageError(what + " would be " + std::to_string(rows) + " x " + std::to_string(cols) +
                   ", more than the limit of " + std::to_string(kMaxMatrixElements) + " elements (4096 x 4096)");
}

// A B + C (A m x k, B k x n, row-major; C m x n, or empty for zeros) as emu gemm
// computes it with a block format: A's rows and B's columns quantised along k (nvfp4:
// one tensor scale for all of A, one for all of B), each element's C rounded into the
// output format (rne), then one dot product per element, row-major: the block-scaled
// MMA with the epilogue, or the reference unit on the dequantised values.
struct BlockGemmResult {
  std::vector<double> values;     // m x n, row-major
  std::vector<Flags> flags;       // per element: the unit's (ctx's status, cleared before each)
  std::vector<Flags> input_flags; // per element: its row's, its column's, alpha's and its C's
  TensorScaleEpilogue epilogue;
};
BlockGemmResult block_gemm(const UnitSetup& s, Context& ctx, std::size_t m, std::size_t n, std::size_t k,
                           const double* A, const double* B, std::span<const Exact> C);

}  // namespace emu::cli
