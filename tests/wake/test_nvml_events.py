"""The NVML event source against a stand-in libnvidia-ml.so.1 (nvml_events_fake.c) that delivers events on
trigger files, hangs in init or in the wait on request, loses a GPU, or crashes: the wake arrives within a
bound, a flood is a few wakes with its count, a hung init is killed at its deadline and is itself a wake,
the child dies with its parent and is gone after `stop`, and an unusable NVML is a reason, not a wake."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from gpuwarden.root import HostRoot
from gpuwarden.wake import nvml_child
from gpuwarden.wake.nvml import NvmlEvents, describe

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: a wake must arrive within this of its trigger (the fake polls its trigger files every 5 ms)
BOUND_S = 1.0


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> str:
    if not shutil.which("gcc"):
        pytest.skip("gcc not available to build the stand-in NVML library")
    so = tmp_path_factory.mktemp("nvml-events") / "libnvidia-ml-events.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(so),
                    str(HERE / "nvml_events_fake.c")], check=True)
    return str(so)


@pytest.fixture
def files(tmp_path, monkeypatch) -> dict[str, Path]:
    """The fake's trigger files (absent until a test writes them), in the children's environment."""
    names = {"event": "FAKE_NVML_EVENT_FILE", "hang": "FAKE_NVML_HANG_FILE", "lost": "FAKE_NVML_LOST_FILE",
             "wait_hang": "FAKE_NVML_WAIT_HANG_FILE", "crash": "FAKE_NVML_CRASH_FILE",
             "registered": "FAKE_NVML_REGISTERED"}
    out = {}
    for key, env in names.items():
        out[key] = tmp_path / key
        monkeypatch.setenv(env, str(out[key]))
    monkeypatch.delenv("GPUWARDEN_NVML_LIBRARY", raising=False)
    return out


@pytest.fixture
def sources():
    """Every source a test starts is stopped after it, whatever the test did."""
    started: list[NvmlEvents] = []
    yield started
    for s in started:
        s.stop()


def trigger(path: Path, text: str = "") -> float:
    """Make a trigger file appear at once (written aside, renamed in); the time it appeared."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.rename(tmp, path)
    return time.time()


def wait_for(pred: Callable[[], Any], timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.005)
    return pred()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def start(sources: list, lib: str, got: list, **kw: Any) -> tuple[NvmlEvents, str | None]:
    kw = {"init_timeout_s": 2.0, "wait_ms": 100, "tick_s": 1.0, **kw}
    src = NvmlEvents(HostRoot("/"), lib, **kw)
    sources.append(src)
    return src, src.start(got.append)


def more(detail: str) -> int:
    m = re.search(r"\(\+(\d+) more\)$", detail)
    return 1 + (int(m.group(1)) if m else 0)


def test_xid_event_wakes_within_a_bound_naming_gpu_and_xid(fake_lib, files, sources):
    got: list = []
    src, why = start(sources, fake_lib, got)
    assert why is None and src.state == "ready"
    t = trigger(files["event"], "1 8 79\n")  # GPU 1, nvmlEventTypeXidCriticalError, Xid 79
    assert wait_for(lambda: got, BOUND_S)
    (w,) = got
    assert (w.source, w.topic, w.detail) == ("nvml", "gpu", "gpu 1 (00000000:19:00.0) xid 79")
    assert t - 0.05 <= w.seen <= t + BOUND_S
    # the faults are registered (Xid, ECC, GPU unavailable, recovery action), not PState changes
    masks = {int(m) for m in re.findall(r"\d+ (\d+)", files["registered"].read_text())}
    assert masks == {nvml_child.FAULTS} and not nvml_child.FAULTS & nvml_child.PSTATE


def test_quiet_gpus_wake_nothing(fake_lib, files, sources):
    got: list = []
    start(sources, fake_lib, got, tick_s=0.2)
    time.sleep(1.0)  # ticks come and go; no event, no wake
    assert got == []


def test_pstate_changes_are_registered_only_when_asked(fake_lib, files, sources):
    got: list = []
    start(sources, fake_lib, got, mask=nvml_child.FAULTS | nvml_child.PSTATE)
    trigger(files["event"], "0 4 0\n")
    assert wait_for(lambda: got, BOUND_S)[0].detail == "gpu 0 (00000000:18:00.0) pstate change"
    assert {int(m) for m in re.findall(r"\d+ (\d+)", files["registered"].read_text())} == {
        nvml_child.FAULTS | nvml_child.PSTATE}


