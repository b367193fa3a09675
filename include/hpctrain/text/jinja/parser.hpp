#pragma once
// The parser of the Jinja subset (text/chat_template.hpp): expressions with Python's precedence (ternary,
// or, and, not, comparisons and `in`/`is` tests, `~`, + -, * / // %, unary minus, filters, calls,
// attributes, subscripts and slices, literals) and the statements chat templates use: for (with its loop
// variable, unpacking, `if` filter, else, break/continue), if/elif/else, set (a name, `ns.attribute`, or a
// block), macro (parameters with defaults, called as functions), filter blocks, and TRL's / transformers'
// `{% generation %}`. Filters, tests and methods are checked against what hpctrain implements as they are
// parsed. Anything else — call, include, extends, import, raw, with, an unknown filter — is refused naming
// the line and column, never skipped. Torch-free.
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <system_error>
#include <string>
#include <utility>
#include <vector>

#include <hpctrain/text/jinja/builtins.hpp>
#include <hpctrain/text/jinja/filters.hpp>
#include <hpctrain/text/jinja/lexer.hpp>
#include <hpctrain/text/jinja/methods.hpp>
#include <hpctrain/text/jinja/value.hpp>

namespace hpctrain::text::jinja {

/// An expression.
struct Expr {
  enum class Kind { literal, name, attribute, item, slice, call, filter, test, unary, binary, ternary, list, dict };
  Kind kind = Kind::literal;
  Json value;        ///< literal
  std::string name;  ///< name, attribute, call (a plain function), filter, test, unary/binary operator
  std::vector<std::unique_ptr<Expr>>
      args;  ///< operands; call/filter/test: the subject first (call: callee), then arguments
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  bool negated = false;  ///< `is not`
  Position at;
};
using ExprPtr = std::unique_ptr<Expr>;

/// A statement or a piece of output.
struct Node {
  enum class Kind { text, output, if_, for_, set, set_block, generation, break_, continue_, macro, filter_block };
  Kind kind = Kind::text;
  std::string text;            ///< text
  std::vector<ExprPtr> exprs;  ///< output: [value]; if: conditions; for: [iterable, filter?]; set: [value];
                               ///< macro: one default per parameter (null: none); filter_block: [the filters]
  std::vector<std::vector<Node>>
      bodies;  ///< if: one per condition (+ else); for: [body, else]; set_block/generation/macro/filter_block: [body]
  std::vector<std::string>
      targets;  ///< for: loop variables; set: [name] or [namespace, attribute]; macro: [name, parameters...]
  Position at;
};

/// The name a filter block's body is bound to while its filters run (no template can spell it).
inline constexpr const char* filter_body_name = "\x01filter body";

/// Parses the pieces of a template into nodes.
class Parser {
 public:
  Parser(std::vector<Piece> pieces, std::string origin) : pieces_(std::move(pieces)), origin_(std::move(origin)) {}

  std::vector<Node> parse() {
    auto nodes = block({});
    if (piece_ < pieces_.size())
      error(pieces_[piece_].tokens.front().at, fmt::format("unexpected '{}'", pieces_[piece_].tokens.front().text));
    return nodes;
  }

 private:
  // ---- statements ------------------------------------------------------------------------------------
  /// Nodes up to a statement whose keyword is in `ends` (left unconsumed), or the end.
  std::vector<Node> block(const std::vector<std::string>& ends) {
    const Depth depth(*this);
    std::vector<Node> nodes;
    while (piece_ < pieces_.size()) {
      auto& piece = pieces_[piece_];
      if (piece.kind == Piece::Kind::text) {
        nodes.push_back({Node::Kind::text, piece.text, {}, {}, {}, piece.at});
        ++piece_;
        continue;
      }
      tokens_ = &piece.tokens;
      at_ = 0;
      if (piece.kind == Piece::Kind::output) {
        Node node{Node::Kind::output, {}, {}, {}, {}, piece.at};
        node.exprs.push_back(expression());
        expect_end();
        ++piece_;
        nodes.push_back(std::move(node));
        continue;
      }
      const auto& keyword = peek();
      if (keyword.kind != Token::Kind::name) error(keyword.at, "a statement must start with a keyword");
      for (const auto& end : ends)
        if (keyword.text == end) return nodes;
      ++piece_;
      nodes.push_back(statement(piece.at));
    }
    if (!ends.empty())
      error(pieces_.empty() ? Position{} : pieces_.back().at,
            fmt::format("the template ends before '{{% {} %}}'", ends.back()));
    return nodes;
  }

