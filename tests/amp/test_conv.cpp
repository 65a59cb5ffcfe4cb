// 2-D convolution through the AMP (emu::amp_conv2d): its layout, stride and padding
// against a plain convolution (exact small integers), its accumulation order against the
// Boost/_Float16 oracle of oracle.hpp and the CPU's fp32 FMA, and bit for bit (flags and
// stochastic rounding included) against the AMP gemm of the same problem laid out as
// im2col. The index arithmetic below is the test's own.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../fp_counts.hpp"
#include "emu/amp.hpp"
#include "oracle.hpp"
#include "tests/gemm_problem.hpp"

using namespace emu;
using amp_oracle::Partials;

namespace {

bool same(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
}

struct Problem {
  Conv2dShape shape;
  std::vector<double> input, weights, partials;  // NCHW, OIHW, NOHW (partials may be empty)
};

double random_half(Rng& rng, double scale) {
  return static_cast<double>(static_cast<_Float16>(rng.normal() * scale));
}

Problem random_problem(Rng& rng, const Conv2dShape& shape, const AmpConfig& cfg, bool with_partials) {
  Problem p{shape, std::vector<double>(shape.input_size()), std::vector<double>(shape.weights_size()), {}};
  const bool fp32_in = cfg.input == fp32();
  auto draw = [&](double scale) {
    return fp32_in ? static_cast<double>(static_cast<float>(rng.normal() * scale)) : random_half(rng, scale);
  };
  for (double& x : p.input) x = draw(2.0);
  for (double& w : p.weights) w = draw(0.5);
  if (with_partials) {
    p.partials.resize(shape.output_size());
    const bool half = cfg.partials == fp16();
    for (double& c : p.partials)
      c = half ? random_half(rng, 4.0) : static_cast<double>(static_cast<float>(rng.normal() * 4));
  }
  return p;
}

// in[n][c][row - pad_h][col - pad_w], zero in the padding.
double input_at(const Problem& p, std::size_t n, std::size_t c, std::size_t row, std::size_t col) {
  const Conv2dShape& s = p.shape;
  if (row < s.pad_h || col < s.pad_w || row - s.pad_h >= s.height || col - s.pad_w >= s.width) return 0.0;
  return p.input[((n * s.in_channels + c) * s.height + row - s.pad_h) * s.width + col - s.pad_w];
}

// The documented reduction of output (n, ., y, x) for output channel o: for each channel
// group g of `group` channels, each kernel row, each kernel column, the group's channels
// (padded with zeros). Returns the inputs and the weights in that order.
void reduction(const Problem& p, std::size_t group, std::size_t n, std::size_t o, std::size_t y, std::size_t x,
               std::vector<double>& in, std::vector<double>& w) {
  const Conv2dShape& s = p.shape;
  in.clear();
  w.clear();
  for (std::size_t g = 0; g * group < s.in_channels; ++g)
    for (std::size_t ky = 0; ky < s.kernel_height; ++ky)
      for (std::size_t kx = 0; kx < s.kernel_width; ++kx)
        for (std::size_t c = g * group; c < (g + 1) * group; ++c) {
          const bool real = c < s.in_channels;
          in.push_back(real ? input_at(p, n, c, y * s.stride_h + ky, x * s.stride_w + kx) : 0.0);
          w.push_back(real ? p.weights[((o * s.in_channels + c) * s.kernel_height + ky) * s.kernel_width + kx] : 0.0);
        }
}

std::size_t out_index(const Conv2dShape& s, std::size_t n, std::size_t o, std::size_t y, std::size_t x) {
  return ((n * s.out_channels + o) * s.out_height() + y) * s.out_width() + x;
}

Conv2dShape shape(std::size_t n, std::size_t c, std::size_t h, std::size_t w, std::size_t o, std::size_t kh,
                  std::size_t kw, std::size_t sh, std::size_t sw, std::size_t ph, std::size_t pw) {
  Conv2dShape s;
  s.batch = n;
  s.in_channels = c;
  s.height = h;
  s.width = w;
  s.out_channels = o;
  s.kernel_height = kh;
  s.kernel_width = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.pad_h = ph;
  s.pad_w = pw;
  return s;
}

// Shapes with one and several channel groups, padded channels, strides and padding.
const Conv2dShape kShapes[] = {
    shape(1, 3, 5, 6, 2, 3, 3, 1, 1, 1, 1),   // 3 channels: one group, 13 padded
    shape(2, 20, 6, 5, 3, 3, 2, 2, 1, 1, 2),  // two groups (16 + 4), stride (2, 1), pad (1, 2)
    shape(1, 16, 4, 4, 4, 1, 1, 1, 1, 0, 0),  // 1x1: a plain matmul over 16 channels
    shape(1, 9, 7, 7, 2, 2, 4, 3, 2, 0, 1),   // 9 channels; f32sisoamp: groups of 8 + 1
};

}  // namespace

