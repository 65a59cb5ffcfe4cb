#include "expression.hpp"

#include <cctype>

#include "number.hpp"

namespace emu::cli {

namespace {

bool is_number_start(std::string_view s, std::size_t i) {
  return i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.');
}

// Recursive descent over the grammar
//   sum     := product (('+' | '-') product)*
//   product := unary (('*' | '/') unary)*
//   unary   := ('-' | '+') unary | primary      (a sign right before a number: literal)
//   primary := number | name | '(' sum ')'
class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  std::unique_ptr<Expression> parse() {
    if (s_.size() > kMaxExpressionLength)
      throw SyntaxError(static_cast<int>(kMaxExpressionLength) + 1,
                        "the expression is longer than " + std::to_string(kMaxExpressionLength) + " characters (the limit)");
    skip_spaces();
    if (pos_ == s_.size()) throw SyntaxError(1, "empty expression");
    auto e = sum();
    skip_spaces();
    if (pos_ < s_.size()) {
      if (s_[pos_] == ')') throw SyntaxError(column(), "')' without a matching '('");
      throw SyntaxError(column(), "expected an operator (+ - * /) but found " + describe_here());
    }
    return e;
  }

 private:
  int column() const { return static_cast<int>(pos_) + 1; }
  void skip_spaces() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  // One more level of parentheses or signs, for as long as it lives.
  class Nested {
   public:
    explicit Nested(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxNesting)
        throw SyntaxError(parser_.column(), "more than " + std::to_string(kMaxNesting) +
                                                " levels of nested parentheses and signs (the limit)");
    }
    ~Nested() { --parser_.depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& parser_;
  };

  std::string describe_here() const {
    if (pos_ >= s_.size()) return "the end of the expression";
    return std::string("'") + s_[pos_] + "'";
  }

  static std::unique_ptr<Expression> node(Expression::Kind kind, int column, std::unique_ptr<Expression> left,
                                          std::unique_ptr<Expression> right) {
    auto e = std::make_unique<Expression>();
    e->kind = kind;
    e->column = column;
    e->left = std::move(left);
    e->right = std::move(right);
    return e;
  }

  std::unique_ptr<Expression> sum() {
    auto left = product();
    while (true) {
      skip_spaces();
      if (pos_ == s_.size() || (s_[pos_] != '+' && s_[pos_] != '-')) return left;
      const auto kind = s_[pos_] == '+' ? Expression::Kind::add : Expression::Kind::sub;
      const int at = column();
      ++pos_;
      left = node(kind, at, std::move(left), product());
    }
  }

  std::unique_ptr<Expression> product() {
    auto left = unary();
    while (true) {
      skip_spaces();
      if (pos_ == s_.size() || (s_[pos_] != '*' && s_[pos_] != '/')) return left;
      const auto kind = s_[pos_] == '*' ? Expression::Kind::mul : Expression::Kind::div;
      const int at = column();
      ++pos_;
      left = node(kind, at, std::move(left), unary());
    }
  }

  std::unique_ptr<Expression> unary() {
    skip_spaces();
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) {
      const bool minus = s_[pos_] == '-';
      const std::size_t sign_at = pos_;
      if (is_number_start(s_, pos_ + 1) || is_name_start(pos_ + 1)) return literal(sign_at);
      const Nested nested(*this);
      ++pos_;
      auto operand = unary();
      if (!minus) return operand;
      return node(Expression::Kind::negate, static_cast<int>(sign_at) + 1, std::move(operand), nullptr);
    }
    return primary();
  }

  bool is_name_start(std::size_t i) const { return i < s_.size() && std::isalpha(static_cast<unsigned char>(s_[i])); }

  std::unique_ptr<Expression> primary() {
    skip_spaces();
    if (pos_ < s_.size() && s_[pos_] == '(') {
      const int open = column();
      const Nested nested(*this);
      ++pos_;
      auto inner = sum();
      skip_spaces();
      if (pos_ == s_.size() || s_[pos_] != ')')
        throw SyntaxError(column(), "expected ')' to close the '(' at column " + std::to_string(open) +
                                        " but found " + describe_here());
      ++pos_;
      return inner;
    }
    if (is_number_start(s_, pos_) || is_name_start(pos_)) return literal(pos_);
    throw SyntaxError(column(), "expected a number or '(' but found " + describe_here());
  }