  Node statement(Position at) {
    const auto keyword = next().text;
    Node node;
    node.at = at;
    if (keyword == "if") {
      node.kind = Node::Kind::if_;
      node.exprs.push_back(expression());
      expect_end();
      while (true) {
        node.bodies.push_back(block({"elif", "else", "endif"}));
        select_statement();
        const auto which = next().text;
        if (which == "elif") {
          node.exprs.push_back(expression());
          expect_end();
          ++piece_;
        } else if (which == "else") {
          expect_end();
          ++piece_;
          node.bodies.push_back(block({"endif"}));
          select_statement();
          next();
          expect_end();
          ++piece_;
          break;
        } else {
          expect_end();
          ++piece_;
          break;
        }
      }
    } else if (keyword == "for") {
      node.kind = Node::Kind::for_;
      do node.targets.push_back(name_token());
      while (accept(","));
      expect_name("in");
      node.exprs.push_back(or_expression(/*allow_ternary_if=*/false));
      if (peek().kind == Token::Kind::name && peek().text == "if") {
        next();
        node.exprs.push_back(expression());
      }
      if (peek().kind == Token::Kind::name && peek().text == "recursive")
        error(peek().at, "recursive loops are not supported");
      expect_end();
      node.bodies.push_back(block({"else", "endfor"}));
      select_statement();
      if (next().text == "else") {
        expect_end();
        ++piece_;
        node.bodies.push_back(block({"endfor"}));
        select_statement();
        next();
      }
      expect_end();
      ++piece_;
    } else if (keyword == "set") {
      node.targets.push_back(name_token());
      if (accept(".")) node.targets.push_back(name_token());
      if (peek().kind == Token::Kind::op && peek().text == ",")
        error(peek().at, "unpacking in '{% set %}' is not supported by hpctrain's chat templates");
      if (accept("=")) {
        node.kind = Node::Kind::set;
        node.exprs.push_back(expression());
        expect_end();
      } else {
        node.kind = Node::Kind::set_block;
        if (peek().kind == Token::Kind::op && peek().text == "|")
          error(peek().at, "a filter on '{% set %}' is not supported by hpctrain's chat templates");
        expect_end();
        node.bodies.push_back(captured_block("endset"));
      }
    } else if (keyword == "macro") {
      node.kind = Node::Kind::macro;
      node.targets.push_back(name_token());
      expect_op("(");
      while (!accept(")")) {
        node.targets.push_back(name_token());
        node.exprs.push_back(accept("=") ? expression() : nullptr);
        if (!node.exprs.back() && node.exprs.size() > 1 && node.exprs[node.exprs.size() - 2])
          error(peek().at, "a parameter without a default follows one with a default");
        if (!accept(",") && !(peek().kind == Token::Kind::op && peek().text == ")"))
          error(peek().at, "expected ',' or ')'");
      }
      expect_end();
      node.bodies.push_back(captured_block("endmacro"));
    } else if (keyword == "filter") {
      node.kind = Node::Kind::filter_block;
      // The filters apply to the body's text, which the interpreter binds to this name.
      auto subject = make(Expr::Kind::name, peek().at);
      subject->name = filter_body_name;
      ExprPtr chain = std::move(subject);
      do chain = filter(std::move(chain));
      while (accept("|"));
      node.exprs.push_back(std::move(chain));
      expect_end();
      node.bodies.push_back(captured_block("endfilter"));
    } else if (keyword == "generation") {
      if (capturing_ > 0)
        error(tokens_->front().at,
              "'{% generation %}' inside a macro, a set block or a filter block is not supported by hpctrain's chat "
              "templates");
      node.kind = Node::Kind::generation;
      expect_end();
      node.bodies.push_back(block({"endgeneration"}));
      select_statement();
      next();
      expect_end();
      ++piece_;
    } else if (keyword == "break" || keyword == "continue") {
      node.kind = keyword == "break" ? Node::Kind::break_ : Node::Kind::continue_;
      expect_end();
    } else {
      error(tokens_->front().at, fmt::format("'{{% {} %}}' is not supported by hpctrain's chat templates", keyword));
    }
    return node;
  }

