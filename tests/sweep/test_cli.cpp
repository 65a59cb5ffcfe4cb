// The real build/sweep binary (path in $SWEEP) with the `swamping` experiment: malformed
// configs (exit 2, one line FILE:LINE:COLUMN: key: message), determinism across -j,
// SIGINT and --resume, and the rules for existing outputs.
#include <catch2/catch.hpp>

#include <poll.h>
#include <pty.h>
#include <signal.h>

#include <chrono>
#include <regex>

#include "support.hpp"

namespace {

using sweep_test::run_program;
using sweep_test::TempDir;
using sweep_test::write_file;

std::string sweep_binary() {
  const char* path = std::getenv("SWEEP");
  if (!path) FAIL("set SWEEP to the sweep program (meson test does)");
  return path;
}

struct BadConfig {
  const char* what;
  std::string yaml;
  int line;
  const char* expected;  // a piece of the message
};

const std::string kHead = "experiment: swamping\noutput: out.h5\n";  // lines 1-2

const BadConfig kBadConfigs[] = {
    {"YAML syntax error", kHead + "grid:\n  rounding: rne: sr\n", 4, "syntax error"},
    {"unknown experiment", "experiment: swampin\n", 1, "did you mean 'swamping'"},
    {"unknown top-level key", kHead + "replica: 3\n", 3, "did you mean 'replicas'"},
    {"unknown parameter", kHead + "grid:\n  formt: fp16\n", 4, "did you mean 'format'"},
    {"string for an int", kHead + "grid:\n  steps: ten\n", 4, "expected an integer"},
    {"float for an int", kHead + "grid:\n  steps: 1.5\n", 4, "expected an integer"},
    {"negative steps", kHead + "grid:\n  steps: -5\n", 4, "must be >= 1"},
    {"empty grid list", kHead + "grid:\n  format: []\n", 4, "empty list"},
    {"zip of unequal lengths", kHead + "zip:\n  format: [fp16, fp32]\n  rounding: [rne]\n", 5, "equal lengths"},
    {"unknown format", kHead + "grid:\n  format: [fp16, fp17]\n", 4, "fp17"},
    {"unknown rounding", kHead + "grid:\n  rounding: rnx\n", 4, "rnx"},
    {"grid over the run limit", kHead + "replicas: 100000\ngrid:\n  format: [fp16, fp32]\n  rounding: [rne, rna, rz, ru, rd, ro, sr]\n",
     4, "over the limit of 1000000 runs"},
    {"output in a missing directory", "experiment: swamping\noutput: no/such/dir/out.h5\n", 2, "does not exist"},
    {"replicas 0", kHead + "replicas: 0\n", 3, "must be >= 1"},
    {"negative seed", kHead + "seed: -1\n", 3, "must be >= 0"},
    {"seed over 2^64", kHead + "seed: 18446744073709551616\n", 3, "out of range"},
    {"duplicate key", kHead + "seed: 1\nseed: 2\n", 4, "duplicate key 'seed' (first at line 3)"},
    {"parameter in grid and zip", kHead + "grid:\n  format: [fp16]\nzip:\n  format: [fp16, fp32]\n  rounding: [rne, sr]\n", 6,
     "also in grid"},
    {"quoted number", kHead + "grid:\n  addend: \"1e-4\"\n", 4, "expected a float"},
    {"yes for a bool", kHead + "grid:\n  subnormals: yes\n", 4, "expected true or false"},
    {"value not allowed", kHead + "grid:\n  overflow: saturat\n", 4, "did you mean 'saturate'"},
    {"cross-parameter check", kHead + "grid:\n  steps: 100\n  trace_every: [10, 200]\n", 3, "trace_every must not exceed steps"},
    {"missing experiment", "seed: 1\n", 1, "experiment: missing"},
    {"empty file", "", 1, "expected a mapping"},
    {"zip value not a list", kHead + "zip:\n  format: fp16\n", 4, "must be lists"},
    {"foreign YAML tag", kHead + "grid:\n  steps: !!python/object 3\n", 4, "unsupported YAML tag"},
    {"integer out of range", kHead + "grid:\n  steps: 99999999999999999999\n", 4, "out of range"},
    {"sr_bits over its maximum", kHead + "grid:\n  sr_bits: 65\n", 4, "must be <= 64"},
    {"grid not a mapping", kHead + "grid: [fp16]\n", 3, "expected a mapping"},
    {"null value", kHead + "grid:\n  addend:\n", 4, "expected a float, got null"},
};

}  // namespace

