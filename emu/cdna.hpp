// AMD Instinct matrix cores (MFMA): MI100 (CDNA1), MI250X (CDNA2), MI300X (CDNA3), as
// the units mi100, mi250x and mi300x.
//
// No measured data here: no AMD machine has been at hand (tests/mma/test_validation.cpp's
// data is NVIDIA's). The datapaths follow MMA-Sim (Xie, Wang, Yang and Yang, "MMA-Sim:
// Bit-Accurate Reference Model of Tensor Cores and Matrix Cores", arXiv 2511.10909;
// github.com/microsoft/MMA-Sim, mmasim/simulator/amd.py for which instruction takes which
// path, mmasim/simulator/arithmetic.py for the paths: pairwise_dot, flush_denormal,
// truncate_to_tf32, amd_fused_dot_rd_add), whose paper reports bitwise agreement with the
// hardware on randomized tests; MIOpen's "MI200 MFMA behavior specifics" note
// (rocm.docs.amd.com/projects/MIOpen, MI200AlternateImplementation) for the flush on
// MI200: "MFMA_F16, MFMA_BF16 and MFMA_BF16_1K flush subnormal input/output data to
// zero". Instruction names and shapes as MMA-Sim's mmasim/isa/amd.py lists them (after
// AMD's CDNA1-3 ISA guides, which name and shape the MFMA instructions but say nothing of
// their internal rounding). Each unit runs its 16x16 instruction:
//  mi100   fp16 v_mfma_f32_16x16x16f16 (pairwise, groups of 4), bf16
//          v_mfma_f32_16x16x8bf16 (pairwise, groups of 2), fp32 v_mfma_f32_16x16x4f32
//          (fma chain);
//  mi250x  fp16 v_mfma_f32_16x16x16f16 and bf16 v_mfma_f32_16x16x16bf16_1k (pairwise,
//          groups of 4, flushed), fp32 v_mfma_f32_16x16x4f32, fp64
//          v_mfma_f64_16x16x4f64 (fma chains, fp64 out);
//  mi300x  fp16 v_mfma_f32_16x16x16_f16 and bf16 v_mfma_f32_16x16x16_bf16 (fused,
//          groups of 8), tf32 (`--in tf32`) v_mfma_f32_16x16x8_xf32 (fused, groups of 4,
//          inputs truncated to tf32), fp8-e4m3fnuz and fp8-e5m2fnuz
//          v_mfma_f32_16x16x32_fp8_fp8 / _bf8_bf8 (fused, groups of 16 in two halves),
//          mixed: A fp8-e4m3fnuz with B fp8-e5m2fnuz v_mfma_f32_16x16x32_fp8_bf8 and
//          the reverse _bf8_fp8 (the same path; each factor decoded in its own format),
//          fp32 v_mfma_f32_16x16x4_f32 and fp64 v_mfma_f64_16x16x4_f64 (fma chains).
// Output fp32 (fp64 for fp64). All roundings below are to nearest even, whatever the
// context's rounding (MFMA has no rounding mode); overflow, tininess, flags and traps are
// the context's.
//
// Pairwise (CDNA1, CDNA2), per group of g products (4 or 2) in index order:
//  1. With flushing (CDNA2 fp16 and bf16): subnormal a_i, b_i and the c an instruction
//     starts from become +0.
//  2. Each product a_i b_i is rounded into fp32 (fma(a_i, b_i, +0): a zero product is +0).
//  3. The group's products are summed as a balanced tree, left half first, each sum an
//     fp32 addition: (p0 + p1) + (p2 + p3); a shorter last group of 3 is p0 + (p1 + p2).
//  4. acc <- acc + group sum, an fp32 addition.
//     With flushing, every result of 2, 3 and 4 below 2^-126 in magnitude becomes a zero
//     of its sign.
// Fused (CDNA3), per group of g products (8; 4 for xf32; 16 for fp8) in index order:
//  1. xf32: a_i and b_i are first truncated to tf32 (their 13 low fraction bits cleared).
//  2. Products are exact: exponent e_a + e_b (each the factor's, clamped at its format's
//     emin: A's and B's own with mixed fp8), significand in [0, 4). Zero products take
//     no part (see below).
//  3. E is the largest product exponent; every product is truncated toward zero
//     (sign-magnitude) to a multiple of 2^(E - 24) and the cut products are added
//     exactly into S. fp8: the even-indexed and the odd-indexed products of the group
//     form two such sums S0 (exponent E0) and S1 (E1); E = max(E0, E1), each floored
//     (toward minus infinity) to a multiple of 2^(E - 24), S = their sum.
//  4. Against the accumulator: M = max(E, e_c), e_c c's binary32 exponent clamped at
//     -126 (a zero c has -126 and takes part). S is floored to a multiple of 2^(M - 31),
//     c floored to a multiple of 2^(M - 24) (fp8: c becomes 0 where e_c < M - 25). This
//     floor, toward minus infinity, is MMA-Sim's "rd" (its paper's asymmetric rounding on
//     CDNA3): a negative term loses up to one unit, a positive one nothing more.
//  5. S + c (exact) is rounded once into fp32; the result is the next group's c. An exact
//     zero is +0. A group without a non-zero product leaves c as it is (a -0 c becomes
//     +0, as the integer adder gives).
// Fma chain (fp32, fp64): acc <- fma(a_i, b_i, acc) in index order, rounded into fp32 or
// fp64.
// K beyond one instruction chains instructions through the accumulator (an fp32 or fp64
// value). Since every group already takes the accumulator as its c and delivers a
// rounded accumulator, instruction boundaries change nothing beyond the groups: a K that
// is not a multiple of the group size ends with a shorter group (the missing products are
// zeros, which take no part). The 16x16 instructions' k (16, 8, 4, 8, 32) is a multiple
// of every group size, so a whole number of instructions is a whole number of groups.
// NaN and infinity: pairwise and fma-chain paths follow IEEE 754 through their fp32 and
// fp64 operations. Fused: a group with a NaN operand or c, 0 * inf, or infinities of both
// signs among its products (a product of magnitude 2^128 or more is an infinity) and c
// gives NaN (INV where no operand was NaN); otherwise an infinity there gives that
// infinity.
//
// Where the sources disagree or are silent:
//  - Zero products: MMA-Sim gives every zero factor the exponent -126 and lets zero
//    products set E (arithmetic.py, extract_significand_exponent). A zero's exponent
//    field means emin (-14 for fp16, -7 for e4m3fnuz), not -126, so that is no hardware's
//    encoding; here, as in emu's NVIDIA models, zero products take no part. The results
//    differ only where a zero product's exponent exceeds every non-zero term's: a bf16
//    zero times a factor of 2^126 or more beside tiny products, or a tiny c (below
//    2^-111 with fp16 or fp8) beside products that are all zero.
//  - Special values: MMA-Sim's fused path returns the fp64 sum of a group for NaN or
//    infinity, treating products past 2^128 as infinities only when that sum is finite;
//    an infinite c beside such a product of the other sign gives c there, NaN here.
//  - fp8's "halves" are the even and the odd products of a group of 16 (MMA-Sim's
//    significands[0::2] and [1::2]), not its first and last eight.
//  - MMA-Sim marks CDNA3's fp16 and bf16 instructions two-stage (is_two_stage) but its
//    arithmetic does not use the mark: groups of 8 are single fused sums here as there.
//  - Flushing on CDNA2: MIOpen names the fp16 and bf16 instructions only; MMA-Sim
//    flushes inputs, c, every product and every partial sum of those, and nothing on
//    fp32 and fp64 (as here). CDNA1 flushes nothing in MMA-Sim; no AMD document says
//    either way. The paper's abstract counts two AMD architectures among those it
//    validated on hardware, while its code models three (CDNA1-3); which two, the
//    sources read here do not say. Its CDNA1 model is the CDNA2 one without the flush,
//    with bf16 groups of 2 (the pre-_1k bf16 instructions).
//  - Mixed fp8 inputs (fp8 with bf8): MMA-Sim's isa/amd_mfma.py lists
//    v_mfma_f32_16x16x32_fp8_bf8 and _bf8_fp8 and parses A's and B's types apart (the
//    first named is A's, as LLVM/MLIR's AMDGPU lowering picks _fp8_bf8 for A in
//    E4M3FNUZ and B in E5M2FNUZ); its amd.py runs every fp8 qualifier through the one
//    fused path, each operand decoded in its own type. Nothing says more, so they are
//    the fp8 path here, A's factors clamped at its format's emin (e4m3fnuz -7, e5m2fnuz
//    -15) and B's at its own.
//  - xf32's truncation: the front ends round operands into --in tf32 first, after which
//    the truncation changes nothing; given fp32 values (the C++ API's dot), the unit
//    truncates them as the hardware does.
#pragma once

