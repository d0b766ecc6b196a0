"""GPU-NODE-001 end to end: facts collection from bundles and the live dev machine, through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.examples import open_bundle_dir, open_example, HERE as EXAMPLES
from gpuwarden.facts import FactUnavailable, NodeFacts, Settings
from gpuwarden.facts import node as facts_node
from gpuwarden.facts.memory import _pid_cgroup, _pod_rel
from gpuwarden.findings import Severity, Status
from gpuwarden.root import BundleRoot, HostRoot
from gpuwarden.rules import get_rule
from tests.support.bundles import H200_PID, H200_POD_UID, bundle, h200_node

CODE = "GPU-NODE-001"
INCIDENT_POD = "5e0c3a7e-2b1d-4c9a-8e7f-6d5c4b3a2918"


def run(root, settings: Settings | None = None):
    facts = NodeFacts(root, settings)
    report = engine.run(facts, [get_rule(CODE)], mode="bundle")
    assert report.errors == [], report.errors
    return facts, report


def overlay(tmp_path: Path, files: dict[str, str] | None = None, meta: dict | None = None) -> BundleRoot:
    """The incident example with some files replaced or removed."""
    bundle(tmp_path / "ov", files or {}, captured_at=None, meta=meta, tz=None)
    return BundleRoot(tmp_path / "ov", lower=open_example("driver-memory-cascade"))


# ------------------------------------------------------------------ positive

@pytest.mark.rule("GPU-NODE-001", "positive")
def test_incident_example_confirmed_critical():
    facts, report = run(open_example("driver-memory-cascade"))
    [f] = report.findings
    assert (f.status, f.severity) == (Status.CONFIRMED, Severity.CRITICAL)
    assert "33.7 GiB of host RAM (55.6% of 60.7 GiB)" in f.summary and "render/egl-render-0" in f.summary
    ev = {e.source: e.text for e in reversed(f.evidence)}  # first of each source
    assert "MemAvailable 16240 kB" in ev["/proc/meminfo"] and "AnonPages 27100712 kB" in ev["/proc/meminfo"]
    assert "nvidia_pte_cache-2782818403 8650926" in ev["/proc/slabinfo"]
    assert "33.0 GiB of driver pages" in ev["/proc/slabinfo"]
    assert "33.8 GiB" in ev["memory ledger"]
    assert any("limit 40.0 GiB" in e.text and "cannot stop" in e.text for e in f.evidence)
    assert any(e.source == "/proc/2657537/fd" and "/dev/nvidia0" in e.text for e in f.evidence)
    assert ev["attribution (sole-holder)"].startswith("render/egl-render-0 is the only workload")
    assert "confidence medium" not in " ".join(e.text for e in f.evidence)  # one confidence, stated once
    assert any(a.kind == "pod" and a.name == "egl-render-0" and a.namespace == "render" for a in f.affected)
    assert f.data["gap"] == f.data["cgroups"]["uncharged_unexplained"] and f.data["driver_named_by_slab"]
    assert f.mechanism and "earlyoom" in f.remedy


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_incident_confirmed_without_psi_files(tmp_path):
    root = overlay(tmp_path, meta={"remove": ["/proc/pressure",
                                              "/sys/fs/cgroup/unified/system.slice/kubelet.service"]})
    facts, report = run(root)
    [f] = report.findings
    assert f.status == Status.CONFIRMED
    keys = {s.key for s in facts.get("memory").ledger.thrash.signals}
    assert {"mem-available-low", "near-min-watermark"} <= keys and "psi-memory-full" not in keys
    assert any(g.source == "/proc/pressure/memory" for g in report.gaps)


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_large_gap_without_thrash_or_slab_is_at_risk(tmp_path):
    mem = "\n".join(f"{k}: {v} kB" for k, v in (
        ("MemTotal", 67108864), ("MemFree", 20971520), ("MemAvailable", 23068672), ("Buffers", 102400),
        ("Cached", 2097152), ("SwapCached", 0), ("Active", 11000000), ("Inactive", 11000000), ("AnonPages", 20971520),
        ("Mapped", 500000), ("Shmem", 10000), ("Slab", 1048576), ("SReclaimable", 524288), ("SUnreclaim", 524288),
        ("KernelStack", 20000), ("PageTables", 60000), ("VmallocUsed", 100000), ("Percpu", 20000),
        ("Hugetlb", 0))) + "\nHugePages_Total: 0\nHugepagesize: 2048 kB\n"
    root = bundle(tmp_path / "n", {"/proc/meminfo": mem,
                                         "/proc/pressure/memory": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                                                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"}, tz=None)
    facts, report = run(root)
    [f] = report.findings
    assert (f.status, f.severity) == (Status.AT_RISK, Severity.HIGH)
    assert "not thrashing yet" in f.summary and "no memory cgroup was readable" in f.summary
    assert any("no per-cgroup split" in e.text for e in f.evidence)
    assert any(g.source == "/proc/slabinfo" for g in report.gaps)


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_h200_pod_charged_kernel_memory_within_its_limit_is_info_with_attribution(tmp_path):
    facts, report = run(h200_node(tmp_path / "n", "managed"))
    [f] = report.findings
    # unified memory charged as kernel, inside a 32 GiB limit on a node with room for it: the limit works
    assert (f.status, f.severity) == (Status.AT_RISK, Severity.INFO)
    assert "ml/uvm-train-0 (4.0 GiB)" in f.summary and "Information only" in f.summary
    [pod] = [a for a in f.affected if a.kind == "pod"]
    assert (pod.namespace, pod.name, pod.uid) == ("ml", "uvm-train-0", H200_POD_UID)
    assert any(e.source.endswith("memory.stat") and "kernel 4306505728" in e.text for e in f.evidence)
    assert any(e.source == f"/proc/{H200_PID}/fd" and "/dev/nvidia-uvm" in e.text for e in f.evidence)
    m = facts.get("memory")
    assert m.cgroup_version == 2 and m.ledger.split.exact
    assert m.ledger.split.charged_outside_source.startswith("/sys/fs/cgroup/memory.stat")
    assert m.ledger.attribution.suspects[0].uid == H200_POD_UID


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_charged_driver_memory_without_a_limit_is_medium(tmp_path):
    uid_ = H200_POD_UID.replace("-", "_")
    pod = f"/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
    bundle(tmp_path / "ov", {f"{pod}/memory.max": "max\n"}, captured_at=None, tz=None)
    facts, report = run(BundleRoot(tmp_path / "ov", lower=h200_node(tmp_path / "n", "managed")))
    [f] = report.findings
    assert (f.status, f.severity) == (Status.AT_RISK, Severity.MEDIUM)
    assert "ml/uvm-train-0 has no memory limit" in f.summary and f.data["risks"]


# ------------------------------------------------------------------ negative

@pytest.mark.rule("GPU-NODE-001", "negative")
def test_dev_machine_live_proc_has_no_finding():
    facts, report = run(HostRoot("/"))
    assert not [f for f in report.findings if f.severity >= Severity.MEDIUM]
    assert CODE not in [s.code for s in report.skipped]
    assert facts.get("memory").ledger.node.reliable


@pytest.mark.rule("GPU-NODE-001", "negative")
@pytest.mark.parametrize("name", ["healthy", "uvm-missing"])
def test_examples_without_the_incident_have_no_finding(name):
    _, report = run(open_example(name))
    assert report.findings == [] and CODE not in [s.code for s in report.skipped]


@pytest.mark.rule("GPU-NODE-001", "negative")
def test_h200_before_and_higher_threshold_have_no_finding(tmp_path):
    _, report = run(h200_node(tmp_path / "a", "before"))
    assert report.findings == []
    strict = Settings(extra={"memory.pod_kernel_other_min_bytes": 8 << 30})
    _, report = run(h200_node(tmp_path / "b", "managed"), strict)
    assert report.findings == []


@pytest.mark.rule("GPU-NODE-001", "negative")
@pytest.mark.parametrize("meminfo,why", [
    (None, "/proc/meminfo unreadable: missing"),
    ("\0\xff garbage \n", "no usable MemTotal"),
    ("MemTotal: 63596320 kB\nMemFree: 433348 kB\nMemAvailable: 162", "meminfo lacks"),
    ("", "no usable MemTotal"),
])
def test_bad_meminfo_is_not_evaluated(tmp_path, meminfo, why):
    files = {} if meminfo is None else {"/proc/meminfo": meminfo}
    _, report = run(overlay(tmp_path, files, {"remove": ["/proc/meminfo"]} if meminfo is None else None))
    assert report.findings == []
    [skip] = [s for s in report.skipped if s.code == CODE]
    assert why in skip.reason


# ------------------------------------------------------------------ collection

def test_denied_slabinfo_is_a_gap(tmp_path):
    root = overlay(tmp_path, meta={"missing": {"/proc/slabinfo": ["denied", "EACCES"]}})
    facts, report = run(root)
    assert any(g.source == "/proc/slabinfo" and g.reason.startswith("denied") for g in report.gaps)
    [f] = report.findings
    assert f.status == Status.CONFIRMED  # still: thrash precursors
    assert any("unreadable (root only)" in e.text for e in f.evidence)
    assert facts.get("memory").ledger.node.line("slab_nvidia") is None


def test_without_containers_section_pods_come_from_holders(monkeypatch):
    def unavailable(facts):
        raise FactUnavailable("containers collector disabled for this test")

    facts_node.registered_facts()
    monkeypatch.setitem(facts_node._COLLECTORS, "containers", unavailable)
    facts, report = run(open_example("driver-memory-cascade"))
    m = facts.get("memory")
    assert "containers section unavailable" in m.pods_source
    [pod] = m.ledger.split.pods
    assert (pod.uid, pod.namespace, pod.name, pod.gpu_pids) == (INCIDENT_POD, "render", "egl-render-0", (2657537,))
    assert pod.cgroup.limit == 40 << 30
    [f] = report.findings
    assert f.status == Status.CONFIRMED and "render/egl-render-0 has escaped its memory limit" in f.summary
    assert "Named by sole-holder (high confidence)" in f.summary


def test_scan_bounds_lower_the_confidence():
    facts, report = run(open_example("driver-memory-cascade"), Settings(extra={"memory.scan_max_pids": 1}))
    m = facts.get("memory")
    assert not m.scan.complete and "stopped after 1 processes" in m.scan.reason
    assert [h.pid for h in m.holders] == [2657537]  # newest pid first
    assert m.ledger.attribution.confidence == "medium"
    assert any(g.source == "/proc/*/fd" for g in report.gaps)


def test_example_bundle_layout():
    d = EXAMPLES / "driver-memory-cascade"
    root = open_bundle_dir(d)
    assert root.meta["base"] == "healthy" and root.meta["captured_at"] > 0
    origin = (d / "ORIGIN.md").read_text()
    for path in ("/proc/meminfo", "/proc/slabinfo", "/proc/zoneinfo", "/proc/vmstat", "/proc/pressure/memory"):
        assert f"`{path}`" in origin
        assert isinstance(root.read_text(path), str)
    assert "**verbatim**" in origin and "**derived**" in origin


@pytest.mark.parametrize("text,path,uid,cid", [
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
     "cri-containerd-" + "a" * 64 + ".scope\n",
     "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice",
     "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "a" * 64),
    ("12:devices:/../../kubepods/besteffort/pod8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b/" + "b" * 64 + "\n",
     "kubepods/besteffort/pod8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "b" * 64),
    ("11:memory:/system.slice/nvidia-persistenced.service\n0::/\n", None, None, None),
    ("garbage", None, None, None),
])
def test_pid_cgroup_to_pod(text, path, uid, cid):
    p, u, c = _pid_cgroup(text)
    assert (u, c) == (uid, cid)
    assert _pod_rel(p) == path


def test_rule_is_registered_and_explained():
    r = get_rule(CODE)
    assert r.needs == ("memory",) and r.severity == Severity.CRITICAL
    assert "CONFIRMED" in r.explanation and "AT-RISK" in r.explanation


@pytest.mark.parametrize("example", ["egl-framebuffer-escape", "driver-memory-cascade"])
def test_the_json_attribution_has_one_explanation_that_agrees_with_the_evidence(example: str) -> None:
    """data.attribution says what the separation found: never the ledger's ranking of a candidate it eliminated."""
    [f] = [f for f in engine.run(NodeFacts(open_example(example), Settings()), mode="example").findings
           if f.code == "GPU-NODE-001"]
    att, sep = f.data["attribution"], f.data["escape"]["separation"]
    assert att["confidence"] == sep["confidence"]
    assert att["explanation"].startswith(f"Holder: {sep['holder']} ") and "ranked" not in att["explanation"]
    assert [s["ref"] for s in att["suspects"]] == [sep["holder"]]
    for c in sep["candidates"]:
        if c["eliminated"]:  # named only as eliminated, with the reason the evidence gives
            assert c["eliminated"] in att["explanation"] or c["ref"] not in att["explanation"]
            assert any(c["ref"] in e.text and "ELIMINATED" in e.text for e in f.evidence)