  /// The body of a block whose output is captured (set, macro, filter), up to `end`, which it consumes.
  std::vector<Node> captured_block(const char* end) {
    ++capturing_;
    auto body = block({end});
    --capturing_;
    select_statement();
    next();
    expect_end();
    ++piece_;
    return body;
  }

  /// Makes the statement piece at piece_ the current token stream (block() stopped at it).
  void select_statement() {
    tokens_ = &pieces_[piece_].tokens;
    at_ = 0;
  }

  // ---- expressions -----------------------------------------------------------------------------------
  ExprPtr expression() { return or_expression(true); }

  ExprPtr or_expression(bool allow_ternary_if) {
    const Depth depth(*this);
    auto value = binary_chain(0);
    if (allow_ternary_if && peek().kind == Token::Kind::name && peek().text == "if") {
      auto node = make(Expr::Kind::ternary, next().at);
      node->args.push_back(std::move(value));
      node->args.push_back(binary_chain(0));
      if (peek().kind == Token::Kind::name && peek().text == "else") {
        next();
        node->args.push_back(or_expression(true));
      }
      return node;
    }
    return value;
  }

  /// Precedence levels: or, and, not, comparison, ~, + -, * / // %.
  ExprPtr binary_chain(int level) {
    static const std::vector<std::vector<std::string>> levels{{"or"},
                                                              {"and"},
                                                              {"not"},
                                                              {"==", "!=", "<", "<=", ">", ">=", "in", "not in"},
                                                              {"~"},
                                                              {"+", "-"},
                                                              {"*", "/", "//", "%"}};
    if (level == static_cast<int>(levels.size())) return unary();
    if (levels[level].front() == "not") {
      if (peek().kind == Token::Kind::name && peek().text == "not") {
        auto node = make(Expr::Kind::unary, next().at);
        node->name = "not";
        node->args.push_back(binary_chain(level));
        return node;
      }
      return binary_chain(level + 1);
    }
    auto left = binary_chain(level + 1);
    while (true) {
      std::string op;
      const auto& token = peek();
      for (const auto& candidate : levels[level]) {
        if (candidate == "not in") {
          if (token.kind == Token::Kind::name && token.text == "not" && at_ + 1 < tokens_->size() &&
              (*tokens_)[at_ + 1].text == "in")
            op = candidate;
        } else if ((token.kind == Token::Kind::op || token.kind == Token::Kind::name) && token.text == candidate) {
          op = candidate;
        }
      }
      if (op.empty()) return left;
      auto node = make(Expr::Kind::binary, next().at);
      if (op == "not in") next();
      node->name = op;
      node->args.push_back(std::move(left));
      node->args.push_back(binary_chain(level + 1));
      left = std::move(node);
    }
  }

  ExprPtr unary() {
    const Depth depth(*this);
    if (peek().kind == Token::Kind::op && (peek().text == "-" || peek().text == "+")) {
      auto node = make(Expr::Kind::unary, peek().at);
      node->name = next().text;
      node->args.push_back(unary());
      return node;
    }
    return postfix(primary());
  }

  ExprPtr postfix(ExprPtr value) {
    while (true) {
      if (accept(".")) {
        auto node = make(Expr::Kind::attribute, peek().at);
        node->name = name_token();
        node->args.push_back(std::move(value));
        value = std::move(node);
      } else if (peek().kind == Token::Kind::op && peek().text == "[") {
        value = subscript(std::move(value));
      } else if (peek().kind == Token::Kind::op && peek().text == "(") {
        auto node = make(Expr::Kind::call, peek().at);
        check_callee(*value);
        node->args.push_back(std::move(value));
        arguments(*node);
        value = std::move(node);
      } else if (accept("|")) {
        value = filter(std::move(value));
      } else if (peek().kind == Token::Kind::name && peek().text == "is") {
        auto node = make(Expr::Kind::test, next().at);
        if (peek().kind == Token::Kind::name && peek().text == "not") {
          next();
          node->negated = true;
        }
        const auto test_at = peek().at;
        node->name = name_token();
        if (!names::tests().count(node->name))
          error(test_at, names::jinja_tests().count(node->name)
                             ? fmt::format("the test '{}' is not supported by hpctrain's chat templates", node->name)
                             : fmt::format("no test named '{}' (jinja2 refuses it too)", node->name));
        node->args.push_back(std::move(value));
        if (peek().kind == Token::Kind::op && peek().text == "(") arguments(*node);
        else if (starts_primary()) node->args.push_back(primary());  // `is divisibleby 3`, `is equalto 'x'`
        value = std::move(node);
      } else {
        return value;
      }
    }
  }

