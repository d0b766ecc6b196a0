"""Issue 30, item 1 and 2: no write, connect or kill outside the node's root; directory bundles confined.

Each test is one reproduction of the issue, run through the same entry points the issue used (the
agent on a copied tree, `check --root`, `check --bundle DIR`), with a canary outside the root that
must not change: a file (its bytes and mtime), a listening unix socket (no connection may arrive)
and a live process (it must not be signalled). tests/security/test_fuzz_effects.py draws the same
classes at random.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden import confine
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.outbox import Outbox
from gpuwarden.cli import main
from gpuwarden.findings import Finding, Severity, Status
from gpuwarden.remediation.localkill import kill_pod
from gpuwarden.root import HostRoot
from tests.support.bundles import example_root, materialize
from tests.support.canaries import CanaryFile, CanaryListener, CanaryProcess

UID = "a6234a7e-29ef-434f-b254-d3cccc28be4e"
POD_CGROUP = f"/sys/fs/cgroup/kubepods/burstable/pod{UID}"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of the example's device nodes needs root")


@pytest.fixture
def short_tmp():
    """A directory with a short path: a unix socket address holds at most 107 bytes, and pytest's
    tmp_path under a long tree would make every connect by name fail on its own (hiding an escape)."""
    d = tempfile.mkdtemp(prefix="gw-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _escape(cgroup: str = POD_CGROUP) -> Finding:
    """GPU-NODE-001 as the memory rule raises it for one pod at high confidence (rules/memory.py)."""
    return Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "memory escape", "escaped",
                   data={"pod": {"namespace": "viz", "name": "render-0", "uid": UID, "cgroup": cgroup}})


def _agent(root: HostRoot, **kw) -> Agent:
    cfg = AgentConfig(kube=False, remediate="on", memory_local_kill=True, listen="", select=["GPU-NODE"],
                      boot_grace_s=0, node_name="n1", probes=False, grpc=False, **kw)
    return Agent(cfg, root=root, out=io.StringIO(), clock=lambda: 1_800_000_000.0)


def _pod_tree(tmp: Path, pids: list[int]) -> tuple[Path, Path]:
    """A copied node tree whose pod cgroup lists `pids` (processes of the analysing machine)."""
    node = tmp / "node"
    d = node / POD_CGROUP.lstrip("/")
    (d / ("c" * 64)).mkdir(parents=True)
    (d / ("c" * 64) / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return node, d


# --- 1. kill -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kill_file", ["link-out", "absent"])
def test_memory_guard_on_a_copied_tree_kills_nothing_and_writes_nothing(tmp_path, kill_file):
    """Issue: the guard SIGKILLed a host pid from the tree's cgroup.procs and wrote 1 through a
    cgroup.kill that was a link outside."""
    with CanaryProcess() as victim:
        canary = CanaryFile(tmp_path / "outside" / "kill-target")
        node, d = _pod_tree(tmp_path, [victim.pid])
        if kill_file == "link-out":
            os.symlink(canary.path, d / "cgroup.kill")
        [o] = _agent(HostRoot(str(node)))._last_resort([_escape()])
        assert o.result == "refused" and "not on the kernel's cgroup filesystem" in o.detail, o.detail
        victim.assert_alive()
        canary.assert_unchanged()


@root_only
def test_memory_guard_end_to_end_on_a_copied_example_tree(tmp_path):
    """The issue's run: the agent, remediation on with the local kill, on a copied node tree whose
    memory rule names a pod; its cgroup.procs names a live process here, its cgroup.kill links out."""
    tree = materialize(example_root("egl-framebuffer-escape"), tmp_path / "root")
    with CanaryProcess() as victim:
        canary = CanaryFile(tmp_path / "outside-kill")
        pod = next(tree.glob("sys/fs/cgroup/kubepods.slice/*/*pod*.slice"))
        (pod / "cgroup.procs").write_text(f"{victim.pid}\n")
        if os.path.lexists(pod / "cgroup.kill"):
            os.unlink(pod / "cgroup.kill")
        os.symlink(canary.path, pod / "cgroup.kill")
        a = _agent(HostRoot(str(tree)))
        a.check()
        r = a.check()
        assert [(o.action.kind, o.result) for o in r.outcomes] == [("kill-pod-processes", "refused")]
        victim.assert_alive()
        canary.assert_unchanged()


def test_kill_pod_refuses_a_tree_whose_cgroup_dir_links_out(tmp_path):
    """The cgroup directory itself a link to a real cgroup outside the tree: resolved in the tree, not there."""
    with CanaryProcess() as victim:
        node = tmp_path / "node"
        (node / "sys/fs/cgroup/kubepods/burstable").mkdir(parents=True)
        os.symlink("/sys/fs/cgroup", node / POD_CGROUP.lstrip("/"))
        r = kill_pod(HostRoot(str(node)), POD_CGROUP, UID)
        assert not r.ok and r.error.startswith("refused"), r.describe()
        victim.assert_alive()


def test_kill_pod_refuses_anything_but_a_live_root(tmp_path):
    r = kill_pod(example_root("egl-framebuffer-escape"), POD_CGROUP, UID)
    assert r.error == "refused: not a live node: nothing local to kill"


# --- 1. write ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("planted", ["tmp", "file", "dir"])
def test_memory_samples_never_write_through_a_planted_link(tmp_path, planted):
    """Issue: run/gpuwarden/memory-samples.json.<pid>.tmp, opened with open(), followed a link."""
    canary = CanaryFile(tmp_path / "outside" / "samples-target")
    node = tmp_path / "node"
    run = node / "run/gpuwarden"
    run.mkdir(parents=True)
    if planted == "tmp":
        os.symlink(canary.path, run / f"memory-samples.json.{os.getpid()}.tmp")
    elif planted == "file":
        os.symlink(canary.path, run / "memory-samples.json")
    else:  # the directory: an absolute link resolves in the tree, not on this machine
        os.rmdir(run)
        os.symlink(str(canary.path.parent), run)
    a = _agent(HostRoot(str(node)))
    a._save_samples()
    canary.assert_unchanged()
    written = HostRoot(str(node)).read_bytes("/run/gpuwarden/memory-samples.json")
    if planted == "dir":  # the link resolves in the tree to a directory that is not there: not made through it
        assert a._samples_warned and not isinstance(written, bytes)
    else:  # the link itself was replaced by the new file
        assert isinstance(written, bytes) and json.loads(written) is not None
        assert not os.path.islink(run / "memory-samples.json")


def test_outbox_under_the_root_never_writes_through_a_link(tmp_path):
    canary = CanaryFile(tmp_path / "outside" / "outbox-target")
    node = tmp_path / "node"
    (node / "run/gpuwarden").mkdir(parents=True)
    os.symlink(canary.path, node / "run/gpuwarden/outbox.json")
    box = Outbox("/run/gpuwarden/outbox.json", root=HostRoot(str(node)))  # an unreadable outbox: read in the tree
    box.put_conditions([{"type": "GPUDeviceAccess", "status": "True"}])
    canary.assert_unchanged()
    assert json.loads((node / "run/gpuwarden/outbox.json").read_bytes())["conditions"]


def test_agent_puts_its_state_dir_under_the_root_through_the_root(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    a = _agent(HostRoot(str(node)), state_dir=str(node / "run/gpuwarden"))
    assert a._state_file("outbox.json") == ("/run/gpuwarden/outbox.json", a.root)
    b = _agent(HostRoot(str(node)), state_dir=str(tmp_path / "elsewhere"))
    assert b._state_file("outbox.json") == (str(tmp_path / "elsewhere/outbox.json"), None)


def test_write_file_makes_missing_directories_but_never_through_a_link(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    r = HostRoot(str(node))
    r.write_file("/run/gpuwarden/x/f", b"x")
    assert (node / "run/gpuwarden/x/f").read_bytes() == b"x"
    r.write_file("/run/gpuwarden/x/f", b"yy")  # replaced atomically, no temporary file left
    assert (node / "run/gpuwarden/x/f").read_bytes() == b"yy" and os.listdir(node / "run/gpuwarden/x") == ["f"]
    os.symlink("/a/b", node / "l")  # a dangling absolute link: resolved in the tree, nothing made through it
    with pytest.raises(NotADirectoryError):
        r.write_file("/l/c/f", b"x")
    assert not (node / "a").exists() and not Path("/a/b/c/f").exists()
    os.makedirs(node / "a/b")  # once its target exists in the tree, the link is an ordinary in-root path
    r.write_file("/l/c/f", b"z")
    assert (node / "a/b/c/f").read_bytes() == b"z"


# --- 1. connect --------------------------------------------------------------------------------------

def test_check_root_never_connects_to_a_plugin_socket_that_links_out(short_tmp):
    """Issue: with probes on, a device-plugin socket under the root that links to one outside was
    connected to (the directory resolved in the root, then the name joined on the real filesystem)."""
    with CanaryListener(short_tmp / "outside" / "plugin.sock") as listener:
        node = short_tmp / "node"
        dp = node / "var/lib/kubelet/device-plugins"
        dp.mkdir(parents=True)
        os.symlink(str(listener.path), dp / "nvidia-gpu.sock")
        os.symlink("../../../../../outside/plugin.sock", dp / "relative.sock")
        r = CliRunner().invoke(main, ["check", "--root", str(node), "--probe-timeout", "1", "--format", "json"])
        assert r.exit_code in (0, 1, 4), r.output
        listener.assert_untouched()


def test_agent_grpc_monitors_never_connect_through_a_link(short_tmp):
    with CanaryListener(short_tmp / "outside" / "kubelet.sock") as listener:
        node = short_tmp / "node"
        for d in ("var/lib/kubelet/device-plugins", "var/lib/kubelet/pod-resources"):
            (node / d).mkdir(parents=True)
        os.symlink(str(listener.path), node / "var/lib/kubelet/device-plugins/nvidia-gpu.sock")
        os.symlink(str(listener.path), node / "var/lib/kubelet/pod-resources/kubelet.sock")
        cfg = AgentConfig(kube=False, listen="", boot_grace_s=0, node_name="n1", probes=False, grpc=True,
                          grpc_timeout_s=0.5)
        Agent(cfg, root=HostRoot(str(node)), out=io.StringIO()).check()
        listener.assert_untouched()


def test_open_socket_connects_to_the_socket_itself_and_refuses_links(tmp_path):
    with CanaryListener(tmp_path / "node/run/real.sock") as inside:
        os.symlink("real.sock", tmp_path / "node/run/link.sock")
        (tmp_path / "node/run/file.sock").write_text("")
        r = HostRoot(str(tmp_path / "node"))
        fd = r.open_socket("/run/real.sock")
        try:
            c = socket.socket(socket.AF_UNIX)
            c.connect(confine.fd_address(fd))
            c.close()
        finally:
            os.close(fd)
        assert inside.pending()
        for name, err in (("link.sock", "symbolic link"), ("file.sock", "not a unix socket")):
            with pytest.raises(OSError, match=err):
                r.open_socket(f"/run/{name}")


# --- 2. directory bundles ----------------------------------------------------------------------------

def _bundle(tmp: Path) -> Path:
    b = tmp / "bundle"
    (b / "files/proc/sys/kernel").mkdir(parents=True)
    (b / "files/proc/sys/kernel/hostname").write_text("bundle-node\n")
    (b / "meta.json").write_text(json.dumps({"captured_at": 1_790_000_000}))
    return b


@pytest.mark.parametrize("target", ["outside", "/"])
def test_bundle_files_link_to_the_host_shows_nothing_of_it(tmp_path, target):
    """Issue: `files -> /` made the report show the analysing machine's host name and kernel."""
    outside = tmp_path / "outside-host"
    (outside / "proc/sys/kernel").mkdir(parents=True)
    (outside / "proc/sys/kernel/hostname").write_text("CANARY-HOST-7c1\n")
    (outside / "proc/sys/kernel/osrelease").write_text("CANARY-KERNEL-7c1\n")
    b = _bundle(tmp_path)
    os.rename(b / "files", tmp_path / "files-aside")
    os.symlink(str(outside) if target == "outside" else "/", b / "files")
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    out = r.output + r.stderr
    assert r.exit_code in (0, 1, 4), out
    assert "CANARY-" not in out
    assert socket.gethostname() not in json.dumps(json.loads(r.stdout)["node"])
    assert "files is a symbolic link: not followed" in out


