"""The agent's footprint does not grow check after check (bench/agent_soak.py, ~50 checks; not timed).

The bench runs the real agent loop in its own process and reads its fds, threads and RSS after every
check; a leak of a file, socket, probe child or thread shows as growth here long before 1,000 checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "bench" / "agent_soak.py"
CHECKS = 50
SETTLE = 10  # the first checks import rules, fill the histories (history_len 30 is reached later, bounded)
#: what 40 checks may add to RSS: the agent's bounded histories and caches fill; a leak of a report a
#: check (~100 KiB+) would pass 4 MiB within these 40 checks only if tiny — fds and threads are exact
RSS_GROWTH_KB = 4096


def _soak(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK), "--checks", str(CHECKS), "--interval", "0.01",
                           "--scrape-every", "5", "--rows", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("example", ["healthy", "uvm-missing"])
def test_agent_soak_keeps_fds_threads_and_rss_flat(tmp_path: Path, example: str) -> None:
    doc = _soak(tmp_path, "--example", example)
    rows, s = doc["rows"], doc["summary"]
    assert s["checks"] == len(rows) == CHECKS
    settled = rows[SETTLE:]
    assert {r["fds"] for r in settled} == {rows[SETTLE]["fds"]}, [r["fds"] for r in rows]
    assert {r["threads"] for r in settled} == {rows[SETTLE]["threads"]}, [r["threads"] for r in rows]
    grown = max(r["rss_kb"] for r in settled) - rows[SETTLE]["rss_kb"]
    assert grown <= RSS_GROWTH_KB, [r["rss_kb"] for r in rows]
    assert s["cpu_per_check_s"]["median"] > 0 and s["fds"]["growth"] == 0


def test_agent_soak_measures_a_process_beside_it(tmp_path: Path) -> None:
    """--plugin-pid: another process's CPU and RSS over the same window (the device plugin on a node)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        doc = _soak(tmp_path, "--example", "healthy", "--plugin-pid", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    p = doc["summary"]["plugins"][str(sleeper.pid)]
    assert p["cpu_s"] is not None and p["cpu_s"] >= 0
    assert p["rss_kb"]["steady_median_last"] > 0 and p["rss_kb"]["growth"] == 0


def test_agent_soak_finds_the_plugin_by_its_name(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["fake-device-plugin", "-c", "import time; time.sleep(120)"], executable=sys.executable)
    try:
        doc = _soak(tmp_path, "--example", "healthy", "--checks", "3", "--plugin-name", "fake-device-plugin")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert list(doc["summary"]["plugins"]) == [str(sleeper.pid)]


def test_agent_soak_refuses_a_plugin_name_no_process_has(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SOAK), "--example", "healthy", "--checks", "2",
                           "--plugin-name", "no-such-plugin-here", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "no process named" in proc.stderr and not (tmp_path / "x.json").exists()


def test_agent_soak_of_a_gone_process_says_unknown_not_zero(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    doc = _soak(tmp_path, "--example", "healthy", "--checks", "3", "--plugin-pid", str(gone.pid))
    p = doc["summary"]["plugins"][str(gone.pid)]
    assert p["cpu_s"] is None and p["cpu_pct_of_core"] is None


def test_agent_soak_beside_the_real_plugin_registered_and_probed(tmp_path: Path) -> None:
    """bench/agent_soak_plugin.py: the real plugin (one fake GPU through tests/support/nvml_fake.c here),
    registered with the kubelet stand-in, measured alone and beside the agent; nothing left running."""
    from tests.support import realplugin

    try:
        realplugin.unpack()
        fake = realplugin.build_shim(REPO / "tests/support/nvml_fake.c", tmp_path / "fake",
                                     soname="libnvidia-ml.so.1")
        realplugin.namespace_prefix()
    except realplugin.Unavailable as exc:
        pytest.skip(f"REAL DEVICE PLUGIN NOT RUN: {exc}")
    out = tmp_path / "soak.json"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake.parent),
               GW_FAKE_NVML_UUID="GPU-11111111-2222-3333-4444-555555555555")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "agent_soak_plugin.py"), "--idle", "1",
                           "--checks", "12", "--interval", "0.05", "--rows", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["plugin"]["registered"] and doc["plugin"]["alone"]["rss_kb"] > 0
    (pid, p), = doc["summary"]["plugins"].items()
    assert p["cpu_s"] is not None and p["rss_kb"]["steady_median_last"] > 0
    assert doc["summary"]["mode"] == "live" and doc["summary"]["fds"]["last_min"] == doc["summary"]["fds"]["first_min"]
    assert not Path(f"/proc/{pid}").exists()  # the plugin was stopped


