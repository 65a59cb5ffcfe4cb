// The fast array kernels (emu/convert.hpp) against the scalar emu::round and the CPU's
// F16C conversion, bit for bit and flag for flag; stochastic rounding by statistics and
// by the documented choice of random words.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "emu/convert.hpp"

namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// Every exponent (both signs), with fraction patterns that put ties, near-ties and
// sticky bits at every bit position, under a few patterns of the leading bits.
std::vector<float> dense_sample() {
  std::vector<std::uint32_t> low;
  for (int k = 0; k < 23; ++k) {
    const std::uint32_t b = 1u << k;
    for (std::uint32_t v : {b, b - 1, b + 1, b | (b >> 1), (b << 1) - 1}) low.push_back(v & 0x7FFFFFu);
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 16; ++i) low.push_back(gen() & 0x7FFFFFu);
  std::vector<std::uint32_t> high;
  for (std::uint32_t h = 0; h < 16; ++h) high.push_back(h << 19);  // top 4 fraction bits
  for (std::uint32_t h : {0x7FEu, 0x7FFu, 0x3FFu, 0x555u}) high.push_back(h << 12);  // long carries
  std::vector<float> out;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t h : high)
        for (std::uint32_t l : low) out.push_back(from_bits((sign << 31) | (e << 23) | ((h | l) & 0x7FFFFFu)));
  for (int i = 0; i < 200000; ++i) out.push_back(from_bits(static_cast<std::uint32_t>(gen())));
  return out;
}

struct Config {
  const emu::Format* format;
  emu::Overflow overflow;
  bool subnormals;
};

std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (const emu::Format* f : {&emu::fp16(), &emu::bf16()})
    for (emu::Overflow o : {emu::Overflow::inf, emu::Overflow::saturate, emu::Overflow::nan})
      for (bool sub : {true, false}) out.push_back({f, o, sub});
  return out;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

}  // namespace

TEST_CASE("rne kernels equal the scalar emu::round bit for bit and flag for flag", "[convert]") {
  const std::vector<float> sample = dense_sample();
  for (const Config& cfg : all_configs()) {
    const emu::Format format = cfg.format->with_subnormals(cfg.subnormals);
    const emu::RoundSpec spec{.mode = emu::Rounding::rne, .overflow = cfg.overflow};
    INFO(format.name() << " overflow " << emu::overflow_name(cfg.overflow) << " subnormals " << cfg.subnormals);
    const emu::HalfRounding how(format, spec);
    std::vector<std::uint16_t> bits(sample.size());
    std::vector<float> values(sample.size());
    const emu::Flags all_flags = emu::round_to_bits(how, sample, bits);
    CHECK(emu::round_to_float(how, sample, values) == all_flags);
    emu::Flags expected_all = 0;
    std::size_t bit_mismatches = 0, flag_mismatches = 0, value_mismatches = 0, chunk_flag_mismatches = 0;
    // Flags of aligned 8-element calls too: single-element calls take a kernel's scalar
    // tail, 8 elements its vector path (AVX2 width).
    constexpr std::size_t kChunk = 8;
    emu::Flags expected_chunk = 0;
    for (std::size_t i = 0; i < sample.size(); ++i) {
      emu::Flags expected_flags = 0;
      const double expected = emu::round(format, static_cast<double>(sample[i]), spec, nullptr, expected_flags);
      expected_all |= expected_flags;
      expected_chunk |= expected_flags;
      if (i % kChunk == kChunk - 1) {
        std::uint16_t chunk_bits[kChunk];
        const emu::Flags chunk_flags =
            emu::round_to_bits(how, std::span(&sample[i + 1 - kChunk], kChunk), std::span(chunk_bits, kChunk));
        if (chunk_flags != expected_chunk && ++chunk_flag_mismatches <= 5)
          FAIL_CHECK("x = " << sample[i + 1 - kChunk] << ".. (8) flags " << int(chunk_flags) << " expected "
                            << int(expected_chunk));
        expected_chunk = 0;
      }
      const auto expected_bits = static_cast<std::uint16_t>(format.encode(expected));
      std::uint16_t one_bits = 0;
      const emu::Flags one_flags = emu::round_to_bits(how, std::span(&sample[i], 1), std::span(&one_bits, 1));
      if (bits[i] != expected_bits || one_bits != expected_bits) {
        if (++bit_mismatches <= 5)
          FAIL_CHECK("x = " << sample[i] << " bits " << bits[i] << " expected " << expected_bits);
      }
      if (one_flags != expected_flags && ++flag_mismatches <= 5)
        FAIL_CHECK("x = " << sample[i] << " flags " << int(one_flags) << " expected " << int(expected_flags));
      if (!same_float(values[i], static_cast<float>(expected)) && ++value_mismatches <= 5)
        FAIL_CHECK("x = " << sample[i] << " value " << values[i] << " expected " << expected);
    }
    CHECK(bit_mismatches == 0);
    CHECK(flag_mismatches == 0);
    CHECK(chunk_flag_mismatches == 0);
    CHECK(value_mismatches == 0);
    CHECK(all_flags == expected_all);
  }
}

