// Floating-point status and control, after the IPU's $FP_STS and $FP_CTL: sticky
// exception flags, which of them trap, stochastic rounding enable (ESR) and the
// overflow policy (NANOO = NaN on overflow).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace emu {

// Sticky status flags. OFLO, DIV0 and INV are the IPU's $FP_STS fields; UFLO and
// INEXACT are IEEE 754's, which the IPU does not record but researchers ask for.
enum Flag : std::uint8_t {
  OFLO = 1u << 0,
  DIV0 = 1u << 1,
  INV = 1u << 2,
  UFLO = 1u << 3,
  INEXACT = 1u << 4,
};
using Flags = std::uint8_t;
inline constexpr Flag kAllFlags[] = {OFLO, DIV0, INV, UFLO, INEXACT};

const char* flag_name(Flag f);
// Names of the raised flags in the order OFLO DIV0 INV UFLO INEXACT.
std::vector<std::string> flag_names(Flags flags);

// Rounding modes. sr = stochastic rounding with probability proportional to distance.
enum class Rounding { rne, rna, rz, ru, rd, ro, sr };
const char* rounding_name(Rounding r);
// Throws std::invalid_argument listing the valid names.
Rounding rounding_by_name(std::string_view name);

// What a finite result too large for the format becomes. Every policy raises OFLO and
// INEXACT (IEEE 754 7.4: overflow of a finite value); emu/round.hpp has the details.
//  inf:      IEEE 754: +-inf (or +-max where the rounding direction says so: rz, ro,
//            ru for negatives, rd for positives); in formats without inf (fp8-e4m3)
//            the NaN of the result's sign, 0x7f or 0xff.
//  saturate: +-max finite, as the IPU does for half when NaN-on-overflow is off.
//  nan:      the IPU's NaN-on-overflow ($FP_CTL.NANOO): NaN, with INV as well. Graphcore
//            documents a NaN result and INV, not which NaN: emu gives the canonical
//            positive quiet NaN for both signs (fp16 0x7e00).
// Precedence: the policy decides; the rounding mode matters only under `inf`.
// An infinite operand is not an overflow: it stays +-inf, or in a format without inf
// becomes NaN of its sign with INV (under saturate: +-max with OFLO).
enum class Overflow { inf, saturate, nan };
const char* overflow_name(Overflow o);
Overflow overflow_by_name(std::string_view name);

// Where stochastic rounding takes its random bits from.
enum class RngKind { philox, ipu };
const char* rng_kind_name(RngKind k);
RngKind rng_kind_by_name(std::string_view name);

struct FpControl {
  Rounding rounding = Rounding::rne;  // default rounding of every operation
  // $FP_CTL.ESR: operations that honour it round stochastically, whatever `rounding`.
  bool esr = false;
  Overflow overflow = Overflow::inf;  // Overflow::nan is the IPU's NANOO
  Flags traps = 0;                    // which of OFLO, DIV0, INV throw FpException
  // Random bits used by stochastic rounding: 0 = exact probabilities; k in 1..64 =
  // hardware-style: the discarded fraction is truncated to k bits and a k-bit random
  // number is added, so P(up) = floor(f * 2^k) / 2^k (biased toward zero by up to
  // 2^-k ulp; see emu/round.hpp).
  int sr_bits = 0;
  // Subnormals on or off is a property of the Format (Format::with_subnormals).

  Rounding effective_rounding() const { return esr ? Rounding::sr : rounding; }
};

// Thrown when an operation raises a flag that FpControl::traps enables. The sticky
// status already holds the flag when this is thrown.
class FpException : public std::runtime_error {
 public:
  FpException(Flag flag, std::string op, std::vector<double> operands);
  Flag flag() const { return flag_; }
  const std::string& op() const { return op_; }
  const std::vector<double>& operands() const { return operands_; }

 private:
  Flag flag_;
  std::string op_;
  std::vector<double> operands_;
};

}  // namespace emu
