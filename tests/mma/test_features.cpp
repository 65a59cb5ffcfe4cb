// The published feature tests of tensor-core arithmetic, run through the presets. Each
// input is chosen so that the feature decides the result; the expected values are worked
// out by hand beside the inputs (not taken from the model's own output).
//
// Sources:
//  [Fasi21]  M. Fasi, N. J. Higham, M. Mikaitis, S. Pranesh, "Numerical behavior of NVIDIA
//            tensor cores", PeerJ Computer Science 7:e330, 2021.
//  [FTTN24]  X. Li et al., "FTTN: Feature-targeted testing for numerical properties of
//            NVIDIA & AMD matrix accelerators", CCGrid 2024 (and its HPEC 2025 follow-up).
//  [KM25]    F. A. Khattak, M. Mikaitis, "Accurate models of NVIDIA tensor cores"
//            (MATLAB-tensor-core).
//  [Mik24]   M. Mikaitis, "Monotonicity of multi-term floating-point adders",
//            IEEE Transactions on Computers, 2024.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/mma.hpp"

namespace {

using emu::UnitKind;

double p2(int e) { return std::ldexp(1.0, e); }

double tc(UnitKind device, const std::vector<double>& a, const std::vector<double>& b, double c,
          const emu::Format& in = emu::fp16(), const emu::Format& out = emu::fp32()) {
  emu::Context ctx;
  const auto unit = emu::make_unit(device, in, out);
  return unit->dot(ctx, a.size(), a.data(), 1, b.data(), 1, c);
}

}  // namespace

TEST_CASE("alignment truncates shifted-out bits, sign-magnitude [Fasi21]", "[mma][features]") {
  // V100 keeps 23 fraction bits below the largest exponent (here 2^0). Exact sum
  // 1 + 3 * 2^-24 would round (rz) to 1 + 2^-23; the truncated 2^-24 terms vanish.
  const double t = p2(-12);  // t * t = 2^-24
  CHECK(tc(UnitKind::v100, {1, t, t, t}, {1, t, t, t}, 0) == 1.0);
  // A negative term below the window is truncated towards zero, not floored: exact
  // 1 - 2^-25 (rz: 1 - 2^-24), floor in two's complement: 1 - 2^-23; the unit gives 1.
  CHECK(tc(UnitKind::v100, {-p2(-12)}, {p2(-13)}, 1.0) == 1.0);
}

TEST_CASE("extra alignment bits: 0 on V100, 1 on A100, 2 on H100 [FTTN24][KM25]", "[mma][features]") {
  const double t = p2(-12);
  // Three products 2^-24 under a leading 1: kept from A100 on (24 fraction bits).
  CHECK(tc(UnitKind::a100, {1, t, t, t}, {1, t, t, t}, 0) == 1.0 + p2(-23));  // 1 + 3*2^-24, rz
  CHECK(tc(UnitKind::h100, {1, t, t, t}, {1, t, t, t}, 0) == 1.0 + p2(-23));
  // Four products 2^-25 (2^-12 * 2^-13): dropped by A100, kept by H100 (25 bits) and B200.
  const double u = p2(-13);
  CHECK(tc(UnitKind::a100, {1, t, t, t, t}, {1, u, u, u, u}, 0) == 1.0);
  CHECK(tc(UnitKind::h100, {1, t, t, t, t}, {1, u, u, u, u}, 0) == 1.0 + p2(-23));
  CHECK(tc(UnitKind::b200, {1, t, t, t, t}, {1, u, u, u, u}, 0) == 1.0 + p2(-23));
}

