#include "format.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace emu {

namespace {

std::string generic_name(int e, int m) {
  std::string name = "e";
  name += std::to_string(e);
  name += 'm';
  name += std::to_string(m);
  return name;
}

FormatSpec family_spec(int exponent_bits, int fraction_bits, Encoding encoding, bool subnormals, std::string name) {
  FormatSpec s;
  s.exponent_bits = exponent_bits;
  s.fraction_bits = fraction_bits;
  s.infinities = encoding == Encoding::ieee;
  s.nan = encoding == Encoding::ieee ? NanEncoding::ieee : NanEncoding::top;
  s.subnormals = subnormals;
  s.name = std::move(name);
  return s;
}

int default_bias(int exponent_bits) { return (1 << (exponent_bits - 1)) - 1; }

}  // namespace

const char* nan_encoding_name(NanEncoding n) {
  switch (n) {
    case NanEncoding::ieee: return "ieee";
    case NanEncoding::top: return "top";
    case NanEncoding::negative_zero: return "negative-zero";
    case NanEncoding::none: return "none";
  }
  return "?";
}

Format::Format(int exponent_bits, int fraction_bits, Encoding encoding, bool subnormals, std::string name)
    : Format(family_spec(exponent_bits, fraction_bits, encoding, subnormals, std::move(name))) {}

Format::Format(const FormatSpec& spec)
    : exponent_bits_(spec.exponent_bits),
      fraction_bits_(spec.fraction_bits),
      bias_(0),
      infinities_(spec.infinities),
      nan_(spec.nan),
      signed_(spec.is_signed),
      zero_(spec.zero),
      subnormals_(spec.subnormals && spec.zero),
      name_(spec.name) {
  const int w = exponent_bits_, m = fraction_bits_;
  if (name_.empty()) name_ = generic_name(w, m);
  const bool ieee = nan_ == NanEncoding::ieee;
  if (w < (ieee ? 2 : 1) || w > 11)
    throw std::invalid_argument("'" + name_ + "': exponent bits must be " + (ieee ? "2" : "1") + "..11, got " +
                                std::to_string(w));
  if (m < (ieee ? 1 : 0) || m > 52)
    throw std::invalid_argument("'" + name_ + "': fraction bits must be " + (ieee ? "1" : "0") + "..52, got " +
                                std::to_string(m));
  if (ieee && !(infinities_ && signed_ && zero_))
    throw std::invalid_argument("'" + name_ + "': IEEE NaNs come with infinities, a sign and a zero");
  if (infinities_ && nan_ == NanEncoding::none)
    throw std::invalid_argument("'" + name_ + "': a format with infinities needs a NaN (inf - inf)");
  if (!signed_ && nan_ == NanEncoding::negative_zero)
    throw std::invalid_argument("'" + name_ + "': an unsigned format has no negative-zero pattern for its NaN");

  bias_ = spec.bias.value_or(default_bias(w));
  const std::uint64_t top_field = (std::uint64_t{1} << w) - 1;
  fraction_mask_ = (std::uint64_t{1} << m) - 1;
  exponent_mask_ = top_field << m;
  sign_mask_ = signed_ ? std::uint64_t{1} << (w + m) : 0;
  const std::uint64_t all_magnitude = exponent_mask_ | fraction_mask_;
  // The largest finite pattern: below the top binade (IEEE), or below the patterns
  // that the NaN (`top`) and the infinity take from the top of the code space.
  max_magnitude_code_ = ieee ? ((top_field - 1) << m) | fraction_mask_
                             : all_magnitude - (nan_ == NanEncoding::top ? 1 : 0) - (infinities_ ? 1 : 0);
  const auto max_field = static_cast<int>(max_magnitude_code_ >> m);
  if (max_field < (zero_ ? 1 : 0))
    throw std::invalid_argument("'" + name_ + "': the special patterns leave no normal binade");
  emin_ = zero_ ? 1 - bias_ : -bias_;
  emax_ = max_field - bias_;
  if (emax_ > 1023) throw std::invalid_argument("'" + name_ + "': the largest binade does not fit in a double");
  if (emin_ < -1022 || emin_ - m < -1074)
    throw std::invalid_argument("'" + name_ + "': the least values lie below double's range");

  const auto max_significand = static_cast<double>((std::uint64_t{1} << m) | (max_magnitude_code_ & fraction_mask_));
  max_finite_ = std::ldexp(max_significand, emax_ - m);  // exact: m + 1 <= 53 bits
  min_normal_ = std::ldexp(1.0, emin_);
  min_subnormal_ = zero_ ? std::ldexp(1.0, emin_ - m) : min_normal_;
  unit_roundoff_ = std::ldexp(1.0, -(m + 1));
}

