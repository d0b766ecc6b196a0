"""The event loop on a synthetic live node: each source's wake-up raises a fault in well under a second at
the chart's 60 s interval, and with the source unavailable the periodic check still catches it; a wake
re-checks only its rules; confirmation is a re-read a moment later; clearing stays the full checks';
floods become a handful of checks and no more API writes; the latency is on /metrics."""

from __future__ import annotations

import io
import os
import re
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.events import EventLoop
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.scope import Scope
from gpuwarden.kube.log import Log
from gpuwarden.root import HostRoot
from gpuwarden.wake.base import Wake
from tests.support.agent_nodes import synthetic_node

XID79 = "3,900,99999999,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1234, GPU has fallen off the bus.\n"


class Running:
    """An agent's run() in a thread, stopped and joined on exit; `log` holds its text log."""

    def __init__(self, root: Path, sources: list | None = None, kube=None, **kw) -> None:
        base = dict(node_name="gpu-node-a", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                    interval_s=60.0, log_format="text")
        base.update(kw)
        self.log = io.StringIO()
        self.agent = Agent(AgentConfig(**base), root=HostRoot(str(root)), kube=kube,
                           log=Log("text", node="gpu-node-a", stream=self.log), out=io.StringIO())
        if sources is not None:
            self.agent.sources = sources
        self.thread = threading.Thread(target=self.agent.run, daemon=True)

    def __enter__(self) -> "Running":
        self.thread.start()
        assert wait(lambda: self.agent.checks >= 1, 30), self.log.getvalue()
        return self

    def __exit__(self, *exc) -> None:
        self.agent.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()

    def raised(self, code: str, timeout: float) -> float | None:
        t0 = time.monotonic()
        if wait(lambda: self.agent.debounce.raised(code), timeout):
            return time.monotonic() - t0
        return None

    def metric(self, name: str, **labels) -> float | None:
        return self.agent.metrics.registry.get_sample_value(name, labels)


def wait(cond, timeout: float) -> bool:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < timeout:
        time.sleep(0.005)
    return bool(cond())


@pytest.fixture
def healthy(node_dir):
    return synthetic_node(node_dir / "root", "healthy")


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


# -- each source: the wake-up, and its fallback ----------------------------------------------------

def test_an_xid_79_line_in_the_trees_kernel_log_is_raised_in_under_a_second(healthy):
    with Running(healthy) as r:
        assert r.metric("gpuwarden_wake_source_up", source="logfile") == 1
        _append(healthy / ".gpuwarden/logs/kmsg.txt", XID79)
        took = r.raised("GPU-HW-002", 5)
        assert took is not None and took < 2.0, r.log.getvalue()
        assert r.agent.checks <= 3  # the first full check, the wake-up's check and its confirming re-read
        assert r.metric("gpuwarden_fault_seen_to_raised_seconds_count", source="logfile", topic="log") >= 1
        s = r.metric("gpuwarden_fault_seen_to_raised_seconds_sum", source="logfile", topic="log")
        assert 0 < s < 2 * r.metric("gpuwarden_fault_seen_to_raised_seconds_count", source="logfile", topic="log")
        assert r.metric("gpuwarden_wakeups_total", source="logfile", topic="log") >= 1
        assert "scope=log source=logfile" in r.log.getvalue()


def test_without_the_log_source_the_periodic_check_catches_the_line(healthy):
    with Running(healthy, sources=[], interval_s=1.0) as r:
        _append(healthy / ".gpuwarden/logs/kmsg.txt", XID79)
        assert r.raised("GPU-HW-002", 0.2) is None or r.agent.checks > 1
        took = r.raised("GPU-HW-002", 10)
        assert took is not None, r.log.getvalue()
        assert r.metric("gpuwarden_fault_seen_to_raised_seconds_count", source="periodic", topic="all") >= 1


def test_a_source_that_cannot_start_says_so_and_the_interval_covers_it(healthy):
    class Broken:
        name = "broken"

        def start(self, emit):
            return "no such thing here"

        def stop(self):
            raise AssertionError("a source that did not start is not stopped")

    with Running(healthy, sources=[Broken()]) as r:
        assert r.metric("gpuwarden_wake_source_up", source="broken") == 0
    assert "msg=wake-source-unavailable" in r.log.getvalue() and "no such thing here" in r.log.getvalue()
    assert "fallback=the periodic check every 60s" in r.log.getvalue()


