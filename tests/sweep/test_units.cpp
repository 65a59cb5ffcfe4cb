// Small pieces of the sweep runner: SHA-256 against the FIPS 180-2 test vectors, the edit
// distance behind "did you mean", the trace_length every shipped experiment declares for
// the sweep's trace limits against the traces its runs record, the shard assignment and
// the byte layout of MPI messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "experiments/sweep/config.hpp"
#include "experiments/sweep/sha256.hpp"
#include "experiments/sweep/shard.hpp"
#include "experiments/sweep/wire.hpp"
#include "tests/run_experiment.hpp"

using roundoff::sweep::did_you_mean;
using roundoff::sweep::edit_distance;
using roundoff::sweep::sha256_hex;

TEST_CASE("SHA-256 matches the FIPS 180-2 examples", "[sweep]") {
  // FIPS 180-2, Appendix B.1 (one block), B.2 (two blocks: 448-bit message), B.3 (10^6 'a').
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The empty message (NIST CSRC example values): padding-only block.
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("edit distance and did-you-mean", "[sweep]") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("replicas", "replicas") == 0);
  CHECK(did_you_mean("replica", {"seed", "replicas", "grid"}) == " (did you mean 'replicas'?)");
  CHECK(did_you_mean("formt", {"format", "rounding"}) == " (did you mean 'format'?)");
  CHECK(did_you_mean("zzzzzz", {"format", "rounding"}).empty());
}

TEST_CASE("swamping's and summation's trace_length is the number of samples a run records", "[sweep]") {
  using roundoff::testing::params_with;
  using roundoff::testing::run_experiment;
  const std::pair<std::int64_t, std::int64_t> cases[] = {{10, 0}, {10, 1}, {10, 3}, {10, 5}, {10, 10}, {7, 2}, {1, 1}, {1000, 999}};
  for (const auto& [steps, every] : cases) {
    INFO("steps " << steps << ", trace_every " << every);
    const roundoff::Experiment& swamping = *roundoff::find_experiment("swamping");
    const std::map<std::string, roundoff::ParamValue> p = {{"steps", steps}, {"trace_every", every}};
    const auto result = run_experiment("swamping", p);
    const std::size_t recorded = result.traces.count("x") ? result.traces.at("x").y.size() : 0;
    CHECK(static_cast<std::int64_t>(recorded) == swamping.trace_length(params_with(swamping, p)));
    // The count by hand: steps 0, every, 2 every, ... and the last step.
    if (every > 0) CHECK(recorded == static_cast<std::size_t>(1 + (steps + every - 1) / every));

    const roundoff::Experiment& summation = *roundoff::find_experiment("summation");
    for (const char* algorithm : {"recursive", "kahan", "pairwise"}) {
      INFO(algorithm);
      const std::map<std::string, roundoff::ParamValue> q = {{"n", steps}, {"trace_every", every}, {"algorithm", std::string(algorithm)}};
      const auto sum = run_experiment("summation", q);
      const std::size_t sum_recorded = sum.traces.count("sum") ? sum.traces.at("sum").y.size() : 0;
      CHECK(static_cast<std::int64_t>(sum_recorded) == summation.trace_length(params_with(summation, q)));
    }
  }
}

TEST_CASE("updates', train's and grad_underflow's trace_length is the number of samples a run records", "[sweep]") {
  using roundoff::testing::params_with;
  using roundoff::testing::run_experiment;
  const auto recorded = [](const roundoff::RunResult& r) {
    std::int64_t samples = 0;
    for (const auto& [name, trace] : r.traces) samples += static_cast<std::int64_t>(trace.y.size());
    return samples;
  };
  const roundoff::Experiment& updates = *roundoff::find_experiment("updates");
  for (const std::int64_t every : {0, 1, 3, 50}) {
    INFO("updates, trace_every " << every);
    const std::map<std::string, roundoff::ParamValue> p = {{"steps", std::int64_t{50}}, {"trace_every", every}};
    const auto result = run_experiment("updates", p);
    CHECK(recorded(result) == updates.trace_length(params_with(updates, p)));
    if (every > 0) CHECK(recorded(result) == 50 / every);  // steps every, 2 every, ...
  }
  const roundoff::Experiment& train = *roundoff::find_experiment("train");
  for (const std::int64_t layers : {2, 3})
    for (const std::int64_t every : {0, 1, 4, 1000}) {
      INFO("train, layers " << layers << ", hist_every " << every);
      const std::map<std::string, roundoff::ParamValue> p = {
          {"layers", layers}, {"hist_every", every}, {"epochs", std::int64_t{1}}, {"samples", std::int64_t{300}}};
      const auto result = run_experiment("train", p);
      CHECK(recorded(result) == train.trace_length(params_with(train, p)));
    }
  const roundoff::Experiment& grad_underflow = *roundoff::find_experiment("grad_underflow");
  const std::map<std::string, roundoff::ParamValue> g = {{"epochs", std::int64_t{1}}};
  CHECK(recorded(run_experiment("grad_underflow", g)) == grad_underflow.trace_length(params_with(grad_underflow, g)));
}

