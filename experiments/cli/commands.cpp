#include "commands.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "emu/block.hpp"
#include "emu/block_mma.hpp"
#include "emu/threads.hpp"
#include "emu/unit.hpp"
#include "expression.hpp"
#include "number.hpp"
#include "options.hpp"

namespace emu::cli {

void Output::line(const std::string& text) {
  buffer_ += text;
  buffer_ += '\n';
  if (buffer_.size() > (1u << 20)) flush();
}

Output::~Output() {
  try {
    flush();
  } catch (const WriteError&) {
    // Already unwinding or already reported: nothing more to say.
  }
}

void Output::flush() {
  errno = 0;
  const bool written = buffer_.empty() || std::fwrite(buffer_.data(), 1, buffer_.size(), file_) == buffer_.size();
  buffer_.clear();
  const bool flushed = std::fflush(file_) == 0;
  if (!written || !flushed || std::ferror(file_))
    throw WriteError(errno != 0 ? std::strerror(errno) : "the output stream reports an error");
}

namespace {

const char* const kMainHelp = R"HELP(usage: emu SUBCOMMAND [ARGS] [--json]

The roundoff calculator: rounding, arithmetic and matrix units in low-precision formats.
  emu info FORMAT                 the format's properties
  emu round VALUE... --format F   round values (or - for one per line on stdin) into F
  emu eval "EXPR" --format F      evaluate + - * / ( ) with every step rounded into F
  emu dot --unit U --a .. --b ..  c + sum a_i*b_i as a matrix unit computes it
  emu gemm --unit U A.txt B.txt   a small matrix product through a matrix unit
  emu quantize VALUE... --format B  block quantisation (OCP MX, NVFP4), per value
emu SUBCOMMAND --help tells more.

)HELP";

// After the format lists. Here and below, @NAME@ stands for a list made from emu's own
// tables (help_text fills them in).
const char* const kMainHelpTail = R"HELP(Rounding: @ROUNDINGS@.
Numbers: decimal (read exactly, rounded once), hex-float (0x1.8p-3), inf, nan.

Output, one line per result. --json: one JSON object per line with "value" (a number
that reads back to the same double; "inf", "-inf", "nan" as strings), "bits" (hex, the
format's width), "flags" (from OFLO DIV0 INV UFLO INEXACT); round and eval add
"raised_by", per flag the first operation that raised it. Without --json the value
is printed as the shortest decimal that rounds (rne) back to the same format value,
e.g. 0.0004883 for fp16's 0.00048828125, then [the value as a double], bits and flags.
round and eval take --trap oflo,div0,inv (any of OFLO DIV0 INV UFLO INEXACT): the
first enabled exception stops the run and its trap report is printed.
Exit status: 0 success, 1 internal error (a bug), 2 bad input, 3 an enabled
floating-point exception trapped (--trap; the trap report is the output, not an
error in the input).
)HELP";

const char* const kInfoHelp = R"HELP(usage: emu info FORMAT [--subnormals on|off] [--json]

The properties of FORMAT: name, exponent_bits, fraction_bits, precision (fraction bits
+ 1), bias, width (bits), encoding (the special values in a word: ieee; ocp-fn: no
infinities, one NaN pattern per sign, as fp8-e4m3; fnuz: no infinities, one NaN at
0x80, no -0; fnuz+inf: the same with +-inf, P3109 signed extended; finite: neither inf
nor NaN, OCP fp6 and fp4; unsigned, unsigned+inf: no sign, NaN all ones, as e8m0 and
ue4m3), has_inf, subnormals, nan (where the NaNs are: ieee, top, negative-zero, none),
signed, has_zero (e8m0 has none), has_negative_zero, emin, emax, max, min_normal (the
least value where there is no zero), min_subnormal (of the encoding, also with
subnormals off), unit_roundoff (2^-precision), epsilon (2^(1-precision)),
finite_values (+0 and -0 count once), finite_encodings.
For people, powers of two also show as such: unit_roundoff 0.00048828125 (2^-11).
--json prints them as one JSON object (plain numbers).
)HELP";

const char* const kRoundHelp = R"HELP(usage: emu round [VALUE... | -] --format F [--rounding R] [--seed S] [--sr-bits K]
                 [--subnormals on|off] [--overflow @OVERFLOWS@] [--rng @RNGS@]
                 [--tininess @TININESS@] [--trap FLAGS] [--json]

