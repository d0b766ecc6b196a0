"""cgroup v1 devices.list and OCI device rules, with the kernel's (and runc's) semantics, on the incidents' lines."""

from __future__ import annotations

import itertools

import pytest

from gpuwarden.parsers.devices_list import DeviceRule, allows, oci_allows, parse, parse_line
from tests.support.bundles import (
    INCIDENT1_DEVICES_LIST,
    INCIDENT1_PATCHED,
    INCIDENT1_UVM_MAJOR,
    INCIDENT3_ANNOTATED_LINES,
    INCIDENT3_BROKEN,
    INCIDENT3_HEALTHY,
)


def rules_of(text: str) -> list[DeviceRule]:
    rules, bad = parse(text)
    assert bad == []
    return rules


def test_parse_incident1_list_verbatim() -> None:
    rules, bad = parse(INCIDENT1_DEVICES_LIST)
    assert bad == [] and len(rules) == 14
    assert str(rules[6]) == "c 195:255 rw" and rules[6].line == "c 195:255 rw"
    star = rules[8]
    assert (star.type, star.major, star.minor, star.access) == ("c", None, None, frozenset("m"))
    assert str(rules[11]) == "c 136:* rwm"


def test_incident1_uvm_denied_nvidiactl_and_gpu_allowed() -> None:
    rules = rules_of(INCIDENT1_DEVICES_LIST)
    assert allows(rules, "c", 195, 255).line == "c 195:255 rw"
    assert allows(rules, "c", 195, 1).line == "c 195:1 rw"
    assert allows(rules, "c", INCIDENT1_UVM_MAJOR, 0) is None  # the incident: no c 237:0 rw
    assert allows(rules, "c", INCIDENT1_UVM_MAJOR, 0, "m").line == "c *:* m"  # mknod is allowed, open is not
    patched = rules_of(INCIDENT1_PATCHED)
    assert allows(patched, "c", INCIDENT1_UVM_MAJOR, 0).line == "c 237:0 rw"


def test_incident3_broken_list_denies_nvidiactl_and_gpu() -> None:
    ok, broken = rules_of(INCIDENT3_HEALTHY), rules_of(INCIDENT3_BROKEN)
    for minor in (255, 3):
        assert allows(ok, "c", 195, minor) is not None
        assert allows(broken, "c", 195, minor) is None
    # the runc defaults stay allowed in both
    for dev in ((1, 3), (1, 5), (5, 2), (10, 200), (136, 4)):
        assert allows(broken, "c", *dev, "rwm") is not None


def test_annotated_incident_lines_are_reported_as_bad() -> None:
    rules, bad = parse(INCIDENT3_BROKEN + "\n".join(INCIDENT3_ANNOTATED_LINES) + "\n")
    assert len(rules) == 12
    assert bad == INCIDENT3_ANNOTATED_LINES


def test_allow_all() -> None:
    rules = rules_of("a *:* rwm\n")
    for t, mj, mn, acc in itertools.product("cb", (1, 195, 238, 4095), (0, 1, 255, 1 << 19), ("r", "w", "m", "rw", "rwm")):
        assert allows(rules, t, mj, mn, acc) is not None
    # "a" alone, as written to devices.allow, is the same
    assert parse_line("a") == DeviceRule("a", None, None, frozenset("rwm"), "a")


def test_mknod_only_wildcard_does_not_allow_rw() -> None:
    rules = rules_of("c *:* m\n")
    assert allows(rules, "c", 195, 255, "m") is not None
    for acc in ("r", "w", "rw", "rm", "rwm"):
        assert allows(rules, "c", 195, 255, acc) is None


def test_wildcard_minor() -> None:
    rules = rules_of("c 195:* rw\n")
    for minor in (0, 1, 7, 254, 255):
        assert allows(rules, "c", 195, minor).line == "c 195:* rw"
    assert allows(rules, "c", 238, 0) is None
    assert allows(rules, "c", 195, 0, "rwm") is None  # no m
    wild_major = rules_of("c *:0 rw\n")
    assert allows(wild_major, "c", 238, 0) is not None and allows(wild_major, "c", 238, 1) is None


