#pragma once
// The values of the Jinja subset (text/chat_template.hpp): JSON values whose mappings keep insertion order, as
// Python's dicts do (nlohmann::ordered_json: `tool | tojson`, `items()` and iteration print a tool's keys in the
// order its schema gives them, as jinja2 does), plus jinja2's Undefined and namespace(). They print, compare and
// convert with Python's rules: str() and repr() (True, None, 1.0, {'a': 1}), json.dumps as transformers' tojson
// calls it, truthiness, equality (1 == 1.0 == True), and strings measured and indexed in code points. Helpers
// here throw PythonError (what Python or jinja2 would raise) or Unsupported (what hpctrain does not implement);
// the interpreter adds the template's line and column. Torch-free.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace hpctrain::text::jinja {

using Json = nlohmann::ordered_json;

/// A value: JSON, or jinja2's Undefined (a missing variable, key or attribute) with the message jinja2 gives
/// when it is used where a value is needed ("'x' is undefined", "'dict object' has no attribute 'y'").
/// `subject.name` where name is a method of the subject's Python type is that bound method, even where a dict
/// holds the key `name` (jinja2 looks attributes up before items: a JSON schema's `param.items` is dict.items):
/// `bound_method` is set, `json` is the subject and `why` the method's name. It is true and defined; hpctrain
/// cannot print it (Python prints its address).
/// `markup`: a string that is markupsafe's Markup (from |safe or |escape): adding a plain string to it escapes
/// that string's HTML characters, even without autoescaping (`"'"|safe + x | tojson` writes &#34; for quotes).
struct Value {
  Json json;
  bool undefined = false;
  std::string why;
  bool bound_method = false;
  bool markup = false;
  static Value of(Json json) { return {std::move(json), false, {}, false, false}; }
  static Value none() { return {Json(nullptr), false, {}, false, false}; }
  static Value missing(std::string why) { return {Json(nullptr), true, std::move(why), false, false}; }
  static Value method(Json subject, std::string name) { return {std::move(subject), false, std::move(name), true, false}; }
  static Value safe(std::string text) { return {Json(std::move(text)), false, {}, false, true}; }
};

/// What Python or jinja2 raises (a TypeError, an UndefinedError, ...): a conversation the template rejects.
struct PythonError {
  std::string message;
};
/// A construct of jinja2 that hpctrain does not implement, met while rendering.
struct Unsupported {
  std::string what;
};

namespace detail {

// ---- namespace() ---------------------------------------------------------------------------------------
// A namespace is an object whose first entry is this key with a binary value: no JSON text and no template
// literal can make a binary value, so a conversation's dict can never pass for one. Every walk over an
// object's entries skips it (for_each_entry), so it is never printed, counted or iterated.
inline constexpr const char* namespace_key = "__hpctrain_namespace__";

inline Json make_namespace() {
  Json ns = Json::object();
  ns[namespace_key] = Json::binary({});
  return ns;
}
inline bool is_namespace(const Json& json) {
  if (!json.is_object()) return false;
  const auto it = json.find(namespace_key);
  return it != json.end() && it->is_binary();
}
/// Calls `visit(key, value)` for each entry of an object in insertion order, the namespace marker left out.
template <typename Visit>
void for_each_entry(const Json& object, Visit&& visit) {
  for (auto it = object.begin(); it != object.end(); ++it)
    if (!it.value().is_binary() || it.key() != namespace_key) visit(it.key(), it.value());
}
inline std::size_t entry_count(const Json& object) { return object.size() - (is_namespace(object) ? 1 : 0); }

// ---- strings as Python sees them: code points ----------------------------------------------------------
/// The byte offset where each code point of `s` starts, and s.size() at the end. A byte that does not start
/// a well-formed UTF-8 sequence counts as one code point (Python strings are always well formed; template
/// literals may not be).
inline std::vector<std::size_t> code_point_starts(std::string_view s) {
  std::vector<std::size_t> starts;
  starts.reserve(s.size() + 1);
  for (std::size_t i = 0; i < s.size();) {
    starts.push_back(i);
    const auto lead = static_cast<unsigned char>(s[i]);
    std::size_t length = lead < 0x80 ? 1 : lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 1;
    if (length > 1) {
      if (i + length > s.size()) length = 1;
      for (std::size_t k = 1; k < length; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) length = 1;
    }
    i += length;
  }
  starts.push_back(s.size());
  return starts;
}
inline std::size_t code_point_count(std::string_view s) { return code_point_starts(s).size() - 1; }
/// The code points of `s`, each as its bytes.
inline std::vector<std::string> code_points(std::string_view s) {
  const auto starts = code_point_starts(s);
  std::vector<std::string> out;
  out.reserve(starts.size() - 1);
  for (std::size_t k = 0; k + 1 < starts.size(); ++k) out.emplace_back(s.substr(starts[k], starts[k + 1] - starts[k]));
  return out;
}
inline bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
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

// ---- Python's str(), repr() and type names -------------------------------------------------------------
inline std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::abs(x) < 1e16) return fmt::format("{:.1f}", x);
  return fmt::format("{}", x);
}

