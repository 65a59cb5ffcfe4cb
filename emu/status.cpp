#include "status.hpp"

#include <cctype>
#include <cstdio>
#include <string>

namespace emu {

const char* flag_name(Flag f) {
  switch (f) {
    case OFLO: return "OFLO";
    case DIV0: return "DIV0";
    case INV: return "INV";
    case UFLO: return "UFLO";
    case INEXACT: return "INEXACT";
  }
  return "?";
}

Flag flag_by_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (Flag f : kAllFlags)
    if (upper == flag_name(f)) return f;
  throw std::invalid_argument("unknown flag '" + std::string(name) + "' (known: OFLO DIV0 INV UFLO INEXACT)");
}

std::vector<std::string> flag_names(Flags flags) {
  std::vector<std::string> names;
  for (Flag f : kAllFlags)
    if (flags & f) names.emplace_back(flag_name(f));
  return names;
}

namespace {

template <typename E, std::size_t N>
E by_name(std::string_view name, const char* const (&names)[N], const char* what) {
  for (std::size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  std::string known;
  for (const char* n : names) known += std::string(known.empty() ? "" : " ") + n;
  throw std::invalid_argument("unknown " + std::string(what) + " '" + std::string(name) +
                              "' (known: " + known + ")");
}

// Indexed by the enums' values.
const char* const kRoundingNames[] = {"rne", "rna", "rz", "ru", "rd", "ro", "sr"};
const char* const kOverflowNames[] = {"inf", "saturate", "nan"};
const char* const kRngNames[] = {"philox", "ipu"};
const char* const kTininessNames[] = {"before", "after"};
const char* const kExceptionModeNames[] = {"off", "count", "trap"};

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

const char* rounding_name(Rounding r) { return kRoundingNames[static_cast<int>(r)]; }
Rounding rounding_by_name(std::string_view name) {
  return by_name<Rounding>(name, kRoundingNames, "rounding mode");
}
const char* overflow_name(Overflow o) { return kOverflowNames[static_cast<int>(o)]; }
Overflow overflow_by_name(std::string_view name) {
  return by_name<Overflow>(name, kOverflowNames, "overflow policy");
}
const char* rng_kind_name(RngKind k) { return kRngNames[static_cast<int>(k)]; }
RngKind rng_kind_by_name(std::string_view name) { return by_name<RngKind>(name, kRngNames, "rng"); }
const char* tininess_name(Tininess t) { return kTininessNames[static_cast<int>(t)]; }
Tininess tininess_by_name(std::string_view name) { return by_name<Tininess>(name, kTininessNames, "tininess"); }
const char* exception_mode_name(ExceptionMode m) { return kExceptionModeNames[static_cast<int>(m)]; }
ExceptionMode exception_mode_by_name(std::string_view name) {
  return by_name<ExceptionMode>(name, kExceptionModeNames, "fp_exceptions mode");
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
