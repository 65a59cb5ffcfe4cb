#include "shard.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string_view>

#include "config.hpp"

namespace roundoff::sweep {
namespace {

// splitmix64's output function (Steele, Lea and Flood, "Fast splittable pseudorandom
// number generators", OOPSLA 2014): an add, two xor-shift-multiplies by odd constants and
// a final xor-shift, each invertible, so distinct points get distinct keys.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

// A whole decimal number in [low, high], else nullopt.
std::optional<std::uint64_t> whole_number(const std::string& text, std::uint64_t low, std::uint64_t high) {
  if (text.empty() || text.size() > 19 || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  const std::uint64_t value = std::stoull(text);
  if (value < low || value > high) return std::nullopt;
  return value;
}

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return std::nullopt;
  return std::string(value);
}

Shard shard_from_slurm() {
  const auto id_text = environment("SLURM_ARRAY_TASK_ID"), count_text = environment("SLURM_ARRAY_TASK_COUNT");
  if (!id_text || !count_text)
    throw InputError(std::string("sweep: --shard auto: ") + (!id_text ? "SLURM_ARRAY_TASK_ID" : "SLURM_ARRAY_TASK_COUNT") +
                     " is not set, so this is not a task of a Slurm job array (submit with sbatch --array=0-" +
                     "<N-1>, e.g. scripts/slurm_sweep.sh, or give --shard K/N)");
  const auto number = [](const std::string& name, const std::string& text, std::uint64_t low) {
    const auto value = whole_number(text, low, kMaxShards);
    if (!value)
      throw InputError("sweep: --shard auto: " + name + "='" + text + "' is not a whole number from " + std::to_string(low) +
                       " to " + std::to_string(kMaxShards));
    return *value;
  };
  const std::uint64_t id = number("SLURM_ARRAY_TASK_ID", *id_text, 0);
  const std::uint64_t count = number("SLURM_ARRAY_TASK_COUNT", *count_text, 1);
  const std::uint64_t min = environment("SLURM_ARRAY_TASK_MIN") ? number("SLURM_ARRAY_TASK_MIN", *environment("SLURM_ARRAY_TASK_MIN"), 0) : 0;
  const std::uint64_t step = environment("SLURM_ARRAY_TASK_STEP") ? number("SLURM_ARRAY_TASK_STEP", *environment("SLURM_ARRAY_TASK_STEP"), 1) : 1;
  if (id < min || (id - min) % step != 0 || (id - min) / step >= count)
    throw InputError("sweep: --shard auto: the job array is not a plain range (task " + std::to_string(id) + ", first " +
                     std::to_string(min) + ", step " + std::to_string(step) + ", " + std::to_string(count) +
                     " tasks); submit with --array=0-<N-1> without a % limit's gaps or a task list");
  return Shard{static_cast<std::uint32_t>((id - min) / step), static_cast<std::uint32_t>(count)};
}

std::string range_text(std::uint32_t first, std::uint32_t last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

// "0-4, 7, 9-10"
std::string replica_text(const std::vector<std::uint32_t>& replicas) {
  std::string text;
  for (std::size_t i = 0; i < replicas.size();) {
    std::size_t j = i;
    while (j + 1 < replicas.size() && replicas[j + 1] == replicas[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + range_text(replicas[i], replicas[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

std::string Shard::text() const { return std::to_string(index) + "/" + std::to_string(count); }

Shard parse_shard(const std::string& text) {
  if (text == "auto") return shard_from_slurm();
  const std::size_t slash = text.find('/');
  const auto index = slash == std::string::npos ? std::nullopt : whole_number(text.substr(0, slash), 0, kMaxShards);
  const auto count = slash == std::string::npos ? std::nullopt : whole_number(text.substr(slash + 1), 1, kMaxShards);
  if (!index || !count || *index >= *count)
    throw InputError("sweep: --shard needs K/N with 0 <= K < N <= " + std::to_string(kMaxShards) +
                     " (shard K of N, counted from 0) or 'auto' (from a Slurm job array), got '" + text + "'");
  return Shard{static_cast<std::uint32_t>(*index), static_cast<std::uint32_t>(*count)};
}

std::vector<std::uint32_t> shard_point_order(std::uint32_t n_points) {
  std::vector<std::uint32_t> order(n_points);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [](std::uint32_t a, std::uint32_t b) { return splitmix64(a) < splitmix64(b); });
  return order;
}

std::vector<std::uint32_t> item_owners(std::uint32_t n_points, std::uint32_t replicas, std::uint32_t count) {
  const std::uint64_t items = std::uint64_t{n_points} * replicas;
  std::vector<std::uint32_t> owner(items);
  const std::vector<std::uint32_t> order = shard_point_order(n_points);
  // Position j of the assignment list belongs to the shard K with
  // floor(K W / N) <= j < floor((K + 1) W / N), i.e. K = floor(((j + 1) N - 1) / W).
  for (std::uint64_t i = 0; i < order.size(); ++i)
    for (std::uint32_t r = 0; r < replicas; ++r) {
      const std::uint64_t j = i * replicas + r;
      owner[std::uint64_t{order[i]} * replicas + r] = static_cast<std::uint32_t>(((j + 1) * count - 1) / items);
    }
  return owner;
}

std::vector<PointWork> shard_items(std::uint32_t n_points, std::uint32_t replicas, const Shard& shard) {
  const std::vector<std::uint32_t> owner = item_owners(n_points, replicas, shard.count);
  std::vector<PointWork> items;
  for (std::uint32_t p = 0; p < n_points; ++p) {
    PointWork work{p, {}};
    for (std::uint32_t r = 0; r < replicas; ++r)
      if (owner[std::uint64_t{p} * replicas + r] == shard.index) work.replicas.push_back(r);
    if (!work.replicas.empty()) items.push_back(std::move(work));
  }
  return items;
}

std::string shard_output_path(const std::string& output, const Shard& shard) {
  const std::filesystem::path path(output);
  std::filesystem::path name = path.stem();
  name += ".shard-" + std::to_string(shard.index) + "-of-" + std::to_string(shard.count);
  name += path.extension();
  return (path.parent_path() / name).string();
}

std::string describe_items(const std::vector<PointWork>& items, std::uint32_t replicas, std::size_t max_points) {
  if (items.empty()) return "no runs";
  const auto whole = [&](std::size_t k) { return items[k].replicas.size() == replicas; };
  std::vector<std::string> parts;
  std::size_t i = 0;
  bool one_point = true;
  while (i < items.size() && parts.size() < max_points) {
    std::size_t j = i;  // consecutive points with the same replicas make one range
    while (j + 1 < items.size() && items[j + 1].point == items[j].point + 1 && items[j + 1].replicas == items[i].replicas) ++j;
    one_point = one_point && i == j;
    parts.push_back(range_text(items[i].point, items[j].point) +
                    (whole(i) ? "" : " (replica" + std::string(items[i].replicas.size() > 1 ? "s " : " ") + replica_text(items[i].replicas) + ")"));
    i = j + 1;
  }
  std::size_t rest = 0;
  for (std::size_t k = i; k < items.size(); ++k) rest += items[k].replicas.size();
  std::string text = parts.size() == 1 && one_point ? "point " : "points ";
  for (std::size_t k = 0; k < parts.size(); ++k) text += (k ? ", " : "") + parts[k];
  if (rest) text += " and " + std::to_string(rest) + " more run" + (rest > 1 ? "s" : "");
  return text;
}

std::string shell_quoted(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || std::string_view("/._-+,:=@%").find(c) != std::string_view::npos;
  });
  if (safe) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace roundoff::sweep
