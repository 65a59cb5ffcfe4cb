#include "h5file.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string_view>

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

// A chunked dataset whose dimensions listed in `growing` can be extended (H5S_UNLIMITED);
// `fill` (of memory type `fill_type`) where nothing was written; no fill: HDF5's default
// (empty strings: a variable-length fill value would make unwritten chunks unreadable
// without write access). Numbers are shuffled and gzip-compressed (level 4);
// variable-length strings are stored as they are.
Hid create_growing_dataset(hid_t group, const std::string& name, hid_t file_type, const std::vector<hsize_t>& dims,
                           const std::vector<std::size_t>& growing, const std::vector<hsize_t>& chunk, hid_t fill_type,
                           const void* fill) {
  Hid dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
  if (H5Tget_class(file_type) != H5T_STRING) {
    check(H5Pset_shuffle(dcpl.get()), "H5Pset_shuffle");
    check(H5Pset_deflate(dcpl.get(), 4), "H5Pset_deflate");
  }
  if (fill) check(H5Pset_fill_value(dcpl.get(), fill_type, fill), "H5Pset_fill_value");
  std::vector<hsize_t> max_dims = dims;
  for (std::size_t axis : growing) max_dims[axis] = H5S_UNLIMITED;
  Hid space = simple_space(dims, max_dims);
  return checked(H5Dcreate2(group, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                 H5Dclose, "create dataset " + name);
}

// A trace: float64, its last dimension growing, NaN where nothing was written.
Hid create_trace_dataset(hid_t group, const std::string& name, const std::vector<hsize_t>& dims,
                         const std::vector<hsize_t>& chunk) {
  return create_growing_dataset(group, name, H5T_IEEE_F64LE, dims, {dims.size() - 1}, chunk, H5T_NATIVE_DOUBLE, &kNaN);
}

std::size_t element_count(hid_t dataset) {
  std::size_t n = 1;
  for (hsize_t d : dataset_dims(dataset)) n *= d;
  return n;
}

// A dataset read whole into a buffer of n elements must hold n.
void expect_elements(hid_t dataset, std::size_t n, const std::string& name) {
  const std::size_t held = element_count(dataset);
  if (held != n) throw DamagedFile(name + " holds " + std::to_string(held) + " elements, not " + std::to_string(n));
}

// The most rows a run's /fp_counts could hold in a file we read (K: one per scope, op and
// flag that raised; far fewer in practice).
constexpr std::size_t kMaxCountRows = 1 << 16;

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

// Runs `reader` (of a file) in a child process with cpu_seconds of CPU time: what went
// wrong, or "". HDF5 1.10 is not hardened against damaged files: a damaged heap of
// strings makes it read or copy out of bounds, a damaged global heap makes it loop for
// ever; in the child that ends the child, not this process.
std::string problem_reading(const std::function<void()>& reader, int cpu_seconds) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    close(pipe_fds[0]);
    const rlim_t limit = static_cast<rlim_t>(cpu_seconds);
    // SIGXCPU ends it; the hard limit stays as inherited, so that the reader may raise
    // the soft one (read_every_dataset)
    rlimit cpu{};
    getrlimit(RLIMIT_CPU, &cpu);
    cpu.rlim_cur = std::min(limit, cpu.rlim_max);
    setrlimit(RLIMIT_CPU, &cpu);
    std::string problem;
    try {
      reader();
    } catch (const std::exception& e) {
      problem = e.what();
      if (problem.empty()) problem = "unreadable";
    }
    if (!problem.empty() && write(pipe_fds[1], problem.data(), problem.size()) < 0) problem = "unreadable";
    _exit(problem.empty() ? 0 : 2);
  }
  close(pipe_fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t got; (got = read(pipe_fds[0], buffer, sizeof buffer)) != 0;) {
    if (got > 0) message.append(buffer, static_cast<std::size_t>(got));
    else if (errno != EINTR) break;
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFSIGNALED(status))
    message = WTERMSIG(status) == SIGXCPU || WTERMSIG(status) == SIGKILL
                  ? "HDF5 did not finish reading it in " + std::to_string(cpu_seconds) + " s of CPU time"
                  : std::string("HDF5 crashed reading it (") + strsignal(WTERMSIG(status)) + ")";
  return message.empty() ? "unreadable" : message;
}

}  // namespace

ExistingOutput inspect_output(const std::string& path, int cpu_seconds) {
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
  const auto read_root = [&](ExistingOutput& e) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
      e.kind = ExistingOutput::Kind::not_hdf5;
      return;
    }
    Hid guard(file, H5Fclose);
    e.config_sha256 = read_string_attribute(file, "config_sha256");
    e.status = read_string_attribute(file, "status");
    e.roundoff_version = read_string_attribute(file, "roundoff_version");
    e.git_commit = read_string_attribute(file, "git_commit");
    e.shard = shard_attributes(file);
    const bool ours = !e.config_sha256.empty() && H5Aexists(file, "roundoff_version") > 0 &&
                      H5Lexists(file, "done", H5P_DEFAULT) > 0;
    e.kind = ours ? ExistingOutput::Kind::roundoff : ExistingOutput::Kind::not_roundoff;
  };
  // First in a child (problem_reading), then here the same reads, which the child survived.
  existing.damage = problem_reading([&] { ExistingOutput scratch; read_root(scratch); }, cpu_seconds);
  if (!existing.damage.empty()) {
    existing.kind = ExistingOutput::Kind::damaged;
    return existing;
  }
  read_root(existing);
  return existing;
}