def test_ecc_and_gpu_unavailable_events_are_named(fake_lib, files, sources):
    got: list = []
    start(sources, fake_lib, got, window_s=0.01)
    for text, want in (("0 2 0\n", "gpu 0 (00000000:18:00.0) ecc double-bit"),
                       ("1 16384 0\n", "gpu 1 (00000000:19:00.0) unavailable (GPU lost)")):
        n = len(got)
        trigger(files["event"], text)
        assert wait_for(lambda: len(got) > n, BOUND_S)
        assert got[-1].detail == want


def test_a_flood_of_xids_is_a_few_wakes_with_its_count(fake_lib, files, sources):
    got: list = []
    src, _ = start(sources, fake_lib, got)
    trigger(files["event"], "0 8 48 5000\n")  # 5,000 Xid 48 events as fast as the wait returns them
    wait_for(lambda: sum(more(w.detail) for w in got) >= 5000, 10.0)
    time.sleep(1.5)  # a last trailing wake would come within one window
    assert sum(more(w.detail) for w in got) == 5000
    assert 1 <= len(got) <= 8, [w.detail for w in got]
    assert all(w.detail.startswith("gpu 0 (00000000:18:00.0) xid 48") for w in got)


def test_hung_init_is_killed_at_its_deadline_and_is_a_wake_then_recovers(fake_lib, files, sources):
    files["hang"].write_text("")
    got: list = []
    t0 = time.monotonic()
    src, why = start(sources, fake_lib, got, init_timeout_s=1.0)
    took = time.monotonic() - t0
    assert why is None and 1.0 <= took < 3.0  # start waits for init no longer than its deadline (+ the kill)
    (w,) = wait_for(lambda: got, BOUND_S)
    assert (w.source, w.topic) == ("nvml", "gpu") and w.detail.startswith("nvmlInit did not return within 1s")
    assert src.state == "retrying" and src.restarts >= 1
    files["hang"].unlink()
    assert wait_for(lambda: src.state == "ready", 5.0)
    trigger(files["event"], "0 8 79\n")
    assert wait_for(lambda: any("xid 79" in w.detail for w in got), BOUND_S + 1.0)


def test_hung_init_child_is_gone_once_killed(fake_lib, files, sources):
    files["hang"].write_text("")
    got: list = []
    src, _ = start(sources, fake_lib, got, init_timeout_s=0.5, backoff_max_s=30.0)
    pids = set()
    wait_for(lambda: pids.add(src.child_pid) or src.restarts >= 2, 5.0)
    pids.discard(None)
    assert pids and all(wait_for(lambda p=p: gone(p), 1.0) for p in pids)
    assert len(got) >= 2 and all(w.detail.startswith("nvmlInit did not return") for w in got)


def test_gpu_lost_from_the_wait_is_one_wake_while_it_lasts(fake_lib, files, sources):
    got: list = []
    start(sources, fake_lib, got, window_s=0.01)
    files["lost"].write_text("")
    assert wait_for(lambda: got, BOUND_S)
    time.sleep(0.8)  # the wait answers GPU_IS_LOST every time: still one wake (edge-triggered)
    assert [w.detail for w in got] == ["a GPU is lost (NVML_ERROR_GPU_IS_LOST from nvmlEventSetWait)"]
    files["lost"].unlink()
    time.sleep(0.3)
    files["lost"].write_text("")  # lost again after a good wait: a new wake
    assert wait_for(lambda: len(got) == 2, BOUND_S)