  // A number (with its sign, if one starts at `start`): letters, digits and points, plus
  // a sign right after an exponent letter (e of decimals, p of hex-floats).
  std::unique_ptr<Expression> literal(std::size_t start) {
    pos_ = start;
    if (s_[pos_] == '-' || s_[pos_] == '+') ++pos_;
    const bool hex = pos_ + 1 < s_.size() && s_[pos_] == '0' && (s_[pos_ + 1] == 'x' || s_[pos_ + 1] == 'X');
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '.') {
        ++pos_;
        continue;
      }
      const char before = s_[pos_ - 1];
      const bool after_exponent = hex ? (before == 'p' || before == 'P') : (before == 'e' || before == 'E');
      if ((c == '+' || c == '-') && after_exponent) {
        ++pos_;
        continue;
      }
      break;
    }
    auto e = std::make_unique<Expression>();
    e->kind = Expression::Kind::literal;
    e->column = static_cast<int>(start) + 1;
    e->text = std::string(s_.substr(start, pos_ - start));
    try {
      e->literal = parse_number(e->text);
    } catch (const NumberError& err) {
      throw SyntaxError(e->column, "malformed number '" + e->text + "': " + err.what());
    }
    return e;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  int depth_ = 0;  // parentheses and signs open at pos_
};

}  // namespace

std::unique_ptr<Expression> parse_expression(std::string_view text) { return Parser(text).parse(); }

void RaisedBy::note(Flags raised, const Operation& operation) {
  for (std::size_t i = 0; i < first_.size(); ++i)
    if ((raised & kAllFlags[i]) && !first_[i]) first_[i] = operation;
}

const Operation* RaisedBy::first(Flag f) const {
  for (std::size_t i = 0; i < first_.size(); ++i)
    if (kAllFlags[i] == f && first_[i]) return &*first_[i];
  return nullptr;
}

namespace {

// Runs one operation of the evaluation: notes the flags it raised first, turns a trap
// into an ExpressionTrap naming it as written.
template <typename Run>
double operation(Context& ctx, RaisedBy& raised_by, Operation written, Run run) {
  const Flags before = ctx.status();
  double r;
  try {
    r = run();
  } catch (const FpException& e) {
    throw ExpressionTrap(e.report(), std::move(written));
  }
  // The sticky status shows a flag as new only the first time it is raised; later
  // raises of it change nothing here, which is what "first" asks for.
  if (const Flags raised = ctx.status() & ~before) raised_by.note(raised, written);
  return r;
}

}  // namespace

double evaluate(const Expression& e, const Format& f, Context& ctx, RaisedBy& raised_by) {
  using Kind = Expression::Kind;
  switch (e.kind) {
    case Kind::literal:
      return operation(ctx, raised_by, {"round", e.column, {e.literal.hi}, e.text},
                       [&] { return ctx.round(f, e.literal, "literal", {e.literal.hi}); });
    case Kind::negate:
      return -evaluate(*e.left, f, ctx, raised_by);
    default:
      break;
  }
  const double a = evaluate(*e.left, f, ctx, raised_by);  // left operand first: left to right
  const double b = evaluate(*e.right, f, ctx, raised_by);
  switch (e.kind) {
    case Kind::add: return operation(ctx, raised_by, {"+", e.column, {a, b}, {}}, [&] { return ctx.add(f, a, b); });
    case Kind::sub: return operation(ctx, raised_by, {"-", e.column, {a, b}, {}}, [&] { return ctx.sub(f, a, b); });
    case Kind::mul: return operation(ctx, raised_by, {"*", e.column, {a, b}, {}}, [&] { return ctx.mul(f, a, b); });
    case Kind::div: return operation(ctx, raised_by, {"/", e.column, {a, b}, {}}, [&] { return ctx.div(f, a, b); });
    default: throw std::logic_error("evaluate: unknown expression kind");
  }
}

std::string to_string(const Expression& e) {
  using Kind = Expression::Kind;
  switch (e.kind) {
    case Kind::literal: return e.text;
    case Kind::negate: return "-(" + to_string(*e.left) + ")";
    default: break;
  }
  const char* op = e.kind == Kind::add ? " + " : e.kind == Kind::sub ? " - " : e.kind == Kind::mul ? " * " : " / ";
  std::string s = "(";
  s += to_string(*e.left);
  s += op;
  s += to_string(*e.right);
  return s + ")";
}

}  // namespace emu::cli
