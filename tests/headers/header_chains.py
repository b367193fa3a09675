#!/usr/bin/env python3
"""Plans the headers' self-containment checks as chains, and checks at build time that the plan still holds.

A header is self-contained when a TU that includes it first compiles. A TU that includes A and then B also shows
that B is self-contained when B includes A (transitively): everything B sees is then something its own includes
bring. So one TU can check a chain of headers, each included (transitively) by the next, and parse their code
once; a check per header parsed the shared headers again in each (185 headers: 2.5x the bytes of the chains).

Two things would let a chain pass a header that fails alone, and the plan avoids both:
  - a header that uses a name (or tests a macro) before the #include that declares it: a header with an
    unconditional hpctrain #include after anything but such includes comes first in its chain (checked alone);
  - an #include under #if: only the includes outside any #if count as "B includes A".
When an edit removes an #include that a chain relies on, `check` fails the build naming it and touches the plan,
which CMake reads at configure time (CMAKE_CONFIGURE_DEPENDS), so that the next build plans the chains anew.

    header_chains.py plan  <include dir> <plan file> --group NAME HEADER... [--group NAME HEADER...]
    header_chains.py check <include dir> <plan file> <stamp file>

The plan file: one chain a line, `<group> <header> <header>...` in the order the chain's TU includes them.
Chains never cross groups (the torch-free headers are checked without LibTorch on the include path).
"""
import argparse
import os
import pathlib
import re
import sys

INCLUDE = re.compile(r"^\s*#\s*include\s*<(hpctrain/[^>]+)>")
CONDITION_OPEN = re.compile(r"^\s*#\s*if")
CONDITION_CLOSE = re.compile(r"^\s*#\s*endif")
# Lines that cannot change what a later #include declares or means: blank, comments, #pragma and #include.
NOT_CODE = re.compile(r"^\s*($|//|/\*|\*|#\s*(pragma|include)\b)")


class Headers:
    """The hpctrain headers under an include directory: each one's unconditional hpctrain includes, whether one
    of them comes after other lines (late_include), and (on demand) everything it includes transitively."""

    def __init__(self, include_dir):
        self.includes = {}
        self.late_include = set()
        root = pathlib.Path(include_dir)
        for path in sorted(root.glob("hpctrain/**/*.hpp")):
            name = path.relative_to(root).as_posix()
            self.includes[name] = []
            depth, seen_other = 0, False
            for line in path.read_text(encoding="utf-8").splitlines():
                if CONDITION_OPEN.match(line):
                    depth += 1
                elif CONDITION_CLOSE.match(line):
                    depth -= 1
                included = INCLUDE.match(line)
                if included and depth == 0:
                    self.includes[name].append(included.group(1))
                    if seen_other:
                        self.late_include.add(name)
                # Anything but the unconditional includes (an #if reads macros, which a header included before
                # in the chain may define) ends the part of the header where the chain's order cannot matter.
                if depth > 0 or not NOT_CODE.match(line):
                    seen_other = True
        self._closures = {}

    def closure(self, name):
        """What `name` includes, directly or through other hpctrain headers (itself not counted)."""
        if name not in self._closures:
            seen, stack = set(), list(self.includes.get(name, []))
            while stack:
                header = stack.pop()
                if header not in seen:
                    seen.add(header)
                    stack.extend(self.includes.get(header, []))
            seen.discard(name)
            self._closures[name] = seen
        return self._closures[name]


def plan_chains(headers, checked):
    """Covers `checked` by chains: from the header that includes the most, down through the unchecked header it
    includes that includes the most, and so on. Returned in include order (the deepest header first)."""
    size = lambda name: (len(headers.closure(name)), name)  # noqa: E731  (ties broken by name: a stable plan)
    left = set(checked)
    chains = []
    for top in sorted(checked, key=size, reverse=True):
        if top not in left:
            continue
        chain = [top]
        left.discard(top)
        while chain[-1] not in headers.late_include:
            below = [name for name in headers.closure(chain[-1]) if name in left]
            if not below:
                break
            chain.append(max(below, key=size))
            left.discard(chain[-1])
        chains.append(chain[::-1])
    return chains


def broken_links(headers, chain):
    """Why a chain no longer shows each of its headers self-contained, if it does not."""
    problems = []
    for position, (earlier, later) in enumerate(zip(chain, chain[1:])):
        if earlier not in headers.closure(later):
            problems.append(f"{later} no longer includes {earlier}, which its check includes before it")
        if position > 0 and earlier in headers.late_include:
            problems.append(f"{earlier} has an #include after other lines, so it must come first in its check")
    if len(chain) > 1 and chain[-1] in headers.late_include:
        problems.append(f"{chain[-1]} has an #include after other lines, so it must come first in its check")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["plan", "check"])
    parser.add_argument("include_dir")
    parser.add_argument("plan_file")
    parser.add_argument("stamp", nargs="?")
    parser.add_argument("--group", nargs="+", action="append", default=[], metavar=("NAME", "HEADER"))
    args = parser.parse_args()
    headers = Headers(args.include_dir)
    plan = pathlib.Path(args.plan_file)
    if args.mode == "plan":
        lines = []
        for group, *checked in args.group:
            unknown = [name for name in checked if name not in headers.includes]
            if unknown:
                sys.exit(f"header_chains.py: not under {args.include_dir}: {' '.join(unknown)}")
            lines += [" ".join([group] + chain) for chain in plan_chains(headers, checked)]
        text = "\n".join(lines) + "\n"
        if not plan.exists() or plan.read_text() != text:  # unchanged: CMake need not write the TUs again
            plan.write_text(text)
        return
    problems = []
    for line in plan.read_text().splitlines():
        problems += broken_links(headers, line.split()[1:])
    if problems:
        os.utime(plan)  # CMake plans again at the next build
        sys.exit("header_chains.py: the self-containment checks' chains no longer hold:\n  " + "\n  ".join(problems)
                 + "\nbuild again: CMake plans the chains anew")
    pathlib.Path(args.stamp).touch()


if __name__ == "__main__":
    main()