TEST_CASE("malformed configs exit 2 with one line naming file, line, column and key", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "results");
  for (const BadConfig& bad : kBadConfigs) {
    INFO(bad.what << "\n--- config ---\n" << bad.yaml);
    write_file(dir / "case.yaml", bad.yaml);
    const auto result = run_program(sweep, {"case.yaml", "--quiet"}, dir.path().string());
    INFO("stderr: " << result.err);
    CHECK(result.status == 2);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(std::regex_search(result.err, std::regex("^case\\.yaml:" + std::to_string(bad.line) + ":[0-9]+: [^ ]+: ")));
    CHECK(result.err.find(bad.expected) != std::string::npos);
    CHECK(result.out.empty());
    CHECK_FALSE(std::filesystem::exists(dir / "out.h5"));
  }
}

TEST_CASE("bad arguments exit 2 with one line", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "ok.yaml", kHead);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ok.yaml", "-j", "0"}, {"ok.yaml", "--frce"}, {"missing.yaml"}, {},
        {"--describe", "swampin"}, {"ok.yaml", "-o", "no/dir/x.h5"}, {"ok.yaml", "--force", "--resume"}}) {
    const auto result = run_program(sweep, args, dir.path().string());
    INFO("stderr: " << result.err);
    CHECK(result.status == 2);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
  }
}

TEST_CASE("--list, --describe, --dry-run", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  const auto list = run_program(sweep, {"--list"}, dir.path().string());
  CHECK(list.status == 0);
  CHECK(list.out.find("swamping") != std::string::npos);
  const auto describe = run_program(sweep, {"--describe", "swamping"}, dir.path().string());
  CHECK(describe.status == 0);
  for (const char* word : {"format", "rounding", "addend", "trace_every", "final", "stagnation_step"})
    CHECK(describe.out.find(word) != std::string::npos);
  write_file(dir / "dry.yaml", kHead + "replicas: 3\ngrid:\n  format: [fp16, fp32]\n  rounding: [rne, sr, rz]\n");
  const auto dry = run_program(sweep, {"dry.yaml", "--dry-run"}, dir.path().string());
  CHECK(dry.status == 0);
  CHECK(dry.out.find("6 points x 3 replicas = 18 runs") != std::string::npos);
  CHECK(dry.out.find("output: out.h5") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "out.h5"));
}

TEST_CASE("swamping with -j1 and -j2 gives identical files", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "s.yaml", "experiment: swamping\nseed: 5\nreplicas: 6\ngrid:\n  format: [fp16, bf16]\n"
                             "  rounding: [rne, sr]\n  steps: 3000\n  trace_every: 100\n");
  REQUIRE(run_program(sweep, {"s.yaml", "-j", "1", "-o", "one.h5"}, dir.path().string()).status == 0);
  const auto two = run_program(sweep, {"s.yaml", "-j", "2", "-o", "two.h5"}, dir.path().string());
  REQUIRE(two.status == 0);
  CHECK(two.out.find("output: two.h5") != std::string::npos);
  CHECK(sweep_test::first_difference(dir / "one.h5", dir / "two.h5") == "");
  CHECK(sweep_test::dataset_shape(dir / "one.h5", "traces/x") == std::vector<hsize_t>{4, 6, 31});
}

