#include "cdna.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "round.hpp"

namespace emu {

namespace {

constexpr int kMaxGroup = 64;
constexpr int kFp32Emin = -126;  // c's exponent floor in the fused path

bool same_layout(const Format& f, const Format& preset) { return f.with_subnormals(true) == preset; }

// MFMA rounds to nearest even whatever the context says: its rounding is pinned while
// a dot runs (flags, overflow policy, tininess and traps stay the context's).
class NearestEven {
 public:
  explicit NearestEven(Context& ctx) : ctx_(ctx), rounding_(ctx.control.rounding), esr_(ctx.control.esr) {
    ctx.control.rounding = Rounding::rne;
    ctx.control.esr = false;
  }
  ~NearestEven() {
    ctx_.control.rounding = rounding_;
    ctx_.control.esr = esr_;
  }
  NearestEven(const NearestEven&) = delete;
  NearestEven& operator=(const NearestEven&) = delete;

 private:
  Context& ctx_;
  Rounding rounding_;
  bool esr_;
};

// v / 2^s rounded toward minus infinity (floor) or toward zero, s >= 0.
std::int64_t shift_down(std::int64_t v, int s, bool floor) {
  if (s == 0) return v;
  if (s >= 63) return floor && v < 0 ? -1 : 0;
  if (floor || v >= 0) return v >> s;  // arithmetic shift: floor
  return -((-v) >> s);
}

// The exponent the fused adder aligns a non-zero x with: its own, clamped at emin.
int aligned_exponent(double x, int emin) { return std::max(std::ilogb(std::fabs(x)), emin); }

// x with its 13 low binary32 fraction bits cleared (tf32, toward zero).
double truncate_to_tf32(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(std::fabs(x)), kFp32Emin);
  const double unit = std::ldexp(1.0, e - 10);
  return std::trunc(x / unit) * unit;
}

class CdnaUnit final : public MatrixUnit {
 public:
  CdnaUnit(UnitKind kind, Format in, Format in_b, Format out, CdnaParams params)
      : kind_(kind), in_(std::move(in)), in_b_(std::move(in_b)), out_(std::move(out)), params_(params) {
    if (params_.group_size < 1 || params_.group_size > kMaxGroup)
      throw std::invalid_argument("AMD MFMA: the group size must be 1.." + std::to_string(kMaxGroup));
    for (int bits : {params_.kept_fraction_bits, params_.sum_fraction_bits, params_.c_fraction_bits})
      if (bits < 1 || bits > 40) throw std::invalid_argument("AMD MFMA: kept fraction bits must be 1..40");
    if (params_.sum_fraction_bits < params_.kept_fraction_bits || params_.sum_fraction_bits < params_.c_fraction_bits)
      throw std::invalid_argument("AMD MFMA: S's kept bits must be at least the products' and c's");
  }

