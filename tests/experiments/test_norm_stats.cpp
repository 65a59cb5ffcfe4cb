// The norm_stats experiment against oracles that share no code with it: the CPU's float
// and _Float16 arithmetic replaying each algorithm (fp16 operations as a float operation
// rounded to _Float16: correct for + - * / of binary16 operands, since 24 >= 2 * 11 + 2,
// Figueroa 1995), and the exact mean and variance in Boost.Multiprecision rationals. The
// error bounds checked are the ones derived in experiments/norm_stats.hpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_int.hpp>
#pragma GCC diagnostic pop

#include "emu/arith.hpp"
#include "emu/format.hpp"
#include "emu/rng.hpp"
#include "experiments/norm_stats.hpp"
#include "tests/run_experiment.hpp"
#include "tests/experiments/sweep_checks.hpp"
#include "tests/sweep/support.hpp"

using roundoff::testing::run_experiment;
namespace ns = roundoff::norm_stats;
using Rational = boost::multiprecision::cpp_rational;
using Int = boost::multiprecision::cpp_int;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const emu::Format kFp16 = emu::format_by_name("fp16");
const emu::Format kFp32 = emu::format_by_name("fp32");

// ---- oracles --------------------------------------------------------------------------

Rational exact(double x) {
  int e = 0;
  const double f = std::frexp(x, &e);  // x = f * 2^e, f * 2^53 an integer
  Rational r{Int(static_cast<long long>(std::ldexp(f, 53)))};
  e -= 53;
  const Int power = boost::multiprecision::pow(Int(2), std::abs(e));
  if (e >= 0) return r * power;
  return r / power;
}
double to_double(const Rational& r) { return r.convert_to<double>(); }

struct ExactStats {
  Rational mean, var;
};
ExactStats exact_stats(const std::vector<double>& x) {
  Rational sum = 0;
  for (double v : x) sum += exact(v);
  ExactStats s;
  s.mean = sum / static_cast<long long>(x.size());
  Rational squares = 0;
  for (double v : x) squares += (exact(v) - s.mean) * (exact(v) - s.mean);
  s.var = squares / static_cast<long long>(x.size());
  return s;
}

// One rounding of a float result into the accumulation type. The volatile store keeps
// the compiler from fusing a float product into the next addition (-mfma is on).
float round_float(float v) {
  volatile float stored = v;
  return stored;
}
float round_half(float v) { return static_cast<float>(static_cast<_Float16>(v)); }
using Rounder = float (*)(float);

// The three algorithms exactly as norm_stats.hpp describes them, in float or _Float16.
ns::Moments naive_oracle(const std::vector<double>& x, Rounder r) {
  float sum = 0, sum_sq = 0;
  for (double v : x) sum = r(sum + static_cast<float>(v));
  for (double v : x) sum_sq = r(sum_sq + r(static_cast<float>(v) * static_cast<float>(v)));
  const auto n = static_cast<float>(x.size());
  const float mean = r(sum / n);
  return {mean, r(r(sum_sq / n) - r(mean * mean))};
}
ns::Moments two_pass_oracle(const std::vector<double>& x, Rounder r) {
  float sum = 0, sum_sq_dev = 0;
  for (double v : x) sum = r(sum + static_cast<float>(v));
  const auto n = static_cast<float>(x.size());
  const float mean = r(sum / n);
  for (double v : x) {
    const float dev = r(static_cast<float>(v) - mean);
    sum_sq_dev = r(sum_sq_dev + r(dev * dev));
  }
  return {mean, r(sum_sq_dev / n)};
}
ns::Moments welford_oracle(const std::vector<double>& x, Rounder r) {
  float mean = 0, m2 = 0;
  for (std::size_t k = 1; k <= x.size(); ++k) {  // k <= 2048: exact in fp16 too
    const auto v = static_cast<float>(x[k - 1]);
    const float delta = r(v - mean);
    mean = r(mean + r(delta / static_cast<float>(k)));
    m2 = r(m2 + r(delta * r(v - mean)));
  }
  return {mean, r(m2 / static_cast<float>(x.size()))};
}
ns::Moments oracle(ns::Algorithm a, const std::vector<double>& x, Rounder r) {
  switch (a) {
    case ns::Algorithm::naive: return naive_oracle(x, r);
    case ns::Algorithm::two_pass: return two_pass_oracle(x, r);
    case ns::Algorithm::welford: return welford_oracle(x, r);
  }
  return {};
}