def test_a_gpu_lost_at_registration_is_a_wake_and_the_others_are_watched(fake_lib, files, sources, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_LOST_GPU", "1")
    got: list = []
    src, why = start(sources, fake_lib, got, window_s=0.01)
    assert why is None and src.state == "ready"
    assert wait_for(lambda: got, BOUND_S)
    assert got[0].detail == "gpu 1 is lost (NVML_ERROR_GPU_IS_LOST from nvmlDeviceGetHandleByIndex)"
    trigger(files["event"], "0 8 79\n")
    assert wait_for(lambda: len(got) == 2, BOUND_S) and got[1].detail == "gpu 0 (00000000:18:00.0) xid 79"


def test_the_only_gpu_lost_at_start_is_a_reason_not_a_wake(fake_lib, files, sources, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_GPUS", "1")
    monkeypatch.setenv("FAKE_NVML_LOST_GPU", "0")
    got: list = []
    src, why = start(sources, fake_lib, got)
    assert why == f"none of 1 GPU(s) accepts event registration (mask {nvml_child.FAULTS:#x}); lost: GPU 0"
    assert got == []  # the periodic check's NVML probe names the lost GPU (GPU-HW-002)


def test_the_child_holds_none_of_the_agents_descriptors(fake_lib, files, sources):
    import socket

    with socket.socket() as s:
        ino = os.fstat(s.fileno()).st_ino
        src, _ = start(sources, fake_lib, [])
        links = [os.readlink(f"/proc/{src.child_pid}/fd/{fd}") for fd in os.listdir(f"/proc/{src.child_pid}/fd")]
    assert f"socket:[{ino}]" not in links and len(links) <= 5, links


def test_a_wait_that_hangs_past_the_heartbeat_is_a_wake_and_a_new_child(fake_lib, files, sources):
    got: list = []
    src, _ = start(sources, fake_lib, got, tick_s=0.2)
    first = src.child_pid
    files["wait_hang"].write_text("")
    (w,) = wait_for(lambda: got, 3.0)
    assert w.detail.startswith("the NVML event wait did not return within 0.7s")
    files["wait_hang"].unlink()
    assert wait_for(lambda: src.state == "ready" and src.child_pid not in (None, first), 5.0)
    assert gone(first)


def test_a_child_that_dies_is_restarted_and_events_flow_again(fake_lib, files, sources):
    import io

    from gpuwarden.kube.log import Log

    got: list = []
    out = io.StringIO()
    src, _ = start(sources, fake_lib, got, log=Log("text", out))
    first = src.child_pid
    files["crash"].write_text("")
    assert wait_for(lambda: src.restarts >= 1 and src.state == "ready", 5.0)
    assert src.child_pid != first and gone(first)
    assert "wake-nvml-restart" in out.getvalue() and "the NVML event child exited" in out.getvalue()
    assert got == []  # a crash is restarted quietly: the next check's NVML probe judges the driver
    trigger(files["event"], "0 8 31\n")
    assert wait_for(lambda: got, BOUND_S)[0].detail.endswith("xid 31")


def test_the_child_is_gone_after_stop(fake_lib, files, sources):
    src, _ = start(sources, fake_lib, [])
    pid = src.child_pid
    assert pid and not gone(pid)
    t0 = time.monotonic()
    src.stop()
    assert time.monotonic() - t0 < 2.0 and gone(pid) and src.state == "stopped"


def test_the_child_dies_with_the_agent(fake_lib, files, tmp_path):
    """PR_SET_PDEATHSIG: the agent killed with SIGKILL (no stop) leaves no NVML child behind."""
    code = ("import sys, time\nfrom gpuwarden.root import HostRoot\nfrom gpuwarden.wake.nvml import NvmlEvents\n"
            f"s = NvmlEvents(HostRoot('/'), {fake_lib!r})\nprint(s.start(lambda w: None), s.child_pid, flush=True)\n"
            "time.sleep(60)\n")
    agent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    try:
        why, pid = agent.stdout.readline().split()  # type: ignore[union-attr]
        assert why == "None" and not gone(int(pid))
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    assert wait_for(lambda: gone(int(pid)), 2.0)


@pytest.mark.parametrize("env, want", [
    ({"FAKE_NVML_SUPPORTED": "none"}, "none of 2 GPU(s) accepts event registration"),
    ({"FAKE_NVML_SUPPORTED": "0x4"}, "none of 2 GPU(s) accepts event registration"),  # PState only
    ({"FAKE_NVML_INIT_RC": "9"}, "nvmlInit failed: Driver Not Loaded"),
    ({"FAKE_NVML_GPUS": "0"}, "none of 0 GPU(s) accepts event registration"),
])
def test_nvml_without_events_is_a_reason_and_no_wake(fake_lib, files, sources, monkeypatch, env, want):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got: list = []
    src, why = start(sources, fake_lib, got)
    assert why is not None and want in why and src.state == "unavailable"
    assert got == [] and src.child_pid is None


def test_no_library_is_a_reason(files, sources, tmp_path):
    src, why = start(sources, str(tmp_path / "libnvidia-ml.so.1"), [])
    assert why is not None and why.startswith("NVML Shared Library Not Found")


def test_not_a_live_root_or_no_driver_starts_no_child(files, tmp_path):
    from gpuwarden.examples import open_example

    got: list = []
    assert NvmlEvents(open_example("healthy")).start(got.append).startswith("not a live root")
    assert NvmlEvents(HostRoot(str(tmp_path))).start(got.append) == "no NVIDIA driver: /proc/driver/nvidia is absent"
    assert got == []


def test_the_library_is_taken_from_the_probes_variable(fake_lib, files, sources, monkeypatch, tmp_path):
    """GPUWARDEN_NVML_LIBRARY, as the NVML probe takes it: the node tree has no driver, the library is named."""
    monkeypatch.setenv("GPUWARDEN_NVML_LIBRARY", fake_lib)
    src = NvmlEvents(HostRoot(str(tmp_path)))
    sources.append(src)
    assert src.start(lambda w: None) is None and src.state == "ready"


@pytest.mark.parametrize("line", ["", "event", "event x 0 - 8 79", "event 1.0 0 - eight 79", "lost 1.0", "tick",
                                  "ready 2 2", "error 1.0 x text", "unavailable x", "event 1.0 0 - 8 79 extra"])
def test_lines_that_are_not_events_wake_nothing(line):
    assert describe(line) is None


def test_event_lines_are_described():
    assert describe("event 5.5 0 - 8 79") == ("gpu 0 xid 79", 5.5)
    assert describe("event 5.5 3 00000000:1B:00.0 32768 2") == ("gpu 3 (00000000:1B:00.0) recovery action 2", 5.5)
    assert describe("error 7.0 999 Unknown Error") == ("NVML event wait failed: Unknown Error (NVML error 999)", 7.0)


def test_the_inject_shim_gives_a_lost_gpu_as_an_event_and_as_the_wait(fake_lib, files, sources, tmp_path, monkeypatch):
    """tools/gpu/nvml_inject_shim.c on the GPU host, here over the stand-in: GW_NVML_LOST_EVENT_FILE hands the
    event child one nvmlEventTypeGpuUnavailableError for the GPU it names, GW_NVML_WAIT_LOST_FILE makes the wait
    answer NVML_ERROR_GPU_IS_LOST, GW_NVML_XID_FILE one Xid; nothing else changes."""
    shim = build_shim(fake_lib, tmp_path)
    for env, name in (("GW_NVML_LOST_EVENT_FILE", "lost-event"), ("GW_NVML_WAIT_LOST_FILE", "wait-lost"),
                      ("GW_NVML_XID_FILE", "xid")):
        monkeypatch.setenv(env, str(tmp_path / name))
    monkeypatch.setenv("GW_NVML_REAL", fake_lib)
    got: list = []
    start(sources, str(shim), got, window_s=0.01)
    trigger(tmp_path / "lost-event", "1\n")
    assert wait_for(lambda: got, BOUND_S)[-1].detail == "gpu 1 (00000000:19:00.0) unavailable (GPU lost)"
    trigger(tmp_path / "xid", "79\n")
    assert wait_for(lambda: len(got) == 2, BOUND_S) and got[-1].detail == "gpu 0 (00000000:18:00.0) xid 79"
    trigger(tmp_path / "wait-lost")
    assert wait_for(lambda: len(got) == 3, BOUND_S) and got[-1].detail.startswith("a GPU is lost")


def build_shim(fake_lib: str, where: Path) -> Path:
    """tools/gpu/nvml_inject_shim.c linked over the stand-in, as bench/event_latency.py links it over the host's."""
    shim = where / "nvml_inject_shim.so"
    soname = Path(fake_lib).parent / "libnvidia-ml.so.1"  # what the shim's link names (the fake's soname)
    if not soname.exists():
        soname.symlink_to(fake_lib)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(REPO / "tools/gpu/nvml_inject_shim.c"),
                    f"-Wl,--no-as-needed,-rpath,{Path(fake_lib).parent}", fake_lib, "-ldl"], check=True)
    return shim


