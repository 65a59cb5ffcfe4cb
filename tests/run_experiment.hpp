// Runs a registered experiment in-process with every parameter at its default except
// the ones given, as the sweep runner would after validation. Shared by the tests of
// every experiment.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

#include "experiments/experiment.hpp"

namespace roundoff::testing {

inline Params params_with(const Experiment& e, const std::map<std::string, ParamValue>& overrides) {
  std::map<std::string, ParamValue> values;
  for (const ParamSpec& spec : e.params) values[spec.name] = spec.default_value;
  for (const auto& [name, value] : overrides) {
    if (!values.count(name)) throw std::logic_error("experiment " + e.name + " has no parameter " + name);
    values[name] = value;
  }
  return Params(std::move(values));
}

inline RunResult run_experiment(const std::string& name, const std::map<std::string, ParamValue>& overrides,
                                emu::StreamId stream = emu::StreamId{1, 0, 0, 0}) {
  const Experiment* e = find_experiment(name);
  if (!e) throw std::logic_error("no experiment " + name);
  const Params p = params_with(*e, overrides);
  if (e->check_point) {
    const std::string problem = e->check_point(p);
    if (!problem.empty()) throw std::invalid_argument(problem);
  }
  return e->run(p, RunEnv{stream});
}

}  // namespace roundoff::testing
