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
// counts adds one to its (scope, op, flag) count (once per element), which keeps the
// first element and its operands; then a raised flag that the control traps throws
// FpException with a TrapReport naming flag, scope, op, element, operands, the
// would-be result and the status. When one operation raises several trapped flags the
// report names the cause, in the order DIV0, OFLO, INV, UFLO, INEXACT: INV can be the
// consequence of the other two (NANOO's NaN on overflow; x/0 into a format without
// inf), never their cause.
class ElementGuard;

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
  // Scalar code leaves it unset; a tensor operation sets it per element (ElementGuard)
  // and restores the previous one when done. Every set_element starts a new element:
  // the flags one element raises count once per (scope, op, flag), however many of
  // its steps raise them.
  void set_element(std::int64_t flat, std::initializer_list<std::int64_t> index = {});
  void set_element(const Element& element);
  void clear_element() { set_element(Element{}); }
  const Element& element() const { return element_; }

  // The counted flags, one entry per (scope, op, flag) in the order first raised: how
  // many elements (scalar operations, or elements of a tensor operation) raised it, and
  // the first of them with its operands and result.
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
  // Adds a count gathered elsewhere (a unit that computes its elements out of order
  // collects them and adds them in element order): raises c.flag into the status
  // without counting or trapping it again; the same (scope, op, flag) adds c.count and
  // keeps its first element, a new one is appended as it is.
  void add_count(const OpCount& c);

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
  // An exact zero result (IEEE 754 6.3's sign in `zero`) as a value of f.
  double exact_zero(const Format& f, double zero, const char* op, std::initializer_list<double> operands);
  void raise(Flags raised, const char* op, std::initializer_list<double> operands, double result);
  void count(Flags counted, const char* op, std::initializer_list<double> operands, double result);

  // Where a (scope, op, flag) is in counts_, and the element that last added to it.
  struct CountSlot {
    std::size_t index;
    std::uint64_t last_element;  // element_serial_ then; 0: a scalar operation
  };

  Rng rng_;
  Flags status_ = 0;
  std::string scope_;
  std::vector<std::size_t> scope_lengths_;  // scope_'s length before each push
  Element element_;
  std::uint64_t element_serial_ = 0;  // one per set_element of a known element (from 1)
  std::vector<OpCount> counts_;
  // Looked up with string_views: counting a known key allocates nothing. The keys are
  // compared as views (std::less<> would compare tuple<string...> with tuple<string_view...>,
  // which libstdc++ leaves to C++20's synthesised ordering and clang 14 rejects).
  using CountKey = std::tuple<std::string, std::string, Flag>;
  using CountKeyView = std::tuple<std::string_view, std::string_view, Flag>;
  struct CountKeyLess {
    using is_transparent = void;
    static CountKeyView view(const CountKey& k) { return {std::get<0>(k), std::get<1>(k), std::get<2>(k)}; }
    static const CountKeyView& view(const CountKeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const { return view(a) < view(b); }
  };
  std::map<CountKey, CountSlot, CountKeyLess> count_index_;
  std::uint64_t next_serial_ = 0;

  friend class ElementGuard;
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

// Sets the element of a tensor operation for as long as it lives, then restores the
// element that was set before (none, or an enclosing operation's).
class ElementGuard {
 public:
  ElementGuard(Context& ctx, std::int64_t flat, std::initializer_list<std::int64_t> index = {})
      : ctx_(ctx), previous_(ctx.element_), previous_serial_(ctx.element_serial_) {
    ctx_.set_element(flat, index);
  }
  // The enclosing element continues (it is not a new one).
  ~ElementGuard() {
    ctx_.element_ = previous_;
    ctx_.element_serial_ = previous_serial_;
  }
  ElementGuard(const ElementGuard&) = delete;
  ElementGuard& operator=(const ElementGuard&) = delete;

 private:
  Context& ctx_;
  Element previous_;
  std::uint64_t previous_serial_;
};

}  // namespace emu
