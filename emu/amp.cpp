#include "amp.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "exact_sum.hpp"

namespace emu {

namespace {

constexpr int kMaxProductsPerPass = 64;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using i128 = __int128;
using u128 = unsigned __int128;

bool same_layout(const Format& a, const Format& b) { return a == b; }
bool is_fp16(const Format& f) { return same_layout(f, fp16()); }
bool is_fp32(const Format& f) { return same_layout(f, fp32()); }

// A finite non-zero double as +-m * 2^e with m odd (m < 2^53).
struct OddSignificand {
  std::uint64_t m;
  int e;                             // weight of the lowest set bit
  int highest() const { return e + static_cast<int>(std::bit_width(m)) - 1; }  // floor(log2 |x|)
};
OddSignificand odd_significand(double x) {
  const auto bits = std::bit_cast<std::uint64_t>(x);
  const int field = static_cast<int>((bits >> 52) & 0x7FF);
  std::uint64_t m = bits & ((std::uint64_t{1} << 52) - 1);
  int e = -1074;
  if (field != 0) {
    m |= std::uint64_t{1} << 52;
    e = field - 1075;
  }
  const int tz = std::countr_zero(m);
  return {m >> tz, e + tz};
}

// The nearest double to v * 2^lsb (ties to even) and the residual, for a non-zero v.
Exact from_fixed(i128 v, int lsb) {
  const bool negative = v < 0;
  const u128 mag = negative ? -static_cast<u128>(v) : static_cast<u128>(v);
  const auto top = static_cast<std::uint64_t>(mag >> 64);
  const int width = top != 0 ? 128 - std::countl_zero(top) : 64 - std::countl_zero(static_cast<std::uint64_t>(mag));
  double hi = 0, lo = 0;
  if (width <= 53) {
    hi = std::ldexp(static_cast<double>(static_cast<std::uint64_t>(mag)), lsb);
  } else {
    // Keep the top 53 bits; round the rest to nearest, ties to even.
    const int shift = width - 53;
    u128 kept = mag >> shift;
    const u128 rest = mag - (kept << shift);
    const u128 half = u128{1} << (shift - 1);
    i128 residual = static_cast<i128>(rest);
    if (rest > half || (rest == half && (kept & 1))) {
      ++kept;
      residual -= static_cast<i128>(u128{1} << shift);
    }
    hi = std::ldexp(static_cast<double>(static_cast<std::uint64_t>(kept)), lsb + shift);
    lo = std::ldexp(static_cast<double>(residual), lsb);  // exact when it fits a double
  }
  if (std::isinf(hi)) return {negative ? -kInf : kInf, 0.0, true};
  return negative ? Exact{-hi, -lo} : Exact{hi, lo};
}

// The exact sum of n <= 65 finite doubles. Terms whose bits span at most 120 binades
// are summed as integers in 128 bits (65 terms below 2^120 cannot overflow 2^127);
// wider spans go through the long accumulator.
Exact exact_sum_of(const double* t, int n) {
  std::array<OddSignificand, kMaxProductsPerPass + 1> parts;
  std::array<bool, kMaxProductsPerPass + 1> negative;
  int count = 0, lowest = INT_MAX, highest = INT_MIN;
  for (int i = 0; i < n; ++i) {
    if (t[i] == 0) continue;
    const auto slot = static_cast<std::size_t>(count++);
    parts[slot] = odd_significand(t[i]);
    negative[slot] = std::signbit(t[i]);
    lowest = std::min(lowest, parts[slot].e);
    highest = std::max(highest, parts[slot].highest());
  }
  if (count == 0) return {0.0};
  if (highest - lowest < 120) {
    i128 acc = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i) {
      const i128 term = static_cast<i128>(parts[i].m) << (parts[i].e - lowest);
      acc += negative[i] ? -term : term;
    }
    if (acc == 0) return {0.0};
    return from_fixed(acc, lowest);
  }
  ExactSum sum;
  for (int i = 0; i < n; ++i) sum.add(t[i]);
  return sum.value();
}

// Round-to-nearest-even of x into f where the result is a normal finite number of f
// (the common case, kept off the general path for speed): keep the top fraction bits
// of |hi|; the dropped bits decide, and at an exact half the residual lo (its sign
// only: |lo| is below half an ulp of double) or else evenness. Returns false where
// the general rounding is needed (tiny, overflow, NaN, infinity).
bool round_nearest_even_normal(const Format& f, const Exact& x, double& out, bool& inexact) {
  const double magnitude = std::fabs(x.hi);
  const bool negative = std::signbit(x.hi);
  const double away = negative ? -x.lo : x.lo;  // > 0: the exact value lies beyond |hi|
  if (!(magnitude >= f.min_normal() && magnitude <= f.max_finite())) return false;
  if (magnitude == f.min_normal() && away < 0) return false;  // tiny: UFLO rules apply
  const int dropped = 52 - f.fraction_bits();
  if (dropped < 1) return false;
  const auto bits = std::bit_cast<std::uint64_t>(magnitude);
  const std::uint64_t half = std::uint64_t{1} << (dropped - 1);
  const std::uint64_t rest = bits & ((half << 1) - 1);
  std::uint64_t kept = bits >> dropped;
  if (rest > half || (rest == half && (away > 0 || (away == 0 && (kept & 1))))) ++kept;
  const double rounded = std::bit_cast<double>(kept << dropped);
  if (rounded > f.max_finite()) return false;
  inexact = rest != 0 || x.lo != 0;
  out = negative ? -rounded : rounded;
  return true;
}

// Truncates t toward zero to a multiple of 2^quantum.
double truncate_to(double t, int quantum) { return std::ldexp(std::trunc(std::ldexp(t, -quantum)), quantum); }

// floor(log2 |t|) of the largest non-zero term; INT_MIN if all are zero.
int largest_exponent(const double* t, int n) {
  int e = INT_MIN;
  for (int i = 0; i < n; ++i)
    if (t[i] != 0 && std::isfinite(t[i])) e = std::max(e, std::ilogb(t[i]));
  return e;
}

// One AMP dot product under one context: the phases, the passes between them, and
// the roundings with their flags.
class AmpRun {
 public:
  AmpRun(Context& ctx, const AmpConfig& cfg) : ctx_(ctx), cfg_(cfg), accumulator_(fp32()) {}

