"""The text report of every built-in example, pinned line by line (golden files), and what makes it
readable at 3 a.m., checked on each of them.

The golden files are tests/render/golden/<example>.txt (and <example>.verbose.txt for --verbose; the
JSON report's are <example>.json, tests/render/test_json.py): the
report as `gpuwarden check --example NAME` prints it, with the run time replaced by `N ms`. After a
deliberate change of a rule's text or of the renderer, regenerate them and review the diff:

    GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/render/test_text.py tests/render/test_json.py
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import msgspec
import pytest

from gpuwarden import engine, examples
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Report
from gpuwarden.render import text, wording

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1"


def report(name: str) -> Report:
    return engine.run(NodeFacts(examples.open_example(name), Settings()), mode="example")


def rendered(r: Report, verbose: bool = False) -> str:
    buf = io.StringIO()
    text.render(r, buf, verbose=verbose)
    return re.sub(r"run in \d+ ms", "run in N ms", buf.getvalue())


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {n: report(n) for n in examples.names()}


@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
@pytest.mark.parametrize("name", examples.names())
def test_golden(name: str, verbose: bool, reports) -> None:
    got = rendered(reports[name], verbose)
    path = GOLDEN / f"{name}{'.verbose' if verbose else ''}.txt"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run with GPUWARDEN_UPDATE_GOLDEN=1 and review it"
    assert got == path.read_text(), f"{path.name} differs: review, then GPUWARDEN_UPDATE_GOLDEN=1 (see the docstring)"


@pytest.mark.parametrize("name", examples.names())
def test_reads_at_3am(name: str, reports) -> None:
    r = reports[name]
    out = rendered(r)
    node = str(r.node.get("hostname") or "")
    lines = out.splitlines()
    for f in r.findings:
        # the first line: what is wrong, who, how soon, short enough for a pager
        [first] = [ln for ln in lines if f" {f.code}  " in ln and ln.startswith(f.severity.label.upper())]
        assert len(first) <= text.HEADLINE_MAX, first
        assert first.endswith(f"{wording.who(f, node)} — {wording.urgency(f)}"), first
        # the title whole, never cut: on the first line, or alone on the next one
        after = lines[lines.index(first) + 1]
        assert f"  {f.title} — " in first or after == f"    {f.title}", (first, after)
        assert "…" not in first
        # names the finding knows are in its fix
        if wording.the_pod(f):
            assert "<ns>" not in out and "<pod>" not in out
    assert "<plugin-pod>" not in out and "<plugin pod>" not in out
    # one unit style outside quoted log lines; no catalog labels; no checkout-only paths; examples are examples
    assert not re.search(r"\d kB\b", out)
    assert not re.search(r"\(A[123]\b", out)
    assert "shared/" not in out and "bundle" not in out
    # UTC is labelled as such, never a bare `Z`
    assert not re.search(r"\d\d:\d\d:\d\dZ", out)
    # what was not checked is one line (every reason with --verbose)
    assert sum(ln.startswith("Not checked") for ln in lines) <= 1
    assert "Unavailable evidence" not in out and "Not evaluated" not in out
    if r.skipped or r.gaps:
        assert "Not checked:" in out
        verbose = rendered(r, verbose=True)
        assert all(s.code in verbose for s in r.skipped) and all(g.source in verbose for g in r.gaps)


def test_local_times_are_labelled_beside_utc(reports) -> None:
    out = rendered(reports["mig-nvml-hang"])
    # the kubelet's log line says 20:39:03 (node time, Asia/Shanghai); the summary says which zone
    assert "2025-07-30 20:39:03 Asia/Shanghai = 12:39:03 UTC" in out
    assert "node time zone Asia/Shanghai" in out
    # one wait, one number
    assert out.count("25m56s") == 1 and "23m00s" not in out


def test_a_time_that_is_no_date_is_left_as_written() -> None:
    from zoneinfo import ZoneInfo

    said = wording.times("from 2025-13-45 12:00:00Z to 2025-07-30 12:39:03Z", ZoneInfo("Asia/Shanghai"), "Asia/Shanghai")
    assert said == "from 2025-13-45 12:00:00Z to 2025-07-30 20:39:03 Asia/Shanghai = 12:39:03 UTC"


def test_fix_commands_name_what_the_finding_knows(reports) -> None:
    assert "kubectl delete pod -n viz render-0" in rendered(reports["egl-framebuffer-escape"])
    # the plugin's pid is in the pod kube-system/nvidia-device-plugin-x7k2p's cgroup: the engine names it
    uvm = rendered(reports["uvm-missing"])
    assert "`kubectl -n kube-system delete pod nvidia-device-plugin-x7k2p`" in uvm
    # not known: a command that finds it on this node
    r = reports["uvm-missing"]
    f = r.findings[0]
    bare = msgspec.structs.replace(f, affected=[a for a in f.affected if a.kind != "plugin"])
    assert "--field-selector spec.nodeName=gpu-node-a" in wording.fill_names(bare.remedy, bare, "gpu-node-a")


def test_a_healthy_node_does_not_look_blind(reports) -> None:
    out = rendered(reports["healthy"])
    assert out.count("\n") <= 8, out
    assert "No problems found." in out


def test_references_an_installed_user_can_follow() -> None:
    ref = "incident 1 (shared/incidents/1-uvm-missing-after-device-plugin-start.zh.md)"
    assert wording.reference(ref) == "incident 1 (reproduced by `gpuwarden check --example uvm-missing`)"
    assert wording.reference("catalog GPU-DRV-001 (../shared/knowledge/signatures.md §4)") == "catalog GPU-DRV-001"
    assert wording.reference("kubernetes/kubernetes#117435") == "kubernetes/kubernetes#117435"


def test_wording_units_and_labels() -> None:
    assert wording.binary_units("MemTotal 131981020 kB; Hugetlb 0 kB") == "MemTotal 125.9 GiB; Hugetlb 0 B"
    assert wording.without_catalog_labels("Stopgap (A2): x. Fix (A3, drain first): y (A1 + A2). grep -A2") == \
        "Stopgap: x. Fix (drain first): y. grep -A2"


def test_how_soon_a_memory_escape_matters() -> None:
    from gpuwarden.findings import Finding, Severity, Status

    def say(data):
        return wording.urgency(Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s", data=data))

    calm = {"present": False}
    assert say({"thrash": {"present": True}}) == "node thrashing now: act now"
    assert say({"thrash": calm}) == "no thrash yet; rate unknown (one check)"
    assert say({"thrash": calm, "escape": {"trend": {"samples": 3, "growing": True}}}) == "no thrash yet; growing"
    assert say({"thrash": calm, "escape": {"trend": {"samples": 3, "rate_bytes_per_s": 0.0}}}) == \
        "no thrash yet; not growing now"
    assert say({"thrash": calm, "escape": {"trend": {"samples": 3, "seconds_to_min_watermark": 600}}}) == \
        "node thrashes in ~10 min at this rate: act now"


def _titled(title: str, affected: int = 1):
    from gpuwarden.findings import Affected, Finding, Severity, Status

    return Finding("GPU-DEV-001", Status.CONFIRMED, Severity.HIGH, title, "summary.",
                   affected=[Affected("container", f"trainer-{i}/main", "ml") for i in range(affected)])


def test_a_long_title_moves_to_its_own_line_whole() -> None:
    long = "A title that goes on " + "and on " * 30 + "(with its mechanism)"
    first, title = text.headline(_titled(long, affected=3), "gpu-node-a")
    assert first == "HIGH     CONFIRMED GPU-DEV-001  container ml/trainer-0/main +2 more — failing now"
    assert title == f"    {long}" and len(first) <= text.HEADLINE_MAX


def test_a_short_title_stays_on_the_first_line() -> None:
    [first] = text.headline(_titled("GPU gone"), "gpu-node-a")
    assert first == "HIGH     CONFIRMED GPU-DEV-001  GPU gone — container ml/trainer-0/main — failing now"
