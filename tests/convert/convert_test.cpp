// The fast array kernels (emu/convert.hpp) against the scalar emu::round and the CPU's
// F16C conversion, bit for bit and flag for flag; stochastic rounding by statistics and
// by the documented choice of random words.
#include <immintrin.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include "emu/convert.hpp"
#include "documented_sr.hpp"

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

// Results of two implementations, element by element (same: bit patterns, or same_float
// for values): on a mismatch, how many differ and the first, with its input. A CHECK on
// the whole arrays would print both, up to millions of elements.
template <class T>
void check_same(const std::vector<float>& in, const std::vector<T>& got, const std::vector<T>& expected,
                bool (*same)(T, T) = [](T a, T b) { return a == b; }) {
  REQUIRE(got.size() == expected.size());
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same(got[i], expected[i]) && count++ == 0) first = i;
  if (count != 0)
    FAIL_CHECK(count << " of " << got.size() << " elements differ, the first at index " << first << ": x = "
                     << in[first] << ", got " << +got[first] << ", expected " << +expected[first]);
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

documented::Expected expected_sr(const emu::Format& format, const emu::RoundSpec& sr, float x,
                                 const emu::StreamId& stream, std::uint64_t index) {
  return documented::expected_sr(format, sr, x, stream, index, documented::r_bits(stream, index));
}

}  // namespace

