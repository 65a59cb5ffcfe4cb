#include "format.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace emu {

namespace {

std::string generic_name(int e, int m) {
  std::string name = "e";
  name += std::to_string(e);
  name += 'm';
  name += std::to_string(m);
  return name;
}

}  // namespace

Format::Format(int exponent_bits, int fraction_bits, Encoding encoding, bool subnormals,
               std::string name)
    : exponent_bits_(exponent_bits),
      fraction_bits_(fraction_bits),
      bias_(0),
      encoding_(encoding),
      subnormals_(subnormals),
      name_(std::move(name)) {
  if (exponent_bits < 2 || exponent_bits > 11)
    throw std::invalid_argument("exponent bits must be 2..11, got " + std::to_string(exponent_bits));
  if (fraction_bits < 1 || fraction_bits > 52)
    throw std::invalid_argument("fraction bits must be 1..52, got " + std::to_string(fraction_bits));
  if (name_.empty()) name_ = generic_name(exponent_bits, fraction_bits);

  bias_ = (1 << (exponent_bits - 1)) - 1;
  const int top_field = (1 << exponent_bits) - 1;
  emin_ = 1 - bias_;
  emax_ = (encoding == Encoding::ieee ? top_field - 1 : top_field) - bias_;
  if (emax_ > 1023)
    throw std::invalid_argument(name_ + ": the largest binade does not fit in a double");

  const int p = fraction_bits;
  // ieee: 1.11..1 * 2^emax; ocp_fn: 1.11..10 * 2^emax (1.11..1 in the top binade is NaN).
  const double top_significand = encoding == Encoding::ieee ? 2.0 - std::ldexp(1.0, -p)
                                                            : 2.0 - std::ldexp(1.0, 1 - p);
  max_finite_ = std::ldexp(top_significand, emax_);
  min_normal_ = std::ldexp(1.0, emin_);
  min_subnormal_ = std::ldexp(1.0, emin_ - p);
  unit_roundoff_ = std::ldexp(1.0, -(p + 1));

  fraction_mask_ = (std::uint64_t{1} << p) - 1;
  exponent_mask_ = static_cast<std::uint64_t>(top_field) << p;
  sign_mask_ = std::uint64_t{1} << (p + exponent_bits);
  quiet_nan_ = encoding == Encoding::ieee ? exponent_mask_ | (std::uint64_t{1} << (p - 1))
                                          : exponent_mask_ | fraction_mask_;
}

Format Format::with_subnormals(bool on) const {
  Format f = *this;
  f.subnormals_ = on;
  return f;
}

std::uint64_t Format::finite_encodings() const {
  const std::uint64_t per_sign_fields = std::uint64_t{1} << (exponent_bits_ + fraction_bits_);
  const std::uint64_t non_finite_per_sign =
      encoding_ == Encoding::ieee ? (std::uint64_t{1} << fraction_bits_) : 1;
  return 2 * (per_sign_fields - non_finite_per_sign);
}

std::uint64_t Format::finite_values() const {
  std::uint64_t n = finite_encodings() - 1;  // -0 == +0
  if (!subnormals_) n -= 2 * fraction_mask_;  // subnormal patterns decode to zero
  return n;
}

