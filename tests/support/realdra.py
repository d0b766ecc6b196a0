"""The real NVIDIA DRA kubelet plugin (`gpu-kubelet-plugin`) for tests: find it, unpack it, run it, always stop it.

The binary is not in this repository. It is looked up at `$GPUWARDEN_DRA_PLUGIN` (the binary, its
`.xz`, or a directory holding the `.xz` and `SHA256SUMS`), else at
`../shared/tools/nvidia-dra-driver-gpu/` beside the repository; the `.xz` is decompressed into
`$GPUWARDEN_CACHE/gpu-kubelet-plugin/` and checked against `SHA256SUMS` before it runs.
`realplugin.Unavailable` says why when it cannot run; tests skip with it, loudly.

What it needs (learned from its code at 95932046 and by running it): a kubeconfig (its
ResourceSlice controller waits for resource.k8s.io/v1 before NewDriver returns, but its gRPC
servers, registration and DRA, are up before that), `--image-name` (required), a CDI root it
writes the per-claim specs to, and a driver root (`--container-driver-root`, also its `/dev` when
`<root>/dev` exists) holding `libnvidia-ml.so.1` in a standard library directory and an
`nvidia-smi`: on the GPU machine `/`, elsewhere `fake_driver_root()` with tests/support/nvml_fake.c
(one fake H100) or tools/gpu/nvml_hang_shim.c (nvmlInit never returns: incident 5a). The
nvidia-cdi-hook path is only written into its specs. It runs through `realplugin.RealPlugin`
(a private mount namespace; `dev_nodes` and `drop_caps` as for the device plugin).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Sequence

from tests.support import realplugin
from tests.support.realplugin import Unavailable

REPO = Path(__file__).resolve().parents[2]
ENV_BINARY = "GPUWARDEN_DRA_PLUGIN"
DEFAULT_DIR = REPO.parent / "shared/tools/nvidia-dra-driver-gpu"
BINARY = "gpu-kubelet-plugin"
DRIVER = "gpu.nvidia.com"
LIBDIR = "usr/lib/x86_64-linux-gnu"


def unpack(cache: str | os.PathLike[str] | None = None) -> Path:
    """The runnable plugin, decompressed once and checked against SHA256SUMS; raises Unavailable."""
    given = os.environ.get(ENV_BINARY)
    where = Path(given) if given else DEFAULT_DIR
    old = os.environ.get(realplugin.ENV_BINARY)
    os.environ[realplugin.ENV_BINARY] = str(where)
    try:
        if not where.exists():
            raise Unavailable(f"the real DRA plugin is not at {where} (set ${ENV_BINARY} to point elsewhere)")
        return realplugin.unpack(cache, name=BINARY)
    finally:
        if old is None:
            os.environ.pop(realplugin.ENV_BINARY, None)
        else:
            os.environ[realplugin.ENV_BINARY] = old


def fake_driver_root(dest: Path, nvml_source: Path, dev_nodes: bool = True) -> Path:
    """A driver root for a machine without a GPU: the given NVML stand-in as libnvidia-ml.so.1, a stub
    nvidia-smi, and a dev/ (the plugin's device root then) with nvidiactl, nvidia0 and nvidia-uvm when root
    may mknod them; without them the plugin refuses to write a claim's spec ("empty device edits")."""
    lib = realplugin.build_shim(nvml_source, dest / "build" / nvml_source.stem, soname="libnvidia-ml.so.1")
    (dest / LIBDIR).mkdir(parents=True, exist_ok=True)
    shutil.copy2(lib, dest / LIBDIR / "libnvidia-ml.so.1")
    # its CDI spec lists the driver's libraries by the driver version NVML reports (nvml_fake.c: 570.999.01):
    # without them the plugin refuses to write a claim's spec
    for name in ("libnvidia-ml.so.570.999.01", "libcuda.so.570.999.01"):
        shutil.copy2(lib, dest / LIBDIR / name)
    (dest / "usr/bin").mkdir(parents=True, exist_ok=True)
    smi = dest / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    if dev_nodes:
        (dest / "dev").mkdir(exist_ok=True)
        # the nodes a claim's spec names (root only: mknod); the plugin stats them, nothing opens them
        for name, major, minor in (("nvidiactl", 195, 255), ("nvidia0", 195, 0), ("nvidia-uvm", 511, 0)):
            try:
                os.mknod(dest / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            except FileExistsError:
                pass
            except OSError:
                break
    return dest


def kubeconfig(path: Path, server: str = "https://127.0.0.1:1", token: str = "none", ca: str | None = None) -> Path:
    """A kubeconfig for the plugin; the default points nowhere (the plugin then serves its sockets and waits)."""
    cluster = f"{{server: \"{server}\", certificate-authority: \"{ca}\"}}" if ca else \
        f"{{server: \"{server}\", insecure-skip-tls-verify: true}}"
    path.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: " + cluster + "\n"
                    "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
                    f"users:\n- name: u\n  user: {{token: \"{token}\"}}\n")
    return path


def args(node: str, kubelet_root: Path, cdi_root: Path, driver_root: str | Path, kubeconfig_path: Path,
         extra: Sequence[str] = (), verbosity: int = 6) -> list[str]:
    """The plugin's command line, as the Helm chart sets it, with every path under the test's own directories.

    Creates the kubelet's plugins_registry (the kubelet's, not the plugin's, to create)."""
    (kubelet_root / "plugins_registry").mkdir(parents=True, exist_ok=True)
    return ["--node-name", node, "--kubeconfig", str(kubeconfig_path), "--cdi-root", str(cdi_root),
            "--kubelet-plugins-directory-path", str(kubelet_root / "plugins"),
            "--kubelet-registrar-directory-path", str(kubelet_root / "plugins_registry"),
            "--nvidia-driver-root", str(driver_root), "--container-driver-root", str(driver_root),
            "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--image-name", "gpuwarden.test/none:0",
            "-v", str(verbosity), *extra]


def sockets(kubelet_root: Path) -> tuple[Path, Path]:
    """(registration socket, DRA socket) the plugin serves under kubelet_root."""
    return kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock", kubelet_root / "plugins" / DRIVER / "dra.sock"


def workdir() -> Path:
    """A short directory (socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix="gwdra", dir="/tmp"))


def host_nvml() -> str:
    """The host's libnvidia-ml.so.1 (from the dynamic linker's cache, else the usual places); "" if none."""
    import subprocess

    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        if "libnvidia-ml.so.1 " in line and "x86-64" in line and "=>" in line:
            return line.split("=>", 1)[1].strip()
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"):
        if os.path.exists(f"{d}/libnvidia-ml.so.1"):
            return f"{d}/libnvidia-ml.so.1"
    return ""


def host_driver_root(work: Path) -> str:
    """`/` when the plugin finds the host's NVML and nvidia-smi there (its search: the standard library
    directories and bin directories under the driver root); else a driver root of links to them (no
    dev/, so its device root stays the host's /dev). Raises Unavailable without an NVIDIA driver."""
    lib = host_nvml()
    smi = shutil.which("nvidia-smi") or ""
    if not lib or not smi:
        raise Unavailable(f"no NVIDIA driver here (libnvidia-ml.so.1: {lib or 'none'}, nvidia-smi: {smi or 'none'})")
    std_lib = any(os.path.exists(f"/{d}/libnvidia-ml.so.1") for d in (LIBDIR, "usr/lib64", "lib64"))
    if std_lib and os.path.dirname(smi) in ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/opt/bin"):
        return "/"
    root = work / "driver-root"
    (root / LIBDIR).mkdir(parents=True, exist_ok=True)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    # every file beside the NVML and nvidia-smi found: its CDI spec also needs libcuda.so.<driver version> & co
    for src_dir, dst_dir in ((os.path.dirname(lib), root / LIBDIR), (os.path.dirname(smi), root / "usr/bin")):
        for name in sorted(os.listdir(src_dir)):
            dst = dst_dir / name
            if not dst.exists() and not dst.is_symlink():
                dst.symlink_to(os.path.realpath(os.path.join(src_dir, name)))
    return str(root)
