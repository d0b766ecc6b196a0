"""The DRA plugin probe (probes/dra.py, facts/dra_probe.py) against real gRPC servers on unix sockets.

`snapshot` runs in-process against in-process servers; the child path (a fresh interpreter), through
the `dra_probe` fact on a live root, talks to a fake plugin in a separate process and to a mute
socket: a hung plugin costs the probe deadline, never more.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Status
from gpuwarden.grpcapi import dra as dra_api
from gpuwarden.probes import dra
from gpuwarden.root import HostRoot
from tests.support.fake_dra_plugin import FakeDraPlugin, MuteSocket

DRIVER = "gpu.nvidia.com"
KR = "/var/lib/kubelet"
#: the deadline where an answer is expected: a Python fake plugin on a loaded 2-core host has taken > 0.5 s
ANSWER_TIMEOUT = 5.0


def _target(p: FakeDraPlugin) -> dict[str, str]:
    return {"driver": p.driver, "registration": f"{KR}/plugins_registry/{p.driver}-reg.sock",
            "service": f"{KR}/plugins/{p.driver}/dra.sock", "registration_addr": str(p.reg_path),
            "service_addr": str(p.dra_path)}


def _calls(out):
    return [(c["rpc"], c["status"]) for c in out["calls"]]


def test_the_liveness_calls_getinfo_then_an_empty_prepare(sock_dir):
    with FakeDraPlugin(sock_dir, DRIVER) as p:
        (out,) = dra.snapshot([_target(p)], 1.0)
        assert _calls(out) == [("GetInfo", "ok"), ("NodePrepareResources", "ok")]
        assert out["info"]["type"] == "DRAPlugin" and out["calls"][1]["service"] == dra_api.DRA_V1
        assert out["calls"][0]["socket"] == f"{KR}/plugins_registry/{DRIVER}-reg.sock"  # node paths, not host paths
        prepares = [req for name, req in p.calls if name == "NodePrepareResources"]
        assert len(prepares) == 1 and list(prepares[0].claims) == []  # no claim: side-effect free
        assert not [n for n, _ in p.calls if n in ("NotifyRegistrationStatus", "NodeUnprepareResources")]


def test_a_v1beta1_plugin_is_asked_on_the_service_it_lists(sock_dir):
    with FakeDraPlugin(sock_dir, DRIVER, services=(dra_api.DRA_V1BETA1,)) as p:
        (out,) = dra.snapshot([_target(p)], 1.0)
    assert _calls(out) == [("GetInfo", "ok"), ("NodePrepareResources", "ok")]
    assert out["calls"][1]["service"] == dra_api.DRA_V1BETA1


def test_without_a_registration_socket_v1_then_v1beta1(sock_dir):
    with FakeDraPlugin(sock_dir, DRIVER, services=(dra_api.DRA_V1BETA1,)) as p:
        t = _target(p)
        del t["registration_addr"]
        (out,) = dra.snapshot([t], 1.0)
    assert _calls(out) == [("NodePrepareResources", "ok")] and out["calls"][0]["service"] == dra_api.DRA_V1BETA1


def test_a_csi_registrar_is_asked_getinfo_only(sock_dir):
    with FakeDraPlugin(sock_dir, "csi.example.com", plugin_type="CSIPlugin") as p:
        (out,) = dra.snapshot([_target(p)], 1.0)
    assert _calls(out) == [("GetInfo", "ok")]


@pytest.mark.parametrize("hang", ["GetInfo", "NodePrepareResources"])
def test_a_hung_call_is_a_timeout_and_the_other_is_still_asked(sock_dir, hang):
    with FakeDraPlugin(sock_dir, DRIVER, hang={hang}) as p:
        t0 = time.monotonic()
        (out,) = dra.snapshot([_target(p)], 0.4)
        elapsed = time.monotonic() - t0
    assert dict(_calls(out))[hang] == "timeout" and elapsed < 3 * 0.4 + 0.5
    assert len(out["calls"]) == 2


def test_no_socket_no_child():
    assert dra.run(None, [], 1.0) is None


def _live_facts(root: Path, timeout: float = 0.5) -> NodeFacts:
    return NodeFacts(HostRoot(str(root)), Settings(probes=True, probe_timeout_s=timeout))


def _plugin_process(root: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.fake_dra_plugin", str(root / KR.lstrip("/")),
                             DRIVER, *args], stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(5)


def _dra030(facts: NodeFacts):
    rep = engine.run(facts, engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="live")
    assert rep.errors == []
    return rep.findings


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_forked_probe_names_a_plugin_hung_in_prepare_and_clears_once_it_answers(sock_dir):
    proc = _plugin_process(sock_dir, "--hang", "NodePrepareResources")
    try:
        t0 = time.monotonic()
        facts = _live_facts(sock_dir)
        (f,) = _dra030(facts)
        assert time.monotonic() - t0 < 8.0  # the child's budget is 2.5 s; the margin is for a loaded CI host
    finally:
        _stop(proc)
    assert f.status is Status.CONFIRMED and f.affected[0].name == DRIVER
    assert f"probe:dra {KR}/plugins/{DRIVER}/dra.sock: NodePrepareResources: no answer within 0.5s" in \
        [f"{e.source}: {e.text}".rsplit(",", 1)[0] for e in f.evidence]
    proc = _plugin_process(sock_dir)  # the plugin restarted and answers: the finding clears
    try:
        assert _dra030(_live_facts(sock_dir, ANSWER_TIMEOUT)) == []
    finally:
        _stop(proc)


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_forked_probe_on_a_registration_socket_that_accepts_and_never_answers(sock_dir):
    with MuteSocket(sock_dir / KR.lstrip("/") / "plugins_registry" / f"{DRIVER}-reg.sock"), \
            MuteSocket(sock_dir / KR.lstrip("/") / "plugins" / DRIVER / "dra.sock"):
        t0 = time.monotonic()
        (f,) = _dra030(_live_facts(sock_dir))
        assert time.monotonic() - t0 < 8.0  # the child's budget is 2.5 s; the margin is for a loaded CI host
    assert f.status is Status.CONFIRMED and f.data["calls"][0]["status"] == "timeout"
    assert [c["rpc"] for c in f.data["calls"]] == ["GetInfo", "NodePrepareResources"]


@pytest.mark.rule("GPU-DRA-030", "negative")
def test_forked_probe_of_an_answering_plugin_is_silent(sock_dir):
    proc = _plugin_process(sock_dir, "--v1beta1-only")
    try:
        facts = _live_facts(sock_dir, ANSWER_TIMEOUT)
        assert _dra030(facts) == []
        p = facts.get("dra_probe")
        assert [c.status for c in p.drivers[0].calls] == ["ok", "ok"]
    finally:
        _stop(proc)


def test_a_symlinked_socket_outside_the_root_is_not_connected(sock_dir, tmp_path):
    """The probe connects only to sockets the root resolves inside itself."""
    outside = sock_dir / "outside"
    with FakeDraPlugin(outside, DRIVER) as p:
        reg = sock_dir / "node" / KR.lstrip("/") / "plugins_registry"
        reg.mkdir(parents=True)
        (reg / f"{DRIVER}-reg.sock").symlink_to(p.reg_path)
        from gpuwarden.facts.dra_probe import targets
        assert targets(_live_facts(sock_dir / "node")) == []
    assert p.calls == []


# --- issue 44 item 6: all drivers at once, under one deadline ------------------------------------------

def test_32_registration_sockets_that_never_answer_cost_one_probe_timeout(sock_dir):
    """Issue 44 item 6: 32 registration sockets that accept and never answer took 67 s with
    --probe-timeout 2s (one after another); asked at once they cost one timeout and the child's start."""
    reg = sock_dir / KR.lstrip("/") / "plugins_registry"
    mutes = [MuteSocket(reg / f"d{i}.example.com-reg.sock") for i in range(32)]
    try:
        t0 = time.monotonic()
        p = _live_facts(sock_dir, 1.0).get("dra_probe")
        elapsed = time.monotonic() - t0
    finally:
        for m in mutes:
            m.close()
    assert p.status == "ok" and len(p.drivers) == 32, p
    assert all([c.status for c in d.calls] == ["timeout"] for d in p.drivers), p.drivers
    # one 1 s deadline, the child's start (2.4 s measured at load 25 on 2 cores) and a margin; 32 s one by one
    assert elapsed < 1.0 + dra.STARTUP_S / 2, elapsed
    assert dra.budget([{}] * 32, 1.0) == dra.budget([{}], 1.0)  # the child's deadline does not grow with drivers


