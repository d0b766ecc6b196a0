"""Open a captured bundle tarball safely as a BundleRoot.

A bundle is written by whoever sends it: its limits (members, unpacked size, compression ratio)
are enforced on the bytes as they are decompressed, so a small archive that unpacks to gigabytes
is refused after the limit, not after the gigabytes.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from gpuwarden.examples import base_of, open_bundle_dir
from gpuwarden.root import BundleRoot

#: refuse bundles that unpack to more than this (a bundle is text; 2 GiB is generous)
MAX_UNPACKED = 2 << 30
#: a big node's bundle holds a few thousand files; a million tar headers is an attack
MAX_MEMBERS = 200_000
#: text compresses ~10x, repetitive logs ~50x: past this ratio (beyond RATIO_FLOOR bytes) it is a bomb
MAX_RATIO = 100
RATIO_FLOOR = 64 << 20


class BundleError(Exception):
    pass


class _Counted:
    """The decompressed stream of an archive, counted as it is read; raises BundleError past a limit."""

    def __init__(self, raw: BinaryIO, inner: BinaryIO, shown: Path) -> None:
        self.raw, self.inner, self.shown, self.total = raw, inner, shown, 0

    def read(self, n: int = -1) -> bytes:
        b = self.inner.read(n if n is not None and n >= 0 else 1 << 20)
        self.total += len(b)
        if self.total > MAX_UNPACKED:
            raise BundleError(f"{self.shown}: unpacks to more than {MAX_UNPACKED >> 20} MiB")
        packed = max(self.raw.tell(), 1)
        if self.total > RATIO_FLOOR and self.total > MAX_RATIO * packed:
            raise BundleError(f"{self.shown}: unpacks more than {MAX_RATIO} times its size (a decompression bomb?)")
        return b

    def tell(self) -> int:
        return self.total


def _decompressed(raw: BinaryIO) -> BinaryIO:
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if head.startswith(b"BZh"):
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    return raw


def _members(p: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The archive's members, streamed, with the member and size limits checked on each header."""
    with open(p, "rb") as raw:
        stream = _Counted(raw, _decompressed(raw), p)
        with tarfile.open(fileobj=stream, mode="r|") as tf:  # type: ignore[call-overload]
            declared = 0
            for n, m in enumerate(tf, 1):
                if n > MAX_MEMBERS:
                    raise BundleError(f"{p}: more than {MAX_MEMBERS} members")
                declared += max(m.size, 0)
                if declared > MAX_UNPACKED:
                    raise BundleError(f"{p}: unpacks to more than {MAX_UNPACKED >> 20} MiB")
                tf.members.clear()  # streamed: no list of every header (200,000 TarInfo) is kept
                yield tf, m


def _unpack(p: Path, dest: str) -> None:
    """Stream the archive into dest: regular files and directories only, every limit checked on the way.

    A first pass reads only the headers (the data is decompressed and skipped), so an archive over a
    limit is refused before one member is written: 250,000 tiny members once wrote 200,000 files
    (97 s) before the count tripped."""
    for _ in _members(p):
        pass
    for tf, m in _members(p):
        if m.isfile() or m.isdir():  # links and devices are described by meta.json, never unpacked
            tf.extract(m, dest, filter="data")


def open_bundle(path: str | Path, workdir: str | None = None) -> tuple[BundleRoot, tempfile.TemporaryDirectory | None]:
    """Unpack (if a tarball) and open; the caller keeps the TemporaryDirectory alive."""
    p = Path(path)
    if p.is_dir():
        return _checked(open_bundle_dir(p, label=f"bundle:{p}"), p), None
    if not p.is_file():
        raise BundleError(f"{p}: no such bundle")
    tmp = tempfile.TemporaryDirectory(prefix="gpuwarden-bundle-", dir=workdir)
    try:
        _unpack(p, tmp.name)
    except BundleError:
        tmp.cleanup()
        raise
    except Exception as exc:  # TarError, OSError, EOFError, zlib/lzma errors: a corrupt or hostile archive
        tmp.cleanup()
        raise BundleError(f"{p}: not a readable bundle ({type(exc).__name__}: {exc})") from exc
    root = Path(tmp.name)
    subdirs = [d for d in root.iterdir() if d.is_dir()]
    if not (root / "meta.json").exists() and len(subdirs) == 1:
        root = subdirs[0]
    try:
        return _checked(open_bundle_dir(root, label=f"bundle:{p.name}"), p), tmp
    except BundleError:
        tmp.cleanup()
        raise


def _checked(root: BundleRoot, shown: Path) -> BundleRoot:
    """The bundle, if it is one: a directory with a meta.json (a regular file in it, not a link) holding a
    JSON object whose "base", if any, names a built-in example and whose every entry is of the type
    `collect` writes (root.manifest); else BundleError with the reason.

    An invalid entry is refused, not dropped: its path would read "invalid", the facts that need it
    would be unavailable and the rules that need those would not run, and a report of the rest could
    say "No problems found" (issue 44).
    """
    if root.meta_error:
        raise BundleError(f"{shown}: {root.meta_error}")
    if root.manifest.problems:
        raise BundleError(f"{shown}: meta.json is not a manifest gpuwarden collect writes: {root.manifest.said()}")
    doc = root.meta
    if "base" in doc and base_of(doc) is None:
        raise BundleError(f"{shown}: meta.json \"base\" must name a built-in example (gpuwarden examples), "
                          f"not {doc['base']!r}")
    return root
