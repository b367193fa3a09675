#pragma once
// The interpreter of the Jinja subset (text/chat_template.hpp). Values are JSON values (what a conversation
// is made of) plus jinja2's Undefined; they print as Python's str() prints them (True, None, 1.0, ['a']) and
// compare, test and combine with Python's rules. The built-ins are those of transformers' chat-template
// environment: raise_exception, strftime_now, namespace, range, the usual filters and tests, and string/dict
// methods. An unknown filter, test, function or method is an error naming the template's line and column.
// Output is capped and loops are bounded, so a hostile template cannot exhaust memory. Torch-free.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/jinja/parser.hpp>

namespace hpctrain::text::jinja {

using Json = nlohmann::json;

/// A value: JSON, or Undefined (a missing variable, key or attribute).
struct Value {
  Json json;
  bool undefined = false;
  static Value none() { return {Json(nullptr), false}; }
  static Value missing() { return {Json(nullptr), true}; }
};

namespace detail {
inline std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::abs(x) < 1e16) return fmt::format("{:.1f}", x);
  return fmt::format("{}", x);
}

/// Python's repr of a string: single quotes unless the string holds one and no double quote.
inline std::string python_repr_string(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out.push_back(c);
  }
  return out + quote;
}

/// Python's type name of a value (`type(x).__name__`), as its TypeErrors say it.
inline std::string python_type_name(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::number_integer: case Json::value_t::number_unsigned: return "int";
    case Json::value_t::number_float: return "float";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    default: return json.type_name();
  }
}

inline std::string python_repr(const Json& json);
/// Python's str().
/// Python's float(str) for the int and float filters: the whole string (spaces around allowed) or the filter's
/// default 0; beyond a double is inf, as in Python.
inline double python_float(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double x = std::strtod(begin, &end);
  while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
  return end == begin || *end != '\0' ? 0.0 : x;
}

inline std::string python_str(const Json& json) {
  if (json.is_string()) return json.get<std::string>();
  return python_repr(json);
}
inline std::string python_repr(const Json& json) {
  switch (json.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return json.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(json.get<std::int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(json.get<std::uint64_t>());
    case Json::value_t::number_float: return python_float(json.get<double>());
    case Json::value_t::string: return python_repr_string(json.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < json.size(); ++i) out += (i ? ", " : "") + python_repr(json[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : json.items()) {
        out += (first ? "" : ", ") + python_repr_string(key) + ": " + python_repr(value);
        first = false;
      }
      return out + "}";
    }
    default: return "";
  }
}

/// json.dumps(value, ensure_ascii=False, indent=indent), as transformers' tojson filter writes it.
inline std::string python_json(const Json& json, std::optional<int> indent, int level = 0) {
  const auto newline = [&](int at) { return indent ? "\n" + std::string(static_cast<std::size_t>(*indent * at), ' ') : std::string(); };
  switch (json.type()) {
    case Json::value_t::number_float: return python_float(json.get<double>());
    case Json::value_t::array: {
      if (json.empty()) return "[]";
      std::string out = "[";
      for (std::size_t i = 0; i < json.size(); ++i) out += (i ? (indent ? "," : ", ") : "") + newline(level + 1) + python_json(json[i], indent, level + 1);
      return out + newline(level) + "]";
    }
    case Json::value_t::object: {
      if (json.empty()) return "{}";
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : json.items()) {
        out += (first ? "" : (indent ? "," : ", ")) + newline(level + 1) + Json(key).dump(-1, ' ', false) + ": " + python_json(value, indent, level + 1);
        first = false;
      }
      return out + newline(level) + "}";
    }
    default: return json.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

inline bool truthy(const Value& value) {
  if (value.undefined) return false;
  const auto& j = value.json;
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return j.get<std::int64_t>() != 0;
    case Json::value_t::number_float: return j.get<double>() != 0.0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();  // json::empty() is false for any string
    case Json::value_t::array:
    case Json::value_t::object: return !j.empty();
    default: return false;
  }
}

/// Python's slice of a sequence of `size` elements: the indices taken.
inline std::vector<std::int64_t> slice_indices(std::int64_t size, std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                                               std::optional<std::int64_t> step) {
  const std::int64_t s = step.value_or(1);
  std::vector<std::int64_t> out;
  if (s == 0) return out;
  const auto clamp = [&](std::optional<std::int64_t> v, std::int64_t fallback) {
    if (!v) return fallback;
    std::int64_t x = *v < 0 ? *v + size : *v;
    return s > 0 ? std::clamp<std::int64_t>(x, 0, size) : std::clamp<std::int64_t>(x, -1, size - 1);
  };
  std::int64_t i = clamp(start, s > 0 ? 0 : size - 1);
  const std::int64_t end = clamp(stop, s > 0 ? size : -1);
  for (; s > 0 ? i < end : i > end; i += s) out.push_back(i);
  return out;
}

inline std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

inline std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (auto& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    c = static_cast<char>(alpha ? (start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c))) : c);
    start = !alpha;
  }
  return out;
}

