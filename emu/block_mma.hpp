// Blackwell's block-scaled MMA (PTX tcgen05.mma ... .block_scale): a block FMA whose
// operands are block formats (emu/block.hpp), d = c + sum_k a_k X_A(k) * b_k X_B(k), with
// X_A(k), X_B(k) the scales of the blocks holding a_k and b_k. The b200 preset for the
// block formats.
//
// No measured data here: tests/mma/test_validation.cpp's data (Khattak and Mikaitis) has
// no block-scaled instruction, and no other measurement of one is at hand. The model
// follows the PTX ISA for the instruction shapes and MMA-Sim (Xie et al., "MMA-Sim:
// Bit-Accurate Reference Model of Tensor Cores and Matrix Cores", arXiv 2511.10909;
// github.com/microsoft/MMA-Sim) for the datapath:
//  - PTX: kind::mxf8f6f4 takes e4m3 e5m2 e2m3 e3m2 e2m1 elements (A and B may differ),
//    one UE8M0 scale per 32 elements (scale_vec::1X), K = 32 per instruction;
//    kind::mxf4 takes e2m1 with UE8M0 scales per 32 (scale_vec::2X), K = 64;
//    kind::mxf4nvf4 takes e2m1 with UE8M0 per 32 (2X) or UE4M3 per 16 (4X), K = 64.
//    fp32 accumulator and output.
//  - MMA-Sim (mmasim/simulator/nv_ptx.py, class tcgen05mma_block_scale; arithmetic in
//    mmasim/simulator/arithmetic.py) runs K = 32 through nv_fused_dot_add with the
//    scales (fused_dot_add: each product's exponent is its elements' plus both scales';
//    25 fraction bits) and K = 64 (kind::mxf4 and kind::mxf4nvf4 alike) through
//    nv_fused_dot_add_with_block_scale (35 fraction bits); both through fused_sum
//    (truncation below the largest exponent) and a final truncation to fp32.
//
// One instruction computes, from its products and the accumulator c (an fp32 value):
//  1. Terms. mxf8f6f4: every product a_k b_k (exact) times X_A X_B is a term; its
//     exponent is e(a_k) + e(b_k) + e(X_A) + e(X_B), e(x) the exponent of x clamped at
//     its format's emin (subnormal elements keep emin, as in emu's block FMA).
//     mxf4nvf4: the products of each group of group_size (16) consecutive k, which lie
//     in one scale block of each operand, are added exactly into S; S X_A X_B is a term
//     whose exponent is e(X_A) + e(X_B) alone: S is not normalised (|S| <= 16 * 36),
//     UE4M3 scales keep their significand (in S X_A X_B) and subnormal UE4M3 scales
//     emin = -6. c is a term with its binary32 exponent (subnormals -126).
//  2. E is the largest exponent of the non-zero terms. Zero terms take no part (as in
//     emu's block FMA, mma.hpp; MMA-Sim gives a zero the exponent -126 and lets it take
//     part, which differs only where a zero's -126 exceeds every non-zero term: a
//     result below 2^-126 with c = 0, or a group of zero sum with the largest scales).
//     Without a non-zero term the result is +0.
//  3. Every term is truncated toward zero (sign-magnitude) to a multiple of
//     2^(E - kept_fraction_bits) and the truncated terms are added exactly: 25 kept bits
//     for K = 32 (as the b200 preset's fp16 path: 23 + 2, Khattak and Mikaitis), 35 for
//     K = 64 (MMA-Sim; no other source).
//  4. The sum is normalised and rounded once into fp32 with final_rounding (rz, as
//     MMA-Sim truncates; exponents floored at -126: gradual underflow). Past fp32's
//     range the result is infinity (the exponent field all ones, as MMA-Sim's
//     conversion gives, and as TensorCoreUnit overflows), through the context's
//     overflow policy. INEXACT when a bit is lost in 3 or 4; UFLO (emu's flag, the
//     hardware has none) when the exact sum is below 2^-126 and bits are lost in 4.
// K beyond one instruction: instructions of instruction_k products chained in index
// order, each result (an fp32 value, as the accumulator in tensor memory holds it) the
// next one's c; a last shorter instruction takes the products that remain (the missing
// ones are zeros, which change nothing).
// NaN and infinity follow IEEE 754 over the whole dot product: a NaN element, a NaN
// scale (E8M0 0xff, UE4M3 0x7f) or a NaN c gives NaN quietly (no flag: the quantiser
// raised INV where an infinity made a scale NaN; MMA-Sim returns NaN, 0x7fffffff, for a
// NaN scale or c; emu's fp32 NaN is its canonical one); 0 * inf and inf - inf give NaN
// with INV; otherwise an infinite element or c gives that infinity.
//
// NVFP4's per-tensor fp32 scale is not the tensor core's: the MMA ignores
// BlockQuantized::tensor_scale. As cuBLASLt applies it (its alpha), it scales the
// MMA's result outside the tensor core: a TensorScaleEpilogue, below, given to dot or
// gemm.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "arith.hpp"
#include "block.hpp"
#include "format.hpp"
#include "unit.hpp"

