"""The signature scanner: chunk boundaries, bounds, filters, follow-up searches, garbage."""

from __future__ import annotations

import datetime as dt
import io
import random
import re
from zoneinfo import ZoneInfo

import pytest

from gpuwarden.logs import scan as logscan, signatures as logsignatures
from gpuwarden.logs.decode import decoder
from gpuwarden.logs.scan import Signature, scan

SH = ZoneInfo("Asia/Shanghai")
REF = dt.datetime(2025, 7, 30, 21, 5, tzinfo=SH).timestamp()

NOISE = ('Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804129 45878 manager.go:919] ignoring '
         'container "/system.slice/sssd-ssh.socket"\n')
GPA = ('Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.753013 45878 manager.go:956] "Issuing a '
       'GetPreferredAllocation call for container" containerName="neal-0729-6" '
       'podUID="69e0758e-d625-4013-9258-df8b7ddf04e2"\n')
ALLOC = ('Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.952761 26361 manager.go:819] "Making '
         'allocation request for device plugin" devices=[MIG-5e2f454b-6cf3-51c3-a060-0a34ba38dfe4] '
         'resourceName="nvidia.com/mig-3g.48gb"\n')


def kubelet_sigs() -> list[Signature]:
    return logsignatures.for_log("kubelet")


def run(data: bytes, sigs=None, **kw):
    kw.setdefault("log", "kubelet")
    kw.setdefault("source", "/k.log")
    kw.setdefault("fmt", "klog")
    return scan(io.BytesIO(data), sigs if sigs is not None else kubelet_sigs(), decoder("klog", REF, SH), **kw)


def test_finds_signatures_with_fields_and_times() -> None:
    s = run((NOISE * 50 + ALLOC + NOISE * 50 + GPA + NOISE).encode())
    assert [e.sig for e in s.events] == ["kubelet.allocate.issue", "kubelet.gpa.issue"]
    gpa = s.events[1]
    assert gpa.fields["podUID"] == "69e0758e-d625-4013-9258-df8b7ddf04e2" and gpa.pid == 45878
    assert gpa.time == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 753013, tzinfo=SH).timestamp())
    assert gpa.line == GPA.rstrip("\n") and gpa.end == gpa.offset + len(GPA)
    assert s.counts == {"kubelet.allocate.issue": 1, "kubelet.gpa.issue": 1}
    assert s.first_time == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 804129, tzinfo=SH).timestamp())
    assert s.last_pid == 45878 and s.last_line == NOISE.rstrip("\n")


@pytest.mark.parametrize("chunk", [16, 97, 1 << 20])
def test_chunk_boundaries_do_not_matter(monkeypatch, chunk: int) -> None:
    text = "".join(random.Random(7).choice([NOISE, NOISE, GPA, ALLOC]) for _ in range(400))
    want = [m.start() for m in re.finditer(r"(?m)^.*(?:GetPreferredAllocation|allocation request)", text)]
    monkeypatch.setattr(logscan, "CHUNK", chunk)
    s = run(text.encode(), [Signature(x.id, x.anchor, x.regex, keep=10_000) for x in kubelet_sigs()])
    assert [e.offset for e in s.events] == want
    # the line-iterator path (roots without a binary file) gives the same events
    lines = scan(iter(io.BytesIO(text.encode())), [Signature(x.id, x.anchor, x.regex, keep=10_000)
                                                   for x in kubelet_sigs()],
                 decoder("klog", REF, SH), log="kubelet", source="/k.log", fmt="klog")
    assert [(e.sig, e.offset) for e in lines.events] == [(e.sig, e.offset) for e in s.events]