Rounds each VALUE once into F and prints, per value, the result, its bit pattern and
the flags that rounding raised (each value's own flags). "-" reads one value per line
from standard input (blank lines are skipped; errors name the line). Values: decimal
(exact: 0.1 is the rational 1/10, never first rounded to double), hex-float
(0x1.8p-3), inf, infinity, nan, with a sign, any case.
  --rounding   @ROUNDING_CHOICES@
  --seed       seed S of the random bits for sr (default 0; same seed, same results):
               with --rng philox the Philox4x32-10 stream keyed by S (0..2^64-1); with
               --rng ipu the IPU's $PRNG_SEED = S (0..2^32-1), expanded as the hardware
               does: s0 = S | (~S << 32), s1 = ((S << 13) | (~S >> 19)) |
               (((~S << 13) | (S >> 19)) << 32) in 32-bit parts; the values then take
               xoroshiro128aox outputs in order, one per inexact sr rounding
  --sr-bits    random bits for sr: 0 = exact probabilities (default), 1..64 = hardware
               style (fraction truncated to K bits plus K random bits; biased toward zero;
               the K bits are the top K of each 64-bit output)
  --rng        source of random bits: philox (default) or ipu (xoroshiro128aox)
  --overflow   inf (IEEE, default; fp8-e4m3 has no inf: NaN of the value's sign),
               saturate (to +-max), nan (the IPU's NANOO: positive NaN, OFLO and INV)
  --subnormals off flushes tiny results to signed zero (UFLO and INEXACT).
  --tininess   when a result is tiny (IEEE 754 7.5 allows both):
               before (default): before rounding, |x| < min normal, as Arm does;
               after: after rounding, when x rounded to the format's precision with
               an unbounded exponent is below min normal, as x86 and SoftFloat do.
               They differ only for x just below min normal that rounds up to it.
               With subnormals on that x gives min normal either way and only UFLO
               differs: raised before, not after. With --subnormals off it is also
               what flushes: before flushes it to zero (Arm's FPCR.FZ), after gives
               min normal with INEXACT only (x86's FTZ).
  --trap       comma-separated flags (oflo,div0,inv; also uflo, inexact; any case):
               the first value whose rounding raises one stops the run; its trap
               report is printed and emu exits with status 3.
Infinities in fp8-e4m3 (no inf) become NaN of their sign with INV; finite overflow
raises OFLO and INEXACT.
JSON fields: input, format, rounding, value, bits, flags, raised_by (per flag its
operation: {"OFLO": {"op": "round", "operands": [70000]}}).
Trap report (--trap, exit 3), one object: input, format, rounding, trap (the flag),
op ("round"), scope ("" here), element (null here), operands, result (the would-be
result under --overflow), bits (of that result), fp_sts (the IPU's $FP_STS as an
integer: bit 0 INV, bit 1 DIV0, bit 2 OFLO), flags (the sticky flags).
)HELP";

const char* const kEvalHelp = R"HELP(usage: emu eval "EXPR"... --format F [--rounding R] [--seed S] [--sr-bits K]
                 [--subnormals on|off] [--overflow @OVERFLOWS@] [--rng @RNGS@]
                 [--tininess @TININESS@] [--trap FLAGS] [--json]

Evaluates each EXPR in F: + - * / with * and / before + and -, left-associative,
parentheses, unary minus. Every literal is rounded once into F first, then every
operation is rounded into F, left to right; the flags are the sticky flags of the
whole evaluation. A sign written directly before a number where an operand is
expected belongs to the literal ("-0.1" is rounded as -0.1; "-(0.1)" negates the
rounded 0.1; only ru and rd can tell the difference). Options as for emu round.
  emu eval "0.0004 + 0.25 - 0.25" --format fp16 --json
  {"input": "0.0004 + 0.25 - 0.25", "format": "fp16", "rounding": "rne", "value": 0.00048828125, "bits": "0x1000", "flags": ["INEXACT"], "raised_by": {"INEXACT": {"op": "round", "column": 1, "operands": [0.0004]}}}
raised_by names, per flag, the first operation that raised it: the operator as
written (+ - * /) or "round" (a literal rounded into F), its 1-based column in EXPR
and its operands (values of F; for a literal its nearest double). Without --json the
line ends with the same, e.g. (first raised by: OFLO INEXACT 300 * 300 at column 5).
--trap FLAGS stops at the first operation that raises an enabled flag and prints the
trap report (fields as for emu round, with the operator as op and its column),
exit status 3. Earlier expressions' results are printed before it.
A syntax error names the column (1-based).
)HELP";

const char* const kDotHelp = R"HELP(usage: emu dot --unit UNIT --a V1,V2,... --b V1,V2,... [--c C] [--in FMT] [--out FMT]
               [--scale-rule R] [--rounding R] [--seed S] [--sr-bits K] [--overflow P]
               [--rng G] [--tininess @TININESS@] [--json]

Prints c + sum a_i*b_i as UNIT computes it: value, bits (in the output format), flags
(raised by the unit's computation). The a_i and b_i are first rounded into the input
format and c into the output format, with rne; the flags of those conversions are
reported apart, as "input_flags". --in and --out default to the unit's own formats.
Units:
@UNITS@
Mixed inputs: --in A:B rounds the a_i into format A and the b_i into format B (two
different scalar formats; JSON's in is A:B), on these units only, with these pairs:
@MIXED_INPUTS@
--rounding and the other rounding options set the context; units with a fixed
rounding (tensor cores) ignore it. --tininess (see emu round --help) applies to the
roundings under the context and to the rounding of the inputs (the tensor cores'
adder decides its own UFLO before rounding).
JSON fields: unit, in, out, format (the output format, that of value and bits),
rounding, value, bits, flags, input_flags.

Block formats (--in @B200_BLOCK_FORMATS@) take
--unit b200: Blackwell's block-scaled MMA, modelled after the PTX ISA and MMA-Sim (no
measured data; emu/block_mma.hpp). a and b are each quantised into blocks along k as
emu quantize does (the format's scale rule, or --scale-rule; elements rne, saturating),
then c + sum a_i X_A b_i X_B runs as kind::mxf8f6f4 (32 products per instruction) or,
for mxfp4-e2m1 and nvfp4, kind::mxf4 / kind::mxf4nvf4 (64), each instruction's result
truncated to fp32; fp32 output only. nvfp4's tensor scales (those emu quantize gives a
and b) are applied outside the MMA, as cuBLASLt's alpha: the MMA runs from zero, then
d = alpha * result + c in one fp32 fma under --rounding, alpha = fp32(ts_a * ts_b).
input_flags are the quantisation's (and alpha's); JSON adds kind (mxf8f6f4 or
mxf4nvf4) and, for nvfp4, alpha. @B200_REFUSED_BLOCK_FORMATS@ and units other than b200 are refused.
)HELP";

const char* const kQuantizeHelp = R"HELP(usage: emu quantize [VALUE... | -] --format BLOCKFORMAT [--scale-rule R] [--rounding R]
                    [--seed S] [--sr-bits K] [--overflow @OVERFLOWS@] [--rng @RNGS@]
                    [--tininess @TININESS@] [--tensor-scale T] [--json]

Quantises the VALUEs, in order, into consecutive blocks of a block format (the last
block may be short, as if padded with zeros) and prints, per value, its dequantised
value, the element (value and bits), and its block's scale (value and bits) and flags.
Each VALUE is first rounded to the nearest double (an array holds doubles), then its
block's scale X is chosen and x / X is rounded once into the element format.
Block formats:
@BLOCK_FORMATS@
  --scale-rule  how X follows from the block's largest magnitude amax (emax: exponent
                of the element format's largest power of two, max: its largest value):
@SCALE_RULES@
  --rounding    of the elements: @ROUNDING_CHOICES@; --seed, --sr-bits,
                --rng as for emu round (sr consumes random bits value by value)
  --overflow    of the elements: saturate (default, as OCP MX), nan, inf (what emu round
                gives: E5M2 inf, E4M3 NaN; FP6, FP4, INT8 saturate whatever the policy);
                an E8M0 scale beyond 2^127 is 2^127 under saturate, else NaN
  --tensor-scale  nvfp4 only: the fp32 tensor scale (default: amax of all values /
                (6 * 448), rounded up to fp32)
A block holding inf or NaN has a NaN scale: its values are NaN (INV for inf).
JSON fields per value: input, format, rounding, scale_rule, value (dequantised), bits
(of the element), flags (of its element's rounding), element, block (from 0), scale,
scale_bits, block_flags (the scale's and all its elements'), tensor_scale.
)HELP";

const char* const kGemmHelp = R"HELP(usage: emu gemm --unit UNIT A.txt B.txt [C.txt] [--in FMT] [--out FMT]
                [--scale-rule R] [--rounding R] [--seed S] [--sr-bits K] [--overflow P]
                [--rng G] [--tininess @TININESS@] [--threads N] [--json]

Computes A*B + C through UNIT (see emu dot --help). Matrix files: one row per line,
numbers separated by white space; blank lines and lines starting with # are skipped.
A is m x k, B is k x n, C (default zero) is m x n; each of them and A*B has at most
16777216 elements (4096 x 4096). Inputs are rounded into the input format and C into
the output format with rne. Each element is computed by the unit's gemm as a 1 x 1 x k
product, so its flags are its own.
Output: without --json, one line per row of the result (shortest decimals that read
back to the output format's values) and a last line with the flags of all elements.
With --json, one object per element in row-major order, with fields unit, in, out,
format (the output format, that of value and bits), rounding, row, col (from 0),
value, bits, flags, input_flags (those of its row of A, its column of B and its C
element).
--in A:B (mixed inputs; see emu dot --help) rounds matrix A into the first format and
matrix B into the second.
A block format (--in, with --unit b200; see emu dot --help) quantises each row of A and
each column of B along k (nvfp4: one tensor scale for all of A, one for all of B) and
runs Blackwell's block-scaled MMA per element; JSON adds kind and, for nvfp4, alpha.
--threads N computes the rows on up to N threads (default 0: every core; 1: one); the
output is the same for every N (sr draws its random bits in element order, on one).
)HELP";

std::string flags_json(Flags flags) {
  std::string s = "[";
  for (const auto& name : flag_names(flags)) s += (s.size() > 1 ? ", \"" : "\"") + name + "\"";
  return s + "]";
}

std::string flags_text(Flags flags) {
  std::string s;
  for (const auto& name : flag_names(flags)) s += (s.empty() ? "" : " ") + name;
  return s.empty() ? "none" : s;
}

// "VALUE [double] bits 0xBITS flags F" for people.
std::string result_text(const Format& f, double value, Flags flags) {
  std::string text = shortest_decimal(f, value);
  if (std::isfinite(value)) text += " [" + json_number(value) + "]";
  return text + " bits " + hex_bits(f, f.encode(value)) + " flags " + flags_text(flags);
}

// The contract's fields after "input"/"format"/"rounding": value, bits, flags.
std::string result_json(const Format& f, double value, Flags flags) {
  return "\"value\": " + json_number(value) + ", \"bits\": " + json_string(hex_bits(f, f.encode(value))) +
         ", \"flags\": " + flags_json(flags);
}

// ---- provenance: which operation raised a flag first, and trap reports -------------

std::string numbers_json(const std::vector<double>& values) {
  std::string s = "[";
  for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + json_number(values[i]);
  return s + "]";
}

// The contract's raised_by: {"OFLO": {"op": "*", "column": 7, "operands": [300, 300]}}
// (no column for emu round, whose one operation is the rounding of its input).
std::string raised_by_json(const RaisedBy& raised_by) {
  std::string s = "{";
  for (Flag flag : kAllFlags) {
    const Operation* o = raised_by.first(flag);
    if (o == nullptr) continue;
    s += (s.size() > 1 ? ", " : "") + json_string(flag_name(flag)) + ": {\"op\": " + json_string(o->op);
    if (o->column > 0) s += ", \"column\": " + std::to_string(o->column);
    s += ", \"operands\": " + numbers_json(o->operands) + "}";
  }
  return s + "}";
}

// An operation for people: "300 * 300 at column 7", "round(0.1) at column 1". Operands
// of operators are values of f; a rounding shows its input as written.
std::string operation_text(const Format& f, const Operation& o) {
  std::string text;
  if (o.op == "round") {
    text = "round(" + o.text + ")";
  } else {
    for (std::size_t i = 0; i < o.operands.size(); ++i)
      text += (i ? " " + o.op + " " : std::string()) + shortest_decimal(f, o.operands[i]);
  }
  if (o.column > 0) text += " at column " + std::to_string(o.column);
  return text;
}

// " (first raised by: INEXACT round(0.1) at column 1; OFLO 60000 * 2 at column 9)",
// flags raised first by the same operation together; "" without flags.
std::string raised_by_text(const Format& f, const RaisedBy& raised_by) {
  std::vector<std::pair<std::string, std::string>> groups;  // (flags, operation)
  for (Flag flag : kAllFlags) {
    const Operation* o = raised_by.first(flag);
    if (o == nullptr) continue;
    const std::string text = operation_text(f, *o);
    if (!groups.empty() && groups.back().second == text)
      groups.back().first += std::string(" ") + flag_name(flag);
    else
      groups.emplace_back(flag_name(flag), text);
  }
  if (groups.empty()) return "";
  std::string s = " (first raised by: ";
  for (std::size_t i = 0; i < groups.size(); ++i)
    s += (i ? "; " : "") + groups[i].first + " " + groups[i].second;
  return s + ")";
}

// The trap report of `emu round` and `emu eval` (exit status 3): the trapping flag, the
// operation as written, its operands, the would-be result under the overflow policy,
// $FP_STS and the sticky flags. The CLI's operations are scalar: no scope, no element.
std::string trap_json(const std::string& input, const Format& f, const std::string& rounding,
                      const TrapReport& report, const Operation& o) {
  std::string s = "{\"input\": " + json_string(input) + ", \"format\": " + json_string(f.name()) +
                  ", \"rounding\": " + json_string(rounding) + ", \"trap\": " + json_string(flag_name(report.flag)) +
                  ", \"op\": " + json_string(o.op);
  if (o.column > 0) s += ", \"column\": " + std::to_string(o.column);
  s += ", \"scope\": " + json_string(report.scope) + ", \"element\": null, \"operands\": " + numbers_json(o.operands) +
       ", \"result\": " + json_number(report.result) + ", \"bits\": " + json_string(hex_bits(f, f.encode(report.result))) +
       ", \"fp_sts\": " + std::to_string(report.fp_sts()) + ", \"flags\": " + flags_json(report.status) + "}";
  return s;
}

std::string trap_text(const std::string& input, const Format& f, const TrapReport& report, const Operation& o) {
  char fp_sts[16];
  std::snprintf(fp_sts, sizeof fp_sts, "0x%x", report.fp_sts());
  return input + " trapped: " + flag_name(report.flag) + " in " + operation_text(f, o) + ", would give " +
         shortest_decimal(f, report.result) + " bits " + hex_bits(f, f.encode(report.result)) + "; $FP_STS " + fp_sts +
         " (" + flags_text(report.status & (OFLO | DIV0 | INV)) + "); flags " + flags_text(report.status);
}

// Exit status: an enabled floating-point exception trapped (CONTRACT.md).
constexpr int kTrapped = 3;

std::string trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r");
  return std::string(s.substr(first, last - first + 1));
}

std::vector<OptionSpec> with(std::vector<OptionSpec> base, std::initializer_list<OptionSpec> more) {
  base.insert(base.end(), more);
  return base;
}

// The special values in one word, for people (the fields nan, has_inf, signed,
// has_zero say the same one by one): ieee; ocp-fn (no inf, NaN S.1..1.1..1 per sign);
// fnuz (no inf, one NaN at 0x80, no -0); fnuz+inf (P3109 signed extended); finite (no
// inf, no NaN: OCP fp6, fp4); unsigned (NaN all ones), unsigned+inf (P3109 unsigned
// extended).
std::string encoding_family(const Format& f) {
  const std::string inf = f.has_infinity() ? "+inf" : "";
  switch (f.nan_encoding()) {
    case NanEncoding::ieee: return "ieee";
    case NanEncoding::top: return f.is_signed() ? "ocp-fn" + inf : "unsigned" + inf;
    case NanEncoding::negative_zero: return "fnuz" + inf;
    case NanEncoding::none: return "finite";
  }
  return "?";
}

}  // namespace

