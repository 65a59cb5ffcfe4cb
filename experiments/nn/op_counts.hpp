// Counted floating-point exceptions of several contexts, as one run's (a model trained
// with replicas and evaluated on its own contexts; an experiment with several contexts).
#pragma once

#include <vector>

#include "emu/status.hpp"

namespace roundoff {

// Adds the counts of one context to a run's (same (scope, op, flag): counts add, the
// first element stays the one already recorded).
void merge_counts(std::vector<emu::OpCount>& into, const std::vector<emu::OpCount>& from);

}  // namespace roundoff
