// Block formats: blocks of low-precision elements sharing one scale, as OCP
// Microscaling (MX v1.0: MXFP8, MXFP6, MXFP4, MXINT8; 32 elements, an E8M0
// power-of-two scale) and NVIDIA's NVFP4 (16 FP4 E2M1 elements, a UE4M3 scale, and one
// fp32 scale per tensor). Quantisation chooses each block's scale from its largest
// magnitude, then rounds every element once, exactly, through emu::round (any mode,
// stochastic rounding with few random bits included); dequantisation is exact.
//
// For a matrix unit consuming blocks: element i of a quantised array is the bit pattern
// element_bits[i] of the element format (decode_element gives its exact value), block b
// = i / block_size() has the scale bit pattern scales[b].bits in scale() (its decode
// gives the exact scale, NaN for a NaN block), and the array has tensor_scale (an fp32
// value; 1 for MX). The value is exactly element * scale * tensor_scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format.hpp"
#include "names.hpp"
#include "rng.hpp"
#include "round.hpp"
#include "status.hpp"

namespace emu {

// How a block's scale X is chosen from amax, the block's largest magnitude. emax is the
// exponent of the element format's largest power of two (OCP's emax_elem: 8 for E4M3,
// 15 for E5M2, 2 for E2M3, 4 for E3M2, 2 for E2M1, 0 for INT8), max its largest value.
//  floor    X = 2^(floor(log2 amax) - emax): OCP MX v1.0 section 6.3 (the default for
//           MX). amax / X lies in [2^emax, 2^(emax+1)) and may exceed max: such
//           elements overflow (saturate, by OCP).
//  ceil     X = 2^(ceil(log2 amax) - emax): never overflows, at the cost of a binade
//           (torchao's ScaleCalculationMode.CEIL).
//  even     X = 2^(floor(log2 r(amax)) - emax), with amax first rounded to the element's
//           precision (ties away from zero): X goes up where amax would round to the
//           next power of two (torchao's ScaleCalculationMode.EVEN).
//  up       X = amax / max rounded up into the scale format: NVIDIA's rule (cuDNN's
//           block scale quantize: scale = quantize_round_up(amax / vmax); torchao's
//           RCEIL): amax / X <= max, nothing overflows.
//  nearest  X = amax / max rounded to nearest (ties to even) into the scale format:
//           NVFP4's UE4M3 block scale as NVIDIA's recipe casts it (the default for
//           nvfp4), then elements beyond max saturate.
// floor, ceil and even are defined for power-of-two (E8M0) scales only.
enum class ScaleRule { floor, ceil, even, up, nearest };
const char* scale_rule_name(ScaleRule r);
ScaleRule scale_rule_by_name(std::string_view name);  // throws std::invalid_argument listing them
NameTable<ScaleRule> scale_rule_table();

class BlockFormat {
 public:
  enum class Elements { floating, integer };  // integer: two's complement k/64 (MXINT8)

  const std::string& name() const { return name_; }
  // The grid elements are rounded to. MXINT8's elements are 8-bit two's complement
  // integers k with value k/64 (OCP MX v1.0 5.3.3), written as the format e1m6 with
  // bias 1, no inf, no NaN: its values are exactly k/64 for |k| <= 127 (k = -128 is
  // never produced: elements saturate to +-127/64 as Microsoft's MX reference library,
  // microxcaling, clamps them).
  const Format& element() const { return element_; }
  Elements elements() const { return elements_; }
  int element_width() const { return elements_ == Elements::integer ? 8 : element_.width(); }
  const Format& scale() const { return scale_; }  // e8m0 or ue4m3
  int block_size() const { return block_size_; }
  bool has_tensor_scale() const { return tensor_scale_; }  // nvfp4: an fp32 scale per array
  ScaleRule default_rule() const { return default_rule_; }
  bool accepts(ScaleRule r) const;  // floor, ceil, even need a power-of-two scale
  int element_emax() const { return element_.emax(); }

  // Element bit patterns (the element format's encoding; MXINT8: two's complement) and
  // their exact values. encode_element takes a value of the element grid (else throws).
  std::uint64_t encode_element(double value) const;
  double decode_element(std::uint64_t bits) const;

  BlockFormat(std::string name, Format element, Elements kind, Format scale, int block_size, bool tensor_scale,
              ScaleRule default_rule);

