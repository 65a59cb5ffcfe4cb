// The IPU AMP model (emu/amp) against its documented behaviour (see emu/amp.hpp for the
// sources): oracles in Boost.Multiprecision and the CPU's binary16/fp32 arithmetic.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "emu/amp.hpp"
#include "emu/unit.hpp"
#include "oracle.hpp"

using namespace emu;
using amp_oracle::Partials;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Same value and same sign of zero (NaN equals NaN).
bool same(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return x == y && std::signbit(x) == std::signbit(y);
}

double random_half(Rng& rng, int min_exp, int max_exp) {
  const int e = min_exp + static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(max_exp - min_exp + 1));
  const double sign = (rng.next_u64() & 1) ? -1.0 : 1.0;
  return static_cast<double>(static_cast<_Float16>(sign * (1.0 + rng.uniform()) * std::ldexp(1.0, e)));
}

// An fp32 partial: usually near the products' magnitude, sometimes far away (so that
// the exact phase sum spans more than any fixed-width accumulator, and fp32 subnormals).
double random_float_partial(Rng& rng) {
  const bool far = rng.next_u64() % 4 == 0;
  const int lo = far ? -140 : -20, hi = far ? 100 : 20;
  const int e = lo + static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(hi - lo + 1));
  const double sign = (rng.next_u64() & 1) ? -1.0 : 1.0;
  return static_cast<double>(static_cast<float>(sign * (1.0 + rng.uniform()) * std::ldexp(1.0, e)));
}

struct Case {
  std::vector<double> a, b;
  double c;
};

Case random_case(Rng& rng, std::size_t k, bool half_partial) {
  Case t;
  for (std::size_t i = 0; i < k; ++i) {
    t.a.push_back(random_half(rng, -10, 8));
    t.b.push_back(random_half(rng, -10, 8));
  }
  t.c = half_partial ? random_half(rng, -8, 12) : random_float_partial(rng);
  return t;
}

}  // namespace

TEST_CASE("ipu-amp (fp32 partials): each phase is the exact 4-term sum plus the partial, rounded once to fp32",
          "[amp]") {
  const auto unit = make_unit(UnitKind::ipu_amp);
  REQUIRE(unit->kind() == UnitKind::ipu_amp);
  REQUIRE(unit->output_format() == fp32());
  Rng rng(StreamId{11});
  int checked = 0;
  for (std::size_t k : {1u, 3u, 4u, 5u, 16u, 17u, 37u, 64u}) {
    for (int trial = 0; trial < 400; ++trial) {
      const Case t = random_case(rng, k, false);
      Context ctx;
      const double got = unit->dot(ctx, k, t.a.data(), 1, t.b.data(), 1, t.c);
      const double want = amp_oracle::amp_reference(t.a, t.b, t.c, Partials::fp32);
      INFO("k " << k << " trial " << trial << " c " << t.c);
      REQUIRE(same(got, want));
      ++checked;
    }
  }
  CHECK(checked == 8 * 400);
}

TEST_CASE("ipu-amp: bits beyond double precision still decide a rounding tie", "[amp]") {
  // 1024 + 2^-14 is an fp32 tie (ulp 2^-13); the 2^-48 (= 2^-24 * 2^-24, fp16
  // subnormals) lies 58 bits below the partial's leading bit, beyond a double's reach.
  const auto unit = make_unit(UnitKind::ipu_amp);
  for (double tiny_sign : {1.0, -1.0}) {
    const std::vector<double> a{0x1p-7, tiny_sign * 0x1p-24, 0, 0}, b{0x1p-7, 0x1p-24, 0, 0};
    for (double c : {1024.0, 1024.0 + 0x1p-13}) {
      Context ctx;
      const double got = unit->dot(ctx, 4, a.data(), 1, b.data(), 1, c);
      INFO("c " << c << " tiny sign " << tiny_sign);
      CHECK(same(got, amp_oracle::amp_reference(a, b, c, Partials::fp32)));
      CHECK(got == (tiny_sign > 0 ? c + 0x1p-13 : c));  // decided by the tiny term
      CHECK(ctx.status() == INEXACT);
    }
  }
  // An exactly representable result raises nothing.
  const std::vector<double> a{0.5, 0.25, 0, 0}, b{0.5, 4, 0, 0};
  Context ctx;
  CHECK(unit->dot(ctx, 4, a.data(), 1, b.data(), 1, 1.0) == 2.25);
  CHECK(ctx.status() == 0);
}

