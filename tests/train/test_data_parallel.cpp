// Data-parallel training and gradient accumulation (train's dp_replicas, allreduce_*,
// esr modes, grad_accum, accum_format): the all-reduce's summation orders against an
// oracle of the CPU's own fp16 and fp32 arithmetic, ulp distances against fp16 bit
// patterns, replicas that stay bit-identical or drift apart by esr mode, gradient
// accumulation against one big batch, and fp16 accumulation buffers that overflow
// where fp32 buffers do not.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "experiments/nn/data_parallel.hpp"
#include "experiments/nn/mlp.hpp"
#include "tests/run_experiment.hpp"

using namespace roundoff;
using namespace roundoff::train;

namespace {

// ---- Oracles of the all-reduce: the CPU's binary16 and binary32 ------------------------

// Sums the values in the given order, each partial sum rounded into fp16 by the CPU's
// _Float16 conversion of the exact sum (two fp16 values add exactly in double).
double fp16_sum_in_order(const std::vector<double>& values, const std::vector<std::size_t>& order) {
  _Float16 acc = static_cast<_Float16>(values[order[0]]);
  for (std::size_t k = 1; k < order.size(); ++k)
    acc = static_cast<_Float16>(static_cast<double>(acc) + values[order[k]]);
  return static_cast<double>(acc);
}
// The same in binary32: C++ float addition (SSE, round to nearest even).
double fp32_sum_in_order(const std::vector<double>& values, const std::vector<std::size_t>& order) {
  float acc = static_cast<float>(values[order[0]]);
  for (std::size_t k = 1; k < order.size(); ++k) acc = acc + static_cast<float>(values[order[k]]);
  return static_cast<double>(acc);
}

// The ring's order for a value in chunk c: replicas c, c+1, ..., c+R-1 (mod R).
std::vector<std::size_t> ring_order(std::size_t c, std::size_t replicas) {
  std::vector<std::size_t> order;
  for (std::size_t k = 0; k < replicas; ++k) order.push_back((c + k) % replicas);
  return order;
}
// The chunk of value i, written independently of ring_chunk: the first n mod R chunks
// hold ceil(n / R) values, the others floor(n / R).
std::size_t chunk_of(std::size_t i, std::size_t n, std::size_t replicas) {
  const std::size_t big = (n + replicas - 1) / replicas, small = n / replicas, bigs = n % replicas;
  if (i < bigs * big) return i / big;
  return bigs + (i - bigs * big) / small;
}
// A pairwise tree over replicas [lo, lo + size) (size a power of two), missing replicas
// (>= R) left out: sum(lo half) + sum(hi half), each partial sum rounded by `round2`.
double tree_sum(const std::vector<double>& v, std::size_t lo, std::size_t size,
                const std::function<double(double, double)>& round2) {
  if (size == 1) return v[lo];
  const std::size_t half = size / 2;
  const double left = tree_sum(v, lo, half, round2);
  if (lo + half >= v.size()) return left;
  return round2(left, tree_sum(v, lo + half, half, round2));
}
double fp16_add(double a, double b) { return static_cast<double>(static_cast<_Float16>(a + b)); }
double fp32_add(double a, double b) { return static_cast<double>(static_cast<float>(a) + static_cast<float>(b)); }

// Runs all_reduce on copies of `values` (values[r][i]) with one context per replica and
// checks that every replica ends with the same sum; returns replica 0's.
std::vector<double> reduce(std::vector<std::vector<double>> values, const emu::Format& f, AllReduceOrder order) {
  std::vector<emu::Context> contexts(values.size());
  std::vector<std::vector<double>*> copies;
  std::vector<emu::Context*> ctx;
  for (std::size_t r = 0; r < values.size(); ++r) {
    copies.push_back(&values[r]);
    ctx.push_back(&contexts[r]);
  }
  all_reduce(copies, f, order, ctx);
  for (const std::vector<double>& v : values) REQUIRE(v == values[0]);
  return values[0];
}

using Overrides = std::map<std::string, ParamValue>;
using Metrics = std::map<std::string, double>;
ParamValue s(const char* text) { return std::string(text); }
Metrics run_train(const Overrides& p) { return testing::run_experiment("train", p, emu::StreamId{7, 0, 0, 0}).metrics; }

// Synthetic clusters, standardised, for Trainers built directly.
std::shared_ptr<data::Split> synthetic(int samples, int features, int classes) {
  auto d = std::make_shared<data::Split>(data::split(data::make_synthetic({samples, features, classes, 1.5, 3}), 0.25, 3));
  data::standardise(*d);
  return d;
}

// An MLP with one hidden layer of 16, batch 32, the given update rule.
TrainSpec small_mlp(UpdateRule rule) {
  TrainSpec spec;
  spec.hidden = {16};
  spec.rule = rule;
  spec.batch = 32;
  return spec;
}

// Every stored array of a replica's trainable tensors equals replica 0's, bit for bit.
bool replicas_bit_identical(const Trainer& t) {
  const auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
  };
  for (std::size_t r = 1; r < t.replica_count(); ++r)
    for (std::size_t k = 0; k < t.params().size(); ++k) {
      const Param& p0 = *t.replica_params(0)[k].param;
      const Param& p = *t.replica_params(r)[k].param;
      if (!same(p0.value, p.value) || !same(p0.master, p.master) || !same(p0.m, p.m) || !same(p0.v, p.v) ||
          !same(p0.compensation, p.compensation))
        return false;
    }
  return true;
}

}  // namespace

