"""The container image, built from ./Dockerfile and run with a real OCI runtime, no Docker engine.

`build()` runs tools/image/build.sh (mmdebstrap base, `buildah bud`, an OCI image layout);
`Image.unpack()` turns the layout into a runtime bundle with umoci; `Image.spec()` writes an OCI
runtime config for one container (args, user, capabilities, read-only root, bind mounts) and
`Container` runs it with runc or crun under its own state directory, killable and bounded.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 900
RUNTIMES = ("runc", "crun")
# every capability in bit order, as runc names them without the CAP_ prefix
ALL_CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
            "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
            "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE "
            "AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ "
            "PERFMON BPF CHECKPOINT_RESTORE").split()


def privileged_caps() -> list[str]:
    """A privileged container's capabilities: all that this process's bounding set still holds."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            bits = int(line.split()[1], 16)
            return [name for i, name in enumerate(ALL_CAPS) if bits >> i & 1]
    return []


# what a runtime says when the machine, not the image, is the problem (crun 1.8 on hybrid cgroups)
CANNOT_RUN = ("cgroups in hybrid mode not supported",)


class ImageUnavailable(RuntimeError):
    """The image cannot be built or run on this machine; the message says why."""


def build() -> str:
    """The OCI layout reference (oci:DIR:TAG) of the image built from ./Dockerfile."""
    if os.geteuid() != 0:
        raise ImageUnavailable("building the image needs root (buildah chroot isolation, mmdebstrap)")
    if shutil.which("apt-get") is None and shutil.which("buildah") is None:
        raise ImageUnavailable("no buildah and no apt-get to install it")
    try:
        p = subprocess.run(["bash", str(REPO / "tools/image/build.sh")], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ImageUnavailable(f"tools/image/build.sh did not finish within {BUILD_TIMEOUT_S} s") from None
    if p.returncode != 0:
        raise ImageUnavailable("tools/image/build.sh failed:\n" + "\n".join(p.stderr.splitlines()[-15:]))
    return p.stdout.strip().splitlines()[-1]


@dataclass
class Image:
    ref: str  # oci:DIR:TAG
    bundle: Path

    @classmethod
    def unpack(cls, ref: str, dest: Path) -> "Image":
        _, layout, tag = ref.split(":", 2)
        p = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(dest)], capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise ImageUnavailable(f"umoci unpack failed: {p.stderr.strip()[-500:]}")
        return cls(ref, dest)

    @property
    def rootfs(self) -> Path:
        return self.bundle / "rootfs"

    def base_config(self) -> dict:
        return json.loads((self.bundle / "config.json").read_text())

    def entrypoint(self) -> list[str]:
        """The image's ENTRYPOINT (umoci puts ENTRYPOINT + CMD in process.args; CMD is 3 words here)."""
        return self.base_config()["process"]["args"][:1]

    def spec(self, args: list[str], *, user: int = 0, caps: list[str] | None = None, readonly: bool = False,
             binds: dict[str, str] | None = None, writable: dict[str, str] | None = None,
             host_network: bool = False, host_pid: bool = False) -> dict:
        """An OCI runtime config: `args` after the ENTRYPOINT, as a Kubernetes pod spec would set it.

        `binds` are read-only bind mounts (container path: host path), `writable` read-write ones;
        `host_network` and `host_pid` leave out those namespaces (hostNetwork, hostPID).
        """
        c = copy.deepcopy(self.base_config())
        c["root"] = {"path": str(self.rootfs), "readonly": readonly}
        proc = c["process"]
        proc["terminal"] = False
        proc["args"] = [*self.entrypoint(), *args]
        proc["user"] = {"uid": user, "gid": 0}
        if caps is not None:
            names = [f"CAP_{x.upper()}" for x in caps]
            proc["capabilities"] = {"bounding": names, "effective": names, "permitted": names,
                                    "inheritable": [], "ambient": []}
        for dest, src in (binds or {}).items():
            c["mounts"].append({"destination": dest, "type": "bind", "source": src, "options": ["rbind", "ro"]})
        for dest, src in (writable or {}).items():
            c["mounts"].append({"destination": dest, "type": "bind", "source": src, "options": ["rbind", "rw"]})
        shared = {"network", "uts"} if host_network else set()  # the kubelet shares UTS with hostNetwork
        shared |= {"pid"} if host_pid else set()
        c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] not in shared]
        if "uts" in shared:
            c.pop("hostname", None)  # a hostname needs a UTS namespace of its own
        return c


class Container:
    """One container run by an OCI runtime (runc or crun), its state kept under `workdir`."""

    def __init__(self, runtime: str, spec: dict, workdir: Path) -> None:
        if shutil.which(runtime) is None:
            raise ImageUnavailable(f"{runtime} is not installed")
        self.runtime, self.id = runtime, f"gpuwarden-{uuid.uuid4().hex[:10]}"
        self.bundle = workdir / self.id
        self.bundle.mkdir(parents=True)
        (self.bundle / "config.json").write_text(json.dumps(spec))
        self.state = workdir / f"{runtime}-state"
        self.state.mkdir(exist_ok=True)
        self.proc: subprocess.Popen | None = None

    def argv(self, *cmd: str) -> list[str]:
        return [self.runtime, "--root", str(self.state), *cmd]

    def run(self, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run to completion (create, start, wait, delete): its exit code, stdout and stderr."""
        try:
            p = subprocess.run(self.argv("run", "--bundle", str(self.bundle), self.id), capture_output=True,
                               text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            if p.returncode != 0 and not p.stdout and any(m in p.stderr for m in CANNOT_RUN):
                raise ImageUnavailable(f"{self.runtime} cannot run containers on this machine: {p.stderr.strip()}")
            return p
        except subprocess.TimeoutExpired:
            self.kill("KILL")
            raise
        finally:
            self.delete()

    def start(self, stdout, stderr) -> None:
        """Run in the background (attached: its output goes to the given files)."""
        self.proc = subprocess.Popen(self.argv("run", "--bundle", str(self.bundle), self.id), stdout=stdout,
                                     stderr=stderr, stdin=subprocess.DEVNULL)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, as the kubelet does; SIGKILL after `timeout`. The exit code."""
        assert self.proc is not None
        self.kill("TERM")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill("KILL")
            return self.proc.wait(10)
        finally:
            self.delete()

    def kill(self, signal: str) -> None:
        subprocess.run(self.argv("kill", self.id, signal), capture_output=True, timeout=10)

    def delete(self) -> None:
        subprocess.run(self.argv("delete", "--force", self.id), capture_output=True, timeout=10)


def wait_http(url: str, timeout: float) -> tuple[int, str]:
    """(status, body) of the first answer from `url` within `timeout` seconds."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise TimeoutError(f"{url}: no answer within {timeout} s ({last})")