def test_nvidia_uvm_removed_is_raised_from_inotify_and_without_it_by_the_check(healthy):
    with Running(healthy) as r:
        os.unlink(healthy / "dev/nvidia-uvm")
        took = r.raised("GPU-DRV-003", 5)
        assert took is not None and took < 2.0, r.log.getvalue()
        assert "scope=devices source=inotify" in r.log.getvalue()
    os.mknod(healthy / "dev/nvidia-uvm", 0o20666, os.makedev(238, 0))
    with Running(healthy, sources=[], interval_s=0.5) as r:
        os.unlink(healthy / "dev/nvidia-uvm")
        assert r.raised("GPU-DRV-003", 10) is not None


def test_the_device_plugins_socket_gone_is_raised_from_inotify(healthy):
    with Running(healthy) as r:
        os.unlink(healthy / "var/lib/kubelet/device-plugins/nvidia-gpu.sock")
        took = r.raised("GPU-K8S-002", 5)
        assert took is not None and took < 2.0, r.log.getvalue()
        assert "scope=plugins source=inotify" in r.log.getvalue()


class Emitter:
    """A source the test drives: `fire(wake)` emits as a real source's thread would."""

    name = "test"

    def __init__(self) -> None:
        self.emit = None
        self.stopped = False

    def start(self, emit):
        self.emit = emit
        return None

    def stop(self):
        self.stopped = True

    def fire(self, wake: Wake) -> None:
        assert self.emit is not None
        self.emit(wake)


def test_a_memory_wake_re_reads_memory_only(healthy):
    src = Emitter()
    with Running(healthy, sources=[src]) as r:
        n = r.agent.checks
        src.fire(Wake("psi", "memory", "memory pressure crossed some 150000 1000000", time.time()))
        assert wait(lambda: "scope=memory source=psi" in r.log.getvalue(), 5)
        assert r.agent.checks == n + 1
        assert r.metric("gpuwarden_targeted_checks_total", topics="memory") == 1
    assert src.stopped


# -- what a wake-up re-checks; confirmation; clearing ----------------------------------------------

def test_a_topic_selects_the_rules_reading_its_sections():
    from gpuwarden.rules import all_rules

    rules = [r for r in all_rules() if r.scope == "node"]
    mem = {r.code for r in rules if Scope(frozenset({"memory"})).wants_rule(r)}
    assert mem == {"GPU-NODE-001"}
    log = {r.code for r in rules if Scope(frozenset({"log"})).wants_rule(r)}
    assert {"GPU-HW-001", "GPU-HW-002", "GPU-K8S-008"} <= log and "GPU-NODE-001" not in log
    dev = {r.code for r in rules if Scope(frozenset({"devices"})).wants_rule(r)}
    assert {"GPU-DRV-003", "GPU-DEV-001", "GPU-DEV-004"} <= dev
    assert Scope().full and all(Scope().wants_rule(r) for r in rules)
    assert {r.code for r in rules if Scope(confirm=frozenset({"GPU-DEV-001"})).wants_rule(r)} == {"GPU-DEV-001"}
    # a confirming read re-reads its codes only, with the monitors of the wake-up that saw them
    confirming = Scope(frozenset({"memory"}), "psi", 1.0, frozenset({"GPU-NODE-001"}))
    assert {r.code for r in rules if confirming.wants_rule(r)} == {"GPU-NODE-001"}
    assert confirming.wants_monitor("memory-growth") and not confirming.wants_monitor("grpc")
    assert Scope(confirm=frozenset({"GPU-DEV-002"})).wants_monitor("device-access")  # after a full check: all
    assert not Scope(frozenset({"log"})).wants_monitor("memory-growth")
    assert Scope(frozenset({"memory"})).wants_monitor("memory-growth")


def test_a_first_bad_observation_is_confirmed_by_a_re_read_not_the_interval(healthy):
    with Running(healthy, confirm_delay_s=0.3) as r:
        t0 = time.monotonic()
        os.unlink(healthy / "dev/nvidia-uvm")
        took = r.raised("GPU-DRV-003", 5)
        assert took is not None and 0.3 <= took < 2.0
        logs = r.log.getvalue()
        assert re.search(r"scope=devices source=inotify [^\n]*findings=1 raised=\[\] transitions=None", logs), logs
        assert "scope=devices source=inotify confirming=['GPU-DRV-003']" in logs


