// The bytes MPI ranks exchange: work items and run outcomes, in a fixed little-endian
// layout (every rank runs the same build, but the layout does not depend on that). Kept
// apart from MPI so that it is tested in every build. The Python workers' protocol
// (python_experiment.hpp) is written in the same primitives: little-endian numbers, text
// and float64 arrays as a uint64 count followed by their bytes or values.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "runner.hpp"

namespace roundoff::sweep {

// Appends fields to a message.
class WireWriter {
 public:
  template <typename T>
  void number(T value) {
    static_assert(std::is_arithmetic_v<T>);
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(bytes, bytes + sizeof(T));
    out_.append(reinterpret_cast<const char*>(bytes), sizeof(T));
  }
  void text(std::string_view s) {
    number<std::uint64_t>(s.size());
    out_.append(s);
  }
  void doubles(const std::vector<double>& values) {
    number<std::uint64_t>(values.size());
    for (double v : values) number(v);
  }
  void element(const emu::Element& e) {
    number(e.flat);
    number<std::int32_t>(e.rank);
    for (std::int64_t i : e.index) number(i);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads the fields of a message in order; a short or malformed one throws
// std::runtime_error("WHAT: ...").
class WireReader {
 public:
  explicit WireReader(std::string_view in, std::string what = "MPI message") : in_(in), what_(std::move(what)) {}
  template <typename T>
  T number() {
    need(sizeof(T));
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, in_.data(), sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(bytes, bytes + sizeof(T));
    in_.remove_prefix(sizeof(T));
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }
  std::string text() {
    const auto n = number<std::uint64_t>();
    need(n);
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  std::vector<double> doubles() {
    const auto n = number<std::uint64_t>();
    need(n > in_.size() / sizeof(double) ? in_.size() + 1 : n * sizeof(double));
    std::vector<double> values(n);
    for (double& v : values) v = number<double>();
    return values;
  }
  emu::Element element() {
    emu::Element e;
    e.flat = number<std::int64_t>();
    e.rank = number<std::int32_t>();
    if (e.rank < 0 || e.rank > emu::Element::kMaxRank) throw std::runtime_error(what_ + ": bad element rank");
    for (std::int64_t& i : e.index) i = number<std::int64_t>();
    return e;
  }
  emu::Flag flag() {
    const auto f = number<std::uint8_t>();
    for (emu::Flag known : emu::kAllFlags)
      if (f == known) return known;
    throw std::runtime_error(what_ + ": unknown flag");
  }
  void end() const {
    if (!in_.empty()) throw std::runtime_error(what_ + ": " + std::to_string(in_.size()) + " bytes left over");
  }

 private:
  void need(std::uint64_t n) const {
    if (n > in_.size()) throw std::runtime_error(what_ + ": truncated");
  }
  std::string_view in_;
  std::string what_;
};

// A run's metrics and traces as the MPI messages and the Python workers' results carry
// them: their count, then (name, value) each; their count, then (name, x, y) each.
void write_metrics_and_traces(WireWriter& w, const RunResult& result);
void read_metrics_and_traces(WireReader& r, RunResult& result);

std::string encode_items(const std::vector<WorkItem>& items);
std::vector<WorkItem> decode_items(std::string_view bytes);

// Every field of the outcome: item, kind, message, and the result's metrics, traces and
// flags. Decoding checks the layout (std::runtime_error when truncated or malformed).
std::string encode_outcome(const ItemOutcome& outcome);
ItemOutcome decode_outcome(std::string_view bytes);

// What rank 0 sends to start the workers: the threads per rank (-j) and the config.
struct StartMessage {
  std::int32_t threads = 0;
  std::string config_path, config_text;
};
std::string encode_start(const StartMessage& start);
StartMessage decode_start(std::string_view bytes);

}  // namespace roundoff::sweep
