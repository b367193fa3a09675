#pragma once
// The interpreter of the Jinja subset (text/chat_template.hpp). Values are JSON values whose mappings keep
// their insertion order, plus jinja2's Undefined and namespace() (jinja/value.hpp); they print, compare and
// combine with Python's rules, and the filters, tests and methods are jinja2's (jinja/builtins.hpp). The
// functions are those of transformers' chat-template environment: raise_exception, strftime_now, namespace,
// dict, range, and the template's own macros. What jinja2 would raise (a TypeError, an undefined value used)
// is a RuntimeError naming the template's line and column; a construct hpctrain does not implement is a
// SpecError. Output, loop iterations and macro nesting are bounded, so a hostile template cannot exhaust
// memory or the stack. Torch-free.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/jinja/builtins.hpp>
#include <hpctrain/text/jinja/filters.hpp>
#include <hpctrain/text/jinja/methods.hpp>
#include <hpctrain/text/jinja/parser.hpp>
#include <hpctrain/text/jinja/value.hpp>

namespace hpctrain::text::jinja {

/// Renders parsed nodes with a context of variables.
class Interpreter {
 public:
  /// Output bytes a rendering may write (each buffer, and all of them together 4x); loop iterations and macro
  /// calls it may run; macro calls nested.
  static constexpr std::size_t max_output = max_rendering_bytes;
  static constexpr std::size_t max_iterations = 1u << 22;
  static constexpr int max_call_depth = 64;

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
  [[noreturn]] void unsupported(Position at, const std::string& what) const {
    syntax_error(origin_, at, what + " is not supported by hpctrain's chat templates");
  }

  /// Runs `f`, turning what Python would raise into a RuntimeError and what hpctrain lacks into a SpecError,
  /// both naming `at`.
  template <typename F>
  auto guarded(Position at, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const PythonError& error) {
      fail(at, error.message);
    } catch (const Unsupported& error) {
      unsupported(at, error.what);
    }
  }

  void write(const std::string& text, Position at) {
    if (out_.size() + text.size() > max_output || (written_ += text.size()) > 4 * max_output)
      fail(at, "the rendering exceeds 64 MiB");
    out_ += text;
  }
  std::string printed(const Value& value, Position at) {
    return guarded(at, [&] { return detail::soft_str(value); });
  }