TEST_CASE("all-reduce: a hand-worked fp16 case where ring and tree give different sums", "[train][dp]") {
  // Four replicas, four values (one per ring chunk); replica 0 holds 1024 at every
  // position, replicas 1..3 hold 0.5. The exact sum is 1025.5; fp16's ulp at 1024 is 1.
  //  ring chunk 0, order 0 1 2 3: 1024 + 0.5 = 1024.5 -> 1024 (tie to even), twice more -> 1024
  //  ring chunk 1, order 1 2 3 0: 0.5 + 0.5 = 1, + 0.5 = 1.5, + 1024 = 1025.5 -> 1026 (tie to even)
  //  ring chunk 2, order 2 3 0 1: 1, + 1024 = 1025, + 0.5 = 1025.5 -> 1026
  //  ring chunk 3, order 3 0 1 2: 1024.5 -> 1024, 1024.5 -> 1024, -> 1024
  //  tree: (1024 + 0.5) + (0.5 + 0.5) = 1024 + 1 = 1025
  //  fp32: every partial sum exact, 1025.5
  const std::vector<std::vector<double>> values = {
      {1024, 1024, 1024, 1024}, {0.5, 0.5, 0.5, 0.5}, {0.5, 0.5, 0.5, 0.5}, {0.5, 0.5, 0.5, 0.5}};
  CHECK(reduce(values, emu::fp16(), AllReduceOrder::ring) == std::vector<double>{1024, 1026, 1026, 1024});
  CHECK(reduce(values, emu::fp16(), AllReduceOrder::tree) == std::vector<double>{1025, 1025, 1025, 1025});
  CHECK(reduce(values, emu::fp32(), AllReduceOrder::ring) == std::vector<double>(4, 1025.5));
  CHECK(reduce(values, emu::fp32(), AllReduceOrder::tree) == std::vector<double>(4, 1025.5));
}

