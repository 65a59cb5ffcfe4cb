// For tests that compute one thing two ways (a unit's fast gemm and its elements one by
// one): the per-(scope, op, flag) counts and the trap reports must agree field by field,
// values bit for bit (NaN payloads aside).
#pragma once

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "emu/arith.hpp"

namespace fp_counts {

inline bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

inline bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_value(a[i], b[i])) return false;
  return true;
}

inline void check_same_counts(const std::vector<emu::OpCount>& got, const std::vector<emu::OpCount>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const emu::OpCount &g = got[i], &w = want[i];
    INFO("count " << i << ": " << w.scope << " " << w.op << " " << emu::flag_name(w.flag) << " x" << w.count
                  << " first at " << w.first_element.to_string() << "; got " << g.scope << " " << g.op << " "
                  << emu::flag_name(g.flag) << " x" << g.count << " first at " << g.first_element.to_string());
    CHECK(g.scope == w.scope);
    CHECK(g.op == w.op);
    CHECK(g.flag == w.flag);
    CHECK(g.count == w.count);
    CHECK(g.first_element == w.first_element);
    CHECK(same_values(g.first_operands, w.first_operands));
    CHECK(same_value(g.first_result, w.first_result));
  }
}

inline void check_same_report(const emu::TrapReport& got, const emu::TrapReport& want) {
  INFO("trap " << emu::flag_name(want.flag) << " in " << want.op << " at " << want.element.to_string() << "; got "
               << emu::flag_name(got.flag) << " in " << got.op << " at " << got.element.to_string());
  CHECK(got.flag == want.flag);
  CHECK(got.scope == want.scope);
  CHECK(got.op == want.op);
  CHECK(got.element == want.element);
  CHECK(same_values(got.operands, want.operands));
  CHECK(same_value(got.result, want.result));
  CHECK(got.status == want.status);
}

// Element (i, j) of an m x n output, as gemm reports it.
inline emu::ElementGuard gemm_element(emu::Context& ctx, std::size_t i, std::size_t j, std::size_t n) {
  return emu::ElementGuard(ctx, static_cast<std::int64_t>(i * n + j),
                           {static_cast<std::int64_t>(i), static_cast<std::int64_t>(j)});
}

}  // namespace fp_counts