inline std::string replace_all(std::string s, const std::string& from, const std::string& to, std::int64_t count = -1) {
  if (from.empty()) return s;
  std::size_t at = 0;
  for (std::int64_t n = 0; (count < 0 || n < count) && (at = s.find(from, at)) != std::string::npos; ++n) {
    s.replace(at, from.size(), to);
    at += to.size();
  }
  return s;
}
}  // namespace detail

/// Renders parsed nodes with a context of variables.
class Interpreter {
 public:
  /// Output bytes a rendering may write; loop iterations it may run.
  static constexpr std::size_t max_output = 64u << 20;
  static constexpr std::size_t max_iterations = 1u << 22;

  Interpreter(std::string origin, Json context) : origin_(std::move(origin)) { scopes_.push_back(std::move(context)); }

  /// The output of `nodes`, and the byte ranges written inside `{% generation %}` blocks.
  std::string render(const std::vector<Node>& nodes) {
    run(nodes);
    return std::move(out_);
  }
  const std::vector<std::pair<std::size_t, std::size_t>>& generation_spans() const { return spans_; }

 private:
  enum class Flow { normal, break_, continue_ };

  [[noreturn]] void fail(Position at, const std::string& reason) const {
    throw RuntimeError(errors::runtime_chat_template, fmt::format("{}:{}:{}: {}", origin_, at.line, at.column, reason));
  }
  [[noreturn]] void unsupported(Position at, const std::string& what) const { syntax_error(origin_, at, what + " is not supported by hpctrain's chat templates"); }

  void write(const std::string& text, Position at) {
    if (out_.size() + text.size() > max_output) fail(at, "the rendering exceeds 64 MiB");
    out_ += text;
  }

  // ---- statements ------------------------------------------------------------------------------------
  Flow run(const std::vector<Node>& nodes) {
    for (const auto& node : nodes) {
      switch (node.kind) {
        case Node::Kind::text: write(node.text, node.at); break;
        case Node::Kind::output: {
          const auto value = eval(*node.exprs[0]);
          if (!value.undefined) write(detail::python_str(value.json), node.at);
          break;
        }
        case Node::Kind::if_: {
          std::size_t branch = 0;
          while (branch < node.exprs.size() && !detail::truthy(eval(*node.exprs[branch]))) ++branch;
          if (branch < node.bodies.size())
            if (const auto flow = run(node.bodies[branch]); flow != Flow::normal) return flow;
          break;
        }
        case Node::Kind::for_: run_for(node); break;
        case Node::Kind::set: assign(node, eval(*node.exprs[0]).json); break;
        case Node::Kind::set_block: {
          std::string saved = std::move(out_);
          out_.clear();
          run(node.bodies[0]);
          auto captured = std::move(out_);
          out_ = std::move(saved);
          assign(node, Json(captured));
          break;
        }
        case Node::Kind::generation: {
          const auto begin = out_.size();
          const auto flow = run(node.bodies[0]);
          spans_.emplace_back(begin, out_.size());
          if (flow != Flow::normal) return flow;
          break;
        }
        case Node::Kind::break_: return Flow::break_;
        case Node::Kind::continue_: return Flow::continue_;
      }
    }
    return Flow::normal;
  }

