// Format parameters that also take a block format (OCP MX, NVFP4: emu/block.hpp), for
// experiments whose values are arrays that such a format can hold (operands of a
// matrix product, activation vectors): the values are quantised in blocks and replaced
// by their dequantised values, which the experiment then uses as it uses values
// rounded into a scalar format.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "emu/block.hpp"
#include "emu/format.hpp"
#include "experiment.hpp"

namespace roundoff {

struct OperandFormat {
  std::optional<emu::Format> scalar;    // a format emu::format_by_name knows, or
  const emu::BlockFormat* block = nullptr;  // a block format
  // The name a format has (its canonical name; a block format's name).
  std::string name() const { return block ? block->name() : scalar->name(); }
};

// Throws std::invalid_argument naming both kinds of format.
OperandFormat operand_format_by_name(const std::string& name);
// For string_param: any format or block format emu knows.
std::string check_operand_format_name(const ParamValue& v);

// Quantises the row-major matrix `values` (rows of `row_length` values, blocks along
// each row: the reduction dimension of A in A B) with the format's default scale rule,
// elements rounded to nearest even and saturating (OCP MX), and replaces every value by
// its dequantised value. nvfp4 takes one tensor scale for the whole matrix. Returns the
// quantised rows (what a block-scaled matrix unit consumes), one per row.
std::vector<emu::BlockQuantized> quantize_rows(const emu::BlockFormat& f, std::span<double> values,
                                               std::size_t row_length);

}  // namespace roundoff