TEST_CASE("ipu-amp-half: the sum is rounded to fp32 before fp16 (expanded, added, rounded back)", "[amp]") {
  // 1024 + 0.5 + 2^-48: to fp32 gives 1024.5 (the 2^-48 is lost), a tie in fp16 that
  // RNE sends to 1024; one rounding of the exact sum would give 1025.
  const std::vector<double> a{0.5, 0x1p-24, 0, 0}, b{1.0, 0x1p-24, 0, 0};
  Context ctx;
  CHECK(make_unit(UnitKind::ipu_amp_half)->dot(ctx, 4, a.data(), 1, b.data(), 1, 1024.0) == 1024.0);
}

TEST_CASE("ipu-amp-half (fp16 partials, esr off): fp32 phase sum rounded to fp16 with RNE after each phase",
          "[amp]") {
  const auto unit = make_unit(UnitKind::ipu_amp_half);
  REQUIRE(unit->kind() == UnitKind::ipu_amp_half);
  REQUIRE(unit->output_format() == fp16());
  Rng rng(StreamId{12});
  int inexact_seen = 0;
  for (std::size_t k : {1u, 4u, 7u, 16u, 33u, 64u}) {
    for (int trial = 0; trial < 400; ++trial) {
      const Case t = random_case(rng, k, true);
      Context ctx;
      const double got = unit->dot(ctx, k, t.a.data(), 1, t.b.data(), 1, t.c);
      const double want = amp_oracle::amp_reference(t.a, t.b, t.c, Partials::fp16);
      INFO("k " << k << " trial " << trial);
      REQUIRE(same(got, want));
      inexact_seen += (ctx.status() & INEXACT) != 0;
    }
  }
  CHECK(inexact_seen > 1000);  // the cases do exercise rounding
}

TEST_CASE("ipu-amp with an fp16 output (f16v4sihoamp last pass): fp32 phases, one rounding to fp16 at the end",
          "[amp]") {
  const auto unit = make_unit(UnitKind::ipu_amp, fp16(), fp16());
  REQUIRE(unit->output_format() == fp16());
  Rng rng(StreamId{13});
  for (int trial = 0; trial < 500; ++trial) {
    const Case t = random_case(rng, 40, true);
    Context ctx;
    const double got = unit->dot(ctx, 40, t.a.data(), 1, t.b.data(), 1, t.c);
    const double want = amp_oracle::to_half(
        static_cast<float>(amp_oracle::amp_reference(t.a, t.b, t.c, Partials::fp32)));
    REQUIRE(same(got, want));
  }
}

TEST_CASE("f32sisoamp (fp32 inputs): one product per phase, each phase rounded to fp32 = a sequential float FMA",
          "[amp]") {
  const auto unit = make_unit(UnitKind::ipu_amp, fp32());
  REQUIRE(unit->input_format() == fp32());
  Rng rng(StreamId{14});
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<double> a(27), b(27);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(rng.normal());
      b[i] = static_cast<float>(rng.normal() * 1e-3);
    }
    const double c = static_cast<float>(rng.normal());
    float want = static_cast<float>(c);
    for (std::size_t i = 0; i < a.size(); ++i)
      want = std::fma(static_cast<float>(a[i]), static_cast<float>(b[i]), want);  // hardware fp32 FMA
    Context ctx;
    REQUIRE(same(unit->dot(ctx, a.size(), a.data(), 1, b.data(), 1, c), want));
  }
}