double Format::decode(std::uint64_t bits) const {
  const bool negative = bits & sign_mask_;
  const std::uint64_t field = (bits & exponent_mask_) >> fraction_bits_;
  const std::uint64_t fraction = bits & fraction_mask_;
  const std::uint64_t top_field = exponent_mask_ >> fraction_bits_;
  double magnitude;
  if (encoding_ == Encoding::ieee && field == top_field) {
    magnitude = fraction == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (encoding_ == Encoding::ocp_fn && field == top_field && fraction == fraction_mask_) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (field == 0) {
    magnitude = subnormals_ ? std::ldexp(static_cast<double>(fraction), emin_ - fraction_bits_) : 0.0;
  } else {
    // Normal: place the fields straight into a double (exact: every format fits).
    const auto double_field = static_cast<std::uint64_t>(static_cast<int>(field) - bias_ + 1023);
    magnitude = std::bit_cast<double>((double_field << 52) | (fraction << (52 - fraction_bits_)));
  }
  return negative ? -magnitude : magnitude;
}

bool Format::representable(double value) const {
  if (!std::isfinite(value)) return std::isnan(value) || has_infinity();
  const double a = std::fabs(value);
  if (a == 0.0) return true;
  // Fast path on the double's fields (as in encode): a normal double within this
  // format's normal range is one of its values iff no bits lie below its last fraction bit.
  const auto bits = std::bit_cast<std::uint64_t>(a);
  const int exponent = static_cast<int>(bits >> 52) - 1023;
  if (exponent >= emin_ && a <= max_finite_)
    return (bits & ((std::uint64_t{1} << (52 - fraction_bits_)) - 1)) == 0;
  if (a > max_finite_) return false;
  if (a < min_normal_ && !subnormals_) return false;
  const int e = std::max(std::ilogb(a), emin_);
  const double scaled = std::ldexp(a, fraction_bits_ - e);  // exact: power-of-two scaling
  return scaled == std::floor(scaled);
}

std::uint64_t Format::encode(double value) const {
  const std::uint64_t sign = std::signbit(value) ? sign_mask_ : 0;
  if (std::isnan(value)) return sign | quiet_nan_;
  if (std::isinf(value)) return sign | (has_infinity() ? exponent_mask_ : quiet_nan_);
  const double a = std::fabs(value);
  if (a == 0.0) return sign;
  // Fast path on the double's fields: a normal double whose value is a normal of this
  // format with no bits below its last fraction bit.
  const auto bits = std::bit_cast<std::uint64_t>(a);
  const int double_field = static_cast<int>(bits >> 52);
  const std::uint64_t low_bits = (std::uint64_t{1} << (52 - fraction_bits_)) - 1;
  if (double_field != 0 && double_field - 1023 >= emin_ && (bits & low_bits) == 0 && a <= max_finite_) {
    const auto field = static_cast<std::uint64_t>(double_field - 1023 + bias_);
    return sign | (field << fraction_bits_) | ((bits >> (52 - fraction_bits_)) & fraction_mask_);
  }
  if (!representable(value))
    throw std::invalid_argument(name_ + ": value is not representable; round it first");
  const int e = std::ilogb(a);
  if (e < emin_) {
    const auto fraction = static_cast<std::uint64_t>(std::ldexp(a, fraction_bits_ - emin_));
    return sign | fraction;
  }
  const auto significand = static_cast<std::uint64_t>(std::ldexp(a, fraction_bits_ - e));
  const auto field = static_cast<std::uint64_t>(e + bias_);
  return sign | (field << fraction_bits_) | (significand & fraction_mask_);
}

namespace {

const char* const kNames[] = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8-e5m2", "fp8-e4m3", nullptr};

bool parse_generic(std::string_view s, int& e, int& m) {
  // eXmY with X and Y decimal, no sign, no leading junk (leading zeros are refused by
  // the caller, with the canonical spelling).
  if (s.size() < 4 || s[0] != 'e') return false;
  const auto mpos = s.find('m');
  if (mpos == std::string_view::npos || mpos < 2 || mpos + 1 >= s.size()) return false;
  auto parse = [](std::string_view d, int& out) {
    if (d.empty() || d.size() > 3) return false;
    out = 0;
    for (char c : d) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  return parse(s.substr(1, mpos - 1), e) && parse(s.substr(mpos + 1), m);
}

}  // namespace

const char* const* format_names() { return kNames; }

const Format& fp64() { static const Format f(11, 52, Encoding::ieee, true, "fp64"); return f; }
const Format& fp32() { static const Format f(8, 23, Encoding::ieee, true, "fp32"); return f; }
const Format& tf32() { static const Format f(8, 10, Encoding::ieee, true, "tf32"); return f; }
const Format& bf16() { static const Format f(8, 7, Encoding::ieee, true, "bf16"); return f; }
const Format& fp16() { static const Format f(5, 10, Encoding::ieee, true, "fp16"); return f; }
const Format& fp8_e5m2() { static const Format f(5, 2, Encoding::ieee, true, "fp8-e5m2"); return f; }
const Format& fp8_e4m3() { static const Format f(4, 3, Encoding::ocp_fn, true, "fp8-e4m3"); return f; }

Format format_by_name(std::string_view name) {
  if (name == "fp64") return fp64();
  if (name == "fp32") return fp32();
  if (name == "tf32") return tf32();
  if (name == "bf16") return bf16();
  if (name == "fp16") return fp16();
  if (name == "fp8-e5m2") return fp8_e5m2();
  if (name == "fp8-e4m3") return fp8_e4m3();
  int e = 0, m = 0;
  if (parse_generic(name, e, m)) {
    // One spelling per format: sweep stores names as spelled, so e05m2 beside e5m2
    // would split one format into two parameter values.
    std::string canonical(1, 'e');  // appended piecewise: GCC 12's -Wrestrict misfires on "e" + ...
    canonical += std::to_string(e);
    canonical += 'm';
    canonical += std::to_string(m);
    // Range first: the spelling hint names only a format that exists.
    Format format = [&] {
      try {
        return Format(e, m, Encoding::ieee, true, canonical);
      } catch (const std::invalid_argument& err) {
        throw std::invalid_argument("format '" + std::string(name) + "': " + err.what());
      }
    }();
    if (name != canonical)
      throw std::invalid_argument("format '" + std::string(name) + "': write it " + canonical +
                                  " (no leading zeros)");
    return format;
  }
  throw std::invalid_argument("unknown format '" + std::string(name) +
                              "' (known: fp64 fp32 tf32 bf16 fp16 fp8-e5m2 fp8-e4m3, or eXmY "
                              "with X = 2..11 exponent bits and Y = 1..52 fraction bits)");
}

}  // namespace emu
