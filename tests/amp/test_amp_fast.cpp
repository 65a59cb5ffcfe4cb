// AMP gemm's vectorised path (emu/amp.cpp, namespace fast) against the exact path it
// must reproduce: every element equal bit for bit to amp_dot (the exact model, itself
// checked against Boost.Multiprecision in test_amp.cpp) and the same status flags, on
// random and adversarial inputs: wide exponent spans, cancellation, rounding ties,
// overflow, fp16 and fp32 subnormals, signed zeros, NaN and infinity.
#include <catch2/catch.hpp>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <ios>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../fp_counts.hpp"
#include "emu/amp.hpp"
#include "emu/threads.hpp"
#include "emu/unit.hpp"
#include "tests/gemm_problem.hpp"

using namespace emu;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFloatMax = std::numeric_limits<float>::max();

using gemm_test::pick;
using gemm_test::Problem;
using gemm_test::sign;
using gemm_test::simd_build;

// An fp16 value with a binary exponent in [lo, hi] (subnormal below -14).
double half_in(Rng& rng, int lo, int hi) {
  const int e = lo + static_cast<int>(pick(rng, static_cast<std::size_t>(hi - lo + 1)));
  return static_cast<double>(static_cast<_Float16>(sign(rng) * (1.0 + rng.uniform()) * std::ldexp(1.0, e)));
}

double float_in(Rng& rng, int lo, int hi) {
  const int e = lo + static_cast<int>(pick(rng, static_cast<std::size_t>(hi - lo + 1)));
  return static_cast<double>(static_cast<float>(sign(rng) * (1.0 + rng.uniform()) * std::ldexp(1.0, e)));
}

// How the operands are drawn.
enum class Inputs {
  normal,       // a few binades around 1, the common case
  wide,         // fp16 exponents -24 .. 15 mixed within a phase: spans beyond 53 bits
  sparse,       // many signed zeros and small integers: exact sums, zero results
  cancelling,   // C cancels the first phase: zero and tiny (fp32 subnormal) results
  ties,         // products of half an fp32 (or fp16) ulp of C: ties, decided by RNE or a tiny term
  extremes,     // C near the fp32 or fp16 limits, subnormal, NaN or infinite
  special_ab,   // a NaN or an infinity in A or B
  zero_phases,  // whole phases of zeros in A (padded channels), C of every kind: the skipped phases
  proof_bounds,  // fp32 ties decided by a term at about double's 53 bits: the bounds of whole-tile proofs
};
const char* inputs_name(Inputs i) {
  const char* names[] = {"normal",   "wide",       "sparse",      "cancelling",  "ties",
                         "extremes", "special_ab", "zero_phases", "proof_bounds"};
  return names[static_cast<int>(i)];
}

double input_value(Rng& rng, Inputs kind) {
  switch (kind) {
    case Inputs::wide: return half_in(rng, -24, 15);
    case Inputs::sparse: return pick(rng, 3) == 0 ? sign(rng) * 0.0 : sign(rng) * static_cast<double>(pick(rng, 9));
    case Inputs::ties:  // powers of two 2^-24 .. 2^15: sums at ties, and tiny terms beyond 53 bits deciding them
      return pick(rng, 4) != 0 ? sign(rng) * std::ldexp(1.0, static_cast<int>(pick(rng, 40)) - 24) : half_in(rng, -24, 15);
    default: return half_in(rng, -6, 3);
  }
}

double partial_value(Rng& rng, Inputs kind, bool half_partials) {
  const double limit = half_partials ? 65504.0 : kFloatMax;
  switch (kind) {
    case Inputs::wide:  // zero: only the products' span decides whether the phase is exact in double
      if (pick(rng, 3) == 0) return 0.0;
      return half_partials ? half_in(rng, -24, 15) : float_in(rng, -149, 127);
    case Inputs::sparse: return pick(rng, 2) == 0 ? sign(rng) * 0.0 : sign(rng) * static_cast<double>(pick(rng, 100));
    case Inputs::ties:
      if (pick(rng, 3) == 0) return 0.0;
      return sign(rng) * std::ldexp(1.0, static_cast<int>(pick(rng, half_partials ? 40 : 70)) - (half_partials ? 24 : 30));
    case Inputs::extremes:
      switch (pick(rng, 6)) {
        case 0: return sign(rng) * limit;
        case 1: return sign(rng) * (limit - (half_partials ? 32.0 * static_cast<double>(pick(rng, 8)) : 0x1p104));
        case 2: return half_partials ? half_in(rng, -24, -15) : float_in(rng, -149, -120);  // subnormal, tiny
        case 3: return std::numeric_limits<double>::quiet_NaN();
        case 4: return sign(rng) * kInf;
        default: return half_partials ? half_in(rng, 10, 15) : float_in(rng, 100, 127);
      }
    default: return half_partials ? half_in(rng, -4, 6) : float_in(rng, -8, 8);
  }
}