  double dot(std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb, double c) {
    const std::size_t per_pass = static_cast<std::size_t>(cfg_.products_per_pass());
    double partial = c;
    if (k == 0) partial = round_into(cfg_.output, Exact{c}, c, 0);
    for (std::size_t start = 0; start < k; start += per_pass) {
      const std::size_t len = std::min(per_pass, k - start);
      const bool last = start + len == k;
      partial = pass(partial, len, a + start * sa, sa, b + start * sb, sb, last ? cfg_.output : cfg_.partials);
    }
    flush_inexact();
    return partial;
  }

 private:
  // A phase's terms: slot 0 the running value, then the products.
  struct Terms {
    std::array<double, kMaxProductsPerPass + 1> t;
    int n = 0;
    Flags raised = 0;   // INV from inf * 0 or inf - inf
    bool special = false;  // a NaN or infinite term: the IEEE result is in `value`
    double value = 0;
  };

  // Products of one phase (exact: fp16 x fp16 and fp32 x fp32 fit in a double).
  void add_products(Terms& terms, std::size_t count, const double* a, std::size_t sa, const double* b,
                    std::size_t sb) const {
    for (std::size_t i = 0; i < count; ++i) {
      const double x = a[i * sa], y = b[i * sb];
      const double p = x * y;
      if (std::isnan(p) && !std::isnan(x) && !std::isnan(y)) terms.raised |= INV;  // inf * 0
      terms.t[static_cast<std::size_t>(terms.n++)] = p;
    }
  }

  // IEEE 754 results for terms with NaN or infinity: NaN propagates (no flag); +inf and
  // -inf together are invalid.
  static void resolve_specials(Terms& terms) {
    bool nan = false, plus = false, minus = false;
    for (int i = 0; i < terms.n; ++i) {
      const double v = terms.t[static_cast<std::size_t>(i)];
      nan |= std::isnan(v);
      plus |= v == kInf;
      minus |= v == -kInf;
    }
    if (!nan && !plus && !minus) return;
    terms.special = true;
    if (plus && minus && !nan) terms.raised |= INV;
    terms.value = (nan || (plus && minus)) ? kNaN : (plus ? kInf : -kInf);
  }

  // Alignment truncation of terms [from, n): against the largest of them and of the
  // carried running value (`carried`, 0 when the running value is among the terms).
  void align(Terms& terms, int from, double carried) const {
    if (cfg_.alignment_bits == AmpConfig::kExactPhase) return;
    int e = largest_exponent(terms.t.data() + from, terms.n - from);
    if (carried != 0 && std::isfinite(carried)) e = std::max(e, std::ilogb(carried));
    if (e == INT_MIN) return;
    const int quantum = e - cfg_.alignment_bits;
    for (int i = from; i < terms.n; ++i) {
      double& v = terms.t[static_cast<std::size_t>(i)];
      if (v != 0) v = truncate_to(v, quantum);
    }
  }

