#include "h5file.hpp"

#include <sys/file.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "build_info.hpp"
#include "emu/status.hpp"

namespace roundoff::sweep {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Hid create_dataset(hid_t group, const std::string& name, hid_t file_type, const std::vector<hsize_t>& dims,
                   const void* fill = nullptr, hid_t fill_type = -1) {
  Hid dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  if (fill) check(H5Pset_fill_value(dcpl.get(), fill_type, fill), "H5Pset_fill_value");
  Hid space = simple_space(dims);
  return checked(H5Dcreate2(group, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                 H5Dclose, "create dataset " + name);
}

// A chunked, compressed dataset whose last dimension grows; NaN where nothing was written.
Hid create_growing_dataset(hid_t group, const std::string& name, std::vector<hsize_t> dims, std::vector<hsize_t> chunk) {
  Hid dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
  check(H5Pset_shuffle(dcpl.get()), "H5Pset_shuffle");
  check(H5Pset_deflate(dcpl.get(), 4), "H5Pset_deflate");
  check(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_DOUBLE, &kNaN), "H5Pset_fill_value");
  std::vector<hsize_t> max_dims = dims;
  max_dims.back() = H5S_UNLIMITED;
  Hid space = simple_space(dims, max_dims);
  return checked(H5Dcreate2(group, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                 H5Dclose, "create dataset " + name);
}

std::string iso8601_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

// Trace chunks: one point, up to 256 replicas, at most 256 KiB, and no longer along T than
// the longest trace the plan declares (a chunk is compressed whole: 32,768 mostly-NaN
// values per point for a 60-sample trace made writing and merging ten times slower).
// Fixed by the plan alone, so that every run of a config lays the file out the same way.
std::vector<hsize_t> trace_chunk(const SweepPlan& plan) {
  const hsize_t chunk_replicas = std::min<hsize_t>(plan.replicas, 256);
  hsize_t length = std::max<hsize_t>(1, 32768 / chunk_replicas);
  if (!plan.trace_lengths.empty()) {
    const std::int64_t longest = *std::max_element(plan.trace_lengths.begin(), plan.trace_lengths.end());
    length = std::clamp<hsize_t>(static_cast<hsize_t>(std::max<std::int64_t>(longest, 1)), 1, length);
  }
  return {1, chunk_replicas, length};
}

}  // namespace

std::string build_roundoff_version() { return ROUNDOFF_VERSION; }
std::string build_git_commit() { return ROUNDOFF_GIT_COMMIT; }

namespace {

// The shard a file's root attributes name, if any.
std::optional<Shard> shard_attributes(hid_t file) {
  if (H5Aexists(file, "shard_index") <= 0 || H5Aexists(file, "shard_count") <= 0) return std::nullopt;
  const std::int64_t index = read_int64_attribute(file, "shard_index"), count = read_int64_attribute(file, "shard_count");
  if (count < 1 || count > kMaxShards || index < 0 || index >= count) return std::nullopt;
  return Shard{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(count)};
}

}  // namespace

ExistingOutput inspect_output(const std::string& path) {
  silence_hdf5_errors();
  ExistingOutput existing;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) return existing;  // missing
  if (LockProbe(path, LOCK_SH).refused()) {  // before HDF5 opens it: that would fail like a foreign file
    existing.kind = ExistingOutput::Kind::in_use;
    return existing;
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    existing.kind = ExistingOutput::Kind::not_hdf5;
    return existing;
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    existing.kind = ExistingOutput::Kind::not_hdf5;
    return existing;
  }
  Hid guard(file, H5Fclose);
  existing.config_sha256 = read_string_attribute(file, "config_sha256");
  existing.status = read_string_attribute(file, "status");
  existing.roundoff_version = read_string_attribute(file, "roundoff_version");
  existing.git_commit = read_string_attribute(file, "git_commit");
  existing.shard = shard_attributes(file);
  const bool ours = !existing.config_sha256.empty() && H5Aexists(file, "roundoff_version") > 0 &&
                    H5Lexists(file, "done", H5P_DEFAULT) > 0;
  existing.kind = ours ? ExistingOutput::Kind::roundoff : ExistingOutput::Kind::not_roundoff;
  return existing;
}

