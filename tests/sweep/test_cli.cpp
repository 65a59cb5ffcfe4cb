// The real build/sweep binary (path in $SWEEP) with the `swamping` experiment: malformed
// configs and arguments (exit 2, one line FILE:LINE:COLUMN: key: message), determinism
// across -j, SIGINT and --resume, signals during startup, the rules for existing outputs
// (locked by another process, written by another build), the summary table, and the
// shipped configs/swamping.yaml (from $ROUNDOFF_ROOT) against the IPU tutorial.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/file.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <regex>
#include <set>
#include <thread>

#include "support.hpp"

namespace {

using sweep_test::run_program;
using sweep_test::TempDir;
using sweep_test::write_file;

std::string testing_args(const std::vector<std::string>& args) {
  std::string text;
  for (const std::string& a : args) text += (text.empty() ? "" : " ") + a;
  return text;
}

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
    // Syntax yaml-cpp itself lets through: quotes never closed, more than one document.
    {"double quote never closed", kHead + "description: \"unterminated\n", 3, "yaml: syntax error: quoted string not closed"},
    {"single quote never closed", kHead + "description: 'it''s\n", 3, "yaml: syntax error: quoted string not closed"},
    {"quote never closed after an escaped one", kHead + "description: \"a \\\" b\n", 3, "quoted string not closed"},
    {"a second document", kHead + "---\nseed: 1\n", 4, "yaml: syntax error: a second YAML document"},
    {"text after the document end", kHead + "...\ngarbage\n", 4, "a second YAML document"},
    {"an empty second document", kHead + "seed: 1\n---\n", 4, "a second YAML document"},
    // yaml-cpp 0.7's YAML::LoadAll loops, allocating without end, on these (fuzz_config).
    {"a comma where the document starts", ",\n" + kHead, 1, "yaml: syntax error: unexpected ','"},
    {"a comma after the document's marker", "--- ,\n" + kHead, 1, "yaml: syntax error: unexpected ','"},
    {"not UTF-8", kHead + "description: caf\xe9\n", 3, "yaml: not valid UTF-8"},
    {"overlong UTF-8", kHead + "description: \xc0\xaf\n", 3, "not valid UTF-8"},
    {"a NUL byte", kHead + std::string("description: a\0b\n", 17), 3, "U+0000 is not allowed"},
    {"aliases expanding", "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                          "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n",
     1, "aliases expand"},
    // Tags: only the core schema, on every node.
    {"python tag on a list", kHead + "grid:\n  format: !!python/object/apply:os.system [fp16]\n", 4, "unsupported YAML tag '!!python/object/apply:os.system'"},
    {"python tag on a mapping", kHead + "grid: !!python/object:foo {steps: 3}\n", 3, "unsupported YAML tag"},
    {"!!set", kHead + "grid: !!set {steps, format}\n", 3, "unsupported YAML tag '!!set'"},
    {"local tag on the description", kHead + "description: !foo bar\n", 3, "unsupported YAML tag '!foo'"},
    {"core tag that does not fit", kHead + "description: !!int bar\n", 3, "'bar' is not an integer"},
    {"tag on a key", kHead + "!!binary seed: 1\n", 3, "unsupported YAML tag '!!binary'"},
    // The config's own output is checked even when unused (see also the -o test below).
    {"output not a string", "experiment: swamping\noutput: 42\n", 2, "expected a string"},
    {"output a list", "experiment: swamping\noutput: [a.h5]\n", 2, "expected a single value, got a list"},
    // Trace limits (configs/README.md), before anything runs.
    {"one run's trace over the limit", kHead + "grid:\n  steps: 100000000\n  trace_every: 1\n", 3,
     "a run records 100000001 trace samples, over the limit of 10000000 per run"},
    {"a sweep's traces over the limit", kHead + "replicas: 200\ngrid:\n  steps: 10000000\n  trace_every: 5\n", 4,
     "over the limit of 268435456"},
    {"summation's trace over the limit", "experiment: summation\noutput: out.h5\ngrid:\n  n: 100000000\n  trace_every: 9\n", 3,
     "trace samples, over the limit"},
    // The matrix limit (configs/README.md): A and B of matmul_accum at most 2^24 elements.
    {"matmul_accum's A over the matrix limit", "experiment: matmul_accum\noutput: out.h5\ngrid:\n  K: [256, 16777216]\n", 3,
     "point 1 (K=16777216): A (M x K) would be 8 x 16777216, more than the limit of 16777216 elements (4096 x 4096)"},
    {"matmul_accum's B over the matrix limit", "experiment: matmul_accum\noutput: out.h5\ngrid:\n  M: 1\n  N: 2\n  K: 16777216\n", 3,
     "B (K x N) would be 16777216 x 2, more than the limit of 16777216 elements"},
    // The floating-point exception parameters.
    {"unknown fp_exceptions mode", kHead + "grid:\n  fp_exceptions: cont\n", 4, "did you mean 'count'"},
    {"fp_exceptions not a string", kHead + "grid:\n  fp_exceptions: true\n", 4, "expected a string"},
    {"oflo not a bool", kHead + "grid:\n  oflo: yes\n", 4, "expected true or false"},
    {"div0 a list with a number", kHead + "grid:\n  div0: [true, 0]\n", 4, "expected true or false"},
    {"inv null", kHead + "grid:\n  inv:\n", 4, "expected true or false"},
    {"nanoo a number", kHead + "grid:\n  nanoo: 1\n", 4, "expected true or false"},
    {"nanoo with another overflow policy", kHead + "grid:\n  overflow: [nan, saturate]\n  nanoo: true\n", 3,
     "point 1 (overflow=saturate, nanoo=true): nanoo: true (NaN on overflow) contradicts overflow: saturate"},
    {"nanoo with the default overflow policy", kHead + "grid:\n  nanoo: true\n", 3, "contradicts overflow: inf"},
    {"fp_exceptions where the experiment takes none", "experiment: grad_underflow\noutput: out.h5\ngrid:\n  fp_exceptions: count\n",
     4, "unknown parameter 'fp_exceptions' of experiment 'grad_underflow'"},
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
  std::filesystem::create_directory(dir / "folder.yaml");
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"ok.yaml", "-j", "0"}, "-j needs a number"},
      {{"ok.yaml", "--frce"}, "did you mean '--force'"},
      {{"missing.yaml"}, "missing.yaml: config: cannot read: No such file or directory"},
      {{"folder.yaml"}, "folder.yaml: config: cannot read: Is a directory"},
      {{}, "no config given"},
      {{"--describe", "swampin"}, "did you mean 'swamping'"},
      {{"ok.yaml", "-o", "no/dir/x.h5"}, "does not exist"},
      {{"ok.yaml", "--force", "--resume"}, "exclude each other"},
      // An option where a value belongs: never taken as the value.
      {{"ok.yaml", "-o", "--quiet"}, "option -o needs a value, got the option '--quiet'"},
      {{"ok.yaml", "--output", "-j"}, "option --output needs a value"},
      {{"ok.yaml", "-o"}, "option -o needs a value"},
      {{"ok.yaml", "-o", "-"}, "'-' (standard output) is not supported"},
      {{"ok.yaml", "--output=-x.h5"}, "for a file of that name, write ./-x.h5"},
      {{"--describe", "--list"}, "option --describe needs a value"},
      // --list and --describe take nothing else.
      {{"--list", "extra"}, "--list takes nothing else (got 'extra')"},
      {{"ok.yaml", "--list"}, "--list takes nothing else (got 'ok.yaml')"},
      {{"--describe", "swamping", "ok.yaml"}, "--describe takes nothing else"},
      {{"--list", "--describe", "swamping"}, "--list takes nothing else (got --describe)"},
      {{"--list", "-j", "2"}, "--list takes nothing else (got -j)"},
      {{"--describe", "swamping", "--quiet"}, "--describe takes nothing else (got --quiet)"},
  };
  for (const auto& [args, expected] : cases) {
    const auto result = run_program(sweep, args, dir.path().string());
    INFO("args: " << testing_args(args) << "\nstderr: " << result.err);
    CHECK(result.status == 2);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(result.err.find(expected) != std::string::npos);
    CHECK(result.out.empty());
  }
  // Nothing ran: no output, no file named after an option.
  for (const char* name : {"out.h5", "--quiet", "-j", "-", "-x.h5", "x.h5"}) CHECK_FALSE(std::filesystem::exists(dir / name));
  // The documented way to a name starting with '-'.
  const auto dashed = run_program(sweep, {"ok.yaml", "-o", "./--quiet", "--quiet"}, dir.path().string());
  CHECK(dashed.status == 0);
  CHECK(std::filesystem::exists(dir / "--quiet"));
}

