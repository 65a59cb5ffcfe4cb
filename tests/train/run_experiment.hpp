// Runs a registered experiment in-process with its defaults overridden.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

#include "experiments/experiment.hpp"

namespace roundoff::test {

inline RunResult run_experiment(const std::string& name, const std::map<std::string, ParamValue>& overrides,
                                std::uint64_t seed = 1, std::uint32_t point = 0) {
  const Experiment* e = find_experiment(name);
  if (!e) throw std::logic_error("no experiment " + name);
  std::map<std::string, ParamValue> values;
  for (const ParamSpec& s : e->params) values[s.name] = s.default_value;
  for (const auto& [k, v] : overrides) {
    if (!values.count(k)) throw std::logic_error("no parameter " + k);
    values[k] = v;
  }
  RunEnv env;
  env.stream = emu::StreamId{seed, point, 0, 0};
  return e->run(Params(values), env);
}

}  // namespace roundoff::test