@pytest.mark.parametrize("hang", ["GetInfo", "NodePrepareResources"])
def test_one_driver_costs_at_most_the_head_start_and_one_timeout(sock_dir, hang):
    """Both calls of a driver, one of them hung, within head_start + one timeout: the prepare does not
    wait a whole deadline for a hung GetInfo."""
    with FakeDraPlugin(sock_dir, DRIVER, hang={hang}) as p:
        t0 = time.monotonic()
        (out,) = dra.snapshot([_target(p)], 0.8)
        elapsed = time.monotonic() - t0
    assert dict(_calls(out))[hang] == "timeout" and len(out["calls"]) == 2
    assert [c["rpc"] for c in out["calls"]] == ["GetInfo", "NodePrepareResources"]
    assert elapsed < dra.head_start(0.8) + 0.8 + 0.5, elapsed


# --- issue 44 item 8: "plugin gone" only on the node itself --------------------------------------------

def _dead_plugin_tree(root: Path) -> None:
    """A DRA plugin's two sockets with nobody listening, as a plugin killed with -9 leaves them."""
    import os
    import stat

    for rel in (f"plugins/{DRIVER}/dra.sock", f"plugins_registry/{DRIVER}-reg.sock"):
        path = root / KR.lstrip("/") / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, stat.S_IFSOCK | 0o755)


