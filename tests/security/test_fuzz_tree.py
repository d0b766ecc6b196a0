"""Damaged node trees end to end: an impossible number anywhere in a node never becomes a CONFIRMED
finding the intact node does not have, never crashes a collector, and the report stays partial,
not absent.

Each example drawn is overlaid (meta.json "base") with one damaged copy of one of its files, so a
case costs one check, not a copy of the node.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from hypothesis import example, given, strategies as st

from gpuwarden import engine
from gpuwarden.examples import HERE, names, open_bundle_dir
from tests.support.bundles import facts_of

#: what damage writes where a number was: no kernel, driver or tool prints these
IMPOSSIBLE = ["-1", "-4096", "18446744073709551615", "9" * 30, "nan", "inf", "-inf", "1e400", "884541340800"]
_NUMBER = re.compile(r"(?<![\w.-])\d+(?![\w])")


def _run(root) -> tuple[set[tuple[str, str]], list[str]]:
    rep = engine.run(facts_of(root), None, mode="bundle")
    return {(f.code, f.status.value) for f in rep.findings if f.status.value == "confirmed"}, rep.errors


@lru_cache(maxsize=None)
def _baseline(name: str) -> frozenset:
    return frozenset(_run(open_bundle_dir(HERE / name))[0])


@lru_cache(maxsize=None)
def _files(name: str) -> tuple[str, ...]:
    top = HERE / name / "files"
    out = []
    for p in sorted(top.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 300_000:
            try:
                if _NUMBER.search(p.read_text()):
                    out.append(str(p.relative_to(top)))
            except UnicodeDecodeError:
                continue
    return tuple(out)


CASES = st.sampled_from(sorted(names())).flatmap(lambda n: st.tuples(
    st.just(n), st.sampled_from(_files(n)), st.sampled_from(IMPOSSIBLE), st.integers(0, 200), st.booleans()))


def damaged(tmp: Path, name: str, rel: str, value: str, index: int, every: bool) -> Path:
    """A bundle over example `name` whose file `rel` has its index-th number (or every one) replaced."""
    text = (HERE / name / "files" / rel).read_text()
    hits = list(_NUMBER.finditer(text))
    if every:
        text = _NUMBER.sub(value, text)
    else:
        m = hits[index % len(hits)]
        text = text[:m.start()] + value + text[m.end():]
    b = tmp / "b"
    (b / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
    (b / "files" / rel).write_text(text)
    (b / "meta.json").write_text(json.dumps({"base": name}))
    return b


@given(case=CASES)
# the measurements, kept as regression cases
@example(case=("healthy", ".gpuwarden/commands/nvidia-smi-q-x.xml", "-1", 0, True))  # GPU-DRV-002 / GPU-HW-007
@example(case=("healthy", ".gpuwarden/commands/nvidia-smi-q-x.xml", "inf", 0, True))  # OverflowError in driver
@example(case=("egl-framebuffer-escape", "proc/zoneinfo", "18446744073709551615", 3, False))  # GPU-NODE-001 watermark
@example(case=("healthy", "proc/devices", "9" * 30, 0, True))  # GPU-DEV-001 / GPU-DEV-004
@example(case=("healthy", "proc/driver/nvidia/version", "884541340800", 0, True))  # GPU-DRV-002
@example(case=("egl-framebuffer-escape", ".gpuwarden/probes.json", "-1", 0, True))  # GPU-DRV-002 from NVML
@example(case=("egl-framebuffer-escape", "sys/bus/pci/devices/0000:00:06.0/max_link_width", "9" * 30, 0, True))
# found by this property (3,000-case campaign): a Device Minor of 884541340800 made /dev/nvidia<that> "dropped"
@example(case=("healthy", "proc/driver/nvidia/gpus/0000:00:06.0/information", "884541340800", 0, True))
def test_an_impossible_number_confirms_nothing_new(tmp_path_factory, case) -> None:
    name, rel, value, index, every = case
    b = damaged(tmp_path_factory.mktemp("t"), name, rel, value, index, every)
    confirmed, errors = _run(open_bundle_dir(b))
    assert [e for e in errors if "collector" in e or "rule " in e] == []
    assert confirmed <= _baseline(name), (case, confirmed - _baseline(name))