TEST_CASE("sr uses the documented random bits of each element", "[convert]") {
  const emu::StreamId stream{.seed = 0x1234'5678'9abc'def0ull, .point = 3, .replica = 4, .lane = 5};
  const std::uint64_t first = 1'000'003;  // not a multiple of the tile
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  std::vector<float> in(3000);
  for (float& x : in) x = dist(gen);
  // sr_bits k compares the top k bits of rho and f (0: all); 16 bits are f whole here.
  for (const emu::Format* format : {&emu::fp16(), &emu::bf16()})
    for (const int sr_bits : {0, 1, 5, 12, 13, 15, 16, 17, 24, 32}) {
      INFO(format->name() << " sr_bits = " << sr_bits);
      const emu::HalfRounding how(*format, {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream);
      std::vector<std::uint16_t> bits(in.size());
      const emu::Flags flags = emu::round_to_bits(how, in, bits, first);
      CHECK(flags == emu::INEXACT);  // normal finite results only: no OFLO, no UFLO
      // Values of the format are exact whatever the random bits: no flag, same value.
      std::vector<float> exact(in.size());
      for (std::size_t j = 0; j < exact.size(); ++j) exact[j] = static_cast<float>(j % 255 + 1) * 0.25f;
      std::vector<float> exact_out(exact.size());
      CHECK(emu::round_to_float(how, exact, exact_out, first) == 0);
      CHECK(exact_out == exact);
      const int drop = 23 - format->fraction_bits();
      std::size_t mismatches = 0, ups = 0;
      for (std::size_t j = 0; j < in.size(); ++j) {
        // Normal results: f = the dropped fraction bits / 2^drop.
        emu::Flags unused = 0;
        const auto down = static_cast<std::uint16_t>(
            format->encode(emu::round(*format, in[j], {.mode = emu::Rounding::rz}, nullptr, unused)));
        const std::uint32_t fraction = std::bit_cast<std::uint32_t>(in[j]) & ((1u << drop) - 1);
        const double f = std::ldexp(static_cast<double>(fraction), -drop);
        const bool up = documented::rounds_up(stream, first + j, documented::r_bits(stream, first + j), f, sr_bits);
        ups += up ? 1 : 0;
        if (bits[j] != static_cast<std::uint16_t>(down + (up ? 1 : 0)) && ++mismatches <= 5)
          FAIL_CHECK(format->name() << " j = " << j << " x = " << in[j]);
      }
      CHECK(mismatches == 0);
      CHECK(ups > 0);
      CHECK(ups < in.size());
    }
}

TEST_CASE("fp16 sr: normal, subnormal and overflowing results mixed within 8 lanes follow the documented bits",
          "[convert]") {
  // Lanes of every kind in one vector, whole vectors of one kind, and a ragged tail.
  const emu::StreamId stream{.seed = 0xfeed'beefull, .point = 1, .replica = 2, .lane = 3};
  const std::uint64_t first = 777;  // not a multiple of the tile
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> normal_exponent(-13.9, 15.9), subnormal_exponent(-40.0, -14.0),
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
  in[8] = 0.0f;
  in[9] = -0.0f;
  in[10] = 0x1p-24f;  // the least subnormal, exact
  for (const emu::Overflow overflow : {emu::Overflow::inf, emu::Overflow::saturate, emu::Overflow::nan})
    for (const int sr_bits : {0, 1, 5, 12, 13, 16, 17, 24, 32}) {
      INFO("overflow " << emu::overflow_name(overflow) << " sr_bits = " << sr_bits);
      const emu::RoundSpec spec{.mode = emu::Rounding::sr, .overflow = overflow, .sr_bits = sr_bits};
      std::vector<documented::Expected> expected;
      emu::Flags expected_flags = 0;
      for (std::size_t j = 0; j < in.size(); ++j) {
        expected.push_back(expected_sr(emu::fp16(), spec, in[j], stream, first + j));
        expected_flags |= expected.back().flags;
      }
      CHECK((expected_flags & (emu::OFLO | emu::UFLO | emu::INEXACT)) == (emu::OFLO | emu::UFLO | emu::INEXACT));
      for (int implementation = 0; implementation < 3; ++implementation) {
        INFO("implementation " << implementation);
        std::vector<std::uint16_t> bits(in.size());
        const auto flags = emu::detail::round_to_bits_with(implementation, emu::HalfRounding(emu::fp16(), spec, stream),
                                                           in, bits, first);
        if (!flags) continue;
        std::size_t mismatches = 0;
        for (std::size_t j = 0; j < in.size(); ++j)
          if (bits[j] != expected[j].bits && ++mismatches <= 5)
            FAIL_CHECK("j = " << j << " x = " << in[j] << " got " << bits[j] << " expected " << expected[j].bits);
        CHECK(mismatches == 0);
        CHECK(*flags == expected_flags);
      }
    }
}

TEST_CASE("sr of every lane class: bits and flags of the direction the documented bits choose", "[convert]") {
  // The dense sample (every exponent, ties and sticky bits at every position, inf, NaN,
  // zeros, subnormal inputs) under every format, overflow policy and subnormals setting,
  // through every implementation: each result is emu::round's toward zero or away from
  // zero as the documented rule says, with that rounding's flags (checked per aligned
  // 8-element call, the AVX2 vector width, and for the whole array).
  std::vector<float> sample = dense_sample();
  std::vector<float> part;
  for (std::size_t i = 0; i < sample.size(); i += 5) part.push_back(sample[i]);  // a fifth: it is long
  const emu::StreamId stream{.seed = 31, .point = 7, .replica = 1, .lane = 9};
  const std::uint64_t first = 12'345;
  for (const Config& cfg : all_configs())
    for (const int sr_bits : {0, 5, 16, 20}) {
      const emu::Format format = cfg.format->with_subnormals(cfg.subnormals);
      const emu::RoundSpec spec{.mode = emu::Rounding::sr, .overflow = cfg.overflow, .sr_bits = sr_bits};
      INFO(format.name() << " overflow " << emu::overflow_name(cfg.overflow) << " subnormals " << cfg.subnormals
                         << " sr_bits " << sr_bits);
      const emu::HalfRounding how(format, spec, stream);
      std::vector<documented::Expected> expected;
      emu::Flags expected_all = 0;
      for (std::size_t i = 0; i < part.size(); ++i) {
        expected.push_back(expected_sr(format, spec, part[i], stream, first + i));
        expected_all |= expected.back().flags;
      }
      for (int implementation = 0; implementation < 3; ++implementation) {
        INFO("implementation " << implementation);
        std::vector<std::uint16_t> bits(part.size());
        const auto all_flags = emu::detail::round_to_bits_with(implementation, how, part, bits, first);
        if (!all_flags) continue;
        CHECK(*all_flags == expected_all);
        std::size_t bit_mismatches = 0, chunk_flag_mismatches = 0;
        for (std::size_t i = 0; i < part.size(); ++i)
          if (bits[i] != expected[i].bits && ++bit_mismatches <= 5)
            FAIL_CHECK("x = " << part[i] << " bits " << bits[i] << " expected " << expected[i].bits);
        CHECK(bit_mismatches == 0);
        // Aligned 8-element calls (indices first + i multiples of 8).
        for (std::size_t i = (8 - first % 8) % 8; i + 8 <= part.size(); i += 8) {
          emu::Flags expected_chunk = 0;
          for (std::size_t k = i; k < i + 8; ++k) expected_chunk |= expected[k].flags;
          std::uint16_t chunk_bits[8];
          const auto chunk_flags = emu::detail::round_to_bits_with(implementation, how, std::span(&part[i], 8),
                                                                   std::span(chunk_bits, 8), first + i);
          if (*chunk_flags != expected_chunk && ++chunk_flag_mismatches <= 5)
            FAIL_CHECK("x = " << part[i] << ".. (8) flags " << int(*chunk_flags) << " expected "
                              << int(expected_chunk));
        }
        CHECK(chunk_flag_mismatches == 0);
      }
    }
}

TEST_CASE("sr settles r == floor(f 2^16) exactly with the tie-break block (fp16 below 2^-17)", "[convert]") {
  // For each element i, x is built so that the first 16 bits of f equal its r and f has
  // bits beyond them (a tie the first 16 random bits cannot decide), at several depths:
  // s = 17, 20, 23 (any r), 24 (r >= 2^15), 28 (r in [2^11, 2^12)), 40 (r = 0: the
  // decision is v < beta 2^128 with beta in [1/2, 1)), and a float32 subnormal (r = 0,
  // beta below 2^-85: down). Other elements get values whose r never ties.
  const emu::StreamId stream{.seed = 77, .lane = 1};
  const std::uint64_t first = 5'000'000'000ull;  // beyond 2^32: the counter's second word
  std::mt19937 gen(21);
  std::vector<float> in;
  std::vector<double> fractions;  // f of the tie elements, else -1
  int deep = 0, subnormal_inputs = 0;
  for (std::uint64_t t = first / 512; in.size() < 2'000'000 && (deep < 12 || subnormal_inputs < 4); ++t) {
    const auto r = documented::tile_r_bits(stream, t);
    for (std::uint64_t e = 0; e < 512; ++e) {
      const std::uint64_t i = 512 * t + e;
      if (i < first) continue;
      const std::uint32_t ri = r[e];
      const std::uint32_t fraction = gen() & 0x7FFFFFu;
      std::uint32_t s = 0;
      if (ri == 0) {
        s = (deep < 12) ? 40 : (subnormal_inputs < 4 ? 125 : 0);
      } else if (in.size() < 4000) {
        const std::uint32_t choice = gen() % 5;
        s = choice < 3 ? std::array<std::uint32_t, 3>{17, 20, 23}[choice]
            : choice == 3 ? (ri >= 0x8000 ? 24 : 0)
                          : (ri >= 0x800 && ri < 0x1000 ? 28 : 0);
      }
      if (s == 0) {  // no tie: a normal value (F16 has its low 3 bits clear; r may equal it)
        in.push_back(std::bit_cast<float>((127u << 23) | fraction));
        fractions.push_back(-1.0);
        continue;
      }
      std::uint32_t m;  // the significand with its hidden bit, s discarded bits
      if (s == 125) {
        m = (fraction | 1u) & 0x7FFFFFu;  // a float32 subnormal: no hidden bit
        ++subnormal_inputs;
      } else if (s <= 23) {
        const std::uint32_t d = s - 16;
        const std::uint32_t beyond = 1 + gen() % ((1u << d) - 1);
        m = (0x00800000u | (fraction << s)) & 0x00FFFFFFu;
        m = (m & ~((1u << s) - 1)) | (ri << d) | beyond;
      } else {
        // kept = 0: m itself is the discarded part; F16 = m >> (s - 16).
        const std::uint32_t d = s - 16;
        m = (d >= 24) ? (0x00800000u | fraction | 1u) : ((ri << d) | (1 + gen() % ((1u << d) - 1)));
        if (s == 40) ++deep;
      }
      const std::uint32_t exponent = s == 125 ? 0u : 126u - s;  // s = 13 + (113 - exponent)
      const auto sign = static_cast<std::uint32_t>(gen() & 1u) << 31;
      const float x = std::bit_cast<float>(sign | (exponent << 23) | (m & 0x7FFFFFu));
      in.push_back(x);
      const std::uint32_t rem = s >= 32 ? m : m & ((1u << s) - 1);
      fractions.push_back(std::ldexp(static_cast<double>(rem), -static_cast<int>(s)));
    }
  }
  REQUIRE(deep == 12);
  REQUIRE(subnormal_inputs == 4);
  for (const int sr_bits : {0, 17, 20, 32}) {
    INFO("sr_bits = " << sr_bits);
    const emu::HalfRounding how(emu::fp16(), {.mode = emu::Rounding::sr, .sr_bits = sr_bits}, stream);
    std::vector<std::uint16_t> bits(in.size()), pieces(in.size());
    emu::round_to_bits(how, in, bits, first);
    for (std::size_t start = 0; start < in.size();) {  // and in pieces: the same
      const std::size_t len = std::min<std::size_t>(1 + gen() % 3000, in.size() - start);
      emu::round_to_bits(how, std::span(in).subspan(start, len), std::span(pieces).subspan(start, len), first + start);
      start += len;
    }
    check_same(in, pieces, bits);
    for (int implementation = 0; implementation < 3; ++implementation) {  // every one: the same
      INFO("implementation " << implementation);
      std::vector<std::uint16_t> other(in.size());
      if (emu::detail::round_to_bits_with(implementation, how, in, other, first)) check_same(in, other, bits);
    }
    int ties = 0, ties_up = 0, deep_up = 0, mismatches = 0;
    for (std::size_t j = 0; j < in.size(); ++j) {
      const auto magnitude_bits = static_cast<std::uint16_t>(bits[j] & 0x7FFF);
      if (fractions[j] < 0) {  // in [1, 2): 0x3C00 + the top 10 fraction bits, or one more
        const std::uint32_t down = 0x3C00 + ((std::bit_cast<std::uint32_t>(in[j]) >> 13) & 0x3FF);
        if (bits[j] != down && bits[j] != down + 1 && ++mismatches <= 5) FAIL_CHECK("j = " << j << " x = " << in[j]);
        continue;
      }
      const double magnitude = std::fabs(static_cast<double>(in[j]));
      const auto kept = static_cast<std::uint16_t>(std::floor(magnitude * 0x1p24));  // subnormal ulps
      const bool up = documented::rounds_up(stream, first + j, documented::r_bits(stream, first + j), fractions[j],
                                            sr_bits);
      ++ties;
      ties_up += up ? 1 : 0;
      if (magnitude < 0x1p-24) deep_up += up ? 1 : 0;
      if (magnitude_bits != kept + (up ? 1 : 0) || (bits[j] >> 15) != (std::signbit(in[j]) ? 1 : 0)) {
        if (++mismatches <= 5) FAIL_CHECK("j = " << j << " x = " << in[j] << " got " << bits[j]);
      }
    }
    CHECK(mismatches == 0);
    CHECK(ties > 1000);
    CHECK(ties_up > 0);           // the tie-break did round up
    CHECK(ties_up < ties);        // and down
    CHECK(deep_up > 0);           // also where the result is 0 or the least subnormal
  }
}

TEST_CASE("every implementation gives the same bits and flags", "[convert]") {
  // The portable kernel, AVX2 and AVX-512F (those this build and CPU have) on the dense
  // sample, every configuration, whole array and in pieces; round_to_float too.
  const std::vector<float> sample = dense_sample();
  const emu::StreamId stream{.seed = 8, .point = 2, .replica = 3, .lane = 4};
  std::mt19937 gen(17);
  int implementations = 0;
  for (const Config& cfg : all_configs())
    for (const int sr_bits : {-1, 0, 3, 16, 17, 32}) {  // -1: rne
      const emu::Format format = cfg.format->with_subnormals(cfg.subnormals);
      const emu::RoundSpec spec{.mode = sr_bits < 0 ? emu::Rounding::rne : emu::Rounding::sr,
                                .overflow = cfg.overflow,
                                .sr_bits = std::max(sr_bits, 0)};
      INFO(format.name() << " overflow " << emu::overflow_name(cfg.overflow) << " subnormals " << cfg.subnormals
                         << " sr_bits " << sr_bits);
      const emu::HalfRounding how(format, spec, stream);
      std::vector<std::uint16_t> portable(sample.size());
      const auto portable_flags = emu::detail::round_to_bits_with(0, how, sample, portable, 99);
      REQUIRE(portable_flags.has_value());
      std::vector<float> portable_values(sample.size());
      CHECK(emu::detail::round_to_float_with(0, how, sample, portable_values, 99) == portable_flags);
      implementations = 1;
      for (int implementation = 1; implementation < 3; ++implementation) {
        INFO("implementation " << implementation);
        std::vector<std::uint16_t> bits(sample.size());
        const auto flags = emu::detail::round_to_bits_with(implementation, how, sample, bits, 99);
        if (!flags) continue;
        ++implementations;
        CHECK(*flags == *portable_flags);
        check_same(sample, bits, portable);
        // In place, as floats.
        std::vector<float> values = sample;
        CHECK(emu::detail::round_to_float_with(implementation, how, values, values, 99) == portable_flags);
        check_same(sample, values, portable_values, same_float);
        // Pieces of random lengths, aligned or not.
        std::vector<std::uint16_t> pieces(sample.size());
        emu::Flags piece_flags = 0;
        for (std::size_t start = 0; start < sample.size();) {
          const std::size_t len = std::min<std::size_t>(1 + gen() % 2000, sample.size() - start);
          piece_flags |= *emu::detail::round_to_bits_with(implementation, how, std::span(sample).subspan(start, len),
                                                          std::span(pieces).subspan(start, len), 99 + start);
          start += len;
        }
        check_same(sample, pieces, portable);
        CHECK(piece_flags == *portable_flags);
      }
    }
#ifdef __AVX2__
  CHECK(implementations >= 2);
#endif
  if (implementations < 3) WARN("no AVX-512F on this CPU: its kernels were not tested");
}

TEST_CASE("vector kernels equal the portable kernel vector by vector, flags included, on wide-range data",
          "[convert]") {
  // The vector kernels against the portable one (the reference), flags compared per
  // vector of 16 elements rather than per array, where one wrong flag hides behind the
  // others: |x| = 2^u with u uniform in (-30, 20) (bench_convert's wide-range data:
  // normal, subnormal, zero and overflowing results in most vectors) and in (-160, 20)
  // (float32 subnormals, results far below the least subnormal), fraction patterns of
  // the exponents where results are tiny or overflow, and specials, ties and overflow
  // boundaries in among them.
  std::mt19937_64 gen(23);
  std::vector<float> in;
  for (const double lowest : {-30.0, -160.0}) {
    std::uniform_real_distribution<double> exponent(lowest, 20.0);
    for (int i = 0; i < 40000; ++i) {
      const auto magnitude = static_cast<float>(std::exp2(exponent(gen)));
      in.push_back((gen() & 1u) != 0 ? -magnitude : magnitude);
    }
  }
  // Every exponent of the fp16 tiny range and of the top binades (both formats'
  // overflow), with a tie, a near-tie and a random fraction at every bit position.
  for (std::uint32_t e = 0; e < 256; ++e) {
    if ((e > 114 && e < 140) || (e > 143 && e < 252)) continue;
    for (int k = 0; k < 23; ++k)
      for (const std::uint32_t fraction : {1u << k, (1u << k) - 1, static_cast<std::uint32_t>(gen())})
        in.push_back(from_bits(static_cast<std::uint32_t>(gen() & 1u) << 31 | e << 23 | (fraction & 0x7FFFFFu)));
  }
  in.resize(in.size() / 16 * 16);
  // Vectors of values exact in both formats (m 2^e, m < 2^8, e in [-24, 7]: zeros, fp16
  // subnormals, normals), where one inexact, overflowing, tiny or special lane alone
  // decides the vector's flags.
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65520.0f, 65535.99f, 65536.0f,
                            0x1p-14f, 0x1.ffcp-15f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-149f, 0x1p-126f, 0x1.8p-24f,
                            0x1.0101p-20f, 0x1.0001p-10f};
  const std::size_t random_end = in.size();
  for (int v = 0; v < 4000; ++v) {
    const std::size_t start = in.size();
    for (int lane = 0; lane < 16; ++lane) {
      const auto m = static_cast<float>(gen() % 256);
      const float x = std::ldexp(m, static_cast<int>(gen() % 32) - 24);
      in.push_back((gen() & 1u) != 0 ? -x : x);
    }
    const std::uint64_t odd_ones = v % 4;  // 0 to 3: a random element or a special
    for (std::uint64_t i = 0; i < odd_ones; ++i)
      in[start + gen() % 16] = (gen() & 1u) != 0 ? in[gen() % random_end] : specials[gen() % std::size(specials)];
  }
  constexpr std::uint64_t kFirst = 512 * 7;  // vector j / 16 is elements [16 j, 16 j + 16) of the tiles
  const emu::StreamId stream{.seed = 31, .point = 1, .replica = 2, .lane = 3};
  int implementations = 0;
  for (const Config& cfg : all_configs())
    for (const int sr_bits : {-1, 0, 5, 16, 17, 32}) {  // -1: rne
      const emu::Format format = cfg.format->with_subnormals(cfg.subnormals);
      const emu::RoundSpec spec{.mode = sr_bits < 0 ? emu::Rounding::rne : emu::Rounding::sr,
                                .overflow = cfg.overflow,
                                .sr_bits = std::max(sr_bits, 0)};
      INFO(format.name() << " overflow " << emu::overflow_name(cfg.overflow) << " subnormals " << cfg.subnormals
                         << " sr_bits " << sr_bits);
      const emu::HalfRounding how(format, spec, stream);
      std::vector<std::uint16_t> expected(in.size());
      REQUIRE(emu::detail::round_to_bits_with(0, how, in, expected, kFirst));
      for (int implementation = 1; implementation < 3; ++implementation) {
        INFO("implementation " << implementation);
        std::vector<std::uint16_t> got(in.size());
        if (!emu::detail::round_to_bits_with(implementation, how, in, got, kFirst)) continue;
        implementations = std::max(implementations, implementation + 1);
        check_same(in, got, expected);
        std::size_t flag_mismatches = 0;
        for (std::size_t start = 0; start < in.size(); start += 16) {
          const auto vector = std::span(in).subspan(start, 16);
          std::array<std::uint16_t, 16> reference{}, bits{};
          const auto reference_flags = emu::detail::round_to_bits_with(0, how, vector, reference, kFirst + start);
          const auto flags = emu::detail::round_to_bits_with(implementation, how, vector, bits, kFirst + start);
          if ((flags != reference_flags || bits != reference) && flag_mismatches++ == 0)
            FAIL_CHECK("the vector at " << start << " differs: flags " << +*flags << ", expected "
                                        << +*reference_flags);
        }
        CHECK(flag_mismatches == 0);
      }
    }
#ifdef __AVX2__
  CHECK(implementations >= 2);
#endif
  if (implementations < 3) WARN("no AVX-512F on this CPU: its kernels were not tested");
}

TEST_CASE("every Philox implementation gives the documented blocks", "[convert]") {
  // The kernels use the fastest one the build and the CPU offer (AVX-512F is chosen at
  // run time); each must give emu::Philox4x32's blocks.
  const emu::StreamId stream{.seed = 0xdead'beef'0123'4567ull, .point = 11, .replica = 12, .lane = 13};
  bool ran[3] = {false, false, false};
  for (int implementation = 0; implementation < 3; ++implementation)
    for (const std::uint64_t tile : {0ull, 1ull, 12345ull, (1ull << 26) - 1, 1ull << 26, (1ull << 42) - 1}) {
      std::array<std::uint32_t, 256> words{};
      if (!emu::detail::philox_tile_words(implementation, stream, tile, words)) continue;
      ran[implementation] = true;
      std::size_t mismatches = 0;
      for (std::uint64_t b = 0; b < 64; ++b) {
        const auto block = documented::block(stream, 64 * tile + b);
        for (std::size_t w = 0; w < 4; ++w) mismatches += words[64 * w + b] != block[w] ? 1 : 0;
      }
      INFO("implementation " << implementation << " tile " << tile);
      CHECK(mismatches == 0);
    }
  CHECK(ran[0]);
#ifdef __AVX2__
  CHECK(ran[1]);
#endif
  if (!ran[2]) WARN("no AVX-512F on this CPU: its Philox implementation was not tested");
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
  // The kernels decide tininess before rounding: a spec asking for `after` is refused
  // (it would get before's UFLO silently), round_array takes it.
  const emu::RoundSpec after{.tininess = emu::Tininess::after};
  CHECK_FALSE(emu::HalfRounding::supports(emu::fp16(), after));
  CHECK_THROWS_AS(emu::HalfRounding(emu::bf16(), after), std::invalid_argument);
  const std::vector<double> just_below = {0x1p-14 - 0x1p-26};
  std::vector<double> rounded(1);
  CHECK(emu::round_array(emu::fp16(), after, just_below, rounded, nullptr) == emu::INEXACT);
  CHECK(rounded[0] == 0x1p-14);
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