Problem make_problem(Rng& rng, std::size_t m, std::size_t n, std::size_t k, Inputs kind, bool half_partials) {
  Problem p = gemm_test::zero_problem(m, n, k);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t q = 0; q < k; ++q) p.A[i * p.lda() + q] = input_value(rng, kind);
  for (std::size_t q = 0; q < k; ++q)
    for (std::size_t j = 0; j < n; ++j) p.B[q * p.ldb() + j] = input_value(rng, kind);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double& c = p.C[i * p.ldc() + j];
      c = partial_value(rng, kind, half_partials);
      if (kind == Inputs::cancelling) {
        // Minus the first phase's products, rounded into the partials format: the
        // phase leaves its rounding error, or zero.
        double first = 0;
        for (std::size_t q = 0; q < std::min<std::size_t>(4, k); ++q) first += p.A[i * p.lda() + q] * p.B[q * p.ldb() + j];
        c = half_partials ? static_cast<double>(static_cast<_Float16>(static_cast<float>(-first)))
                          : static_cast<double>(static_cast<float>(-first));
        if (pick(rng, 4) == 0) c = -c;  // then an exact doubling instead
      }
    }
  if (kind == Inputs::zero_phases) {
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t q = 0; q < k; q += 4)
        if (pick(rng, 3) != 0)
          for (std::size_t r = q; r < std::min(k, q + 4); ++r) p.A[i * p.lda() + r] = sign(rng) * 0.0;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double& c = p.C[i * p.ldc() + j];
        switch (pick(rng, 5)) {
          case 0: c = sign(rng) * 0.0; break;
          case 1: c = partial_value(rng, Inputs::extremes, half_partials); break;
          case 2: c = float_in(rng, -20, 20); break;  // an fp32 value, for fp16 partials too
          default: break;
        }
      }
  }
  if (kind == Inputs::proof_bounds && k >= 4) {
    // The first phase of element (i, j): c = 2^(x_i + y_j + 24), a_0 b_0 = 2^(x_i + y_j),
    // half an fp32 ulp of c (a tie), a_1 b_1 far below (fp16 values down to 2^-24),
    // deciding it, a_2 and a_3 zero: the phase spans about 24 + x + y - log2 |a_1 b_1|
    // bits, on both sides of double's 53, and the tile-wide bounds (emu/amp.cpp, step 7)
    // must send the phases beyond 53 bits to the lane checks. With fp16 partials c stays
    // an fp16 value (0 where it would not be).
    const int low = half_partials ? -17 : -10;
    std::vector<int> x(m), y(n);
    for (std::size_t i = 0; i < m; ++i) {
      x[i] = low + static_cast<int>(pick(rng, 15));
      double* a = p.A.data() + i * p.lda();
      a[0] = std::ldexp(1.0, x[i]);
      a[1] = half_in(rng, -24, 0);
      a[2] = a[3] = 0.0;
    }
    for (std::size_t j = 0; j < n; ++j) {
      y[j] = low + static_cast<int>(pick(rng, 15));
      p.B[j] = std::ldexp(1.0, y[j]);
      p.B[p.ldb() + j] = half_in(rng, -24, 0);
      p.B[2 * p.ldb() + j] = p.B[3 * p.ldb() + j] = 0.0;
    }
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const double c = std::ldexp(1.0, x[i] + y[j] + 24);
        p.C[i * p.ldc() + j] = half_partials && c > 65504.0 ? 0.0 : c;
      }
  }
  if (kind == Inputs::special_ab) {
    const double special[] = {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf};
    if (pick(rng, 2) == 0)
      p.A[pick(rng, m) * p.lda() + pick(rng, k)] = special[pick(rng, 3)];
    else
      p.B[pick(rng, k) * p.ldb() + pick(rng, n)] = special[pick(rng, 3)];
  }
  return p;
}

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
bool half_partials(const AmpConfig& cfg) { return cfg.partials == fp16(); }

