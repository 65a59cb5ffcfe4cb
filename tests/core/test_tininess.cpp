// Tininess before and after rounding (emu/round.hpp step 5, FpControl::tininess) on the
// values that matter: those just below the smallest normal that round up to it, in
// fp16, bf16, fp32 and fp64, for multiplication and conversion, under every rounding
// mode but sr, with subnormals on and off.
//
// Oracles:
//  - The host CPU, which decides tininess after rounding (Intel SDM vol. 1, 4.9.1.5):
//    SSE multiplication of floats and doubles under each MXCSR rounding mode, with
//    MXCSR.FTZ for subnormals off (FTZ flushes results that are tiny after rounding,
//    Intel SDM vol. 1, 10.2.3.3); F16C's VCVTPS2PH with its rounding immediate for fp16
//    conversion and, from the exact float product of two fp16 values, multiplication;
//    the x87 conversion of long double to double (fesetround), for fp64 conversion of
//    values with more bits than a double.
//  - reference.hpp (Boost integers, from IEEE 754 7.5) for every mode and both rules,
//    which covers what the CPU cannot: rna, ro, bf16, `before`.
// For `before` the host's flags are turned into the other rule by definition: UFLO iff
// the result is inexact and the exact |x| < min_normal.
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/round.hpp"
#include "host_flags.hpp"
#include "reference.hpp"

namespace {

using emu::Rounding;
using emu::Tininess;

constexpr Rounding kModes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru, Rounding::rd, Rounding::ro};
// The modes the host has, with their MXCSR.RC and VCVTPS2PH immediate (both: 0 nearest,
// 1 down, 2 up, 3 toward zero).
constexpr Rounding kHostModes[] = {Rounding::rne, Rounding::rd, Rounding::ru, Rounding::rz};
unsigned host_rc(Rounding m) {
  switch (m) {
    case Rounding::rne: return 0;
    case Rounding::rd: return 1;
    case Rounding::ru: return 2;
    case Rounding::rz: return 3;
    default: throw std::logic_error("no host rounding for this mode");
  }
}

using host_flags::kMxcsrFlags;
constexpr unsigned kMxcsrRounding = 0x6000, kMxcsrFtz = 0x8000, kMxcsrDaz = 0x0040;

// Runs op with MXCSR set to the mode (and FTZ) and its flags cleared; restores MXCSR
// before returning, so emu never runs under another mode. The empty asm statements in
// the ops keep gcc from moving the arithmetic out of the window.
template <typename Op>
auto on_host(Rounding mode, bool flush, emu::Flags& flags, Op op) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr((saved & ~(kMxcsrFlags | kMxcsrRounding | kMxcsrFtz | kMxcsrDaz)) | (host_rc(mode) << 13) |
             (flush ? kMxcsrFtz : 0u));
  const auto r = op();
  flags = host_flags::from_mxcsr(_mm_getcsr());
  _mm_setcsr(saved);
  return r;
}

template <typename T>  // float or double: SSE multiplication
T host_mul(T a, T b, Rounding mode, bool flush, emu::Flags& flags) {
  return on_host(mode, flush, flags, [&] {
    asm volatile("" : "+x"(a), "+x"(b));
    T c = a * b;
    asm volatile("" : "+x"(c));
    return c;
  });
}

float host_to_float(double x, Rounding mode, bool flush, emu::Flags& flags) {
  return on_host(mode, flush, flags, [&] {
    asm volatile("" : "+x"(x));
    float c = static_cast<float>(x);
    asm volatile("" : "+x"(c));
    return c;
  });
}

// F16C with the rounding in the instruction (MXCSR.RC unused; FTZ does not apply).
std::uint16_t host_to_fp16(float x, Rounding mode, emu::Flags& flags) {
  return on_host(Rounding::rne, false, flags, [&] {
    asm volatile("" : "+x"(x));
    std::uint16_t h = 0;
    switch (mode) {
      case Rounding::rne: h = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); break;
      case Rounding::rd: h = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEG_INF)); break;
      case Rounding::ru: h = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_POS_INF)); break;
      case Rounding::rz: h = static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_ZERO)); break;
      default: throw std::logic_error("no F16C rounding for this mode");
    }
    asm volatile("" ::"r"(h));
    return h;
  });
}