TEST_CASE("gemm through the AMP: C = A B + C, every element the documented chained dot product", "[amp]") {
  const std::size_t m = 3, n = 5, k = 37;
  Rng rng(StreamId{15});
  std::vector<double> A(m * k), B(k * n), C(m * n), C0;
  for (double& x : A) x = random_half(rng, -4, 4);
  for (double& x : B) x = random_half(rng, -4, 4);
  for (double& x : C) x = random_float_partial(rng);
  C0 = C;
  const auto unit = make_unit(UnitKind::ipu_amp);
  Context ctx;
  unit->gemm(ctx, m, n, k, A.data(), k, B.data(), n, C.data(), n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      std::vector<double> row(A.begin() + static_cast<long>(i * k), A.begin() + static_cast<long>((i + 1) * k));
      std::vector<double> col(k);
      for (std::size_t q = 0; q < k; ++q) col[q] = B[q * n + j];
      REQUIRE(same(C[i * n + j], amp_oracle::amp_reference(row, col, C0[i * n + j], Partials::fp32)));
    }
}

TEST_CASE("ipu-amp-half with esr: stochastic rounding of the partial is unbiased", "[amp][sr]") {
  const auto unit = make_unit(UnitKind::ipu_amp_half);
  FpControl control;
  control.esr = true;

  SECTION("one phase: each result is a neighbour, taken with the distance ratio") {
    // 1 + 2^-12 + 2^-13 = 1 + 0.375 ulp of fp16 at 1: exact in fp32, so the fp32 step is
    // exact and only the fp16 rounding is stochastic.
    const std::vector<double> a{0x1p-6, 0x1p-7, 0, 0}, b{0x1p-6, 0x1p-6, 0, 0};
    Context ctx(control, Rng(StreamId{16}));
    const int runs = 20000;
    int up = 0;
    for (int r = 0; r < runs; ++r) {
      const double v = unit->dot(ctx, 4, a.data(), 1, b.data(), 1, 1.0);
      REQUIRE((v == 1.0 || v == 1.0 + 0x1p-10));
      up += v != 1.0;
    }
    const double p = 0.375, sigma = std::sqrt(p * (1 - p) / runs);
    CHECK(std::fabs(static_cast<double>(up) / runs - p) < 5 * sigma);
  }

  SECTION("a chained dot product: the mean of many runs equals the exact value within 5 sigma") {
    // Inputs k/16 keep every fp32 phase sum exact, so only the fp16 roundings are random.
    Rng data(StreamId{17});
    const std::size_t k = 64;
    std::vector<double> a(k), b(k);
    for (std::size_t i = 0; i < k; ++i) {
      a[i] = static_cast<double>(1 + data.next_u64() % 16) / 16;
      b[i] = static_cast<double>(1 + data.next_u64() % 16) / 16;
    }
    double exact = 0;
    for (std::size_t i = 0; i < k; ++i) exact += a[i] * b[i];  // exact: 8-bit products, small sum
    Context ctx(control, Rng(StreamId{18}));
    const int runs = 4000;
    double sum = 0, sum_sq = 0;
    for (int r = 0; r < runs; ++r) {
      const double v = unit->dot(ctx, k, a.data(), 1, b.data(), 1, 0.0);
      sum += v;
      sum_sq += v * v;
    }
    const double mean = sum / runs, sd = std::sqrt(sum_sq / runs - mean * mean);
    REQUIRE(sd > 0);  // the runs did differ
    CHECK(std::fabs(mean - exact) < 5 * sd / std::sqrt(runs));
  }
}

TEST_CASE("swamping: many small products into a large fp16 partial stagnate with RNE, not with SR", "[amp][sr]") {
  // Partial 2048 (fp16 ulp 2); each phase adds 4 * 0.25 = 1: 2049 is a tie, RNE keeps
  // 2048 forever. The exact result is 2048 + 4096 * 0.25 = 3072.
  const std::size_t k = 4096;
  const std::vector<double> a(k, 0.5), b(k, 0.5);
  const auto half_unit = make_unit(UnitKind::ipu_amp_half);
  Context rne;
  CHECK(half_unit->dot(rne, k, a.data(), 1, b.data(), 1, 2048.0) == 2048.0);

  FpControl control;
  control.esr = true;
  Context sr(control, Rng(StreamId{19}));
  const double stochastic = half_unit->dot(sr, k, a.data(), 1, b.data(), 1, 2048.0);
  // 1024 phases of +-1 steps: standard deviation about 32.
  CHECK(std::fabs(stochastic - 3072.0) < 200.0);

  Context fp32_ctx;
  CHECK(make_unit(UnitKind::ipu_amp)->dot(fp32_ctx, k, a.data(), 1, b.data(), 1, 2048.0) == 3072.0);
}

