// Speed of the array rounding kernels (emu/convert.hpp), single-threaded, against two
// references measured in the same run: memcpy of the float32 array and the CPU's F16C
// conversion (_mm256_cvtps_ph). Prints Melem/s (best of 5, thread CPU time) and the
// ratios, and the speed of sr's random words per Philox implementation; never fails on
// speed.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "emu/convert.hpp"

namespace {

constexpr std::size_t kCount = 10'000'000;
constexpr int kRepetitions = 5;

// CPU time of this thread: on a shared machine, wall-clock time would also count the
// time slices given to other processes, which penalises the longer-running kernels.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best (shortest) thread CPU time of kRepetitions runs, in seconds.
double best_seconds(const std::function<void()>& work) {
  double best = 1e300;
  for (int i = 0; i < kRepetitions; ++i) {
    const double start = thread_seconds();
    work();
    best = std::min(best, thread_seconds() - start);
  }
  return best;
}

void f16c_convert(const std::vector<float>& in, std::vector<std::uint16_t>& out) {
  std::size_t j = 0;
  for (; j + 8 <= in.size(); j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in.data() + j), _MM_FROUND_TO_NEAREST_INT));
  for (; j < in.size(); ++j) out[j] = _cvtss_sh(in[j], _MM_FROUND_TO_NEAREST_INT);
}

void run_data_set(const char* title, const std::vector<float>& data) {
  std::vector<float> copy(data.size());
  std::vector<std::uint16_t> bits(data.size());
  std::printf("\n%s (%zu float32 values)\n", title, data.size());
  std::printf("  %-22s %12s %10s %10s\n", "kernel", "Melem/s", "x F16C", "x memcpy");

  const double memcpy_s =
      best_seconds([&] { std::memcpy(copy.data(), data.data(), data.size() * sizeof(float)); });
  const double f16c_s = best_seconds([&] { f16c_convert(data, bits); });
  auto report = [&](const char* name, double seconds) {
    std::printf("  %-22s %12.1f %10.3f %10.3f\n", name, data.size() / seconds * 1e-6, f16c_s / seconds,
                memcpy_s / seconds);
  };
  report("memcpy", memcpy_s);
  report("F16C cvtps_ph", f16c_s);

  const emu::StreamId stream{.seed = 2024, .point = 0, .replica = 0, .lane = 7};
  struct Case {
    const char* name;
    const emu::Format& format;
    emu::Rounding mode;
  };
  const Case cases[] = {{"emu fp16 rne", emu::fp16(), emu::Rounding::rne},
                        {"emu fp16 sr", emu::fp16(), emu::Rounding::sr},
                        {"emu bf16 rne", emu::bf16(), emu::Rounding::rne},
                        {"emu bf16 sr", emu::bf16(), emu::Rounding::sr}};
  emu::Flags flags = 0;
  for (const Case& c : cases) {
    const emu::HalfRounding how(c.format, emu::RoundSpec{.mode = c.mode}, stream);
    report(c.name, best_seconds([&] { flags |= emu::round_to_bits(how, data, bits); }));
  }
  // The float-output variant, for scale.
  for (const Case& c : cases) {
    const emu::HalfRounding how(c.format, emu::RoundSpec{.mode = c.mode}, stream);
    const std::string name = std::string(c.name) + " ->float";
    report(name.c_str(), best_seconds([&] { flags |= emu::round_to_float(how, data, copy); }));
  }
  // Where the CPU has AVX-512F (the kernels then use it), the AVX2 kernels as well: what
  // a CPU without it gets.
  if (emu::detail::round_to_bits_with(2, emu::HalfRounding(emu::fp16(), {}), {}, {})) {
    for (const Case& c : cases) {
      const emu::HalfRounding how(c.format, emu::RoundSpec{.mode = c.mode}, stream);
      const std::string name = std::string(c.name) + " [AVX2]";
      report(name.c_str(), best_seconds([&] { flags |= *emu::detail::round_to_bits_with(1, how, data, bits); }));
    }
  }
  std::printf("  (flags raised: %s)\n", [&] {
    std::string s;
    for (const auto& n : emu::flag_names(flags)) s += n + " ";
    return s;
  }().c_str());
}

// The random words of sr (Philox4x32-10, 64 blocks = 256 words per tile) from each
// implementation the build and the CPU offer; the kernels use the fastest.
void run_philox() {
  std::printf("\nsr random words (Philox4x32-10), per implementation\n");
  std::printf("  %-22s %12s\n", "implementation", "Mwords/s");
  const emu::StreamId stream{.seed = 2024, .lane = 7};
  constexpr std::uint64_t kTiles = 100'000;
  const char* names[] = {"portable", "AVX2", "AVX-512F"};
  for (int implementation = 0; implementation < 3; ++implementation) {
    std::array<std::uint32_t, 256> words{};
    if (!emu::detail::philox_tile_words(implementation, stream, 0, words)) {
      std::printf("  %-22s %12s\n", names[implementation], "(not here)");
      continue;
    }
    const std::uint64_t tiles = implementation == 0 ? kTiles / 10 : kTiles;
    const double seconds = best_seconds([&] {
      for (std::uint64_t t = 0; t < tiles; ++t) emu::detail::philox_tile_words(implementation, stream, t, words);
    });
    std::printf("  %-22s %12.1f\n", names[implementation], static_cast<double>(tiles * 256) / seconds * 1e-6);
  }
}

}  // namespace

int main() {
  std::mt19937_64 gen(12345);
  std::vector<float> uniform(kCount), wide(kCount);
  std::uniform_real_distribution<float> in_range(-100.0f, 100.0f);
  for (float& x : uniform) x = in_range(gen);
  // |x| = 2^u, u uniform in (-30, 20), random sign: many fp16 subnormal, zero and
  // overflow results.
  std::uniform_real_distribution<double> exponent(-30.0, 20.0);
  std::bernoulli_distribution negative(0.5);
  for (float& x : wide) {
    const auto magnitude = static_cast<float>(std::exp2(exponent(gen)));
    x = negative(gen) ? -magnitude : magnitude;
  }
  std::printf("convert benchmark: single thread, best of %d runs (thread CPU time); targets (issue 22): fp16 rne "
              ">= 0.95x F16C, fp16 sr >= 0.9x, bf16 rne and sr >= 0.95x\n",
              kRepetitions);
  run_data_set("uniform in [-100, 100]", uniform);
  run_data_set("|x| = 2^u, u uniform in (-30, 20), random sign", wide);
  run_philox();
  return 0;
}