def test_access_must_be_a_subset_of_one_entry() -> None:
    rules = rules_of("c 195:255 r\n")
    assert allows(rules, "c", 195, 255, "r") is not None
    assert allows(rules, "c", 195, 255, "rw") is None
    assert allows(rules, "c", 195, 255, "w") is None
    # the kernel matches one exception at a time: r from one entry and w from another is not rw
    split = rules_of("c 195:255 r\nc 195:* w\n")
    assert allows(split, "c", 195, 255, "rw") is None
    assert allows(split, "c", 195, 255, "w").line == "c 195:* w"


def test_block_does_not_match_char() -> None:
    rules = rules_of("b 195:255 rwm\nb *:* rwm\n")
    assert allows(rules, "c", 195, 255) is None
    assert allows(rules, "b", 195, 255) is not None
    assert allows(rules_of("c 8:0 rw\n"), "b", 8, 0) is None


@pytest.mark.parametrize("line", [
    "c 195:255",            # truncated: no access
    "c 195:25",             # truncated mid-number and no access
    "c 195 rw",             # no colon
    "x 195:255 rw",         # unknown type
    "c 195:255 rwx",        # unknown access bit
    "c -1:0 rw",            # negative
    "c 195:abc rw",
    "c :0 rw",
    "c 195:255 rw extra",
    "\x00\x01garbage",
    "a *:* rwm trailing",
])
def test_garbage_lines_are_bad(line: str) -> None:
    assert parse_line(line) is None
    rules, bad = parse(f"c 1:3 rwm\n{line}\nc 195:255 rw\n")
    assert [str(r) for r in rules] == ["c 1:3 rwm", "c 195:255 rw"]
    assert bad == [line]


def test_empty_and_blank() -> None:
    assert parse("") == ([], [])
    assert parse("\n \n\t\n") == ([], [])
    assert allows([], "c", 195, 255) is None


def test_truncated_list_keeps_the_parsed_prefix() -> None:
    cut = INCIDENT1_DEVICES_LIST[: INCIDENT1_DEVICES_LIST.index("c 195:255 rw") + 7]  # "c 195:2"
    rules, bad = parse(cut)
    assert len(rules) == 6 and bad == ["c 195:2"]
    assert allows(rules, "c", 195, 255) is None


def test_deny_entries_are_ignored_by_allows() -> None:
    r = DeviceRule("c", 195, 255, frozenset("rw"), "c 195:255 rw", allow=False)
    assert allows([r], "c", 195, 255) is None


def test_str_roundtrip() -> None:
    for line in INCIDENT3_HEALTHY.splitlines():
        assert str(parse_line(line)) == line


# --- OCI linux.resources.devices: last match wins, per access bit ----------------------------------


def oci(type_: str, major: int | None, minor: int | None, access: str, allow: bool) -> DeviceRule:
    return DeviceRule(type_, major, minor, frozenset(access), "", allow)


def test_oci_default_deny_then_allow() -> None:
    rules = [oci("a", None, None, "rwm", False), oci("c", 195, 255, "rw", True)]
    assert oci_allows(rules, "c", 195, 255)
    assert not oci_allows(rules, "c", 195, 0)
    assert not oci_allows([], "c", 195, 255)


def test_oci_last_match_wins() -> None:
    allow_then_deny = [oci("c", 195, None, "rw", True), oci("c", 195, 255, "rw", False)]
    assert not oci_allows(allow_then_deny, "c", 195, 255)
    assert oci_allows(allow_then_deny, "c", 195, 0)
    deny_then_allow = [oci("c", 195, 255, "rw", False), oci("c", 195, None, "rw", True)]
    assert oci_allows(deny_then_allow, "c", 195, 255)


def test_oci_per_access_bit() -> None:
    rules = [oci("a", None, None, "rwm", False), oci("c", 195, 255, "r", True), oci("c", 195, None, "w", True)]
    assert oci_allows(rules, "c", 195, 255, "rw")  # r and w come from different rules
    later_deny_w = rules + [oci("c", 195, 255, "w", False)]
    assert not oci_allows(later_deny_w, "c", 195, 255, "rw")
    assert oci_allows(later_deny_w, "c", 195, 255, "r")


def test_oci_type_matching() -> None:
    assert not oci_allows([oci("b", 195, 255, "rw", True)], "c", 195, 255)
    assert oci_allows([oci("a", None, None, "rw", True)], "b", 8, 0)
