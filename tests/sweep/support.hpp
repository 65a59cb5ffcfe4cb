// Helpers shared by the sweep tests: temporary folders, running the real `sweep` binary,
// and comparing two output files dataset by dataset and attribute by attribute.
#pragma once

#include <hdf5.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <regex>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace sweep_test {

// A fresh folder under /tmp, removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "roundoff-sweep-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct ProcessResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

inline pid_t start_program(const std::string& program, const std::vector<std::string>& args, const std::string& cwd);
inline ProcessResult finish_program(pid_t child, const std::string& cwd);

// Runs `program args...` in `cwd` with stdout and stderr captured through files.
inline ProcessResult run_program(const std::string& program, const std::vector<std::string>& args, const std::string& cwd) {
  return finish_program(start_program(program, args, cwd), cwd);
}

// Runs `body` with this process's stderr going to a file; returns what was written.
template <typename Body>
std::string capture_stderr(const std::string& scratch_file, Body&& body) {
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  FILE* sink = std::fopen(scratch_file.c_str(), "w");
  if (saved < 0 || !sink) throw std::runtime_error("cannot redirect stderr");
  dup2(fileno(sink), STDERR_FILENO);
  try {
    body();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    std::fclose(sink);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(sink);
  return read_file(scratch_file);
}

// Whether process `pid` runs `program` (it has exec'ed: a forked child that has not yet
// still shows its parent's handlers) and has handlers installed for SIGINT and SIGTERM
// (Linux: the SigCgt mask in /proc/PID/status), i.e. it has reached the point where it
// catches them.
inline bool catches_stop_signals(pid_t pid, const std::string& program) {
  std::error_code ec;
  const std::string proc = "/proc/" + std::to_string(pid);
  if (std::filesystem::read_symlink(proc + "/exe", ec) != std::filesystem::canonical(program, ec)) return false;
  std::ifstream status(proc + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("SigCgt:", 0) == 0) {
      const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> (SIGINT - 1) & 1) && (mask >> (SIGTERM - 1) & 1);
    }
  return false;
}