/// Python's repr of a string: single quotes unless the string holds one and no double quote; control
/// characters escaped as Python escapes them.
inline std::string python_repr_string(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (u < 0x20 || u == 0x7F) out += fmt::format("\\x{:02x}", u);
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
    case Json::value_t::object: return is_namespace(json) ? "Namespace" : "dict";
    default: return json.type_name();
  }
}
/// How jinja2's Undefined names the object it was looked up in ("'dict object' has no attribute 'x'").
inline std::string jinja_object_name(const Json& json) {
  return is_namespace(json) ? "jinja2.utils.Namespace object" : python_type_name(json) + " object";
}

inline std::string python_repr(const Json& json);
/// Python's str().
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
      for_each_entry(json, [&](const std::string& key, const Json& value) {
        out += (first ? "" : ", ") + python_repr_string(key) + ": " + python_repr(value);
        first = false;
      });
      out += "}";
      return is_namespace(json) ? "<Namespace " + out + ">" : out;
    }
    default: return "";
  }
}

// ---- json.dumps ----------------------------------------------------------------------------------------
/// The options of transformers' tojson filter, which calls json.dumps(x, ensure_ascii, indent, separators,
/// sort_keys).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;                           ///< the text of one level; none: one line
  std::optional<std::pair<std::string, std::string>> separators;  ///< (item, key); default (", ", ": "), or (",", ": ") with indent
  bool sort_keys = false;
};

inline std::string json_dumps(const Json& json, const JsonDumpOptions& options, int level = 0) {
  const std::string item_separator = options.separators ? options.separators->first : options.indent ? "," : ", ";
  const std::string key_separator = options.separators ? options.separators->second : ": ";
  const auto newline = [&](int at) {
    std::string out;
    if (!options.indent) return out;
    out = "\n";
    for (int k = 0; k < at; ++k) out += *options.indent;
    return out;
  };
  switch (json.type()) {
    case Json::value_t::number_float: {
      const double x = json.get<double>();
      if (std::isnan(x)) return "NaN";
      if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
      return python_float(x);
    }
    case Json::value_t::string:
      return json.dump(-1, ' ', options.ensure_ascii, Json::error_handler_t::replace);
    case Json::value_t::array: {
      if (json.empty()) return "[]";
      std::string out = "[";
      for (std::size_t i = 0; i < json.size(); ++i) out += (i ? item_separator : "") + newline(level + 1) + json_dumps(json[i], options, level + 1);
      return out + newline(level) + "]";
    }
    case Json::value_t::object: {
      if (is_namespace(json)) throw PythonError{"Object of type Namespace is not JSON serializable"};
      if (json.empty()) return "{}";
      std::vector<std::pair<std::string, const Json*>> entries;
      for_each_entry(json, [&](const std::string& key, const Json& value) { entries.emplace_back(key, &value); });
      if (options.sort_keys) std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::string out = "{";
      for (std::size_t i = 0; i < entries.size(); ++i)
        out += (i ? item_separator : "") + newline(level + 1) + Json(entries[i].first).dump(-1, ' ', options.ensure_ascii, Json::error_handler_t::replace) +
               key_separator + json_dumps(*entries[i].second, options, level + 1);
      return out + newline(level) + "}";
    }
    case Json::value_t::binary: throw PythonError{"Object of type Namespace is not JSON serializable"};
    default: return json.dump();
  }
}

