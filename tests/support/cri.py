"""The real node runtime for tests: containerd and runc (Debian sid's, tools/cri/build.sh) driven
through CRI by a kubelet stand-in, as kubelet drives them.

`Containerd` starts one containerd for one test: its own root, state, sockets and runc root under
the test's directory, the CRI plugin with `enable_cdi` and the test's CDI spec directory, cgroupfs
(not systemd) cgroups, host networking only (no CNI), the two images of tools/cri/images.py
imported with `ctr` (no registry). Closing it stops and removes every pod it ran, then containerd;
nothing it started outlives it (the shims are stopped by their pids).

`Kubelet` is the stand-in: the CRI calls kubelet makes, with what kubelet puts in them --
RunPodSandbox with the cgroupfs driver's cgroup parent (`/kubepods/pod<uid>` for a Guaranteed pod,
the only kind the static CPU manager pins), CreateContainer with the devices of a device plugin's
Allocate (`from_allocate`: DeviceSpecs as CRI Devices, envs, annotations, CDI device names) and the
CDI devices of a DRA claim, StartContainer, and UpdateContainerResources exactly as the static CPU
manager's reconcile loop sends it (kubelet pkg/kubelet/cm/cpumanager `updateContainerCPUSet`:
`ContainerResources{Linux: &LinuxContainerResources{CpusetCpus: cpus.String()}}`, nothing else).

Root only (mknod, cgroups, containerd). `why_not()` says why a machine cannot run it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from tests.support.bundles import REPO

PAUSE = "localhost/gpuwarden/pause:cri"
BUSYBOX = "localhost/gpuwarden/busybox:cri"
V1_DEVICES = "/sys/fs/cgroup/devices"
#: every CRI call's deadline: a hung runtime fails the test, never hangs it
CALL_TIMEOUT = 60.0


class Unavailable(Exception):
    """The runtime cannot be had here; the message says why (tests skip with it)."""


def build(timeout: float = 900.0) -> Path:
    """tools/cri/build.sh (cached): the bin directory with containerd, the shim, ctr, runc, images.tar.
    With $CRI_DEBS (a directory of the .debs, e.g. carried to a host with no network) nothing is fetched."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (containerd and runc create cgroups, mount rootfs, mknod)")
    if not shutil.which("dpkg-deb") or not (shutil.which("apt-get") or os.environ.get("CRI_DEBS")):
        raise Unavailable("no apt-get/dpkg-deb to fetch Debian's containerd and runc (or $CRI_DEBS: the .debs)")
    out = subprocess.run(["bash", str(REPO / "tools/cri/build.sh")], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise Unavailable("tools/cri/build.sh failed: " + out.stderr.strip()[-1500:])
    return Path(out.stdout.strip().splitlines()[-1])


def cgroup_mode() -> str:
    """Which device controller runc uses here: "v1" when /sys/fs/cgroup holds v1 hierarchies (legacy or
    hybrid: the v1 devices controller), "v2" when it is the unified hierarchy (BPF device programs)."""
    return "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1"


def versions(bin_dir: Path) -> dict[str, str]:
    """`containerd --version` and `runc --version`, as run."""
    out = {}
    for name in ("containerd", "runc"):
        r = subprocess.run([str(bin_dir / name), "--version"], capture_output=True, text=True, timeout=30)
        out[name] = r.stdout.strip()
    return out


def _config(work: Path, bin_dir: Path, cdi_dir: Path, state: Path) -> str:
    rt = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{work}/root"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd.sock.ttrpc"
[debug]
  address = "{work}/debug.sock"
  level = "info"
[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/opt"
[{rt}]
  enable_cdi = true
  # an unprivileged-ish root (no CAP_SYS_RESOURCE, as in a container) cannot lower oom_score_adj
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{cdi_dir}"]
  [{rt}.cni]
    bin_dirs = ["{work}/cni/bin"]
    conf_dir = "{work}/cni/conf"
  [{rt}.containerd]
    default_runtime_name = "runc"
    [{rt}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{rt}.containerd.runtimes.runc.options]
        BinaryName = "{bin_dir}/runc"
        Root = "{work}/runc"
        SystemdCgroup = false
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE}"
[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/amd64"
    snapshotter = "native"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


class Containerd:
    """One containerd (CRI plugin, runc, CDI) for one test; a context manager."""

    def __init__(self, bin_dir: Path, work: Path, cdi_dir: Path, state: Path | None = None):
        """`state`: containerd's state directory (default WORK/state); /run/containerd on a node whose
        gpuwarden reads the task's config.json where containerd keeps it."""
        self.bin, self.work, self.cdi_dir = bin_dir, work, cdi_dir
        self.state = state or work / "state"
        self.sock = work / "containerd.sock"
        self.proc: subprocess.Popen | None = None
        self.log = work / "containerd.log"

    def __enter__(self) -> "Containerd":
        self.work.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        for d in ("cni/bin", "cni/conf"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        cfg = self.work / "config.toml"
        cfg.write_text(_config(self.work, self.bin, self.cdi_dir, self.state))
        env = dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(self.bin / "containerd"), "--config", str(cfg)], stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not self.sock.exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise Unavailable("containerd did not start: " + self.log.read_text()[-1500:])
                time.sleep(0.1)
            self.ctr("images", "import", "--snapshotter", "native", "--platform", "linux/amd64", str(self.bin / "images.tar"))
        except BaseException:
            self.close()
            raise
        return self

    def ctr(self, *args: str) -> str:
        out = subprocess.run([str(self.bin / "ctr"), "--address", str(self.sock), "--namespace", "k8s.io", *args],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def shim_pids(self) -> list[int]:
        """The runc shims serving this containerd (their -address names our socket)."""
        pids = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(self.sock).encode() in argv:
                pids.append(int(p.name))
        return pids

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None and self.sock.exists():
            try:
                k = Kubelet(self.sock)
                for pod in k.list_pods():
                    k.stop_pod(pod)
                    k.remove_pod(pod)
                k.close()
            except Exception:  # noqa: BLE001 - best effort; the kills below stop what is left
                pass
        shims = self.shim_pids()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        for pid in shims:
            try:
                os.killpg(pid, signal.SIGKILL)  # a shim leads its own process group
            except OSError:
                pass
        self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RuntimeService:
    """runtime.v1.RuntimeService's unary calls on a channel, from the messages alone: no generated
    gRPC module, so no grpcio version pinned by grpcio-tools (the GPU host has an older grpcio)."""

    def __init__(self, channel: Any, pb: Any):
        self._channel, self._pb = channel, pb

    def __getattr__(self, method: str) -> Any:
        resp = getattr(self._pb, f"{method}Response")
        return self._channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=resp.FromString)


class Kubelet:
    """The kubelet stand-in's CRI side."""

    def __init__(self, sock: Path | str):
        import grpc

        from tests.support.cri_api import cri_v1_pb2 as pb

        self.pb = pb
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        self.rt = _RuntimeService(self.channel, pb)
        self.configs: dict[str, Any] = {}  # pod sandbox id -> its PodSandboxConfig

    def close(self) -> None:
        self.channel.close()

    def version(self) -> dict[str, str]:
        v = self.rt.Version(self.pb.VersionRequest(version="v1"), timeout=CALL_TIMEOUT)
        return {"runtime": v.runtime_name, "version": v.runtime_version, "api": v.runtime_api_version}

    def run_pod(self, name: str, namespace: str = "default", uid: str | None = None,
                parent_prefix: str = "", qos: str = "guaranteed") -> tuple[str, str]:
        """RunPodSandbox as kubelet's cgroupfs driver sends it; (sandbox id, pod uid)."""
        pb = self.pb
        uid = uid or str(uuid.uuid4())
        qos_dir = "" if qos == "guaranteed" else f"/{qos}"
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            log_directory=f"/var/log/pods/{namespace}_{name}_{uid}",
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=f"{parent_prefix}/kubepods{qos_dir}/pod{uid}",
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD))))
        sid = self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=CALL_TIMEOUT).pod_sandbox_id
        self.configs[sid] = cfg
        return sid, uid

    def create(self, sandbox: str, name: str, *, devices: Iterable[tuple[str, str, str]] = (),
               cdi: Iterable[str] = (), envs: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None, command: list[str] | None = None,
               cpuset: str = "", memory_limit: int = 0, mounts: Iterable[tuple[str, str, bool]] = ()) -> str:
        """CreateContainer: devices as (container path, host path, permissions), CDI names, envs,
        annotations, as kubelet builds them from the device manager's and DRA manager's results;
        `memory_limit` as kubelet sends a container's limits.memory (LinuxContainerResources
        memory_limit_in_bytes); `mounts` (container path, host path, read-only) as hostPath volumes."""
        pb = self.pb
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=BUSYBOX),
            command=command or ["/bin/sleep", "3600"],
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],  # bytes in cri-api 0.36
            devices=[pb.Device(container_path=c, host_path=h, permissions=p) for c, h, p in devices],
            mounts=[pb.Mount(container_path=c, host_path=h, readonly=ro) for c, h, ro in mounts],
            CDI_devices=[pb.CDIDevice(name=n) for n in cdi],
            annotations=annotations or {},
            labels={"io.kubernetes.container.name": name},
            log_path=f"{name}/0.log",
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                cpu_shares=1024, cpuset_cpus=cpuset, memory_limit_in_bytes=memory_limit)))
        req = pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=cfg, sandbox_config=self.configs[sandbox])
        return self.rt.CreateContainer(req, timeout=CALL_TIMEOUT).container_id

    def start(self, cid: str) -> None:
        self.rt.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=CALL_TIMEOUT)

    def update_cpuset(self, cid: str, cpus: str) -> None:
        """What the static CPU manager's reconcile sends: the cpuset, and nothing else."""
        pb = self.pb
        self.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus=cpus)), timeout=CALL_TIMEOUT)

    def status(self, cid: str) -> dict[str, Any]:
        r = self.rt.ContainerStatus(self.pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=CALL_TIMEOUT)
        info = {k: json.loads(v) for k, v in r.info.items() if v.startswith("{")}
        return {"state": self.pb.ContainerState.Name(r.status.state), "info": info,
                "cpuset": r.status.resources.linux.cpuset_cpus if r.status.HasField("resources") else None}

    def stop(self, cid: str, timeout: int = 0) -> None:
        self.rt.StopContainer(self.pb.StopContainerRequest(container_id=cid, timeout=timeout), timeout=CALL_TIMEOUT)

    def remove(self, cid: str) -> None:
        self.rt.RemoveContainer(self.pb.RemoveContainerRequest(container_id=cid), timeout=CALL_TIMEOUT)

    def list_pods(self) -> list[str]:
        r = self.rt.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
        return [p.id for p in r.items]

    def stop_pod(self, sid: str) -> None:
        self.rt.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=CALL_TIMEOUT)

    def remove_pod(self, sid: str) -> None:
        self.rt.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=CALL_TIMEOUT)


