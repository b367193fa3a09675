#pragma once
// The built-in tests of the Jinja subset (text/chat_template.hpp; the filters are in jinja/filters.hpp, the
// methods in jinja/methods.hpp), with jinja2 3.1's semantics in transformers' environment, applied to values already
// evaluated, and the helpers the filters share. The name tables say what is implemented and what jinja2 or
// Python know beside it: the parser refuses a filter, test or method hpctrain lacks before anything renders,
// and a name jinja2 itself does not know ("No filter named ...") the same way. Helpers throw PythonError (what jinja2
// would raise) or Unsupported; the interpreter adds the line and column. Torch-free.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/text/jinja/value.hpp>

namespace hpctrain::text::jinja {

/// The arguments of a filter, test, method or function, after its subject.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  /// The argument at `index` (0: the first after the subject) or named `name`; nullptr when absent.
  const Value* get(std::size_t index, std::string_view name) const {
    for (const auto& [key, value] : keyword)
      if (key == name) return &value;
    return index < positional.size() ? &positional[index] : nullptr;
  }
};

namespace names {
/// jinja2's other built-in filters: a template using one is refused as unsupported.
inline const std::set<std::string, std::less<>>& jinja_filters() {
  static const std::set<std::string, std::less<>> names{
      "batch",     "center",   "filesizeformat", "format", "groupby",   "pprint",   "random", "slice",
      "striptags", "truncate", "urlencode",      "urlize", "wordcount", "wordwrap", "xmlattr"};
  return names;
}
/// The tests hpctrain implements: the table's names.
inline const std::set<std::string, std::less<>>& tests();
inline const std::set<std::string, std::less<>>& jinja_tests() {
  static const std::set<std::string, std::less<>> names{"filter", "test"};
  return names;
}
/// Python's other methods of str, list and dict, and the loop object's: known, not implemented (list.append and
/// dict.update also modify their object, which transformers' sandbox refuses).
inline const std::set<std::string, std::less<>>& python_methods() {
  static const std::set<std::string, std::less<>> names{
      "casefold",     "center",     "encode",      "expandtabs", "format",  "format_map", "isascii",   "isdecimal",
      "isidentifier", "isnumeric",  "isprintable", "istitle",    "ljust",   "maketrans",  "partition", "rindex",
      "rjust",        "rpartition", "swapcase",    "translate",  "zfill",   "append",     "clear",     "copy",
      "extend",       "insert",     "pop",         "remove",     "reverse", "sort",       "fromkeys",  "popitem",
      "setdefault",   "update",     "cycle",       "changed"};
  return names;
}
/// Python methods of str (all of them), which `'abc'.name` finds; and of dict and list.
inline bool python_has_method(const Json& subject, const std::string& name) {
  static const std::set<std::string, std::less<>> str_all{
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  static const std::set<std::string, std::less<>> list_all{"append", "clear", "copy",   "count",   "extend", "index",
                                                           "insert", "pop",   "remove", "reverse", "sort"};
  static const std::set<std::string, std::less<>> dict_all{"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                                           "pop",   "popitem", "setdefault", "update", "values"};
  if (subject.is_string()) return str_all.count(name) > 0;
  if (subject.is_array()) return list_all.count(name) > 0;
  if (subject.is_object() && !detail::is_namespace(subject)) return dict_all.count(name) > 0;
  return false;
}
}  // namespace names

namespace detail {

/// str() as jinja2's filters take it (soft_str): Undefined is "".
inline std::string soft_str(const Value& value) {
  if (value.bound_method)
    throw Unsupported{fmt::format("printing the method '{}' (Python prints its address)", value.why)};
  return value.undefined ? std::string() : python_str(value.json);
}

inline void require_defined(const Value& value) {
  if (value.undefined) throw PythonError{value.why};
}

/// What Python's iter() gives: a list's items, a dict's keys, a string's code points; Undefined is empty.
inline std::vector<Json> iterate(const Value& value) {
  std::vector<Json> items;
  const auto& j = value.json;
  if (value.undefined) return items;
  if (j.is_array()) {
    items.assign(j.begin(), j.end());
  } else if (j.is_object() && !is_namespace(j)) {
    for_each_entry(j, [&](const Json& key, const Json&) { items.push_back(key); });
  } else if (j.is_string()) {
    for (auto& c : code_points(j.get_ref<const std::string&>())) items.emplace_back(std::move(c));
  } else {
    throw PythonError{fmt::format("'{}' object is not iterable", python_type_name(j))};
  }
  return items;
}

/// `subject.name` / `subject[key]` as jinja2's environment looks it up: a dict's key (any key equal to it:
/// d[1], d[1.0] and d[True] are one, d['1'] another; a namespace's attribute only by name), a list's or string's
/// element (negative from the end); else Undefined naming what was missing.
inline Value member(const Value& subject, const Json& key) {
  const auto& j = subject.json;
  require_defined(subject);  // jinja2's Undefined raises on any attribute or item
  if (subject.bound_method)
    return Value::missing(fmt::format("'builtin_function_or_method object' has no attribute {}", python_repr(key)));
  if (j.is_object() && (key.is_string() || !is_namespace(j))) {
    const auto it = find_key(j, key);
    if (it != j.end() && !it->is_binary()) return Value::of(*it);
  } else if ((j.is_array() || j.is_string()) && key.is_number_integer()) {
    auto i = key.get<std::int64_t>();
    if (j.is_array()) {
      const auto size = static_cast<std::int64_t>(j.size());
      if (i < 0) i += size;
      if (i >= 0 && i < size) return Value::of(j[static_cast<std::size_t>(i)]);
    } else {
      const auto points = code_points(j.get_ref<const std::string&>());
      const auto size = static_cast<std::int64_t>(points.size());
      if (i < 0) i += size;
      if (i >= 0 && i < size) return Value::of(Json(points[static_cast<std::size_t>(i)]));
    }
  }
  const std::string owner = j.is_null() ? "None" : "'" + jinja_object_name(j) + "'";
  if (key.is_string()) return Value::missing(fmt::format("{} has no attribute {}", owner, python_repr(key)));
  return Value::missing(fmt::format("{} has no element {}", owner, python_repr(key)));
}

/// jinja2's attribute getter of selectattr, map, sort, ...: "a.b.0" walks dict keys and list indices.
inline Value attribute_path(const Json& item, const std::string& path) {
  Value value = Value::of(item);
  std::size_t begin = 0;
  while (true) {
    const auto dot = path.find('.', begin);
    const auto part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    std::int64_t index = 0;
    const auto [end, failure] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool digits = !part.empty() && failure == std::errc{} && end == part.data() + part.size() && part[0] != '-';
    if (value.undefined) return value;
    value = member(value, digits ? Json(index) : Json(part));
    if (dot == std::string::npos) return value;
    begin = dot + 1;
  }
}

inline std::int64_t length_of(const Value& value) {
  const auto& j = value.json;
  if (value.undefined) return 0;
  if (j.is_string()) return static_cast<std::int64_t>(code_point_count(j.get_ref<const std::string&>()));
  if (j.is_array()) return static_cast<std::int64_t>(j.size());
  if (j.is_object() && !is_namespace(j)) return static_cast<std::int64_t>(entry_count(j));
  throw PythonError{fmt::format("object of type '{}' has no len()", python_type_name(j))};
}

inline std::string string_argument(const Args& args, std::size_t index, std::string_view name,
                                   std::string fallback = {}) {
  const auto* value = args.get(index, name);
  if (!value || value->undefined) return fallback;
  if (!value->json.is_string())
    throw PythonError{fmt::format("'{}' must be a string, not {}", name, python_type_name(value->json))};
  return value->json.get<std::string>();
}
inline bool bool_argument(const Args& args, std::size_t index, std::string_view name, bool fallback) {
  const auto* value = args.get(index, name);
  return value ? truthy(*value) : fallback;
}

/// Sorting key of sort, dictsort, unique, min and max: strings lower-cased unless case_sensitive.
inline Json sort_key(const Json& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return Json(change_case(value.get<std::string>(), "lower"));
  return value;
}

}  // namespace detail

/// A test: `name` is the name it was called by (aliases and families share one function).
using TestFunction = bool (*)(const std::string& name, const Value& subject, const Args& args);

namespace detail {
/// The first argument of a comparison test.
inline const Value& test_argument(const std::string& name, const Args& args) {
  if (args.positional.empty()) throw PythonError{fmt::format("the test '{}' needs an argument", name)};
  return args.positional[0];
}
inline bool is_mapping(const Json& j) { return j.is_object() && !is_namespace(j); }

inline bool equal_test(const std::string& name, const Value& subject, const Args& args) {
  const auto& other = test_argument(name, args);
  const bool equal = python_equal(subject.json, other.json) && subject.undefined == other.undefined;
  return (name == "eq" || name == "equalto" || name == "==") == equal;
}
inline bool order_test(const std::string& name, const Value& subject, const Args& args) {
  const auto& other = test_argument(name, args).json;
  if (name == "lt" || name == "lessthan" || name == "<") return python_compare(subject.json, other, "<") < 0;
  if (name == "le" || name == "<=") return python_compare(subject.json, other, "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return python_compare(subject.json, other, ">") > 0;
  return python_compare(subject.json, other, ">=") >= 0;  // ge, >=
}
inline bool case_test(const std::string& name, const Value& subject, const Args&) {
  const auto s = soft_str(subject);
  return s == change_case(s, name) && s != change_case(s, name == "lower" ? "upper" : "lower");
}
inline bool parity_test(const std::string& name, const Value& subject, const Args&) {
  if (!subject.json.is_number_integer()) throw PythonError{fmt::format("the test '{}' needs an integer", name)};
  return (subject.json.get<std::int64_t>() % 2 != 0) == (name == "odd");
}
inline bool sameas_test(const std::string& name, const Value& subject, const Args& args) {
  // Python's `is`: None, True and False are singletons; other values are not shared here
  const auto& j = subject.json;
  const auto& other = test_argument(name, args).json;
  return !subject.undefined && (j.is_null() || j.is_boolean()) && j.type() == other.type() && j == other;
}
inline bool divisibleby_test(const std::string& name, const Value& subject, const Args& args) {
  const auto& d = test_argument(name, args).json;
  const auto& j = subject.json;
  if (!j.is_number_integer() || !d.is_number_integer() || d.get<std::int64_t>() == 0)
    throw PythonError{"divisibleby needs integers"};
  return j.get<std::int64_t>() % d.get<std::int64_t>() == 0;
}
inline bool in_test(const std::string& name, const Value& subject, const Args& args) {
  const auto& container = test_argument(name, args);
  if (container.undefined) return false;
  const auto& c = container.json;
  const auto& j = subject.json;
  if (c.is_array()) return std::any_of(c.begin(), c.end(), [&](const Json& x) { return python_equal(x, j); });
  if (c.is_string() && j.is_string())
    return c.get_ref<const std::string&>().find(j.get<std::string>()) != std::string::npos;
  if (is_mapping(c)) return !subject.undefined && !subject.bound_method && find_key(c, j) != c.end();
  throw PythonError{fmt::format("argument of type '{}' is not iterable", python_type_name(c))};
}
}  // namespace detail

/// The tests hpctrain implements (`subject is name(args)`), by name. The parser refuses any other name before
/// anything renders.
inline const std::map<std::string, TestFunction, std::less<>>& test_table() {
  using namespace detail;
  using N = const std::string&;  // the tests of the subject's kind alone ignore the name and the arguments
  using V = const Value&;
  using A = const Args&;
  static const std::map<std::string, TestFunction, std::less<>> table{
      {"defined", [](N, V v, A) { return !v.undefined; }},
      {"undefined", [](N, V v, A) { return v.undefined; }},
      {"none", [](N, V v, A) { return !v.undefined && v.json.is_null(); }},
      {"string", [](N, V v, A) { return !v.undefined && v.json.is_string(); }},
      {"mapping", [](N, V v, A) { return !v.undefined && is_mapping(v.json); }},
      {"sequence",
       [](N, V v, A) { return !v.undefined && (v.json.is_array() || v.json.is_string() || is_mapping(v.json)); }},
      {"iterable",
       [](N, V v, A) {
         return v.undefined || v.json.is_array() || v.json.is_string() || is_mapping(v.json);
       }},  // Undefined iterates
      {"number", [](N, V v, A) { return !v.undefined && is_python_number(v.json); }},
      {"integer", [](N, V v, A) { return !v.undefined && v.json.is_number_integer(); }},
      {"float", [](N, V v, A) { return !v.undefined && v.json.is_number_float(); }},
      {"boolean", [](N, V v, A) { return !v.undefined && v.json.is_boolean(); }},
      {"true", [](N, V v, A) { return !v.undefined && v.json.is_boolean() && v.json.get<bool>(); }},
      {"false", [](N, V v, A) { return !v.undefined && v.json.is_boolean() && !v.json.get<bool>(); }},
      {"callable", [](N, V, A) { return false; }},
      {"escaped", [](N, V, A) { return false; }},
      {"lower", case_test},
      {"upper", case_test},
      {"odd", parity_test},
      {"even", parity_test},
      {"eq", equal_test},
      {"equalto", equal_test},
      {"==", equal_test},
      {"ne", equal_test},
      {"!=", equal_test},
      {"sameas", sameas_test},
      {"lt", order_test},
      {"lessthan", order_test},
      {"<", order_test},
      {"le", order_test},
      {"<=", order_test},
      {"gt", order_test},
      {"greaterthan", order_test},
      {">", order_test},
      {"ge", order_test},
      {">=", order_test},
      {"divisibleby", divisibleby_test},
      {"in", in_test}};
  return table;
}

/// The test called `name` (`subject is name(args)`).
inline bool apply_test(const std::string& name, const Value& subject, const Args& args) {
  const auto& table = test_table();
  const auto it = table.find(name);
  if (it == table.end()) throw Unsupported{fmt::format("the test '{}'", name)};
  return it->second(name, subject, args);
}

namespace names {
inline const std::set<std::string, std::less<>>& tests() {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> keys;
    for (const auto& entry : test_table()) keys.insert(entry.first);
    return keys;
  }();
  return names;
}
}  // namespace names

}  // namespace hpctrain::text::jinja