std::vector<OptionSpec> command_options(std::string_view command) {
  const std::vector<OptionSpec> unit = {{"--unit", true}, {"--in", true}, {"--out", true}};
  if (command == "info") return {{"--subnormals", true}, {"--json", false}, {"--help", false}};
  if (command == "round" || command == "eval")
    return with(rounding_options(), {{"--format", true}, {"--subnormals", true}, {"--trap", true}});
  std::vector<OptionSpec> known = rounding_options();
  if (command == "quantize")
    return with(std::move(known), {{"--format", true}, {"--scale-rule", true}, {"--tensor-scale", true}});
  if (command == "dot") known = with(std::move(known), {{"--a", true}, {"--b", true}, {"--c", true}});
  else if (command == "gemm") known.push_back({"--threads", true});
  else throw std::logic_error("command_options: unknown command");
  known.insert(known.end(), unit.begin(), unit.end());
  known.push_back({"--scale-rule", true});  // block formats (b200's block-scaled MMA)
  return known;
}

std::vector<std::pair<std::string, std::string>> info_fields(const Format& f) {
  return {
      {"name", json_string(f.name())},
      {"exponent_bits", std::to_string(f.exponent_bits())},
      {"fraction_bits", std::to_string(f.fraction_bits())},
      {"precision", std::to_string(f.precision())},
      {"bias", std::to_string(f.bias())},
      {"width", std::to_string(f.width())},
      {"encoding", json_string(encoding_family(f))},
      {"has_inf", f.has_infinity() ? "true" : "false"},
      {"subnormals", f.subnormals() ? "true" : "false"},
      {"nan", json_string(nan_encoding_name(f.nan_encoding()))},
      {"signed", f.is_signed() ? "true" : "false"},
      {"has_zero", f.has_zero() ? "true" : "false"},
      {"has_negative_zero", f.has_negative_zero() ? "true" : "false"},
      {"emin", std::to_string(f.emin())},
      {"emax", std::to_string(f.emax())},
      {"max", json_number(f.max_finite())},
      {"min_normal", json_number(f.min_normal())},
      {"min_subnormal", json_number(f.min_subnormal())},
      {"unit_roundoff", json_number(f.unit_roundoff())},
      {"epsilon", json_number(f.epsilon())},
      {"finite_values", std::to_string(f.finite_values())},
      {"finite_encodings", std::to_string(f.finite_encodings())},
  };
}

