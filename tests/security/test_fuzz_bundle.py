"""Hostile bundles: any tarball or manifest opens as a bundle or is refused with BundleError; once
open, nothing is read outside it, a lying manifest confirms nothing, and the limits hold while
streaming (a bomb is refused after its limit, not after its gigabytes)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import example, given, strategies as st

from gpuwarden import engine
from gpuwarden.bundle import archive
from gpuwarden.bundle.archive import BundleError, open_bundle
from tests.support.bundles import facts_of

CANARY = b"CANARY-bundle-7c2e"

_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
                         st.text(max_size=20), st.sampled_from(["../../outside", "/etc", "healthy", "..", "/"]))
_json = st.recursive(_json_scalar, lambda c: st.one_of(st.lists(c, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), c, max_size=4)),
                     max_leaves=12)
_node_path = st.sampled_from(["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/proc/1/fd/3", "/dev/char/195:0",
                              "/var/lib/kubelet/device-plugins", "/proc", "/", "../../etc", "/sys/fs/cgroup"])
_manifest = st.fixed_dictionaries({}, optional={
    "base": st.one_of(st.sampled_from(["healthy", "../healthy", "/etc", "../../outside", ""]), _json),
    "stat": st.one_of(st.dictionaries(_node_path, _json, max_size=4), _json),
    "readlink": st.one_of(st.dictionaries(_node_path, _json, max_size=4), _json),
    "listdir": st.one_of(st.dictionaries(_node_path, _json, max_size=4), _json),
    "missing": st.one_of(st.dictionaries(_node_path, _json, max_size=4), _json),
    "remove": _json, "captured_at": _json, "clk_tck": _json,
})
_member = st.tuples(
    st.sampled_from(["bundle/files/proc/devices", "bundle/files/etc/x", "../escape", "/abs", "bundle/../../up",
                     "bundle/files/dev/nvidia0", "bundle/files/proc/1/cmdline"]),
    st.sampled_from(["file", "dir", "symlink", "hardlink", "chr", "fifo"]),
    st.binary(max_size=64))


def _tar(tmp: Path, meta: object, members: list[tuple[str, str, bytes]]) -> Path:
    out = tmp / "b.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        data = json.dumps(meta).encode()
        ti = tarfile.TarInfo("bundle/meta.json")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
        for name, kind, body in members:
            ti = tarfile.TarInfo(name)
            ti.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                       "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("symlink", "hardlink"):
                ti.linkname = str(tmp / "outside" / "secret")
            ti.size = len(body) if kind == "file" else 0
            tf.addfile(ti, io.BytesIO(body) if kind == "file" else None)
    return out


@given(meta=_manifest, members=st.lists(_member, max_size=5))
@example(meta={"base": "/etc"}, members=[])  # issue 18: a base outside the shipped examples
@example(meta={"base": "../../outside"}, members=[])
@example(meta={"base": "healthy", "stat": {"/dev/nvidia-uvm": {"kind": "chr", "major": -1, "minor": 0}},
               "listdir": {"/var/lib/kubelet/device-plugins": [1, None]}}, members=[])  # issue 18: lying manifest
@example(meta={"base": "healthy", "stat": {"/dev/nvidia0": "chr"}, "readlink": {"/dev/char/195:0": 7}}, members=[])
def test_any_bundle_opens_or_is_refused_and_reads_nothing_outside(tmp_path_factory, meta, members) -> None:
    tmp = tmp_path_factory.mktemp("bundle")
    (tmp / "outside").mkdir()
    (tmp / "outside/secret").write_bytes(CANARY)
    path = _tar(tmp, meta, members)
    try:
        root, keep = open_bundle(path, workdir=str(tmp))
    except BundleError:
        return
    try:
        base = meta.get("base") if isinstance(meta, dict) else None
        if root.lower is not None:
            assert base in ("healthy",)  # only a shipped example can be the lower layer
        rep = engine.run(facts_of(root), None, mode="bundle")
        assert CANARY.decode() not in json.dumps(rep.to_json())
        assert [e for e in rep.errors if "collector" in e or "rule " in e] == []
        if base == "healthy" and any(k in meta for k in ("stat", "readlink", "listdir", "missing")):
            # a manifest that only lies adds no confirmed finding to the healthy node it overlays
            assert [f.code for f in rep.findings if f.status.value == "confirmed"] == []
    finally:
        if keep is not None:
            keep.cleanup()


def test_a_bomb_is_refused_while_streaming(tmp_path, monkeypatch) -> None:
    """A small archive that unpacks to far more than the limit stops at the limit (issue 18: 20 GB, 60 s)."""
    monkeypatch.setattr(archive, "MAX_UNPACKED", 64 << 20)
    bomb = tmp_path / "bomb.tar.gz"
    ti = tarfile.TarInfo("bundle/files/huge")
    ti.size = 4 << 30  # 4 GiB of zeros in ~4 MB: one tar header, then 4096 gzip members of 1 MiB of zeros each
    block = gzip.compress(bytes(1 << 20), compresslevel=9)
    with open(bomb, "wb") as f:
        f.write(gzip.compress(ti.tobuf()))
        for _ in range(4096):
            f.write(block)
    t0 = time.monotonic()
    with pytest.raises(BundleError, match="unpacks to more than 64 MiB|times its size"):
        open_bundle(bomb, workdir=str(tmp_path))
    assert time.monotonic() - t0 < 5
    assert not list(tmp_path.glob("gpuwarden-bundle-*"))  # the partial unpack is removed


def test_too_many_members_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(archive, "MAX_MEMBERS", 10)
    members = [(f"bundle/files/d{i}", "dir", b"") for i in range(20)]
    with pytest.raises(BundleError, match="more than 10 members"):
        open_bundle(_tar(tmp_path, {}, members), workdir=str(tmp_path))


def test_member_limits_are_checked_before_anything_is_written(tmp_path, monkeypatch) -> None:
    """Issue 30: 250,000 tiny members wrote 200,000 files (97 s) before the count limit tripped.
    Headers are counted in a first pass: an archive over a limit writes no member at all."""
    writes: list = []
    real_extract = tarfile.TarFile.extract
    monkeypatch.setattr(tarfile.TarFile, "extract", lambda self, *a, **k: writes.append(a) or real_extract(self, *a, **k))
    monkeypatch.setattr(archive, "MAX_MEMBERS", 10)
    members = [(f"bundle/files/f{i}", "file", b"x") for i in range(11)]
    with pytest.raises(BundleError, match="more than 10 members"):
        open_bundle(_tar(tmp_path, {}, members), workdir=str(tmp_path))
    assert writes == [] and not list(tmp_path.glob("gpuwarden-bundle-*"))
    monkeypatch.setattr(archive, "MAX_MEMBERS", 200_000)
    monkeypatch.setattr(archive, "MAX_UNPACKED", 64)
    big = [(f"bundle/files/f{i}", "file", b"y" * 40) for i in range(2)]
    (tmp_path / "b").mkdir()
    with pytest.raises(BundleError, match="unpacks to more than"):
        open_bundle(_tar(tmp_path / "b", {}, big), workdir=str(tmp_path))
    assert writes == []
