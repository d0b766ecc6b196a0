"""The DRA plugin probe (probes/dra.py, facts/dra_probe.py) against real gRPC servers on unix sockets.

`snapshot` runs in-process against in-process servers; the child path (a fresh interpreter), through
the `dra_probe` fact on a live root, talks to a fake plugin in a separate process and to a mute
socket: a hung plugin costs the probe deadline, never more.
"""

from __future__ import annotations

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
            "service": f"{KR}/plugins/{p.driver}/dra.sock", "registration_host": str(p.reg_path),
            "service_host": str(p.dra_path)}


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
        del t["registration_host"]
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
    assert dra.run([], 1.0) is None


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
