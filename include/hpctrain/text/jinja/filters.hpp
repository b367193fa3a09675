#pragma once
// The built-in filters of the Jinja subset (text/chat_template.hpp), each a function of its own, found by name in
// one table: what the parser accepts (names::filters()) and what the interpreter calls are the same entries.
// jinja2 3.1's semantics in transformers' environment (its own tojson: json.dumps, no HTML escaping). Helpers
// throw PythonError (what jinja2 would raise) or Unsupported; the interpreter adds the line and column. Torch-free.
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
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/text/jinja/builtins.hpp>

namespace hpctrain::text::jinja {

/// A filter: `name` is the name it was called by (aliases and families share one function).
using FilterFunction = Value (*)(const std::string& name, const Value& subject, const Args& args);

namespace filters {
using namespace detail;

inline const std::map<std::string, FilterFunction, std::less<>>& filter_table();

/// `text` as a value of the subject's kind: Markup stays Markup.
inline Value keeping_markup(const Value& subject, std::string text) {
  return subject.markup ? Value::safe(std::move(text)) : Value::of(Json(std::move(text)));
}

/// trim(chars): both ends stripped, Markup kept.
inline Value trim(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto* chars = args.get(0, "chars");
  return keeping_markup(
      subject,
      strip_chars(soft_str(subject), chars && chars->json.is_string() ? chars->json.get<std::string>() : " \t\n\r\f\v",
                  true, true));
}

/// upper, lower, capitalize.
inline Value change_case_filter(const std::string& name, const Value& subject, const Args& /*args*/) {
  return keeping_markup(subject, change_case(soft_str(subject), name));
}

/// title: jinja2's own rule, a word starts after whitespace, '-', '(', '{', '[' or '<'.
inline Value title(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  std::string out;
  bool start = true;
  for (const auto& point : code_points(soft_str(subject))) {
    const bool separator = point.size() == 1 && (std::isspace(static_cast<unsigned char>(point[0])) ||
                                                 std::string_view("-({[<").find(point[0]) != std::string_view::npos);
    out += separator ? point : change_case(point, start ? "upper" : "lower");
    start = separator;
  }
  return Value::of(Json(out));
}

/// replace(old, new, count).
inline Value replace(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto& j = subject.json;
  const auto* count = args.get(2, "count");
  const auto text = subject.undefined ? std::string() : python_str(j);
  const auto old_text = soft_str(args.get(0, "old") ? *args.get(0, "old") : Value::missing(""));
  const auto new_text = soft_str(args.get(1, "new") ? *args.get(1, "new") : Value::missing(""));
  return Value::of(Json(replace_all(text, old_text, new_text,
                                    count && count->json.is_number_integer() ? count->json.get<std::int64_t>() : -1)));
}

/// string: str(), Markup kept.
inline Value string(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  return keeping_markup(subject, soft_str(subject));
}

/// safe: marked as Markup.
inline Value safe(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  return Value::safe(soft_str(subject));
}

/// e, escape (Markup as it is), forceescape.
inline Value escape(const std::string& name, const Value& subject, const Args& /*args*/) {
  return subject.markup && name != "forceescape" ? subject : Value::safe(html_escape(soft_str(subject)));
}

/// length, count.
inline Value length(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  return Value::of(Json(length_of(subject)));
}

/// tojson(ensure_ascii, indent, separators, sort_keys): transformers' own, json.dumps without HTML escaping.
inline Value tojson(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto& j = subject.json;
  JsonDumpOptions options;
  if (const auto* a = args.get(0, "ensure_ascii")) options.ensure_ascii = truthy(*a);
  if (const auto* indent = args.get(1, "indent"); indent && !indent->json.is_null()) {
    if (indent->json.is_number_integer()) options.indent = spaces(indent->json.get<std::int64_t>());
    else if (indent->json.is_string()) options.indent = indent->json.get<std::string>();
    else throw Unsupported{"tojson with an indent that is neither a number nor a string"};
  }
  if (const auto* separators = args.get(2, "separators"); separators && !separators->json.is_null()) {
    const auto& s = separators->json;
    if (!s.is_array() || s.size() != 2 || !s[0].is_string() || !s[1].is_string())
      throw PythonError{"separators must be a pair of strings"};
    options.separators = std::pair(s[0].get<std::string>(), s[1].get<std::string>());
  }
  if (const auto* sort_keys = args.get(3, "sort_keys")) options.sort_keys = truthy(*sort_keys);
  if (subject.undefined) throw PythonError{"Object of type Undefined is not JSON serializable"};
  return Value::of(Json(json_dumps(j, options)));
}

/// default(default_value, boolean), d.
inline Value default_filter(const std::string& /*name*/, const Value& subject, const Args& args) {
  if (subject.undefined || (bool_argument(args, 1, "boolean", false) && !truthy(subject))) {
    const auto* fallback = args.get(0, "default_value");
    return fallback ? *fallback : Value::of(Json(""));
  }
  return subject;
}

/// first, last: Undefined for an empty sequence.
inline Value first_or_last(const std::string& name, const Value& subject, const Args& /*args*/) {
  auto items = iterate(subject);
  if (items.empty()) return Value::missing(fmt::format("No {} item, sequence was empty.", name));
  return Value::of(name == "first" ? items.front() : items.back());
}

/// list.
inline Value list(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  const auto items = iterate(subject);
  return Value::of(Json(Json::array_t(items.begin(), items.end())));
}

/// items: a mapping's (key, value) pairs.
inline Value items(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  const auto& j = subject.json;
  if (subject.undefined) return Value::of(Json::array());
  if (!j.is_object() || is_namespace(j)) throw PythonError{"Can only get item pairs from a mapping."};
  Json out = Json::array();
  for_each_entry(j, [&](const Json& key, const Json& value) { out.push_back(Json::array({key, value})); });
  return Value::of(out);
}

/// dictsort(case_sensitive, by, reverse): Python's sorted(items, key=..., reverse=...), so keys of different kinds
/// (1 and 'a') raise its TypeError, and equal ones keep their order under reverse too.
inline Value dictsort(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto& j = subject.json;
  require_defined(subject);
  if (!j.is_object() || is_namespace(j))
    throw PythonError{fmt::format("'{}' object has no attribute 'items'", python_type_name(j))};
  const bool case_sensitive = bool_argument(args, 0, "case_sensitive", false);
  const auto by = string_argument(args, 1, "by", "key");
  if (by != "key" && by != "value") throw PythonError{"You can only sort by either \"key\" or \"value\""};
  const bool descending = bool_argument(args, 2, "reverse", false);
  std::vector<std::pair<Json, Json>> entries;
  for_each_entry(j, [&](const Json& key, const Json& value) { entries.emplace_back(key, value); });
  std::stable_sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
    const auto& x = by == "key" ? a.first : a.second;
    const auto& y = by == "key" ? b.first : b.second;
    const int c = python_compare(sort_key(x, case_sensitive), sort_key(y, case_sensitive), "<");
    return descending ? c > 0 : c < 0;
  });
  Json out = Json::array();
  for (auto& [key, value] : entries) out.push_back(Json::array({key, value}));
  return Value::of(out);
}

