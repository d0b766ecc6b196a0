"""Every read of a node stays inside its root: HostRoot (openat2 and the fallback walk), BundleRoot.

A canary file sits next to the tree; links of every shape (absolute, `../`, chains, loops, into
/proc) are planted in the tree, and no operation of the root may return the canary's bytes, list
its directory or name a path outside the tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from gpuwarden import confine
from gpuwarden.root import BundleRoot, HostRoot, Missing, StatInfo

CANARY = b"CANARY-9d1f outside the node's root"
NAMES = ["a", "b", "etc", "proc", "var", "log", ".."]


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    if request.param == "openat2" and not confine.USE_OPENAT2:
        pytest.skip("openat2 not available on this kernel")
    monkeypatch.setattr(confine, "USE_OPENAT2", request.param == "openat2")
    return request.param


def _world(tmp: Path) -> tuple[Path, Path]:
    """tmp/outside/secret (the canary, also at tmp/etc/secret) and tmp/node (the root)."""
    (tmp / "outside").mkdir(exist_ok=True)
    (tmp / "outside/secret").write_bytes(CANARY)
    (tmp / "etc").mkdir(exist_ok=True)
    (tmp / "etc/secret").write_bytes(CANARY)
    node = tmp / "node"
    (node / "etc").mkdir(parents=True, exist_ok=True)
    (node / "etc/secret").write_bytes(b"inside")
    return tmp, node


def _leaks(root: HostRoot | BundleRoot, path: str, outside: Path) -> list[str]:
    out = []
    for name, v in (("read_bytes", root.read_bytes(path)), ("listdir", root.listdir(path)),
                    ("readlink", root.readlink(path))):
        if isinstance(v, bytes) and CANARY in v:
            out.append(f"{name}({path}) read the canary")
        if isinstance(v, list) and "secret" in v and "outside" in str(path):
            out.append(f"{name}({path}) listed outside")
    lines = root.open_lines(path)
    if not isinstance(lines, Missing) and CANARY in b"".join(lines):
        out.append(f"open_lines({path}) read the canary")
    hp = root.host_path(path) if isinstance(root, HostRoot) else None
    if hp is not None and not os.path.realpath(hp).startswith(str(root.base) + os.sep) and os.path.realpath(hp) != root.base:
        out.append(f"host_path({path}) = {hp} is outside")
    return out


def test_absolute_link_resolves_inside_the_root(tmp_path, resolver) -> None:
    """/var/log/containers/*.log are absolute links meant for the host: under /host they must stay there."""
    _, node = _world(tmp_path)
    (node / "var/log/pods/ns_p_u/c").mkdir(parents=True)
    (node / "var/log/pods/ns_p_u/c/0.log").write_text("inside the host\n")
    (node / "var/log/containers").mkdir(parents=True)
    os.symlink("/var/log/pods/ns_p_u/c/0.log", node / "var/log/containers/p_ns_c-1.log")
    os.symlink("/etc/secret", node / "abs")
    os.symlink("../../../../../../etc/secret", node / "up")
    os.symlink(str(tmp_path / "outside/secret"), node / "real-abs")
    r = HostRoot(str(node))
    assert r.read_text("/var/log/containers/p_ns_c-1.log") == "inside the host\n"
    assert r.read_bytes("/abs") == b"inside" and r.read_bytes("/up") == b"inside"
    assert r.read_bytes("/real-abs") == Missing("/real-abs", "missing")  # that path does not exist in the node
    assert r.read_bytes("/../../outside/secret") == Missing("/outside/secret", "missing")
    assert r.host_path("/abs") == str(node / "etc/secret")
    assert r.stat("/abs").kind == "file" and r.stat("/abs", follow=False).kind == "link"
    assert r.readlink("/abs") == "/etc/secret"


def test_link_loops_and_long_chains_end_in_eloop(tmp_path, resolver) -> None:
    _, node = _world(tmp_path)
    os.symlink("/loop2", node / "loop1")
    os.symlink("/loop1", node / "loop2")
    for i in range(confine.MAX_LINKS + 5):
        os.symlink(f"/c{i + 1}", node / f"c{i}")
    r = HostRoot(str(node))
    for p in ("/loop1", "/c0"):
        m = r.read_bytes(p)
        assert isinstance(m, Missing) and m.kind == "error" and "ELOOP" in m.detail


def test_proc_root_of_a_copied_tree_is_an_ordinary_link(tmp_path, resolver) -> None:
    """/proc/<pid>/root in a tree that is not procfs is resolved in the tree, never on the real /."""
    _, node = _world(tmp_path)
    (node / "proc/77").mkdir(parents=True)
    os.symlink("/", node / "proc/77/root")
    r = HostRoot(str(node))
    assert r.read_bytes("/proc/77/root/etc/secret") == b"inside"
    assert r.listdir("/proc/77/root/etc") == ["secret"]


def test_proc_root_on_real_procfs_is_the_process_view(resolver) -> None:
    """On a live node, /proc/<pid>/root/dev is the container's /dev (what _dev_view reads)."""
    r = HostRoot("/")
    names = r.listdir(f"/proc/{os.getpid()}/root/proc/self")
    assert isinstance(names, list) and "status" in names
    assert isinstance(r.stat(f"/proc/{os.getpid()}/root/"), StatInfo)


def test_magic_links_are_not_followed(tmp_path, resolver) -> None:
    """/proc/self/fd/N of an fd open outside the root must not become a way out."""
    _, node = _world(tmp_path)
    fd = os.open(tmp_path / "outside/secret", os.O_RDONLY)
    try:
        (node / "proc").mkdir()
        os.symlink(f"/proc/self/fd/{fd}", node / "fdlink")
        r = HostRoot(str(node))
        assert not isinstance(r.read_bytes("/fdlink"), bytes)  # resolved in the tree: no /proc/self there
        live = HostRoot("/")
        got = live.read_bytes(f"/proc/self/fd/{fd}")
        assert not (isinstance(got, bytes) and CANARY in got) or not confine.USE_OPENAT2
    finally:
        os.close(fd)


# --- the property ------------------------------------------------------------------------------

_component = st.sampled_from(NAMES)
_target = st.one_of(
    st.lists(_component, min_size=0, max_size=6).map(lambda p: "/" + "/".join(p)),
    st.lists(_component, min_size=1, max_size=8).map("/".join),
    st.sampled_from(["/etc/secret", "../outside/secret", "../../outside", "/proc/self/root/etc", "/..", "..",
                     "/proc/self/fd/0", "../../../../etc/secret"]),
)
_tree = st.lists(st.tuples(st.lists(_component.filter(lambda c: c != ".."), min_size=1, max_size=3), _target),
                 min_size=1, max_size=12)
_query = st.lists(_component, min_size=0, max_size=8).map(lambda p: "/" + "/".join(p + ["secret"]))


def _plant(top: Path, links) -> None:
    """Create the drawn links; a parent that is itself a link (or a loop) is left as it is."""
    for parts, target in links:
        where = top.joinpath(*parts)
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(where):
                os.symlink(target, where)
        except OSError:
            pass


@given(links=_tree, queries=st.lists(_query, min_size=1, max_size=8), walk=st.booleans())
def test_no_link_leads_out_of_a_host_root(tmp_path_factory, links, queries, walk) -> None:
    tmp = tmp_path_factory.mktemp("w")
    outside, node = _world(tmp)
    _plant(node, links)
    old = confine.USE_OPENAT2
    confine.USE_OPENAT2 = old and not walk
    try:
        r = HostRoot(str(node))
        leaks = [x for q in queries + ["/outside/secret", "/../outside"] for x in _leaks(r, q, outside)]
    finally:
        confine.USE_OPENAT2 = old
    assert leaks == []


@given(links=_tree, queries=st.lists(_query, min_size=1, max_size=8))
def test_no_link_leads_out_of_a_bundle_directory(tmp_path_factory, links, queries) -> None:
    """`check --bundle DIR` and the examples: a link under files/ reads nothing outside files/."""
    tmp = tmp_path_factory.mktemp("b")
    _world(tmp)
    b = tmp / "bundle"
    (b / "files/etc").mkdir(parents=True)
    (b / "files/etc/secret").write_bytes(b"inside")
    (b / "meta.json").write_text(json.dumps({"readlink": {"/x": "../../../outside/secret", "/y": "/etc/secret"},
                                             "listdir": {"/z": ["..", "../outside", "ok"]}}))
    _plant(b / "files", links)
    r = BundleRoot(b)
    assert [x for q in queries + ["/x", "/y", "/z"] for x in _leaks(r, q, tmp)] == []
    assert r.listdir("/z") == Missing("/z", "invalid", "invalid entry in meta.json")
