"""GPU-machine scenarios of incident 5b through the device plugin's real MPS control daemon (validate.py's SCENARIOS).

Laid out as the Helm chart runs it (`nvidia-device-plugin-mps-control-daemon`): the daemon container's
config (the ConfigMap volume and the config-manager's emptyDir copy under /var/lib/kubelet/pods, MPS
sharing of nvidia.com/gpu, 4 replicas), its host MPS root /run/nvidia/mps (pipe, log and shm
directories) seen as /mps, its pod log under /var/log/pods in the CRI format, and a client "pod" (a
kubepods cgroup with a runc-shaped device program, containerd's config.json with the env the plugin's
Allocate gives an MPS client: CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe, the device-manager
checkpoint) whose process sees /mps and /dev/shm as the plugin's mounts give them.

- mps-healthy: the daemon starts the driver's `nvidia-cuda-mps-control -d`; the client creates a
  CUDA context and runs through MPS (an nvidia-cuda-mps-server appears); gpuwarden must say nothing
  at medium or above; then the clean stop (SIGTERM: `quit`, compute mode back to DEFAULT).
- mps-daemon-died: as healthy, then the MPS control daemon and server are killed (SIGKILL) under the
  running client: the client's next call fails; gpuwarden must say GPU-K8S-011 (not GPU-K8S-007).
  Then the remedy: the daemon pod restarted, a new client runs through MPS, gpuwarden quiet.
- mps-binary-missing: the node after a driver upgrade that removed the compute utilities:
  nvidia-cuda-mps-control and nvidia-cuda-mps-server absent from /usr/bin (or wherever the driver
  put them) in a mount namespace (overlay; the host's files are untouched) where the daemon, the
  client, `gpuwarden check` and `gpuwarden collect` run. The daemon's failure, its exit and restart,
  the client's view and the node's are recorded; gpuwarden must say GPU-K8S-007, and the captured
  bundle (the `mps-binary-missing-h100` example) must say what the live node said.

Safety: the daemon's `nvidia-smi -c EXCLUSIVE_PROCESS` / `-c DEFAULT` go to a recording stand-in
(tests/support/mpsdaemon.py), never to the GPU; every scenario checks that the compute mode is
Default before and after; an MPS daemon already running, or an MPS root not ours, stops it. Everything
started is stopped (the MPS daemon with `quit`, or killed in mps-daemon-died), every file removed.
A dry run without a GPU: GW_MPS_DRY=1 with GW_FAKE_NVML_DIR (tests/support/nvml_fake.c),
GW_MPS_DRIVER_BIN (a directory holding tests/support/mps_control_fake.sh as nvidia-cuda-mps-control)
and GW_MPS_CLIENT (a client that needs no CUDA).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[2]
#: the MPS client workload and the pod layout (tools/gpu)
TOOLS = REPO / "tools/gpu"
sys.path[:0] = [p for p in (str(REPO / "src"), str(REPO), str(REPO / "tests/gpu"), str(TOOLS)) if p not in sys.path]

from memory_scenarios import src_path  # noqa: E402  this checkout's src, then the caller's path (carried wheels)

HOST_ROOT = Path("/run/nvidia/mps")
MARKER = ".gpuwarden-test"
WORK = Path("/tmp/gw-mps")
NS, POD, CTR = "nvidia-device-plugin", "nvidia-device-plugin-mps-control-daemon-gw7xq", "mps-control-daemon-ctr"
CLIENT_NS, CLIENT_POD, CLIENT_CTR = "ml", "mps-client-0", "cuda"
RESOURCE = "nvidia.com/gpu"
REPLICAS = 4
PIPE_IN_CTR = f"/mps/{RESOURCE}/pipe"
CONFIG = f"""version: v1
sharing:
  mps:
    resources:
    - name: {RESOURCE}
      replicas: {REPLICAS}
