// Floating-point status and control, after the IPU's $FP_STS and $FP_CTL: sticky
// exception flags, which of them trap, stochastic rounding enable (ESR) and the
// overflow policy (NANOO = NaN on overflow).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "names.hpp"

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
// "OFLO" ... "INEXACT", in either case ("oflo"); throws std::invalid_argument listing them.
Flag flag_by_name(std::string_view name);
// Names of the raised flags in the order OFLO DIV0 INV UFLO INEXACT.
std::vector<std::string> flag_names(Flags flags);
NameTable<Flag> flag_table();  // in kAllFlags' order

// Rounding modes. sr = stochastic rounding with probability proportional to distance.
enum class Rounding { rne, rna, rz, ru, rd, ro, sr };
const char* rounding_name(Rounding r);
// Throws std::invalid_argument listing the valid names.
Rounding rounding_by_name(std::string_view name);
NameTable<Rounding> rounding_table();

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
NameTable<Overflow> overflow_table();

// When a result counts as tiny (for UFLO, and for flushing when subnormals are off).
// IEEE 754 (7.5) allows either: `before` rounding looks at the exact value (|x| <
// min_normal), as Arm does (FPRoundBase); `after` rounding asks whether x rounded to
// the format's precision with an unbounded exponent range is below min_normal, as x86
// and Berkeley SoftFloat's default do. They differ only for x just below min_normal
// that rounds up to it. emu's default is `before` (emu/round.hpp has the details).
enum class Tininess { before, after };
const char* tininess_name(Tininess t);  // "before", "after"
Tininess tininess_by_name(std::string_view name);
NameTable<Tininess> tininess_table();

// What an experiment does with floating-point exceptions (its `fp_exceptions` parameter):
// off: only the sticky flags; count: every enabled flag is counted per (scope, op), the
// run goes to its end; trap: the first enabled flag stops the run with a TrapReport.
enum class ExceptionMode { off, count, trap };
const char* exception_mode_name(ExceptionMode m);  // "off", "count", "trap"
ExceptionMode exception_mode_by_name(std::string_view name);
NameTable<ExceptionMode> exception_mode_table();

// Where stochastic rounding takes its random bits from.
enum class RngKind { philox, ipu };
const char* rng_kind_name(RngKind k);
RngKind rng_kind_by_name(std::string_view name);
NameTable<RngKind> rng_kind_table();

struct FpControl {
  Rounding rounding = Rounding::rne;  // default rounding of every operation
  // $FP_CTL.ESR: operations that honour it round stochastically, whatever `rounding`.
  bool esr = false;
  Overflow overflow = Overflow::inf;  // Overflow::nan is the IPU's NANOO
  Flags traps = 0;                    // which flags throw FpException (IPU: OFLO, DIV0, INV)
  // Which flags are counted per (scope, op) in Context::counts() (any of the five; the
  // count costs nothing for flags that are not raised).
  Flags counted = 0;
  Tininess tininess = Tininess::before;
  // Random bits used by stochastic rounding: 0 = exact probabilities; k in 1..64 =
  // hardware-style: the discarded fraction is truncated to k bits and a k-bit random
  // number is added, so P(up) = floor(f * 2^k) / 2^k (biased toward zero by up to
  // 2^-k ulp; see emu/round.hpp).
  int sr_bits = 0;
  // Subnormals on or off is a property of the Format (Format::with_subnormals).

  Rounding effective_rounding() const { return esr ? Rounding::sr : rounding; }
};

// The $FP_STS status register as the IPU would show it, for the IPU's three flags.
// Graphcore's public documents (the Tile Vertex ISA, Poplar's Target API) name the
// fields OFLO, DIV0 and INV of $FP_STS but give no bit positions that we could find;
// emu takes the order of Poplar's Target::makeFpIctlValue(inv, div0, oflo, esr, nanoo):
// bit 0 INV, bit 1 DIV0, bit 2 OFLO. UFLO and INEXACT are not in it.
std::uint32_t fp_sts(Flags flags);

// The element of a tensor operation a flag was raised in: the flat (row-major) index
// into the operation's output and, where the caller knows it, the index per dimension.
struct Element {
  static constexpr int kMaxRank = 4;
  std::int64_t flat = -1;  // -1: a scalar operation (no element)
  int rank = 0;            // number of entries of `index` that are set
  std::array<std::int64_t, kMaxRank> index{};

  bool known() const { return flat >= 0; }
  // "" (none), "#41" (flat index only) or "[3, 7]" (multi-dimensional).
  std::string to_string() const;
  friend bool operator==(const Element&, const Element&) = default;
};

// Everything known about the operation that raised an enabled flag.
struct TrapReport {
  Flag flag = INV;
  std::string scope;             // "encoder.block3.ffn.wo", "" at top level
  std::string op;                // "add", "mul", "div", "amp", "mma", ...
  Element element;
  std::vector<double> operands;  // as the op names them (may be empty for units)
  double result = 0;             // the would-be result under the overflow policy
  Flags status = 0;              // the sticky status, the trapping flag included
  std::uint32_t fp_sts() const { return emu::fp_sts(status); }
};

// Thrown when an operation raises a flag that FpControl::traps enables. The sticky
// status already holds the flag when this is thrown.
class FpException : public std::runtime_error {
 public:
  explicit FpException(TrapReport report);
  const TrapReport& report() const { return report_; }
  Flag flag() const { return report_.flag; }
  const std::string& op() const { return report_.op; }
  const std::string& scope() const { return report_.scope; }
  const Element& element() const { return report_.element; }
  const std::vector<double>& operands() const { return report_.operands; }
  double result() const { return report_.result; }

 private:
  TrapReport report_;
};

// One counted (scope, op, flag): how many elements (operations) raised it, and the
// first of them.
struct OpCount {
  std::string scope;
  std::string op;
  Flag flag = INV;
  std::uint64_t count = 0;
  Element first_element;
  std::vector<double> first_operands;
  double first_result = 0;
};

}  // namespace emu
