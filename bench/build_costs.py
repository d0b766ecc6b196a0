#!/usr/bin/env python3
"""What a gpuwarden command spends on building classes and patterns: dataclasses and regular expressions.

Records are msgspec Structs since issue 34 (built in C: not timed here, counted as `structs`); the
dataclasses left are the agent's and controller's option classes, which `check` does not load.

    python3 bench/build_costs.py check --example healthy --format json -o /dev/null

Runs the command in this interpreter (PYTHONPATH picks the tree) with `dataclasses` and `re`
timed: how many dataclasses were created and regular expressions compiled, how long that took, and
the modules that paid most. Prints one JSON object on stderr (the command's output stays on stdout).
The timing wrappers add a little; the figures are for reading, bench/gpu_live.py is the benchmark.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import runpy
import sys
import time


def main() -> int:
    spent: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    process_class, compile_ = dataclasses._process_class, re._compile  # type: ignore[attr-defined]

    def timed_class(cls, *args, **kwargs):
        t = time.perf_counter()
        try:
            return process_class(cls, *args, **kwargs)
        finally:
            spent["dataclass " + cls.__module__] += time.perf_counter() - t
            count["dataclass"] += 1

    def timed_compile(pattern, flags):
        t = time.perf_counter()
        out = compile_(pattern, flags)
        dt = time.perf_counter() - t
        if dt > 2e-5:  # a compilation, not a hit in re's cache
            f = sys._getframe(1)
            while f is not None and f.f_globals.get("__name__", "").split(".")[0] == "re":
                f = f.f_back
            spent["re " + (f.f_globals.get("__name__", "?") if f is not None else "?")] += dt
            count["re"] += 1
        return out

    dataclasses._process_class = timed_class  # type: ignore[attr-defined]
    re._compile = timed_compile  # type: ignore[attr-defined]
    sys.argv = ["gpuwarden", *sys.argv[1:]]
    t0 = time.perf_counter()
    code = 0
    try:
        runpy.run_module("gpuwarden", run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    total = time.perf_counter() - t0
    structs = _struct_classes()
    ms = {k: round(v * 1000, 2) for k, v in spent.most_common()}
    print(json.dumps({
        "python": sys.version.split()[0], "exit": code, "command_ms": round(total * 1000, 1),
        "dataclasses": count["dataclass"], "structs": structs,
        "dataclasses_ms": round(sum(v for k, v in ms.items() if k.startswith("dataclass ")), 1),
        "regex_compiled": count["re"], "regex_ms": round(sum(v for k, v in ms.items() if k.startswith("re ")), 1),
        "by_module_ms": dict(list(ms.items())[:40]),
    }, indent=1), file=sys.stderr)
    return 0


def _struct_classes() -> int:
    """How many msgspec Struct classes the command built (gpuwarden's records)."""
    base = getattr(sys.modules.get("msgspec"), "Struct", None)
    if base is None:
        return 0
    seen, todo = set(), [base]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return len(seen)


if __name__ == "__main__":
    sys.exit(main())