def pod_cgroup(uid: str, parent_prefix: str = "", qos: str = "guaranteed") -> str:
    """The pod's cgroup (relative to a hierarchy's root) as run_pod names its cgroup parent."""
    qos_dir = "" if qos == "guaranteed" else f"/{qos}"
    return f"{parent_prefix}/kubepods{qos_dir}/pod{uid}".strip("/")


def set_pod_memory_limit(uid: str, limit: int, parent_prefix: str = "") -> Path:
    """What kubelet's pod container manager does for a Guaranteed pod before its sandbox: the pod
    cgroup's memory limit is the sum of its containers' (here: the one container's). The runtime sets
    the container's own from CreateContainer. Returns the file written (v2 memory.max, v1
    memory.limit_in_bytes)."""
    rel = pod_cgroup(uid, parent_prefix)
    if cgroup_mode() == "v2":
        path = Path("/sys/fs/cgroup", rel, "memory.max")
    else:
        path = Path("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes")
    path.write_text(str(limit))
    return path


def container_memory(cgroup: str) -> dict[str, int | None]:
    """The container cgroup's memory limit and usage as the kernel keeps them (v2 memory.max and
    memory.current, v1 memory.limit_in_bytes and memory.usage_in_bytes); None where unreadable."""
    if cgroup_mode() == "v2":
        base, files = Path("/sys/fs/cgroup", cgroup.strip("/")), ("memory.max", "memory.current", "memory.peak")
    else:
        base = Path("/sys/fs/cgroup/memory", cgroup.strip("/"))
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes")
    out: dict[str, int | None] = {}
    for key, name in zip(("limit", "current", "peak"), files):
        try:
            text = (base / name).read_text().strip()
            out[key] = None if text == "max" else int(text)
        except (OSError, ValueError):
            out[key] = None
    return out


