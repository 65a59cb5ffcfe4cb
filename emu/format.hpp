// Floating-point formats: one immutable descriptor per format, with every limit and
// mask derived once from independent fields: exponent bits, fraction bits, bias,
// infinities yes/no, NaN encoding, signed or unsigned, zero yes/no, subnormals on/off.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "names.hpp"

namespace emu {

// Where a format keeps its NaNs (bit patterns with the sign bit first, then exponent,
// then fraction; unsigned formats have no sign bit).
//  ieee:          IEEE 754 3.4: exponent all ones and fraction non-zero, both signs
//                 (the whole top binade is inf and NaN). The canonical quiet NaN has the
//                 top fraction bit set (fp16 0x7e00).
//  top:           the largest magnitude pattern only: S.1..1.1..1, one per sign in a
//                 signed format (OCP fp8-e4m3: 0x7f and 0xff), all ones in an unsigned
//                 one (OCP e8m0 0xff, ue4m3 0x7f, P3109 unsigned formats).
//  negative_zero: the one pattern 1.0..0.0..0, where IEEE has -0: the format has one
//                 NaN and no negative zero (fnuz formats: 0x80; P3109 signed formats).
//  none:          no NaN at all (OCP fp6 and fp4: every pattern is a finite number).
enum class NanEncoding { ieee, top, negative_zero, none };
const char* nan_encoding_name(NanEncoding n);  // "ieee", "top", "negative-zero", "none"

// The defining fields. A format without NaN encoding `ieee` keeps its infinities (if
// any) in the largest magnitude pattern(s) that are not NaN: S.1..1.1..1 (P3109 signed
// extended: 0x7f, 0xff), or all ones minus one when all ones is the NaN (P3109
// unsigned extended: 0xfe, +inf only).
struct FormatSpec {
  int exponent_bits = 0;  // 1..11
  int fraction_bits = 0;  // 0..52 (trailing significand bits, p - 1)
  // Unset: IEEE 754's 2^(exponent_bits - 1) - 1. fnuz and P3109 formats use one more.
  std::optional<int> bias;
  bool infinities = true;
  NanEncoding nan = NanEncoding::ieee;
  bool is_signed = true;
  // false: the exponent field 0 is an ordinary binade (2^-bias), so the format has no
  // zero and no subnormals (OCP e8m0, the MX scale: 2^-127 .. 2^127).
  bool zero = true;
  bool subnormals = true;
  std::string name;  // "" = the generic eXmY name
};

// Kept for the constructor that names a family in one word (the tensor-core presets
// use it): ieee = IEEE 754 layout; ocp_fn = OCP 8-bit "fn" (finite + NaN): no
// infinities, NaN S.1..1.1..1 (FormatSpec{..., infinities = false, nan = top}).
enum class Encoding { ieee, ocp_fn };

class Format {
 public:
  // Throws std::invalid_argument when the fields do not describe a format that fits in
  // a double or contradict each other: exponent 1..11 bits (2..11 with IEEE NaNs),
  // fraction 0..52 bits (1..52 with IEEE NaNs), every normal a normal double and every
  // subnormal a double; IEEE NaNs come with infinities; infinities need a NaN (inf - inf
  // has to give something); an unsigned format has no negative_zero NaN.
  explicit Format(const FormatSpec& spec);
  Format(int exponent_bits, int fraction_bits, Encoding encoding = Encoding::ieee,
         bool subnormals = true, std::string name = {});

  // The same format with subnormals switched on or off (name gets no suffix: the
  // subnormals() flag says it). Throws std::invalid_argument for subnormals on in a
  // format without zero (it has none).
  [[nodiscard]] Format with_subnormals(bool on) const;

  const std::string& name() const { return name_; }
  int exponent_bits() const { return exponent_bits_; }
  int fraction_bits() const { return fraction_bits_; }  // p - 1 in Higham's notation
  int precision() const { return fraction_bits_ + 1; }  // significand bits incl. hidden
  int bias() const { return bias_; }
  bool subnormals() const { return subnormals_; }
  bool has_infinity() const { return infinities_; }
  NanEncoding nan_encoding() const { return nan_; }
  bool has_nan() const { return nan_ != NanEncoding::none; }
  bool is_signed() const { return signed_; }
  bool has_zero() const { return zero_; }
  // -0 exists in signed formats with a zero whose NaN is not the -0 pattern.
  bool has_negative_zero() const { return signed_ && zero_ && nan_ != NanEncoding::negative_zero; }
  // IEEE 754's layout: IEEE NaNs and infinities, signed, default bias, a zero. The fast
  // array kernels and the tensor-core models accept only these.
  bool ieee_like() const;
  int width() const { return (signed_ ? 1 : 0) + exponent_bits_ + fraction_bits_; }

  int emin() const { return emin_; }  // exponent of min_normal
  int emax() const { return emax_; }  // exponent of max_finite
  double max_finite() const { return max_finite_; }
  // The least normal value (without zero: the least value, 2^-bias).
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

