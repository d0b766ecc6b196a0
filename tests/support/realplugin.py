"""The real NVIDIA k8s-device-plugin binary for tests: find it, unpack it, run it isolated, always stop it.

The binary is not in this repository. It is looked up, in order, at `$GPUWARDEN_DEVICE_PLUGIN`
(the binary, its `.xz`, or a directory holding the `.xz` and `SHA256SUMS`) and at
`../shared/tools/nvidia-device-plugin/` beside the repository. The `.xz` is decompressed
(stdlib lzma) into `$GPUWARDEN_CACHE/nvidia-device-plugin/` or a temp dir, and its SHA-256 checked
against `SHA256SUMS` before it runs. `Unavailable` says why when it cannot run; tests skip with it.

The plugin always serves on `/var/lib/kubelet/device-plugins/nvidia-gpu.sock` (a constant in its
code; only `--kubelet-socket` moves). So it runs in a private mount namespace (`unshare -m`, or
`-Urm` when not root) where a test directory is bind-mounted on /var/lib: nothing is written
outside the test's directory. `dev_nodes` gives it a tmpfs /dev holding only the named device
nodes (root only, mknod): the view of a plugin that started before a node existed (incident 1).
`drop_caps` removes capabilities from its bounding set before it starts, as the upstream Helm
chart's `capabilities: drop: ["ALL"]` does: measured on an H100 (driver 580.159.04), a plugin that
keeps CAP_MKNOD has NVML re-create /dev/nvidia-uvm (and nvidia-caps) in its own /dev when it
initialises, so incident 1 needs a plugin without it.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

REPO = Path(__file__).resolve().parents[2]
ENV_BINARY = "GPUWARDEN_DEVICE_PLUGIN"
DEFAULT_DIR = REPO.parent / "shared/tools/nvidia-device-plugin"
BINARY = "nvidia-device-plugin"
#: the plugin's socket inside its namespace; its kubelet.sock sits beside it
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


class Unavailable(Exception):
    """The real plugin cannot run here; the message says why (tests skip with it)."""


def _sums(d: Path) -> dict[str, str]:
    out = {}
    f = d / "SHA256SUMS"
    if f.is_file():
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[1].lstrip("*")] = parts[0].lower()
    return out


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def locate(name: str = BINARY) -> tuple[Path, str | None]:
    """(the binary `name` or its .xz, its expected SHA-256 or None); raises Unavailable.

    `name` is the plugin (default) or another binary of the same release beside it (mps-control-daemon)."""
    given = os.environ.get(ENV_BINARY)
    where = Path(given) if given else DEFAULT_DIR
    if where.is_file() and name != BINARY:  # $GPUWARDEN_DEVICE_PLUGIN names the plugin's file: look beside it
        where = where.parent
    if where.is_dir():
        xz = sorted(where.glob(f"{name}*.xz")) or sorted(p for p in where.glob(f"{name}*") if p.is_file() and os.access(p, os.X_OK))
        if not xz:
            raise Unavailable(f"no {name}*.xz in {where}")
        return xz[0], _sums(where).get(name)
    if where.is_file():
        return where, _sums(where.parent).get(name)
    how = f"${ENV_BINARY}={given}" if given else f"{where} (set ${ENV_BINARY} to point elsewhere)"
    raise Unavailable(f"the real device plugin is not at {how}")


def unpack(cache: str | os.PathLike[str] | None = None, name: str = BINARY) -> Path:
    """The runnable binary `name`, decompressed once into the cache and checked; raises Unavailable."""
    src, want = locate(name)
    if src.suffix != ".xz":
        got = _sha256(src)
        if want and got != want:
            raise Unavailable(f"{src}: SHA-256 {got} does not match SHA256SUMS ({want})")
        return src
    base = Path(cache or os.environ.get("GPUWARDEN_CACHE") or tempfile.gettempdir()) / "nvidia-device-plugin"
    out = base / (want or _sha256(src))[:16] / name
    if out.is_file() and (not want or _sha256(out) == want):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    try:
        with lzma.open(src) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    except (OSError, lzma.LZMAError) as exc:
        raise Unavailable(f"cannot decompress {src}: {exc}") from None
    got = _sha256(tmp)
    if want is None:
        raise Unavailable(f"{src.parent}/SHA256SUMS lists no {name}: refusing to run an unchecked binary")
    if got != want:
        tmp.unlink()
        raise Unavailable(f"{src} decompresses to SHA-256 {got}, SHA256SUMS says {want}")
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def build_shim(source: Path, out_dir: Path, soname: str | None = None, libs: Sequence[str] = ()) -> Path:
    """Compile a shared library from one C file with gcc; raises Unavailable without a compiler."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise Unavailable("no C compiler (gcc/cc) to build the NVML library the plugin loads")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (soname or source.stem + ".so")
    cmd = [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(source)]
    if soname:
        cmd.insert(3, f"-Wl,-soname,{soname}")
    p = subprocess.run(cmd + list(libs), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise Unavailable(f"{' '.join(cmd)} failed: {p.stderr[-500:]}")
    return out


def namespace_prefix() -> list[str]:
    """`unshare` arguments for a private mount namespace here; raises Unavailable when none can be made."""
    if shutil.which("unshare") is None:
        raise Unavailable("no `unshare` to give the plugin a private mount namespace")
    prefix = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else \
        ["unshare", "-Urm", "--propagation", "private"]
    p = subprocess.run(prefix + ["true"], capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        raise Unavailable(f"cannot create a mount namespace ({' '.join(prefix)}): {p.stderr.strip()[-300:]}")
    return prefix


# runs inside the new mount namespace: $0 = /var/lib stand-in ("" = keep), $1 = device nodes
# ("" = keep /dev), then the plugin's argv
_SETUP = r"""
set -e
varlib=$0; nodes=$1; shift
if [ -n "$varlib" ]; then mount --bind "$varlib" /var/lib; fi
if [ -n "$nodes" ]; then
  mount -t tmpfs -o mode=755 tmpfs /dev
  mknod -m 666 /dev/null c 1 3
  for n in $nodes; do IFS=: read -r name maj min <<< "$n"; mknod -m 666 "/dev/$name" c "$maj" "$min"; done
fi
exec "$@"
"""


CAP_MKNOD = 27
# execs argv[2:] after dropping the comma-separated capability numbers in argv[1] from the bounding set
# (PR_CAPBSET_DROP = 24); root's permitted and effective sets after execve are then without them
_DROP = ("import ctypes, os, sys\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "for c in filter(None, sys.argv[1].split(',')):\n"
         "    if libc.prctl(24, int(c), 0, 0, 0) != 0:\n"
         "        raise OSError(ctypes.get_errno(), f'PR_CAPBSET_DROP {c}')\n"
         "os.execv(sys.argv[2], sys.argv[2:])\n")


def capabilities(pid: int) -> dict[str, int]:
    """CapInh/CapPrm/CapEff/CapBnd/CapAmb of a process, as integers."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cap"):
                k, v = line.split(":", 1)
                out[k] = int(v.strip(), 16)
    return out


def stop_process(proc: subprocess.Popen, timeout: float, group: bool = True) -> None:
    """SIGTERM to its process group (or to it alone, as the kubelet stops a container's first process),
    then SIGKILL to the group when it has not exited within `timeout`."""
    if proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


class RealPlugin:
    """One run of the real plugin; a context manager that always stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: Path, args: Sequence[str] = (), *, var_lib: str | os.PathLike[str] | None = None,
                 dev_nodes: Sequence[tuple[str, int, int]] | None = None, env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike[str] | None = None, drop_caps: Sequence[int] = ()) -> None:
        self.binary = Path(binary)
        self.args = list(args)
        self.var_lib = os.fspath(var_lib) if var_lib is not None else ""
        self.dev_nodes = dev_nodes
        self.env = dict(env or {})
        self.drop_caps = list(drop_caps)
        self._own_log = not log_path  # a temp log of ours is removed by stop(); read it before
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="gw-plugin-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        """The plugin's own pid (unshare execs bash, which execs (python, which execs) the plugin)."""
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> "RealPlugin":
        if self.var_lib:
            os.makedirs(os.path.join(self.var_lib, "kubelet/device-plugins"), exist_ok=True)
        nodes = " ".join(f"{n}:{a}:{b}" for n, a, b in self.dev_nodes) if self.dev_nodes else ""
        run = [str(self.binary), *self.args]
        if self.drop_caps:
            run = [sys.executable, "-c", _DROP, ",".join(map(str, self.drop_caps))] + run
        argv = namespace_prefix() + ["bash", "-c", _SETUP, self.var_lib, nodes, *run]
        env = dict(os.environ, **self.env)
        self._log = open(self.log_path, "ab")
        self.started_at = time.time()
        # unshare, bash and the plugin exec one another: one pid, its own session so stop() can kill the group
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, text: str, timeout: float = 20.0) -> bool:
        """True once the plugin's log contains `text`; False at the deadline or when it exited."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return text in self.log()
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        stop_process(self.proc, timeout)
        self._log.close()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> "RealPlugin":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> str:
        return " ".join(shlex.quote(a) for a in [str(self.binary), *self.args])


@contextmanager
def plugin_kit(prefix: str = "gw-plugin-kit-") -> Iterator[tuple[Path, Path, Path]]:
    """(binary, fake NVML dir, injection shim) for the real plugin on a machine without a GPU, in a
    temporary directory removed afterwards; raises Unavailable when the plugin cannot run here."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        binary = unpack()
        fake = build_shim(REPO / "tests/support/nvml_fake.c", work / "fake", soname="libnvidia-ml.so.1")
        shim = build_shim(REPO / "tools/gpu/nvml_inject_shim.c", work / "shim", libs=["-ldl"])
        namespace_prefix()
        yield binary, fake.parent, shim
    finally:
        shutil.rmtree(work, ignore_errors=True)
