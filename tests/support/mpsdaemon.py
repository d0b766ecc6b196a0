"""The real MPS control daemon of the NVIDIA device plugin (v0.20.0) for tests: run it as the chart does, isolated.

`mps-control-daemon` (the Helm chart's `mps-control-daemon-ctr`) reads its sharing config, asks NVML
for the GPUs, runs `nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS`, creates `/mps/<resource>/{pipe,log}`,
execs `nvidia-cuda-mps-control -d` (looked up on its PATH), then writes `/mps/<resource>/.started` and
`/mps/.ready`. If the exec fails it logs `Failed to start MPS daemon: ...`, retries 30 s later by
first stopping what it started (`quit` through nvidia-cuda-mps-control), and when that fails too it
exits 1: the container's crash loop. A clean stop (SIGTERM) sends `quit`, runs `nvidia-smi -c DEFAULT`
and removes `.started` and the log directory.

Here it runs in its own mount namespace (`unshare -m`, private propagation) where:
- `/mps` is the host MPS root given (the chart's hostPath /run/nvidia/mps), `/dev/shm` its `shm`;
- `nvidia-smi` is a recording stand-in: first on PATH and bind-mounted over every `nvidia-smi` of the
  PATH directories, so the compute-mode calls never reach a GPU; each call is a line in `smi_record`;
- `hide` names binaries to make absent from the daemon's view (the state after a driver upgrade
  removed the compute utilities): their directory is overlaid (tmpfs upper) and the file deleted in
  the overlay only; the host's files are never touched;
- its stdout and stderr are written to `log_path` in the CRI format containerd writes pod logs in.

`NodeView` is a long-lived mount namespace where binaries are hidden the same way: the view of a whole
node after the upgrade, in which a client, `gpuwarden check` and `gpuwarden collect` run (nsenter).
Root only (mount, and the `/mps` mount point is created when absent and removed by `cleanup_mountpoint`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

BINARY = "mps-control-daemon"
MOUNTPOINT = Path("/mps")

# bash: make the files in $2 (space-separated paths) absent in this mount namespace, one overlay per
# directory (a tmpfs upper layer, the file deleted there; overlays do not stack on overlays more
# than twice, and the root file system may be one already); where overlayfs refuses, the directory
# is replaced by a tmpfs of links to everything else in it (through a bind of the original)
_HIDE = r"""
hide_files() {
  local tmp=$1 hide=$2 n=0 d f e
  for d in $(for f in $hide; do dirname "$f"; done | sort -u); do
    n=$((n+1)); mkdir -p "$tmp/h$n"; mount -t tmpfs tmpfs "$tmp/h$n"
    mkdir "$tmp/h$n/up" "$tmp/h$n/work" "$tmp/h$n/orig" "$tmp/h$n/farm"
    if mount -t overlay overlay -o "lowerdir=$d,upperdir=$tmp/h$n/up,workdir=$tmp/h$n/work" "$d" 2>"$tmp/h$n/err"; then
      for f in $hide; do if [ "$(dirname "$f")" = "$d" ]; then rm -f "$f"; fi; done
    else
      mount --bind "$d" "$tmp/h$n/orig"
      for e in "$tmp/h$n/orig"/* "$tmp/h$n/orig"/.[!.]*; do
        if [ -e "$e" ] || [ -L "$e" ]; then ln -s "$e" "$tmp/h$n/farm/"; fi
      done
      for f in $hide; do if [ "$(dirname "$f")" = "$d" ]; then rm -f "$tmp/h$n/farm/$(basename "$f")"; fi; done
      mount --bind "$tmp/h$n/farm" "$d"
    fi
  done
  return 0
}
trap 'echo "mount namespace set-up failed: line $LINENO: $BASH_COMMAND" >&2' ERR
"""

# runs inside the daemon's new mount namespace: $0 MPS root, $1 stand-in dir, $2 hidden files
# (space-separated absolute paths), $3 tmp dir for overlays; then the daemon's argv
_SETUP = _HIDE + r"""
set -e
root=$0; standin=$1; hide=$2; tmp=$3; shift 3
mount --bind "$root" /mps
if [ -d "$root/shm" ]; then mount --bind "$root/shm" /dev/shm; fi
hide_files "$tmp" "$hide"
IFS=: ; for d in $PATH; do
  if [ "$d" != "$standin" ] && [ -e "$d/nvidia-smi" ]; then mount --bind "$standin/nvidia-smi" "$d/nvidia-smi"; fi
done
unset IFS
exec "$@"
"""

_STANDIN_SMI = """#!/bin/sh
# nvidia-smi stand-in (gpuwarden tests): records what it was asked, touches no GPU
printf '%s %s\\n' "$(date +%s.%N)" "$*" >> {record}
case "$*" in
  *-c*) echo "Compute mode set by stand-in (no GPU touched)." ;;
esac
exit 0
"""


def standin_dir(where: Path, record: Path) -> Path:
    """A directory holding the recording `nvidia-smi` stand-in (first on the daemon's PATH)."""
    d = where / "standin-bin"
    d.mkdir(parents=True, exist_ok=True)
    smi = d / "nvidia-smi"
    smi.write_text(_STANDIN_SMI.format(record=shlex.quote(str(record))))
    smi.chmod(0o755)
    return d


def smi_calls(record: Path) -> list[str]:
    """The stand-in's record: the arguments of each call, in order."""
    try:
        return [ln.split(" ", 1)[1] if " " in ln else "" for ln in record.read_text().splitlines()]
    except OSError:
        return []


def ensure_mountpoint() -> bool:
    """Create /mps (the daemon's fixed root) when absent; True if this call created it."""
    if MOUNTPOINT.is_dir():
        return False
    MOUNTPOINT.mkdir()
    return True


def cleanup_mountpoint(created: bool) -> None:
    if created:
        try:
            MOUNTPOINT.rmdir()
        except OSError:
            pass


def _cri_time() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


class CriLog:
    """Writes a process's stdout/stderr lines as containerd writes them into /var/log/pods."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "ab", buffering=0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def pump(self, stream: object, name: str) -> None:
        def run() -> None:
            for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
                line = raw.rstrip(b"\n")
                with self._lock:
                    if self._closed:  # a child that outlived the daemon still writes: dropped
                        continue
                    self._f.write(f"{_cri_time()} {name} F ".encode() + line + b"\n")

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        for t in self._threads:
            t.join(2)
        with self._lock:
            self._closed = True
            self._f.close()


class MpsDaemon:
    """One container run of the real daemon; a context manager that always stops it (SIGTERM, SIGKILL)."""

    def __init__(self, binary: Path, mps_root: Path, config_file: Path, log_path: Path, smi_record: Path, *,
                 path_dirs: Sequence[str], hide: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 work: Path, ns_pid: int | None = None) -> None:
        self.binary, self.mps_root, self.config_file = Path(binary), Path(mps_root), Path(config_file)
        self.log_path, self.smi_record, self.work = Path(log_path), Path(smi_record), Path(work)
        self.path_dirs, self.hide, self.env, self.ns_pid = list(path_dirs), list(hide), dict(env or {}), ns_pid
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self._log: CriLog | None = None

    def start(self) -> "MpsDaemon":
        standin = standin_dir(self.work, self.smi_record)
        self.work.mkdir(parents=True, exist_ok=True)
        enter = ["nsenter", "-t", str(self.ns_pid), "-m", "--"] if self.ns_pid else []
        argv = enter + ["unshare", "-m", "--propagation", "private", "bash", "-c", _SETUP, str(self.mps_root),
                        str(standin), " ".join(self.hide), str(self.work), str(self.binary)]
        env = dict(os.environ, **self.env)
        env["PATH"] = ":".join([str(standin)] + self.path_dirs)
        env["CONFIG_FILE"] = str(self.config_file)
        env.setdefault("NVIDIA_VISIBLE_DEVICES", "all")
        env.setdefault("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
        self._log = CriLog(self.log_path)
        self.started_at = time.time()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)
        self._log.pump(self.proc.stdout, "stdout")
        self._log.pump(self.proc.stderr, "stderr")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        """The pod log as written so far, CRI prefixes removed."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(ln.split(" ", 3)[3] if ln.count(" ") >= 3 else ln for ln in lines)

    def wait_log(self, text: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                time.sleep(0.2)
                return text in self.log()
            time.sleep(0.05)
        return False

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (the kubelet's stop: the daemon's clean shutdown), then SIGKILL on its process group."""
        from tests.support.realplugin import stop_process

        if self.proc is None:
            return None
        stop_process(self.proc, timeout, group=False)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> "MpsDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NodeView:
    """A mount namespace where `hide` is absent (overlays, as MpsDaemon does): the node after the upgrade."""

    _HOLD = _HIDE + r"""
set -e
tmp=$0; hide=$1
hide_files "$tmp" "$hide"
echo ready
exec sleep 3600
"""

    def __init__(self, hide: Sequence[str], work: Path) -> None:
        self.hide, self.work = list(hide), Path(work)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "NodeView":
        self.work.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "bash", "-c", self._HOLD,
                                      str(self.work), " ".join(self.hide)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            self.stop()
            err = self.proc.stderr.read()  # type: ignore[union-attr]
            raise RuntimeError(f"node view not set up: {line!r} {err[-500:]}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def prefix(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "--"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def __enter__(self) -> "NodeView":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