def test_a_fault_gone_at_the_confirming_read_is_not_raised(healthy):
    src = Emitter()
    with Running(healthy, sources=[src], confirm_delay_s=0.5) as r:
        uvm = healthy / "dev/nvidia-uvm"
        os.rename(uvm, healthy / "uvm.bak")
        src.fire(Wake("inotify", "devices", "/dev/nvidia-uvm", time.time()))
        assert wait(lambda: "scope=devices" in r.log.getvalue(), 5)
        os.rename(healthy / "uvm.bak", uvm)  # back before the confirming read
        assert wait(lambda: "confirming=['GPU-DRV-003']" in r.log.getvalue(), 5), r.log.getvalue()
        time.sleep(0.5)
        assert not r.agent.debounce.raised("GPU-DRV-003")
        assert r.agent.debounce.states["GPU-DRV-003"].bad == 0 and r.agent.loop.confirm is None


def test_a_targeted_check_never_clears_only_full_checks_do(healthy):
    src = Emitter()
    with Running(healthy, sources=[src], debounce_clear=2) as r:
        os.unlink(healthy / "dev/nvidia-uvm")
        src.fire(Wake("inotify", "devices", "/dev/nvidia-uvm", time.time()))
        assert r.raised("GPU-DRV-003", 5) is not None
        os.mknod(healthy / "dev/nvidia-uvm", 0o20666, os.makedev(238, 0))
        for _ in range(5):  # clean targeted reads: not a clearing observation
            n = r.agent.loop.targeted
            src.fire(Wake("inotify", "devices", "/dev/nvidia-uvm", time.time()))
            assert wait(lambda: r.agent.loop.targeted > n, 5)
        assert r.agent.debounce.raised("GPU-DRV-003")
    # the full checks clear it, as before wake-ups existed
    a = r.agent
    a.check()
    assert a.debounce.raised("GPU-DRV-003")
    assert a.check().transitions.get("GPU-DRV-003") == "cleared"


def test_a_targeted_check_keeps_the_other_codes_on_the_findings_gauge(healthy):
    src = Emitter()
    with Running(healthy, sources=[src]) as r:
        os.unlink(healthy / "dev/nvidia-uvm")
        src.fire(Wake("inotify", "devices", "/dev/nvidia-uvm", time.time()))
        assert r.raised("GPU-DRV-003", 5) is not None
        n = r.agent.loop.targeted
        src.fire(Wake("psi", "memory", "pressure", time.time()))  # a check of GPU-NODE-001 alone
        assert wait(lambda: r.agent.loop.targeted > n, 5)
        text = r.agent.metrics.exposition().decode()
        assert re.search(r'gpuwarden_findings\{code="GPU-DRV-003"[^}]*\} 1\.0', text), text[:2000]
        assert r.metric("gpuwarden_fault_raised", code="GPU-DRV-003") == 1


# -- floods ----------------------------------------------------------------------------------------

def test_100k_kernel_lines_a_second_are_a_handful_of_checks_and_one_raise(healthy):
    from gpuwarden.agent.offline import OfflineKube

    out = io.StringIO()
    kube = OfflineKube("gpu-node-a", [], out)
    with Running(healthy, kube=kube) as r:
        writes0 = out.getvalue().count("[would write] Node")
        n0 = r.agent.checks
        kmsg = healthy / ".gpuwarden/logs/kmsg.txt"
        t0 = time.monotonic()
        with open(kmsg, "a") as f:
            for i in range(100):  # 100,000 lines (Xid 13 from a user's app: each one a finding line)
                f.write("4,1000,99999999,-;NVRM: Xid (PCI:0000:00:06): 13, pid=4242, Graphics Exception\n" * 1000)
                f.flush()
                time.sleep(0.01)
        took = time.monotonic() - t0
        _append(kmsg, XID79)
        assert r.raised("GPU-HW-002", 10) is not None, r.log.getvalue()[-3000:]
        time.sleep(0.5)
        checks = r.agent.checks - n0
        # the flood took ~1 s; checks at least RECHECK_GAP_S apart, each reading what the burst added
        assert checks <= (took + 1.5) / 0.2 + 3, (checks, took)
        node_writes = [ln for ln in out.getvalue().splitlines() if ln.startswith("[would write] Node")]
        # one condition change per condition raised: the flood multiplies nothing
        assert len(node_writes) - writes0 <= 3, node_writes
        assert r.metric("gpuwarden_fault_seen_to_raised_seconds_count", source="logfile", topic="log") >= 1


