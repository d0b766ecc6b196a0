#!/usr/bin/env python3
"""On a GPU host: a full live `gpuwarden check` (probes included) against `nvidia-smi -q`, side by side.

    python3 bench/gpu_live.py [--n 15] [--out FILE]       # as root, from the repository root

Budgets (docs/performance.md): gpuwarden's own time on a GPU host (the check less `python3 -c pass`,
same interpreter) is at most `nvidia-smi -q`'s; with --dry-run (no GPU: the healthy example) the
check takes at most 6x `python3 -c pass`. Both are run as processes, interleaved round by round
(the order rotates each round), after one warm-up run of each; the summary gives medians, the 10th/90th percentiles and the ratio of medians. Also timed:
`check --no-probes` (what the probes cost), `python3 -c "import gpuwarden.cli"` (start-up) and
`python3 -c pass` (the interpreter alone). Child CPU time comes from wait4(2). Nothing on the GPU is
changed; the NVML probe only reads.

The source tree is byte-compiled first (`python3 -m compileall`), as `pip install` does for an
installed package: with PYTHONDONTWRITEBYTECODE set and no `.pyc`, every run would compile ~250
modules from source (~0.5 s) and measure the compiler, not the check. `--compare DIR` adds the
check of another checkout (e.g. the code before a change) to the same interleaved rounds.

Prints one JSON object (also written to --out, default $OUT/gpu_live.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(argv: list[str], env: dict[str, str], stdout) -> tuple[float, float, int]:
    """(wall s, child cpu s, exit code) of one process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.DEVNULL, env=env, cwd=str(REPO))
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, p.returncode


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def goals(wall: dict[str, list[float]], check: str, smi: float) -> dict[str, float]:
    """The check's own time (its median less `python3 -c pass`'s) and the two ratios the budgets use."""
    ck, py = statistics.median(wall[check]), statistics.median(wall["python3 -c pass"])
    return {"own_time_s": round(ck - py, 4), "ratio_own_time_to_nvidia_smi": round((ck - py) / smi, 3),
            "ratio_check_to_python_pass": round(ck / py, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=15, help="timed rounds (after one warm-up round)")
    ap.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu_live.json") if os.environ.get("OUT") else "")
    ap.add_argument("--dry-run", action="store_true", help="exercise the script on a host without a GPU: the "
                    "'healthy' example instead of --root /, and `nvidia-smi` from PATH or a stand-in")
    ap.add_argument("--compare", metavar="DIR", help="another checkout whose live check joins the same rounds")
    ap.add_argument("--no-compile", action="store_true", help="do not byte-compile the trees first")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs gpuwarden (e.g. a venv of "
                    "its own, without the site-packages of another stack); default: this one")
    a = ap.parse_args()
    smi = shutil.which("nvidia-smi")
    if a.dry_run:
        smi = smi or shutil.which("true") or "/bin/true"
    elif not smi or not os.path.exists("/proc/driver/nvidia"):
        print(json.dumps({"error": "no NVIDIA driver or nvidia-smi on this host"}))
        return 2
    where = ["--example", "healthy"] if a.dry_run else ["--root", "/"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NO_COLOR="1")
    report = Path(tempfile.mkdtemp(prefix="gw-live-")) / "report.json"
    py = a.python
    trees = [REPO] + ([Path(a.compare).resolve()] if a.compare else [])
    if not a.no_compile:
        for t in trees:
            subprocess.run([py, "-m", "compileall", "-q", str(t / "src")], stdout=subprocess.DEVNULL, check=False)
    cmds = {
        "gpuwarden check (live, probes)": [py, "-m", "gpuwarden", "check", *where, "--format", "json",
                                           "-o", str(report)],
        "nvidia-smi -q": [smi, "-q"],
        "gpuwarden check --no-probes": [py, "-m", "gpuwarden", "check", *where, "--no-probes", "--format",
                                        "json", "-o", os.devnull],
        "python3 -c 'import gpuwarden.cli'": [py, "-c", "import gpuwarden.cli"],
        "python3 -c pass": [py, "-c", "pass"],
    }
    envs = {k: env for k in cmds}
    if a.compare:
        other = dict(env, PYTHONPATH=str(trees[1] / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for k in ("gpuwarden check (live, probes)", "gpuwarden check --no-probes"):
            cmds[f"{k} [compare]"] = [x if x != str(report) else os.devnull for x in cmds[k]]
            envs[f"{k} [compare]"] = other
    wall: dict[str, list[float]] = {k: [] for k in cmds}
    cpu: dict[str, list[float]] = {k: [] for k in cmds}
    codes: dict[str, set[int]] = {k: set() for k in cmds}
    names = list(cmds)
    with open(os.devnull, "wb") as null:
        for k in names:  # warm-up: page cache, .pyc files, the driver's state
            run(cmds[k], envs[k], subprocess.PIPE if k == "nvidia-smi -q" else null)
        for i in range(a.n):
            for k in names[i % len(names):] + names[:i % len(names)]:
                # nvidia-smi writes to a pipe that is drained, as a user would read it
                if k == "nvidia-smi -q":
                    t0 = time.perf_counter()
                    p = subprocess.run(cmds[k], capture_output=True, env=env)
                    w = time.perf_counter() - t0
                    wall[k].append(w)
                    codes[k].add(p.returncode)
                    continue
                w, c, rc = run(cmds[k], envs[k], null)
                wall[k].append(w)
                cpu[k].append(c)
                codes[k].add(rc)
    rep = {}
    try:
        rep = json.loads(report.read_text())
    except (OSError, ValueError):
        pass
    gl, sm = statistics.median(wall[names[0]]), statistics.median(wall["nvidia-smi -q"])
    out_dry = {"dry_run": True} if a.dry_run else {}
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip().splitlines()
    drv = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    out = {
        **out_dry,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "gpus": gpus, "driver": drv[0] if drv else ""},
        "rounds": a.n,
        "byte_compiled": not a.no_compile, "compare": str(trees[1]) if a.compare else None,
        "env": {k: os.environ[k] for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH") if k in os.environ},
        "commands": {k: " ".join(v) for k, v in cmds.items()},
        "median_s": {k: round(statistics.median(v), 4) for k, v in wall.items()},
        "p10_s": {k: round(pct(v, 0.1), 4) for k, v in wall.items()},
        "p90_s": {k: round(pct(v, 0.9), 4) for k, v in wall.items()},
        "child_cpu_median_s": {k: round(statistics.median(v), 4) for k, v in cpu.items() if v},
        "exit_codes": {k: sorted(v) for k, v in codes.items()},
        "ratio_check_to_nvidia_smi": round(gl / sm, 3),
        "ratio_no_probes_to_nvidia_smi": round(statistics.median(wall["gpuwarden check --no-probes"]) / sm, 3),
        **({"ratio_compare_to_nvidia_smi": round(statistics.median(wall["gpuwarden check (live, probes) [compare]"]) / sm, 3)}
           if a.compare else {}),
        "check_faster_than_nvidia_smi": gl < sm,
        # the goals of docs/performance.md: gpuwarden's own time (the check less the interpreter's
        # start-up, same interpreter) against `nvidia-smi -q`; and the whole check against `python -c pass`
        **goals(wall, "gpuwarden check (live, probes)", sm),
        **({f"compare_{k}": v for k, v in goals(wall, "gpuwarden check (live, probes) [compare]", sm).items()}
           if a.compare else {}),
        "last_report": {"findings": sorted({str(f.get("code")) for f in rep.get("findings", [])}),
                        "summary": rep.get("summary"), "unavailable": len(rep.get("unavailable", [])),
                        "not_evaluated": len(rep.get("not_evaluated", [])), "errors": rep.get("errors", [])[:5]},
    }
    text = json.dumps(out, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
