#pragma once
// The methods of str, dict and list values in the Jinja subset (`'text'.strip()`, `message.get('content')`), each a
// function of its own, found by the subject's type and the name in one table per type: what the parser and
// `names::implemented_method` accept and what call_method calls are the same entries. Python's semantics; Markup
// (from |safe or |escape) keeps its kind where jinja2's Markup does. Torch-free.
#include <algorithm>
#include <cctype>
#include <cstdint>
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

/// A method of a str, dict or list subject: `name` is the name it was called by (families share a function).
using MethodFunction = Value (*)(const std::string& name, const Json& subject, const Args& args);
using MethodTable = std::map<std::string, MethodFunction, std::less<>>;

namespace methods {
using namespace detail;

/// Python's whitespace for strip() and split() without arguments.
inline const std::string python_whitespace = " \t\n\r\f\v";

/// The str argument at `index` (or named `key`) of method `name`; PythonError as Python words it otherwise.
inline std::string string_arg(const std::string& name, const Args& args, std::size_t index, std::string_view key) {
  const auto* value = args.get(index, key);
  if (!value) throw PythonError{fmt::format("{}() missing the argument '{}'", name, key)};
  if (!value->json.is_string())
    throw PythonError{
        fmt::format("must be str, not {}", value->undefined ? "Undefined" : python_type_name(value->json))};
  return value->json.get<std::string>();
}

/// strip, lstrip, rstrip (chars).
inline Value strip(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto* chars = args.get(0, "chars");
  const auto set = chars && chars->json.is_string() ? chars->json.get<std::string>() : python_whitespace;
  return Value::of(Json(strip_chars(s, set, name != "rstrip", name != "lstrip")));
}

/// startswith, endswith (a prefix, or a tuple of them).
inline Value startswith_or_endswith(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto* affix = args.get(0, "prefix");
  if (!affix) throw PythonError{fmt::format("{}() takes at least 1 argument (0 given)", name)};
  std::vector<std::string> candidates;
  if (affix->json.is_string()) candidates.push_back(affix->json.get<std::string>());
  else if (affix->json.is_array() &&
           std::all_of(affix->json.begin(), affix->json.end(), [](const Json& x) { return x.is_string(); }))
    for (const auto& x : affix->json) candidates.push_back(x.get<std::string>());
  else
    throw PythonError{
        fmt::format("{} first arg must be str or a tuple of str, not {}", name, python_type_name(affix->json))};
  const bool ok = std::any_of(candidates.begin(), candidates.end(), [&](const std::string& a) {
    return s.size() >= a.size() &&
           (name == "startswith" ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  });
  return Value::of(Json(ok));
}

/// removeprefix, removesuffix.
inline Value remove_affix(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto& j = subject;
  const auto affix = string_arg(name, args, 0, "prefix");
  if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value::of(Json(s.substr(affix.size())));
  if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
      s.compare(s.size() - affix.size(), affix.size(), affix) == 0)
    return Value::of(Json(s.substr(0, s.size() - affix.size())));
  return Value::of(j);
}

/// replace(old, new, count).
inline Value replace(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto* count = args.get(2, "count");
  return Value::of(Json(replace_all(s, string_arg(name, args, 0, "old"), string_arg(name, args, 1, "new"),
                                    count && count->json.is_number_integer() ? count->json.get<std::int64_t>() : -1)));
}

/// find, rfind, index, count: positions in code points, as Python counts them.
inline Value search(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto needle = string_arg(name, args, 0, "sub");
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

/// join(iterable).
inline Value join(const std::string& /*name*/, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto* items = args.get(0, "iterable");
  if (!items) throw PythonError{"join() takes exactly one argument (0 given)"};
  std::string out;
  bool first = true;
  for (const auto& item : iterate(*items)) {
    if (!item.is_string())
      throw PythonError{fmt::format("sequence item: expected str instance, {} found", python_type_name(item))};
    out += (first ? "" : s) + item.get<std::string>();
    first = false;
  }
  return Value::of(Json(out));
}

/// split, rsplit (sep, maxsplit).
inline Value split(const std::string& name, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
  const auto* separator = args.get(0, "sep");
  const auto* limit = args.get(1, "maxsplit");
  std::int64_t maxsplit = limit && limit->json.is_number_integer() ? limit->json.get<std::int64_t>() : -1;
  std::vector<std::string> parts;
  if (!separator || separator->json.is_null()) {  // runs of python_whitespace, none at the ends
    std::vector<std::pair<std::size_t, std::size_t>> words;
    for (std::size_t i = 0; i < s.size();) {
      while (i < s.size() && python_whitespace.find(s[i]) != std::string::npos) ++i;
      std::size_t k = i;
      while (k < s.size() && python_whitespace.find(s[k]) == std::string::npos) ++k;
      if (k > i) words.emplace_back(i, k);
      i = k;
    }
    if (maxsplit < 0 || static_cast<std::size_t>(maxsplit) + 1 >= words.size()) {
      for (const auto& [b, e] : words) parts.push_back(s.substr(b, e - b));
    } else if (name == "split") {
      for (std::size_t k = 0; k < static_cast<std::size_t>(maxsplit); ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.push_back(
          strip_chars(s.substr(words[static_cast<std::size_t>(maxsplit)].first), python_whitespace, false, true));
    } else {
      const auto first = words.size() - static_cast<std::size_t>(maxsplit);
      parts.push_back(strip_chars(s.substr(0, words[first - 1].second), python_whitespace, true, false));
      for (std::size_t k = first; k < words.size(); ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
  } else {
    const auto sep = string_arg(name, args, 0, "sep");
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

/// splitlines(keepends).
inline Value splitlines(const std::string& /*name*/, const Json& subject, const Args& args) {
  const auto& s = subject.get_ref<const std::string&>();
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

/// isdigit, isalpha, isalnum, isspace, isupper, islower (ASCII text).
inline Value character_class(const std::string& name, const Json& subject, const Args& /*args*/) {
  const auto& s = subject.get_ref<const std::string&>();
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

/// upper, lower, title, capitalize.
inline Value case_method(const std::string& name, const Json& subject, const Args& /*args*/) {
  const auto& s = subject.get_ref<const std::string&>();
  return Value::of(Json(change_case(s, name)));
}

/// get(key, default).
inline Value get(const std::string& /*name*/, const Json& subject, const Args& args) {
  const auto& j = subject;
  const auto* key = args.get(0, "key");
  if (!key) throw PythonError{"get expected at least 1 argument, got 0"};
  const auto it = key->undefined || key->bound_method ? j.end() : find_key(j, key->json);
  if (it != j.end()) return Value::of(*it);
  const auto* fallback = args.get(1, "default");
  return fallback ? *fallback : Value::none();
}

/// items, keys, values.
inline Value entries(const std::string& name, const Json& subject, const Args& /*args*/) {
  const auto& j = subject;
  Json out = Json::array();
  for_each_entry(j, [&](const Json& key, const Json& value) {
    out.push_back(name == "items" ? Json::array({key, value}) : name == "keys" ? Json(key) : value);
  });
  return Value::of(out);
}

/// index, count (a value).
inline Value list_search(const std::string& name, const Json& subject, const Args& args) {
  const auto& j = subject;
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

/// str's methods hpctrain implements.
inline const MethodTable& str_table() {
  static const MethodTable table{{"capitalize", case_method},
                                 {"count", search},
                                 {"endswith", startswith_or_endswith},
                                 {"find", search},
                                 {"index", search},
                                 {"isalnum", character_class},
                                 {"isalpha", character_class},
                                 {"isdigit", character_class},
                                 {"islower", character_class},
                                 {"isspace", character_class},
                                 {"isupper", character_class},
                                 {"join", join},
                                 {"lower", case_method},
                                 {"lstrip", strip},
                                 {"removeprefix", remove_affix},
                                 {"removesuffix", remove_affix},
                                 {"replace", replace},
                                 {"rfind", search},
                                 {"rsplit", split},
                                 {"rstrip", strip},
                                 {"split", split},
                                 {"splitlines", splitlines},
                                 {"startswith", startswith_or_endswith},
                                 {"strip", strip},
                                 {"title", case_method},
                                 {"upper", case_method}};
  return table;
}
/// dict's.
inline const MethodTable& dict_table() {
  static const MethodTable table{{"get", get}, {"items", entries}, {"keys", entries}, {"values", entries}};
  return table;
}
/// list's.
inline const MethodTable& list_table() {
  static const MethodTable table{{"count", list_search}, {"index", list_search}};
  return table;
}
/// The table of `subject`'s type, or nullptr (a namespace, a number, None: no methods).
inline const MethodTable* table_of(const Json& subject) {
  if (subject.is_string()) return &str_table();
  if (subject.is_array()) return &list_table();
  if (subject.is_object() && !is_namespace(subject)) return &dict_table();
  return nullptr;
}
}  // namespace methods

/// `subject.name(args)` for str, dict and list subjects.
inline Value call_method(const Value& subject, const std::string& name, const Args& args) {
  using namespace detail;
  const auto& j = subject.json;
  require_defined(subject);
  if (subject.markup) {  // Markup's methods return Markup, and some escape their arguments
    static const std::set<std::string, std::less<>> keep{"strip", "lstrip", "rstrip",    "upper",
                                                         "lower", "title",  "capitalize"};
    static const std::set<std::string, std::less<>> plain{"startswith", "endswith", "find",    "rfind",
                                                          "count",      "index",    "isalnum", "isalpha",
                                                          "isdigit",    "islower",  "isspace", "isupper"};
    if (keep.count(name)) {
      auto unmarked = subject;
      unmarked.markup = false;
      return Value::safe(call_method(unmarked, name, args).json.get<std::string>());
    }
    if (!plain.count(name))
      throw Unsupported{fmt::format("the method '{}' of a Markup string (from |safe or |escape)", name)};
  }
  if (!names::python_has_method(j, name))
    throw PythonError{fmt::format("'{}' has no attribute '{}'", j.is_null() ? "None" : jinja_object_name(j), name)};
  const auto* table = methods::table_of(j);
  const auto it = table != nullptr ? table->find(name) : MethodTable::const_iterator{};
  if (table == nullptr || it == table->end())
    throw Unsupported{fmt::format("the method '{}' of {}", name, python_type_name(j))};
  return it->second(name, j, args);
}

namespace names {
inline const std::set<std::string, std::less<>>& implemented_methods() {
  static const std::set<std::string, std::less<>> names = [] {
    std::set<std::string, std::less<>> keys;
    for (const auto* table : {&methods::str_table(), &methods::dict_table(), &methods::list_table()})
      for (const auto& entry : *table) keys.insert(entry.first);
    return keys;
  }();
  return names;
}
/// Whether some type's method of this name is implemented (the parser refuses the others before rendering).
inline bool implemented_method(std::string_view name) { return implemented_methods().count(name) > 0; }
}  // namespace names

}  // namespace hpctrain::text::jinja