def test_bounded_keep_first_and_last() -> None:
    sig = Signature("t.gpa", b"GetPreferredAllocation", keep=3)
    s = run((GPA * 10).encode(), [sig])
    assert s.count("t.gpa") == 10
    assert [e.offset // len(GPA) for e in s.events] == [0, 7, 8, 9]  # the first hit and the last three


def test_max_bytes_scans_the_tail() -> None:
    data = (GPA + NOISE * 100 + ALLOC).encode()
    s = run(data, max_bytes=len(ALLOC) + 10)
    assert [e.sig for e in s.events] == ["kubelet.allocate.issue"] and s.truncated
    assert any("scanned the last" in p for p in s.problems)


def test_line_filter_for_shared_syslog() -> None:
    other = "Jul 30 20:39:03 host containerd[800]: GetPreferredAllocation mentioned by someone else\n"
    s = run((other + GPA).encode(), line_filter=b" kubelet[")
    assert [e.sig for e in s.events] == ["kubelet.gpa.issue"]


def test_first_only_and_start_offset() -> None:
    data = (GPA + NOISE + ALLOC + GPA).encode()
    start = len(GPA)
    s = run(data, start=start, first_only=True, edges=False)
    assert [e.sig for e in s.events] == ["kubelet.allocate.issue"] and s.events[0].offset == start + len(NOISE)
    # aligned window: a start inside a line begins at the next one
    s = run(data, start=start - 5, align_start=True, edges=False)
    assert [e.offset for e in s.events] == [start + len(NOISE), start + len(NOISE) + len(ALLOC)]


def test_regex_decides_and_groups_become_fields() -> None:
    sig = Signature("t.x", b"GetPreferredAllocation", re.compile(r'containerName="(?P<c>[^"]+)"'))
    s = run((GPA + "I0730 20:39:03.753013 1 f.go:1] GetPreferredAllocation without container\n").encode(), [sig])
    assert [e.fields["c"] for e in s.events] == ["neal-0729-6"]


@pytest.mark.parametrize("data", [
    b"",
    b"\n\n\n",
    bytes(random.Random(1).randrange(256) for _ in range(100_000)),
    b"\x00" * 50_000 + GPA.encode() + b"\x00" * 10,
    GPA.encode().rstrip(b"\n"),  # no trailing newline
    GPA.encode()[:60] + b"\n" + GPA.encode()[60:],  # a torn line
])
def test_garbage_never_raises(data: bytes) -> None:
    s = run(data)
    assert isinstance(s.events, list) and isinstance(s.problems, list)


def test_runaway_line_is_cut(monkeypatch) -> None:
    monkeypatch.setattr(logscan, "MAX_LINE", 1024)
    monkeypatch.setattr(logscan, "CHUNK", 512)
    data = (b"x" * 10_000 + b" GetPreferredAllocation " + b"y" * 10_000 + b"\n" + GPA.encode())
    s = run(data, [Signature("t.gpa", b"GetPreferredAllocation", keep=100)])
    assert s.events[-1].line == GPA.rstrip("\n")
    assert all(len(e.line) <= logscan.LINE_CLIP for e in s.events)


def test_decoder_bug_costs_one_line() -> None:
    def broken(line: str):
        raise RuntimeError("boom")
    s = scan(io.BytesIO(GPA.encode()), kubelet_sigs(), broken, log="kubelet", source="/k", fmt="klog")
    assert [e.sig for e in s.events] == ["kubelet.gpa.issue"] and s.events[0].time is None


def test_signature_validation() -> None:
    with pytest.raises(ValueError):
        Signature("x", b'with "quote"')
    with pytest.raises(ValueError):
        Signature("x", b"")
    with pytest.raises(ValueError):
        Signature("x", b"ok", phase="sometimes")
    with pytest.raises(ValueError):
        logsignatures.from_mapping({"id": "Bad Id", "anchor": "x"})
    with pytest.raises(ValueError):
        logsignatures.from_mapping({"id": "x.y", "anchor": "x", "regex": "("})
    with pytest.raises(ValueError):
        logsignatures.from_mapping({"id": "x.y", "anchor": "x", "logs": ["nowhere"]})


def test_shipped_table_loads_and_anchors_are_in_their_regexes() -> None:
    sigs = logsignatures.all_signatures()
    assert {"kubelet.gpa.issue", "kubelet.allocate.issue", "mps.binary-missing", "kernel.xid"} <= set(sigs)
    for s in sigs.values():
        if s.regex is not None and s.id != "nvml.error":
            # every line the regex accepts must contain the anchor, or the pre-filter would hide it
            assert s.anchor.decode() in s.regex.pattern.replace("\\", ""), s.id
    main_kubelet = {s.anchor for s in logsignatures.for_log("kubelet")}
    # 5: "Kubelet version" (kubelet.version, GPU-DRA-013) joined the device-plugin, toolkit and MPS anchors
    assert len(main_kubelet) <= 5, "each distinct anchor is one more pass over a 200 MB kubelet log"


def test_register_code_signatures() -> None:
    sig = Signature("test.extra-sig", b"EXTRA-MARKER", logs=frozenset({"kernel"}))
    logsignatures.register([sig])
    try:
        assert sig in logsignatures.for_log("kernel")
        with pytest.raises(ValueError):
            logsignatures.register([Signature("kubelet.gpa.issue", b"x")])
    finally:
        logsignatures._extra.pop("test.extra-sig", None)