TEST_CASE("the config's own output key is checked even when -o replaces it", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  for (const char* value : {"42", "[a.h5, b.h5]", "", "\"\"", "{a: 1}"}) {
    write_file(dir / "c.yaml", std::string("experiment: swamping\noutput: ") + value + "\n");
    const auto result = run_program(sweep, {"c.yaml", "-o", "x.h5", "--quiet"}, dir.path().string());
    INFO("output: " << value << "\nstderr: " << result.err);
    CHECK(result.status == 2);
    CHECK(std::regex_search(result.err, std::regex("^c\\.yaml:2:[0-9]+: output: ")));
    CHECK_FALSE(std::filesystem::exists(dir / "x.h5"));
  }
  // A config whose output folder does not exist here still runs with -o.
  write_file(dir / "c.yaml", "experiment: swamping\noutput: no/such/folder/out.h5\ngrid:\n  steps: 10\n");
  CHECK(run_program(sweep, {"c.yaml", "-o", "x.h5", "--quiet"}, dir.path().string()).status == 0);
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
  // Which experiments take the fp_exceptions parameters, from their specs.
  for (const char* name : {"swamping", "summation", "matmul_accum", "updates", "train"}) {
    const auto text = run_program(sweep, {"--describe", name}, dir.path().string()).out;
    INFO(name);
    CHECK(text.find("floating-point exceptions: takes fp_exceptions (off, count, trap)") != std::string::npos);
    CHECK(text.find("scope") != std::string::npos);
  }
  // configs/README.md names the experiments that take them: the same as --describe says.
  const char* root = std::getenv("ROUNDOFF_ROOT");
  REQUIRE(root);
  const std::string readme = sweep_test::read_file(std::string(root) + "/configs/README.md");
  const std::string lead = "Which experiments take them: ";
  const auto at = readme.find(lead);
  REQUIRE(at != std::string::npos);
  std::string named = readme.substr(at + lead.size(), readme.find('.', at) - at - lead.size());
  std::replace(named.begin(), named.end(), ',', ' ');
  std::set<std::string> documented;
  std::istringstream words(named);
  for (std::string w; words >> w;)
    if (w != "and") documented.insert(w);
  std::set<std::string> taking;
  std::istringstream names(list.out);
  for (std::string line; std::getline(names, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (run_program(sweep, {"--describe", name}, dir.path().string()).out.find("takes fp_exceptions (") != std::string::npos)
      taking.insert(name);
  }
  CHECK(taking == documented);
  const auto grad = run_program(sweep, {"--describe", "grad_underflow"}, dir.path().string()).out;
  CHECK(grad.find("floating-point exceptions: takes no fp_exceptions parameters") != std::string::npos);
  CHECK(grad.find("fp_exceptions  ") == std::string::npos);  // not among its parameters
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
  const auto run = sweep_test::interrupt_after_progress(sweep, {"long.yaml", "-j", "2"}, dir.path().string(), 40, 3, SIGINT);
  INFO("terminal: " << run.screen);
  REQUIRE(run.signalled);
  REQUIRE(run.status == 130);
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

namespace {

// No temporary skeleton (".NAME.sweep-tmp-PID") left in the folder.
bool temporary_files_left(const TempDir& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    if (entry.path().filename().string().find(".sweep-tmp-") != std::string::npos) return true;
  return false;
}

// Waits until sweep has its SIGINT/SIGTERM handlers (it installs them first thing).
bool wait_for_handlers(pid_t child) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (sweep_test::catches_stop_signals(child, sweep_binary())) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

}  // namespace

TEST_CASE("a signal while the config is parsed exits 130 and writes nothing", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  // 300,000 grid values: parsing takes far longer than the signal needs to arrive.
  std::string values;
  for (int n = 1; n <= 300000; ++n) values += (n > 1 ? ", " : "") + std::to_string(n);
  write_file(dir / "big.yaml", "experiment: summation\noutput: big.h5\ngrid:\n  n: [" + values + "]\n");
  for (const int signal : {SIGINT, SIGTERM}) {
    const pid_t child = sweep_test::start_program(sweep, {"big.yaml", "--quiet"}, dir.path().string());
    REQUIRE(wait_for_handlers(child));
    kill(child, signal);
    const auto result = sweep_test::finish_program(child, dir.path().string());
    INFO("stderr: " << result.err);
    CHECK(result.status == 130);
    CHECK(result.err == "sweep: interrupted before any point was computed; nothing written\n");
    CHECK_FALSE(std::filesystem::exists(dir / "big.h5"));
    CHECK_FALSE(temporary_files_left(dir));
  }
}

TEST_CASE("a signal at any moment of startup leaves no file or a valid partial one that --resume completes", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  // 20,000 points of one step: parsing, creating the skeleton and running each take a
  // while, so the signals below land in each phase on some run.
  std::string initial;
  for (int k = 0; k < 400; ++k) initial += (k ? ", " : "") + std::to_string(k);
  write_file(dir / "s.yaml", "experiment: swamping\noutput: s.h5\ngrid:\n  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, "
                             "13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, "
                             "37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]\n  initial: [" + initial + "]\n  steps: 1\n");
  int outcomes[3] = {0, 0, 0};  // no file, partial file, complete
  for (const int delay_us : {0, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 512000}) {
    std::filesystem::remove(dir / "s.h5");
    const pid_t child = sweep_test::start_program(sweep, {"s.yaml", "--quiet", "-j", "2"}, dir.path().string());
    REQUIRE(wait_for_handlers(child));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    kill(child, delay_us % 2000 == 0 ? SIGTERM : SIGINT);
    const auto result = sweep_test::finish_program(child, dir.path().string());
    INFO("signal " << delay_us << " us after the handlers; stderr: " << result.err);
    REQUIRE((result.status == 130 || result.status == 0));
    CHECK_FALSE(temporary_files_left(dir));
    if (result.status == 0) {
      ++outcomes[2];
      CHECK(sweep_test::string_attribute(dir / "s.h5", "/", "status") == "complete");
    } else if (!std::filesystem::exists(dir / "s.h5")) {
      ++outcomes[0];
      CHECK(result.err.find("nothing written") != std::string::npos);
    } else {
      ++outcomes[1];
      CHECK(sweep_test::string_attribute(dir / "s.h5", "/", "status") == "partial");
      CHECK(result.err.find("--resume") != std::string::npos);
      const auto resumed = run_program(sweep, {"s.yaml", "--resume", "--quiet"}, dir.path().string());
      INFO("resume stderr: " << resumed.err);
      CHECK(resumed.status == 0);
      CHECK(sweep_test::string_attribute(dir / "s.h5", "/", "status") == "complete");
      const auto done = sweep_test::read_dataset<std::uint8_t>(dir / "s.h5", "done");
      CHECK(std::count(done.begin(), done.end(), 1) == 20000);
    }
  }
  // Which phases the signals hit depends on the machine; say so rather than assert it.
  WARN("signals that found: nothing written " << outcomes[0] << ", a partial file " << outcomes[1] << ", a finished sweep "
                                              << outcomes[2]);
}

TEST_CASE("an output another process holds open is refused, with --force too, and left intact", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "a.yaml", "experiment: swamping\noutput: a.h5\ngrid:\n  steps: 100\n");
  REQUIRE(run_program(sweep, {"a.yaml", "--quiet"}, dir.path().string()).status == 0);
  const std::string before = sweep_test::read_file(dir / "a.h5");
  {
    // This process opens it for writing, as a running sweep has its output: HDF5's lock.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t held = H5Fopen((dir / "a.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(held >= 0);
    for (const std::vector<std::string>& args : {std::vector<std::string>{"a.yaml", "--force"}, {"a.yaml"},
                                                 {"a.yaml", "--resume"}, {"a.yaml", "--force", "-o", "a.h5"}}) {
      const auto result = run_program(sweep, args, dir.path().string());
      INFO("args: " << testing_args(args) << "\nstderr: " << result.err);
      CHECK(result.status == 2);
      CHECK(result.err.find("a.h5 is in use by another process") != std::string::npos);
      CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    }
    H5Fclose(held);
  }
  CHECK(sweep_test::read_file(dir / "a.h5") == before);
  CHECK_FALSE(temporary_files_left(dir));
  CHECK(run_program(sweep, {"a.yaml", "--force", "--quiet"}, dir.path().string()).status == 0);
}

TEST_CASE("--force onto the output of a sweep still running is refused; that sweep is unharmed", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  // 10^8 steps per run: seconds even on a fast machine; it is interrupted anyway.
  write_file(dir / "long.yaml", "experiment: swamping\nseed: 3\nreplicas: 2\noutput: long.h5\ngrid:\n  rounding: sr\n"
                                "  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]\n"
                                "  steps: 100000000\n");
  const pid_t running = sweep_test::start_program(sweep, {"long.yaml", "-j", "1", "--quiet"}, dir.path().string());
  // Wait until its output exists and is locked for writing.
  bool locked = false;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30); !locked && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int fd = open((dir / "long.h5").c_str(), O_RDONLY);
    if (fd < 0) continue;
    locked = flock(fd, LOCK_SH | LOCK_NB) != 0;
    close(fd);
  }
  INFO("running sweep: " << sweep_test::read_file(dir / ".stderr"));
  REQUIRE(locked);
  TempDir other;  // the second sweep's own stdout and stderr files
  write_file(other / "long.yaml", sweep_test::read_file(dir / "long.yaml"));
  for (const std::vector<std::string>& args : {std::vector<std::string>{"long.yaml", "--force", "-o", dir / "long.h5"},
                                               {"long.yaml", "-o", dir / "long.h5"}}) {
    const auto second = run_program(sweep, args, other.path().string());
    INFO("second sweep: " << second.err);
    CHECK(second.status == 2);
    CHECK(second.err.find("in use by another process") != std::string::npos);
  }
  kill(running, SIGINT);
  const auto first = sweep_test::finish_program(running, dir.path().string());
  INFO("first sweep: " << first.err);
  REQUIRE(first.status == 130);
  // Its file is intact: readable, its own config's partial run, as --resume would take it.
  CHECK(sweep_test::string_attribute(dir / "long.h5", "/", "status") == "partial");
  CHECK(sweep_test::read_dataset<std::uint8_t>(dir / "long.h5", "done").size() == 20);
  const auto again = run_program(sweep, {"long.yaml", "--quiet"}, dir.path().string());
  INFO("again: " << again.err);
  CHECK(again.status == 2);
  CHECK(again.err.find("holds a partial run of this config; continue it with --resume") != std::string::npos);
}

