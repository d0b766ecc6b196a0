"""Hybrid hosts (v1 controllers + cgroup2 mounted beside them): both device policies decide, offline.

The trees are the built-in `healthy` example (v1 cgroupfs; its GPU container's devices.list
allows every NVIDIA node) made hybrid the way a real hybrid node reads: the container's
/proc/<pid>/cgroup names its unified cgroup, and the bundle carries the unified-hierarchy
programs the collector read. The program is the one recorded live on a hybrid host
(tests/bpf/fixtures/hybrid_uvm_deny.json; tests/bpf/test_hybrid_live.py reproduces it).
Also: under --no-probes a live check never calls bpf(2) and says the programs were not evaluated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuwarden.bpf import syscall
from gpuwarden.findings import Status
from gpuwarden.root import HostRoot
from tests.support.bundles import (
    CID_GPU, GPU_DEVICES_LIST, GPU_PID, POD_UID, copy_example, example_root, facts_of, findings, materialize, open_dir,
    write,
)

FIXTURE = json.loads((Path(__file__).parents[1] / "bpf/fixtures/hybrid_uvm_deny.json").read_text())
REL = f"kubepods/besteffort/pod{POD_UID}/{CID_GPU}"
UNIFIED_DIR = f"/sys/fs/cgroup/unified/{REL}"
PROC_CGROUP = f"12:devices:/{REL}\n1:name=systemd:/{REL}\n0::/{REL}\n"
ALLOW_ALL = "b4000000010000009500000000000000"  # r0 = 1; exit


def _hybrid(tmp_path: Path, programs: dict | None) -> Path:
    b = copy_example("healthy", tmp_path)
    write(b, f"/proc/{GPU_PID}/cgroup", PROC_CGROUP)
    if programs is not None:
        write(b, "/.gpuwarden/bpf-programs.json", json.dumps(programs))
    return b


def _entry(*hexes: str) -> dict:
    return {CID_GPU: {"cgroup": UNIFIED_DIR, "programs": [
        {"id": 167 + n, "name": f"p{n}", "tag": "", "xlated": h} for n, h in enumerate(hexes)]}}


def test_recorded_program_denies_uvm_and_the_v1_list_allows_it() -> None:
    assert FIXTURE["v1_devices_list"] == "a *:* rwm\n"
    assert FIXTURE["kernel"]["both"]["/dev/nvidia-uvm"] == "EPERM"
    assert FIXTURE["kernel"]["v1_only"]["/dev/nvidia-uvm"] != "EPERM"  # the v1 list alone lets it through


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_confirmed_when_a_unified_program_denies_what_the_v1_list_allows(tmp_path: Path) -> None:
    root = open_dir(_hybrid(tmp_path, _entry(FIXTURE["program"]["xlated"])))
    (ca,) = [c for c in facts_of(root).get("gpu_access").containers if c.container.id == CID_GPU]
    v = ca.verdict("/dev/nvidia-uvm")
    assert v.allowed is False and v.how == "bpf" and v.source == f"bpf: {UNIFIED_DIR}"
    assert "denied by program #0" in v.evidence and "devices.list allows: 'c 238:0 rw' allows c 238:0 rw" in v.evidence
    ctl = ca.verdict("/dev/nvidiactl")
    assert ctl.allowed is True and ctl.how == "bpf+devices.list"
    (f,) = [f for f in findings(root) if f.code == "GPU-DEV-001"]
    assert f.status is Status.CONFIRMED and f.data["cause"] == "unified-program"
    assert "denied /dev/nvidia-uvm by their device cgroup (trainer-0/trainer)" in f.summary
    assert "a device program on the container's unified (cgroup2) cgroup denies it" in f.summary
    assert "bpftool cgroup show" in f.remedy and "nvidia-modprobe" not in f.remedy


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_when_the_unified_programs_allow(tmp_path: Path) -> None:
    root = open_dir(_hybrid(tmp_path, _entry(ALLOW_ALL)))
    assert findings(root) == []


def test_hybrid_without_recorded_programs_is_undecided_not_allowed(tmp_path: Path) -> None:
    """A hybrid bundle without the programs: the v1 list's allow is not the answer; nothing is invented."""
    root = open_dir(_hybrid(tmp_path, None))
    facts = facts_of(root)
    (ca,) = [c for c in facts.get("gpu_access").containers if c.container.id == CID_GPU]
    v = ca.verdict("/dev/nvidia-uvm")
    assert v.allowed is None and v.how == "bpf+devices.list"
    assert "unified-hierarchy device programs not evaluated: no unified-hierarchy (cgroup2) device programs " \
           "recorded in this bundle" in v.evidence
    assert [g.source for g in facts.gaps() if g.source == "unified-hierarchy device programs"]
    assert findings(root) == []


