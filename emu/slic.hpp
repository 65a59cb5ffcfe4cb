// Graphcore IPU SLIC (slim convolution) model: 1-D convolution with the AMP's
// accumulation rules.
//
// The SLIC instructions come in the AMP's precisions (fp16 inputs with fp32 or fp16
// partials, fp32 throughout; Tile Vertex ISA, docs.graphcore.ai/projects/isa) and poplibs
// drives them with 1x4 kernel slices (lib/poplin/codelets/ConvPartial1x4SLIC.cpp and
// asm/ConvPartial1x4SLIC_*.S). The arrangement of taps inside the instruction is not
// documented; the model accumulates each output point as the AMP does a dot product:
// the kernel taps in order, products_per_phase taps per phase (4: one 1x4 slice), one
// rounding per phase, passes chained through the partials format (emu/amp.hpp).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "amp.hpp"

namespace emu {

// out[i] = partials_in[i] + sum_{j < kernel.size()} signal[i * stride + j] * kernel[j]
// for i < (signal.size() - kernel.size()) / stride + 1 ("valid" cross-correlation, the
// convolution of neural networks: the kernel is not flipped). partials_in is empty
// (zeros) or one value per output, in cfg.partials. signal and kernel hold values of
// cfg.input (build cfg with amp_config(PartialsType::half or ::float32, ...)).
// Throws std::invalid_argument for an empty kernel, a kernel longer than the signal,
// stride 0, a partials_in of the wrong length, or an invalid cfg.
std::vector<double> slic_conv1d(Context& ctx, const AmpConfig& cfg, std::span<const double> signal,
                                std::span<const double> kernel, std::size_t stride = 1,
                                std::span<const double> partials_in = {});

}  // namespace emu