 private:
  std::string name_;
  Format element_;
  Elements elements_;
  Format scale_;
  int block_size_;
  bool tensor_scale_;
  ScaleRule default_rule_;
};

// mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2 mxfp4-e2m1 mxint8 nvfp4; throws
// std::invalid_argument naming them.
const BlockFormat& block_format_by_name(std::string_view name);
NameTable<const BlockFormat*> block_format_table();  // the one list of block formats
const char* const* block_format_names();  // nullptr-terminated
bool is_block_format_name(std::string_view name);

struct BlockSpec {
  ScaleRule rule = ScaleRule::floor;
  // The elements' rounding (mode, overflow policy, sr_bits, tininess). OCP MX has
  // elements saturate (the default); inf and nan give what emu::round gives (E5M2: inf,
  // E4M3: NaN; FP6, FP4 and INT8 have neither and saturate whatever the policy). The
  // policy also says what a scale too large for E8M0 becomes: 2^127 under saturate,
  // else NaN (the block's values are NaN, as Microsoft's MX reference library does).
  RoundSpec element{Rounding::rne, Overflow::saturate};
  // nvfp4: the fp32 per-tensor scale to use (a positive finite fp32 value); unset:
  // default_tensor_scale(f, values). Must stay unset for MX formats.
  std::optional<double> tensor_scale;
};
// The format's default rule, elements rne, saturating.
BlockSpec default_block_spec(const BlockFormat& f);
// nvfp4's default tensor scale for `values` (what quantize uses when spec.tensor_scale
// is unset): their largest finite magnitude / (6 * 448) rounded up to fp32, so that no
// block's scale exceeds 448; at least the least fp32 subnormal; 1 for all zeros. To
// quantise a matrix in pieces (its rows, say) with the one tensor scale of the whole,
// pass this in spec.tensor_scale. Throws std::invalid_argument for MX formats.
double default_tensor_scale(const BlockFormat& f, std::span<const double> values);

struct BlockScale {
  std::uint64_t bits = 0;  // in BlockFormat::scale()
  double value = 0;        // its exact value (NaN: every value of the block is NaN)
  // The block's flags: its elements' (element_flags: OFLO for an element that
  // overflowed, saturated or not; UFLO, INEXACT as emu::round raises them; integer
  // elements raise no UFLO; UFLO and INEXACT for a non-zero value lost to an NVFP4 scale
  // that rounded to zero) and its scale's (scale_flags: OFLO and INEXACT when the scale
  // overflowed E8M0, with INV when that made it NaN; INV for an infinite value in the
  // block, whose scale is NaN). A NaN value makes the scale NaN without a flag (NaN
  // propagates quietly).
  Flags flags = 0;
  // The scale's own part of `flags` (OFLO, INEXACT and INV of an E8M0 overflow, INV of
  // an infinite value), without its elements'.
  Flags scale_flags = 0;
};

struct BlockQuantized {
  std::vector<std::uint64_t> element_bits;  // one per value
  std::vector<double> elements;             // their exact values (0 in NaN blocks)
  std::vector<Flags> element_flags;         // the flags of each element's rounding
  std::vector<BlockScale> scales;           // one per block; the last block may be short
  double tensor_scale = 1.0;                // nvfp4's fp32 decode scale; 1 for MX
  Flags flags = 0;                          // OR of the blocks' flags

  std::size_t block_of(std::size_t i, const BlockFormat& f) const { return i / static_cast<std::size_t>(f.block_size()); }
  // Value i, exactly: elements[i] * scale * tensor_scale (NaN in a NaN block).
  double value(std::size_t i, const BlockFormat& f) const;
};

// Quantises `values` into consecutive blocks of f.block_size() (the last one may be
// shorter: it is quantised as if padded with zeros). `rng` is read for stochastic
// rounding of the elements only, one rounding after another in index order, and must
// then be non-null. Throws std::invalid_argument when spec.rule is one f does not
// accept, or spec.tensor_scale is set for an MX format or is not a positive finite
// fp32 value.
BlockQuantized quantize(const BlockFormat& f, std::span<const double> values, const BlockSpec& spec, Rng* rng);
// The exact values: value(i) for every i.
std::vector<double> dequantize(const BlockFormat& f, const BlockQuantized& q);

}  // namespace emu