namespace {

// ---- /fp_counts and /traps (results/README.md) -----------------------------------------
//
// Placed by (point, replica) like the metrics, so the file is the same whatever the thread
// count, the completion order or an interruption: /fp_counts/* are [P, R, K] (K, the most
// rows any run counted, grows as points are written, like a trace's T), /traps/* are
// [P, R]; index datasets add a dimension of Element::kMaxRank, operand datasets one of M
// (the most operands of any row; grows too).

constexpr hsize_t kIndexRank = emu::Element::kMaxRank;
constexpr hsize_t kCountRowsChunk = 16, kOperandsChunk = 4;

enum class FpKind { text, int64, uint64, uint32, uint8, float64 };
enum class FpExtra { none, index, operands };  // the dataset's last dimension, if any

struct FpColumn {
  const char* path;  // "fp_counts/scope"
  FpKind kind;
  FpExtra extra;
  std::int64_t int_fill;  // for int64 columns (-1 for indices, 0 for counts of things)
  const char* meaning;
};

const FpColumn kFpColumns[] = {
    {"fp_counts/scope", FpKind::text, FpExtra::none, 0, "scope path of the counted operations (\"\" at top level)"},
    {"fp_counts/op", FpKind::text, FpExtra::none, 0,
     "operation (add, sub, mul, div, fma, sqrt, convert, amp, mma, ...)"},
    {"fp_counts/flag", FpKind::text, FpExtra::none, 0, "the counted flag: OFLO, DIV0 or INV (\"\" in an unused row)"},
    {"fp_counts/count", FpKind::uint64, FpExtra::none, 0,
     "operations (elements) that raised the flag in this scope and op; 0 in an unused row"},
    {"fp_counts/first_element", FpKind::int64, FpExtra::none, -1,
     "flat index of the first such element; -1 if the operation names none"},
    {"fp_counts/first_index", FpKind::int64, FpExtra::index, -1,
     "the first element's index per dimension; -1 beyond its rank"},
    {"fp_counts/n_operands", FpKind::int64, FpExtra::none, 0, "number of operands of the first such operation"},
    {"fp_counts/first_operands", FpKind::float64, FpExtra::operands, 0,
     "operands of the first such operation (NaN beyond n_operands)"},
    {"fp_counts/first_result", FpKind::float64, FpExtra::none, 0,
     "result of the first such operation under the overflow policy"},
    {"traps/trapped", FpKind::uint8, FpExtra::none, 0, "1 where the run ended in a trap (its metrics are NaN)"},
    {"traps/flag", FpKind::text, FpExtra::none, 0, "the flag that trapped: OFLO, DIV0 or INV (\"\" if none)"},
    {"traps/scope", FpKind::text, FpExtra::none, 0, "scope path of the trapping operation"},
    {"traps/op", FpKind::text, FpExtra::none, 0, "the trapping operation"},
    {"traps/element", FpKind::int64, FpExtra::none, -1, "flat index of the element it computed; -1 if none"},
    {"traps/index", FpKind::int64, FpExtra::index, -1, "the element's index per dimension; -1 beyond its rank"},
    {"traps/n_operands", FpKind::int64, FpExtra::none, 0, "number of operands"},
    {"traps/operands", FpKind::float64, FpExtra::operands, 0, "the operands (NaN beyond n_operands)"},
    {"traps/result", FpKind::float64, FpExtra::none, 0, "the would-be result under the overflow policy"},
    {"traps/fp_sts", FpKind::uint32, FpExtra::none, 0,
     "the status register as the IPU would show it: bit 0 INV, bit 1 DIV0, bit 2 OFLO"},
    {"traps/report", FpKind::text, FpExtra::none, 0, "the trap report as one line of text"},
};

const char* const kEmptyText = "";

// The file and memory types of a column (`text`: the UTF-8 string type, both).
struct FpTypes {
  hid_t file, memory;
};
FpTypes fp_types(FpKind kind, hid_t text) {
  switch (kind) {
    case FpKind::text: return {text, text};
    case FpKind::int64: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case FpKind::uint64: return {H5T_STD_U64LE, H5T_NATIVE_UINT64};
    case FpKind::uint32: return {H5T_STD_U32LE, H5T_NATIVE_UINT32};
    case FpKind::uint8: return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case FpKind::float64: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
  }
  return {-1, -1};
}

void write_fp_layout(hid_t f, hsize_t n_points, hsize_t replicas) {
  Hid counts = create_group(f, "fp_counts");
  write_attribute(counts.get(), "meaning",
                  std::string("fp_exceptions: count: per (point, replica), one row per (scope, op, flag) in the order "
                              "first raised, K rows (unused rows: count 0)"));
  Hid traps = create_group(f, "traps");
  write_attribute(traps.get(), "meaning", std::string("fp_exceptions: trap: the report of the trap that ended each run"));
  Hid text = utf8_string_type();
  const hsize_t chunk_replicas = std::min<hsize_t>(replicas, 256);
  for (const FpColumn& column : kFpColumns) {
    const bool is_counts = std::string_view(column.path).rfind("fp_counts/", 0) == 0;
    std::vector<hsize_t> dims{n_points, replicas}, chunk{1, chunk_replicas};
    std::vector<std::size_t> growing;
    if (is_counts) {
      dims.push_back(0);
      chunk.push_back(kCountRowsChunk);
      growing.push_back(2);
    }
    if (column.extra == FpExtra::index) {
      dims.push_back(kIndexRank);
      chunk.push_back(kIndexRank);
    } else if (column.extra == FpExtra::operands) {
      growing.push_back(dims.size());
      dims.push_back(0);
      chunk.push_back(kOperandsChunk);
    }
    const std::uint64_t zero = 0;
    const void* fill = &zero;  // uint8, uint32, uint64: zero, converted from uint64
    hid_t fill_type = H5T_NATIVE_UINT64;
    switch (column.kind) {
      case FpKind::text: fill = nullptr; break;  // HDF5's default: read as ""
      case FpKind::int64: fill = &column.int_fill, fill_type = H5T_NATIVE_INT64; break;
      case FpKind::float64: fill = &kNaN, fill_type = H5T_NATIVE_DOUBLE; break;
      default: break;
    }
    Hid dataset = create_growing_dataset(f, column.path, fp_types(column.kind, text.get()).file, dims, growing, chunk,
                                         fill_type, fill);
    write_attribute(dataset.get(), "meaning", std::string(column.meaning));
  }
}

// Extends `dataset` along `axis` to at least `size`.
void grow(hid_t dataset, std::size_t axis, hsize_t size) {
  std::vector<hsize_t> dims = dataset_dims(dataset);
  if (dims[axis] >= size) return;
  dims[axis] = size;
  check(H5Dset_extent(dataset, dims.data()), "extend dataset");
}

// One column's values for a block of rows, in the order they are written.
struct FpBlock {
  std::vector<const char*> text;
  std::vector<std::int64_t> int64;
  std::vector<std::uint64_t> uint64;
  std::vector<std::uint32_t> uint32;
  std::vector<std::uint8_t> uint8;
  std::vector<double> float64;
  const void* data(FpKind kind) const {
    switch (kind) {
      case FpKind::text: return text.data();
      case FpKind::int64: return int64.data();
      case FpKind::uint64: return uint64.data();
      case FpKind::uint32: return uint32.data();
      case FpKind::uint8: return uint8.data();
      case FpKind::float64: return float64.data();
    }
    return nullptr;
  }
};

// An element's index per dimension, -1 beyond its rank, appended to `out`.
void append_index(std::vector<std::int64_t>& out, const emu::Element& e) {
  for (hsize_t d = 0; d < kIndexRank; ++d)
    out.push_back(static_cast<int>(d) < e.rank ? e.index[static_cast<std::size_t>(d)] : -1);
}
void append_operands(std::vector<double>& out, const std::vector<double>& operands, hsize_t width) {
  for (hsize_t m = 0; m < width; ++m) out.push_back(m < operands.size() ? operands[m] : kNaN);
}

// Appends one unused cell (the column's fill) to `block`.
void append_fill(FpBlock& block, const FpColumn& column, hsize_t width) {
  const hsize_t cells = column.extra == FpExtra::index ? kIndexRank : column.extra == FpExtra::operands ? width : 1;
  for (hsize_t i = 0; i < cells; ++i) {
    switch (column.kind) {
      case FpKind::text: block.text.push_back(kEmptyText); break;
      case FpKind::int64: block.int64.push_back(column.int_fill); break;
      case FpKind::uint64: block.uint64.push_back(0); break;
      case FpKind::uint32: block.uint32.push_back(0); break;
      case FpKind::uint8: block.uint8.push_back(0); break;
      case FpKind::float64: block.float64.push_back(kNaN); break;
    }
  }
}

// Writes the blocks of the columns under `group` ("fp_counts/" or "traps/") at point p:
// `shape` is [1, R] or [1, R, rows]; `width` the operands dimension of the block.
void write_fp_blocks(const std::map<std::string, Hid>& sets, const std::map<std::string, FpBlock>& blocks,
                     const std::string& group, hsize_t p, hsize_t first_replica, const std::vector<hsize_t>& shape,
                     hsize_t width) {
  Hid text = utf8_string_type();
  for (const FpColumn& column : kFpColumns) {
    if (std::string_view(column.path).rfind(group, 0) != 0) continue;
    std::vector<hsize_t> count = shape;
    if (column.extra == FpExtra::index) count.push_back(kIndexRank);
    if (column.extra == FpExtra::operands) {
      if (width == 0) continue;  // nothing but fill
      count.push_back(width);
    }
    const hid_t dataset = sets.at(column.path).get();
    if (shape.size() == 3) grow(dataset, 2, shape[2]);
    if (column.extra == FpExtra::operands) grow(dataset, count.size() - 1, width);
    std::vector<hsize_t> start(count.size(), 0);
    start[0] = p;
    start[1] = first_replica;
    write_block(dataset, fp_types(column.kind, text.get()).memory, start, count, blocks.at(column.path).data(column.kind));
  }
}

// The counts and traps of every replica of point p.
void write_fp_point(const std::map<std::string, Hid>& sets, hsize_t p, hsize_t first_replica,
                    std::span<const RunResult> results) {
  const hsize_t replicas = results.size();

  hsize_t rows = 0, width = 0;
  for (const RunResult& r : results) {
    rows = std::max<hsize_t>(rows, r.fp_counts.size());
    for (const emu::OpCount& c : r.fp_counts) width = std::max<hsize_t>(width, c.first_operands.size());
  }
  if (rows > 0) {
    std::map<std::string, FpBlock> b;
    for (const RunResult& r : results)
      for (hsize_t k = 0; k < rows; ++k) {
        if (k >= r.fp_counts.size()) {
          for (const FpColumn& c : kFpColumns)
            if (std::string_view(c.path).rfind("fp_counts/", 0) == 0) append_fill(b[c.path], c, width);
          continue;
        }
        const emu::OpCount& c = r.fp_counts[k];
        b["fp_counts/scope"].text.push_back(c.scope.c_str());
        b["fp_counts/op"].text.push_back(c.op.c_str());
        b["fp_counts/flag"].text.push_back(emu::flag_name(c.flag));
        b["fp_counts/count"].uint64.push_back(c.count);
        b["fp_counts/first_element"].int64.push_back(c.first_element.flat);
        append_index(b["fp_counts/first_index"].int64, c.first_element);
        b["fp_counts/n_operands"].int64.push_back(static_cast<std::int64_t>(c.first_operands.size()));
        append_operands(b["fp_counts/first_operands"].float64, c.first_operands, width);
        b["fp_counts/first_result"].float64.push_back(c.first_result);
      }
    write_fp_blocks(sets, b, "fp_counts/", p, first_replica, {1, replicas, rows}, width);
  }

  if (std::none_of(results.begin(), results.end(), [](const RunResult& r) { return r.trap.has_value(); })) return;
  width = 0;
  for (const RunResult& r : results)
    if (r.trap) width = std::max<hsize_t>(width, r.trap->operands.size());
  std::vector<std::string> reports;  // alive while written
  reports.reserve(replicas);
  std::map<std::string, FpBlock> b;
  for (const RunResult& r : results) {
    if (!r.trap) {
      for (const FpColumn& c : kFpColumns)
        if (std::string_view(c.path).rfind("traps/", 0) == 0) append_fill(b[c.path], c, width);
      continue;
    }
    const emu::TrapReport& t = *r.trap;
    reports.push_back(emu::FpException(t).what());  // the message emu gives the trap
    b["traps/trapped"].uint8.push_back(1);
    b["traps/flag"].text.push_back(emu::flag_name(t.flag));
    b["traps/scope"].text.push_back(t.scope.c_str());
    b["traps/op"].text.push_back(t.op.c_str());
    b["traps/element"].int64.push_back(t.element.flat);
    append_index(b["traps/index"].int64, t.element);
    b["traps/n_operands"].int64.push_back(static_cast<std::int64_t>(t.operands.size()));
    append_operands(b["traps/operands"].float64, t.operands, width);
    b["traps/result"].float64.push_back(t.result);
    b["traps/fp_sts"].uint32.push_back(t.fp_sts());
    b["traps/report"].text.push_back(reports.back().c_str());
  }
  write_fp_blocks(sets, b, "traps/", p, first_replica, {1, replicas}, width);
}

// The n variable-length UTF-8 strings of a dataset ("" for unwritten ones).
std::vector<std::string> read_strings(hid_t dataset, std::size_t n) {
  Hid string_type = utf8_string_type();
  std::vector<char*> values(n);
  check(H5Dread(dataset, string_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read strings");
  std::vector<std::string> strings;
  for (char* v : values) strings.push_back(v ? v : "");
  Hid space = checked(H5Dget_space(dataset), H5Sclose, "H5Dget_space");
  reclaim_variable_length(string_type.get(), space.get(), values.data());
  return strings;
}

// /failures (results/README.md): the runs that raised and are not done, one row each by
// (point, replica). Rewritten whole when it changed (failures are few); absent when empty,
// so that a file whose failed runs a --resume redid equals an uninterrupted run's.
constexpr const char* kFailureColumns[] = {"point", "replica", "message", "traceback"};

std::map<std::pair<std::uint32_t, std::uint32_t>, FailedRun> read_failures(hid_t f) {
  std::map<std::pair<std::uint32_t, std::uint32_t>, FailedRun> failures;
  if (H5Lexists(f, "failures", H5P_DEFAULT) <= 0) return failures;
  Hid point_set = open_dataset(f, "failures/point"), replica_set = open_dataset(f, "failures/replica");
  Hid message_set = open_dataset(f, "failures/message"), traceback_set = open_dataset(f, "failures/traceback");
  const std::size_t n = element_count(point_set.get());
  if (n > kMaxRuns) throw DamagedFile("/failures holds more rows than a sweep has runs");
  expect_elements(replica_set.get(), n, "/failures/replica");
  expect_elements(message_set.get(), n, "/failures/message");
  expect_elements(traceback_set.get(), n, "/failures/traceback");
  std::vector<std::int64_t> points(n), replicas(n);
  check(H5Dread(point_set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, points.data()), "read failures");
  check(H5Dread(replica_set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, replicas.data()), "read failures");
  const std::vector<std::string> messages = read_strings(message_set.get(), n);
  const std::vector<std::string> tracebacks = read_strings(traceback_set.get(), n);
  constexpr std::int64_t kMaxIndex = std::numeric_limits<std::uint32_t>::max();
  for (std::size_t i = 0; i < n; ++i) {
    if (points[i] < 0 || points[i] > kMaxIndex || replicas[i] < 0 || replicas[i] > kMaxIndex)
      throw DamagedFile("/failures row " + std::to_string(i) + " names no run (point " + std::to_string(points[i]) +
                        ", replica " + std::to_string(replicas[i]) + ")");
    failures[{static_cast<std::uint32_t>(points[i]), static_cast<std::uint32_t>(replicas[i])}] = {messages[i], tracebacks[i]};
  }
  return failures;
}

void write_failures(hid_t f, const std::map<std::pair<std::uint32_t, std::uint32_t>, FailedRun>& failures) {
  if (H5Lexists(f, "failures", H5P_DEFAULT) > 0) check(H5Ldelete(f, "failures", H5P_DEFAULT), "delete failures");
  if (failures.empty()) return;
  Hid group = create_group(f, "failures");
  write_attribute(group.get(), "meaning",
                  std::string("the runs whose own code raised and are not done (--resume reruns them), one row each"));
  const hsize_t n = failures.size();
  std::vector<std::int64_t> points, replicas;
  std::vector<const char*> messages, tracebacks;
  for (const auto& [run, failed] : failures) {
    points.push_back(run.first), replicas.push_back(run.second);
    messages.push_back(failed.message.c_str()), tracebacks.push_back(failed.traceback.c_str());
  }
  Hid text = utf8_string_type();
  const char* const meanings[] = {"grid point index", "replica index", "the exception, one line",
                                  "the traceback, as Python prints it"};
  for (std::size_t c = 0; c < std::size(kFailureColumns); ++c) {
    const bool is_text = c >= 2;
    Hid dataset = create_dataset(group.get(), kFailureColumns[c], is_text ? text.get() : H5T_STD_I64LE, {n});
    const void* const data[] = {points.data(), replicas.data(), messages.data(), tracebacks.data()};
    write_block(dataset.get(), is_text ? text.get() : H5T_NATIVE_INT64, {0}, {n}, data[c]);
    write_attribute(dataset.get(), "meaning", std::string(meanings[c]));
  }
}

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
    Hid y = create_trace_dataset(traces.get(), spec.name, {n_points, replicas, 0}, chunk);
    write_attribute(y.get(), "meaning", spec.meaning);
    write_attribute(y.get(), "x", spec.name + "_x");
    write_attribute(y.get(), "x_name", spec.x_name);
    Hid x = create_trace_dataset(traces.get(), spec.name + "_x", {n_points, 0}, {1, chunk[1] * chunk[2]});
    write_attribute(x.get(), "meaning", spec.x_name);
  }

  Hid flags = create_group(f, "flags");
  const std::uint8_t zero = 0;
  for (emu::Flag flag : emu::kAllFlags) {
    Hid dataset = create_dataset(flags.get(), emu::flag_name(flag), H5T_STD_U8LE, {n_points, replicas}, &zero, H5T_NATIVE_UINT8);
    write_attribute(dataset.get(), "meaning", std::string("1 where the run ended with the sticky ") + emu::flag_name(flag) + " flag raised");
  }

  write_fp_layout(f, n_points, replicas);

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

namespace {

// Reads every dataset of the file whole, in slabs of rows of at most 16 MiB, into scratch
// memory: a chunk that does not decompress, or that lies past the file's end, throws.
// Such damage to trace data was otherwise found only by whoever read the traces later,
// after --resume had completed the file around it. In problem_reading's child: first
// allows one more CPU second for every 64 MiB the datasets hold (decompressed), so that
// a large file is not taken for one that makes HDF5 loop.
void read_every_dataset(hid_t file) {
  const auto add_bytes = [](hid_t group, const char* name, const H5O_info_t* info, void* total) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    const hid_t dataset = H5Dopen2(group, name, H5P_DEFAULT);
    if (dataset < 0) return 0;  // the reading below reports it
    const hid_t type = H5Dget_type(dataset), space = H5Dget_space(dataset);
    const hssize_t elements = space >= 0 ? H5Sget_simple_extent_npoints(space) : 0;
    if (type >= 0 && elements > 0) *static_cast<double*>(total) += static_cast<double>(elements) * static_cast<double>(H5Tget_size(type));
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(dataset);
    return 0;
  };
  double total_bytes = 0;
  H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, add_bytes, &total_bytes);
  if (rlimit cpu{}; getrlimit(RLIMIT_CPU, &cpu) == 0 && cpu.rlim_cur != RLIM_INFINITY) {
    cpu.rlim_cur = std::min(cpu.rlim_max, cpu.rlim_cur + static_cast<rlim_t>(std::min(total_bytes / double(64 << 20), 1e7)));
    setrlimit(RLIMIT_CPU, &cpu);
  }

  const auto read_dataset = [](hid_t group, const char* name, const H5O_info_t* info, void* failure) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    try {
      Hid dataset = open_dataset(group, name);
      Hid file_type = checked(H5Dget_type(dataset.get()), H5Tclose, std::string("type of ") + name);
      const bool strings = H5Tis_variable_str(file_type.get()) > 0;
      Hid memory_type = strings ? utf8_string_type() : checked(H5Tcopy(file_type.get()), H5Tclose, "H5Tcopy");
      const std::size_t element = strings ? sizeof(char*) : H5Tget_size(file_type.get());
      std::vector<hsize_t> dims = dataset_dims(dataset.get());
      if (dims.empty()) dims = {1};  // a scalar: one slab of one row
      hsize_t row = element;
      for (std::size_t axis = 1; axis < dims.size(); ++axis) row *= dims[axis];
      const hsize_t rows_per_slab = std::max<hsize_t>(1, (hsize_t{16} << 20) / std::max<hsize_t>(row, 1));
      Hid space = checked(H5Dget_space(dataset.get()), H5Sclose, "H5Dget_space");
      std::vector<unsigned char> slab;
      for (hsize_t first = 0; first < dims[0]; first += rows_per_slab) {
        std::vector<hsize_t> start(dims.size(), 0), count = dims;
        start[0] = first, count[0] = std::min(rows_per_slab, dims[0] - first);
        hsize_t elements = 1;
        for (hsize_t n : count) elements *= n;
        if (elements == 0) break;
        slab.assign(elements * element, 0);
        Hid memory_space = simple_space({elements});
        if (H5Sget_simple_extent_ndims(space.get()) > 0)
          check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), "select");
        check(H5Dread(dataset.get(), memory_type.get(), memory_space.get(), space.get(), H5P_DEFAULT, slab.data()),
              std::string("read /") + name);
        if (strings) check(H5Dvlen_reclaim(memory_type.get(), memory_space.get(), H5P_DEFAULT, slab.data()), "H5Dvlen_reclaim");
      }
      return 0;
    } catch (const H5Error& e) {
      *static_cast<std::string*>(failure) = e.what();
      return -1;  // stops the visit
    }
  };
  std::string failure;
  const herr_t visited = H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, read_dataset, &failure);
  if (!failure.empty()) throw std::runtime_error(failure);
  check(visited, "visit every object");
}

}  // namespace

