"""The known-versions knowledge base: version order, ranges, and the shipped entries' verdicts."""

from __future__ import annotations

import pytest

from gpuwarden import known_versions
from gpuwarden.known_versions import VersionRange, parse_version as V


@pytest.mark.parametrize("a,b", [
    ("570.158.01", "570.172.08"),
    ("570.9.0", "570.10.0"),  # numeric, not lexical
    ("1.0.0-rc92", "1.0.0"),  # a pre-release sorts before its release
    ("1.0.0-rc9", "1.0.0-rc10"),
    ("1.0.0-beta", "1.0.0-beta5"),
    ("1.0.0-beta4", "1.0.0-beta5"),
    ("1.0.0-alpha", "1.0.0-beta"),
    ("v1.27.5", "v1.28.0"),
    ("575.57.08", "580.65.06"),
])
def test_order(a: str, b: str) -> None:
    assert V(a) < V(b) and not V(b) < V(a) and V(a) != V(b)


def test_equality_and_parsing() -> None:
    assert V("1.1") == V("1.1.0") and hash(V("1.1")) == hash(V("1.1.0"))
    assert V("570.158.01") == V("570.158.1")
    assert V("runc version 1.1.12").release == (1, 1, 12)
    assert V("commit: v1.1.12-0-g51d5e946").release == (1, 1, 12)
    assert V("1.2.3+build.7") == V("1.2.3")
    assert V("") is None and V("no digits") is None and V(None) is None


@pytest.mark.parametrize("rng,inside,outside", [
    (">=570.124.06, <=570.158.01", ["570.124.06", "570.133.20", "570.148.08", "570.158.01"],
     ["570.124.05", "570.172.08", "575.57.08", "570.86.15"]),
    ("<1.0.0", ["0.1.1", "1.0.0-rc92", "1.0.0-rc10"], ["1.0.0", "1.1.0"]),
    ("1.1.3 - 1.1.6", ["1.1.3", "1.1.5", "1.1.6"], ["1.1.2", "1.1.7", "1.2.0"]),
    ("==1.2.5", ["1.2.5", "1.2.5.0"], ["1.2.4"]),
    (">1.0, !=1.5", ["1.1", "2.0"], ["1.0", "1.5"]),
])
def test_ranges(rng: str, inside: list[str], outside: list[str]) -> None:
    r = VersionRange.parse(rng)
    assert all(V(v) in r for v in inside)
    assert not any(V(v) in r for v in outside)


@pytest.mark.parametrize("bad", ["", ">=", ">= x.y", "1.0 - ", "~>1.0"])
def test_bad_ranges(bad: str) -> None:
    with pytest.raises(ValueError):
        VersionRange.parse(bad)


@pytest.mark.parametrize("version,status,fix", [
    ("570.158.01", "affected", "570.172.08"),  # incident 5
    ("570.124.06", "affected", "570.172.08"),
    ("570.172.08", "fixed", None),
    ("570.86.15", "unaffected", None),  # the suggested downgrade
    ("570.169.0", "unknown", "570.172.08"),  # between the last known-bad and the fix
    ("575.57.08", "affected", "580.65.06"),  # no fix on 575 as of 2025-08-11
    ("575.64.03", "unknown", "580.65.06"),
    ("580.65.06", "fixed", None),
    ("590.10", "fixed", None),
    ("535.104.05", "unaffected", None),
])
def test_nvml_hang_driver_verdicts(version: str, status: str, fix: str | None) -> None:
    m = known_versions.get("nvidia-driver-570-nvml-hang-mig").check(version)
    assert m.status == status
    assert (str(m.fix) if m.fix else None) == fix


@pytest.mark.parametrize("entry,version,status", [
    ("runc-update-rewrites-devices", "1.0.0-rc92", "affected"),
    ("runc-update-rewrites-devices", "1.0.0", "fixed"),
    ("runc-update-rewrites-devices", "1.1.12", "fixed"),
    ("runc-devchar-skip", "1.1.5", "affected"),
    ("runc-devchar-skip", "1.1.7", "fixed"),
    ("runc-devchar-skip", "1.2.0", "fixed"),
    ("runc-devchar-skip", "1.0.3", "unaffected"),
    ("runc-need-daemon-reload", "1.1.12", "affected"),
    ("runc-need-daemon-reload", "1.2.4", "affected"),
    ("runc-need-daemon-reload", "1.2.5", "fixed"),
    ("runc-need-daemon-reload", "1.3.0", "fixed"),
    ("device-plugin-pass-device-specs", "0.4.0", "affected"),
    ("device-plugin-pass-device-specs", "0.5.0", "fixed"),
    ("device-plugin-pass-device-specs", "v0.17.3", "fixed"),
    ("device-plugin-pass-device-specs", "1.0.0-beta4", "affected"),
    ("device-plugin-pass-device-specs", "1.0.0-beta5", "fixed"),
    ("kubelet-deviceplugin-call-no-timeout", "v1.27.5", "affected"),
])
def test_other_entries(entry: str, version: str, status: str) -> None:
    assert known_versions.get(entry).check(version).status == status


def test_conditions_and_lookup() -> None:
    e = known_versions.get("nvidia-driver-570-nvml-hang-mig")
    assert e.conditions_met({"mig": True}) == ([], [])
    assert e.conditions_met({"mig": False}) == (["mig"], [])
    assert e.conditions_met({}) == ([], ["mig"])
    assert [m.issue.id for m in known_versions.affected_by("nvidia-driver", "570.158.01", {"mig": True})] == [e.id]
    assert known_versions.affected_by("nvidia-driver", "570.158.01", {"mig": False}) == []
    assert known_versions.affected_by("nvidia-driver", "garbage") == []
    assert e.check("not a version") is None
    assert {i.id for i in known_versions.issues(signature="GPU-K8S-001")} == {
        "nvidia-driver-570-nvml-hang-mig", "kubelet-deviceplugin-call-no-timeout"}


def test_catalog_entries_are_complete() -> None:
    for e in known_versions.iter_all():
        assert e.summary and e.references and e.affected, e.id
        assert e.kind in ("bug", "feature")
    refs = known_versions.references("nvidia-driver-570-nvml-hang-mig", "kubelet-deviceplugin-call-no-timeout")
    assert "https://github.com/NVIDIA/gpu-operator/issues/1361" in refs and len(refs) == len(set(refs))


def test_malformed_documents_are_rejected() -> None:
    with pytest.raises(ValueError):
        known_versions.load("schema: other\n")
    with pytest.raises(ValueError):
        known_versions.load("schema: gpuwarden.known-versions/v1\nentries:\n  - id: x\n    component: c\n")
    dup = ("schema: gpuwarden.known-versions/v1\nentries:\n"
           + "  - {id: x, component: c, summary: s, affected: ['<1']}\n" * 2)
    with pytest.raises(ValueError, match="duplicate"):
        known_versions.load(dup)
