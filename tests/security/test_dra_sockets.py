"""Issue 44, items 1, 2 and 8: the DRA probe connects only to sockets beneath the root, pinned
before its child starts, and a copied tree's dead sockets are evidence of nothing.

Each test is one reproduction of the issue through the entry point that showed it (`check --root T`,
`agent --root T`, the `dra_probe` fact on a live root), with a listener outside the root that records
whether anything connected to it (tests/support/canaries.py). Each fails on main b2e46e2.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.cli import main
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.probes import dra
from gpuwarden.root import HostRoot
from tests.support.agent_nodes import can_mknod
from tests.support.bundles import example_root, materialize
from tests.support.canaries import CanaryListener
from tests.support.fake_dra_plugin import MuteSocket

KR = "var/lib/kubelet"


@pytest.fixture
def short_tmp():
    """A short path: the decoded escape must fit a unix socket address (107 bytes), as `/host` does."""
    d = tempfile.mkdtemp(prefix="gw-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def dead_socket(path: Path) -> Path:
    """A socket file nobody listens on, as `cp -a` copies one (mknod S_IFSOCK needs no privilege)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFSOCK | 0o755)
    return path


def escaping_name(node: Path, parent: str, evil: Path, suffix: str = "") -> str:
    """The issue's name: `x.y%2F..%2F..(…)%2F<evil>?<suffix>`. gRPC's target parser percent-decodes it and
    cuts at `?`, which leaves `<parent>/x.y/../../…/<evil>`: the `..` climb out of the root to `evil`."""
    ups = len((node / parent / "x.y").relative_to(evil.parent).parts)
    return "x.y" + "%2F.." * ups + "%2F" + evil.name + "?" + suffix


def crafted_tree(node: Path, evil: Path, which: str) -> None:
    """A node whose DRA plugin directory (`which` "service") or registration socket ("registration") is
    named to escape, with the plain directory `x.y` beside it that the decoded path walks through."""
    parent = f"{KR}/plugins" if which == "service" else f"{KR}/plugins_registry"
    (node / parent / "x.y").mkdir(parents=True)
    name = escaping_name(node, parent, evil, "" if which == "service" else "-reg.sock")
    dead_socket(node / parent / name / "dra.sock" if which == "service" else node / parent / name)
    decoded = f"{node / parent}/{name.split('?')[0].replace('%2F', '/')}"  # what gRPC made of it
    assert len(decoded) < 108 and os.path.normpath(decoded) == str(evil)


@pytest.mark.parametrize("which", ["service", "registration"])
def test_check_root_never_connects_to_a_socket_a_crafted_plugin_name_decodes_to(short_tmp, which):
    """Issue 44 item 1: `check --root T` connected to /tmp/evil.sock (gRPC decoded `%2F` in the path text
    it was handed and cut it at `?`), then reported the refusal as CONFIRMED GPU-DRA-030."""
    with CanaryListener(short_tmp / "evil.sock") as evil:
        node = short_tmp / "node"
        crafted_tree(node, evil.path, which)
        r = CliRunner().invoke(main, ["check", "--root", str(node), "--probe-timeout", "1", "--format", "json",
                                      "--select", "GPU-DRA-030"])
        evil.assert_untouched()
    assert r.exit_code in (0, 4), r.output
    assert json.loads(r.output)["findings"] == []


@pytest.mark.parametrize("which", ["service", "registration"])
def test_agent_root_never_connects_to_a_socket_a_crafted_plugin_name_decodes_to(short_tmp, which):
    with CanaryListener(short_tmp / "evil.sock") as evil:
        node = short_tmp / "node"
        crafted_tree(node, evil.path, which)
        cfg = AgentConfig(kube=False, listen="", boot_grace_s=0, node_name="n1", probes=True, grpc=False,
                          probe_timeout_s=1.0, select=["GPU-DRA-030"])
        Agent(cfg, root=HostRoot(str(node)), out=io.StringIO()).check()
        evil.assert_untouched()


def test_a_socket_swapped_for_a_link_after_the_check_is_not_followed(short_tmp, monkeypatch):
    """Issue 44 item 2: the socket was checked, then a new interpreter connected by name 0.3-2 s later;
    swapping it for a link meanwhile connected outside. Here the swap happens at the worst moment, just
    before the child starts: the child must still connect to the inode that was checked."""
    with CanaryListener(short_tmp / "evil.sock") as evil, \
            MuteSocket(short_tmp / "node" / KR / "plugins" / "gpu.nvidia.com" / "dra.sock") as inside:
        sock = inside.path
        real_run = dra.run_cmd

        def swap_then_run(*args, **kw):
            os.rename(sock, sock.with_name("moved.sock"))  # the listening inode stays, under another name
            os.symlink(str(evil.path), sock)
            return real_run(*args, **kw)

        monkeypatch.setattr(dra, "run_cmd", swap_then_run)
        facts = NodeFacts(HostRoot(str(short_tmp / "node")), Settings(probes=True, probe_timeout_s=0.5))
        p = facts.get("dra_probe")
        evil.assert_untouched()
        assert inside._held  # the pinned socket was the one asked (and it never answered)
    assert [c.status for c in p.drivers[0].calls] == ["timeout"]


