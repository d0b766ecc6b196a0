"""bench/event_latency.py runs as the lead runs it on the GPU host: each tree-based fault class is raised
(and an Xid 79 fenced) within its timeout, the JSON says what was met, the NVML-lost class runs
through a stand-in NVML and the pod-rejected one through the real test API server (or says why not).
Not timed (a loaded machine), only complete."""

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