// C = A B + C through gemm and, element by element in row-major order, through dot
// (AmpRun's exact path) under equal contexts, each dot as its gemm element: the
// results, the flags, the counts (scope "gemm") and, where a trap throws, its report
// and the elements written before it must agree.
void compare(const MatrixUnit& unit, const FpControl& control, const Problem& p, const std::string& what) {
  Context fast_ctx(control, Rng(StreamId{77})), exact_ctx(control, Rng(StreamId{77}));
  std::vector<double> fast = p.C, exact = p.C;
  std::optional<TrapReport> fast_trap, exact_trap;
  try {
    Scope scope(fast_ctx, "gemm");
    unit.gemm(fast_ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), fast.data(), p.ldc());
  } catch (const FpException& e) {
    fast_trap = e.report();
  }
  try {
    Scope scope(exact_ctx, "gemm");
    for (std::size_t i = 0; i < p.m; ++i)
      for (std::size_t j = 0; j < p.n; ++j) {
        const auto element = fp_counts::gemm_element(exact_ctx, i, j, p.n);
        exact[i * p.ldc() + j] = unit.dot(exact_ctx, p.k, p.A.data() + i * p.lda(), 1, p.B.data() + j, p.ldb(),
                                          exact[i * p.ldc() + j]);
      }
  } catch (const FpException& e) {
    exact_trap = e.report();
  }
  INFO(what << " m " << p.m << " n " << p.n << " k " << p.k);
  REQUIRE(fast_trap.has_value() == exact_trap.has_value());
  if (fast_trap) fp_counts::check_same_report(*fast_trap, *exact_trap);
  fp_counts::check_same_counts(fast_ctx.counts(), exact_ctx.counts());
  for (std::size_t i = 0; i < p.m; ++i)
    for (std::size_t j = 0; j < p.n; ++j) {
      const double x = fast[i * p.ldc() + j], y = exact[i * p.ldc() + j];
      INFO("element (" << i << ", " << j << "): gemm " << x << " dot " << y << " C " << p.C[i * p.ldc() + j]);
      REQUIRE(bits(x) == bits(y));
    }
  INFO("flags: gemm " << static_cast<int>(fast_ctx.status()) << " dot " << static_cast<int>(exact_ctx.status()));
  REQUIRE(fast_ctx.status() == exact_ctx.status());
}

constexpr Inputs kAllInputs[] = {Inputs::normal,     Inputs::wide,        Inputs::sparse,
                                 Inputs::cancelling, Inputs::ties,        Inputs::extremes,
                                 Inputs::special_ab, Inputs::zero_phases, Inputs::proof_bounds};

// Many small products (flags per gemm are then nearly per element) and a few larger
// ones with several tiles and passes; n and k not multiples of the tile and the phase.
void sweep(const MatrixUnit& unit, const FpControl& control, bool half_partials, std::uint64_t seed) {
  Rng rng(StreamId{seed});
  for (Inputs kind : kAllInputs) {
    for (int trial = 0; trial < 60; ++trial) {
      const std::size_t sizes_k[] = {1, 3, 4, 5, 8, 16, 17, 33, 64};
      const Problem p = make_problem(rng, 1 + pick(rng, 2), 1 + pick(rng, 20), sizes_k[pick(rng, 9)], kind, half_partials);
      compare(unit, control, p, std::string(inputs_name(kind)) + " small trial " + std::to_string(trial));
    }
    for (int trial = 0; trial < 3; ++trial) {
      const Problem p = make_problem(rng, 5, 37 + pick(rng, 12), 90 + pick(rng, 80), kind, half_partials);
      compare(unit, control, p, std::string(inputs_name(kind)) + " large trial " + std::to_string(trial));
    }
  }
}

}  // namespace

