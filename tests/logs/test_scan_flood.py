"""A flood of one class of kernel line (issue 41): counted in bulk, a different line in it read exactly."""

from __future__ import annotations

import datetime as dt
import io
import random

import pytest

from gpuwarden.logs import flood, scan as logscan, signatures as logsignatures
from gpuwarden.logs.decode import decoder
from gpuwarden.logs.scan import Signature, merge, scan

BOOT = 1_700_000_000.0
X13 = "4,{n},{t},-;NVRM: Xid (PCI:0000:00:06): 13, pid={p}, Graphics SM Warp Exception on (GPC {g}, TPC 1)\n"
X79 = "3,{n},{t},-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n"
X31 = "4,{n},{t},-;NVRM: Xid (PCI:0000:00:07): 31, pid={p}, Ch 0000000a, MMU Fault\n"
NOISE = "6,{n},{t},-;mlx5_core 0000:3b:00.0 eth2: Link down\n"


def kernel(data: bytes, sigs=None):
    return scan(io.BytesIO(data), sigs if sigs is not None else logsignatures.for_log("kernel"),
                decoder("kernel", BOOT + 10_000, dt.timezone.utc, BOOT), log="kernel", source="/k", fmt="kernel")


def log_of(kinds: list[str], seed: int = 3) -> bytes:
    rng = random.Random(seed)
    return "".join(k.format(n=i, t=i * 1000, p=rng.randint(1, 9), g=rng.randint(0, 7))
                   for i, k in enumerate(kinds)).encode()


def classes(s) -> dict[tuple[str, str], int]:
    """(device, xid) -> offset of its latest kept line."""
    out: dict[tuple[str, str], int] = {}
    for e in s.events:
        if e.sig == "kernel.xid":
            k = (e.fields["device"], e.fields["xid"])
            out[k] = max(out.get(k, -1), e.offset)
    return out


def test_a_flood_is_counted_in_bulk_and_exactly() -> None:
    data = log_of([X13] * 20_000)
    s = kernel(data)
    assert s.count("kernel.xid") == 20_000 and s.count("kernel.nvidia-unplaced") == 20_000
    assert s.bulk_lines > 19_000  # read one by one: the first LEARN_AFTER and a few a block
    last = s.events[-1]
    assert last.fields["xid"] == "13" and last.offset == len(data) - len(data.splitlines(True)[-1])


def test_a_different_xid_inside_the_flood_is_kept() -> None:
    kinds = [X13] * 30_000 + [X79] + [X13] * 30_000
    s = kernel(log_of(kinds))
    assert [e.fields["xid"] for e in s.events if e.sig == "kernel.xid" and e.fields["xid"] != "13"] == ["79"]
    assert s.count("kernel.xid") == 60_001


def test_per_signature_keep_alone_would_lose_it() -> None:
    """The negative: with the signature's latest `keep` only (no flood class), 30,000 Xid 13 lines after an
    Xid 79 push it out of the kept events; its class keeps it."""
    kinds = [X13] * 10 + [X79] + [X13] * 3_000
    plain = [Signature(s.id, s.anchor, s.regex, s.logs, s.phase, s.keep) for s in logsignatures.for_log("kernel")]
    assert ("PCI:0000:00:06", "79") not in classes(kernel(log_of(kinds), plain))
    assert ("PCI:0000:00:06", "79") in classes(kernel(log_of(kinds)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_counting_agrees_with_reading_every_line(monkeypatch, seed: int) -> None:
    rng = random.Random(seed)
    kinds = [X79 if r < 0.0005 else X31 if r < 0.02 else NOISE if r < 0.1 else X13
             for r in (rng.random() for _ in range(40_000))]
    data = log_of(kinds, seed)
    fast = kernel(data)
    monkeypatch.setattr(flood, "MAX_CLASSES", 0)  # the peer: every matching line read
    slow = kernel(data)
    assert fast.bulk_lines > 0 and slow.bulk_lines == 0
    assert fast.counts == slow.counts
    assert classes(fast) == classes(slow)  # every class, its latest line the same
    assert fast.first_hit == slow.first_hit


def test_a_class_line_with_another_anchor_is_read(monkeypatch) -> None:
    """A line of the class that also holds another signature's anchor is never counted in bulk."""
    odd = "4,{n},{t},-;NVRM: Xid (PCI:0000:00:06): 13, pid=5, NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.\n"
    s = kernel(log_of([X13] * 5_000 + [odd] + [X13] * 5_000))
    assert s.count("kernel.gpu-fallen-off-bus") == 1 and s.count("kernel.xid") == 10_001


def test_few_lines_are_read_one_by_one() -> None:
    s = kernel(log_of([X13] * 10 + [NOISE] * 100))
    assert s.bulk_lines == 0 and s.count("kernel.xid") == 10


def test_a_line_filter_reads_every_line() -> None:
    """/var/log/messages' kernel lines: a class line without the filter's text must not count."""
    text = "".join(f"Dec  2 18:00:00 h kernel: NVRM: Xid (PCI:0000:00:06): 13, pid={i}, x\n" for i in range(3_000))
    s = scan(io.BytesIO(text.encode()), logsignatures.for_log("kernel"), decoder("kernel", BOOT, dt.timezone.utc, BOOT),
             log="kernel", source="/m", fmt="kernel", line_filter=b" kernel: ")
    assert s.bulk_lines == 0 and s.count("kernel.xid") == 3_000


def test_merge_keeps_each_class_latest() -> None:
    sigs = logsignatures.for_log("kernel")
    a = kernel(log_of([X79] + [X13] * 10))
    b_data = log_of([X13] * 5_000)
    b = scan(io.BytesIO(b_data), sigs, decoder("kernel", BOOT + 10_000, dt.timezone.utc, BOOT), log="kernel", source="/k",
             fmt="kernel")
    m = merge(a, b, sigs)
    assert ("PCI:0000:00:06", "79") in classes(m) and m.count("kernel.xid") == 5_011


def test_flood_class_must_name_the_regex_groups() -> None:
    with pytest.raises(ValueError, match="flood_class"):
        logsignatures.from_mapping({"id": "t.x", "anchor": "Xid ", "regex": "Xid (?P<n>\\d+)", "flood_class": ["xid"]})
    s = logsignatures.from_mapping({"id": "t.x", "anchor": "Xid ", "regex": "Xid (?P<n>\\d+),", "flood_class": "n"})
    assert s.flood_class == ("n",) and s.match_class("NVRM: Xid 13, x") == ({"n": "13"}, "Xid 13,")
    assert s.match_class("Xid 13") is None or s.match_class("Xid 13") == ({"n": "13"}, "")


def test_chunk_boundaries_do_not_change_bulk_results(monkeypatch) -> None:
    data = log_of([X13] * 4_000 + [X79] + [X13] * 4_000)
    want = kernel(data)
    monkeypatch.setattr(logscan, "CHUNK", 7_777)
    monkeypatch.setattr(logscan, "BLOCK", 3_333)
    got = kernel(data)
    assert got.counts == want.counts and classes(got) == classes(want)
