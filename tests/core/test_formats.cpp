// Formats: every bit pattern of the small formats decodes and encodes back, against the
// CPU's binary16 (gcc _Float16), float32 (bf16 is its top half), and the OCP spec's
// definitions; the published format properties.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <set>

#include "emu/format.hpp"

namespace {

// The patterns that are NaN by definition: IEEE (IEEE 754-2019 3.4): exponent all ones,
// fraction non-zero. OCP fn (OCP 8-bit FP spec v1.0, E4M3): S.1111.111 only.
bool is_nan_pattern(const emu::Format& f, std::uint64_t bits) {
  const std::uint64_t exponent = (bits >> f.fraction_bits()) & ((std::uint64_t{1} << f.exponent_bits()) - 1);
  const std::uint64_t fraction = bits & ((std::uint64_t{1} << f.fraction_bits()) - 1);
  const bool top = exponent == (std::uint64_t{1} << f.exponent_bits()) - 1;
  if (f.nan_encoding() == emu::NanEncoding::top) return top && fraction == (std::uint64_t{1} << f.fraction_bits()) - 1;
  return top && fraction != 0;
}

// Decodes every pattern, checks it against `oracle` (which returns the value the
// pattern means), encodes it back; NaN patterns must map to the canonical NaN of their
// sign (format.hpp: "NaN -> canonical NaN, keeping its sign"); with subnormals off the
// subnormal patterns decode to signed zero and encode back as that zero.
template <typename Oracle>
void check_every_pattern(const emu::Format& f, Oracle oracle) {
  const std::uint64_t count = std::uint64_t{1} << f.width();
  std::uint64_t finite = 0, wrong_value = 0, wrong_bits = 0;
  std::set<double> values;
  for (std::uint64_t bits = 0; bits < count; ++bits) {
    const double v = f.decode(bits);
    const double want = oracle(bits);
    const bool nan = is_nan_pattern(f, bits);
    if (nan != std::isnan(v) || (!nan && (v != want || std::signbit(v) != std::signbit(want)))) {
      if (++wrong_value < 5) UNSCOPED_INFO(f.name() << " decode 0x" << std::hex << bits << " = " << v << ", expected " << want);
      continue;
    }
    const bool subnormal_pattern = (bits & f.exponent_mask()) == 0 && (bits & f.fraction_mask()) != 0;
    std::uint64_t expected_bits = bits;
    if (nan) expected_bits = (bits & f.sign_mask()) | f.quiet_nan_bits();
    if (subnormal_pattern && !f.subnormals()) expected_bits = bits & f.sign_mask();
    if (f.encode(v) != expected_bits && ++wrong_bits < 5)
      UNSCOPED_INFO(f.name() << " encode(decode(0x" << std::hex << bits << ")) = 0x" << f.encode(v));
    if (!nan && !std::isinf(v)) {
      ++finite;
      values.insert(v);  // +0 and -0 compare equal: one value
    }
  }
  INFO(f.name() << (f.subnormals() ? "" : " (subnormals off)"));
  CHECK(wrong_value == 0);
  CHECK(wrong_bits == 0);
  CHECK(finite == f.finite_encodings());
  CHECK(values.size() == f.finite_values());
}

double from_fp16_bits(std::uint64_t bits) {
  return static_cast<double>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(bits)));
}

// The value of a pattern from the definition: (-1)^s 2^(E - bias) (1 + F / 2^m), or
// (-1)^s 2^(1 - bias) (F / 2^m) for E = 0 (OCP 8-bit FP spec v1.0, section 5); IEEE
// formats have inf where E is all ones and F = 0.
double from_definition(const emu::Format& f, std::uint64_t bits) {
  const int m = f.fraction_bits();
  const int bias = (1 << (f.exponent_bits() - 1)) - 1;
  const auto e = static_cast<int>((bits >> m) & ((1u << f.exponent_bits()) - 1));
  const auto frac = static_cast<double>(bits & ((std::uint64_t{1} << m) - 1));
  const bool infinite = f.has_infinity() && e == (1 << f.exponent_bits()) - 1 && frac == 0;  // IEEE 754 3.4
  const double magnitude = infinite ? INFINITY
                           : e == 0 ? std::ldexp(frac, 1 - bias - m)
                                    : std::ldexp(1.0 + std::ldexp(frac, -m), e - bias);
  return (bits >> (m + f.exponent_bits())) & 1 ? -magnitude : magnitude;
}

}  // namespace

TEST_CASE("every fp16 pattern decodes as gcc _Float16 and encodes back", "[formats]") {
  check_every_pattern(emu::fp16(), from_fp16_bits);
  CHECK(emu::fp16().quiet_nan_bits() == 0x7e00);
}

TEST_CASE("every bf16 pattern decodes as the top half of a float32 and encodes back", "[formats]") {
  check_every_pattern(emu::bf16(), [](std::uint64_t bits) {
    return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits << 16)));
  });
  CHECK(emu::bf16().quiet_nan_bits() == 0x7fc0);
}

TEST_CASE("every fp8-e5m2 pattern decodes as the top byte of an fp16 and encodes back", "[formats]") {
  // OCP 8-bit FP v1.0: E5M2 is IEEE-like, and binary16 truncated to its top byte.
  check_every_pattern(emu::fp8_e5m2(), [](std::uint64_t bits) { return from_fp16_bits(bits << 8); });
}