TEST_CASE("AMP gemm's vectorised path is bit- and flag-identical to the exact path", "[amp][fast]") {
  struct Unit {
    const char* name;
    AmpConfig cfg;
  };
  AmpConfig two_phase_passes = amp_config(PartialsType::float32);
  two_phase_passes.phases_per_pass = 2;  // pass ends inside the kernel's chunks of 16 phases
  const Unit units[] = {
      {"ipu-amp", amp_config(PartialsType::float32)},
      {"ipu-amp-half", amp_config(PartialsType::half)},
      {"ipu-amp, fp16 output (f16v4sihoamp)", amp_config(PartialsType::float32, fp16(), fp16())},
      {"ipu-amp, 2 phases per pass", two_phase_passes},
  };
  FpControl saturate, nanoo, esr;
  saturate.overflow = Overflow::saturate;
  nanoo.overflow = Overflow::nan;
  esr.esr = true;
  if (!simd_build())
    WARN("built without AVX2/FMA/F16C: gemm takes the exact path, which this test then checks against dot");
  std::uint64_t seed = 100;
  for (const Unit& u : units) {
    const auto unit = make_amp_unit(u.cfg);
    for (const FpControl& control : {FpControl{}, saturate, nanoo}) {
      INFO(u.name << ", overflow " << overflow_name(control.overflow));
      CHECK(amp_gemm_is_vectorised(Context(control), u.cfg) == simd_build());
      sweep(*unit, control, half_partials(u.cfg), seed++);
    }
    // fp32 partials ignore esr (the accumulator rounds RNE): still vectorised.
    INFO(u.name << " with esr");
    CHECK(amp_gemm_is_vectorised(Context(esr), u.cfg) ==
          (simd_build() && !half_partials(u.cfg) && u.cfg.output == fp32()));
    sweep(*unit, esr, half_partials(u.cfg), seed++);
  }
}

TEST_CASE("AMP gemm under other configurations and contexts equals the exact path", "[amp][fast]") {
  FpControl trap_overflow, toward_zero;
  trap_overflow.traps = OFLO | INV;
  toward_zero.rounding = Rounding::rz;
  AmpConfig follows_context = amp_config(PartialsType::float32);
  follows_context.accumulator_rounding.reset();
  AmpConfig aligned = amp_config(PartialsType::float32);
  aligned.alignment_bits = 30;
  std::uint64_t seed = 200;
  for (const AmpConfig& cfg : {amp_config(PartialsType::half), follows_context, aligned}) {
    const auto unit = make_amp_unit(cfg);
    for (const FpControl& control : {FpControl{}, trap_overflow, toward_zero}) {
      CHECK(amp_gemm_is_vectorised(Context(control), cfg) ==
            (simd_build() && control.traps == 0 && control.rounding == Rounding::rne &&
             cfg.alignment_bits == AmpConfig::kExactPhase));
      sweep(*unit, control, half_partials(cfg), seed++);
    }
  }
}

TEST_CASE("AMP gemm: operands that are not fp16 (A, B) or fp32 (C) values take the exact path", "[amp][fast]") {
  const auto unit = make_unit(UnitKind::ipu_amp);
  Rng rng(StreamId{300});
  for (int trial = 0; trial < 20; ++trial) {
    Problem p = make_problem(rng, 2, 9, 12, Inputs::normal, false);
    switch (trial % 3) {
      case 0: p.A[pick(rng, 12)] = 1.0 + 0x1p-20; break;            // not an fp16 value
      case 1: p.B[pick(rng, 9)] = 70000.0; break;                  // beyond fp16's range
      default: p.C[pick(rng, 9)] = 1.0 + 0x1p-40; break;           // not an fp32 value
    }
    compare(*unit, FpControl{}, p, "non-format operand, trial " + std::to_string(trial));
  }
}

