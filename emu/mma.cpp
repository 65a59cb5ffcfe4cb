#include "mma.hpp"
#include <stdexcept>
namespace emu {
std::unique_ptr<MatrixUnit> make_tensor_core_unit(UnitKind preset, std::optional<Format>, std::optional<Format>) {
  throw std::invalid_argument(std::string("unit '") + unit_kind_name(preset) + "' is not modelled yet");
}
}  // namespace emu