TEST_CASE("overflow of fp16 partials follows the context's policy (NANOO)", "[amp]") {
  // 65504 + 16 * 16 = 65760 is exact in fp32 and beyond fp16's 65504 (+ half ulp 16).
  const std::vector<double> a{16, 0, 0, 0}, b{16, 0, 0, 0};
  const auto unit = make_unit(UnitKind::ipu_amp_half);
  struct Expect {
    Overflow policy;
    double value;
    Flags flags;
  };
  for (const Expect& e : {Expect{Overflow::nan, std::numeric_limits<double>::quiet_NaN(), OFLO | INV},
                          Expect{Overflow::saturate, 65504.0, OFLO}, Expect{Overflow::inf, kInf, OFLO}}) {
    FpControl control;
    control.overflow = e.policy;
    Context ctx(control);
    const double v = unit->dot(ctx, 4, a.data(), 1, b.data(), 1, 65504.0);
    INFO("policy " << overflow_name(e.policy));
    CHECK(same(v, e.value));
    CHECK((ctx.status() & (OFLO | INV)) == e.flags);
  }
  // The same for the fp16 output after fp32 partials (f16v4sihoamp).
  FpControl nanoo;
  nanoo.overflow = Overflow::nan;
  Context ctx(nanoo);
  CHECK(std::isnan(make_unit(UnitKind::ipu_amp, fp16(), fp16())->dot(ctx, 4, a.data(), 1, b.data(), 1, 65504.0)));
  CHECK((ctx.status() & (OFLO | INV)) == (OFLO | INV));
}

TEST_CASE("traps, NaN and infinity", "[amp]") {
  const auto unit = make_unit(UnitKind::ipu_amp_half);
  const std::vector<double> big{16, 0, 0, 0};

  FpControl trap_overflow;
  trap_overflow.traps = OFLO;
  Context ctx(trap_overflow);
  try {
    (void)unit->dot(ctx, 4, big.data(), 1, big.data(), 1, 65504.0);
    FAIL("no FpException");
  } catch (const FpException& e) {
    CHECK(e.flag() == OFLO);
    CHECK((ctx.status() & OFLO) != 0);
  }

  const std::vector<double> inf_a{kInf, 1, 1, 1}, zero_b{0, 1, 1, 1};
  Context quiet;
  CHECK(std::isnan(unit->dot(quiet, 4, inf_a.data(), 1, zero_b.data(), 1, 0.0)));
  CHECK((quiet.status() & INV) != 0);

  FpControl trap_invalid;
  trap_invalid.traps = INV;
  Context trapping(trap_invalid);
  CHECK_THROWS_AS(unit->dot(trapping, 4, inf_a.data(), 1, zero_b.data(), 1, 0.0), FpException);

  const std::vector<double> nan_a{std::numeric_limits<double>::quiet_NaN(), 1, 1, 1}, ones{1, 1, 1, 1};
  Context nan_ctx;
  CHECK(std::isnan(unit->dot(nan_ctx, 4, nan_a.data(), 1, ones.data(), 1, 0.0)));
  CHECK((nan_ctx.status() & INV) == 0);  // quiet NaN propagates without a flag

  Context inf_ctx;
  CHECK(unit->dot(inf_ctx, 4, inf_a.data(), 1, ones.data(), 1, 1.0) == kInf);
  // inf * 1 + 1 * -inf: inf - inf is invalid.
  const std::vector<double> x{kInf, 1, 0, 0}, y{1, -kInf, 0, 0};
  Context cancel;
  CHECK(std::isnan(unit->dot(cancel, 4, x.data(), 1, y.data(), 1, 0.0)));
  CHECK((cancel.status() & INV) != 0);
}

