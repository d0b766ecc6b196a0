"""journald export/JSON, kernel log and container log parsers on real-format input and garbage."""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpuwarden.parsers import cri_log, journal_export, kmsg

FIX = Path(__file__).resolve().parents[1] / "fixtures/logs/incident5-journal"
SH = ZoneInfo("Asia/Shanghai")


# --- journald (real journalctl output, see the fixture's ORIGIN.md) ---------------------------------

def test_journal_json_real_output() -> None:
    entries = list(journal_export.iter_json(FIX.joinpath("kubelet.journal.json").read_bytes().splitlines()))
    assert len(entries) == 22
    first = entries[0]
    assert first.realtime == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 752764, tzinfo=SH).timestamp())
    assert (first.pid, first.unit, first.identifier, first.priority) == (45878, "kubelet.service", "kubelet", 6)
    assert first.message.startswith('I0730 20:39:03.752764 45878 kubelet.go:2343] "SyncLoop ADD"')
    multi = entries[-2]
    assert "\n\tfailed to \"StartContainer\"" in multi.message and multi.priority == 3
    garbled = entries[-1]  # non-UTF-8 MESSAGE: a JSON array of byte values
    assert garbled.binary["MESSAGE"].endswith(b'"x\xff\xfe"')
    assert garbled.message.startswith("I0730 21:02:04.200000")


def test_journal_export_real_output_any_chunking() -> None:
    data = FIX.joinpath("kubelet.export").read_bytes()
    whole = list(journal_export.iter_export([data]))
    assert len(whole) == 22
    assert whole[-2].binary["MESSAGE"].count(b"\n") == 2  # the multi-line value travelled as a binary field
    json_msgs = [e.message for e in journal_export.iter_json(FIX.joinpath("kubelet.journal.json").open("rb"))]
    assert [e.message for e in whole] == json_msgs
    for size in (1, 7, 4096):
        chunked = list(journal_export.iter_export(data[i:i + size] for i in range(0, len(data), size)))
        assert [e.fields for e in chunked] == [e.fields for e in whole]


def _export(*entries: list[tuple[str, bytes | str]]) -> bytes:
    out = b""
    for fields in entries:
        for k, v in fields:
            if isinstance(v, bytes):
                out += k.encode() + b"\n" + struct.pack("<Q", len(v)) + v + b"\n"
            else:
                out += f"{k}={v}\n".encode()
        out += b"\n"
    return out


def test_journal_export_garbage_resyncs() -> None:
    good = [("__REALTIME_TIMESTAMP", "1753879143753013"), ("MESSAGE", "ok")]
    bad_size = b"MESSAGE\n" + struct.pack("<Q", 1 << 62) + b"xx\n\n"
    lower = b"message=not a field name\nMESSAGE=x\n\n"
    data = _export(good) + bad_size + lower + _export(good, [("MESSAGE", b"a\nb")])
    got = list(journal_export.iter_export([data]))
    assert [e.message for e in got] == ["ok", "ok", "a\nb"]
    # truncated in the middle of a binary field: what was complete is kept, nothing raises
    cut = _export(good, [("MESSAGE", b"0123456789")])[:-6]
    assert [e.message for e in journal_export.iter_export([cut])] == ["ok"]
    assert list(journal_export.iter_export([b"\x00\xff" * 100])) == []
    assert list(journal_export.iter_export([])) == []


@pytest.mark.parametrize("line", ["", "   ", "not json", "[1,2]", '"str"', "{", '{"MESSAGE": null}'])
def test_journal_json_garbage(line: str) -> None:
    got = list(journal_export.iter_json([line]))
    assert got == [] or got[0].message == ""


def test_journal_json_repeated_field_and_numbers() -> None:
    e = journal_export.parse_json('{"MESSAGE":["first","second"],"_PID":12,"__REALTIME_TIMESTAMP":"x"}')
    assert e.message == "first" and e.pid == 12 and e.realtime is None


# --- kernel -------------------------------------------------------------------------------------------

def test_kmsg_records_and_dictionary() -> None:
    lines = [
        "4,1090,434189944726,-;NVRM: Xid (PCI:0000:0f:00): 79, pid=1234, GPU has fallen off the bus.\n",
        " SUBSYSTEM=pci\n",
        " DEVICE=+pci:0000:0f:00.0\n",
        "6,1091,434190000000,c,caller=T12;escaped \\x0a newline\n",
    ]
    recs = list(kmsg.iter_records(lines, boot_time=1753440000.0))
    assert len(recs) == 2
    xid = recs[0]
    assert (xid.level, xid.facility, xid.seq, xid.level_name) == (4, 0, 1090, "warning")
    assert xid.monotonic == pytest.approx(434189.944726) and xid.wall == pytest.approx(1753440000 + 434189.944726)
    assert xid.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:0f:00.0"}
    assert recs[1].message == "escaped \n newline"