// The x87 conversion of long double to double under fesetround (x87 and SSE alike).
double host_to_double(long double x, Rounding mode, emu::Flags& flags) {
  const int modes[] = {FE_TONEAREST, FE_DOWNWARD, FE_UPWARD, FE_TOWARDZERO};
  volatile long double in = x;
  REQUIRE(std::fesetround(modes[host_rc(mode)]) == 0);
  std::feclearexcept(FE_ALL_EXCEPT);
  volatile double out = static_cast<double>(in);
  flags = host_flags::from_fenv(std::fetestexcept(FE_ALL_EXCEPT));
  std::fesetround(FE_TONEAREST);
  return out;
}

// One rounding by emu under a mode, a tininess rule and subnormals on or off.
struct EmuResult {
  double value;
  emu::Flags flags;
};

emu::Context context(Rounding mode, Tininess tininess) {
  emu::FpControl c;
  c.rounding = mode;
  c.tininess = tininess;
  return emu::Context(c);
}

EmuResult emu_mul(const emu::Format& f, double a, double b, Rounding mode, Tininess t) {
  auto ctx = context(mode, t);
  const double r = ctx.mul(f, a, b);
  return {r, ctx.status()};
}

EmuResult emu_round(const emu::Format& f, const emu::Exact& x, Rounding mode, Tininess t) {
  emu::RoundSpec spec;
  spec.mode = mode;
  spec.tininess = t;
  emu::Flags flags = 0;
  const double r = emu::round(f, x, spec, nullptr, flags);
  return {r, flags};
}

bool same_value(double a, double b) { return a == b && std::signbit(a) == std::signbit(b); }

// The flags under `before` from those under `after` (same result): UFLO iff inexact and
// the exact value is below min_normal in magnitude; a flushed result is always tiny.
emu::Flags before_from_after(emu::Flags after, bool exact_below_min_normal) {
  emu::Flags f = after & ~emu::UFLO;
  if ((after & emu::INEXACT) && exact_below_min_normal) f |= emu::UFLO;
  return f;
}

ref::Tininess ref_rule(Tininess t) { return t == Tininess::after ? ref::Tininess::after : ref::Tininess::before; }

// Counts of the cases that tell the two rules apart: exact |x| below min_normal, and the
// result (with subnormals on) min_normal with INEXACT.
struct Coverage {
  long checked = 0, differ = 0;
};

void check_against_reference(const emu::Format& f, const ref::Spec& spec, const ref::Real& exact,
                             const EmuResult& got, Rounding mode, Tininess t, Coverage& cov) {
  const ref::Result want = ref::round(exact, spec, mode, emu::Overflow::inf, ref_rule(t));
  ++cov.checked;
  INFO(f.name() << " subnormals " << f.subnormals() << " " << emu::rounding_name(mode) << " "
                << emu::tininess_name(t) << ": " << want.value << " flags " << int(want.flags));
  CHECK(same_value(got.value, want.value));
  CHECK(got.flags == want.flags);
}

ref::Real real_of(double x) { return ref::real(ref::dyadic(x)); }
ref::Real product_of(double a, double b) { return ref::real(ref::mul(ref::dyadic(a), ref::dyadic(b))); }

// Pairs (a, b) of positive values of f with a*b next to min_normal: for every stride-th
// normal a, the b of f nearest min_normal / a and two neighbours on each side.
std::vector<std::pair<double, double>> pairs_near_min_normal(const emu::Format& f, std::uint64_t stride) {
  const emu::Format with_sub = f.with_subnormals(true);
  std::vector<std::pair<double, double>> pairs;
  const std::uint64_t first = with_sub.encode(f.min_normal()), last = with_sub.encode(f.max_finite());
  for (std::uint64_t bits = first; bits <= last; bits += stride) {
    const double a = with_sub.decode(bits);
    emu::Flags ignored = 0;
    const double b0 = emu::round(with_sub, f.min_normal() / a, emu::RoundSpec{}, nullptr, ignored);
    const auto b0_bits = static_cast<std::int64_t>(with_sub.encode(b0));
    for (std::int64_t d = -2; d <= 2; ++d)
      if (b0_bits + d > 0) pairs.emplace_back(a, with_sub.decode(static_cast<std::uint64_t>(b0_bits + d)));
  }
  return pairs;
}

}  // namespace