TEST_CASE("all-reduce: ring and tree against the CPU's fp16 and fp32 sums in their orders", "[train][dp]") {
  std::mt19937_64 gen(11);
  std::uniform_int_distribution<int> exponent(-14, 10);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  for (std::size_t replicas : {2u, 3u, 4u, 5u, 7u, 8u})
    for (std::size_t n : {1u, 5u, 13u, 64u}) {
      // fp16 values over a wide range of magnitudes, so that the order matters.
      std::vector<std::vector<double>> values(replicas, std::vector<double>(n));
      for (auto& v : values)
        for (double& x : v)
          x = static_cast<double>(static_cast<_Float16>(std::ldexp(mantissa(gen), exponent(gen))));
      for (const bool half : {true, false}) {
        const emu::Format& f = half ? emu::fp16() : emu::fp32();
        const std::vector<double> ring = reduce(values, f, AllReduceOrder::ring);
        const std::vector<double> tree = reduce(values, f, AllReduceOrder::tree);
        std::size_t ring_differs_from_tree = 0;
        std::size_t size = 1;
        while (size < replicas) size *= 2;
        for (std::size_t i = 0; i < n; ++i) {
          std::vector<double> column(replicas);
          for (std::size_t r = 0; r < replicas; ++r) column[r] = values[r][i];
          const std::vector<std::size_t> order = ring_order(chunk_of(i, n, replicas), replicas);
          INFO("R = " << replicas << ", n = " << n << ", value " << i << (half ? ", fp16" : ", fp32"));
          CHECK(ring[i] == (half ? fp16_sum_in_order(column, order) : fp32_sum_in_order(column, order)));
          CHECK(tree[i] == tree_sum(column, 0, size, half ? fp16_add : fp32_add));
          ring_differs_from_tree += ring[i] != tree[i];
        }
        // With R > 2 the orders differ, and over 64 values of this spread some sums do.
        if (half && n == 64 && replicas > 2) CHECK(ring_differs_from_tree > 0);
      }
    }
}

TEST_CASE("all-reduce: chunks, inputs rounded into the format first, one replica untouched", "[train][dp]") {
  // 10 values over 4 replicas: 3, 3, 2, 2.
  CHECK(ring_chunk(10, 4, 0).begin == 0);
  CHECK(ring_chunk(10, 4, 0).end == 3);
  CHECK(ring_chunk(10, 4, 1).end == 6);
  CHECK(ring_chunk(10, 4, 2).end == 8);
  CHECK(ring_chunk(10, 4, 3).end == 10);
  // 2 values over 4 replicas: chunks 2 and 3 are empty.
  CHECK(ring_chunk(2, 4, 2).begin == ring_chunk(2, 4, 2).end);
  // Each replica's value is rounded into the format before the sum: 1 + 2^-11 (a tie in
  // fp16, whose ulp in [1, 2) is 2^-10) becomes 1, and 1 + 2^-11 = 1.00048828125 is a tie
  // again: 1. Added unrounded, (1 + 2^-11) + 2^-11 = 1 + 2^-10 would be exact.
  const double tie = 1.0 + std::ldexp(1.0, -11);
  for (const AllReduceOrder order : {AllReduceOrder::ring, AllReduceOrder::tree})
    CHECK(reduce({{tie}, {std::ldexp(1.0, -11)}}, emu::fp16(), order) == std::vector<double>{1.0});
  // One replica: nothing is rounded, even a value outside the format.
  CHECK(reduce({{0.1}}, emu::fp16(), AllReduceOrder::ring) == std::vector<double>{0.1});
}

