#include "names.hpp"

namespace emu {

void throw_unknown_name(std::string_view what, std::string_view name, const std::string& known) {
  throw std::invalid_argument("unknown " + std::string(what) + " '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace emu
