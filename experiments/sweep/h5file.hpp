// The sweep's output file (HDF5 C API). Layout, documented in results/README.md:
//   /                 attributes experiment, description, config, config_sha256,
//                     roundoff_version, git_commit, created, seed, replicas, n_points,
//                     headline_metric, status ("partial" until the very end, then "complete")
//   /points/<param>   [P] int64 | float64 | UTF-8 string | uint8 (bool); attrs meaning, type
//   /metrics/<name>   [P, R] float64, NaN until written; attr meaning
//   /traces/<name>    [P, R, T] float64, chunked + gzip, NaN-padded; attrs meaning, x, x_name
//   /traces/<name>_x  [P, T] float64: the x axis of each point's trace; attr meaning
//   /flags/<FLAG>     [P, R] uint8 for OFLO DIV0 INV UFLO INEXACT
//   /fp_counts/<col>  [P, R, K(, 4 | M)]: counted flags per (scope, op), one row each
//   /traps/<col>      [P, R(, 4 | M)]: the trap that ended a run
//   /done             [P] uint8: every replica of the point is written
//   /done_replicas    [P, R] uint8: this run is written
//   /failures/<col>   [F]: the runs whose own code raised and are not done (point,
//                     replica, message, traceback); only while there are any
// A shard's file (sweep --shard K/N) has the same layout and adds the root attributes
// shard_index, shard_count and config_path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config.hpp"
#include "h5util.hpp"

namespace roundoff::sweep {

// This build's roundoff_version and git_commit attributes.
std::string build_roundoff_version();
std::string build_git_commit();

// What is already at an output path. `in_use`: another process holds it open for writing
// (HDF5's file lock; e.g. a sweep still running): it must be left alone, even with --force.
struct ExistingOutput {
  // damaged: HDF5 fails, crashes or loops reading its root attributes (`damage` says
  // how; they are read in a child process first, as check_readable_output does).
  enum class Kind { missing, in_use, not_hdf5, damaged, not_roundoff, roundoff } kind = Kind::missing;
  std::string damage;
  std::string config_sha256;     // for roundoff files
  std::string status;            // "partial" or "complete"
  std::string roundoff_version;  // of the build that created it
  std::string git_commit;
  std::optional<Shard> shard;    // a shard's file
};
ExistingOutput inspect_output(const std::string& path, int cpu_seconds = 60);

// A file that opens as HDF5 but not as the layout it claims (a dataset of the wrong size,
// attributes out of range): what is wrong with it.
class DamagedFile : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the summary, /failures and then every dataset whole (a trace chunk that does not
// decompress is damage too) of an existing output in a child process, so that no
// damage can crash this one (HDF5 1.10 is not hardened against damaged files: a damaged
// heap of strings makes it read out of bounds, a damaged global heap makes it loop for
// ever, hence the child's limit of cpu_seconds). InputError naming the file and what is
// wrong when anything fails; the file is opened read-only and never changed.
void check_readable_output(const std::string& path, const std::string& program = "sweep", int cpu_seconds = 60);

// A run whose own code raised (RunRaised): the exception's line and its traceback.
struct FailedRun {
  std::string message, traceback;
};

class OutputFile {
 public:
  // Writes the complete skeleton (every dataset, status "partial") under a temporary name
  // in the output's directory, closes it, renames it onto the output path (replacing any
  // file there, unless another process holds that one open for writing: InputError) and
  // opens it for writing. A crash or signal at any moment of this leaves at the output
  // path the old file (or none) or a complete partial file, never a truncated or
  // half-written one.
  static OutputFile create(const SweepPlan& plan, const std::string& config_sha256);
  // Opens a partial file of the same plan to continue it (InputError when another process
  // holds it open).
  static OutputFile open_for_resume(const SweepPlan& plan);

  // [P * R], row-major: 1 where the run (point, replica) is written.
  const std::vector<std::uint8_t>& done_replicas() const { return done_replicas_; }
  // Writes the results of some replicas of one point (results[i] is replica
  // work.replicas[i]) and marks them done; the point is done once all its replicas are
  // (the done flags reach the file at the next flush, after the results).
  // Also removes those runs from /failures.
  void write_point(const PointWork& work, const std::vector<RunResult>& results);
  // Records a run that raised in /failures (replacing an earlier failure of that run); it
  // stays not done. Written at the next flush.
  void record_failure(std::uint32_t point, std::uint32_t replica, const std::string& message, const std::string& traceback);
  // A failed write or flush (H5Error: a full disk, an I/O error) leaves the file as the
  // last successful flush left it, unclosed, and this object unusable.
  void flush();
  // Sets status "complete" and flushes: call only after the last point is written.
  void mark_complete();

 private:
  OutputFile(const SweepPlan& plan, Hid file);
  void write_point_unguarded(const PointWork& work, const std::vector<RunResult>& results);
  void guarded(const std::function<void()>& write);
  void abandon();
  void write_done_flags();
  void write_out_chunks();
  void reserve_space();
  void flush_reserved(const char* what);
  hsize_t flushed_size_ = 0;  // the file's size at the last flush
  const SweepPlan* plan_;
  Hid file_;
  // Open once: per-point writes would otherwise spend most of their time opening datasets.
  std::vector<Hid> metric_sets_, trace_sets_, trace_x_sets_, flag_sets_;  // in spec order
  std::map<std::string, Hid> fp_sets_;  // /fp_counts/* and /traps/*, by path
  Hid done_set_, done_replicas_set_;
  std::vector<std::uint8_t> done_replicas_;
  std::set<std::uint32_t> unflushed_done_;  // points with runs written since the last flush
  std::map<std::pair<std::uint32_t, std::uint32_t>, FailedRun> failures_;  // by (point, replica)
  bool failures_changed_ = false;
};

// What the summary table shows, read back from a file.
struct SweepSummary {
  std::string experiment, headline_metric, status;
  std::uint64_t n_points = 0, replicas = 0;
  std::vector<std::string> param_names;                 // in the experiment's order
  std::vector<std::vector<std::string>> param_values;   // [param][point], as spelled
  std::vector<std::vector<double>> headline;            // [point][replica]
  std::vector<std::vector<std::uint8_t>> done;          // [point][replica]: the run is written
  std::optional<Shard> shard;
  // fp_exceptions, over the runs written: runs that ended in a trap, the first of them
  // ("point P replica R: REPORT"; by point, then replica), and the counted operations and
  // the runs that counted any, per flag name.
  std::uint64_t trapped_runs = 0;
  std::string first_trap;
  std::map<std::string, std::uint64_t> counted_operations, counted_runs;
};
SweepSummary read_summary(const std::string& path);

}  // namespace roundoff::sweep