XID48 = ("4,1000,99999999,-;NVRM: Xid (PCI:0000:00:06): 48, pid=4242, An uncorrectable double bit error (DBE) "
         "has been detected on GPU in the framebuffer at partition 0, subpartition 0.\n")


def _flood(path: Path, line: str, seconds: float, stop: threading.Event, mark: dict, at: float,
           rate: int = 100_000) -> None:
    """`rate` lines a second of `line` for `seconds`; XID79 written `at` s in, the flood going on after it."""
    t0 = time.monotonic()
    n = 0
    with open(path, "a") as f:
        while time.monotonic() - t0 < seconds and not stop.is_set():
            if "t79" not in mark and time.monotonic() - t0 >= at:
                f.write(XID79)
                f.flush()
                mark["t79"] = time.monotonic()
            f.write(line * (rate // 100))
            f.flush()
            n += rate // 100
            time.sleep(max(0.0, t0 + n / rate - time.monotonic()))


def test_a_new_xid_inside_a_flood_is_raised_promptly_and_the_flood_holds(healthy):
    """Issue 41: 100,000 lines a second of one Xid (a DBE storm) must not delay a later, different one. The
    flooded code is raised as well, the log's scan counts the flood in bulk, and the API sees one condition
    change per condition."""
    from gpuwarden.agent.offline import OfflineKube

    out = io.StringIO()
    kube = OfflineKube("gpu-node-a", [], out)
    with Running(healthy, kube=kube) as r:
        writes0 = out.getvalue().count("[would write] Node")
        n0 = r.agent.checks
        stop, mark = threading.Event(), {}
        w = threading.Thread(target=_flood, args=(healthy / ".gpuwarden/logs/kmsg.txt", XID48, 3.0, stop, mark, 1.5))
        w.start()
        try:
            assert r.raised("GPU-HW-003", 5) is not None, r.log.getvalue()[-3000:]  # the flooded code
            assert wait(lambda: "t79" in mark, 5)
            assert wait(lambda: r.agent.debounce.raised("GPU-HW-002"), 10), r.log.getvalue()[-3000:]
            took = time.monotonic() - mark["t79"]
            # the P99 is 2 s; before the flood was counted in bulk this took 8-10 s on a 2-core machine
            assert took < 2.5, took
            assert "t79" in mark and w.is_alive()  # raised while the flood went on
        finally:
            stop.set()
            w.join()
        time.sleep(0.5)
        kernel = r.agent._facts.get("logs").kernel
        assert kernel.bulk_lines > kernel.count("kernel.xid") // 2  # most of the flood never read line by line
        assert r.agent.checks - n0 <= 3.5 / 0.2 + 4  # a check at most every RECHECK_GAP_S
        node_writes = [ln for ln in out.getvalue().splitlines() if ln.startswith("[would write] Node")]
        assert len(node_writes) - writes0 <= 4, node_writes  # two conditions raised, nothing multiplied


def test_a_flooded_code_clears_once_its_lines_are_gone(healthy):
    """The flood's own code clears like any other: the kernel log rotated (a new boot's), full checks only."""
    a = Running(healthy).agent
    kmsg = healthy / ".gpuwarden/logs/kmsg.txt"
    before = kmsg.read_bytes()
    a.check()
    with open(kmsg, "a") as f:
        f.write(XID48 * 50_000)
    for _ in range(a.cfg.debounce_raise):
        a.check()
    assert a.debounce.raised("GPU-HW-003")
    assert a._facts.get("logs").kernel.bulk_lines > 40_000
    kmsg.write_bytes(before)
    a.check(Scope(frozenset({"log"}), "test", time.time()))  # a wake-up never clears
    assert a.debounce.raised("GPU-HW-003")
    for _ in range(a.cfg.debounce_clear - 1):
        a.check()
        assert a.debounce.raised("GPU-HW-003")
    a.check()
    assert not a.debounce.raised("GPU-HW-003")


def test_an_inotify_storm_is_a_handful_of_checks(healthy):
    with Running(healthy) as r:
        n0 = r.agent.checks
        d = healthy / "var/lib/kubelet/device-plugins"
        t0 = time.monotonic()
        for i in range(3000):
            (d / f"x{i}.sock").write_text("")
            os.unlink(d / f"x{i}.sock")
        took = time.monotonic() - t0
        time.sleep(1.0)
        # checks at least RECHECK_GAP_S apart (or their own duration): about 5 a second at most
        assert r.agent.checks - n0 <= (took + 1.0) / 0.2 + 2, (r.agent.checks - n0, took)
        assert len(r.agent.loop.queue) <= 8


# -- a quiet node --------------------------------------------------------------------------------------

def test_a_healthy_idle_node_is_not_woken(healthy):
    with Running(healthy) as r:
        time.sleep(2.0)
        assert r.agent.checks == 1 and r.agent.loop.targeted == 0


def test_fast_memory_sampling_follows_a_leak_and_stops_with_it(healthy):
    src = Emitter()
    meminfo = healthy / "proc/meminfo"
    text = meminfo.read_text()
    free = int(re.search(r"MemFree:\s+(\d+)", text).group(1))
    avail = int(re.search(r"MemAvailable:\s+(\d+)", text).group(1))
    stop = threading.Event()

    def leak() -> None:  # 512 MiB every 100 ms: ~300 GiB/min of memory no cgroup is charged for
        taken = 0
        while not stop.is_set() and taken < free // 2:
            taken += 512 << 10
            tmp = meminfo.with_name("meminfo.new")  # renamed over it: a read never sees a file half written
            tmp.write_text(re.sub(r"MemAvailable:\s+\d+", f"MemAvailable: {avail - taken}",
                                  re.sub(r"MemFree:\s+\d+", f"MemFree: {free - taken}", text)))
            tmp.replace(meminfo)
            time.sleep(0.1)

    with Running(healthy, sources=[src], fast_memory_interval_s=0.25) as r:
        t = threading.Thread(target=leak)
        t.start()
        time.sleep(0.3)
        src.fire(Wake("psi", "memory", "pressure", time.time()))
        assert wait(lambda: "source=fast-memory" in r.log.getvalue(), 5), r.log.getvalue()
        time.sleep(1.0)
        fast = r.log.getvalue().count("source=fast-memory")
        assert fast >= 3  # about one read every 0.25 s while it grows
        stop.set()
        t.join()
        time.sleep(1.0)
        n = r.log.getvalue().count("source=fast-memory")
        time.sleep(1.0)
        assert r.log.getvalue().count("source=fast-memory") == n  # growth stopped: back to idle
        assert "msg=memory-fast-sampling" in r.log.getvalue()


def test_the_event_loop_stops_promptly_when_asked(healthy):
    with Running(healthy) as r:
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5
    assert isinstance(r.agent.loop, EventLoop) and r.agent.loop.running == []


def test_memavailable_falling_fast_wakes_a_memory_check_long_before_the_interval(healthy):
    """Incident 4 on a node with plenty free (run 20's issue-41 finding): no pressure, so PSI is silent; the
    meminfo source sees MemAvailable fall at 40 GiB/min and the memory rules are re-read within ~2 s at the
    chart's 60 s interval. The negative: MemAvailable steady for as long wakes nothing."""
    path = healthy / "proc" / "meminfo"
    text = path.read_text()
    avail = int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1))
    with Running(healthy) as r:
        n = r.agent.checks
        time.sleep(2.5)  # steady: nothing
        assert r.agent.checks == n and "scope=memory source=meminfo" not in r.log.getvalue()
        assert "wake-source-started node=gpu-node-a source=meminfo" in r.log.getvalue()
        t0 = time.monotonic()
        for i in range(1, 6):
            avail -= 700 * 1024  # 0.68 GiB a second, in kB
            path.write_text(re.sub(r"MemAvailable:\s+\d+ kB", f"MemAvailable:   {avail} kB", text))
            if "scope=memory source=meminfo" in r.log.getvalue():
                break
            time.sleep(1.0)
        assert wait(lambda: "scope=memory source=meminfo" in r.log.getvalue(), 3), r.log.getvalue()
        assert time.monotonic() - t0 < 4.0
