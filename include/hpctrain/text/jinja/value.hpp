#pragma once
// The values of the Jinja subset (text/chat_template.hpp): JSON values whose mappings keep insertion order, as
// Python's dicts do (nlohmann::ordered_json: `tool | tojson`, `items()` and iteration print a tool's keys in the
// order its schema gives them, as jinja2 does; a dict literal's keys may be numbers, bools or None, stored as
// "dictionary keys that are not strings" below say), plus jinja2's Undefined and namespace(). They print, compare and
// convert with Python's rules: str() and repr() (True, None, 1.0, {'a': 1}), json.dumps as transformers' tojson
// calls it, truthiness, equality (1 == 1.0 == True), and strings measured and indexed in code points. Helpers
// here throw PythonError (what Python or jinja2 would raise) or Unsupported (what hpctrain does not implement);
// the interpreter adds the template's line and column. Torch-free.
#include <algorithm>
#include <cmath>
#include <cstddef>
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
  static Value method(Json subject, std::string name) {
    return {std::move(subject), false, std::move(name), true, false};
  }
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

/// The most bytes a rendering may write into one buffer (Interpreter::max_output): a chat template is a few
/// kilobytes of text around a conversation, and a template that asks for more is refused rather than allowed to
/// take the machine's memory.
inline constexpr std::size_t max_rendering_bytes = 64u << 20;

/// `width` spaces, for indent and tojson's indent; a PythonError beyond max_rendering_bytes, where jinja2 would
/// try to allocate them (indent(99999999999) is 100 GB).
inline std::string spaces(std::int64_t width) {
  if (width > static_cast<std::int64_t>(max_rendering_bytes)) throw PythonError{"the rendering exceeds 64 MiB"};
  return std::string(static_cast<std::size_t>(std::max<std::int64_t>(0, width)), ' ');
}

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
inline std::size_t entry_count(const Json& object) { return object.size() - (is_namespace(object) ? 1 : 0); }

// ---- dictionary keys that are not strings --------------------------------------------------------------
// Python's dicts take any hashable key; nlohmann's objects take strings. A template's dict literal may have
// numbers, True, False or None as keys (Seed-OSS looks its thinking budget up in `{0: 0, 512: 128, ...}` with
// dictsort): such a key is stored as the byte 0xFF followed by its JSON text ("\xFF512", "\xFFtrue", "\xFFnull",
// "\xFF1.5"). No UTF-8 text holds the byte 0xFF, so no string of JSON data (nlohmann's parser refuses text that
// is not UTF-8) or of a template jinja2 can read passes for one, and 512 and '512' stay two keys, as in Python;
// a dict literal's string key starting with that byte is refused (require_storable_key). Every walk over a
// dict's entries (for_each_entry) gives the key decoded, every lookup goes through find_key and every store
// through set_key: nothing else sees the stored form. One side table or a wrapper per dict would have to be
// carried through every copy of a value; a key that spells its own kind travels with the object.
inline constexpr char non_string_key_marker = '\xFF';

inline bool is_stored_non_string_key(const std::string& stored) {
  return !stored.empty() && stored[0] == non_string_key_marker;
}

/// The key a stored key stands for: itself, or the number, bool or None behind the marker (what does not parse
/// as one of those is the string it is).
inline Json decode_key(const std::string& stored) {
  if (!is_stored_non_string_key(stored)) return Json(stored);
  auto key = Json::parse(stored.begin() + 1, stored.end(), nullptr, false);
  if (key.is_discarded() || key.is_string() || key.is_structured()) return Json(stored);
  if (key.is_number_unsigned() && key.get<std::uint64_t>() <= std::uint64_t{INT64_MAX})
    return Json(key.get<std::int64_t>());  // an int as the template's literals make them
  return key;
}