def host_python_mounts(*extra: str | os.PathLike[str]) -> list[tuple[str, str, bool]]:
    """Read-only hostPath mounts that let the node's own python3 (and what it imports) run in a busybox
    container, as a node-like setup: /usr, /lib, /lib64 (the interpreter, the C and GL libraries, the
    NVIDIA driver's user-space libraries), the loader's cache, the interpreter's prefix where it is not
    under /usr (a virtual environment or a pyenv build), and `extra` (the repository, carried wheels).
    Each at its host path, so sys.executable and PYTHONPATH mean the same inside."""
    import sys

    paths: list[str] = []
    for p in ("/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/glvnd", sys.base_prefix, sys.prefix,
              os.path.dirname(os.path.realpath(sys.executable)), *map(str, extra)):
        p = os.path.normpath(p)
        if not os.path.exists(p) or any(p == q or p.startswith(q + "/") for q in paths):
            continue
        paths = [q for q in paths if not q.startswith(p + "/")] + [p]
    return [(p, p, True) for p in paths]


HOST = "/gwhost"


def host_python_beside(argv: list[str], *extra: str | os.PathLike[str],
                       pythonpath: Iterable[str] = ()) -> tuple[list[str], list[tuple[str, str, bool]], dict[str, str]]:
    """The node's python3 in a container whose /usr belongs to something else (a CDI spec mounting the
    driver's libraries and binaries there): the same host paths as host_python_mounts, mounted read-only
    under /gwhost, and the interpreter started through the host's loader with the container's own
    /usr/lib/x86_64-linux-gnu first on the library path (so libcuda and NVML are the ones the container
    was given). `argv`: the host's command (its paths are prefixed). Returns (command, mounts, env)."""
    import sys

    mounts = [(HOST + h, h, ro) for _, h, ro in host_python_mounts(*extra)]
    arch = "x86_64-linux-gnu"
    conf = _ld_conf_dirs()  # the host's own (e.g. /usr/local/nvidia/lib64 for its driver): its ld.so.cache is not there
    libs = [f"/usr/lib/{arch}", *conf, f"{HOST}/usr/lib/{arch}", f"{HOST}/lib/{arch}", *(HOST + d for d in conf),
            f"{HOST}{sys.base_prefix}/lib"]
    loader = HOST + os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    cmd = [loader, "--library-path", ":".join(dict.fromkeys(libs)), HOST + os.path.realpath(argv[0])] + [
        HOST + a if a.startswith("/") and os.path.exists(a) else a for a in argv[1:]]
    env = {"PYTHONHOME": HOST + sys.base_prefix,
           "PYTHONPATH": ":".join(HOST + d for d in pythonpath if d.startswith("/"))}
    return cmd, mounts, env


