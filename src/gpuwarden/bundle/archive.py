"""Open a captured bundle tarball safely as a BundleRoot."""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path

from gpuwarden.examples import open_bundle_dir
from gpuwarden.root import BundleRoot

#: refuse bundles that unpack to more than this (a bundle is text; 2 GiB is generous)
MAX_UNPACKED = 2 << 30


class BundleError(Exception):
    pass


def open_bundle(path: str | Path, workdir: str | None = None) -> tuple[BundleRoot, tempfile.TemporaryDirectory | None]:
    """Unpack (if a tarball) and open; the caller keeps the TemporaryDirectory alive."""
    p = Path(path)
    if p.is_dir():
        _check_meta(p, p)
        return open_bundle_dir(p, label=f"bundle:{p}"), None
    if not p.is_file():
        raise BundleError(f"{p}: no such bundle")
    tmp = tempfile.TemporaryDirectory(prefix="gpuwarden-bundle-", dir=workdir)
    try:
        with tarfile.open(p, "r:*") as tf:
            total = 0
            members = []
            for m in tf.getmembers():
                if not (m.isfile() or m.isdir()):
                    continue  # links and devices are described by meta.json, never unpacked
                total += m.size
                if total > MAX_UNPACKED:
                    raise BundleError(f"{p}: unpacks to more than {MAX_UNPACKED >> 20} MiB")
                members.append(m)
            tf.extractall(tmp.name, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        tmp.cleanup()
        raise BundleError(f"{p}: not a readable bundle ({exc})") from exc
    root = Path(tmp.name)
    subdirs = [d for d in root.iterdir() if d.is_dir()]
    if not (root / "meta.json").exists() and len(subdirs) == 1:
        root = subdirs[0]
    try:
        _check_meta(root, p)
    except BundleError:
        tmp.cleanup()
        raise
    return open_bundle_dir(root, label=f"bundle:{p.name}"), tmp


def _check_meta(root: Path, shown: Path) -> None:
    """A bundle is a directory with a meta.json holding a JSON object; anything else is refused."""
    meta = root / "meta.json"
    if not meta.is_file():
        raise BundleError(f"{shown}: no meta.json (not a gpuwarden bundle)")
    try:
        doc = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{shown}: meta.json is unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise BundleError(f"{shown}: meta.json is not a JSON object")