/// The stored forms of every number, bool or None key Python's dict takes as `key` (equal and hashing alike):
/// 1, 1.0 and True are one key; so are 0, 0.0, -0.0 and False.
inline std::vector<std::string> stored_forms_of(const Json& key) {
  std::vector<std::string> forms;
  const auto add = [&](const Json& form) { forms.push_back(non_string_key_marker + form.dump()); };
  if (key.is_string() || key.is_structured() || key.is_binary()) return forms;
  if (key.is_number_float() && !std::isfinite(key.get<double>())) return forms;  // never stored (set_key)
  if (key.is_null() || (key.is_number_unsigned() && key.get<std::uint64_t>() > std::uint64_t{INT64_MAX})) {
    add(key);
    return forms;
  }
  // A double converts to int64 exactly in [-2**63, 2**63): the range of the casts below.
  const auto fits_int64 = [](double x) { return x >= -9223372036854775808.0 && x < 9223372036854775808.0; };
  std::optional<std::int64_t> integer;  // the int equal to the key, if any
  std::optional<double> real;           // the float equal to the key, if any
  if (key.is_boolean()) integer = key.get<bool>() ? 1 : 0;
  if (key.is_number_integer()) integer = key.get<std::int64_t>();
  if (key.is_number_float()) {
    real = key.get<double>();
    if (*real == std::floor(*real) && fits_int64(*real)) integer = static_cast<std::int64_t>(*real);
  } else if (const auto x = static_cast<double>(*integer); fits_int64(x) && static_cast<std::int64_t>(x) == *integer) {
    real = x;  // an int a double holds exactly (2**53 + 1 has no float equal to it)
  }
  if (integer) add(Json(*integer));
  if (integer == 0 || integer == 1) add(Json(integer == 1));
  if (real) add(Json(*real));
  if (real == 0.0) add(Json(-*real));  // 0.0 and -0.0: equal, two texts
  return forms;
}

/// Where `object` holds `key` as Python's dict finds it (a key equal to it, whatever its type), or end(). A
/// list or dict is never a key.
inline Json::const_iterator find_key(const Json& object, const Json& key) {
  if (key.is_string()) {
    const auto& text = key.get_ref<const std::string&>();
    return is_stored_non_string_key(text) ? object.end() : object.find(text);
  }
  if (!key.is_primitive() || key.is_binary()) return object.end();
  for (const auto& stored : stored_forms_of(key))
    if (const auto it = object.find(stored); it != object.end()) return it;
  return object.end();
}

/// `object[key] = value` as Python's dict stores it: a key equal to it that is already there keeps its form
/// and takes the value ({1: 'a', True: 'b'} is {1: 'b'}). `key` is a string, a finite number, a bool or None
/// (require_storable_key).
inline void set_key(Json& object, const Json& key, Json value) {
  if (key.is_string()) {
    object[key.get<std::string>()] = std::move(value);
    return;
  }
  for (const auto& stored : stored_forms_of(key))
    if (const auto it = object.find(stored); it != object.end()) {
      *it = std::move(value);
      return;
    }
  object[non_string_key_marker + key.dump()] = std::move(value);
}

/// Refuses a dict literal's key that cannot be stored: a dict (Python's TypeError), and the hashable kinds jinja2
/// takes and hpctrain does not keep (a tuple, which the parser makes a list, so a list is refused the same way;
/// Undefined, a method, a namespace, a Markup string, NaN or an infinity; text that is not UTF-8).
inline void require_storable_key(const Value& key) {
  const auto& j = key.json;
  if (key.undefined) throw Unsupported{"a dictionary key that is undefined"};
  if (key.bound_method) throw Unsupported{"a dictionary key that is a method"};
  if (key.markup) throw Unsupported{"a dictionary key that is a Markup string (from |safe or |escape)"};
  if (j.is_array()) throw Unsupported{"a dictionary key that is a tuple or a list"};
  if (is_namespace(j)) throw Unsupported{"a dictionary key that is a namespace"};
  if (j.is_object()) throw PythonError{"unhashable type: 'dict'"};
  if (j.is_number_float() && !std::isfinite(j.get<double>()))
    throw Unsupported{"a dictionary key that is NaN or infinite"};
  if (j.is_string() && is_stored_non_string_key(j.get_ref<const std::string&>()))
    throw Unsupported{"a dictionary key that is not UTF-8 text"};
}

