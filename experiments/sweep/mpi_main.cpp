// build/sweep with MPI (meson -Dmpi=enabled). Under mpirun, rank 0 runs the sweep as on one
// machine (arguments, output, signals, exit status) and also computes on its own threads;
// the other ranks compute the runs rank 0 hands them, a few more than they have threads at
// a time, so that points of very different cost balance out. Started without mpirun it is the ordinary
// sweep and never initialises MPI.
//
// Messages (all small except results, which carry a run's traces):
//   rank 0 -> worker: start (threads, config) | quit | assign (items) | no_more | cancel
//   worker -> rank 0: request (how many) | result (an outcome) | failed (cannot run the
//                     config) | bye (everything given was returned)
// Only each process's main thread calls MPI (MPI_THREAD_FUNNELED). Waits poll with short
// sleeps instead of blocking in MPI, whose busy-waiting would take a core from the runs.
// The C API only: Open MPI's deprecated C++ bindings do not compile without warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "experiments/sweep/cli.hpp"
#include "experiments/sweep/config.hpp"
#include "experiments/sweep/runner.hpp"
#include "experiments/sweep/signals.hpp"
#include "experiments/sweep/wire.hpp"

namespace roundoff::sweep {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(1);
// After rank 0 cancels the workers (a signal, a failure), it waits this long for their last
// results before it closes the output: mpirun kills every rank one second after it
// forwards a SIGINT or SIGTERM, and the file must be closed by then.
constexpr auto kCancelGrace = std::chrono::milliseconds(500);

enum Tag : int { kStart = 1, kQuit, kAssign, kNoMore, kCancel, kRequest, kResult, kFailed, kBye };

struct Message {
  int source = 0;
  int tag = 0;
  std::string bytes;
};

void send(int destination, Tag tag, const std::string& bytes = {}) {
  if (bytes.size() > static_cast<std::size_t>(INT_MAX)) throw std::runtime_error("MPI message over 2 GiB");
  MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, destination, tag, MPI_COMM_WORLD);
}