std::string info_json(const Format& f) {
  std::string line = "{";
  for (const auto& [key, value] : info_fields(f)) line += (line.size() > 1 ? ", \"" : "\"") + key + "\": " + value;
  return line + "}";
}

namespace {

// ---- info -----------------------------------------------------------------------

int info(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("info", args, command_options("info"));
  if (o.positionals.size() != 1) throw UsageError("emu info: expected one FORMAT (e.g. emu info fp16)");
  // The format is the positional FORMAT (error messages name it so: info has no --format).
  ParsedOptions with_format = o;
  with_format.values["FORMAT"] = o.positionals.front();
  const Format f = format_option(with_format, "FORMAT");
  const auto fields = info_fields(f);
  if (o.has("--json")) {
    out.line(info_json(f));
    return 0;
  }
  // For people, the limits that are powers of two also as 2^k.
  const std::pair<const char*, double> powers[] = {{"max", f.max_finite()},
                                                   {"min_normal", f.min_normal()},
                                                   {"min_subnormal", f.min_subnormal()},
                                                   {"unit_roundoff", f.unit_roundoff()},
                                                   {"epsilon", f.epsilon()}};
  for (const auto& [key, value] : fields) {
    std::string shown = value;
    if (!shown.empty() && shown.front() == '"') shown = shown.substr(1, shown.size() - 2);
    for (const auto& [power_key, v] : powers) {
      int exponent = 0;
      if (key == power_key && std::frexp(v, &exponent) == 0.5)
        shown += " (2^" + std::to_string(exponent - 1) + ")";
    }
    out.line(key + std::string(18 - key.size(), ' ') + shown);
  }
  return 0;
}

// ---- round and eval -----------------------------------------------------------------

struct Input {
  std::string text;
  Exact value;
};

// Standard input, one value per line; blank (or white-space-only) lines are skipped;
// errors name the line (counting every line, blank ones too).
void read_stdin_values(const std::string& command, std::vector<Input>& inputs) {
  std::string all;
  char chunk[1 << 16];
  std::size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, stdin)) > 0) all.append(chunk, n);
  if (std::ferror(stdin)) throw UsageError("emu " + command + ": cannot read standard input");
  std::size_t line_no = 0, start = 0;
  while (start < all.size()) {
    auto end = all.find('\n', start);
    if (end == std::string::npos) end = all.size();
    ++line_no;
    std::string text = trimmed(std::string_view(all).substr(start, end - start));
    start = end + 1;
    if (text.empty()) continue;  // blank or white space only: skipped, still counted
    try {
      Exact x = parse_number(text);
      inputs.push_back({std::move(text), x});
    } catch (const NumberError& e) {
      throw UsageError("emu " + command + ": standard input line " + std::to_string(line_no) +
                       ": malformed number '" + text + "': " + e.what());
    }
  }
}

// The VALUE... positionals of `emu round` and `emu quantize`, "-" reading standard input.
std::vector<Input> read_values(const std::string& command, const std::vector<std::string>& positionals) {
  std::vector<Input> inputs;
  bool read_stdin = false;
  for (const auto& p : positionals) {
    if (p == "-") {
      if (read_stdin) throw UsageError("emu " + command + ": '-' (standard input) given twice");
      read_stdin = true;
      read_stdin_values(command, inputs);
      continue;
    }
    try {
      inputs.push_back({p, parse_number(p)});
    } catch (const NumberError& e) {
      throw UsageError("emu " + command + ": malformed number '" + p + "': " + e.what());
    }
  }
  if (positionals.empty())
    throw UsageError("emu " + command + ": no values (give VALUE... or - to read standard input)");
  return inputs;
}

int round_values(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("round", args, command_options("round"));
  const Format f = format_option(o);
  Context ctx = context_from(o);
  const std::string rounding = rounding_from(o);
  const std::vector<Input> inputs = read_values("round", o.positionals);
  const bool json = o.has("--json");
  const std::string fixed = ", \"format\": " + json_string(f.name()) + ", \"rounding\": " + json_string(rounding) + ", ";
  RaisedBy raised_by;
  for (const auto& in : inputs) {
    ctx.clear_status();
    const Operation rounding_op{"round", 0, {in.value.hi}, in.text};
    double v;
    try {
      v = ctx.round(f, in.value, "round", {in.value.hi});
    } catch (const FpException& e) {
      out.line(json ? trap_json(in.text, f, rounding, e.report(), rounding_op)
                    : trap_text(in.text, f, e.report(), rounding_op));
      return kTrapped;
    }
    raised_by.clear();
    raised_by.note(ctx.status(), rounding_op);
    if (json)
      out.line("{\"input\": " + json_string(in.text) + fixed + result_json(f, v, ctx.status()) +
               ", \"raised_by\": " + raised_by_json(raised_by) + "}");
    else
      out.line(in.text + " -> " + result_text(f, v, ctx.status()) + raised_by_text(f, raised_by));
  }
  return 0;
}

