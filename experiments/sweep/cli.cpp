#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>
#include <string>
#include <vector>

#include "config.hpp"
#include "emu/status.hpp"
#include "h5file.hpp"
#include "merge.hpp"
#include "runner.hpp"
#include "sha256.hpp"
#include "shard.hpp"
#include "signals.hpp"

namespace roundoff::sweep {
namespace {

constexpr int kExitOk = 0, kExitBug = 1, kExitBadInput = 2, kExitInterrupted = 130;

const char* const kUsage =
    "usage: sweep CONFIG.yaml [-o OUT.h5] [-j N] [--shard K/N | --shard auto] [--force | --resume] [--dry-run] [--quiet]\n"
    "       sweep merge OUT.h5 SHARD.h5... [--force] [--quiet]\n"
    "       sweep --list\n"
    "       sweep --describe EXPERIMENT | CONFIG.yaml\n"
    "\n"
    "Runs every grid point x replica of a YAML config in parallel and writes one HDF5 file\n"
    "(schema: results/README.md; config keys: configs/README.md). Under mpirun (a build\n"
    "with -Dmpi=enabled), rank 0 hands the runs out to every rank and writes the file.\n"
    "\n"
    "  -o, --output OUT   write OUT instead of the config's output (relative to the cwd;\n"
    "                     a name starting with '-' is written ./-name)\n"
    "  -j, --jobs N       use N threads (default: all cores; per rank under mpirun)\n"
    "  --shard K/N        run only shard K of N (0 <= K < N) of the runs and write a shard\n"
    "                     file (default OUTPUT.shard-K-of-N.h5); 'auto': K and N from the\n"
    "                     Slurm job array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT)\n"
    "  --force            replace an existing output (never one another process has open for writing)\n"
    "  --resume           continue a partial output of the same config\n"
    "  --dry-run          validate, print the grid size and output path, compute nothing\n"
    "  --quiet            no progress bar\n"
    "  --list             list the experiments\n"
    "  --describe NAME    an experiment's parameters, metrics and traces; for a Python\n"
    "                     experiment (experiment: python) name its config instead\n"
    "\n"
    "sweep merge checks that the shard files come from one config and one build and hold\n"
    "every run exactly once, then writes OUT, identical to a single-machine run.\n"
    "\n"
    "Exit status: 0 ok, 1 internal error (a bug), 2 bad input, 130 interrupted (finished\n"
    "points are saved; continue with --resume). Status 3 (an enabled floating-point\n"
    "exception trapped) is emu's, never sweep's: a trap inside a run (fp_exceptions: trap)\n"
    "is that run's recorded outcome (NaN metrics, the report in /traps), and the sweep\n"
    "goes on. A Python experiment's run that raises fails that run only: its traceback\n"
    "goes to /failures, the sweep goes on and exits 2 at the end (--resume reruns it).\n";

struct Arguments {
  std::optional<std::string> config, output, describe, shard;
  int jobs = 0;
  bool force = false, resume = false, dry_run = false, quiet = false, list = false, help = false;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  // A value may also be attached, as make and GNU tools allow: -j2, -oOUT.h5,
  // --jobs=2, --output=OUT.h5, --describe=NAME.
  std::optional<std::string> attached;
  const auto value_of = [&](int& i, const std::string& flag) -> std::string {
    if (attached) return *std::exchange(attached, std::nullopt);
    if (i + 1 >= argc) throw InputError("sweep: option " + flag + " needs a value (see sweep --help)");
    return argv[++i];
  };
  // A name (output file, experiment) never starts with '-': `-o --quiet` is a forgotten
  // value, not a file named --quiet (write ./--quiet for that); "-" (standard output) is
  // no HDF5 file either.
  const auto name_of = [&](int& i, const std::string& flag, bool is_file) -> std::string {
    const bool given_apart = !attached;
    std::string value = value_of(i, flag);
    if (value == "-" && is_file)
      throw InputError("sweep: option " + flag + " needs a value: '-' (standard output) is not supported; name an HDF5 file");
    if (value.rfind('-', 0) == 0)
      throw InputError("sweep: option " + flag + " needs a value, got " + (given_apart ? "the option " : "") + "'" + value +
                       "'" + (is_file ? " (for a file of that name, write ./" + value + ")" : ""));
    return value;
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    attached.reset();
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      attached = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (arg.size() > 2 && (arg.rfind("-j", 0) == 0 || arg.rfind("-o", 0) == 0)) {
      attached = arg.substr(2);
      arg.resize(2);
    }
    if (arg == "-h" || arg == "--help") args.help = true;
    else if (arg == "--list") args.list = true;
    else if (arg == "--describe") args.describe = name_of(i, arg, false);
    else if (arg == "-o" || arg == "--output") args.output = name_of(i, arg, true);
    else if (arg == "--shard") args.shard = value_of(i, arg);
    else if (arg == "-j" || arg == "--jobs") {
      const std::string text = value_of(i, arg);
      std::size_t used = 0;
      long jobs = 0;
      try {
        jobs = std::stol(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || jobs < 1 || jobs > 4096)
        throw InputError("sweep: -j needs a number of threads from 1 to 4096, got '" + text + "'");
      args.jobs = static_cast<int>(jobs);
    } else if (arg == "--force") args.force = true;
    else if (arg == "--resume") args.resume = true;
    else if (arg == "--dry-run") args.dry_run = true;
    else if (arg == "--quiet" || arg == "-q") args.quiet = true;
    else if (arg.size() > 1 && arg[0] == '-') {
      const std::vector<std::string> options = {"--output", "--jobs", "--shard", "--force", "--resume", "--dry-run",
                                                "--quiet", "--list", "--describe", "--help"};
      throw InputError("sweep: unknown option '" + arg + "'" + did_you_mean(arg, options) + " (see sweep --help)");
    } else if (args.config) {
      throw InputError("sweep: one config at a time (got '" + *args.config + "' and '" + arg + "')");
    } else {
      args.config = arg;
    }
    if (attached) throw InputError("sweep: " + arg + " takes no value (see sweep --help)");
  }
  if (args.force && args.resume) throw InputError("sweep: --force and --resume exclude each other");
  if (!args.help && (args.list || args.describe)) {
    // --list and --describe run nothing: anything else given with them is a mistake.
    const std::string mode = args.list ? "--list" : "--describe";
    std::string extra;
    if (args.list && args.describe) extra = "--describe";
    else if (args.config) extra = "'" + *args.config + "'";
    else if (args.output) extra = "-o";
    else if (args.jobs) extra = "-j";
    else if (args.shard) extra = "--shard";
    else if (args.force) extra = "--force";
    else if (args.resume) extra = "--resume";
    else if (args.dry_run) extra = "--dry-run";
    else if (args.quiet) extra = "--quiet";
    if (!extra.empty())
      throw InputError("sweep: " + mode + " takes nothing else (got " + extra + "); usage: sweep --list, sweep --describe EXPERIMENT");
  }
  if (!args.help && !args.list && !args.describe && !args.config)
    throw InputError("sweep: no config given (usage: sweep CONFIG.yaml [options]; see sweep --help)");
  return args;
}

void print_list() {
  std::size_t width = 0;
  for (const Experiment& e : experiments()) width = std::max(width, e.name.size());
  for (const Experiment& e : experiments())
    std::printf("%-*s  %s\n", static_cast<int>(width), e.name.c_str(), e.description.c_str());
  std::printf("%-*s  %s\n", static_cast<int>(width), kPythonExperiment,
              "a Python callable named by the config's run: (configs/README.md); sweep --describe CONFIG.yaml");
}

std::string limits_text(const ParamSpec& spec) {
  std::string text;
  if (!spec.allowed.empty()) {
    text = "one of:";
    for (const std::string& a : spec.allowed) text += " " + a;
  }
  if (spec.min) text += (text.empty() ? "" : "; ") + std::string(">= ") + to_string(*spec.min);
  if (spec.max) text += (text.empty() ? "" : "; ") + std::string("<= ") + to_string(*spec.max);
  if (spec.numbers_as_text) text += (text.empty() ? "" : "; ") + std::string("a plain number is taken as its text");
  return text;
}

// NAME is an experiment's name, or a config file (a .yaml, .yml or a path to a file):
// that config's experiment, the way for a Python one.
int describe(const std::string& name) {
  const bool is_config = name.ends_with(".yaml") || name.ends_with(".yml") || name.find('/') != std::string::npos;
  const SweepPlan plan = is_config ? load_plan(name, std::nullopt, /*check_output_folder=*/false) : SweepPlan{};
  const Experiment* e = is_config ? plan.experiment : find_experiment(name);
  if (!e) {
    std::vector<std::string> names;
    for (const Experiment& x : experiments()) names.push_back(x.name);
    throw InputError("sweep: --describe: unknown experiment '" + name + "'" + did_you_mean(name, names) + " (see sweep --list)");
  }
  const std::string title = plan.python_experiment ? e->name + " (" + name + ")" : e->name;
  std::printf("%s: %s\n\nparameters (name, type, default, meaning):\n", title.c_str(), e->description.c_str());
  for (const ParamSpec& p : e->params) {
    const std::string limits = limits_text(p);
    std::printf("  %-14s %-6s %-10s %s%s\n", p.name.c_str(), param_type_name(p.type), to_string(p.default_value).c_str(),
                p.meaning.c_str(), limits.empty() ? "" : (" [" + limits + "]").c_str());
  }
  if (takes_fp_exceptions(*e))
    std::printf("\nfloating-point exceptions: takes fp_exceptions (off, count, trap) with oflo, div0, inv and nanoo "
                "(configs/README.md); counts per scope and op go to /fp_counts, traps to /traps (results/README.md)%s%s\n",
                e->fp_exceptions_note.empty() ? "" : ";\n  ", e->fp_exceptions_note.c_str());
  else
    std::printf("\nfloating-point exceptions: takes no fp_exceptions parameters (the sticky flags are in /flags)%s%s\n",
                e->fp_exceptions_note.empty() ? "" : ";\n  ", e->fp_exceptions_note.c_str());
  std::printf("\nmetrics (float64 [points, replicas]; headline: %s):\n", e->headline_metric.c_str());
  for (const MetricSpec& m : e->metrics) std::printf("  %-18s %s\n", m.name.c_str(), m.meaning.c_str());
  if (!e->traces.empty()) {
    std::printf("\ntraces (float64 [points, replicas, T]):\n");
    for (const TraceSpec& t : e->traces)
      std::printf("  %-18s %s (x axis: %s)\n", t.name.c_str(), t.meaning.c_str(), t.x_name.c_str());
  }
  return kExitOk;
}

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// The lines on counted and trapped floating-point exceptions ("" when there were none).
std::string fp_exceptions_text(const SweepSummary& s) {
  std::uint64_t done_runs = 0;
  for (const std::vector<std::uint8_t>& point : s.done)
    done_runs += static_cast<std::uint64_t>(std::count(point.begin(), point.end(), 1));
  const std::string of_runs = " of " + std::to_string(done_runs) + " runs";
  std::string text;
  for (emu::Flag flag : emu::kAllFlags) {
    const auto it = s.counted_operations.find(emu::flag_name(flag));
    if (it == s.counted_operations.end()) continue;
    text += std::string(text.empty() ? "fp_exceptions counted: " : ", ") + it->first + " in " +
            std::to_string(it->second) + (it->second == 1 ? " operation" : " operations") + " of " +
            std::to_string(s.counted_runs.at(it->first)) + of_runs;
  }
  if (!text.empty()) text += " (per scope and op in /fp_counts)\n";
  if (s.trapped_runs > 0)
    text += "trapped: " + std::to_string(s.trapped_runs) + of_runs + " (their metrics are NaN; reports in /traps); first: " +
            s.first_trap + "\n";
  return text;
}

}  // namespace

// Per point: the parameters that differ between points, and mean / std / min / max of the
// headline metric over the replicas written (std with n - 1; "-" for one replica). A
// shard's file shows the points it holds runs of.
void print_summary(const std::string& path) {
  const SweepSummary s = read_summary(path);
  std::vector<std::size_t> varied;
  for (std::size_t k = 0; k < s.param_names.size(); ++k) {
    const auto& column = s.param_values[k];
    if (std::any_of(column.begin(), column.end(), [&](const std::string& v) { return v != column.front(); }))
      varied.push_back(k);
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header;
  header.push_back("point");
  for (std::size_t k : varied) header.push_back(s.param_names[k]);
  for (const char* stat : {"mean", "std", "min", "max"}) header.push_back(s.headline_metric + "." + stat);
  constexpr std::size_t kMaxRows = 1000;
  std::size_t not_shown = 0;
  for (std::size_t p = 0; p < s.n_points; ++p) {
    std::vector<double> v;
    for (std::size_t r = 0; r < s.replicas; ++r)
      if (s.done[p][r]) v.push_back(s.headline[p][r]);
    if (v.empty()) continue;
    if (rows.size() == kMaxRows) {
      ++not_shown;
      continue;
    }
    std::vector<std::string> row{std::to_string(p)};
    for (std::size_t k : varied) row.push_back(s.param_values[k][p]);
    double sum = 0, low = INFINITY, high = -INFINITY;
    bool any_nan = false;
    for (double x : v) sum += x, low = std::min(low, x), high = std::max(high, x), any_nan = any_nan || std::isnan(x);
    const double mean = sum / static_cast<double>(v.size());
    double squares = 0;
    for (double x : v) squares += (x - mean) * (x - mean);
    const std::string std_text = v.size() > 1 ? number_text(std::sqrt(squares / static_cast<double>(v.size() - 1))) : "-";
    if (any_nan) low = high = NAN;
    row.insert(row.end(), {number_text(mean), std_text, number_text(low), number_text(high)});
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  out << s.experiment << ": " << s.n_points << " points x " << s.replicas << " replicas ("
      << (s.shard ? "shard " + s.shard->text() + ", " : "") << s.status << ")\n";
  for (const auto* row : {&header}) {
    for (std::size_t c = 0; c < row->size(); ++c) out << (c ? "  " : "") << std::string(width[c] - (*row)[c].size(), ' ') << (*row)[c];
    out << '\n';
  }
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) out << (c ? "  " : "") << std::string(width[c] - row[c].size(), ' ') << row[c];
    out << '\n';
  }
  if (not_shown) out << "... " << not_shown << " more points; all are in the file (python3 -m roundoff.results reads them)\n";
  out << fp_exceptions_text(s);
  out << "output: " << path << '\n';
  std::cout << out.str() << std::flush;
}

namespace {

int interrupted_before_start() {
  std::fprintf(stderr, "sweep: interrupted before any point was computed; nothing written\n");
  return kExitInterrupted;
}

// The command that continues (or, for a shard, redoes) this run, for hints.
std::string command_for(const Arguments& args, const SweepPlan& plan, const std::string& extra) {
  std::string command = "sweep " + shell_quoted(*args.config);
  if (plan.shard) command += " --shard " + plan.shard->text();
  if (args.output) command += " -o " + shell_quoted(*args.output);
  return command + extra;
}

// Every run of the plan, or those of its shard.
std::vector<PointWork> work_of(const SweepPlan& plan) {
  const auto n_points = static_cast<std::uint32_t>(plan.points.size());
  if (plan.shard) return shard_items(n_points, plan.replicas, *plan.shard);
  std::vector<std::uint32_t> all(plan.replicas);
  for (std::uint32_t r = 0; r < plan.replicas; ++r) all[r] = r;
  std::vector<PointWork> work;
  for (std::uint32_t p = 0; p < n_points; ++p) work.push_back({p, all});
  return work;
}

std::string shard_text(const std::optional<Shard>& shard) { return shard ? "shard " + shard->text() : "the whole sweep"; }

int run(const Arguments& args, WorkerGroup* workers) {
  SweepPlan plan = load_plan(*args.config, args.output);
  if (args.shard) {
    plan.shard = parse_shard(*args.shard);
    if (!args.output) plan.output = shard_output_path(plan.output, *plan.shard);
  }
  const std::string sha = sha256_hex(plan.config_text);
  const std::size_t n_points = plan.points.size();
  if (stop_requested().load()) return interrupted_before_start();
  const std::vector<PointWork> work = work_of(plan);

  if (args.dry_run) {
    std::printf("%s: %zu points x %u replicas = %zu runs\n", plan.experiment->name.c_str(), n_points, plan.replicas,
                n_points * plan.replicas);
    if (plan.shard) {
      std::size_t runs = 0;
      for (const PointWork& w : work) runs += w.replicas.size();
      std::printf("shard %s: %zu runs (%s)\n", plan.shard->text().c_str(), runs, describe_items(work, plan.replicas).c_str());
    }
    std::printf("output: %s\n", plan.output.c_str());
    return kExitOk;
  }

  const ExistingOutput existing = inspect_output(plan.output);
  const std::string& out = plan.output;
  bool resume = false;
  if (existing.kind == ExistingOutput::Kind::in_use) throw InputError(in_use_message(out));  // --force too
  if (existing.kind != ExistingOutput::Kind::missing && !args.force) {
    if (existing.kind == ExistingOutput::Kind::not_hdf5)
      throw InputError("sweep: " + out + " exists and is not an HDF5 file; left untouched (choose another -o, or --force to overwrite)");
    if (existing.kind == ExistingOutput::Kind::damaged)
      throw InputError("sweep: " + out + " is damaged: " + existing.damage + "; left untouched (choose another -o, or --force to overwrite)");
    if (existing.kind == ExistingOutput::Kind::not_roundoff)
      throw InputError("sweep: " + out + " exists and is not a roundoff sweep output; left untouched (choose another -o, or --force to overwrite)");
    if (existing.config_sha256 != sha)
      throw InputError("sweep: " + out + " was written by another config (config_sha256 differs); left untouched " +
                       (args.resume ? "and not resumed " : "") + "(choose another -o, or --force to overwrite)");
    const auto same_shard = [](const std::optional<Shard>& a, const std::optional<Shard>& b) {
      return a.has_value() == b.has_value() && (!a || (a->index == b->index && a->count == b->count));
    };
    if (!same_shard(existing.shard, plan.shard))
      throw InputError("sweep: " + out + " holds " + shard_text(existing.shard) + " of this config, not " + shard_text(plan.shard) +
                       "; left untouched (" +
                       (existing.shard ? "continue it with --shard " + existing.shard->text() + ", merge shards with sweep merge, "
                                       : std::string()) +
                       "choose another -o, or --force to overwrite)");
    // Read whole before anything is said about it: a damaged file is refused (exit 2, left
    // as it is), never shown as complete first nor half resumed.
    check_readable_output(out);
    if (existing.status == "complete") {
      std::fprintf(stderr, "sweep: %s is already complete for this config%s; showing it (--force recomputes)\n", out.c_str(),
                   plan.shard ? (" (shard " + plan.shard->text() + ")").c_str() : "");
      print_summary(out);
      return kExitOk;
    }
    if (!args.resume)
      throw InputError("sweep: " + out + " holds a partial run of this config; continue it with --resume (" +
                       command_for(args, plan, " --resume") + "), or start over with --force");
    // One file, one build: finishing another build's partial run could mix two builds' numbers.
    const std::string version = build_roundoff_version(), commit = build_git_commit();
    if (existing.roundoff_version != version || existing.git_commit != commit)
      throw InputError("sweep: " + out + " holds a partial run by another build (roundoff_version " + existing.roundoff_version +
                       ", git_commit " + existing.git_commit + "; this is " + version + ", " + commit +
                       "); not resumed, so that one file holds one build's numbers: start over with --force");
    resume = true;
  }
  if (stop_requested().load()) return interrupted_before_start();

  RunReport report;
  bool output_exists = resume;  // a valid partial file that --resume continues
  try {
    // A signal from here on: the points finished so far (maybe none) are in a valid
    // partial file that --resume continues.
    // Declared first so that the output is closed before the workers are waited for.
    std::unique_ptr<RemoteWorkers> remote;
    OutputFile output = resume ? OutputFile::open_for_resume(plan) : OutputFile::create(plan, sha);
    output_exists = true;
    if (workers) remote = workers->start(plan, args.jobs);
    RunOptions options;
    options.threads = args.jobs;
    options.progress = !args.quiet && isatty(STDERR_FILENO);
    report = run_plan(plan, output, work, options, stop_requested(), remote.get());
    if (report.complete) output.mark_complete();
  } catch (const H5Error& e) {
    // A full disk or an I/O error (ENOSPC, EIO, EDQUOT, ...): the environment's, not a bug.
    // Every flush leaves a valid file, so what was flushed before the failure stays.
    if (e.error_number() == 0) throw;
    throw InputError("sweep: cannot write " + out + ": " + std::strerror(e.error_number()) + " (" + e.what() + "); " +
                     (output_exists ? "the points saved before are kept: once the cause is fixed, continue with: " +
                                          command_for(args, plan, " --resume")
                                    : std::string("nothing was written")));
  }
  if (report.failed_runs > 0 && !stop_requested().load()) {
    print_summary(out);
    std::fprintf(stderr,
                 "sweep: %zu %s raised; %s in %s /failures (python3 -m roundoff.results %s --failures); after a fix, "
                 "rerun %s with: %s\n",
                 report.failed_runs, report.failed_runs == 1 ? "run" : "runs", report.failed_runs == 1 ? "its traceback is" : "their tracebacks are",
                 out.c_str(), shell_quoted(out).c_str(), report.failed_runs == 1 ? "it" : "them", command_for(args, plan, " --resume").c_str());
    return kExitBadInput;
  }
  if (!report.complete) {
    std::fprintf(stderr, "sweep: interrupted; %zu of %zu points%s saved in %s (status partial); continue with: %s\n",
                 report.points_done, report.n_points, plan.shard ? (" of shard " + plan.shard->text()).c_str() : "",
                 out.c_str(), command_for(args, plan, " --resume").c_str());
    return kExitInterrupted;
  }
  print_summary(out);
  return kExitOk;
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

int sweep_main(int argc, char** argv, WorkerGroup* workers) {
  const StopSignals signals;  // first of all: no moment is left to the default action
  silence_hdf5_errors();      // before any other HDF5 call (it also keeps HDF5's exit handler off)
  try {
    if (argc > 1 && std::string(argv[1]) == "merge") return merge_main(argc - 1, argv + 1);
    const Arguments args = parse_arguments(argc, argv);
    if (args.help) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
    if (args.list) {
      print_list();
      return kExitOk;
    }
    if (args.describe) return describe(*args.describe);
    return run(args, workers);
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", one_line(e.what()).c_str());
    return kExitBadInput;
  } catch (const ExperimentBadInput& e) {
    std::fprintf(stderr, "%s (finished points were saved)\n", one_line(e.what()).c_str());
    return kExitBadInput;
  } catch (const ExperimentFailure& e) {
    std::fprintf(stderr, "sweep: internal error in an experiment: %s (this is a bug; finished points were saved)\n",
                 one_line(e.what()).c_str());
    return kExitBug;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sweep: internal error: %s (this is a bug, unless the file system failed)\n", one_line(e.what()).c_str());
    return kExitBug;
  }
}

}  // namespace roundoff::sweep
