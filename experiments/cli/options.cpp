#include "options.hpp"

#include <cstdlib>

namespace emu::cli {

std::optional<std::string> ParsedOptions::get(std::string_view name) const {
  const auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

ParsedOptions parse_options(std::string_view command, const std::vector<std::string>& args,
                            const std::vector<OptionSpec>& known) {
  ParsedOptions out;
  const std::string where = "emu " + std::string(command) + ": ";
  bool options_ended = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_ended || arg.size() < 2 || arg.compare(0, 2, "--") != 0) {
      out.positionals.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_ended = true;
      continue;
    }
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpec* spec = nullptr;
    for (const auto& k : known)
      if (k.name == name) spec = &k;
    if (spec == nullptr) {
      std::string list;
      for (const auto& k : known) {
        if (!list.empty()) list += ' ';
        list += k.name;
      }
      throw UsageError(where + "unknown option '" + name + "' (known: " + list + ")");
    }
    if (out.has(name)) throw UsageError(where + "option " + name + " given twice");
    std::string value;
    if (spec->takes_value) {
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
      } else {
        if (i + 1 == args.size()) throw UsageError(where + "option " + name + " needs a value");
        value = args[++i];
      }
    } else if (eq != std::string::npos) {
      throw UsageError(where + "option " + name + " takes no value");
    }
    out.values.emplace(name, std::move(value));
  }
  return out;
}

namespace {

bool on_off(std::string_view option, const std::string& value) {
  if (value == "on") return true;
  if (value == "off") return false;
  throw UsageError(std::string(option) + ": expected on or off, got '" + value + "'");
}

}  // namespace

std::uint64_t integer_option(std::string_view option, const std::string& value, std::uint64_t lo, std::uint64_t hi) {
  const bool digits_only = !value.empty() && value.size() <= 20 &&
                           value.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  const unsigned long long v = digits_only ? std::strtoull(value.c_str(), nullptr, 10) : 0;
  if (!digits_only || errno == ERANGE || v < lo || v > hi) integer_out_of_range(option, lo, hi, value);
  return v;
}

void integer_out_of_range(std::string_view option, std::uint64_t lo, std::uint64_t hi, const std::string& text) {
  throw UsageError(std::string(option) + ": expected an integer from " + std::to_string(lo) + " to " +
                   std::to_string(hi) + ", got '" + text + "'");
}

Format format_named(std::string_view option, const std::string& name) {
  try {
    return format_by_name(name);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(option) + ": " + e.what());
  }
}

Format format_option(const ParsedOptions& o, std::string_view option) {
  const auto name = o.get(option);
  if (!name) throw UsageError(std::string(option) + " is required (e.g. " + std::string(option) + " fp16)");
  Format f = format_named(option, *name);
  if (const auto s = o.get("--subnormals")) f = f.with_subnormals(on_off("--subnormals", *s));
  return f;
}

std::string rounding_from(const ParsedOptions& o) { return o.get("--rounding").value_or("rne"); }

Flags trap_flags(const std::string& list) {
  Flags flags = 0;
  std::size_t start = 0;
  while (true) {
    const auto comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      flags |= flag_by_name(name);
    } catch (const std::invalid_argument&) {
      throw UsageError("--trap: unknown flag '" + name + "' in '" + list +
                       "' (a comma-separated list of oflo div0 inv uflo inexact)");
    }
    if (comma == std::string::npos) return flags;
    start = comma + 1;
  }
}

RoundingOptions rounding_options_from(const ParsedOptions& o) {
  RoundingOptions r;
  r.rounding = option_value("--rounding", [&] { return rounding_by_name(rounding_from(o)); });
  if (const auto v = o.get("--overflow")) r.overflow = option_value("--overflow", [&] { return overflow_by_name(*v); });
  if (const auto v = o.get("--sr-bits")) r.sr_bits = static_cast<int>(integer_option("--sr-bits", *v, 0, 64));
  if (const auto v = o.get("--tininess")) r.tininess = option_value("--tininess", [&] { return tininess_by_name(*v); });
  if (const auto v = o.get("--trap")) r.traps = trap_flags(*v);
  if (const auto v = o.get("--rng")) r.rng = option_value("--rng", [&] { return rng_kind_by_name(*v); });
  if (const auto v = o.get("--seed")) {
    // The hardware's $PRNG_SEED is 32 bits.
    r.seed = r.rng == RngKind::ipu ? integer_option("--seed (with --rng ipu)", *v, 0, 0xFFFFFFFFu)
                                   : integer_option("--seed", *v, 0, ~std::uint64_t{0});
  }
  return r;
}

Context make_context(const RoundingOptions& r) {
  FpControl control;
  control.rounding = r.rounding;
  control.overflow = r.overflow;
  control.sr_bits = r.sr_bits;
  control.tininess = r.tininess;
  control.traps = r.traps;
  // S is expanded exactly as the IPU expands its $PRNG_SEED.
  if (r.rng == RngKind::ipu) return Context(control, Rng::ipu_from_prng_seed(static_cast<std::uint32_t>(r.seed)));
  StreamId stream;
  stream.seed = r.seed;
  return Context(control, Rng(stream, r.rng));
}

Context context_from(const ParsedOptions& o) { return make_context(rounding_options_from(o)); }

std::vector<OptionSpec> rounding_options() {
  return {{"--rounding", true}, {"--seed", true},     {"--sr-bits", true}, {"--overflow", true},
          {"--rng", true},      {"--tininess", true}, {"--json", false},   {"--help", false}};
}

}  // namespace emu::cli