Format Format::with_subnormals(bool on) const {
  if (on && !zero_) throw std::invalid_argument(name_ + " has no zero and no subnormals (its least binade is 2^-bias)");
  Format f = *this;
  f.subnormals_ = on;
  return f;
}

bool Format::ieee_like() const {
  return nan_ == NanEncoding::ieee && bias_ == default_bias(exponent_bits_);  // IEEE NaNs imply inf, sign, zero
}

std::uint64_t Format::quiet_nan_bits() const {
  switch (nan_) {
    case NanEncoding::ieee: return exponent_mask_ | (std::uint64_t{1} << (fraction_bits_ - 1));
    case NanEncoding::top: return exponent_mask_ | fraction_mask_;
    case NanEncoding::negative_zero: return sign_mask_;
    case NanEncoding::none: break;
  }
  throw std::logic_error(name_ + " has no NaN");
}

std::uint64_t Format::infinity_bits() const {
  if (!infinities_) throw std::logic_error(name_ + " has no infinity");
  return nan_ == NanEncoding::ieee ? exponent_mask_ : max_magnitude_code_ + 1;
}

std::uint64_t Format::finite_encodings() const {
  const std::uint64_t per_sign = std::uint64_t{1} << (exponent_bits_ + fraction_bits_);
  const std::uint64_t signs = signed_ ? 2 : 1;
  std::uint64_t nans = 0;
  switch (nan_) {
    case NanEncoding::ieee: nans = 2 * fraction_mask_; break;
    case NanEncoding::top: nans = signs; break;
    case NanEncoding::negative_zero: nans = 1; break;
    case NanEncoding::none: break;
  }
  const std::uint64_t infinities = infinities_ ? signs : 0;
  return signs * per_sign - nans - infinities;
}

std::uint64_t Format::finite_values() const {
  std::uint64_t n = finite_encodings();
  if (has_negative_zero()) n -= 1;                                     // -0 == +0
  if (zero_ && !subnormals_) n -= (signed_ ? 2 : 1) * fraction_mask_;  // subnormal patterns decode to zero
  return n;
}

double Format::decode(std::uint64_t bits) const {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const bool negative = (bits & sign_mask_) != 0;
  const std::uint64_t magnitude_code = bits & (exponent_mask_ | fraction_mask_);
  const std::uint64_t field = magnitude_code >> fraction_bits_;
  const std::uint64_t fraction = bits & fraction_mask_;
  double magnitude;
  if (nan_ == NanEncoding::negative_zero && negative && magnitude_code == 0) {
    return kNaN;  // the one NaN
  } else if (nan_ == NanEncoding::ieee && field == exponent_mask_ >> fraction_bits_) {
    magnitude = fraction == 0 ? kInf : kNaN;
  } else if (nan_ == NanEncoding::top && magnitude_code == (exponent_mask_ | fraction_mask_)) {
    magnitude = kNaN;
  } else if (infinities_ && nan_ != NanEncoding::ieee && magnitude_code == max_magnitude_code_ + 1) {
    magnitude = kInf;
  } else if (field == 0 && zero_) {
    if (!subnormals_ || fraction == 0) return negative && has_negative_zero() ? -0.0 : 0.0;
    magnitude = std::ldexp(static_cast<double>(fraction), emin_ - fraction_bits_);
  } else {
    // Normal: place the fields straight into a double (exact: every format fits, and
    // its normals are normal doubles).
    const auto double_field = static_cast<std::uint64_t>(static_cast<int>(field) - bias_ + 1023);
    magnitude = std::bit_cast<double>((double_field << 52) | (fraction << (52 - fraction_bits_)));
  }
  return negative ? -magnitude : magnitude;
}

