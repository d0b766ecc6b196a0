"""bench/event_latency.py runs as the lead runs it on the GPU host: each tree-based fault class is raised
(and an Xid 79 fenced) within its timeout, the JSON says what was met, the NVML-lost class runs
through a stand-in NVML and the pod-rejected one through the real test API server (or says why not), each
woken by its own source; a run stuck past its deadline is reported as a timeout with its state, and one stuck
past the grace ends the bench with what was measured saved. Not timed (a loaded machine), only complete."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "event_latency.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="ROOT ONLY: the bench's node tree needs mknod")
def test_the_latency_bench_raises_each_tree_fault_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--runs", "2", "--out", str(out),
                           "--classes", "xid79,uvm-removed,plugin-socket-gone,nvml-lost,pod-rejected"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["defaults"]["interval_s"] == 60
    c = doc["classes"]
    for name, code in (("xid79", "GPU-HW-002"), ("uvm-removed", "GPU-DRV-003"), ("plugin-socket-gone", "GPU-K8S-002")):
        assert c[name]["code"] == code and c[name]["raised"] == 2, (name, c[name])
        assert all(r["raised_s"] < 10 for r in c[name]["rows"])
    assert c["xid79"]["fenced"] == 2  # GPU-HW-002 is a node fault: the node is tainted
    assert c["uvm-removed"]["targets"]["fenced_p99"].startswith("n/a")
    # through the NVML source (the stand-in NVML of tests/wake, built with gcc) and the pods watch (the real test
    # API server when GPUWARDEN_TESTAPISERVER is set); otherwise a reason
    for name, code, can in (("nvml-lost", "GPU-HW-002", bool(shutil.which("gcc"))),
                            ("pod-rejected", "GPU-K8S-012", bool(os.environ.get("GPUWARDEN_TESTAPISERVER")))):
        if can:
            assert c[name]["code"] == code and c[name]["raised"] == 2 and c[name]["fenced"] == 2, (name, c[name])
        else:
            assert c[name]["not_run"], (name, c[name])
    # each class was woken by the source it measures (nvml-lost: NVML is the run's only source)
    for name, source in (("xid79", "logfile/log"), ("uvm-removed", "inotify/"), ("plugin-socket-gone", "inotify/"),
                         ("nvml-lost", "nvml/gpu"), ("pod-rejected", "pods/")):
        for r in c[name].get("rows", []):
            assert any(k.startswith(source) for k in r["woken_by"]), (name, r)
        if name == "nvml-lost" and "rows" in c[name]:
            assert all(set(r["woken_by"]) == {"nvml/gpu"} for r in c[name]["rows"]), c[name]["rows"]
    # a line per run, flushed as it ends
    assert proc.stdout.count("[xid79 ") == 2 and "[xid79 2/2] raised " in proc.stdout


def _hung_nvml_bench(tmp_path: Path, deadline: float, grace: float) -> tuple[subprocess.CompletedProcess, dict]:
    """nvml-lost over the stand-in NVML hung in nvmlInit (FAKE_NVML_HANG_FILE present): the source never gets
    ready, so the run outlives a short deadline."""
    hang = tmp_path / "hang"
    hang.write_text("")
    out = tmp_path / "lat.json"
    env = dict(os.environ, FAKE_NVML_HANG_FILE=str(hang))
    proc = subprocess.run([sys.executable, str(BENCH), "--runs", "2", "--classes", "nvml-lost", "--out", str(out),
                           "--deadline", str(deadline), "--grace", str(grace)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    return proc, json.loads(out.read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the bench's node tree needs mknod")
@pytest.mark.skipif(not shutil.which("gcc"), reason="no gcc for the stand-in NVML")
def test_a_run_past_its_deadline_is_a_timeout_with_the_nvml_childs_state(tmp_path: Path) -> None:
    proc, doc = _hung_nvml_bench(tmp_path, deadline=2, grace=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[nvml-lost 1/2] TIMEOUT after 2s" in proc.stdout  # said when it happened, not at the end
    c = doc["classes"]["nvml-lost"]
    r = c["rows"][0]
    assert r["timeout"].startswith("run not done within its deadline") and r["raised_s"] is None
    # what it was doing: the NVML source starting or retrying, its child (sleeping in the hung init, or between
    # two tries), the bench's main thread waiting for the source
    assert r["state"]["nvml"]["state"] in ("starting", "retrying") and "stacks" in r["state"]
    assert r["late"]["why"].startswith("NVML source not ready")  # the run ended later: kept beside the timeout
    assert c["raised"] == 0 and c["targets"]["raised_p50"] == "missed"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the bench's node tree needs mknod")
@pytest.mark.skipif(not shutil.which("gcc"), reason="no gcc for the stand-in NVML")
def test_a_run_stuck_past_the_grace_ends_the_bench_with_its_json_saved(tmp_path: Path) -> None:
    proc, doc = _hung_nvml_bench(tmp_path, deadline=1, grace=1)
    assert proc.returncode == 3, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    c = doc["classes"]["nvml-lost"]
    assert c["aborted"].startswith("run 1 still not done") and c["rows"][0]["timeout"]