def _ld_conf_dirs() -> list[str]:
    """The library directories /etc/ld.so.conf names (with its include files), in order."""
    import glob

    out: list[str] = []

    def read(path: str) -> None:
        try:
            lines = open(path).read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                for f in sorted(glob.glob(line.split(None, 1)[1])):
                    read(f)
            elif line.startswith("/") and line not in out:
                out.append(line)

    read("/etc/ld.so.conf")
    return out


class FifoWorker:
    """A line-protocol worker (tools/gpu: one command per line in, one JSON line out) that is a CRI
    container's own process: `argv` becomes the container's command with its stdin a FIFO and its stdout
    a file in `io_dir`, which is mounted into the container at the same path. The test writes commands
    to the FIFO and reads the answers from the file; no CRI streaming (Attach) is needed."""

    def __init__(self, io_dir: Path, argv: list[str]):
        self.dir = io_dir
        io_dir.mkdir(parents=True, exist_ok=True)
        self.fifo, self.out, self.err = io_dir / "cmd", io_dir / "out", io_dir / "err"
        for f in (self.fifo, self.out, self.err):
            f.unlink(missing_ok=True)
        os.mkfifo(self.fifo, 0o600)
        self.out.touch()
        # O_RDWR: the open does not wait for the container's reader, and the worker never sees EOF early
        self.fd = os.open(self.fifo, os.O_RDWR | os.O_CLOEXEC)
        self._pos = 0
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        self.command = ["/bin/sh", "-c", f"exec {quoted} <{self.fifo} >{self.out} 2>{self.err}"]
        self.mount = (str(io_dir), str(io_dir), False)

    def read(self, timeout: float = 60.0) -> dict:
        """The next JSON line the worker wrote; {"error": ...} at the deadline."""
        end = time.monotonic() + timeout
        while True:
            with open(self.out, "rb") as fh:
                fh.seek(self._pos)
                line = fh.readline()
            if line.endswith(b"\n"):
                self._pos += len(line)
                try:
                    return json.loads(line)
                except ValueError:
                    return {"error": line.decode(errors="replace")[-500:]}
            if time.monotonic() > end:
                err = self.err.read_text(errors="replace")[-1500:] if self.err.exists() else ""
                return {"error": f"no answer within {timeout:.0f}s; stderr: {err}"}
            time.sleep(0.05)

    def cmd(self, line: str, timeout: float = 60.0) -> dict:
        try:
            os.write(self.fd, (line + "\n").encode())
        except OSError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return self.read(timeout)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def from_allocate(resp: Any) -> dict[str, Any]:
    """A device plugin's ContainerAllocateResponse as kubelet hands it to CreateContainer
    (pkg/kubelet/cm/devicemanager: DeviceSpecs -> Devices, Envs, Annotations, CDIDevices)."""
    return {
        "devices": [(d.container_path, d.host_path, d.permissions) for d in resp.devices],
        "envs": dict(resp.envs),
        "annotations": dict(resp.annotations),
        "cdi": [d.name for d in resp.cdi_devices],
    }