TEST_CASE("tininess: fp32 and fp64 multiplication against the CPU (after) and by definition (before)",
          "[tininess]") {
  std::mt19937_64 gen(20261123);
  struct Case {
    const emu::Format& format;
    ref::Spec spec;
    int fraction_bits;
  };
  Coverage cov;
  for (const bool fp64 : {false, true}) {
    const emu::Format& base = fp64 ? emu::fp64() : emu::fp32();
    const ref::Spec spec_base = fp64 ? ref::Spec{11, 52} : ref::Spec{8, 23};
    const int p = base.fraction_bits();
    // a = A 2^-(p+1) in [1/2, 1), b = B 2^(emin - p) in [min_normal, 2 min_normal): the
    // product A B 2^(emin - 2p - 1) lies within a few ulps below or above min_normal =
    // 2^(2p+1) 2^(emin - 2p - 1).
    const auto top = std::uint64_t{1} << p;
    for (int n = 0; n < 3000; ++n) {
      const std::uint64_t A = top + gen() % top;
      const unsigned __int128 target = (static_cast<unsigned __int128>(1) << (2 * p + 1)) -
                                       (static_cast<unsigned __int128>(gen() % (8 * top)));
      std::uint64_t B = static_cast<std::uint64_t>(target / A) + (gen() % 3);
      if (B >= 2 * top) B = 2 * top - 1;
      if (B < top) B = top;
      const double a = std::ldexp(static_cast<double>(A), -(p + 1)) * ((gen() & 1) ? -1 : 1);
      const double b = std::ldexp(static_cast<double>(B), base.emin() - p);
      const ref::Real exact = product_of(a, b);
      const bool below = std::fabs(a) * b < base.min_normal() ||
                         (std::fabs(a) * b == base.min_normal() && ref::floor_log2(exact.num, exact.den) < base.emin());
      for (const bool subnormals : {true, false}) {
        const emu::Format f = base.with_subnormals(subnormals);
        const ref::Spec spec{spec_base.exponent_bits, spec_base.p, false, subnormals};
        for (Rounding mode : kModes) {
          const EmuResult after = emu_mul(f, a, b, mode, Tininess::after);
          const EmuResult before = emu_mul(f, a, b, mode, Tininess::before);
          check_against_reference(f, spec, exact, after, mode, Tininess::after, cov);
          check_against_reference(f, spec, exact, before, mode, Tininess::before, cov);
          if (subnormals && before.flags != after.flags) ++cov.differ;
          if (mode == Rounding::rna || mode == Rounding::ro) continue;
          emu::Flags host_flags = 0;
          const double host = fp64 ? host_mul(a, b, mode, !subnormals, host_flags)
                                   : static_cast<double>(host_mul(static_cast<float>(a), static_cast<float>(b), mode,
                                                                  !subnormals, host_flags));
          INFO((fp64 ? "fp64 " : "fp32 ") << a << " * " << b << " subnormals " << subnormals << " "
                                          << emu::rounding_name(mode));
          CHECK(same_value(after.value, host));
          CHECK(after.flags == host_flags);
          if (subnormals) {  // the results agree; only the flags tell the rules apart
            CHECK(same_value(before.value, host));
            CHECK(before.flags == before_from_after(host_flags, below));
          }
        }
      }
    }
  }
  // Both rules were exercised where they differ.
  INFO(cov.differ << " of " << cov.checked);
  CHECK(cov.differ > 500);
}