TEST_CASE("amp_conv2d: layout, stride and padding equal a plain convolution (exact integers)", "[amp][conv]") {
  // Small integers: every product and partial sum is exact, so any order gives the plain
  // convolution's value and only the indexing is tested.
  Rng rng(StreamId{31});
  for (const Conv2dShape& s : kShapes) {
    Problem p{s, std::vector<double>(s.input_size()), std::vector<double>(s.weights_size()), {}};
    for (double& x : p.input) x = static_cast<double>(static_cast<int>(rng.next_u64() % 9) - 4);
    for (double& w : p.weights) w = static_cast<double>(static_cast<int>(rng.next_u64() % 7) - 3);
    p.partials.resize(s.output_size());
    for (double& c : p.partials) c = static_cast<double>(static_cast<int>(rng.next_u64() % 11) - 5);
    for (PartialsType partials : {PartialsType::float32, PartialsType::half}) {
      Context ctx;
      const std::vector<double> out = amp_conv2d(ctx, amp_config(partials), s, p.input, p.weights, p.partials);
      REQUIRE(out.size() == s.output_size());
      CHECK(ctx.status() == 0);  // exact throughout
      for (std::size_t n = 0; n < s.batch; ++n)
        for (std::size_t o = 0; o < s.out_channels; ++o)
          for (std::size_t y = 0; y < s.out_height(); ++y)
            for (std::size_t x = 0; x < s.out_width(); ++x) {
              // out[n][o][y][x] = partial + sum in[n][c][y sh + ky - ph][x sw + kx - pw] w[o][c][ky][kx]
              const std::size_t at = out_index(s, n, o, y, x);
              double want = p.partials[at];
              for (std::size_t c = 0; c < s.in_channels; ++c)
                for (std::size_t ky = 0; ky < s.kernel_height; ++ky)
                  for (std::size_t kx = 0; kx < s.kernel_width; ++kx) {
                    const long row = static_cast<long>(y * s.stride_h + ky) - static_cast<long>(s.pad_h);
                    const long col = static_cast<long>(x * s.stride_w + kx) - static_cast<long>(s.pad_w);
                    if (row < 0 || col < 0 || row >= static_cast<long>(s.height) || col >= static_cast<long>(s.width))
                      continue;
                    want += p.input[((n * s.in_channels + c) * s.height + static_cast<std::size_t>(row)) * s.width +
                                    static_cast<std::size_t>(col)] *
                            p.weights[((o * s.in_channels + c) * s.kernel_height + ky) * s.kernel_width + kx];
                  }
              INFO("n " << n << " o " << o << " y " << y << " x " << x);
              REQUIRE(out[at] == want);
            }
    }
  }
  // Output sizes: (H + 2 ph - KH) / sh + 1.
  CHECK(kShapes[1].out_height() == 3);  // (6 + 2 - 3) / 2 + 1
  CHECK(kShapes[1].out_width() == 8);   // (5 + 4 - 2) / 1 + 1
  CHECK(kShapes[3].out_height() == 2);  // (7 - 2) / 3 + 1
  CHECK(kShapes[3].out_width() == 3);   // (7 + 2 - 4) / 2 + 1
}

