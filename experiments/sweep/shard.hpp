// Work items and shards. A sweep's work items are its (point, replica) runs; `--shard K/N`
// runs the items of shard K of N only. The assignment is a pure function of P, R and N
// (documented in results/README.md, "Shards and merging"):
//   1. order the points by splitmix64(point) (a fixed bijection of 64-bit integers, so no
//      ties): a deterministic shuffle, the same for every config, that breaks the link
//      between grid axes and shards (otherwise one shard could get every n = 10^6 point);
//   2. list the items point by point in that order, each point's replicas in order;
//   3. shard K takes the contiguous run of items [floor(K W / N), floor((K + 1) W / N))
//      of that list, W = P R.
// Every shard gets the same number of items (within one); its cost is that of a random
// sample of points, so shards are balanced in expectation, not exactly (dynamic balancing
// is what the MPI mode is for). A point's replicas stay together except at the N - 1
// boundaries, where a point is split between neighbouring shards.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace roundoff::sweep {

struct Shard {
  std::uint32_t index = 0, count = 1;  // shard `index` of `count`, 0 <= index < count
  std::string text() const;            // "K/N"
};

// The largest shard count: a sweep has at most kMaxRuns items, so more shards would all
// be empty ones.
inline constexpr std::uint32_t kMaxShards = 1'000'000;

// "K/N" (0 <= K < N <= kMaxShards) or "auto": K and N from the Slurm job array
// (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT, and SLURM_ARRAY_TASK_MIN/STEP when set,
// so that --array=1-8 or 0-14:2 work too). InputError with the reason otherwise.
Shard parse_shard(const std::string& text);

// The runs of one point that some unit of work holds (replicas ascending).
struct PointWork {
  std::uint32_t point = 0;
  std::vector<std::uint32_t> replicas;
};

// The points in assignment order (step 1 above).
std::vector<std::uint32_t> shard_point_order(std::uint32_t n_points);

// The items of `shard`, by point ascending.
std::vector<PointWork> shard_items(std::uint32_t n_points, std::uint32_t replicas, const Shard& shard);

// Which shard of `count` holds each item: [P * R], row-major (point, replica).
std::vector<std::uint32_t> item_owners(std::uint32_t n_points, std::uint32_t replicas, std::uint32_t count);

// A shard's output when no -o is given: OUTPUT with ".shard-K-of-N" before its extension
// (results/x.h5 -> results/x.shard-2-of-8.h5).
std::string shard_output_path(const std::string& output, const Shard& shard);

// Compact text for a set of items, for messages: "points 3 (replicas 0-4), 7, 12-15 and
// 40 more" (a point listed without replicas means all of them).
std::string describe_items(const std::vector<PointWork>& items, std::uint32_t replicas, std::size_t max_points = 12);

// `word` as a POSIX shell reads it back: unchanged when it is made of safe characters only,
// else in single quotes. For the commands that hints print.
std::string shell_quoted(const std::string& word);

}  // namespace roundoff::sweep