TEST_CASE("ulp_distance counts fp16 encodings between two values, as the CPU's bit patterns do", "[train][dp]") {
  // The oracle: _Float16's own bits, sign-magnitude mapped onto a signed line.
  auto line = [](double v) {
    const _Float16 h = static_cast<_Float16>(v);
    std::uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    const int magnitude = bits & 0x7fff;
    return (bits & 0x8000) ? -magnitude : magnitude;
  };
  std::vector<double> finite;
  for (std::uint32_t bits = 0; bits < 0x10000; bits += 37) {
    const auto b = static_cast<std::uint16_t>(bits);
    _Float16 h;
    std::memcpy(&h, &b, sizeof h);
    if (std::isfinite(static_cast<double>(h))) finite.push_back(static_cast<double>(h));
  }
  for (std::size_t i = 0; i < finite.size(); i += 3)
    for (std::size_t j = 0; j < finite.size(); j += 5)
      REQUIRE(ulp_distance(emu::fp16(), finite[i], finite[j]) == std::abs(line(finite[i]) - line(finite[j])));
  CHECK(ulp_distance(emu::fp16(), 1.0, 1.0 + std::ldexp(1.0, -10)) == 1);
  CHECK(ulp_distance(emu::fp16(), 1.0 - std::ldexp(1.0, -11), 1.0 + std::ldexp(1.0, -10)) == 2);
  CHECK(ulp_distance(emu::fp16(), -std::ldexp(1.0, -24), std::ldexp(1.0, -24)) == 2);  // -0 and +0 are one value
  CHECK(ulp_distance(emu::fp16(), -0.0, 0.0) == 0);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK(ulp_distance(emu::fp16(), nan, nan) == 0);
  CHECK(ulp_distance(emu::fp16(), 65504.0, inf) == inf);
  CHECK(ulp_distance(emu::fp32(), 1.0, 1.0 + std::ldexp(1.0, -23) * 5) == 5);
}

TEST_CASE("ReplicaDivergence: spread in ulps and relative, fraction of values that differ", "[train][dp]") {
  ReplicaDivergence d;
  const std::vector<double> a = {1.0, 2.0, 0.0, -4.0}, b = {1.0, 2.0 + std::ldexp(1.0, -9), 0.0, -4.0},
                            c = {1.0, 2.0 - std::ldexp(1.0, -10), 0.0, -4.0};
  const std::vector<const std::vector<double>*> copies = {&a, &b, &c};
  d.add(emu::fp16(), copies);
  CHECK(d.values == 4);
  CHECK(d.differing == 1);
  CHECK(d.frac_differing() == 0.25);
  CHECK(d.max_ulps == 2);  // 2 - 2^-10 -> 2 (fp16's ulp below 2 is 2^-10) -> 2 + 2^-9 (above 2: 2^-9)
  CHECK(d.max_rel == (std::ldexp(1.0, -9) + std::ldexp(1.0, -10)) / (2.0 + std::ldexp(1.0, -9)));
}

TEST_CASE("replicas stay bit-identical under esr off and replica_identical_only, and drift apart under on",
          "[train][dp]") {
  const auto data = synthetic(640, 16, 5);
  for (const UpdateRule rule : {UpdateRule::fp16_rn, UpdateRule::fp16_sr, UpdateRule::fp32_master}) {
    std::map<EsrMode, ReplicaDivergence> by_mode;
    for (const EsrMode mode : {EsrMode::off, EsrMode::replica_identical_only, EsrMode::on}) {
      TrainSpec spec = small_mlp(rule);
      spec.optimizer.kind = OptimizerKind::momentum;
      spec.lr = 0.05;
      spec.loss_scale = LossScaleKind::constant;
      spec.scale = 256.0;
      spec.esr = mode;
      spec.dp_replicas = 4;
      spec.allreduce_format = emu::fp16();
      Trainer t(spec, data, 1, 0, emu::StreamId{1, 0, 0, 3});
      for (int i = 0; i < 30; ++i) t.step();
      INFO("update " << kUpdateRuleNames[static_cast<int>(rule)] << ", esr " << kEsrModeNames[static_cast<int>(mode)]);
      by_mode[mode] = t.replica_divergence();
      if (mode == EsrMode::on) {
        CHECK_FALSE(replicas_bit_identical(t));
      } else {
        CHECK(replicas_bit_identical(t));
        CHECK(by_mode[mode].max_ulps == 0);
        CHECK(by_mode[mode].differing == 0);
      }
    }
    // Under on every replica rounds with its own random bits: the stored states part.
    CHECK(by_mode[EsrMode::on].frac_differing() > 0.2);
    CHECK(by_mode[EsrMode::on].max_ulps >= 2);
    CHECK(by_mode[EsrMode::on].max_rel > 0);
  }
  // The experiment's metrics say the same.
  const Overrides base{{"update", s("fp16-rn")}, {"dp_replicas", std::int64_t{4}}, {"samples", std::int64_t{400}},
                       {"epochs", std::int64_t{2}}, {"loss_scale", s("256")}};
  for (const char* mode : {"off", "replica_identical_only"}) {
    Overrides o = base;
    o["esr"] = s(mode);
    const Metrics m = run_train(o);
    INFO("esr " << mode);
    CHECK(m.at("replica_max_ulp_diff") == 0);
    CHECK(m.at("replica_max_rel_diff") == 0);
    CHECK(m.at("replica_frac_differ") == 0);
  }
  Overrides on = base;
  on["esr"] = s("on");
  const Metrics m = run_train(on);
  CHECK(m.at("replica_max_ulp_diff") >= 2);
  CHECK(m.at("replica_frac_differ") > 0.2);
}