TEST_CASE("amp_conv2d: each output is the documented AMP accumulation (Boost and _Float16 oracle)", "[amp][conv]") {
  Rng rng(StreamId{32});
  for (PartialsType partials : {PartialsType::float32, PartialsType::half}) {
    const AmpConfig cfg = amp_config(partials);
    const Partials oracle_partials = partials == PartialsType::half ? Partials::fp16 : Partials::fp32;
    for (const Conv2dShape& s : kShapes) {
      const Problem p = random_problem(rng, s, cfg, s.batch == 2 || s.in_channels == 3);
      Context ctx;
      const std::vector<double> out = amp_conv2d(ctx, cfg, s, p.input, p.weights, p.partials);
      std::vector<double> in, w;
      for (std::size_t n = 0; n < s.batch; ++n)
        for (std::size_t o = 0; o < s.out_channels; ++o)
          for (std::size_t y = 0; y < s.out_height(); ++y)
            for (std::size_t x = 0; x < s.out_width(); ++x) {
              reduction(p, 16, n, o, y, x, in, w);
              const std::size_t at = out_index(s, n, o, y, x);
              const double partial = p.partials.empty() ? 0.0 : p.partials[at];
              INFO(partials_type_name(partials) << " C " << s.in_channels << " at " << at);
              REQUIRE(same(out[at], amp_oracle::amp_reference(in, w, partial, oracle_partials)));
            }
      CHECK((ctx.status() & INEXACT) != 0);  // the data does round
    }
  }
}

TEST_CASE("amp_conv2d with fp32 inputs (f32sisoamp): groups of 8 channels, a float FMA per product",
          "[amp][conv]") {
  Rng rng(StreamId{33});
  const AmpConfig cfg = amp_config(PartialsType::float32, fp32());
  REQUIRE(cfg.products_per_pass() == 8);
  const Conv2dShape& s = kShapes[3];  // 9 channels: a group of 8 and one of 1 (7 padded)
  const Problem p = random_problem(rng, s, cfg, true);
  Context ctx;
  const std::vector<double> out = amp_conv2d(ctx, cfg, s, p.input, p.weights, p.partials);
  std::vector<double> in, w;
  for (std::size_t o = 0; o < s.out_channels; ++o)
    for (std::size_t y = 0; y < s.out_height(); ++y)
      for (std::size_t x = 0; x < s.out_width(); ++x) {
        reduction(p, 8, 0, o, y, x, in, w);
        const std::size_t at = out_index(s, 0, o, y, x);
        float want = static_cast<float>(p.partials[at]);
        for (std::size_t r = 0; r < in.size(); ++r)
          want = std::fma(static_cast<float>(in[r]), static_cast<float>(w[r]), want);  // hardware fp32 FMA
        REQUIRE(same(out[at], want));
      }
}

