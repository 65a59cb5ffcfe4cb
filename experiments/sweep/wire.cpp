#include "wire.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <type_traits>

namespace roundoff::sweep {
namespace {

// Every field of RunResult is encoded below. A field added to it changes its size and
// stops the build here: encode and decode the new field, then update this mirror.
struct RunResultFields {
  std::map<std::string, double> metrics;
  std::map<std::string, Trace> traces;
  emu::Flags flags;
  std::vector<emu::OpCount> fp_counts;
  std::optional<emu::TrapReport> trap;
};
static_assert(sizeof(RunResult) == sizeof(RunResultFields),
              "RunResult has changed: encode its new fields in encode_outcome and decode_outcome");

class Writer {
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

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
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
    if (e.rank < 0 || e.rank > emu::Element::kMaxRank) throw std::runtime_error("MPI message: bad element rank");
    for (std::int64_t& i : e.index) i = number<std::int64_t>();
    return e;
  }
  emu::Flag flag() {
    const auto f = number<std::uint8_t>();
    for (emu::Flag known : emu::kAllFlags)
      if (f == known) return known;
    throw std::runtime_error("MPI message: unknown flag");
  }
  void end() const {
    if (!in_.empty()) throw std::runtime_error("MPI message: " + std::to_string(in_.size()) + " bytes left over");
  }

 private:
  void need(std::uint64_t n) const {
    if (n > in_.size()) throw std::runtime_error("MPI message: truncated");
  }
  std::string_view in_;
};

}  // namespace

std::string encode_items(const std::vector<WorkItem>& items) {
  Writer w;
  w.number<std::uint64_t>(items.size());
  for (const WorkItem& item : items) w.number(item.point), w.number(item.replica);
  return w.take();
}

std::vector<WorkItem> decode_items(std::string_view bytes) {
  Reader r(bytes);
  const auto n = r.number<std::uint64_t>();
  if (n > bytes.size() / 8) throw std::runtime_error("MPI message: truncated");
  std::vector<WorkItem> items(n);
  for (WorkItem& item : items) item.point = r.number<std::uint32_t>(), item.replica = r.number<std::uint32_t>();
  r.end();
  return items;
}

std::string encode_outcome(const ItemOutcome& outcome) {
  Writer w;
  w.number(outcome.item.point), w.number(outcome.item.replica);
  w.number(static_cast<std::uint8_t>(outcome.kind));
  w.text(outcome.message);
  const RunResult& result = outcome.result;
  w.number<std::uint64_t>(result.metrics.size());
  for (const auto& [name, value] : result.metrics) w.text(name), w.number(value);
  w.number<std::uint64_t>(result.traces.size());
  for (const auto& [name, trace] : result.traces) w.text(name), w.doubles(trace.x), w.doubles(trace.y);
  w.number<std::uint64_t>(result.flags);
  w.number<std::uint64_t>(result.fp_counts.size());
  for (const emu::OpCount& c : result.fp_counts) {
    w.text(c.scope), w.text(c.op), w.number<std::uint8_t>(c.flag), w.number(c.count);
    w.element(c.first_element), w.doubles(c.first_operands), w.number(c.first_result);
  }
  w.number<std::uint8_t>(result.trap.has_value());
  if (const auto& t = result.trap) {
    w.number<std::uint8_t>(t->flag), w.text(t->scope), w.text(t->op), w.element(t->element);
    w.doubles(t->operands), w.number(t->result), w.number<std::uint8_t>(t->status);
  }
  return w.take();
}

ItemOutcome decode_outcome(std::string_view bytes) {
  Reader r(bytes);
  ItemOutcome outcome;
  outcome.item.point = r.number<std::uint32_t>();
  outcome.item.replica = r.number<std::uint32_t>();
  const auto kind = r.number<std::uint8_t>();
  if (kind > static_cast<std::uint8_t>(ItemOutcome::Kind::failure)) throw std::runtime_error("MPI message: unknown outcome kind");
  outcome.kind = static_cast<ItemOutcome::Kind>(kind);
  outcome.message = r.text();
  RunResult& result = outcome.result;
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    std::string name = r.text();
    result.metrics[std::move(name)] = r.number<double>();
  }
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    std::string name = r.text();
    Trace trace;
    trace.x = r.doubles();
    trace.y = r.doubles();
    result.traces[std::move(name)] = std::move(trace);
  }
  result.flags = static_cast<emu::Flags>(r.number<std::uint64_t>());
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    emu::OpCount c;
    c.scope = r.text(), c.op = r.text(), c.flag = r.flag(), c.count = r.number<std::uint64_t>();
    c.first_element = r.element(), c.first_operands = r.doubles(), c.first_result = r.number<double>();
    result.fp_counts.push_back(std::move(c));
  }
  if (r.number<std::uint8_t>() != 0) {
    emu::TrapReport t;
    t.flag = r.flag(), t.scope = r.text(), t.op = r.text(), t.element = r.element();
    t.operands = r.doubles(), t.result = r.number<double>(), t.status = r.number<std::uint8_t>();
    result.trap = std::move(t);
  }
  r.end();
  return outcome;
}

std::string encode_start(const StartMessage& start) {
  Writer w;
  w.number(start.threads);
  w.text(start.config_path);
  w.text(start.config_text);
  return w.take();
}

StartMessage decode_start(std::string_view bytes) {
  Reader r(bytes);
  StartMessage start;
  start.threads = r.number<std::int32_t>();
  start.config_path = r.text();
  start.config_text = r.text();
  r.end();
  return start;
}

}  // namespace roundoff::sweep