  // The exact sum of the terms; an exact zero keeps -0 only when every term is -0.
  static Exact sum(const Terms& terms) {
    // Most phases add up exactly in double: then every TwoSum error (Knuth) is zero.
    double running = terms.t[0];
    bool exact_in_double = true;
    for (int i = 1; i < terms.n; ++i) {
      const double term = terms.t[static_cast<std::size_t>(i)];
      const double s = running + term;
      const double back = s - running;
      exact_in_double &= ((running - (s - back)) + (term - back)) == 0;
      running = s;
    }
    if (exact_in_double && running != 0) return {running};
    const Exact x = exact_sum_of(terms.t.data(), terms.n);
    if (x.hi != 0 || x.lo != 0) return x;
    bool all_negative_zero = terms.n > 0;
    for (int i = 0; i < terms.n; ++i) all_negative_zero &= std::signbit(terms.t[static_cast<std::size_t>(i)]);
    return {all_negative_zero ? -0.0 : 0.0};
  }

  // Rounds into f: fp32 with the accumulator's rounding, narrower formats under the
  // context (RNE, or SR when esr is set). RNE results in f's normal range take the fast
  // path, whose only flag, INEXACT (never trapped), is collected and raised in one go
  // before the next general rounding and at the end of the dot product.
  double round_into(const Format& f, const Exact& x, double operand, Flags raised) {
    const bool accumulator_width = f.precision() >= accumulator_.precision();
    const Rounding mode = accumulator_width && cfg_.accumulator_rounding ? *cfg_.accumulator_rounding
                                                                        : ctx_.control.effective_rounding();
    double result = 0;
    bool inexact = false;
    if (raised == 0 && mode == Rounding::rne && round_nearest_even_normal(f, x, result, inexact)) {
      inexact_pending_ |= inexact;
      return result;
    }
    flush_inexact();
    return ctx_.round_with(mode, f, x, "amp", {operand}, raised);
  }

  // Context has no public way to raise a flag: rounding an exact zero raises exactly
  // the flags handed to it.
  void flush_inexact() {
    if (!inexact_pending_) return;
    inexact_pending_ = false;
    (void)ctx_.round_with(Rounding::rne, accumulator_, Exact{0.0}, "amp", {}, INEXACT);
  }

  double settle(const Terms& terms, const Format& f, double operand) {
    if (terms.special) return round_into(f, Exact{terms.value}, operand, terms.raised);
    return round_into(f, sum(terms), operand, terms.raised);
  }

  double pass(double partial, std::size_t len, const double* a, std::size_t sa, const double* b, std::size_t sb,
              const Format& out) {
    const std::size_t per_phase = static_cast<std::size_t>(cfg_.products_per_phase);
    if (cfg_.round_each_phase) {
      double running = partial;
      for (std::size_t start = 0; start < len; start += per_phase) {
        Terms terms;
        terms.t[0] = running;
        terms.n = 1;
        add_products(terms, std::min(per_phase, len - start), a + start * sa, sa, b + start * sb, sb);
        resolve_specials(terms);
        if (!terms.special) align(terms, 0, 0.0);
        running = settle(terms, accumulator_, running);
        if (cfg_.partials.precision() < accumulator_.precision())
          running = round_into(cfg_.partials, Exact{running}, running, 0);
      }
      return round_into(out, Exact{running}, running, 0);  // f16v4sihoamp's fp16 output
    }
    // Exact through the pass: collect every (aligned) term, round once at the end.
    Terms terms;
    terms.t[0] = partial;
    terms.n = 1;
    for (std::size_t start = 0; start < len; start += per_phase) {
      const int first_product = terms.n;
      add_products(terms, std::min(per_phase, len - start), a + start * sa, sa, b + start * sb, sb);
      resolve_specials(terms);
      if (terms.special) break;
      if (cfg_.alignment_bits != AmpConfig::kExactPhase) {
        // The carried value is not truncated (it is the adder's own register), except
        // the input partial entering the first phase.
        const bool first_phase = first_product == 1;
        const double carried = first_phase ? 0.0 : exact_sum_of(terms.t.data(), first_product).hi;
        align(terms, first_phase ? 0 : first_product, carried);
      }
    }
    return settle(terms, out, partial);
  }

