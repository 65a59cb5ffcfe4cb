#include "status.hpp"

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

FpException::FpException(Flag flag, std::string op, std::vector<double> operands)
    : std::runtime_error([&] {
        std::string msg = std::string("floating-point trap: ") + flag_name(flag) + " in " + op + "(";
        for (std::size_t i = 0; i < operands.size(); ++i)
{
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.17g", operands[i]);
          msg += (i ? ", " : "") + std::string(buf);
        }
        return msg + ")";
      }()),
      flag_(flag),
      op_(std::move(op)),
      operands_(std::move(operands)) {}

}  // namespace emu