def test_v1_denial_stands_whatever_the_unified_side_says(tmp_path: Path) -> None:
    """A v1 refusal is sufficient: the kernel checks both, either refusal is EPERM."""
    b = copy_example("cpu-manager-device-loss", tmp_path)
    write(b, f"/proc/{GPU_PID}/cgroup", PROC_CGROUP)  # hybrid, programs not recorded
    (f,) = findings(open_dir(b))
    assert f.code == "GPU-DEV-002" and f.status is Status.CONFIRMED
    assert any(e.source == GPU_DEVICES_LIST and "no entry allows c 195:255 rw" in e.text for e in f.evidence)


def test_a_process_the_kernel_places_in_no_unified_cgroup_is_judged_by_v1_alone() -> None:
    """/proc/<pid>/cgroup lists every hierarchy a process is in; without a "0::" line there is no
    unified cgroup whose programs could apply (the shipped examples read so)."""
    facts = facts_of(example_root("healthy"))
    (ca,) = [c for c in facts.get("gpu_access").containers if c.container.id == CID_GPU]
    assert ca.container.unified_cgroup is None and ca.container.unified_unknown == ""
    assert ca.verdict("/dev/nvidia-uvm").how == "devices.list"


def test_a_cgroup_namespace_relative_path_is_not_trusted(tmp_path: Path) -> None:
    """Read from inside another cgroup namespace, "0::" shows "/../.."; the same-named unified
    directory is looked for instead, and without one the programs are undecided, not skipped."""
    b = _hybrid(tmp_path, _entry(FIXTURE["program"]["xlated"]))
    write(b, f"/proc/{GPU_PID}/cgroup", f"12:devices:/{REL}\n0::/../../{REL}\n")
    facts = facts_of(open_dir(b))
    (ca,) = [c for c in facts.get("gpu_access").containers if c.container.id == CID_GPU]
    assert ca.container.unified_cgroup is None and "was not found" in ca.container.unified_unknown
    assert ca.verdict("/dev/nvidia-uvm").allowed is None


# --- --no-probes: no bpf(2) on a live node ---------------------------------------------------------


def _live_hybrid_tree(tmp_path: Path) -> HostRoot:
    node = materialize(example_root("healthy"), tmp_path / "node")
    (node / f"proc/{GPU_PID}/cgroup").write_text(PROC_CGROUP)
    (node / UNIFIED_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return HostRoot(str(node))


def _live_v2_tree(tmp_path: Path) -> HostRoot:
    return HostRoot(str(materialize(example_root("egl-framebuffer-escape"), tmp_path / "node")))


@pytest.mark.parametrize("layout", ["hybrid", "v2"])
@pytest.mark.parametrize("probes", [True, False])
def test_no_probes_never_calls_bpf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes: bool, layout: str) -> None:
    """The bpf(2) wrapper is replaced by one that leaves a mark (from the forked reader too); with
    probes on the mark proves the test would see a call; with --no-probes there must be none, on a
    hybrid tree and on a pure cgroup v2 one (the issue's case)."""
    mark = tmp_path / "bpf-called"

    def spy(cmd: int, attr: object) -> int:
        with open(mark, "a") as fh:
            fh.write(f"{cmd}\n")
        raise syscall.BpfUnsupportedError(9, "spy", "not a cgroup2 directory")

    monkeypatch.setattr(syscall, "bpf", spy)
    root = _live_hybrid_tree(tmp_path) if layout == "hybrid" else _live_v2_tree(tmp_path)
    facts = facts_of(root, probes=probes, probe_timeout_s=20.0)
    (ca,) = [c for c in facts.get("gpu_access").containers if layout == "v2" or c.container.id == CID_GPU]
    v = ca.verdict("/dev/nvidia-uvm")
    assert v.allowed is None  # v1 allows; the unified side is unknown either way here
    if probes:
        assert mark.exists() and os.path.getsize(mark) > 0
        assert "programs unreadable" in v.evidence
    else:
        assert not mark.exists()
        assert "not evaluated: live probes are off (--no-probes), so bpf(2) was not called" in v.evidence
        gaps = {g.source: g.reason for g in facts.gaps()}
        assert gaps["unified-hierarchy device programs"].startswith("not evaluated: live probes are off")


def test_on_pure_v2_the_runtime_program_is_the_allowlist_not_a_third_party(tmp_path: Path) -> None:
    """The same deny-uvm program on a pure cgroup v2 node is the runtime's own allowlist: GPU-DEV-001
    confirms the denial but does not blame a foreign program (there is no v1 list it contradicts)."""
    b = copy_example("egl-framebuffer-escape", tmp_path)
    progs = json.loads((b / "files/.gpuwarden/bpf-programs.json").read_text())
    (cid,) = progs
    progs[cid]["programs"] = [{"id": 167, "name": "deny_uvm", "tag": "", "xlated": FIXTURE["program"]["xlated"]}]
    write(b, "/.gpuwarden/bpf-programs.json", json.dumps(progs))
    fs = [f for f in findings(open_dir(b)) if f.code == "GPU-DEV-001"]
    assert [f.status for f in fs] == [Status.CONFIRMED]
    assert fs[0].data["cause"] != "unified-program" and "bpftool" not in fs[0].remedy