def _bench(name: str):  # noqa: ANN202 (a bench script as a module)
    import importlib.util

    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_soak_verdict_flat_growing_undecided() -> None:
    """FLAT: RSS slope after the first quarter <= the bound and the fds/threads floors equal; GROWING
    otherwise (a slow leak, a rising fd floor); UNDECIDED with too few checks after warm-up."""
    soak = _bench("agent_soak")
    n, bound = 1000, soak.FLAT_KIB_PER_100
    warm = [30000 + 10 * i for i in range(n // 4)]  # warm-up growth is not judged
    flat = warm + [32500 + (4 if i % 7 == 0 else 0) for i in range(n - n // 4)]
    leak = warm + [32500 + int(0.2 * i) for i in range(n - n // 4)]  # 20 KiB per 100 checks
    fds, thr = [7] * n, [2] * n
    v = soak.verdict(flat, fds, thr)
    assert v["verdict"] == "FLAT" and abs(v["rss_slope_kib_per_100_checks"]) < 1 and v["from_check"] == 251
    v = soak.verdict(leak, fds, thr)
    assert v["verdict"] == "GROWING" and v["rss_slope_kib_per_100_checks"] == pytest.approx(20, abs=0.5)
    assert 20 > bound
    fd_leak = [7] * (n // 2) + [8] * (n - n // 2)
    assert soak.verdict(flat, fd_leak, thr)["verdict"] == "GROWING"
    busy = [7 + (i % 3) for i in range(n)]  # a probe's pipe open at some samples: the floor stays 7
    assert soak.verdict(flat, busy, thr)["verdict"] == "FLAT"
    assert soak.verdict(flat[:100], fds[:100], thr[:100])["verdict"] == "UNDECIDED"


def test_the_soak_json_carries_the_verdict(tmp_path: Path) -> None:
    doc = _soak(tmp_path, "--example", "healthy", "--checks", "8")
    fl = doc["summary"]["flat"]
    assert fl["verdict"] == "UNDECIDED" and fl["bound_kib_per_100_checks"] > 0 and fl["fds_floor"][0] > 0
    parts = doc["summary"]["rss_parts"]
    assert parts["rss_anon_kb"]["at_check"]["8"] > 0 and parts["rss_file_kb"]["at_check"]["8"] > 0
    assert "rss_anon_kb" in doc["rows"][0] and doc["rows"][-1]["rss_kb"] > 0


def test_the_plugin_soak_reads_the_go_heap_from_gctrace() -> None:
    plugin = _bench("agent_soak_plugin")
    log = ("I1127 main.go:1] Starting\n"
           "gc 1 @0.012s 1%: 0.010+0.5+0.003 ms clock, 0.02+0/0.2/0.4+0.007 ms cpu, 3->3->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n"
           "gc 2 @40.1s 0%: 0.02+1.1+0.01 ms clock, 0.04+0.1/0.5/0+0.02 ms cpu, 4->4->2 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n"
           "gc 3 @130.5s 0%: 0.02+1.0+0.01 ms clock, 0.04+0.1/0.5/0+0.02 ms cpu, 4->4->1 MB, 5 MB goal, 0 MB stacks, 0 MB globals, 2 P\n")
    h = plugin.go_heap(log, 30.0, 100.0)
    assert h == {"collections": 3, "live_mb_first": 1, "live_mb_last": 1, "goal_mb_last": 5,
                 "live_mb_max_soak": 2, "live_mb_max": 2}
    assert plugin.go_heap("no gctrace here\n") == {}