  UnitKind kind() const override { return kind_; }
  const Format& input_format() const override { return in_; }
  const Format& b_input_format() const override { return in_b_; }
  const Format& output_format() const override { return out_; }

  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb,
             double c) const override {
    const NearestEven rne(ctx);
    const auto group = static_cast<std::size_t>(params_.group_size);
    double x[kMaxGroup], y[kMaxGroup];
    if (params_.flush_subnormals) c = flush_input(c, out_);
    for (std::size_t first = 0; first < k; first += group) {
      const std::size_t n = std::min(group, k - first);
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = operand(a[(first + i) * sa], in_);
        y[i] = operand(b[(first + i) * sb], in_b_);
      }
      switch (params_.path) {
        case CdnaPath::fma_chain:
          for (std::size_t i = 0; i < n; ++i) c = ctx.fma(out_, x[i], y[i], c);
          break;
        case CdnaPath::pairwise: c = flush(ctx.add(out_, c, pairwise(ctx, x, y, n))); break;
        case CdnaPath::fused: c = fused(ctx, x, y, n, c); break;
      }
    }
    return c;
  }

 private:
  // An input as the datapath takes it: checked against its operand's format f (xf32
  // takes any fp32 value and truncates it), flushed where the datapath flushes.
  double operand(double v, const Format& f) const {
    if (params_.truncate_to_tf32) {
      if (std::isfinite(v) && !fp32().representable(v))
        throw std::invalid_argument(unit_kind_name(kind_) + std::string(": ") + std::to_string(v) +
                                    " is not an fp32 value");
      return truncate_to_tf32(v);
    }
    if (std::isfinite(v) && !f.representable(v))
      throw std::invalid_argument(unit_kind_name(kind_) + std::string(": ") + std::to_string(v) + " is not an " +
                                  f.name() + " value");
    return params_.flush_subnormals ? flush_input(v, f) : v;
  }

  // Pairwise step 1: a subnormal input (or a zero of either sign) becomes +0.
  static double flush_input(double v, const Format& f) { return std::fabs(v) < std::ldexp(1.0, f.emin()) ? 0.0 : v; }
  // The flush after pairwise steps 2-4: below 2^-126, a zero of the same sign.
  double flush(double v) const {
    if (!params_.flush_subnormals || !(std::fabs(v) < std::ldexp(1.0, fp32().emin()))) return v;
    return std::copysign(0.0, v);
  }

  // Pairwise steps 2 and 3 on n >= 1 products.
  double pairwise(Context& ctx, const double* x, const double* y, std::size_t n) const {
    if (n == 1) return flush(ctx.fma(fp32(), x[0], y[0], 0.0));
    const std::size_t half = n / 2;
    const double left = pairwise(ctx, x, y, half);
    const double right = pairwise(ctx, x + half, y + half, n - half);
    return flush(ctx.add(fp32(), left, right));
  }

  // A fused group with a NaN or infinite operand, product or c (see the header).
  double fused_special(Context& ctx, const double* x, const double* y, std::size_t n, double c, bool& handled) const {
    bool nan = std::isnan(c), invalid = false, pos = c == INFINITY, neg = c == -INFINITY;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isnan(x[i]) || std::isnan(y[i])) {
        nan = true;
      } else if ((std::isinf(x[i]) && y[i] == 0) || (std::isinf(y[i]) && x[i] == 0)) {
        invalid = true;
      } else {
        const double p = x[i] * y[i];
        if (std::fabs(p) >= 0x1p128) (p > 0 ? pos : neg) = true;
      }
    }
    invalid = invalid || (pos && neg);
    handled = nan || invalid || pos || neg;
    const double quiet_nan = std::numeric_limits<double>::quiet_NaN();
    if (invalid && !nan) ctx.raise_flags(INV, "mma", {}, quiet_nan);
    if (nan || invalid) return quiet_nan;
    return pos ? INFINITY : -INFINITY;
  }

  // Fused steps 2 and 3 over the products i = first, first + step, ... < n: their cut
  // sum in units of 2^(exp - kept); exp < kNone where every product is zero.
  static constexpr int kNone = std::numeric_limits<int>::min() / 2;
  std::int64_t cut_sum(const double* x, const double* y, std::size_t n, std::size_t first, std::size_t step, int& exp,
                       bool& lost) const {
    const int emin_a = in_.emin(), emin_b = in_b_.emin();
    exp = kNone;
    for (std::size_t i = first; i < n; i += step)
      if (x[i] != 0 && y[i] != 0) exp = std::max(exp, aligned_exponent(x[i], emin_a) + aligned_exponent(y[i], emin_b));
    if (exp == kNone) return 0;
    std::int64_t sum = 0;
    for (std::size_t i = first; i < n; i += step) {
      // Exact: the product has at most 22 significant bits and lies below 2^(exp + 2).
      const double scaled = std::ldexp(x[i] * y[i], params_.kept_fraction_bits - exp);
      const double cut = std::trunc(scaled);
      lost = lost || cut != scaled;
      sum += static_cast<std::int64_t>(cut);
    }
    return sum;
  }

  double fused(Context& ctx, const double* x, const double* y, std::size_t n, double c) const {
    bool special = false;
    const double s = fused_special(ctx, x, y, n, c, special);
    if (special) return s;
    const bool floor = params_.floor_alignment;
    const int kept = params_.kept_fraction_bits, sum_bits = params_.sum_fraction_bits, c_bits = params_.c_fraction_bits;
    bool lost = false;

    // Step 3: S in units of 2^(E - kept).
    int e = kNone;
    std::int64_t sum = 0;
    if (!params_.split_halves) {
      sum = cut_sum(x, y, n, 0, 1, e, lost);
    } else {
      int e0 = kNone, e1 = kNone;
      const std::int64_t s0 = cut_sum(x, y, n, 0, 2, e0, lost), s1 = cut_sum(x, y, n, 1, 2, e1, lost);
      e = std::max(e0, e1);
      for (auto [part, pe] : {std::pair{s0, e0}, std::pair{s1, e1}}) {
        if (pe == kNone) continue;
        const std::int64_t aligned = shift_down(part, e - pe, floor);
        lost = lost || (aligned << std::min(e - pe, 62)) != part;
        sum += aligned;
      }
    }
    if (e == kNone) return c == 0 ? 0.0 : c;  // no non-zero product: c as it is (+0 for -0)

    // Step 4: S and c floored against M, in units of 2^(M - sum_bits).
    const int ec = c == 0 ? kFp32Emin : aligned_exponent(c, kFp32Emin);
    const int m = std::max(e, ec);
    const int shift = (e - kept) - (m - sum_bits);
    std::int64_t total = 0;
    if (shift >= 0) {
      total = sum << shift;
    } else {
      total = shift_down(sum, -shift, floor);
      lost = lost || (total << std::min(-shift, 62)) != sum;
    }
    std::int64_t c_units = 0;
    if (c != 0 && !(params_.split_halves && ec < m - (c_bits + 1))) {
      const double scaled = std::ldexp(c, c_bits - m);  // exact: c has 24 bits at most
      const double cut = floor ? std::floor(scaled) : std::trunc(scaled);
      lost = lost || cut != scaled;
      c_units = static_cast<std::int64_t>(cut);
    } else {
      lost = lost || c != 0;
    }
    total += c_units << (sum_bits - c_bits);

    // Step 5: one rounding into fp32. Exact in double: |total| < 2^40.
    const Flags truncated = lost ? INEXACT : 0;
    if (total == 0) {
      if (truncated != 0) ctx.raise_flags(truncated, "mma", {}, 0.0);
      return 0.0;
    }
    const double value = std::ldexp(static_cast<double>(total), m - sum_bits);
    return ctx.round_with(Rounding::rne, out_, Exact{value}, "mma", {}, truncated);
  }

  UnitKind kind_;
  Format in_, in_b_, out_;  // A's, B's (in_ but for mixed inputs), the output's
  CdnaParams params_;
};

