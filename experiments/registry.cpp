#include <algorithm>
#include <cstdio>

#include "emu/block.hpp"
#include "emu/format.hpp"
#include "emu/unit.hpp"
#include "emu/unit_request.hpp"
#include "experiment.hpp"

namespace roundoff {

const char* param_type_name(ParamType t) {
  switch (t) {
    case ParamType::integer: return "int";
    case ParamType::real: return "float";
    case ParamType::string: return "string";
    case ParamType::boolean: return "bool";
  }
  return "?";
}

std::string to_string(const ParamValue& v) {
  struct Visitor {
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", d);
      // shortest form that reads back to the same double
      for (int prec = 1; prec <= 17; ++prec) {
        char trial[32];
        std::snprintf(trial, sizeof trial, "%.*g", prec, d);
        if (std::strtod(trial, nullptr) == d) return trial;
      }
      return buf;
    }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
  };
  return std::visit(Visitor{}, v);
}

namespace {

template <typename T>
const T& get_as(const std::map<std::string, ParamValue>& values, const std::string& name) {
  const auto it = values.find(name);
  if (it == values.end()) throw std::logic_error("no parameter '" + name + "'");
  const T* p = std::get_if<T>(&it->second);
  if (!p) throw std::logic_error("parameter '" + name + "' has another type");
  return *p;
}

std::vector<Experiment>& mutable_registry() {
  static std::vector<Experiment> registry;
  return registry;
}

std::string check_with(const ParamValue& v, void (*parse)(const std::string&)) {
  const std::string* s = std::get_if<std::string>(&v);
  if (!s) return "expected a string";
  try {
    parse(*s);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

ParamSpec int_param(std::string name, std::int64_t default_value, std::string meaning, std::optional<double> min,
                    std::optional<double> max) {
  return ParamSpec{std::move(name), ParamType::integer, default_value, std::move(meaning), {}, min, max, {}};
}
ParamSpec real_param(std::string name, double default_value, std::string meaning, std::optional<double> min,
                     std::optional<double> max) {
  return ParamSpec{std::move(name), ParamType::real, default_value, std::move(meaning), {}, min, max, {}};
}
ParamSpec string_param(std::string name, std::string default_value, std::string meaning,
                       std::vector<std::string> allowed, std::function<std::string(const ParamValue&)> check) {
  return ParamSpec{std::move(name), ParamType::string, std::move(default_value), std::move(meaning),
                   std::move(allowed), {}, {}, std::move(check)};
}
ParamSpec bool_param(std::string name, bool default_value, std::string meaning) {
  return ParamSpec{std::move(name), ParamType::boolean, default_value, std::move(meaning), {}, {}, {}, {}};
}

std::int64_t Params::integer(const std::string& name) const { return get_as<std::int64_t>(values_, name); }
const std::string& Params::string(const std::string& name) const { return get_as<std::string>(values_, name); }
bool Params::boolean(const std::string& name) const { return get_as<bool>(values_, name); }
double Params::real(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return get_as<double>(values_, name);
}
std::size_t Params::index_in(const std::string& name, const char* const* names, std::size_t count) const {
  const std::string& value = string(name);
  for (std::size_t i = 0; i < count; ++i)
    if (value == names[i]) return i;
  throw std::logic_error("parameter '" + name + "' is '" + value + "', not one of its declared names");
}
const ParamValue& Params::at(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw std::logic_error("no parameter '" + name + "'");
  return it->second;
}

const std::vector<Experiment>& experiments() { return mutable_registry(); }

const Experiment* find_experiment(const std::string& name) {
  for (const Experiment& e : mutable_registry())
    if (e.name == name) return &e;
  return nullptr;
}

Registration::Registration(Experiment e) { mutable_registry().push_back(std::move(e)); }

bool takes_fp_exceptions(const Experiment& e) {
  return std::any_of(e.params.begin(), e.params.end(), [](const ParamSpec& p) { return p.name == "fp_exceptions"; });
}

std::vector<ParamSpec> fp_exception_params() {
  return {
      string_param("fp_exceptions", "off",
                   "floating-point exceptions: off (sticky flags only), count (per scope and op, the run "
                   "goes on) or trap (the first enabled exception ends the run, recorded in /traps)",
                   {"off", "count", "trap"}),
      bool_param("oflo", true, "fp_exceptions counts or traps overflow (the IPU's $FP_CTL.OFLO)"),
      bool_param("div0", true, "fp_exceptions counts or traps division by zero ($FP_CTL.DIV0)"),
      bool_param("inv", true, "fp_exceptions counts or traps invalid operations ($FP_CTL.INV)"),
      bool_param("nanoo", false,
                 "true: an overflow gives NaN and raises INV (the IPU's $FP_CTL.NANOO); false: the "
                 "experiment's own overflow policy"),
      string_param("tininess", "before",
                   "when a result counts as tiny (UFLO, and flushing with subnormals off): before rounding "
                   "(Arm, the default) or after rounding (x86, SoftFloat)",
                   {"before", "after"}),
  };
}

emu::FpControl with_fp_exceptions(emu::FpControl control, const Params& p) {
  emu::Flags enabled = 0;
  if (p.boolean("oflo")) enabled |= emu::OFLO;
  if (p.boolean("div0")) enabled |= emu::DIV0;
  if (p.boolean("inv")) enabled |= emu::INV;
  switch (emu::exception_mode_by_name(p.string("fp_exceptions"))) {
    case emu::ExceptionMode::off: break;
    case emu::ExceptionMode::count: control.counted |= enabled; break;
    case emu::ExceptionMode::trap: control.traps |= enabled; break;
  }
  if (p.boolean("nanoo")) control.overflow = emu::Overflow::nan;
  control.tininess = emu::tininess_by_name(p.string("tininess"));
  return control;
}

std::uint32_t stable_hash32(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

std::string check_format_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::format_by_name(s); });
}
std::string check_rounding_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::rounding_by_name(s); });
}
std::string check_unit_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::unit_kind_by_name(s); });
}
std::string check_block_format_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::block_format_by_name(s); });
}
std::string check_operand_format_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::operand_format_by_name(s); });
}
std::string check_unit_input_name(const ParamValue& v) {
  return check_with(v, [](const std::string& s) { (void)emu::unit_input_by_name(s); });
}

}  // namespace roundoff
