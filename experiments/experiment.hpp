// The experiment interface: an experiment is a pure function of typed parameters and a
// random stream, returning metrics, traces and the final FP status. It knows nothing of
// YAML, HDF5 or threads; the sweep runner and the registry connect it to those.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "emu/arith.hpp"
#include "emu/rng.hpp"
#include "emu/status.hpp"
#include "nn/op_counts.hpp"  // merge_counts

namespace roundoff {

enum class ParamType { integer, real, string, boolean };
const char* param_type_name(ParamType t);

using ParamValue = std::variant<std::int64_t, double, std::string, bool>;
std::string to_string(const ParamValue& v);

struct ParamSpec {
  std::string name;
  ParamType type;
  ParamValue default_value;
  std::string meaning;
  // For strings: the allowed spellings (empty = checked by `check` only, e.g. any
  // format name eXmY). For numbers: inclusive bounds.
  std::vector<std::string> allowed;
  std::optional<double> min, max;
  // Extra validation: returns an error message, or "" when the value is fine.
  std::function<std::string(const ParamValue&)> check;
  // Strings only: a plain YAML number is taken as its text (loss_scale: 128 means "128"),
  // for parameters whose spellings include numbers.
  bool numbers_as_text = false;
};

// The one way to declare a parameter (bounds inclusive; `allowed` lists the spellings a
// string may take, `check` validates what a list cannot, e.g. any format name).
ParamSpec int_param(std::string name, std::int64_t default_value, std::string meaning,
                    std::optional<double> min = {}, std::optional<double> max = {});
ParamSpec real_param(std::string name, double default_value, std::string meaning, std::optional<double> min = {},
                     std::optional<double> max = {});
ParamSpec string_param(std::string name, std::string default_value, std::string meaning,
                       std::vector<std::string> allowed = {},
                       std::function<std::string(const ParamValue&)> check = {});
ParamSpec bool_param(std::string name, bool default_value, std::string meaning);

// The spellings of a string parameter that names one of an enum's values: its table of
// names, in the enum's order (`allowed` of string_param; Params::choice reads it back).
template <std::size_t N>
std::vector<std::string> names_of(const char* const (&names)[N]) {
  return {std::begin(names), std::end(names)};
}

// Validated parameter values of one grid point, by name. Lookups of unknown names or of
// the wrong type are programming errors (std::logic_error): validation happened before.
class Params {
 public:
  Params() = default;
  explicit Params(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}
  std::int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;  // integers are accepted too
  const std::string& string(const std::string& name) const;
  bool boolean(const std::string& name) const;
  // A string parameter declared with allowed = names_of(names): the enum value at its
  // name's position in the table.
  template <typename Enum, std::size_t N>
  Enum choice(const std::string& name, const char* const (&names)[N]) const {
    return static_cast<Enum>(index_in(name, names, N));
  }
  const ParamValue& at(const std::string& name) const;
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  std::size_t index_in(const std::string& name, const char* const* names, std::size_t count) const;
  std::map<std::string, ParamValue> values_;
};

struct MetricSpec {
  std::string name;  // lower_snake_case, stable once shipped
  std::string meaning;
};

struct TraceSpec {
  std::string name;
  std::string meaning;
  std::string x_name = "step";  // what the x axis counts
};

struct Trace {
  std::vector<double> x;  // e.g. step indices; the same for every replica of a point
  std::vector<double> y;
};

struct RunResult {
  std::map<std::string, double> metrics;  // every MetricSpec name, NaN where undefined
  std::map<std::string, Trace> traces;    // the TraceSpecs this run recorded (may be none)
  emu::Flags flags = 0;                   // sticky FP status at the end of the run
  // fp_exceptions: count — the counted flags per (scope, op), in the order first raised
  // (the union over the run's contexts: merge_counts).
  std::vector<emu::OpCount> fp_counts;
  // fp_exceptions: trap — the report of the trap that ended the run (the runner sets it
  // when the experiment lets emu::FpException escape; metrics are then NaN).
  std::optional<emu::TrapReport> trap;
};

// Thrown by an experiment whose parameters name something unusable that validation
// could not see (a data file that changed or vanished after the sweep was planned): bad
// input, exit status 2, not a bug. Prefer catching such problems in check_point.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by an experiment that saw `cancel` set: the run is abandoned, not recorded.
struct Cancelled : std::runtime_error {
  Cancelled() : std::runtime_error("cancelled") {}
};

struct RunEnv {
  emu::StreamId stream;  // (seed, point, replica, lane 0); use other lanes for sub-streams
  const std::atomic<bool>* cancel = nullptr;  // long experiments poll it between steps
  bool cancelled() const { return cancel && cancel->load(std::memory_order_relaxed); }
};

struct Experiment {
  std::string name;
  std::string description;  // one line, for `sweep --list`
  std::vector<ParamSpec> params;
  std::vector<MetricSpec> metrics;
  std::string headline_metric;  // summarised in sweep's table
  std::vector<TraceSpec> traces;
  std::function<RunResult(const Params&, const RunEnv&)> run;
  // Checks across parameters of one point (e.g. trace_every <= steps); "" when fine.
  std::function<std::string(const Params&)> check_point;
  // Optional; experiments with traces should provide it: the most trace samples one run
  // at these params records, all its traces together (0 = none). The sweep checks the
  // total of a config against its trace limit before anything runs (configs/README.md),
  // and a run that records more than this is a bug (exit 1).
  std::function<std::int64_t(const Params&)> trace_length = {};
  // For `sweep --describe`. An experiment that declares fp_exception_params(): what the
  // scopes and elements of its counts and traps name. One that does not: why not.
  std::string fp_exceptions_note = {};
};

// Whether the experiment declares the fp_exceptions parameters (fp_exception_params()).
bool takes_fp_exceptions(const Experiment& e);

// All registered experiments, in registration order.
const std::vector<Experiment>& experiments();
const Experiment* find_experiment(const std::string& name);

// Registration from each experiment's own file, one way for all: a function
// `Experiment make_<name>()` that fills the fields by name, then
//     const Registration registration(make_<name>());
// (a named factory tests and tools can call; fields by name, not by position, so a new
// field of Experiment moves nothing).
struct Registration {
  explicit Registration(Experiment e);
};

// The floating-point exception parameters (the IPU's $FP_CTL enables), declared by every
// experiment that runs emulated arithmetic:
//   fp_exceptions  off | count | trap (default off)
//   oflo, div0, inv  which flags count or trap (default true each)
//   tininess       before (default) | after: when a result counts as tiny (emu/round.hpp)
//   nanoo          true: an overflow gives NaN and raises INV (the IPU's NaN-on-overflow);
//                  false (default): the experiment's own overflow policy
std::vector<ParamSpec> fp_exception_params();
// The control with the point's exception parameters applied: traps (trap) or counted
// (count) = the enabled flags; nanoo sets Overflow::nan; tininess sets FpControl::tininess.
emu::FpControl with_fp_exceptions(emu::FpControl control, const Params& p);

// FNV-1a, 64 bits, over the text, folded to 32 bits: stable across platforms and runs.
// For the point index of a common-random-numbers data stream (a hash of exactly the
// parameters the data depend on).
std::uint32_t stable_hash32(std::string_view text);

// Common validators for parameters that name emu things.
std::string check_format_name(const ParamValue& v);          // any format emu knows
std::string check_rounding_name(const ParamValue& v);        // rne rna rz ru rd ro sr
std::string check_unit_name(const ParamValue& v);            // a matrix unit emu knows
std::string check_block_format_name(const ParamValue& v);    // a block format (OCP MX, NVFP4: emu/block.hpp)
std::string check_operand_format_name(const ParamValue& v);  // a format or a block format (emu/unit_request.hpp)
std::string check_unit_input_name(const ParamValue& v);  // that, or A:B (mixed inputs; emu/unit_request.hpp)

}  // namespace roundoff
