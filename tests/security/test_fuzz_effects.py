"""Property-based (Hypothesis) tests of issue 30's side-effect classes: links planted for writes,
sockets and kills, and directory bundles with links.

Each property plants links of every shape (absolute, `../`, chains, into the real /proc or
/sys/fs/cgroup, to a canary outside) in a node tree, does the side effect, and watches canaries
outside the root (tests/support/canaries.py): a file that must keep its bytes and mtime in a
directory that must gain no name, a listening socket that must receive no connection, a live
process that must not be signalled. Budgets come from tests/security/conftest.py (bounded in CI).
The plain reproductions are in test_side_effects.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

from hypothesis import given, strategies as st

from gpuwarden import confine
from gpuwarden.bundle.archive import BundleError, open_bundle
from gpuwarden.remediation.localkill import kill_pod
from gpuwarden.root import HostRoot
from tests.security.test_confinement import _plant, resolver  # noqa: F401 (a fixture: both resolvers)
from tests.support.canaries import DEFAULT, CanaryFile, CanaryListener, CanaryProcess

UID = "a6234a7e-29ef-434f-b254-d3cccc28be4e"
POD_CGROUP = f"/sys/fs/cgroup/kubepods/burstable/pod{UID}"
NAMES = ["run", "gpuwarden", "var", "lib", "kubelet", "device-plugins", "x.sock", "f", ".."]


def _short_dir() -> Path:
    """A fresh directory with a short path (a unix socket address holds at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))


def _targets(outside: Path) -> st.SearchStrategy[str]:
    comp = st.sampled_from(NAMES)
    return st.one_of(
        st.lists(comp, min_size=0, max_size=5).map(lambda p: "/" + "/".join(p)),
        st.lists(comp, min_size=1, max_size=6).map("/".join),
        st.sampled_from([str(outside), str(outside / "canary"), str(outside / "canary.sock"), "../" * 8 + "outside",
                         "../" * 8 + "outside/canary", "/proc/self/root" + str(outside), "/proc/self/fd/0",
                         "/sys/fs/cgroup", "/", ".."]),
    )


_comp = st.sampled_from([n for n in NAMES if n != ".."])
_path = st.lists(st.sampled_from(NAMES), min_size=1, max_size=5).map(lambda p: "/" + "/".join(p))


def _links(outside: Path) -> st.SearchStrategy:
    return st.lists(st.tuples(st.lists(_comp, min_size=1, max_size=4), _targets(outside)), min_size=1, max_size=10)


_OUTSIDE = Path("/tmp/gw-fuzz-outside-placeholder")  # replaced per example: the strategies only name it


def _rebase(links, outside: Path):
    return [(p, t.replace(str(_OUTSIDE), str(outside))) for p, t in links]


