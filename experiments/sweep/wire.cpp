#include "wire.hpp"

#include <map>
#include <optional>

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

}  // namespace

std::string encode_items(const std::vector<WorkItem>& items) {
  WireWriter w;
  w.number<std::uint64_t>(items.size());
  for (const WorkItem& item : items) w.number(item.point), w.number(item.replica);
  return w.take();
}

std::vector<WorkItem> decode_items(std::string_view bytes) {
  WireReader r(bytes);
  const auto n = r.number<std::uint64_t>();
  if (n > bytes.size() / 8) throw std::runtime_error("MPI message: truncated");
  std::vector<WorkItem> items(n);
  for (WorkItem& item : items) item.point = r.number<std::uint32_t>(), item.replica = r.number<std::uint32_t>();
  r.end();
  return items;
}

void write_metrics_and_traces(WireWriter& w, const RunResult& result) {
  w.number<std::uint64_t>(result.metrics.size());
  for (const auto& [name, value] : result.metrics) w.text(name), w.number(value);
  w.number<std::uint64_t>(result.traces.size());
  for (const auto& [name, trace] : result.traces) w.text(name), w.doubles(trace.x), w.doubles(trace.y);
}

void read_metrics_and_traces(WireReader& r, RunResult& result) {
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
}

std::string encode_outcome(const ItemOutcome& outcome) {
  WireWriter w;
  w.number(outcome.item.point), w.number(outcome.item.replica);
  w.number(static_cast<std::uint8_t>(outcome.kind));
  w.text(outcome.message);
  w.text(outcome.traceback);
  const RunResult& result = outcome.result;
  write_metrics_and_traces(w, result);
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
  WireReader r(bytes);
  ItemOutcome outcome;
  outcome.item.point = r.number<std::uint32_t>();
  outcome.item.replica = r.number<std::uint32_t>();
  const auto kind = r.number<std::uint8_t>();
  if (kind > static_cast<std::uint8_t>(ItemOutcome::Kind::raised)) throw std::runtime_error("MPI message: unknown outcome kind");
  outcome.kind = static_cast<ItemOutcome::Kind>(kind);
  outcome.message = r.text();
  outcome.traceback = r.text();
  RunResult& result = outcome.result;
  read_metrics_and_traces(r, result);
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
  WireWriter w;
  w.number(start.threads);
  w.text(start.config_path);
  w.text(start.config_text);
  return w.take();
}

StartMessage decode_start(std::string_view bytes) {
  WireReader r(bytes);
  StartMessage start;
  start.threads = r.number<std::int32_t>();
  start.config_path = r.text();
  start.config_text = r.text();
  r.end();
  return start;
}

}  // namespace roundoff::sweep