TEST_CASE("--resume refuses a partial file of another build", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "a.yaml", "experiment: swamping\noutput: a.h5\ngrid:\n  steps: [10, 20]\n");
  REQUIRE(run_program(sweep, {"a.yaml", "--quiet"}, dir.path().string()).status == 0);
  const std::string out = dir / "a.h5";
  const std::string version = sweep_test::string_attribute(out, "/", "roundoff_version");
  const std::string commit = sweep_test::string_attribute(out, "/", "git_commit");
  REQUIRE_FALSE(version.empty());
  REQUIRE_FALSE(commit.empty());
  sweep_test::set_root_string_attribute(out, "status", "partial");
  for (const auto& [name, value] : {std::pair<std::string, std::string>{"git_commit", "0123456789abcdef"},
                                    {"roundoff_version", "0.0.1"}}) {
    sweep_test::set_root_string_attribute(out, name, value);
    const std::string before = sweep_test::read_file(out);
    const auto result = run_program(sweep, {"a.yaml", "--resume"}, dir.path().string());
    INFO(name << " changed; stderr: " << result.err);
    CHECK(result.status == 2);
    CHECK(result.err.find("partial run by another build") != std::string::npos);
    CHECK(result.err.find(value) != std::string::npos);
    CHECK(result.err.find("--force") != std::string::npos);
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK(sweep_test::read_file(out) == before);
  }
  // Its own build's partial file: resumed (nothing left to run, so just completed).
  sweep_test::set_root_string_attribute(out, "git_commit", commit);
  sweep_test::set_root_string_attribute(out, "roundoff_version", version);
  CHECK(run_program(sweep, {"a.yaml", "--resume", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::string_attribute(out, "/", "status") == "complete");
}

TEST_CASE("the summary shows every point up to 1000 rows, then says how many more are in the file", "[sweep][cli]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  std::string initial;
  for (int k = 0; k < 110; ++k) initial += (k ? ", " : "") + std::to_string(k);
  const std::string head = "experiment: swamping\noutput: t.h5\ngrid:\n  steps: 1\n  initial: [" + initial + "]\n";
  write_file(dir / "t.yaml", head + "  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n");  // 1100 points
  const auto result = run_program(sweep, {"t.yaml", "--quiet"}, dir.path().string());
  REQUIRE(result.status == 0);
  std::vector<std::string> lines;
  std::istringstream out(result.out);
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  REQUIRE(lines.size() == 1 + 1 + 1000 + 1 + 1);  // title, header, rows, "...", output
  CHECK(lines[2].find("    0  ") == 0);
  CHECK(lines[1001].find("  999  ") == 0);
  CHECK(lines[1002] == "... 100 more points; all are in the file (python3 -m roundoff.results reads them)");
  CHECK(lines[1003] == "output: t.h5");

  write_file(dir / "u.yaml", head + "  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8]\n");  // 990 points: all shown
  const auto all = run_program(sweep, {"u.yaml", "-o", "u.h5", "--quiet"}, dir.path().string());
  REQUIRE(all.status == 0);
  CHECK(std::count(all.out.begin(), all.out.end(), '\n') == 1 + 1 + 990 + 1);
}

TEST_CASE("golden: the shipped configs/swamping.yaml reproduces the IPU tutorial", "[sweep][cli][golden]") {
  const std::string sweep = sweep_binary();
  const char* root = std::getenv("ROUNDOFF_ROOT");
  REQUIRE(root);
  TempDir dir;
  const std::string config = std::string(root) + "/configs/swamping.yaml";
  const auto result = run_program(sweep, {config, "-o", dir / "swamping.h5", "-j", "2", "--quiet"}, dir.path().string());
  INFO("stderr: " << result.err);
  REQUIRE(result.status == 0);
  const std::string out = dir / "swamping.h5";
  CHECK(sweep_test::string_attribute(out, "/", "config") == sweep_test::read_file(config));
  const auto formats = sweep_test::string_dataset(out, "points/format");
  const auto roundings = sweep_test::string_dataset(out, "points/rounding");
  const auto finals = sweep_test::read_dataset<double>(out, "metrics/final");
  const std::size_t replicas = finals.size() / formats.size();
  REQUIRE(replicas == 20);

  // Oracles: the CPU's binary16 and binary32, both round-to-nearest-even.
  const double fp16_addend = static_cast<double>(static_cast<_Float16>(1e-4));
  const double fp16_exact_sum = 10000 * fp16_addend;  // exact in double: a 11-bit times a 14-bit integer
  float fp32_loop = 0;
  for (int k = 0; k < 10000; ++k) fp32_loop += 1e-4f;

  int seen[4] = {0, 0, 0, 0};
  for (std::size_t p = 0; p < formats.size(); ++p) {
    const std::vector<double> runs(finals.begin() + static_cast<std::ptrdiff_t>(p * replicas),
                                   finals.begin() + static_cast<std::ptrdiff_t>((p + 1) * replicas));
    const double mean = std::accumulate(runs.begin(), runs.end(), 0.0) / static_cast<double>(replicas);
    INFO(formats[p] << " " << roundings[p] << " mean " << mean);
    if (formats[p] == "fp16" && roundings[p] == "rne") {
      ++seen[0];
      for (double f : runs) CHECK(f == 0.25);
    } else if (formats[p] == "fp16" && roundings[p] == "sr") {
      ++seen[1];
      CHECK(std::fabs(mean - fp16_exact_sum) < 0.01);
      CHECK(*std::min_element(runs.begin(), runs.end()) > 0.9);  // the tutorial's spread is about 0.97..1.03
      CHECK(*std::max_element(runs.begin(), runs.end()) < 1.1);
    } else if (formats[p] == "fp32" && roundings[p] == "rne") {
      ++seen[2];
      for (double f : runs) CHECK(f == static_cast<double>(fp32_loop));
    } else if (formats[p] == "fp32" && roundings[p] == "sr") {
      ++seen[3];
      CHECK(std::fabs(mean - 1.0) < 1e-3);
    }
  }
  CHECK(seen[0] == 1);  // the shipped grid still has each of the four points
  CHECK(seen[1] == 1);
  CHECK(seen[2] == 1);
  CHECK(seen[3] == 1);
}

namespace {

// The oracle of x <- fp16(x + addend) from 0, the CPU's binary16 with round-to-nearest-even:
// the first step whose sum overflows to inf, and x just before it.
struct Fp16Overflow {
  int step = -1;
  double before = 0;
};
Fp16Overflow first_fp16_overflow(double addend, int steps) {
  double x = 0;
  for (int k = 1; k <= steps; ++k) {
    const double next = static_cast<double>(static_cast<_Float16>(x + addend));  // x + addend is exact in double
    if (std::isinf(next)) return {k, x};
    x = next;
  }
  return {};
}

std::string integer_text(double x) { return std::to_string(static_cast<long long>(x)); }

}  // namespace

TEST_CASE("fp_exceptions through sweep: a trapped run is recorded and the sweep goes on; counts name the first element",
          "[sweep][cli][fp]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  const Fp16Overflow overflow = first_fp16_overflow(1000, 100);
  REQUIRE(overflow.step > 0);  // 66: x = 64608, and 65608 rounds past 65504 to inf
  const std::string step = std::to_string(overflow.step), before = integer_text(overflow.before);

  // Trap: point 1 (addend 1000) traps in both replicas; point 0 runs to its end.
  write_file(dir / "trap.yaml", "experiment: swamping\nreplicas: 2\noutput: trap.h5\ngrid:\n  addend: [1.0e-4, 1000]\n"
                                "  steps: 100\n  fp_exceptions: trap\n");
  const auto trap = run_program(sweep, {"trap.yaml", "--quiet", "-j", "2"}, dir.path().string());
  INFO("stdout: " << trap.out << "\nstderr: " << trap.err);
  REQUIRE(trap.status == 0);
  const std::string report = "floating-point trap: OFLO in sum: add(" + before + ", 1000) at element #" + step + " = inf";
  CHECK(trap.out.find("trapped: 2 of 4 runs (their metrics are NaN; reports in /traps); first: point 1 replica 0: " +
                      report + "\n") != std::string::npos);
  const std::string out = dir / "trap.h5";
  CHECK(sweep_test::read_dataset<std::uint8_t>(out, "traps/trapped") == std::vector<std::uint8_t>{0, 0, 1, 1});
  CHECK(sweep_test::string_dataset(out, "traps/report") == std::vector<std::string>{"", "", report, report});
  CHECK(sweep_test::read_dataset<std::int64_t>(out, "traps/element") == std::vector<std::int64_t>{-1, -1, overflow.step, overflow.step});
  const auto operands = sweep_test::read_dataset<double>(out, "traps/operands");
  CHECK(operands[4] == overflow.before);
  CHECK(operands[5] == 1000);
  CHECK(sweep_test::read_dataset<std::int64_t>(out, "traps/fp_sts") == std::vector<std::int64_t>{0, 0, 4, 4});
  const auto final = sweep_test::read_dataset<double>(out, "metrics/final");
  CHECK(final[0] == final[1]);
  CHECK(std::isfinite(final[0]));
  CHECK(std::isnan(final[2]));
  CHECK(std::isnan(final[3]));
  CHECK(sweep_test::read_dataset<std::uint8_t>(out, "flags/OFLO") == std::vector<std::uint8_t>{0, 0, 1, 1});

  // Count: the run goes to its end (x stays inf: an infinite operand is no overflow), one
  // OFLO at the step the oracle names. Summation with nanoo: the same overflow gives NaN
  // and raises INV too (counted where inv is on), and overflowing terms count in `terms`.
  write_file(dir / "count.yaml", "experiment: swamping\noutput: count.h5\ngrid:\n  addend: 1000\n  steps: 100\n"
                                 "  fp_exceptions: count\n");
  const auto count = run_program(sweep, {"count.yaml", "--quiet"}, dir.path().string());
  INFO("stdout: " << count.out << "\nstderr: " << count.err);
  REQUIRE(count.status == 0);
  CHECK(count.out.find("fp_exceptions counted: OFLO in 1 operation of 1 of 1 runs (per scope and op in /fp_counts)\n") !=
        std::string::npos);
  CHECK(sweep_test::string_dataset(dir / "count.h5", "fp_counts/scope") == std::vector<std::string>{"sum"});
  CHECK(sweep_test::read_dataset<std::int64_t>(dir / "count.h5", "fp_counts/first_element") == std::vector<std::int64_t>{overflow.step});
  CHECK(sweep_test::read_dataset<double>(dir / "count.h5", "fp_counts/first_operands") == std::vector<double>{overflow.before, 1000});
  CHECK(std::isinf(sweep_test::read_dataset<double>(dir / "count.h5", "metrics/final")[0]));

  write_file(dir / "nanoo.yaml", "experiment: summation\noutput: nanoo.h5\ngrid:\n  series: constant\n  format: fp16\n"
                                 "  value: [1000, 1.0e5]\n  n: 100\n  fp_exceptions: count\n  nanoo: true\n  inv: [true, false]\n");
  REQUIRE(run_program(sweep, {"nanoo.yaml", "--quiet"}, dir.path().string()).status == 0);
  const std::string nanoo = dir / "nanoo.h5";
  // Points: (1000, inv), (1000, no inv), (1e5, inv), (1e5, no inv); rows: the most is 2.
  const auto scope = sweep_test::string_dataset(nanoo, "fp_counts/scope");
  const auto flag = sweep_test::string_dataset(nanoo, "fp_counts/flag");
  const auto counted = sweep_test::read_dataset<std::int64_t>(nanoo, "fp_counts/count");
  const auto first = sweep_test::read_dataset<std::int64_t>(nanoo, "fp_counts/first_element");
  const auto result = sweep_test::read_dataset<double>(nanoo, "fp_counts/first_result");
  REQUIRE(scope.size() == 4 * 2);
  CHECK(std::vector<std::string>(scope.begin(), scope.begin() + 2) == std::vector<std::string>{"recursive", "recursive"});
  CHECK(std::vector<std::string>(flag.begin(), flag.begin() + 2) == std::vector<std::string>{"OFLO", "INV"});
  CHECK(std::vector<std::int64_t>(counted.begin(), counted.begin() + 2) == std::vector<std::int64_t>{1, 1});
  CHECK(std::vector<std::int64_t>(first.begin(), first.begin() + 2) == std::vector<std::int64_t>{overflow.step, overflow.step});
  CHECK(std::isnan(result[0]));  // NaN on overflow
  CHECK(std::vector<std::string>(flag.begin() + 2, flag.begin() + 4) == std::vector<std::string>{"OFLO", ""});
  // 1e5 overflows fp16 as it is rounded into the format: every term, first at k = 1.
  CHECK(std::vector<std::string>(scope.begin() + 4, scope.begin() + 6) == std::vector<std::string>{"terms", "terms"});
  CHECK(std::vector<std::int64_t>(counted.begin() + 4, counted.begin() + 6) == std::vector<std::int64_t>{100, 100});
  CHECK(std::vector<std::int64_t>(first.begin() + 4, first.begin() + 6) == std::vector<std::int64_t>{1, 1});
  CHECK(sweep_test::read_dataset<double>(nanoo, "fp_counts/first_operands")[2 * 2 * 2] == 1e5);  // [P, R, K, M] = [4, 1, 2, 2]
  CHECK(std::vector<std::string>(flag.begin() + 6, flag.begin() + 8) == std::vector<std::string>{"OFLO", ""});
}

TEST_CASE("fp_exceptions: -j1 and -j2 write identical files, counts and traps included", "[sweep][cli][fp]") {
  const std::string sweep = sweep_binary();
  TempDir dir;
  write_file(dir / "s.yaml", "experiment: summation\nseed: 8\nreplicas: 3\ngrid:\n  series: [uniform01, constant]\n"
                             "  value: 1000\n  format: fp16\n  rounding: [rne, sr]\n  n: [50, 70, 3000]\n"
                             "  algorithm: [recursive, kahan]\n  fp_exceptions: [count, trap]\n  nanoo: [false, true]\n");
  REQUIRE(run_program(sweep, {"s.yaml", "-j", "1", "-o", "one.h5", "--quiet"}, dir.path().string()).status == 0);
  REQUIRE(run_program(sweep, {"s.yaml", "-j", "2", "-o", "two.h5", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::first_difference(dir / "one.h5", dir / "two.h5") == "");
  // The sweep did trap and count somewhere (else the comparison proves little).
  const auto trapped = sweep_test::read_dataset<std::uint8_t>(dir / "one.h5", "traps/trapped");
  const auto counts = sweep_test::read_dataset<std::int64_t>(dir / "one.h5", "fp_counts/count");
  CHECK(std::count(trapped.begin(), trapped.end(), 1) > 0);
  CHECK(std::count_if(counts.begin(), counts.end(), [](std::int64_t c) { return c > 0; }) > 0);
}