TEST_CASE("tininess: fp32 conversion against the CPU, fp64 conversion against the x87", "[tininess]") {
  std::mt19937_64 gen(7);
  Coverage cov;
  // fp32: doubles just below and above 2^-126, with bits far below fp32's last place.
  for (int n = 0; n < 3000; ++n) {
    const double d = std::ldexp(static_cast<double>(gen() >> 11), -53 - 22 - static_cast<int>(gen() % 4));
    const double x = ((gen() & 1) ? -1 : 1) * std::ldexp(1.0 - d + ((gen() & 3) == 0 ? 2 * d : 0.0), -126);
    const bool below = std::fabs(x) < 0x1p-126;
    for (const bool subnormals : {true, false}) {
      const emu::Format f = emu::fp32().with_subnormals(subnormals);
      const ref::Spec spec{8, 23, false, subnormals};
      for (Rounding mode : kModes) {
        const EmuResult after = emu_round(f, emu::Exact{x}, mode, Tininess::after);
        const EmuResult before = emu_round(f, emu::Exact{x}, mode, Tininess::before);
        check_against_reference(f, spec, real_of(x), after, mode, Tininess::after, cov);
        check_against_reference(f, spec, real_of(x), before, mode, Tininess::before, cov);
        if (subnormals && before.flags != after.flags) ++cov.differ;
        if (mode == Rounding::rna || mode == Rounding::ro) continue;
        emu::Flags host_flags = 0;
        const double host = host_to_float(x, mode, !subnormals, host_flags);
        INFO("fp32 convert " << x << " subnormals " << subnormals << " " << emu::rounding_name(mode));
        CHECK(same_value(after.value, host));
        CHECK(after.flags == host_flags);
        if (subnormals) CHECK(before.flags == before_from_after(host_flags, below));
      }
    }
  }
  // fp64 from long double (64-bit significands): x = 2^-1022 (1 - k 2^-64), the last
  // two intervals of fp64's grid with unbounded exponent (spacing 2^-53 relative) below
  // 2^-1022, and some above. hi + lo is x exactly, lo scaled by 2^1100.
  static_assert(std::numeric_limits<long double>::digits == 64, "x87 extended precision");
  for (int n = 0; n < 3000; ++n) {
    const long double k = static_cast<long double>(gen() % (std::uint64_t{1} << 12)) - 256;
    const long double x = ((gen() & 1) ? -1.0L : 1.0L) * std::ldexp(1.0L - k * 0x1p-64L, -1022);
    const double hi = static_cast<double>(x);  // nearest (the host rounds to nearest here)
    const emu::Exact exact{hi, static_cast<double>(std::ldexp(x - hi, 1100)), false, 1100};
    REQUIRE(static_cast<long double>(exact.lo) == std::ldexp(x - hi, 1100));
    const bool below = std::fabs(x) < 0x1p-1022L;
    // The reference from x's 64-bit significand.
    int e = 0;
    const long double frac = std::frexp(std::fabs(x), &e);
    ref::Real real;
    real.negative = x < 0;
    real.num = ref::Int(static_cast<std::uint64_t>(std::ldexp(frac, 64)));
    real.den = ref::Int(1) << (64 - e);
    for (const bool subnormals : {true, false}) {
      const emu::Format f = emu::fp64().with_subnormals(subnormals);
      const ref::Spec spec{11, 52, false, subnormals};
      for (Rounding mode : kModes) {
        const EmuResult after = emu_round(f, exact, mode, Tininess::after);
        const EmuResult before = emu_round(f, exact, mode, Tininess::before);
        check_against_reference(f, spec, real, after, mode, Tininess::after, cov);
        check_against_reference(f, spec, real, before, mode, Tininess::before, cov);
        if (subnormals && before.flags != after.flags) ++cov.differ;
        if (!subnormals || mode == Rounding::rna || mode == Rounding::ro) continue;  // x87 has no FTZ
        emu::Flags host_flags = 0;
        const double host = host_to_double(x, mode, host_flags);
        INFO("fp64 convert " << static_cast<double>(x) << " - 2^-1022 = "
                             << static_cast<double>(std::fabs(x) - 0x1p-1022L) << " " << emu::rounding_name(mode));
        CHECK(same_value(after.value, host));
        CHECK(after.flags == host_flags);
        CHECK(before.flags == before_from_after(host_flags, below));
      }
    }
  }
  INFO(cov.differ << " of " << cov.checked);
  CHECK(cov.differ > 500);
}