// Starts `program args...` in `cwd` with stdout and stderr to files there (.stdout, .stderr).
inline pid_t start_program(const std::string& program, const std::vector<std::string>& args, const std::string& cwd) {
  const std::string out_path = cwd + "/.stdout", err_path = cwd + "/.stderr";
  const pid_t child = fork();
  if (child == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(127);
    if (!freopen(out_path.c_str(), "w", stdout) || !freopen(err_path.c_str(), "w", stderr)) _exit(127);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  return child;
}

// Waits for a child from start_program: its exit status or 128 + signal, and its output.
inline ProcessResult finish_program(pid_t child, const std::string& cwd) {
  int raw = 0;
  waitpid(child, &raw, 0);
  ProcessResult result;
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  result.out = read_file(cwd + "/.stdout");
  result.err = read_file(cwd + "/.stderr");
  return result;
}

struct InterruptedRun {
  int status = -1;         // exit status, or 128 + signal
  bool signalled = false;  // the signal was sent after the progress bar showed enough
  std::string screen;      // what the program drew
};

// Runs `program args...` in `cwd` on a pseudo-terminal, where sweep draws its progress bar
// ("N/TOTAL points"); sends `signal` once N >= min_done (or after 50 s) and waits for it.
inline InterruptedRun interrupt_after_progress(const std::string& program, const std::vector<std::string>& args,
                                               const std::string& cwd, int total, int min_done, int signal) {
  InterruptedRun run;
  int terminal = -1;
  const pid_t child = forkpty(&terminal, nullptr, nullptr, nullptr);
  if (child < 0) throw std::runtime_error("forkpty failed");
  if (child == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(127);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(50);
  const std::regex progress("\\s([0-9]+)/" + std::to_string(total) + " points");
  while (!run.signalled && std::chrono::steady_clock::now() < deadline) {
    pollfd fd{terminal, POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(terminal, buf, sizeof buf);
    if (n <= 0) break;
    run.screen.append(buf, static_cast<std::size_t>(n));
    for (auto it = std::sregex_iterator(run.screen.begin(), run.screen.end(), progress); it != std::sregex_iterator(); ++it)
      run.signalled = run.signalled || std::stoi((*it)[1]) >= min_done;
  }
  kill(child, signal);
  // Drain the terminal so the child never blocks writing to it.
  for (pollfd fd{terminal, POLLIN, 0}; poll(&fd, 1, 2000) > 0;) {
    char buf[512];
    const ssize_t n = read(terminal, buf, sizeof buf);
    if (n <= 0) break;
    run.screen.append(buf, static_cast<std::size_t>(n));
  }
  int raw = 0;
  waitpid(child, &raw, 0);
  close(terminal);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return run;
}

// ---- comparing two sweep outputs -------------------------------------------------------

namespace detail {

struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

// One element in memory (native type) as bytes that are equal exactly when the values are:
// numbers bit for bit (so NaNs compare by pattern), strings as their text, variable-length
// sequences by content, compounds and arrays member by member (each part length-prefixed).
inline std::string element_bytes(hid_t type, const unsigned char* element) {
  const std::size_t size = H5Tget_size(type);
  const H5T_class_t type_class = H5Tget_class(type);
  if (type_class == H5T_STRING && H5Tis_variable_str(type) > 0) {
    const char* text = *reinterpret_cast<char* const*>(element);
    return text ? text : "";
  }
  if (type_class == H5T_VLEN || type_class == H5T_ARRAY) {
    Handle base{H5Tget_super(type), H5Tclose};
    const std::size_t base_size = H5Tget_size(base.id);
    const unsigned char* first = element;
    std::size_t n = size / base_size;
    if (type_class == H5T_VLEN) {
      const auto* sequence = reinterpret_cast<const hvl_t*>(element);
      first = static_cast<const unsigned char*>(sequence->p), n = sequence->len;
    }
    std::string bytes("[");
    bytes.append(std::to_string(n)).append("]");
    for (std::size_t i = 0; i < n; ++i) {
      const std::string part = element_bytes(base.id, first + i * base_size);
      bytes.append(std::to_string(part.size())).append(":").append(part);
    }
    return bytes;
  }
  if (type_class == H5T_COMPOUND) {
    std::string bytes;
    for (int m = 0; m < H5Tget_nmembers(type); ++m) {
      Handle member{H5Tget_member_type(type, static_cast<unsigned>(m)), H5Tclose};
      const std::string part = element_bytes(member.id, element + H5Tget_member_offset(type, static_cast<unsigned>(m)));
      bytes += std::to_string(part.size()) + ":" + part;
    }
    return bytes;
  }
  return std::string(reinterpret_cast<const char*>(element), size);
}

// Every element of a dataset or attribute, as element_bytes gives it.
inline std::vector<std::string> read_elements(hid_t object, bool is_attribute) {
  Handle type{is_attribute ? H5Aget_type(object) : H5Dget_type(object), H5Tclose};
  Handle space{is_attribute ? H5Aget_space(object) : H5Dget_space(object), H5Sclose};
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.id));
  Handle native{H5Tget_native_type(type.id, H5T_DIR_ASCEND), H5Tclose};
  const std::size_t size = H5Tget_size(native.id);
  std::vector<unsigned char> bytes(std::max<std::size_t>(1, n * size));
  herr_t ok = is_attribute ? H5Aread(object, native.id, bytes.data())
                           : H5Dread(object, native.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
  if (ok < 0) throw std::runtime_error("read failed");
  std::vector<std::string> elements;
  for (std::size_t i = 0; i < n; ++i) elements.push_back(element_bytes(native.id, bytes.data() + i * size));
#if H5_VERSION_GE(1, 12, 0)
  H5Treclaim(native.id, space.id, H5P_DEFAULT, bytes.data());
#else
  H5Dvlen_reclaim(native.id, space.id, H5P_DEFAULT, bytes.data());
#endif
  return elements;
}

inline std::vector<hsize_t> dims_of(hid_t dataset) {
  Handle space{H5Dget_space(dataset), H5Sclose};
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.id)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return dims;
}

inline herr_t collect_object(hid_t, const char* name, const H5O_info_t* info, void* out) {
  static_cast<std::set<std::pair<std::string, int>>*>(out)->insert({name, static_cast<int>(info->type)});
  return 0;
}
inline herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::set<std::string>*>(out)->insert(name);
  return 0;
}

inline std::string compare_attributes(hid_t a, hid_t b, const std::string& path, const std::set<std::string>& ignored) {
  std::set<std::string> names_a, names_b;
  H5Aiterate2(a, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute, &names_a);
  H5Aiterate2(b, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute, &names_b);
  if (names_a != names_b) return path + ": different attribute names";
  for (const std::string& name : names_a) {
    if (ignored.count(name)) continue;
    Handle attr_a{H5Aopen(a, name.c_str(), H5P_DEFAULT), H5Aclose};
    Handle attr_b{H5Aopen(b, name.c_str(), H5P_DEFAULT), H5Aclose};
    if (read_elements(attr_a.id, true) != read_elements(attr_b.id, true)) return path + " attribute " + name + " differs";
  }
  return "";
}

}  // namespace detail

