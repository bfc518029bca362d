// Parsing a Jinja template, as transformers' apply_chat_template configures Jinja: trim_blocks
// and lstrip_blocks on, loop controls (break, continue), `{% generation %}` blocks, one trailing
// newline of the source dropped, "\r\n" read as "\n".
//
// What is parsed: text, `{{ }}`, `{# #}`, whitespace control (`{%-`, `-%}`, `{%+`, `+%}`); the
// statements if/elif/else, for (with `loop`, an `if` filter and `else`), set (of a name, of a
// namespace's attribute, and `{% set x %}...{% endset %}`), macro, break, continue, generation;
// expressions with Jinja's precedence (conditional expressions, or/and/not, comparisons, in,
// + - ~ * / // % **, unary minus), literals (strings, numbers, lists, dicts, tuples, true/none
// in either case), attributes, subscripts, slices, calls with keyword arguments, filters and
// `is` tests. Anything else (e.g. `{% raw %}`, `{% include %}`, `{% extends %}`) is an error
// that names it and its line, never skipped.
//
// The source is the operator's file, but bounded anyway: nesting deeper than kMaxNesting (of
// blocks or of expressions) is an error, not a stack overflow.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/jinja_value.h"
#include "core/status.h"

namespace colony::api::jinja {

inline constexpr int kMaxNesting = 64;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // operands[0].name
    kItem,     // operands[0][operands[1]]
    kSlice,    // operands[0][operands[1]:operands[2]:operands[3]], absent ones null
    kCall,     // operands[0](operands[1..], keyword)
    kFilter,   // operands[0] | name(operands[1..], keyword)
    kTest,     // operands[0] is [not] name(operands[1..]); negated
    kUnary,    // name ("not", "-", "+") operands[0]
    kBinary,   // operands[0] name operands[1]: and or + - * / // % ** ~
    kCompare,  // operands[0] ops[0] operands[1] ops[1] ...: == != < > <= >= in "not in"
    kCond,     // operands[0] if operands[1] else operands[2] (null: undefined)
    kList,     // [operands...]
    kTuple,    // (operands...), a list once evaluated
    kDict,     // {operands[0]: operands[1], ...}
  };
  Type type = Type::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Type {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches; else_body
    kFor,       // for targets in expr [if cond]: body [else: else_body]
    kSet,       // set targets[0] (or targets[0].attr) = expr
    kSetBlock,  // set targets[0]: body
    kMacro,     // macro name(targets with defaults): body
    kBreak,
    kContinue,
    kScope,  // body (generation)
  };
  Type type = Type::kText;
  int line = 0;
  std::string text;  // kText; kMacro's name
  std::string attr;  // kSet of a namespace attribute
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // a macro's, one per target (null: none)
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

// InvalidArgument "line N: ..." for what is malformed or not supported.
Result<Body> ParseTemplate(std::string_view source);

}  // namespace colony::api::jinja