@given(links=_links(_OUTSIDE), writes=st.lists(_path, min_size=1, max_size=4), data=st.binary(max_size=64))
def test_no_write_lands_outside_the_root(resolver, links, writes, data):
    """HostRoot.write_file (the memory samples, the outbox) with links planted on and around the path."""
    tmp = _short_dir()
    try:
        canary = CanaryFile(tmp / "outside" / "canary")
        node = tmp / "node"
        node.mkdir()
        _plant(node, _rebase(links, tmp / "outside"))
        r = HostRoot(str(node))
        wrote = 0
        for w in writes:
            try:
                r.write_file(w, data + w.encode())
                wrote += 1
            except OSError:
                continue
        canary.assert_unchanged()
        assert sorted(os.listdir(tmp)) == ["node", "outside"]
        found = []  # every write is a regular file in the tree (os.walk follows no link), no temporary left
        for d, _, names in os.walk(node):
            for n in names:
                p = Path(d, n)
                assert not n.endswith(".tmp"), p
                if not p.is_symlink() and p.read_bytes().startswith(data):
                    found.append(p)
        assert len(found) >= min(wrote, 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@given(links=_links(_OUTSIDE), queries=st.lists(_path, min_size=1, max_size=5))
def test_no_socket_outside_the_root_is_connected_to(resolver, links, queries):
    """HostRoot.open_socket + fd_address (the plugin and pod-resources probes): only a socket inside."""
    tmp = _short_dir()
    try:
        with CanaryListener(tmp / "outside" / "canary.sock") as canary:
            node = tmp / "node"
            (node / "run").mkdir(parents=True)
            inside = socket.socket(socket.AF_UNIX)
            inside.bind(str(node / "run/x.sock"))
            inside.listen(8)
            _plant(node, _rebase(links, tmp / "outside"))
            r = HostRoot(str(node))
            for q in queries + ["/run/x.sock", "/var/lib/kubelet/device-plugins/x.sock"]:
                try:
                    fd = r.open_socket(q)
                except OSError:
                    continue
                try:
                    assert os.fstat(fd).st_ino == os.stat(node / "run/x.sock").st_ino
                    c = socket.socket(socket.AF_UNIX)
                    c.settimeout(1)
                    c.connect(confine.fd_address(fd))
                    c.close()
                finally:
                    os.close(fd)
            inside.close()
            canary.assert_untouched()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@given(links=st.lists(st.tuples(st.sampled_from(["", "c" * 64, "cgroup.kill", "cgroup.procs"]),
                                st.sampled_from(["canary", "outside", "/sys/fs/cgroup", "/sys/fs/cgroup/cgroup.procs",
                                                 "/proc/self", "../..", "/"])),
                      max_size=4),
       procs=st.booleans())
def test_no_kill_reaches_outside_a_live_cgroupfs(links, procs):
    """kill_pod on a copied tree: whatever its pod cgroup links to, no pid is signalled and nothing written."""
    tmp = _short_dir()
    try:
        with CanaryProcess() as victim:
            canary = CanaryFile(tmp / "outside" / "canary")
            node = tmp / "node"
            pod = node / POD_CGROUP.lstrip("/")
            (pod / ("c" * 64)).mkdir(parents=True)
            if procs:
                (pod / ("c" * 64) / "cgroup.procs").write_text(f"{victim.pid}\n")
                (pod / "cgroup.procs").write_text(f"{victim.pid}\n")
            # the pod directory itself last: once it is a link, nothing more is made under it (this
            # test's own setup would otherwise follow it on the real filesystem)
            for where, target in sorted(links, key=lambda x: x[0] == ""):
                t = str(canary.path) if target == "canary" else str(tmp / "outside") if target == "outside" else target
                spot = pod / where if where else pod
                if spot.is_symlink() or spot.is_file():
                    os.unlink(spot)
                elif spot.is_dir():
                    shutil.rmtree(spot)
                os.symlink(t, spot)
                if not where:
                    break
            r = kill_pod(HostRoot(str(node)), POD_CGROUP, UID, timeout_s=5)
            assert not r.ok and r.error.startswith("refused"), r.describe()
            victim.assert_alive()
            canary.assert_unchanged()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_bundle_links = st.lists(st.tuples(st.lists(st.sampled_from(["proc", "sys", "kernel", "hostname", "etc", ".."]),
                                            min_size=1, max_size=4),
                                   st.sampled_from(["/", "..", "../..", "../../outside", "../../../outside/hostname",
                                                    "/etc/hostname", "/proc/self/root/etc/hostname"])),
                         max_size=6)


@given(meta=st.sampled_from(["file", "link-out", "link-in", "absent", "dir"]),
       files=st.sampled_from(["dir", "link-root", "link-out", "link-in", "absent"]), links=_bundle_links)
def test_a_directory_bundle_reads_nothing_outside_it(meta, files, links):
    """`check --bundle DIR`: meta.json and files/ are read beneath DIR, never through a link."""
    tmp = _short_dir()
    try:
        outside = tmp / "outside"
        outside.mkdir()
        (outside / "hostname").write_bytes(DEFAULT)
        (outside / "meta.json").write_text(json.dumps({"base": "egl-framebuffer-escape"}))
        b = tmp / "bundle"
        (b / "real/proc/sys/kernel").mkdir(parents=True)
        (b / "real/proc/sys/kernel/hostname").write_text("bundle-node\n")
        (b / "meta.real").write_text(json.dumps({"captured_at": 1_790_000_000}))
        if meta == "file":
            (b / "meta.json").write_text(json.dumps({"captured_at": 1_790_000_000}))
        elif meta == "dir":
            (b / "meta.json").mkdir()
        elif meta != "absent":
            os.symlink(str(outside / "meta.json") if meta == "link-out" else "meta.real", b / "meta.json")
        if files == "dir":
            os.rename(b / "real", b / "files")
        elif files != "absent":
            os.symlink({"link-root": "/", "link-out": str(outside), "link-in": "real"}[files], b / "files")
        _plant(b / "files" if files == "dir" else b / "real", links)
        try:
            root, keep = open_bundle(b)
        except BundleError as exc:
            assert meta != "file" and ("meta.json" in str(exc))
            return
        assert meta == "file" and keep is None and root.lower is None  # no base read from outside
        for p in ("/proc/sys/kernel/hostname", "/etc/hostname", "/hostname", "/outside/hostname"):
            got = root.read_bytes(p)
            assert not (isinstance(got, bytes) and DEFAULT in got), p
            assert not (isinstance(got, bytes) and files != "dir"), f"{p} read through files -> {files}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
