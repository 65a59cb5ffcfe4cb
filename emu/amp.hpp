// Graphcore IPU AMP (accumulating matrix product) model.
//
// What is documented, and where:
//  - The instructions and their precisions (Tile Vertex ISA for Mk1/Mk2 IPUs,
//    docs.graphcore.ai/projects/isa; used in poplibs lib/poplin/codelets/asm/):
//    f16v4sisoamp (fp16 inputs, fp32 partials in and out), f16v4sihoamp (fp32 partials
//    in, fp16 out), f16v4hihoamp (fp16 partials in and out), f32sisoamp (fp32
//    throughout); the SLIC family (emu/slic.hpp) has the same precisions.
//  - One output channel of an f16v4 AMP pass is one input partial plus 16 fp16 products,
//    added in 4 sequential phases of 4-element dot products:
//      R = x_k . W0 + P;  R += x_k+1 . W1;  R += x_k+2 . W2;  R += x_k+3 . W3
//    (x_k: 4 fp16 inputs; poplibs issues the phases as TAMP_F16V4_E4_P0..P3 and feeds
//    16 input channels per pass: NUM_INCHAN_GROUPS 16 in conv_partial_1x1_half_half.S).
//    f32sisoamp takes one fp32 input per phase in 8 phases, 8 input channels per pass
//    (TAMP_F32_E4_P0..P7, NUM_INCHAN_GROUPS 8 in conv_partial_1x1_float_float.S).
//  - "If the accumulated partial sums of products are FP16, these are first expanded
//    to FP32, then added, then rounded back to FP16 ... Round to Nearest (ties to
//    even) or Stochastic Rounding" (Graphcore, AI-Float white paper,
//    docs.graphcore.ai/projects/ai-float-white-paper). Stochastic rounding is
//    $FP_CTL.ESR (Context::control.esr); NANOO selects NaN instead of clipping when a
//    half result overflows (graphcore/tensorflow docs, rand_and_fp.rst), here
//    Context::control.overflow == Overflow::nan. poplibs can switch SR off for AMP
//    vertices (matMul option disableSRForAMPVertices, include/poplin/MatMul.hpp;
//    the codelets clear $FP_ICTL.ESR, conv_sr_ctrl.h.S): run such a matmul with a
//    context whose esr is false.
//  - Internal widths, as quoted from IPU1 constants in roundoff's issue 4 (no public
//    text found to cite): exact 22-bit fp16 products, 33-bit adder inputs, 36-bit
//    adder output. The model keeps products exact (fp16 x fp16 and fp32 x fp32
//    products are exact in double).
//
// What is not documented, and is therefore a parameter of AmpConfig with a default:
//  - alignment truncation inside a phase (default: none, the phase sum is exact);
//  - whether the running fp32 value is rounded after every phase (default: yes, once
//    per phase, RNE into fp32).
// So the default phase is: R = RNE_fp32(exact(R + four products)), followed for fp16
// partials by a rounding into fp16 under the context (RNE, or SR when esr is set).
//
// Chaining (as poplibs does for more input channels than one pass takes): the inner
// dimension is cut into passes of products_per_pass() products in index order; each
// pass's result is written out in the partials format and fed to the next pass as its
// input partial (the codelets store partials to memory between input-channel groups
// and reload them). The last pass writes the output format. A short last pass simply
// has fewer phases (poplibs pads with zero channels, which add exactly nothing).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "arith.hpp"
#include "format.hpp"
#include "unit.hpp"

namespace emu {

// Poplar's partialsType option (matMul, convolution): the format of the partials that
// the AMP passes carry.
enum class PartialsType { half, float32 };
const char* partials_type_name(PartialsType p);            // "half", "float"
PartialsType partials_type_by_name(std::string_view name);  // throws std::invalid_argument
NameTable<PartialsType> partials_type_table();

struct AmpConfig {
  Format input = fp16();     // fp16 (f16v4*amp) or fp32 (f32sisoamp)
  Format partials = fp32();  // carried between passes: fp32, or fp16 (f16v4hihoamp)
  Format output = fp32();    // written by the last pass: the partials format, or fp16
                             // after fp32 partials (f16v4sihoamp)
  int products_per_phase = 4;
  int phases_per_pass = 4;