TEST_CASE("tininess: fp16 conversion and multiplication against F16C, bf16 against the reference", "[tininess]") {
  Coverage cov;
  // fp16 conversion: every float in the last two intervals of fp16's unbounded grid
  // (spacing 2^-25) below 2^-14 and the first above (float spacing there is 2^-38),
  // every 5th one, both signs.
  const float start = 0x1p-14f - 0x1p-24f, stop = 0x1p-14f + 0x1p-24f;
  long n = 0;
  for (float v = start; v <= stop; v = std::nextafter(v, 1.0f)) {
    if (n++ % 5 != 0) continue;
    for (const float x : {v, -v}) {
      const bool below = std::fabs(x) < 0x1p-14f;
      for (Rounding mode : kHostModes) {
        emu::Flags host_flags = 0;
        const double host = static_cast<double>(std::bit_cast<_Float16>(host_to_fp16(x, mode, host_flags)));
        const EmuResult after = emu_round(emu::fp16(), emu::Exact{x}, mode, Tininess::after);
        const EmuResult before = emu_round(emu::fp16(), emu::Exact{x}, mode, Tininess::before);
        INFO("fp16 convert " << x << " " << emu::rounding_name(mode));
        CHECK(same_value(after.value, host));
        CHECK(after.flags == host_flags);
        CHECK(same_value(before.value, host));
        CHECK(before.flags == before_from_after(host_flags, below));
        ++cov.checked;
        if (before.flags != after.flags) ++cov.differ;
      }
      // The other modes and subnormals off against the reference (a sparser sample).
      if (n % 35 != 1) continue;
      for (const bool subnormals : {true, false}) {
        const emu::Format f = emu::fp16().with_subnormals(subnormals);
        const ref::Spec spec{5, 10, false, subnormals};
        for (Rounding mode : kModes)
          for (Tininess t : {Tininess::before, Tininess::after})
            check_against_reference(f, spec, real_of(x), emu_round(f, emu::Exact{x}, mode, t), mode, t, cov);
      }
    }
  }
  // fp16 multiplication: fp16 pairs with a product next to 2^-14. The float product is
  // exact (22 bits), so F16C's rounding of it is the oracle.
  for (const auto& [a, b] : pairs_near_min_normal(emu::fp16(), 3)) {
    for (const double sa : {a, -a}) {
      const double product = sa * b;
      const bool below = std::fabs(product) < 0x1p-14;
      for (Rounding mode : kHostModes) {
        emu::Flags host_flags = 0;
        const double host = static_cast<double>(
            std::bit_cast<_Float16>(host_to_fp16(static_cast<float>(product), mode, host_flags)));
        const EmuResult after = emu_mul(emu::fp16(), sa, b, mode, Tininess::after);
        const EmuResult before = emu_mul(emu::fp16(), sa, b, mode, Tininess::before);
        INFO("fp16 " << sa << " * " << b << " " << emu::rounding_name(mode));
        CHECK(same_value(after.value, host));
        CHECK(after.flags == host_flags);
        CHECK(before.flags == before_from_after(host_flags, below));
        ++cov.checked;
        if (before.flags != after.flags) ++cov.differ;
      }
    }
  }
  for (const auto& [a, b] : pairs_near_min_normal(emu::fp16(), 41))
    for (const bool subnormals : {true, false}) {
      const emu::Format f = emu::fp16().with_subnormals(subnormals);
      const ref::Spec spec{5, 10, false, subnormals};
      for (Rounding mode : kModes)
        for (Tininess t : {Tininess::before, Tininess::after})
          check_against_reference(f, spec, product_of(-a, b), emu_mul(f, -a, b, mode, t), mode, t, cov);
    }
  // bf16: multiplication of pairs next to 2^-126 and conversion of the products' exact
  // values with a residual below bf16's last place, both against the reference.
  long bf16_differ = 0;
  for (const auto& [a, b] : pairs_near_min_normal(emu::bf16(), 7))
    for (const double sa : {a, -a})
      for (const bool subnormals : {true, false}) {
        const emu::Format f = emu::bf16().with_subnormals(subnormals);
        const ref::Spec spec{8, 7, false, subnormals};
        for (Rounding mode : kModes) {
          const EmuResult after = emu_mul(f, sa, b, mode, Tininess::after);
          const EmuResult before = emu_mul(f, sa, b, mode, Tininess::before);
          check_against_reference(f, spec, product_of(sa, b), after, mode, Tininess::after, cov);
          check_against_reference(f, spec, product_of(sa, b), before, mode, Tininess::before, cov);
          if (subnormals && before.flags != after.flags) ++bf16_differ;
          const double x = sa * b * (1 - 0x1p-30);  // exact in double: 16 + 30 bits
          for (Tininess t : {Tininess::before, Tininess::after})
            check_against_reference(f, spec, real_of(x), emu_round(f, emu::Exact{x}, mode, t), mode, t, cov);
        }
      }
  INFO(cov.differ << " fp16 and " << bf16_differ << " bf16 cases tell the rules apart");
  CHECK(cov.differ > 200);
  CHECK(bf16_differ > 50);
}