TEST_CASE("amp_conv2d equals the AMP gemm of the im2col problem: values, flags, stochastic rounding",
          "[amp][conv]") {
  struct Setup {
    const char* label;
    PartialsType partials;
    bool fp32_in, esr;
    Overflow overflow;
  };
  const Setup setups[] = {
      {"float partials, rne", PartialsType::float32, false, false, Overflow::inf},
      {"half partials, rne", PartialsType::half, false, false, Overflow::inf},
      {"half partials, esr (sr)", PartialsType::half, false, true, Overflow::inf},
      {"half partials, nanoo", PartialsType::half, false, false, Overflow::nan},
      {"fp32 inputs", PartialsType::float32, true, false, Overflow::inf},
  };
  Rng rng(StreamId{34});
  for (const Setup& setup : setups)
    for (const Conv2dShape& s : kShapes) {
      const AmpConfig cfg = amp_config(setup.partials, setup.fp32_in ? fp32() : fp16());
      const std::size_t group = static_cast<std::size_t>(cfg.products_per_pass());
      Problem p = random_problem(rng, s, cfg, true);
      if (setup.overflow == Overflow::nan) {  // push output channel 0 past fp16's range
        for (std::size_t i = 0; i < p.input.size(); i += 5) p.input[i] = 30000.0;  // an fp16 value
        for (std::size_t i = 0; i < s.weights_size() / s.out_channels; ++i) p.weights[i] = 8.0;
      }
      // im2col: row (n, y, x), column o; k in the documented order; C the partials.
      const std::size_t rows = s.batch * s.out_height() * s.out_width();
      std::vector<double> in, w;
      reduction(p, group, 0, 0, 0, 0, in, w);
      const std::size_t k = in.size();
      std::vector<double> A(rows * k), B(k * s.out_channels), C(rows * s.out_channels);
      for (std::size_t n = 0; n < s.batch; ++n)
        for (std::size_t y = 0; y < s.out_height(); ++y)
          for (std::size_t x = 0; x < s.out_width(); ++x) {
            const std::size_t row = (n * s.out_height() + y) * s.out_width() + x;
            for (std::size_t o = 0; o < s.out_channels; ++o) {
              reduction(p, group, n, o, y, x, in, w);
              REQUIRE(in.size() == k);
              for (std::size_t q = 0; q < k; ++q) {
                A[row * k + q] = in[q];
                B[q * s.out_channels + o] = w[q];
              }
              C[row * s.out_channels + o] = p.partials[out_index(s, n, o, y, x)];
            }
          }
      FpControl control;
      control.esr = setup.esr;
      control.overflow = setup.overflow;
      Context conv_ctx(control, Rng(StreamId{77, 1}));
      Context gemm_ctx(control, Rng(StreamId{77, 1}));
      const std::vector<double> out = amp_conv2d(conv_ctx, cfg, s, p.input, p.weights, p.partials);
      make_amp_unit(cfg)->gemm(gemm_ctx, rows, s.out_channels, k, A.data(), k, B.data(), s.out_channels, C.data(),
                               s.out_channels);
      std::size_t differ = 0, nans = 0;
      for (std::size_t n = 0; n < s.batch; ++n)
        for (std::size_t y = 0; y < s.out_height(); ++y)
          for (std::size_t x = 0; x < s.out_width(); ++x)
            for (std::size_t o = 0; o < s.out_channels; ++o) {
              const double conv = out[out_index(s, n, o, y, x)];
              const double gemm = C[((n * s.out_height() + y) * s.out_width() + x) * s.out_channels + o];
              differ += !same(conv, gemm);
              nans += std::isnan(conv);
            }
      INFO(setup.label << ", C " << s.in_channels << " KH " << s.kernel_height << " KW " << s.kernel_width);
      CHECK(differ == 0);
      CHECK(int{conv_ctx.status()} == int{gemm_ctx.status()});
      if (setup.overflow == Overflow::nan) {
        CHECK(nans > 0);  // NANOO turned overflowing fp16 partials into NaN
        CHECK((conv_ctx.status() & (OFLO | INV)) == (OFLO | INV));
      }
    }
}

TEST_CASE("amp_conv2d honours esr and traps of the context", "[amp][conv][sr]") {
  // One output: 16 channels of 1x1, each product 2^-12 * 2^-1 = 2^-13 into a half
  // partial of 1: with RNE every phase (1 + 4 * 2^-13 = 1 + 0.5 ulp of fp16, a tie) stays
  // at 1 (swamping); with esr the mean follows the exact 1 + 16 * 2^-13 = 1.001953125.
  const Conv2dShape s = shape(1, 16, 1, 1, 1, 1, 1, 1, 1, 0, 0);
  const std::vector<double> input(16, 0x1p-12), weights(16, 0.5), partial{1.0};
  const AmpConfig cfg = amp_config(PartialsType::half);
  Context rne;
  CHECK(amp_conv2d(rne, cfg, s, input, weights, partial)[0] == 1.0);
  CHECK(rne.status() == INEXACT);
  FpControl esr;
  esr.esr = true;
  Context sr(esr, Rng(StreamId{35}));
  double sum = 0;
  const int runs = 4000;
  for (int r = 0; r < runs; ++r) {
    const double v = amp_conv2d(sr, cfg, s, input, weights, partial)[0];
    REQUIRE(v >= 1.0);
    REQUIRE(v <= 1.0 + 4 * 0x1p-10);
    sum += v;
  }
  // Each phase adds 2^-11 = ulp / 2 in expectation; sd of the mean ~ 2^-10 / sqrt(4000).
  CHECK(std::fabs(sum / runs - (1.0 + 16 * 0x1p-13)) < 0x1p-10 * 0.1);

  // An overflowing fp16 partial traps when OFLO traps.
  const std::vector<double> big(16, 256.0);
  FpControl trap;
  trap.traps = OFLO;
  Context trapping(trap);
  CHECK_THROWS_AS(amp_conv2d(trapping, cfg, s, big, big, partial), FpException);
  CHECK((trapping.status() & OFLO) != 0);
}

