#include "block_mma.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mma.hpp"
#include "round.hpp"
#include "threads.hpp"

namespace emu {

namespace {

// Zeros carry an exponent so low that they never set E, even with two of them and two
// scale exponents added; below kNoTerm no term is non-zero (as in emu/mma.cpp).
constexpr std::int32_t kZeroExponent = -(1 << 20);
constexpr std::int32_t kNoTerm = -(1 << 19);

constexpr int kMaxInstructionK = 1024;
constexpr int kMxf8f6f4K = 32, kMxf4K = 64;
constexpr int kMxf8f6f4KeptBits = 25, kMxf4KeptBits = 35;
constexpr int kMxf4Group = 16;

// 2^e for e inside double's normal range, exactly.
double pow2(int e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

// The exponent the adder aligns x != 0 with: its own, clamped at the format's emin.
std::int32_t aligned_exponent(double x, const Format& f) { return std::max(std::ilogb(std::fabs(x)), f.emin()); }

bool is_mx_float(const BlockFormat& f) {
  return !f.has_tensor_scale() && f.elements() == BlockFormat::Elements::floating && f.scale() == e8m0();
}

}  // namespace

struct BlockMmaUnit::Decoded {
  std::size_t size = 0;
  std::size_t block_size = 0;
  std::vector<double> value;           // the elements' exact values
  std::vector<std::int32_t> exp;       // aligned_exponent in the element format; kZeroExponent for 0
  std::vector<double> scale;           // per block, exact (NaN for a NaN block)
  std::vector<std::int32_t> scale_exp; // aligned_exponent in the scale format; kZeroExponent for 0
  bool special = false;                // a NaN or infinite element, or a NaN scale