  std::uint64_t sign_mask() const { return sign_mask_; }  // 0 in unsigned formats
  std::uint64_t exponent_mask() const { return exponent_mask_; }
  std::uint64_t fraction_mask() const { return fraction_mask_; }
  std::uint64_t all_mask() const { return sign_mask_ | exponent_mask_ | fraction_mask_; }
  // The canonical NaN: IEEE the positive quiet NaN, `top` the positive one, the single
  // NaN of negative_zero (0x80). Throws std::logic_error in a format without NaN.
  std::uint64_t quiet_nan_bits() const;
  // The pattern of +inf (throws std::logic_error without infinities); -inf is it with
  // the sign bit (signed formats).
  std::uint64_t infinity_bits() const;

  // Bits -> value. Every pattern decodes; NaNs decode to a quiet double NaN with the
  // pattern's sign (the single negative_zero NaN: positive); with subnormals off,
  // subnormal patterns decode to signed zero.
  double decode(std::uint64_t bits) const;
  // Value -> bits. The value must be representable (NaN -> the canonical NaN, keeping
  // its sign where the format has one per sign; +-inf -> inf pattern, or NaN in formats
  // without inf; -0 -> +0 in formats without -0). Throws std::invalid_argument for a
  // value the format does not have (round first): a finite value off its grid, a
  // negative value in an unsigned format, zero without zero, NaN or inf without NaN.
  std::uint64_t encode(double value) const;
  bool representable(double value) const;

  friend bool operator==(const Format& a, const Format& b) {
    return a.exponent_bits_ == b.exponent_bits_ && a.fraction_bits_ == b.fraction_bits_ && a.bias_ == b.bias_ &&
           a.infinities_ == b.infinities_ && a.nan_ == b.nan_ && a.signed_ == b.signed_ && a.zero_ == b.zero_ &&
           a.subnormals_ == b.subnormals_;
  }

 private:
  int exponent_bits_, fraction_bits_, bias_;
  bool infinities_;
  NanEncoding nan_;
  bool signed_, zero_, subnormals_;
  std::string name_;
  int emin_, emax_;
  double max_finite_, min_normal_, min_subnormal_, unit_roundoff_;
  std::uint64_t sign_mask_, exponent_mask_, fraction_mask_;
  std::uint64_t max_magnitude_code_;  // the largest finite pattern without its sign bit
};

// Presets by name (format_names() lists them) and three generic families:
//  eXmY        IEEE-like, X exponent bits 2..11, Y fraction bits 1..52, e.g. e5m10 ==
//              fp16's layout, X and Y written without leading zeros (e05m2 is refused
//              with a hint to write e5m2: one spelling per format).
//  binaryKpPSD the IEEE P3109 formats (interim report v4.0, 2026, section 4.2): K bits,
//              precision P, S = s (signed) or u (unsigned), D = e (extended: +-inf) or f
//              (finite), e.g. binary8p3se, binary8p4sf, binary8p1ue. Bias 2^(K-P-1)
//              signed, 2^(K-P) unsigned (one more than IEEE's for the same exponent
//              width); one NaN (signed: 0x80 where -0 would be; unsigned: all ones), no
//              negative zero, subnormals; extended formats have inf at the largest
//              pattern below the NaN (signed 0x7f/0xff, unsigned all ones - 1).
// Throws std::invalid_argument naming the known formats.
Format format_by_name(std::string_view name);
// The presets: name, the format, one line of help; the one list of them.
NameTable<const Format& (*)()> format_table();
// The preset names, for help texts and did-you-mean.
const char* const* format_names();  // nullptr-terminated
// "fp64 fp32 ... ue4m3, or eXmY ..., or binaryKpPSD ...": the list for help texts.
std::string format_list_text();

const Format& fp64();
const Format& fp32();
const Format& tf32();
const Format& bf16();
const Format& fp16();
const Format& fp8_e5m2();
const Format& fp8_e4m3();
// AMD's and Graphcore's fp8 (ml_dtypes float8_e4m3fnuz, float8_e5m2fnuz): no
// infinities, one NaN at 0x80, no -0, bias one more than IEEE's (8 and 16): e4m3fnuz
// max 240, e5m2fnuz max 57344.
const Format& fp8_e4m3fnuz();
const Format& fp8_e5m2fnuz();
// OCP MX v1.0 section 5.3: finite, no NaN, with -0 and subnormals: max 7.5, 28 and 6.
const Format& fp6_e2m3();
const Format& fp6_e3m2();
const Format& fp4_e2m1();
// OCP MX v1.0 section 5.4: the shared scale, unsigned exponent only, bias 127, values
// 2^-127 .. 2^127, NaN 0xff, no zero, no inf.
const Format& e8m0();
// NVFP4's block scale: fp8-e4m3 without the sign (bias 7, NaN 0x7f, max 448, zero and
// subnormals), 7 bits (stored in a byte whose top bit is 0).
const Format& ue4m3();

}  // namespace emu