TEST_CASE("SIGINT saves finished points (exit 130); --resume ends identical to an uninterrupted run", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  // 40 points x 2 replicas of 100,000 additions: a few seconds, long enough to interrupt.
  write_file(dir / "long.yaml", "experiment: swamping\nseed: 9\nreplicas: 2\noutput: long.h5\ngrid:\n"
                                "  rounding: [rne, sr]\n  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]\n"
                                "  steps: 100000\n  trace_every: 5000\n");

  // On a terminal sweep draws "N/40 points"; wait for a few, then interrupt.
  int terminal = -1;
  const pid_t child = forkpty(&terminal, nullptr, nullptr, nullptr);
  REQUIRE(child >= 0);
  if (child == 0) {
    if (chdir(dir.path().c_str()) != 0) _exit(127);
    execl(sweep.c_str(), sweep.c_str(), "long.yaml", "-j", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string screen;
  bool some_done = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(50);
  const std::regex progress("\\s([0-9]+)/40 points");
  while (!some_done && std::chrono::steady_clock::now() < deadline) {
    pollfd fd{terminal, POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(terminal, buf, sizeof buf);
    if (n <= 0) break;
    screen.append(buf, static_cast<std::size_t>(n));
    for (auto it = std::sregex_iterator(screen.begin(), screen.end(), progress); it != std::sregex_iterator(); ++it)
      some_done = some_done || std::stoi((*it)[1]) >= 3;
  }
  INFO("terminal: " << screen);
  kill(child, SIGINT);
  // Drain the terminal so the child never blocks writing to it.
  for (pollfd fd{terminal, POLLIN, 0}; poll(&fd, 1, 2000) > 0;) {
    char buf[512];
    if (read(terminal, buf, sizeof buf) <= 0) break;
  }
  int raw = 0;
  waitpid(child, &raw, 0);
  close(terminal);
  REQUIRE(some_done);
  REQUIRE(WIFEXITED(raw));
  REQUIRE(WEXITSTATUS(raw) == 130);
  const std::string out = dir / "long.h5";
  CHECK(sweep_test::string_attribute(out, "/", "status") == "partial");
  const auto done = sweep_test::read_dataset<std::uint8_t>(out, "done");
  const auto n_done = std::count(done.begin(), done.end(), 1);
  CHECK(n_done >= 3);
  CHECK(n_done < 40);

  const std::string partial = sweep_test::read_file(out);
  const auto again = run_program(sweep, {"long.yaml"}, dir.path().string());
  CHECK(again.status == 2);  // partial without --resume: a hint, file untouched
  CHECK(again.err.find("--resume") != std::string::npos);
  CHECK(sweep_test::read_file(out) == partial);

  REQUIRE(run_program(sweep, {"long.yaml", "--resume", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::string_attribute(out, "/", "status") == "complete");
  REQUIRE(run_program(sweep, {"long.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::first_difference(out, dir / "reference.h5") == "");
}

TEST_CASE("existing outputs: other files untouched, own complete output reported", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "a.yaml", "experiment: swamping\noutput: a.h5\ngrid:\n  steps: 100\n");
  write_file(dir / "b.yaml", "experiment: swamping\noutput: a.h5\ngrid:\n  steps: 200\n");

  write_file(dir / "a.h5", "precious notes\n");
  auto refused = run_program(sweep, {"a.yaml"}, dir.path().string());
  CHECK(refused.status == 2);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(sweep_test::read_file(dir / "a.h5") == "precious notes\n");
  std::filesystem::remove(dir / "a.h5");

  REQUIRE(run_program(sweep, {"a.yaml"}, dir.path().string()).status == 0);
  const std::string complete = sweep_test::read_file(dir / "a.h5");
  const auto rerun = run_program(sweep, {"a.yaml"}, dir.path().string());
  CHECK(rerun.status == 0);
  CHECK(rerun.err.find("already complete") != std::string::npos);
  CHECK(rerun.out.find("output: a.h5") != std::string::npos);
  CHECK(sweep_test::read_file(dir / "a.h5") == complete);

  refused = run_program(sweep, {"b.yaml"}, dir.path().string());  // another config's output
  CHECK(refused.status == 2);
  CHECK(refused.err.find("another config") != std::string::npos);
  CHECK(sweep_test::read_file(dir / "a.h5") == complete);
  CHECK(run_program(sweep, {"b.yaml", "--resume"}, dir.path().string()).status == 2);
  CHECK(sweep_test::read_file(dir / "a.h5") == complete);
  CHECK(run_program(sweep, {"b.yaml", "--force", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::read_dataset<std::int64_t>(dir / "a.h5", "points/steps") == std::vector<std::int64_t>{200});
}
