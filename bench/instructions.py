#!/usr/bin/env python3
"""Instructions a command executes, counted by valgrind's callgrind: a cost figure that load does not move.

    python3 bench/instructions.py [--compare OTHER_CHECKOUT] [--out FILE] [-- CHECK ARGS]

On a shared machine wall and CPU times of one process vary by 2x from run to run (docs/performance.md,
Method); the number of instructions the process executes varies by well under 1%. This counts them for
`gpuwarden check --example healthy --format json` (or CHECK ARGS), for `python3 -c pass` (the
interpreter alone, the budget's unit) and, with --compare, for another checkout's check, and splits a
check's count by where the interpreter spent it:

- `parse_generated`: parsing source text at run time (exec/eval of strings: the methods that
  `@dataclass` and `namedtuple` generate; modules come from `.pyc` and are not parsed),
- `compile_ast`: compiling such text to code,
- `unmarshal`: loading the modules' `.pyc`,
- `regex_match`: regular-expression matching (compiling a pattern is Python code in `re` and counts
  as `other`).

Instructions are not time (a cache miss or a page fault costs more than an add), so the ratio to
`python3 -c pass` differs from the wall-time ratio the budget uses; bench/gpu_live.py --dry-run
measures that one. Needs valgrind; the trees are byte-compiled first. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: inclusive counts of these interpreter functions, by name in callgrind_annotate's output
PARTS = {"parse_generated": "_PyPegen_run_parser_from_string", "compile_ast": "_PyAST_Compile",
         "unmarshal": "marshal.c:r_object", "regex_match": "sre.c:_sre_SRE_Pattern_match"}


def count(argv: list[str], src: Path, split: bool) -> dict[str, int]:
    """Instructions of one run of argv with src on PYTHONPATH; with split, PARTS as well."""
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
                           env=env, cwd=str(REPO), capture_output=True, text=True, timeout=900)
        m = re.search(r"Collected : ([0-9]+)", p.stderr)
        if not m:
            raise SystemExit(f"no count from valgrind for {argv}: {p.stderr[-500:]}")
        res = {"instructions": int(m.group(1))}
        if split:
            ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", out], capture_output=True, text=True,
                                 timeout=300).stdout
            for key, fn in PARTS.items():
                # the outermost (non-recursive) entry of the function: callgrind names recursion fn'2
                hit = re.search(r"^\s*([0-9,]+) \([^)]*\)\s+\S*" + re.escape(fn) + r"(?: |$)", ann, re.M)
                res[key] = int(hit.group(1).replace(",", "")) if hit else 0
        return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", metavar="DIR", help="another checkout whose check is counted too")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default="")
    ap.add_argument("check_args", nargs="*", help="after --: the check's arguments")
    a = ap.parse_args()
    args = a.check_args or ["--example", "healthy", "--format", "json"]
    check = [a.python, "-m", "gpuwarden", "check", *args, "-o", os.devnull]
    trees = {"check": REPO / "src", **({"check [compare]": Path(a.compare).resolve() / "src"} if a.compare else {})}
    for src in trees.values():
        subprocess.run([a.python, "-m", "compileall", "-q", str(src)], stdout=subprocess.DEVNULL, check=True)
    version = subprocess.run([a.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    res = {"command": " ".join(["gpuwarden", "check", *args]), "python": version,
           "compare": str(a.compare) if a.compare else None,
           "python3 -c pass": count([a.python, "-c", "pass"], REPO / "src", split=False)}
    for name, src in trees.items():
        res[name] = count(check, src, split=True)
    base = res["python3 -c pass"]["instructions"]
    for name in trees:
        c = res[name]
        c["ratio_to_python_pass"] = round(c["instructions"] / base, 2)
        c["shares"] = {k: round(c[k] / c["instructions"], 3) for k in PARTS}
    if a.compare:
        res["check_vs_compare"] = round(res["check"]["instructions"] / res["check [compare]"]["instructions"], 3)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