TEST_CASE("fp16 rne equals the CPU's F16C conversion", "[convert]") {
  std::vector<float> sample = dense_sample();
  sample.resize(sample.size() / 8 * 8);
  std::vector<std::uint16_t> bits(sample.size());
  emu::round_to_bits(emu::HalfRounding(emu::fp16(), {}), sample, bits);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < sample.size(); i += 8) {
    alignas(16) std::uint16_t hw[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(hw),
                    _mm256_cvtps_ph(_mm256_loadu_ps(&sample[i]), _MM_FROUND_TO_NEAREST_INT));
    for (int k = 0; k < 8; ++k) {
      // F16C keeps NaN payloads; emu gives the canonical quiet NaN: compare NaN-ness and sign.
      const bool nan = std::isnan(sample[i + k]);
      const bool equal = nan ? (bits[i + k] & 0x7E00) == 0x7E00 && (bits[i + k] >> 15) == (hw[k] >> 15)
                             : bits[i + k] == hw[k];
      if (!equal && ++mismatches <= 5) FAIL_CHECK("x = " << sample[i + k] << " emu " << bits[i + k] << " F16C " << hw[k]);
    }
  }
  CHECK(mismatches == 0);
}

namespace {

// Counts how often x rounds up (away from zero) over `draws` elements of one array.
struct UpCount {
  std::uint64_t up = 0;
  std::uint64_t other = 0;  // neither neighbour: must stay 0
};

UpCount count_up(const emu::Format& format, float x, int sr_bits, std::size_t draws, emu::StreamId stream) {
  emu::Flags unused = 0;
  const double down = emu::round(format, x, {.mode = emu::Rounding::rz}, nullptr, unused);
  const double up = emu::round(format, x, {.mode = x > 0 ? emu::Rounding::ru : emu::Rounding::rd}, nullptr, unused);
  const emu::HalfRounding how(format, {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream);
  std::vector<float> in(draws, x), out(draws);
  emu::round_to_float(how, in, out);
  UpCount c;
  for (float v : out) {
    if (v == static_cast<float>(up) && up != down) ++c.up;
    else if (v != static_cast<float>(down)) ++c.other;
  }
  return c;
}

// The discarded fraction of |x| in ulps of the result, exactly (x is a float: the
// double arithmetic below is exact).
double distance_ratio(const emu::Format& format, float x) {
  emu::Flags unused = 0;
  const double down = emu::round(format, x, {.mode = emu::Rounding::rz}, nullptr, unused);
  double up = emu::round(format, x, {.mode = x > 0 ? emu::Rounding::ru : emu::Rounding::rd}, nullptr, unused);
  // Above max finite the upper neighbour is inf; the grid's next point is max + ulp(max).
  if (std::isinf(up)) up = down + std::copysign(std::ldexp(1.0, std::ilogb(down) - format.fraction_bits()), down);
  return (static_cast<double>(x) - down) / (up - down);
}

}  // namespace

TEST_CASE("sr rounds up with probability equal to the distance ratio (5 sigma, 10^5 draws)", "[convert]") {
  constexpr std::size_t kDraws = 100000;
  struct Case {
    const emu::Format* format;
    float x;
  };
  const Case cases[] = {
      {&emu::fp16(), 0.1f},                 // normal, 13 discarded bits
      {&emu::fp16(), -1234.567f},           // negative normal
      {&emu::fp16(), 1e-5f},                // subnormal result, 19 discarded bits
      {&emu::fp16(), 3e-8f},                // below the least subnormal: 0 or 2^-24
      {&emu::fp16(), from_bits((90u << 23) | 0x654321u)},  // about 2^-37: F truncated, tie-break
      {&emu::fp16(), 65519.0f},             // rounds to 65504 or overflows to inf
      {&emu::bf16(), 3.14159265f},          // normal, 16 discarded bits
      {&emu::bf16(), from_bits(0x00012345u)},  // float32 subnormal -> bf16 subnormal
  };
  std::uint32_t lane = 0;
  for (const Case& c : cases) {
    const double p = distance_ratio(*c.format, c.x);
    const UpCount count = count_up(*c.format, c.x, 0, kDraws, {.seed = 99, .lane = static_cast<std::uint16_t>(++lane)});
    INFO(c.format->name() << " x = " << c.x << " p = " << p << " up " << count.up);
    CHECK(count.other == 0);
    const double sigma = std::sqrt(kDraws * p * (1 - p));
    CHECK(std::fabs(static_cast<double>(count.up) - kDraws * p) <= 5 * sigma + 1);
  }
}

TEST_CASE("sr with k random bits: P(up) = floor(f 2^k) / 2^k, as emu::round documents", "[convert]") {
  constexpr std::size_t kDraws = 100000;
  const float x = 1.0f + 0.3f * 0x1p-10f;  // fp16: f = 0.3 of an ulp (to float precision)
  const double f = distance_ratio(emu::fp16(), x);
  for (int k : {2, 4, 8}) {
    const double p = std::floor(f * std::ldexp(1.0, k)) / std::ldexp(1.0, k);
    const UpCount count = count_up(emu::fp16(), x, k, kDraws, {.seed = 5});
    INFO("k = " << k << " p = " << p << " up " << count.up);
    CHECK(count.other == 0);
    const double sigma = std::sqrt(kDraws * p * (1 - p));
    CHECK(std::fabs(static_cast<double>(count.up) - kDraws * p) <= 5 * sigma + 1);
  }
}

namespace {

// The random word of element i, computed from the documentation in convert.hpp with
// the generator of emu/rng.hpp.
std::uint32_t documented_word(const emu::StreamId& id, std::uint64_t i) {
  const std::uint64_t block = i / 256 * 64 + i % 64;
  const emu::Philox4x32::Block counter = {static_cast<std::uint32_t>(block),
                                          static_cast<std::uint32_t>(block >> 32) | (std::uint32_t{id.lane} << 16),
                                          id.point, id.replica};
  const auto key = std::array<std::uint32_t, 2>{static_cast<std::uint32_t>(id.seed),
                                                static_cast<std::uint32_t>(id.seed >> 32)};
  return emu::Philox4x32::block(key, counter)[i % 256 / 64];
}

}  // namespace

TEST_CASE("sr uses the documented random word of each element", "[convert]") {
  const emu::StreamId stream{.seed = 0x1234'5678'9abc'def0ull, .point = 3, .replica = 4, .lane = 5};
  const std::uint64_t first = 1'000'003;  // not a multiple of the tile
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  std::vector<float> in(3000);
  for (float& x : in) x = dist(gen);
  // sr_bits k compares the top k bits of r and F (0: all 32 bits, ties impossible here).
  for (const emu::Format* format : {&emu::fp16(), &emu::bf16()})
  for (const int sr_bits : {0, 1, 5, 12, 13, 16, 24, 32}) {
    INFO("sr_bits = " << sr_bits);
    std::vector<std::uint16_t> bits(in.size());
    const emu::Flags flags = emu::round_to_bits(
        emu::HalfRounding(*format, {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream), in, bits, first);
    CHECK(flags == emu::INEXACT);  // normal finite results only: no OFLO, no UFLO
    // Values of the format are exact whatever the random bits: no flag, same value.
    std::vector<float> exact(in.size());
    for (std::size_t j = 0; j < exact.size(); ++j) exact[j] = static_cast<float>(j % 255 + 1) * 0.25f;
    std::vector<float> exact_out(exact.size());
    CHECK(emu::round_to_float(emu::HalfRounding(*format, {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream),
                              exact, exact_out, first) == 0);
    CHECK(exact_out == exact);
    const int shift = sr_bits == 0 ? 0 : 32 - sr_bits;
    const int drop = 23 - format->fraction_bits();
    std::size_t mismatches = 0;
    for (std::size_t j = 0; j < in.size(); ++j) {
      // Normal results: F = the dropped fraction bits, left-aligned in 32 bits.
      emu::Flags unused = 0;
      const auto down = static_cast<std::uint16_t>(
          format->encode(emu::round(*format, in[j], {.mode = emu::Rounding::rz}, nullptr, unused)));
      const std::uint32_t fraction = std::bit_cast<std::uint32_t>(in[j]) & ((1u << drop) - 1);
      const std::uint32_t big_f = fraction << (32 - drop);
      const bool up = (documented_word(stream, first + j) >> shift) < (big_f >> shift);
      if (bits[j] != static_cast<std::uint16_t>(down + (up ? 1 : 0)) && ++mismatches <= 5)
        FAIL_CHECK(format->name() << " j = " << j << " x = " << in[j]);
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("fp16 sr: normal, subnormal and overflowing results mixed within 8 lanes follow the documented words",
          "[convert]") {
  // The fast path takes the lanes with normal finite results and leaves the others to
  // the integer kernel: mixed groups, whole groups of one kind, and a ragged tail.
  const emu::StreamId stream{.seed = 0xfeed'beefull, .point = 1, .replica = 2, .lane = 3};
  const std::uint64_t first = 777;  // not a multiple of the tile
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> normal_exponent(-13.9, 15.9), subnormal_exponent(-30.0, -14.0),
      overflow_exponent(15.99, 20.0);
  std::uniform_int_distribution<int> kind_of(0, 2);
  std::vector<float> in(3001);
  for (std::size_t j = 0; j < in.size(); ++j) {
    int kind = j < 1024 ? kind_of(gen) : j < 1536 ? 0 : j < 2048 ? 1 : static_cast<int>(j % 3);
    const double e = kind == 0 ? normal_exponent(gen) : kind == 1 ? subnormal_exponent(gen) : overflow_exponent(gen);
    in[j] = static_cast<float>((gen() & 1u ? -1.0 : 1.0) * std::exp2(e));
  }
  in[5] = 65504.0f + 31.0f;  // rounds to max or to inf
  in[6] = -65504.0f - 1.0f;
  in[7] = 0x1.ff8p-15f;  // subnormal that may carry into the min normal
  for (const int sr_bits : {0, 1, 5, 12, 13, 16, 24, 32}) {
    INFO("sr_bits = " << sr_bits);
    std::vector<std::uint16_t> bits(in.size());
    const emu::Flags flags = emu::round_to_bits(
        emu::HalfRounding(emu::fp16(), {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream), in, bits, first);
    const int shift = sr_bits == 0 ? 0 : 32 - sr_bits;
    emu::Flags expected_flags = 0;
    std::size_t mismatches = 0;
    for (std::size_t j = 0; j < in.size(); ++j) {
      const double magnitude = std::fabs(static_cast<double>(in[j]));
      const std::uint16_t sign = std::signbit(in[j]) ? 0x8000 : 0;
      std::uint16_t expected;
      if (magnitude >= 65536.0) {  // beyond max + ulp: every rounding overflows
        expected = sign | 0x7C00;
        expected_flags |= emu::OFLO | emu::INEXACT;
      } else {
        // The pattern toward zero and f (in ulps) are exact in double: |x| has 24 bits.
        const double ulp = magnitude < 0x1p-14 ? 0x1p-24 : std::exp2(std::floor(std::log2(magnitude)) - 10);
        const double kept = std::floor(magnitude / ulp);
        const auto big_f = static_cast<std::uint32_t>(std::ldexp(magnitude / ulp - kept, 32));
        const bool up = (documented_word(stream, first + j) >> shift) < (big_f >> shift);
        const int exponent_field = magnitude < 0x1p-14 ? 0 : static_cast<int>(std::floor(std::log2(magnitude))) + 15;
        const int fraction = static_cast<int>(kept) - (exponent_field == 0 ? 0 : 1024);
        expected = static_cast<std::uint16_t>(sign | ((exponent_field << 10) + fraction + (up ? 1 : 0)));
        if (big_f != 0) expected_flags |= emu::INEXACT;
        if (big_f != 0 && magnitude < 0x1p-14) expected_flags |= emu::UFLO;
        if ((expected & 0x7FFF) == 0x7C00) expected_flags |= emu::OFLO;
      }
      if (bits[j] != expected && ++mismatches <= 5)
        FAIL_CHECK("j = " << j << " x = " << in[j] << " got " << bits[j] << " expected " << expected);
    }
    CHECK(mismatches == 0);
    CHECK(flags == expected_flags);
    CHECK(flags == (emu::OFLO | emu::UFLO | emu::INEXACT));
  }
}

TEST_CASE("sr settles r == F exactly with the tie-break block (fp16 below 2^-33)", "[convert]") {
  // x = m 2^-57 (float exponent field 93): 33 discarded bits, F = m >> 1, one bit beyond.
  // Where the element's word r equals F, the documented tie-break decides: up iff the
  // top bit of block 2^47 + i is 0 (probability 1/2 = the bit beyond F).
  const emu::StreamId stream{.seed = 77, .lane = 1};
  const auto key = std::array<std::uint32_t, 2>{77u, 0u};
  std::vector<float> in;
  std::vector<bool> expected_up;
  for (std::uint64_t i = 0; in.size() < 400; ++i) {
    const std::uint32_t r = documented_word(stream, i);
    const bool tie = r >= (1u << 22) && r < (1u << 23);
    const std::uint32_t m = tie ? 2 * r + 1 : 0x00C00001u;  // otherwise some non-tie value
    in.push_back(from_bits((93u << 23) | (m & 0x7FFFFFu)));
    if (!tie) {
      expected_up.push_back(r < (m >> 1));
      continue;
    }
    const std::uint64_t block = (std::uint64_t{1} << 47) + i;
    const auto b = emu::Philox4x32::block(
        key, {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32) | (1u << 16), 0, 0});
    expected_up.push_back((b[0] >> 31) == 0);
  }
  std::vector<std::uint16_t> bits(in.size());
  emu::round_to_bits(emu::HalfRounding(emu::fp16(), {.mode = emu::Rounding::sr}, stream), in, bits);
  int ties_up = 0, mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (bits[i] != (expected_up[i] ? 1 : 0) && ++mismatches <= 5) FAIL_CHECK("i = " << i);
    ties_up += expected_up[i] ? 1 : 0;
  }
  CHECK(mismatches == 0);
  CHECK(ties_up > 0);  // the test did exercise rounding up
}

TEST_CASE("sr is deterministic: same stream same bits, pieces equal one call", "[convert]") {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> in(10000);
  for (float& x : in) x = std::ldexp(dist(gen), static_cast<int>(gen() % 40) - 30);
  for (const emu::Format* format : {&emu::fp16(), &emu::bf16()}) {
    const emu::HalfRounding how(*format, {.mode = emu::Rounding::sr}, {.seed = 42, .replica = 2});
    std::vector<std::uint16_t> one(in.size()), again(in.size()), pieces(in.size()), other(in.size());
    const emu::Flags flags = emu::round_to_bits(how, in, one);
    emu::round_to_bits(how, in, again);
    CHECK(one == again);
    emu::Flags piece_flags = 0;
    for (std::size_t start = 0; start < in.size();) {
      const std::size_t len = std::min<std::size_t>(1 + gen() % 700, in.size() - start);
      piece_flags |= emu::round_to_bits(how, std::span(in).subspan(start, len),
                                        std::span(pieces).subspan(start, len), start);
      start += len;
    }
    CHECK(pieces == one);
    CHECK(piece_flags == flags);
    emu::round_to_bits(emu::HalfRounding(*format, {.mode = emu::Rounding::sr}, {.seed = 43, .replica = 2}), in,
                       other);
    CHECK(other != one);
  }
}

TEST_CASE("round_to_float works in place; configuration is validated", "[convert]") {
  std::vector<float> v = {0.1f, 1e-6f, 70000.0f, -2.5f};
  const emu::Flags flags = emu::round_to_float(emu::HalfRounding(emu::fp16(), {}), v, v);
  CHECK(v[0] == 0.0999755859375f);  // fp16 0x2e66
  CHECK(v[1] == 17.0f * 0x1p-24f);   // 1e-6 / 2^-24 = 16.78 -> 17 subnormal ulps
  CHECK(std::isinf(v[2]));
  CHECK(v[3] == -2.5f);
  CHECK(flags == (emu::OFLO | emu::UFLO | emu::INEXACT));
  CHECK_THROWS_AS(emu::HalfRounding(emu::fp8_e4m3(), {}), std::invalid_argument);
  CHECK_THROWS_AS(emu::HalfRounding(emu::fp16(), {.mode = emu::Rounding::rz}), std::invalid_argument);
  CHECK_THROWS_AS(emu::HalfRounding(emu::fp16(), {.mode = emu::Rounding::sr, .sr_bits = 33}), std::invalid_argument);
  std::vector<std::uint16_t> too_short(3);
  CHECK_THROWS_AS(emu::round_to_bits(emu::HalfRounding(emu::bf16(), {}), v, too_short), std::invalid_argument);
}

TEST_CASE("round_array rounds doubles into any format (fp8-e4m3 golden values)", "[convert]") {
  // OCP 8-bit FP spec: e4m3 max 448 = 1.75 * 2^8; 0.3 -> 1.25 * 2^-2; -17 is a tie
  // between 16 and 18 at spacing 2: even 16.
  const std::vector<double> in = {0.3, 448.0, 1e-3, -17.0};
  std::vector<double> out(in.size());
  const emu::Flags flags = emu::round_array(emu::fp8_e4m3(), {}, in, out, nullptr);
  CHECK(out[0] == 0.3125);
  CHECK(out[1] == 448.0);
  CHECK(out[2] == 0.0019531250);  // least subnormal 2^-9 = 0.001953125: 1e-3 is above half of it
  CHECK(out[3] == -16.0);
  CHECK(flags == (emu::UFLO | emu::INEXACT));
}
