"""The corpus of real driver lines (tests/fixtures/xid/driver_lines.yaml), each in the forms a node
logs it, through a whole `check` of the healthy example: the verdict of each case, per form.

The forms are written as the kernel, dmesg, rsyslog and journald write them: a /dev/kmsg record
escapes a multi-line printk's newlines as \\x0a; dmesg and `journalctl -k` put the continuation
lines on their own lines, indented; rsyslog writes them as #012 (its control-character escape).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpuwarden.findings import Severity, Status
from tests.support.gpunode import add_kmsg, healthy
from tests.support.bundles import REPO, bundle_file, open_dir, report_of, write

CORPUS = REPO / "tests/fixtures/xid/driver_lines.yaml"
CASES = yaml.safe_load(CORPUS.read_text())["cases"]
KERNEL_LOG = "/.gpuwarden/logs/kernel.log"  # read before kmsg.txt (facts/logs.py CANDIDATES)
KERNEL_JOURNAL = "/.gpuwarden/logs/kernel.journal.json"  # `journalctl -k -o json`, read first
#: 2026-11-22T02:12:30Z in microseconds, inside the example's boot
JOURNAL_USEC = 1795313550_000000
VERSION = "/proc/driver/nvidia/version"
CODES = ("GPU-HW-001", "GPU-HW-002", "GPU-HW-003", "GPU-HW-005", "GPU-HW-007", "GPU-HW-008", "GPU-DRV-005", "GPU-DRV-007")
#: inside the healthy example's boot (btime 2026-11-22T02:12:07Z; its zone is UTC)
SYSLOG_TIME = "Nov 22 02:12:30"
MONO = 20.000001
_BDF = re.compile(r"(?P<dom>[0-9a-fA-F]{4}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})")


def _own_gpu(records: list[str]) -> list[str]:
    """Every address of the case's first GPU rewritten to the node's (0000:00:06), form kept."""
    m = _BDF.search("\n".join(records))
    if m is None:
        return records
    pat = re.compile(re.escape(m.group(0)), re.IGNORECASE)
    return [pat.sub("0000:00:06", r) for r in records]


def render(form: str, records: list[str]) -> str:
    out: list[str] = []
    for i, rec in enumerate(records):
        lines = rec.split("\n")
        mono = f"[{MONO + i / 1e4:12.6f}] "
        if form == "dmesg":
            out.append(mono + lines[0])
            out.extend(" " * len(mono) + x for x in lines[1:])
        elif form == "syslog":
            out.append(f"{SYSLOG_TIME} gpu-node-1 kernel: {mono}" + "#012".join(lines))
        elif form == "journal":
            head = f"{SYSLOG_TIME} gpu-node-1 kernel: "
            out.append(head + lines[0])
            out.extend(" " * len(head) + x for x in lines[1:])
        elif form == "journal-json":  # one entry per record: journald keeps a printk's newlines in MESSAGE
            out.append(json.dumps({"__REALTIME_TIMESTAMP": str(JOURNAL_USEC + i), "_TRANSPORT": "kernel",
                                   "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3", "MESSAGE": rec}))
        else:
            raise AssertionError(form)
    return "\n".join(out) + "\n"


def _bundle(tmp: Path, case: dict, form: str) -> Path:
    b = healthy(tmp)
    records = _own_gpu(case["records"]) if case.get("own_gpu") else list(case["records"])
    if case.get("driver"):
        f = bundle_file(b, VERSION)
        f.write_text(f.read_text().replace("580.159.04", f"{case['driver']}.158.01"))
    if form == "kmsg":
        add_kmsg(b, *(r.replace("\n", "\\x0a") for r in records))
    elif form == "journal-json":
        write(b, KERNEL_JOURNAL, render(form, records))
    else:
        write(b, KERNEL_LOG, render(form, records))
    return b


PARAMS = [pytest.param(c, form, id=f"{c['id']}[{form}]") for c in CASES for form in c["forms"]]


@pytest.mark.parametrize(("case", "form"), PARAMS)
def test_driver_line_verdict(tmp_path: Path, case: dict, form: str) -> None:
    rep = report_of(open_dir(_bundle(tmp_path, case, form)), CODES)
    assert rep.errors == []
    got = [(f.code, f.status, f.severity) for f in rep.findings]
    for want in case.get("expect") or []:
        status, sev = Status(want["status"]), Severity.parse(want["severity"])
        mine = [g for g in got if g[0] == want["code"]]
        assert mine, f"{case['id']} [{form}]: no {want['code']} finding; got {got}"
        assert (mine[-1][1], mine[-1][2]) == (status, sev), f"{case['id']} [{form}]: {got}"
        assert len(mine) == want.get("count", len(mine)), f"{case['id']} [{form}]: one finding per GPU/switch: {got}"
    for code in case.get("silent") or []:
        assert not [g for g in got if g[0] == code], f"{case['id']} [{form}]: {code} must stay silent; got {got}"


def test_every_case_names_its_source_and_the_catalog() -> None:
    assert len(CASES) >= 25
    for c in CASES:
        assert c.get("source") and c.get("catalog") and c.get("peers"), c["id"]
        assert c.get("expect") or c.get("silent"), c["id"]
    # each class of the issue has real lines from at least two sources
    classes = {"lost": ("lost-gpu", "xid79"), "sxid": ("sxid-",), "nvl5": ("nvl5-",), "xid": ("xid",)}
    for name, prefixes in classes.items():
        sources = {c["source"].split(" (")[0].split(" pkg/")[0].split(" health-monitors/")[0]
                   for c in CASES if c["id"].startswith(prefixes)}
        assert len(sources) >= 2, (name, sources)