@pytest.mark.skipif(not can_mknod(), reason="materializing the example's device nodes needs mknod (root)")
def test_a_copied_trees_dead_sockets_are_not_a_dead_plugin(short_tmp):
    """Issue 44 item 8: on a copy of the dra-uvm-missing tree, its sockets (copied, so nobody listens)
    read as "plugin gone", CONFIRMED GPU-DRA-030. On a copy the refusal is evidence of nothing."""
    node = materialize(example_root("dra-uvm-missing"), short_tmp / "node")
    for rel in (f"{KR}/plugins/gpu.nvidia.com/dra.sock", f"{KR}/plugins_registry/gpu.nvidia.com-reg.sock"):
        (node / rel).unlink(missing_ok=True)
        dead_socket(node / rel)
    r = CliRunner().invoke(main, ["check", "--root", str(node), "--probe-timeout", "1", "--format", "json",
                                  "--select", "GPU-DRA-030"])
    doc = json.loads(r.output)
    assert doc["findings"] == [], doc["findings"]
    (skipped,) = doc["not_evaluated"]
    assert skipped["code"] == "GPU-DRA-030" and "no evidence of a dead plugin" in skipped["reason"], skipped
    assert "this root is not the running node" in skipped["reason"]


def test_open_targets_pins_each_socket_and_refuses_links_and_files(short_tmp):
    with CanaryListener(short_tmp / "evil.sock") as evil:
        node = short_tmp / "node"
        dead_socket(node / KR / "plugins" / "a.b" / "dra.sock")
        (node / KR / "plugins" / "c.d").mkdir(parents=True)
        os.symlink(str(evil.path), node / KR / "plugins" / "c.d" / "dra.sock")
        (node / KR / "plugins_registry").mkdir(parents=True)
        (node / KR / "plugins_registry" / "c.d-reg.sock").write_text("")
        targets = [{"driver": "a.b", "service": f"/{KR}/plugins/a.b/dra.sock", "service_addr": "/evil"},
                   {"driver": "c.d", "service": f"/{KR}/plugins/c.d/dra.sock",
                    "registration": f"/{KR}/plugins_registry/c.d-reg.sock"}]
        opened, fds = dra.open_targets(HostRoot(str(node)), targets)
        try:
            assert len(fds) == 1 and opened[0]["service_addr"] == f"/proc/self/fd/{fds[0]}"  # "/evil" dropped
            assert os.path.samefile(opened[0]["service_addr"], node / KR / "plugins" / "a.b" / "dra.sock")
            assert "service_addr" not in opened[1] and "symbolic link" in opened[1]["service_error"]
            assert "not a unix socket" in opened[1]["registration_error"]
        finally:
            for fd in fds:
                os.close(fd)
        evil.assert_untouched()


def test_a_copied_trees_dead_device_plugin_socket_is_no_verdict(short_tmp):
    """Issue 44 item 8, the device-plugin side: a refused connection to a plugin socket of a copied
    tree says nothing of a process. Neither `check`'s plugin probe (GPU-K8S-001 reads only calls that
    got no answer) nor the agent's monitor (a refusal is "not observed": GPU-K8S-001 "unknown", never
    "good" or "bad") turns it into a verdict. This held on b2e46e2 already; the test keeps it so."""
    from gpuwarden.agent import monitors as mon
    from gpuwarden.agent.history import NodeHistory
    from gpuwarden.agent.metrics import AgentMetrics

    node = short_tmp / "node"
    dead_socket(node / KR / "device-plugins" / "nvidia-gpu.sock")
    dead_socket(node / KR / "device-plugins" / "kubelet.sock")
    r = CliRunner().invoke(main, ["check", "--root", str(node), "--probe-timeout", "1", "--format", "json"])
    doc = json.loads(r.output)
    assert doc["findings"] == [], doc["findings"]
    res, m = mon.MonitorResult(), AgentMetrics()
    mon.probe_plugins(HostRoot(str(node)), f"/{KR}/device-plugins", 0.5, NodeHistory(), m, 1.0, res)
    assert res.findings == [] and res.observed["GPU-K8S-001"] == "unknown" and res.errors == []
    assert m.registry.get_sample_value("gpuwarden_probe_timeouts_total",
                                       {"probe": "plugin/GetDevicePluginOptions"}) in (None, 0.0)


@pytest.mark.parametrize("call", ["plugin_options", "get_info", "prepare"])
def test_a_dead_socket_never_reads_as_a_hung_plugin(short_tmp, call):
    """A socket nobody listens on refuses at once, but when gRPC's deadline passes while it still sets up
    the connection (a loaded host; here a 1 ms deadline) the call ended DEADLINE_EXCEEDED: a copied tree's
    dead socket read as a plugin that accepted and hung (CONFIRMED GPU-DRA-030 or GPU-K8S-001). Checked on
    b2e46e2: `plugin_options` gave "timeout". A listener that accepts and never answers stays a timeout."""
    from gpuwarden.grpcapi import client
    from gpuwarden.grpcapi import dra as dra_api

    ask = {"plugin_options": lambda p, t: client.plugin_options(p, t),
           "get_info": lambda p, t: dra_api.get_info(p, t),
           "prepare": lambda p, t: dra_api.prepare(p, [], dra_api.DRA_V1, t)}[call]
    dead = dead_socket(short_tmp / "dead.sock")
    assert all(ask(str(dead), 0.001).status == "unavailable" for _ in range(5))
    with MuteSocket(short_tmp / "mute.sock") as mute:
        assert ask(str(mute.path), 0.05).status == "timeout"