namespace emu {

// How an instruction makes its terms (step 1 above).
enum class BlockMmaKind {
  mxf8f6f4,  // one term per product, normalised: PTX kind::mxf8f6f4
  mxf4nvf4,  // one term per group of products, exponent of the scales: kind::mxf4, kind::mxf4nvf4
};
const char* block_mma_kind_name(BlockMmaKind kind);  // "mxf8f6f4", "mxf4nvf4"

struct BlockMmaParams {
  BlockMmaKind kind = BlockMmaKind::mxf8f6f4;
  int instruction_k = 32;       // products per instruction (32: mxf8f6f4, 64: mxf4 and mxf4nvf4)
  int group_size = 1;           // products added exactly into one term: 1 for mxf8f6f4, 16 for mxf4nvf4
  int kept_fraction_bits = 25;  // fraction bits kept below E (25 for K = 32, 35 for K = 64)
  // Rounding of the sum into fp32: rne rna rz ru rd ro (sr is refused: no random bits).
  Rounding final_rounding = Rounding::rz;
};

// The b200 preset for operands in block formats a and b (names as block_format_by_name):
//  mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2, and mxfp4-e2m1 beside one of them:
//    kind::mxf8f6f4 (K 32, 25 kept bits);
//  mxfp4-e2m1 with mxfp4-e2m1: kind::mxf4 (K 64, groups of 16, 35 kept bits), the
//    instruction a pure FP4 GEMM takes (packed FP4, twice mxf8f6f4's K); kind::mxf8f6f4
//    also takes e2m1 (params with kind mxf8f6f4 model that);
//  nvfp4 with nvfp4: kind::mxf4nvf4 with UE4M3 scales per 16 (scale_vec::4X), as the
//    mxf4 row.
// Throws std::invalid_argument naming the reason for any other device (only b200 has
// block-scaled MMA), mxint8 (no kind takes integer elements), and nvfp4 beside an MX
// format (the two scales of an instruction have one type).
BlockMmaParams block_mma_params(UnitKind device, const BlockFormat& a, const BlockFormat& b);

// NVFP4's per-tensor scales ts_a and ts_b applied after the MMA, as cuBLASLt applies
// alpha (tensor-wide scales are no part of the instruction):
//  1. alpha = ts_a * ts_b rounded to nearest even into fp32 (overflow to infinity);
//     its flags are the inputs' (alpha_flags), not the unit's.
//  2. The MMA runs from zero: r = c' + sum ... with c' = +0.
//  3. d = alpha * r + c in one fp32 fused multiply-add under the context (its rounding
//     mode and flags; op "fma").
// Operands without tensor scales (MX) take no epilogue (applies false): c is the MMA's
// accumulator, as a default-constructed epilogue gives.
struct TensorScaleEpilogue {
  bool applies = false;
  double alpha = 1;
  Flags alpha_flags = 0;
};

class BlockMmaUnit {
 public:
  // Throws std::invalid_argument for what the model cannot run: integer elements;
  // mxf8f6f4 with a scale other than E8M0; mxf4nvf4 with elements other than fp4-e2m1,
  // A and B scales of different formats, or a group size that does not divide both
  // block sizes and instruction_k; instruction_k outside 1..1024; kept bits outside
  // 1..40, or so many that an instruction's exact sum could reach 2^53; final_rounding
  // sr.
  BlockMmaUnit(UnitKind device, const BlockFormat& a, const BlockFormat& b, BlockMmaParams params);

