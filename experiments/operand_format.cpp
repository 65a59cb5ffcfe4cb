#include "operand_format.hpp"

#include <stdexcept>

namespace roundoff {

std::string check_operand_format_name(const ParamValue& v) {
  const std::string* s = std::get_if<std::string>(&v);
  if (!s) return "expected a string";
  try {
    (void)operand_format_by_name(*s);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace roundoff
