// Arithmetic in a Format under an FP context: every result is the exact result rounded
// once (emu/round.hpp), with IEEE 754 NaN and infinity semantics, sticky status flags
// and traps.
#pragma once

#include <compare>
#include <initializer_list>

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
class Context {
 public:
  explicit Context(FpControl control = {}, Rng rng = Rng{}) : control(control), rng_(rng) {}

  FpControl control;

  Flags status() const { return status_; }
  // As the IPU clears $FP_STS at worker launch: flags are sticky until cleared.
  void clear_status() { status_ = 0; }
  Rng& rng() { return rng_; }

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
  // set; its overflow policy and sr_bits), raising `raised` plus rounding's flags, and
  // trapping as the control says. `op` and the operands name the operation in a trap.
  double round(const Format& f, const Exact& x, const char* op,
               std::initializer_list<double> operands, Flags raised = 0);
  // The same with an explicit rounding mode, for units that do not honour esr.
  double round_with(Rounding mode, const Format& f, const Exact& x, const char* op,
                    std::initializer_list<double> operands, Flags raised = 0);

  // Raises flags that a unit computed itself (e.g. INEXACT collected over a block),
  // updating the sticky status and trapping as the control says.
  void raise_flags(Flags raised, const char* op, std::initializer_list<double> operands) {
    raise(raised, op, operands);
  }

  RoundSpec spec() const { return {control.effective_rounding(), control.overflow, control.sr_bits}; }

 private:
  double invalid(const char* op, std::initializer_list<double> operands);
  void raise(Flags raised, const char* op, std::initializer_list<double> operands);

  Rng rng_;
  Flags status_ = 0;
};

}  // namespace emu