TEST_CASE("AMP gemm: a tie decided by a term beyond double's 53 bits", "[amp][fast]") {
  // 2^30 + 2^6 is an fp32 tie (ulp 2^7 at 2^30); 2^-48 = 2^-24 * 2^-24 (fp16 subnormals)
  // lies 78 bits below 2^30 and decides it: rounded to double first, the sum would be
  // the tie, and RNE would give 2^30 instead of 2^30 + 2^7.
  const auto unit = make_unit(UnitKind::ipu_amp);
  for (double tiny_sign : {1.0, -1.0}) {
    for (double c : {0.0, 0x1p30}) {
      const double a_first = c == 0 ? 0x1p15 : 0.0;  // with c = 2^30 the partial holds the 2^30
      Problem p{1, 3, 4, {a_first, 0x1p3, tiny_sign * 0x1p-24, 0.0, 0.0}, {}, {}};
      p.B.assign(4 * p.ldb(), 0.0);
      for (std::size_t j = 0; j < 3; ++j) {
        p.B[0 * p.ldb() + j] = 0x1p15;
        p.B[1 * p.ldb() + j] = 0x1p3;
        p.B[2 * p.ldb() + j] = 0x1p-24;
      }
      p.C = {c, c, c, 0, 0};
      compare(*unit, FpControl{}, p, "tie beyond 53 bits, c " + std::to_string(c));
      std::vector<double> C = p.C;
      Context ctx;
      unit->gemm(ctx, 1, 3, 4, p.A.data(), p.lda(), p.B.data(), p.ldb(), C.data(), p.ldc());
      CHECK(C[0] == (tiny_sign > 0 ? 0x1p30 + 0x1p7 : 0x1p30));
      CHECK(ctx.status() == INEXACT);
    }
  }
}

TEST_CASE("AMP gemm: a tie decided by c's lowest bits beyond double's 53 bits", "[amp][fast]") {
  // m = 1 + 3 2^-24 is an fp32 tie (between 1 + 2^-23 and the even 1 + 2^-22). The
  // products add up to m - 2^-32 (1, 3 2^-12 2^-12, -2^-16 2^-16) and c = 2^-32 - 2^-55,
  // an fp32 value whose lowest bit lies 55 bits below the sum: exactly, the sum is
  // m - 2^-55, rounded down to 1 + 2^-23; rounded to double first, it would be the tie
  // m, rounded to 1 + 2^-22. A whole-tile proof must take c's lowest bit into account
  // (emu/amp.cpp, step 7: the fp32 ulp of the least |c|), not only the products'.
  const auto unit = make_unit(UnitKind::ipu_amp);
  for (const bool proof : {true, false}) {
    struct Restore {
      ~Restore() { detail::select_amp_proof(true); }
    } restore;
    detail::select_amp_proof(proof);
    Problem p = gemm_test::zero_problem(2, 3, 4);
    for (std::size_t i = 0; i < p.m; ++i) {
      const double a[] = {1.0, 3 * 0x1p-12, 0x1p-16, 0.0};
      std::copy(std::begin(a), std::end(a), p.A.begin() + static_cast<std::ptrdiff_t>(i * p.lda()));
      for (std::size_t j = 0; j < p.n; ++j) p.C[i * p.ldc() + j] = 0x1p-32 - 0x1p-55;
    }
    for (std::size_t j = 0; j < p.n; ++j) {
      p.B[0 * p.ldb() + j] = 1.0;
      p.B[1 * p.ldb() + j] = 0x1p-12;
      p.B[2 * p.ldb() + j] = -0x1p-16;
    }
    compare(*unit, FpControl{}, p, proof ? "c's lowest bits, whole-tile proofs" : "c's lowest bits, lane checks");
    std::vector<double> C = p.C;
    Context ctx;
    unit->gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C.data(), p.ldc());
    CHECK(C[0] == 1 + 0x1p-23);
    CHECK(C[p.ldc() + 2] == 1 + 0x1p-23);
    CHECK(ctx.status() == INEXACT);
  }
}

TEST_CASE("AMP gemm: a host rounding mode other than to-nearest turns the vectorised path off", "[amp][fast]") {
  // The vectorised path rounds with the host's conversions: under another host mode it
  // steps aside, and gemm still equals dot.
  const AmpConfig cfg = amp_config(PartialsType::float32);
  const auto unit = make_amp_unit(cfg);
  Rng rng(StreamId{400});
  const Problem p = make_problem(rng, 2, 7, 9, Inputs::normal, false);
  {
    struct RestoreNearest {
      ~RestoreNearest() { std::fesetround(FE_TONEAREST); }
    } restore;
    REQUIRE(std::fesetround(FE_UPWARD) == 0);
    CHECK_FALSE(amp_gemm_is_vectorised(Context(), cfg));
    compare(*unit, FpControl{}, p, "host rounding upward");
  }
  CHECK(amp_gemm_is_vectorised(Context(), cfg) == simd_build());
}

