#!/usr/bin/env python3
"""Every public header includes what it uses from outside hpctrain.

The self-containment checks (tests/headers/CMakeLists.txt) compile each header after a precompiled header of
the heavy outside headers (LibTorch and c10d, fmt, nlohmann/json, CLI11, the standard library): parsing those
once instead of once per header halves the checks. A header that uses one of them without including it would
still pass there, so this check reads the headers instead: what a header names (`fmt::`, `std::optional`, ...)
must come from an #include of its own or of an hpctrain header it includes (transitively). Includes that an
outside header makes for us do not count: fmt may stop including <string>.

    includes_what_it_uses.py <include dir>     exit 1 naming each header, the name it uses and what to include
"""
import pathlib
import re
import sys

# What a name needs: (pattern over code without comments and strings, the #include that provides it; a trailing
# slash accepts any header of that folder).
NEEDS = [
    (r"\bfmt::", "fmt/"),
    (r"\bnlohmann::", "nlohmann/json.hpp"),
    (r"\bCLI::", "CLI/CLI.hpp"),
    (r"\bc10d::", "torch/csrc/distributed/c10d/"),
    (r"\b(?:torch|at|c10)::", ("torch/", "ATen/", "c10/")),
    (r"\bpcre2_\w+\(", "pcre2.h"),
    (r"\bstd::filesystem\b", "filesystem"),
    (r"\bstd::(?:optional|nullopt)\b", "optional"),
    (r"\bstd::(?:u8|w)?string_view\b", "string_view"),
    (r"\bstd::(?:string|to_string|stoi|stol|stoll|stoul|stoull|stod)\b(?!_view)", "string"),
    (r"\bstd::vector\b", "vector"),
    (r"\bstd::(?:multi)?map\b", "map"),
    (r"\bstd::unordered_map\b", "unordered_map"),
    (r"\bstd::(?:multi)?set\b", "set"),
    (r"\bstd::unordered_set\b", "unordered_set"),
    (r"\bstd::deque\b", "deque"),
    (r"\bstd::array\b", "array"),
    (r"\bstd::span\b", "span"),
    (r"\bstd::(?:variant|visit|holds_alternative|get_if|monostate)\b", "variant"),
    (r"\bstd::(?:function|invoke|reference_wrapper|ref|cref|hash)\b", "functional"),
    (r"\bstd::(?:unique_ptr|shared_ptr|weak_ptr|make_unique|make_shared|enable_shared_from_this)\b", "memory"),
    (r"\bstd::(?:tuple|make_tuple|tie|apply|tuple_size|tuple_element)\b", "tuple"),
    (r"\bstd::chrono\b", "chrono"),
    (r"\bstd::(?:thread|jthread|this_thread)\b", "thread"),
    (r"\bstd::(?:mutex|lock_guard|unique_lock|scoped_lock)\b", "mutex"),
    (r"\bstd::condition_variable\b", "condition_variable"),
    (r"\bstd::atomic\b", "atomic"),
    (r"\bstd::(?:i|o)?fstream\b", "fstream"),
    (r"\bstd::(?:i|o)?stringstream\b", "sstream"),
    (r"\bstd::(?:cout|cerr|clog)\b", "iostream"),
    (r"\bstd::numeric_limits\b", "limits"),
    (r"\bstd::(?:from_chars|to_chars)\b", "charconv"),
    (r"\bstd::(?:sort|stable_sort|find|find_if|find_if_not|any_of|all_of|none_of|count_if|remove_if|reverse|"
     r"max_element|min_element|minmax_element|clamp|lower_bound|upper_bound|transform|unique|fill|copy_if)\b",
     "algorithm"),
    (r"\bstd::(?:accumulate|iota|inner_product|partial_sum|gcd|lcm)\b", "numeric"),
    (r"\bstd::(?:pair|make_pair|move|forward|exchange|swap|declval|in_place)\b", "utility"),
    (r"\bstd::(?:u?int(?:8|16|32|64)_t|u?intptr_t)\b", "cstdint"),
    (r"\bstd::(?:size_t|ptrdiff_t|byte|nullptr_t)\b", ("cstddef", "cstdio", "cstdlib", "cstring")),
    (r"\bstd::(?:exception|exception_ptr|current_exception|rethrow_exception|terminate)\b", "exception"),
    (r"\bstd::(?:runtime_error|logic_error|invalid_argument|out_of_range|length_error)\b", "stdexcept"),
    (r"\bstd::(?:system_error|generic_category|system_category)\b", "system_error"),
    # What from_chars and the filesystem functions report in: their headers name them too.
    (r"\bstd::(?:error_code|errc)\b", ("system_error", "charconv", "filesystem")),
]
NEEDS = [(re.compile(pattern), (need,) if isinstance(need, str) else need) for pattern, need in NEEDS]

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
# Comments, character and string literals (raw strings first: their body may hold quotes).
CODE_NOISE = re.compile(r'R"([^(\s]*)\(.*?\)\1"|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def code_of(text):
    return CODE_NOISE.sub(" ", text)


def provides(include, need):
    return include == need or (need.endswith("/") and include.startswith(need))


def check(root):
    """The violations under root (the include dir): 'header: uses X, include <Y>'."""
    root = pathlib.Path(root)
    headers = {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.hpp"))}
    direct = {name: INCLUDE.findall(text) for name, text in headers.items()}

    def reachable(name, seen=None):
        seen = set() if seen is None else seen
        for include in direct.get(name, ()):
            if include not in seen:
                seen.add(include)
                if include in headers:  # our own: what it includes counts too
                    reachable(include, seen)
        return seen

    violations = []
    for name, text in headers.items():
        code, includes = code_of(text), reachable(name)
        for pattern, needs in NEEDS:
            used = pattern.search(code)
            if used and not any(provides(include, need) for include in includes for need in needs):
                violations.append(f"{name}: uses {used.group(0).rstrip('(')} and includes none of "
                                  + ", ".join(f"<{need}>" for need in needs))
    return violations


def self_test():
    """The check finds a missing include, follows our own includes, and ignores comments and strings."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp, "hpctrain")
        folder.mkdir()
        (folder / "a.hpp").write_text('#include <fmt/format.h>\n#include <string>\nstd::string a() { return fmt::format("x"); }\n')
        (folder / "b.hpp").write_text('#include <hpctrain/a.hpp>\n// std::vector in a comment\n'
                                      'inline auto b() { return a() + "std::map" + fmt::format("y"); }\n')
        (folder / "c.hpp").write_text('#include <hpctrain/b.hpp>\ninline nlohmann::json c();\n')
        found = check(tmp)
    expected = ["hpctrain/c.hpp: uses nlohmann:: and includes none of <nlohmann/json.hpp>"]
    if found != expected:
        sys.exit(f"includes_what_it_uses.py: self-test failed: found {found}, expected {expected}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    self_test()
    problems = check(sys.argv[1])
    for problem in problems:
        print(problem)
    print(f"{'FAIL' if problems else 'PASS'}: {len(problems)} missing includes in "
          f"{len(list(pathlib.Path(sys.argv[1]).rglob('*.hpp')))} headers")
    sys.exit(1 if problems else 0)