TEST_CASE("esr replica_identical_only rounds stochastically in the update only", "[train][dp]") {
  // One replica: the first step's loss comes from the initial weights through the
  // forward pass, which rounds to nearest under off and replica_identical_only (equal
  // losses) and stochastically under on. The updates after it round stochastically under
  // replica_identical_only, so its weights leave off's.
  const auto data = synthetic(320, 16, 5);
  std::map<EsrMode, std::unique_ptr<Trainer>> t;
  std::map<EsrMode, double> first_loss;
  for (const EsrMode mode : {EsrMode::off, EsrMode::replica_identical_only, EsrMode::on}) {
    TrainSpec spec = small_mlp(UpdateRule::fp16_rn);
    spec.esr = mode;
    t[mode] = std::make_unique<Trainer>(spec, data, 1, 0, emu::StreamId{1, 0, 0, 3});
    first_loss[mode] = t[mode]->step().loss;
    for (int i = 0; i < 5; ++i) t[mode]->step();
  }
  CHECK(first_loss[EsrMode::off] == first_loss[EsrMode::replica_identical_only]);
  CHECK(first_loss[EsrMode::on] != first_loss[EsrMode::off]);
  CHECK(t[EsrMode::off]->params()[1].param->value != t[EsrMode::replica_identical_only]->params()[1].param->value);
}

TEST_CASE("two replicas equal two accumulated micro-batches, bit for bit", "[train][dp]") {
  // The same micro-batches (replica r's share = micro-batch r), the same sum of two
  // gradients (a + b in either order), the same division by S x 2: the same weights.
  // (Batch-norm running statistics differ: each replica's see only its share.)
  const auto data = synthetic(640, 16, 5);
  auto make = [&](int replicas, int accum) {
    TrainSpec spec = small_mlp(UpdateRule::fp16_rn);
    spec.loss_scale = LossScaleKind::constant;
    spec.scale = 1024.0;
    spec.dp_replicas = replicas;
    spec.grad_accum = accum;
    spec.allreduce_format = emu::fp32();
    spec.accum_format = emu::fp32();
    return std::make_unique<Trainer>(spec, data, 1, 0, emu::StreamId{1, 0, 0, 3});
  };
  auto dp = make(2, 1), accum = make(1, 2), single = make(1, 1);
  for (int i = 0; i < 20; ++i) {
    dp->step();
    accum->step();
    single->step();
  }
  bool same = true, same_as_single = true;
  for (std::size_t k = 0; k < dp->params().size(); ++k) {
    same = same && dp->params()[k].param->value == accum->params()[k].param->value;
    same_as_single = same_as_single && dp->params()[k].param->value == single->params()[k].param->value;
  }
  CHECK(same);
  CHECK_FALSE(same_as_single);  // the batch norms of the micro-batches see 16 samples, not 32
}