TEST_CASE("block size: products fused before one normalisation [Fasi21][FTTN24]", "[mma][features]") {
  // a.b = [2^10, -2^10, s, s, ...] with s = 2^-24: inside the first block every s is
  // truncated against 2^10; the first block gives 0 and each later block adds its s
  // exactly. So the result is (K - block) * s and reveals the block size.
  const auto detect = [](UnitKind device, const emu::Format& in, double s_factor, int k) {
    std::vector<double> a(k, s_factor), b(k, s_factor);
    a[0] = 32;
    b[0] = 32;
    a[1] = -32;
    b[1] = 32;
    const double s = s_factor * s_factor;
    return k - static_cast<int>(tc(device, a, b, 0, in) / s);
  };
  CHECK(detect(UnitKind::v100, emu::fp16(), p2(-12), 32) == 4);
  CHECK(detect(UnitKind::t4, emu::fp16(), p2(-12), 32) == 8);
  CHECK(detect(UnitKind::a100, emu::fp16(), p2(-12), 32) == 8);
  CHECK(detect(UnitKind::a100, emu::bf16(), p2(-12), 32) == 8);
  CHECK(detect(UnitKind::a100, emu::tf32(), p2(-12), 32) == 4);
  CHECK(detect(UnitKind::ada, emu::fp16(), p2(-12), 32) == 8);
  CHECK(detect(UnitKind::h100, emu::fp16(), p2(-12), 32) == 16);
  CHECK(detect(UnitKind::h100, emu::tf32(), p2(-12), 32) == 8);
  CHECK(detect(UnitKind::b200, emu::bf16(), p2(-12), 32) == 16);
  // Native fp8 (s = 2^-6 * 2^-6 = 2^-12, truncated against 2^10 with 13 kept bits).
  CHECK(detect(UnitKind::ada, emu::fp8_e4m3(), p2(-6), 64) == 16);
  CHECK(detect(UnitKind::h100, emu::fp8_e4m3(), p2(-6), 64) == 32);
}

TEST_CASE("late normalisation: one normalisation per block [Fasi21]", "[mma][features]") {
  // Products 1, 1, 2^-23, -1 (2^-23 = 2^-12 * 2^-11). Normalising after 1 + 1 = 2 would
  // move the window to 2^-22 and lose 2^-23; the block keeps it: 1 + 2^-23.
  CHECK(tc(UnitKind::v100, {1, 1, p2(-12), -1}, {1, 1, p2(-11), 1}, 0) == 1.0 + p2(-23));
}

TEST_CASE("fp32 output is rounded toward zero [Fasi21][KM25]", "[mma][features]") {
  // A100: 1 + 2^-23 + 2^-24 is exact in the block (24 kept bits); it is a tie between
  // 1 + 2^-23 and 1 + 2^-22: rne would give 1 + 2^-22, rz gives 1 + 2^-23.
  const std::vector<double> a{1, p2(-12), p2(-12)}, b{1, p2(-11), p2(-12)};
  CHECK(tc(UnitKind::a100, a, b, 0) == 1.0 + p2(-23));
  CHECK(tc(UnitKind::a100, {-1, -p2(-12), -p2(-12)}, b, 0) == -(1.0 + p2(-23)));  // toward zero, not down
}

TEST_CASE("fp16 output is rounded to nearest even [Fasi21][KM25]", "[mma][features]") {
  const emu::Format& h = emu::fp16();
  // 1 + 0.75 ulp -> 1 + ulp (ulp = 2^-10); ties 1 + 0.5 ulp -> 1, 1 + 1.5 ulp -> 1 + 2 ulp.
  CHECK(tc(UnitKind::v100, {1, 3 * p2(-6)}, {1, p2(-6)}, 0, h, h) == 1.0 + p2(-10));
  CHECK(tc(UnitKind::v100, {1, p2(-6)}, {1, p2(-5)}, 0, h, h) == 1.0);
  CHECK(tc(UnitKind::v100, {1, 3 * p2(-6)}, {1, p2(-5)}, 0, h, h) == 1.0 + p2(-9));
  CHECK(tc(UnitKind::h100, {1, 3 * p2(-6)}, {1, p2(-6)}, 0, h, h) == 1.0 + p2(-10));
}

TEST_CASE("the sum is not monotonic on V100 and A100 [Mik24][Fasi21]", "[mma][features]") {
  // Raising c from 2 - 2^-23 to 2 moves the alignment exponent from 0 to 1, and the small
  // products fall out of the window: the larger input gives the smaller result.
  // V100 (block 4, 23 bits): c + 3 * 2^-23 = 2 + 2^-22 exactly; with c = 2: 2.
  const double t = p2(-12), u = p2(-11);
  CHECK(tc(UnitKind::v100, {t, t, t}, {u, u, u}, 2.0 - p2(-23)) == 2.0 + p2(-22));
  CHECK(tc(UnitKind::v100, {t, t, t}, {u, u, u}, 2.0) == 2.0);
  // A100 (block 8, 24 bits): c + 7 * 2^-24 = 2 + 5 * 2^-24 -> rz 2 + 2^-22; with c = 2: 2.
  const std::vector<double> a(7, t);
  CHECK(tc(UnitKind::a100, a, a, 2.0 - p2(-23)) == 2.0 + p2(-22));
  CHECK(tc(UnitKind::a100, a, a, 2.0) == 2.0);
}