// ---- the bounds of norm_stats.hpp -----------------------------------------------------

double gamma(double k, double u) { return k * u / (1 - k * u); }

struct Bounds {
  double mean, var;  // on |mean - mu| and |var - V|
};
Bounds bounds(ns::Algorithm a, const std::vector<double>& x, const ExactStats& exact_values, double u) {
  const double n = static_cast<double>(x.size());
  const double var = to_double(exact_values.var);
  const double g = gamma(n + 3, u);
  double sum_abs = 0, max_abs = 0;
  for (double v : x) {
    sum_abs += std::fabs(v);
    max_abs = std::max(max_abs, std::fabs(v));
  }
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  const double range = *hi - *lo;
  // The bounds evaluated in double carry relative errors of a few 2^-53: 1e-9 covers them.
  constexpr double kSlack = 1 + 1e-9;
  if (a == ns::Algorithm::two_pass) {
    const double e = gamma(n, u) * sum_abs / n;
    return {e * kSlack, (g * var + (1 + g) * e * e) * kSlack};
  }
  const double e = gamma(2, u) * range + u * max_abs * (n + 1) / 2;
  return {e * kSlack, (g * var + (1 + g) * (2 * e * range + e * e)) * kSlack};
}

// x_i = fp16(mean + spread * t_i), t_i a fixed sequence of mean 0 and standard deviation
// about 1 (the golden-ratio sequence spread over [-sqrt 3, sqrt 3]).
std::vector<double> golden_vector(double mean, double spread, int n) {
  std::vector<double> x(n);
  for (int i = 0; i < n; ++i) {
    const double t = (std::fmod(0.6180339887498949 * (i + 1), 1.0) - 0.5) * 2 * std::sqrt(3.0);
    x[i] = static_cast<double>(static_cast<_Float16>(mean + spread * t));
  }
  return x;
}

struct Computed {
  ns::Moments m;
  emu::Flags flags = 0;
  std::vector<emu::OpCount> counts;
};
Computed compute(ns::Algorithm a, const emu::Format& acc, const std::vector<double>& x,
                 emu::Overflow overflow = emu::Overflow::inf) {
  emu::FpControl control;
  control.overflow = overflow;
  control.counted = emu::OFLO | emu::INV | emu::DIV0;
  emu::Context ctx(control);
  Computed c;
  c.m = ns::compute(ctx, a, acc, x, 0);
  c.flags = ctx.status();
  c.counts = ctx.counts();
  return c;
}

const emu::OpCount* find_count(const std::vector<emu::OpCount>& counts, const std::string& scope, const std::string& op,
                               emu::Flag flag) {
  for (const emu::OpCount& c : counts)
    if (c.scope == scope && c.op == op && c.flag == flag) return &c;
  return nullptr;
}

// 16 values 290, 291.25, ..., 308.75 (fp16 has ulp 0.25 in [256, 512)): mean 299.375,
// variance 1.25^2 (16^2 - 1) / 12 = 33.203125.
std::vector<double> above_256() {
  std::vector<double> x;
  for (int i = 0; i < 16; ++i) x.push_back(290 + 1.25 * i);
  return x;
}

}  // namespace