// A message from `source` (or any) if one has arrived, without waiting.
std::optional<Message> poll(int source = MPI_ANY_SOURCE) {
  int arrived = 0;
  MPI_Status status;
  MPI_Iprobe(source, MPI_ANY_TAG, MPI_COMM_WORLD, &arrived, &status);
  if (!arrived) return std::nullopt;
  int size = 0;
  MPI_Get_count(&status, MPI_BYTE, &size);
  Message message{status.MPI_SOURCE, status.MPI_TAG, std::string(static_cast<std::size_t>(size), '\0')};
  MPI_Recv(message.bytes.data(), size, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return message;
}

std::string count_bytes(std::uint32_t n) { return encode_items({{n, 0}}); }
std::uint32_t count_of(const std::string& bytes) { return decode_items(bytes).at(0).point; }

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// Rank 0's side of a run: hands items to the workers that ask and collects their outcomes.
class MpiRemoteWorkers final : public RemoteWorkers {
 public:
  explicit MpiRemoteWorkers(int ranks) : ranks_(ranks), left_(ranks, false), no_more_sent_(ranks, false) {
    left_[0] = true;
  }
  // After the output is closed: cancels what still runs and takes every worker's last
  // messages, so that none is left blocked sending a large result.
  ~MpiRemoteWorkers() override {
    try {
      cancel();
      while (remaining() > 0) {
        if (auto message = poll()) handle(*message, nullptr, true, nullptr);
        else std::this_thread::sleep_for(kPoll);
      }
    } catch (...) {
      // Leaving: mpirun ends the job.
    }
  }

  void exchange(ComputePool& pool, bool stopping, const std::function<void(ItemOutcome&&)>& deliver) override {
    if (stopping) cancel();
    while (auto message = poll()) handle(*message, &pool, stopping, &deliver);
  }

  std::chrono::milliseconds poll_interval() const override { return kPoll; }

  bool finished() const override {
    return remaining() == 0 || (cancelled_at_ && Clock::now() - *cancelled_at_ > kCancelGrace);
  }

 private:
  int remaining() const {
    int n = 0;
    for (bool left : left_) n += left ? 0 : 1;
    return n;
  }
  void cancel() {
    if (cancelled_at_) return;
    cancelled_at_ = Clock::now();
    for (int w = 1; w < ranks_; ++w)
      if (!left_[w]) send(w, kCancel);
  }
  void handle(const Message& message, ComputePool* pool, bool stopping, const std::function<void(ItemOutcome&&)>* deliver) {
    const int w = message.source;
    switch (message.tag) {
      case kRequest: {
        const std::vector<WorkItem> items = stopping || !pool ? std::vector<WorkItem>{} : pool->take(count_of(message.bytes));
        if (!items.empty()) send(w, kAssign, encode_items(items));
        else if (!no_more_sent_[w]) send(w, kNoMore), no_more_sent_[w] = true;
        break;
      }
      case kResult:
        if (deliver) (*deliver)(decode_outcome(message.bytes));
        break;
      case kFailed:
        if (deliver) {
          ItemOutcome failed;
          failed.kind = ItemOutcome::Kind::bad_input;
          failed.message = "MPI rank " + std::to_string(w) + " " + message.bytes;
          (*deliver)(std::move(failed));
        }
        break;
      case kBye:
        left_[w] = true;
        break;
      default:
        throw std::runtime_error("MPI: unexpected message " + std::to_string(message.tag) + " from rank " + std::to_string(w));
    }
  }

  int ranks_;
  std::vector<bool> left_, no_more_sent_;
  std::optional<Clock::time_point> cancelled_at_;
};

class MpiWorkerGroup final : public WorkerGroup {
 public:
  explicit MpiWorkerGroup(int ranks) : ranks_(ranks) {}
  std::unique_ptr<RemoteWorkers> start(const SweepPlan& plan, int threads) override {
    const std::string start = encode_start({threads, plan.config_path, plan.config_text});
    for (int w = 1; w < ranks_; ++w) send(w, kStart, start);
    return std::make_unique<MpiRemoteWorkers>(ranks_);
  }
  // At the end, whatever happened: every worker may leave.
  void dismiss() {
    for (int w = 1; w < ranks_; ++w) send(w, kQuit);
  }

 private:
  int ranks_;
};

constexpr int kExitInterrupted = 130;

// Waits for rank 0's next message; nullopt when a signal asks this process to stop.
std::optional<Message> wait_for_rank_0(const std::atomic<bool>& stop) {
  for (;;) {
    if (auto message = poll(0)) return message;
    if (stop.load()) return std::nullopt;
    std::this_thread::sleep_for(kPoll);
  }
}

int worker_main() {
  const StopSignals signals;
  const std::atomic<bool>& signalled = stop_requested();  // a signal to this process
  const auto first = wait_for_rank_0(signalled);
  if (!first) return kExitInterrupted;
  if (first->tag != kStart) return 0;  // quit: rank 0 runs nothing (bad input, --help, ...)
  const StartMessage start = decode_start(first->bytes);
  std::optional<SweepPlan> plan;
  try {
    plan = parse_plan(start.config_text, start.config_path, std::nullopt, /*check_output_folder=*/false);
  } catch (const std::exception& e) {
    send(0, kFailed, "(" + host_name() + ") cannot run the config: " + e.what());
  }
  if (plan) {
    std::atomic<bool> cancel{false};  // by a signal or by rank 0
    ComputePool pool(*plan, start.threads, cancel);
    // Enough items that no thread waits for the next hand-out (a quarter of the threads
    // finishing within the ~1 ms a request takes needs points of 4 ms or more), few
    // enough that the last items spread over all ranks: at the end, each rank holds at
    // most a quarter more items than it has threads.
    const std::size_t capacity = pool.threads() + std::max<std::size_t>(2, pool.threads() / 4);
    bool asked = false, closed = false;
    while (!pool.idle()) {
      if (!asked && !closed && !cancel.load() && pool.pending() < capacity) {
        send(0, kRequest, count_bytes(static_cast<std::uint32_t>(capacity - pool.pending())));
        asked = true;
      }
      for (const ItemOutcome& outcome : pool.wait_for_outcomes(kPoll))
        if (outcome.kind != ItemOutcome::Kind::cancelled) send(0, kResult, encode_outcome(outcome));
      while (auto message = poll(0)) {
        if (message->tag == kAssign) pool.add(decode_items(message->bytes)), asked = false;
        else if (message->tag == kNoMore) closed = true;
        else if (message->tag == kCancel || message->tag == kQuit) cancel.store(true);
        else throw std::runtime_error("MPI: unexpected message " + std::to_string(message->tag) + " from rank 0");
      }
      if (signalled.load()) cancel.store(true);
      if (cancel.load()) pool.wake_on_stop();
      if (closed || cancel.load()) pool.close();
    }
  }
  send(0, kBye);
  // Until rank 0 is done with everyone, so that all ranks finalise together and rank 0's
  // exit status is the job's.
  for (;;) {
    const auto message = wait_for_rank_0(signalled);
    if (!message) return kExitInterrupted;
    if (message->tag == kQuit) return 0;
  }
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
}

}  // namespace
}  // namespace roundoff::sweep

int main(int argc, char** argv) {
  using namespace roundoff::sweep;
  if (!launched_by_mpirun()) return sweep_main(argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    if (rank != 0) {
      status = worker_main();
    } else {
      MpiWorkerGroup workers(ranks);
      status = sweep_main(argc, argv, ranks > 1 ? &workers : nullptr);
      workers.dismiss();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sweep: MPI rank %d: internal error: %s (this is a bug)\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