  void assign(const Node& node, Json value) {
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = std::move(value);
      return;
    }
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (scope->contains(node.targets[0])) {
        auto& target = (*scope)[node.targets[0]];
        if (!target.is_object() || !target.contains("__namespace__"))
          fail(node.at, fmt::format("'{}' is not a namespace(): only a namespace's attributes can be set", node.targets[0]));
        target[node.targets[1]] = std::move(value);
        return;
      }
    }
    fail(node.at, fmt::format("'{}' is undefined", node.targets[0]));
  }

  void run_for(const Node& node) {
    const auto iterable = eval(*node.exprs[0]);
    std::vector<Json> items;
    const auto& j = iterable.json;
    if (iterable.undefined) {  // jinja2's Undefined iterates as empty
    } else if (j.is_array()) {
      items.assign(j.begin(), j.end());
    } else if (j.is_object()) {
      for (const auto& [key, value] : j.items())
        if (key != "__namespace__") items.emplace_back(key);
    } else if (j.is_string()) {
      for (const char c : j.get<std::string>()) items.emplace_back(std::string(1, c));
    } else {
      fail(node.at, fmt::format("'{}' object is not iterable", detail::python_type_name(j)));  // None too, as in jinja2
    }
    if (node.exprs.size() > 1) {  // `for x in xs if condition`: filter first, so loop.* counts the kept ones
      std::vector<Json> kept;
      for (auto& item : items) {
        scopes_.push_back(bind(node, item, node.at));
        if (detail::truthy(eval(*node.exprs[1]))) kept.push_back(std::move(item));
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (node.bodies.size() > 1) run(node.bodies[1]);
      return;
    }
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      if (++iterations_ > max_iterations) fail(node.at, "too many loop iterations");
      auto scope = bind(node, items[static_cast<std::size_t>(i)], node.at);
      scope["loop"] = Json{{"index", i + 1}, {"index0", i}, {"revindex", n - i}, {"revindex0", n - i - 1}, {"first", i == 0},
                           {"last", i == n - 1}, {"length", n}};
      if (i > 0) scope["loop"]["previtem"] = items[static_cast<std::size_t>(i - 1)];  // else undefined, as in jinja2
      if (i + 1 < n) scope["loop"]["nextitem"] = items[static_cast<std::size_t>(i + 1)];
      scopes_.push_back(std::move(scope));
      const auto flow = run(node.bodies[0]);
      scopes_.pop_back();
      if (flow == Flow::break_) break;
    }
  }

  Json bind(const Node& node, const Json& item, Position at) const {
    Json scope = Json::object();
    if (node.targets.size() == 1) {
      scope[node.targets[0]] = item;
    } else {
      if (!item.is_array() || item.size() != node.targets.size())
        fail(at, fmt::format("cannot unpack {} into {} names", detail::python_repr(item), node.targets.size()));
      for (std::size_t k = 0; k < node.targets.size(); ++k) scope[node.targets[k]] = item[k];
    }
    return scope;
  }

  // ---- expressions -----------------------------------------------------------------------------------
  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope)
      if (const auto it = scope->find(name); it != scope->end()) return {*it, false};
    return Value::missing();
  }

  static Value member(const Value& subject, const Json& key) {
    const auto& j = subject.json;
    if (subject.undefined) return Value::missing();
    if (j.is_object() && key.is_string()) {
      const auto it = j.find(key.get<std::string>());
      return it == j.end() ? Value::missing() : Value{*it, false};
    }
    if ((j.is_array() || j.is_string()) && key.is_number_integer()) {
      const auto size = static_cast<std::int64_t>(j.is_array() ? j.size() : j.get<std::string>().size());
      auto i = key.get<std::int64_t>();
      if (i < 0) i += size;
      if (i < 0 || i >= size) return Value::missing();
      return j.is_array() ? Value{j[static_cast<std::size_t>(i)], false} : Value{Json(std::string(1, j.get<std::string>()[static_cast<std::size_t>(i)])), false};
    }
    return Value::missing();
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return {e.value, false};
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::attribute: return member(eval(*e.args[0]), Json(e.name));
      case Expr::Kind::item: return member(eval(*e.args[0]), eval(*e.args[1]).json);
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::list: {
        Json list = Json::array();
        for (const auto& item : e.args) list.push_back(eval(*item).json);
        return {list, false};
      }
      case Expr::Kind::dict: {
        Json dict = Json::object();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const auto key = eval(*e.args[i]).json;
          if (!key.is_string()) fail(e.at, "dictionary keys must be strings");
          dict[key.get<std::string>()] = eval(*e.args[i + 1]).json;
        }
        return {dict, false};
      }
      case Expr::Kind::ternary: {
        if (detail::truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args.size() > 2 ? eval(*e.args[2]) : Value::missing();
      }
      case Expr::Kind::unary: {
        const auto value = eval(*e.args[0]);
        if (e.name == "not") return {Json(!detail::truthy(value)), false};
        if (!value.json.is_number()) fail(e.at, fmt::format("bad operand for unary {}: {}", e.name, detail::python_repr(value.json)));
        if (e.name == "+") return value;
        return value.json.is_number_float() ? Value{Json(-value.json.get<double>()), false} : Value{Json(-value.json.get<std::int64_t>()), false};
      }
      case Expr::Kind::binary: return binary(e);
      case Expr::Kind::test: return {Json(test(e) != e.negated), false};
      case Expr::Kind::filter: return filter(e);
      case Expr::Kind::call: return call(e);
    }
    fail(e.at, "unknown expression");
  }

  Value slice(const Expr& e) {
    const auto subject = eval(*e.args[0]);
    const auto bound = [&](std::size_t k) -> std::optional<std::int64_t> {
      if (!e.args[k]) return std::nullopt;
      const auto v = eval(*e.args[k]).json;
      if (v.is_null()) return std::nullopt;
      if (!v.is_number_integer()) fail(e.at, "slice indices must be integers");
      return v.get<std::int64_t>();
    };
    const auto start = bound(1), stop = bound(2), step = bound(3);
    if (step && *step == 0) fail(e.at, "slice step cannot be zero");
    const auto& j = subject.json;
    if (j.is_array()) {
      Json out = Json::array();
      for (const auto i : detail::slice_indices(static_cast<std::int64_t>(j.size()), start, stop, step)) out.push_back(j[static_cast<std::size_t>(i)]);
      return {out, false};
    }
    if (j.is_string()) {
      const auto s = j.get<std::string>();
      std::string out;
      for (const auto i : detail::slice_indices(static_cast<std::int64_t>(s.size()), start, stop, step)) out.push_back(s[static_cast<std::size_t>(i)]);
      return {Json(out), false};
    }
    fail(e.at, fmt::format("{} cannot be sliced", detail::python_repr(j)));
  }

  static int compare(const Json& a, const Json& b, bool& comparable) {
    comparable = true;
    if (a.is_number() && b.is_number()) {
      const double x = a.get<double>(), y = b.get<double>();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) return a.get<std::string>().compare(b.get<std::string>()) < 0 ? -1 : a == b ? 0 : 1;
    comparable = false;
    return 0;
  }

  static bool equal(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }

  Value binary(const Expr& e) {
    const auto& op = e.name;
    if (op == "and") {
      auto left = eval(*e.args[0]);
      return detail::truthy(left) ? eval(*e.args[1]) : left;
    }
    if (op == "or") {
      auto left = eval(*e.args[0]);
      return detail::truthy(left) ? left : eval(*e.args[1]);
    }
    const auto left = eval(*e.args[0]), right = eval(*e.args[1]);
    const auto& a = left.json;
    const auto& b = right.json;
    if (op == "~") return {Json((left.undefined ? "" : detail::python_str(a)) + (right.undefined ? "" : detail::python_str(b))), false};
    if (op == "==") return {Json(left.undefined == right.undefined && equal(a, b)), false};
    if (op == "!=") return {Json(!(left.undefined == right.undefined && equal(a, b))), false};
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string()) found = b.get<std::string>().find(a.get<std::string>()) != std::string::npos;
      else if (b.is_array()) found = std::any_of(b.begin(), b.end(), [&](const Json& x) { return equal(x, a); });
      else if (b.is_object() && a.is_string()) found = b.contains(a.get<std::string>());
      else if (!right.undefined) fail(e.at, fmt::format("argument of type '{}' is not iterable", detail::python_type_name(b)));
      return {Json(op == "in" ? found : !found), false};
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      bool comparable = false;
      const int c = compare(a, b, comparable);
      if (!comparable) fail(e.at, fmt::format("cannot compare {} and {}", detail::python_repr(a), detail::python_repr(b)));
      return {Json(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0), false};
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return {Json(a.get<std::string>() + b.get<std::string>()), false};
      if (a.is_array() && b.is_array()) {
        Json out = a;
        for (const auto& x : b) out.push_back(x);
        return {out, false};
      }
    }
    if (a.is_number() && b.is_number() && !a.is_boolean() && !b.is_boolean()) {
      const bool ints = a.is_number_integer() && b.is_number_integer();
      const double x = a.get<double>(), y = b.get<double>();
      if (op == "+") return ints ? Value{Json(a.get<std::int64_t>() + b.get<std::int64_t>()), false} : Value{Json(x + y), false};
      if (op == "-") return ints ? Value{Json(a.get<std::int64_t>() - b.get<std::int64_t>()), false} : Value{Json(x - y), false};
      if (op == "*") return ints ? Value{Json(a.get<std::int64_t>() * b.get<std::int64_t>()), false} : Value{Json(x * y), false};
      if ((op == "/" || op == "//" || op == "%") && y == 0) fail(e.at, "division by zero");
      if (op == "/") return {Json(x / y), false};
      if (op == "//") return ints ? Value{Json(static_cast<std::int64_t>(std::floor(x / y))), false} : Value{Json(std::floor(x / y)), false};
      if (op == "%") {
        if (ints) {
          const auto m = a.get<std::int64_t>() % b.get<std::int64_t>();
          return {Json(m != 0 && ((m < 0) != (b.get<std::int64_t>() < 0)) ? m + b.get<std::int64_t>() : m), false};
        }
        return {Json(x - y * std::floor(x / y)), false};
      }
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      std::string out;
      for (std::int64_t i = 0; i < b.get<std::int64_t>(); ++i) {
        out += a.get<std::string>();
        if (out.size() > max_output) fail(e.at, "the rendering exceeds 64 MiB");
      }
      return {Json(out), false};
    }
    fail(e.at, fmt::format("unsupported operand types for {}: {} and {}", op, detail::python_repr(a), detail::python_repr(b)));
  }

  bool test(const Expr& e) {
    const auto subject = eval(*e.args[0]);
    const auto& j = subject.json;
    const auto& name = e.name;
    const auto argument = [&]() -> Json {
      if (e.args.size() < 2) fail(e.at, fmt::format("the test '{}' needs an argument", name));
      return eval(*e.args[1]).json;
    };
    if (name == "defined") return !subject.undefined;
    if (name == "undefined") return subject.undefined;
    if (name == "none") return !subject.undefined && j.is_null();
    if (name == "string") return !subject.undefined && j.is_string();
    if (name == "mapping") return !subject.undefined && j.is_object();
    if (name == "sequence" || name == "iterable") return !subject.undefined && (j.is_array() || j.is_string() || j.is_object());
    if (name == "number") return !subject.undefined && j.is_number() && !j.is_boolean();
    if (name == "integer") return !subject.undefined && j.is_number_integer();
    if (name == "float") return !subject.undefined && j.is_number_float();
    if (name == "boolean") return !subject.undefined && j.is_boolean();
    if (name == "true") return !subject.undefined && j.is_boolean() && j.get<bool>();
    if (name == "false") return !subject.undefined && j.is_boolean() && !j.get<bool>();
    if (name == "odd" || name == "even") {
      if (!j.is_number_integer()) fail(e.at, fmt::format("the test '{}' needs an integer", name));
      return (j.get<std::int64_t>() % 2 != 0) == (name == "odd");
    }
    if (name == "eq" || name == "equalto" || name == "sameas") return equal(j, argument());
    if (name == "ne") return !equal(j, argument());
    if (name == "divisibleby") {
      const auto d = argument();
      if (!j.is_number_integer() || !d.is_number_integer() || d.get<std::int64_t>() == 0) fail(e.at, "divisibleby needs integers");
      return j.get<std::int64_t>() % d.get<std::int64_t>() == 0;
    }
    if (name == "in") {
      const auto container = argument();
      if (container.is_array()) return std::any_of(container.begin(), container.end(), [&](const Json& x) { return equal(x, j); });
      if (container.is_string() && j.is_string()) return container.get<std::string>().find(j.get<std::string>()) != std::string::npos;
      if (container.is_object() && j.is_string()) return container.contains(j.get<std::string>());
      return false;
    }
    unsupported(e.at, fmt::format("the test '{}'", name));
  }

  /// A positional or keyword argument of a call or filter (positional `index` after the subject).
  std::optional<Json> arg(const Expr& e, std::size_t index, const char* keyword) {
    for (const auto& [key, value] : e.kwargs)
      if (key == keyword) return eval(*value).json;
    if (index < e.args.size()) return eval(*e.args[index]).json;
    return std::nullopt;
  }
  std::string string_arg(const Expr& e, std::size_t index, const char* keyword, std::string fallback = {}) {
    const auto v = arg(e, index, keyword);
    if (!v) return fallback;
    if (!v->is_string()) fail(e.at, fmt::format("'{}' must be a string, not {}", keyword, detail::python_repr(*v)));
    return v->get<std::string>();
  }

  Value filter(const Expr& e) {
    const auto subject = eval(*e.args[0]);
    const auto& j = subject.json;
    const auto& name = e.name;
    const auto need_string = [&]() -> std::string {
      if (subject.undefined) return "";
      return detail::python_str(j);
    };
    if (name == "trim") return {Json(detail::strip_chars(need_string(), string_arg(e, 1, "chars", " \t\n\r\f\v"), true, true)), false};
    if (name == "upper" || name == "lower") {
      auto s = need_string();
      for (auto& c : s) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      return {Json(s), false};
    }
    if (name == "title") return {Json(detail::title_case(need_string())), false};
    if (name == "capitalize") {
      auto s = need_string();
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return {Json(s), false};
    }
    if (name == "replace") {
      const auto count = arg(e, 3, "count");
      return {Json(detail::replace_all(need_string(), string_arg(e, 1, "old"), string_arg(e, 2, "new"), count ? count->get<std::int64_t>() : -1)), false};
    }
    if (name == "string") return {Json(need_string()), false};
    if (name == "safe" || name == "e" || name == "escape") return subject;  // no autoescape in chat templates
    if (name == "length" || name == "count") {
      if (j.is_string()) return {Json(static_cast<std::int64_t>(j.get<std::string>().size())), false};
      if (j.is_array() || j.is_object()) return {Json(static_cast<std::int64_t>(j.size())), false};
      if (subject.undefined) return {Json(0), false};
      fail(e.at, fmt::format("{} has no length", detail::python_repr(j)));
    }
    if (name == "tojson") {
      const auto indent = arg(e, 1, "indent");
      return {Json(detail::python_json(j, indent && indent->is_number_integer() ? std::optional<int>(indent->get<int>()) : std::nullopt)), false};
    }
    if (name == "default" || name == "d") {
      const auto boolean = arg(e, 2, "boolean");
      if (subject.undefined || (boolean && boolean->is_boolean() && boolean->get<bool>() && !detail::truthy(subject)))
        return {arg(e, 1, "default_value").value_or(Json("")), false};
      return subject;
    }
    if (name == "first" || name == "last") {
      if (j.is_array() && !j.empty()) return {name == "first" ? j.front() : j.back(), false};
      if (j.is_string() && !j.get<std::string>().empty()) {
        const auto s = j.get<std::string>();
        return {Json(std::string(1, name == "first" ? s.front() : s.back())), false};
      }
      return Value::missing();
    }
    if (name == "list") {
      if (j.is_array()) return subject;
      Json out = Json::array();
      if (j.is_string()) for (const char c : j.get<std::string>()) out.push_back(std::string(1, c));
      else if (j.is_object()) for (const auto& [key, value] : j.items()) out.push_back(key);
      return {out, false};
    }
    if (name == "items") {
      Json out = Json::array();
      if (j.is_object())
        for (const auto& [key, value] : j.items())
          if (key != "__namespace__") out.push_back(Json::array({key, value}));
      return {out, false};
    }
    if (name == "reverse") {
      if (j.is_array()) return {Json(Json::array_t(j.rbegin(), j.rend())), false};
      auto s = need_string();
      std::reverse(s.begin(), s.end());
      return {Json(s), false};
    }
    if (name == "join") {
      const auto separator = string_arg(e, 1, "d");
      const auto attribute = arg(e, 2, "attribute");
      std::string out;
      if (j.is_array())
        for (std::size_t i = 0; i < j.size(); ++i) {
          const auto item = attribute ? member({j[i], false}, *attribute).json : j[i];
          out += (i ? separator : "") + detail::python_str(item);
        }
      return {Json(out), false};
    }
    if (name == "int" || name == "float") {
      double x = 0;
      if (j.is_number()) x = j.get<double>();
      else if (j.is_string()) x = detail::python_float(j.get<std::string>());
      // Outside 64 bits (or not a number) int gives its default, 0: the cast would be undefined.
      const bool fits = std::isfinite(x) && std::abs(x) < 9.2e18;
      return name == "int" ? Value{Json(fits ? static_cast<std::int64_t>(x) : std::int64_t{0}), false} : Value{Json(x), false};
    }
    if (name == "indent") {
      const auto width = arg(e, 1, "width").value_or(Json(4));
      const auto first = arg(e, 2, "first").value_or(Json(false));
      const std::string pad(static_cast<std::size_t>(width.is_number_integer() ? width.get<std::int64_t>() : 4), ' ');
      std::string out, s = need_string();
      bool line_start = first.is_boolean() && first.get<bool>();
      for (const char c : s) {
        if (line_start && c != '\n') out += pad;
        out.push_back(c);
        line_start = c == '\n';
      }
      return {Json(out), false};
    }
    if (name == "selectattr" || name == "rejectattr" || name == "map") {
      if (!j.is_array()) return {Json::array(), false};
      Json out = Json::array();
      if (name == "map") {
        const auto attribute = arg(e, 99, "attribute");
        if (!attribute) unsupported(e.at, "map() without attribute=");
        for (const auto& item : j) out.push_back(member({item, false}, *attribute).json);
        return {out, false};
      }
      const auto attribute = string_arg(e, 1, "attribute");
      const auto test_name = string_arg(e, 2, "test", "");
      const auto operand = arg(e, 3, "value");
      for (const auto& item : j) {
        const auto value = member({item, false}, Json(attribute));
        bool ok;
        if (test_name.empty()) ok = detail::truthy(value);
        else if (test_name == "defined") ok = !value.undefined;
        else if (test_name == "undefined") ok = value.undefined;
        else if (test_name == "equalto" || test_name == "eq" || test_name == "==") ok = operand && equal(value.json, *operand);
        else if (test_name == "ne" || test_name == "!=") ok = !(operand && equal(value.json, *operand));
        else if (test_name == "none") ok = !value.undefined && value.json.is_null();
        else unsupported(e.at, fmt::format("{}() with the test '{}'", name, test_name));
        if (ok == (name == "selectattr")) out.push_back(item);
      }
      return {out, false};
    }
    unsupported(e.at, fmt::format("the filter '{}'", name));
  }

  Value call(const Expr& e) {
    const auto& callee = *e.args[0];
    if (callee.kind == Expr::Kind::attribute) return method(e, eval(*callee.args[0]), callee.name);
    if (callee.kind != Expr::Kind::name) unsupported(e.at, "calling this expression");
    const auto& name = callee.name;
    if (name == "raise_exception") {
      const auto message = arg(e, 1, "message").value_or(Json(""));
      throw RuntimeError(errors::runtime_chat_template, fmt::format("{}: the template raised: {}", origin_, detail::python_str(message)));
    }
    if (name == "namespace" || name == "dict") {
      Json ns = Json::object();
      if (name == "namespace") ns["__namespace__"] = true;
      for (const auto& [key, value] : e.kwargs) ns[key] = eval(*value).json;
      return {ns, false};
    }
    if (name == "range") {
      std::int64_t start = 0, stop = 0, step = 1;
      std::vector<std::int64_t> values;
      for (std::size_t i = 1; i < e.args.size(); ++i) {
        const auto v = eval(*e.args[i]).json;
        if (!v.is_number_integer()) fail(e.at, "range() needs integers");
        values.push_back(v.get<std::int64_t>());
      }
      if (values.size() == 1) stop = values[0];
      else if (values.size() >= 2) start = values[0], stop = values[1];
      if (values.size() == 3) step = values[2];
      if (step == 0) fail(e.at, "range() step cannot be zero");
      Json out = Json::array();
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= max_iterations) fail(e.at, "range() is too long");
        out.push_back(i);
      }
      return {out, false};
    }
    if (name == "strftime_now") {
      const auto format = string_arg(e, 1, "format");
      const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[256];
      const auto n = std::strftime(buffer, sizeof buffer, format.c_str(), &local);
      return {Json(std::string(buffer, n)), false};
    }
    const auto value = lookup(name);
    if (value.undefined) fail(e.at, fmt::format("'{}' is undefined", name));
    unsupported(e.at, fmt::format("calling '{}'", name));
  }

  Value method(const Expr& e, const Value& subject, const std::string& name) {
    const auto& j = subject.json;
    if (j.is_string()) {
      const auto s = j.get<std::string>();
      const std::string whitespace = " \t\n\r\f\v";
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const auto chars = arg(e, 1, "chars");
        const auto set = chars && chars->is_string() ? chars->get<std::string>() : whitespace;
        return {Json(detail::strip_chars(s, set, name != "rstrip", name != "lstrip")), false};
      }
      if (name == "upper" || name == "lower") {
        auto out = s;
        for (auto& c : out) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
        return {Json(out), false};
      }
      if (name == "title") return {Json(detail::title_case(s)), false};
      if (name == "startswith" || name == "endswith") {
        const auto affix = string_arg(e, 1, "prefix");
        const bool ok = s.size() >= affix.size() && (name == "startswith" ? s.compare(0, affix.size(), affix) == 0
                                                                            : s.compare(s.size() - affix.size(), affix.size(), affix) == 0);
        return {Json(ok), false};
      }
      if (name == "replace") return {Json(detail::replace_all(s, string_arg(e, 1, "old"), string_arg(e, 2, "new"))), false};
      if (name == "split") {
        const auto separator = arg(e, 1, "sep");
        Json out = Json::array();
        if (!separator || separator->is_null()) {
          std::size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && whitespace.find(s[i]) != std::string::npos) ++i;
            std::size_t j2 = i;
            while (j2 < s.size() && whitespace.find(s[j2]) == std::string::npos) ++j2;
            if (j2 > i) out.push_back(s.substr(i, j2 - i));
            i = j2;
          }
        } else {
          const auto sep = separator->get<std::string>();
          if (sep.empty()) fail(e.at, "empty separator");
          std::size_t begin = 0, at = 0;
          while ((at = s.find(sep, begin)) != std::string::npos) {
            out.push_back(s.substr(begin, at - begin));
            begin = at + sep.size();
          }
          out.push_back(s.substr(begin));
        }
        return {out, false};
      }
    }
    if (j.is_object()) {
      if (name == "get") {
        const auto key = arg(e, 1, "key");
        const auto found = key ? member(subject, *key) : Value::missing();
        return found.undefined ? Value{arg(e, 2, "default").value_or(Json(nullptr)), false} : found;
      }
      if (name == "items" || name == "keys" || name == "values") {
        Json out = Json::array();
        for (const auto& [key, value] : j.items()) {
          if (key == "__namespace__") continue;
          out.push_back(name == "items" ? Json::array({key, value}) : name == "keys" ? Json(key) : value);
        }
        return {out, false};
      }
    }
    if (subject.undefined) fail(e.at, fmt::format("cannot call '{}' on an undefined value", name));
    unsupported(e.at, fmt::format("the method '{}' of {}", name, j.type_name()));
  }

  std::string origin_;
  std::vector<Json> scopes_;
  std::string out_;
  std::vector<std::pair<std::size_t, std::size_t>> spans_;
  std::size_t iterations_ = 0;
};

}  // namespace hpctrain::text::jinja
