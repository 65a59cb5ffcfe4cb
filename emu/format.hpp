// Floating-point formats: one immutable descriptor per format, with every limit and
// mask derived once from independent fields (exponent bits, fraction bits, bias,
// encoding family, subnormals).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace emu {

// How the top exponent field is used.
//  ieee:   all-ones exponent = inf (fraction 0) or NaN (fraction != 0).
//  ocp_fn: OCP 8-bit "fn" (finite + NaN) family, e.g. fp8-e4m3: no infinities; the
//          all-ones exponent is an ordinary binade except S.1..1.1..1, the one NaN
//          pattern per sign. fp8-e4m3 max = 1.75 * 2^8 = 448.
enum class Encoding { ieee, ocp_fn };

class Format {
 public:
  // Throws std::invalid_argument when the fields do not describe a format that fits in
  // a double: exponent 2..11 bits, fraction 1..52 bits, bias such that the range lies
  // inside double's.
  Format(int exponent_bits, int fraction_bits, Encoding encoding = Encoding::ieee,
         bool subnormals = true, std::string name = {});

  // The same format with subnormals switched on or off (name gets no suffix: the
  // subnormals() flag says it).
  [[nodiscard]] Format with_subnormals(bool on) const;

  const std::string& name() const { return name_; }
  int exponent_bits() const { return exponent_bits_; }
  int fraction_bits() const { return fraction_bits_; }  // p - 1 in Higham's notation
  int precision() const { return fraction_bits_ + 1; }  // significand bits incl. hidden
  int bias() const { return bias_; }
  Encoding encoding() const { return encoding_; }
  bool subnormals() const { return subnormals_; }
  bool has_infinity() const { return encoding_ == Encoding::ieee; }
  int width() const { return 1 + exponent_bits_ + fraction_bits_; }

  int emin() const { return emin_; }  // exponent of min_normal
  int emax() const { return emax_; }  // exponent of max_finite
  double max_finite() const { return max_finite_; }
  double min_normal() const { return min_normal_; }
  // Smallest positive value: the least subnormal, or min_normal with subnormals off.
  double min_positive() const { return subnormals_ ? min_subnormal_ : min_normal_; }
  double min_subnormal() const { return min_subnormal_; }  // of the encoding
  double unit_roundoff() const { return unit_roundoff_; }  // 2^-precision
  double epsilon() const { return 2.0 * unit_roundoff_; }

  // Counting bit patterns that decode to finite numbers (+0 and -0 both count), and
  // distinct finite values (+0 == -0). With subnormals off, subnormal patterns decode
  // to zero and so count as patterns but not as extra values.
  std::uint64_t finite_encodings() const;
  std::uint64_t finite_values() const;

  std::uint64_t sign_mask() const { return sign_mask_; }
  std::uint64_t exponent_mask() const { return exponent_mask_; }
  std::uint64_t fraction_mask() const { return fraction_mask_; }
  std::uint64_t all_mask() const { return sign_mask_ | exponent_mask_ | fraction_mask_; }
  std::uint64_t quiet_nan_bits() const { return quiet_nan_; }  // canonical positive NaN

  // Bits -> value. Every pattern decodes; NaNs decode to a quiet double NaN with the
  // pattern's sign; with subnormals off, subnormal patterns decode to signed zero.
  double decode(std::uint64_t bits) const;
  // Value -> bits. The value must be representable (NaN -> canonical NaN, keeping its
  // sign; +-inf -> inf pattern, or NaN in formats without inf). Throws
  // std::invalid_argument for a finite value that is not in the format: round first.
  std::uint64_t encode(double value) const;
  bool representable(double value) const;

  friend bool operator==(const Format& a, const Format& b) {
    return a.exponent_bits_ == b.exponent_bits_ && a.fraction_bits_ == b.fraction_bits_ &&
           a.bias_ == b.bias_ && a.encoding_ == b.encoding_ && a.subnormals_ == b.subnormals_;
  }

 private:
  int exponent_bits_, fraction_bits_, bias_;
  Encoding encoding_;
  bool subnormals_;
  std::string name_;
  int emin_, emax_;
  double max_finite_, min_normal_, min_subnormal_, unit_roundoff_;
  std::uint64_t sign_mask_, exponent_mask_, fraction_mask_, quiet_nan_;
};

// Presets by name: fp64 fp32 tf32 bf16 fp16 fp8-e5m2 fp8-e4m3, and the generic
// IEEE-like eXmY (X exponent bits 2..11, Y fraction bits 1..52), e.g. e5m10 == fp16's
// layout, X and Y written without leading zeros (e05m2 is refused with a hint to write
// e5m2: one spelling per format). Throws std::invalid_argument naming the known formats.
Format format_by_name(std::string_view name);
// The preset names, for help texts and did-you-mean.
const char* const* format_names();  // nullptr-terminated

const Format& fp64();
const Format& fp32();
const Format& tf32();
const Format& bf16();
const Format& fp16();
const Format& fp8_e5m2();
const Format& fp8_e4m3();

}  // namespace emu
