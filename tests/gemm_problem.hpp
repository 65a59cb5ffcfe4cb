// Random GEMM problems for the tests that compare a unit's gemm with its dot products
// (tests/amp/test_amp_fast.cpp, tests/mma/test_sequential.cpp): strided row-major
// operands and the random choices their generators share.
#pragma once

#include <cstddef>
#include <vector>

#include "emu/rng.hpp"

namespace gemm_test {

inline std::size_t pick(emu::Rng& rng, std::size_t n) { return static_cast<std::size_t>(rng.next_u64() % n); }
inline double sign(emu::Rng& rng) { return (rng.next_u64() & 1) ? -1.0 : 1.0; }

// C = A B + C with A m x k, B k x n and C m x n, row-major, with row strides wider
// than the rows so that a kernel that ignores a stride reads the wrong values.
struct Problem {
  std::size_t m, n, k;
  std::vector<double> A, B, C;
  std::size_t lda() const { return k + 1; }
  std::size_t ldb() const { return n + 3; }
  std::size_t ldc() const { return n + 2; }
};

// Whether this build has the vectorised fast paths (emu/simd.hpp: AVX2, FMA, F16C).
inline bool simd_build() {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return true;
#else
  return false;
#endif
}

// All operands zero (the padding between rows too).
inline Problem zero_problem(std::size_t m, std::size_t n, std::size_t k) {
  Problem p{m, n, k, {}, {}, {}};
  p.A.assign(m * p.lda(), 0.0);
  p.B.assign(k * p.ldb(), 0.0);
  p.C.assign(m * p.ldc(), 0.0);
  return p;
}

}  // namespace gemm_test