def test_bundle_meta_json_link_out_is_refused_and_its_base_ignored(tmp_path):
    """Issue: a meta.json link outside was read and its `base` honoured."""
    canary = CanaryFile(tmp_path / "outside" / "meta.json",
                        json.dumps({"base": "egl-framebuffer-escape", "captured_at": 1_790_000_000}).encode())
    b = _bundle(tmp_path)
    os.unlink(b / "meta.json")
    os.symlink(canary.path, b / "meta.json")
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exit_code == 2, r.output
    assert "meta.json is a symbolic link: not followed" in r.stderr
    assert "GPU-NODE-001" not in r.output


def test_bundle_directory_is_still_read_when_it_is_well_formed(tmp_path):
    b = _bundle(tmp_path)
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exit_code in (0, 1, 4), r.output
    assert "bundle-node" in json.dumps(json.loads(r.stdout)["node"])


# --- probe-access: joining a container's cgroup is a write too --------------------------------------

def test_probe_access_never_joins_a_copied_cgroup_or_writes_through_its_link(tmp_path):
    from gpuwarden.probes import devaccess

    canary = CanaryFile(tmp_path / "outside" / "procs-target")
    d = tmp_path / "node" / POD_CGROUP.lstrip("/")
    d.mkdir(parents=True)
    os.symlink(canary.path, d / "cgroup.procs")
    out = devaccess.probe(HostRoot(str(tmp_path / "node")), [POD_CGROUP], ["/dev/null"], timeout=5)
    assert out.status == "error" and "not on the kernel's cgroup filesystem" in out.detail, out
    canary.assert_unchanged()


def test_the_canaries_see_what_they_guard(tmp_path):
    """The watchers themselves: a change, a connection and a signal are each noticed."""
    canary = CanaryFile(tmp_path / "c")
    (tmp_path / "c").write_bytes(b"changed")
    with pytest.raises(AssertionError):
        canary.assert_unchanged()
    with CanaryListener(tmp_path / "s.sock") as listener:
        socket.socket(socket.AF_UNIX).connect(str(listener.path))
        with pytest.raises(AssertionError):
            listener.assert_untouched()
    with CanaryProcess() as victim:
        os.kill(victim.pid, 9)
        victim.proc.wait()
        with pytest.raises(AssertionError):
            victim.assert_alive()