TEST_CASE("subnormal inputs give exact products; subnormal outputs are kept [Fasi21][KM25]",
          "[mma][features]") {
  const double min_sub = p2(-24);  // fp16's least subnormal
  CHECK(tc(UnitKind::v100, {min_sub}, {min_sub}, 0) == p2(-48));
  CHECK(tc(UnitKind::a100, {3 * min_sub}, {5 * min_sub}, 0) == 15 * p2(-48));
  // A subnormal factor keeps the exponent emin (-14) in the alignment [KM25]: the product
  // 2^-24 * 1 aligns as if it were 2^-14, so 2^-38 (= 2^-24 * 2^-14) falls 24 places
  // below and is truncated; an exact sum would be 2^-24 + 2^-38.
  CHECK(tc(UnitKind::v100, {min_sub, min_sub}, {1, p2(-14)}, 0) == p2(-24));
  // fp16 output: 2^-12 * 2^-12 = 2^-24 is fp16's least subnormal, not flushed.
  CHECK(tc(UnitKind::v100, {p2(-12)}, {p2(-12)}, 0, emu::fp16(), emu::fp16()) == p2(-24));
}

TEST_CASE("NaN and infinity follow IEEE 754 over the dot product", "[mma][features]") {
  const double inf = std::numeric_limits<double>::infinity();
  emu::Context ctx;
  const auto unit = emu::make_unit(UnitKind::a100);
  const std::vector<double> a{1, inf, 2}, b{1, 1, 0}, zero_inf{1, 0, 2}, inf_b{1, inf, 3};
  CHECK(unit->dot(ctx, 3, a.data(), 1, b.data(), 1, 0) == inf);
  CHECK(ctx.status() == 0);
  CHECK(std::isnan(unit->dot(ctx, 3, zero_inf.data(), 1, inf_b.data(), 1, 0)));  // 0 * inf
  CHECK((ctx.status() & emu::INV) != 0);
  CHECK(std::isnan(unit->dot(ctx, 3, a.data(), 1, b.data(), 1, -inf)));  // inf - inf
}