  std::size_t block(std::size_t i) const { return i / block_size; }
};

const char* block_mma_kind_name(BlockMmaKind kind) {
  return kind == BlockMmaKind::mxf8f6f4 ? "mxf8f6f4" : "mxf4nvf4";
}

BlockMmaParams block_mma_params(UnitKind device, const BlockFormat& a, const BlockFormat& b) {
  if (device != UnitKind::b200)
    throw std::invalid_argument(std::string("block formats (") + a.name() + ") are taken by --unit b200 only " +
                                "(Blackwell's block-scaled MMA); " + unit_kind_name(device) + " has none");
  for (const BlockFormat* f : {&a, &b})
    if (f->elements() == BlockFormat::Elements::integer)
      throw std::invalid_argument(f->name() +
                                  " is not taken by Blackwell's block-scaled MMA (its kinds take fp8, fp6 and fp4 "
                                  "elements, not integers)");
  const bool a_fp4 = a.name() == "mxfp4-e2m1", b_fp4 = b.name() == "mxfp4-e2m1";
  BlockMmaParams p;
  if (a.has_tensor_scale() && b.has_tensor_scale()) {
    p.kind = BlockMmaKind::mxf4nvf4;  // kind::mxf4nvf4, scale_vec::4X
  } else if (a.has_tensor_scale() || b.has_tensor_scale()) {
    throw std::invalid_argument(a.name() + " with " + b.name() +
                                ": an instruction's two scales have one type (nvfp4's UE4M3, MX's UE8M0)");
  } else if (a_fp4 && b_fp4) {
    p.kind = BlockMmaKind::mxf4nvf4;  // kind::mxf4, scale_vec::2X
  } else {
    p.kind = BlockMmaKind::mxf8f6f4;  // scale_vec::1X
  }
  if (p.kind == BlockMmaKind::mxf4nvf4) {
    p.instruction_k = kMxf4K;
    p.group_size = kMxf4Group;
    p.kept_fraction_bits = kMxf4KeptBits;
  } else {
    p.instruction_k = kMxf8f6f4K;
    p.group_size = 1;
    p.kept_fraction_bits = kMxf8f6f4KeptBits;
  }
  p.final_rounding = Rounding::rz;
  return p;
}

BlockMmaUnit::BlockMmaUnit(UnitKind device, const BlockFormat& a, const BlockFormat& b, BlockMmaParams params)
    : device_(device), a_(a), b_(b), params_(params) {
  for (const BlockFormat* f : {&a_, &b_})
    if (f->elements() != BlockFormat::Elements::floating)
      throw std::invalid_argument("block-scaled MMA: " + f->name() + " has integer elements");
  if (params_.instruction_k < 1 || params_.instruction_k > kMaxInstructionK)
    throw std::invalid_argument("block-scaled MMA: instruction k must be 1.." + std::to_string(kMaxInstructionK));
  if (params_.kept_fraction_bits < 1 || params_.kept_fraction_bits > 40)
    throw std::invalid_argument("block-scaled MMA: kept fraction bits must be 1..40");
  if (params_.final_rounding == Rounding::sr)
    throw std::invalid_argument("block-scaled MMA: the final rounding must be one of rne rna rz ru rd ro (not sr)");
  // The largest term, in units of 2^(E - kept): a product of two significands below 2, or
  // a group's sum (at most group_size * max^2) times two scale significands below 2.
  double largest_term = 4;
  if (params_.kind == BlockMmaKind::mxf8f6f4) {
    if (params_.group_size != 1) throw std::invalid_argument("block-scaled MMA: mxf8f6f4 has no groups (group size 1)");
    if (!is_mx_float(a_) || !is_mx_float(b_))
      throw std::invalid_argument("block-scaled MMA: mxf8f6f4 takes E8M0-scaled MX formats, not " +
                                  (is_mx_float(a_) ? b_.name() : a_.name()));
  } else {
    for (const BlockFormat* f : {&a_, &b_})
      if (f->element() != fp4_e2m1())
        throw std::invalid_argument("block-scaled MMA: mxf4nvf4 takes fp4-e2m1 elements, not " + f->name() + "'s");
    if (a_.scale() != b_.scale())
      throw std::invalid_argument("block-scaled MMA: " + a_.name() + " and " + b_.name() + " have scales of two types");
    const int g = params_.group_size;
    if (g < 1 || params_.instruction_k % g != 0 || a_.block_size() % g != 0 || b_.block_size() % g != 0)
      throw std::invalid_argument("block-scaled MMA: the group size must divide instruction k and both block sizes");
    const double max = fp4_e2m1().max_finite();
    largest_term = g * max * max * 4;
  }
  // The exact sum of an instruction's cut terms and c must stay below 2^53 (exact in
  // double, where an overflow is rounded through the context).
  const double terms = params_.instruction_k / params_.group_size;
  if ((terms * largest_term + 2) * std::ldexp(1.0, params_.kept_fraction_bits) >= 0x1p53)
    throw std::invalid_argument("block-scaled MMA: too many kept bits for instructions this long");
}

BlockMmaUnit::Decoded BlockMmaUnit::decode(const BlockQuantized& q, const BlockFormat& f) const {
  Decoded d;
  d.size = q.elements.size();
  d.block_size = static_cast<std::size_t>(f.block_size());
  if (q.scales.size() != (d.size + d.block_size - 1) / d.block_size)
    throw std::invalid_argument("block-scaled MMA: " + std::to_string(d.size) + " elements with " +
                                std::to_string(q.scales.size()) + " scales are not an array quantised in " + f.name());
  d.value = q.elements;
  d.exp.resize(d.size);
  for (std::size_t i = 0; i < d.size; ++i) {
    const double x = q.elements[i];
    if (!std::isfinite(x)) d.special = true;
    d.exp[i] = x == 0 || !std::isfinite(x) ? kZeroExponent : aligned_exponent(x, f.element());
  }
  for (const BlockScale& s : q.scales) {
    if (std::isnan(s.value)) d.special = true;
    d.scale.push_back(s.value);
    d.scale_exp.push_back(s.value == 0 || std::isnan(s.value) ? kZeroExponent : aligned_exponent(s.value, f.scale()));
  }
  return d;
}

double BlockMmaUnit::instruction(Context& ctx, std::size_t first, std::size_t count, const Decoded& a,
                                 const Decoded& b, double c, Flags& flags) const {
  const int kept = params_.kept_fraction_bits;
  const std::size_t end = first + count;

  // Step 1: the terms, as value and exponent (kZeroExponent for a zero term).
  const bool grouped = params_.kind == BlockMmaKind::mxf4nvf4;
  const auto group = static_cast<std::size_t>(params_.group_size);
  const std::size_t terms = grouped ? (count + group - 1) / group : count;
  std::vector<double> term(terms);
  std::vector<std::int32_t> term_exp(terms);
  for (std::size_t t = 0; t < terms; ++t) {
    if (!grouped) {
      const std::size_t i = first + t;
      const std::size_t ba = a.block(i), bb = b.block(i);
      // Exact: the product of two elements has at most 8 significant bits, and the scales
      // are powers of two within 2^-254 .. 2^254 of it.
      term[t] = a.value[i] * b.value[i] * a.scale[ba] * b.scale[bb];
      term_exp[t] = a.exp[i] + b.exp[i] + a.scale_exp[ba] + b.scale_exp[bb];
    } else {
      const std::size_t i0 = first + t * group;
      double sum = 0;  // exact: fp4 products are multiples of 1/4 below 36
      for (std::size_t i = i0; i < std::min(i0 + group, end); ++i) sum += a.value[i] * b.value[i];
      const std::size_t ba = a.block(i0), bb = b.block(i0);
      term[t] = sum * a.scale[ba] * b.scale[bb];  // exact: at most 12 + 4 + 4 significant bits
      term_exp[t] = term[t] != 0 ? a.scale_exp[ba] + b.scale_exp[bb] : kZeroExponent;
    }
  }

  // Steps 1 and 2: c's exponent as a binary32, and E.
  std::int32_t align = kZeroExponent;
  if (c != 0) align = aligned_exponent(c, fp32());
  for (std::size_t t = 0; t < terms; ++t) align = std::max(align, term_exp[t]);
  if (align < kNoTerm) return 0.0;  // an exact zero sum is +0, as the integer adder gives

  // Step 3: each term in units of 2^(align - kept), truncated toward zero, added
  // exactly. In those units a term is below 2^(kept + 12) (the constructor's bound) and
  // exact in double: a power-of-two scaling well inside double's range (|align| and the
  // terms' exponents stay within +-300).
  const double unit = pow2(kept - align);
  std::int64_t sum = 0;
  bool lost = false;
  auto add = [&](double scaled) {
    const double cut = std::trunc(scaled);
    lost = lost || cut != scaled;
    sum += static_cast<std::int64_t>(cut);
  };
  add(c * unit);
  for (std::size_t t = 0; t < terms; ++t) add(term[t] * unit);
  const Flags truncated = lost ? INEXACT : 0;
  if (sum == 0) {
    flags |= truncated;
    return 0.0;
  }

  // Step 4: one normalisation and rounding into fp32.
  const Format& out = fp32();
  const FixedPoint exact{static_cast<std::uint64_t>(sum < 0 ? -sum : sum), align - kept, sum < 0};
  FixedPoint result = exact;
  Flags raised = truncated;
  round_fixed_point(result, out.fraction_bits(), out.emin(), params_.final_rounding, raised);
  const double value = to_double(result);
  if (std::fabs(value) <= out.max_finite()) {
    flags |= raised;
    return value;
  }
  // Past fp32's range: through the context (its overflow policy), rne beyond 2^128 so
  // that the default policy gives infinity whatever final_rounding is (the exponent field
  // all ones, as TensorCoreUnit::block).
  const double wide = to_double(exact);  // exact: below 2^53 (the constructor's bound)
  const Rounding mode = std::fabs(wide) >= std::ldexp(1.0, out.emax() + 1) ? Rounding::rne : params_.final_rounding;
  return ctx.round_with(mode, out, Exact{wide}, "mma", {}, truncated);
}

double BlockMmaUnit::special(Context& ctx, const Decoded& a, const Decoded& b, double c) const {
  bool nan = std::isnan(c), invalid = false, pos_inf = c == INFINITY, neg_inf = c == -INFINITY;
  for (std::size_t i = 0; i < a.size; ++i) {
    const double factors[] = {a.value[i], a.scale[a.block(i)], b.value[i], b.scale[b.block(i)]};
    bool any_nan = false, any_inf = false, any_zero = false, negative = false;
    for (double f : factors) {
      any_nan = any_nan || std::isnan(f);
      any_inf = any_inf || std::isinf(f);
      any_zero = any_zero || f == 0;
      negative = negative != std::signbit(f);
    }
    if (any_nan) nan = true;
    else if (any_inf && any_zero) invalid = true;
    else if (any_inf) (negative ? neg_inf : pos_inf) = true;
  }
  if (pos_inf && neg_inf) invalid = true;
  const double quiet_nan = std::numeric_limits<double>::quiet_NaN();
  if (invalid) ctx.raise_flags(INV, "mma", {}, quiet_nan);
  if (nan || invalid) return quiet_nan;
  return pos_inf ? INFINITY : -INFINITY;
}

double BlockMmaUnit::dot_decoded(Context& ctx, const Decoded& a, const Decoded& b, double c) const {
  if (a.special || b.special || !std::isfinite(c)) return special(ctx, a, b, c);
  Flags flags = 0;
  const auto step = static_cast<std::size_t>(params_.instruction_k);
  for (std::size_t first = 0; first < a.size && std::isfinite(c); first += step)
    c = instruction(ctx, first, std::min(step, a.size - first), a, b, c, flags);
  if (flags != 0) ctx.raise_flags(flags, "mma", {}, c);
  return c;
}

TensorScaleEpilogue BlockMmaUnit::tensor_scale_epilogue(double ts_a, double ts_b) const {
  TensorScaleEpilogue e;
  if (!a_.has_tensor_scale() && !b_.has_tensor_scale()) return e;
  e.applies = true;
  e.alpha = emu::round(fp32(), exact_mul(ts_a, ts_b), RoundSpec{Rounding::rne, Overflow::inf}, nullptr, e.alpha_flags);
  return e;
}

double BlockMmaUnit::dot_with(Context& ctx, const Decoded& a, const Decoded& b, double c,
                              const TensorScaleEpilogue& epilogue) const {
  if (!epilogue.applies) return dot_decoded(ctx, a, b, c);
  return ctx.fma(fp32(), epilogue.alpha, dot_decoded(ctx, a, b, 0.0), c);
}

double BlockMmaUnit::dot(Context& ctx, const BlockQuantized& a, const BlockQuantized& b, double c,
                         const TensorScaleEpilogue& epilogue) const {
  if (a.elements.size() != b.elements.size())
    throw std::invalid_argument("block-scaled MMA: a has " + std::to_string(a.elements.size()) + " values but b has " +
                                std::to_string(b.elements.size()));
  if (std::isfinite(c) && !fp32().representable(c))
    throw std::invalid_argument("block-scaled MMA: c = " + std::to_string(c) + " is not an fp32 value");
  return dot_with(ctx, decode(a, a_), decode(b, b_), c, epilogue);
}

void BlockMmaUnit::gemm(Context& ctx, std::span<const BlockQuantized> rows, std::span<const BlockQuantized> cols,
                        double* C, std::size_t ldc, const TensorScaleEpilogue& epilogue) const {
  const std::size_t k = rows.empty() ? 0 : rows.front().elements.size();
  // B decoded once for every band. Where a column is not an array quantised in B's
  // format, the bands decode the columns themselves, after their rows (the serial order,
  // so that the same operand is reported).
  std::optional<std::vector<Decoded>> b;
  try {
    b.emplace();
    for (const BlockQuantized& q : cols) b->push_back(decode(q, b_));
  } catch (const std::invalid_argument&) {
    b.reset();
  }
  gemm_by_rows(ctx, rows.size(), cols.size(), k, C, ldc, [&](Context& band_ctx, std::size_t first, std::size_t count) {
    serial_gemm(band_ctx, rows.subspan(first, count), cols, b ? &*b : nullptr, C + first * ldc, ldc, epilogue);
  });
}

void BlockMmaUnit::serial_gemm(Context& ctx, std::span<const BlockQuantized> rows,
                               std::span<const BlockQuantized> cols, const std::vector<Decoded>* decoded_cols,
                               double* C, std::size_t ldc, const TensorScaleEpilogue& epilogue) const {
  std::vector<Decoded> a, own_b;
  for (const BlockQuantized& q : rows) a.push_back(decode(q, a_));
  if (decoded_cols == nullptr)
    for (const BlockQuantized& q : cols) own_b.push_back(decode(q, b_));
  const std::vector<Decoded>& b = decoded_cols != nullptr ? *decoded_cols : own_b;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < b.size(); ++j) {
      if (a[i].size != b[j].size)
        throw std::invalid_argument("block-scaled MMA: row " + std::to_string(i) + " has " +
                                    std::to_string(a[i].size) + " values but column " + std::to_string(j) + " has " +
                                    std::to_string(b[j].size));
      double& c = C[i * ldc + j];
      if (std::isfinite(c) && !fp32().representable(c))
        throw std::invalid_argument("block-scaled MMA: C[" + std::to_string(i) + "][" + std::to_string(j) +
                                    "] is not an fp32 value");
      const ElementGuard element(ctx, static_cast<std::int64_t>(i * b.size() + j),
                                 {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
      c = dot_with(ctx, a[i], b[j], c, epilogue);
    }
}

std::unique_ptr<BlockMmaUnit> make_block_mma_unit(UnitKind device, const BlockFormat& a, const BlockFormat& b) {
  return std::make_unique<BlockMmaUnit>(device, a, b, block_mma_params(device, a, b));
}

}  // namespace emu