CdnaParams fused_params(int instruction_k, int group_size) {
  CdnaParams p;
  p.path = CdnaPath::fused;
  p.instruction_k = instruction_k;
  p.group_size = group_size;
  return p;
}

CdnaParams pairwise_params(int instruction_k, int group_size, bool flush) {
  CdnaParams p;
  p.path = CdnaPath::pairwise;
  p.instruction_k = instruction_k;
  p.group_size = group_size;
  p.flush_subnormals = flush;
  return p;
}

}  // namespace

bool is_cdna_unit(UnitKind unit) {
  return unit == UnitKind::mi100 || unit == UnitKind::mi250x || unit == UnitKind::mi300x;
}

bool takes_mixed_inputs(UnitKind unit) { return unit == UnitKind::mi300x; }

CdnaParams cdna_params(UnitKind unit, const Format& in, const Format& out) {
  if (!is_cdna_unit(unit))
    throw std::invalid_argument(std::string("unit '") + unit_kind_name(unit) + "' is no AMD matrix core");
  const std::string name = unit_kind_name(unit);
  const bool cdna1 = unit == UnitKind::mi100, cdna2 = unit == UnitKind::mi250x, cdna3 = unit == UnitKind::mi300x;
  const bool fp64_in = same_layout(in, fp64());
  CdnaParams p;
  if (same_layout(in, fp16())) {
    p = cdna3 ? fused_params(16, 8) : pairwise_params(16, 4, cdna2);
  } else if (same_layout(in, bf16())) {
    p = cdna3 ? fused_params(16, 8) : cdna2 ? pairwise_params(16, 4, true) : pairwise_params(8, 2, false);
  } else if (same_layout(in, fp32()) || (fp64_in && !cdna1)) {
    p.path = CdnaPath::fma_chain;  // v_mfma_f32_16x16x4f32, v_mfma_f64_16x16x4f64
  } else if (cdna3 && same_layout(in, tf32())) {
    p = fused_params(8, 4);
    p.truncate_to_tf32 = true;
  } else if (cdna3 && (same_layout(in, fp8_e4m3fnuz()) || same_layout(in, fp8_e5m2fnuz()))) {
    p = fused_params(32, 16);
    p.split_halves = true;
  } else {
    const char* accepted = cdna1   ? "fp16, bf16, fp32"
                           : cdna2 ? "fp16, bf16, fp32, fp64"
                                   : "fp16, bf16, tf32, fp8-e4m3fnuz, fp8-e5m2fnuz, fp32, fp64";
    throw std::invalid_argument(name + " matrix cores do not take " + in.name() + " inputs (they take " + accepted +
                                ")");
  }
  if (!same_layout(out, fp64_in ? fp64() : fp32()))
    throw std::invalid_argument(name + " matrix cores do not give " + out.name() + " output for " + in.name() +
                                " inputs (" + (fp64_in ? "fp64" : "fp32") + ")");
  return p;
}

