#include "op_counts.hpp"

#include <algorithm>

namespace roundoff {

void merge_counts(std::vector<emu::OpCount>& into, const std::vector<emu::OpCount>& from) {
  for (const emu::OpCount& c : from) {
    auto same = [&](const emu::OpCount& o) { return o.scope == c.scope && o.op == c.op && o.flag == c.flag; };
    const auto it = std::find_if(into.begin(), into.end(), same);
    if (it == into.end()) into.push_back(c);
    else it->count += c.count;
  }
}

}  // namespace roundoff