"""
MPS_BINS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
MAIN_CHECK = ("running", "died", "broken")  # each scenario's check that its verdict is taken from
DRY = bool(os.environ.get("GW_MPS_DRY"))
OUT: Path | None = None  # validate.py sets it: where the broken node's bundle goes
LOG = print


def _run(*cmd: str, timeout: float = 30) -> str:
    env = dict(os.environ, PYTHONPATH=src_path())
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return (p.stdout + p.stderr).strip()


def compute_modes() -> list[str]:
    if DRY:
        return ["Default"]
    return [ln.strip() for ln in _run("nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader").splitlines()
            if ln.strip()]


def mps_processes() -> list[dict]:
    """Every live nvidia-cuda-mps-* process of the host (comm is cut at 15 characters; zombies left out)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            if comm.startswith("nvidia-cuda-mps") and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                argv = (d / "cmdline").read_bytes().split(b"\0")
                out.append({"pid": int(d.name), "comm": comm, "argv": [a.decode(errors="replace") for a in argv if a]})
        except OSError:
            continue
    return out


def tree(root: Path) -> list[str]:
    """What a directory holds: one `path kind [size]` per entry (sockets and FIFOs named as such)."""
    import stat as st

    out = []
    for dirpath, dirs, files in os.walk(root):
        for n in sorted(dirs) + sorted(files):
            p = Path(dirpath) / n
            try:
                m = p.lstat()
            except OSError:
                continue
            kind = ("dir" if st.S_ISDIR(m.st_mode) else "socket" if st.S_ISSOCK(m.st_mode) else
                    "fifo" if st.S_ISFIFO(m.st_mode) else "file")
            out.append(f"{p.relative_to(root)} {kind}" + (f" {m.st_size}" if kind == "file" else ""))
    return sorted(out)


def mps_logs() -> dict[str, str]:
    """The MPS control and server logs under the host root (their tails)."""
    out = {}
    for f in sorted(HOST_ROOT.glob("*/*/log/*.log")):
        try:
            out[str(f.relative_to(HOST_ROOT))] = f.read_text(errors="replace")[-4000:]
        except OSError:
            continue
    return out


def driver_bin() -> Path:
    given = os.environ.get("GW_MPS_DRIVER_BIN")
    if given:
        return Path(given)
    found = shutil.which("nvidia-cuda-mps-control")
    if not found:
        raise RuntimeError("no nvidia-cuda-mps-control on this host's PATH: the driver's compute utilities are not installed")
    return Path(found).resolve().parent


def _path_dirs() -> list[str]:
    return list(dict.fromkeys([str(driver_bin()), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]))


def _hidden() -> list[str]:
    """Every nvidia-cuda-mps-* the daemon could find on its PATH (the driver's, and wrappers or links to it)."""
    out = []
    for d in _path_dirs():
        for b in MPS_BINS:
            p = Path(d) / b
            if (p.exists() or p.is_symlink()) and str(p) not in out:
                out.append(str(p))
    return out


def _wait(pred: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)


class Client:
    """The MPS client pod: mps_client.py in a kubepods cgroup, /mps and /dev/shm mounted as the plugin's Allocate says."""

    def __init__(self, gpu: str, prefix: list[str]) -> None:
        from podlayout import Pod

        self.pod = Pod(CLIENT_NS, CLIENT_POD, CLIENT_CTR, None, qos="besteffort", gpu=f"{gpu}::0",
                       env={"CUDA_MPS_PIPE_DIRECTORY": PIPE_IN_CTR})
        if DRY:  # no cgroup v2 to lay a pod out in: the process stays where it is
            self.pod.enter = self.pod.remove = lambda: None  # type: ignore[method-assign]
        else:
            self.pod.create()
        self.stop_file = WORK / f"stop-{self.pod.uid}"
        prog = os.environ.get("GW_MPS_CLIENT") or str(TOOLS / "mps_client.py")
        script = (f"mount --bind {HOST_ROOT} /mps && mount --bind {HOST_ROOT}/shm /dev/shm && "
                  f"exec {sys.executable} {prog} {self.stop_file}")
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=PIPE_IN_CTR, MPS_CLIENT_SECONDS="240")
        self.lines: list[dict] = []
        self.proc = subprocess.Popen([*prefix, "unshare", "-m", "--propagation", "private", "bash", "-c", script],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=self.pod.enter, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"raw": line.rstrip()})

    def wait_for(self, pred: Callable[[dict], bool], timeout: float) -> dict | None:
        def find() -> dict | None:
            return next((ln for ln in self.lines if pred(ln)), None)
        return _wait(lambda: find() or (self.proc.poll() is not None and find()), timeout)

    def stop(self) -> dict:
        self.stop_file.touch()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        err = self.proc.stderr.read()[-1500:] if self.proc.stderr else ""  # type: ignore[union-attr]
        self.pod.remove()
        self.stop_file.unlink(missing_ok=True)
        return {"rc": self.proc.returncode, "stderr": err}