CdnaParams cdna_params(UnitKind unit, const Format& a, const Format& b, const Format& out) {
  if (same_layout(a, b)) return cdna_params(unit, a, out);
  const std::string name = unit_kind_name(unit);
  if (!takes_mixed_inputs(unit))
    throw std::invalid_argument(name + " matrix cores take one input format for A and B");
  const bool e4m3_a = same_layout(a, fp8_e4m3fnuz()), e5m2_a = same_layout(a, fp8_e5m2fnuz());
  const bool e4m3_b = same_layout(b, fp8_e4m3fnuz()), e5m2_b = same_layout(b, fp8_e5m2fnuz());
  if (!((e4m3_a && e5m2_b) || (e5m2_a && e4m3_b)))
    throw std::invalid_argument(name + " matrix cores mix fp8-e4m3fnuz with fp8-e5m2fnuz only (either as A), not " +
                                a.name() + " with " + b.name());
  return cdna_params(unit, a, out);  // the fp8 path: one decoder per operand (CdnaUnit)
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format in, Format in_b, Format out, CdnaParams params) {
  return std::make_unique<CdnaUnit>(unit, std::move(in), std::move(in_b), std::move(out), params);
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, std::optional<Format> in, std::optional<Format> out) {
  Format input = in.value_or(fp16());
  Format output = out.value_or(same_layout(input, fp64()) ? fp64() : fp32());
  const CdnaParams params = cdna_params(unit, input, output);
  return make_cdna_unit(unit, input, input, std::move(output), params);
}

std::unique_ptr<MatrixUnit> make_cdna_unit(UnitKind unit, Format a, Format b, std::optional<Format> out) {
  if (same_layout(a, b)) return make_cdna_unit(unit, std::optional<Format>(std::move(a)), out);
  Format output = out.value_or(fp32());
  const CdnaParams params = cdna_params(unit, a, b, output);
  return make_cdna_unit(unit, std::move(a), std::move(b), std::move(output), params);
}

}  // namespace emu
