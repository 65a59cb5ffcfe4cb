// From a typed request (unit, input format, output format, options) to a ready unit: the
// one place that says which unit takes which operand format, with the messages every
// front end (the emu calculator, sweep experiments, Python) prints. Front ends parse
// their names once (emu/names.hpp's tables), fill a UnitRequest and call resolve_unit.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "block.hpp"
#include "block_mma.hpp"
#include "format.hpp"
#include "unit.hpp"

namespace emu {

// A format for the operands of a matrix unit: a scalar format or a block format.
struct OperandFormat {
  std::optional<Format> scalar;             // a format format_by_name knows, or
  const BlockFormat* block = nullptr;       // a block format
  // Its name (a scalar format's canonical name; a block format's name).
  std::string name() const { return block ? block->name() : scalar->name(); }
};
// Throws std::invalid_argument naming both kinds of format.
OperandFormat operand_format_by_name(std::string_view name);

// A matrix unit's input formats, named at every front end (emu's --in, matmul_accum's
// in_format, roundoff.matmul's and roundoff.torch.emulate's in_format=) in one of two ways:
//   FORMAT  A's and B's: a scalar or a block format (operand_format_by_name);
//   A:B     mixed inputs, two different scalar formats, A's then B's: mi300x's
//           fp8-e4m3fnuz:fp8-e5m2fnuz (v_mfma_f32_16x16x32_fp8_bf8) and the reverse.
struct UnitInput {
  OperandFormat a;          // A's format (and B's where b is unset)
  std::optional<Format> b;  // B's, where it differs from A's
  std::string name() const;  // "fp16", "fp8-e4m3fnuz:fp8-e5m2fnuz"
};
// Throws std::invalid_argument for an unknown format (as operand_format_by_name), a block
// format in A:B, the same format twice, or more than two names.
UnitInput unit_input_by_name(std::string_view name);
// "A" where a and b are one format, else "A:B": the name of a unit's input formats.
std::string unit_input_name(const Format& a, const Format& b);
// The mixed inputs A:B that `unit` takes, among the preset formats (format_table), by
// name: none for most units; mi300x fp8-e4m3fnuz:fp8-e5m2fnuz fp8-e5m2fnuz:fp8-e4m3fnuz.
std::vector<std::string> mixed_input_names(UnitKind unit);

// `rule` where f accepts it, else f's default rule; throws std::invalid_argument
// "LABEL RULE: F's SCALE scale is not a power of two (take up or nearest)".
ScaleRule scale_rule_for(const BlockFormat& f, std::optional<ScaleRule> rule, std::string_view label);

struct UnitRequest {
  UnitKind unit = UnitKind::exact;
  std::optional<UnitInput> in;          // unset: the unit's natural input format
  std::optional<Format> out;            // unset: the unit's natural output format
  std::optional<ScaleRule> scale_rule;  // block formats only; unset: the format's default
  bool fused = true;                    // false: fp32-seq and fp16-seq unfused (make_sequential_unit)
};

// What the front end calls each field, for the messages: the calculator's "--unit",
// "--in", ...; a sweep config's "unit", "in_format", ...
struct RequestLabels {
  std::string_view unit, in, out, scale_rule, fused;
};

// The operands of a unit that takes block formats, quantised along k: A's rows and B's
// columns, and the epilogue that applies nvfp4's tensor scales after a block-scaled MMA.
struct QuantizedOperands {
  std::vector<BlockQuantized> rows, cols;
  TensorScaleEpilogue epilogue;
};

// A resolved request: a scalar unit, or b200's block-scaled MMA, with the block format
// its operands are quantised into (if any) and how.
struct ReadyUnit {
  UnitKind kind = UnitKind::exact;
  std::unique_ptr<MatrixUnit> unit;   // scalar units (with a block format: its dequantised values, fp64 in)
  std::unique_ptr<BlockMmaUnit> mma;  // the block-scaled MMA (block_operands(kind) == mma)
  const BlockFormat* block = nullptr;  // the operands' block format, or nullptr
  BlockSpec block_spec;                // the format's quantisation: the scale rule, elements rne, saturating

  const Format& output_format() const { return mma ? mma->output_format() : unit->output_format(); }
  // The input formats' name: the block format's, else the unit's (A:B for mixed inputs).
  std::string in_name() const {
    return block ? block->name() : unit_input_name(unit->input_format(), unit->b_input_format());
  }

  // Quantises A (m x k, row-major) along its rows and B (k x n, row-major) along its
  // columns into `block` with block_spec (nvfp4: one tensor scale for all of A, one for
  // all of B, their defaults), and replaces every value by its dequantised value. For
  // any unit that takes block formats; the epilogue applies for the MMA only.
  QuantizedOperands quantize_operands(std::span<double> A, std::span<double> B, std::size_t m, std::size_t n,
                                      std::size_t k) const;
};

// Which unit takes which operand format (block_operands in emu/unit.hpp):
//  - a block format: b200's block-scaled MMA (output fp32 only, fused), or the
//    dequantised values for the reference units; any other unit refuses it;
//  - a scalar format, or none: make_unit / make_sequential_unit (fused = false only for
//    fp32-seq and fp16-seq), which refuse formats the unit does not take;
//  - mixed inputs A:B: the units that take them (takes_mixed_inputs, emu/cdna.hpp:
//    mi300x, which takes fp8-e4m3fnuz with fp8-e5m2fnuz); any other unit refuses them.
// A scale rule needs a block format that accepts it. Throws std::invalid_argument with
// the message, naming the fields by `labels`.
ReadyUnit resolve_unit(const UnitRequest& request, const RequestLabels& labels);

}  // namespace emu