  /// `value | name(arguments)`, the name checked against the filters hpctrain implements.
  ExprPtr filter(ExprPtr value) {
    auto node = make(Expr::Kind::filter, peek().at);
    node->name = name_token();
    if (!names::filters().count(node->name))
      error(node->at, names::jinja_filters().count(node->name)
                          ? fmt::format("the filter '{}' is not supported by hpctrain's chat templates", node->name)
                          : fmt::format("no filter named '{}' (jinja2 refuses it too)", node->name));
    node->args.push_back(std::move(value));
    if (peek().kind == Token::Kind::op && peek().text == "(") arguments(*node);
    // A filter or test named by a string literal (map('upper'), selectattr('x', 'equalto', 1)) is checked too.
    const std::size_t named = node->name == "map" || node->name == "select" || node->name == "reject" ? 1
                              : node->name == "selectattr" || node->name == "rejectattr"              ? 2
                                                                                                      : 0;
    if (named && node->args.size() > named && node->args[named]->kind == Expr::Kind::literal &&
        node->args[named]->value.is_string()) {
      const auto which = node->args[named]->value.get<std::string>();
      const bool known = node->name == "map" ? names::filters().count(which) > 0 : names::tests().count(which) > 0;
      if (!known)
        error(node->args[named]->at, fmt::format("{}() with the {} '{}' is not supported by hpctrain's chat templates",
                                                 node->name, node->name == "map" ? "filter" : "test", which));
    }
    return node;
  }

  /// A call's callee: a method hpctrain lacks, or a jinja2 global it lacks, is refused here.
  void check_callee(const Expr& callee) const {
    if (callee.kind == Expr::Kind::attribute && !names::implemented_method(callee.name) &&
        names::python_methods().count(callee.name))
      error(callee.at, fmt::format("the method '{}' is not supported by hpctrain's chat templates", callee.name));
    if (callee.kind == Expr::Kind::name &&
        (callee.name == "lipsum" || callee.name == "cycler" || callee.name == "joiner"))
      error(callee.at, fmt::format("the function '{}' is not supported by hpctrain's chat templates", callee.name));
  }

  ExprPtr subscript(ExprPtr value) {
    const auto at = next().at;  // [
    std::vector<ExprPtr> parts(3);
    int colons = 0;
    while (!(peek().kind == Token::Kind::op && peek().text == "]")) {
      if (accept(":")) {
        if (++colons > 2) error(at, "a slice has at most two ':'");
        continue;
      }
      if (parts[colons]) error(peek().at, "expected ':' or ']'");
      parts[colons] = expression();
    }
    next();
    if (colons == 0) {
      if (!parts[0]) error(at, "an empty subscript");
      auto node = make(Expr::Kind::item, at);
      node->args.push_back(std::move(value));
      node->args.push_back(std::move(parts[0]));
      return node;
    }
    auto node = make(Expr::Kind::slice, at);
    node->args.push_back(std::move(value));
    for (auto& part : parts) node->args.push_back(std::move(part));  // null: absent
    return node;
  }

  void arguments(Expr& node) {
    next();  // (
    while (!accept(")")) {
      if (peek().kind == Token::Kind::name && at_ + 1 < tokens_->size() && (*tokens_)[at_ + 1].text == "=") {
        auto key = name_token();
        next();
        node.kwargs.emplace_back(std::move(key), expression());
      } else {
        node.args.push_back(expression());
      }
      if (!accept(",") && !(peek().kind == Token::Kind::op && peek().text == ")"))
        error(peek().at, "expected ',' or ')'");
    }
  }

  bool starts_primary() const {
    const auto& token = peek();
    return token.kind == Token::Kind::string || token.kind == Token::Kind::integer ||
           token.kind == Token::Kind::number ||
           (token.kind == Token::Kind::name && token.text != "and" && token.text != "or" && token.text != "else" &&
            token.text != "if" && token.text != "in" && token.text != "not" && token.text != "is");
  }