void check_readable_output(const std::string& path, const std::string& program, int cpu_seconds) {
  const std::string problem = problem_reading(
      [&] {
        read_summary(path);
        Hid file = checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open '" + path + "'");
        read_failures(file.get());
        read_every_dataset(file.get());
      },
      cpu_seconds);
  if (!problem.empty()) throw InputError(program + ": " + path + " is damaged: " + problem + "; left untouched");
}

OutputFile OutputFile::open_for_resume(const SweepPlan& plan) {
  silence_hdf5_errors();
  if (LockProbe(plan.output, LOCK_EX).refused()) throw InputError(in_use_message(plan.output));
  Hid file = checked(H5Fopen(plan.output.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "open '" + plan.output + "' for writing");
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
  for (const FpColumn& column : kFpColumns) fp_sets_.emplace(column.path, open_dataset(f, column.path));
  done_set_ = open_dataset(f, "done");
  done_replicas_set_ = open_dataset(f, "done_replicas");
  done_replicas_.resize(plan.points.size() * plan.replicas);
  expect_elements(done_replicas_set_.get(), done_replicas_.size(), "/done_replicas");
  check(H5Dread(done_replicas_set_.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done_replicas_.data()),
        "read done_replicas");
  failures_ = read_failures(f);
  hsize_t size = 0;
  check(H5Fget_filesize(f, &size), "H5Fget_filesize");
  flushed_size_ = size;
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

void OutputFile::write_point_unguarded(const PointWork& work, const std::vector<RunResult>& results) {
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

  for_each_replica_run(replicas, [&](std::size_t first, std::size_t count) {
    write_fp_point(fp_sets_, p, replicas[first], std::span<const RunResult>(results).subspan(first, count));
  });

  for (std::uint32_t r : replicas) failures_changed_ = failures_.erase({work.point, r}) > 0 || failures_changed_;
  const auto row = done_replicas_.begin() + static_cast<std::ptrdiff_t>(p * plan_->replicas);
  for (std::uint32_t r : replicas) row[r] = 1;
  unflushed_done_.insert(work.point);  // written to the file by flush, after the rest
}

void OutputFile::write_done_flags() {
  const hsize_t replicas = plan_->replicas;
  for (std::uint32_t point : unflushed_done_) {
    const hsize_t p = point;
    const std::uint8_t* row = done_replicas_.data() + p * replicas;
    write_block(done_replicas_set_.get(), H5T_NATIVE_UINT8, {p, 0}, {1, replicas}, row);
    if (std::all_of(row, row + replicas, [](std::uint8_t d) { return d == 1; })) {
      const std::uint8_t one = 1;
      write_block(done_set_.get(), H5T_NATIVE_UINT8, {p}, {1}, &one);
    }
  }
  unflushed_done_.clear();
}

void OutputFile::record_failure(std::uint32_t point, std::uint32_t replica, const std::string& message,
                                const std::string& traceback) {
  failures_[{point, replica}] = {message, traceback};
  failures_changed_ = true;
}

void OutputFile::write_point(const PointWork& work, const std::vector<RunResult>& results) {
  guarded([&] { write_point_unguarded(work, results); });
}

void OutputFile::flush() {
  guarded([&] {
    if (failures_changed_) write_failures(file_.get(), failures_);
    failures_changed_ = false;
    write_out_chunks();
    flush_reserved("H5Fflush");
    // The done flags last, in a flush of their own: HDF5 writes a contiguous dataset's
    // raw data before any metadata, so flushed together with the traces, a flush that
    // failed half-way could leave a point marked done whose trace chunks the file does
    // not know (NaN on reading; seen in the EIO test under ASan). On disk, a point is
    // done only once everything it wrote is.
    if (unflushed_done_.empty()) return;
    write_done_flags();
    flush_reserved("H5Fflush (done flags)");
  });
}

void OutputFile::flush_reserved(const char* what) {
  reserve_space();
  check(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), what);
  hsize_t size = 0;
  if (H5Fget_filesize(file_.get(), &size) >= 0) flushed_size_ = size;
}

void OutputFile::mark_complete() {
  flush();
  guarded([&] { write_attribute(file_.get(), "status", std::string("complete")); });
  flush();
}

void OutputFile::guarded(const std::function<void()>& write) {
  if (!file_.get() || file_.get() < 0) throw std::logic_error("OutputFile: written after a failed write");
  try {
    write();
  } catch (const H5Error&) {
    abandon();
    throw;
  }
}

void OutputFile::abandon() {
  // HDF5 keeps no journal: closing would flush the metadata cached since the last flush,
  // which on a full disk lands in part and leaves a file that points at data never
  // written. Left unclosed (HDF5's exit handler is off, silence_hdf5_errors), the file
  // stays as the last successful flush left it; the kernel closes it at exit.
  const auto leave = [](Hid& id) { id.release(); };
  for (auto* sets : {&metric_sets_, &trace_sets_, &trace_x_sets_, &flag_sets_})
    for (Hid& id : *sets) leave(id);
  for (auto& [path, id] : fp_sets_) leave(id);
  leave(done_set_), leave(done_replicas_set_), leave(file_);
}

void OutputFile::write_out_chunks() {
  // H5Fflush writes the cached chunks first and places each one it writes anew (a
  // compressed chunk moves when its size changes), then the metadata that points at them.
  // So space taken during a flush is known only after it, and a full disk half-way leaves
  // metadata that points past the file's end; HDF5 1.10 cannot even retry such a flush
  // ("slist already enabled?"). Closing a dataset writes its chunks and no metadata: done
  // first, every byte the flush writes lies below the file's end that reserve_space sees.
  const hid_t f = file_.get();
  const auto write_out = [&](Hid& dataset, const std::string& path) {
    check(H5Dclose(dataset.release()), "write the chunks of " + path);
    dataset = open_dataset(f, path);
  };
  for (std::size_t t = 0; t < plan_->experiment->traces.size(); ++t) {
    const std::string& name = plan_->experiment->traces[t].name;
    write_out(trace_sets_[t], "traces/" + name);
    write_out(trace_x_sets_[t], "traces/" + name + "_x");
  }
  for (auto& [path, dataset] : fp_sets_) write_out(dataset, path);
}

void OutputFile::reserve_space() {
  // A flush writes metadata that HDF5 has assigned addresses already, all below the
  // file's end once the chunks are written out (write_out_chunks). That range, from the
  // last flush's end, and a margin are allocated ahead (fallocate, the file's size
  // unchanged), so that a full disk stops the sweep here, before the flush, rather than
  // half-way through it.
  void* handle = nullptr;
  hsize_t size = 0;
  if (H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle) < 0 || !handle || H5Fget_filesize(file_.get(), &size) < 0) return;
  const int fd = *static_cast<int*>(handle);
  const hsize_t grown = size > flushed_size_ ? size - flushed_size_ : 0;
  const hsize_t margin = (hsize_t{64} << 10) + grown / 8;
  const hsize_t from = std::min(flushed_size_, size);
  if (fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from), static_cast<off_t>(size + margin - from)) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS)
    throw H5Error("reserve space for H5Fflush", "fallocate", errno);
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
    column = read_strings(dataset, n);
  }
  return column;
}