TEST_CASE("grad_accum: M micro-batches equal one batch where batch norm sees the same statistics",
          "[train][dp]") {
  // Batch norm normalises each micro-batch with its own statistics, so M micro-batches
  // equal one batch of their samples only when every micro-batch has the batch's
  // statistics. Here the batch is M copies of the same 8 inputs with different labels:
  // in real arithmetic the micro-batches' summed gradients (each of its mean loss) are M
  // times the batch's gradient for every tensor (worked out: batch norm's backward means
  // over the batch are the means of the micro-batches' means). In fp32 they agree to
  // rounding; with distinct inputs per micro-batch they do not.
  constexpr int kMicro = 8, kAccum = 4, kFeatures = 6, kClasses = 3;
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal;
  auto make_data = [&](bool copies) {
    auto d = std::make_shared<data::Split>();
    for (data::Dataset* set : {&d->train, &d->test}) {
      set->features = kFeatures;
      set->classes = kClasses;
    }
    std::vector<float> first(kMicro * kFeatures);
    for (float& v : first) v = normal(gen);
    for (int m = 0; m < kAccum; ++m) {
      for (int i = 0; i < kMicro * kFeatures; ++i) d->train.x.push_back(copies ? first[i] : normal(gen));
      for (int i = 0; i < kMicro; ++i) d->train.y.push_back(static_cast<int>(gen() % kClasses));
    }
    d->test = d->train;
    return d;
  };
  // The largest difference between (sum of micro-batch gradients) / M and the batch's
  // gradient, relative to the largest batch gradient of the same tensor.
  auto worst_difference = [&](const std::shared_ptr<data::Split>& d) {
    auto trainer = [&](int accum) {
      TrainSpec spec;
      spec.hidden = {5};
      spec.rule = UpdateRule::fp32;
      spec.batch = kMicro * kAccum;
      spec.grad_accum = accum;
      return std::make_unique<Trainer>(spec, d, 1, 0, emu::StreamId{1, 0, 0, 3});
    };
    auto big = trainer(1), accumulated = trainer(kAccum);
    std::vector<std::size_t> rows(kMicro * kAccum);
    std::iota(rows.begin(), rows.end(), 0);
    big->step_on(rows);
    accumulated->step_on(rows);
    double worst = 0.0;
    for (std::size_t k = 0; k < big->params().size(); ++k) {
      const std::vector<double>& g = big->params()[k].param->grad;
      const std::vector<double>& sum = accumulated->params()[k].param->grad;
      double largest = 0.0, diff = 0.0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        largest = std::max(largest, std::fabs(g[i]));
        diff = std::max(diff, std::fabs(sum[i] / kAccum - g[i]));
      }
      REQUIRE(largest > 0.0);
      worst = std::max(worst, diff / largest);
    }
    return worst;
  };
  const double same_statistics = worst_difference(make_data(true));
  const double own_statistics = worst_difference(make_data(false));
  INFO("relative difference: copies " << same_statistics << ", distinct micro-batches " << own_statistics);
  CHECK(same_statistics < 1e-5);  // fp32 rounding of sums of 8 and 32 terms
  CHECK(own_statistics > 1e-2);   // batch norm per micro-batch
}

