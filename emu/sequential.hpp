// Fast passes of the reference units' GEMM (emu/unit.cpp), vectorised over columns of
// C: for every element of C = A B + C, what `exact` (c + sum_q a_q b_q, exactly) and
// fp32-seq / fp16-seq (for q = 0, 1, ...: c <- fma(a_q, b_q, c), or unfused
// c <- add(c, mul(a_q, b_q)), under round-to-nearest-even) compute, where the kernel can
// prove it is the reference's result; the elements it cannot vouch for are marked for
// the reference (ReferenceUnit::dot). emu/sequential.cpp has the proofs. Internal to emu.
#pragma once

#include <climits>
#include <cstddef>
#include <vector>

#include "arith.hpp"

namespace emu {

// What the passes need to know of an operand (rows x columns): whether every finite
// value is an fp32 value; the lowest set bit and the largest magnitude among the finite
// non-zero values; which rows and columns hold a NaN or an infinity.
struct PassOperand {
  bool floats = true;
  int lowest_bit = INT_MAX;
  double largest = 0;
  std::vector<bool> special_row, special_column;
};

// B as both passes read it: scanned, and packed by tiles of columns where its finite
// values are fp32 values (else the passes do not apply). A GEMM prepares it once for all
// its bands of rows (emu/threads.hpp); left empty in a build without the passes.
struct PassColumns {
  PassOperand scan;
  std::vector<double> panels;
};
PassColumns pass_columns(std::size_t n, std::size_t k, const double* B, std::size_t ldb);

// Per element of C in row-major order (i * n + j).
struct SequentialPass {
  static constexpr Flags kRedo = 0xFF;  // in `flags`: the kernel cannot vouch for the element
  std::vector<double> value;            // the element's result
  std::vector<Flags> flags;             // the flags its operations raise (INEXACT, UFLO), or kRedo
  // Flags raised by elements that are not redone but which `flags` does not record per
  // element (only without traps, where their order cannot show).
  Flags raised = 0;
};

// The sequential pass: fused or unfused steps into `out` (fp32 or fp16, subnormals on or
// off), as Context::fma or Context::add and Context::mul compute them under `ctx`'s
// control. False, with nothing computed, where it does not apply: effective rounding
// other than rne, INEXACT counted or trapped, an output format other than fp32 and fp16,
// a finite value of A or B that is not an fp32 value, a host not rounding to nearest,
// a build without AVX2/FMA/F16C. Elements whose c is not an fp32 value (fp16 unfused:
// not an fp16 value) are left to the reference. columns: pass_columns(n, k, B, ldb)
// where the caller has it, else nullptr (the pass prepares it).
bool sequential_pass(const Context& ctx, const Format& out, bool fused, std::size_t m, std::size_t n, std::size_t k,
                     const double* A, std::size_t lda, const double* B, std::size_t ldb, const double* C,
                     std::size_t ldc, SequentialPass& pass, const PassColumns* columns = nullptr);

// Per element of C in row-major order (i * n + j).
struct ExactPass {
  std::vector<Exact> sum;  // c + sum_q a_q b_q, the Exact that ExactSum::value() gives for it
  std::vector<bool> redo;  // a NaN or infinite operand: left to the reference
};

// The exact pass. False, with nothing computed, where it does not apply: a finite value
// of A or B that is not an fp32 value, products too far apart for its 128-bit sums, a
// host not rounding to nearest, a build without AVX2. columns: as for sequential_pass.
bool exact_pass(std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda, const double* B,
                std::size_t ldb, const double* C, std::size_t ldc, ExactPass& pass,
                const PassColumns* columns = nullptr);

}  // namespace emu
