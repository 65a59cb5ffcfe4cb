#include "amp.hpp"
#include <stdexcept>
namespace emu {
std::unique_ptr<MatrixUnit> make_ipu_amp_unit(bool, std::optional<Format>, std::optional<Format>) {
  throw std::invalid_argument("unit 'ipu-amp' is not modelled yet");
}
}  // namespace emu
