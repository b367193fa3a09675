#pragma once
// The built-in filters, tests and methods of the Jinja subset (text/chat_template.hpp), with jinja2 3.1's
// semantics in transformers' environment (its own tojson: json.dumps, no HTML escaping), applied to values
// already evaluated. The name tables say what is implemented and what jinja2 or Python know beside it: the
// parser refuses a filter, test or method hpctrain lacks before anything renders, and a name jinja2 itself
// does not know ("No filter named ...") the same way. Helpers throw PythonError (what jinja2 would raise) or
// Unsupported; the interpreter adds the line and column. Torch-free.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
inline const std::set<std::string, std::less<>>& filters() {
  static const std::set<std::string, std::less<>> names{
      "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "forceescape",
      "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
      "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim",
      "unique", "upper"};
  return names;
}
/// jinja2's other built-in filters: a template using one is refused as unsupported.
inline const std::set<std::string, std::less<>>& jinja_filters() {
  static const std::set<std::string, std::less<>> names{"batch", "center", "filesizeformat", "format", "groupby", "pprint", "random",
                                                        "slice", "striptags", "truncate", "urlencode", "urlize", "wordcount",
                                                        "wordwrap", "xmlattr"};
  return names;
}
inline const std::set<std::string, std::less<>>& tests() {
  static const std::set<std::string, std::less<>> names{
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "float", "ge", "greaterthan",
      "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
      "sequence", "string", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};
  return names;
}
inline const std::set<std::string, std::less<>>& jinja_tests() {
  static const std::set<std::string, std::less<>> names{"filter", "test"};
  return names;
}
/// Methods hpctrain implements, by the Python type that has them.
inline const std::set<std::string, std::less<>>& str_methods() {
  static const std::set<std::string, std::less<>> names{
      "capitalize", "count", "endswith", "find", "index", "isalnum", "isalpha", "isdigit", "islower", "isspace", "isupper", "join",
      "lower", "lstrip", "removeprefix", "removesuffix", "replace", "rfind", "rsplit", "rstrip", "split", "splitlines",
      "startswith", "strip", "title", "upper"};
  return names;
}
inline const std::set<std::string, std::less<>>& dict_methods() {
  static const std::set<std::string, std::less<>> names{"get", "items", "keys", "values"};
  return names;
}
inline const std::set<std::string, std::less<>>& list_methods() {
  static const std::set<std::string, std::less<>> names{"count", "index"};
  return names;
}
/// Python's other methods of str, list and dict, and the loop object's: known, not implemented (list.append and
/// dict.update also modify their object, which transformers' sandbox refuses).
inline const std::set<std::string, std::less<>>& python_methods() {
  static const std::set<std::string, std::less<>> names{
      "casefold", "center", "encode", "expandtabs", "format", "format_map", "isascii", "isdecimal", "isidentifier", "isnumeric",
      "isprintable", "istitle", "ljust", "maketrans", "partition", "rindex", "rjust", "rpartition", "swapcase", "translate",
      "zfill", "append", "clear", "copy", "extend", "insert", "pop", "remove", "reverse", "sort", "fromkeys", "popitem",
      "setdefault", "update", "cycle", "changed"};
  return names;
}
inline bool implemented_method(std::string_view name) {
  return str_methods().count(name) || dict_methods().count(name) || list_methods().count(name);
}
/// Python methods of str (all of them), which `'abc'.name` finds; and of dict and list.
inline bool python_has_method(const Json& subject, const std::string& name) {
  static const std::set<std::string, std::less<>> str_all{
      "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map", "index",
      "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace",
      "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace",
      "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
      "title", "translate", "upper", "zfill"};
  static const std::set<std::string, std::less<>> list_all{"append", "clear", "copy", "count", "extend", "index", "insert",
                                                            "pop", "remove", "reverse", "sort"};
  static const std::set<std::string, std::less<>> dict_all{"clear", "copy", "fromkeys", "get", "items", "keys", "pop",
                                                            "popitem", "setdefault", "update", "values"};
  if (subject.is_string()) return str_all.count(name) > 0;
  if (subject.is_array()) return list_all.count(name) > 0;
  if (subject.is_object() && !detail::is_namespace(subject)) return dict_all.count(name) > 0;
  return false;
}
}  // namespace names