TEST_CASE("undocumented parameters change results as defined, on crafted inputs", "[amp][config]") {
  SECTION("alignment truncation inside a phase drops bits below 2^(E - alignment_bits)") {
    // Partial 1 (E = 0) and four products 2^-25: exact sum 1 + 2^-23, an fp32 value.
    const std::vector<double> a(4, 0x1p-12), b(4, 0x1p-13);
    AmpConfig cfg = amp_config(PartialsType::float32);
    Context ctx;
    CHECK(amp_dot(ctx, cfg, 4, a.data(), 1, b.data(), 1, 1.0) == 1.0 + 0x1p-23);
    cfg.alignment_bits = 25;  // 2^-25 is kept
    CHECK(amp_dot(ctx, cfg, 4, a.data(), 1, b.data(), 1, 1.0) == 1.0 + 0x1p-23);
    cfg.alignment_bits = 24;  // each 2^-25 truncated to zero
    CHECK(amp_dot(ctx, cfg, 4, a.data(), 1, b.data(), 1, 1.0) == 1.0);
    // Truncation is toward zero in sign-magnitude: -(2^-25 + 2^-26) becomes -2^-25 with
    // 25 bits, so four of them give 1 - 2^-23 (a floor would give 1 - 2^-22).
    const std::vector<double> neg_a(4, -0x1p-12), neg_b(4, 0x1.8p-13);
    cfg.alignment_bits = 25;
    CHECK(amp_dot(ctx, cfg, 4, neg_a.data(), 1, neg_b.data(), 1, 1.0) == 1.0 - 0x1p-23);
  }

  SECTION("rounding after every phase versus once per pass") {
    // One product 2^-24 (half an fp32 ulp at 1) per phase: every phase ties back to 1
    // under RNE, while the unrounded pass sum 1 + 4 * 2^-24 = 1 + 2^-22 is exact.
    std::vector<double> a(16, 0.0), b(16, 0.0);
    for (std::size_t phase = 0; phase < 4; ++phase) a[phase * 4] = b[phase * 4] = 0x1p-12;
    AmpConfig cfg = amp_config(PartialsType::float32);
    Context ctx;
    CHECK(amp_dot(ctx, cfg, 16, a.data(), 1, b.data(), 1, 1.0) == 1.0);
    cfg.round_each_phase = false;
    CHECK(amp_dot(ctx, cfg, 16, a.data(), 1, b.data(), 1, 1.0) == 1.0 + 0x1p-22);
  }

  SECTION("the accumulator rounding can follow the context") {
    // fp32 partials: the default fp32 rounding is RNE whatever the context says.
    const std::vector<double> a{0x1p-12, 0, 0, 0}, b{0x1p-12, 0, 0, 0};
    FpControl upward;
    upward.rounding = Rounding::ru;
    AmpConfig cfg = amp_config(PartialsType::float32);
    Context ctx(upward);
    CHECK(amp_dot(ctx, cfg, 4, a.data(), 1, b.data(), 1, 1.0) == 1.0);
    cfg.accumulator_rounding.reset();
    CHECK(amp_dot(ctx, cfg, 4, a.data(), 1, b.data(), 1, 1.0) == 1.0 + 0x1p-23);
  }
}

TEST_CASE("AMP configurations: the documented ones are accepted, others refused", "[amp][config]") {
  CHECK_THROWS_AS(make_unit(UnitKind::ipu_amp_half, fp32()), std::invalid_argument);  // no fp32-in, half-partials AMP
  CHECK_THROWS_AS(make_unit(UnitKind::ipu_amp, bf16()), std::invalid_argument);
  CHECK_THROWS_AS(make_unit(UnitKind::ipu_amp_half, fp16(), fp32()), std::invalid_argument);
  CHECK_THROWS_AS(make_unit(UnitKind::ipu_amp, fp32(), fp16()), std::invalid_argument);
  AmpConfig bad = amp_config(PartialsType::float32);
  bad.alignment_bits = -2;
  CHECK_THROWS_AS(validate(bad), std::invalid_argument);
  bad = amp_config(PartialsType::float32);
  bad.phases_per_pass = 0;
  CHECK_THROWS_AS(make_amp_unit(bad), std::invalid_argument);
  CHECK(amp_config(PartialsType::float32, fp32()).products_per_pass() == 8);
  CHECK(amp_config(PartialsType::half).products_per_pass() == 16);
  CHECK(partials_type_by_name("half") == PartialsType::half);
  CHECK(std::string(partials_type_name(PartialsType::float32)) == "float");
  CHECK_THROWS_AS(partials_type_by_name("double"), std::invalid_argument);
}
