"""No probe can hang the caller: children that sleep or block forever are killed at the deadline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.probes import devaccess
from gpuwarden.probes.bounded import run_cmd, run_func
from gpuwarden.root import HostRoot
from tests.support.bundles import copy_example, open_dir, write

SHIM = Path(__file__).resolve().parents[2] / "tools/gpu/nvml_hang_shim.c"
SLACK = 1.0


def _forever() -> None:
    while True:
        time.sleep(60)


def test_command_that_never_exits_is_killed():
    t0 = time.monotonic()
    out = run_cmd(["sleep", "1000"], timeout=0.5)
    assert out.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK


def test_command_that_closes_stdout_but_keeps_running_is_killed():
    t0 = time.monotonic()
    out = run_cmd(["sh", "-c", "exec >/dev/null 2>&1; sleep 1000"], timeout=0.5)
    assert out.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK


def test_grandchildren_do_not_keep_the_caller_waiting():
    t0 = time.monotonic()
    out = run_cmd(["sh", "-c", "sleep 1000 & sleep 1000"], timeout=0.5)
    assert out.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK


def test_function_that_never_returns_is_killed():
    t0 = time.monotonic()
    out = run_func(_forever, timeout=0.5)
    assert out.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK


def test_function_result_and_error_come_back():
    assert run_func(sum, [1, 2, 3], timeout=5).value == 6
    err = run_func(int, "x", timeout=5)
    assert err.status == "error" and "ValueError" in err.detail


def test_missing_command_is_notfound_not_an_exception():
    assert run_cmd(["/nonexistent/tool"], timeout=1).status == "notfound"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a cgroup")
def test_devaccess_on_a_fifo_returns_within_deadline(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    out = devaccess.probe(HostRoot("/"), [], [str(fifo)], timeout=2)  # O_NONBLOCK: opening a FIFO for write fails fast
    assert time.monotonic() - t0 < 2 + SLACK
    assert out.ok and out.value[str(fifo)] in ("ENXIO", "OK")


@pytest.fixture(scope="module")
def hang_shim(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc not available to build the NVML hang shim")
    so = tmp_path_factory.mktemp("shim") / "libnvidia-ml-hang.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(so), str(SHIM)], check=True)
    return so


@pytest.mark.rule("GPU-DRV-006", "positive")
def test_nvml_hang_is_reported_within_deadline(hang_shim, monkeypatch):
    monkeypatch.setenv("GPUWARDEN_NVML_LIBRARY", str(hang_shim))
    from gpuwarden import engine

    facts = NodeFacts(HostRoot("/"), Settings(probe_timeout_s=1.0))
    t0 = time.monotonic()
    report = engine.run(facts, engine.select(engine.all_rules(), ["GPU-DRV-006"]))
    assert time.monotonic() - t0 < 1.0 + SLACK
    [f] = report.findings
    # one timeout is gpuwarden's own deadline missed, not a verdict (the agent confirms repeats)
    assert f.code == "GPU-DRV-006" and f.status.value == "at-risk" and f.severity.name == "HIGH"
    assert "did not answer within 1.0s once; not a verdict" in f.summary
    assert "did not return within 1s" in f.evidence[0].text


def _drv006_on(example: str, dest: Path, nvml: dict):
    """GPU-DRV-006 alone on a copy of `example` whose recorded NVML probe is `nvml`."""
    from gpuwarden import engine

    b = copy_example(example, dest)
    write(b, "/.gpuwarden/probes.json", json.dumps({"nvml": nvml}))
    return engine.run(NodeFacts(open_dir(b)), engine.select(engine.all_rules(), ["GPU-DRV-006"]))


RECORDED_TIMEOUT = {"status": "timeout", "elapsed_s": 5.0, "detail": "snapshot did not return within 5s (child killed)"}


@pytest.mark.rule("GPU-DRV-006", "positive")
def test_recorded_hang_in_a_bundle_is_evidence_offline(tmp_path):
    report = _drv006_on("healthy", tmp_path / "n", RECORDED_TIMEOUT)
    assert [(f.code, f.status.value) for f in report.findings] == [("GPU-DRV-006", "at-risk")]
    assert "(recorded)" in report.findings[0].evidence[0].source


@pytest.mark.rule("GPU-DRV-006", "positive")
def test_a_timeout_the_kubelets_own_stalled_plugin_call_corroborates_is_confirmed(tmp_path):
    """Incident 5: the probe timed out and the kubelet has waited on GetPreferredAllocation for minutes."""
    [f] = _drv006_on("mig-nvml-hang", tmp_path / "n", RECORDED_TIMEOUT).findings
    assert (f.status.value, f.severity.name) == ("confirmed", "CRITICAL")
    assert f.data["corroborated_by"] == "kubelet device-plugin call stalled"
    assert any("GetPreferredAllocation" in e.text and "waited" in e.text for e in f.evidence[1:]), f.evidence


@pytest.mark.rule("GPU-DRV-006", "negative")
def test_a_stalled_kubelet_call_without_an_nvml_timeout_is_no_nvml_hang(tmp_path):
    report = _drv006_on("mig-nvml-hang", tmp_path / "n", {"status": "ok", "elapsed_s": 0.1, "value": {"init": "ok"}})
    assert report.findings == []


@pytest.mark.rule("GPU-DRV-006", "negative")
def test_nvml_that_answers_is_not_a_hang(tmp_path):
    b = copy_example("healthy", tmp_path / "n")
    write(b, "/.gpuwarden/probes.json", json.dumps({"nvml": {"status": "ok", "elapsed_s": 0.1, "value": {"init": "ok"}}}))
    from gpuwarden import engine

    report = engine.run(NodeFacts(open_dir(b)), engine.select(engine.all_rules(), ["GPU-DRV-006"]))
    assert report.findings == []
    # and an NVML error (driver not loaded) is an error, not a hang
    write(b, "/.gpuwarden/probes.json", json.dumps({"nvml": {"status": "error", "elapsed_s": 0.1, "detail": "Driver Not Loaded"}}))
    report = engine.run(NodeFacts(open_dir(b)), engine.select(engine.all_rules(), ["GPU-DRV-006"]))
    assert report.findings == []


@pytest.mark.parametrize("record", [
    {"status": "error", "elapsed_s": 0.0, "detail": "fork failed: [Errno 12] Cannot allocate memory"},
    {"status": "error", "elapsed_s": 0.2, "detail": "child exited without a result"},
    {"status": "ok", "elapsed_s": 0.0, "value": {"init": "error", "error": "NVML Shared Library Not Found", "error_code": 12}},
], ids=["fork", "child-exit", "no-library"])
def test_a_probe_that_never_asked_nvml_leaves_the_hang_not_evaluated(record, tmp_path):
    """gpuwarden's own failure is no answer from NVML: a raised hang must not clear on it (unknown, not good)."""
    report = _drv006_on("healthy", tmp_path / "n", record)
    assert report.findings == []
    assert [s.code for s in report.skipped] == ["GPU-DRV-006"]
    assert "did not ask NVML" in report.skipped[0].reason