class Session:
    """One scenario's node: layout, daemons and clients started through it, all removed by close()."""

    def __init__(self, res: dict) -> None:
        from tests.support import realplugin

        self.res = res
        self.daemons: list[Any] = []
        self.clients: list[Client] = []
        self.restarts = 0
        self.created: list[Path] = []
        self.mountpoint = False
        self.view: Any = None
        if "GPUWARDEN_DEVICE_PLUGIN" not in os.environ and (REPO / ".plugin").is_dir():
            os.environ["GPUWARDEN_DEVICE_PLUGIN"] = str(REPO / ".plugin")
        WORK.mkdir(parents=True, exist_ok=True)
        self.binary = realplugin.unpack(WORK, name="mps-control-daemon")
        from validate import gpu_uuid

        self.gpu = os.environ.get("GW_FAKE_NVML_UUID", "GPU-6a7f0b1c-0000-4000-8000-00000000f00d") if DRY else gpu_uuid()
        self.record = WORK / f"nvidia-smi-{res['scenario']}.record"
        self.record.unlink(missing_ok=True)
        self.uid = str(uuid.uuid4())  # the daemon pod's

    # -- the node --------------------------------------------------------------------------------
    def preflight(self) -> None:
        modes = compute_modes()
        self.res["compute_mode_before"] = modes
        if not modes or any(m.lower() != "default" for m in modes):
            raise RuntimeError(f"compute mode is not Default before the scenario ({modes}): not running")
        if mps_processes():
            raise RuntimeError(f"an MPS daemon already runs on this host ({mps_processes()}): not touching it")
        if HOST_ROOT.exists() and not (HOST_ROOT / MARKER).exists():
            raise RuntimeError(f"{HOST_ROOT} exists and is not this test's: not touching it")

    def layout(self) -> None:
        for d in (HOST_ROOT.parent, HOST_ROOT):
            if not d.exists():
                d.mkdir()
                self.created.append(d)
        (HOST_ROOT / MARKER).touch()
        (HOST_ROOT / "shm").mkdir(exist_ok=True)  # /run is a tmpfs: what mount-shm's tmpfs would be
        vol = Path("/var/lib/kubelet/pods") / self.uid / "volumes"
        (vol / "kubernetes.io~configmap/available-configs").mkdir(parents=True, exist_ok=True)
        (vol / "kubernetes.io~configmap/available-configs/mps-shared").write_text(CONFIG)
        (vol / "kubernetes.io~empty-dir/config").mkdir(parents=True, exist_ok=True)
        self.config = vol / "kubernetes.io~empty-dir/config/config.yaml"
        self.config.write_text(CONFIG)
        self.mountpoint = _ensure_mountpoint()

    def log_path(self) -> Path:
        return Path("/var/log/pods") / f"{NS}_{POD}_{self.uid}" / CTR / f"{self.restarts}.log"

    def daemon(self, view: Any = None, hide: list[str] | None = None):
        from tests.support.mpsdaemon import MpsDaemon

        env = {"LD_LIBRARY_PATH": os.environ["GW_FAKE_NVML_DIR"]} if DRY else {}
        d = MpsDaemon(self.binary, HOST_ROOT, self.config, self.log_path(), self.record, path_dirs=_path_dirs(),
                      hide=hide or [], env=env, work=WORK / f"daemon-{self.res['scenario']}-{self.restarts}",
                      ns_pid=view.pid if view is not None else None).start()
        self.daemons.append(d)
        return d

    def restart(self, view: Any = None):
        """The kubelet's restart of the daemon container: the next log file (the scenario does not back off)."""
        self.restarts += 1
        return self.daemon(view)

    def client(self, view: Any = None) -> Client:
        c = Client(self.gpu, view.prefix() if view is not None else [])
        self.clients.append(c)
        self._checkpoint(c)
        return c

    def _checkpoint(self, c: Client) -> None:
        from podlayout import kubelet_state

        kubelet_state([c.pod])
        cp = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
        doc = json.loads(cp.read_text())
        doc["Data"]["RegisteredDevices"] = {RESOURCE: [f"{self.gpu}::{i}" for i in range(REPLICAS)]}
        cp.write_text(json.dumps(doc))

    def smi_calls(self) -> list[str]:
        from tests.support.mpsdaemon import smi_calls

        return smi_calls(self.record)

    # -- gpuwarden ---------------------------------------------------------------------------------
    def check(self, key: str, view: Any = None) -> dict:
        import validate as v

        prefix = view.prefix() if view is not None else []
        report, err, dt = v.gpuwarden("/", prefix=prefix)
        found = v.summarize(report)
        self.res.setdefault("checks", {})[key] = {
            "seconds": round(dt, 3), "findings": found, "text": v.gpuwarden_text("/", prefix=prefix),
            "stderr": err[-1500:]}
        if key in MAIN_CHECK:  # what validate.py's verdict and summary line read
            self.res["findings"], self.res["check_seconds"] = found, round(dt, 3)
        LOG(f"   {key}: gpuwarden {sorted((f['code'], f['status'], f['severity']) for f in found)} in {dt:.2f}s")
        return report

    def collect(self, name: str, view: Any = None) -> Path | None:
        """`gpuwarden collect` of the node now (in `view`), for the record and to re-check offline."""
        if OUT is None:
            return None
        bundle = OUT / f"{name}.tar.gz"
        t0 = time.monotonic()
        out = _run(*(view.prefix() if view is not None else []), sys.executable, "-m", "gpuwarden", "collect",
                   "-o", str(bundle), timeout=120)
        self.res.setdefault("collect", {})[name] = {"output": out, "seconds": round(time.monotonic() - t0, 3)}
        return bundle if bundle.exists() else None

    def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.stop()
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop()
        left = _wait(lambda: not mps_processes(), 3) and [] or mps_processes()  # ours: preflight saw none
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p["pid"], signal.SIGKILL)
        if self.view is not None:
            self.view.stop()
        self.res["left_running_then_killed"] = left
        if (HOST_ROOT / MARKER).exists():
            shutil.rmtree(HOST_ROOT, ignore_errors=True)
        for d in reversed(self.created):
            with contextlib.suppress(OSError):
                d.rmdir()
        from podlayout import clear_kubelet_state

        clear_kubelet_state()
        shutil.rmtree(Path("/var/lib/kubelet/pods") / self.uid, ignore_errors=True)
        _cleanup_mountpoint(self.mountpoint)
        self.res["compute_mode_after"] = compute_modes()
        self.res["smi_calls"] = self.smi_calls()