int eval(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("eval", args, command_options("eval"));
  const Format f = format_option(o);
  Context ctx = context_from(o);
  const std::string rounding = rounding_from(o);
  if (o.positionals.empty()) throw UsageError("emu eval: no expression (e.g. emu eval \"0.1 + 0.2\" --format fp16)");
  std::vector<std::unique_ptr<Expression>> expressions;
  for (const auto& text : o.positionals) {
    try {
      expressions.push_back(parse_expression(text));
    } catch (const SyntaxError& e) {
      throw UsageError("emu eval: \"" + text + "\": " + e.what());
    }
  }
  const bool json = o.has("--json");
  RaisedBy raised_by;
  for (std::size_t i = 0; i < expressions.size(); ++i) {
    ctx.clear_status();
    raised_by.clear();
    const std::string& text = o.positionals[i];
    double v;
    try {
      v = evaluate(*expressions[i], f, ctx, raised_by);
    } catch (const ExpressionTrap& trap) {
      out.line(json ? trap_json(text, f, rounding, trap.report, trap.operation)
                    : trap_text(text, f, trap.report, trap.operation));
      return kTrapped;
    }
    if (json)
      out.line("{\"input\": " + json_string(text) + ", \"format\": " + json_string(f.name()) +
               ", \"rounding\": " + json_string(rounding) + ", " + result_json(f, v, ctx.status()) +
               ", \"raised_by\": " + raised_by_json(raised_by) + "}");
    else
      out.line(text + " = " + result_text(f, v, ctx.status()) + raised_by_text(f, raised_by));
  }
  return 0;
}

// ---- quantize -----------------------------------------------------------------------

int quantize_values(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("quantize", args, command_options("quantize"));
  QuantizeSetup setup = quantize_from(o);
  const BlockFormat* f = setup.format;
  const BlockSpec& spec = setup.spec;
  Context& ctx = setup.ctx;
  const std::vector<Input> inputs = read_values("quantize", o.positionals);
  std::vector<double> values;
  for (const auto& in : inputs) values.push_back(round_nearest(fp64(), in.value));
  const BlockQuantized q = quantize(*f, values, spec, &ctx.rng());

  const bool json = o.has("--json");
  const std::string rounding = rounding_from(o);
  const std::string fixed = ", \"format\": " + json_string(f->name()) + ", \"rounding\": " + json_string(rounding) +
                            ", \"scale_rule\": " + json_string(scale_rule_name(spec.rule)) + ", ";
  const Format& element = f->element();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::size_t b = q.block_of(i, *f);
    const BlockScale& scale = q.scales[b];
    const double value = q.value(i, *f);
    const std::string element_bits = hex_bits(element, q.element_bits[i]);
    const std::string scale_bits = hex_bits(f->scale(), scale.bits);
    if (json) {
      out.line("{\"input\": " + json_string(inputs[i].text) + fixed + "\"value\": " + json_number(value) +
               ", \"bits\": " + json_string(element_bits) + ", \"flags\": " + flags_json(q.element_flags[i]) +
               ", \"element\": " + json_number(q.elements[i]) + ", \"block\": " + std::to_string(b) +
               ", \"scale\": " + json_number(scale.value) + ", \"scale_bits\": " + json_string(scale_bits) +
               ", \"block_flags\": " + flags_json(scale.flags) + ", \"tensor_scale\": " + json_number(q.tensor_scale) +
               "}");
      continue;
    }
    if (i % static_cast<std::size_t>(f->block_size()) == 0) {
      std::string head = "block " + std::to_string(b) + ": scale " + shortest_decimal(f->scale(), scale.value) +
                         " bits " + scale_bits;
      if (f->has_tensor_scale()) head += ", tensor scale " + json_number(q.tensor_scale);
      out.line(head + ", flags " + flags_text(scale.flags) + " (" + f->name() + ", scale rule " +
               scale_rule_name(spec.rule) + ", elements " + rounding + ")");
    }
    out.line("  " + inputs[i].text + " -> " + json_number(value) + " = element " +
             shortest_decimal(element, q.elements[i]) + " bits " + element_bits + " flags " +
             flags_text(q.element_flags[i]));
  }
  return 0;
}

// ---- dot and gemm ---------------------------------------------------------------

// The names of the options, for emu::resolve_unit's messages.
constexpr RequestLabels kOptionLabels{"--unit", "--in", "--out", "--scale-rule", "fused"};

}  // namespace

QuantizeSetup quantize_setup(const BlockFormat& f, std::optional<ScaleRule> rule, const RoundingOptions& rounding,
                             bool overflow_given, std::optional<double> tensor_scale,
                             const std::string& tensor_scale_text) {
  BlockSpec spec = default_block_spec(f);
  spec.rule = usage_checked([&] { return scale_rule_for(f, rule, "--scale-rule"); });
  if (tensor_scale) {
    if (!f.has_tensor_scale()) throw UsageError("--tensor-scale: " + f.name() + " has no tensor scale (nvfp4 has)");
    const double value = *tensor_scale;
    if (!(value > 0) || !std::isfinite(value) || !fp32().representable(value))
      throw UsageError("--tensor-scale: '" + tensor_scale_text + "': not a positive finite fp32 value");
    spec.tensor_scale = value;
  }
  Context ctx = make_context(rounding);
  if (!overflow_given) ctx.control.overflow = Overflow::saturate;  // OCP MX elements saturate
  spec.element = ctx.spec();
  return {&f, spec, std::move(ctx)};
}

QuantizeSetup quantize_from(const ParsedOptions& o) {
  const auto name = o.get("--format");
  if (!name) throw UsageError("--format is required (e.g. --format mxfp4-e2m1)");
  const BlockFormat& f = *option_value("--format", [&] { return &block_format_by_name(*name); });
  std::optional<ScaleRule> rule;
  if (const auto r = o.get("--scale-rule")) rule = option_value("--scale-rule", [&] { return scale_rule_by_name(*r); });
  std::optional<double> tensor_scale;
  const auto t = o.get("--tensor-scale");
  if (t) {
    try {
      const Exact x = parse_number(*t);
      if (x.lo != 0 || x.beyond_double) throw NumberError("not a positive finite fp32 value");
      tensor_scale = x.hi;
    } catch (const NumberError& e) {
      if (!f.has_tensor_scale()) throw UsageError("--tensor-scale: " + f.name() + " has no tensor scale (nvfp4 has)");
      throw UsageError("--tensor-scale: '" + *t + "': " + e.what());
    }
  }
  return quantize_setup(f, rule, rounding_options_from(o), o.has("--overflow"), tensor_scale, t.value_or(""));
}

