#!/usr/bin/env python3
"""Every command-line flag README.md and docs/*.md name is in the --help of the program they give it to, so a doc
cannot keep a flag the binaries dropped.

  docs_flags_test.py SOURCE_DIR NAME=PROGRAM...   exit 0 when every flag is found, 1 listing file:line: --flag (program)

Whose flag it is: in a ``` block, the program that starts the command (or appears in it: `srun ... ./gpt --x`);
`./train`, `<binary>` and the like are any program of the library's common CLI, so their flags must be in every
training example's --help. In inline code, the span's own first word when it is a program, else the nearest
program the paragraph names before it (as code, `sft`, or as a path, examples/sft.cpp), else any example program. Flags of other tools and of the repository's
scripts are skipped (TOOLS below). A synthetic doc with a made-up flag is checked first, so the walk can fail."""
import os
import re
import subprocess
import sys

# Other programs whose flags the docs quote: Slurm and its plugins, build and packaging tools, launchers,
# container runtimes, shell utilities. Their flags are theirs, not the examples'.
TOOLS = {
    "sbatch", "srun", "salloc", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr", "slurmd", "#SBATCH",
    "pyxis", "cmake", "ctest", "ninja", "make", "git", "pip", "pip3", "python", "python3", "torchrun", "wandb",
    "tensorboard", "ch-run", "ch-image", "ch-convert", "docker", "podman", "apptainer", "singularity", "enroot",
    "nvidia-smi", "nsys", "objdump", "ldd", "clang-format", "curl", "tar", "uv", "transformers",
}
# The repository's own test, bench and setup scripts (scripts/test, bench/gpu_budget, hpctrain_ddp_bench, x.py, ...)
# take flags of their own; they are documented beside their use.
SCRIPT = re.compile(r"^(\./)?(scripts|bench|tests)/|^hpctrain_\w+$|\.(py|sh)$")
# The library's private worker entry points: the rendered script passes them, no user types them, --help hides them.
INTERNAL = {"--hpctrain-worker", "--hpctrain-prepare"}
# An example's own flag that it takes out of argv before the common CLI parses it, so --help cannot list it.
UNLISTED = {("fashion_mnist", "--sweep")}
# Stand-ins for "some knob" (`--name=value`) and errors.md's deliberate typo (`--epoch` -> did you mean --epochs?).
NOT_FLAGS = {"--name", "--key", "--epoch"}
# Lines of the rendered script that a doc shows without naming sbatch, srun or the container runtime (a setter's
# `--nodes=n`, a preset's `--exclusive`): with no program named nearby these are the script's, not a knob.
SCRIPT_OPTIONS = {
    "--job-name", "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--mem", "--mem-per-gpu", "--qos",
    "--constraint", "--reservation", "--exclusive", "--output", "--error", "--mail-user", "--mail-type", "--chdir",
    "--dependency", "--requeue", "--open-mode", "--gres", "--gpus", "--gpus-per-task", "--gpu-bind", "--cpu-bind",
    "--wait-all-nodes", "--signal", "--kill-on-bad-exit", "--export", "--overcommit", "--tres-per-task",
    "--container-image", "--container-mounts", "--container-workdir", "--container-mount-home",
    "--no-container-mount-home", "--container-writable", "--container-readonly", "--container-env",
    "--container-name", "--bind", "--pwd", "--nv", "--cleanenv", "--cd", "--set-env",
}
# A page whose `./train` is one program: docs/quickstart-gpu.md's is containers/example/train.cpp, built in the image by
# the container tests and not here; its knobs are sft's (lm::causal_lm_training and the same data knobs, a subset),
# and tests/job/quickstart_gpu_test.sh runs each of the page's commands with the real one.
PAGE_TRAIN = {"docs/quickstart-gpu.md": "sft"}
COMMON, ANY, SKIP = "any training example", "any example", None
FLAG = re.compile(r"^--[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)?")  # --dpo.lr: a chain's knob for one stage


def help_flags(path):
    """The option names of `path --help` (the first column only: descriptions mention other programs' flags),
    and of each subcommand's --help."""
    def run(args):
        return subprocess.run([path] + args, capture_output=True, text=True, timeout=60).stdout
    text = run(["--help"])
    subs = re.findall(r"^  (\w+) ", text.split("Subcommands:")[1], re.M) if "Subcommands:" in text else []
    text += "".join(run([sub, "--help"]) for sub in subs)
    flags = set(re.findall(r"^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", text, re.M))
    # A chain of stages (hpctrain::run over stages) takes each knob once more per stage: --<stage>.<knob>.
    stages = re.search(r"one stage of the chain \(([^)]*)\)", text)
    for stage in stages.group(1).split(", ") if stages else []:
        flags |= {f"--{stage}.{flag[2:]}" for flag in flags if "." not in flag}
    return flags