bool Format::representable(double value) const {
  if (std::isnan(value)) return has_nan();
  if (std::isinf(value)) return infinities_ && (signed_ || value > 0);
  const double a = std::fabs(value);
  if (a == 0.0) return zero_;
  if (value < 0 && !signed_) return false;
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
  const bool negative = std::signbit(value);
  const std::uint64_t sign = negative ? sign_mask_ : 0;
  auto refuse = [&](const char* why) -> std::uint64_t {
    throw std::invalid_argument("'" + name_ + "': " + why);
  };
  if (std::isnan(value) || (std::isinf(value) && !infinities_)) {
    // No inf: inf is encoded as NaN (of its sign where the format has one per sign).
    if (!has_nan()) return refuse(std::isnan(value) ? "has no NaN" : "has neither inf nor NaN");
    return nan_ == NanEncoding::negative_zero ? sign_mask_ : sign | quiet_nan_bits();
  }
  if (negative && !signed_ && value != 0) return refuse("unsigned: negative values are not representable");
  if (std::isinf(value)) return sign | infinity_bits();
  const double a = std::fabs(value);
  if (a == 0.0) {
    if (!zero_) return refuse("has no zero");
    return has_negative_zero() ? sign : 0;
  }
  // Fast path on the double's fields: a normal double whose value is a normal of this
  // format with no bits below its last fraction bit.
  const auto bits = std::bit_cast<std::uint64_t>(a);
  const int double_field = static_cast<int>(bits >> 52);
  const std::uint64_t low_bits = (std::uint64_t{1} << (52 - fraction_bits_)) - 1;
  if (double_field != 0 && double_field - 1023 >= emin_ && (bits & low_bits) == 0 && a <= max_finite_) {
    const auto field = static_cast<std::uint64_t>(double_field - 1023 + bias_);
    return sign | (field << fraction_bits_) | ((bits >> (52 - fraction_bits_)) & fraction_mask_);
  }
  if (!representable(value)) return refuse("value is not representable; round it first");
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

const char* const kFamilies =
    "eXmY (IEEE-like, X = 2..11 exponent bits, Y = 1..52 fraction bits) or binaryKpPSD (IEEE P3109: K bits, "
    "precision P, S = s signed or u unsigned, D = e with inf or f finite, e.g. binary8p3se)";

// A decimal number without sign or leading zeros (as written: `canonical` says whether
// it had none), at most 3 digits.
bool parse_digits(std::string_view d, int& out, bool& canonical) {
  if (d.empty() || d.size() > 3) return false;
  out = 0;
  for (char c : d) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  canonical = d.size() == 1 || d[0] != '0';
  return true;
}

bool parse_generic(std::string_view s, int& e, int& m) {
  // eXmY with X and Y decimal, no sign, no leading junk (leading zeros are refused by
  // the caller, with the canonical spelling).
  if (s.size() < 4 || s[0] != 'e') return false;
  const auto mpos = s.find('m');
  if (mpos == std::string_view::npos || mpos < 2 || mpos + 1 >= s.size()) return false;
  bool ce = true, cm = true;
  return parse_digits(s.substr(1, mpos - 1), e, ce) && parse_digits(s.substr(mpos + 1), m, cm);
}

Format make_preset(int e, int m, int bias, bool infinities, NanEncoding nan, bool is_signed, bool zero,
                   const char* name) {
  FormatSpec s;
  s.exponent_bits = e;
  s.fraction_bits = m;
  s.bias = bias;
  s.infinities = infinities;
  s.nan = nan;
  s.is_signed = is_signed;
  s.zero = zero;
  s.name = name;
  return Format(s);
}

// binaryKpP followed by s|u and e|f (P3109 interim report v4.0, 4.2 and 4.7.2).
// Returns nullopt when `name` does not start like one; throws for a malformed one.
std::optional<Format> parse_p3109(std::string_view name) {
  constexpr std::string_view kPrefix = "binary";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string spelled(name);
  const std::string_view rest = name.substr(kPrefix.size());
  const auto ppos = rest.find('p');
  int k = 0, p = 0;
  bool ck = true, cp = true;
  std::size_t end = ppos == std::string_view::npos ? 0 : ppos + 1;
  while (end < rest.size() && rest[end] >= '0' && rest[end] <= '9') ++end;
  if (ppos == std::string_view::npos || !parse_digits(rest.substr(0, ppos), k, ck) ||
      !parse_digits(rest.substr(ppos + 1, end - ppos - 1), p, cp))
    throw std::invalid_argument("format '" + spelled + "': a P3109 name is binaryKpPSD, e.g. binary8p3se");
  const std::string_view suffix = rest.substr(end);
  const std::string base = "binary" + std::to_string(k) + "p" + std::to_string(p);
  if (suffix.empty())
    throw std::invalid_argument("format '" + spelled + "': say signedness and domain as the P3109 interim report " +
                                "(v4.0) names its formats: " + base + "se (signed, with +-inf: what the first " +
                                "report called " + base + "), " + base + "sf (signed, finite), " + base + "ue or " +
                                base + "uf (unsigned)");
  if (suffix.size() != 2 || (suffix[0] != 's' && suffix[0] != 'u') || (suffix[1] != 'e' && suffix[1] != 'f'))
    throw std::invalid_argument("format '" + spelled + "': the suffix is s or u (signed, unsigned) then e or f " +
                                "(extended: +-inf; finite), e.g. " + base + "se");
  if (!ck || !cp)
    throw std::invalid_argument("format '" + spelled + "': write it " + base + std::string(suffix) +
                                " (no leading zeros)");
  const bool is_signed = suffix[0] == 's';
  if (k < 3 || p < 1 || (is_signed ? p >= k : p > k))
    throw std::invalid_argument("format '" + spelled + "': P3109 needs K >= 3 and 1 <= P " + (is_signed ? "< K" : "<= K") +
                                " (" + (is_signed ? "signed" : "unsigned") + ")");
  // Signed: 1 sign bit, K - P exponent bits, bias 2^(K-P-1); unsigned: K - P + 1
  // exponent bits, bias 2^(K-P). Both: bias 2^(exponent bits - 1).
  const int w = is_signed ? k - p : k - p + 1;
  try {
    return make_preset(w, p - 1, 1 << (w - 1), suffix[1] == 'e',
                       is_signed ? NanEncoding::negative_zero : NanEncoding::top, is_signed, true, spelled.c_str());
  } catch (const std::invalid_argument& err) {
    throw std::invalid_argument(std::string("format ") + err.what());
  }
}

}  // namespace