TEST_CASE("amp_conv2d reports the element [n, o, y, x] of its counts and traps", "[amp][conv]") {
  // N 2, C 3, 4 x 5 input, O 3, 3 x 3 kernel, stride 1, padding 1: output 2 x 3 x 4 x 5.
  // The input at (n 1, c 2, row 2, col 3) and the weights of (o 2, c 2, ky 1, kx 1) are
  // 256: that product lands (among others) in output [1, 2, 2, 3], 65536 past fp16's
  // range; the outputs whose kernel covers the big input in other positions see products
  // of 256 with ordinary weights only.
  const Conv2dShape s = shape(2, 3, 4, 5, 3, 3, 3, 1, 1, 1, 1);
  std::vector<double> input(s.input_size(), 0.5), weights(s.weights_size(), 0.25);
  input[((1 * 3 + 2) * 4 + 2) * 5 + 3] = 256.0;
  weights[((2 * 3 + 2) * 3 + 1) * 3 + 1] = 256.0;
  const AmpConfig cfg = amp_config(PartialsType::half);
  const std::int64_t flat = ((1 * 3 + 2) * 4 + 2) * 5 + 3;  // NOHW
  FpControl count;
  count.counted = OFLO;
  Context counting(count);
  {
    Scope scope(counting, "conv1");
    const std::vector<double> out = amp_conv2d(counting, cfg, s, input, weights);
    CHECK(std::isinf(out[static_cast<std::size_t>(flat)]));
  }
  REQUIRE(counting.counts().size() == 1);
  const OpCount& c = counting.counts()[0];
  CHECK(c.scope == "conv1");
  CHECK(c.op == "amp");
  CHECK(c.count == 1);
  CHECK(c.first_element.flat == flat);
  CHECK(c.first_element.to_string() == "[1, 2, 2, 3]");
  CHECK(std::isinf(c.first_result));
  FpControl trap;
  trap.traps = OFLO;
  Context trapping(trap);
  try {
    amp_conv2d(trapping, cfg, s, input, weights);
    FAIL("no trap");
  } catch (const FpException& e) {
    CHECK(e.report().flag == OFLO);
    CHECK(e.report().element.to_string() == "[1, 2, 2, 3]");
    CHECK(std::isinf(e.report().result));
  }
}

