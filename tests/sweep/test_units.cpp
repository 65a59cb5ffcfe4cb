// Small pieces of the sweep runner: SHA-256 against the FIPS 180-2 test vectors, the edit
// distance behind "did you mean", and the trace_length every shipped experiment declares
// for the sweep's trace limits against the traces its runs record.
#include <catch2/catch.hpp>

#include "experiments/sweep/config.hpp"
#include "experiments/sweep/sha256.hpp"
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
