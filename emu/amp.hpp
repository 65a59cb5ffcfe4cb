// Graphcore IPU AMP models (being written).
#pragma once
#include <memory>
#include <optional>
#include "unit.hpp"
namespace emu {
// IPU AMP (f16v4sisoamp with float partials, f16v4hihoamp with half partials) as a MatrixUnit.
std::unique_ptr<MatrixUnit> make_ipu_amp_unit(bool half_partials, std::optional<Format> in, std::optional<Format> out);
}  // namespace emu