  ExprPtr primary() {
    const auto token = next();
    switch (token.kind) {
      case Token::Kind::string: {
        auto node = make(Expr::Kind::literal, token.at);
        std::string text = token.text;
        while (peek().kind == Token::Kind::string) text += next().text;  // 'a' 'b' is 'ab', as in Python
        node->value = text;
        return node;
      }
      case Token::Kind::integer: {
        auto node = make(Expr::Kind::literal, token.at);
        std::int64_t value = 0;
        const auto [end, failure] = std::from_chars(token.text.data(), token.text.data() + token.text.size(), value);
        if (failure != std::errc{} || end != token.text.data() + token.text.size())
          error(token.at, "the integer " + token.text.substr(0, 40) + (token.text.size() > 40 ? "..." : "") +
                              " does not fit 64 bits");
        node->value = value;
        return node;
      }
      case Token::Kind::number: {
        auto node = make(Expr::Kind::literal, token.at);
        node->value = std::strtod(token.text.c_str(), nullptr);  // beyond a double is inf, as Python's float()
        return node;
      }
      case Token::Kind::name: {
        auto node = make(Expr::Kind::literal, token.at);
        if (token.text == "true" || token.text == "True") node->value = true;
        else if (token.text == "false" || token.text == "False") node->value = false;
        else if (token.text == "none" || token.text == "None") node->value = nullptr;
        else {
          node->kind = Expr::Kind::name;
          node->name = token.text;
        }
        return node;
      }
      case Token::Kind::op:
        if (token.text == "(") {
          auto inner = expression();
          if (accept(",")) {  // a tuple: a list here
            auto list = make(Expr::Kind::list, token.at);
            list->args.push_back(std::move(inner));
            while (!accept(")")) {
              list->args.push_back(expression());
              if (!accept(",") && !(peek().kind == Token::Kind::op && peek().text == ")"))
                error(peek().at, "expected ',' or ')'");
            }
            return list;
          }
          expect_op(")");
          return inner;
        }
        if (token.text == "[") {
          auto list = make(Expr::Kind::list, token.at);
          while (!accept("]")) {
            list->args.push_back(expression());
            if (!accept(",") && !(peek().kind == Token::Kind::op && peek().text == "]"))
              error(peek().at, "expected ',' or ']'");
          }
          return list;
        }
        if (token.text == "{") {
          auto dict = make(Expr::Kind::dict, token.at);
          while (!accept("}")) {
            dict->args.push_back(expression());
            expect_op(":");
            dict->args.push_back(expression());
            if (!accept(",") && !(peek().kind == Token::Kind::op && peek().text == "}"))
              error(peek().at, "expected ',' or '}'");
          }
          return dict;
        }
        break;
      default: error(token.at, "the expression ends too early");
    }
    error(token.at, fmt::format("unexpected '{}'", token.text));
  }

  // ---- tokens ----------------------------------------------------------------------------------------
  const Token& peek() const { return (*tokens_)[at_]; }
  Token next() {
    const auto& token = (*tokens_)[at_];
    if (token.kind != Token::Kind::end) ++at_;
    return token;
  }
  bool accept(const char* op) {
    if (peek().kind == Token::Kind::op && peek().text == op) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect_op(const char* op) {
    if (!accept(op)) error(peek().at, fmt::format("expected '{}'", op));
  }
  void expect_name(const char* name) {
    if (peek().kind != Token::Kind::name || peek().text != name) error(peek().at, fmt::format("expected '{}'", name));
    ++at_;
  }
  std::string name_token() {
    if (peek().kind != Token::Kind::name) error(peek().at, "expected a name");
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Token::Kind::end) error(peek().at, fmt::format("unexpected '{}'", peek().text));
  }
  ExprPtr make(Expr::Kind kind, Position at) {
    if (++made_ > 200000) error(at, "the template is too large");
    auto node = std::make_unique<Expr>();
    node->kind = kind;
    node->at = at;
    return node;
  }
  [[noreturn]] void error(Position at, const std::string& reason) const { syntax_error(origin_, at, reason); }

  /// Nesting guard: a hostile template cannot exhaust the stack.
  struct Depth {
    explicit Depth(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > 150)
        parser_.error(parser_.tokens_ && parser_.at_ < parser_.tokens_->size() ? parser_.peek().at : Position{},
                      "nested too deeply");
    }
    ~Depth() { --parser_.depth_; }
    Parser& parser_;
  };

  std::vector<Piece> pieces_;
  std::string origin_;
  int capturing_ = 0;  // inside a macro, set block or filter block
  std::size_t piece_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  std::size_t at_ = 0;
  std::size_t made_ = 0;
  int depth_ = 0;
};

}  // namespace hpctrain::text::jinja
