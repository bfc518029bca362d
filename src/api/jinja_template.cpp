// Rendering a parsed Jinja template: scopes as Jinja has them (a loop's iteration and a macro
// call get their own; `if` does not), loop controls, macros, and a budget of steps and bytes.
#include "api/jinja_template.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/jinja_builtins.h"

namespace colony::api::jinja {

namespace {

// Errors of rendering get the line; the template's own (raise_exception's FailedPrecondition)
// and exhausted limits pass as they are.
Status LineError(int line, const Status& st) {
  if (st.code() != StatusCode::kInvalidArgument) return st;
  return InvalidArgument(fmt::format("line {}: {}", line, st.message()));
}

// Every filter and test the template names must exist: a template Colony cannot run fails when
// it is loaded.
Status CheckExpr(const Expr* e) {
  if (e == nullptr) return Status::Ok();
  if (e->type == Expr::Type::kFilter && !IsFilter(e->name)) {
    return InvalidArgument(fmt::format("line {}: no filter named '{}'", e->line, e->name));
  }
  if (e->type == Expr::Type::kTest && !IsTest(e->name)) {
    return InvalidArgument(fmt::format("line {}: no test named '{}'", e->line, e->name));
  }
  for (const auto& o : e->operands) COLONY_RETURN_IF_ERROR(CheckExpr(o.get()));
  for (const auto& [k, o] : e->keyword) COLONY_RETURN_IF_ERROR(CheckExpr(o.get()));
  return Status::Ok();
}

// ... and break and continue stand in a loop's body (not its else, not a macro's body).
Status CheckBody(const Body& body, bool in_loop) {
  for (const NodePtr& n : body) {
    if ((n->type == Node::Type::kBreak || n->type == Node::Type::kContinue) && !in_loop) {
      return InvalidArgument(fmt::format("line {}: '{}' outside a loop", n->line,
                                         n->type == Node::Type::kBreak ? "break" : "continue"));
    }
    COLONY_RETURN_IF_ERROR(CheckExpr(n->expr.get()));
    COLONY_RETURN_IF_ERROR(CheckExpr(n->cond.get()));
    for (const auto& d : n->defaults) COLONY_RETURN_IF_ERROR(CheckExpr(d.get()));
    for (const auto& [cond, b] : n->branches) {
      COLONY_RETURN_IF_ERROR(CheckExpr(cond.get()));
      COLONY_RETURN_IF_ERROR(CheckBody(b, in_loop));
    }
    const bool body_in_loop = n->type == Node::Type::kFor     ? true
                              : n->type == Node::Type::kMacro ? false
                                                              : in_loop;
    COLONY_RETURN_IF_ERROR(CheckBody(n->body, body_in_loop));
    COLONY_RETURN_IF_ERROR(CheckBody(n->else_body, in_loop));
  }
  return Status::Ok();
}

using Frame = std::vector<std::pair<std::string, Value>>;

class Renderer {
 public:
  Renderer(const Dict& context, const RenderLimits& limits)
      : limits_(limits),
        budget_{.max_string_bytes = limits.max_output_bytes,
                .max_list_items = limits.max_list_items} {
    frames_.push_back(Frame(context.begin(), context.end()));
    frames_.emplace_back();  // the template's own variables (set at top level)
  }
  // A namespace can hold itself (`{% set ns.x = ns %}`): emptied here, none outlives the
  // rendering in a cycle of shared pointers.
  ~Renderer() {
    for (const Value& ns : namespaces_) ns.namespace_dict().clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  Result<std::string> Run(const Body& body) {
    std::string out;
    COLONY_ASSIGN_OR_RETURN(Flow flow, Exec(body, out));
    if (flow != Flow::kNormal) return Internal("'break' or 'continue' outside a loop");  // Parse
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Status Step(int line) {
    if (++steps_ > limits_.max_steps) {
      return ResourceExhausted(
          fmt::format("line {}: the template ran more than {} steps", line, limits_.max_steps));
    }
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      for (auto it = f->rbegin(); it != f->rend(); ++it) {
        if (it->first == name) return it->second;
      }
    }
    return Global(name);
  }

  static void Assign(Frame& frame, const std::string& name, Value v) {
    for (auto& [k, old] : frame) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    frame.emplace_back(name, std::move(v));
  }

  Status Append(std::string& out, std::string_view s, int line) {
    if (out.size() + s.size() > limits_.max_output_bytes) {
      return ResourceExhausted(
          fmt::format("line {}: the template's output is over its limit ({} bytes)", line,
                      limits_.max_output_bytes));
    }
    out += s;
    return Status::Ok();
  }

  Result<Flow> Exec(const Body& body, std::string& out) {
    for (const NodePtr& n : body) {
      COLONY_RETURN_IF_ERROR(Step(n->line));
      COLONY_ASSIGN_OR_RETURN(Flow flow, ExecOne(*n, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Result<Flow> ExecOne(const Node& n, std::string& out) {
    switch (n.type) {
      case Node::Type::kText:
        COLONY_RETURN_IF_ERROR(Append(out, n.text, n.line));
        return Flow::kNormal;
      case Node::Type::kOutput: {
        COLONY_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        COLONY_RETURN_IF_ERROR(Append(out, v.Str(), n.line));
        return Flow::kNormal;
      }
      case Node::Type::kIf:
        for (const auto& [cond, body] : n.branches) {
          COLONY_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) return Exec(body, out);
        }
        return Exec(n.else_body, out);
      case Node::Type::kFor:
        return ExecFor(n, out);
      case Node::Type::kSet: {
        COLONY_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (n.attr.empty()) {
          Assign(frames_.back(), n.targets[0], std::move(v));
          return Flow::kNormal;
        }
        const Value ns = Lookup(n.targets[0]);
        if (ns.kind() != Value::Kind::kNamespace) {
          return InvalidArgument(
              fmt::format("line {}: cannot set an attribute of '{}', a {} (only of a namespace())",
                          n.line, n.targets[0], ns.TypeName()));
        }
        Assign(ns.namespace_dict(), n.attr, std::move(v));
        return Flow::kNormal;
      }
      case Node::Type::kSetBlock: {
        std::string captured;
        frames_.emplace_back();
        Result<Flow> flow = Exec(n.body, captured);
        frames_.pop_back();
        if (!flow.ok()) return flow.status();
        if (*flow != Flow::kNormal) return *flow;  // a break or continue of the loop around it
        Assign(frames_.back(), n.targets[0], Value::String(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Type::kMacro:
        Assign(frames_.back(), n.text, MakeMacro(n));
        return Flow::kNormal;
      case Node::Type::kBreak:
        return Flow::kBreak;
      case Node::Type::kContinue:
        return Flow::kContinue;
      case Node::Type::kScope:
        return Exec(n.body, out);
    }
    return Flow::kNormal;
  }

  Result<Flow> ExecFor(const Node& n, std::string& out) {
    COLONY_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    Result<List> all = Iterate(seq);
    if (!all.ok()) return LineError(n.line, all.status());
    List items;
    if (n.cond) {
      // The loop's `if` filters before counting (loop.length, loop.last see what is left).
      for (Value& item : *all) {
        COLONY_RETURN_IF_ERROR(Step(n.line));
        frames_.emplace_back();
        Status bound = Bind(n, item, frames_.back());
        Result<Value> keep = bound.ok() ? Eval(*n.cond) : Result<Value>(bound);
        frames_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(std::move(item));
      }
    } else {
      items = std::move(*all);
    }
    // Jinja runs the loop's else unless an iteration reached the end of the body: with no items,
    // and also when every iteration ended in continue, or the first in break.
    bool completed = false;
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      COLONY_RETURN_IF_ERROR(Step(n.line));
      const auto at = static_cast<size_t>(i);
      Dict loop = {
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(length - i)},
          {"revindex0", Value::Int(length - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == length - 1)},
          {"length", Value::Int(length)},
          {"depth", Value::Int(1)},
          {"depth0", Value::Int(0)},
          {"previtem", i > 0 ? items[at - 1] : Value()},
          {"nextitem", i + 1 < length ? items[at + 1] : Value()},
      };
      frames_.emplace_back();
      frames_.back().emplace_back("loop", Value::FromDict(std::move(loop)));
      Status bound = Bind(n, items[at], frames_.back());
      Result<Flow> flow = bound.ok() ? Exec(n.body, out) : Result<Flow>(bound);
      frames_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
      completed = completed || *flow == Flow::kNormal;
    }
    if (completed) return Flow::kNormal;
    frames_.emplace_back();  // the else's own scope, as the body's
    Result<Flow> flow = Exec(n.else_body, out);
    frames_.pop_back();
    return flow;
  }

  static Status Bind(const Node& n, const Value& item, Frame& frame) {
    if (n.targets.size() == 1) {
      Assign(frame, n.targets[0], item);
      return Status::Ok();
    }
    if (item.kind() != Value::Kind::kList || item.as_list().size() != n.targets.size()) {
      return InvalidArgument(fmt::format("line {}: cannot unpack a {} into {} names", n.line,
                                         item.TypeName(), n.targets.size()));
    }
    for (size_t i = 0; i < n.targets.size(); ++i) Assign(frame, n.targets[i], item.as_list()[i]);
    return Status::Ok();
  }

  Value MakeMacro(const Node& n) {
    const size_t visible = frames_.size();
    return Value::FromFunction([this, &n, visible](Args& args) -> Result<Value> {
      if (call_depth_ >= limits_.max_call_depth) {
        return ResourceExhausted(fmt::format("line {}: macro '{}' calls nest deeper than {}",
                                             n.line, n.text, limits_.max_call_depth));
      }
      if (args.positional.size() > n.targets.size()) {
        return InvalidArgument(fmt::format("macro '{}' takes {} arguments, {} given", n.text,
                                           n.targets.size(), args.positional.size()));
      }
      Frame params;
      for (size_t i = 0; i < n.targets.size(); ++i) {
        Value v;
        if (i < args.positional.size()) v = args.positional[i];
        for (const auto& [k, kv] : args.keyword) {
          if (k == n.targets[i]) v = kv;
        }
        if (v.undefined() && n.defaults[i]) {
          COLONY_ASSIGN_OR_RETURN(v, Eval(*n.defaults[i]));
        }
        params.emplace_back(n.targets[i], std::move(v));
      }
      for (const auto& [k, kv] : args.keyword) {
        if (std::find(n.targets.begin(), n.targets.end(), k) == n.targets.end()) {
          return InvalidArgument(fmt::format("macro '{}' has no argument '{}'", n.text, k));
        }
      }
      // The macro sees the scopes it was defined in (as they are now) and its arguments.
      std::vector<Frame> saved(
          frames_.begin() + static_cast<std::ptrdiff_t>(std::min(visible, frames_.size())),
          frames_.end());
      frames_.resize(std::min(visible, frames_.size()));
      frames_.push_back(std::move(params));
      ++call_depth_;
      std::string out;
      Result<Flow> flow = Exec(n.body, out);
      --call_depth_;
      frames_.pop_back();
      for (Frame& f : saved) frames_.push_back(std::move(f));
      if (!flow.ok()) return flow.status();
      return Value::String(std::move(out));
    });
  }

  Result<Args> EvalArgs(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.operands.size(); ++i) {
      COLONY_ASSIGN_OR_RETURN(Value v, Eval(*e.operands[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, ke] : e.keyword) {
      COLONY_ASSIGN_OR_RETURN(Value v, Eval(*ke));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  // `name` for errors about an undefined value: the expression's own name where it has one.
  static std::string Named(const Expr& e) {
    if (e.type == Expr::Type::kName) return "'" + e.name + "'";
    if (e.type == Expr::Type::kAttr) return Named(*e.operands[0]) + "." + e.name;
    return "a value";
  }

  Result<Value> Eval(const Expr& e) {
    COLONY_RETURN_IF_ERROR(Step(e.line));
    Result<Value> v = EvalInner(e);
    if (!v.ok() && v.status().message().rfind("line ", 0) != 0 &&
        v.status().code() == StatusCode::kInvalidArgument) {
      return LineError(e.line, v.status());
    }
    return v;
  }

  Result<Value> EvalInner(const Expr& e) {
    switch (e.type) {
      case Expr::Type::kLiteral:
        return e.literal;
      case Expr::Type::kName:
        return Lookup(e.name);
      case Expr::Type::kAttr: {
        COLONY_ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        if (obj.undefined()) {
          return InvalidArgument(fmt::format("{} is undefined", Named(*e.operands[0])));
        }
        return Attribute(obj, e.name, budget_);
      }
      case Expr::Type::kItem: {
        COLONY_ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        COLONY_ASSIGN_OR_RETURN(Value key, Eval(*e.operands[1]));
        if (obj.undefined()) {
          return InvalidArgument(fmt::format("{} is undefined", Named(*e.operands[0])));
        }
        Value item = Item(obj, key);
        if (item.undefined() && key.is_string()) return Attribute(obj, key.as_string(), budget_);
        return item;
      }
      case Expr::Type::kSlice: {
        COLONY_ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0]));
        std::array<Value, 3> parts;
        for (size_t i = 0; i < 3; ++i) {
          if (e.operands[i + 1]) {
            COLONY_ASSIGN_OR_RETURN(parts[i], Eval(*e.operands[i + 1]));
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Type::kCall: {
        COLONY_ASSIGN_OR_RETURN(Value callee, Eval(*e.operands[0]));
        COLONY_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        if (callee.kind() != Value::Kind::kFunction) {
          return InvalidArgument(fmt::format(
              "{} is {}, not a function", Named(*e.operands[0]),
              callee.undefined() ? "undefined" : "a " + std::string(callee.TypeName())));
        }
        Result<Value> result = callee.as_function()(args);
        if (result.ok() && result->kind() == Value::Kind::kNamespace)
          namespaces_.push_back(*result);
        return result;
      }
      case Expr::Type::kFilter: {
        COLONY_ASSIGN_OR_RETURN(Value operand, Eval(*e.operands[0]));
        COLONY_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return ApplyFilter(e.name, operand, args, budget_);
      }
      case Expr::Type::kTest: {
        COLONY_ASSIGN_OR_RETURN(Value operand, Eval(*e.operands[0]));
        COLONY_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        COLONY_ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, operand, args));
        return Value::Bool(result != e.negated);
      }
      case Expr::Type::kUnary: {
        COLONY_ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (e.name == "-") {
          if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.as_number());  // -0.0
          return Arithmetic("-", Value::Int(0), v, budget_);
        }
        if (!v.is_number())
          return InvalidArgument(fmt::format("bad operand for unary +: a {}", v.TypeName()));
        return v;
      }
      case Expr::Type::kBinary: {
        COLONY_ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0]));
        if (e.name == "and") return a.Truthy() ? Eval(*e.operands[1]) : a;
        if (e.name == "or") return a.Truthy() ? a : Eval(*e.operands[1]);
        COLONY_ASSIGN_OR_RETURN(Value b, Eval(*e.operands[1]));
        if (e.name == "~") return Concat(a, b, budget_);
        return Arithmetic(e.name, a, b, budget_);
      }
      case Expr::Type::kCompare: {
        COLONY_ASSIGN_OR_RETURN(Value left, Eval(*e.operands[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          COLONY_ASSIGN_OR_RETURN(Value right, Eval(*e.operands[i + 1]));
          COLONY_ASSIGN_OR_RETURN(bool holds, Compare(e.ops[i], left, right));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Type::kCond: {
        COLONY_ASSIGN_OR_RETURN(Value c, Eval(*e.operands[1]));
        if (c.Truthy()) return Eval(*e.operands[0]);
        if (e.operands[2]) return Eval(*e.operands[2]);
        return Value();
      }
      case Expr::Type::kList:
      case Expr::Type::kTuple: {
        List items;
        for (const auto& o : e.operands) {
          COLONY_ASSIGN_OR_RETURN(Value v, Eval(*o));
          items.push_back(std::move(v));
        }
        return e.type == Expr::Type::kTuple ? Value::FromTuple(std::move(items))
                                            : Value::FromList(std::move(items));
      }
      case Expr::Type::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          COLONY_ASSIGN_OR_RETURN(Value k, Eval(*e.operands[i]));
          COLONY_ASSIGN_OR_RETURN(Value v, Eval(*e.operands[i + 1]));
          if (!k.is_string()) {
            return InvalidArgument(
                fmt::format("a dict's keys must be strings, not a {}", k.TypeName()));
          }
          Assign(d, k.as_string(), std::move(v));
        }
        return Value::FromDict(std::move(d));
      }
    }
    return Value();
  }

  static Result<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "<") return Less(a, b);
    if (op == ">") return Less(b, a);
    if (op == "<=") {
      COLONY_ASSIGN_OR_RETURN(bool greater, Less(b, a));
      return !greater;
    }
    if (op == ">=") {
      COLONY_ASSIGN_OR_RETURN(bool less, Less(a, b));
      return !less;
    }
    if (op == "in") return Contains(b, a);
    COLONY_ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return !in;
  }

  const RenderLimits& limits_;
  Budget budget_;
  std::vector<Frame> frames_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<Value> namespaces_;  // every namespace() this rendering made
};

}  // namespace

Result<Template> Template::Parse(std::string_view source) {
  COLONY_ASSIGN_OR_RETURN(Body body, ParseTemplate(source));
  COLONY_RETURN_IF_ERROR(CheckBody(body, false));
  return Template(std::make_shared<const Body>(std::move(body)));
}

Result<std::string> Template::Render(const Dict& context, const RenderLimits& limits) const {
  Renderer r(context, limits);
  return r.Run(*body_);
}

}  // namespace colony::api::jinja
