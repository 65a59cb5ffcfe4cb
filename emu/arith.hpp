// Arithmetic in a Format under an FP context: every result is the exact result rounded
// once (emu/round.hpp), with IEEE 754 NaN and infinity semantics, sticky status flags
// and traps.
#pragma once

#include <compare>
#include <limits>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "format.hpp"
#include "rng.hpp"
#include "round.hpp"
#include "status.hpp"

namespace emu {

// Exact results of the basic operations on doubles (error-free transforms where they
// are exact, Boost.Multiprecision where they are not). NaN and infinite operands are the
// caller's business: these take finite operands.
Exact exact_add(double a, double b);
Exact exact_mul(double a, double b);
Exact exact_fma(double a, double b, double c);  // a*b + c
Exact exact_div(double a, double b);            // b != 0
Exact exact_sqrt(double a);                     // a >= 0

// Values are passed as doubles; every value of every Format is a double. Operands need
// not belong to the result's format (mixed precision): the exact result of the given
// values is rounded into the result format.
//
// Provenance (for diagnosing numerical issues): a context has a scope path (nestable
// names, "encoder.block3.ffn.wo", set with emu::Scope) and the element the current
// tensor operation is computing (set_element). Every raised flag that the control
// traps throws FpException with a TrapReport naming flag, scope, op, element, operands,
// the would-be result and the status; every raised flag that the control counts adds
// one to its (scope, op, flag) count, which keeps the first element and its operands.
class Context {
 public:
  explicit Context(FpControl control = {}, Rng rng = Rng{}) : control(control), rng_(rng) {}

  FpControl control;

  Flags status() const { return status_; }
  // As the IPU clears $FP_STS at worker launch: flags are sticky until cleared.
  void clear_status() { status_ = 0; }
  Rng& rng() { return rng_; }

  // The scope path: names joined by '.'; "" at top level. Use emu::Scope to push and pop.
  const std::string& scope() const { return scope_; }
  void push_scope(std::string_view name);
  void pop_scope();

  // The element the current tensor operation computes (flat row-major index into its
  // output, and the index per dimension where known, at most Element::kMaxRank).
  // Scalar code leaves it unset; a tensor operation sets it per element and clears it
  // when done.
  void set_element(std::int64_t flat) {
    element_.flat = flat;
    element_.rank = 0;
  }
  void set_element(std::int64_t flat, std::initializer_list<std::int64_t> index);
  void clear_element() { element_ = Element{}; }
  const Element& element() const { return element_; }

  // The counted flags, one entry per (scope, op, flag) in the order first raised.
  const std::vector<OpCount>& counts() const { return counts_; }
  // Adds the sticky status and the counts of a context that ran part of this one's work
  // (e.g. a copy on another thread) as if this context had run it after its own: the
  // flags join the status, counts of the same (scope, op, flag) add up (the first
  // element stays this context's), new ones are appended in their order.
  void absorb(const Context& other);
  void clear_counts() {
    counts_.clear();
    count_index_.clear();
  }

  double add(const Format& f, double a, double b);
  double sub(const Format& f, double a, double b);
  double mul(const Format& f, double a, double b);
  double div(const Format& f, double a, double b);
  double fma(const Format& f, double a, double b, double c);  // a*b + c, one rounding
  double sqrt(const Format& f, double a);
  // Conversion of any double (a value of another format) into f.
  double convert(const Format& f, double a);
  // IEEE comparison: unordered when either is NaN. Ordered comparisons (less) raise INV
  // on NaN operands; equality does not.
  std::partial_ordering compare(double a, double b);
  bool less(double a, double b);
  bool equal(double a, double b) const { return a == b; }

  // Rounds an exact value into f under this context (its rounding, or SR when esr is
  // set; its overflow policy, sr_bits and tininess), raising `raised` plus rounding's
  // flags, counting and trapping as the control says. `op` and the operands name the
  // operation in a trap report and in the counts.
  double round(const Format& f, const Exact& x, const char* op,
               std::initializer_list<double> operands, Flags raised = 0);
  // The same with an explicit rounding mode, for units that do not honour esr.
  double round_with(Rounding mode, const Format& f, const Exact& x, const char* op,
                    std::initializer_list<double> operands, Flags raised = 0);

  // Raises flags that a unit computed itself (e.g. INEXACT collected over a block),
  // updating the sticky status, counting and trapping as the control says; `result` is
  // the value the operation delivers (for the report).
  void raise_flags(Flags raised, const char* op, std::initializer_list<double> operands,
                   double result = std::numeric_limits<double>::quiet_NaN()) {
    raise(raised, op, operands, result);
  }

  RoundSpec spec() const {
    return {control.effective_rounding(), control.overflow, control.sr_bits, control.tininess};
  }

 private:
  double invalid(const char* op, std::initializer_list<double> operands);
  void raise(Flags raised, const char* op, std::initializer_list<double> operands, double result);
  void count(Flags counted, const char* op, std::initializer_list<double> operands, double result);

  Rng rng_;
  Flags status_ = 0;
  std::string scope_;
  std::vector<std::size_t> scope_lengths_;  // scope_'s length before each push
  Element element_;
  std::vector<OpCount> counts_;
  std::map<std::tuple<std::string, std::string, Flag>, std::size_t> count_index_;
};

// Names a part of a computation for as long as it lives (RAII, nestable):
//   emu::Scope block(ctx, "block3"); emu::Scope ffn(ctx, "ffn");  // "block3.ffn"
class Scope {
 public:
  Scope(Context& ctx, std::string_view name) : ctx_(ctx) { ctx_.push_scope(name); }
  ~Scope() { ctx_.pop_scope(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Context& ctx_;
};

// Sets the element of a tensor operation for as long as it lives and clears it after.
class ElementGuard {
 public:
  ElementGuard(Context& ctx, std::int64_t flat, std::initializer_list<std::int64_t> index = {}) : ctx_(ctx) {
    ctx_.set_element(flat, index);
  }
  ~ElementGuard() { ctx_.clear_element(); }
  ElementGuard(const ElementGuard&) = delete;
  ElementGuard& operator=(const ElementGuard&) = delete;

 private:
  Context& ctx_;
};

}  // namespace emu
