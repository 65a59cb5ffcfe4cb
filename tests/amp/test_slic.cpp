// SLIC 1-D convolution (emu/slic): each output point accumulated as the AMP does,
// checked against the Boost/_Float16 oracle of tests/amp/oracle.hpp.
#include <catch2/catch.hpp>

#include <vector>

#include "emu/slic.hpp"
#include "oracle.hpp"

using namespace emu;
using amp_oracle::Partials;

namespace {

std::vector<double> window(const std::vector<double>& signal, std::size_t start, std::size_t len) {
  return {signal.begin() + static_cast<long>(start), signal.begin() + static_cast<long>(start + len)};
}

std::vector<double> random_halves(Rng& rng, std::size_t n) {
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<_Float16>(rng.normal() * 4));
  return v;
}

}  // namespace

TEST_CASE("slic_conv1d with float partials: one rounding to fp32 per 4-tap phase", "[slic]") {
  Rng rng(StreamId{21});
  const std::vector<double> signal = random_halves(rng, 50), kernel = random_halves(rng, 4);
  Context ctx;
  const std::vector<double> out = slic_conv1d(ctx, amp_config(PartialsType::float32), signal, kernel);
  REQUIRE(out.size() == 47);
  for (std::size_t i = 0; i < out.size(); ++i)
    REQUIRE(out[i] == amp_oracle::amp_reference(window(signal, i, 4), kernel, 0.0, Partials::fp32));
}

TEST_CASE("slic_conv1d with half partials, stride 2 and input partials: fp16 after each phase", "[slic]") {
  Rng rng(StreamId{22});
  const std::vector<double> signal = random_halves(rng, 41), kernel = random_halves(rng, 9);
  const std::size_t outputs = (41 - 9) / 2 + 1;
  const std::vector<double> bias = random_halves(rng, outputs);
  Context ctx;
  const std::vector<double> out = slic_conv1d(ctx, amp_config(PartialsType::half), signal, kernel, 2, bias);
  REQUIRE(out.size() == outputs);
  for (std::size_t i = 0; i < outputs; ++i)
    REQUIRE(out[i] == amp_oracle::amp_reference(window(signal, 2 * i, 9), kernel, bias[i], Partials::fp16));
}

TEST_CASE("slic_conv1d refuses malformed arguments", "[slic]") {
  Context ctx;
  const AmpConfig cfg = amp_config(PartialsType::half);
  const std::vector<double> signal(8, 1.0), kernel(3, 1.0), empty;
  CHECK_THROWS_AS(slic_conv1d(ctx, cfg, signal, empty), std::invalid_argument);
  CHECK_THROWS_AS(slic_conv1d(ctx, cfg, kernel, signal), std::invalid_argument);
  CHECK_THROWS_AS(slic_conv1d(ctx, cfg, signal, kernel, 0), std::invalid_argument);
  CHECK_THROWS_AS(slic_conv1d(ctx, cfg, signal, kernel, 1, kernel), std::invalid_argument);
}
