// Every float32 input (all 2^32 patterns): the fp16 and bf16 rne kernels against the
// scalar emu::round, bit for bit and flag for flag, and fp16 also against F16C; and the
// sr kernels against the documented rule (documented_sr.hpp) with emu::round's results
// and flags for the direction it picks. Two threads; minutes (suite 'exhaustive').
#include <immintrin.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "emu/convert.hpp"
#include "documented_sr.hpp"

namespace {

struct Mismatches {
  std::atomic<std::uint64_t> bits{0}, flags{0}, f16c{0};
  std::atomic<std::uint32_t> first_bad_input{0};
};

void check_range(const emu::Format& format, std::uint64_t begin, std::uint64_t end, Mismatches& bad) {
  const emu::HalfRounding how(format, {});
  const emu::RoundSpec spec{};
  const bool is_fp16 = format.exponent_bits() == 5;
  constexpr std::size_t kChunk = 4096;
  std::vector<float> in(kChunk);
  std::vector<std::uint16_t> bits(kChunk);
  for (std::uint64_t start = begin; start < end; start += kChunk) {
    for (std::size_t j = 0; j < kChunk; ++j) in[j] = std::bit_cast<float>(static_cast<std::uint32_t>(start + j));
    emu::round_to_bits(how, in, bits);
    for (std::size_t j = 0; j < kChunk; j += 8) {
      alignas(16) std::uint16_t hw[8];
      if (is_fp16)
        _mm_store_si128(reinterpret_cast<__m128i*>(hw),
                        _mm256_cvtps_ph(_mm256_loadu_ps(&in[j]), _MM_FROUND_TO_NEAREST_INT));
      // The flags of an 8-element call (a kernel's vector path; single elements take
      // its scalar tail) must be the OR of the scalar ones.
      std::uint16_t eight[8];
      const emu::Flags eight_flags = emu::round_to_bits(how, std::span(&in[j], 8), std::span(eight, 8));
      emu::Flags expected_eight = 0;
      for (std::size_t k = j; k < j + 8; ++k) {
        emu::Flags expected_flags = 0;
        const double expected = emu::round(format, static_cast<double>(in[k]), spec, nullptr, expected_flags);
        expected_eight |= expected_flags;
        const auto expected_bits = static_cast<std::uint16_t>(format.encode(expected));
        std::uint16_t one = 0;
        const emu::Flags flags = emu::round_to_bits(how, std::span(&in[k], 1), std::span(&one, 1));
        bool wrong = false;
        if (bits[k] != expected_bits || one != expected_bits) ++bad.bits, wrong = true;
        if (flags != expected_flags) ++bad.flags, wrong = true;
        // F16C keeps NaN payloads where emu canonicalises: compare non-NaN inputs.
        if (is_fp16 && !std::isnan(in[k]) && hw[k - j] != bits[k]) ++bad.f16c, wrong = true;
        if (wrong) bad.first_bad_input = std::bit_cast<std::uint32_t>(in[k]);
      }
      if (eight_flags != expected_eight) ++bad.flags, bad.first_bad_input = std::bit_cast<std::uint32_t>(in[j]);
    }
  }
}

// sr: the element index is the input's bit pattern, so each input meets its own random
// bits. Whole 4096-element calls through every implementation this build and CPU have
// (emu::detail::round_to_bits_with), and aligned 8-element calls (the AVX2 vector width)
// through the fastest one, for their flags.
void check_sr_range(const emu::Format& format, const emu::RoundSpec& spec, std::uint64_t begin, std::uint64_t end,
                    Mismatches& bad) {
  const emu::StreamId stream{.seed = 2718, .point = 28, .lane = 1};
  const emu::HalfRounding how(format, spec, stream);
  constexpr std::size_t kChunk = 4096;  // a multiple of the 512-element tile
  std::vector<float> in(kChunk);
  std::vector<std::uint16_t> bits(kChunk), other(kChunk);
  for (std::uint64_t start = begin; start < end; start += kChunk) {
    for (std::size_t j = 0; j < kChunk; ++j) in[j] = std::bit_cast<float>(static_cast<std::uint32_t>(start + j));
    const emu::Flags chunk_flags = emu::round_to_bits(how, in, bits, start);
    for (int implementation = 0; implementation < 3; ++implementation) {
      const auto flags = emu::detail::round_to_bits_with(implementation, how, in, other, start);
      if (flags && (*flags != chunk_flags || other != bits))
        ++bad.bits, bad.first_bad_input = std::bit_cast<std::uint32_t>(in[0]);
    }
    emu::Flags expected_chunk = 0;
    std::array<std::uint16_t, 512> r{};
    for (std::size_t j = 0; j < kChunk; j += 8) {
      if (j % 512 == 0) r = documented::tile_r_bits(stream, (start + j) / 512);
      std::uint16_t eight[8];
      const emu::Flags eight_flags = emu::round_to_bits(how, std::span(&in[j], 8), std::span(eight, 8), start + j);
      emu::Flags expected_eight = 0;
      for (std::size_t k = j; k < j + 8; ++k) {
        const documented::Expected e = documented::expected_sr(format, spec, in[k], stream, start + k, r[k % 512]);
        expected_eight |= e.flags;
        if (bits[k] != e.bits || eight[k - j] != e.bits)
          ++bad.bits, bad.first_bad_input = std::bit_cast<std::uint32_t>(in[k]);
      }
      expected_chunk |= expected_eight;
      if (eight_flags != expected_eight) ++bad.flags, bad.first_bad_input = std::bit_cast<std::uint32_t>(in[j]);
    }
    if (chunk_flags != expected_chunk) ++bad.flags, bad.first_bad_input = std::bit_cast<std::uint32_t>(in[0]);
  }
}

void check_all(const emu::Format& format) {
  Mismatches bad;
  constexpr std::uint64_t kAll = std::uint64_t{1} << 32;
  std::thread other(check_range, std::cref(format), 0, kAll / 2, std::ref(bad));
  check_range(format, kAll / 2, kAll, bad);
  other.join();
  INFO(format.name() << ": a mismatching input 0x" << std::hex << bad.first_bad_input.load());
  CHECK(bad.bits == 0);
  CHECK(bad.flags == 0);
  CHECK(bad.f16c == 0);
}

void check_all_sr(const emu::Format& format, const emu::RoundSpec& spec, std::uint64_t count) {
  Mismatches bad;
  std::thread other(check_sr_range, std::cref(format), std::cref(spec), 0, count / 2, std::ref(bad));
  check_sr_range(format, spec, count / 2, count, bad);
  other.join();
  INFO(format.name() << " sr_bits " << spec.sr_bits << " overflow " << emu::overflow_name(spec.overflow)
                     << " subnormals " << format.subnormals() << ": a mismatching input 0x" << std::hex
                     << bad.first_bad_input.load());
  CHECK(bad.bits == 0);
  CHECK(bad.flags == 0);
}

}  // namespace

TEST_CASE("fp16 rne kernel on all 2^32 float32 inputs", "[convert][exhaustive]") { check_all(emu::fp16()); }

TEST_CASE("bf16 rne kernel on all 2^32 float32 inputs", "[convert][exhaustive]") { check_all(emu::bf16()); }

TEST_CASE("fp16 sr kernel (exact) on all 2^32 float32 inputs", "[convert][exhaustive]") {
  check_all_sr(emu::fp16(), {.mode = emu::Rounding::sr}, std::uint64_t{1} << 32);
}

TEST_CASE("bf16 sr kernel (exact) on all 2^32 float32 inputs", "[convert][exhaustive]") {
  check_all_sr(emu::bf16(), {.mode = emu::Rounding::sr}, std::uint64_t{1} << 32);
}

