#include "python_experiment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

#include "runner.hpp"
#include "wire.hpp"

extern char** environ;

namespace roundoff::sweep {
namespace {

const char* const kWhat = "Python worker message";

// The folder above the running executable that holds python/roundoff/_worker.py, or "".
std::string roundoff_python_folder() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (fs::path folder = exe.parent_path(); !folder.empty(); folder = folder.parent_path()) {
    if (fs::exists(folder / "python" / "roundoff" / "_worker.py", ec)) return (folder / "python").string();
    if (folder == folder.parent_path()) break;
  }
  return "";
}

// The worker's environment: ours, with the roundoff package first on PYTHONPATH and one
// thread for the numerical libraries (-j N workers use N cores, one each).
std::vector<std::string> worker_environment() {
  std::vector<std::string> env;
  const std::string folder = roundoff_python_folder();
  const char* const replaced[] = {"PYTHONPATH=", "OMP_NUM_THREADS=", "OPENBLAS_NUM_THREADS=", "MKL_NUM_THREADS="};
  for (char** e = environ; *e; ++e) {
    bool drop = false;
    for (const char* prefix : replaced) drop = drop || std::strncmp(*e, prefix, std::strlen(prefix)) == 0;
    if (!drop) env.emplace_back(*e);
  }
  const char* old_path = std::getenv("PYTHONPATH");
  std::string path = folder;
  if (old_path && *old_path) path += (path.empty() ? "" : ":") + std::string(old_path);
  if (!path.empty()) env.push_back("PYTHONPATH=" + path);
  for (const char* threads : {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"}) env.emplace_back(threads);
  return env;
}

std::string python_interpreter() {
  const char* chosen = std::getenv("ROUNDOFF_PYTHON");
  return chosen && *chosen ? chosen : "/usr/bin/python3";
}

bool write_all(int fd, const std::string& bytes) {
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
};

// Why a worker ended, once it has: "exited with status 1", "killed by signal 9".
std::string reap(Worker& worker, bool kill_it) {
  if (worker.fd >= 0) close(worker.fd), worker.fd = -1;
  if (worker.pid < 0) return "";
  if (kill_it) kill(worker.pid, SIGKILL);
  int status = 0;
  while (waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
  }
  worker.pid = -1;
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

enum class Read { ok, closed, cancelled };

// Reads n bytes, looking at `cancel` every 100 ms while none arrive.
Read read_exactly(int fd, char* out, std::size_t n, const RunEnv* env) {
  for (std::size_t done = 0; done < n;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) return Read::closed;
    if (env && env->cancelled()) return Read::cancelled;
    if (ready <= 0) continue;
    const ssize_t got = read(fd, out + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Read::closed;
    done += static_cast<std::size_t>(got);
  }
  return Read::ok;
}

// One frame: its message (tag byte first).
Read read_frame(int fd, std::string& message, const RunEnv* env) {
  char header[8];
  if (const Read r = read_exactly(fd, header, sizeof header, env); r != Read::ok) return r;
  const auto size = WireReader(std::string_view(header, sizeof header), kWhat).number<std::uint64_t>();
  if (size == 0 || size > (std::uint64_t{1} << 34)) return Read::closed;  // not our worker speaking
  message.assign(size, '\0');
  return read_exactly(fd, message.data(), size, env);
}

std::string frame(const std::string& message) {
  WireWriter w;
  w.number<std::uint64_t>(message.size());
  return w.take() + message;
}

void write_value(WireWriter& w, const ParamValue& value) {
  w.number<std::uint8_t>(static_cast<std::uint8_t>(value.index()));
  if (const auto* i = std::get_if<std::int64_t>(&value)) w.number(*i);
  else if (const auto* d = std::get_if<double>(&value)) w.number(*d);
  else if (const auto* s = std::get_if<std::string>(&value)) w.text(*s);
  else w.number<std::uint8_t>(std::get<bool>(value) ? 1 : 0);
}

ParamValue read_value(WireReader& r, ParamType type) {
  switch (type) {
    case ParamType::integer: return r.number<std::int64_t>();
    case ParamType::real: return r.number<double>();
    case ParamType::string: return r.text();
    case ParamType::boolean: return r.number<std::uint8_t>() != 0;
  }
  throw std::runtime_error("unreachable");
}

Experiment read_declaration(WireReader& r, const std::string& run_target) {
  Experiment e;
  e.name = "python";
  e.description = r.text();
  e.headline_metric = r.text();
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    ParamSpec spec;
    spec.name = r.text();
    const auto type = r.number<std::uint8_t>();
    if (type > 3) throw std::runtime_error(std::string(kWhat) + ": unknown parameter type");
    // ParamValue's alternatives are in ParamType's order: int64, double, string, bool.
    spec.type = static_cast<ParamType>(type);
    spec.default_value = read_value(r, spec.type);
    spec.meaning = r.text();
    for (auto k = r.number<std::uint64_t>(); k > 0; --k) spec.allowed.push_back(r.text());
    if (r.number<std::uint8_t>()) spec.min = r.number<double>();
    else r.number<double>();
    if (r.number<std::uint8_t>()) spec.max = r.number<double>();
    else r.number<double>();
    e.params.push_back(std::move(spec));
  }
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    MetricSpec spec;
    spec.name = r.text(), spec.meaning = r.text();
    e.metrics.push_back(std::move(spec));
  }
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    TraceSpec spec;
    spec.name = r.text(), spec.meaning = r.text(), spec.x_name = r.text();
    e.traces.push_back(std::move(spec));
  }
  r.end();
  e.fp_exceptions_note = "a Python experiment (" + run_target +
                         "): the fp_counts its callable returns (roundoff.torch's exception table) go to /fp_counts, "
                         "and a flag is set in /flags where a row counted it";
  return e;
}

emu::Flag flag_named(const std::string& name, const std::string& what) {
  try {
    return emu::flag_by_name(name);
  } catch (const std::invalid_argument& e) {
    throw RunRaised(what + ": " + e.what(), "");
  }
}

RunResult read_result(WireReader& r) {
  RunResult result;
  read_metrics_and_traces(r, result);
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    emu::OpCount c;
    c.scope = r.text(), c.op = r.text(), c.flag = flag_named(r.text(), "fp_counts"), c.count = r.number<std::uint64_t>();
    c.first_element.flat = r.number<std::int64_t>();
    c.first_operands = r.doubles();
    c.first_result = std::numeric_limits<double>::quiet_NaN();  // roundoff.torch's table does not carry it
    if (c.count > 0) result.flags |= c.flag;
    result.fp_counts.push_back(std::move(c));
  }
  r.end();
  return result;
}

