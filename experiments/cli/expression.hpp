// Arithmetic expressions for `emu eval`: + - * / with the usual precedence (* and /
// before + and -, all left-associative), parentheses, unary minus and plus. Parsing
// builds a tree; evaluation walks it left to right, rounding every literal and every
// operation into one format through an emu::Context.
#pragma once

#include <array>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "emu/arith.hpp"
#include "emu/format.hpp"

namespace emu::cli {

// A syntax error at a 1-based column of the expression text.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(int column, const std::string& message)
      : std::runtime_error("column " + std::to_string(column) + ": " + message), column_(column) {}
  int column() const { return column_; }

 private:
  int column_;
};

struct Expression {
  enum class Kind { literal, negate, add, sub, mul, div };
  Kind kind = Kind::literal;
  Exact literal;        // the exact value of a literal
  std::string text;     // a literal as written (including a sign folded into it)
  int column = 0;       // where it starts in the source, 1-based
  std::unique_ptr<Expression> left, right;  // negate uses left only
};

// Limits, so that no input can exhaust the stack (parsing, evaluation and the tree's
// destruction recurse once per level): an expression has at most kMaxExpressionLength
// characters and nests at most kMaxNesting parentheses and signs ("((1))" and "- -1"
// nest twice). Beyond either: SyntaxError at the column where the limit is passed.
inline constexpr std::size_t kMaxExpressionLength = 4096;
inline constexpr int kMaxNesting = 100;

// Numbers are written as parse_number() reads them (decimal, hex-float, inf, nan).
// A minus or plus sign written directly before a number, where an operand is expected,
// belongs to that literal: "-0.1" is the literal -0.1, rounded once (which matters
// under ru and rd), while "-(0.1)" negates the rounded 0.1. Negation is exact.
// Throws SyntaxError naming the column.
std::unique_ptr<Expression> parse_expression(std::string_view text);

// An operation of an evaluation as the user wrote it: the operator ("+", "-", "*",
// "/"), or "round" for a literal rounded into the format; its 1-based column in the
// expression; its operands (values of the format; a literal's nearest double).
struct Operation {
  std::string op;
  int column = 0;  // 0: no expression (emu round)
  std::vector<double> operands;
  std::string text;  // "round": the literal or input as written, for people
};

// Per flag, the first operation that raised it (in evaluation order).
class RaisedBy {
 public:
  // Records `operation` for the flags in `raised` that have none yet.
  void note(Flags raised, const Operation& operation);
  const Operation* first(Flag f) const;
  void clear() { first_ = {}; }

 private:
  std::array<std::optional<Operation>, std::size(kAllFlags)> first_;
};

// Thrown by evaluate when the context traps: the context's report and the operation
// as written.
class ExpressionTrap : public std::runtime_error {
 public:
  ExpressionTrap(TrapReport report, Operation operation)
      : std::runtime_error(std::string("trap ") + flag_name(report.flag) + " at column " +
                           std::to_string(operation.column)),
        report(std::move(report)), operation(std::move(operation)) {}
  TrapReport report;
  Operation operation;
};

// Evaluates e in format f under ctx: each literal is rounded into f (ctx.round), each
// operation is ctx.add/sub/mul/div into f; the flags collect in ctx.status() and, per
// flag, the first operation that raised it in `raised_by`. A trap of the context is
// rethrown as ExpressionTrap.
double evaluate(const Expression& e, const Format& f, Context& ctx, RaisedBy& raised_by);

// The tree written back with full parentheses, e.g. "((1 + 2) * -3)", for tests.
std::string to_string(const Expression& e);

}  // namespace emu::cli