def _ensure_mountpoint() -> bool:
    from tests.support.mpsdaemon import ensure_mountpoint

    return ensure_mountpoint()


def _cleanup_mountpoint(created: bool) -> None:
    from tests.support.mpsdaemon import cleanup_mountpoint

    cleanup_mountpoint(created)


@contextlib.contextmanager
def session(res: dict) -> Iterator[Session]:
    s = Session(res)
    s.preflight()
    try:
        s.layout()
        yield s
    finally:
        s.close()


def _finding(s: Session, key: str, code: str) -> dict:
    return next((f for f in s.res["checks"][key]["findings"] if f["code"] == code), {})


def _serious(s: Session, key: str) -> list[dict]:
    return [f for f in s.res["checks"][key]["findings"] if f["severity"] in ("medium", "high", "critical")]


def _through_mps(s: Session) -> bool:
    return DRY or any(p["comm"].startswith("nvidia-cuda-mps") and "server" in " ".join(p["argv"]) + p["comm"]
                      for p in s.res.get("mps_processes", []))


def _fail_unless(res: dict, checks: dict[str, bool]) -> dict:
    res["checks_passed"] = checks
    modes = res.get("compute_mode_after") or []
    checks["compute_mode_default_after"] = bool(modes) and all(m.lower() == "default" for m in modes)
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        res["error"] = "checks failed: " + ", ".join(bad)
    return res


def _client_ok(c: Client, timeout: float = 60) -> dict | None:
    return c.wait_for(lambda ln: ln.get("step") in ("memset+sync", "cuInit", "cuCtxCreate", "cuMemAlloc")
                      and (ln.get("step") == "memset+sync" or ln.get("rc")), timeout)