// "" when the files hold the same objects, datasets (shape, type class, every element bit
// for bit) and attributes, ignoring the root attribute `created`; else the first difference.
inline std::string first_difference(const std::string& path_a, const std::string& path_b) {
  using namespace detail;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle a{H5Fopen(path_a.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  Handle b{H5Fopen(path_b.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (a.id < 0 || b.id < 0) return "cannot open both files";
  std::set<std::pair<std::string, int>> objects_a, objects_b;
#if H5_VERSION_GE(1, 12, 0)
  H5Ovisit3(a.id, H5_INDEX_NAME, H5_ITER_INC, collect_object, &objects_a, H5O_INFO_BASIC);
  H5Ovisit3(b.id, H5_INDEX_NAME, H5_ITER_INC, collect_object, &objects_b, H5O_INFO_BASIC);
#else
  H5Ovisit(a.id, H5_INDEX_NAME, H5_ITER_INC, collect_object, &objects_a);
  H5Ovisit(b.id, H5_INDEX_NAME, H5_ITER_INC, collect_object, &objects_b);
#endif
  if (objects_a != objects_b) return "different sets of objects";
  for (const auto& [name, type] : objects_a) {
    Handle object_a{H5Oopen(a.id, name.c_str(), H5P_DEFAULT), H5Oclose};
    Handle object_b{H5Oopen(b.id, name.c_str(), H5P_DEFAULT), H5Oclose};
    const std::string difference = compare_attributes(object_a.id, object_b.id, name, name == "." ? std::set<std::string>{"created"} : std::set<std::string>{});
    if (!difference.empty()) return difference;
    if (type != H5O_TYPE_DATASET) continue;
    if (dims_of(object_a.id) != dims_of(object_b.id)) return name + ": different shapes";
    Handle type_a{H5Dget_type(object_a.id), H5Tclose};
    Handle type_b{H5Dget_type(object_b.id), H5Tclose};
    if (H5Tequal(type_a.id, type_b.id) <= 0) return name + ": different types";
    if (read_elements(object_a.id, false) != read_elements(object_b.id, false)) return name + ": different values";
  }
  return "";
}

// Reads a whole dataset converted to `T` (double, std::int64_t, std::uint8_t).
template <typename T>
std::vector<T> read_dataset(const std::string& file, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  detail::Handle d{H5Dopen2(f.id, path.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0) throw std::runtime_error("no dataset " + path);
  const auto dims = detail::dims_of(d.id);
  std::size_t n = 1;
  for (hsize_t x : dims) n *= x;
  std::vector<T> values(n);
  const hid_t memory_type = std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : std::is_same_v<T, std::int64_t> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT8;
  if (H5Dread(d.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) throw std::runtime_error("read " + path);
  return values;
}

inline std::vector<hsize_t> dataset_shape(const std::string& file, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  detail::Handle d{H5Dopen2(f.id, path.c_str(), H5P_DEFAULT), H5Dclose};
  return d.id < 0 ? std::vector<hsize_t>{} : detail::dims_of(d.id);
}

inline std::string string_attribute(const std::string& file, const std::string& object, const std::string& name) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  detail::Handle o{H5Oopen(f.id, object.c_str(), H5P_DEFAULT), H5Oclose};
  detail::Handle a{H5Aopen(o.id, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (a.id < 0) return "";
  const auto values = detail::read_elements(a.id, true);
  return values.empty() ? "" : values.front();
}

// Overwrites a variable-length UTF-8 string attribute of the root group (to fake a file
// written by another build).
inline void set_root_string_attribute(const std::string& file, const std::string& name, const std::string& value) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  detail::Handle a{H5Aopen(f.id, name.c_str(), H5P_DEFAULT), H5Aclose};
  detail::Handle type{H5Aget_type(a.id), H5Tclose};
  const char* text = value.c_str();
  if (a.id < 0 || H5Awrite(a.id, type.id, &text) < 0) throw std::runtime_error("cannot write attribute " + name);
}

inline std::vector<std::string> string_dataset(const std::string& file, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  detail::Handle f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  detail::Handle d{H5Dopen2(f.id, path.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0) throw std::runtime_error("no dataset " + path);
  return detail::read_elements(d.id, false);
}

}  // namespace sweep_test