// ---- shards (experiments/sweep/shard.hpp) ------------------------------------------------

namespace {

using roundoff::sweep::item_owners;
using roundoff::sweep::PointWork;
using roundoff::sweep::Shard;

// Sets or clears an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("shards hold every run exactly once, in contiguous runs of a fixed point order, equal in size within one", "[sweep][shard]") {
  for (const auto& [points, replicas] : std::vector<std::pair<std::uint32_t, std::uint32_t>>{{1, 1}, {12, 4}, {16, 3}, {7, 1}, {3, 20}, {100, 7}})
    for (const std::uint32_t count : {1u, 2u, 3u, 5u, 8u, 60u}) {
      INFO(points << " points x " << replicas << " replicas in " << count << " shards");
      const std::vector<std::uint32_t> owner = item_owners(points, replicas, count);
      std::vector<std::size_t> held(count, 0);
      for (std::uint32_t k = 0; k < count; ++k) {
        const auto items = roundoff::sweep::shard_items(points, replicas, Shard{k, count});
        for (const PointWork& w : items)
          for (std::uint32_t r : w.replicas) {
            CHECK(owner[w.point * replicas + r] == k);
            ++held[k];
          }
      }
      CHECK(std::accumulate(held.begin(), held.end(), std::size_t{0}) == std::size_t{points} * replicas);
      const auto [low, high] = std::minmax_element(held.begin(), held.end());
      CHECK(*high - *low <= 1);
      // Walking the points in assignment order, the shard never goes back.
      const std::vector<std::uint32_t> order = roundoff::sweep::shard_point_order(points);
      std::uint32_t last = 0;
      for (std::uint32_t p : order)
        for (std::uint32_t r = 0; r < replicas; ++r) {
          CHECK(owner[p * replicas + r] >= last);
          last = owner[p * replicas + r];
        }
    }
}

TEST_CASE("the point order is splitmix64's and fixed: golden assignment", "[sweep][shard]") {
  // splitmix64(p), p = 0..4: e220a8397b1dcdaf (the first output of Vigna's splitmix64.c
  // seeded with 0, its published check value), 910a2dec89025cc1, 975835de1c9756ce,
  // 1d0b14e4db018fed, 6e73e372e2338aca (computed with an independent Python version of
  // the same three steps); ascending: 3, 4, 1, 2, 0.
  CHECK(roundoff::sweep::shard_point_order(5) == std::vector<std::uint32_t>{3, 4, 1, 2, 0});
  // 5 points x 2 replicas in 3 shards: the list (3,0) (3,1) (4,0) (4,1) (1,0) | (1,1) ...
  // cut at floor(10 k / 3) = 3, 6: shard 0 = (3,0) (3,1) (4,0); 1 = (4,1) (1,0) (1,1);
  // 2 = (2,0) (2,1) (0,0) (0,1).
  CHECK(item_owners(5, 2, 3) == std::vector<std::uint32_t>{2, 2, 1, 1, 2, 2, 0, 0, 0, 1});
  CHECK(roundoff::sweep::describe_items(roundoff::sweep::shard_items(5, 2, Shard{1, 3}), 2) == "points 1, 4 (replica 1)");
  CHECK(roundoff::sweep::describe_items({{2, {0, 1}}, {3, {0, 1}}, {4, {0, 1}}, {9, {1, 2, 3, 5}}}, 6) ==
        "points 2-4 (replicas 0-1), 9 (replicas 1-3, 5)");
  CHECK(roundoff::sweep::describe_items({{2, {0}}, {3, {0}}, {4, {0}}, {9, {0}}}, 1, 1) == "points 2-4 and 1 more run");
}