UnitRequest unit_request_from(const ParsedOptions& o, std::string_view command) {
  UnitRequest r;
  const auto unit = o.get("--unit"), in = o.get("--in");
  if (!unit) {
    const bool block = in && is_block_format_name(*in);
    throw UsageError("emu " + std::string(command) + ": --unit is required (" +
                     (block ? "--unit b200 for --in " + *in : std::string("e.g. --unit exact")) + ")");
  }
  r.unit = option_value("--unit", [&] { return unit_kind_by_name(*unit); });
  if (in) r.in = option_value("--in", [&] { return unit_input_by_name(*in); });
  if (const auto v = o.get("--out")) r.out = format_named("--out", *v);
  if (const auto v = o.get("--scale-rule")) r.scale_rule = option_value("--scale-rule", [&] { return scale_rule_by_name(*v); });
  return r;
}

UnitSetup unit_setup(const UnitRequest& request, const std::string& rounding) {
  UnitSetup s;
  s.ready = usage_checked([&] { return resolve_unit(request, kOptionLabels); });
  const std::string unit = unit_kind_name(s.ready.kind), in = s.ready.in_name(), out = s.ready.output_format().name();
  s.fixed_json = "\"unit\": " + json_string(unit) + ", \"in\": " + json_string(in) + ", \"out\": " + json_string(out) +
                 ", \"format\": " + json_string(out) + ", \"rounding\": " + json_string(rounding);
  s.description = "unit " + unit;
  if (s.ready.mma) {
    const std::string kind = block_mma_kind_name(s.ready.mma->params().kind);
    s.fixed_json += ", \"kind\": " + json_string(kind);
    s.description += " block-scaled kind::" + kind;
  }
  s.description += ", in " + in + ", out " + out;
  return s;
}

double convert_input(const Format& f, const Exact& x, const Context& ctx, Flags& flags) {
  // A value already in f: rne leaves it as it is and raises nothing (the common case of
  // inputs rounded before, e.g. from Python; skips the general rounding).
  if (x.lo == 0.0 && !x.beyond_double && std::isfinite(x.hi) && f.representable(x.hi)) return x.hi;
  RoundSpec spec;
  spec.tininess = ctx.control.tininess;
  return emu::round(f, x, spec, nullptr, flags);
}

DotResult unit_dot(const UnitSetup& s, Context& ctx, std::span<const Exact> a_exact, std::span<const Exact> b_exact,
                   const Exact& c_exact) {
  const ReadyUnit& u = s.ready;
  const std::size_t k = a_exact.size();
  DotResult r;
  std::vector<double> a(k), b(k);
  if (u.block) {
    for (std::size_t i = 0; i < k; ++i) {
      a[i] = round_nearest(fp64(), a_exact[i]);
      b[i] = round_nearest(fp64(), b_exact[i]);
    }
    const QuantizedOperands q = u.quantize_operands(a, b, 1, 1, k);
    r.epilogue = q.epilogue;
    r.input_flags = q.rows[0].flags | q.cols[0].flags | r.epilogue.alpha_flags;
    const double c = convert_input(u.output_format(), c_exact, ctx, r.input_flags);
    r.value = u.mma ? u.mma->dot(ctx, q.rows[0], q.cols[0], c, r.epilogue) : u.unit->dot(ctx, k, a.data(), 1, b.data(), 1, c);
    return r;
  }
  for (std::size_t i = 0; i < k; ++i) a[i] = convert_input(u.unit->input_format(), a_exact[i], ctx, r.input_flags);
  for (std::size_t i = 0; i < k; ++i) b[i] = convert_input(u.unit->b_input_format(), b_exact[i], ctx, r.input_flags);
  const double c = convert_input(u.output_format(), c_exact, ctx, r.input_flags);
  r.value = u.unit->dot(ctx, k, a.data(), 1, b.data(), 1, c);
  return r;
}

BlockGemmResult block_gemm(const UnitSetup& s, Context& ctx, std::size_t m, std::size_t n, std::size_t k,
                           const double* A, const double* B, std::span<const Exact> C) {
  const ReadyUnit& u = s.ready;
  std::vector<double> a(A, A + m * k), b(B, B + k * n);
  const QuantizedOperands q = u.quantize_operands(a, b, m, n, k);
  BlockGemmResult r;
  r.epilogue = q.epilogue;
  r.values.assign(m * n, 0.0);
  r.flags.assign(m * n, 0);
  r.input_flags.assign(m * n, 0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t e = i * n + j;
      r.input_flags[e] = q.rows[i].flags | q.cols[j].flags | r.epilogue.alpha_flags;
      double c = C.empty() ? 0.0 : convert_input(u.output_format(), C[e], ctx, r.input_flags[e]);
      ctx.clear_status();
      if (u.mma)
        c = u.mma->dot(ctx, q.rows[i], q.cols[j], c, r.epilogue);
      else
        u.unit->gemm(ctx, 1, 1, k, a.data() + i * k, k, b.data() + j, n, &c, 1);
      r.values[e] = c;
      r.flags[e] = ctx.status();
    }
  return r;
}

