"""data/xid.yaml against NVIDIA's Xid catalog (the snapshot read 2026-11-24), and against the rules.

The snapshot (tests/fixtures/xid/nvidia-xid-catalog-2026-11-24.tsv) is the oracle: every Xid of
the catalog is in the table under NVIDIA's mnemonic with NVIDIA's immediate-action bucket; where
the catalog leaves the bucket blank the table says why it chose its own. The rules claim the Xids
the table routes to them, and nothing else.
"""

from __future__ import annotations

import re

from gpuwarden import xid as xidtable
from gpuwarden.findings import Severity
from gpuwarden.rules import all_rules
from tests.support.bundles import REPO

SNAPSHOT = REPO / "tests/fixtures/xid/nvidia-xid-catalog-2026-11-24.tsv"
#: gpuwarden's bucket names (NVSentinel's) -> the catalog's
CATALOG_NAME = {"UNEXPECTED_ERR_REPORT_ISSUE": "CONTACT_SUPPORT", "FOLLOW_RECOVERY_ACTION": "XID_154"}


def snapshot() -> dict[int, tuple[str, str]]:
    return {x: (name, bucket) for x, (name, bucket, _inv) in _rows().items()}


def _rows() -> dict[int, tuple[str, str, str]]:
    out = {}
    for line in SNAPSHOT.read_text().splitlines():
        if line and not line.startswith("#"):
            x, name, bucket, inv = line.split("\t")
            out[int(x)] = (name, bucket, inv)
    return out


def test_investigatory_actions_are_the_catalogs_and_name_the_follow_ons() -> None:
    t = xidtable.table()
    for x, (_n, _b, inv) in _rows().items():
        assert t.xids[x].investigate == ("" if inv == "-" else inv), x
    assert {x for x, i in t.xids.items() if i.follow_on} == {45, 154}
    assert xidtable.named_cause("45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149") == 149
    assert xidtable.named_cause("45, pid=1, name=x, Ch 00000001") is None


def test_repeat_threshold_counts_within_one_window() -> None:
    r = xidtable.Repeat(3, 3600.0)
    assert r.reached([0.0, 10.0, 3599.0]) and not r.reached([0.0, 10.0, 3601.0])
    assert not r.reached([]) and r.reached([5.0, 5.0, 5.0])
    assert r.reached([0.0, 10.0, 20.0], now=100.0) and not r.reached([0.0, 10.0, 20.0], now=3700.0)


def test_table_is_the_catalog_as_read() -> None:
    t, cat = xidtable.table(), snapshot()
    assert t.catalog["read"] == "2026-11-24" and t.catalog["last_xid"] == max(cat) == 172
    assert set(t.xids) == set(cat) == set(range(1, 173))
    for x, (name, bucket) in cat.items():
        info = t.xids[x]
        assert info.name.replace(" ", "") == name.replace(" ", ""), (x, info.name, name)
        if bucket == "-":
            assert info.note.startswith("catalog action blank"), (x, info.note)
        else:
            assert CATALOG_NAME.get(info.action.name, info.action.name) == bucket, (x, info.action.name, bucket)


def test_unknown_xids_are_escalated_not_hidden() -> None:
    t = xidtable.table()
    unknown = t.get(185)  # R620's release notes name Xid 185 (SPARING_EVENT); the catalog as read stops at 172
    assert not unknown.known and unknown.severity >= Severity.MEDIUM
    assert "2026-11-24" in unknown.meaning and "escalate" in t.actions["UNKNOWN"].remedy


def test_rules_claim_exactly_the_xids_the_table_routes_to_them() -> None:
    t, rules = xidtable.table(), {r.code: r for r in all_rules()}
    routed = {code: t.routed_to(code) for code in {i.rule for i in t.xids.values()}}
    assert set(routed) <= set(rules), set(routed) - set(rules)
    # GPU-HW-001 names the Xids it leaves to the other rules
    doc = rules["GPU-HW-001"].explanation.replace("\n", " ")
    claimed: dict[str, set[int]] = {}
    for nums, code in re.findall(r"([\d/ and-]+) \((GPU-[A-Z]+-\d{3})\)", doc):
        for part in re.split(r"/| and ", nums.strip()):
            lo, _, hi = part.strip().partition("-")
            claimed.setdefault(code, set()).update(range(int(lo), int(hi or lo) + 1))
    for code, xids in routed.items():
        if code == "GPU-HW-001":
            continue
        assert claimed.get(code) == set(xids), (code, claimed.get(code), sorted(xids))
        text = rules[code].title + " " + rules[code].explanation
        named = {int(n) for n in re.findall(r"\b\d+\b", text)}
        named |= {x for lo, hi in re.findall(r"\b(\d+)-(\d+)\b", text) for x in range(int(lo), int(hi) + 1)}
        assert set(xids) <= named, (code, sorted(set(xids) - named))


def test_nvlink5_decode_sheet_is_whole() -> None:
    t = xidtable.table()
    assert len(t.nvlink5) == 94
    assert {r.xid for r in t.nvlink5} == set(range(144, 151)) == set(t.routed_to("GPU-HW-005")) - {74}
    assert {r.action for r in t.nvlink5} == {"IGNORE", "RESET_GPU", "XID_154_EVAL"}
    for r in t.nvlink5:  # every row is reachable: its patterns decode themselves to it
        fatal = r.severity.lower().startswith(("fatal", "link fatal"))
        assert fatal == (r.action == "RESET_GPU") or r.action == "IGNORE", r
