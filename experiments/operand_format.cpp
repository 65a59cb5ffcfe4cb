#include "operand_format.hpp"

#include <stdexcept>
#include <vector>

namespace roundoff {

OperandFormat operand_format_by_name(const std::string& name) {
  OperandFormat f;
  if (emu::is_block_format_name(name)) {
    f.block = &emu::block_format_by_name(name);
    return f;
  }
  try {
    f.scalar = emu::format_by_name(name);
  } catch (const std::invalid_argument& e) {
    std::string blocks;
    for (const char* const* n = emu::block_format_names(); *n != nullptr; ++n) blocks += std::string(" ") + *n;
    throw std::invalid_argument(std::string(e.what()) + "; or a block format:" + blocks);
  }
  return f;
}

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

std::vector<emu::BlockQuantized> quantize_rows(const emu::BlockFormat& f, std::span<double> values,
                                               std::size_t row_length) {
  emu::BlockSpec spec = emu::default_block_spec(f);
  if (f.has_tensor_scale()) spec.tensor_scale = emu::default_tensor_scale(f, values);
  std::vector<emu::BlockQuantized> rows;
  for (std::size_t first = 0; first < values.size(); first += row_length) {
    const std::span<double> row = values.subspan(first, row_length);
    rows.push_back(emu::quantize(f, row, spec, nullptr));  // rne: no random bits
    for (std::size_t i = 0; i < row.size(); ++i) row[i] = rows.back().value(i, f);
  }
  return rows;
}

}  // namespace roundoff