  UnitKind kind() const { return device_; }
  const BlockFormat& a_format() const { return a_; }
  const BlockFormat& b_format() const { return b_; }
  const Format& output_format() const { return fp32(); }
  const BlockMmaParams& params() const { return params_; }

  // The epilogue for operands whose tensor scales are ts_a and ts_b (BlockQuantized::
  // tensor_scale): applies where a_format() and b_format() have tensor scales (nvfp4).
  TensorScaleEpilogue tensor_scale_epilogue(double ts_a, double ts_b) const;

  // c + sum_k a_k X_A(k) b_k X_B(k) over all of a and b (quantised in a_format() and
  // b_format(), as quantize() gives them; their lengths must agree), c an fp32 value;
  // through `epilogue` where it applies. Flags into ctx: INEXACT and UFLO gathered over
  // the dot product and raised once, OFLO and INV as they occur, then the epilogue's
  // fma's. Throws std::invalid_argument for lengths that differ or a c outside fp32.
  double dot(Context& ctx, const BlockQuantized& a, const BlockQuantized& b, double c,
             const TensorScaleEpilogue& epilogue = {}) const;
  // C[i * ldc + j] = dot(rows[i], cols[j], C[i * ldc + j], epilogue) for every i, j:
  // rows of A and columns of B, each quantised along k. Element (i, j) raises its flags
  // with Context::element set to flat i * n + j (n = cols.size()), index [i, j]. Runs on
  // up to gemm_threads() threads in bands of rows (emu/threads.hpp): results, flags,
  // counts and a trap do not depend on the number of threads.
  void gemm(Context& ctx, std::span<const BlockQuantized> rows, std::span<const BlockQuantized> cols, double* C,
            std::size_t ldc, const TensorScaleEpilogue& epilogue = {}) const;

 private:
  struct Decoded;  // an operand decoded for the adder (emu/block_mma.cpp)
  Decoded decode(const BlockQuantized& q, const BlockFormat& f) const;
  double dot_decoded(Context& ctx, const Decoded& a, const Decoded& b, double c) const;
  double dot_with(Context& ctx, const Decoded& a, const Decoded& b, double c,
                  const TensorScaleEpilogue& epilogue) const;
  // gemm on the calling thread; decoded_cols: cols decoded (by gemm, once for all its
  // bands of rows), or nullptr to decode them after the rows.
  void serial_gemm(Context& ctx, std::span<const BlockQuantized> rows, std::span<const BlockQuantized> cols,
                   const std::vector<Decoded>* decoded_cols, double* C, std::size_t ldc,
                   const TensorScaleEpilogue& epilogue) const;
  double special(Context& ctx, const Decoded& a, const Decoded& b, double c) const;
  double instruction(Context& ctx, std::size_t first, std::size_t count, const Decoded& a, const Decoded& b, double c,
                     Flags& flags) const;

  UnitKind device_;
  BlockFormat a_, b_;
  BlockMmaParams params_;
};

// The b200 preset (block_mma_params) as a unit. Throws std::invalid_argument as
// block_mma_params does.
std::unique_ptr<BlockMmaUnit> make_block_mma_unit(UnitKind device, const BlockFormat& a, const BlockFormat& b);

}  // namespace emu
