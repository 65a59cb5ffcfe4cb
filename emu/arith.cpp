#include "arith.hpp"

// GCC 12 reports false -Warray-bounds positives inside Boost.Multiprecision.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <boost/multiprecision/cpp_bin_float.hpp>
#pragma GCC diagnostic pop
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace emu {

namespace {

namespace mp = boost::multiprecision;
// Wide enough to hold a*b + c exactly for any doubles (exponents span 2^1024 .. 2^-2148).
using Wide = mp::number<mp::cpp_bin_float<3400, mp::digit_base_2, void, std::int32_t, -20000, 20000>,
                        mp::et_off>;
// For quotients and roots, computed to 200 bits plus the sign of what was left over.
using Narrow = mp::number<mp::cpp_bin_float<200, mp::digit_base_2, void, std::int32_t, -20000, 20000>,
                          mp::et_off>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Below this magnitude products and remainders of doubles may lose bits to underflow.
constexpr double kSafeLow = 0x1p-969;
// Residuals of tiny results are held as lo * 2^-kResidualScale (they reach 2^-2148 - 200).
constexpr int kResidualScale = 1300;
// A residual known only by its sign: lo = +-1 * 2^-kTinyScale, below every format's bits.
constexpr int kTinyScale = 2400;

// The nearest double to v + sticky*tiny, with the residual (sticky = sign of what v
// leaves out: -1, 0 or +1). Beyond double's range: +-DBL_MAX with the residual while
// |v| < 2^1024 (directed rounding must not overflow there), else beyond_double.
Exact to_exact(const Wide& v, int sticky) {
  if (v == 0) return {0.0};  // an exact zero (quotients and roots are never zero here)
  constexpr double kMax = std::numeric_limits<double>::max();
  constexpr double kLeast = std::numeric_limits<double>::denorm_min();
  double hi = v.convert_to<double>();
  if (abs(v) > Wide(kMax)) {
    if (abs(v) >= ldexp(Wide(1), 1024)) return {v > 0 ? HUGE_VAL : -HUGE_VAL, 0.0, true};
    hi = v > 0 ? kMax : -kMax;
  } else {
    // Make hi the nearest double (convert_to's rounding is not relied on).
    for (int i = 0; i < 3; ++i) {
      const Wide r = v - Wide(hi);
      const double toward = r > 0 ? HUGE_VAL : -HUGE_VAL;
      const double next = std::nextafter(hi, toward);
      if (std::isinf(next)) break;
      const Wide gap = abs(Wide(next) - Wide(hi));
      const Wide twice = abs(r) * 2;
      if (twice > gap || (twice == gap && sticky != 0 && (r > 0) == (sticky > 0))) {
        hi = next;
        continue;
      }
      break;
    }
  }
  if (hi == 0) hi = v > 0 ? kLeast : -kLeast;  // |v| <= kLeast / 2: hi is not exact, so round() sees lo
  const Wide r = v - Wide(hi);
  if (r == 0) {
    if (sticky == 0) return {hi};
    // v is a double and the rest lies far below any format's last bit: only its sign counts.
    return {hi, static_cast<double>(sticky), false, kTinyScale};
  }
  // Residuals below the normal range are held scaled, so no bit and no tie is lost.
  const int scale = abs(r) < Wide(std::numeric_limits<double>::min()) ? kResidualScale : 0;
  const Wide scaled = ldexp(r, scale);
  double lo = scaled.convert_to<double>();
  const Wide lo_error = scaled - Wide(lo);
  const int beyond_lo = lo_error > 0 ? 1 : (lo_error < 0 ? -1 : sticky);
  // An inexact lo that lands on a power of two may sit exactly on half an ulp of a
  // 52-bit format and fake a tie: step it one double toward the true residual.
  int e = 0;
  if (beyond_lo != 0 && std::fabs(std::frexp(lo, &e)) == 0.5)
    lo = std::nextafter(lo, beyond_lo > 0 ? HUGE_VAL : -HUGE_VAL);
  return {hi, lo, false, scale};
}

int sign_of(const Wide& w) { return w > 0 ? 1 : (w < 0 ? -1 : 0); }

}  // namespace

Exact exact_add(double a, double b) {
  // Knuth's TwoSum: s + e == a + b exactly whenever s is finite.
  const double s = a + b;
  if (std::isinf(s)) return to_exact(Wide(a) + Wide(b), 0);
  const double bb = s - a;
  const double e = (a - (s - bb)) + (b - bb);
  if (!std::isfinite(e)) return to_exact(Wide(a) + Wide(b), 0);  // s - a overflowed near DBL_MAX
  return {s, e};
}

Exact exact_mul(double a, double b) {
  const double p = a * b;
  if (std::isinf(p)) return to_exact(Wide(a) * Wide(b), 0);
  if (a == 0 || b == 0) return {p};
  if (std::fabs(p) >= kSafeLow) return {p, std::fma(a, b, -p)};  // TwoProduct, exact
  return to_exact(Wide(a) * Wide(b), 0);
}

Exact exact_fma(double a, double b, double c) {
  if (a == 0 || b == 0) return exact_add(std::copysign(0.0, a) * std::copysign(1.0, b), c);
  const double p = a * b;
  if (std::isfinite(p) && std::fabs(p) >= kSafeLow && std::fma(a, b, -p) == 0) {
    if (c == 0) return {p};
    return exact_add(p, c);  // a*b is a double: one TwoSum is exact
  }
  const Wide w = Wide(a) * Wide(b) + Wide(c);
  if (w == 0) return {0.0};  // exact cancellation: +0 (the caller fixes the sign for rd)
  return to_exact(w, 0);
}

Exact exact_div(double a, double b) {
  const double q = a / b;
  if (a == 0) return {q};
  if (std::isfinite(q) && std::fabs(q) >= kSafeLow && std::fabs(a) >= kSafeLow) {
    const double r = std::fma(-q, b, a);  // exact remainder a - q*b
    const double lo = r / b;
    // lo is r/b rounded; only a power of two can be a fake half-ulp tie (true quotients
    // of doubles are never midpoints in the normal range): those take the slow path.
    int e = 0;
    if (lo == 0 || std::fabs(std::frexp(lo, &e)) != 0.5) return {q, lo};
  }
  const Narrow qn = Narrow(a) / Narrow(b);
  const Wide rem = Wide(a) - Wide(qn) * Wide(b);  // exact: 200 + 53 bits
  return to_exact(Wide(qn), sign_of(rem) * (b < 0 ? -1 : 1));
}

Exact exact_sqrt(double a) {
  if (a == 0) return {a};
  const double s = std::sqrt(a);
  if (a >= kSafeLow) {
    const double r = std::fma(-s, s, a);  // exact a - s^2
    const double lo = r / (2 * s);          // sqrt(a) - s to about 2^-52 relative
    // Near half an ulp of s (or of the binade below, for s a power of two) that error
    // could fake or hide a tie of a 52-bit format: those take the slow path.
    const double half_ulp = std::ldexp(1.0, std::ilogb(s) - 53);
    const double d = std::min(std::fabs(std::fabs(lo) - half_ulp), std::fabs(std::fabs(lo) - half_ulp / 2));
    if (d > half_ulp * 0x1p-45) return {s, lo};
  }
  const Narrow sn = sqrt(Narrow(a));
  const Wide rem = Wide(a) - Wide(sn) * Wide(sn);
  return to_exact(Wide(sn), sign_of(rem));
}

void Context::push_scope(std::string_view name) {
  if (name.empty()) throw std::logic_error("emu::Context::push_scope: an empty scope name");
  scope_lengths_.push_back(scope_.size());
  if (!scope_.empty()) scope_ += '.';
  scope_ += name;
}

void Context::pop_scope() {
  if (scope_lengths_.empty()) throw std::logic_error("emu::Context::pop_scope without a scope");
  scope_.resize(scope_lengths_.back());
  scope_lengths_.pop_back();
}

void Context::set_element(std::int64_t flat, std::initializer_list<std::int64_t> index) {
  if (index.size() > static_cast<std::size_t>(Element::kMaxRank))
    throw std::logic_error("emu::Context::set_element: more than Element::kMaxRank dimensions");
  Element e;
  e.flat = flat;
  e.rank = static_cast<int>(index.size());
  std::copy(index.begin(), index.end(), e.index.begin());
  set_element(e);
}

void Context::set_element(const Element& element) {
  element_ = element;
  element_serial_ = element.known() ? ++next_serial_ : 0;
}

void Context::count(Flags counted, const char* op, std::initializer_list<double> operands, double result) {
  for (Flag f : kAllFlags) {
    if (!(counted & f)) continue;
    const auto it = count_index_.find(std::make_tuple(std::string_view(scope_), std::string_view(op), f));
    if (it != count_index_.end()) {
      // A scalar operation counts every time; an element once, at its first raise.
      if (element_serial_ == 0 || it->second.last_element != element_serial_) ++counts_[it->second.index].count;
      it->second.last_element = element_serial_;
      continue;
    }
    count_index_.emplace(std::make_tuple(scope_, std::string(op), f), CountSlot{counts_.size(), element_serial_});
    counts_.push_back(OpCount{scope_, op, f, 1, element_, std::vector<double>(operands), result});
  }
}

void Context::absorb(const Context& other) {
  status_ |= other.status_;
  for (const OpCount& c : other.counts_) add_count(c);
}

void Context::add_count(const OpCount& c) {
  status_ |= c.flag;
  const auto it = count_index_.find(std::make_tuple(std::string_view(c.scope), std::string_view(c.op), c.flag));
  if (it != count_index_.end()) {
    counts_[it->second.index].count += c.count;
    it->second.last_element = 0;
    return;
  }
  count_index_.emplace(std::make_tuple(c.scope, c.op, c.flag), CountSlot{counts_.size(), 0});
  counts_.push_back(c);
}

void Context::raise(Flags raised, const char* op, std::initializer_list<double> operands, double result) {
  status_ |= raised;
  if (const Flags counted = raised & control.counted) count(counted, op, operands, result);
  const Flags trapped = raised & control.traps;
  if (!trapped) return;
  for (Flag f : {DIV0, OFLO, INV, UFLO, INEXACT})  // the cause first (see arith.hpp)
    if (trapped & f) throw FpException(TrapReport{f, scope_, op, element_, std::vector<double>(operands), result, status_});
}

double Context::round_with(Rounding mode, const Format& f, const Exact& x, const char* op,
                           std::initializer_list<double> operands, Flags raised) {
  RoundSpec s = spec();
  s.mode = mode;
  const double r = emu::round(f, x, s, &rng_, raised);
  raise(raised, op, operands, r);
  return r;
}

double Context::round(const Format& f, const Exact& x, const char* op,
                      std::initializer_list<double> operands, Flags raised) {
  return round_with(control.effective_rounding(), f, x, op, operands, raised);
}

double Context::exact_zero(const Format& f, double zero, const char* op, std::initializer_list<double> operands) {
  // IEEE formats keep the sign IEEE 754 6.3 gives; formats without -0 or without zero
  // take round()'s rule for a zero (+0; the least value with UFLO and INEXACT).
  if (f.has_negative_zero()) return zero;
  return round(f, Exact{zero}, op, operands);
}

double Context::invalid(const char* op, std::initializer_list<double> operands) {
  raise(INV, op, operands, kNaN);
  return kNaN;
}

namespace {

bool is_exact_zero(const Exact& x) { return x.hi == 0 && x.lo == 0 && !x.beyond_double; }

// IEEE 754 6.3: the sign of an exact zero sum a + b. Zeros of the same sign keep it;
// otherwise +0, except -0 when rounding toward -inf.
double zero_sum(Rounding mode, double a, double b) {
  if (a == 0 && b == 0 && std::signbit(a) == std::signbit(b)) return a;
  return mode == Rounding::rd ? -0.0 : 0.0;
}

}  // namespace

double Context::add(const Format& f, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if (std::isinf(a) && std::isinf(b) && std::signbit(a) != std::signbit(b)) return invalid("add", {a, b});
  if (std::isinf(a) || std::isinf(b)) return round(f, Exact{std::isinf(a) ? a : b}, "add", {a, b});
  const Exact x = exact_add(a, b);
  if (is_exact_zero(x)) return exact_zero(f, zero_sum(control.effective_rounding(), a, b), "add", {a, b});
  return round(f, x, "add", {a, b});
}

double Context::sub(const Format& f, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if (std::isinf(a) && std::isinf(b) && std::signbit(a) == std::signbit(b)) return invalid("sub", {a, b});
  if (std::isinf(a) || std::isinf(b)) return round(f, Exact{std::isinf(a) ? a : -b}, "sub", {a, b});
  const Exact x = exact_add(a, -b);
  if (is_exact_zero(x)) return exact_zero(f, zero_sum(control.effective_rounding(), a, -b), "sub", {a, b});
  return round(f, x, "sub", {a, b});
}

double Context::mul(const Format& f, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if ((std::isinf(a) && b == 0) || (std::isinf(b) && a == 0)) return invalid("mul", {a, b});
  if (std::isinf(a) || std::isinf(b)) return round(f, Exact{a * b}, "mul", {a, b});
  return round(f, exact_mul(a, b), "mul", {a, b});
}

double Context::div(const Format& f, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  if ((a == 0 && b == 0) || (std::isinf(a) && std::isinf(b))) return invalid("div", {a, b});
  // An infinite dividend gives an exact infinity (also for a zero divisor): IEEE 754
  // 7.3 raises divideByZero only for an infinite result from finite operands.
  if (std::isinf(a) || std::isinf(b)) return round(f, Exact{a / b}, "div", {a, b});
  if (b == 0) return round(f, Exact{a / b}, "div", {a, b}, DIV0);  // +-inf (NaN in formats without inf)
  return round(f, exact_div(a, b), "div", {a, b});
}

double Context::fma(const Format& f, double a, double b, double c) {
  if (std::isnan(a) || std::isnan(b) || std::isnan(c)) return kNaN;
  if ((std::isinf(a) && b == 0) || (std::isinf(b) && a == 0)) return invalid("fma", {a, b, c});
  if (std::isinf(a) || std::isinf(b)) {
    const double p = a * b;  // +-inf
    if (std::isinf(c) && std::signbit(c) != std::signbit(p)) return invalid("fma", {a, b, c});
    return round(f, Exact{p}, "fma", {a, b, c});
  }
  if (std::isinf(c)) return round(f, Exact{c}, "fma", {a, b, c});
  const Exact x = exact_fma(a, b, c);
  if (is_exact_zero(x)) {
    const double product = (a == 0 || b == 0) ? std::copysign(0.0, a) * std::copysign(1.0, b) : 1.0;
    return exact_zero(f, zero_sum(control.effective_rounding(), product, c), "fma", {a, b, c});
  }
  return round(f, x, "fma", {a, b, c});
}

double Context::sqrt(const Format& f, double a) {
  if (std::isnan(a)) return kNaN;
  if (a < 0) return invalid("sqrt", {a});
  if (std::isinf(a) || a == 0) return round(f, Exact{a}, "sqrt", {a});
  return round(f, exact_sqrt(a), "sqrt", {a});
}

double Context::convert(const Format& f, double a) { return round(f, Exact{a}, "convert", {a}); }

std::partial_ordering Context::compare(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::partial_ordering::unordered;
  return a <=> b;
}

bool Context::less(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) {
    raise(INV, "less", {a, b}, kNaN);
    return false;
  }
  return a < b;
}

}  // namespace emu