def cdi_spec(kind: str, devices: dict[str, list[dict]], common: list[dict]) -> dict:
    """A CDI spec (0.6.0) of the shape `nvidia-ctk cdi generate` writes: per-device nodes, and the
    node-wide ones (nvidiactl, nvidia-uvm...) in containerEdits. Each node: path, hostPath, type,
    major, minor."""
    return {"cdiVersion": "0.6.0", "kind": kind,
            "devices": [{"name": n, "containerEdits": {"deviceNodes": nodes}} for n, nodes in devices.items()],
            "containerEdits": {"deviceNodes": common}}


def v1_devices_list(cgroup: str) -> list[str] | None:
    """A cgroup's v1 devices.list (cgroup relative to the devices hierarchy), None when absent."""
    try:
        return Path(V1_DEVICES, cgroup.strip("/"), "devices.list").read_text().split("\n")[:-1]
    except OSError:
        return None


def remove_cgroups(top: str) -> list[str]:
    """rmdir a scratch cgroup subtree in every hierarchy, leaves first; what could not go."""
    left = []
    for mnt in Path("/sys/fs/cgroup").iterdir():
        base = mnt / top.strip("/")
        if not base.is_dir():
            continue
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [base]:
            try:
                d.rmdir()
            except OSError:
                left.append(str(d))
    return left