const char* const* format_names() {
  static const std::vector<const char*> names = name_array(format_table());
  return names.data();
}

std::string format_list_text() { return name_list(format_table()) + ", or " + kFamilies; }

const Format& fp64() { static const Format f(11, 52, Encoding::ieee, true, "fp64"); return f; }
const Format& fp32() { static const Format f(8, 23, Encoding::ieee, true, "fp32"); return f; }
const Format& tf32() { static const Format f(8, 10, Encoding::ieee, true, "tf32"); return f; }
const Format& bf16() { static const Format f(8, 7, Encoding::ieee, true, "bf16"); return f; }
const Format& fp16() { static const Format f(5, 10, Encoding::ieee, true, "fp16"); return f; }
const Format& fp8_e5m2() { static const Format f(5, 2, Encoding::ieee, true, "fp8-e5m2"); return f; }
const Format& fp8_e4m3() { static const Format f(4, 3, Encoding::ocp_fn, true, "fp8-e4m3"); return f; }
const Format& fp8_e4m3fnuz() {
  // 0b0'1111'111 = 1.875 * 2^(15 - 8) = 240
  static const Format f = make_preset(4, 3, 8, false, NanEncoding::negative_zero, true, true, "fp8-e4m3fnuz");
  return f;
}
const Format& fp8_e5m2fnuz() {
  // 0b0'11111'11 = 1.75 * 2^(31 - 16) = 57344
  static const Format f = make_preset(5, 2, 16, false, NanEncoding::negative_zero, true, true, "fp8-e5m2fnuz");
  return f;
}
const Format& fp6_e2m3() {
  static const Format f = make_preset(2, 3, 1, false, NanEncoding::none, true, true, "fp6-e2m3");  // 0b0'11'111 = 7.5
  return f;
}
const Format& fp6_e3m2() {
  static const Format f = make_preset(3, 2, 3, false, NanEncoding::none, true, true, "fp6-e3m2");  // 0b0'111'11 = 28
  return f;
}
const Format& fp4_e2m1() {
  static const Format f = make_preset(2, 1, 1, false, NanEncoding::none, true, true, "fp4-e2m1");  // 0b0'11'1 = 6
  return f;
}
const Format& e8m0() {
  // 0x00 = 2^-127, 0xfe = 2^127, 0xff = NaN
  static const Format f = make_preset(8, 0, 127, false, NanEncoding::top, false, false, "e8m0");
  return f;
}
const Format& ue4m3() {
  // 0b1111'110 = 1.75 * 2^8 = 448, 0b1111'111 = NaN
  static const Format f = make_preset(4, 3, 7, false, NanEncoding::top, false, true, "ue4m3");
  return f;
}