def _table(*argvs: tuple[str, ...]):
    from gpuwarden.facts.processes import Proc, ProcessTable

    return ProcessTable({1 + i: Proc(1 + i, a) for i, a in enumerate((("/sbin/init",), *argvs))}, None, 100)


def _as_the_node(monkeypatch, root: Path, *argvs: tuple[str, ...]) -> NodeFacts:
    """The tree taken for the running node (HostRoot.node_identity says so), with this process table."""
    monkeypatch.setattr(HostRoot, "node_identity", lambda self: "")
    facts = _live_facts(root)
    facts.set("processes", _table(*argvs))
    return facts


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_refused_on_the_node_with_no_plugin_process_is_a_dead_plugin(sock_dir, monkeypatch):
    _dead_plugin_tree(sock_dir)
    (f,) = _dra030(_as_the_node(monkeypatch, sock_dir, ("/usr/bin/kubelet", "--v=2")))
    assert f.status is Status.CONFIRMED and "no process of the plugin runs" in f.summary
    assert f"/proc: no process of the plugin among 2 (argv naming {DRIVER} or gpu-kubelet-plugin)" in \
        [str(e) for e in f.evidence]
    assert [c["status"] for c in f.data["calls"]] == ["unavailable", "unavailable"]


@pytest.mark.rule("GPU-DRA-030", "clears")
def test_a_dead_plugin_clears_once_it_serves_again(sock_dir, monkeypatch):
    _dead_plugin_tree(sock_dir)
    assert len(_dra030(_as_the_node(monkeypatch, sock_dir))) == 1
    for rel in (f"plugins/{DRIVER}/dra.sock", f"plugins_registry/{DRIVER}-reg.sock"):
        (sock_dir / KR.lstrip("/") / rel).unlink()
    proc = _plugin_process(sock_dir)
    try:
        assert _dra030(_as_the_node(monkeypatch, sock_dir, ("python", "-m", "fake_dra_plugin", DRIVER))) == []
    finally:
        _stop(proc)


