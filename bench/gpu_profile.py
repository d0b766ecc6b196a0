#!/usr/bin/env python3
"""On a GPU host: where a live `gpuwarden check` spends its time (start-up, imports, NVML, the check).

    python3 bench/gpu_profile.py [--compare DIR]      # as root, from the repository root

Prints plain text: the interpreter's own start-up (`-X importtime -c pass`, with and without
site-packages), `nvidia-smi -q` alone, the NVML snapshot in process (this tree's ctypes client,
and nvidia-ml-py's import and nvmlInit), `-X importtime` of the live check (the 30 costliest
modules by cumulative time), what it spends creating dataclasses and compiling regular
expressions (bench/build_costs.py), and a cProfile of it without probes. With --compare, the same for
another checkout. Numbers for reading, not a benchmark: bench/gpu_live.py is the interleaved one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def timed(argv: list[str], env: dict[str, str], n: int = 5) -> str:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        except OSError as exc:
            return str(exc)
        ts.append(time.perf_counter() - t0)
    return f"median {statistics.median(ts) * 1000:.0f} ms (min {min(ts) * 1000:.0f}, n={n})"


def importtime(argv: list[str], env: dict[str, str], top: int) -> str:
    err = subprocess.run([PY, "-X", "importtime", *argv], capture_output=True, text=True, env=env).stderr
    rows = [ln for ln in err.splitlines() if ln.startswith("import time:") and "|" in ln]
    rows = [r for r in rows if r.split("|")[1].strip().isdigit()]
    total = sum(int(r.split("|")[0].split(":")[1]) for r in rows)
    best = sorted(rows, key=lambda r: int(r.split("|")[1]))[-top:]
    return f"{len(rows)} modules, self times sum {total / 1000:.0f} ms\n" + "\n".join(best)


def section(title: str, body: str) -> None:
    print(f"\n== {title}\n{body}", flush=True)


def tree(label: str, root: Path, base: dict[str, str]) -> None:
    env = dict(base, PYTHONPATH=str(root / "src"))
    live = ["-m", "gpuwarden", "check", "--root", "/", "--format", "json", "-o", os.devnull]
    section(f"{label}: check --root / (probes on)", timed([PY, *live], env))
    section(f"{label}: check --root / --no-probes", timed([PY, *live, "--no-probes"], env))
    section(f"{label}: python3 -c 'import gpuwarden.cli'", timed([PY, "-c", "import gpuwarden.cli"], env))
    section(f"{label}: -X importtime of the live check (top 30 by cumulative, us)", importtime(live, env, 30))
    for _ in range(3):
        costs = subprocess.run([PY, str(REPO / "bench/build_costs.py"), *live[2:], "--no-probes"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        section(f"{label}: dataclasses and regular expressions built by check --no-probes (bench/build_costs.py)",
                costs.stderr[-3000:])
    prof = subprocess.run([PY, "-m", "cProfile", "-s", "cumulative", *live, "--no-probes"], capture_output=True,
                          text=True, env=env).stdout
    section(f"{label}: cProfile of check --no-probes (first 45 lines, by cumulative)", "\n".join(prof.splitlines()[:45]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", metavar="DIR", help="another checkout, profiled the same way")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    trees = [("this tree", REPO)] + ([("compare", Path(a.compare).resolve())] if a.compare else [])
    for _, root in trees:
        subprocess.run([PY, "-m", "compileall", "-q", str(root / "src")], stdout=subprocess.DEVNULL, check=False)
    section("interpreter", f"{sys.version}\nPYTHON* env: "
            + str({k: v for k, v in os.environ.items() if k.startswith("PYTHON")}) + f"\ncpus {os.cpu_count()}")
    section("python3 -c pass", timed([PY, "-c", "pass"], base))
    section("python3 -S -c pass (no site-packages)", timed([PY, "-S", "-c", "pass"], base))
    section("python3 -I -c pass (isolated)", timed([PY, "-I", "-c", "pass"], base))
    section("-X importtime -c pass (top 15)", importtime(["-c", "pass"], base, 15))
    section("nvidia-smi -q", timed(["nvidia-smi", "-q"], base))
    code = ("import time,sys; t=time.perf_counter(); from gpuwarden.probes import nvml; t1=time.perf_counter(); "
            "s=nvml.snapshot(); t2=time.perf_counter(); "
            "print(f'client import {1e3*(t1-t):.1f} ms, snapshot {1e3*(t2-t1):.1f} ms, init={s.get(\"init\")}, '"
            "f'gpus={len(s.get(\"gpus\") or [])}, pynvml loaded={\"pynvml\" in sys.modules}')")
    for _ in range(3):
        r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=dict(base, PYTHONPATH=str(REPO / "src")))
        section("NVML snapshot in process (ctypes client)", r.stdout + r.stderr[-300:])
    ref = ("import time; t=time.perf_counter(); import pynvml; t1=time.perf_counter(); pynvml.nvmlInit(); "
           "t2=time.perf_counter(); n=pynvml.nvmlDeviceGetCount(); pynvml.nvmlShutdown(); "
           "print(f'import pynvml {1e3*(t1-t):.1f} ms, nvmlInit {1e3*(t2-t1):.1f} ms, {n} GPU(s)')")
    for _ in range(3):
        r = subprocess.run([PY, "-c", ref], capture_output=True, text=True, env=base)
        section("nvidia-ml-py: import and nvmlInit", r.stdout + r.stderr[-300:])
    for label, root in trees:
        tree(label, root, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