/// Calls `visit(key, value)` for each entry of an object in insertion order, the key decoded (a string, or a
/// number, bool or None: decode_key), the namespace marker left out.
template <typename Visit>
void for_each_entry(const Json& object, Visit&& visit) {
  for (auto it = object.begin(); it != object.end(); ++it)
    if (!it.value().is_binary() || it.key() != namespace_key) visit(decode_key(it.key()), it.value());
}

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
inline std::vector<std::int64_t> slice_indices(std::int64_t size, std::optional<std::int64_t> start,
                                               std::optional<std::int64_t> stop, std::optional<std::int64_t> step) {
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
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "int";
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
      for_each_entry(json, [&](const Json& key, const Json& value) {
        out += (first ? "" : ", ") + python_repr(key) + ": " + python_repr(value);
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
  std::optional<std::string> indent;  ///< the text of one level; none: one line
  std::optional<std::pair<std::string, std::string>>
      separators;  ///< (item, key); default (", ", ": "), or (",", ": ") with indent
  bool sort_keys = false;
};

/// A float as json.dumps writes it (float.__repr__, and JavaScript's names for NaN and the infinities).
inline std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return python_float(x);
}
/// A dict's key as json.dumps writes it: a string as it is, a number, bool or None as its JSON text (1 → "1",
/// True → "true", None → "null", 1.5 → "1.5").
inline std::string json_key_text(const Json& key) {
  if (key.is_string()) return key.get<std::string>();
  if (key.is_number_float()) return json_float(key.get<double>());
  return key.dump();
}

inline int python_compare(const Json& a, const Json& b, const char* op);

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
  const auto quoted = [&](const std::string& text) {
    return Json(text).dump(-1, ' ', options.ensure_ascii, Json::error_handler_t::replace);
  };
  switch (json.type()) {
    case Json::value_t::number_float: return json_float(json.get<double>());
    case Json::value_t::string: return quoted(json.get_ref<const std::string&>());
    case Json::value_t::array: {
      if (json.empty()) return "[]";
      std::string out = "[";
      for (std::size_t i = 0; i < json.size(); ++i)
        out += (i ? item_separator : "") + newline(level + 1) + json_dumps(json[i], options, level + 1);
      return out + newline(level) + "]";
    }
    case Json::value_t::object: {
      if (is_namespace(json)) throw PythonError{"Object of type Namespace is not JSON serializable"};
      if (json.empty()) return "{}";
      std::vector<std::pair<Json, const Json*>> entries;
      for_each_entry(json, [&](const Json& key, const Json& value) { entries.emplace_back(key, &value); });
      if (options
              .sort_keys)  // Python's sorted(): keys of different kinds raise its TypeError ('<' ... 'str' and 'int')
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return python_compare(a.first, b.first, "<") < 0; });
      std::string out = "{";
      for (std::size_t i = 0; i < entries.size(); ++i)
        out += (i ? item_separator : "") + newline(level + 1) + quoted(json_key_text(entries[i].first)) +
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
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();  // json::empty() is false for any string
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
    const auto integer = [](const Json& j) -> std::int64_t {
      return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<std::int64_t>();
    };
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
    for_each_entry(a, [&](const Json& key, const Json& value) {
      const auto it = find_key(b, key);
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
  throw PythonError{fmt::format("'{}' not supported between instances of '{}' and '{}'", op, python_type_name(a),
                                python_type_name(b))};
}

// ---- string helpers --------------------------------------------------------------------------------------
inline std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
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

/// A code point's case in Python: its upper and lower forms, and whether it is cased (Lu, Ll, Lt). hpctrain
/// carries Python's mapping for ASCII, Latin-1, Latin Extended-A, basic Greek and Cyrillic, and knows the blocks
/// that have no case (punctuation, symbols, CJK, Hangul, emoji); any other code point is Unsupported rather than
/// changed differently from Python.
struct CodePointCase {
  std::uint32_t upper, lower;
  bool cased;
};
inline std::optional<CodePointCase> code_point_case(std::uint32_t c) {
  const auto caseless = [&] { return CodePointCase{c, c, false}; };
  if (c < 0x80) {
    if (c >= 'A' && c <= 'Z') return CodePointCase{c, c + 32, true};
    if (c >= 'a' && c <= 'z') return CodePointCase{c - 32, c, true};
    return caseless();
  }
  if (c == 0xB5) return CodePointCase{0x39C, c, true};  // micro sign: upper is Greek Mu
  if (c == 0xDF || c == 0x130 || c == 0x131 || c == 0x149 || c == 0x17F || c == 0x3A3 || c == 0x3C2)
    return std::nullopt;  // ß→SS, İ, ı, ŉ, ſ, final sigma
  if (c >= 0xA0 && c <= 0xBF) return caseless();
  if (c == 0xD7 || c == 0xF7) return caseless();
  if (c >= 0xC0 && c <= 0xDE) return CodePointCase{c, c + 32, true};
  if (c >= 0xE0 && c <= 0xFE) return CodePointCase{c - 32, c, true};
  if (c == 0xFF) return CodePointCase{0x178, c, true};
  if (c == 0x178) return CodePointCase{c, 0xFF, true};
  if (c == 0x138) return CodePointCase{c, c, true};  // kra: lower case, no upper form
  const auto pair = [&](bool upper_is_even) {
    const bool upper = (c % 2 == 0) == upper_is_even;
    return upper ? CodePointCase{c, c + 1, true} : CodePointCase{c - 1, c, true};
  };
  if (c >= 0x100 && c <= 0x137) return pair(true);
  if (c >= 0x139 && c <= 0x148) return pair(false);
  if (c >= 0x14A && c <= 0x177) return pair(true);
  if (c >= 0x179 && c <= 0x17E) return pair(false);
  if ((c >= 0x391 && c <= 0x3A9) || (c >= 0x410 && c <= 0x42F)) return CodePointCase{c, c + 32, true};
  if ((c >= 0x3B1 && c <= 0x3C9) || (c >= 0x430 && c <= 0x44F)) return CodePointCase{c - 32, c, true};
  if (c >= 0x400 && c <= 0x40F) return CodePointCase{c, c + 80, true};
  if (c >= 0x450 && c <= 0x45F) return CodePointCase{c - 80, c, true};
  const std::pair<std::uint32_t, std::uint32_t> blocks[] = {
      {0x2000, 0x20FF}, {0x2190, 0x245F}, {0x2500, 0x2BFF}, {0x2E80, 0xA4CF},   {0xAC00, 0xD7FF},
      {0xF900, 0xFAFF}, {0xFE30, 0xFE4F}, {0xFF01, 0xFF20}, {0x1F000, 0x1FAFF}, {0x20000, 0x3FFFF}};
  for (const auto& [first, last] : blocks)
    if (c >= first && c <= last) return caseless();
  return std::nullopt;
}

inline std::uint32_t decode_utf8(std::string_view bytes) {
  const auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])); };
  switch (bytes.size()) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}
inline std::string encode_utf8(std::uint32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

/// Python's str.upper(), lower(), title() (a cased letter after an uncased character starts a word) and
/// capitalize(), code point by code point (code_point_case).
inline std::string change_case(const std::string& s, const std::string& how) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  bool first = true;
  for (const auto& point : code_points(s)) {
    const auto c = decode_utf8(point);
    const auto info = code_point_case(c);
    if (!info)
      throw Unsupported{
          fmt::format("{}() of text with the character U+{:04X} (no case table for it in hpctrain)", how, c)};
    bool to_upper = how == "upper";
    if (how == "title") to_upper = !previous_cased;
    if (how == "capitalize") to_upper = first;
    out += encode_utf8(to_upper ? info->upper : info->lower);
    previous_cased = info->cased;
    first = false;
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