NameTable<const Format& (*)()> format_table() {
  static constexpr Named<const Format& (*)()> kPresets[] = {
      {fp64, "fp64", "IEEE 754 binary64"},
      {fp32, "fp32", "IEEE 754 binary32"},
      {tf32, "tf32", "NVIDIA TensorFloat-32: fp32's range, fp16's precision"},
      {bf16, "bf16", "bfloat16: fp32's range, 8 bits of precision"},
      {fp16, "fp16", "IEEE 754 binary16"},
      {fp8_e5m2, "fp8-e5m2", "OCP fp8 E5M2 (IEEE-like, with inf)"},
      {fp8_e4m3, "fp8-e4m3", "OCP fp8 E4M3 (fn: no inf, NaN S.1111.111, max 448)"},
      {fp8_e4m3fnuz, "fp8-e4m3fnuz", "fp8 E4M3 fnuz (AMD, Graphcore): no inf, one NaN at 0x80, max 240"},
      {fp8_e5m2fnuz, "fp8-e5m2fnuz", "fp8 E5M2 fnuz (AMD, Graphcore): no inf, one NaN at 0x80, max 57344"},
      {fp6_e2m3, "fp6-e2m3", "OCP MX fp6 E2M3: finite, max 7.5"},
      {fp6_e3m2, "fp6-e3m2", "OCP MX fp6 E3M2: finite, max 28"},
      {fp4_e2m1, "fp4-e2m1", "OCP MX fp4 E2M1: finite, max 6"},
      {e8m0, "e8m0", "OCP MX scale: unsigned powers of two 2^-127 .. 2^127, NaN 0xff"},
      {ue4m3, "ue4m3", "NVFP4's block scale: unsigned E4M3, max 448"},
  };
  return kPresets;
}

Format format_by_name(std::string_view name) {
  if (const auto* preset = find_name(format_table(), name)) return preset->value();
  if (auto p3109 = parse_p3109(name)) return *p3109;
  int e = 0, m = 0;
  if (parse_generic(name, e, m)) {
    // One spelling per format: sweep stores names as spelled, so e05m2 beside e5m2
    // would split one format into two parameter values.
    const std::string canonical = generic_name(e, m);
    // Range first: the spelling hint names only a format that exists.
    Format format = [&] {
      try {
        return Format(e, m, Encoding::ieee, true, canonical);
      } catch (const std::invalid_argument& err) {
        throw std::invalid_argument(std::string("format ") + err.what());
      }
    }();
    if (name != canonical)
      throw std::invalid_argument("format '" + std::string(name) + "': write it " + canonical +
                                  " (no leading zeros)");
    return format;
  }
  throw std::invalid_argument("unknown format '" + std::string(name) + "' (known: " + format_list_text() + ")");
}

}  // namespace emu
