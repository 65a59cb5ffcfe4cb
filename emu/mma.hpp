// NVIDIA tensor-core models (being written).
#pragma once
#include <memory>
#include <optional>
#include "unit.hpp"
namespace emu {
// A tensor-core preset (kind v100 ... b200) as a MatrixUnit.
std::unique_ptr<MatrixUnit> make_tensor_core_unit(UnitKind preset, std::optional<Format> in, std::optional<Format> out);
}  // namespace emu