// Every element of a dataset of n elements, as numbers of memory type `type`.
template <typename T>
std::vector<T> read_numbers(hid_t dataset, hid_t type, std::size_t n) {
  std::vector<T> values(n);
  check(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read dataset");
  return values;
}

// The fp_exceptions part of the summary, over the runs of finished points.
void read_fp_summary(hid_t f, SweepSummary& summary) {
  if (H5Lexists(f, "traps", H5P_DEFAULT) <= 0) return;  // written before fp_exceptions existed
  const std::size_t replicas = summary.replicas, runs = summary.n_points * replicas;
  auto run_done = [&](std::size_t run) { return summary.done[run / replicas][run % replicas] != 0; };
  Hid trapped_set = open_dataset(f, "traps/trapped");
  expect_elements(trapped_set.get(), runs, "/traps/trapped");
  const auto trapped = read_numbers<std::uint8_t>(trapped_set.get(), H5T_NATIVE_UINT8, runs);
  std::size_t first = runs;
  for (std::size_t run = 0; run < runs; ++run)
    if (trapped[run] && run_done(run)) {
      ++summary.trapped_runs;
      first = std::min(first, run);
    }
  if (first < runs) {
    Hid reports = open_dataset(f, "traps/report");
    expect_elements(reports.get(), runs, "/traps/report");
    summary.first_trap = "point " + std::to_string(first / replicas) + " replica " + std::to_string(first % replicas) +
                         ": " + read_strings(reports.get(), runs)[first];
  }
  Hid count_set = open_dataset(f, "fp_counts/count"), flag_set = open_dataset(f, "fp_counts/flag");
  const std::size_t cells = element_count(count_set.get()), rows = runs ? cells / runs : 0;
  if (cells == 0) return;
  if (rows * runs != cells || cells > kMaxRuns * kMaxCountRows) throw DamagedFile("/fp_counts/count is not [n_points, replicas, K]");
  expect_elements(flag_set.get(), cells, "/fp_counts/flag");
  const auto counts = read_numbers<std::uint64_t>(count_set.get(), H5T_NATIVE_UINT64, cells);
  const std::vector<std::string> flags = read_strings(flag_set.get(), cells);
  for (std::size_t run = 0; run < runs; ++run) {
    if (!run_done(run)) continue;
    std::map<std::string, bool> seen;
    for (std::size_t k = run * rows; k < (run + 1) * rows; ++k) {
      if (counts[k] == 0) continue;
      summary.counted_operations[flags[k]] += counts[k];
      if (!seen[flags[k]]) {
        seen[flags[k]] = true;
        ++summary.counted_runs[flags[k]];
      }
    }
  }
}

}  // namespace

