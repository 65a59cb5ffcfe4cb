#include "block.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "arith.hpp"

namespace emu {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr Named<ScaleRule> kRules[] = {
    {ScaleRule::floor, "floor", "2^(floor(log2 amax) - emax), OCP MX v1.0 6.3 (default for MX)"},
    {ScaleRule::ceil, "ceil", "2^(ceil(log2 amax) - emax)"},
    {ScaleRule::even, "even", "2^(floor(log2 amax') - emax), amax' = amax rounded to the element's precision, ties away (torchao's EVEN)"},
    {ScaleRule::up, "up", "amax / max rounded up into the scale format (NVIDIA, cuDNN)"},
    {ScaleRule::nearest, "nearest",
     "amax / max rounded to nearest into the scale format (default for nvfp4, whose UE4M3 scale takes only up "
     "and nearest)"},
};
static_assert(in_enum_order(kRules));

// MXINT8's element grid k/64, |k| <= 127, as a floating-point format: one exponent bit
// with bias 1 puts the subnormals (field 0) and the normals (field 1) on the same 2^-6
// spacing, 0 .. 63/64 and 1 .. 127/64.
Format int8_grid() {
  FormatSpec s;
  s.exponent_bits = 1;
  s.fraction_bits = 6;
  s.bias = 1;
  s.infinities = false;
  s.nan = NanEncoding::none;
  s.name = "int8/64";
  return Format(s);
}

struct BlockFormatRow {
  BlockFormat format;
  const char* help;
};

// The block formats and their help: the one list of them.
const std::vector<Named<const BlockFormat*>>& block_format_rows() {
  using E = BlockFormat::Elements;
  static const std::vector<BlockFormatRow> formats = {
      {{"mxfp8-e4m3", fp8_e4m3(), E::floating, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 fp8-e4m3 elements, an E8M0 scale"},
      {{"mxfp8-e5m2", fp8_e5m2(), E::floating, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 fp8-e5m2 elements, an E8M0 scale"},
      {{"mxfp6-e2m3", fp6_e2m3(), E::floating, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 fp6-e2m3 elements, an E8M0 scale"},
      {{"mxfp6-e3m2", fp6_e3m2(), E::floating, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 fp6-e3m2 elements, an E8M0 scale"},
      {{"mxfp4-e2m1", fp4_e2m1(), E::floating, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 fp4-e2m1 elements, an E8M0 scale"},
      {{"mxint8", int8_grid(), E::integer, e8m0(), 32, false, ScaleRule::floor},
       "OCP MX: 32 8-bit integer elements k/64, an E8M0 scale"},
      {{"nvfp4", fp4_e2m1(), E::floating, ue4m3(), 16, true, ScaleRule::nearest},
       "NVIDIA: 16 fp4-e2m1 elements, a UE4M3 scale, one fp32 scale per tensor"},
  };
  static const std::vector<Named<const BlockFormat*>> rows = [] {
    std::vector<Named<const BlockFormat*>> r;
    for (const BlockFormatRow& f : formats) r.push_back({&f.format, f.format.name().c_str(), f.help});
    return r;
  }();
  return rows;
}

// floor(log2 a) for a finite a > 0 (exact: frexp).
int floor_log2(double a) {
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  return e - 1;
}

// The exponent of an E8M0 scale by the power-of-two rules (before clamping).
int power_of_two_exponent(ScaleRule rule, double amax, const Format& element) {
  const int e = floor_log2(amax);
  const bool power_of_two = amax == std::ldexp(1.0, e);
  switch (rule) {
    case ScaleRule::floor: return e - element.emax();
    case ScaleRule::ceil: return e + (power_of_two ? 0 : 1) - element.emax();
    case ScaleRule::even: {
      // amax's significand rounded to the element's fraction bits, ties away, reaches 2
      // iff it is at least 2 - 2^-(fraction_bits + 1).
      const double threshold = std::ldexp(2.0 - std::ldexp(1.0, -(element.fraction_bits() + 1)), e);
      return e + (amax >= threshold ? 1 : 0) - element.emax();
    }
    default: break;
  }
  throw std::logic_error("power_of_two_exponent: not a power-of-two rule");
}

struct ChosenScale {
  double value = 0;  // NaN for a NaN block
  Flags flags = 0;
};

// The scale of a finite block with amax > 0 (0 < amax: the caller handles zero blocks).
ChosenScale choose_scale(const BlockFormat& f, const BlockSpec& spec, double amax, double tensor_scale) {
  const Format& s = f.scale();
  const bool saturate = spec.element.overflow == Overflow::saturate;
  ChosenScale c;
  if (spec.rule == ScaleRule::floor || spec.rule == ScaleRule::ceil || spec.rule == ScaleRule::even) {
    int e = power_of_two_exponent(spec.rule, amax, f.element());
    // E8M0 covers 2^-127 .. 2^127. Below: the least scale (the elements then underflow
    // as rounding says). Above: overflow, as Microsoft's reference makes it (NaN).
    if (e < s.emin()) e = s.emin();
    if (e > s.emax()) {
      c.flags = OFLO | INEXACT;
      if (!saturate) {
        c.flags |= INV;
        c.value = kNaN;
        return c;
      }
      e = s.emax();
    }
    c.value = std::ldexp(1.0, e);
    return c;
  }
  // up, nearest: amax / (max * tensor_scale) rounded once into the scale format (an
  // exact quotient: max * tensor_scale has at most 3 + 24 bits).
  RoundSpec r;
  r.mode = spec.rule == ScaleRule::up ? Rounding::ru : Rounding::rne;
  // NVFP4's UE4M3 scale saturates (NVIDIA converts it with satfinite; with the default
  // tensor scale it cannot exceed 448 anyway); an E8M0 scale past 2^127 follows the
  // elements' policy as above.
  r.overflow = saturate || f.has_tensor_scale() ? Overflow::saturate : Overflow::nan;
  Flags raised = 0;
  c.value = round(s, exact_div(amax, f.element().max_finite() * tensor_scale), r, nullptr, raised);
  // Only overflow counts: a scale is inexact by design, and one clamped to E8M0's least
  // value leaves the underflow to the elements.
  if (raised & OFLO) c.flags = raised & (OFLO | INEXACT | INV);
  return c;
}


// x / scale exactly, for emu::round. A power-of-two scale: x * 2^-e, exact unless it
// falls below double's normal range, where only its sign and being non-zero matter (it
// lies far below every element format's least subnormal).
Exact scaled(double x, double scale) {
  int e = 0;
  if (std::frexp(scale, &e) == 0.5) {
    const double v = std::ldexp(x, 1 - e);
    if (x == 0 || std::fabs(v) >= std::numeric_limits<double>::min()) return Exact{v};
    return Exact{std::copysign(0.0, x), std::copysign(std::numeric_limits<double>::denorm_min(), x)};
  }
  return exact_div(x, scale);
}

}  // namespace

NameTable<ScaleRule> scale_rule_table() { return kRules; }
const char* scale_rule_name(ScaleRule r) { return kRules[static_cast<int>(r)].name; }
ScaleRule scale_rule_by_name(std::string_view name) { return value_by_name(scale_rule_table(), name, "scale rule"); }

BlockFormat::BlockFormat(std::string name, Format element, Elements kind, Format scale, int block_size,
                         bool tensor_scale, ScaleRule default_rule)
    : name_(std::move(name)),
      element_(std::move(element)),
      elements_(kind),
      scale_(std::move(scale)),
      block_size_(block_size),
      tensor_scale_(tensor_scale),
      default_rule_(default_rule) {}

bool BlockFormat::accepts(ScaleRule r) const {
  const bool power_of_two_scale = scale_.fraction_bits() == 0;
  return power_of_two_scale || r == ScaleRule::up || r == ScaleRule::nearest;
}

std::uint64_t BlockFormat::encode_element(double value) const {
  if (elements_ == Elements::floating) return element_.encode(value);
  if (!element_.representable(value)) throw std::invalid_argument(name_ + ": not an element value: round it first");
  const auto k = static_cast<std::int64_t>(value * 64);  // exact: |k| <= 127
  return static_cast<std::uint64_t>(k) & 0xff;
}

double BlockFormat::decode_element(std::uint64_t bits) const {
  if (elements_ == Elements::floating) return element_.decode(bits);
  return static_cast<double>(static_cast<std::int8_t>(bits & 0xff)) / 64;
}

NameTable<const BlockFormat*> block_format_table() { return block_format_rows(); }

const BlockFormat& block_format_by_name(std::string_view name) {
  return *value_by_name(block_format_table(), name, "block format");
}

const char* const* block_format_names() {
  static const std::vector<const char*> names = name_array(block_format_table());
  return names.data();
}

bool is_block_format_name(std::string_view name) { return find_name(block_format_table(), name) != nullptr; }

double default_tensor_scale(const BlockFormat& f, std::span<const double> values) {
  if (!f.has_tensor_scale()) throw std::invalid_argument(f.name() + " has no tensor scale (only nvfp4 has)");
  double amax = 0;
  for (double x : values)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  if (amax == 0) return 1.0;
  // Rounded up: amax_b / (6 t) <= 448 for every block; ru never gives 0.
  Flags ignored = 0;
  return round(fp32(), exact_div(amax, f.element().max_finite() * f.scale().max_finite()),
               RoundSpec{Rounding::ru, Overflow::saturate}, nullptr, ignored);
}

BlockSpec default_block_spec(const BlockFormat& f) {
  BlockSpec s;
  s.rule = f.default_rule();
  return s;
}

double BlockQuantized::value(std::size_t i, const BlockFormat& f) const {
  return elements[i] * scales[block_of(i, f)].value * tensor_scale;  // exact: few bits, in range
}

BlockQuantized quantize(const BlockFormat& f, std::span<const double> values, const BlockSpec& spec, Rng* rng) {
  if (!f.accepts(spec.rule))
    throw std::invalid_argument(f.name() + ": scale rule " + scale_rule_name(spec.rule) +
                                " needs a power-of-two scale (this format's is " + f.scale().name() +
                                "; take up or nearest)");
  BlockQuantized q;
  if (f.has_tensor_scale()) {
    if (spec.tensor_scale) {
      const double t = *spec.tensor_scale;
      if (!(t > 0) || !std::isfinite(t) || !fp32().representable(t))
        throw std::invalid_argument(f.name() + ": the tensor scale must be a positive finite fp32 value");
      q.tensor_scale = t;
    } else {
      q.tensor_scale = default_tensor_scale(f, values);
    }
  } else if (spec.tensor_scale) {
    throw std::invalid_argument(f.name() + " has no tensor scale (only nvfp4 has)");
  }

  const std::size_t n = values.size(), bs = static_cast<std::size_t>(f.block_size());
  q.element_bits.resize(n);
  q.elements.resize(n);
  q.element_flags.resize(n);
  for (std::size_t first = 0; first < n; first += bs) {
    const std::size_t last = std::min(n, first + bs);
    BlockScale block;
    double amax = 0;
    bool nan = false, inf = false;
    for (std::size_t i = first; i < last; ++i) {
      nan = nan || std::isnan(values[i]);
      inf = inf || std::isinf(values[i]);
      if (std::isfinite(values[i])) amax = std::max(amax, std::fabs(values[i]));
    }
    if (nan || inf) {
      block.value = kNaN;
      block.scale_flags = inf ? INV : 0;
    } else if (amax == 0) {
      // All zeros: the least scale (UE4M3 0, E8M0 0x00 = 2^-127); the elements are zeros.
      block.value = f.scale().has_zero() ? 0.0 : f.scale().min_normal();
    } else {
      const ChosenScale c = choose_scale(f, spec, amax, q.tensor_scale);
      block.value = c.value;
      block.scale_flags = c.flags;
    }
    block.flags = block.scale_flags;
    block.bits = f.scale().encode(block.value);
    const double total = block.value * q.tensor_scale;  // exact: few bits
    for (std::size_t i = first; i < last; ++i) {
      const double x = values[i];
      double e = 0;
      if (std::isnan(block.value)) {
        e = 0;  // the scale says NaN for the whole block
      } else if (total == 0) {
        e = std::copysign(0.0, x);  // only zeros, or NVFP4's scale underflowed: lost
        if (x != 0) q.element_flags[i] = UFLO | INEXACT;
        block.flags |= q.element_flags[i];
      } else {
        Flags raised = 0;
        e = round(f.element(), scaled(x, total), spec.element, rng, raised);
        if (f.elements() == BlockFormat::Elements::integer) raised &= ~UFLO;  // a fixed-point grid has no underflow
        q.element_flags[i] = raised;
        block.flags |= raised;
      }
      q.element_bits[i] = f.encode_element(e);
      q.elements[i] = f.decode_element(q.element_bits[i]);  // MXINT8 has no -0
    }
    q.flags |= block.flags;
    q.scales.push_back(block);
  }
  return q;
}

std::vector<double> dequantize(const BlockFormat& f, const BlockQuantized& q) {
  std::vector<double> out(q.elements.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = q.value(i, f);
  return out;
}

}  // namespace emu
