// NVIDIA tensor-core models: one parametric multi-term fused adder ("block FMA") and a
// table of named per-device parameters, after Khattak and Mikaitis, "Accurate Models of
// NVIDIA Tensor Cores" (MATLAB-tensor-core), which agrees with Fasi, Higham, Mikaitis and
// Pranesh, "Numerical behavior of NVIDIA tensor cores" (PeerJ CS 2021), and the FTTN /
// HPEC 2025 feature tests.
//
// One block computes d = c + sum_{i<n} a_i b_i (n <= block_size) as follows:
//  1. Products are exact. Each factor has the exponent of its format, clamped at the
//     format's emin (subnormals keep emin and a significand below 1); a product's "raw"
//     exponent is e_a + e_b, its significand (in [0, 4)) is not normalised. With
//     BlockFmaParams::product_lsb set, each product is first truncated toward zero to a
//     multiple of 2^product_lsb: -149 on Hopper (h100, h200) for bf16 and tf32 inputs,
//     as if the products were binary32 values cut toward zero (only products below
//     binary32's normal range change; see product_lsb).
//  2. The alignment exponent E is the largest raw exponent among the non-zero products
//     and c (c's exponent is its binary32 exponent). Zero products take no part.
//  3. Every term (c and the products) is cut to a multiple of 2^(E - kept_fraction_bits):
//     kept_fraction_bits = 23 + the device's extra alignment bits (13 for native fp8 on
//     Ada and Hopper). How it is cut is BlockFmaParams::alignment_rounding; every preset
//     truncates sign-magnitude (towards zero), as measured.
//  4. The cut terms are added exactly (integers), normalised once and rounded once into
//     the output format with BlockFmaParams::final_rounding (rz for fp32 output, rne for
//     fp16 output on every preset; any of rne rna rz ru rd ro may be set). The rounding
//     looks only at the integer sum (its bits below the output's last place decide, the
//     sign for ru and rd): the bits cut at alignment are gone, as in the hardware, and
//     only raise INEXACT. Native fp8 with fp32 output first truncates the sum to 13
//     fraction bits (an e8m13 result). UFLO (emu's flag; the hardware has none) is
//     decided on the exact sum, before rounding, whatever the context's tininess;
//     overflow and the flush of an output without subnormals go through emu::round
//     under the context, and so follow its overflow policy and tininess.
// For K > block_size the blocks are chained in index order: c <- block(a_j, b_j, c), each
// intermediate rounded into the output format. NaN and infinity follow IEEE 754 over the
// whole dot product (any NaN, inf - inf or 0 * inf gives NaN with INV; otherwise an
// infinite operand gives that infinity).
//
// fp8 on the fp16 datapath (Hopper with fp16 output, Blackwell): each 32-product
// instruction is two fp16 blocks of 16 taking the products in alternating pairs, chained
// from zero; c is then added in one IEEE addition rounded to nearest. Found by fitting
// the measured data (tests/mma/test_validation.cpp); Khattak and Mikaitis's MATLAB model
// describes this path only as an "interleaved pattern".
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "unit.hpp"

