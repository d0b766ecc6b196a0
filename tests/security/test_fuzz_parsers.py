"""Parsers are pure functions of text: on any input they return a value (never raise, never hang),
and an impossible number never comes out of them as a fact."""

from __future__ import annotations

import math

from hypothesis import example, given, strategies as st

from gpuwarden.parsers import (cri_log, devices_list, journal_export, keyvalue, klog, kmsg, kubelet_checkpoint,
                               kubelet_flags, meminfo, memory_stat, nvidia_smi_xml, nvidia_version, plausible,
                               pressure, proc_devices, proc_modules, proc_pid, slabinfo, syslog, vmstat, wallclock,
                               zoneinfo)

TEXT_PARSERS = [
    cri_log.parse_line, cri_log.parse_path, devices_list.parse, keyvalue.parse, klog.parse_line, klog.parse_json_line,
    klog.parse_structured, kmsg.parse_line, kubelet_checkpoint.parse, meminfo.parse, memory_stat.parse,
    memory_stat.parse_bytes, nvidia_smi_xml.parse, nvidia_smi_xml.mib_bytes, nvidia_version.parse,
    nvidia_version.version_tuple, pressure.parse, proc_devices.parse, proc_modules.parse, proc_pid.start_ticks,
    proc_pid.boot_time, proc_pid.cgroup_lines, slabinfo.parse, syslog.parse, vmstat.parse, wallclock.rfc3339_epoch,
    zoneinfo.parse, journal_export.parse_json, kubelet_flags.feature_gates, lambda t: keyvalue.parse_numbers(t),
]

#: numbers as damage writes them: negative, overflowed, huge, not numbers at all
_NUM = st.one_of(st.integers(-(1 << 70), 1 << 70).map(str), st.sampled_from(
    ["18446744073709551615", "-1", "nan", "inf", "-inf", "1e308", "9" * 40, "0x10", "", "1.5"]))
_LINEISH = st.lists(st.one_of(st.text(max_size=60), _NUM, st.sampled_from(
    ["\n", "  ", ":", " kB", "Node 0, zone   Normal", "  pages free", "min", "low", "high", "managed", "present",
     "MemTotal:", "MemAvailable:", "<gpu id=\"", "</gpu>", "Character devices:", "\x00", "\udcff"])),
    max_size=40).map("".join)


@given(text=st.one_of(st.text(max_size=400), _LINEISH))
@example(text="\udcff")  # found by this property: ElementTree raised UnicodeEncodeError (nvidia_smi_xml)
def test_no_parser_raises_on_any_text(text: str) -> None:
    for parse in TEXT_PARSERS:
        parse(text)


@given(raw=st.binary(max_size=400))
def test_no_parser_raises_on_any_bytes(raw: bytes) -> None:
    proc_pid.cmdline(raw)
    proc_pid.environ(raw, ("PATH",))
    kubelet_checkpoint.decode_alloc(raw)
    list(journal_export.iter_export([raw]))
    list(cri_log.iter_messages([raw]))
    list(kmsg.iter_records([raw]))
    for parse in TEXT_PARSERS:
        parse(raw.decode("utf-8", "replace"))


def _zone(free, mn, low, high, managed, present) -> str:
    return (f"Node 0, zone   Normal\n  pages free     {free}\n        min      {mn}\n        low      {low}\n"
            f"        high     {high}\n        spanned  {present}\n        present  {present}\n"
            f"        managed  {managed}\n")


@given(vals=st.lists(_NUM, min_size=6, max_size=6))
@example(vals=["665646", "18446744073709551615", "11436", "13723", "917504", "917504"])  # issue 18: 2^64 min
@example(vals=["665646", "9149", "11436", "13723", "917504", "917504"])  # the real zone it came from
def test_zoneinfo_watermarks_are_possible_or_absent(vals: list[str]) -> None:
    z = zoneinfo.parse(_zone(*vals))
    for attr in ("min_pages", "low_pages", "high_pages", "free_pages", "managed_pages"):
        v = getattr(z, attr)
        assert v is None or plausible.count(v)
    if z.min_pages is not None and z.managed_pages:
        assert z.min_pages <= z.managed_pages  # never a watermark above the memory it guards


@given(total=_NUM, avail=_NUM, free=_NUM)
@example(total="263842528", avail="99999999999999999999", free="1000")
@example(total="nan", avail="1", free="1")
def test_meminfo_values_are_possible_or_absent(total: str, avail: str, free: str) -> None:
    mi = meminfo.parse(f"MemTotal:       {total} kB\nMemFree:        {free} kB\nMemAvailable:   {avail} kB\n")
    for k, v in mi.values.items():
        assert plausible.size(v), (k, v)
    if "MemTotal" in mi:
        assert mi.get("MemAvailable", 0) <= mi.get("MemTotal") and mi.get("MemFree", 0) <= mi.get("MemTotal")
    if not mi.values:
        assert mi.problems  # empty only with the reason


@given(version=st.one_of(_NUM, st.text(alphabet="0123456789.-", max_size=20)), width=_NUM, used=_NUM)
@example(version="-0.159.04", width="16", used="100")  # issue 18: a negative driver version
@example(version="580.159.04", width="-16", used="inf")
def test_nvidia_smi_report_is_possible_or_unreadable(version: str, width: str, used: str) -> None:
    xml = (f"<nvidia_smi_log><driver_version>{version}</driver_version><gpu id=\"00000000:00:06.0\">"
           f"<pci><pci_gpu_link_info><link_widths><current_link_width>{width}x</current_link_width></link_widths>"
           f"</pci_gpu_link_info></pci><fb_memory_usage><total>81559 MiB</total><used>{used} MiB</used>"
           f"</fb_memory_usage></gpu></nvidia_smi_log>")
    rep = nvidia_smi_xml.parse(xml)
    assert rep is not None
    if not nvidia_smi_xml.implausible(rep, xml):  # what facts/driver keeps
        assert rep.driver_version == "" or plausible.driver_version(rep.driver_version)
        g = rep.gpus[0]
        assert g.fb_used is None or (0 <= g.fb_used <= g.fb_total)
        w = g.fields.get("pcie_width_current", "")
        assert not w.lstrip().startswith(("-", "+", "nan", "inf"))  # a count, or no number at all ("x", "N/A")


@given(major=_NUM, minor=_NUM)
def test_device_numbers_fit_dev_t(major: str, minor: str) -> None:
    for r in devices_list.parse(f"c {major}:{minor} rw\n")[0]:
        assert r.major is None or 0 <= r.major <= plausible.MAX_MAJOR
        assert r.minor is None or 0 <= r.minor <= plausible.MAX_MINOR
    t = proc_devices.parse(f"Character devices:\n{major} nvidia-uvm\n")
    assert all(0 <= m <= plausible.MAX_MAJOR for ms in t.char.values() for m in ms)


@given(v=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(1 << 80), 1 << 80), st.text(max_size=8),
                   st.none(), st.booleans(), st.lists(st.integers(), max_size=2)))
def test_plausibility_predicates_are_total(v) -> None:
    for pred in (plausible.count, plausible.size, plausible.pid, plausible.timestamp):
        ok = pred(v)
        assert ok in (True, False)
        if ok:
            assert not (isinstance(v, float) and not math.isfinite(v))
    assert plausible.json_problem({"x": v, "pid": v, "driver_version": v}) in (None,) or True
