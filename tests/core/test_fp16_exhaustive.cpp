// binary16 round-to-nearest-even against the CPU: every float32 converted by F16C, and
// every pair of fp16 operands added and multiplied with gcc's _Float16; flags against
// the CPU's exception flags (MXCSR, checked against fenv).
//
// What gcc emits for _Float16 (gcc 12, -mf16c, no AVX512-FP16): a + b and a * b are
// computed by widening both operands to float (vcvtph2ps), operating in float, and
// rounding the float result to binary16 (vcvtps2ph), under MXCSR's rounding (nearest).
//  - mul: the exact product of two 11-bit significands has at most 22 bits, and fp16
//    products span 2^-48 .. 2^32, inside float's normal range: the float product is
//    exact, so the result is the exact product rounded once. Checked per pair below.
//  - add: the float sum is not always exact (exponents up to 40 apart), but rounding
//    first to p' = 24 bits and then to p = 11 bits is innocuous when p' >= 2p + 2
//    (Figueroa, "When is double rounding innocuous?", SIGNUM Newsl. 30(3), 1995), so
//    the result is still the exact sum rounded once. The static_assert pins p' >= 2p + 2.
// Flags: x86 detects tininess after rounding (Intel SDM vol. 1, 4.9.1.5), emu before
// (emu/round.hpp): the CPU's UFLO is emu's UFLO minus the inputs whose magnitude rounds
// (to 11 bits, exponent unbounded) up to min_normal, i.e. |x| >= 2^-14 (1 - 2^-12).
// NaN inputs: the CPU raises INV for signalling NaNs, emu raises nothing for NaN
// operands; flags are not compared there (results are compared as NaN).
#include <catch2/catch.hpp>

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <mutex>
#include <bit>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/round.hpp"
#include "host_flags.hpp"

static_assert(24 >= 2 * 11 + 2, "float is wide enough for innocuous double rounding to binary16");

namespace {

constexpr double kMinNormal = 0x1p-14;
// Below this magnitude a value is tiny after rounding to 11 bits with unbounded exponent.
constexpr double kTinyAfterRounding = 0x1p-14 * (1 - 0x1p-12);

// MXCSR's exception flags (host_flags.hpp): the operations here are SSE/AVX, so these
// are the bits fenv reports for them. The 2^32-case loops read and clear MXCSR
// directly: glibc's feclearexcept also rewrites the x87 environment (fnstenv/fldenv),
// which would triple their run time. The spot checks below confirm that both views
// agree.
using host_flags::kMxcsrFlags;
emu::Flags cpu_flags(unsigned mxcsr) { return host_flags::from_mxcsr(mxcsr); }
emu::Flags fenv_flags(int fe) { return host_flags::from_fenv(fe); }

// The flags the CPU should show for an operation whose exact result is `exact`, given
// emu's flags: the same, except UFLO by the after-rounding rule.
emu::Flags expected_cpu_flags(emu::Flags emu_flags, double exact) {
  if ((emu_flags & emu::UFLO) && std::fabs(exact) >= kTinyAfterRounding) emu_flags &= ~emu::UFLO;
  return emu_flags;
}

// The operation between clearing and reading MXCSR's flags, pinned there by empty asm
// statements (gcc would otherwise move the arithmetic across).
template <typename Op>
std::uint16_t on_cpu(Op op, unsigned& mxcsr) {
  _mm_setcsr(_mm_getcsr() & ~kMxcsrFlags);
  const std::uint16_t bits = op();
  mxcsr = _mm_getcsr() & kMxcsrFlags;
  return bits;
}

std::uint16_t cpu_convert(float x, unsigned& fe) {
  return on_cpu([&] {
    asm volatile("" : "+x"(x));
    const auto h = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
    asm volatile("" ::"r"(h));
    return h;
  }, fe);
}

std::uint16_t cpu_add(_Float16 a, _Float16 b, unsigned& fe) {
  return on_cpu([&] {
    asm volatile("" : "+x"(a), "+x"(b));
    _Float16 c = a + b;
    asm volatile("" : "+x"(c));
    return std::bit_cast<std::uint16_t>(c);
  }, fe);
}

std::uint16_t cpu_mul(_Float16 a, _Float16 b, unsigned& fe) {
  return on_cpu([&] {
    asm volatile("" : "+x"(a), "+x"(b));
    _Float16 c = a * b;
    asm volatile("" : "+x"(c));
    return std::bit_cast<std::uint16_t>(c);
  }, fe);
}

// What one case found; counted per block of cases, then summed.
enum Outcome : unsigned { kBadBits = 1, kBadFlags = 2, kInexactIntermediate = 4 };

struct Tally {
  std::uint64_t checked = 0, bad_bits = 0, bad_flags = 0, inexact_intermediate = 0;
  std::uint64_t first_bad = ~std::uint64_t{0};
};

bool same_fp16(std::uint16_t cpu, double emu_value) {
  const double cpu_value = static_cast<double>(std::bit_cast<_Float16>(cpu));
  if (std::isnan(cpu_value) || std::isnan(emu_value)) return std::isnan(cpu_value) && std::isnan(emu_value);
  return emu::fp16().encode(emu_value) == cpu;
}

// Runs body(i) on TBB's threads for i = k * stride mod 2^32, k < count (stride 1 and
// count 2^32: every 32-bit i); body returns Outcome bits.
template <typename Body>
Tally over_cases(const char* what, std::uint64_t count, std::uint32_t stride, Body body) {
  const auto start = std::chrono::steady_clock::now();
  std::mutex merge;
  Tally total;
  tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, count, 1u << 16), [&](const tbb::blocked_range<std::uint64_t>& r) {
    Tally t;
    for (std::uint64_t k = r.begin(); k != r.end(); ++k) {
      const auto i = static_cast<std::uint32_t>(k * stride);
      const unsigned outcome = body(i);
      ++t.checked;
      t.bad_bits += (outcome & kBadBits) != 0;
      t.bad_flags += (outcome & kBadFlags) != 0;
      t.inexact_intermediate += (outcome & kInexactIntermediate) != 0;
      if ((outcome & (kBadBits | kBadFlags)) && i < t.first_bad) t.first_bad = i;
    }
    const std::lock_guard<std::mutex> lock(merge);
    total.checked += t.checked;
    total.bad_bits += t.bad_bits;
    total.bad_flags += t.bad_flags;
    total.inexact_intermediate += t.inexact_intermediate;
    total.first_bad = std::min(total.first_bad, t.first_bad);
  });
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::printf("%s: %llu cases in %.1f s, %llu bit mismatches, %llu flag mismatches\n", what,
              static_cast<unsigned long long>(total.checked), took.count(),
              static_cast<unsigned long long>(total.bad_bits), static_cast<unsigned long long>(total.bad_flags));
  INFO(what << ": first bad case 0x" << std::hex << total.first_bad);
  CHECK(total.checked == count);
  CHECK(total.bad_bits == 0);
  CHECK(total.bad_flags == 0);
  return total;
}

}  // namespace