def program_of(word, examples):
    """The program a word names: an example's name, COMMON, SKIP for another tool, or "" for no program."""
    word = word.strip("`'\"()[],:;")
    base = os.path.basename(word)
    if word in TOOLS or base in TOOLS or SCRIPT.search(word):
        return SKIP
    if base.endswith(".cpp"):
        base = base[:-4]
    if base in examples:
        return base
    if base in ("train", "<binary>", "binary", "<program>"):
        return COMMON
    return ""


def flags_in(text, program, examples):
    """(flag, program) of each flag of a command text, the program switching at every program name it holds."""
    for word in re.split(r"[\s|;&]+", text):
        named = program_of(word, examples) if not word.startswith(("-", "'-", '"-')) else ""
        if named != "":
            program = named
        flag = FLAG.match(word.strip("'\"`("))
        if flag:
            yield flag.group(0), program


def mentions(text, examples):
    """(position, program) of each program named in prose: code spans' first words and paths (English words like
    "generate" or "train" name no program outside code)."""
    found = [(m.start(), program_of(m.group(1).split()[0], examples)) for m in re.finditer(r"`([^`\s-][^`]*)`", text)]
    for m in re.finditer(r"(?<![\w`-])([\w.<>-]*/[\w./<>-]*[\w>])(?![\w`-])", text):  # paths: examples/sft.cpp
        found.append((m.start(), program_of(m.group(1), examples)))
    return sorted((pos, prog) for pos, prog in found if prog != "")


def occurrences(lines, examples):
    """(line number, flag, program) of every flag of a markdown page."""
    in_code, command, start, paragraph = False, "", 0, []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code, paragraph = not in_code, []
            continue
        if in_code:  # a command continued with '\' is one command
            command, start = (command + " " + line, start) if command else (line, number)
            if line.endswith("\\"):
                continue
            yield from ((start, f, p) for f, p in flags_in(command.lstrip("$ "), "", examples))
            command = ""
            continue
        if not line.strip() or re.match(r"^\s*([-*|#]|\d+\.) ", line):
            paragraph = []  # a blank line, list item, table row or heading starts a paragraph
        paragraph.append(line)
        prose = " ".join(paragraph)
        offset = len(prose) - len(line)
        for span in re.finditer(r"`([^`]+)`", line):
            before = [prog for pos, prog in mentions(prose, examples) if pos < offset + span.start()]
            context = before[-1] if before else ANY
            yield from ((number, f, p) for f, p in flags_in(span.group(1), context, examples))


def missing(lines, helps, where):
    common = set.intersection(*[flags for flags in helps.values() if "--max-steps" in flags])
    known = {COMMON: helps.get(PAGE_TRAIN.get(where), common), ANY: set.union(*helps.values()), **helps}
    return [f"{where}:{number}: {flag} ({program})" for number, flag, program in occurrences(lines, set(helps))
            if program is not SKIP and program != "" and flag not in INTERNAL | NOT_FLAGS
            and (program, flag) not in UNLISTED
            and flag not in known[program] and not (program == ANY and flag in SCRIPT_OPTIONS)]


def self_check():
    """A made-up flag in each place a doc names one is reported; other tools' flags are not."""
    helps = {"gpt": {"--help", "--max-steps", "--lr"}, "sft": {"--help", "--max-steps", "--from"}}
    doc = ["```", "./gpt --max-steps 3 --made-up-a", "srun --exclusive ./train --lr 1 \\", "  --made-up-b", "```",
           "Run `sft --from DIR --made-up-c`; `sbatch --test-only` then `--made-up-d`.", "", "Any: `--made-up-e`."]
    want = ["doc:2: --made-up-a (gpt)", "doc:3: --lr (any training example)", "doc:3: --made-up-b (any training example)",
            "doc:6: --made-up-c (sft)", "doc:8: --made-up-e (any example)"]
    got = missing(doc, helps, "doc")
    if got != want:
        sys.exit(f"FAIL: the self-check on a synthetic doc reports {got}, not {want}")


def main(root, programs):
    self_check()
    helps = {}
    for arg in programs:
        name, _, path = arg.partition("=")
        helps[name] = help_flags(path)
        if "--help" not in helps[name]:
            sys.exit(f"FAIL: {path} --help lists no option")
    pages = ["README.md"] + sorted(f"docs/{n}" for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    failures, count = [], 0
    for page in pages:
        lines = open(os.path.join(root, page), encoding="utf-8").read().split("\n")
        count += sum(1 for o in occurrences(lines, set(helps)) if o[2] not in (SKIP, ""))
        failures += missing(lines, helps, page)
    for failure in failures:
        print("MISSING", failure)
    print(f"{count} flags of {len(helps)} programs named in {len(pages)} pages; {len(failures)} not in their --help")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
