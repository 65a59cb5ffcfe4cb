// A sweep config (YAML) turned into a validated plan: the experiment, the expanded grid
// of typed parameter points, seed, replicas and output path. Everything is checked here,
// before anything runs; a problem is reported as FILE:LINE:COLUMN: key.path: message.
// The schema is documented in configs/README.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "experiments/experiment.hpp"
#include "shard.hpp"

namespace roundoff::sweep {

// The most runs (grid points x replicas) one config may ask for.
inline constexpr std::uint64_t kMaxRuns = 1'000'000;
// The most trace samples one run may record (80 MB of float64), and the most trace values
// a whole config may record, points x replicas x samples per run: 2^28 float64 = 2 GiB.
// Checked before anything runs, for experiments that declare their trace_length.
inline constexpr std::uint64_t kMaxTraceSamplesPerRun = 10'000'000;
inline constexpr std::uint64_t kMaxTraceValues = std::uint64_t{1} << 28;

// The experiment name of a config whose `run:` names a Python callable
// (python_experiment.hpp).
inline constexpr const char* kPythonExperiment = "python";

// Bad input: a config problem (with its place in the file) or a bad argument.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// line and column are 1-based.
InputError config_error(const std::string& file, int line, int column, const std::string& key_path,
                        const std::string& message);

struct SweepPlan {
  std::string config_path;
  std::string config_text;  // verbatim
  const Experiment* experiment = nullptr;
  // experiment: python: the experiment the callable declares (with its worker processes);
  // `experiment` points to it.
  std::shared_ptr<const Experiment> python_experiment;
  std::string description;
  std::uint64_t seed = 0;
  std::uint32_t replicas = 1;
  std::string output;           // as given (relative paths are relative to the cwd)
  std::vector<Params> points;   // in grid order: grid keys in config order, last fastest,
                                // then the zip lists as one axis varying fastest of all
  // Per point, the experiment's trace_length, worked out once while planning (it may read
  // a data file); empty for experiments that declare none.
  std::vector<std::int64_t> trace_lengths;
  // Set by `--shard K/N`: this run computes that shard's work items only (shard.hpp) and
  // its output says so in its root attributes.
  std::optional<Shard> shard;
};

// Parses and validates `config_text` (read from `config_path`). `output_override` is the
// -o argument, which replaces the config's `output` (that is still checked to be a path).
// `check_output_folder` false: the output's folder need not exist here (an MPI rank that
// computes but never writes the output).
SweepPlan parse_plan(const std::string& config_text, const std::string& config_path,
                     const std::optional<std::string>& output_override, bool check_output_folder = true);

// Reads the file (a problem reading it is "FILE: config: cannot read: OS reason"), then
// parse_plan.
SweepPlan load_plan(const std::string& config_path, const std::optional<std::string>& output_override,
                    bool check_output_folder = true);

// Levenshtein distance, for "did you mean".
std::size_t edit_distance(const std::string& a, const std::string& b);
// " (did you mean 'x'?)" for the closest candidate within a small distance, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace roundoff::sweep