@pytest.mark.parametrize("line,msg,mono,has_wall", [
    # the incident's syslog form (viewer line numbers removed)
    ("Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681608] INFO: task containerd-shim:7663 blocked for more "
     "than 5 seconds.", "INFO: task containerd-shim:7663 blocked for more than 5 seconds.", 341115.681608, True),
    ("[  123.456789] nvidia-uvm: Loaded the UVM driver, major device number 509.",
     "nvidia-uvm: Loaded the UVM driver, major device number 509.", 123.456789, False),
    ("<6>[  123.456789] raw level", "raw level", 123.456789, False),
    ("kern  :info  : [  123.456789] decoded", "decoded", 123.456789, False),
    ("[Tue Jul 29 17:54:57 2025] XFS (dm-3): Mounting V5 Filesystem", "XFS (dm-3): Mounting V5 Filesystem", None, True),
    ("2025-07-29T17:54:57,681608+08:00 iso form", "iso form", None, True),
    ("no prefix at all", "no prefix at all", None, False),
])
def test_dmesg_forms(line: str, msg: str, mono: float | None, has_wall: bool) -> None:
    r = kmsg.parse_line(line, ref_epoch=dt.datetime(2025, 8, 1, tzinfo=SH).timestamp(), tz=SH)
    assert r.message == msg
    assert r.monotonic == (pytest.approx(mono) if mono is not None else None)
    assert (r.wall is not None) == has_wall


def test_dmesg_human_time_in_zone() -> None:
    r = kmsg.parse_dmesg("[Tue Jul 29 17:54:57 2025] x", tz=SH)
    assert r.wall == dt.datetime(2025, 7, 29, 17, 54, 57, tzinfo=SH).timestamp()


def test_kernel_garbage() -> None:
    assert kmsg.parse_line("") is None
    assert kmsg.parse_kmsg("6,abc,1,-;x") is None
    recs = list(kmsg.iter_records([b"\x00\xff garbage\n", b"\n", "  KEY=orphan continuation\n"]))
    assert all(isinstance(r.message, str) for r in recs)


# --- CRI container logs ---------------------------------------------------------------------------------

MPS = ('2025-08-05T16:40:16.431856992+08:00 stderr F E0805 08:40:16.431856 303 main.go:213] Failed to start MPS '
       'daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH')


def test_cri_line() -> None:
    c = cri_log.parse_line(MPS)
    assert (c.stream, c.partial) == ("stderr", False)
    assert c.time == pytest.approx(dt.datetime(2025, 8, 5, 8, 40, 16, 431856, tzinfo=dt.timezone.utc).timestamp())
    assert c.message.startswith("E0805 08:40:16.431856 303 main.go:213] Failed to start MPS daemon")


def test_cri_partial_lines_joined() -> None:
    lines = ["2025-08-05T08:40:16.1Z stdout P part one, ", "2025-08-05T08:40:16.2Z stdout P part two, ",
             "2025-08-05T08:40:16.3Z stdout F end", "garbage line", "2025-08-05T08:40:17Z stderr F next"]
    got = list(cri_log.iter_messages(lines))
    assert [m.message for m in got] == ["part one, part two, end", "next"]
    assert got[0].time == pytest.approx(dt.datetime(2025, 8, 5, 8, 40, 16, 100000, tzinfo=dt.timezone.utc).timestamp())
    # a trailing partial without its F line is still returned, marked partial
    assert list(cri_log.iter_messages(["2025-08-05T08:40:16Z stdout P cut"]))[0].partial


def test_docker_json_file_line() -> None:
    c = cri_log.parse_line('{"log":"Failed to initialize NVML: Unknown Error\\n","stream":"stderr",'
                           '"time":"2025-08-05T08:40:16.021509123Z"}')
    assert c.message == "Failed to initialize NVML: Unknown Error" and not c.partial and c.stream == "stderr"


@pytest.mark.parametrize("line", ["", "garbage", "2025-08-05T08:40:16Z", "2025-08-05T08:40:16Z stdin F x", "{",
                                  '{"log": 1}'])
def test_cri_garbage(line: str) -> None:
    assert cri_log.parse_line(line) is None


def test_pod_log_path() -> None:
    p = cri_log.parse_path("/var/log/pods/gpu-operator_nvidia-device-plugin-mps-control-daemon-rpm7r_"
                           "5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14/mps-control-daemon-ctr/12.log")
    assert (p.namespace, p.pod, p.container, p.restart) == (
        "gpu-operator", "nvidia-device-plugin-mps-control-daemon-rpm7r", "mps-control-daemon-ctr", 12)
    assert cri_log.parse_path("/var/log/pods/not-a-pod-dir/c/0.log") is None
    assert cri_log.parse_path("x") is None
