#include "unit_request.hpp"

#include <stdexcept>

#include "cdna.hpp"

namespace emu {

namespace {

// "a", "a and b", "a, b and c".
std::string listed(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

std::vector<std::string> units_taking(BlockOperands how) {
  std::vector<std::string> names;
  for (const Named<UnitKind>& row : unit_table())
    if (block_operands(row.value) == how) names.emplace_back(row.name);
  return names;
}

std::string field(std::string_view label, const std::string& value) { return std::string(label) + " " + value; }

// A block format on a unit that does not take it: who does, from the unit table.
std::string refused_block_format(const UnitRequest& r, const RequestLabels& labels) {
  const std::vector<std::string> mma = units_taking(BlockOperands::mma), dequantised = units_taking(BlockOperands::dequantised);
  return field(labels.in, r.in->name()) + " is a block format: " + (mma.size() == 1 ? "unit " : "units ") +
         listed(mma) + " runs its blocks on the block-scaled MMA, the reference units " + listed(dequantised) +
         " take its dequantised values (" + field(labels.unit, unit_kind_name(r.unit)) + " takes a scalar format)";
}

std::string unfused_refused(const UnitRequest& r, const RequestLabels& labels) {
  return std::string(labels.fused) + " = false applies to fp32-seq and fp16-seq only (" +
         field(labels.unit, unit_kind_name(r.unit)) + ")";
}

bool is_sequential(UnitKind k) { return k == UnitKind::fp32_seq || k == UnitKind::fp16_seq; }

constexpr char kMixedSeparator = ':';  // A:B

}  // namespace

std::vector<std::string> mixed_input_names(UnitKind unit) {
  std::vector<std::string> names;
  if (!takes_mixed_inputs(unit)) return names;
  for (const auto& a : format_table())
    for (const auto& b : format_table()) {
      if (a.value() == b.value()) continue;
      try {
        (void)cdna_params(unit, a.value(), b.value(), fp32());
        names.push_back(unit_input_name(a.value(), b.value()));
      } catch (const std::invalid_argument&) {
      }
    }
  return names;
}

namespace {

// Mixed inputs A:B: the units that take them (mi300x's fp8 with bf8), the others refuse.
std::unique_ptr<MatrixUnit> mixed_unit(const UnitRequest& r, const RequestLabels& labels) {
  const std::string where = field(labels.in, r.in->name()) + (r.out ? ", " + field(labels.out, r.out->name()) : "") +
                            " on " + field(labels.unit, unit_kind_name(r.unit)) + ": ";
  if (!takes_mixed_inputs(r.unit)) {
    std::vector<std::string> mixing;
    for (const Named<UnitKind>& row : unit_table()) {
      std::vector<std::string> names = mixed_input_names(row.value);
      if (!names.empty()) mixing.push_back(std::string(row.name) + " (" + listed(names) + ")");
    }
    throw std::invalid_argument(where + "mixed inputs (A:B) are taken by " + listed(mixing) + " only; " +
                                unit_kind_name(r.unit) + " takes one input format for A and B");
  }
  if (!r.fused) throw std::invalid_argument(unfused_refused(r, labels));
  try {
    return make_cdna_unit(r.unit, *r.in->a.scalar, *r.in->b, r.out);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(where + e.what());
  }
}

}  // namespace

ScaleRule scale_rule_for(const BlockFormat& f, std::optional<ScaleRule> rule, std::string_view label) {
  if (!rule) return f.default_rule();
  if (!f.accepts(*rule))
    throw std::invalid_argument(field(label, scale_rule_name(*rule)) + ": " + f.name() + "'s " + f.scale().name() +
                                " scale is not a power of two (take up or nearest)");
  return *rule;
}

OperandFormat operand_format_by_name(std::string_view name) {
  OperandFormat f;
  if (const auto* row = find_name(block_format_table(), name)) {
    f.block = row->value;
    return f;
  }
  try {
    f.scalar = format_by_name(name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(e.what()) + "; or a block format: " + name_list(block_format_table()));
  }
  return f;
}

std::string unit_input_name(const Format& a, const Format& b) {
  return a == b ? a.name() : a.name() + kMixedSeparator + b.name();
}

std::string UnitInput::name() const { return b ? unit_input_name(*a.scalar, *b) : a.name(); }

UnitInput unit_input_by_name(std::string_view name) {
  const std::size_t separator = name.find(kMixedSeparator);
  if (separator == std::string_view::npos) return {operand_format_by_name(name), std::nullopt};
  const std::string spelled(name);
  const std::string_view a_name = name.substr(0, separator), b_name = name.substr(separator + 1);
  if (b_name.find(kMixedSeparator) != std::string_view::npos)
    throw std::invalid_argument("'" + spelled + "': A:B names two formats, A's and B's");
  auto side = [&](std::string_view side_name, const char* which) {
    try {
      return operand_format_by_name(side_name);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(which) + " of '" + spelled + "': " + e.what());
    }
  };
  UnitInput in{side(a_name, "A"), std::nullopt};
  const OperandFormat b = side(b_name, "B");
  if (in.a.block || b.block)
    throw std::invalid_argument("'" + spelled + "': A:B (mixed inputs) takes two scalar formats; a block format (" +
                                (in.a.block ? in.a.name() : b.name()) + ") stands alone, for A and B");
  if (*in.a.scalar == *b.scalar)
    throw std::invalid_argument("'" + spelled + "': A and B take one format: write it " + in.a.name());
  in.b = *b.scalar;
  return in;
}

ReadyUnit resolve_unit(const UnitRequest& r, const RequestLabels& labels) {
  ReadyUnit ready;
  ready.kind = r.unit;
  const BlockFormat* block = r.in ? r.in->a.block : nullptr;
  if (!block && r.scale_rule)
    throw std::invalid_argument(std::string(labels.scale_rule) + ": only with a block format (" +
                                std::string(labels.in) + " mxfp8-e4m3, nvfp4, ...)");
  const BlockOperands takes = block_operands(r.unit);
  if (block) {
    if (takes == BlockOperands::none) throw std::invalid_argument(refused_block_format(r, labels));
    ready.block = block;
    ready.block_spec = default_block_spec(*block);
    ready.block_spec.rule = scale_rule_for(*block, r.scale_rule, labels.scale_rule);
  }
  if (block && takes == BlockOperands::mma) {
    if (r.out && *r.out != fp32())
      throw std::invalid_argument(field(labels.out, r.out->name()) + ": " + unit_kind_name(r.unit) +
                                  "'s block-scaled MMA (" + field(labels.in, block->name()) + ") gives fp32 output only");
    if (!r.fused) throw std::invalid_argument(unfused_refused(r, labels));
    try {
      ready.mma = make_block_mma_unit(r.unit, *block, *block);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(field(labels.in, block->name()) + " on " + field(labels.unit, unit_kind_name(r.unit)) +
                                  ": " + e.what());
    }
    return ready;
  }
  if (r.in && r.in->b) {
    ready.unit = mixed_unit(r, labels);
    return ready;
  }
  // The dequantised values of a block format need not lie in any scalar format.
  const std::optional<Format> in = block ? std::optional<Format>(fp64()) : r.in ? r.in->a.scalar : std::nullopt;
  if (!r.fused && !is_sequential(r.unit)) throw std::invalid_argument(unfused_refused(r, labels));
  try {
    ready.unit = is_sequential(r.unit) ? make_sequential_unit(r.unit, r.fused, in, r.out) : make_unit(r.unit, in, r.out);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(field(labels.unit, unit_kind_name(r.unit)) + ": " + e.what());
  }
  return ready;
}

QuantizedOperands ReadyUnit::quantize_operands(std::span<double> A, std::span<double> B, std::size_t m, std::size_t n,
                                               std::size_t k) const {
  const BlockFormat& f = *block;
  const double ts_a = f.has_tensor_scale() ? default_tensor_scale(f, A) : 1.0;
  const double ts_b = f.has_tensor_scale() ? default_tensor_scale(f, B) : 1.0;
  // Quantises `values` (one row or column) and replaces them by their dequantised values.
  auto quantized = [&](std::span<double> values, double tensor_scale) {
    BlockSpec spec = block_spec;
    if (f.has_tensor_scale()) spec.tensor_scale = tensor_scale;
    BlockQuantized q = quantize(f, values, spec, nullptr);  // elements rne: no random bits
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = q.value(i, f);
    return q;
  };
  QuantizedOperands q;
  for (std::size_t i = 0; i < m; ++i) q.rows.push_back(quantized(A.subspan(i * k, k), ts_a));
  std::vector<double> column(k);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t p = 0; p < k; ++p) column[p] = B[p * n + j];
    q.cols.push_back(quantized(column, ts_b));
    for (std::size_t p = 0; p < k; ++p) B[p * n + j] = column[p];
  }
  if (mma) q.epilogue = mma->tensor_scale_epilogue(ts_a, ts_b);
  return q;
}

}  // namespace emu