  // ---- statements ------------------------------------------------------------------------------------
  Flow run(const std::vector<Node>& nodes) {
    for (const auto& node : nodes) {
      switch (node.kind) {
        case Node::Kind::text: write(node.text, node.at); break;
        case Node::Kind::output: write(printed(eval(*node.exprs[0]), node.at), node.at); break;
        case Node::Kind::if_: {
          std::size_t branch = 0;
          while (branch < node.exprs.size() && !detail::truthy(eval(*node.exprs[branch]))) ++branch;
          if (branch < node.bodies.size())
            if (const auto flow = run(node.bodies[branch]); flow != Flow::normal) return flow;
          break;
        }
        case Node::Kind::for_: run_for(node); break;
        case Node::Kind::set: assign(node, eval(*node.exprs[0])); break;
        case Node::Kind::set_block: assign(node, Value::of(Json(capture(node.bodies[0])))); break;
        case Node::Kind::macro: macros_[node.targets[0]] = &node; break;
        case Node::Kind::filter_block: {
          auto body = capture(node.bodies[0]);
          Json scope = Json::object();
          scope[filter_body_name] = std::move(body);
          scopes_.push_back(std::move(scope));
          const auto value = eval(*node.exprs[0]);
          scopes_.pop_back();
          write(printed(value, node.at), node.at);
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

  /// The text `nodes` write, apart from the output so far (set blocks, filter blocks, macros).
  std::string capture(const std::vector<Node>& nodes) {
    std::string saved = std::move(out_);
    out_.clear();
    run(nodes);
    auto captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  /// A missing value in a scope (a macro's parameter not given): a binary value no data can hold.
  static Json undefined_marker() { return Json::binary({}, 0x55); }

  void assign(const Node& node, const Value& value) {
    if (value.bound_method) unsupported(node.at, "assigning a method");
    if (value.markup) unsupported(node.at, "keeping a Markup string (from |safe or |escape) in a variable");
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = value.undefined ? undefined_marker() : value.json;
      return;
    }
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto it = scope->find(node.targets[0]);
      if (it == scope->end()) continue;
      if (!detail::is_namespace(*it)) fail(node.at, "cannot assign attribute on non-namespace object");
      if (value.undefined) unsupported(node.at, "assigning an undefined value to a namespace attribute");
      (*it)[node.targets[1]] = value.json;
      return;
    }
    fail(node.at, fmt::format("'{}' is undefined", node.targets[0]));
  }

  void run_for(const Node& node) {
    auto items = guarded(node.at, [&] { return detail::iterate(eval(*node.exprs[0])); });
    if (node.exprs.size() > 1) {  // `for x in xs if condition`: filter first, so loop.* counts the kept ones
      std::vector<Json> kept;
      for (auto& item : items) {
        scopes_.push_back(bind(node, item));
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
      auto scope = bind(node, items[static_cast<std::size_t>(i)]);
      Json loop = Json::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = n - i;
      loop["revindex0"] = n - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == n - 1;
      loop["length"] = n;
      loop["depth"] = 1;
      loop["depth0"] = 0;
      if (i > 0) loop["previtem"] = items[static_cast<std::size_t>(i - 1)];  // else undefined, as in jinja2
      if (i + 1 < n) loop["nextitem"] = items[static_cast<std::size_t>(i + 1)];
      scope["loop"] = std::move(loop);
      scopes_.push_back(std::move(scope));
      const auto flow = run(node.bodies[0]);
      scopes_.pop_back();
      if (flow == Flow::break_) break;
    }
  }

  Json bind(const Node& node, const Json& item) const {
    Json scope = Json::object();
    if (node.targets.size() == 1) {
      scope[node.targets[0]] = item;
    } else {
      const auto parts = item.is_string() ? Json(detail::code_points(item.get<std::string>())) : item;
      if (!parts.is_array() || parts.size() != node.targets.size())
        fail(node.at,
             parts.is_array() && parts.size() > node.targets.size()
                 ? fmt::format("too many values to unpack (expected {})", node.targets.size())
             : parts.is_array()
                 ? fmt::format("not enough values to unpack (expected {}, got {})", node.targets.size(), parts.size())
                 : fmt::format("cannot unpack non-iterable {} object", detail::python_type_name(item)));
      for (std::size_t k = 0; k < node.targets.size(); ++k) scope[node.targets[k]] = parts[k];
    }
    return scope;
  }

  // ---- expressions -----------------------------------------------------------------------------------
  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope)
      if (const auto it = scope->find(name); it != scope->end()) {
        if (it->is_binary()) break;  // a parameter not given
        return Value::of(*it);
      }
    return Value::missing(fmt::format("'{}' is undefined", name));
  }

  /// `subject.name`: a method of the subject's type first (jinja2's getattr), then a key or attribute.
  Value attribute(const Value& subject, const std::string& name, Position at) {
    return guarded(at, [&] {
      if (!subject.undefined && !subject.bound_method && names::python_has_method(subject.json, name))
        return Value::method(subject.json, name);
      return detail::member(subject, Json(name));
    });
  }
  /// `subject[key]`: a key or element first (jinja2's getitem), then a method of that name.
  Value item(const Value& subject, const Json& key, Position at) {
    return guarded(at, [&] {
      auto found = detail::member(subject, key);
      if (found.undefined && key.is_string() && names::python_has_method(subject.json, key.get<std::string>()))
        return Value::method(subject.json, key.get<std::string>());
      return found;
    });
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return Value::of(e.value);
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::attribute: return attribute(eval(*e.args[0]), e.name, e.at);
      case Expr::Kind::item: {
        const auto subject = eval(*e.args[0]);
        const auto key = eval(*e.args[1]);
        if (key.undefined)
          return guarded(e.at, [&] {  // an Undefined key finds nothing (its hash matches no key)
            detail::require_defined(subject);
            return Value::missing(
                fmt::format("'{}' has no attribute Undefined", detail::jinja_object_name(subject.json)));
          });
        return item(subject, key.json, e.at);
      }
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::list: {
        Json list = Json::array();
        for (const auto& element : e.args) list.push_back(defined(eval(*element), element->at).json);
        return Value::of(list);
      }
      case Expr::Kind::dict: {
        Json dict = Json::object();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const auto key = eval(*e.args[i]);
          guarded(e.args[i]->at, [&] { detail::require_storable_key(key); });
          detail::set_key(dict, key.json, defined(eval(*e.args[i + 1]), e.args[i + 1]->at).json);
        }
        return Value::of(dict);
      }
      case Expr::Kind::ternary: {
        if (detail::truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args.size() > 2 ? eval(*e.args[2])
                                 : Value::missing("the inline if's condition was false and it has no else");
      }
      case Expr::Kind::unary: {
        const auto value = eval(*e.args[0]);
        if (e.name == "not") return Value::of(Json(!detail::truthy(value)));
        return guarded(e.at, [&] {
          detail::require_defined(value);
          const auto& j = value.json;
          if (!detail::is_python_number(j))
            throw PythonError{fmt::format("bad operand type for unary {}: '{}'", e.name, detail::python_type_name(j))};
          const auto x = j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : j;
          if (e.name == "+") return Value::of(x);
          return x.is_number_float() ? Value::of(Json(-x.get<double>())) : Value::of(Json(-x.get<std::int64_t>()));
        });
      }
      case Expr::Kind::binary: return binary(e);
      case Expr::Kind::test: {
        const auto subject = eval(*e.args[0]);
        const auto args = arguments(e);
        return Value::of(Json(guarded(e.at, [&] { return apply_test(e.name, subject, args); }) != e.negated));
      }
      case Expr::Kind::filter: {
        const auto subject = eval(*e.args[0]);
        const auto args = arguments(e);
        return guarded(e.at, [&] { return apply_filter(e.name, subject, args); });
      }
      case Expr::Kind::call: return call(e);
    }
    fail(e.at, "unknown expression");
  }

  /// A value that must be defined and plain to be kept (in a list or dict literal, a macro's argument): jinja2
  /// keeps Undefined and Markup there, hpctrain cannot.
  Value defined(Value value, Position at) {
    if (value.undefined) unsupported(at, "an undefined value inside a list or dict literal");
    if (value.bound_method) unsupported(at, "a method inside a list or dict literal");
    if (value.markup)
      unsupported(at, "a Markup string (from |safe or |escape) kept in a list, a dict or a macro's argument");
    return value;
  }

  /// The arguments after the subject (filters, tests) or the callee (calls).
  Args arguments(const Expr& e) {
    Args args;
    for (std::size_t i = 1; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  Value slice(const Expr& e) {
    const auto subject = eval(*e.args[0]);
    const auto bound = [&](std::size_t k) -> std::optional<std::int64_t> {
      if (!e.args[k]) return std::nullopt;
      const auto v = eval(*e.args[k]).json;
      if (v.is_null()) return std::nullopt;
      if (!v.is_number_integer()) fail(e.at, "slice indices must be integers or None or have an __index__ method");
      return v.get<std::int64_t>();
    };
    const auto start = bound(1), stop = bound(2), step = bound(3);
    if (step && *step == 0) fail(e.at, "slice step cannot be zero");
    if (subject.undefined) fail(e.at, subject.why);
    const auto& j = subject.json;
    if (j.is_array()) {
      Json out = Json::array();
      for (const auto i : detail::slice_indices(static_cast<std::int64_t>(j.size()), start, stop, step))
        out.push_back(j[static_cast<std::size_t>(i)]);
      return Value::of(out);
    }
    if (j.is_string()) {
      const auto points = detail::code_points(j.get<std::string>());
      std::string out;
      for (const auto i : detail::slice_indices(static_cast<std::int64_t>(points.size()), start, stop, step))
        out += points[static_cast<std::size_t>(i)];
      return Value::of(Json(out));
    }
    fail(e.at, fmt::format("'{}' object is not subscriptable", detail::python_type_name(j)));
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
    return guarded(e.at, [&] { return operate(op, left, right); });
  }

  Value operate(const std::string& op, const Value& left, const Value& right) {
    using detail::python_type_name;
    const auto& a = left.json;
    const auto& b = right.json;
    if (op == "~") return Value::of(Json(detail::soft_str(left) + detail::soft_str(right)));
    if (left.bound_method || right.bound_method) throw Unsupported{"an operator on a method"};
    if (op == "==" || op == "!=") {
      const bool same = left.undefined == right.undefined && (left.undefined || detail::python_equal(a, b));
      return Value::of(Json(op == "==" ? same : !same));
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (right.undefined) {
        found = false;  // Undefined iterates as empty
      } else if (b.is_string()) {
        if (!a.is_string() || left.undefined)
          throw PythonError{fmt::format("'in <string>' requires string as left operand, not {}",
                                        left.undefined ? "Undefined" : python_type_name(a))};
        found = b.get_ref<const std::string&>().find(a.get_ref<const std::string&>()) != std::string::npos;
      } else if (b.is_array()) {
        found = !left.undefined &&
                std::any_of(b.begin(), b.end(), [&](const Json& x) { return detail::python_equal(x, a); });
      } else if (b.is_object() && !detail::is_namespace(b)) {
        if (a.is_array() || a.is_object()) throw PythonError{fmt::format("unhashable type: '{}'", python_type_name(a))};
        found = !left.undefined && detail::find_key(b, a) != b.end();
      } else {
        throw PythonError{fmt::format("argument of type '{}' is not iterable", python_type_name(b))};
      }
      return Value::of(Json(op == "in" ? found : !found));
    }
    detail::require_defined(left);
    detail::require_defined(right);
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      const int c = detail::python_compare(a, b, op.c_str());
      return Value::of(Json(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0));
    }
    const auto type_error = [&] {
      if (op == "+" && (a.is_string() || a.is_array()) && a.type() != b.type())
        return PythonError{fmt::format("can only concatenate {} (not \"{}\") to {}", python_type_name(a),
                                       python_type_name(b), python_type_name(a))};
      return PythonError{fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, python_type_name(a),
                                     python_type_name(b))};
    };
    if (op == "+" && a.is_string() && b.is_string()) {
      if (!left.markup && !right.markup) return Value::of(Json(a.get<std::string>() + b.get<std::string>()));
      // Markup + str (or str + Markup, through Markup.__radd__) escapes the plain side
      const auto side = [](const Value& v) {
        return v.markup ? v.json.get<std::string>() : detail::html_escape(v.json.get<std::string>());
      };
      return Value::safe(side(left) + side(right));
    }
    if (op == "+" && a.is_array() && b.is_array()) {
      Json out = a;
      for (const auto& x : b) out.push_back(x);
      return Value::of(out);
    }
    if (detail::is_python_number(a) && detail::is_python_number(b)) {
      const auto integer = [](const Json& j) -> std::int64_t {
        return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<std::int64_t>();
      };
      const bool ints = !a.is_number_float() && !b.is_number_float();
      const double x = detail::as_double(a), y = detail::as_double(b);
      if (op == "+") return ints ? Value::of(Json(integer(a) + integer(b))) : Value::of(Json(x + y));
      if (op == "-") return ints ? Value::of(Json(integer(a) - integer(b))) : Value::of(Json(x - y));
      if (op == "*") return ints ? Value::of(Json(integer(a) * integer(b))) : Value::of(Json(x * y));
      if ((op == "/" || op == "//" || op == "%") && y == 0)
        throw PythonError{op == "/" ? "division by zero"
                          : ints    ? "integer division or modulo by zero"
                                    : "float modulo"};
      if (op == "/") return Value::of(Json(x / y));
      if (op == "//")
        return ints ? Value::of(Json(static_cast<std::int64_t>(std::floor(x / y))))
                    : Value::of(Json(std::floor(x / y)));
      if (op == "%") {
        if (ints) {
          const auto m = integer(a) % integer(b);
          return Value::of(Json(m != 0 && ((m < 0) != (integer(b) < 0)) ? m + integer(b) : m));
        }
        return Value::of(Json(x - y * std::floor(x / y)));
      }
    }
    if (op == "%" && a.is_string()) throw Unsupported{"printf-style formatting with '%'"};
    if (op == "*" && (a.is_string() || a.is_array()) && b.is_number_integer()) {
      // Bounded before any work: Python's "" * n and [] * n are empty for any n, and otherwise the result's size
      // is known. Bounded only as they grew, "" * 99999999999 looped forever growing nothing, and "a" * 99999999999
      // took 50 s (ASan, -O0) to reach 64 MiB a byte at a time.
      const std::size_t size = a.is_string() ? a.get_ref<const std::string&>().size() : a.size();
      const auto times = size == 0 ? 0 : b.get<std::int64_t>();
      if (times > 0 && static_cast<std::uint64_t>(times) > (a.is_string() ? max_output : max_iterations) / size)
        throw PythonError{a.is_string() ? "the rendering exceeds 64 MiB" : "the list is too long"};
      if (a.is_string()) {  // by doubling: 26 appends, not 64 million, for "a" * 67108864
        const auto total = times > 0 ? size * static_cast<std::size_t>(times) : 0;
        std::string out = total > 0 ? a.get<std::string>() : std::string();
        out.reserve(total);
        while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
        return left.markup ? Value::safe(std::move(out)) : Value::of(Json(std::move(out)));
      }
      Json out = Json::array();
      for (std::int64_t i = 0; i < times; ++i)
        for (const auto& x : a) out.push_back(x);
      return Value::of(out);
    }
    throw type_error();
  }

  Value call(const Expr& e) {
    const auto& callee = *e.args[0];
    if (callee.kind == Expr::Kind::attribute) {
      const auto subject = eval(*callee.args[0]);
      const auto args = arguments(e);
      return guarded(e.at, [&] { return call_method(subject, callee.name, args); });
    }
    if (callee.kind != Expr::Kind::name) unsupported(e.at, "calling this expression");
    const auto& name = callee.name;
    if (const auto macro = macros_.find(name); macro != macros_.end() && !local(name))
      return call_macro(*macro->second, e);
    if (name == "raise_exception") {
      const auto args = arguments(e);
      const auto* message = args.get(0, "message");
      throw RuntimeError(errors::runtime_chat_template, fmt::format("{}: the template raised: {}", origin_,
                                                                    message ? printed(*message, e.at) : std::string()));
    }
    if (name == "namespace" || name == "dict") {
      const auto args = arguments(e);
      Json out = name == "namespace" ? detail::make_namespace() : Json::object();
      if (args.positional.size() > 1)
        fail(e.at, fmt::format("{} expected at most 1 argument, got {}", name, args.positional.size()));
      if (!args.positional.empty()) {
        const auto& initial = args.positional[0].json;
        if (!initial.is_object() || detail::is_namespace(initial))
          unsupported(e.at, fmt::format("{}() of anything but a dict", name));
        detail::for_each_entry(initial, [&](const Json& key, const Json& value) { detail::set_key(out, key, value); });
      }
      for (const auto& [key, value] : args.keyword) out[key] = defined(value, e.at).json;
      return Value::of(out);
    }
    if (name == "range") {
      const auto args = arguments(e);
      std::vector<std::int64_t> values;
      for (const auto& v : args.positional) {
        if (!v.json.is_number_integer())
          fail(e.at, fmt::format("'{}' object cannot be interpreted as an integer", detail::python_type_name(v.json)));
        values.push_back(v.json.get<std::int64_t>());
      }
      if (values.empty() || values.size() > 3)
        fail(e.at, fmt::format("range expected 1 to 3 arguments, got {}", values.size()));
      std::int64_t start = 0, stop = values[0], step = 1;
      if (values.size() >= 2) start = values[0], stop = values[1];
      if (values.size() == 3) step = values[2];
      if (step == 0) fail(e.at, "range() arg 3 must not be zero");
      Json out = Json::array();
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= max_iterations) fail(e.at, "range() is too long");
        out.push_back(i);
      }
      return Value::of(out);
    }
    if (name == "strftime_now") {
      const auto args = arguments(e);
      const auto format = guarded(e.at, [&] { return detail::string_argument(args, 0, "format"); });
      const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[256];
      const auto n = std::strftime(buffer, sizeof buffer, format.c_str(), &local);
      return Value::of(Json(std::string(buffer, n)));
    }
    const auto value = lookup(name);
    if (value.undefined) fail(e.at, value.why);
    fail(e.at, fmt::format("'{}' object is not callable", detail::python_type_name(value.json)));
  }

  /// Whether `name` is a variable of a scope above the global one (it hides a macro of that name).
  bool local(const std::string& name) const {
    for (std::size_t k = 1; k < scopes_.size(); ++k)
      if (scopes_[k].contains(name)) return true;
    return false;
  }

  /// A macro's output for the call `e`: its parameters bound (positional, then by name, then defaults, else
  /// Undefined), run with the template's global variables but not the caller's loop variables, as jinja2 does.
  Value call_macro(const Node& macro, const Expr& e) {
    const auto& name = macro.targets[0];
    const std::size_t parameters = macro.targets.size() - 1;
    auto args = arguments(e);
    if (args.positional.size() > parameters)
      fail(e.at, fmt::format("macro '{}' takes not more than {} argument(s)", name, parameters));
    Json scope = Json::object();
    std::vector<bool> given(parameters, false);
    for (std::size_t k = 0; k < args.positional.size(); ++k) {
      scope[macro.targets[k + 1]] =
          args.positional[k].undefined ? undefined_marker() : defined(args.positional[k], e.at).json;
      given[k] = true;
    }
    for (auto& [key, value] : args.keyword) {
      const auto it = std::find(macro.targets.begin() + 1, macro.targets.end(), key);
      if (it == macro.targets.end()) fail(e.at, fmt::format("macro '{}' takes no keyword argument '{}'", name, key));
      const auto k = static_cast<std::size_t>(it - macro.targets.begin() - 1);
      if (given[k]) fail(e.at, fmt::format("macro '{}' got multiple values for argument '{}'", name, key));
      scope[key] = value.undefined ? undefined_marker() : defined(value, e.at).json;
      given[k] = true;
    }
    if (++call_depth_ > max_call_depth) fail(e.at, "macro calls nested too deeply");
    if (++iterations_ > max_iterations) fail(e.at, "too many loop iterations");
    std::vector<Json> caller(std::make_move_iterator(scopes_.begin() + 1), std::make_move_iterator(scopes_.end()));
    scopes_.resize(1);
    scopes_.push_back(Json::object());
    for (std::size_t k = 0; k < parameters; ++k) {  // defaults in order: one may use the parameters before it
      const auto& parameter = macro.targets[k + 1];
      if (given[k]) scopes_.back()[parameter] = scope[parameter];
      else scopes_.back()[parameter] = macro.exprs[k] ? eval(*macro.exprs[k]).json : undefined_marker();
    }
    auto output = capture(macro.bodies[0]);
    scopes_.resize(1);
    for (auto& scope_of_caller : caller) scopes_.push_back(std::move(scope_of_caller));
    --call_depth_;
    return Value::of(Json(std::move(output)));
  }

  std::string origin_;
  std::vector<Json> scopes_;
  std::map<std::string, const Node*> macros_;
  std::string out_;
  std::vector<std::pair<std::size_t, std::size_t>> spans_;
  std::size_t iterations_ = 0, written_ = 0;
  int call_depth_ = 0;
};

}  // namespace hpctrain::text::jinja
