// A check the experiments' tests share, through the real sweep program ($SWEEP, with the
// source tree at $ROUNDOFF_ROOT; meson test sets both).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "tests/sweep/support.hpp"

namespace experiments_test {

// Runs the YAML text `config` in `dir` with -j 1 (one.h5) and -j 2 (two.h5) and checks
// that the files are identical (results never depend on the threads), then that the
// shipped config configs/`shipped` plans (--dry-run exits 0).
inline void check_threads_agree_and_shipped_config_plans(const sweep_test::TempDir& dir, const std::string& config,
                                                         const std::string& shipped) {
  const char* sweep = std::getenv("SWEEP");
  const char* root = std::getenv("ROUNDOFF_ROOT");
  if (!sweep || !root) FAIL("set SWEEP and ROUNDOFF_ROOT (meson test does)");
  sweep_test::write_file(dir / "config.yaml", config);
  for (const char* threads : {"1", "2"}) {
    const std::string out = std::string(threads) == "1" ? "one.h5" : "two.h5";
    const auto run = sweep_test::run_program(sweep, {"config.yaml", "-j", threads, "-o", out, "--quiet"},
                                             dir.path().string());
    INFO(run.out << run.err);
    REQUIRE(run.status == 0);
  }
  CHECK(sweep_test::first_difference(dir / "one.h5", dir / "two.h5") == "");
  const auto dry = sweep_test::run_program(
      sweep, {std::string(root) + "/configs/" + shipped, "--dry-run", "-o", dir / "dry.h5"}, dir.path().string());
  INFO(dry.out << dry.err);
  CHECK(dry.status == 0);
}

}  // namespace experiments_test