// ---- truthiness, equality, order -----------------------------------------------------------------------
inline bool truthy(const Value& value) {
  if (value.undefined) return false;
  if (value.bound_method) return true;
  const auto& j = value.json;
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return j.get<std::int64_t>() != 0;
    case Json::value_t::number_float: return j.get<double>() != 0.0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();  // json::empty() is false for any string
    case Json::value_t::array: return !j.empty();
    case Json::value_t::object: return is_namespace(j) || !j.empty();  // a namespace is an object: always true
    default: return false;
  }
}

/// A number in Python's sense: bool is an int.
inline bool is_python_number(const Json& j) { return j.is_number() || j.is_boolean(); }
inline double as_double(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }

/// Python's ==: numbers by value (1 == 1.0 == True), dicts whatever their order, lists element by element.
inline bool python_equal(const Json& a, const Json& b) {
  if (is_python_number(a) && is_python_number(b)) {
    if (a.is_number_float() || b.is_number_float()) return as_double(a) == as_double(b);
    const auto integer = [](const Json& j) -> std::int64_t { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<std::int64_t>(); };
    return integer(a) == integer(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!python_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (is_namespace(a) != is_namespace(b) || entry_count(a) != entry_count(b)) return false;
    bool same = true;
    for_each_entry(a, [&](const std::string& key, const Json& value) {
      const auto it = b.find(key);
      same = same && it != b.end() && python_equal(value, *it);
    });
    return same;
  }
  return a == b;
}

/// Python's <: numbers, strings (by code point: UTF-8 bytes order the same way) and lists; PythonError else.
inline int python_compare(const Json& a, const Json& b, const char* op) {
  if (is_python_number(a) && is_python_number(b)) {
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
      if (!python_equal(a[i], b[i])) return python_compare(a[i], b[i], op);
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  throw PythonError{fmt::format("'{}' not supported between instances of '{}' and '{}'", op, python_type_name(a), python_type_name(b))};
}

// ---- string helpers --------------------------------------------------------------------------------------
inline std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

inline std::string replace_all(std::string s, const std::string& from, const std::string& to, std::int64_t count = -1) {
  if (from.empty()) {  // Python inserts `to` around every code point
    if (count == 0) return s;
    std::string out = to;
    std::int64_t n = 1;
    for (const auto& c : code_points(s)) {
      out += c;
      if (count < 0 || n < count) out += to, ++n;
    }
    return out;
  }
  std::size_t at = 0;
  for (std::int64_t n = 0; (count < 0 || n < count) && (at = s.find(from, at)) != std::string::npos; ++n) {
    s.replace(at, from.size(), to);
    at += to.size();
  }
  return s;
}

/// Python's upper(), lower(), title() (str's: a cased letter after an uncased character starts a word) and
/// capitalize() for ASCII text. Non-ASCII letters have case too in Python: hpctrain carries no Unicode case
/// table, so such text is refused rather than changed differently.
inline std::string change_case(const std::string& s, const std::string& how) {
  if (!is_ascii(s)) throw Unsupported{fmt::format("{}() of text with non-ASCII characters", how)};
  std::string out = s;
  bool word_start = true;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    const bool alpha = std::isalpha(c) != 0;
    if (how == "upper") out[i] = static_cast<char>(std::toupper(c));
    else if (how == "lower") out[i] = static_cast<char>(std::tolower(c));
    else if (how == "title") out[i] = static_cast<char>(alpha ? (word_start ? std::toupper(c) : std::tolower(c)) : c);
    else if (how == "capitalize") out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
    word_start = !alpha;
  }
  return out;
}

/// markupsafe.escape, which jinja2's escape filter applies even without autoescaping.
inline std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace detail
}  // namespace hpctrain::text::jinja