TEST_CASE("norm_stats naive fp16: E[x^2] overflows above 256, inf - inf = NaN; two-pass and Welford hold",
          "[norm_stats][golden]") {
  const std::vector<double> x = above_256();
  const ExactStats ex = exact_stats(x);
  REQUIRE(ex.mean == Rational(2395, 8));
  REQUIRE(ex.var == Rational(2125, 64));
  // The oracle: every square is above 65520 (the fp16 overflow threshold under rne) and
  // becomes inf, and so does mean^2; inf/16 - inf is NaN.
  REQUIRE(std::isinf(round_half(290.0f * 290.0f)));
  const ns::Moments half = naive_oracle(x, round_half);
  REQUIRE(std::isnan(half.var));

  const Computed naive = compute(ns::Algorithm::naive, kFp16, x);
  CHECK(std::isnan(naive.m.var));
  CHECK(naive.m.mean == half.mean);
  CHECK((naive.flags & emu::OFLO) != 0);
  CHECK((naive.flags & emu::INV) != 0);
  // Provenance: 16 squares overflowed in naive.sum_sq, the first at element [0, 0] with
  // operands 290 and 290; then mean * mean in naive.var, and the subtraction inf - inf.
  const emu::OpCount* squares = find_count(naive.counts, "naive.sum_sq", "mul", emu::OFLO);
  REQUIRE(squares);
  CHECK(squares->count == 16);
  CHECK(squares->first_element.to_string() == "[0, 0]");
  CHECK(squares->first_operands == std::vector<double>{290, 290});
  CHECK(std::isinf(squares->first_result));
  const emu::OpCount* mean_sq = find_count(naive.counts, "naive.var", "mul", emu::OFLO);
  REQUIRE(mean_sq);
  CHECK(mean_sq->count == 1);
  CHECK(mean_sq->first_element.to_string() == "[0]");
  const emu::OpCount* inv = find_count(naive.counts, "naive.var", "sub", emu::INV);
  REQUIRE(inv);
  CHECK(inv->count == 1);
  CHECK(std::isinf(inv->first_operands.at(0)));
  CHECK(naive.counts.size() == 3);

  for (ns::Algorithm a : {ns::Algorithm::two_pass, ns::Algorithm::welford}) {
    INFO(ns::algorithm_name(a));
    const Computed c = compute(a, kFp16, x);
    const ns::Moments o = oracle(a, x, round_half);
    CHECK(c.m.mean == o.mean);
    CHECK(c.m.var == o.var);
    // The bound's assumptions: nothing overflowed or underflowed.
    REQUIRE((c.flags & (emu::OFLO | emu::UFLO | emu::INV)) == 0);
    CHECK(c.counts.empty());
    const Bounds b = bounds(a, x, ex, kFp16.unit_roundoff());
    const double var_error = std::fabs(to_double(exact(c.m.var) - ex.var));
    const double mean_error = std::fabs(to_double(exact(c.m.mean) - ex.mean));
    INFO("var " << c.m.var << " error " << var_error << " bound " << b.var << "; mean error " << mean_error
                << " bound " << b.mean);
    CHECK(mean_error <= b.mean);
    CHECK(var_error <= b.var);
    // The two-pass bound says something here (relative error below 1). Welford's a priori
    // bound is 1.5 V on this vector (the running mean's rounding, u X (n + 1) / 2, is
    // weighed against R): true, but loose; its error is 0.0156 = 4.7e-4 V.
    if (a == ns::Algorithm::two_pass) CHECK(b.var < to_double(ex.var));
  }
}

TEST_CASE("norm_stats fp16 overflow policies: saturation turns the NaN into a large negative variance",
          "[norm_stats][golden]") {
  const std::vector<double> x = above_256();
  // Saturating (the IPU with NANOO off): every square is 65504, so is their sum, and
  // mean^2; q / 16 = 4094 and fl(4094 - 65504) = fl(-61410) = -61408 (ulp 32 there).
  const Computed sat = compute(ns::Algorithm::naive, kFp16, x, emu::Overflow::saturate);
  CHECK(sat.m.var == -61408);
  CHECK((sat.flags & emu::OFLO) != 0);
  CHECK((sat.flags & emu::INV) == 0);
  // NaN on overflow (the IPU's NANOO): the first square is NaN, with INV.
  const Computed nan = compute(ns::Algorithm::naive, kFp16, x, emu::Overflow::nan);
  CHECK(std::isnan(nan.m.var));
  CHECK((nan.flags & emu::INV) != 0);
}

