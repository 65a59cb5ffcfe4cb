// Scale-out with the real build/sweep ($SWEEP): `--shard K/N` files merged by `sweep merge`
// equal the unsharded run bit for bit (a summation and a training config, points split
// between shards included); merge refuses a gap, an overlap, another config or build, an
// unfinished shard, and the commands it prints fix the problem when run as printed; a
// killed shard resumes; datasets a later version adds are merged from the files' own
// layout. Tagged [mpi] (run when meson was set up with -Dmpi=enabled; $MPIRUN names
// mpirun): `mpirun -n 2 --oversubscribe` equals -j1, signals and a dead rank.
#include <catch2/catch.hpp>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "experiments/sweep/shard.hpp"
#include "support.hpp"

namespace {

using sweep_test::ProcessResult;
using sweep_test::run_program;
using sweep_test::TempDir;
using sweep_test::write_file;

std::string sweep_binary() {
  const char* path = std::getenv("SWEEP");
  if (!path) FAIL("set SWEEP to the sweep program (meson test does)");
  return path;
}

std::string shard_file(const std::string& stem, int k, int n) {
  return stem + ".shard-" + std::to_string(k) + "-of-" + std::to_string(n) + ".h5";
}

// Runs `sweep CONFIG --shard k/N ARGS...` for every k in `shards`; each must succeed.
void run_shards(const TempDir& dir, const std::string& config, int n, const std::vector<int>& shards,
                const std::vector<std::string>& extra = {}) {
  for (int k : shards) {
    std::vector<std::string> args{config, "--shard", std::to_string(k) + "/" + std::to_string(n), "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult r = run_program(sweep_binary(), args, dir.path().string());
    INFO("shard " << k << "/" << n << ": " << r.err);
    REQUIRE(r.status == 0);
  }
}

ProcessResult merge(const TempDir& dir, const std::string& out, const std::vector<std::string>& shards,
                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"merge", out};
  args.insert(args.end(), shards.begin(), shards.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return run_program(sweep_binary(), args, dir.path().string());
}

// The command a message prints after `lead` ("... with: sweep a.yaml --shard 1/3 -o x.h5;"),
// split into words (the test's paths need no quoting).
std::vector<std::string> printed_command(const std::string& message, const std::string& lead) {
  const std::size_t at = message.find(lead);
  if (at == std::string::npos) return {};
  std::string command = message.substr(at + lead.size());
  command = command.substr(0, command.find_first_of(";\n"));
  std::istringstream words(command);
  std::vector<std::string> args;
  for (std::string w; words >> w;) args.push_back(w);
  return args;
}

ProcessResult run_printed(const TempDir& dir, const std::vector<std::string>& command) {
  REQUIRE(command.size() > 1);
  REQUIRE(command.front() == "sweep");
  return run_program(sweep_binary(), std::vector<std::string>(command.begin() + 1, command.end()), dir.path().string());
}

herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// The root attributes in creation order, as readers list them.
std::vector<std::string> root_attribute_order(const std::string& file) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  sweep_test::detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  std::vector<std::string> names;
  H5Aiterate2(f.id, H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr, collect_attribute, &names);
  return names;
}

std::int64_t int64_attribute(const std::string& file, const std::string& name) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  sweep_test::detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  sweep_test::detail::Handle a{H5Aopen(f.id, name.c_str(), H5P_DEFAULT), H5Aclose};
  std::int64_t value = -1;
  if (a.id < 0 || H5Aread(a.id, H5T_NATIVE_INT64, &value) < 0) return -1;
  return value;
}

bool some_point_split(std::uint32_t points, std::uint32_t replicas, std::uint32_t shards) {
  const auto owner = roundoff::sweep::item_owners(points, replicas, shards);
  for (std::uint32_t p = 0; p < points; ++p)
    for (std::uint32_t r = 1; r < replicas; ++r)
      if (owner[p * replicas + r] != owner[p * replicas]) return true;
  return false;
}

// 16 points x 3 replicas, traces of 4 and 22 samples: shard 0/3 holds 16 runs, so point
// boundaries fall inside a point.
const std::string kSummation =
    "experiment: summation\nseed: 21\nreplicas: 3\noutput: sum.h5\ngrid:\n  series: [harmonic, uniform01]\n"
    "  format: [fp16, bf16]\n  rounding: [rne, sr]\n  n: [100, 1000]\n  trace_every: 50\n";