TEST_CASE("AMP gemm counting OFLO, DIV0 and INV stays vectorised; results and counts equal the exact path",
          "[amp][fast]") {
  // A training step with fp_exceptions: count must stay fast: the flags it counts only
  // come from lanes the kernel hands to the exact model, which report their element.
  FpControl count, count_saturate, count_nanoo, count_inexact, count_uflo;
  count.counted = OFLO | DIV0 | INV;
  count_saturate = count;
  count_saturate.overflow = Overflow::saturate;
  count_nanoo = count;
  count_nanoo.overflow = Overflow::nan;
  count_inexact.counted = OFLO | INEXACT;
  count_uflo.counted = UFLO;
  std::uint64_t seed = 500;
  for (const AmpConfig& cfg : {amp_config(PartialsType::float32), amp_config(PartialsType::half),
                               amp_config(PartialsType::float32, fp16(), fp16())}) {
    const auto unit = make_amp_unit(cfg);
    for (const FpControl& control : {count, count_saturate, count_nanoo}) {
      CHECK(amp_gemm_is_vectorised(Context(control), cfg) == simd_build());
      sweep(*unit, control, half_partials(cfg), seed++);
    }
    // Counting INEXACT or UFLO per element needs the exact path (the kernel raises
    // INEXACT once per call); it still equals the elements one by one.
    for (const FpControl& control : {count_inexact, count_uflo}) {
      CHECK_FALSE(amp_gemm_is_vectorised(Context(control), cfg));
      sweep(*unit, control, half_partials(cfg), seed++);
    }
  }
}

TEST_CASE("AMP gemm counts in element order what the kernel meets out of order", "[amp][fast]") {
  // Overflows in a few elements of a 6 x 40 product (two tiles of 32 columns, several
  // chunks of phases): the kernel meets (4, 3) in tile 0 before (0, 33) in tile 1 and
  // a late phase of (1, 5) after an early phase of (2, 6); the counts must name the
  // row-major first, (0, 33), and count each element once even where a saturating fp16
  // partial overflows again in later phases.
  const std::size_t m = 6, n = 40, k = 160;
  // fp16 partials overflow in the phase of the big products; fp32 partials with an fp16
  // output (f16v4sihoamp) when the last pass rounds into fp16.
  for (const AmpConfig& cfg : {amp_config(PartialsType::half), amp_config(PartialsType::float32, fp16(), fp16())}) {
    Problem p{m, n, k, {}, {}, {}};
    p.A.assign(m * p.lda(), 0.0);
    p.B.assign(k * p.ldb(), 0.0);
    p.C.assign(m * p.ldc(), 0.0);
    Rng rng(StreamId{600});
    for (double& a : p.A) a = half_in(rng, -2, 1);
    for (double& b : p.B) b = half_in(rng, -2, 1);
    // Two products 256 * 256 in one phase of element (i, j): 131072, far past 65504
    // whatever the other (small) products add.
    auto blow_up = [&](std::size_t i, std::size_t j, std::size_t q) {
      for (std::size_t r : {q, q + 1}) {
        p.A[i * p.lda() + r] = 256.0;
        p.B[r * p.ldb() + j] = 256.0;
      }
    };
    blow_up(4, 3, 2);
    blow_up(0, 33, 150);
    blow_up(1, 5, 140);
    blow_up(2, 6, 9);
    const auto unit = make_amp_unit(cfg);
    for (Overflow overflow : {Overflow::inf, Overflow::saturate, Overflow::nan}) {
      FpControl control;
      control.counted = OFLO | DIV0 | INV;
      control.overflow = overflow;
      INFO((half_partials(cfg) ? "half" : "float") << " partials, overflow " << overflow_name(overflow));
      compare(*unit, control, p, "scattered overflows");
      Context ctx(control);
      std::vector<double> C = p.C;
      unit->gemm(ctx, m, n, k, p.A.data(), p.lda(), p.B.data(), p.ldb(), C.data(), p.ldc());
      REQUIRE_FALSE(ctx.counts().empty());
      CHECK(ctx.counts()[0].flag == OFLO);
      CHECK(ctx.counts()[0].op == "amp");
      CHECK(ctx.counts()[0].first_element.to_string() == "[0, 33]");
      CHECK(ctx.counts()[0].count == 4);
    }
  }
}