def test_the_inject_shim_answers_a_trigger_made_during_a_long_real_wait(fake_lib, sources, tmp_path, monkeypatch):
    """The GPU host's case (docs/validation.md run 20): the real nvmlEventSetWait_v2 sleeps its whole timeout
    when no event comes, and nothing can be put into a real event set from outside. The stand-in with no
    FAKE_NVML_* variable set waits the same way, so this is the shim over a wait like the driver's, at the
    agent's default wait (5 s): a GW_NVML_WAIT_LOST_FILE made while the child sits in it is answered within a
    slice (20 ms), not when the 5 s wait ends; with no trigger file present nothing wakes."""
    for env in ("FAKE_NVML_EVENT_FILE", "FAKE_NVML_LOST_FILE", "FAKE_NVML_WAIT_HANG_FILE", "FAKE_NVML_CRASH_FILE",
                "GW_NVML_XID_FILE", "GW_NVML_LOST_EVENT_FILE", "GPUWARDEN_NVML_LIBRARY"):
        monkeypatch.delenv(env, raising=False)
    shim = build_shim(fake_lib, tmp_path)
    monkeypatch.setenv("GW_NVML_REAL", fake_lib)
    monkeypatch.setenv("GW_NVML_WAIT_LOST_FILE", str(tmp_path / "wait-lost"))
    got: list = []
    src, why = start(sources, str(shim), got, wait_ms=5000, tick_s=30.0, window_s=0.01)
    assert why is None and src.state == "ready"
    time.sleep(1.0)  # the child is inside its first 5 s wait; no trigger: quiet
    assert got == []
    t = trigger(tmp_path / "wait-lost")
    assert wait_for(lambda: got, BOUND_S), "the trigger was not seen inside the 5 s wait"
    assert got[0].detail.startswith("a GPU is lost") and got[0].seen - t < BOUND_S