TEST_CASE("norm_stats naive: negative variances from cancellation, in fp32 and in fp16", "[norm_stats][golden]") {
  SECTION("fp32: five copies of 1833") {
    // Exact variance 0. c^2 = 3,359,889 (22 bits) and the partial sums up to 4 c^2 are
    // exact in fp32, but 5 c^2 = 16,799,445 lies above 2^24, where the ulp is 2: a tie,
    // rounded to even, down to 16,799,444. The sum 5 c = 9165 and the mean 1833 are
    // exact, so E[x^2] = fl(16,799,444 / 5) = 3,359,888.75 (ulp 0.25) < E[x]^2 = c^2:
    // var = -0.25.
    const std::vector<double> x(5, 1833.0);
    const ns::Moments o = naive_oracle(x, round_float);
    REQUIRE(o.mean == 1833.0f);
    REQUIRE(o.var == -0.25f);
    REQUIRE(exact_stats(x).var == 0);
    const Computed c = compute(ns::Algorithm::naive, kFp32, x);
    CHECK(c.m.mean == 1833.0);
    CHECK(c.m.var == -0.25);
    CHECK(compute(ns::Algorithm::two_pass, kFp32, x).m.var == 0);
    CHECK(compute(ns::Algorithm::welford, kFp32, x).m.var == 0);
  }
  SECTION("fp16: three copies of 1.23046875") {
    // c = 1260 * 2^-10; c^2 rounds to 1550 * 2^-10 (fp16, ulp 2^-10 in [1, 2)); two of
    // them sum exactly to 3.02734375, the third gives 4.541015625 = 1162.5 * 2^-8: a tie
    // in [4, 8), rounded to even, down to 4.5390625. The sum 3 c and the mean c are
    // exact, so E[x^2] = fl(4.5390625 / 3) = 1549 * 2^-10 < fl(c^2) = 1550 * 2^-10:
    // var = -2^-10.
    const std::vector<double> x(3, 1.23046875);
    const ns::Moments o = naive_oracle(x, round_half);
    REQUIRE(o.var == -0x1p-10f);
    const Computed c = compute(ns::Algorithm::naive, kFp16, x);
    CHECK(c.m.mean == 1.23046875);
    CHECK(c.m.var == -0x1p-10);
    CHECK(compute(ns::Algorithm::two_pass, kFp16, x).m.var == 0);
    CHECK(compute(ns::Algorithm::welford, kFp16, x).m.var == 0);
  }
}

TEST_CASE("norm_stats two-pass and Welford: equal to the CPU's float/_Float16 and within their bounds",
          "[norm_stats][golden]") {
  struct Case {
    const emu::Format* acc;
    Rounder rounder;
    double mean, spread;
    int n;
  };
  // fp16 cases keep n * mean and n * var below 65504 (no overflow: the bounds' premise).
  const Case cases[] = {
      {&kFp32, round_float, 100, 1, 64},     {&kFp32, round_float, 1000, 1, 256},
      {&kFp32, round_float, 1000, 10, 1024}, {&kFp32, round_float, 10000, 50, 2048},
      {&kFp16, round_half, 10, 1, 64},       {&kFp16, round_half, 100, 3, 64},
      {&kFp16, round_half, 300, 10, 16},     {&kFp16, round_half, 1000, 20, 32},
  };
  int naive_outside = 0;
  for (const Case& k : cases) {
    const std::vector<double> x = golden_vector(k.mean, k.spread, k.n);
    const ExactStats ex = exact_stats(x);
    const double u = k.acc->unit_roundoff();
    for (ns::Algorithm a : {ns::Algorithm::two_pass, ns::Algorithm::welford}) {
      INFO(k.acc->name() << " " << ns::algorithm_name(a) << " mean " << k.mean << " spread " << k.spread << " n "
                         << k.n);
      const Computed c = compute(a, *k.acc, x);
      const ns::Moments o = oracle(a, x, k.rounder);
      CHECK(c.m.mean == o.mean);
      CHECK(c.m.var == o.var);
      REQUIRE((c.flags & (emu::OFLO | emu::UFLO | emu::INV)) == 0);
      CHECK(c.m.var >= 0);
      const Bounds b = bounds(a, x, ex, u);
      const double var_error = std::fabs(to_double(exact(c.m.var) - ex.var));
      INFO("var error " << var_error << " bound " << b.var << " exact var " << to_double(ex.var));
      CHECK(std::fabs(to_double(exact(c.m.mean) - ex.mean)) <= b.mean);
      CHECK(var_error <= b.var);
      if (k.acc == &kFp32) CHECK(b.var < 0.1 * to_double(ex.var));  // informative for fp32
    }
    // Naive on the same vector, for contrast (fp32 only: no overflow there).
    if (k.acc == &kFp32) {
      const Computed c = compute(ns::Algorithm::naive, *k.acc, x);
      CHECK(c.m.var == naive_oracle(x, k.rounder).var);
      if (std::fabs(to_double(exact(c.m.var) - ex.var)) > bounds(ns::Algorithm::two_pass, x, ex, u).var)
        ++naive_outside;
    }
  }
  // Naive misses the two-pass bound on at least three of the four fp32 vectors.
  CHECK(naive_outside >= 3);
}