TEST_CASE("AMP gemm: the AVX-512 kernel equals the AVX2 one (values, flags, counts)", "[amp][fast]") {
  // The vectorised path runs eight lanes on AVX-512 where the CPU has it (the default)
  // and four otherwise (detail::select_amp_kernel); the two must not differ in a bit.
  // Random shapes (partial tiles of 32 columns, short last phases, several chunks and
  // passes), every input kind, every configuration the path takes, counting OFLO, DIV0
  // and INV or not.
  if (!detail::select_amp_kernel(1)) {
    WARN("no AVX-512 here (or a build without the vectorised path): only one kernel runs");
    return;
  }
  struct Restore {
    ~Restore() { detail::select_amp_kernel(1); }
  } restore;
  AmpConfig two_phase_passes = amp_config(PartialsType::float32);
  two_phase_passes.phases_per_pass = 2;
  FpControl count, saturate;
  count.counted = OFLO | DIV0 | INV;
  saturate.overflow = Overflow::saturate;
  struct Outcome {
    std::vector<double> C;
    Flags status;
    std::vector<OpCount> counts;
  };
  auto run = [](int kernel, const MatrixUnit& unit, const FpControl& control, const Problem& p) {
    REQUIRE(detail::select_amp_kernel(kernel));
    Context ctx(control);
    Outcome o{p.C, 0, {}};
    unit.gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), o.C.data(), p.ldc());
    o.status = ctx.status();
    o.counts = ctx.counts();
    return o;
  };
  Rng rng(StreamId{4096});
  std::size_t problems = 0;
  for (const AmpConfig& cfg : {amp_config(PartialsType::float32), amp_config(PartialsType::half),
                               amp_config(PartialsType::float32, fp16(), fp16()), two_phase_passes}) {
    const auto unit = make_amp_unit(cfg);
    for (const FpControl& control : {FpControl{}, count, saturate}) {
      REQUIRE(amp_gemm_is_vectorised(Context(control), cfg));
      for (Inputs kind : kAllInputs)
        for (int trial = 0; trial < 6; ++trial) {
          const Problem p = make_problem(rng, 1 + pick(rng, 6), 1 + pick(rng, 70), 1 + pick(rng, 150), kind,
                                         half_partials(cfg));
          const Outcome wide = run(1, *unit, control, p), narrow = run(0, *unit, control, p);
          ++problems;
          std::size_t mismatches = 0, first = 0;
          for (std::size_t e = 0; e < p.C.size(); ++e)
            if (bits(wide.C[e]) != bits(narrow.C[e]) && mismatches++ == 0) first = e;
          INFO(inputs_name(kind) << ", partials " << cfg.partials.name() << ", output " << cfg.output.name()
                                 << ", phases per pass " << cfg.phases_per_pass << ", counted "
                                 << int{control.counted} << ", overflow " << overflow_name(control.overflow) << ", "
                                 << p.m << "x" << p.n << "x" << p.k);
          if (mismatches != 0)
            FAIL_CHECK(mismatches << " of " << p.C.size() << " elements differ, the first at index " << first
                                  << ": AVX-512 " << std::hexfloat << wide.C[first] << ", AVX2 " << narrow.C[first]);
          CHECK(int{wide.status} == int{narrow.status});
          fp_counts::check_same_counts(wide.counts, narrow.counts);
        }
    }
  }
  CHECK(problems == 4 * 3 * std::size(kAllInputs) * 6);
}