namespace {

// Every attribute, group and dataset of a new output, in file `f`.
void write_layout(hid_t f, const SweepPlan& plan, const std::string& config_sha256) {
  const Experiment& experiment = *plan.experiment;
  const hsize_t n_points = plan.points.size(), replicas = plan.replicas;

  // status first: a file that exists at all says "partial" until mark_complete.
  write_attribute(f, "status", std::string("partial"));
  write_attribute(f, "experiment", experiment.name);
  write_attribute(f, "description", plan.description);
  write_attribute(f, "config", plan.config_text);
  write_attribute(f, "config_sha256", config_sha256);
  write_attribute(f, "roundoff_version", std::string(ROUNDOFF_VERSION));
  write_attribute(f, "git_commit", std::string(ROUNDOFF_GIT_COMMIT));
  write_attribute(f, "created", iso8601_utc_now());
  write_attribute(f, "seed", plan.seed);
  write_attribute(f, "replicas", static_cast<std::int64_t>(replicas));
  write_attribute(f, "n_points", static_cast<std::int64_t>(n_points));
  write_attribute(f, "headline_metric", experiment.headline_metric);
  if (plan.shard) {
    write_attribute(f, "shard_index", static_cast<std::int64_t>(plan.shard->index));
    write_attribute(f, "shard_count", static_cast<std::int64_t>(plan.shard->count));
    write_attribute(f, "config_path", plan.config_path);
  }

  Hid points = create_group(f, "points");
  for (const ParamSpec& spec : experiment.params) {
    Hid dataset;
    switch (spec.type) {
      case ParamType::integer: {
        std::vector<std::int64_t> values;
        for (const Params& p : plan.points) values.push_back(p.integer(spec.name));
        dataset = create_dataset(points.get(), spec.name, H5T_STD_I64LE, {n_points});
        write_block(dataset.get(), H5T_NATIVE_INT64, {0}, {n_points}, values.data());
        break;
      }
      case ParamType::real: {
        std::vector<double> values;
        for (const Params& p : plan.points) values.push_back(p.real(spec.name));
        dataset = create_dataset(points.get(), spec.name, H5T_IEEE_F64LE, {n_points});
        write_block(dataset.get(), H5T_NATIVE_DOUBLE, {0}, {n_points}, values.data());
        break;
      }
      case ParamType::string: {
        std::vector<const char*> values;
        for (const Params& p : plan.points) values.push_back(p.string(spec.name).c_str());
        Hid type = utf8_string_type();
        dataset = create_dataset(points.get(), spec.name, type.get(), {n_points});
        write_block(dataset.get(), type.get(), {0}, {n_points}, values.data());
        break;
      }
      case ParamType::boolean: {
        std::vector<std::uint8_t> values;
        for (const Params& p : plan.points) values.push_back(p.boolean(spec.name) ? 1 : 0);
        dataset = create_dataset(points.get(), spec.name, H5T_STD_U8LE, {n_points});
        write_block(dataset.get(), H5T_NATIVE_UINT8, {0}, {n_points}, values.data());
        break;
      }
    }
    write_attribute(dataset.get(), "meaning", spec.meaning);
    write_attribute(dataset.get(), "type", std::string(param_type_name(spec.type)));
  }

  Hid metrics = create_group(f, "metrics");
  for (const MetricSpec& spec : experiment.metrics) {
    Hid dataset = create_dataset(metrics.get(), spec.name, H5T_IEEE_F64LE, {n_points, replicas}, &kNaN, H5T_NATIVE_DOUBLE);
    write_attribute(dataset.get(), "meaning", spec.meaning);
  }

  Hid traces = create_group(f, "traces");
  for (const TraceSpec& spec : experiment.traces) {
    const std::vector<hsize_t> chunk = trace_chunk(plan);
    Hid y = create_growing_dataset(traces.get(), spec.name, {n_points, replicas, 0}, chunk);
    write_attribute(y.get(), "meaning", spec.meaning);
    write_attribute(y.get(), "x", spec.name + "_x");
    write_attribute(y.get(), "x_name", spec.x_name);
    Hid x = create_growing_dataset(traces.get(), spec.name + "_x", {n_points, 0}, {1, chunk[1] * chunk[2]});
    write_attribute(x.get(), "meaning", spec.x_name);
  }

  Hid flags = create_group(f, "flags");
  const std::uint8_t zero = 0;
  for (emu::Flag flag : emu::kAllFlags) {
    Hid dataset = create_dataset(flags.get(), emu::flag_name(flag), H5T_STD_U8LE, {n_points, replicas}, &zero, H5T_NATIVE_UINT8);
    write_attribute(dataset.get(), "meaning", std::string("1 where the run ended with the sticky ") + emu::flag_name(flag) + " flag raised");
  }

  Hid done = create_dataset(f, "done", H5T_STD_U8LE, {n_points}, &zero, H5T_NATIVE_UINT8);
  write_attribute(done.get(), "meaning", std::string("1 where every replica of the point is written"));
  Hid done_replicas = create_dataset(f, "done_replicas", H5T_STD_U8LE, {n_points, replicas}, &zero, H5T_NATIVE_UINT8);
  write_attribute(done_replicas.get(), "meaning", std::string("1 where this replica of the point is written"));
}

// The whole file as `create` leaves it, written to `path` and closed.
void write_skeleton(const std::string& path, const SweepPlan& plan, const std::string& config_sha256) {
  Hid fcpl = creation_ordered(H5P_FILE_CREATE);
  Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) throw std::runtime_error("cannot create '" + path + "'");
  write_layout(file.get(), plan, config_sha256);  // its objects are closed on return
  check(H5Fclose(file.release()), "H5Fclose");     // complete on disk before it is renamed
}

}  // namespace