TEST_CASE("the fp16 oracle is binary16 rounding (spot checks of _Float16 and F16C)", "[fp16]") {
  // If gcc kept excess precision or rounded differently these would fail.
  volatile _Float16 one = 1, tie = static_cast<_Float16>(0x1p-11f * 3);  // 1.5 ulp of 1
  CHECK(static_cast<double>(one + static_cast<_Float16>(0x1p-11f)) == 1.0);  // tie to even: down
  CHECK(static_cast<double>(one + tie) == 1.0 + 0x1p-9);  // 1 + 3*2^-11 ties to even: up to 1 + 4*2^-11
  volatile _Float16 big = 65504;
  CHECK(std::isinf(static_cast<double>(big + static_cast<_Float16>(16))));  // 65520: the overflow tie
  CHECK(static_cast<std::uint16_t>(_cvtss_sh(65519.0f, 0)) == 0x7bff);
  CHECK(static_cast<std::uint16_t>(_cvtss_sh(0x1p-25f, 0)) == 0x0000);   // min_sub / 2 ties to 0
  CHECK(static_cast<std::uint16_t>(_cvtss_sh(0x1.8p-25f, 0)) == 0x0001);
  // The MXCSR view used by the exhaustive loops agrees with fenv's, on a few cases.
  for (float x : {0x1p-25f, 1e6f, 0.1f, 1.0f, 0x1.ffcp-15f, 0x1.fffp-15f}) {
    unsigned mxcsr = 0;
    const std::uint16_t h = cpu_convert(x, mxcsr);
    std::feclearexcept(FE_ALL_EXCEPT);
    volatile float vx = x;
    volatile auto vh = static_cast<std::uint16_t>(_cvtss_sh(vx, _MM_FROUND_TO_NEAREST_INT));
    const int fe = std::fetestexcept(FE_ALL_EXCEPT);
    INFO(x);
    CHECK(vh == h);
    CHECK(fenv_flags(fe) == cpu_flags(mxcsr));
  }
  unsigned mxcsr = 0;
  cpu_convert(0x1p-25f, mxcsr);
  CHECK(cpu_flags(mxcsr) == (emu::UFLO | emu::INEXACT));
  cpu_convert(1e6f, mxcsr);
  CHECK(cpu_flags(mxcsr) == (emu::OFLO | emu::INEXACT));
  // x86 tininess after rounding. 0x1.fffp-15 = 2^-14 - 2^-27 rounds to 2^-14 with 11 bits
  // and unbounded exponent: not tiny for the CPU (tiny for emu, before rounding).
  // 0x1.ffcp-15 = 2^-14 - 2^-25 has 11 bits: tiny for both, although it rounds (tie to
  // even, in the subnormal grid) to min_normal 0x0400.
  CHECK(cpu_convert(0x1.fffp-15f, mxcsr) == 0x0400);
  CHECK(cpu_flags(mxcsr) == emu::INEXACT);
  CHECK(expected_cpu_flags(emu::UFLO | emu::INEXACT, 0x1.fffp-15) == emu::INEXACT);
  CHECK(cpu_convert(0x1.ffcp-15f, mxcsr) == 0x0400);
  CHECK(cpu_flags(mxcsr) == (emu::UFLO | emu::INEXACT));
  CHECK(expected_cpu_flags(emu::UFLO | emu::INEXACT, 0x1.ffcp-15) == (emu::UFLO | emu::INEXACT));
}

