// Format parameters that also take a block format (OCP MX, NVFP4: emu/block.hpp), for
// experiments whose values are arrays that such a format can hold (operands of a
// matrix product, activation vectors). The format itself and its lookup are emu's
// (emu/unit_request.hpp); here is the check a parameter spec takes.
#pragma once

#include <string>

#include "emu/unit_request.hpp"
#include "experiment.hpp"

namespace roundoff {

using emu::OperandFormat;
using emu::operand_format_by_name;

// For string_param: any format or block format emu knows.
std::string check_operand_format_name(const ParamValue& v);

}  // namespace roundoff