namespace detail {

/// str() as jinja2's filters take it (soft_str): Undefined is "".
inline std::string soft_str(const Value& value) {
  if (value.bound_method) throw Unsupported{fmt::format("printing the method '{}' (Python prints its address)", value.why)};
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
    for_each_entry(j, [&](const std::string& key, const Json&) { items.emplace_back(key); });
  } else if (j.is_string()) {
    for (auto& c : code_points(j.get_ref<const std::string&>())) items.emplace_back(std::move(c));
  } else {
    throw PythonError{fmt::format("'{}' object is not iterable", python_type_name(j))};
  }
  return items;
}

/// `subject.name` / `subject[key]` as jinja2's environment looks it up: a dict's key (a namespace's
/// attribute), a list's or string's element (negative from the end); else Undefined naming what was missing.
inline Value member(const Value& subject, const Json& key) {
  const auto& j = subject.json;
  require_defined(subject);  // jinja2's Undefined raises on any attribute or item
  if (subject.bound_method) return Value::missing(fmt::format("'builtin_function_or_method object' has no attribute {}", python_repr(key)));
  if (j.is_object() && key.is_string()) {
    const auto it = j.find(key.get<std::string>());
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

inline std::string string_argument(const Args& args, std::size_t index, std::string_view name, std::string fallback = {}) {
  const auto* value = args.get(index, name);
  if (!value || value->undefined) return fallback;
  if (!value->json.is_string()) throw PythonError{fmt::format("'{}' must be a string, not {}", name, python_type_name(value->json))};
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

inline bool apply_test(const std::string& name, const Value& subject, const Args& args);

/// A filter applied to `subject`.
inline Value apply_filter(const std::string& name, const Value& subject, const Args& args) {
  using namespace detail;
  const auto& j = subject.json;
  if (name == "trim") {
    const auto* chars = args.get(0, "chars");
    auto text = strip_chars(soft_str(subject), chars && chars->json.is_string() ? chars->json.get<std::string>() : " \t\n\r\f\v", true, true);
    return subject.markup ? Value::safe(std::move(text)) : Value::of(Json(std::move(text)));
  }
  const auto keeping_markup = [&](std::string text) { return subject.markup ? Value::safe(std::move(text)) : Value::of(Json(std::move(text))); };
  if (name == "upper" || name == "lower" || name == "capitalize") return keeping_markup(change_case(soft_str(subject), name));
  if (name == "title") {  // jinja2's own rule: a word starts after whitespace, '-', '(', '{', '[' or '<'
    std::string out;
    bool start = true;
    for (const auto& point : code_points(soft_str(subject))) {
      const bool separator = point.size() == 1 && (std::isspace(static_cast<unsigned char>(point[0])) || std::string_view("-({[<").find(point[0]) != std::string_view::npos);
      out += separator ? point : change_case(point, start ? "upper" : "lower");
      start = separator;
    }
    return Value::of(Json(out));
  }
  if (name == "replace") {
    const auto* count = args.get(2, "count");
    const auto text = subject.undefined ? std::string() : python_str(j);
    const auto old_text = soft_str(args.get(0, "old") ? *args.get(0, "old") : Value::missing(""));
    const auto new_text = soft_str(args.get(1, "new") ? *args.get(1, "new") : Value::missing(""));
    return Value::of(Json(replace_all(text, old_text, new_text, count && count->json.is_number_integer() ? count->json.get<std::int64_t>() : -1)));
  }
  if (name == "string") return keeping_markup(soft_str(subject));
  if (name == "safe") return Value::safe(soft_str(subject));
  if (name == "e" || name == "escape" || name == "forceescape")
    return subject.markup && name != "forceescape" ? subject : Value::safe(html_escape(soft_str(subject)));
  if (name == "length" || name == "count") return Value::of(Json(length_of(subject)));
  if (name == "tojson") {
    JsonDumpOptions options;
    if (const auto* a = args.get(0, "ensure_ascii")) options.ensure_ascii = truthy(*a);
    if (const auto* indent = args.get(1, "indent"); indent && !indent->json.is_null()) {
      if (indent->json.is_number_integer()) options.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, indent->json.get<std::int64_t>())), ' ');
      else if (indent->json.is_string()) options.indent = indent->json.get<std::string>();
      else throw Unsupported{"tojson with an indent that is neither a number nor a string"};
    }
    if (const auto* separators = args.get(2, "separators"); separators && !separators->json.is_null()) {
      const auto& s = separators->json;
      if (!s.is_array() || s.size() != 2 || !s[0].is_string() || !s[1].is_string()) throw PythonError{"separators must be a pair of strings"};
      options.separators = std::pair(s[0].get<std::string>(), s[1].get<std::string>());
    }
    if (const auto* sort_keys = args.get(3, "sort_keys")) options.sort_keys = truthy(*sort_keys);
    if (subject.undefined) throw PythonError{"Object of type Undefined is not JSON serializable"};
    return Value::of(Json(json_dumps(j, options)));
  }
  if (name == "default" || name == "d") {
    if (subject.undefined || (bool_argument(args, 1, "boolean", false) && !truthy(subject))) {
      const auto* fallback = args.get(0, "default_value");
      return fallback ? *fallback : Value::of(Json(""));
    }
    return subject;
  }
  if (name == "first" || name == "last") {
    auto items = iterate(subject);
    if (items.empty()) return Value::missing(fmt::format("No {} item, sequence was empty.", name));
    return Value::of(name == "first" ? items.front() : items.back());
  }
  if (name == "list") {
    const auto items = iterate(subject);
    return Value::of(Json(Json::array_t(items.begin(), items.end())));
  }
  if (name == "items") {
    if (subject.undefined) return Value::of(Json::array());
    if (!j.is_object() || is_namespace(j)) throw PythonError{"Can only get item pairs from a mapping."};
    Json out = Json::array();
    for_each_entry(j, [&](const std::string& key, const Json& value) { out.push_back(Json::array({key, value})); });
    return Value::of(out);
  }
  if (name == "dictsort") {
    require_defined(subject);
    if (!j.is_object() || is_namespace(j)) throw PythonError{fmt::format("'{}' object has no attribute 'items'", python_type_name(j))};
    const bool case_sensitive = bool_argument(args, 0, "case_sensitive", false);
    const auto by = string_argument(args, 1, "by", "key");
    if (by != "key" && by != "value") throw PythonError{"You can only sort by either \"key\" or \"value\""};
    std::vector<std::pair<std::string, Json>> entries;
    for_each_entry(j, [&](const std::string& key, const Json& value) { entries.emplace_back(key, value); });
    std::stable_sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
      const Json x = by == "key" ? Json(a.first) : a.second, y = by == "key" ? Json(b.first) : b.second;
      return python_compare(sort_key(x, case_sensitive), sort_key(y, case_sensitive), "<") < 0;
    });
    if (bool_argument(args, 2, "reverse", false)) std::reverse(entries.begin(), entries.end());
    Json out = Json::array();
    for (auto& [key, value] : entries) out.push_back(Json::array({key, value}));
    return Value::of(out);
  }
  if (name == "reverse") {
    if (j.is_string()) {
      auto points = code_points(j.get_ref<const std::string&>());
      std::string out;
      for (auto it = points.rbegin(); it != points.rend(); ++it) out += *it;
      return Value::of(Json(out));
    }
    auto items = iterate(subject);
    std::reverse(items.begin(), items.end());
    return Value::of(Json(Json::array_t(items.begin(), items.end())));
  }
  if (name == "join") {
    const auto separator = soft_str(args.get(0, "d") ? *args.get(0, "d") : Value::of(Json("")));
    const auto* attribute = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(subject)) {
      const auto value = attribute ? attribute_path(item, soft_str(*attribute)) : Value::of(item);
      out += (first ? "" : separator) + soft_str(value);
      first = false;
    }
    return Value::of(Json(out));
  }
  if (name == "int" || name == "float") {
    double x = 0;
    if (is_python_number(j)) x = as_double(j);
    else if (j.is_string()) {
      const auto& s = j.get_ref<const std::string&>();
      char* end = nullptr;
      x = std::strtod(s.c_str(), &end);
      while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
      if (end == s.c_str() || *end != '\0') x = 0;  // Python's float() refuses it: the filter's default
    }
    // Outside 64 bits (or not a number) int gives its default, 0: the cast would be undefined.
    const bool fits = std::isfinite(x) && std::abs(x) < 9.2e18;
    if (name == "int" && j.is_number_integer()) return Value::of(j);
    return name == "int" ? Value::of(Json(fits ? static_cast<std::int64_t>(x) : std::int64_t{0})) : Value::of(Json(x));
  }
  if (name == "abs") {
    if (j.is_number_integer()) return Value::of(Json(std::abs(j.get<std::int64_t>())));
    if (is_python_number(j)) return Value::of(j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : Json(std::abs(j.get<double>())));
    throw PythonError{fmt::format("bad operand type for abs(): '{}'", python_type_name(j))};
  }
  if (name == "round") {
    const auto* precision = args.get(0, "precision");
    const auto method = string_argument(args, 1, "method", "common");
    if (!is_python_number(j)) throw PythonError{fmt::format("type {} doesn't define __round__ method", python_type_name(j))};
    const std::int64_t digits = precision && precision->json.is_number_integer() ? precision->json.get<std::int64_t>() : 0;
    if (digits < 0 || digits > 15) throw Unsupported{"round() to a precision outside 0 to 15 digits"};
    if (method == "common") {
      if (!j.is_number_float()) return Value::of(j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : j);  // round(int) is the int
      // Python's round(): the exact binary value rounded to the nearest decimal, ties to even (printf does the same)
      char buffer[400];
      std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(digits), j.get<double>());
      return Value::of(Json(std::strtod(buffer, nullptr)));
    }
    const double scale = std::pow(10.0, static_cast<double>(digits));
    if (method == "ceil") return Value::of(Json(std::ceil(as_double(j) * scale) / scale));
    if (method == "floor") return Value::of(Json(std::floor(as_double(j) * scale) / scale));
    throw PythonError{"method must be common, ceil or floor"};
  }
  if (name == "indent") {
    const auto* width = args.get(0, "width");
    std::string pad(4, ' ');
    if (width && width->json.is_string()) pad = width->json.get<std::string>();
    else if (width && width->json.is_number_integer()) pad = std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, width->json.get<std::int64_t>())), ' ');
    const bool first = bool_argument(args, 1, "first", false), blank = bool_argument(args, 2, "blank", false);
    std::vector<std::string> lines;
    const auto s = soft_str(subject) + "\n";  // jinja2 appends a newline so that splitlines keeps a trailing empty line
    std::size_t begin = 0;
    for (std::size_t at; (at = s.find('\n', begin)) != std::string::npos; begin = at + 1) lines.push_back(s.substr(begin, at - begin));
    std::string out = lines.front();
    for (std::size_t k = 1; k < lines.size(); ++k) out += "\n" + (blank || !lines[k].empty() ? pad + lines[k] : lines[k]);
    return Value::of(Json(first ? pad + out : out));
  }
  if (name == "attr") return member(subject, Json(string_argument(args, 0, "name")));
  // jinja2's map, select, reject, selectattr and rejectattr start with `if value:`: None gives nothing.
  if ((name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") && !truthy(subject))
    return Value::of(Json::array());
  if (name == "map") {
    Json out = Json::array();
    const auto items = iterate(subject);
    if (const auto* attribute = args.get(99, "attribute")) {
      const auto* fallback = args.get(99, "default");
      for (const auto& item : items) {
        auto value = attribute_path(item, soft_str(*attribute));
        out.push_back(value.undefined && fallback ? fallback->json : value.json);
      }
      return Value::of(out);
    }
    if (args.positional.empty() || !args.positional[0].json.is_string()) throw PythonError{"map requires a filter argument"};
    const auto filter = args.positional[0].json.get<std::string>();
    if (!names::filters().count(filter)) throw Unsupported{fmt::format("map() with the filter '{}'", filter)};
    Args rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()), args.keyword};
    for (const auto& item : items) out.push_back(apply_filter(filter, Value::of(item), rest).json);
    return Value::of(out);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attribute = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "select" || name == "selectattr";
    std::size_t at = 0;
    std::string attribute;
    if (by_attribute) {
      if (args.positional.empty() || !args.positional[0].json.is_string()) throw PythonError{"selectattr needs an attribute name"};
      attribute = args.positional[at++].json.get<std::string>();
    }
    std::string test;
    if (at < args.positional.size()) {
      if (!args.positional[at].json.is_string()) throw PythonError{"the test name must be a string"};
      test = args.positional[at++].json.get<std::string>();
      if (!names::tests().count(test)) throw Unsupported{fmt::format("{}() with the test '{}'", name, test)};
    }
    Args test_args{std::vector<Value>(args.positional.begin() + static_cast<long>(std::min(at, args.positional.size())), args.positional.end()), {}};
    Json out = Json::array();
    for (const auto& item : iterate(subject)) {
      const auto value = by_attribute ? attribute_path(item, attribute) : Value::of(item);
      const bool ok = test.empty() ? truthy(value) : apply_test(test, value, test_args);
      if (ok == keep) out.push_back(item);
    }
    return Value::of(out);
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool case_sensitive = bool_argument(args, name == "sort" ? 1 : 0, "case_sensitive", false);
    const auto* attribute = args.get(name == "sort" ? 2 : 1, "attribute");
    const auto key_of = [&](const Json& item) {
      return sort_key(attribute ? attribute_path(item, soft_str(*attribute)).json : item, case_sensitive);
    };
    auto items = iterate(subject);
    if (name == "unique") {
      Json out = Json::array();
      std::vector<Json> seen;
      for (const auto& item : items) {
        const auto key = key_of(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Json& s) { return python_equal(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::of(out);
    }
    // Python's sorted() is stable either way: equal items keep their order under reverse=True too.
    const bool descending = name == "sort" && bool_argument(args, 0, "reverse", false);
    std::stable_sort(items.begin(), items.end(), [&](const Json& a, const Json& b) {
      const int c = python_compare(key_of(a), key_of(b), "<");
      return descending ? c > 0 : c < 0;
    });
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::missing(fmt::format("No aggregated item, sequence was empty."));
      if (name == "min") return Value::of(items.front());
      // max: the first of the largest, as Python's max() keeps it
      auto best = items.back();
      for (const auto& item : items)
        if (python_equal(key_of(item), key_of(best))) return Value::of(item);
      return Value::of(best);
    }
    return Value::of(Json(Json::array_t(items.begin(), items.end())));
  }
  if (name == "sum") {
    const auto* attribute = args.get(0, "attribute");
    const auto* start = args.get(1, "start");
    Json total = start ? start->json : Json(0);
    for (const auto& item : iterate(subject)) {
      const auto value = attribute ? attribute_path(item, soft_str(*attribute)).json : item;
      if (!is_python_number(total) || !is_python_number(value))
        throw PythonError{fmt::format("unsupported operand type(s) for +: '{}' and '{}'", python_type_name(total), python_type_name(value))};
      if (total.is_number_integer() && value.is_number_integer()) total = total.get<std::int64_t>() + value.get<std::int64_t>();
      else total = as_double(total) + as_double(value);
    }
    return Value::of(total);
  }
  throw Unsupported{fmt::format("the filter '{}'", name)};
}

/// A test (`subject is name(args)`).
inline bool apply_test(const std::string& name, const Value& subject, const Args& args) {
  using namespace detail;
  const auto& j = subject.json;
  const auto argument = [&]() -> const Value& {
    if (args.positional.empty()) throw PythonError{fmt::format("the test '{}' needs an argument", name)};
    return args.positional[0];
  };
  const bool defined = !subject.undefined;
  if (name == "defined") return defined;
  if (name == "undefined") return !defined;
  if (name == "none") return defined && j.is_null();
  if (name == "string") return defined && j.is_string();
  if (name == "mapping") return defined && j.is_object() && !is_namespace(j);
  if (name == "sequence") return defined && (j.is_array() || j.is_string() || (j.is_object() && !is_namespace(j)));
  if (name == "iterable") return !defined || j.is_array() || j.is_string() || (j.is_object() && !is_namespace(j));  // Undefined iterates
  if (name == "number") return defined && is_python_number(j);
  if (name == "integer") return defined && j.is_number_integer();
  if (name == "float") return defined && j.is_number_float();
  if (name == "boolean") return defined && j.is_boolean();
  if (name == "true") return defined && j.is_boolean() && j.get<bool>();
  if (name == "false") return defined && j.is_boolean() && !j.get<bool>();
  if (name == "callable" || name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    const auto s = soft_str(subject);
    return s == change_case(s, name) && s != change_case(s, name == "lower" ? "upper" : "lower");
  }
  if (name == "odd" || name == "even") {
    if (!j.is_number_integer()) throw PythonError{fmt::format("the test '{}' needs an integer", name)};
    return (j.get<std::int64_t>() % 2 != 0) == (name == "odd");
  }
  if (name == "eq" || name == "equalto" || name == "==") return python_equal(j, argument().json) && defined == !argument().undefined;
  if (name == "ne" || name == "!=") return !(python_equal(j, argument().json) && defined == !argument().undefined);
  if (name == "sameas") {  // Python's `is`: None, True and False are singletons; other values are not shared here
    const auto& other = argument().json;
    return defined && (j.is_null() || j.is_boolean()) && j.type() == other.type() && j == other;
  }
  if (name == "lt" || name == "lessthan" || name == "<") return python_compare(j, argument().json, "<") < 0;
  if (name == "le" || name == "<=") return python_compare(j, argument().json, "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return python_compare(j, argument().json, ">") > 0;
  if (name == "ge" || name == ">=") return python_compare(j, argument().json, ">=") >= 0;
  if (name == "divisibleby") {
    const auto& d = argument().json;
    if (!j.is_number_integer() || !d.is_number_integer() || d.get<std::int64_t>() == 0) throw PythonError{"divisibleby needs integers"};
    return j.get<std::int64_t>() % d.get<std::int64_t>() == 0;
  }
  if (name == "in") {
    const auto& container = argument();
    if (container.undefined) return false;
    const auto& c = container.json;
    if (c.is_array()) return std::any_of(c.begin(), c.end(), [&](const Json& x) { return python_equal(x, j); });
    if (c.is_string() && j.is_string()) return c.get_ref<const std::string&>().find(j.get<std::string>()) != std::string::npos;
    if (c.is_object() && !is_namespace(c)) return j.is_string() && c.contains(j.get<std::string>());
    throw PythonError{fmt::format("argument of type '{}' is not iterable", python_type_name(c))};
  }
  throw Unsupported{fmt::format("the test '{}'", name)};
}

/// `subject.name(args)` for str, dict and list subjects.
inline Value call_method(const Value& subject, const std::string& name, const Args& args) {
  using namespace detail;
  const auto& j = subject.json;
  require_defined(subject);
  if (subject.markup) {  // Markup's methods return Markup, and some escape their arguments
    static const std::set<std::string, std::less<>> keep{"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize"};
    static const std::set<std::string, std::less<>> plain{"startswith", "endswith", "find", "rfind", "count", "index", "isalnum", "isalpha",
                                                          "isdigit", "islower", "isspace", "isupper"};
    if (keep.count(name)) {
      auto unmarked = subject;
      unmarked.markup = false;
      return Value::safe(call_method(unmarked, name, args).json.get<std::string>());
    }
    if (!plain.count(name)) throw Unsupported{fmt::format("the method '{}' of a Markup string (from |safe or |escape)", name)};
  }
  if (!names::python_has_method(j, name))
    throw PythonError{fmt::format("'{}' has no attribute '{}'", j.is_null() ? "None" : jinja_object_name(j), name)};
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    const std::string whitespace = " \t\n\r\f\v";
    const auto text = [&](std::size_t index, std::string_view key) {
      const auto* value = args.get(index, key);
      if (!value) throw PythonError{fmt::format("{}() missing the argument '{}'", name, key)};
      if (!value->json.is_string()) throw PythonError{fmt::format("must be str, not {}", value->undefined ? "Undefined" : python_type_name(value->json))};
      return value->json.get<std::string>();
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const auto* chars = args.get(0, "chars");
      const auto set = chars && chars->json.is_string() ? chars->json.get<std::string>() : whitespace;
      return Value::of(Json(strip_chars(s, set, name != "rstrip", name != "lstrip")));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") return Value::of(Json(change_case(s, name)));
    if (name == "startswith" || name == "endswith") {
      const auto* affix = args.get(0, "prefix");
      if (!affix) throw PythonError{fmt::format("{}() takes at least 1 argument (0 given)", name)};
      std::vector<std::string> candidates;
      if (affix->json.is_string()) candidates.push_back(affix->json.get<std::string>());
      else if (affix->json.is_array() && std::all_of(affix->json.begin(), affix->json.end(), [](const Json& x) { return x.is_string(); }))
        for (const auto& x : affix->json) candidates.push_back(x.get<std::string>());
      else throw PythonError{fmt::format("{} first arg must be str or a tuple of str, not {}", name, python_type_name(affix->json))};
      const bool ok = std::any_of(candidates.begin(), candidates.end(), [&](const std::string& a) {
        return s.size() >= a.size() && (name == "startswith" ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
      });
      return Value::of(Json(ok));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const auto affix = text(0, "prefix");
      if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value::of(Json(s.substr(affix.size())));
      if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0)
        return Value::of(Json(s.substr(0, s.size() - affix.size())));
      return Value::of(j);
    }
    if (name == "replace") {
      const auto* count = args.get(2, "count");
      return Value::of(Json(replace_all(s, text(0, "old"), text(1, "new"), count && count->json.is_number_integer() ? count->json.get<std::int64_t>() : -1)));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      const auto needle = text(0, "sub");
      if (name == "count") {
        if (needle.empty()) return Value::of(Json(static_cast<std::int64_t>(code_point_count(s) + 1)));
        std::int64_t n = 0;
        for (std::size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + needle.size())) ++n;
        return Value::of(Json(n));
      }
      const auto at = name == "rfind" ? s.rfind(needle) : s.find(needle);
      if (at == std::string::npos) {
        if (name == "index") throw PythonError{"substring not found"};
        return Value::of(Json(-1));
      }
      return Value::of(Json(static_cast<std::int64_t>(code_point_count(std::string_view(s).substr(0, at)))));
    }
    if (name == "join") {
      const auto* items = args.get(0, "iterable");
      if (!items) throw PythonError{"join() takes exactly one argument (0 given)"};
      std::string out;
      bool first = true;
      for (const auto& item : iterate(*items)) {
        if (!item.is_string()) throw PythonError{fmt::format("sequence item: expected str instance, {} found", python_type_name(item))};
        out += (first ? "" : s) + item.get<std::string>();
        first = false;
      }
      return Value::of(Json(out));
    }
    if (name == "split" || name == "rsplit") {
      const auto* separator = args.get(0, "sep");
      const auto* limit = args.get(1, "maxsplit");
      std::int64_t maxsplit = limit && limit->json.is_number_integer() ? limit->json.get<std::int64_t>() : -1;
      std::vector<std::string> parts;
      if (!separator || separator->json.is_null()) {  // runs of whitespace, none at the ends
        std::vector<std::pair<std::size_t, std::size_t>> words;
        for (std::size_t i = 0; i < s.size();) {
          while (i < s.size() && whitespace.find(s[i]) != std::string::npos) ++i;
          std::size_t k = i;
          while (k < s.size() && whitespace.find(s[k]) == std::string::npos) ++k;
          if (k > i) words.emplace_back(i, k);
          i = k;
        }
        if (maxsplit < 0 || static_cast<std::size_t>(maxsplit) + 1 >= words.size()) {
          for (const auto& [b, e] : words) parts.push_back(s.substr(b, e - b));
        } else if (name == "split") {
          for (std::size_t k = 0; k < static_cast<std::size_t>(maxsplit); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
          parts.push_back(strip_chars(s.substr(words[static_cast<std::size_t>(maxsplit)].first), whitespace, false, true));
        } else {
          const auto first = words.size() - static_cast<std::size_t>(maxsplit);
          parts.push_back(strip_chars(s.substr(0, words[first - 1].second), whitespace, true, false));
          for (std::size_t k = first; k < words.size(); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
        }
      } else {
        const auto sep = text(0, "sep");
        if (sep.empty()) throw PythonError{"empty separator"};
        std::vector<std::size_t> cuts;
        for (std::size_t at = s.find(sep); at != std::string::npos; at = s.find(sep, at + sep.size())) cuts.push_back(at);
        if (maxsplit >= 0 && cuts.size() > static_cast<std::size_t>(maxsplit)) {
          if (name == "split") cuts.resize(static_cast<std::size_t>(maxsplit));
          else cuts.erase(cuts.begin(), cuts.end() - maxsplit);
        }
        std::size_t begin = 0;
        for (const auto at : cuts) {
          parts.push_back(s.substr(begin, at - begin));
          begin = at + sep.size();
        }
        parts.push_back(s.substr(begin));
      }
      Json out = Json::array();
      for (auto& part : parts) out.push_back(std::move(part));
      return Value::of(out);
    }
    if (name == "splitlines") {
      Json out = Json::array();
      const bool keepends = bool_argument(args, 0, "keepends", false);
      std::size_t begin = 0;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\n' && s[i] != '\r') continue;
        const std::size_t end = s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n' ? i + 2 : i + 1;
        out.push_back(s.substr(begin, (keepends ? end : i) - begin));
        begin = end;
        i = end - 1;
      }
      if (begin < s.size()) out.push_back(s.substr(begin));
      return Value::of(out);
    }
    if (name.rfind("is", 0) == 0) {
      if (s.empty()) return Value::of(Json(false));
      if (!is_ascii(s)) throw Unsupported{fmt::format("{}() of text with non-ASCII characters", name)};
      bool ok = true, cased = false;
      for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (name == "isdigit") ok = ok && std::isdigit(u);
        else if (name == "isalpha") ok = ok && std::isalpha(u);
        else if (name == "isalnum") ok = ok && std::isalnum(u);
        else if (name == "isspace") ok = ok && std::isspace(u);
        else if (name == "isupper") ok = ok && !std::islower(u), cased = cased || std::isupper(u);
        else if (name == "islower") ok = ok && !std::isupper(u), cased = cased || std::islower(u);
      }
      return Value::of(Json(ok && (cased || (name != "isupper" && name != "islower"))));
    }
  }
  if (j.is_object()) {
    if (name == "get") {
      const auto* key = args.get(0, "key");
      if (!key) throw PythonError{"get expected at least 1 argument, got 0"};
      const auto it = key->json.is_string() ? j.find(key->json.get<std::string>()) : j.end();
      if (it != j.end()) return Value::of(*it);
      const auto* fallback = args.get(1, "default");
      return fallback ? *fallback : Value::none();
    }
    if (name == "items" || name == "keys" || name == "values") {
      Json out = Json::array();
      for_each_entry(j, [&](const std::string& key, const Json& value) {
        out.push_back(name == "items" ? Json::array({key, value}) : name == "keys" ? Json(key) : value);
      });
      return Value::of(out);
    }
  }
  if (j.is_array()) {
    const auto* needle = args.get(0, "value");
    if (!needle) throw PythonError{fmt::format("{}() takes exactly one argument (0 given)", name)};
    std::int64_t count = 0;
    for (std::size_t i = 0; i < j.size(); ++i) {
      if (!python_equal(j[i], needle->json)) continue;
      if (name == "index") return Value::of(Json(static_cast<std::int64_t>(i)));
      ++count;
    }
    if (name == "count") return Value::of(Json(count));
    throw PythonError{fmt::format("{} is not in list", python_repr(needle->json))};
  }
  throw Unsupported{fmt::format("the method '{}' of {}", name, python_type_name(j))};
}

}  // namespace hpctrain::text::jinja