namespace emu {

// How a term is cut to the kept fraction bits when it is aligned (step 3 above), in units
// q = 2^(E - kept_fraction_bits):
//  truncate_magnitude        towards zero, sign-magnitude: |t| is truncated and the sign
//                            put back. Measured on every NVIDIA device modelled here
//                            (Fasi et al. 2021; Khattak and Mikaitis), the default.
//                            -0.75 q -> 0, 0.75 q -> 0.
//  truncate_twos_complement  towards minus infinity (floor), what an arithmetic right shift
//                            of a two's-complement term drops. -0.75 q -> -q, 0.75 q -> 0.
//  nearest_even              to the nearest multiple of q, ties to the even multiple (a
//                            guard-and-round step at the last kept bit). -0.75 q -> -q,
//                            0.5 q -> 0, 1.5 q -> 2 q.
enum class AlignmentRounding { truncate_magnitude, truncate_twos_complement, nearest_even };
// "truncate-magnitude", "truncate-twos-complement", "nearest-even".
const char* alignment_rounding_name(AlignmentRounding r);
AlignmentRounding alignment_rounding_by_name(std::string_view name);  // throws std::invalid_argument
NameTable<AlignmentRounding> alignment_rounding_table();

// The micro-architecture parameters of one multi-term fused adder (STYLE.md point 11).
struct BlockFmaParams {
  int block_size = 4;            // products fused before one normalisation (at most 64)
  int kept_fraction_bits = 23;   // fraction bits kept below the alignment exponent E
  // How the terms are cut to the kept bits at alignment (see AlignmentRounding).
  AlignmentRounding alignment_rounding = AlignmentRounding::truncate_magnitude;
  // Rounding of a block's integer sum into the output format: rne rna rz ru rd or ro
  // (sr is refused: the adder has no random bits).
  Rounding final_rounding = Rounding::rz;
  // > 0: the normalised sum is first truncated to this many fraction bits (13: the
  // e8m13 result of native fp8 on Ada and Hopper); 0: rounded straight into the output.
  int result_fraction_bits = 0;
  bool input_subnormals = true;  // false: subnormal inputs are flushed to zero
  // Each product is truncated toward zero (sign-magnitude) to a multiple of
  // 2^product_lsb before alignment; the default is far below any product (exact
  // products). -149, binary32's subnormal grid, is what an H100 gave for a bf16 inner
  // product whose products lie below 2^-126: 0x1.6p-146 = 11 * 2^-149, where exact
  // products give 0x1.4p-146 (the exact sum is 10.9989 * 2^-149; measured by a user of
  // MATLAB-tensor-core, its GitHub issue #7; tests/mma/test_params.cpp).
  // The h100 and h200 presets set it for bf16 and tf32 (whose products can fall below
  // 2^-126; fp16 and fp8 products cannot fall off the grid). No other device has a
  // measurement with such products (none of the 48 published sets has one), so the
  // other presets keep exact products; set it to model them otherwise.
  int product_lsb = std::numeric_limits<int>::min() / 4;
  // E is raised to at least this (no clamp by default).
  int min_alignment_exponent = std::numeric_limits<int>::min() / 4;
  // fp8 inputs converted (exactly) to fp16 and run through the fp16 adder: their
  // exponents are clamped at fp16's emin, not fp8's.
  bool fp16_datapath = false;
  // Products per instruction; 0 means block_size. With pair_interleave the products of
  // an instruction are dealt to its instruction_k / block_size blocks two at a time
  // (products 0,1 to the first block, 2,3 to the second, ...), as fp8 MMA on the fp16
  // datapath does (Hopper with fp16 output, Blackwell); the blocks run in order.
  int instruction_k = 0;
  bool pair_interleave = false;
  // false: c is aligned with the products of the first block (NVIDIA's native paths);
  // true: each instruction's blocks accumulate from zero and c is added afterwards in
  // one addition rounded with c_rounding (fp8 on the fp16 datapath; AMD CDNA3 style).
  bool c_after_products = false;
  Rounding c_rounding = Rounding::rne;
};

// The parameters of a device for one input/output format pair. Throws
// std::invalid_argument naming the device when it does not take the formats (inputs:
// fp16, bf16, tf32, fp8-e4m3, fp8-e5m2 as the device supports them; outputs fp32, and
// fp16 for fp16 and fp8 inputs).
BlockFmaParams tensor_core_params(UnitKind device, const Format& in, const Format& out);

// The adder's last step on its fixed-point sum: x = (negative ? -1 : 1) * magnitude *
// 2^lsb (magnitude != 0) rounded in place with mode (rne rna rz ru rd ro; sr throws
// std::invalid_argument) to `fraction_bits` with exponents floored at emin (gradual
// underflow). Raises INEXACT, and UFLO for a tiny inexact x, into flags. Range
// (overflow) and flushing are the caller's: this is emu::round()'s arithmetic on
// integers, for speed, and is tested against it.
struct FixedPoint {
  std::uint64_t magnitude = 0;
  int lsb = 0;
  bool negative = false;
};
void round_fixed_point(FixedPoint& x, int fraction_bits, int emin, Rounding mode, Flags& flags);
double to_double(const FixedPoint& x);  // exact for magnitudes below 2^53

// A tensor core: the block FMA with fixed parameters and formats.
class TensorCoreUnit final : public MatrixUnit {
 public:
  // Throws std::invalid_argument for parameters the adder cannot run (block size outside
  // 1..64, kept bits outside 1..40, final_rounding sr, formats beyond binary32, ...).
  TensorCoreUnit(UnitKind kind, Format in, Format out, BlockFmaParams params);