  // Undocumented behaviour, with the defaults described above.
  // Alignment inside a phase: kExactPhase keeps every term exact. A value b >= 0 aligns
  // the terms entering the phase adder (the running value and the phase's products) to
  // the largest exponent E among them (E = floor(log2 |t|)) and truncates each toward
  // zero (sign-magnitude) to a multiple of 2^(E - b), i.e. keeps b bits below the
  // leading bit of the largest term. (The IPU1 constant "33-bit adder inputs" hints at
  // b near 31; unverified.)
  static constexpr int kExactPhase = -1;
  int alignment_bits = kExactPhase;
  // true: after every phase the running value is rounded into fp32 (then, for fp16
  // partials, into fp16). false: the running value is kept exact through a pass and
  // rounded once, into the pass's output format, at its end; alignment then truncates
  // only the products (the carried value is the accumulator's own register).
  bool round_each_phase = true;
  // Rounding into fp32 (the accumulator). nullopt: the context's rounding (SR when
  // esr). Rounding into fp16 always follows the context: RNE, or SR when esr is set.
  std::optional<Rounding> accumulator_rounding = Rounding::rne;

  int products_per_pass() const { return products_per_phase * phases_per_pass; }
};

// The documented configurations: fp16 inputs with fp32 partials (f16v4sisoamp; with out
// fp16 the last pass is f16v4sihoamp), fp16 inputs with fp16 partials (f16v4hihoamp), fp32
// inputs with fp32 partials (f32sisoamp). `out` defaults to the partials format.
// Throws std::invalid_argument for any other combination.
AmpConfig amp_config(PartialsType partials, const Format& in = fp16(),
                     std::optional<Format> out = std::nullopt);

// Throws std::invalid_argument naming the field when a config is not one the model runs
// (formats other than fp16/fp32, fp32 inputs without fp32 partials and output, fp16
// partials with an fp32 output, counts < 1 or more than 64 products per pass,
// alignment_bits < -1 or > 200).
void validate(const AmpConfig& cfg);

// c + sum_{i<k} a[i*sa] * b[i*sb] through chained AMP passes. a and b hold values of
// cfg.input, c a value of cfg.partials (or of cfg.output). Rounding, esr, overflow
// policy and traps come from ctx, which collects the flags. cfg must be valid.
double amp_dot(Context& ctx, const AmpConfig& cfg, std::size_t k, const double* a, std::size_t sa,
               const double* b, std::size_t sb, double c);

// The AMP as a MatrixUnit (kind ipu_amp, or ipu_amp_half for fp16 partials): gemm is
// Poplar's matMul with the config's partialsType, every output channel one amp_dot.
// Validates the config.
// gemm's results and flags are those of amp_dot per channel, in row-major order; where
// amp_gemm_is_vectorised says so, it computes them many channels at a time (proving
// each phase's double sum exact, else taking amp_dot's exact path for that phase), B
// packed once for all the bands of rows that MatrixUnit::gemm's threads take.
std::unique_ptr<MatrixUnit> make_amp_unit(const AmpConfig& cfg);

// Whether gemm takes its vectorised path under ctx: a build with AVX2, FMA and F16C;
// fp16 inputs; exact phases (alignment_bits -1) of 4 products rounded after every phase;
// every rounding RNE; no traps; INEXACT and UFLO not counted (counting OFLO, DIV0 and
// INV keeps it: emu/amp.cpp, step 5); the host rounding to nearest without flushing
// subnormals. It also needs, checked per call, fp16 values in A and B and fp32 values
// (or NaN, inf) in C. Only the speed depends on it: results, flags, counts and the
// elements they name are those of the exact path.
bool amp_gemm_is_vectorised(const Context& ctx, const AmpConfig& cfg);

namespace detail {
// For tests, which compare them: the vectorised path's kernel for the gemm calls that
// follow, in the whole process: implementation 0 (AVX2, four lanes) or 1 (AVX-512,
// eight lanes: the default where the CPU has it). false, changing nothing, where this
// build or CPU lacks it.
bool select_amp_kernel(int implementation);
// Whether the vectorised path proves a phase exact for a whole tile of output channels
// from bounds tracked across phases (true, the default) or always lane by lane (false:
// the reference), for the gemm calls that follow, in the whole process. false,
// changing nothing, where this build has no vectorised path.
bool select_amp_proof(bool whole_tiles);
}  // namespace detail

// ---- 2-D convolution through the AMP (Poplar's convolution with partialsType) -------
//
// Layouts (row-major, the last index fastest): input N x C x H x W (NCHW), weights
// O x C x KH x KW (OIHW), partials_in and the result N x O x OH x OW, with
// OH = (H + 2 pad_h - KH) / stride_h + 1 and OW likewise. The convolution is the
// cross-correlation of neural networks (the kernel is not flipped), zero padding:
//   out[n][o][y][x] = partial + sum_{c, ky, kx} in[n][c][y sh + ky - ph][x sw + kx - pw] w[o][c][ky][kx]
//
// Accumulation order. poplibs' AMP convolution vertex (ConvPartialnx1, lib/poplin/
// codelets/ConvPartialnx1.cpp, the C++ form of conv_partial_nx1_*.S) loops over input
// channel groups, then kernel rows, then kernel columns; for each (group, ky, kx) it runs
// one AMP pass over the group's inChansPerGroup input channels and stores the partials
// (AccumType) back to memory, from which the next pass reloads them. The model does the
// same, with the group size the AMP's products_per_pass() (16 fp16 channels, 8 fp32
// channels for f32sisoamp: poplibs' usual inChansPerGroup):
//  - the input channels are cut into G = ceil(C / P) groups of P = products_per_pass()
//    channels, the last padded with zero channels (input and weight +0, as poplibs pads
//    channels; they add nothing);
//  - each output element is one amp_dot over the reduction index
//      r = ((g KH + ky) KW + kx) P + (c - g P)
//    so every AMP pass is exactly one (group, ky, kx) and its phases take consecutive
//    channels (4 per phase for fp16, 1 for fp32); positions in the padding contribute
//    +0 inputs times the weights;
//  - the pass results chain through the partials format, the last pass writes the
//    output format, the first pass starts from partials_in (zero when empty).
// Not modelled: poplibs' folding of several kernel rows into one pass for small channel
// counts (ampKernelHeight > 1); the padding to P channels stands for it.
// This is exactly the AMP gemm (make_amp_unit) of the im2col problem whose row for an
// output position (n, y, x) holds the input values in the order r, whose column o holds
// w[o] in the same order, and whose C holds the partials: results, flags and, under
// stochastic rounding, the random bits drawn, because the outputs are computed in that
// gemm's row-major order, n, y, x outer and o inner. Rounding, esr, NANOO (overflow
// policy) and traps come from ctx, which collects the status flags.
// Speed: where amp_gemm_is_vectorised(ctx, cfg), each image runs as that gemm on its
// vectorised path (the weights packed once for all images), whose counts are renamed to
// the convolution's elements [n, o, y, x] (flat index into the output); so results,
// flags and counts, with their elements and in their order, are those of the outputs
// computed one by one (tests/amp/test_conv.cpp). There the images run in bands on up to
// gemm_threads() threads (emu/threads.hpp), with the same outcome at any number of them
// (tests/mma/test_threads.cpp); traps and stochastic rounding run on the calling thread.
struct Conv2dShape {
  std::size_t batch = 1, in_channels = 1, height = 1, width = 1;       // N C H W
  std::size_t out_channels = 1, kernel_height = 1, kernel_width = 1;  // O, KH, KW
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t pad_h = 0, pad_w = 0;  // zeros above and below, left and right

  std::size_t out_height() const;
  std::size_t out_width() const;
  std::size_t input_size() const { return batch * in_channels * height * width; }
  std::size_t weights_size() const { return out_channels * in_channels * kernel_height * kernel_width; }
  std::size_t output_size() const { return batch * out_channels * out_height() * out_width(); }
};

// Throws std::invalid_argument for a zero dimension or stride, a kernel larger than the
// padded input, spans of the wrong size (partials_in may be empty: zeros), or an invalid
// cfg. Inputs hold values of cfg.input, partials_in values of cfg.partials.
std::vector<double> amp_conv2d(Context& ctx, const AmpConfig& cfg, const Conv2dShape& shape,
                               std::span<const double> input, std::span<const double> weights,
                               std::span<const double> partials_in = {});

// make_unit's entry point: ipu-amp (half_partials false: fp16 in, fp32 partials and
// out) and ipu-amp-half (fp16 in, fp16 partials and out); in = fp32 gives f32sisoamp,
// out = fp16 with fp32 partials gives an f16v4sihoamp last pass.
std::unique_ptr<MatrixUnit> make_ipu_amp_unit(bool half_partials, std::optional<Format> in,
                                              std::optional<Format> out);

}  // namespace emu