TEST_CASE("tininess golden cases: fp16 just below 2^-14", "[tininess]") {
  // 2^-14 - 2^-26 lies in the last interval below 2^-14 of the 11-bit grid with
  // unbounded exponent (spacing 2^-25), above its midpoint: rne rounds it up to 2^-14,
  // so it is not tiny after rounding; before rounding it is.
  const double x = 0x1p-14 - 0x1p-26;
  for (const bool subnormals : {true, false}) {
    const emu::Format f = emu::fp16().with_subnormals(subnormals);
    const EmuResult after = emu_round(f, emu::Exact{x}, Rounding::rne, Tininess::after);
    const EmuResult before = emu_round(f, emu::Exact{x}, Rounding::rne, Tininess::before);
    CHECK(after.value == 0x1p-14);
    CHECK(after.flags == emu::INEXACT);
    CHECK(before.value == (subnormals ? 0x1p-14 : 0.0));  // Arm's FZ: flushed
    CHECK(before.flags == (emu::UFLO | emu::INEXACT));
  }
  // 2^-14 - 2^-25 is a point of the unbounded grid: tiny under both rules, and with
  // subnormals it ties (rne, to even) up to 2^-14 all the same.
  const EmuResult tie = emu_round(emu::fp16(), emu::Exact{0x1p-14 - 0x1p-25}, Rounding::rne, Tininess::after);
  CHECK(tie.value == 0x1p-14);
  CHECK(tie.flags == (emu::UFLO | emu::INEXACT));
  // rz never rounds up: tiny under both; ru rounds any x above the last point up.
  CHECK(emu_round(emu::fp16(), emu::Exact{x}, Rounding::rz, Tininess::after).flags == (emu::UFLO | emu::INEXACT));
  const EmuResult up = emu_round(emu::fp16(), emu::Exact{0x1p-14 - 0x1p-25 + 0x1p-30}, Rounding::ru, Tininess::after);
  CHECK(up.value == 0x1p-14);
  CHECK(up.flags == emu::INEXACT);
  CHECK(emu_round(emu::fp16(), emu::Exact{-x}, Rounding::rd, Tininess::after).value == -0x1p-14);
  CHECK(emu_round(emu::fp16(), emu::Exact{-x}, Rounding::ru, Tininess::after).flags == (emu::UFLO | emu::INEXACT));
}

TEST_CASE("tininess after rounding under sr: UFLO follows the delivered result (subnormals on) or one draw "
          "with unbounded exponent (off)", "[tininess]") {
  // x = 2^-14 - 2^-26 is half way through the last interval of the unbounded grid below
  // 2^-14 (spacing 2^-25) and a quarter of the subnormal spacing (2^-24) below 2^-14.
  const double x = 0x1p-14 - 0x1p-26;
  emu::FpControl c;
  c.rounding = Rounding::sr;
  c.tininess = Tininess::after;
  emu::Context on(c, emu::Rng(emu::StreamId{5}));
  emu::Context off(c, emu::Rng(emu::StreamId{6}));
  const emu::Format flushing = emu::fp16().with_subnormals(false);
  constexpr int kDraws = 4000;
  int up_on = 0, up_off = 0;
  for (int i = 0; i < kDraws; ++i) {
    on.clear_status();
    const double r = on.convert(emu::fp16(), x);
    REQUIRE((r == 0x1p-14 || r == 0x1p-14 - 0x1p-24));
    CHECK(on.status() == (r == 0x1p-14 ? emu::INEXACT : (emu::UFLO | emu::INEXACT)));
    up_on += r == 0x1p-14;
    off.clear_status();
    const double s = off.convert(flushing, x);
    REQUIRE((s == 0x1p-14 || s == 0.0));
    CHECK(off.status() == (s == 0x1p-14 ? emu::INEXACT : (emu::UFLO | emu::INEXACT)));
    up_off += s == 0x1p-14;
  }
  // P(up) = 3/4 on the subnormal grid, 1/2 on the unbounded one; 5 sigma bounds.
  CHECK(std::abs(up_on - 0.75 * kDraws) < 5 * std::sqrt(kDraws * 0.75 * 0.25));
  CHECK(std::abs(up_off - 0.5 * kDraws) < 5 * std::sqrt(kDraws * 0.5 * 0.5));
}