// The report of the roundoff.FloatingPointTrap that ended a run ('T').
emu::TrapReport read_trap(WireReader& r) {
  emu::TrapReport trap;
  trap.flag = flag_named(r.text(), "FloatingPointTrap");
  trap.scope = r.text(), trap.op = r.text();
  trap.element.flat = r.number<std::int64_t>();
  const auto rank = r.number<std::uint64_t>();
  if (rank > emu::Element::kMaxRank)
    throw RunRaised("FloatingPointTrap: an index of " + std::to_string(rank) + " dimensions (at most " +
                        std::to_string(emu::Element::kMaxRank) + ")",
                    "");
  trap.element.rank = static_cast<int>(rank);
  for (std::uint64_t i = 0; i < rank; ++i) trap.element.index[i] = r.number<std::int64_t>();
  trap.operands = r.doubles();
  trap.result = r.number<double>();
  trap.status = static_cast<emu::Flags>(r.number<std::uint8_t>() | trap.flag);
  r.end();
  return trap;
}

// The workers of one experiment: idle ones wait here between runs; a run takes one (or
// starts one) and gives it back, so that -j N threads keep N workers busy.
class WorkerPool {
 public:
  WorkerPool(std::string run_target, std::string config_folder)
      : run_target_(std::move(run_target)), config_folder_(std::move(config_folder)), environment_(worker_environment()) {}
  ~WorkerPool() {
    // Closing its socket ends an idle worker (it reads end of file).
    for (Worker& w : idle_) reap(w, false);
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts a worker and reads its declaration (the worker stays idle in the pool).
  std::string start_first() {
    auto [worker, declaration] = start();
    give_back(worker);
    return declaration;
  }

  Worker take() {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        Worker w = idle_.back();
        idle_.pop_back();
        return w;
      }
    }
    try {
      return start().first;
    } catch (const PythonLoadError& e) {  // it loaded at plan time: now it fails this run only
      throw RunRaised(e.what(), "");
    }
  }
  void give_back(Worker w) {
    std::lock_guard lock(mutex_);
    idle_.push_back(w);
  }

 private:
  std::pair<Worker, std::string> start() {
    int sockets[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0)
      throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
    const std::string python = python_interpreter();
    std::vector<std::string> args = {python, "-m", "roundoff._worker", "3", run_target_, config_folder_};
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (const std::string& e : environment_) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // fd 3 the socket; stdin nothing; stdout the sweep's stderr, so that a print() in the
    // callable shows up and never mixes with the sweep's own output.
    posix_spawn_file_actions_adddup2(&actions, sockets[1], 3);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
    // Nothing else: HDF5 opens the output without O_CLOEXEC, and a worker started while
    // it is open would hold its flock after the sweep closes it, so that the sweep could
    // not open it again for its summary.
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    Worker worker;
    const int error = posix_spawn(&worker.pid, python.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(sockets[1]);
    worker.fd = sockets[0];
    if (error != 0) {
      close(worker.fd);
      throw PythonLoadError("cannot start the Python interpreter " + python + ": " + std::strerror(error) +
                            " (set ROUNDOFF_PYTHON to another)");
    }
    std::string message;
    if (read_frame(worker.fd, message, nullptr) != Read::ok) {
      const std::string how = reap(worker, false);
      throw PythonLoadError("the Python worker for '" + run_target_ + "' " + how +
                            " before declaring the experiment (its error is above; is the roundoff package built: "
                            "meson compile -C build python?)");
    }
    if (message[0] == 'E') {
      reap(worker, true);
      WireReader r(std::string_view(message).substr(1), kWhat);
      throw PythonLoadError(r.text());
    }
    if (message[0] != 'D') {
      reap(worker, true);
      throw PythonLoadError(std::string(kWhat) + ": expected the declaration");
    }
    return {worker, message};
  }

  std::string run_target_, config_folder_;
  std::vector<std::string> environment_;
  std::mutex mutex_;
  std::vector<Worker> idle_;
};