#include <memory>
#include <optional>

#include "format.hpp"
#include "unit.hpp"

namespace emu {

enum class CdnaPath { pairwise, fused, fma_chain };

// One instruction's datapath (the parameters of the steps above).
struct CdnaParams {
  CdnaPath path = CdnaPath::fma_chain;
  int instruction_k = 4;          // the 16x16 instruction's k (products per instruction)
  int group_size = 1;             // products per group (pairwise 4 or 2; fused 8, 4, 16)
  bool flush_subnormals = false;  // pairwise step 1 and the flush after 2, 3, 4
  bool truncate_to_tf32 = false;  // fused step 1 (xf32)
  bool split_halves = false;      // fused step 3: even and odd products apart (fp8)
  int kept_fraction_bits = 24;    // fused step 3: products (and fp8 halves) below E
  int sum_fraction_bits = 31;     // fused step 4: S below M
  int c_fraction_bits = 24;       // fused step 4: c below M
  bool floor_alignment = true;    // fused steps 3 (halves) and 4: floor; false: toward zero
};

// The parameters of an AMD unit (mi100, mi250x, mi300x) for an input format (output fp32,
// fp64 for fp64). Throws std::invalid_argument naming the unit and the formats it takes.
CdnaParams cdna_params(UnitKind unit, const Format& in, const Format& out);
// For A in format a and B in format b: the one-format parameters where a and b agree;
// mixed, mi300x's fp8 path for fp8-e4m3fnuz with fp8-e5m2fnuz either way round. Throws
// std::invalid_argument naming the unit and the mixed inputs it takes.
CdnaParams cdna_params(UnitKind unit, const Format& a, const Format& b, const Format& out);

// True for mi100, mi250x and mi300x.
bool is_cdna_unit(UnitKind unit);
// True for the units whose A and B may take different formats (mi300x).
bool takes_mixed_inputs(UnitKind unit);

// The unit with explicit parameters (tests and experiments vary them), A in `in` and B
// in `in_b`; throws std::invalid_argument for group sizes outside 1..64 or kept bits
// outside 1..40.
std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format in, Format in_b, Format out, CdnaParams params);
// The preset: in defaults to fp16, out to fp32 (fp64 for fp64 in).
std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, std::optional<Format> in, std::optional<Format> out);
// The preset with mixed inputs, A in a and B in b (cdna_params); out defaults to fp32.
std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format a, Format b, std::optional<Format> out);

namespace detail {
// For tests, which compare them: whether the AMD units' gemm takes its fast passes (true,
// the default: operands checked and decoded once per call, the pairwise and fused groups
// in native and integer arithmetic over columns, every element they cannot vouch for
// through dot()) or computes every element by dot() (false), in the whole process.
void select_cdna_fast_gemm(bool fast);
}  // namespace detail

}  // namespace emu
