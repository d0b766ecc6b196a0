"""Malformed but parseable node files confirm nothing (issue 30): property-based, bounded in time.

Each example damages the healthy example's /proc/devices (or its driver version) the way no
kernel writes it, yet so that every line still looks like "<number> <name>": a major zeroed,
moved out of every dynamic range, written in non-ASCII digits, a line duplicated at another
major, lines out of order, the file cut before its block section. The property: no CONFIRMED
finding, and the file reads "unreadable (malformed)". tests/security/test_impossible_files.py
holds the issue's own inputs as plain tests.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings, strategies as st

from gpuwarden.findings import Status
from gpuwarden.parsers import proc_devices
from tests.support.bundles import EXAMPLES, copy_example, facts_of, open_dir, report_of, write

DEVICES = (EXAMPLES / "healthy/files/proc/devices").read_text()
VERSION = (EXAMPLES / "healthy/files/proc/driver/nvidia/version").read_text()
CHAR = DEVICES.split("\n\n")[0].splitlines()[1:]  # the character section's lines
BLOCK_AT = DEVICES.index("Block devices:")
NVIDIA = [i for i, ln in enumerate(CHAR) if ln.split()[1].startswith("nvidia")]
_NON_ASCII_DIGIT = st.characters(categories=["Nd"]).filter(lambda c: not c.isascii())


def _impossible_major() -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.integers(255, 383), st.integers(512, 99_999))


def _lines(lines: list[str]) -> str:
    return "Character devices:\n" + "\n".join(lines) + "\n" + DEVICES[DEVICES.index("\nBlock devices:"):]


@st.composite
def damaged_devices(draw) -> str:
    kind = draw(st.sampled_from(["major", "non-ascii", "duplicate", "shuffle", "cut", "frontend"]))
    lines = list(CHAR)
    i = draw(st.sampled_from(NVIDIA))
    major, name = lines[i].split(None, 1)
    if kind == "major" and name not in ("nvidia", "nvidiactl"):
        new = draw(_impossible_major())
        lines[i] = f"{new:3d} {name}"
        lines.sort(key=lambda ln: int(ln.split()[0]))  # kept in order: only the number is impossible
    elif kind == "non-ascii":
        digits = draw(st.lists(_NON_ASCII_DIGIT, min_size=len(major), max_size=len(major)))
        lines[i] = "".join(digits) + " " + name
    elif kind == "duplicate" or (kind == "major" and name in ("nvidia", "nvidiactl")):
        other = draw(st.integers(1, 511).filter(lambda m: m != int(major)))
        lines.append(f"{other:3d} {name}")
        lines.sort(key=lambda ln: int(ln.split()[0]))
    elif kind == "shuffle":
        order = draw(st.permutations(range(len(lines))).filter(lambda p: list(p) != sorted(p)))
        shuffled = [lines[k] for k in order]
        majors = [int(ln.split()[0]) for ln in shuffled]
        if majors == sorted(majors):  # a permutation among equal majors is still a kernel's file
            shuffled.reverse()
        lines = shuffled
    elif kind == "cut":
        return DEVICES[: draw(st.integers(len("Character devices:\n") + 1, BLOCK_AT - 1))]
    else:  # the fixed frontend moved to a major that is free
        free = draw(st.integers(1, 511).filter(lambda m: m != 195 and all(int(ln.split()[0]) != m for ln in lines)))
        lines = sorted([ln.replace("195 nvidia", f"{free:3d} nvidia") for ln in lines], key=lambda ln: int(ln.split()[0]))
    return _lines(lines)


@settings(max_examples=40)
@given(text=damaged_devices())
def test_a_proc_devices_no_kernel_writes_is_malformed(text: str) -> None:
    """Parser level, cheap: many examples."""
    t = proc_devices.parse(text)
    assert t.char == {} and len(t.problems) == 1, (text, t)


@settings(max_examples=8, deadline=20_000)  # a whole check each: the parser property above takes the volume
@given(text=damaged_devices())
def test_a_malformed_proc_devices_confirms_nothing(tmp_path_factory, text: str) -> None:
    b = copy_example("healthy", tmp_path_factory.mktemp("d"))
    write(b, "/proc/devices", text)
    rep = report_of(open_dir(b))
    assert [f.code for f in rep.findings if f.status is Status.CONFIRMED] == []
    gaps = {g.source: g.reason for g in rep.gaps}
    assert gaps["/proc/devices"].startswith("unreadable (malformed): ")
    assert {"GPU-DRV-003", "GPU-DEV-001", "GPU-DEV-004"} <= {s.code for s in rep.skipped}


@settings(max_examples=15, deadline=20_000)
@given(digits=st.lists(_NON_ASCII_DIGIT, min_size=1, max_size=3), where=st.sampled_from(["580", "159", "04"]))
def test_non_ascii_digits_in_the_driver_version_are_no_version(tmp_path_factory, digits: list[str], where: str) -> None:
    b = copy_example("healthy", tmp_path_factory.mktemp("v"))
    write(b, "/proc/driver/nvidia/version", VERSION.replace(where, "".join(digits), 1))
    facts = facts_of(open_dir(b))
    assert facts.get("driver").version is None
    assert "/proc/driver/nvidia/version" in {g.source for g in facts.gaps()}