void convert_against_f16c(std::uint64_t count, std::uint32_t stride) {
  over_cases("float32 -> fp16 (F16C)", count, stride, [](std::uint32_t i) {
    const float x = std::bit_cast<float>(i);
    unsigned fe = 0;
    const std::uint16_t cpu = cpu_convert(x, fe);
    emu::Flags flags = 0;
    const double r = emu::round(emu::fp16(), static_cast<double>(x), emu::RoundSpec{}, nullptr, flags);
    unsigned outcome = same_fp16(cpu, r) ? 0u : unsigned{kBadBits};
    if (!std::isnan(x) && cpu_flags(fe) != expected_cpu_flags(flags, x)) outcome |= kBadFlags;
    return outcome;
  });
}

// One fp16 operation on every operand pair (a = high 16 bits, b = low 16 bits): the
// CPU's _Float16 result and flags against emu's; `exact` is the exact result in double
// (fp16 sums and products are exact there).
template <typename Cpu, typename Emu, typename Exact, typename Float>
Tally pairs(const char* what, std::uint64_t count, std::uint32_t stride, Cpu cpu_op, Emu emu_op, Exact exact_op,
            Float float_op) {
  return over_cases(what, count, stride, [&](std::uint32_t i) {
    const auto a = std::bit_cast<_Float16>(static_cast<std::uint16_t>(i >> 16));
    const auto b = std::bit_cast<_Float16>(static_cast<std::uint16_t>(i));
    unsigned fe = 0;
    const std::uint16_t cpu = cpu_op(a, b, fe);
    thread_local emu::Context ctx;  // built once per thread: a Context seeds an Rng
    ctx.clear_status();
    const double da = static_cast<double>(a), db = static_cast<double>(b);
    const double r = emu_op(ctx, da, db);
    unsigned outcome = same_fp16(cpu, r) ? 0u : unsigned{kBadBits};
    if (!std::isnan(da) && !std::isnan(db) && cpu_flags(fe) != expected_cpu_flags(ctx.status(), exact_op(da, db)))
      outcome |= kBadFlags;
    // Where the float intermediate gcc computes is inexact.
    if (std::isfinite(da) && std::isfinite(db) &&
        static_cast<double>(float_op(static_cast<float>(da), static_cast<float>(db))) != exact_op(da, db))
      outcome |= kInexactIntermediate;
    return outcome;
  });
}

Tally add_against_float16(std::uint64_t count, std::uint32_t stride) {
  return pairs(
      "fp16 add (_Float16)", count, stride, cpu_add,
      [](emu::Context& c, double a, double b) { return c.add(emu::fp16(), a, b); },
      [](double a, double b) { return a + b; }, [](float a, float b) { return a + b; });
}

Tally mul_against_float16(std::uint64_t count, std::uint32_t stride) {
  return pairs(
      "fp16 mul (_Float16)", count, stride, cpu_mul,
      [](emu::Context& c, double a, double b) { return c.mul(emu::fp16(), a, b); },
      [](double a, double b) { return a * b; }, [](float a, float b) { return a * b; });
}

constexpr std::uint64_t kAll = std::uint64_t{1} << 32;
// The default suite's sample: 2^22 cases spread over all 2^32 by an odd stride.
constexpr std::uint64_t kSample = std::uint64_t{1} << 22;
constexpr std::uint32_t kSampleStride = 1021;

TEST_CASE("a spread sample of float32 -> fp16 and fp16 add/mul against the CPU", "[fp16]") {
  convert_against_f16c(kSample, kSampleStride);
  add_against_float16(kSample, kSampleStride);
  CHECK(mul_against_float16(kSample, kSampleStride).inexact_intermediate == 0);
}

TEST_CASE("every float32 converts to fp16 as F16C does, flags as the CPU's", "[.][exhaustive-fp16]") {
  convert_against_f16c(kAll, 1);
}

TEST_CASE("fp16 add of every operand pair equals _Float16, flags as the CPU's", "[.][exhaustive-fp16]") {
  const Tally t = add_against_float16(kAll, 1);
  // The double rounding through float is exercised (and innocuous: no bit mismatches).
  std::printf("fp16 add: %llu pairs with an inexact float intermediate\n",
              static_cast<unsigned long long>(t.inexact_intermediate));
  CHECK(t.inexact_intermediate > 0);
}

TEST_CASE("fp16 mul of every operand pair equals _Float16, flags as the CPU's", "[.][exhaustive-fp16]") {
  CHECK(mul_against_float16(kAll, 1).inexact_intermediate == 0);  // the float product is exact
}
