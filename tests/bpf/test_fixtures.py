"""The evaluator on code the kernel actually returned, against the rule lists it was built from.

Fixture: tests/bpf/fixtures/cgroup_device_xlated.json (see its ORIGIN; regenerate as root with
``python3 tools/record_bpf_fixtures.py``).  For every recorded program and every request of a
grid (plus a seeded random sample) the evaluator's verdict must equal the reference semantics
of the rules: first matching rule decides, a rule matches when the type is equal, major/minor
equal or ``*``, and the requested access is a subset of the rule's; no match -> the default.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from functools import lru_cache
from pathlib import Path

import pytest

from gpuwarden.bpf import insn as I
from gpuwarden.bpf.evaluate import DeviceRequest, evaluate, evaluate_all, explain
from tests.support.devprog import COMBINATIONS, NVIDIA_MAJOR, NVIDIACTL_MINOR, SCENARIOS, UVM_MAJOR

FIXTURE = Path(__file__).parent / "fixtures" / "cgroup_device_xlated.json"

TYPES = ("c", "b")
MAJORS = (0, 1, 5, 7, 8, 10, 136, 195, 238, 254, 509, 511, 4095)
MINORS = (0, 1, 2, 3, 5, 7, 8, 9, 200, 254, 255, 256)
ACCESSES = ("r", "w", "m", "rw", "rm", "wm", "rwm")


@lru_cache(maxsize=1)
def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def code(name: str, key: str = "xlated") -> bytes:
    rec = fixture()["programs"].get(name) or fixture()["extra"][name]
    return bytes.fromhex("".join(rec[key]))


def grid() -> list[DeviceRequest]:
    return [DeviceRequest(*t) for t in itertools.product(TYPES, MAJORS, MINORS, ACCESSES)]


def random_requests(seed: int, n: int = 400) -> list[DeviceRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        major = rng.choice((rng.randrange(4096), rng.randrange(1 << 32), rng.choice(MAJORS)))
        minor = rng.choice((rng.randrange(1 << 20), rng.randrange(1 << 32), rng.choice(MINORS)))
        access = "".join(ch for ch in "rwm" if rng.random() < 0.5) or "r"
        out.append(DeviceRequest(rng.choice(TYPES), major, minor, access))
    return out


def test_fixture_has_origin_and_all_scenarios() -> None:
    doc = fixture()
    assert "ORIGIN" in doc and doc["kernel"] in doc["ORIGIN"]
    assert set(doc["programs"]) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_builders_still_produce_the_recorded_submission(name: str) -> None:
    sc = SCENARIOS[name]
    base = I.decode(code(sc.base)) if sc.base else None
    assert I.encode(sc.build(base)) == code(name, "submitted")


@pytest.mark.parametrize("name", sorted(n for n, s in SCENARIOS.items() if not s.known_bug))
def test_evaluator_matches_rule_semantics_exhaustively(name: str) -> None:
    insns = I.decode(code(name))
    sc = SCENARIOS[name]
    mismatches = []
    for req in grid() + random_requests(seed=zlib.crc32(name.encode())):
        v = evaluate(insns, req.dev_type, req.major, req.minor, req.access)
        assert v.known, f"{name} {req}: {v.reason}"
        if v.allowed != sc.allows(req):
            mismatches.append(f"{req}: evaluator {v.allowed}, rules {sc.allows(req)}")
    assert not mismatches, "\n".join(mismatches[:20])


def test_old_nvcgo_r2_scratch_bug_is_reproduced_not_hidden() -> None:
    """The evaluator follows the code, not the intent: r2 clobbering loses 'w'/'rw' on later blocks."""
    name = "nvidia-r2-on-runc-default"
    insns = I.decode(code(name))
    sc = SCENARIOS[name]
    diverge = set()
    for req in grid():
        v = evaluate(insns, req.dev_type, req.major, req.minor, req.access)
        if v.allowed != sc.allows(req):
            assert v.allowed is False and sc.allows(req) is True
            diverge.add(str(req))
    assert diverge
    # read-only opens still work (2 & 6 == 2 == the char type, by accident) ...
    assert evaluate(insns, "c", NVIDIA_MAJOR, 0, "r").allowed is True
    # ... but O_RDWR on a device whose block is not the first one checked is denied
    assert evaluate(insns, "c", NVIDIA_MAJOR, 0, "rw").allowed is False
    assert evaluate(insns, "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw").allowed is False
    # the first block checked (the last rule: uvm 509:1) is unaffected
    assert evaluate(insns, "c", UVM_MAJOR, 1, "rw").allowed is True
    assert all(("w" in d.split()[-1]) for d in diverge)


@pytest.mark.parametrize("combo", sorted(COMBINATIONS))
def test_all_must_allow_over_attached_programs(combo: str) -> None:
    names = COMBINATIONS[combo]
    programs = [I.decode(code(n)) for n in names]
    for req in grid():
        cv = evaluate_all(programs, req.dev_type, req.major, req.minor, req.access)
        expected = all(SCENARIOS[n].allows(req) for n in names)
        assert cv.allowed is expected, f"{combo} {req}: {cv.reason}"
        if expected is False:
            assert cv.verdicts[cv.decisive].allowed is False


# -- named configurations a GPU diagnosis has to get right ------------------------------------------


def verdict(name: str, t: str, major: int, minor: int, access: str) -> bool | None:
    return evaluate(I.decode(code(name)), t, major, minor, access).allowed


def test_gpu_allow_list() -> None:
    for minor in (NVIDIACTL_MINOR, 0, 1, 254):
        assert verdict("runc-gpu", "c", NVIDIA_MAJOR, minor, "rw") is True
        assert verdict("runc-gpu", "c", NVIDIA_MAJOR, minor, "m") is True  # via "c *:* m"
        # rules never combine for one request: no single rule grants r, w and m together
        assert verdict("runc-gpu", "c", NVIDIA_MAJOR, minor, "rwm") is False
    assert verdict("runc-gpu", "c", UVM_MAJOR, 0, "rw") is True
    assert verdict("runc-gpu", "c", NVIDIA_MAJOR, 2, "rw") is False  # GPU 2 not granted


def test_denied_nvidia_uvm_and_nvidiactl() -> None:
    assert verdict("runc-gpu-no-uvm", "c", UVM_MAJOR, 0, "rw") is False
    assert verdict("runc-gpu-no-uvm", "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw") is True
    assert verdict("runc-gpu-no-ctl", "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw") is False
    assert verdict("runc-gpu-no-ctl", "c", 238, 0, "rw") is True  # older dynamic uvm major
    assert verdict("runc-default", "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "r") is False


def test_combined_access_of_an_rdwr_open() -> None:
    assert verdict("runc-ctl-readonly", "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "r") is True
    assert verdict("runc-ctl-readonly", "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw") is False


def test_wildcard_mknod_rules() -> None:
    for t in ("c", "b"):
        assert verdict("runc-default", t, 4095, 12345, "m") is True
        assert verdict("runc-default", t, 4095, 12345, "rm") is False
        assert verdict("systemd-closed", t, 77, 1, "m") is True


def test_deny_list_uses_subset_matching_so_partial_denies_leak() -> None:
    """runc's deny block fires only if the request is a subset of the rule: 'w' denied, 'rw' allowed.

    cgroup v1 (match_exception_partial) would deny 'rw' here: a real v1->v2 behaviour change.
    """
    assert verdict("runc-denylist", "c", UVM_MAJOR, 0, "w") is False
    assert verdict("runc-denylist", "c", UVM_MAJOR, 0, "rw") is True
    assert verdict("runc-denylist", "c", NVIDIA_MAJOR, 7, "rwm") is False
    assert verdict("runc-denylist", "c", 1, 3, "rwm") is True  # default allow


def test_strict_and_allow_all() -> None:
    for req in grid()[::37]:
        assert verdict("systemd-strict-empty", req.dev_type, req.major, req.minor, req.access) is False
        assert verdict("runc-allow-all", req.dev_type, req.major, req.minor, req.access) is True


def test_daemon_reload_drops_nvidia_prefix_from_systemd_program() -> None:
    start = [I.decode(code(n)) for n in COMBINATIONS["nvidia-at-start"]]
    after = [I.decode(code(n)) for n in COMBINATIONS["nvidia-after-daemon-reload"]]
    assert evaluate_all(start, "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw").allowed is True
    cv = evaluate_all(after, "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw")
    assert cv.allowed is False and cv.decisive == 0  # systemd's fresh program


def test_verifier_rewrite_changes_code_not_verdicts() -> None:
    sub, xl = I.decode(code("verifier-dead-code", "submitted")), I.decode(code("verifier-dead-code"))
    assert len(xl) < len(sub)
    for req in grid():
        a = evaluate(sub, req.dev_type, req.major, req.minor, req.access)
        b = evaluate(xl, req.dev_type, req.major, req.minor, req.access)
        assert a.allowed == b.allowed == (req.major == NVIDIA_MAJOR)


@pytest.mark.parametrize("key", sorted(k for k in json.loads(FIXTURE.read_text())["extra"] if k.startswith("blinded:")))
def test_constant_blinded_code_evaluates_like_the_rules(key: str) -> None:
    """net.core.bpf_jit_harden rewrites every immediate through r11 (BPF_REG_AX); verdicts must not move."""
    rec = fixture()["extra"][key]
    sub, xl = I.decode(code(key, "submitted")), I.decode(code(key))
    assert len(xl) > len(sub) and any(11 in (i.dst, i.src) for i in xl)
    sc = SCENARIOS[rec["scenario"]]
    for req in grid()[::3] + random_requests(seed=zlib.crc32(key.encode()), n=150):
        v = evaluate(xl, req.dev_type, req.major, req.minor, req.access)
        assert v.known, v.reason
        assert v.allowed == sc.allows(req), f"{key} {req}: {v.reason}"


def test_rejected_shape_is_recorded_with_the_verifier_reason() -> None:
    rej = fixture()["rejected"]["systemd-closed-empty"]
    assert rej["errno"] == "EINVAL" and "unreachable insn" in rej["verifier"]


def test_evidence_for_a_denied_nvidiactl() -> None:
    insns = I.decode(code("runc-gpu-no-ctl"))
    v = evaluate(insns, "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw")
    assert v.allowed is False
    lines = explain(insns, v)
    assert insns[-1].index == v.index  # runc's default-deny tail
    assert lines[-1].endswith("exit    ; r0 = 0")
    assert any("if r5 != 0x0 goto" in ln and "taken" in ln for ln in lines)  # 195:0 block, minor mismatched