namespace {

std::vector<Exact> number_list(std::string_view option, const std::string& text) {
  std::vector<Exact> values;
  std::size_t start = 0, index = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string item = trimmed(std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    ++index;
    try {
      values.push_back(parse_number(item));
    } catch (const NumberError& e) {
      throw UsageError(std::string(option) + ": value " + std::to_string(index) + " '" + item + "' is malformed: " + e.what());
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

std::string alpha_json(const TensorScaleEpilogue& e) {
  return e.applies ? ", \"alpha\": " + json_number(e.alpha) : "";
}

// What the unit did to its inputs, for people: "; inputs rounded with rne: flags F" or
// "; inputs quantised with R scales: flags F", after the description (and alpha).
std::string inputs_text(const UnitSetup& s, const TensorScaleEpilogue& e, Flags input_flags) {
  const std::string how = s.ready.block
                              ? std::string("quantised with ") + scale_rule_name(s.ready.block_spec.rule) + " scales"
                              : std::string("rounded with rne");
  return s.description + (e.applies ? ", alpha " + json_number(e.alpha) : "") + "; inputs " + how + ": flags " +
         flags_text(input_flags);
}

int dot(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("dot", args, command_options("dot"));
  if (!o.positionals.empty()) throw UsageError("emu dot: unexpected argument '" + o.positionals.front() + "'");
  const auto a_text = o.get("--a"), b_text = o.get("--b");
  if (!a_text || !b_text) throw UsageError("emu dot: --a and --b are required (e.g. --a 1,2 --b 3,4)");
  const std::vector<Exact> a_exact = number_list("--a", *a_text), b_exact = number_list("--b", *b_text);
  if (a_exact.size() != b_exact.size())
    throw UsageError("emu dot: --a has " + std::to_string(a_exact.size()) + " values but --b has " +
                     std::to_string(b_exact.size()));
  Exact c_exact{0.0};
  if (const auto c = o.get("--c")) {
    try {
      c_exact = parse_number(trimmed(*c));
    } catch (const NumberError& e) {
      throw UsageError("--c: malformed number '" + *c + "': " + e.what());
    }
  }
  const UnitSetup setup = unit_setup(unit_request_from(o, "dot"), rounding_from(o));
  Context ctx = context_from(o);
  const DotResult r = unit_dot(setup, ctx, a_exact, b_exact, c_exact);
  const Format& out_format = setup.ready.output_format();
  if (o.has("--json"))
    out.line("{" + setup.fixed_json + ", " + result_json(out_format, r.value, ctx.status()) +
             ", \"input_flags\": " + flags_json(r.input_flags) + alpha_json(r.epilogue) + "}");
  else
    out.line(result_text(out_format, r.value, ctx.status()) + " (" + inputs_text(setup, r.epilogue, r.input_flags) +
             ")");
  return 0;
}

struct Matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<Exact> values;       // row-major
  std::vector<std::size_t> lines;  // the file line of each row
  std::string path;
};

Matrix read_matrix(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw UsageError(path + ": cannot open: " + std::strerror(errno));
  Matrix m;
  m.path = path;
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(file, line)) {
    ++line_no;
    const std::string t = trimmed(line);
    if (t.empty() || t.front() == '#') continue;
    std::size_t count = 0, pos = 0;
    while (true) {
      const auto start = line.find_first_not_of(" \t\r", pos);
      if (start == std::string::npos) break;
      auto end = line.find_first_of(" \t\r", start);
      if (end == std::string::npos) end = line.size();
      const std::string token = line.substr(start, end - start);
      if (m.values.size() == kMaxMatrixElements)
        throw UsageError(path + ":" + std::to_string(line_no) + ": more than " + std::to_string(kMaxMatrixElements) +
                         " values, the limit of a matrix (4096 x 4096)");
      try {
        m.values.push_back(parse_number(token));
      } catch (const NumberError& e) {
        throw UsageError(path + ":" + std::to_string(line_no) + ": column " + std::to_string(start + 1) +
                         ": malformed number '" + token + "': " + e.what());
      }
      ++count;
      pos = end;
    }
    if (m.rows > 0 && count != m.cols)
      throw UsageError(path + ":" + std::to_string(line_no) + ": " + std::to_string(count) + " values, but line " +
                       std::to_string(m.lines.front()) + " has " + std::to_string(m.cols));
    m.cols = count;
    m.lines.push_back(line_no);
    ++m.rows;
  }
  if (file.bad()) throw UsageError(path + ": read error");
  if (m.rows == 0) throw UsageError(path + ": no rows (one row of numbers per line)");
  return m;
}

// Checks that `m` has the expected number of rows, naming the line where it breaks.
void expect_rows(const Matrix& m, std::size_t rows, const std::string& why) {
  if (m.rows == rows) return;
  const std::size_t line = m.rows > rows ? m.lines[rows] : m.lines.back();
  throw UsageError(m.path + ":" + std::to_string(line) + ": " + std::to_string(m.rows) + " rows, but " + why + " needs " +
                   std::to_string(rows));
}

// emu gemm with a block format (block_gemm), one line per element or per row.
int print_block_gemm(const ParsedOptions& o, const UnitSetup& s, const Matrix& A, const Matrix& B,
                     const std::optional<Matrix>& C, Output& out) {
  Context ctx = context_from(o);
  const std::size_t m = A.rows, n = B.cols, k = A.cols;
  std::vector<double> a(m * k), b(k * n);
  for (std::size_t e = 0; e < m * k; ++e) a[e] = round_nearest(fp64(), A.values[e]);
  for (std::size_t e = 0; e < k * n; ++e) b[e] = round_nearest(fp64(), B.values[e]);
  const BlockGemmResult r =
      block_gemm(s, ctx, m, n, k, a.data(), b.data(), C ? std::span<const Exact>(C->values) : std::span<const Exact>());
  const Format& out_format = s.ready.output_format();

  const bool json = o.has("--json");
  Flags all_flags = 0, all_input_flags = 0;
  for (std::size_t i = 0; i < m; ++i) {
    std::string row_text;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t e = i * n + j;
      all_flags |= r.flags[e];
      all_input_flags |= r.input_flags[e];
      if (json)
        out.line("{" + s.fixed_json + ", \"row\": " + std::to_string(i) + ", \"col\": " + std::to_string(j) + ", " +
                 result_json(out_format, r.values[e], r.flags[e]) +
                 ", \"input_flags\": " + flags_json(r.input_flags[e]) + alpha_json(r.epilogue) + "}");
      else
        row_text += (j ? std::string(" ") : std::string()) + shortest_decimal(out_format, r.values[e]);
    }
    if (!json) out.line(row_text);
  }
  if (!json) out.line("flags " + flags_text(all_flags) + " (" + inputs_text(s, r.epilogue, all_input_flags) + ")");
  return 0;
}

int gemm(const std::vector<std::string>& args, Output& out) {
  const auto o = parse_options("gemm", args, command_options("gemm"));
  if (o.positionals.size() < 2 || o.positionals.size() > 3)
    throw UsageError("emu gemm: expected the files A.txt B.txt [C.txt]");
  const UnitSetup setup = unit_setup(unit_request_from(o, "gemm"), rounding_from(o));
  Context ctx = context_from(o);
  if (const auto v = o.get("--threads")) set_gemm_threads(static_cast<int>(integer_option("--threads", *v, 0, 4096)));
  const Matrix A = read_matrix(o.positionals[0]), B = read_matrix(o.positionals[1]);
  expect_rows(B, A.cols, "A*B with A = " + A.path + " (" + std::to_string(A.cols) + " columns)");
  check_matrix_size("A*B with A = " + A.path + " and B = " + B.path, A.rows, B.cols);
  std::optional<Matrix> C;
  if (o.positionals.size() == 3) {
    C = read_matrix(o.positionals[2]);
    expect_rows(*C, A.rows, "A*B + C with A = " + A.path + " (" + std::to_string(A.rows) + " rows)");
    if (C->cols != B.cols)
      throw UsageError(C->path + ":" + std::to_string(C->lines.front()) + ": " + std::to_string(C->cols) +
                       " columns, but A*B + C with B = " + B.path + " needs " + std::to_string(B.cols));
  }
  if (setup.ready.block) return print_block_gemm(o, setup, A, B, C, out);
  const MatrixUnit& unit = *setup.ready.unit;
  const std::size_t m = A.rows, n = B.cols, k = A.cols;
  const Format &in = unit.input_format(), &in_b = unit.b_input_format();
  const Format& out_format = unit.output_format();

  std::vector<double> a(m * k), b(k * n), c(m * n, 0.0);
  std::vector<Flags> a_row_flags(m, 0), b_col_flags(n, 0), c_flags(m * n, 0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) a[i * k + p] = convert_input(in, A.values[i * k + p], ctx, a_row_flags[i]);
  for (std::size_t p = 0; p < k; ++p)
    for (std::size_t j = 0; j < n; ++j) b[p * n + j] = convert_input(in_b, B.values[p * n + j], ctx, b_col_flags[j]);
  if (C)
    for (std::size_t e = 0; e < m * n; ++e) c[e] = convert_input(out_format, C->values[e], ctx, c_flags[e]);

  // Every element its own 1 x 1 x k gemm, with its own flags; rows of them on the
  // threads emu/threads.hpp gives (serially where sr draws random bits).
  std::vector<Flags> flags(m * n, 0);
  gemm_by_rows(ctx, m, n, k, c.data(), n, [&](Context& rows_ctx, std::size_t first, std::size_t rows) {
    for (std::size_t i = first; i < first + rows; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        rows_ctx.clear_status();
        unit.gemm(rows_ctx, 1, 1, k, a.data() + i * k, k, b.data() + j, n, &c[i * n + j], 1);
        flags[i * n + j] = rows_ctx.status();
      }
  });

  const bool json = o.has("--json");
  Flags all_flags = 0, all_input_flags = 0;
  for (std::size_t i = 0; i < m; ++i) {
    std::string row_text;
    for (std::size_t j = 0; j < n; ++j) {
      const double v = c[i * n + j];
      const Flags input_flags = a_row_flags[i] | b_col_flags[j] | c_flags[i * n + j];
      all_flags |= flags[i * n + j];
      all_input_flags |= input_flags;
      if (json)
        out.line("{" + setup.fixed_json + ", \"row\": " + std::to_string(i) + ", \"col\": " + std::to_string(j) + ", " +
                 result_json(out_format, v, flags[i * n + j]) + ", \"input_flags\": " + flags_json(input_flags) + "}");
      else
        row_text += (j ? std::string(" ") : std::string()) + shortest_decimal(out_format, v);
    }
    if (!json) out.line(row_text);
  }
  if (!json) out.line("flags " + flags_text(all_flags) + " (" + inputs_text(setup, {}, all_input_flags) + ")");
  return 0;
}


// `text` broken into lines of at most `width` columns at spaces, after `line` (what the
// first line starts with); the lines after the first start with `hang` spaces.
std::string wrapped(std::string_view text, std::string line = "", std::size_t hang = 0, std::size_t width = 88) {
  std::string out;
  bool words_on_line = false;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (words_on_line && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.assign(hang, ' ');
      words_on_line = false;
    }
    if (words_on_line) line += ' ';
    line += word;
    words_on_line = true;
    start = end + 1;
  }
  return out + line + "\n";
}