def _compute_apps() -> str:
    return "" if DRY else _run("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv")


# --- the scenarios ---------------------------------------------------------------------------------

def healthy() -> dict:
    res: dict[str, Any] = {"scenario": "mps-healthy", "expect": None}
    try:
        with session(res) as s:
            t0 = time.monotonic()
            d = s.daemon()
            ready = _wait(lambda: (HOST_ROOT / ".ready").exists(), 30)
            res["daemon_ready_s"] = round(time.monotonic() - t0, 3) if ready else None
            c = s.client()
            res["client_first"] = _client_ok(c)
            time.sleep(1.0)
            res["mps_processes"] = mps_processes()
            res["compute_apps"] = _compute_apps()
            res["mps_root"] = tree(HOST_ROOT)
            res["mps_logs"] = mps_logs()
            s.check("running")
            s.collect("mps-healthy")
            res["client"] = list(c.lines)
            res["client_stop"] = c.stop()
            s.clients.remove(c)
            rc = d.stop()
            res["daemon_stop"] = {"rc": rc, "mps_root_after": tree(HOST_ROOT), "mps_processes_after": mps_processes()}
            res["daemon_log"] = d.log()[-6000:]
            LOG(f"   ready in {res['daemon_ready_s']}s; client {res['client_first']}; mps {[p['comm'] for p in res['mps_processes']]}; "
                f"stop rc {rc}")
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        return res
    calls = res.get("smi_calls", [])
    first = res.get("client_first") or {}
    return _fail_unless(res, {
        "daemon_ready": res.get("daemon_ready_s") is not None,
        "client_runs": first.get("step") == "memset+sync" and first.get("rc") == 0,
        "through_mps": _through_mps(s),
        "gpuwarden_quiet": not _serious(s, "running"),
        "clean_stop_rc0": res["daemon_stop"]["rc"] == 0,
        "smi_exclusive_then_default": [c.split(" -c ")[-1] for c in calls] == ["EXCLUSIVE_PROCESS", "DEFAULT"],
    })


def died() -> dict:
    res: dict[str, Any] = {"scenario": "mps-daemon-died", "expect": "GPU-K8S-011"}
    try:
        with session(res) as s:
            d = s.daemon()
            _wait(lambda: (HOST_ROOT / ".ready").exists(), 30)
            c = s.client()
            res["client_first"] = _client_ok(c)
            time.sleep(1.0)
            res["mps_processes"] = mps_processes()
            killed = [p for p in res["mps_processes"]]
            t_kill = time.time()
            for p in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p["pid"], signal.SIGKILL)
            res["killed"] = killed
            err = c.wait_for(lambda ln: bool(ln.get("rc")), 30)
            res["client_error"] = err
            res["client_error_after_s"] = round(err["t"] - t_kill, 3) if err and "t" in err else None
            time.sleep(0.5)
            res["mps_root"] = tree(HOST_ROOT)
            res["mps_logs"] = mps_logs()
            res["daemon_alive_after_kill"] = d.proc.poll() is None
            res["daemon_log_after_kill"] = d.log()[-3000:]
            s.check("died")
            s.collect("mps-daemon-died")
            # the remedy: restart the daemon pod (its stop fails: no control daemon to quit), new client
            res["restart_stop_rc"] = d.stop()
            res["daemon_log"] = d.log()[-6000:]
            c.stop()
            s.clients.remove(c)
            t0 = time.monotonic()
            s.restart()
            ready = _wait(lambda: (HOST_ROOT / ".ready").exists(), 30)
            res["restarted_ready_s"] = round(time.monotonic() - t0, 3) if ready else None
            c2 = s.client()
            res["client2_first"] = _client_ok(c2)
            res["mps_processes_after_restart"] = mps_processes()
            res["mps_root_after_restart"] = tree(HOST_ROOT)
            s.check("restarted")
            LOG(f"   killed {[p['comm'] for p in killed]}; client error {err}; daemon alive {res['daemon_alive_after_kill']}; "
                f"restart ready {res['restarted_ready_s']}s; client2 {res['client2_first']}")
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        return res
    f011 = _finding(s, "died", "GPU-K8S-011")
    second = res.get("client2_first") or {}
    return _fail_unless(res, {
        "client_sees_error": bool(res.get("client_error")),
        "gpuwarden_k8s011": f011.get("status") == "confirmed",
        "not_k8s007": not _finding(s, "died", "GPU-K8S-007"),
        "restart_recovers": res.get("restarted_ready_s") is not None and second.get("step") == "memset+sync"
                            and second.get("rc") == 0,
        "gpuwarden_quiet_after_restart": not _serious(s, "restarted"),
    })


