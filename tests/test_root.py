"""The rooted reader: HostRoot on a real tmp tree, BundleRoot on examples and hand-made bundles, glob()."""

from __future__ import annotations

import json
import os
import signal
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuwarden.root import BundleRoot, HostRoot, Missing, StatInfo, glob, norm
from tests.support.bundles import CAPTURE, EXAMPLES, example_root

IS_ROOT = os.geteuid() == 0


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when a read blocks."""

    def boom(signum, frame):
        raise AssertionError(f"read blocked for more than {seconds}s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/devices").write_bytes((CAPTURE / "files/proc/devices").read_bytes())
    (tmp_path / "proc/driver/nvidia/version").write_bytes((CAPTURE / "files/proc/driver/nvidia/version").read_bytes())
    (tmp_path / "dev/char").mkdir(parents=True)
    return tmp_path


# --- HostRoot ---------------------------------------------------------------------------------


def test_host_regular_file(tree: Path) -> None:
    r = HostRoot(str(tree))
    text = r.read_text("/proc/devices")
    assert isinstance(text, str) and "238 nvidia-uvm" in text
    assert r.read_bytes("proc/driver/nvidia/version").startswith(b"NVRM version: NVIDIA UNIX Open Kernel Module")
    assert r.live and r.label == f"live:{tree}"


def test_host_missing_file(tree: Path) -> None:
    r = HostRoot(str(tree))
    m = r.read_text("/proc/meminfo")
    assert m == Missing("/proc/meminfo", "missing")
    assert str(m) == "/proc/meminfo: missing"
    # a path through a regular file (ENOTDIR) is missing too
    assert r.read_text("/proc/devices/x") == Missing("/proc/devices/x", "missing")
    assert r.listdir("/nope") == Missing("/nope", "missing")
    assert r.stat("/dev/nvidia-uvm") == Missing("/dev/nvidia-uvm", "missing")
    assert r.readlink("/dev/char/195:0") == Missing("/dev/char/195:0", "missing")
    assert isinstance(r.open_lines("/nope"), Missing)


def test_host_directory_read_is_an_error(tree: Path) -> None:
    m = HostRoot(str(tree)).read_bytes("/proc/driver")
    assert isinstance(m, Missing) and m.kind == "error"
    assert "not a regular file" in m.detail


def test_host_fifo_does_not_block(tree: Path) -> None:
    os.mkfifo(tree / "proc/fifo")
    r = HostRoot(str(tree))
    with deadline(5):
        m = r.read_bytes("/proc/fifo")
        lines = r.open_lines("/proc/fifo")
    assert isinstance(m, Missing) and m.kind == "error" and "not a regular file" in m.detail
    assert isinstance(lines, Missing) and lines.kind == "error"
    assert r.stat("/proc/fifo").kind == "other"


@pytest.mark.skipif(not IS_ROOT, reason="mknod of a character device needs root")
def test_host_char_device(tree: Path) -> None:
    os.mknod(tree / "dev/nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    r = HostRoot(str(tree))
    st = r.stat("/dev/nvidiactl")
    assert isinstance(st, StatInfo)
    assert (st.kind, st.major, st.minor) == ("chr", 195, 255)
    assert st.ctime > 0 and st.path == "/dev/nvidiactl"
    assert st.to_json()["major"] == 195
    with deadline(5):
        m = r.read_bytes("/dev/nvidiactl")  # opening it may fail (no driver) or succeed; never read
    assert isinstance(m, Missing) and m.kind == "error"
    assert sorted(glob(r, "/dev/nvidia*")) == ["/dev/nvidiactl"]


def test_host_symlink(tree: Path) -> None:
    (tree / "dev/nvidia0").write_text("")
    os.symlink("../nvidia0", tree / "dev/char/195:0")
    r = HostRoot(str(tree))
    assert r.readlink("/dev/char/195:0") == "../nvidia0"
    assert r.stat("/dev/char/195:0", follow=False).kind == "link"
    assert r.stat("/dev/char/195:0").kind == "file"
    assert r.listdir("/dev/char") == ["195:0"]
    os.symlink("../nowhere", tree / "dev/char/195:1")
    assert r.stat("/dev/char/195:1") == Missing("/dev/char/195:1", "missing")


def test_host_max_bytes(tree: Path) -> None:
    big = tree / "var/log/kubelet.log"
    big.parent.mkdir(parents=True)
    big.write_bytes(b"x" * (3 << 20))
    r = HostRoot(str(tree))
    assert len(r.read_bytes("/var/log/kubelet.log", max_bytes=100)) == 100
    assert len(r.read_bytes("/var/log/kubelet.log", max_bytes=(2 << 20) + 7)) == (2 << 20) + 7
    assert len(r.read_bytes("/var/log/kubelet.log")) == 3 << 20


def test_host_open_lines(tree: Path) -> None:
    lines = list(HostRoot(str(tree)).open_lines("/proc/devices"))
    assert lines[0] == b"Character devices:\n"
    assert b"195 nvidiactl\n" in lines


def test_host_path_cannot_escape_base(tree: Path) -> None:
    r = HostRoot(str(tree))
    assert r.host_path("/../../etc/passwd") == str(tree / "etc/passwd")
    assert HostRoot("/").host_path("proc//devices") == "/proc/devices"
    assert norm("a/../b/./c") == "/b/c"


def _as_nobody(fn) -> object:
    """Run fn() in a forked child that dropped to uid/gid 65534; return its JSON-able result.

    (Fork, not exec: the venv's interpreter may live where uid 65534 cannot reach it.)
    """
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(wfd, json.dumps(fn()).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to drop to uid 65534 (chmod cannot deny root)")
def test_host_permission_denied() -> None:
    d = tempfile.mkdtemp(prefix="gw-denied-")
    try:
        os.chmod(d, 0o755)
        secret = Path(d, "config.yaml")
        secret.write_text("cpuManagerPolicy: static\n")
        os.chmod(secret, 0o600)
        private = Path(d, "private")
        private.mkdir(mode=0o700)
        r = HostRoot(d)

        def probe() -> dict:
            m, lst = r.read_text("/config.yaml"), r.listdir("/private")
            return {"read": [m.kind, m.detail] if isinstance(m, Missing) else m,
                    "list": [lst.kind] if isinstance(lst, Missing) else lst}

        res = _as_nobody(probe)
        assert res["read"][0] == "denied" and res["read"][1]  # strerror kept as detail
        assert res["list"] == ["denied"]
    finally:
        import shutil

        shutil.rmtree(d)


# --- BundleRoot ----------------------------------------------------------------------------------


def test_bundle_files_and_meta_stat() -> None:
    r = example_root("healthy")
    assert not r.live and r.label == "example:healthy"
    assert "238 nvidia-uvm" in r.read_text("/proc/devices")
    st = r.stat("/dev/nvidiactl")
    assert (st.kind, st.major, st.minor) == ("chr", 195, 255)
    assert st.ctime == pytest.approx(1795313528.2948635)
    # a directory of files/ stats as a directory
    assert r.stat("/proc/driver").kind == "dir"
    assert r.stat("/proc/devices").kind == "file"
    assert r.host_path("/proc/devices") is None


def test_bundle_listdir_from_files_stats_and_meta() -> None:
    r = example_root("healthy")
    dev = r.listdir("/dev")  # only device stats exist under /dev
    assert {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"} <= set(dev)
    assert r.listdir("/dev/nvidia-caps") == ["nvidia-cap1", "nvidia-cap2"]
    assert "nvidia-gpu.sock" in r.listdir("/var/lib/kubelet/device-plugins")  # meta listdir ...
    assert "kubelet_internal_checkpoint" in r.listdir("/var/lib/kubelet/device-plugins")  # ... and files/
    assert r.listdir("/sys/fs/cgroup")[:3] == ["blkio", "cpu", "cpu,cpuacct"]
    assert r.listdir("/nope") == Missing("/nope", "missing")


def test_bundle_readlink_and_missing_records(tmp_path: Path) -> None:
    (tmp_path / "files/proc").mkdir(parents=True)
    (tmp_path / "meta.json").write_text(json.dumps({
        "stat": {"/dev/nvidiactl": {"path": "/dev/nvidiactl", "kind": "chr", "major": 195, "minor": 255,
                                    "mode": 8630, "ctime": 1.0, "mtime": 1.0, "size": 0, "inode": 7},
                 "/dev/nvidia9": {"kind": "chr"}},
        "readlink": {"/dev/char/195:255": "../nvidiactl", "/dev/char/1:1": "/dev/char/1:2",
                     "/dev/char/1:2": "/dev/char/1:1"},
        "missing": {"/proc/1/environ": ["denied", "EACCES"], "/var/lib/kubelet/config.yaml": ["error"]},
    }))
    r = BundleRoot(tmp_path)
    assert r.readlink("/dev/char/195:255") == "../nvidiactl"
    assert r.stat("/dev/char/195:255").minor == 255  # followed, relative to /dev/char
    assert r.stat("/dev/char/195:255", follow=False).kind == "link"
    # an unknown key (a newer collector) is ignored; a broken record is an error value, not a raise
    assert r.stat("/dev/nvidiactl").major == 195
    bad = r.stat("/dev/nvidia9")
    assert isinstance(bad, Missing) and bad.kind == "invalid"
    loop = r.stat("/dev/char/1:1")
    assert isinstance(loop, Missing) and "ELOOP" in loop.detail
    assert r.read_text("/proc/1/environ") == Missing("/proc/1/environ", "denied", "EACCES")
    assert r.read_text("/var/lib/kubelet/config.yaml") == Missing("/var/lib/kubelet/config.yaml", "error")
    assert r.stat("/proc/1/environ").kind == "denied"
    assert r.listdir("/dev/char") == sorted(["1:1", "1:2", "195:255"])
    assert r.readlink("/dev/char/9:9") == Missing("/dev/char/9:9", "missing")


def test_bundle_directory_read_and_max_bytes() -> None:
    r = example_root("healthy")
    assert isinstance(r.read_bytes("/proc/driver"), Missing)
    assert len(r.read_bytes("/proc/meminfo", max_bytes=10)) == 10


@pytest.mark.parametrize("meta", ["{not json", "[1, 2]", "", "null"])
def test_bundle_garbage_meta_is_empty_not_a_crash(tmp_path: Path, meta: str) -> None:
    (tmp_path / "files/proc").mkdir(parents=True)
    (tmp_path / "files/proc/devices").write_text("Character devices:\n195 nvidia\n")
    (tmp_path / "meta.json").write_text(meta)
    r = BundleRoot(tmp_path)
    assert r.meta == {}
    assert r.read_text("/proc/devices").startswith("Character")
    assert isinstance(r.stat("/dev/nvidiactl"), Missing)


def test_overlay_base_and_remove_whiteouts() -> None:
    healthy, uvm = example_root("healthy"), example_root("uvm-missing")
    assert uvm.lower is not None and uvm.lower.label == "example:healthy"
    # the lower layer's files show through
    assert uvm.read_text("/proc/devices") == healthy.read_text("/proc/devices")
    assert uvm.read_text("/var/lib/kubelet/config.yaml") == healthy.read_text("/var/lib/kubelet/config.yaml")
    # the upper layer wins
    gpu_list = "/sys/fs/cgroup/devices/kubepods/besteffort/pod8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b/" \
               "4c2f0b8e9a7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d/devices.list"
    assert "c 238:0 rw" in healthy.read_text(gpu_list)
    assert "c 238:0 rw" not in uvm.read_text(gpu_list)
    assert uvm.stat("/dev/nvidia-uvm").ctime == 1795313622.0
    # `remove` hides the plugin's uvm nodes that the healthy base has
    assert healthy.stat("/proc/2301/root/dev/nvidia-uvm").kind == "chr"
    assert isinstance(uvm.stat("/proc/2301/root/dev/nvidia-uvm"), Missing)
    assert "nvidia-uvm" in healthy.listdir("/proc/2301/root/dev")
    assert "nvidia-uvm" not in uvm.listdir("/proc/2301/root/dev")
    assert "nvidia0" in uvm.listdir("/proc/2301/root/dev")
    # other processes' views are untouched
    assert "nvidia-uvm" in uvm.listdir("/proc/3400/root/dev")
    # listings are the union of both layers
    procs = uvm.listdir("/proc")
    assert {"1200", "2301", "3400", "devices", "meminfo"} <= set(procs)
    # meta: the upper's keys over the lower's (captured_at comes from the base)
    assert uvm.meta_merged["captured_at"] == 1795313561.0
    assert uvm.meta_merged["base"] == "healthy"


def test_overlay_remove_hides_a_whole_lower_tree() -> None:
    sd = example_root("systemd-reload-device-loss")
    assert "cgroupDriver: systemd" in sd.read_text("/var/lib/kubelet/config.yaml")
    assert "1.1.5" in sd.read_text("/.gpuwarden/commands/runc-version.txt")
    # healthy's cgroupfs tree is whited out, the systemd one replaces it
    assert isinstance(sd.listdir("/sys/fs/cgroup/devices/kubepods"), Missing)
    assert "kubepods.slice" in sd.listdir("/sys/fs/cgroup/devices")
    assert "kubepods" not in sd.listdir("/sys/fs/cgroup/devices")
    assert sd.stat("/dev/nvidiactl").major == 195  # bottom layer


def test_capture_is_cgroup_v2() -> None:
    r = BundleRoot(CAPTURE)
    assert r.read_text("/sys/fs/cgroup/cgroup.controllers").split() == ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"]
    assert "cgroup.controllers" in r.listdir("/sys/fs/cgroup")


def test_glob() -> None:
    r = example_root("healthy")
    assert glob(r, "/dev/nvidia*") == ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                       "/dev/nvidia0", "/dev/nvidiactl"]
    assert glob(r, "/dev/nvidia-caps/*") == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    assert glob(r, "/proc/driver/nvidia/gpus/*/information") == ["/proc/driver/nvidia/gpus/0000:00:06.0/information"]
    assert glob(r, "/proc/[0-9]*/cmdline")[:2] == ["/proc/1/cmdline", "/proc/1100/cmdline"]
    assert glob(r, "/nope/*") == []
    assert glob(r, "/proc/driver/nvidia/capabilities/gpu*/mig/gi*") == []
    # a literal pattern is returned as is (like the shell); readers report it missing
    assert glob(r, "/etc/os-release") == ["/etc/os-release"]


def test_examples_dir_is_packaged() -> None:
    assert (EXAMPLES / "healthy/meta.json").is_file()


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 3 * 65536 + 5, (1 << 20) + 7, (3 << 20) + 1])
def test_read_fd_reads_every_size_whole_and_stops_at_the_limit(tmp_path, size) -> None:
    """The pieces grow from READ_FIRST to READ_MAX (a 1 MiB read per small file fragmented the agent's
    C heap): every size is read whole, and max_bytes still cuts it."""
    from gpuwarden.root import read_fd

    data = bytes(i % 251 for i in range(size))
    f = tmp_path / "f"
    f.write_bytes(data)
    for limit in (None, size, max(0, size - 3), 70000):
        fd = os.open(f, os.O_RDONLY)
        try:
            got = read_fd(fd, limit)
        finally:
            os.close(fd)
        assert got == (data if limit is None else data[:limit])


_SEGMENT = ["a", "b", "..", ".", "", "x y", "...", "c\\d", "nvidia0"]


def test_a_relative_link_target_is_joined_as_pathlib_joined_it() -> None:
    """BundleRoot.stat follows a relative link in meta.json from the link's directory with posixpath
    (a check does not import pathlib); the path is the one PurePosixPath(p).parent / target gave."""
    import posixpath
    from pathlib import PurePosixPath

    from hypothesis import given, settings, strategies as st

    @settings(max_examples=500, deadline=None)
    @given(st.lists(st.sampled_from(_SEGMENT), max_size=6), st.lists(st.sampled_from(_SEGMENT), max_size=6),
           st.booleans())
    def same(link: list[str], target: list[str], slash: bool) -> None:
        p, t = norm("/".join(link)), "/".join(target) + ("/" if slash else "")
        if not t.startswith("/"):
            assert norm(posixpath.join(posixpath.dirname(p), t)) == norm(str(PurePosixPath(p).parent / t))

    same()


def test_bundle_root_keeps_its_directory_as_paths(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "files").mkdir()
    for given_as in (tmp_path, str(tmp_path), str(tmp_path) + "/"):
        root = BundleRoot(given_as)
        assert root.base == tmp_path and root.files == tmp_path / "files" and root.label == f"bundle:{tmp_path}"
        assert root.meta_error == ""
