// The Jinja lexer (with trim_blocks, lstrip_blocks and whitespace control applied to the text
// between tags) and a recursive-descent parser with Jinja's precedence.
#include "api/jinja_syntax.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>

namespace colony::api::jinja {

namespace {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kBlockBegin,
    kVarEnd,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type = Type::kEof;
  std::string text;  // text, name, string's value, operator
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

Status LineError(int line, std::string_view what) {
  return InvalidArgument(fmt::format("line {}: {}", line, what));
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Python's str.rstrip() / lstrip() (Unicode whitespace).
std::string RStrip(const std::string& s) {
  std::u32string u = DecodeUtf8(s);
  while (!u.empty() && IsSpace(u.back())) u.pop_back();
  return EncodeUtf8(u);
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  Result<std::vector<Token>> Run() {
    bool strip_next = false;    // a '-' closed the last tag: drop the next text's whitespace
    bool line_starting = true;  // the last tag's end ended with a newline (or none yet)
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= src_.size()) {
          start = std::string::npos;
          break;
        }
        const char c = src_[start + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++start;
      }
      std::string text =
          src_.substr(pos, start == std::string::npos ? std::string::npos : start - pos);
      if (strip_next) {
        const std::u32string u = DecodeUtf8(text);
        size_t k = 0;
        while (k < u.size() && IsSpace(u[k])) ++k;
        // Jinja's end pattern (`-%}\s*`) takes the whitespace; a newline last starts a line.
        line_starting = k > 0 && u[k - 1] == '\n';
        text = EncodeUtf8(std::u32string_view(u).substr(k));
      }
      strip_next = false;
      if (start == std::string::npos) {
        Emit(Token::Type::kText, std::move(text));
        break;
      }
      const char kind = src_[start + 1];
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          const std::u32string rest = DecodeUtf8(std::string_view(text).substr(l_pos));
          if (!rest.empty() && std::all_of(rest.begin(), rest.end(), IsSpace)) {
            text.resize(l_pos);
          }
        }
      }
      Emit(Token::Type::kText, std::move(text));
      pos = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string::npos) return LineError(LineAt(start), "a comment is not closed");
        pos = end + 2;
        const bool minus = end > 0 && src_[end - 1] == '-' && end - 1 >= start + 2;
        const bool plus = end > 0 && src_[end - 1] == '+' && end - 1 >= start + 2;
        COLONY_RETURN_IF_ERROR(AfterTagEnd(minus, plus, true, pos, strip_next, line_starting));
        continue;
      }
      const bool block = kind == '%';
      Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, {});
      tokens_.back().line = LineAt(start);
      COLONY_ASSIGN_OR_RETURN(pos, LexTag(pos, block, strip_next, line_starting));
    }
    Token eof;
    eof.type = Token::Type::kEof;
    eof.line = LineAt(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void Emit(Token::Type type, std::string text) {
    if (type == Token::Type::kText && text.empty()) return;
    Token t;
    t.type = type;
    t.text = std::move(text);
    tokens_.push_back(std::move(t));
  }

  // After a tag's end at `pos`: whitespace control and trim_blocks (for blocks and comments).
  Status AfterTagEnd(bool minus, bool plus, bool trims, size_t& pos, bool& strip_next,
                     bool& line_starting) {
    line_starting = false;
    if (minus) {
      strip_next = true;  // Run() strips the next text and sees whether a newline ended it
    } else if (trims && !plus && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
      line_starting = true;
    }
    return Status::Ok();
  }

  Result<size_t> LexTag(size_t pos, bool block, bool& strip_next, bool& line_starting) {
    std::vector<char> open;  // brackets: the tag's end counts only outside them
    const char close = block ? '%' : '}';
    while (true) {
      while (pos < src_.size() &&
             (src_[pos] == ' ' || src_[pos] == '\t' || src_[pos] == '\n' || src_[pos] == '\r')) {
        ++pos;
      }
      if (pos >= src_.size()) {
        return LineError(LineAt(pos), block ? "a '{%' is not closed" : "a '{{' is not closed");
      }
      const int line = LineAt(pos);
      if (open.empty()) {
        const bool sign = (src_[pos] == '-' || src_[pos] == '+');
        const size_t at = pos + (sign ? 1 : 0);
        if (src_.compare(at, 2, std::string{close, '}'}) == 0) {
          Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, {});
          tokens_.back().line = line;
          pos = at + 2;
          COLONY_RETURN_IF_ERROR(AfterTagEnd(sign && src_[pos - 3] == '-',
                                             sign && src_[pos - 3] == '+', block, pos, strip_next,
                                             line_starting));
          return pos;
        }
      }
      Token t;
      t.line = line;
      const char c = src_[pos];
      if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        t.type = Token::Type::kName;
        t.text = src_.substr(pos, e - pos);
        pos = e;
      } else if (IsDigit(c)) {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() && (IsDigit(src_[e]) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
          is_float = true;
          ++e;
          while (e < src_.size() && (IsDigit(src_[e]) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && IsDigit(src_[k])) {
            is_float = true;
            e = k;
            while (e < src_.size() && IsDigit(src_[e])) ++e;
          }
        }
        std::string digits;
        for (size_t k = pos; k < e; ++k) {
          if (src_[k] != '_') digits += src_[k];
        }
        if (is_float) {
          t.type = Token::Type::kFloat;
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          t.type = Token::Type::kInt;
          auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
          if (ec != std::errc())
            return LineError(line, fmt::format("number {} is too large", digits));
        }
        pos = e;
      } else if (c == '\'' || c == '"') {
        COLONY_ASSIGN_OR_RETURN(pos, LexString(pos, t));
      } else {
        static constexpr std::array<std::string_view, 6> kTwo = {
            "//", "**", "==", "!=", "<=", ">="};
        t.type = Token::Type::kOp;
        for (std::string_view op : kTwo) {
          if (src_.compare(pos, 2, op) == 0) t.text = op;
        }
        if (t.text.empty()) {
          if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
            return LineError(line, fmt::format("unexpected character '{}'", c));
          }
          t.text = std::string(1, c);
        }
        pos += t.text.size();
        if (c == '(' || c == '[' || c == '{') {
          if (open.size() >= kMaxNesting) {
            return LineError(line, fmt::format("brackets nest deeper than {}", kMaxNesting));
          }
          open.push_back(c);
        } else if (c == ')' || c == ']' || c == '}') {
          const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (open.empty()) return LineError(line, fmt::format("unexpected '{}'", c));
          if (open.back() != want) {
            return LineError(line,
                             fmt::format("unexpected '{}': a '{}' is not closed", c, open.back()));
          }
          open.pop_back();
        }
      }
      tokens_.push_back(std::move(t));
    }
  }

  Result<size_t> LexString(size_t pos, Token& t) {
    const char quote = src_[pos];
    const int line = LineAt(pos);
    std::string out;
    ++pos;
    while (true) {
      if (pos >= src_.size()) return LineError(line, "a string is not closed");
      const char c = src_[pos];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++pos;
        continue;
      }
      if (pos + 1 >= src_.size()) return LineError(line, "a string is not closed");
      const char e = src_[pos + 1];
      pos += 2;
      const auto hex = [&](int digits) -> Result<char32_t> {
        if (pos + static_cast<size_t>(digits) > src_.size()) {
          return LineError(line, "a string's escape is cut short");
        }
        uint32_t v = 0;
        auto [p, ec] = std::from_chars(src_.data() + pos, src_.data() + pos + digits, v, 16);
        if (ec != std::errc() || p != src_.data() + pos + digits || v > 0x10ffff) {
          return LineError(line, "a string has a malformed escape");
        }
        pos += static_cast<size_t>(digits);
        return static_cast<char32_t>(v);
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          COLONY_ASSIGN_OR_RETURN(char32_t cp, hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
          out += EncodeUtf8(std::u32string(1, cp));
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    t.type = Token::Type::kString;
    t.text = std::move(out);
    return pos + 1;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<Body> Run() {
    Body body;
    std::string end;
    COLONY_RETURN_IF_ERROR(ParseBody(body, {}, end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  Token Next() {
    Token t = Peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kName && Peek(ahead).text == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Token::Type::kEof:
        return "the end of the template";
      case Token::Type::kBlockEnd:
        return "'%}'";
      case Token::Type::kVarEnd:
        return "'}}'";
      case Token::Type::kText:
        return "text";
      case Token::Type::kString:
        return "a string";
      case Token::Type::kInt:
      case Token::Type::kFloat:
        return "a number";
      default:
        return "'" + t.text + "'";
    }
  }
  Status Expect(std::string_view op) {
    if (SkipOp(op)) return Status::Ok();
    return LineError(Peek().line, fmt::format("expected '{}', found {}", op, Describe(Peek())));
  }
  Status ExpectBlockEnd() {
    if (Peek().type == Token::Type::kBlockEnd) {
      Next();
      return Status::Ok();
    }
    return LineError(Peek().line, fmt::format("expected '%}}', found {}", Describe(Peek())));
  }
  Result<std::string> ExpectName() {
    if (Peek().type != Token::Type::kName) {
      return LineError(Peek().line, fmt::format("expected a name, found {}", Describe(Peek())));
    }
    return Next().text;
  }

  struct Depth {
    explicit Depth(int& d) : d_(d) { ++d_; }
    ~Depth() { --d_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
    int& d_;
  };
  Status CheckDepth() const {
    if (depth_ > kMaxNesting) {
      return LineError(Peek().line, fmt::format("the template nests deeper than {}", kMaxNesting));
    }
    return Status::Ok();
  }

  // Parses nodes until a block tag named in `ends` (left as the next tag's name, in `end`) or
  // the end of the template (only where `ends` is empty).
  Status ParseBody(Body& body, std::initializer_list<std::string_view> ends, std::string& end) {
    Depth depth(depth_);
    COLONY_RETURN_IF_ERROR(CheckDepth());
    const int opened = Peek().line;
    while (true) {
      const Token& t = Peek();
      if (t.type == Token::Type::kEof) {
        if (ends.size() == 0) return Status::Ok();
        return LineError(opened,
                         fmt::format("a block is not closed (expected '{}')", *ends.begin()));
      }
      if (t.type == Token::Type::kText) {
        auto n = std::make_unique<Node>();
        n->type = Node::Type::kText;
        n->line = t.line;
        n->text = Next().text;
        body.push_back(std::move(n));
        continue;
      }
      if (t.type == Token::Type::kVarBegin) {
        auto n = std::make_unique<Node>();
        n->type = Node::Type::kOutput;
        n->line = Next().line;
        COLONY_ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpr());
        if (Peek().type != Token::Type::kVarEnd) {
          return LineError(Peek().line, fmt::format("expected '}}}}', found {}", Describe(Peek())));
        }
        Next();
        body.push_back(std::move(n));
        continue;
      }
      if (t.type != Token::Type::kBlockBegin) {
        return LineError(t.line, fmt::format("unexpected {}", Describe(t)));
      }
      const int line = Next().line;
      COLONY_ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
        end = name;
        return Status::Ok();
      }
      COLONY_ASSIGN_OR_RETURN(NodePtr n, ParseStatement(name, line));
      body.push_back(std::move(n));
    }
  }

  Result<NodePtr> ParseStatement(const std::string& name, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string end;
    if (name == "if") {
      n->type = Node::Type::kIf;
      std::string word = "if";
      while (word == "if" || word == "elif") {
        COLONY_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpr());
        COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
        Body body;
        COLONY_RETURN_IF_ERROR(ParseBody(body, {"elif", "else", "endif"}, word));
        n->branches.emplace_back(std::move(cond), std::move(body));
      }
      if (word == "else") {
        COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
        COLONY_RETURN_IF_ERROR(ParseBody(n->else_body, {"endif"}, word));
      }
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (name == "for") {
      n->type = Node::Type::kFor;
      do {
        COLONY_ASSIGN_OR_RETURN(std::string target, ExpectName());
        n->targets.push_back(std::move(target));
      } while (SkipOp(","));
      if (!SkipName("in")) {
        return LineError(Peek().line, fmt::format("expected 'in', found {}", Describe(Peek())));
      }
      COLONY_ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpr(/*no_condexpr=*/true));
      if (SkipName("if")) {
        COLONY_ASSIGN_OR_RETURN(n->cond, ParseExpr());
      }
      if (SkipName("recursive")) {
        return LineError(line, "recursive for loops are not supported");
      }
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      COLONY_RETURN_IF_ERROR(ParseBody(n->body, {"else", "endfor"}, end));
      if (end == "else") {
        COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
        COLONY_RETURN_IF_ERROR(ParseBody(n->else_body, {"endfor"}, end));
      }
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (name == "set") {
      COLONY_ASSIGN_OR_RETURN(std::string target, ExpectName());
      n->targets.push_back(std::move(target));
      if (SkipOp(".")) {
        COLONY_ASSIGN_OR_RETURN(n->attr, ExpectName());
      }
      if (SkipOp("=")) {
        n->type = Node::Type::kSet;
        COLONY_ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpr());
        COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
        return n;
      }
      if (!n->attr.empty()) {
        return LineError(line, "expected '=' after a namespace's attribute in 'set'");
      }
      n->type = Node::Type::kSetBlock;
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      COLONY_RETURN_IF_ERROR(ParseBody(n->body, {"endset"}, end));
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (name == "macro") {
      n->type = Node::Type::kMacro;
      COLONY_ASSIGN_OR_RETURN(n->text, ExpectName());
      COLONY_RETURN_IF_ERROR(Expect("("));
      while (!IsOp(")")) {
        COLONY_ASSIGN_OR_RETURN(std::string param, ExpectName());
        n->targets.push_back(std::move(param));
        ExprPtr def;
        if (SkipOp("=")) {
          COLONY_ASSIGN_OR_RETURN(def, ParseExpr());
        }
        n->defaults.push_back(std::move(def));
        if (!SkipOp(",")) break;
      }
      COLONY_RETURN_IF_ERROR(Expect(")"));
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      COLONY_RETURN_IF_ERROR(ParseBody(n->body, {"endmacro"}, end));
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (name == "break" || name == "continue") {
      n->type = name == "break" ? Node::Type::kBreak : Node::Type::kContinue;
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (name == "generation") {
      n->type = Node::Type::kScope;
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      COLONY_RETURN_IF_ERROR(ParseBody(n->body, {"endgeneration"}, end));
      COLONY_RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    return LineError(line, fmt::format("the statement '{}' is not supported here", name));
  }

  // An expression, or several separated by commas (a tuple).
  Result<ExprPtr> ParseTupleOrExpr(bool no_condexpr = false) {
    const int line = Peek().line;
    COLONY_ASSIGN_OR_RETURN(ExprPtr first, no_condexpr ? ParseOr() : ParseExpr());
    if (!IsOp(",")) return first;
    auto tuple = std::make_unique<Expr>();
    tuple->type = Expr::Type::kTuple;
    tuple->line = line;
    tuple->operands.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Peek().type == Token::Type::kBlockEnd || Peek().type == Token::Type::kVarEnd) break;
      COLONY_ASSIGN_OR_RETURN(ExprPtr e, no_condexpr ? ParseOr() : ParseExpr());
      tuple->operands.push_back(std::move(e));
    }
    return tuple;
  }

  static ExprPtr Make(Expr::Type type, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    e->name = std::move(name);
    return e;
  }

  Result<ExprPtr> ParseExpr() {
    Depth depth(depth_);
    COLONY_RETURN_IF_ERROR(CheckDepth());
    COLONY_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      const int line = Next().line;
      auto cond = Make(Expr::Type::kCond, line);
      COLONY_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      cond->operands.push_back(std::move(e));
      cond->operands.push_back(std::move(test));
      if (SkipName("else")) {
        COLONY_ASSIGN_OR_RETURN(ExprPtr other, ParseExpr());
        cond->operands.push_back(std::move(other));
      } else {
        cond->operands.push_back(nullptr);
      }
      e = std::move(cond);
    }
    return e;
  }

  Result<ExprPtr> ParseOr() {
    COLONY_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    while (IsName("or")) {
      auto b = Make(Expr::Type::kBinary, Next().line, "or");
      COLONY_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      b->operands.push_back(std::move(e));
      b->operands.push_back(std::move(r));
      e = std::move(b);
    }
    return e;
  }

  Result<ExprPtr> ParseAnd() {
    COLONY_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    while (IsName("and")) {
      auto b = Make(Expr::Type::kBinary, Next().line, "and");
      COLONY_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      b->operands.push_back(std::move(e));
      b->operands.push_back(std::move(r));
      e = std::move(b);
    }
    return e;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Depth depth(depth_);
      COLONY_RETURN_IF_ERROR(CheckDepth());
      auto u = Make(Expr::Type::kUnary, Next().line, "not");
      COLONY_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      u->operands.push_back(std::move(operand));
      return u;
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    const int line = Peek().line;
    COLONY_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    auto cmp = Make(Expr::Type::kCompare, line);
    cmp->operands.push_back(std::move(first));
    while (true) {
      std::string op;
      static constexpr std::array<std::string_view, 6> kOps = {"==", "!=", "<", ">", "<=", ">="};
      for (std::string_view o : kOps) {
        if (IsOp(o)) op = o;
      }
      if (!op.empty()) {
        Next();
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      COLONY_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      cmp->ops.push_back(op);
      cmp->operands.push_back(std::move(r));
    }
    if (cmp->ops.empty()) return std::move(cmp->operands[0]);
    return cmp;
  }

  template <typename Sub>
  Result<ExprPtr> ParseBinary(std::initializer_list<std::string_view> ops, Sub sub) {
    COLONY_ASSIGN_OR_RETURN(ExprPtr e, (this->*sub)());
    while (true) {
      std::string op;
      for (std::string_view o : ops) {
        if (IsOp(o)) op = o;
      }
      if (op.empty()) return e;
      auto b = Make(Expr::Type::kBinary, Next().line, op);
      COLONY_ASSIGN_OR_RETURN(ExprPtr r, (this->*sub)());
      b->operands.push_back(std::move(e));
      b->operands.push_back(std::move(r));
      e = std::move(b);
    }
  }
  Result<ExprPtr> ParseMath1() { return ParseBinary({"+", "-"}, &Parser::ParseConcat); }
  Result<ExprPtr> ParseConcat() { return ParseBinary({"~"}, &Parser::ParseMath2); }
  Result<ExprPtr> ParseMath2() { return ParseBinary({"*", "/", "//", "%"}, &Parser::ParsePow); }
  Result<ExprPtr> ParsePow() { return ParseBinary({"**"}, &Parser::ParseUnaryFiltered); }
  Result<ExprPtr> ParseUnaryFiltered() { return ParseUnary(true); }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    Depth depth(depth_);
    COLONY_RETURN_IF_ERROR(CheckDepth());
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token op = Next();
      e = Make(Expr::Type::kUnary, op.line, op.text);
      COLONY_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      e->operands.push_back(std::move(operand));
    } else {
      COLONY_ASSIGN_OR_RETURN(e, ParsePrimary());
      COLONY_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) {
      COLONY_ASSIGN_OR_RETURN(e, ParseFilters(std::move(e)));
    }
    return e;
  }

  Status ParseCallArgs(Expr& call) {
    COLONY_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Peek().type == Token::Type::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        COLONY_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        call.keyword.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call.keyword.empty()) {
          return LineError(Peek().line, "a positional argument follows a keyword argument");
        }
        COLONY_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        call.operands.push_back(std::move(v));
      }
      if (!SkipOp(",")) break;
    }
    return Expect(")");
  }

  Result<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        std::string attr;
        if (Peek().type == Token::Type::kName) {
          attr = Next().text;
        } else if (Peek().type == Token::Type::kInt) {
          // x.0: the item 0
          auto item = Make(Expr::Type::kItem, line);
          auto index = Make(Expr::Type::kLiteral, line);
          index->literal = Value::Int(Next().i);
          item->operands.push_back(std::move(e));
          item->operands.push_back(std::move(index));
          e = std::move(item);
          continue;
        } else {
          return LineError(line,
                           fmt::format("expected a name after '.', found {}", Describe(Peek())));
        }
        auto a = Make(Expr::Type::kAttr, line, attr);
        a->operands.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        const int line = Next().line;
        std::array<ExprPtr, 3> parts;
        int colons = 0;
        while (!IsOp("]")) {
          if (SkipOp(":")) {
            if (++colons > 2) return LineError(line, "a slice has more than three parts");
            continue;
          }
          if (parts[static_cast<size_t>(colons)]) {
            return LineError(line, fmt::format("expected ']', found {}", Describe(Peek())));
          }
          COLONY_ASSIGN_OR_RETURN(parts[static_cast<size_t>(colons)], ParseExpr());
        }
        Next();
        if (colons == 0) {
          if (!parts[0]) return LineError(line, "an empty subscript");
          auto item = Make(Expr::Type::kItem, line);
          item->operands.push_back(std::move(e));
          item->operands.push_back(std::move(parts[0]));
          e = std::move(item);
        } else {
          auto slice = Make(Expr::Type::kSlice, line);
          slice->operands.push_back(std::move(e));
          for (auto& p : parts) slice->operands.push_back(std::move(p));
          e = std::move(slice);
        }
      } else if (IsOp("(")) {
        auto call = Make(Expr::Type::kCall, Peek().line);
        call->operands.push_back(std::move(e));
        COLONY_RETURN_IF_ERROR(ParseCallArgs(*call));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        COLONY_ASSIGN_OR_RETURN(std::string name, ExpectName());
        while (IsOp(".") && Peek(1).type == Token::Type::kName) {
          Next();
          name += "." + Next().text;
        }
        auto f = Make(Expr::Type::kFilter, line, name);
        f->operands.push_back(std::move(e));
        if (IsOp("(")) COLONY_RETURN_IF_ERROR(ParseCallArgs(*f));
        e = std::move(f);
      } else if (IsName("is")) {
        const int line = Next().line;
        const bool negated = SkipName("not");
        COLONY_ASSIGN_OR_RETURN(std::string name, ExpectName());
        auto t = Make(Expr::Type::kTest, line, name);
        t->negated = negated;
        t->operands.push_back(std::move(e));
        if (IsOp("(")) {
          COLONY_RETURN_IF_ERROR(ParseCallArgs(*t));
        } else if (const Token& p = Peek();
                   p.type == Token::Type::kString || p.type == Token::Type::kInt ||
                   p.type == Token::Type::kFloat ||
                   (p.type == Token::Type::kOp && (p.text == "[" || p.text == "{")) ||
                   (p.type == Token::Type::kName && p.text != "else" && p.text != "or" &&
                    p.text != "and" && p.text != "if" && p.text != "is" && p.text != "in" &&
                    p.text != "not")) {
          // `x is divisibleby 3`: one argument without parentheses.
          COLONY_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          COLONY_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->operands.push_back(std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    const int line = t.line;
    switch (t.type) {
      case Token::Type::kName: {
        const std::string name = Next().text;
        auto lit = Make(Expr::Type::kLiteral, line);
        if (name == "true" || name == "True") {
          lit->literal = Value::Bool(true);
        } else if (name == "false" || name == "False") {
          lit->literal = Value::Bool(false);
        } else if (name == "none" || name == "None") {
          lit->literal = Value::None();
        } else {
          return Make(Expr::Type::kName, line, name);
        }
        return lit;
      }
      case Token::Type::kString: {
        std::string s = Next().text;
        while (Peek().type == Token::Type::kString) s += Next().text;  // "a" "b"
        auto lit = Make(Expr::Type::kLiteral, line);
        lit->literal = Value::String(std::move(s));
        return lit;
      }
      case Token::Type::kInt: {
        auto lit = Make(Expr::Type::kLiteral, line);
        lit->literal = Value::Int(Next().i);
        return lit;
      }
      case Token::Type::kFloat: {
        auto lit = Make(Expr::Type::kLiteral, line);
        lit->literal = Value::Float(Next().f);
        return lit;
      }
      case Token::Type::kOp:
        break;
      default:
        return LineError(line, fmt::format("expected an expression, found {}", Describe(t)));
    }
    if (SkipOp("(")) {
      if (SkipOp(")")) return Make(Expr::Type::kTuple, line);
      COLONY_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
      if (SkipOp(")")) return first;
      auto tuple = Make(Expr::Type::kTuple, line);
      tuple->operands.push_back(std::move(first));
      while (SkipOp(",")) {
        if (IsOp(")")) break;
        COLONY_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
        tuple->operands.push_back(std::move(e));
      }
      COLONY_RETURN_IF_ERROR(Expect(")"));
      return tuple;
    }
    if (SkipOp("[")) {
      auto list = Make(Expr::Type::kList, line);
      while (!IsOp("]")) {
        COLONY_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
        list->operands.push_back(std::move(e));
        if (!SkipOp(",")) break;
      }
      COLONY_RETURN_IF_ERROR(Expect("]"));
      return list;
    }
    if (SkipOp("{")) {
      auto dict = Make(Expr::Type::kDict, line);
      while (!IsOp("}")) {
        COLONY_ASSIGN_OR_RETURN(ExprPtr k, ParseExpr());
        COLONY_RETURN_IF_ERROR(Expect(":"));
        COLONY_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        dict->operands.push_back(std::move(k));
        dict->operands.push_back(std::move(v));
        if (!SkipOp(",")) break;
      }
      COLONY_RETURN_IF_ERROR(Expect("}"));
      return dict;
    }
    return LineError(line, fmt::format("expected an expression, found {}", Describe(t)));
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Body> ParseTemplate(std::string_view source) {
  // Jinja reads every newline sequence as "\n" and drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  COLONY_ASSIGN_OR_RETURN(auto tokens, Lexer(std::move(src)).Run());
  return Parser(std::move(tokens)).Run();
}

}  // namespace colony::api::jinja