TEST_CASE("every fp8-e4m3 pattern decodes as the OCP definition and encodes back", "[formats]") {
  const emu::Format& f = emu::fp8_e4m3();
  check_every_pattern(f, [&](std::uint64_t bits) { return from_definition(f, bits); });
  // Golden patterns from the OCP spec's E4M3 table.
  CHECK(f.decode(0b0'1111'110) == 448.0);       // max normal: 1.75 * 2^8
  CHECK(f.decode(0b0'0001'000) == 0x1p-6);      // min normal
  CHECK(f.decode(0b0'0000'111) == 0.875 * 0x1p-6);  // max subnormal
  CHECK(f.decode(0b0'0000'001) == 0x1p-9);      // min subnormal
  CHECK(std::isnan(f.decode(0b0'1111'111)));
  CHECK(std::isnan(f.decode(0b1'1111'111)));
  CHECK(f.decode(0b0'1111'000) == 256.0);       // the top binade is ordinary (no inf)
  CHECK(f.encode(INFINITY) == 0x7f);            // no inf: inf is encoded as NaN
}

TEST_CASE("every pattern of small generic formats, with subnormals on and off", "[formats]") {
  for (const char* name : {"e3m2", "e2m1", "e4m3", "e5m2", "e5m10", "e8m7"}) {
    const emu::Format f = emu::format_by_name(name);
    for (bool subnormals : {true, false}) {
      const emu::Format g = f.with_subnormals(subnormals);
      check_every_pattern(g, [&](std::uint64_t bits) {
        const bool subnormal = (bits & g.exponent_mask()) == 0;
        const double v = from_definition(g, bits);
        return subnormal && !subnormals ? std::copysign(0.0, v) : v;
      });
    }
  }
}

TEST_CASE("format properties match the published values", "[formats]") {
  // IEEE 754-2019 Table 3.5 (binary16); Higham & Pranesh, "Simulating low precision
  // floating-point arithmetic", SIAM J. Sci. Comput. 41(5), 2019, Table 2.1 (fp16,
  // bf16 unit roundoff, ranges).
  const emu::Format& h = emu::fp16();
  CHECK(h.max_finite() == 65504.0);
  CHECK(h.min_normal() == 6.103515625e-05);
  CHECK(h.min_subnormal() == 5.9604644775390625e-08);  // 5.960464477539063e-08 printed to 16 digits
  CHECK(h.unit_roundoff() == 0x1p-11);
  CHECK(h.finite_values() == 2 * (0x7c00 - 1) + 1);  // 0x0001..0x7bff each sign, and zero
  CHECK(h.bias() == 15);
  CHECK(h.emin() == -14);
  CHECK(h.emax() == 15);

  const emu::Format& b = emu::bf16();
  CHECK(b.max_finite() == 0x1.fep127);  // 3.38953139e38
  CHECK(b.min_normal() == 0x1p-126);
  CHECK(b.min_subnormal() == 0x1p-133);
  CHECK(b.unit_roundoff() == 0x1p-8);

  // OCP 8-bit Floating Point Specification (OFP8) v1.0, Table 1.
  const emu::Format& e4m3 = emu::fp8_e4m3();
  CHECK(e4m3.max_finite() == 448.0);
  CHECK(e4m3.min_normal() == 0x1p-6);
  CHECK(e4m3.min_subnormal() == 0x1p-9);
  CHECK(e4m3.bias() == 7);
  CHECK_FALSE(e4m3.has_infinity());
  CHECK(e4m3.finite_encodings() == 254);
  const emu::Format& e5m2 = emu::fp8_e5m2();
  CHECK(e5m2.max_finite() == 57344.0);
  CHECK(e5m2.min_normal() == 0x1p-14);
  CHECK(e5m2.min_subnormal() == 0x1p-16);
  CHECK(e5m2.bias() == 15);
  CHECK(e5m2.has_infinity());

  // NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): TF32 has the 8-bit
  // exponent of fp32 and the 10-bit fraction of fp16.
  const emu::Format& t = emu::tf32();
  CHECK(t.max_finite() == 0x1.ffcp127);
  CHECK(t.min_normal() == 0x1p-126);
  CHECK(t.unit_roundoff() == 0x1p-11);
  CHECK(t.width() == 19);

  CHECK(emu::fp32().max_finite() == 0x1.fffffep127);  // FLT_MAX
  CHECK(emu::fp64().max_finite() == 0x1.fffffffffffffp1023);
  CHECK(emu::fp64().min_subnormal() == 0x1p-1074);
  CHECK(emu::format_by_name("e5m10") == emu::fp16());
  CHECK_THROWS_AS(emu::format_by_name("fp12"), std::invalid_argument);
  CHECK_THROWS_AS(emu::format_by_name("e12m3"), std::invalid_argument);
  CHECK_THROWS_AS(emu::format_by_name("e5m0"), std::invalid_argument);
  // One spelling per format: leading zeros are refused, with the canonical name.
  for (const char* spelled : {"e05m2", "e5m02", "e005m010", "e08m7"}) {
    INFO(spelled);
    CHECK_THROWS_AS(emu::format_by_name(spelled), std::invalid_argument);
  }
  CHECK_THROWS_WITH(emu::format_by_name("e05m2"), Catch::Contains("write it e5m2"));
  CHECK(emu::format_by_name("e10m52").name() == "e10m52");
}
