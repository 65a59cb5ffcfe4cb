// Matrix units behind one interface: tensor-core presets (emu/mma), the IPU's AMP
// (emu/amp), and reference accumulations. Experiments pick one by name.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "arith.hpp"
#include "format.hpp"
#include "names.hpp"

namespace emu {

enum class UnitKind {
  v100, t4, a100, ada, l40s, h100, h200, b200,  // NVIDIA tensor cores (emu/mma.hpp)
  mi100, mi250x, mi300x,                         // AMD matrix cores (emu/cdna.hpp)
  ipu_amp,       // IPU AMP, fp16 inputs, fp32 partials (f16v4sisoamp)
  ipu_amp_half,  // IPU AMP, fp16 inputs, fp16 partials (f16v4hihoamp)
  exact,         // c + sum a_i b_i computed exactly, rounded once into the output format
  // Sequential accumulation in index order i = 0, 1, ...: under these names (make_unit)
  // always fused, c <- fma(a_i, b_i, c) with one rounding per step into the output
  // format (fp32, or fp16 for fp16-seq). make_sequential_unit(kind, false) gives the
  // unfused form with the same name: c <- c + p with p = a_i * b_i rounded first, two
  // roundings per step.
  fp32_seq,
  fp16_seq,
};
// The units' names and help, in UnitKind's order: every front end's list of units.
// A unit added to UnitKind gets its row here (a static_assert checks the order) and,
// for a tensor core, its parameters in emu/mma.cpp's device table; the CLI, sweeps and
// Python then take it with no other edit.
NameTable<UnitKind> unit_table();
const char* unit_kind_name(UnitKind k);  // "v100" ... "ipu-amp-half", "exact", "fp32-seq"
UnitKind unit_kind_by_name(std::string_view name);  // throws std::invalid_argument
const char* const* unit_names();                    // nullptr-terminated

// How a unit takes operands in a block format (emu/block.hpp):
//  mma          its block-scaled MMA consumes the blocks (b200: emu/block_mma.hpp)
//  dequantised  the exact values of the quantised operands, as fp64 inputs (the
//               reference units exact, fp32-seq, fp16-seq: what they compute does not
//               depend on a hardware input format)
//  none         it takes scalar formats only
enum class BlockOperands { none, mma, dequantised };
BlockOperands block_operands(UnitKind k);

class MatrixUnit {
 public:
  virtual ~MatrixUnit() = default;
  virtual UnitKind kind() const = 0;
  virtual const Format& input_format() const = 0;  // A's (and B's, but for mixed inputs)
  // B's input format: input_format() but on a unit with mixed inputs (mi300x's fp8 with
  // bf8, emu/cdna.hpp), whose A and B take different formats.
  virtual const Format& b_input_format() const { return input_format(); }
  virtual const Format& output_format() const = 0;

  // c + sum_{i<k} a[i*sa] * b[i*sb] as the unit computes it. a holds values of
  // input_format(), b of b_input_format() (round them first), c a value of
  // output_format(). Rounding, overflow policy, esr and traps come from ctx, which also
  // collects the status flags.
  virtual double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                     std::size_t sb, double c) const = 0;

  // C = A * B + C with A m x k (row stride lda), B k x n (row stride ldb), C m x n
  // (row stride ldc), row-major, as the unit computes it. Flags raised for element
  // (i, j) carry it (Context::element: flat i * n + j, index [i, j]); every unit's
  // counts equal those of its elements computed one by one in row-major order. Runs
  // serial_gemm on up to gemm_threads() threads in bands of rows (emu/threads.hpp):
  // results, flags, counts and a trap do not depend on the number of threads. (A unit
  // may override it to share work between the bands, with the same outcome.)
  virtual void gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
            const double* B, std::size_t ldb, double* C, std::size_t ldc) const;

 protected:
  // gemm on the calling thread (default: one dot per element; units whose tiling changes
  // the result override it). Each element's result and flags must not depend on the
  // other rows: gemm runs it on bands of rows.
  virtual void serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                           std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) const;
};

// in/out default to the unit's natural formats (tensor cores: fp16 in, fp32 out;
// ipu-amp: fp16 in, fp32 out; ipu-amp-half: fp16 in and out; exact and fp32-seq: fp16
// in, fp32 out; fp16-seq: fp16 in and out). Throws std::invalid_argument for a format
// the unit does not accept.
std::unique_ptr<MatrixUnit> make_unit(UnitKind kind, std::optional<Format> in = std::nullopt,
                                      std::optional<Format> out = std::nullopt);

// fp32-seq or fp16-seq, fused (as make_unit gives them: c <- fma(a_i, b_i, c)) or not
// (c <- add(c, mul(a_i, b_i)), the product rounded into the output format before the
// addition; both roundings under the context, each raising its own flags). Formats as
// make_unit. Throws std::invalid_argument for any other kind.
std::unique_ptr<MatrixUnit> make_sequential_unit(UnitKind kind, bool fused, std::optional<Format> in = std::nullopt,
                                                 std::optional<Format> out = std::nullopt);

}  // namespace emu