SweepSummary read_summary(const std::string& path) {
  silence_hdf5_errors();
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) throw hdf5_error("open '" + path + "'");
  const hid_t f = file.get();
  SweepSummary summary;
  summary.experiment = read_string_attribute(f, "experiment");
  summary.headline_metric = read_string_attribute(f, "headline_metric");
  summary.status = read_string_attribute(f, "status");
  summary.shard = shard_attributes(f);
  const std::int64_t n_points = read_int64_attribute(f, "n_points"), replicas = read_int64_attribute(f, "replicas");
  // Within the limits a config could ask for, before anything is sized by them.
  if (n_points < 0 || replicas < 1 || static_cast<std::uint64_t>(n_points) * static_cast<std::uint64_t>(replicas) > kMaxRuns)
    throw DamagedFile("its n_points (" + std::to_string(n_points) + ") and replicas (" + std::to_string(replicas) +
                      ") are out of range");
  summary.n_points = static_cast<std::uint64_t>(n_points);
  summary.replicas = static_cast<std::uint64_t>(replicas);
  const std::size_t runs = summary.n_points * summary.replicas;

  Hid points = checked(H5Gopen2(f, "points", H5P_DEFAULT), H5Gclose, "open /points");
  summary.param_names = link_names(points.get());
  for (const std::string& name : summary.param_names) {
    Hid dataset = open_dataset(points.get(), name);
    expect_elements(dataset.get(), summary.n_points, "/points/" + name);
    summary.param_values.push_back(read_param_column(dataset.get(), read_string_attribute(dataset.get(), "type"), summary.n_points));
  }

  std::vector<double> headline(runs, kNaN);
  if (!summary.headline_metric.empty()) {
    Hid dataset = open_dataset(f, "metrics/" + summary.headline_metric);
    expect_elements(dataset.get(), runs, "/metrics/" + summary.headline_metric);
    check(H5Dread(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, headline.data()), "read headline metric");
  }
  // Files written before /done_replicas existed mark whole points in /done only.
  std::vector<std::uint8_t> done(runs);
  if (H5Lexists(f, "done_replicas", H5P_DEFAULT) > 0) {
    Hid dataset = open_dataset(f, "done_replicas");
    expect_elements(dataset.get(), runs, "/done_replicas");
    check(H5Dread(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done.data()), "read done_replicas");
  } else {
    std::vector<std::uint8_t> done_points(summary.n_points);
    Hid dataset = open_dataset(f, "done");
    expect_elements(dataset.get(), summary.n_points, "/done");
    check(H5Dread(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, done_points.data()), "read done");
    for (std::size_t i = 0; i < runs; ++i) done[i] = done_points[i / summary.replicas];
  }
  for (std::uint64_t p = 0; p < summary.n_points; ++p) {
    const auto first = static_cast<std::ptrdiff_t>(p * summary.replicas), last = first + static_cast<std::ptrdiff_t>(summary.replicas);
    summary.headline.emplace_back(headline.begin() + first, headline.begin() + last);
    summary.done.emplace_back(done.begin() + first, done.begin() + last);
  }
  read_fp_summary(f, summary);
  return summary;
}

}  // namespace roundoff::sweep