TEST_CASE("amp_conv2d's vectorised path: values, flags and counts with their [n, o, y, x] elements, as computed "
          "output by output",
          "[amp][conv]") {
  // The reference is the documented definition run element by element in the order
  // n, y, x, then o, each output one amp_dot with its element set; amp_conv2d runs an
  // image as one gemm (emu/amp.cpp) and must count the same elements in the same order.
  // Inputs: ordinary values, wide exponent spans (phases the kernel cannot prove exact),
  // values that overflow fp16 partials, zero weights, and an image with a NaN and an
  // infinity (inf * 0 raises INV).
  struct Setup {
    const char* label;
    PartialsType partials;
    Overflow overflow;
  };
  const Setup setups[] = {
      {"float partials", PartialsType::float32, Overflow::inf},
      {"half partials", PartialsType::half, Overflow::inf},
      {"half partials, nanoo", PartialsType::half, Overflow::nan},
      {"float partials, nanoo", PartialsType::float32, Overflow::nan},
  };
  Rng rng(StreamId{36});
  for (const Setup& setup : setups)
    for (const Conv2dShape& base : kShapes) {
      Conv2dShape s = base;
      s.batch = 3;
      const AmpConfig cfg = amp_config(setup.partials);
      const std::size_t group = static_cast<std::size_t>(cfg.products_per_pass());
      Problem p = random_problem(rng, s, cfg, true);
      for (double& x : p.input) {
        const std::size_t r = gemm_test::pick(rng, 40);
        if (r == 0) x = 30000.0 * gemm_test::sign(rng);                                  // overflows
        if (r == 1) x = std::ldexp(gemm_test::sign(rng), -24 + int(gemm_test::pick(rng, 10)));  // wide spans
      }
      for (double& x : p.weights)
        if (gemm_test::pick(rng, 8) == 0) x = 0.0;
      const std::size_t kernel = s.kernel_height * s.kernel_width;
      for (std::size_t r = 0; r < kernel; ++r) p.weights[s.in_channels * kernel + r] = 0.0;  // o 1, c 0: inf * 0
      p.weights[0] = 60000.0;
      const std::size_t per_image = s.in_channels * s.height * s.width;
      p.input[2 * per_image + 1] = std::numeric_limits<double>::quiet_NaN();  // image 2: the exact path
      p.input[2 * per_image + 3] = -std::numeric_limits<double>::infinity();
      FpControl control;
      control.overflow = setup.overflow;
      control.counted = OFLO | INV | DIV0;
      Context conv_ctx(control), reference(control);
      CHECK(amp_gemm_is_vectorised(conv_ctx, cfg) == gemm_test::simd_build());
      std::vector<double> out;
      {
        const Scope scope(conv_ctx, "conv");
        out = amp_conv2d(conv_ctx, cfg, s, p.input, p.weights, p.partials);
      }
      const Scope scope(reference, "conv");
      std::vector<double> in, w;
      std::size_t differ = 0, nonfinite = 0;
      for (std::size_t n = 0; n < s.batch; ++n)
        for (std::size_t y = 0; y < s.out_height(); ++y)
          for (std::size_t x = 0; x < s.out_width(); ++x)
            for (std::size_t o = 0; o < s.out_channels; ++o) {
              reduction(p, group, n, o, y, x, in, w);
              const std::size_t at = out_index(s, n, o, y, x);
              const ElementGuard element(reference, static_cast<std::int64_t>(at),
                                         {static_cast<std::int64_t>(n), static_cast<std::int64_t>(o),
                                          static_cast<std::int64_t>(y), static_cast<std::int64_t>(x)});
              const double want = amp_dot(reference, cfg, in.size(), in.data(), 1, w.data(), 1, p.partials[at]);
              differ += !same(out[at], want);
              nonfinite += !std::isfinite(want);
            }
      INFO(setup.label << ", C " << s.in_channels << " KH " << s.kernel_height << " KW " << s.kernel_width);
      CHECK(differ == 0);
      CHECK(nonfinite > 0);
      CHECK(int{conv_ctx.status()} == int{reference.status()});
      CHECK(!reference.counts().empty());
      fp_counts::check_same_counts(conv_ctx.counts(), reference.counts());
    }
}

TEST_CASE("amp_conv2d refuses malformed arguments", "[amp][conv]") {
  Context ctx;
  const AmpConfig cfg = amp_config(PartialsType::float32);
  const Conv2dShape s = shape(1, 2, 3, 3, 1, 2, 2, 1, 1, 0, 0);
  const std::vector<double> input(s.input_size(), 1.0), weights(s.weights_size(), 1.0);
  CHECK(amp_conv2d(ctx, cfg, s, input, weights).size() == 4);
  CHECK_THROWS_AS(amp_conv2d(ctx, cfg, s, weights, weights), std::invalid_argument);
  CHECK_THROWS_AS(amp_conv2d(ctx, cfg, s, input, input), std::invalid_argument);
  CHECK_THROWS_AS(amp_conv2d(ctx, cfg, s, input, weights, input), std::invalid_argument);
  Conv2dShape bad = s;
  bad.stride_w = 0;
  CHECK_THROWS_AS(amp_conv2d(ctx, cfg, bad, input, weights), std::invalid_argument);
  bad = s;
  bad.kernel_height = 4;  // larger than the (unpadded) input
  CHECK_THROWS_AS(amp_conv2d(ctx, cfg, bad, input, std::vector<double>(bad.weights_size(), 1.0)),
                  std::invalid_argument);
  bad.pad_h = 1;  // fits with padding: (3 + 2 - 4) / 1 + 1 = 2 rows, 2 columns
  CHECK(amp_conv2d(ctx, cfg, bad, input, std::vector<double>(bad.weights_size(), 1.0)).size() == 4);
}