@pytest.mark.rule("GPU-DRA-030", "negative")
@pytest.mark.parametrize("argv", [("/usr/bin/gpu-kubelet-plugin",), ("/bin/plugin", f"--driver-name={DRIVER}")])
def test_refused_while_a_plugin_process_runs_is_not_confirmed(sock_dir, monkeypatch, argv):
    _dead_plugin_tree(sock_dir)
    (f,) = _dra030(_as_the_node(monkeypatch, sock_dir, argv))
    assert f.status is Status.AT_RISK and "still runs" in f.summary and "pid 2" in str(f.evidence)


@pytest.mark.rule("GPU-DRA-030", "negative")
def test_refused_on_a_tree_that_is_not_the_node_is_not_evaluated(sock_dir):
    """The tree itself (not taken for the node): a refusal proves nothing, whatever /proc holds."""
    _dead_plugin_tree(sock_dir)
    facts = _live_facts(sock_dir)
    facts.set("processes", _table())
    rep = engine.run(facts, engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="live")
    assert rep.findings == [] and rep.errors == []
    (s,) = rep.skipped
    assert "no evidence of a dead plugin here: this root is not the running node (its /proc cannot be opened" in \
        s.reason, s
    assert [g.source for g in rep.gaps] == [f"probe:dra {DRIVER}"]


def test_refusal_verdict():
    from gpuwarden.facts.dra_probe import GONE, NOT_SURE, RUNNING, refusal_verdict

    assert refusal_verdict(DRIVER, "a copied tree", _table())[0] == NOT_SURE
    assert refusal_verdict(DRIVER, "", None) == (NOT_SURE, "the node's process table could not be read")
    assert refusal_verdict(DRIVER, "", _table(("kubelet",)))[0] == GONE
    assert refusal_verdict(DRIVER, "", _table(("/opt/gpu-kubelet-plugin", "-v", "6")))[0] == RUNNING
    assert refusal_verdict("other.example.com", "", _table(("/opt/gpu-kubelet-plugin",)))[0] == GONE
    # this process (the check, whose argv may name the driver) is never the plugin
    assert refusal_verdict(DRIVER, "", _table(("gpuwarden", DRIVER)), own_pid=2)[0] == GONE


def test_node_identity_of_the_running_root_and_of_trees(tmp_path):
    import os
    import subprocess

    me = HostRoot("/").node_identity()
    assert me == "" or "PID namespace" in me or "cannot be" in me, me  # a container without the host's PIDs
    assert "cannot be opened" in HostRoot(str(tmp_path)).node_identity()
    (tmp_path / "proc").mkdir()
    assert HostRoot(str(tmp_path)).node_identity() == "its /proc is not the kernel's procfs: a copied tree"
    if os.geteuid() == 0 and subprocess.run(["mount", "--bind", "/proc", str(tmp_path / "proc")]).returncode == 0:
        try:  # the kernel's procfs inside a copy: still not the node (init's root is not this directory)
            why = HostRoot(str(tmp_path)).node_identity()
        finally:
            subprocess.run(["umount", str(tmp_path / "proc")], check=True)
        assert why.endswith("a copied tree") or "PID namespace" in why, why


def test_the_nodes_verdict_is_recorded_for_bundles(sock_dir, monkeypatch):
    """`collect` writes to_json(): a bundle of the node keeps "gone" and its evidence, so it reads as the
    node did; a driver that answered carries no verdict."""
    from gpuwarden.facts.dra_probe import GONE, from_json

    _dead_plugin_tree(sock_dir)
    p = _as_the_node(monkeypatch, sock_dir).get("dra_probe")
    back = from_json(json.loads(json.dumps(p.to_json())), recorded=True)
    assert [(d.refused, d.refused_why) for d in back.drivers] == [(d.refused, d.refused_why) for d in p.drivers]
    assert back.drivers[0].refused == GONE
    ok = from_json({"status": "ok", "value": [{"driver": DRIVER, "refused": {"verdict": GONE, "why": "x"},
                                               "calls": [{"rpc": "GetInfo", "status": "ok"}]}]}, recorded=True)
    assert ok.drivers[0].refused == ""