  Context& ctx_;
  const AmpConfig& cfg_;
  const Format& accumulator_;  // the fp32 the running value is rounded into
  bool inexact_pending_ = false;
};

class AmpUnit final : public MatrixUnit {
 public:
  explicit AmpUnit(AmpConfig cfg) : cfg_(std::move(cfg)) {}
  UnitKind kind() const override {
    return is_fp16(cfg_.partials) ? UnitKind::ipu_amp_half : UnitKind::ipu_amp;
  }
  const Format& input_format() const override { return cfg_.input; }
  const Format& output_format() const override { return cfg_.output; }
  double dot(Context& ctx, std::size_t k, const double* a, std::size_t sa, const double* b, std::size_t sb,
             double c) const override {
    return AmpRun(ctx, cfg_).dot(k, a, sa, b, sb, c);
  }
  // The same dot products in the same order as the default (so stochastic rounding
  // draws the same random bits), with B transposed once so that every dot product
  // reads contiguous memory.
  void gemm(Context& ctx, std::size_t m, std::size_t n, std::size_t k, const double* A, std::size_t lda,
            const double* B, std::size_t ldb, double* C, std::size_t ldc) const override {
    std::vector<double> columns(n * k);
    for (std::size_t q = 0; q < k; ++q)
      for (std::size_t j = 0; j < n; ++j) columns[j * k + q] = B[q * ldb + j];
    AmpRun run(ctx, cfg_);
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        C[i * ldc + j] = run.dot(k, A + i * lda, 1, columns.data() + j * k, 1, C[i * ldc + j]);
  }

 private:
  AmpConfig cfg_;
};

[[noreturn]] void reject(const std::string& what) { throw std::invalid_argument("AMP config: " + what); }

}  // namespace

const char* partials_type_name(PartialsType p) { return p == PartialsType::half ? "half" : "float"; }

PartialsType partials_type_by_name(std::string_view name) {
  if (name == "half") return PartialsType::half;
  if (name == "float") return PartialsType::float32;
  throw std::invalid_argument("unknown partials type '" + std::string(name) + "' (known: half float)");
}

void validate(const AmpConfig& cfg) {
  if (!is_fp16(cfg.input) && !is_fp32(cfg.input))
    reject("input format " + cfg.input.name() + " (the AMP takes fp16 or fp32)");
  if (!is_fp16(cfg.partials) && !is_fp32(cfg.partials))
    reject("partials format " + cfg.partials.name() + " (partialsType is half or float)");
  if (!is_fp16(cfg.output) && !is_fp32(cfg.output))
    reject("output format " + cfg.output.name() + " (the AMP writes fp16 or fp32)");
  if (is_fp32(cfg.input) && !(is_fp32(cfg.partials) && is_fp32(cfg.output)))
    reject("fp32 inputs need fp32 partials and output (f32sisoamp is fp32 throughout)");
  if (is_fp16(cfg.partials) && !is_fp16(cfg.output))
    reject("fp16 partials give an fp16 output (f16v4hihoamp)");
  if (cfg.products_per_phase < 1 || cfg.phases_per_pass < 1 || cfg.products_per_pass() > kMaxProductsPerPass)
    reject("products_per_phase and phases_per_pass must be >= 1 with at most " +
           std::to_string(kMaxProductsPerPass) + " products per pass");
  if (cfg.alignment_bits < AmpConfig::kExactPhase || cfg.alignment_bits > 200)
    reject("alignment_bits must be -1 (exact) or 0..200");
}

AmpConfig amp_config(PartialsType partials, const Format& in, std::optional<Format> out) {
  AmpConfig cfg;
  cfg.input = in;
  cfg.partials = partials == PartialsType::half ? fp16() : fp32();
  cfg.output = out.value_or(cfg.partials);
  if (is_fp32(in)) {  // f32sisoamp: one fp32 input per phase, 8 phases per pass
    cfg.products_per_phase = 1;
    cfg.phases_per_pass = 8;
  }
  validate(cfg);
  return cfg;
}

double amp_dot(Context& ctx, const AmpConfig& cfg, std::size_t k, const double* a, std::size_t sa, const double* b,
               std::size_t sb, double c) {
  return AmpRun(ctx, cfg).dot(k, a, sa, b, sb, c);
}

std::unique_ptr<MatrixUnit> make_amp_unit(const AmpConfig& cfg) {
  validate(cfg);
  return std::make_unique<AmpUnit>(cfg);
}

std::unique_ptr<MatrixUnit> make_ipu_amp_unit(bool half_partials, std::optional<Format> in,
                                              std::optional<Format> out) {
  return make_amp_unit(amp_config(half_partials ? PartialsType::half : PartialsType::float32,
                                  in.value_or(fp16()), std::move(out)));
}

}  // namespace emu