// A table's rows, one per name: `indent` spaces, the name in a column `name_width` wide,
// its help wrapped under itself at `width` columns. No newline after the last.
template <class T>
std::string table_rows(NameTable<T> table, std::size_t indent, std::size_t name_width, std::size_t width = 88) {
  std::string rows;
  for (const Named<T>& row : table) {
    std::string name = std::string(indent, ' ') + row.name;
    name.resize(std::max(name.size() + 1, indent + name_width), ' ');
    rows += wrapped(row.help, std::move(name), indent + name_width, width);
  }
  rows.pop_back();
  return rows;
}

// "a (default) b c": the table's names with the default marked.
template <class T>
std::string names_with_default(NameTable<T> table, const T& default_value) {
  std::string s;
  for (const Named<T>& row : table)
    s += (s.empty() ? "" : " ") + std::string(row.name) + (row.value == default_value ? " (default)" : "");
  return s;
}

// The block formats that b200's block-scaled MMA takes (as both operands), or those it
// refuses (block_mma_params says which).
std::string b200_block_formats(bool taken) {
  std::string s;
  for (const Named<const BlockFormat*>& row : block_format_table()) {
    bool takes = true;
    try {
      (void)block_mma_params(UnitKind::b200, *row.value, *row.value);
    } catch (const std::invalid_argument&) {
      takes = false;
    }
    if (takes == taken) s += (s.empty() ? "" : " ") + std::string(row.name);
  }
  return s;
}

// "  mi300x  A:B A:B", a line per unit that takes mixed inputs, with the pairs it takes.
std::string mixed_inputs() {
  std::string s;
  for (const Named<UnitKind>& row : unit_table()) {
    std::string pairs;
    for (const std::string& name : mixed_input_names(row.value)) pairs += " " + name;
    if (!pairs.empty()) s += (s.empty() ? "  " : "\n  ") + std::string(row.name) + " " + pairs;
  }
  return s;
}

// `text` with every @NAME@ replaced by its list from emu's tables.
std::string filled(std::string text) {
  const std::pair<const char*, std::string> lists[] = {
      {"@ROUNDINGS@", name_list(rounding_table())},
      {"@ROUNDING_CHOICES@", names_with_default(rounding_table(), FpControl{}.rounding)},
      {"@OVERFLOWS@", name_list(overflow_table(), "|")},
      {"@RNGS@", name_list(rng_kind_table(), "|")},
      {"@TININESS@", name_list(tininess_table(), "|")},
      // A unit's line stays whole (however long): grep UNIT finds all it says.
      {"@UNITS@", table_rows(unit_table(), 2, 14, std::string::npos)},
      {"@BLOCK_FORMATS@", table_rows(block_format_table(), 2, 12)},
      {"@SCALE_RULES@", table_rows(scale_rule_table(), 16, 8)},
      {"@B200_BLOCK_FORMATS@", b200_block_formats(true)},
      {"@B200_REFUSED_BLOCK_FORMATS@", b200_block_formats(false)},
      {"@MIXED_INPUTS@", mixed_inputs()},
  };
  for (const auto& [name, list] : lists)
    for (auto at = text.find(name); at != std::string::npos; at = text.find(name, at + list.size()))
      text.replace(at, std::string_view(name).size(), list);
  return text;
}

std::string main_help() {
  return kMainHelp + wrapped("Formats: " + format_list_text() + ".") +
         wrapped("Block formats (emu quantize; emu dot and gemm --unit b200 but " + b200_block_formats(false) +
                 "): " + name_list(block_format_table()) + ".") +
         filled(kMainHelpTail);
}

}  // namespace

const char* help_text(const std::string& command) {
  static const std::string main_text = main_help();
  static const std::string round_text = filled(kRoundHelp), eval_text = filled(kEvalHelp),
                           dot_text = filled(kDotHelp), gemm_text = filled(kGemmHelp),
                           quantize_text = filled(kQuantizeHelp);
  if (command.empty()) return main_text.c_str();
  if (command == "info") return kInfoHelp;
  if (command == "round") return round_text.c_str();
  if (command == "eval") return eval_text.c_str();
  if (command == "dot") return dot_text.c_str();
  if (command == "gemm") return gemm_text.c_str();
  if (command == "quantize") return quantize_text.c_str();
  return nullptr;
}

int run_command(const std::string& command, const std::vector<std::string>& args, Output& out) {
  if (command == "info") return info(args, out);
  if (command == "round") return round_values(args, out);
  if (command == "eval") return eval(args, out);
  if (command == "dot") return dot(args, out);
  if (command == "gemm") return gemm(args, out);
  if (command == "quantize") return quantize_values(args, out);
  throw UsageError("emu: unknown subcommand '" + command + "'");
}

}  // namespace emu::cli