TEST_CASE("--shard K/N and --shard auto (Slurm job arrays)", "[sweep][shard]") {
  using roundoff::sweep::InputError;
  using roundoff::sweep::parse_shard;
  CHECK(parse_shard("0/1").text() == "0/1");
  CHECK(parse_shard("2/3").index == 2);
  for (const char* bad : {"3/3", "1/0", "-1/3", "1", "a/3", "1/3/4", "", "1/", "/3", "1/1000001", " 1/3"})
    CHECK_THROWS_AS(parse_shard(bad), InputError);
  {
    const ScopedEnv id("SLURM_ARRAY_TASK_ID", nullptr), count("SLURM_ARRAY_TASK_COUNT", nullptr);
    CHECK_THROWS_WITH(parse_shard("auto"), Catch::Contains("SLURM_ARRAY_TASK_ID is not set"));
  }
  {
    const ScopedEnv id("SLURM_ARRAY_TASK_ID", "4"), count("SLURM_ARRAY_TASK_COUNT", "8"), min("SLURM_ARRAY_TASK_MIN", nullptr),
        step("SLURM_ARRAY_TASK_STEP", nullptr);
    CHECK(parse_shard("auto").text() == "4/8");
  }
  {
    const ScopedEnv id("SLURM_ARRAY_TASK_ID", "4"), count("SLURM_ARRAY_TASK_COUNT", nullptr);
    CHECK_THROWS_WITH(parse_shard("auto"), Catch::Contains("SLURM_ARRAY_TASK_COUNT is not set"));
  }
  {  // --array=1-8 and --array=0-14:2
    const ScopedEnv id("SLURM_ARRAY_TASK_ID", "8"), count("SLURM_ARRAY_TASK_COUNT", "8"), min("SLURM_ARRAY_TASK_MIN", "1");
    CHECK(parse_shard("auto").text() == "7/8");
    const ScopedEnv step_id("SLURM_ARRAY_TASK_ID", "14"), step("SLURM_ARRAY_TASK_STEP", "2"), min0("SLURM_ARRAY_TASK_MIN", "0");
    CHECK(parse_shard("auto").text() == "7/8");
  }
  {
    const ScopedEnv id("SLURM_ARRAY_TASK_ID", "9"), count("SLURM_ARRAY_TASK_COUNT", "8");
    CHECK_THROWS_WITH(parse_shard("auto"), Catch::Contains("not a plain range"));
  }
  CHECK(roundoff::sweep::shard_output_path("results/x.h5", Shard{2, 8}) == "results/x.shard-2-of-8.h5");
  CHECK(roundoff::sweep::shard_output_path("out", Shard{0, 3}) == "out.shard-0-of-3");
  CHECK(roundoff::sweep::shell_quoted("results/a-b_c.h5") == "results/a-b_c.h5");
  CHECK(roundoff::sweep::shell_quoted("my file's.h5") == "'my file'\\''s.h5'");
}

TEST_CASE("run outcomes cross MPI intact: every field, NaN payloads and signs included", "[sweep][mpi-wire]") {
  using roundoff::sweep::ItemOutcome;
  ItemOutcome outcome;
  outcome.item = {7, 3};
  outcome.kind = ItemOutcome::Kind::ok;
  const double negative_nan = -std::numeric_limits<double>::quiet_NaN();
  outcome.result.metrics = {{"final", 0.25}, {"odd", negative_nan}, {"tiny", 4.9e-324}, {"inf", -INFINITY}};
  outcome.result.traces["x"] = {{0, 1, 2}, {0.5, std::nan("7"), 1e300}};
  outcome.result.traces["empty"] = {};
  outcome.result.flags = emu::OFLO | emu::INEXACT;
  const std::string bytes = roundoff::sweep::encode_outcome(outcome);
  const ItemOutcome back = roundoff::sweep::decode_outcome(bytes);
  CHECK(back.item.point == 7);
  CHECK(back.item.replica == 3);
  CHECK(back.kind == ItemOutcome::Kind::ok);
  CHECK(back.result.flags == outcome.result.flags);
  REQUIRE(back.result.metrics.size() == 4);
  for (const auto& [name, value] : outcome.result.metrics)
    CHECK(std::memcmp(&back.result.metrics.at(name), &value, sizeof value) == 0);
  REQUIRE(back.result.traces.size() == 2);
  CHECK(back.result.traces.at("x").x == outcome.result.traces["x"].x);
  CHECK(std::memcmp(back.result.traces.at("x").y.data(), outcome.result.traces["x"].y.data(), 3 * sizeof(double)) == 0);
  CHECK(back.result.traces.at("empty").y.empty());
  ItemOutcome failed;
  failed.kind = ItemOutcome::Kind::bad_input;
  failed.message = "cfg.yaml: point 1 replica 0: data file vanished";
  CHECK(roundoff::sweep::decode_outcome(roundoff::sweep::encode_outcome(failed)).message == failed.message);
  CHECK_THROWS(roundoff::sweep::decode_outcome(bytes.substr(0, bytes.size() - 1)));
  CHECK_THROWS(roundoff::sweep::decode_outcome(bytes + "x"));
  const std::vector<roundoff::sweep::WorkItem> items{{1, 2}, {4000000000u, 5}};
  const auto items_back = roundoff::sweep::decode_items(roundoff::sweep::encode_items(items));
  REQUIRE(items_back.size() == 2);
  CHECK(items_back[1].point == 4000000000u);
  CHECK(items_back[1].replica == 5);
  const auto start = roundoff::sweep::decode_start(roundoff::sweep::encode_start({3, "configs/a b.yaml", "experiment: x\n"}));
  CHECK(start.threads == 3);
  CHECK(start.config_path == "configs/a b.yaml");
  CHECK(start.config_text == "experiment: x\n");
}