TEST_CASE("grad_accum: an fp16 buffer overflows at a loss scale where an fp32 buffer does not", "[train][dp]") {
  // Mixed precision (fp16 gradients, fp32 master weights), 8 micro-batches of 8 samples:
  // the buffer holds the sum of 8 gradients times S, up to 8 times the largest of them.
  // Over S = 2^0 .. 2^24, the first scale where the fp16 buffer overflows from finite
  // gradients is at least 4 times below the first scale where the fp32-buffer run sees
  // any inf/NaN (there the fp16 gradients themselves overflow).
  const Overrides base{{"update", s("fp32-master")}, {"samples", std::int64_t{160}}, {"train_samples", std::int64_t{64}},
                       {"batch", std::int64_t{64}},  {"grad_accum", std::int64_t{8}}, {"epochs", std::int64_t{2}}};
  auto with = [&](const char* buffer, const std::string& scale) {
    Overrides o = base;
    o["accum_format"] = s(buffer);
    o["loss_scale"] = scale;
    return run_train(o);
  };
  int first16 = -1, first32 = -1;
  for (int k = 0; k <= 24 && (first16 < 0 || first32 < 0); ++k) {
    const std::string scale = std::to_string(1 << k);
    if (first16 < 0) {
      const Metrics m = with("fp16", scale);
      if (m.at("nonfinite_grad_steps") > 0) {
        first16 = k;
        CHECK(m.at("accum_overflow_steps") >= 1);  // the buffer, not the gradients
      }
    }
    if (first32 < 0 && with("fp32", scale).at("nonfinite_grad_steps") > 0) first32 = k;
  }
  INFO("first overflowing scale: fp16 buffer 2^" << first16 << ", fp32 buffer 2^" << first32);
  REQUIRE(first16 >= 0);
  CHECK((first32 < 0 || first32 - first16 >= 2));
  const std::string at = std::to_string(1 << first16);
  CHECK(with("fp32", at).at("nonfinite_grad_steps") == 0);

  // Dynamic scaling from that scale: the fp16 buffer's first step is skipped and the scale
  // backs off; the fp32 buffer's is not.
  Overrides dynamic = base;
  dynamic["loss_scale"] = s("dynamic");
  dynamic["ls_init"] = static_cast<double>(1 << first16);
  dynamic["accum_format"] = s("fp16");
  const Metrics d16 = run_train(dynamic);
  dynamic["accum_format"] = s("fp32");
  const Metrics d32 = run_train(dynamic);
  CHECK(d16.at("skipped_steps") >= 1);
  CHECK(d16.at("accum_overflow_steps") >= 1);
  CHECK(d16.at("final_loss_scale") < static_cast<double>(1 << first16));
  CHECK(d32.at("skipped_steps") == 0);
  CHECK(d32.at("final_loss_scale") == static_cast<double>(1 << first16));
}

TEST_CASE("one replica without accumulation: the all-reduce and buffer keys change no bit", "[train][dp]") {
  // With dp_replicas 1 and grad_accum 1 there is no all-reduce and no buffer, so their
  // formats and order cannot matter: stochastic rounding, dynamic scaling and counted
  // exceptions included, every metric and trace is the same as with the defaults. (That
  // these runs equal the ones before data parallelism existed was checked on sweeps over
  // update rules, esr, loss scaling and fp_exceptions when it was added.)
  const Overrides base{{"update", s("fp16-sr")}, {"esr", s("on")}, {"loss_scale", s("dynamic")},
                       {"ls_init", 1048576.0}, {"ls_interval", std::int64_t{10}}, {"fp_exceptions", s("count")},
                       {"samples", std::int64_t{400}}, {"epochs", std::int64_t{2}}, {"hist_every", std::int64_t{3}}};
  Overrides other = base;
  other["dp_replicas"] = std::int64_t{1};
  other["grad_accum"] = std::int64_t{1};
  other["allreduce_format"] = s("fp8-e4m3");
  other["allreduce_order"] = s("tree");
  other["accum_format"] = s("fp8-e5m2");
  const RunResult a = testing::run_experiment("train", base, emu::StreamId{7, 0, 0, 0});
  const RunResult b = testing::run_experiment("train", other, emu::StreamId{7, 0, 0, 0});
  REQUIRE(a.metrics.size() == b.metrics.size());
  for (const auto& [name, value] : a.metrics) {
    INFO(name);
    CHECK(std::memcmp(&value, &b.metrics.at(name), sizeof value) == 0);
  }
  for (const auto& [name, trace] : a.traces) {
    INFO(name);
    CHECK(trace.y.size() == b.traces.at(name).y.size());
    CHECK(std::memcmp(trace.y.data(), b.traces.at(name).y.data(), trace.y.size() * sizeof(double)) == 0);
  }
  CHECK(a.flags == b.flags);
  CHECK(a.fp_counts.size() == b.fp_counts.size());
  CHECK(a.metrics.at("skipped_steps") > 0);  // the dynamic scaling was exercised
}
