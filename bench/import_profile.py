#!/usr/bin/env python3
"""What `gpuwarden check` imports, what each import costs, and which imported modules it never ran.

    .venv/bin/python bench/import_profile.py [--top 25] [--json OUT] [-- CHECK ARGS]

Default command: `check --example healthy --format json -o /dev/null`. Three fresh interpreters:
1. `-X importtime`: the modules by self time (top --top), their sum, and the sum per top-level
   package (gpuwarden, click, yaml, the standard library's ...);
2. `-X importtime -c pass`: the interpreter's own imports, for scale;
3. the check once more under a profile hook (sys.setprofile) that records which modules had a
   function of theirs run (module and class bodies, which run at import, do not count): a module
   loaded but with no function run was imported for nothing — or only for constants or types,
   which is why this is a list to read, not a test (tests/test_perf_paths.py is the test).
The tree is byte-compiled first (`python -m compileall`, as bench/gpu_live.py does): with
PYTHONDONTWRITEBYTECODE set and no `.pyc`, every import would be timed with its compilation.
Numbers for reading on this machine (one run, noisy): bench/gpu_live.py is the interleaved timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
DEFAULT = ["check", "--example", "healthy", "--format", "json", "-o", os.devnull]

#: runs the command under a profile hook; prints {"loaded": [...], "ran": [...]} as its last line
_TRACER = r"""
import json, runpy, sys
argv = json.loads(sys.argv[1])
ran = set()
def hook(frame, event, arg):
    # CO_NEWLOCALS: a function, not a module or class body; by its globals' module, so that the methods
    # dataclasses generate (compiled from "<string>" into the module's globals) count for their module
    if event == "call" and frame.f_code.co_flags & 0x2:
        ran.add(frame.f_globals.get("__name__"))
sys.argv = ["gpuwarden", *argv]
sys.setprofile(hook)
try:
    runpy.run_module("gpuwarden", run_name="__main__")
except SystemExit:
    pass
sys.setprofile(None)
files = {}
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if f:
        files[name] = f
print(json.dumps({"loaded": sorted(files), "ran": sorted(n for n in files if n in ran)}))
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"))


def importtime(argv: list[str]) -> list[tuple[str, int, int]]:
    """(module, self us, cumulative us) of each import, in import order."""
    err = subprocess.run([PY, "-X", "importtime", *argv], capture_output=True, text=True, env=_env(),
                         timeout=120).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        rows.append((parts[2].strip(), int(parts[0]), int(parts[1])))
    return rows


def package(name: str) -> str:
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top.startswith("_"):
        return "(standard library)"
    return top


def loaded_and_ran(argv: list[str]) -> dict[str, list[str]]:
    out = subprocess.run([PY, "-c", _TRACER, json.dumps(argv)], capture_output=True, text=True, env=_env(),
                         timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    argv = sys.argv[1:]
    check = DEFAULT
    if "--" in argv:
        i = argv.index("--")
        argv, check = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="also write the figures as JSON here")
    a = ap.parse_args(argv)
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "src")], stdout=subprocess.DEVNULL, check=False)

    rows = importtime(["-m", "gpuwarden", *check])
    base = importtime(["-c", "pass"])
    total, base_total = sum(r[1] for r in rows), sum(r[1] for r in base)
    print(f"gpuwarden {' '.join(check)}")
    print(f"  {len(rows)} imports, self times sum {total / 1000:.1f} ms "
          f"(python -c pass: {len(base)} imports, {base_total / 1000:.1f} ms)")
    per_pkg: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, self_us, _ in rows:
        p = per_pkg[package(name)]
        p[0] += self_us
        p[1] += 1
    print("\n  by package (self ms, modules):")
    for pkg, (us, n) in sorted(per_pkg.items(), key=lambda kv: -kv[1][0]):
        print(f"    {us / 1000:7.1f}  {n:4d}  {pkg}")
    print(f"\n  top {a.top} by self time (ms self / cumulative):")
    for name, self_us, cum in sorted(rows, key=lambda r: -r[1])[:a.top]:
        print(f"    {self_us / 1000:6.1f} / {cum / 1000:6.1f}  {name}")

    lr = loaded_and_ran(check)
    ran = set(lr["ran"])
    idle = [m for m in lr["loaded"] if m not in ran]
    ours = [m for m in idle if m.split(".")[0] == "gpuwarden"]
    cost = {name: self_us for name, self_us, _ in rows}
    print(f"\n  loaded {len(lr['loaded'])} modules with a file; no function ran in {len(idle)} "
          f"(import self time {sum(cost.get(m, 0) for m in idle) / 1000:.1f} ms); gpuwarden's:")
    for m in sorted(ours, key=lambda m: -cost.get(m, 0)):
        print(f"    {cost.get(m, 0) / 1000:6.1f}  {m}")
    others = sorted((m for m in idle if m not in ours), key=lambda m: -cost.get(m, 0))[:15]
    print("  others (costliest 15):")
    for m in others:
        print(f"    {cost.get(m, 0) / 1000:6.1f}  {m}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "command": check, "imports": len(rows), "self_ms": total / 1000, "python_pass_self_ms": base_total / 1000,
            "by_package_ms": {k: v[0] / 1000 for k, v in per_pkg.items()},
            "top": [{"module": n, "self_ms": s / 1000, "cumulative_ms": c / 1000}
                    for n, s, c in sorted(rows, key=lambda r: -r[1])[:a.top]],
            "no_function_ran": {m: cost.get(m, 0) / 1000 for m in idle}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