  UnitKind kind() const override { return kind_; }
  const Format& input_format() const override { return in_; }
  const Format& output_format() const override { return out_; }
  const BlockFmaParams& params() const { return params_; }

  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
             std::size_t sb, double c) const override;
  // Equal to dot() per element, flags included (the instruction shapes m8n8k4,
  // m16n8k16, ... only cut k into chunks whose results are chained the same way). Where
  // the adder's terms fit 32-bit integers (every preset's native paths), alignment
  // truncates sign-magnitude and the final rounding is rz or rne, it runs a column
  // adder across several output columns at once (its products exact in float, or
  // integer shifts: detail::select_product_adder); otherwise, and for elements with NaN,
  // infinity or overflow, the reference adder per element. The context counting or
  // trapping INEXACT or UFLO takes the reference adder for every element, raising each
  // element's flags with it.
  // (gemm runs it in bands of rows on several threads, as MatrixUnit::gemm, with B
  // decoded once for every band where the column adder applies.)
  void serial_gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                   std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) const override;
  void gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
            const double* B, std::size_t ldb, double* C, std::size_t ldc) const override;
  // Volta's instruction on 4x4 tiles (row-major): D = A * B + C.
  void mma_4x4x4(Context& ctx, const double* A, const double* B, const double* C, double* D) const;

  // Decoded inputs, as arrays so that the adder's loops vectorise: the value (products
  // of two are exact in double) and the exponent the adder aligns with (the format's,
  // clamped at its emin; far below any other for zeros).
  struct Operands {
    const double* value;
    const std::int32_t* exp;
    Operands operator+(std::size_t j) const { return {value + j, exp + j}; }
  };

 private:
  // Decodes x into value and exp; marks NaN and infinity in `special`. Throws
  // std::invalid_argument for a value outside the input format.
  void decode(double x, double& value, std::int32_t& exp, bool& special) const;
  // dot() without raising INEXACT and UFLO into the context: they gather in `flags`.
  double dot_gathering(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                       std::size_t sb, double c, Flags& flags) const;
  // Whether serial_gemm takes the column adder: product_shift_ >= 0, k > 0 and INEXACT
  // and UFLO neither counted nor trapped.
  bool column_adder_applies(const Context& ctx, std::size_t k) const;
  // B decoded for the column adder (defined in mma.cpp). Throws std::invalid_argument
  // for an input outside the format, as decode().
  struct ColumnPanels;
  ColumnPanels decode_panels(std::size_t n, std::size_t k, const double* B, std::size_t ldb) const;
  // serial_gemm on the column adder, with B from `shared` where given (else decoded
  // here, after A), and the reference gemm.
  void gemm_columns(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
                    const double* B, std::size_t ldb, double* C, std::size_t ldc, const ColumnPanels* shared) const;
  void gemm_reference(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A,
                      std::size_t lda, const double* B, std::size_t ldb, double* C, std::size_t ldc) const;
  // The adder on decoded, contiguous operands. INEXACT and UFLO gather in `flags` and
  // reach the context once per dot or gemm (per element where the context counts or
  // traps them: flags_per_element); OFLO goes straight through the context (it may
  // trap).
  double chain(Context& ctx, std::size_t k, Operands a, Operands b, double c, Flags& flags) const;
  double instruction(Context& ctx, std::size_t k, Operands a, Operands b, double c, Flags& flags) const;
  double block(Context& ctx, std::size_t n, Operands a, Operands b, double c, Flags& flags) const;
  double special_dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b,
                     std::size_t sb, double c) const;
  // Raises the gathered flags; `result` is what the operation delivered (for a report).
  void commit(Context& ctx, Flags flags, double result = std::numeric_limits<double>::quiet_NaN()) const;
  static bool flags_per_element(const Context& ctx);

  UnitKind kind_;
  Format in_, out_;
  Format adder_in_;                      // in_, or fp16 on the fp16 datapath
  std::optional<Format> result_format_;  // the e8m13 step, if any
  BlockFmaParams params_;
  // The integer adder of gemm_columns: a product of two significands (integers below
  // 2^(f+1), f the adder's fraction bits) shifted left by this is the product in units of
  // 2^(E - kept_fraction_bits) before the alignment shift; -1 where that adder does not
  // apply (terms beyond 32 bits, pair interleaving, c added after the products, alignment
  // other than sign-magnitude truncation, final rounding other than rz and rne).
  int product_shift_ = -1;
};

// A tensor-core preset (kind v100 ... b200) as a MatrixUnit; in defaults to fp16, out to
// fp32. Throws std::invalid_argument for formats the device does not take.
std::unique_ptr<MatrixUnit> make_tensor_core_unit(UnitKind preset, std::optional<Format> in,
                                                  std::optional<Format> out);

namespace detail {
// For tests, which compare them: the vector width of the tensor-core models' column
// adder for the gemm calls that follow, in the whole process: implementation 0 (32-byte
// vectors: AVX2) or 1 (64-byte vectors compiled for AVX-512, the default where the CPU
// has it). false, changing nothing, where this build or CPU lacks it.
bool select_panel_adder(int implementation);
// For tests, likewise: how the column adder aligns and sums a block's products,
// implementation 0 (integer shifts, the reference) or 1 (exact float products scaled to
// the alignment and truncated by conversion, the default; rows and columns whose
// exponents spread too far for float take the integer shifts). false for another value.
bool select_product_adder(int implementation);
}  // namespace detail

}  // namespace emu