def missing() -> dict:
    from tests.support.mpsdaemon import NodeView

    res: dict[str, Any] = {"scenario": "mps-binary-missing", "expect": "GPU-K8S-007"}
    try:
        with session(res) as s:
            hide = _hidden()
            res["hidden"] = hide
            s.view = view = NodeView(hide, WORK / "node-view").start()
            res["driver_bin_in_view"] = _run(*view.prefix(), "ls", str(driver_bin()))
            res["which_in_view"] = _run(*view.prefix(), "sh", "-c", "command -v nvidia-cuda-mps-control || echo absent")
            res["host_still_has"] = [h for h in hide if Path(h).exists() or Path(h).is_symlink()]
            res["what_was_hidden"] = _run("sh", "-c", "ls -la " + " ".join(hide) + "; for f in " + " ".join(hide)
                                          + "; do head -c 300 \"$f\" | tr -c '[:print:]\\n' '.'; echo; done")
            t0 = time.monotonic()
            d = s.daemon(view)
            failed = d.wait_log("Failed to start MPS daemon", 30)
            res["failed_after_s"] = round(time.monotonic() - t0, 3) if failed else None
            rc = d.wait_exit(45)
            res["exit"] = {"rc": rc, "after_s": round(time.monotonic() - t0, 3)}
            res["daemon_log_0"] = d.log()[-6000:]
            d.stop()
            d2 = s.restart(view)
            d2.wait_log("Failed to start MPS daemon", 30)
            c = s.client(view)
            res["client_first"] = c.wait_for(lambda ln: ln.get("step") == "memset+sync" or bool(ln.get("rc")), 60)
            time.sleep(0.5)
            res["client"] = list(c.lines)
            res["mps_processes"] = mps_processes()
            res["compute_apps"] = _compute_apps()
            res["mps_root"] = tree(HOST_ROOT)
            res["mps_logs"] = mps_logs()
            res["pod_logs"] = tree(Path("/var/log/pods") / f"{NS}_{POD}_{s.uid}")
            s.check("broken", view)
            bundle = s.collect("mps-binary-missing", view)
            if bundle is not None:
                import validate as v

                e = dict(os.environ, PYTHONPATH=src_path())
                p = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--bundle", str(bundle), "--format", "json",
                                    "--fail-on", "critical"], capture_output=True, text=True, timeout=120, env=e)
                try:
                    res["bundle_findings"] = v.summarize(json.loads(p.stdout))
                except ValueError:
                    res["bundle_findings"] = [{"error": (p.stdout + p.stderr)[-1500:]}]
            res["client_stop"] = c.stop()
            s.clients.remove(c)
            res["restart_stop_rc"] = d2.stop()
            res["daemon_log_1"] = d2.log()[-6000:]
            LOG(f"   failed after {res['failed_after_s']}s, exit {res['exit']}; client {res['client_first']}; "
                f"mps root {res['mps_root']}")
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        return res
    f007 = _finding(s, "broken", "GPU-K8S-007")
    live = sorted((f["code"], f["status"]) for f in res["checks"]["broken"]["findings"])
    captured = sorted((f.get("code"), f.get("status")) for f in res.get("bundle_findings", []))
    return _fail_unless(res, {
        "host_untouched": res["host_still_has"] == hide,
        "daemon_logs_exec_error": "executable file not found in $PATH" in res["daemon_log_0"],
        "daemon_exits_1": res["exit"]["rc"] == 1,
        "gpuwarden_k8s007": f007.get("status") == "confirmed",
        "not_k8s011": not _finding(s, "broken", "GPU-K8S-011"),
        "bundle_says_the_same": "mps-binary-missing" not in res.get("collect", {}) or live == captured,
    })


SCENARIOS = {
    "mps-healthy": healthy,
    "mps-daemon-died": died,
    "mps-binary-missing": missing,
}