TEST_CASE("devices reject the formats they do not take, naming the device", "[mma]") {
  const auto message = [](UnitKind device, const emu::Format& in, const emu::Format& out) -> std::string {
    try {
      emu::make_unit(device, in, out);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(message(UnitKind::v100, emu::bf16(), emu::fp32()), Catch::Contains("v100"));
  CHECK_THAT(message(UnitKind::a100, emu::fp8_e4m3(), emu::fp32()), Catch::Contains("a100"));
  CHECK_THAT(message(UnitKind::h100, emu::bf16(), emu::fp16()), Catch::Contains("h100"));
  CHECK_THAT(message(UnitKind::h100, emu::fp32(), emu::fp32()), Catch::Contains("h100"));
  CHECK(message(UnitKind::h100, emu::fp8_e5m2(), emu::fp16()).empty());
  CHECK(message(UnitKind::b200, emu::tf32(), emu::fp32()).empty());
}

TEST_CASE("gemm and the 4x4x4 tile agree with dot per element", "[mma][gemm]") {
  std::mt19937 gen(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  struct Case {
    UnitKind device;
    const emu::Format* in;
    const emu::Format* out;
  };
  const Case cases[] = {{UnitKind::v100, &emu::fp16(), &emu::fp32()},
                        {UnitKind::a100, &emu::bf16(), &emu::fp32()},
                        {UnitKind::h100, &emu::fp16(), &emu::fp16()},
                        {UnitKind::h100, &emu::fp8_e4m3(), &emu::fp16()},
                        {UnitKind::l40s, &emu::fp8_e5m2(), &emu::fp32()},
                        {UnitKind::b200, &emu::fp8_e4m3(), &emu::fp32()}};
  for (const Case& cs : cases) {
    const std::size_t m = 5, n = 6, k = 70;  // k not a multiple of any block
    emu::Context round_ctx;
    const auto sample = [&](const emu::Format& f, std::size_t count) {
      std::vector<double> v(count);
      for (double& x : v) x = round_ctx.convert(f, normal(gen));
      return v;
    };
    const auto A = sample(*cs.in, m * k), B = sample(*cs.in, k * n);
    const auto C0 = sample(*cs.out, m * n);
    const auto unit = emu::make_unit(cs.device, *cs.in, *cs.out);
    emu::Context ctx;
    auto C = C0;
    unit->gemm(ctx, m, n, k, A.data(), k, B.data(), n, C.data(), n);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const double d = unit->dot(ctx, k, A.data() + i * k, 1, B.data() + j, n, C0[i * n + j]);
        INFO(emu::unit_kind_name(cs.device) << " " << cs.in->name() << " element " << i << "," << j);
        CHECK(C[i * n + j] == d);
      }
  }
  // Volta's 4x4x4 instruction: each element is one 4-product block with c.
  const auto v100 = emu::make_tensor_core_unit(UnitKind::v100, std::nullopt, std::nullopt);
  const auto& tile_unit = dynamic_cast<const emu::TensorCoreUnit&>(*v100);
  std::vector<double> A(16), B(16), C(16), D(16);
  emu::Context ctx;
  for (double& x : A) x = ctx.convert(emu::fp16(), normal(gen));
  for (double& x : B) x = ctx.convert(emu::fp16(), normal(gen));
  for (double& x : C) x = ctx.convert(emu::fp32(), normal(gen));
  tile_unit.mma_4x4x4(ctx, A.data(), B.data(), C.data(), D.data());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) CHECK(D[i * 4 + j] == v100->dot(ctx, 4, A.data() + i * 4, 1, B.data() + j, 4, C[i * 4 + j]));
}

TEST_CASE("the adder's integer rounding equals emu::round (two paths checked against each other)",
          "[mma][rounding]") {
  std::mt19937_64 gen(11);
  const emu::Format e8m13(8, 13);
  const emu::Format* formats[] = {&emu::fp32(), &emu::fp16(), &e8m13};
  int compared = 0;
  for (const emu::Format* f : formats)
    for (const emu::Rounding mode : {emu::Rounding::rne, emu::Rounding::rna, emu::Rounding::rz, emu::Rounding::ru,
                                     emu::Rounding::rd, emu::Rounding::ro})
      for (int trial = 0; trial < 20000; ++trial) {
        // Sums up to 2^41 wide, placed from deep below the subnormals to the top binade.
        const int width = 1 + static_cast<int>(gen() % 41);
        std::uint64_t magnitude = (gen() >> (64 - width)) | (std::uint64_t{1} << (width - 1));
        if (trial % 3 == 0) magnitude |= (std::uint64_t{1} << (width / 2)) - 1;  // long runs of ones: ties, carries
        const int lsb = f->emin() - f->fraction_bits() - 45 + static_cast<int>(gen() % (f->emax() - f->emin() + 60));
        const bool negative = (gen() & 1) != 0;
        emu::FixedPoint x{magnitude, lsb, negative};
        const double exact = emu::to_double(x);
        emu::Flags reference_flags = 0;
        const double reference = emu::round(*f, exact, {mode}, nullptr, reference_flags);
        if (std::fabs(reference) > f->max_finite() || std::isinf(reference) ||
            std::fabs(exact) >= f->max_finite())
          continue;  // the range is the caller's business
        emu::Flags flags = 0;
        emu::round_fixed_point(x, f->fraction_bits(), f->emin(), mode, flags);
        const double got = emu::to_double(x);
        INFO(f->name() << " " << emu::rounding_name(mode) << " magnitude " << magnitude << " lsb " << lsb);
        REQUIRE(std::bit_cast<std::uint64_t>(got) == std::bit_cast<std::uint64_t>(reference));
        REQUIRE(flags == reference_flags);
        ++compared;
      }
  CHECK(compared > 300000);
  emu::FixedPoint x{1, 0, false};
  emu::Flags flags = 0;
  CHECK_THROWS_AS(emu::round_fixed_point(x, 10, -14, emu::Rounding::sr, flags), std::invalid_argument);
}