namespace {

// The vectors a run draws, regenerated from the documented streams: vector j is
// fp16(mean + spread * z), z the normals of stream (seed, 0, replica, 1 + j).
std::vector<std::vector<double>> run_vectors(std::uint64_t seed, std::uint32_t replica, double mean, double spread,
                                             int length, int vectors) {
  std::vector<std::vector<double>> out;
  for (int j = 0; j < vectors; ++j) {
    emu::Rng data(emu::StreamId{seed, 0, replica, static_cast<std::uint16_t>(1 + j)});
    std::vector<double> x(length);
    for (double& v : x) v = static_cast<double>(static_cast<_Float16>(mean + spread * data.normal()));
    out.push_back(std::move(x));
  }
  return out;
}

double relative(const Rational& exact_value, double computed) {
  if (!std::isfinite(computed)) return kInf;
  const Rational error = abs(exact(computed) - exact_value);
  if (error == 0) return 0;
  return exact_value == 0 ? kInf : to_double(error / abs(exact_value));
}

// The report of the trap that ends a run at these parameters.
emu::TrapReport trap_of(const std::map<std::string, roundoff::ParamValue>& p) {
  try {
    run_experiment("norm_stats", p);
  } catch (const emu::FpException& e) {
    return e.report();
  }
  FAIL("the run did not trap");
  return {};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

}  // namespace

TEST_CASE("norm_stats metrics equal the oracle's on the run's own vectors", "[norm_stats]") {
  constexpr std::uint64_t kSeed = 77;
  constexpr std::uint32_t kReplica = 3;
  constexpr int kLength = 300, kVectors = 6;
  struct Case {
    const char* algorithm;
    const char* acc;
    Rounder rounder;
    double mean, spread;
  };
  const Case cases[] = {
      {"naive", "fp32", round_float, 1000, 0.5},   {"two_pass", "fp32", round_float, 1000, 0.5},
      {"welford", "fp32", round_float, 1000, 0.5}, {"naive", "fp16", round_half, 10, 0.1},
      {"two_pass", "fp16", round_half, 10, 0.1},   {"welford", "fp16", round_half, 10, 0.1},
  };
  for (const Case& k : cases) {
    INFO(k.algorithm << " " << k.acc);
    const auto vectors = run_vectors(kSeed, kReplica, k.mean, k.spread, kLength, kVectors);
    std::vector<double> mean_errors, var_errors, exact_vars;
    int negative = 0;
    for (const auto& x : vectors) {
      const ExactStats ex = exact_stats(x);
      const ns::Moments o = oracle(ns::algorithm_by_name(k.algorithm), x, k.rounder);
      negative += o.var < 0;
      mean_errors.push_back(relative(ex.mean, o.mean));
      var_errors.push_back(relative(ex.var, o.var));
      exact_vars.push_back(to_double(ex.var));
    }
    const auto r = run_experiment("norm_stats",
                                  {{"algorithm", k.algorithm},
                                   {"accumulation", k.acc},
                                   {"mean", k.mean},
                                   {"spread", k.spread},
                                   {"length", std::int64_t{kLength}},
                                   {"vectors", std::int64_t{kVectors}}},
                                  emu::StreamId{kSeed, 12345, kReplica, 0});
    const auto& m = r.metrics;
    CHECK(m.at("frac_negative_var") == Approx(negative / double(kVectors)));
    CHECK(m.at("frac_nonfinite_var") == 0);
    CHECK(m.at("frac_oflo") == 0);
    CHECK(m.at("mean_rel_error") == Approx(*std::max_element(mean_errors.begin(), mean_errors.end())).epsilon(1e-12));
    CHECK(m.at("mean_rel_error_median") == Approx(median(mean_errors)).epsilon(1e-12));
    CHECK(m.at("var_rel_error") == Approx(*std::max_element(var_errors.begin(), var_errors.end())).epsilon(1e-12));
    CHECK(m.at("var_rel_error_median") == Approx(median(var_errors)).epsilon(1e-12));
    CHECK(m.at("exact_var_median") == Approx(median(exact_vars)).epsilon(1e-12));
    if (std::string(k.algorithm) != "naive") CHECK(m.at("frac_negative_var") == 0);
  }
}

TEST_CASE("norm_stats: naive fp16 above 256 counts every square and traps at the first", "[norm_stats]") {
  // mean 300, spread 1: the inputs lie within 300 +- 9 (Box-Muller normals from 53-bit
  // uniforms stay below 8.6 in magnitude), so every one of the 4 x 32 squares overflows.
  const std::map<std::string, roundoff::ParamValue> p = {{"accumulation", "fp16"},
                                                         {"mean", 300.0},
                                                         {"length", std::int64_t{32}},
                                                         {"vectors", std::int64_t{4}}};
  auto with = [&](const char* mode) {
    auto q = p;
    q["fp_exceptions"] = mode;
    return q;
  };
  const auto off = run_experiment("norm_stats", with("off"));
  CHECK(off.fp_counts.empty());
  CHECK(off.metrics.at("frac_oflo") == 1);
  CHECK(off.metrics.at("frac_inv") == 1);
  CHECK(off.metrics.at("frac_nonfinite_var") == 1);
  CHECK(off.metrics.at("var_rel_error") == kInf);
  CHECK((off.flags & (emu::OFLO | emu::INV)) == (emu::OFLO | emu::INV));

  const auto counted = run_experiment("norm_stats", with("count"));
  CHECK(counted.metrics == off.metrics);
  const emu::OpCount* squares = find_count(counted.fp_counts, "naive.sum_sq", "mul", emu::OFLO);
  REQUIRE(squares);
  CHECK(squares->count == 4 * 32);
  CHECK(squares->first_element.to_string() == "[0, 0]");
  const auto first = run_vectors(1, 0, 300, 1, 1, 1)[0][0];  // stream {1, 0, 0, 0} as run_experiment's
  CHECK(squares->first_operands == std::vector<double>{first, first});
  REQUIRE(find_count(counted.fp_counts, "naive.var", "sub", emu::INV));
  CHECK(find_count(counted.fp_counts, "naive.var", "sub", emu::INV)->count == 4);
  CHECK_FALSE(find_count(counted.fp_counts, "input", "convert", emu::OFLO));

  const emu::TrapReport oflo = trap_of(with("trap"));
  CHECK(oflo.flag == emu::OFLO);
  CHECK(oflo.scope == "naive.sum_sq");
  CHECK(oflo.op == "mul");
  CHECK(oflo.element.to_string() == "[0, 0]");
  CHECK(oflo.operands == std::vector<double>{first, first});
  CHECK(std::isinf(oflo.result));
  // Naive is one pass: at length 512 the running sum overflows too (near element 218,
  // 218 x 300 > 65504), but the square of element 0 comes first.
  auto long_vectors = with("trap");
  long_vectors["length"] = std::int64_t{512};
  const emu::TrapReport first_of_two = trap_of(long_vectors);
  CHECK(first_of_two.scope == "naive.sum_sq");
  CHECK(first_of_two.element.to_string() == "[0, 0]");
  long_vectors["fp_exceptions"] = "count";
  const auto both = run_experiment("norm_stats", long_vectors);
  REQUIRE(find_count(both.fp_counts, "naive.sum", "add", emu::OFLO));
  CHECK(find_count(both.fp_counts, "naive.sum", "add", emu::OFLO)->count == 4);  // once per vector: then inf
  // Only INV enabled: the run traps at the subtraction inf - inf.
  auto only_inv = with("trap");
  only_inv["oflo"] = false;
  const emu::TrapReport inv = trap_of(only_inv);
  CHECK(inv.flag == emu::INV);
  CHECK(inv.scope == "naive.var");
  CHECK(inv.op == "sub");
  CHECK(inv.element.to_string() == "[0]");

  // Two-pass at the same point: the sum of 32 values near 300 (9600) and the deviations
  // stay finite; only at length 512 (sum near 153,600) does the sum overflow.
  auto two_pass = with("count");
  two_pass["algorithm"] = "two_pass";
  const auto short_run = run_experiment("norm_stats", two_pass);
  CHECK(short_run.fp_counts.empty());
  CHECK(short_run.metrics.at("frac_oflo") == 0);
  two_pass["length"] = std::int64_t{512};
  const auto long_run = run_experiment("norm_stats", two_pass);
  REQUIRE(find_count(long_run.fp_counts, "two_pass.sum", "add", emu::OFLO));
  CHECK(long_run.metrics.at("frac_oflo") == 1);
}

TEST_CASE("norm_stats: common random numbers and parameter checks", "[norm_stats]") {
  // Same (seed, replica): the same vectors whatever the point, algorithm or accumulation.
  const std::map<std::string, roundoff::ParamValue> base = {{"mean", 100.0}, {"length", std::int64_t{64}}};
  const double reference = run_experiment("norm_stats", base, {5, 0, 2, 0}).metrics.at("exact_var_median");
  for (const char* algorithm : {"naive", "two_pass", "welford"})
    for (const char* acc : {"fp16", "fp32"}) {
      auto p = base;
      p["algorithm"] = algorithm;
      p["accumulation"] = acc;
      CHECK(run_experiment("norm_stats", p, {5, 17, 2, 0}).metrics.at("exact_var_median") == reference);
    }
  CHECK(run_experiment("norm_stats", base, {5, 0, 3, 0}).metrics.at("exact_var_median") != reference);

  CHECK_THROWS_WITH(run_experiment("norm_stats", {{"format", "fp64"}}),
                    Catch::Contains("at most 24") && Catch::Contains("fp64"));
  CHECK_THROWS_WITH(run_experiment("norm_stats", {{"mean", 70000.0}}), Catch::Contains("within the range of fp16"));
  CHECK_NOTHROW(run_experiment("norm_stats", {{"format", "bf16"}, {"mean", 70000.0}, {"length", std::int64_t{8}}}));
  CHECK_THROWS(ns::algorithm_by_name("kahan"));
}

TEST_CASE("norm_stats through build/sweep: -j1 and -j2 identical; the shipped config plans", "[norm_stats][sweep]") {
  sweep_test::TempDir dir;
  experiments_test::check_threads_agree_and_shipped_config_plans(
      dir,
      "experiment: norm_stats\nseed: 11\nreplicas: 3\ngrid:\n  accumulation: [fp16, fp32]\n"
      "  algorithm: [naive, two_pass, welford]\n  mean: [10, 300]\n  length: 64\n"
      "  vectors: 4\n  fp_exceptions: count\n",
      "norm_stats.yaml");
  CHECK(sweep_test::dataset_shape(dir / "one.h5", "metrics/var_rel_error") == std::vector<hsize_t>{12, 3});
}