OutputFile OutputFile::create(const SweepPlan& plan, const std::string& config_sha256) {
  silence_hdf5_errors();
  publish_new_file(plan.output, [&](const std::string& temporary) { write_skeleton(temporary, plan, config_sha256); });
  return open_for_resume(plan);
}

OutputFile OutputFile::open_for_resume(const SweepPlan& plan) {
  silence_hdf5_errors();
  if (LockProbe(plan.output, LOCK_EX).refused()) throw InputError(in_use_message(plan.output));
  Hid file(H5Fopen(plan.output.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) throw std::runtime_error("cannot open '" + plan.output + "' for writing");
  const auto n_points = read_int64_attribute(file.get(), "n_points");
  const auto replicas = read_int64_attribute(file.get(), "replicas");
  if (static_cast<std::size_t>(n_points) != plan.points.size() || static_cast<std::uint32_t>(replicas) != plan.replicas)
    throw std::runtime_error("'" + plan.output + "' has another shape than its config describes");
  return OutputFile(plan, std::move(file));
}

OutputFile::OutputFile(const SweepPlan& plan, Hid file) : plan_(&plan), file_(std::move(file)) {
  const hid_t f = file_.get();
  for (const MetricSpec& spec : plan.experiment->metrics) metric_sets_.push_back(open_dataset(f, "metrics/" + spec.name));
  for (const TraceSpec& spec : plan.experiment->traces) {
    trace_sets_.push_back(open_dataset(f, "traces/" + spec.name));
    trace_x_sets_.push_back(open_dataset(f, "traces/" + spec.name + "_x"));
  }
  for (emu::Flag flag : emu::kAllFlags) flag_sets_.push_back(open_dataset(f, std::string("flags/") + emu::flag_name(flag)));
  done_set_ = open_dataset(f, "done");
  done_replicas_set_ = open_dataset(f, "done_replicas");
  done_replicas_.resize(plan.points.size() * plan.replicas);
  check(H5Dread(done_replicas_set_.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done_replicas_.data()),
        "read done_replicas");
}

namespace {

// Calls write(first, count) for each run of consecutive replicas in `replicas` (ascending):
// first is the run's index in `replicas`.
template <typename Write>
void for_each_replica_run(const std::vector<std::uint32_t>& replicas, Write&& write) {
  for (std::size_t i = 0; i < replicas.size();) {
    std::size_t j = i + 1;
    while (j < replicas.size() && replicas[j] == replicas[j - 1] + 1) ++j;
    write(i, j - i);
    i = j;
  }
}

}  // namespace

void OutputFile::write_point(const PointWork& work, const std::vector<RunResult>& results) {
  const Experiment& experiment = *plan_->experiment;
  const hsize_t p = work.point;
  const std::vector<std::uint32_t>& replicas = work.replicas;
  // Writes `row` (one value per entry of `replicas`) into [p, replica] of a [P, R] dataset.
  const auto write_row = [&](hid_t dataset, hid_t memory_type, const auto& row) {
    for_each_replica_run(replicas, [&](std::size_t first, std::size_t count) {
      write_block(dataset, memory_type, {p, replicas[first]}, {1, count}, row.data() + first);
    });
  };

  for (std::size_t m = 0; m < experiment.metrics.size(); ++m) {
    std::vector<double> row;
    for (const RunResult& r : results) row.push_back(r.metrics.at(experiment.metrics[m].name));
    write_row(metric_sets_[m].get(), H5T_NATIVE_DOUBLE, row);
  }

  for (std::size_t t = 0; t < experiment.traces.size(); ++t) {
    const TraceSpec& spec = experiment.traces[t];
    const Trace* longest = nullptr;
    for (const RunResult& r : results)
      if (const auto it = r.traces.find(spec.name); it != r.traces.end() && (!longest || it->second.y.size() > longest->y.size()))
        longest = &it->second;
    if (!longest || longest->y.empty()) continue;
    const hsize_t length = longest->y.size();
    const hid_t y = trace_sets_[t].get(), x = trace_x_sets_[t].get();
    std::vector<hsize_t> y_dims = dataset_dims(y);
    if (length > y_dims[2]) {
      y_dims[2] = length;
      check(H5Dset_extent(y, y_dims.data()), "extend trace");
      const hsize_t x_dims[2] = {y_dims[0], length};
      check(H5Dset_extent(x, x_dims), "extend trace x");
    }
    std::vector<double> block(results.size() * length, kNaN);
    for (std::size_t i = 0; i < results.size(); ++i)
      if (const auto it = results[i].traces.find(spec.name); it != results[i].traces.end())
        std::copy(it->second.y.begin(), it->second.y.end(), block.begin() + static_cast<std::ptrdiff_t>(i * length));
    for_each_replica_run(replicas, [&](std::size_t first, std::size_t count) {
      write_block(y, H5T_NATIVE_DOUBLE, {p, replicas[first], 0}, {1, count, length}, block.data() + first * length);
    });
    // The x axis is the same for every replica: the longest trace's, as far as it goes.
    write_block(x, H5T_NATIVE_DOUBLE, {p, 0}, {1, length}, longest->x.data());
  }

  for (std::size_t k = 0; k < std::size(emu::kAllFlags); ++k) {
    std::vector<std::uint8_t> row;
    for (const RunResult& r : results) row.push_back((r.flags & emu::kAllFlags[k]) ? 1 : 0);
    write_row(flag_sets_[k].get(), H5T_NATIVE_UINT8, row);
  }

  const std::vector<std::uint8_t> ones(replicas.size(), 1);
  write_row(done_replicas_set_.get(), H5T_NATIVE_UINT8, ones);
  const auto row = done_replicas_.begin() + static_cast<std::ptrdiff_t>(p * plan_->replicas);
  for (std::uint32_t r : replicas) row[r] = 1;
  if (std::all_of(row, row + plan_->replicas, [](std::uint8_t d) { return d == 1; })) {
    const std::uint8_t one = 1;
    write_block(done_set_.get(), H5T_NATIVE_UINT8, {p}, {1}, &one);
  }
}

void OutputFile::flush() { check(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "H5Fflush"); }

void OutputFile::mark_complete() {
  flush();
  write_attribute(file_.get(), "status", std::string("complete"));
  flush();
}

namespace {

std::vector<std::string> read_param_column(hid_t dataset, const std::string& type, std::size_t n) {
  std::vector<std::string> column;
  if (type == "int") {
    std::vector<std::int64_t> values(n);
    check(H5Dread(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read points");
    for (std::int64_t v : values) column.push_back(std::to_string(v));
  } else if (type == "float") {
    std::vector<double> values(n);
    check(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read points");
    for (double v : values) column.push_back(to_string(ParamValue(v)));
  } else if (type == "bool") {
    std::vector<std::uint8_t> values(n);
    check(H5Dread(dataset, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read points");
    for (std::uint8_t v : values) column.push_back(v ? "true" : "false");
  } else {
    Hid string_type = utf8_string_type();
    std::vector<char*> values(n);
    check(H5Dread(dataset, string_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read points");
    for (char* v : values) column.push_back(v ? v : "");
    Hid space = checked(H5Dget_space(dataset), H5Sclose, "H5Dget_space");
    reclaim_variable_length(string_type.get(), space.get(), values.data());
  }
  return column;
}

}  // namespace

SweepSummary read_summary(const std::string& path) {
  silence_hdf5_errors();
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) throw std::runtime_error("cannot open '" + path + "'");
  const hid_t f = file.get();
  SweepSummary summary;
  summary.experiment = read_string_attribute(f, "experiment");
  summary.headline_metric = read_string_attribute(f, "headline_metric");
  summary.status = read_string_attribute(f, "status");
  summary.shard = shard_attributes(f);
  summary.n_points = static_cast<std::uint64_t>(read_int64_attribute(f, "n_points"));
  summary.replicas = static_cast<std::uint64_t>(read_int64_attribute(f, "replicas"));
  const std::size_t runs = summary.n_points * summary.replicas;

  Hid points = checked(H5Gopen2(f, "points", H5P_DEFAULT), H5Gclose, "open /points");
  summary.param_names = link_names(points.get());
  for (const std::string& name : summary.param_names) {
    Hid dataset = open_dataset(points.get(), name);
    summary.param_values.push_back(read_param_column(dataset.get(), read_string_attribute(dataset.get(), "type"), summary.n_points));
  }

  std::vector<double> headline(runs, kNaN);
  if (!summary.headline_metric.empty()) {
    Hid dataset = open_dataset(f, "metrics/" + summary.headline_metric);
    check(H5Dread(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, headline.data()), "read headline metric");
  }
  // Files written before /done_replicas existed mark whole points in /done only.
  std::vector<std::uint8_t> done(runs);
  if (H5Lexists(f, "done_replicas", H5P_DEFAULT) > 0) {
    Hid dataset = open_dataset(f, "done_replicas");
    check(H5Dread(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done.data()), "read done_replicas");
  } else {
    std::vector<std::uint8_t> done_points(summary.n_points);
    Hid dataset = open_dataset(f, "done");
    check(H5Dread(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done_points.data()), "read done");
    for (std::size_t i = 0; i < runs; ++i) done[i] = done_points[i / summary.replicas];
  }
  for (std::uint64_t p = 0; p < summary.n_points; ++p) {
    const auto first = static_cast<std::ptrdiff_t>(p * summary.replicas), last = first + static_cast<std::ptrdiff_t>(summary.replicas);
    summary.headline.emplace_back(headline.begin() + first, headline.begin() + last);
    summary.done.emplace_back(done.begin() + first, done.begin() + last);
  }
  return summary;
}

}  // namespace roundoff::sweep