def test_started_probe_overlaps_other_work_and_keeps_its_deadline():
    from gpuwarden.probes.bounded import start_func

    t0 = time.monotonic()
    pending = start_func(time.sleep, 0.4, timeout=2.0)
    time.sleep(0.4)  # the caller's own work, concurrent with the child
    out = pending.result()
    assert out.ok and time.monotonic() - t0 < 0.4 + SLACK
    hung = start_func(_forever, timeout=0.3)
    t1 = time.monotonic()
    assert hung.result().status == "timeout" and time.monotonic() - t1 < 0.3 + SLACK
    assert hung.result().status == "timeout"  # collected once, answered again from memory


@pytest.mark.rule("GPU-DRV-006", "positive")
def test_cli_check_reports_a_hang_started_early(hang_shim, monkeypatch):
    """The CLI forks the NVML probe before reading the node; the hang still surfaces within its deadline."""
    import sys

    env = dict(os.environ, GPUWARDEN_NVML_LIBRARY=str(hang_shim), PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--root", "/", "--select", "GPU-DRV-006",
                        "--probe-timeout", "1", "--format", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - t0 < 10
    report = json.loads(p.stdout)
    assert [f["code"] for f in report["findings"]] == ["GPU-DRV-006"], p.stderr


def test_process_table_survives_a_proc_read_that_blocks():
    """/proc/<pid>/cmdline blocks behind a D-state process's mm lock: that process costs its own budget only."""
    from gpuwarden.facts import processes

    stuck = os.getppid()

    class Blocking(HostRoot):
        def read_bytes(self, path, max_bytes=1 << 20):
            if path == f"/proc/{stuck}/cmdline":
                _forever()
            return super().read_bytes(path, max_bytes)

    facts = NodeFacts(Blocking("/"), Settings(probe_timeout_s=5))
    t0 = time.monotonic()
    table = facts.get("processes")
    assert time.monotonic() - t0 < processes.PER_PROCESS_S + SLACK + 2
    me = table.procs[os.getpid()]
    assert "pytest" in " ".join(me.argv) or "python" in me.exe_name  # the others keep their argv
    assert stuck in table.procs  # the stuck one by its task name (comm)
    assert any(g.source == f"/proc/{stuck}/cmdline" and "D state" in g.reason for g in facts.gaps())


def test_process_table_reads_argv_in_a_child_on_a_live_node():
    facts = NodeFacts(HostRoot("/"), Settings(probe_timeout_s=5))
    table = facts.get("processes")
    me = table.procs[os.getpid()]
    assert "pytest" in " ".join(me.argv) or "python" in me.exe_name


def test_a_probe_no_selected_rule_needs_is_cancelled_at_once():
    """The CLI forks NVML before it knows the rules; a --select without GPU-DRV-006 kills it, never waits."""
    from gpuwarden.probes.bounded import start_func

    pending = start_func(_forever, timeout=30)
    t0 = time.monotonic()
    pending.cancel()
    out = pending.result()
    assert out.status == "error" and "cancelled" in out.detail and time.monotonic() - t0 < SLACK
    with pytest.raises(ProcessLookupError):
        os.kill(pending.pid, 0)  # killed and reaped
