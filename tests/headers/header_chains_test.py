#!/usr/bin/env python3
"""header_chains.py on a small include tree: the chains it plans, the headers it keeps first, the groups it keeps
apart, and the check that fails (and asks CMake to plan again) once an edit breaks a chain.

    header_chains_test.py     exit 0 when every expectation holds, else 1 naming the first that does not
"""
import os
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).with_name("header_chains.py")
TREE = {
    "a.hpp": "#pragma once\n// a comment\nint a();\n",
    "b.hpp": "#pragma once\n#include <vector>\n#include <hpctrain/a.hpp>\nint b();\n",
    "c.hpp": "#pragma once\n#include <hpctrain/b.hpp>\nint c();\n",
    # An #if before an unconditional include: d must come first in its chain.
    "d.hpp": "#pragma once\n#if defined(X)\n#endif\n#include <hpctrain/c.hpp>\nint d();\n",
    # A conditional include does not count as "e includes d" (else e's chain would take d, which includes more
    # than c, and end there).
    "e.hpp": "#pragma once\n#include <hpctrain/c.hpp>\n#if HPCTRAIN_Y\n#include <hpctrain/d.hpp>\n#endif\nint e();\n",
    "f.hpp": "#pragma once\n#include <hpctrain/e.hpp>\nint f();\n",
    # g's chain takes d and ends there: d comes first.
    "g.hpp": "#pragma once\n#include <hpctrain/d.hpp>\nint g();\n",
}


def run(*arguments):
    return subprocess.run([sys.executable, str(SCRIPT), *arguments], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def expect(condition, what):
    if not condition:
        sys.exit(f"header_chains_test.py: {what}")


def main():
    with tempfile.TemporaryDirectory() as directory:
        include = pathlib.Path(directory, "include")
        (include / "hpctrain").mkdir(parents=True)
        for name, text in TREE.items():
            (include / "hpctrain" / name).write_text(text)
        plan = pathlib.Path(directory, "plan.txt")
        stamp = pathlib.Path(directory, "checked")
        names = [f"hpctrain/{name}" for name in TREE]
        one = [name for name in names if name != "hpctrain/f.hpp"]
        done = run("plan", str(include), str(plan), "--group", "one", *one, "--group", "two", "hpctrain/f.hpp")
        expect(done.returncode == 0, f"plan failed: {done.stdout}")
        chains = plan.read_text().splitlines()
        expect(chains == ["one hpctrain/d.hpp hpctrain/g.hpp",
                          "one hpctrain/a.hpp hpctrain/b.hpp hpctrain/c.hpp hpctrain/e.hpp",
                          "two hpctrain/f.hpp"], f"unexpected chains {chains}")

        done = run("check", str(include), str(plan), str(stamp))
        expect(done.returncode == 0 and stamp.exists(), f"the check of a fresh plan failed: {done.stdout}")

        os.utime(plan, (0, 0))
        (include / "hpctrain" / "b.hpp").write_text("#pragma once\nint b();\n")  # b no longer includes a
        done = run("check", str(include), str(plan), str(stamp))
        expect(done.returncode != 0, "the check passed a chain whose link an edit removed")
        expect("hpctrain/b.hpp no longer includes hpctrain/a.hpp" in done.stdout, f"the check's message: {done.stdout}")
        expect(plan.stat().st_mtime > 0, "the failed check did not touch the plan (CMake would not plan again)")

        done = run("plan", str(include), str(plan), "--group", "one", *one)
        expect(done.returncode == 0 and run("check", str(include), str(plan), str(stamp)).returncode == 0,
               "the plan made after the edit does not hold")
        expect("one hpctrain/a.hpp hpctrain/b.hpp" not in plan.read_text(), f"replanned: {plan.read_text()}")
    print("header_chains.py: chains, first-only headers, groups and the failing check as expected")


if __name__ == "__main__":
    main()