// 9 points x 2 replicas of a small MLP with gradient histograms (traces) every 4 steps.
const std::string kTrain =
    "experiment: train\nseed: 7\nreplicas: 2\noutput: train.h5\ngrid:\n  update: [fp32, fp16-rn, fp16-sr]\n"
    "  loss_scale: [none, 128, dynamic]\n  samples: 200\n  features: 8\n  classes: 3\n  width1: 8\n  epochs: 2\n"
    "  batch: 16\n  hist_every: 4\n";

// Issue 9's tables: 8 points x 3 replicas of fp16 sums that overflow, half of them counting
// (/fp_counts) and half trapping (/traps), with split points among the shards.
const std::string kExceptions =
    "experiment: summation\nseed: 5\nreplicas: 3\noutput: exc.h5\ngrid:\n  series: [constant]\n"
    "  value: [1000, 3000]\n  n: [100, 300]\n  format: [fp16]\n  fp_exceptions: [count, trap]\n";

void check_three_shards_merge_to_the_unsharded_run(const std::string& stem, const std::string& config_text) {
  TempDir dir;
  const std::string config = stem + ".yaml";
  write_file(dir / config, config_text);
  REQUIRE(run_program(sweep_binary(), {config, "-j", "1", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  run_shards(dir, config, 3, {0, 1, 2}, {"-j", "2"});
  const std::vector<std::string> shards = {shard_file(stem, 0, 3), shard_file(stem, 1, 3), shard_file(stem, 2, 3)};
  for (int k = 0; k < 3; ++k) {
    INFO("shard " << k);
    CHECK(sweep_test::string_attribute(dir / shards[k], "/", "status") == "complete");
    CHECK(sweep_test::string_attribute(dir / shards[k], "/", "config_path") == config);
    CHECK(int64_attribute(dir / shards[k], "shard_index") == k);
    CHECK(int64_attribute(dir / shards[k], "shard_count") == 3);
  }
  // Merged in any order of the arguments.
  const ProcessResult merged = merge(dir, stem + ".h5", {shards[2], shards[0], shards[1]});
  INFO("merge: " << merged.err);
  REQUIRE(merged.status == 0);
  CHECK(sweep_test::first_difference(dir / (stem + ".h5"), dir / "reference.h5") == "");
  CHECK(root_attribute_order(dir / (stem + ".h5")) == root_attribute_order(dir / "reference.h5"));
  CHECK(merged.out.find("(complete)") != std::string::npos);
  // Merging again onto the result is not an error: it is shown.
  const ProcessResult again = merge(dir, stem + ".h5", shards);
  CHECK(again.status == 0);
  CHECK(again.err.find("already the complete output") != std::string::npos);
}

}  // namespace

TEST_CASE("summation: shards 0/3, 1/3, 2/3 merged equal the unsharded run bit for bit", "[scaleout]") {
  REQUIRE(some_point_split(16, 3, 3));  // the split-point path is exercised
  check_three_shards_merge_to_the_unsharded_run("sum", kSummation);
}

TEST_CASE("train: shards 0/3, 1/3, 2/3 merged equal the unsharded run bit for bit", "[scaleout]") {
  check_three_shards_merge_to_the_unsharded_run("train", kTrain);
}

TEST_CASE("fp_exceptions counts and traps: shards merged equal the unsharded run bit for bit", "[scaleout]") {
  REQUIRE(some_point_split(8, 3, 3));
  check_three_shards_merge_to_the_unsharded_run("exc", kExceptions);
}

TEST_CASE("a shard file: same schema, /done_replicas marks exactly its runs, root attributes name the shard", "[scaleout]") {
  TempDir dir;
  write_file(dir / "sum.yaml", kSummation);
  run_shards(dir, "sum.yaml", 3, {1});
  const std::string file = dir / shard_file("sum", 1, 3);
  const auto done_replicas = sweep_test::read_dataset<std::uint8_t>(file, "done_replicas");
  const auto done = sweep_test::read_dataset<std::uint8_t>(file, "done");
  const auto owner = roundoff::sweep::item_owners(16, 3, 3);
  REQUIRE(done_replicas.size() == 48);
  for (std::size_t i = 0; i < 48; ++i) CHECK(done_replicas[i] == (owner[i] == 1 ? 1 : 0));
  for (std::size_t p = 0; p < 16; ++p)  // done: points held whole
    CHECK(done[p] == (owner[3 * p] == 1 && owner[3 * p + 1] == 1 && owner[3 * p + 2] == 1 ? 1 : 0));
  const auto final_sums = sweep_test::read_dataset<double>(file, "metrics/final");
  for (std::size_t i = 0; i < 48; ++i) CHECK(std::isnan(final_sums[i]) == (owner[i] != 1));
  const auto dry = run_program(sweep_binary(), {"sum.yaml", "--shard", "1/3", "--dry-run"}, dir.path().string());
  CHECK(dry.out.find("shard 1/3: 16 runs (points ") != std::string::npos);
  CHECK(dry.out.find("output: sum.shard-1-of-3.h5") != std::string::npos);
  // The same shard again: complete, shown; another shard or the whole sweep onto it: refused.
  const auto again = run_program(sweep_binary(), {"sum.yaml", "--shard", "1/3"}, dir.path().string());
  CHECK(again.status == 0);
  CHECK(again.out.find("(shard 1/3, complete)") != std::string::npos);
  const auto other = run_program(sweep_binary(), {"sum.yaml", "--shard", "2/3", "-o", shard_file("sum", 1, 3)}, dir.path().string());
  CHECK(other.status == 2);
  CHECK(other.err.find("holds shard 1/3 of this config, not shard 2/3") != std::string::npos);
  const auto whole = run_program(sweep_binary(), {"sum.yaml", "-o", shard_file("sum", 1, 3), "--resume"}, dir.path().string());
  CHECK(whole.status == 2);
  CHECK(whole.err.find("holds shard 1/3 of this config, not the whole sweep") != std::string::npos);
}

TEST_CASE("--shard auto takes the shard from the Slurm job array, and says so when there is none", "[scaleout]") {
  TempDir dir;
  write_file(dir / "sum.yaml", kSummation);
  unsetenv("SLURM_ARRAY_TASK_ID");
  unsetenv("SLURM_ARRAY_TASK_COUNT");
  const auto outside = run_program(sweep_binary(), {"sum.yaml", "--shard", "auto"}, dir.path().string());
  CHECK(outside.status == 2);
  CHECK(outside.err.find("SLURM_ARRAY_TASK_ID is not set") != std::string::npos);
  CHECK(std::count(outside.err.begin(), outside.err.end(), '\n') == 1);
  setenv("SLURM_ARRAY_TASK_ID", "2", 1);
  setenv("SLURM_ARRAY_TASK_COUNT", "3", 1);
  const auto inside = run_program(sweep_binary(), {"sum.yaml", "--shard", "auto", "--quiet"}, dir.path().string());
  unsetenv("SLURM_ARRAY_TASK_ID");
  unsetenv("SLURM_ARRAY_TASK_COUNT");
  CHECK(inside.status == 0);
  CHECK(sweep_test::string_attribute(dir / shard_file("sum", 2, 3), "/", "status") == "complete");
}

TEST_CASE("merge refuses a gap, an overlap, another config or build, and says what to run", "[scaleout]") {
  TempDir dir;
  write_file(dir / "sum.yaml", kSummation);
  REQUIRE(run_program(sweep_binary(), {"sum.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  run_shards(dir, "sum.yaml", 3, {0, 2});
  const std::string s0 = shard_file("sum", 0, 3), s2 = shard_file("sum", 2, 3);

  // A gap: the missing shard is named with the runs it holds and the command computing it,
  // which, run as printed, makes the merge succeed.
  const ProcessResult gap = merge(dir, "sum.h5", {s0, s2});
  CHECK(gap.status == 2);
  CHECK(std::count(gap.err.begin(), gap.err.end(), '\n') == 1);
  CHECK(gap.err.find("sum.h5 not written: 16 of 48 runs are missing; shard 1/3 is missing (16 runs: points ") != std::string::npos);
  const auto compute = printed_command(gap.err, "compute it with: ");
  CHECK(compute == std::vector<std::string>{"sweep", "sum.yaml", "--shard", "1/3", "-o", shard_file("sum", 1, 3)});
  CHECK_FALSE(std::filesystem::exists(dir / "sum.h5"));
  REQUIRE(run_printed(dir, compute).status == 0);
  const std::string s1 = shard_file("sum", 1, 3);

  // An overlap: a shard given twice, by its name or a copy's.
  std::filesystem::copy_file(dir / s1, dir / "copy.h5");
  for (const auto& twice : {std::vector<std::string>{s0, s1, s2, s1}, std::vector<std::string>{s0, s1, s2, "copy.h5"}}) {
    const ProcessResult overlap = merge(dir, "sum.h5", twice);
    CHECK(overlap.status == 2);
    CHECK(overlap.err.find("shard 1/3 is given twice") != std::string::npos);
  }

  // Another config (another seed), another build, another split, not a shard.
  write_file(dir / "other.yaml", kSummation + "description: other\n");
  run_shards(dir, "other.yaml", 3, {1}, {"-o", shard_file("other", 1, 3)});
  const ProcessResult config = merge(dir, "sum.h5", {s0, shard_file("other", 1, 3), s2});
  CHECK(config.status == 2);
  CHECK(config.err.find("the files come from different configs (config_sha256)") != std::string::npos);
  CHECK(config.err.find(shard_file("other", 1, 3)) != std::string::npos);
  sweep_test::set_root_string_attribute(dir / "copy.h5", "git_commit", "0123456789abcdef0123456789abcdef01234567");
  const ProcessResult build = merge(dir, "sum.h5", {s0, "copy.h5", s2});
  CHECK(build.status == 2);
  CHECK(build.err.find("the shards come from different builds") != std::string::npos);
  CHECK(build.err.find("git_commit 0123456789abcdef0123456789abcdef01234567") != std::string::npos);
  run_shards(dir, "sum.yaml", 2, {1});
  const ProcessResult split = merge(dir, "sum.h5", {s0, shard_file("sum", 1, 2), s2});
  CHECK(split.status == 2);
  CHECK(split.err.find("different splits") != std::string::npos);
  const ProcessResult whole = merge(dir, "sum.h5", {s0, s1, s2, "reference.h5"});
  CHECK(whole.status == 2);
  CHECK(whole.err.find("reference.h5 is not a shard file") != std::string::npos);
  CHECK(merge(dir, "sum.h5", {"missing.h5"}).status == 2);
  CHECK(merge(dir, "sum.h5", {}).status == 2);
  CHECK(merge(dir, s0, {s0, s1, s2}).status == 2);  // the output is one of the shards
  CHECK_FALSE(std::filesystem::exists(dir / "sum.h5"));

  // An existing output that is not this merge is left alone unless --force.
  write_file(dir / "sum.h5", "notes\n");
  CHECK(merge(dir, "sum.h5", {s0, s1, s2}).status == 2);
  CHECK(sweep_test::read_file(dir / "sum.h5") == "notes\n");
  REQUIRE(merge(dir, "sum.h5", {s0, s1, s2}, {"--force", "--quiet"}).status == 0);
  CHECK(sweep_test::first_difference(dir / "sum.h5", dir / "reference.h5") == "");
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    CHECK(entry.path().filename().string().find(".sweep-tmp-") == std::string::npos);
}

TEST_CASE("merge refuses a shard file marking runs its shard does not hold", "[scaleout]") {
  TempDir dir;
  write_file(dir / "sum.yaml", kSummation);
  run_shards(dir, "sum.yaml", 3, {0, 1, 2});
  const std::string s1 = dir / shard_file("sum", 1, 3);
  const auto owner = roundoff::sweep::item_owners(16, 3, 3);
  const std::size_t foreign = static_cast<std::size_t>(std::find(owner.begin(), owner.end(), 0u) - owner.begin());
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    sweep_test::detail::Handle f{H5Fopen(s1.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
    sweep_test::detail::Handle d{H5Dopen2(f.id, "done_replicas", H5P_DEFAULT), H5Dclose};
    std::vector<std::uint8_t> done(48);
    REQUIRE(H5Dread(d.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done.data()) >= 0);
    done[foreign] = 1;
    REQUIRE(H5Dwrite(d.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done.data()) >= 0);
  }
  const ProcessResult r = merge(dir, "sum.h5", {shard_file("sum", 0, 3), shard_file("sum", 1, 3), shard_file("sum", 2, 3)});
  CHECK(r.status == 2);
  CHECK(r.err.find("does not hold") != std::string::npos);
}

TEST_CASE("a killed shard resumes; merge names it unfinished with the command that finishes it", "[scaleout]") {
  TempDir dir;
  // 40 points x 2 replicas of 200,000 additions; shard 1/2 is 20 points.
  write_file(dir / "long.yaml", "experiment: swamping\nseed: 9\nreplicas: 2\noutput: long.h5\ngrid:\n  rounding: [rne, sr]\n"
                                "  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]\n"
                                "  steps: 200000\n  trace_every: 20000\n");
  const auto killed = sweep_test::interrupt_after_progress(sweep_binary(), {"long.yaml", "--shard", "1/2", "-j", "1"},
                                                           dir.path().string(), 20, 2, SIGTERM);
  INFO("terminal: " << killed.screen);
  REQUIRE(killed.signalled);
  REQUIRE(killed.status == 130);
  CHECK(killed.screen.find("continue with: sweep long.yaml --shard 1/2 --resume") != std::string::npos);
  const std::string s1 = shard_file("long", 1, 2);
  CHECK(sweep_test::string_attribute(dir / s1, "/", "status") == "partial");
  run_shards(dir, "long.yaml", 2, {0});

  const auto partial = run_program(sweep_binary(), {"long.yaml", "--shard", "1/2"}, dir.path().string());
  CHECK(partial.status == 2);
  CHECK(partial.err.find("continue it with --resume (sweep long.yaml --shard 1/2 --resume)") != std::string::npos);
  const ProcessResult refused = merge(dir, "long.h5", {shard_file("long", 0, 2), s1});
  CHECK(refused.status == 2);
  CHECK(refused.err.find("shard 1/2 (" + s1 + ") is unfinished (status partial, ") != std::string::npos);
  const auto finish = printed_command(refused.err, "finish it with: ");
  CHECK(finish == std::vector<std::string>{"sweep", "long.yaml", "--shard", "1/2", "-o", s1, "--resume"});
  REQUIRE(run_printed(dir, finish).status == 0);
  REQUIRE(merge(dir, "long.h5", {shard_file("long", 0, 2), s1}, {"--quiet"}).status == 0);
  REQUIRE(run_program(sweep_binary(), {"long.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::first_difference(dir / "long.h5", dir / "reference.h5") == "");
}

// ---- datasets added by later versions ------------------------------------------------------

namespace {

using sweep_test::detail::Handle;

// What a later version might add beside today's datasets, written for the runs a file holds
// (`done_replicas` of it): a [P, R] string per run, a [P, R, K] count table whose K grows
// with the runs written (fill -1), a table of rows per run (point, replica, text, value)
// in (point, replica) order, and a dataset not indexed by point.
void add_later_datasets(const std::string& file, std::size_t points, std::size_t replicas) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle f{H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  REQUIRE(f.id >= 0);
  std::vector<std::uint8_t> done(points * replicas);
  {
    Handle d{H5Dopen2(f.id, "done_replicas", H5P_DEFAULT), H5Dclose};
    REQUIRE(H5Dread(d.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done.data()) >= 0);
  }
  Handle group{H5Gcreate2(f.id, "later", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
  Handle text{H5Tcopy(H5T_C_S1), H5Tclose};
  H5Tset_size(text.id, H5T_VARIABLE);
  H5Tset_cset(text.id, H5T_CSET_UTF8);

  std::vector<std::string> labels(points * replicas);
  std::vector<const char*> label_pointers(points * replicas, nullptr);
  std::size_t width = 0;  // K: the widest count row this file holds
  for (std::size_t i = 0; i < points * replicas; ++i)
    if (done[i]) {
      labels[i] = "run " + std::to_string(i / replicas) + "." + std::to_string(i % replicas);
      label_pointers[i] = labels[i].c_str();
      width = std::max(width, i / replicas % 3 + 1);
    }
  {
    const hsize_t dims[2] = {points, replicas};
    Handle space{H5Screate_simple(2, dims, nullptr), H5Sclose};
    Handle d{H5Dcreate2(group.id, "label", text.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    // Only the runs held are written, as a writer filling rows as points finish would.
    for (std::size_t i = 0; i < points * replicas; ++i) {
      if (!done[i]) continue;
      const hsize_t start[2] = {i / replicas, i % replicas}, count[2] = {1, 1};
      Handle file_space{H5Dget_space(d.id), H5Sclose};
      H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, start, nullptr, count, nullptr);
      Handle one{H5Screate_simple(2, count, nullptr), H5Sclose};
      REQUIRE(H5Dwrite(d.id, text.id, one.id, file_space.id, H5P_DEFAULT, &label_pointers[i]) >= 0);
    }
  }
  {
    const hsize_t dims[3] = {points, replicas, width}, max_dims[3] = {points, replicas, H5S_UNLIMITED}, chunk[3] = {1, replicas, 4};
    Handle space{H5Screate_simple(3, dims, max_dims), H5Sclose};
    Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(dcpl.id, 3, chunk);
    const std::int32_t fill = -1;
    H5Pset_fill_value(dcpl.id, H5T_NATIVE_INT32, &fill);
    Handle d{H5Dcreate2(group.id, "counts", H5T_STD_I32LE, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
    for (std::size_t i = 0; i < points * replicas; ++i) {
      if (!done[i]) continue;
      const std::size_t k = i / replicas % 3 + 1;
      std::vector<std::int32_t> row(k, static_cast<std::int32_t>(i * 10));
      const hsize_t start[3] = {i / replicas, i % replicas, 0}, count[3] = {1, 1, k};
      Handle file_space{H5Dget_space(d.id), H5Sclose};
      H5Sselect_hyperslab(file_space.id, H5S_SELECT_SET, start, nullptr, count, nullptr);
      Handle memory{H5Screate_simple(3, count, nullptr), H5Sclose};
      REQUIRE(H5Dwrite(d.id, H5T_NATIVE_INT32, memory.id, file_space.id, H5P_DEFAULT, row.data()) >= 0);
    }
    Handle scalar{H5Screate(H5S_SCALAR), H5Sclose};
    Handle attribute{H5Acreate2(d.id, "meaning", text.id, scalar.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    const char* meaning = "a count per run";
    H5Awrite(attribute.id, text.id, &meaning);
  }
  {
    struct Row {
      std::int64_t point;
      std::int32_t replica;
      const char* what;
      double value;
    };
    Handle row_type{H5Tcreate(H5T_COMPOUND, sizeof(Row)), H5Tclose};
    H5Tinsert(row_type.id, "point", HOFFSET(Row, point), H5T_NATIVE_INT64);
    H5Tinsert(row_type.id, "replica", HOFFSET(Row, replica), H5T_NATIVE_INT32);
    H5Tinsert(row_type.id, "what", HOFFSET(Row, what), text.id);
    H5Tinsert(row_type.id, "value", HOFFSET(Row, value), H5T_NATIVE_DOUBLE);
    static const char* const kWhat[] = {"first", "second"};
    std::vector<Row> rows;
    for (std::size_t i = 0; i < points * replicas; ++i)
      if (done[i])
        for (std::size_t e = 0; e <= i % 2; ++e)
          rows.push_back({static_cast<std::int64_t>(i / replicas), static_cast<std::int32_t>(i % replicas), kWhat[e], i + 0.25 * e});
    const hsize_t dims[1] = {rows.size()}, max_dims[1] = {H5S_UNLIMITED}, chunk[1] = {64};
    Handle space{H5Screate_simple(1, dims, max_dims), H5Sclose};
    Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(dcpl.id, 1, chunk);
    Handle d{H5Dcreate2(group.id, "events", row_type.id, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
    if (!rows.empty()) REQUIRE(H5Dwrite(d.id, row_type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) >= 0);
  }
  {
    const double constants[3] = {1.5, -2.0, 65504.0};
    const hsize_t dims[1] = {3};
    Handle space{H5Screate_simple(1, dims, nullptr), H5Sclose};
    Handle d{H5Dcreate2(group.id, "constants", H5T_IEEE_F64LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    REQUIRE(H5Dwrite(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, constants) >= 0);
  }
}

}  // namespace

TEST_CASE("datasets a later version adds are merged from the files' own layout", "[scaleout]") {
  TempDir dir;
  write_file(dir / "sum.yaml", kSummation);
  REQUIRE(run_program(sweep_binary(), {"sum.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  add_later_datasets(dir / "reference.h5", 16, 3);
  REQUIRE(some_point_split(16, 3, 5));
  run_shards(dir, "sum.yaml", 5, {0, 1, 2, 3, 4});
  std::vector<std::string> shards;
  for (int k = 0; k < 5; ++k) {
    shards.push_back(shard_file("sum", k, 5));
    add_later_datasets(dir / shards.back(), 16, 3);
  }
  const ProcessResult merged = merge(dir, "sum.h5", shards, {"--quiet"});
  INFO(merged.err);
  REQUIRE(merged.status == 0);
  CHECK(sweep_test::first_difference(dir / "sum.h5", dir / "reference.h5") == "");
  CHECK(sweep_test::dataset_shape(dir / "sum.h5", "later/counts") == std::vector<hsize_t>{16, 3, 3});
  CHECK(sweep_test::dataset_shape(dir / "sum.h5", "later/events") == std::vector<hsize_t>{72});

  // A dataset not indexed by point must be the same everywhere.
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const std::string path = dir / shards[2];
    Handle f{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
    Handle d{H5Dopen2(f.id, "later/constants", H5P_DEFAULT), H5Dclose};
    const double changed[3] = {1.5, -2.0, 65520.0};
    REQUIRE(H5Dwrite(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, changed) >= 0);
  }
  const ProcessResult differs = merge(dir, "sum2.h5", shards);
  CHECK(differs.status == 2);
  CHECK(differs.err.find("/later/constants") != std::string::npos);
}

// ---- MPI -------------------------------------------------------------------------------

namespace {

std::string mpirun() {
  const char* path = std::getenv("MPIRUN");
  if (!path) FAIL("set MPIRUN to mpirun (meson test does when built with -Dmpi=enabled)");
  return path;
}

std::vector<std::string> mpi_args(int ranks, std::vector<std::string> sweep_args) {
  std::vector<std::string> args{"-n", std::to_string(ranks), "--oversubscribe", sweep_binary()};
  args.insert(args.end(), sweep_args.begin(), sweep_args.end());
  return args;
}

// The process of `rank` among the children of mpirun `parent` (0 while not yet started).
pid_t rank_process(pid_t parent, int rank) {
  DIR* proc = opendir("/proc");
  pid_t found = 0;
  for (dirent* entry; proc && (entry = readdir(proc)) && !found;) {
    const std::string name = entry->d_name;
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    std::getline(stat, line);
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream environ("/proc/" + name + "/environ", std::ios::binary);
    const std::string wanted = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
    for (std::string variable; std::getline(environ, variable, '\0');)
      if (variable == wanted) found = static_cast<pid_t>(std::stol(name));
  }
  if (proc) closedir(proc);
  return found;
}

// Starts mpirun, waits until `file` exists and `delay` more, then kills `rank` with `signal`.
ProcessResult kill_rank_during_run(const TempDir& dir, const std::vector<std::string>& args, const std::string& file, int rank,
                                   int signal, std::chrono::milliseconds delay) {
  const pid_t job = sweep_test::start_program(mpirun(), args, dir.path().string());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(dir / file) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(delay);
  pid_t target = 0;
  while (!(target = rank_process(job, rank)) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (target) kill(target, signal);
  ProcessResult result = sweep_test::finish_program(job, dir.path().string());
  if (!target) result.status = -1;
  return result;
}

// 40 points x 2 replicas of a million additions: about 2 s on two idle cores, so that a
// signal 0.6 s after the output appears finds some points written and most not.
const std::string kLong = "experiment: swamping\nseed: 9\nreplicas: 2\noutput: long.h5\ngrid:\n  rounding: [rne, sr]\n"
                          "  sr_bits: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]\n"
                          "  steps: 1000000\n  trace_every: 100000\n";

}  // namespace

TEST_CASE("mpirun -n 2 --oversubscribe gives the datasets of -j1 (summation, train, counts and traps)", "[mpi]") {
  for (const auto& [stem, text] : {std::pair<std::string, std::string>{"sum", kSummation}, {"train", kTrain},
                                   {"exc", kExceptions}}) {
    INFO(stem);
    TempDir dir;
    write_file(dir / (stem + ".yaml"), text);
    REQUIRE(run_program(sweep_binary(), {stem + ".yaml", "-j", "1", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
    for (const int ranks : {2, 3}) {
      const ProcessResult r = run_program(mpirun(), mpi_args(ranks, {stem + ".yaml", "-j", "1"}), dir.path().string());
      INFO("ranks " << ranks << ": " << r.err);
      REQUIRE(r.status == 0);
      CHECK(r.out.find("output: " + stem + ".h5") != std::string::npos);
      CHECK(sweep_test::first_difference(dir / (stem + ".h5"), dir / "reference.h5") == "");
      std::filesystem::remove(dir / (stem + ".h5"));
    }
  }
}

TEST_CASE("under mpirun: bad input exits 2 with one line; --shard composes with MPI", "[mpi]") {
  TempDir dir;
  write_file(dir / "bad.yaml", "experiment: summation\noutput: bad.h5\ngrid:\n  n: -3\n");
  const ProcessResult bad = run_program(mpirun(), mpi_args(2, {"bad.yaml"}), dir.path().string());
  INFO(bad.err);
  CHECK(bad.status == 2);
  CHECK(bad.err.find("bad.yaml:4:6: grid.n") != std::string::npos);
  write_file(dir / "sum.yaml", kSummation);
  REQUIRE(run_program(sweep_binary(), {"sum.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  REQUIRE(run_program(mpirun(), mpi_args(2, {"sum.yaml", "--shard", "0/2", "--quiet"}), dir.path().string()).status == 0);
  run_shards(dir, "sum.yaml", 2, {1});
  REQUIRE(merge(dir, "sum.h5", {shard_file("sum", 0, 2), shard_file("sum", 1, 2)}, {"--quiet"}).status == 0);
  CHECK(sweep_test::first_difference(dir / "sum.h5", dir / "reference.h5") == "");
}

namespace {

// Completes the partial long.h5 with `resume` (a sweep --resume command line) and compares
// it with an uninterrupted single-machine run.
void check_resume_completes(const TempDir& dir, const std::string& program, const std::vector<std::string>& resume) {
  CHECK(sweep_test::string_attribute(dir / "long.h5", "/", "status") == "partial");
  const auto resumed = run_program(program, resume, dir.path().string());
  INFO(resumed.err);
  REQUIRE(resumed.status == 0);
  REQUIRE(run_program(sweep_binary(), {"long.yaml", "-o", "reference.h5", "--quiet"}, dir.path().string()).status == 0);
  CHECK(sweep_test::first_difference(dir / "long.h5", dir / "reference.h5") == "");
}

// Runs kLong under mpirun on `ranks` ranks of one thread and sends `signal` to `rank`
// 0.6 s after the output appears.
ProcessResult signal_long_run(const TempDir& dir, int ranks, int rank, int signal) {
  write_file(dir / "long.yaml", kLong);
  return kill_rank_during_run(dir, mpi_args(ranks, {"long.yaml", "-j", "1"}), "long.h5", rank, signal,
                              std::chrono::milliseconds(600));
}

}  // namespace

TEST_CASE("under mpirun, SIGINT to rank 0 saves what finished and exits 130; --resume completes it", "[mpi]") {
  TempDir dir;
  const ProcessResult r = signal_long_run(dir, 2, 0, SIGINT);
  INFO(r.err);
  REQUIRE(r.status == 130);
  CHECK(r.err.find("continue with: sweep long.yaml --resume") != std::string::npos);
  check_resume_completes(dir, mpirun(), mpi_args(2, {"long.yaml", "--resume", "--quiet"}));
}

TEST_CASE("under mpirun, a rank that dies makes the run exit non-zero with what finished saved", "[mpi]") {
  TempDir dir;
  const ProcessResult r = signal_long_run(dir, 3, 1, SIGKILL);
  INFO(r.err);
  CHECK(r.status != 0);
  CHECK(r.status != -1);  // the rank was found and killed
  REQUIRE(std::filesystem::exists(dir / "long.h5"));
  const auto done = sweep_test::read_dataset<std::uint8_t>(dir / "long.h5", "done");
  CHECK(std::count(done.begin(), done.end(), 1) > 0);
  check_resume_completes(dir, sweep_binary(), {"long.yaml", "--resume", "--quiet"});
}
