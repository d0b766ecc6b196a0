"""klog, syslog prefixes and wall-clock times: incident lines, upstream formats, garbage."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from gpuwarden.parsers import klog, syslog, wallclock

SH = ZoneInfo("Asia/Shanghai")

# incident 5, verbatim (journalctl short output; the write-up collapsed klog's padded thread id)
GPA = ('Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.753013 45878 manager.go:956] '
       '"Issuing a GetPreferredAllocation call for container" containerName="neal-0729-6" '
       'podUID="69e0758e-d625-4013-9258-df8b7ddf04e2"')
# upstream formatHeader pads the thread id to 7 columns
UPSTREAM = ('I0730 19:37:03.954888   26361 pod_workers.go:770] "Pod is being synced for the first time" '
            'pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" podUID=cf97dd7e-bc61-44c1-8241-b47204a2e9b1 updateType="create"')
MPS = ('E0805 08:40:16.431856 303 main.go:213] Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": '
       'executable file not found in $PATH')


def ref(y: int, mo: int, d: int, h: int = 12) -> float:
    return dt.datetime(y, mo, d, h, tzinfo=SH).timestamp()


def test_header_with_syslog_prefix() -> None:
    s = syslog.parse(GPA)
    assert (s.host, s.ident, s.pid) == ("ai-app-8-1-msxf", "kubelet", 45878)
    assert s.wall == (7, 30, 20, 39, 3, 0)
    k = klog.parse_line(s.rest)
    assert (k.severity, k.thread, k.file, k.lineno) == ("I", 45878, "manager.go", 956)
    assert (k.month, k.day, k.hour, k.minute, k.second, k.micro) == (7, 30, 20, 39, 3, 753013)
    assert k.message() == "Issuing a GetPreferredAllocation call for container"
    assert k.fields() == {"containerName": "neal-0729-6", "podUID": "69e0758e-d625-4013-9258-df8b7ddf04e2"}
    assert k.time(ref(2025, 7, 31), SH) == dt.datetime(2025, 7, 30, 20, 39, 3, 753013, tzinfo=SH).timestamp()


def test_upstream_padding_and_bare_values() -> None:
    k = klog.parse_line(UPSTREAM)
    assert k.thread == 26361 and k.file == "pod_workers.go"
    f = k.fields()
    assert f["pod"] == "mck-test/neal-0729-1-6f67d4dd6f-bw8pz"  # KObj: ns/name, quoted
    assert f["podUID"] == "cf97dd7e-bc61-44c1-8241-b47204a2e9b1"  # types.UID: printed bare
    assert f["updateType"] == "create"


@pytest.mark.parametrize("text,expect", [
    ('"SyncLoop ADD" source="api" pods=[mck-test/neal-0729-6-8686d45f8c-rgsr9]',
     {"source": "api", "pods": "[mck-test/neal-0729-6-8686d45f8c-rgsr9]"}),
    ('"Looking for needed resources" needed=50331648000 resourceName="memory"',
     {"needed": "50331648000", "resourceName": "memory"}),
    ('"Resource is not shared" resource="resource" nvidia.com/gpu="(MISSING)"',
     {"resource": "resource", "nvidia.com/gpu": "(MISSING)"}),
    ('"Making allocation request for device plugin" devices=[MIG-5e2f454b-6cf3-51c3-a060-0a34ba38dfe4] '
     'resourceName="nvidia.com/mig-3g.48gb"',
     {"devices": "[MIG-5e2f454b-6cf3-51c3-a060-0a34ba38dfe4]", "resourceName": "nvidia.com/mig-3g.48gb"}),
    ('"Failed" err="rpc error: code = Unavailable desc = \\"connection refused\\"" pod="a/b"',
     {"err": 'rpc error: code = Unavailable desc = "connection refused"', "pod": "a/b"}),
    ('"Starting" version=<', {"version": "<multiline>"}),
    ('"Obj" spec=&{Name:x Nested:{A:1}} after="y"', {"spec": "&{Name:x Nested:{A:1}}", "after": "y"}),
    ('"Truncated" podUID="69e0758e-d625', {"podUID": "69e0758e-d625"}),
    ('"Unicode" name="caf\\u00e9 \\xff"', {"name": "café \xff"}),
])
def test_structured_values(text: str, expect: dict) -> None:
    msg, fields = klog.parse_structured(text)
    assert msg and fields == expect


def test_split_list() -> None:
    assert klog.split_list("[ns/a ns/b]") == ["ns/a", "ns/b"]
    assert klog.split_list("[]") == []


def test_printf_style_line() -> None:
    k = klog.parse_line(MPS)
    assert k.severity == "E" and k.thread == 303 and not k.structured
    assert k.message().startswith("Failed to start MPS daemon: exec:") and k.fields() == {}


def test_json_logging_format() -> None:
    line = ('{"ts":1753879143.753013,"caller":"devicemanager/manager.go:956","msg":"Issuing a GetPreferredAllocation '
            'call for container","v":4,"containerName":"neal-0729-6","podUID":"69e0758e-d625-4013-9258-df8b7ddf04e2"}')
    k = klog.parse_line(line)
    assert k.epoch == pytest.approx(1753879143.753013)
    assert k.time(0, dt.timezone.utc) == k.epoch
    assert k.message() == "Issuing a GetPreferredAllocation call for container"
    assert k.fields()["podUID"] == "69e0758e-d625-4013-9258-df8b7ddf04e2"


@pytest.mark.parametrize("line", [
    "", "\n", "garbage", "I0730", "I0730 20:39:03.753013", "I1399 20:39:03.753013 1 f.go:1] bad month",
    "X0730 20:39:03.753013 1 f.go:1] bad severity", "I0730 25:39:03.000000 1 f.go:1] bad hour",
    "\x00\xff\x00", "{not json", '{"ts":"x","msg":1}', "[1,2,3]",
])
def test_garbage_is_none(line: str) -> None:
    assert klog.parse_line(line) is None


def test_structured_garbage_never_raises() -> None:
    for text in ('"', '"unterminated', '"m" =x', '"m" k=[unclosed', '"m" k={', '"m" k=', '"m" 1k=v',
                 '"m" k="v" \x00 j=w', "no quote"):
        msg, fields = klog.parse_structured(text)
        assert isinstance(msg, str) and isinstance(fields, dict)


def test_year_inference_and_new_year_wrap() -> None:
    # a Dec 31 line read on Jan 1 belongs to the year before
    jan1 = dt.datetime(2026, 1, 1, 0, 5, tzinfo=SH)
    assert wallclock.infer_year(12, 31, jan1) == 2025
    assert wallclock.infer_year(1, 1, jan1) == 2026
    # a day or two of clock skew into the future is not last year
    assert wallclock.infer_year(1, 2, jan1) == 2026
    # Feb 29 read in a non-leap year: the last leap year
    assert wallclock.infer_year(2, 29, dt.datetime(2027, 3, 1, tzinfo=SH)) == 2024
    k = klog.parse_line("I1231 23:59:59.999999 1 f.go:1] last")
    assert dt.datetime.fromtimestamp(k.time(jan1.timestamp(), SH), SH).year == 2025


def test_zone_changes_epoch() -> None:
    k = klog.parse_line(UPSTREAM)
    r = ref(2025, 8, 1)
    assert k.time(r, dt.timezone.utc) - k.time(r, SH) == 8 * 3600


def test_syslog_forms() -> None:
    precise = syslog.parse("Jul 30 20:39:03.753013 host kubelet[45878]: I0730 x")
    assert precise.wall == (7, 30, 20, 39, 3, 753013) and precise.rest == "I0730 x"
    iso = syslog.parse("2025-07-30T20:39:03.753013+08:00 host kubelet[45878]: msg")
    assert iso.epoch == pytest.approx(dt.datetime(2025, 7, 30, 20, 39, 3, 753013, tzinfo=SH).timestamp())
    assert iso.time(0, dt.timezone.utc) == iso.epoch
    single_digit = syslog.parse("Aug  5 08:40:16 host containerd[812]: time=x")
    assert single_digit.wall[:2] == (8, 5) and single_digit.ident == "containerd"
    assert syslog.parse("not syslog") is None
    assert syslog.parse("Foo 30 20:39:03 host x: y") is None


def test_zone_names() -> None:
    assert wallclock.zone("+08:00").utcoffset(None) == dt.timedelta(hours=8)
    assert wallclock.zone(-18000).utcoffset(None) == dt.timedelta(hours=-5)
    assert wallclock.zone("No/Such_Zone") is dt.timezone.utc
    assert wallclock.zone(None) is dt.timezone.utc
    assert wallclock.rfc3339_epoch("2025-08-05T08:40:16.021509123Z") == pytest.approx(1754383216.021509)
    assert wallclock.rfc3339_epoch("2025-02-30T00:00:00Z") is None
    assert wallclock.rfc3339_epoch("garbage") is None