/// reverse: a string's code points or a sequence's items in reverse.
inline Value reverse(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  const auto& j = subject.json;
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

/// join(d, attribute).
inline Value join(const std::string& /*name*/, const Value& subject, const Args& args) {
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

/// int, float: Python's conversion, the filter's default (0) where it fails.
inline Value number(const std::string& name, const Value& subject, const Args& /*args*/) {
  const auto& j = subject.json;
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

/// abs.
inline Value abs(const std::string& /*name*/, const Value& subject, const Args& /*args*/) {
  const auto& j = subject.json;
  if (j.is_number_integer()) return Value::of(Json(std::abs(j.get<std::int64_t>())));
  if (is_python_number(j))
    return Value::of(j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : Json(std::abs(j.get<double>())));
  throw PythonError{fmt::format("bad operand type for abs(): '{}'", python_type_name(j))};
}

/// round(precision, method).
inline Value round(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto& j = subject.json;
  const auto* precision = args.get(0, "precision");
  const auto method = string_argument(args, 1, "method", "common");
  if (!is_python_number(j))
    throw PythonError{fmt::format("type {} doesn't define __round__ method", python_type_name(j))};
  const std::int64_t digits =
      precision && precision->json.is_number_integer() ? precision->json.get<std::int64_t>() : 0;
  if (digits < 0 || digits > 15) throw Unsupported{"round() to a precision outside 0 to 15 digits"};
  if (method == "common") {
    if (!j.is_number_float())
      return Value::of(j.is_boolean() ? Json(j.get<bool>() ? 1 : 0) : j);  // round(int) is the int
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

/// indent(width, first, blank).
inline Value indent(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto* width = args.get(0, "width");
  std::string pad(4, ' ');
  if (width && width->json.is_string()) pad = width->json.get<std::string>();
  else if (width && width->json.is_number_integer()) pad = spaces(width->json.get<std::int64_t>());
  const bool first = bool_argument(args, 1, "first", false), blank = bool_argument(args, 2, "blank", false);
  std::vector<std::string> lines;
  const auto s = soft_str(subject) + "\n";  // jinja2 appends a newline so that splitlines keeps a trailing empty line
  std::size_t begin = 0;
  for (std::size_t at; (at = s.find('\n', begin)) != std::string::npos; begin = at + 1)
    lines.push_back(s.substr(begin, at - begin));
  std::string out = lines.front();
  for (std::size_t k = 1; k < lines.size(); ++k) out += "\n" + (blank || !lines[k].empty() ? pad + lines[k] : lines[k]);
  return Value::of(Json(first ? pad + out : out));
}

/// attr(name).
inline Value attr(const std::string& /*name*/, const Value& subject, const Args& args) {
  return member(subject, Json(string_argument(args, 0, "name")));
}

/// map(attribute, default) or map(filter, args...).
inline Value map(const std::string& /*name*/, const Value& subject, const Args& args) {
  if (!truthy(subject)) return Value::of(Json::array());  // jinja2's map starts with `if value:`: None gives nothing
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
  if (args.positional.empty() || !args.positional[0].json.is_string())
    throw PythonError{"map requires a filter argument"};
  const auto filter = args.positional[0].json.get<std::string>();
  if (!filter_table().count(filter)) throw Unsupported{fmt::format("map() with the filter '{}'", filter)};
  Args rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()), args.keyword};
  for (const auto& item : items) out.push_back(filter_table().find(filter)->second(filter, Value::of(item), rest).json);
  return Value::of(out);
}

/// select, reject (by a test), selectattr, rejectattr (by a test of an attribute).
inline Value select(const std::string& name, const Value& subject, const Args& args) {
  if (!truthy(subject)) return Value::of(Json::array());  // as map: None gives nothing
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  std::size_t at = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].json.is_string())
      throw PythonError{"selectattr needs an attribute name"};
    attribute = args.positional[at++].json.get<std::string>();
  }
  std::string test;
  if (at < args.positional.size()) {
    if (!args.positional[at].json.is_string()) throw PythonError{"the test name must be a string"};
    test = args.positional[at++].json.get<std::string>();
    if (!names::tests().count(test)) throw Unsupported{fmt::format("{}() with the test '{}'", name, test)};
  }
  Args test_args{std::vector<Value>(args.positional.begin() + static_cast<long>(std::min(at, args.positional.size())),
                                    args.positional.end()),
                 {}};
  Json out = Json::array();
  for (const auto& item : iterate(subject)) {
    const auto value = by_attribute ? attribute_path(item, attribute) : Value::of(item);
    const bool ok = test.empty() ? truthy(value) : apply_test(test, value, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::of(out);
}

/// sort(reverse, case_sensitive, attribute), unique, min, max.
inline Value ordering(const std::string& name, const Value& subject, const Args& args) {
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

/// sum(attribute, start).
inline Value sum(const std::string& /*name*/, const Value& subject, const Args& args) {
  const auto* attribute = args.get(0, "attribute");
  const auto* start = args.get(1, "start");
  Json total = start ? start->json : Json(0);
  for (const auto& item : iterate(subject)) {
    const auto value = attribute ? attribute_path(item, soft_str(*attribute)).json : item;
    if (!is_python_number(total) || !is_python_number(value))
      throw PythonError{fmt::format("unsupported operand type(s) for +: '{}' and '{}'", python_type_name(total),
                                    python_type_name(value))};
    if (total.is_number_integer() && value.is_number_integer())
      total = total.get<std::int64_t>() + value.get<std::int64_t>();
    else total = as_double(total) + as_double(value);
  }
  return Value::of(total);
}

/// The filters hpctrain implements, by name (aliases share a function, which the name tells apart). The parser
/// refuses any other name before anything renders.
inline const std::map<std::string, FilterFunction, std::less<>>& filter_table() {
  static const std::map<std::string, FilterFunction, std::less<>> table{{"abs", abs},
                                                                        {"attr", attr},
                                                                        {"capitalize", change_case_filter},
                                                                        {"count", length},
                                                                        {"d", default_filter},
                                                                        {"default", default_filter},
                                                                        {"dictsort", dictsort},
                                                                        {"e", escape},
                                                                        {"escape", escape},
                                                                        {"first", first_or_last},
                                                                        {"float", number},
                                                                        {"forceescape", escape},
                                                                        {"indent", indent},
                                                                        {"int", number},
                                                                        {"items", items},
                                                                        {"join", join},
                                                                        {"last", first_or_last},
                                                                        {"length", length},
                                                                        {"list", list},
                                                                        {"lower", change_case_filter},
                                                                        {"map", map},
                                                                        {"max", ordering},
                                                                        {"min", ordering},
                                                                        {"reject", select},
                                                                        {"rejectattr", select},
                                                                        {"replace", replace},
                                                                        {"reverse", reverse},
                                                                        {"round", round},
                                                                        {"safe", safe},
                                                                        {"select", select},
                                                                        {"selectattr", select},
                                                                        {"sort", ordering},
                                                                        {"string", string},
                                                                        {"sum", sum},
                                                                        {"title", title},
                                                                        {"tojson", tojson},
                                                                        {"trim", trim},
                                                                        {"unique", ordering},
                                                                        {"upper", change_case_filter}};
  return table;
}
}  // namespace filters

/// The filter called `name` applied to `subject`.
inline Value apply_filter(const std::string& name, const Value& subject, const Args& args) {
  const auto& table = filters::filter_table();
  const auto it = table.find(name);
  if (it == table.end()) throw Unsupported{fmt::format("the filter '{}'", name)};
  return it->second(name, subject, args);
}

namespace names {
/// The filters hpctrain implements: the table's names.
inline const std::set<std::string, std::less<>>& filters() {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> keys;
    for (const auto& entry : filters::filter_table()) keys.insert(entry.first);
    return keys;
  }();
  return names;
}
}  // namespace names

}  // namespace hpctrain::text::jinja
