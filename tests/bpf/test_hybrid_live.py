"""Live, on a hybrid-cgroup host: the kernel applies the v1 devices list AND the unified hierarchy's
device programs, and `gpuwarden check` reports what the kernel enforces.

tests/support/hybrid.py builds the node (the `healthy` example's tree with this host's real v1
devices and cgroup2 hierarchies mounted into it, in a child's own cgroup and mount namespace) and
runs the real CLI on it: without options, with --probe-access, and with --no-probes under strace.
Skipped, with the reason, where the machine cannot (not root, not hybrid, no cgroup-device BPF,
no namespaces). tests/rules/test_devices_hybrid.py checks the same verdicts offline on CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support import hybrid
from tests.support.bundles import REPO

pytestmark = pytest.mark.root
UVM, CTL = "/dev/nvidia-uvm", "/dev/nvidiactl"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = hybrid.why_not()
    if reason:
        pytest.skip(f"live hybrid-cgroup test cannot run here: {reason}")
    work = tmp_path_factory.mktemp("hybrid")
    if os.statvfs(work).f_flag & os.ST_NODEV:
        pytest.skip(f"live hybrid-cgroup test cannot run here: {work} is mounted nodev")
    name = f"gpuwarden-hybrid-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'src'}")
    try:
        out = subprocess.run([sys.executable, "-m", "tests.support.hybrid", str(work), name], capture_output=True,
                             text=True, timeout=300, env=env, cwd=REPO)
    finally:
        hybrid.cleanup(name)
    if out.returncode != 0:
        if "unshare" in out.stderr or "mount" in out.stderr:
            pytest.skip(f"live hybrid-cgroup test cannot run here: {out.stderr.strip().splitlines()[-1]}")
        raise AssertionError(out.stderr)
    rep = json.loads(out.stdout)
    if "skip" in rep:
        pytest.skip(f"live hybrid-cgroup test cannot run here: {rep['skip']}")
    save = os.environ.get("GPUWARDEN_VALIDATION_OUT")
    if save:
        Path(save).write_text(json.dumps(rep, indent=1))
    return rep


def _dev001(rep: dict) -> list[dict]:
    return [f for f in rep["findings"] if f["code"] == "GPU-DEV-001"]


def test_kernel_applies_both_hierarchies(report: dict) -> None:
    assert report["v1_devices_list"] == "a *:* rwm\n"
    k = {mode: {Path(p).name: e for p, e in res.items()} for mode, res in report["kernel"].items()}
    assert k["both"]["nvidia-uvm"] == "EPERM"  # what a container in both cgroups gets
    assert k["unified_only"]["nvidia-uvm"] == "EPERM"
    assert k["v1_only"]["nvidia-uvm"] != "EPERM"  # the v1 list alone allows it
    assert k["both"]["nvidiactl"] != "EPERM"


def test_check_evaluates_the_unified_program_beside_the_v1_list(report: dict) -> None:
    (f,) = _dev001(report["check"])
    assert f["status"] == "confirmed" and f["data"]["cause"] == "unified-program"
    ev = {e["text"] for e in f["evidence"] if e["source"].startswith("bpf: ")}
    assert any(t.startswith(f"{UVM} (c 238:0): c 238:0 rw: denied by program #0") and "deny_uvm" in t
               and "devices.list allows: 'a *:* rwm' allows c 238:0 rw" in t for t in ev)


def test_probe_access_joins_both_cgroups_and_sees_eperm(report: dict) -> None:
    (f,) = _dev001(report["check_probe_access"])
    assert f["status"] == "confirmed" and f["data"]["cause"] == "unified-program"  # the program, read, still named
    probe = [e for e in f["evidence"] if e["source"].startswith("probe-access: ")]
    uvm = [e for e in probe if e["text"].startswith(UVM)]
    assert uvm and uvm[0]["text"].endswith("from inside the cgroup: EPERM")
    assert "/sys/fs/cgroup/devices/" in uvm[0]["source"] and "/sys/fs/cgroup/unified/" in uvm[0]["source"]


def test_no_probes_calls_no_bpf_and_says_not_evaluated(report: dict) -> None:
    rep = report["check_no_probes"]
    assert not [f for f in _dev001(rep) if f["status"] == "confirmed"]  # the v1 list alone cannot confirm it
    for f in _dev001(rep):  # the tree's nvidia-uvm is newer than the plugin: only that is stated, not a stale /dev
        assert "has no nvidia-uvm" not in f["summary"] and "snapshot" not in f["mechanism"]
    reasons = {u["source"]: u["reason"] for u in rep["unavailable"]}
    assert reasons["unified-hierarchy device programs"].startswith("not evaluated: live probes are off (--no-probes)")
    if report["bpf_calls"] is None:
        pytest.skip("strace not installed: the absence of bpf(2) is checked offline only "
                    "(tests/rules/test_devices_hybrid.py::test_no_probes_never_calls_bpf)")
    assert report["bpf_calls"]["probes"], "strace saw no bpf(2) even with probes on: the trace proves nothing"
    assert report["bpf_calls"]["no_probes"] == []
