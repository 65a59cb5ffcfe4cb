#include "status.hpp"

#include <cctype>
#include <cstdio>
#include <string>

namespace emu {

namespace {

// In the enums' order (static_assert below): the *_name functions index them.
constexpr Named<Flag> kFlags[] = {
    {OFLO, "OFLO", "overflow: a finite result too large for the format"},
    {DIV0, "DIV0", "division of a finite non-zero value by zero"},
    {INV, "INV", "invalid operation: 0/0, inf - inf, 0 * inf, sqrt(-1), a NaN from overflow"},
    {UFLO, "UFLO", "underflow: a tiny inexact result (IEEE 754 7.5)"},
    {INEXACT, "INEXACT", "the result differs from the exact one"},
};
static_assert(std::size(kFlags) == std::size(kAllFlags));

constexpr Named<Rounding> kRoundings[] = {
    {Rounding::rne, "rne", "to nearest, ties to even (IEEE 754 default)"},
    {Rounding::rna, "rna", "to nearest, ties away from zero"},
    {Rounding::rz, "rz", "toward zero (truncation)"},
    {Rounding::ru, "ru", "toward +infinity"},
    {Rounding::rd, "rd", "toward -infinity"},
    {Rounding::ro, "ro", "to odd (von Neumann): inexact results get an odd last bit"},
    {Rounding::sr, "sr", "stochastic: up with probability proportional to the distance"},
};
static_assert(in_enum_order(kRoundings));

constexpr Named<Overflow> kOverflows[] = {
    {Overflow::inf, "inf", "IEEE 754: +-inf (or +-max where the rounding direction says so)"},
    {Overflow::saturate, "saturate", "+-max finite"},
    {Overflow::nan, "nan", "the IPU's NaN-on-overflow (NANOO): NaN, with INV"},
};
static_assert(in_enum_order(kOverflows));

constexpr Named<RngKind> kRngs[] = {
    {RngKind::philox, "philox", "Philox4x32-10 counter-based streams"},
    {RngKind::ipu, "ipu", "the IPU's xoroshiro128aox"},
};
static_assert(in_enum_order(kRngs));

constexpr Named<Tininess> kTininess[] = {
    {Tininess::before, "before", "tiny before rounding: |x| < min normal, as Arm"},
    {Tininess::after, "after", "tiny after rounding to the format's precision, as x86 and SoftFloat"},
};
static_assert(in_enum_order(kTininess));

constexpr Named<ExceptionMode> kExceptionModes[] = {
    {ExceptionMode::off, "off", "only the sticky flags"},
    {ExceptionMode::count, "count", "every enabled flag counted per (scope, op)"},
    {ExceptionMode::trap, "trap", "the first enabled flag stops the run with a trap report"},
};
static_assert(in_enum_order(kExceptionModes));

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

NameTable<Flag> flag_table() { return kFlags; }
const char* flag_name(Flag f) {
  for (const Named<Flag>& row : kFlags)
    if (row.value == f) return row.name;
  return "?";
}

Flag flag_by_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (const Named<Flag>* row = find_name(flag_table(), upper)) return row->value;
  throw_unknown_name("flag", name, name_list(flag_table()));
}

std::vector<std::string> flag_names(Flags flags) {
  std::vector<std::string> names;
  for (Flag f : kAllFlags)
    if (flags & f) names.emplace_back(flag_name(f));
  return names;
}

NameTable<Rounding> rounding_table() { return kRoundings; }
const char* rounding_name(Rounding r) { return kRoundings[static_cast<int>(r)].name; }
Rounding rounding_by_name(std::string_view name) { return value_by_name(rounding_table(), name, "rounding mode"); }

NameTable<Overflow> overflow_table() { return kOverflows; }
const char* overflow_name(Overflow o) { return kOverflows[static_cast<int>(o)].name; }
Overflow overflow_by_name(std::string_view name) { return value_by_name(overflow_table(), name, "overflow policy"); }

NameTable<RngKind> rng_kind_table() { return kRngs; }
const char* rng_kind_name(RngKind k) { return kRngs[static_cast<int>(k)].name; }
RngKind rng_kind_by_name(std::string_view name) { return value_by_name(rng_kind_table(), name, "rng"); }

NameTable<Tininess> tininess_table() { return kTininess; }
const char* tininess_name(Tininess t) { return kTininess[static_cast<int>(t)].name; }
Tininess tininess_by_name(std::string_view name) { return value_by_name(tininess_table(), name, "tininess"); }

NameTable<ExceptionMode> exception_mode_table() { return kExceptionModes; }
const char* exception_mode_name(ExceptionMode m) { return kExceptionModes[static_cast<int>(m)].name; }
ExceptionMode exception_mode_by_name(std::string_view name) {
  return value_by_name(exception_mode_table(), name, "fp_exceptions mode");
}

std::uint32_t fp_sts(Flags flags) {
  return ((flags & INV) ? 1u : 0u) | ((flags & DIV0) ? 2u : 0u) | ((flags & OFLO) ? 4u : 0u);
}

std::string Element::to_string() const {
  if (!known()) return "";
  std::string s = rank == 0 ? "#" : "[";
  if (rank == 0) return s.append(std::to_string(flat));
  for (int i = 0; i < rank; ++i) {
    if (i) s.append(", ");
    s.append(std::to_string(index[static_cast<std::size_t>(i)]));
  }
  return s.append("]");
}

FpException::FpException(TrapReport report)
    : std::runtime_error([&] {
        std::string msg = std::string("floating-point trap: ") + flag_name(report.flag) + " in ";
        if (!report.scope.empty()) msg += report.scope + ": ";
        msg += report.op + "(";
        for (std::size_t i = 0; i < report.operands.size(); ++i)
          msg += (i ? ", " : "") + format_double(report.operands[i]);
        msg += ")";
        if (report.element.known()) msg += " at element " + report.element.to_string();
        return msg + " = " + format_double(report.result);
      }()),
      report_(std::move(report)) {}

}  // namespace emu