TEST_CASE("AMP gemm: whole-tile proofs equal the lane checks they replace, at 1, 2 and 3 threads", "[amp][fast]") {
  // The vectorised path proves most phases exact for a whole tile from bounds it tracks
  // (emu/amp.cpp, step 7: detail::select_amp_proof(true), the default, with rows in
  // pairs on AVX-512) and otherwise checks lane by lane (select_amp_proof(false): the
  // reference). Values, status, counts and trap reports must not differ between the two,
  // nor between 1, 2 and 3 GEMM threads (bands of at least 64 rows: m up to 400), for
  // every configuration, every control (those that leave the vectorised path too), every
  // kind of input. The first test case checks the default against the exact path.
  struct Restore {
    ~Restore() {
      detail::select_amp_proof(true);
      set_gemm_threads(0);
    }
  } restore;
  if (!detail::select_amp_proof(true)) {
    WARN("a build without the vectorised path: nothing to compare");
    return;
  }
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena arena(4);  // 2 and 3 threads at once even on fewer cores
  AmpConfig two_phase_passes = amp_config(PartialsType::float32);
  two_phase_passes.phases_per_pass = 2;
  FpControl count, saturate, nanoo, esr, traps, toward_zero;
  count.counted = OFLO | DIV0 | INV;
  saturate.overflow = Overflow::saturate;
  nanoo.overflow = Overflow::nan;
  esr.esr = true;
  traps.traps = OFLO | INV;
  toward_zero.rounding = Rounding::rz;
  struct Outcome {
    std::vector<double> C;
    Flags status = 0;
    std::vector<OpCount> counts;
    std::optional<TrapReport> trap;
  };
  auto run = [&](bool proof, int threads, const MatrixUnit& unit, const FpControl& control, const Problem& p) {
    REQUIRE(detail::select_amp_proof(proof));
    set_gemm_threads(threads);
    Context ctx(control);
    Outcome o{p.C, 0, {}, std::nullopt};
    try {
      arena.execute([&] { unit.gemm(ctx, p.m, p.n, p.k, p.A.data(), p.lda(), p.B.data(), p.ldb(), o.C.data(), p.ldc()); });
    } catch (const FpException& e) {
      o.trap = e.report();
    }
    o.status = ctx.status();
    o.counts = ctx.counts();
    return o;
  };
  Rng rng(StreamId{8192});
  for (const AmpConfig& cfg : {amp_config(PartialsType::float32), amp_config(PartialsType::half),
                               amp_config(PartialsType::float32, fp16(), fp16()), two_phase_passes}) {
    const auto unit = make_amp_unit(cfg);
    for (const FpControl& control : {FpControl{}, count, saturate, nanoo, esr, traps, toward_zero})
      for (Inputs kind : kAllInputs) {
        const std::size_t m = pick(rng, 2) == 0 ? 1 + pick(rng, 9) : 129 + pick(rng, 272);
        const Problem p = make_problem(rng, m, 1 + pick(rng, 70), 1 + pick(rng, 100), kind, half_partials(cfg));
        const Outcome reference = run(false, 1, *unit, control, p);
        for (int threads : {1, 2, 3}) {
          const Outcome proved = run(true, threads, *unit, control, p);
          INFO(inputs_name(kind) << ", partials " << cfg.partials.name() << ", output " << cfg.output.name()
                                 << ", phases per pass " << cfg.phases_per_pass << ", counted "
                                 << int{control.counted} << ", traps " << int{control.traps} << ", overflow "
                                 << overflow_name(control.overflow) << ", esr " << control.esr << ", rounding "
                                 << int(control.rounding) << ", " << p.m << "x" << p.n << "x" << p.k << ", "
                                 << threads << " threads");
          std::size_t mismatches = 0, first = 0;
          for (std::size_t e = 0; e < p.C.size(); ++e)
            if (bits(proved.C[e]) != bits(reference.C[e]) && mismatches++ == 0) first = e;
          if (mismatches != 0)
            FAIL_CHECK(mismatches << " of " << p.C.size() << " elements differ, the first at index " << first
                                  << ": proved " << std::hexfloat << proved.C[first] << ", checked lane by lane "
                                  << reference.C[first] << ", C " << p.C[first]);
          CHECK(int{proved.status} == int{reference.status});
          fp_counts::check_same_counts(proved.counts, reference.counts);
          REQUIRE(proved.trap.has_value() == reference.trap.has_value());
          if (proved.trap) fp_counts::check_same_report(*proved.trap, *reference.trap);
        }
      }
  }
}