RunResult run_in_worker(WorkerPool& pool, const Params& params, const RunEnv& env) {
  Worker worker = pool.take();
  WireWriter w;
  w.number<std::uint8_t>('R');
  w.number(env.stream.point), w.number(env.stream.replica), w.number(python_run_seed(env.stream));
  w.number<std::uint64_t>(params.values().size());
  for (const auto& [name, value] : params.values()) w.text(name), write_value(w, value);
  std::string message;
  const bool sent = write_all(worker.fd, frame(w.take()));
  const Read read = sent ? read_frame(worker.fd, message, &env) : Read::closed;
  if (read == Read::cancelled || (read == Read::closed && env.cancelled())) {
    reap(worker, true);
    throw Cancelled();
  }
  if (read == Read::closed) {
    const std::string how = reap(worker, true);
    throw RunRaised("the Python worker " + how + " during the run (a new one takes the next run)", "");
  }
  // The reply: a result, a trap or the callable's exception. One that names something
  // unusable (an unknown flag) fails the run and keeps the worker; a malformed one fails
  // the run and ends the worker; neither stops the sweep.
  const char kind = message.empty() ? '\0' : message[0];
  RunResult result;
  std::optional<emu::TrapReport> trap;
  std::optional<RunRaised> raised;
  try {
    WireReader r(std::string_view(message).substr(message.empty() ? 0 : 1), kWhat);
    if (kind == 'F') {
      std::string text = r.text(), traceback = r.text();
      r.end();
      raised.emplace(text, traceback);
    } else if (kind == 'T') {
      trap = read_trap(r);
    } else if (kind == 'R') {
      result = read_result(r);
    } else {
      throw std::runtime_error("expected a result");
    }
  } catch (const RunRaised&) {
    pool.give_back(worker);
    throw;
  } catch (const std::exception& e) {
    reap(worker, true);
    throw RunRaised(std::string(kWhat) + ": " + e.what() + " (a new worker takes the next run)", "");
  }
  pool.give_back(worker);
  if (raised) throw *raised;
  if (trap) throw emu::FpException(std::move(*trap));  // the runner records the run's trap outcome
  return result;
}

}  // namespace

std::uint64_t python_run_seed(const emu::StreamId& stream) { return emu::Philox4x32(stream).next_u64(); }

std::shared_ptr<const Experiment> load_python_experiment(const std::string& run_target, const std::string& config_folder) {
  auto pool = std::make_shared<WorkerPool>(run_target, config_folder);
  const std::string declaration = pool->start_first();
  WireReader r(std::string_view(declaration).substr(1), kWhat);
  auto experiment = std::make_shared<Experiment>(read_declaration(r, run_target));
  experiment->run = [pool](const Params& params, const RunEnv& env) { return run_in_worker(*pool, params, env); };
  return experiment;
}

}  // namespace roundoff::sweep
