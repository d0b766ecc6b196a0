"""Incidents 1, 2, 3 and 5a through the real node runtime on the GPU host (issue 42).

Debian sid's containerd 2.1 and runc 1.3 (tools/cri/build.sh; on a host with no network the .debs
come from $CRI_DEBS), driven through CRI by the kubelet stand-in (tests/support/cri.py): pods under
`/kubepods/pod<uid>` (the cgroupfs driver's Guaranteed parent), containerd's state in /run/containerd
(where gpuwarden reads the task's config.json), the node CDI spec written by the real `nvidia-ctk cdi
generate` into /var/run/cdi/nvidia.yaml (hooks disabled: the busybox image has no ldconfig), the
kubelet's files (static CPU manager, the device-manager checkpoint with each container's Allocate
response) in /var/lib/kubelet. A CUDA worker (tools/gpu/cuda_worker.py) placed in each container's
cgroup says what CUDA and NVML get under runc's real device program; `gpuwarden check --root /`
reads the host. Everything written is removed afterwards; the GPU's settings are never changed.

- ``cri-update-keeps-devices``: a pod per form (DeviceSpecs, CDI names in CDI_devices, CDI names in
  an annotation), the static CPU manager's UpdateContainerResources (cpuset only) on each; CUDA
  before and after. Expect: no finding; cuInit 0 after the update in every form.
- ``cri-cdi-uvm-missing``: the node spec generated while /dev (a private tmpfs) had no nvidia-uvm,
  a pod given `nvidia.com/gpu=<uuid>` through CDI_devices as the plugin's cdi-cri strategy does.
  Expect GPU-DEV-001 confirmed, the spec named as the cause (`stale-cdi-spec`), regenerate as the fix.
- ``cri-plugin-uvm-stale`` (incident 1, /dev snapshot form): the real device plugin started in a /dev
  without nvidia-uvm (no CAP_MKNOD); the device-plugin stand-in admits a pod through it and the CRI
  stand-in creates it with the Allocate's DeviceSpecs. Expect GPU-DEV-001 confirmed, cause `stale-plugin`,
  restart the plugin as the fix; after the restart and a new pod, CUDA works and nothing is said.
- ``cri-plugin-nvml-hang`` (incident 5a): the real plugin's NVML hung (tools/gpu/nvml_inject_shim.c); two
  admissions block in GetPreferredAllocation, so the CRI stand-in creates no pod. Expect GPU-K8S-001.
- ``cri-memory-escape`` (incident 4): a pod whose memory limit containerd set from CreateContainer, its own
  process tools/gpu/gl_worker.py creating EGL framebuffers on a full GPU. Expect GPU-NODE-001 confirmed
  naming the pod while its memory.current stays under the limit.
- ``cri-hook-v2-update``: the legacy hook's cgroup v2 program (libnvidia-container's AddDeviceRules, done by
  tests/support/devprog.add_device_rules) through the static CPU manager's update. Expect: kept, nothing
  said; then runc rc9x's re-apply by hand: GPU-DEV-002 confirmed.
- ``cri-dra-healthy``, ``cri-dra-stale-major``, ``cri-dra-uvm-missing``, ``cri-dra-teardown``: claims the
  real DRA kubelet plugin prepared, their CDI device IDs in CreateContainer, resolved by containerd's own CDI
  handling; tools/gpu/cuda_worker.py in the container. Expect quiet, GPU-DRA-011, GPU-DRA-010.
"""

from __future__ import annotations

import base64
import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORK = Path("/tmp/gw-cri")
STATE = Path("/run/containerd")
CDI_DIR = Path("/var/run/cdi")
SPEC = CDI_DIR / "nvidia.yaml"
KUBELET = Path("/var/lib/kubelet")
CTK_DIRS = (REPO / ".ctk", REPO.parent / "shared/tools/nvidia-container-toolkit")


def _ctk() -> Path:
    """The real nvidia-ctk, unpacked from its .xz after its SHA-256 is checked."""
    import hashlib

    for d in CTK_DIRS:
        xz = sorted(d.glob("nvidia-ctk-*.xz"))
        if not xz:
            continue
        sums = {ln.split()[1].lstrip("*"): ln.split()[0] for ln in (d / "SHA256SUMS").read_text().splitlines() if ln.strip()}
        want = sums.get(xz[0].name)
        if want and hashlib.sha256(xz[0].read_bytes()).hexdigest() != want:
            raise RuntimeError(f"{xz[0]}: SHA-256 does not match SHA256SUMS")
        out = WORK / "nvidia-ctk"
        WORK.mkdir(parents=True, exist_ok=True)
        out.write_bytes(lzma.decompress(xz[0].read_bytes()))
        out.chmod(0o755)
        return out
    raise RuntimeError(f"no nvidia-ctk .xz in {', '.join(map(str, CTK_DIRS))}")


def _generate_spec(without_uvm: bool, minor: int) -> str:
    """`nvidia-ctk cdi generate` into SPEC; without_uvm: in a private mount namespace whose /dev
    (tmpfs) holds only null, nvidiactl and the GPU's node: a node where nvidia-uvm did not exist yet."""
    import sys

    from tests.support.realplugin import _DROP, CAP_MKNOD

    gen = [str(_ctk()), "cdi", "generate", "--disable-hook", "all", f"--output={SPEC}"]
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    if without_uvm:
        # without CAP_MKNOD: NVML re-creates a missing /dev/nvidia-uvm when it can (measured on an H100,
        # tests/support/realplugin.py), which the node of the incident had not done yet
        script = ("mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/nvidiactl c 195 255 "
                  f'&& mknod -m 666 /dev/nvidia{minor} c 195 {minor} && exec "$@"')
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                sys.executable, "-c", _DROP, str(CAP_MKNOD), *gen]
    else:
        argv = gen
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"nvidia-ctk cdi generate failed: {p.stderr[-1500:]}")
    return p.stderr[-1500:]


def _kubelet_files(pods: list[dict], gpu: str) -> None:
    """config.yaml (static CPU manager, cgroupfs), cpu_manager_state, and the device manager's
    checkpoint with each container's Allocate response, as kubelet writes them."""
    from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp

    (KUBELET / "device-plugins").mkdir(parents=True, exist_ok=True)
    (KUBELET / "config.yaml").write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                         "cgroupDriver: cgroupfs\ncpuManagerPolicy: static\n")
    (KUBELET / "cpu_manager_state").write_text(json.dumps({"policyName": "static", "defaultCpuSet": "1-15", "checksum": 0}))
    entries = []
    for p in pods:
        a = p["alloc"]
        resp = dp.ContainerAllocateResponse(
            envs=a["envs"], annotations=a["annotations"],
            devices=[dp.DeviceSpec(container_path=c, host_path=h, permissions=m) for c, h, m in a["devices"]],
            cdi_devices=[dp.CDIDevice(name=n) for n in a["cdi"]])
        entries.append({"PodUID": p["uid"], "ContainerName": p.get("container", "worker"), "ResourceName": "nvidia.com/gpu",
                        "DeviceIDs": {"-1": [gpu]}, "AllocResp": base64.b64encode(resp.SerializeToString()).decode()})
    (KUBELET / "device-plugins/kubelet_internal_checkpoint").write_text(
        json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"nvidia.com/gpu": [gpu]}}, "Checksum": 0}))


def _alloc(form: str, gpu: str, minor: int) -> dict[str, Any]:
    """What the device plugin's Allocate returns in each device-list strategy (k8s-device-plugin v0.20)."""
    name = f"nvidia.com/gpu={gpu}"
    if form == "devicespecs":  # PASS_DEVICE_SPECS=true, envvar
        nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", f"/dev/nvidia{minor}"]
        return {"devices": [(n, n, "rw") for n in nodes], "envs": {"NVIDIA_VISIBLE_DEVICES": gpu}, "annotations": {},
                "cdi": []}
    if form == "cdi-cri":
        return {"devices": [], "envs": {}, "annotations": {}, "cdi": [name]}
    if form == "cdi-annotations":
        return {"devices": [], "envs": {}, "annotations": {"cdi.k8s.io/nvidia-device-plugin_gpu": name}, "cdi": []}
    raise ValueError(form)


class Session:
    """containerd + the stand-in for one scenario; close() removes everything it made."""

    def __init__(self) -> None:
        from tests.support import cri

        self.cri = cri
        self.created_state = not STATE.exists()
        self.spec_backup = SPEC.read_bytes() if SPEC.exists() else None
        self.kubelet_existed = KUBELET.exists()
        self.bin = cri.build()
        self.versions = cri.versions(self.bin)
        shutil.rmtree(WORK / "containerd", ignore_errors=True)
        self.pods: list[dict] = []
        self.c = cri.Containerd(self.bin, WORK / "containerd", CDI_DIR, state=STATE)
        try:
            self.c.__enter__()
            self.k = cri.Kubelet(self.c.sock)
        except BaseException:
            self.c.close()
            if self.created_state:
                shutil.rmtree(STATE, ignore_errors=True)
            raise

    def pod(self, form: str, name: str, gpu: str, minor: int) -> dict:
        a = _alloc(form, gpu, minor)
        sid, uid = self.k.run_pod(name, namespace="ml")
        cid = self.k.create(sid, "worker", devices=a["devices"], cdi=a["cdi"], envs=a["envs"], annotations=a["annotations"])
        self.k.start(cid)
        p = {"form": form, "name": name, "uid": uid, "sandbox": sid, "id": cid, "alloc": a,
             "cgroup": f"/sys/fs/cgroup/kubepods/pod{uid}/{cid}"}
        self.pods.append(p)
        return p

    def admitted(self, standin: Any, name: str, out: dict | None = None) -> dict | None:
        """What kubelet does for a GPU pod: the device manager's admission through the real plugin
        (GetPreferredAllocation, Allocate; no deadline), then, only once it returned, the pod through CRI
        with the Allocate's DeviceSpecs and envs. None (and `out["admission"]` says why) when it failed."""
        from tests.support import cri

        out = out if out is not None else {}
        uid = str(uuid.uuid4())
        out["uid"] = uid
        try:
            a = standin.admit(uid, "worker")
        except Exception as exc:  # noqa: BLE001 - a hung admission ends when the plugin stops: UNAVAILABLE
            out["admission"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return None
        out["admission"] = "returned"
        alloc = cri.from_allocate(a.response)
        sid, _ = self.k.run_pod(name, namespace="ml", uid=uid)
        cid = self.k.create(sid, "worker", devices=alloc["devices"], cdi=alloc["cdi"], envs=alloc["envs"],
                            annotations=alloc["annotations"])
        self.k.start(cid)
        p = {"form": "devicespecs", "name": name, "uid": uid, "sandbox": sid, "id": cid, "alloc": alloc,
             "cgroup": f"/sys/fs/cgroup/kubepods/pod{uid}/{cid}"}
        self.pods.append(p)
        out["pod"] = p
        return p

    def drop(self, p: dict) -> None:
        self.k.stop_pod(p["sandbox"])
        self.k.remove_pod(p["sandbox"])
        self.pods.remove(p)
        for d in (Path(p["cgroup"]), Path(p["cgroup"]).parent):
            try:
                d.rmdir()
            except OSError:
                pass

    def worker(self, p: dict) -> dict:
        """A CUDA/NVML attempt from inside the container's cgroup (runc's device program applies)."""
        from tests.gpu import validate as v

        w, out = v.start_worker([f"{p['cgroup']}/cgroup.procs"])
        w.kill()
        w.wait()
        return out

    def check(self, *flags: str) -> dict:
        from tests.gpu import validate as v

        env = {"PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        report, err, dt = v.gpuwarden("/", *flags, env=env)
        return {"findings": v.summarize(report), "raw": report, "check_seconds": round(dt, 3), "stderr": err[-1500:]}

    def close(self) -> None:
        try:
            for p in self.pods:
                try:
                    self.k.stop_pod(p["sandbox"])
                    self.k.remove_pod(p["sandbox"])
                except Exception:  # noqa: BLE001 - containerd's close removes what is left
                    pass
            self.k.close()
        finally:
            self.c.close()
            for p in self.pods:
                for d in (Path(p["cgroup"]), Path(p["cgroup"]).parent):
                    try:
                        d.rmdir()
                    except OSError:
                        pass
            try:
                Path("/sys/fs/cgroup/kubepods").rmdir()
            except OSError:
                pass
            if self.spec_backup is None:
                SPEC.unlink(missing_ok=True)
            else:
                SPEC.write_bytes(self.spec_backup)
            if self.created_state:
                shutil.rmtree(STATE, ignore_errors=True)
            if not self.kubelet_existed:
                shutil.rmtree(KUBELET, ignore_errors=True)


def _gpu() -> tuple[str, int]:
    from tests.gpu import validate as v

    gpu = v.gpu_uuid()
    minor = None
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        text = info.read_text()
        if gpu in text:
            for line in text.splitlines():
                if line.startswith("Device Minor:"):
                    minor = int(line.split(":", 1)[1])
    return gpu, minor if minor is not None else 0


def _fail_unless(res: dict, checks: dict[str, bool]) -> dict:
    res["checks"] = checks
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        res["error"] = "checks failed: " + ", ".join(bad)
    return res


def update_keeps_devices() -> dict:
    gpu, minor = _gpu()
    res: dict[str, Any] = {"scenario": "cri-update-keeps-devices", "expect": None,
                           "injected": "pods created through CRI in three device-list forms, then the static CPU "
                                       "manager's UpdateContainerResources (cpuset only) on each"}
    s = Session()
    try:
        res["versions"] = s.versions
        res["cdi_generate"] = _generate_spec(False, minor)
        res["spec_device_nodes"] = sorted({d["path"] for d in _spec_nodes()})
        forms = {}
        for form in ("devicespecs", "cdi-cri", "cdi-annotations"):
            p = s.pod(form, f"gpu-{form}", gpu, minor)
            forms[form] = {"before": s.worker(p)}
        _kubelet_files(s.pods, gpu)
        for p in s.pods:
            s.k.update_cpuset(p["id"], "0")
            forms[p["form"]]["after"] = s.worker(p)
            forms[p["form"]]["cpuset"] = s.k.status(p["id"])["cpuset"]
            forms[p["form"]]["config_devices"] = _config_devices(p["id"])
        res["forms"] = forms
        got = s.check()
        probe = s.check("--probe-access")
        res.update(findings=got["findings"], check_seconds=got["check_seconds"], stderr=got["stderr"],
                   probe_access_findings=probe["findings"])
        res["worker"] = forms["cdi-cri"]["after"]
        dev = [f for f in got["findings"] + probe["findings"] if f["code"].startswith("GPU-DEV")]
        return _fail_unless(res, {
            "cuda_ok_before_and_after_in_every_form": all(f["before"].get("cuInit") == 0 and f["after"].get("cuInit") == 0
                                                          for f in forms.values()),
            "cpuset_updated": all(f["cpuset"] == "0" for f in forms.values()),
            "no_device_finding": not dev,
        })
    finally:
        s.close()


def cdi_uvm_missing() -> dict:
    gpu, minor = _gpu()
    res: dict[str, Any] = {"scenario": "cri-cdi-uvm-missing", "expect": "GPU-DEV-001",
                           "injected": "node CDI spec generated by nvidia-ctk while /dev had no nvidia-uvm; a pod "
                                       f"given nvidia.com/gpu={gpu} through CRI CDI_devices (cdi-cri)"}
    s = Session()
    try:
        res["versions"] = s.versions
        res["cdi_generate"] = _generate_spec(True, minor)
        res["spec_device_nodes"] = sorted({d["path"] for d in _spec_nodes()})
        p = s.pod("cdi-cri", "gpu-cdi-nouvm", gpu, minor)
        _kubelet_files(s.pods, gpu)
        res["worker"] = s.worker(p)
        res["config_devices"] = _config_devices(p["id"])
        got = s.check()
        res.update(findings=got["findings"], check_seconds=got["check_seconds"], stderr=got["stderr"])
        f1 = [f for f in got["raw"].get("findings", []) if f["code"] == "GPU-DEV-001"]
        res["dev001"] = f1
        return _fail_unless(res, {
            "spec_lacks_uvm": "/dev/nvidia-uvm" not in res["spec_device_nodes"],
            "cuda_fails": res["worker"].get("cuInit") not in (0, None),
            "confirmed": bool(f1) and f1[0]["status"] == "confirmed",
            "cause_is_the_spec": bool(f1) and f1[0]["data"].get("cause") == "stale-cdi-spec",
            "fix_is_regenerate": bool(f1) and "nvidia-ctk cdi generate" in (f1[0].get("remedy") or ""),
        })
    finally:
        s.close()


def _kubelet_config() -> None:
    """kubelet's config.yaml and cpu_manager_state (the device-manager checkpoint is the stand-in's)."""
    (KUBELET / "device-plugins").mkdir(parents=True, exist_ok=True)
    (KUBELET / "config.yaml").write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                         "cgroupDriver: cgroupfs\ncpuManagerPolicy: static\n")
    (KUBELET / "cpu_manager_state").write_text(json.dumps({"policyName": "static", "defaultCpuSet": "1-15", "checksum": 0}))


def plugin_uvm_stale() -> dict:
    """Incident 1 in the /dev snapshot form: the real plugin started while its /dev had no nvidia-uvm."""
    from tests.gpu import plugin_scenarios as ps
    from tests.support.kubelet_standin import KubeletStandIn
    from tests.support.realplugin import CAP_MKNOD

    _, minor = _gpu()
    binary, _ = ps._kit()
    res: dict[str, Any] = {"scenario": "cri-plugin-uvm-stale", "expect": "GPU-DEV-001",
                           "injected": "the real device plugin (--pass-device-specs, no CAP_MKNOD) started in a /dev "
                                       f"(tmpfs) with only nvidiactl and nvidia{minor}; a pod admitted through it by the "
                                       "stand-in and created through CRI with its Allocate's DeviceSpecs"}
    ps._clean_node()
    s = Session()
    ps.KDIR.mkdir(parents=True, exist_ok=True)
    k = KubeletStandIn(ps.KDIR).start()
    plugin = None
    try:
        res["versions"] = s.versions
        _kubelet_config()
        plugin = ps._plugin(binary, "cri-uvm-stale", ["--pass-device-specs"],
                            dev_nodes=[("nvidiactl", 195, 255), (f"nvidia{minor}", 195, minor)], drop_caps=[CAP_MKNOD])
        ps._registered(k, plugin)
        res["plugin_pid"], res["plugin_dev"] = plugin.pid, sorted(os.listdir(f"/proc/{plugin.pid}/root/dev"))
        p = s.admitted(k, "gpu-stale-plugin")
        assert p is not None
        k.write_checkpoint()
        res["allocate_devices"] = [h for _, h, _ in p["alloc"]["devices"]]
        res["worker"] = s.worker(p)
        res["config_devices"] = _config_devices(p["id"])
        got = s.check()
        res.update(findings=got["findings"], check_seconds=got["check_seconds"], stderr=got["stderr"])
        f1 = [f for f in got["raw"].get("findings", []) if f["code"] == "GPU-DEV-001"]
        res["dev001"] = f1
        # the fix: the plugin restarted with the host's /dev, the pod recreated from a new Allocate
        s.drop(p)
        k.forget(p["uid"])
        plugin.stop()
        n = len(k.registrations)
        plugin = ps._plugin(binary, "cri-uvm-restarted", ["--pass-device-specs"])
        ps._registered(k, plugin, after=n)
        p2 = s.admitted(k, "gpu-restarted-plugin")
        assert p2 is not None
        k.write_checkpoint()
        fixed = {"allocate_devices": [h for _, h, _ in p2["alloc"]["devices"]], "worker": s.worker(p2),
                 "config_devices": _config_devices(p2["id"])}
        got2 = s.check()
        fixed.update(findings=got2["findings"], check_seconds=got2["check_seconds"])
        res["fixed"] = fixed
        d = f1[0] if f1 else {}
        serious = [f for f in fixed["findings"] if f["severity"] in ("medium", "high", "critical")]
        return _fail_unless(res, {
            "plugin_dev_lacks_uvm": "nvidia-uvm" not in res["plugin_dev"],
            "allocate_lacks_uvm": "/dev/nvidia-uvm" not in res["allocate_devices"],
            "config_lacks_uvm": not any(c.startswith("/dev/nvidia-uvm ") for c in res["config_devices"]),
            "cuda_fails": res["worker"].get("cuInit") not in (0, None),
            "confirmed": d.get("status") == "confirmed",
            "cause_is_the_plugin": (d.get("data") or {}).get("cause") == "stale-plugin"
                                   and (d.get("data") or {}).get("stale_plugin") is True,
            "fix_is_restart": "Restart the device-plugin pod" in (d.get("remedy") or "")
                              and "nvidia-ctk" not in (d.get("remedy") or ""),
            "fixed_allocate_has_uvm": "/dev/nvidia-uvm" in fixed["allocate_devices"],
            "fixed_cuda_works": fixed["worker"].get("cuInit") == 0,
            "fixed_gpuwarden_quiet": not serious,
        })
    finally:
        if plugin is not None:
            plugin.stop()
        k.stop()
        s.close()
        ps._clean_node()


def plugin_nvml_hang() -> dict:
    """Incident 5a through the stand-in: the real plugin's NVML hung; kubelet's admission blocks."""
    from tests.gpu import plugin_scenarios as ps
    from tests.support.kubelet_standin import KubeletStandIn

    binary, shim = ps._kit()
    trigger = ps.WORK / "cri-nvml-hang"
    trigger.unlink(missing_ok=True)
    klog = ps.WORK / "cri-kubelet.log"
    klog.unlink(missing_ok=True)
    res: dict[str, Any] = {"scenario": "cri-plugin-nvml-hang", "expect": "GPU-K8S-001",
                           "injected": f"LD_PRELOAD={shim.name} on the real plugin only; nvmlInit blocks once {trigger} "
                                       "exists; two pods admitted through the stand-in, each created through CRI only "
                                       "once its admission returned"}
    ps._clean_node()
    s = Session()
    ps.KDIR.mkdir(parents=True, exist_ok=True)
    k = KubeletStandIn(ps.KDIR, log_path=str(klog)).start()
    plugin = None
    outs: list[dict] = [{}, {}]
    threads: list[threading.Thread] = []
    try:
        res["versions"] = s.versions
        _kubelet_config()
        plugin = ps._plugin(binary, "cri-nvml-hang", ["--pass-device-specs"],
                            env={"LD_PRELOAD": str(shim), "GW_NVML_HANG_FILE": str(trigger)})
        ps._registered(k, plugin)
        before = set(s.k.list_pods())
        trigger.touch()
        for i, o in enumerate(outs):
            threads.append(threading.Thread(target=s.admitted, args=(k, f"gpu-5a-{i}", o), daemon=True))
            threads[-1].start()
            time.sleep(0.5)
        time.sleep(5.5)
        res["pending_after_6s"] = [t.is_alive() for t in threads]
        res["sandboxes_created"] = sorted(set(s.k.list_pods()) - before)
        report, res["findings"], res["check_seconds"], res["stderr"] = ps._check(
            "--kubelet-log", str(klog), "--stall-seconds", "5")
        res["kubelet_log"] = klog.read_text()[-3000:]
        res["plugin_log_tail"] = plugin.log()[-1500:]
        k001 = [f for f in res["findings"] if f["code"] == "GPU-K8S-001"]
        res["k001"] = k001
        return _fail_unless(res, {
            "admissions_hang": res["pending_after_6s"] == [True, True],
            "no_pod_created": res["sandboxes_created"] == [],
            "k001_confirmed": bool(k001) and k001[0]["status"] == "confirmed",
            "check_within_deadline": res["check_seconds"] < 60,
        })
    finally:
        if plugin is not None:
            plugin.stop()
        for t in threads:
            t.join(10)
        res["admissions_after_plugin_stop"] = [o.get("admission", "pending") for o in outs]
        k.stop()
        trigger.unlink(missing_ok=True)
        s.close()
        ps._clean_node()


GIB = 1 << 30
TOOLS = REPO / "tools/gpu"
#: what cri-memory-escape launches: the GPU filler (a host process) and the graphics worker (the container's);
#: a development host's stand-in run replaces both (tests/interop/test_cri_runtime.py)
FILL = [str(TOOLS / "gpu_fill.py"), "1.5"]
GL_WORKER = [str(TOOLS / "gl_worker.py")]


def _host_gpu_devices() -> list[tuple[str, str, str]]:
    """Every NVIDIA and DRI character node of the host as CRI Devices: what a graphics pod gets from the
    device plugin with NVIDIA_DRIVER_CAPABILITIES including graphics (the toolkit adds nvidia-modeset and
    the DRI nodes for it)."""
    import stat

    out = []
    for d in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev/dri").glob("*")):
        try:
            if stat.S_ISCHR(d.stat().st_mode):
                out.append((str(d), str(d), "rw"))
        except OSError:
            continue
    return out


def _pythonpath_dirs() -> list[str]:
    return [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d and os.path.isdir(d)]


def _container_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The env a worker needs inside the container: the carried wheels' PYTHONPATH (mounted at the same
    path), the loader's path where the host sets one, unbuffered output."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    env.update(extra or {})
    return env


def memory_escape(fbs: int = 48, step: int = 8, limit: int = 2 * GIB) -> dict:
    """Incident 4 in a real container whose memory limit containerd set (issue 42): the GPU's memory filled
    with plain cudaMalloc (tools/gpu/gpu_fill.py, 1.5 GiB left, a host process), then pod viz/render-0 through
    CRI -- kubelet's pod limit, CreateContainer with memory_limit_in_bytes, the host's NVIDIA/DRI nodes as
    DeviceSpecs, the node's python3 and libraries from read-only hostPath mounts -- whose own process is
    tools/gpu/gl_worker.py, told through a FIFO to create `fbs` 4096x4096 EGL framebuffers, `step` at a time.
    gpuwarden is sampled in-process after each step (as the agent does) and run as the CLI; the agent's
    dry-run plan is recorded. Expect: the container's memory.current stays under the limit runc set, host
    memory falls by more than the limit, GPU-NODE-001 CONFIRMED naming viz/render-0."""
    from gpuwarden.memory.trend import MemoryHistory

    import memory_scenarios as ms
    import memprobe as M
    from tests.support import cri

    gpu, _ = _gpu()
    res: dict[str, Any] = {"scenario": "cri-memory-escape", "expect": "GPU-NODE-001",
                           "injected": f"GPU memory filled (1.5 GiB left); pod viz/render-0 created through CRI with "
                                       f"memory_limit_in_bytes={limit} creates {fbs} 4096x4096 EGL framebuffers, {step} at "
                                       "a time, from tools/gpu/gl_worker.py as the container's process"}
    procs: list[Any] = []
    w = None
    s = Session()
    try:
        res["versions"] = s.versions
        res["gap_idle"] = ms.in_process()["gap"]
        fill = ms.Proc([sys.executable, *FILL])
        procs.append(fill)
        res["fill"] = fill.first
        sid, uid = s.k.run_pod("render-0", namespace="viz")
        pod_limit = cri.set_pod_memory_limit(uid, limit)
        w = cri.FifoWorker(WORK / "io-render", [sys.executable, *GL_WORKER])
        devices = _host_gpu_devices()
        cid = s.k.create(sid, "render", devices=devices, envs=_container_env(ms.gl_env()), memory_limit=limit,
                         command=w.command, mounts=cri.host_python_mounts(REPO, *_pythonpath_dirs()) + [w.mount])
        s.k.start(cid)
        cg = f"{cri.pod_cgroup(uid)}/{cid}"
        pod = {"form": "devicespecs", "name": "render-0", "uid": uid, "sandbox": sid, "id": cid, "container": "render",
               "alloc": {"devices": devices, "envs": {"NVIDIA_VISIBLE_DEVICES": gpu}, "annotations": {}, "cdi": []},
               "cgroup": _cgroup_dir(cg)}
        s.pods.append(pod)
        _kubelet_files(s.pods, gpu)
        res["devices"] = [h for _, h, _ in devices]
        res["worker"] = w.read(120)
        res["container_procs"] = Path(pod["cgroup"], "cgroup.procs").read_text().split()
        res["limits"] = {"container": cri.container_memory(cg), "pod": pod_limit.read_text().strip(),
                         "config_json": ((json.loads((STATE / "io.containerd.runtime.v2.task/k8s.io" / cid / "config.json")
                                                      .read_text()).get("linux") or {}).get("resources") or {}).get("memory")}
        if "error" in res["worker"] or not res["worker"].get("ready"):
            res["error"] = f"GL worker in the container: {res['worker']}"
            return res
        free0 = M.meminfo()["MemFree"]
        hist = MemoryHistory(100, window_s=8.0, growth_bytes_per_min=256 * (1 << 20), clock=time.monotonic)
        samples = [ms.in_process(hist)]
        first: dict[str, float] = {}
        t0 = time.monotonic()
        for _ in range(fbs // step):
            r = w.cmd(f"fb {step}", timeout=120)
            time.sleep(1.0)
            smp = ms.in_process(hist)
            smp["worker"] = {k: r.get(k) for k in ("counts", "seconds", "error")}
            smp["memfree_drop"] = free0 - smp["MemFree"]
            smp["container"] = cri.container_memory(cg)
            samples.append(smp)
            st = (smp["finding"] or {}).get("status")
            if st and st not in first:
                first[st] = round(smp["t"] - t0, 3)
            ms.log(f"  fb {smp['worker']['counts']}: MemFree -{smp['memfree_drop'] / GIB:.2f} GiB, container "
                   f"{(smp['container']['current'] or 0) / GIB:.2f} GiB of {limit / GIB:.1f}, {st or 'no finding'}")
            if r.get("error"):
                break
        res["samples"] = samples
        res["first_status_after_s"] = first
        res["memfree_drop"] = free0 - M.meminfo()["MemFree"]
        res["nvml"] = M.nvml_processes()
        c = ms.cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["check_seconds"] = c["seconds"]
        res["findings"] = ms.findings(c.get("report", {}))
        res["stderr"] = c["stderr"]
        res["text"] = ms.cli("check", "--root", "/", "--no-color", "--select", "GPU-NODE").get("stdout", "")
        dry = subprocess.run([sys.executable, "-m", "gpuwarden", "agent", "--root", "/", "--no-kube", "--listen", "",
                              "--select", "GPU-NODE", "--interval", "1s", "--cycles", "3", "--remediate", "dry-run",
                              "--boot-grace", "0s", "--memory-local-kill", "--log-format", "text"],
                             capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ms.src_path()))
        res["agent_dry_run"] = (dry.stdout + dry.stderr)[-3000:]
        peak = max((x.get("container") or {}).get("current") or 0 for x in samples)
        res["container_current_peak"] = peak
        f = [x for x in res["findings"] if x["code"] == "GPU-NODE-001" and x["status"] == "confirmed"]
        return _fail_unless(res, {
            "limit_set_by_runc": res["limits"]["container"]["limit"] == limit,
            "limit_in_config_json": (res["limits"]["config_json"] or {}).get("limit") == limit,
            "worker_is_the_containers_process": len(res["container_procs"]) >= 1,
            "container_stays_under_its_limit": 0 < peak < limit,
            "host_memory_fell_more_than_the_limit": res["memfree_drop"] > limit,
            "named_the_pod": bool(f) and any(a.endswith(":viz/render-0") for a in f[0]["affected"]),
            # the evidence that the limit could not stop it: the pod's charge beside its limit (rules/memory.py)
            "evidence_has_the_charge_under_the_limit": bool(f) and any(
                "viz/render-0 is charged" in e and "of its limit" in e for e in f[0]["evidence"]),
        })
    finally:
        if w is not None:
            w.cmd("quit", timeout=5)
            w.close()
        for pr in procs:
            pr.stop()
        s.close()
        shutil.rmtree(WORK / "io-render", ignore_errors=True)


def _programs(cgroup: str) -> list[dict]:
    """The device programs attached to the cgroup itself (direct query): id, name, code digest."""
    import hashlib

    from gpuwarden.bpf.syscall import query_cgroup_device, read_program

    out = []
    for i in query_cgroup_device(cgroup, effective=False).prog_ids:
        info = read_program(i)
        out.append({"id": i, "name": info.name, "insns": len(info.xlated) // 8,
                    "sha256": hashlib.sha256(info.xlated).hexdigest()[:16]})
    return out


def hook_v2_update() -> dict:
    """The legacy NVIDIA hook's form on cgroup v2 through CRI (issue 42, item 4). A pod created with
    NVIDIA_VISIBLE_DEVICES only (the envvar strategy: no GPU node in linux.devices, so runc's own program
    denies them); then, as libnvidia-container's prestart hook does on v2 (src/nvcgo/internal/cgroup/v2.go
    AddDeviceRules, tests/support/devprog.py add_device_rules), runc's program replaced by one whose GPU
    allow rules are prepended to runc's code read back from the kernel, and the GPU's nodes made in the
    container's /dev (its mount step bind-mounts them; mknod gives the same nodes). Then the static CPU manager's
    UpdateContainerResources (cpuset only): runc 1.3 skips devices on update (runc update.go sets
    SkipDevices, runc#2994, v1.0.0), so the hook's program stays and CUDA keeps working; gpuwarden quiet.
    Then what runc 1.0.0-rc9x's update did instead (re-applied runc's own program from the spec, replacing
    the single program attached) is done by hand: CUDA fails and gpuwarden must confirm the loss
    (GPU-DEV-002) without naming the CPU manager as its cause on this runc."""
    from gpuwarden.bpf.syscall import query_cgroup_device, read_program
    from tests.support import cri, devprog

    gpu, minor = _gpu()
    from tests.gpu import validate as v

    uvm = v.uvm_major()
    rules = ["c 195:255 rw", f"c 195:{minor} rw", f"c {uvm}:0 rw", f"c {uvm}:1 rw"]
    nodes = {"nvidiactl": (195, 255), f"nvidia{minor}": (195, minor), "nvidia-uvm": (uvm, 0), "nvidia-uvm-tools": (uvm, 1)}
    res: dict[str, Any] = {"scenario": "cri-hook-v2-update", "expect": None,
                           "injected": "a hook-form pod (NVIDIA_VISIBLE_DEVICES only); runc's device program replaced "
                                       f"as libnvidia-container's AddDeviceRules does ({', '.join(rules)} prepended); "
                                       "the static CPU manager's UpdateContainerResources"}
    if cri.cgroup_mode() != "v2":
        res["error"] = "not a cgroup v2 host: the hook's v2 path (a BPF program) does not apply"
        return res
    harden = Path("/proc/sys/net/core/bpf_jit_harden")
    res["bpf_jit_harden"] = harden.read_text().strip() if harden.exists() else None
    s = Session()
    try:
        res["versions"] = s.versions
        sid, uid = s.k.run_pod("gpu-hook", namespace="ml")
        cid = s.k.create(sid, "worker", envs={"NVIDIA_VISIBLE_DEVICES": gpu, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})
        s.k.start(cid)
        p = {"form": "hook", "name": "gpu-hook", "uid": uid, "sandbox": sid, "id": cid,
             "alloc": {"devices": [], "envs": {"NVIDIA_VISIBLE_DEVICES": gpu}, "annotations": {}, "cdi": []},
             "cgroup": f"/sys/fs/cgroup/kubepods/pod{uid}/{cid}"}
        s.pods.append(p)
        _kubelet_files(s.pods, gpu)
        cg = p["cgroup"]
        res["config_devices"] = _config_devices(cid)
        res["runc_program"] = _programs(cg)
        res["before_hook"] = s.worker(p)
        runc_ids = query_cgroup_device(cg, effective=False).prog_ids
        runc_code = [read_program(i).xlated for i in runc_ids]
        try:
            res["hook_program_ids"] = devprog.add_device_rules(cg, devprog.rules(*rules))
        except OSError as exc:  # a hardened host (bpf_jit_harden=2) refuses code read back: so would the real hook
            res["error"] = f"the hook's program could not be built here: {type(exc).__name__}: {exc}"
            return res
        res["hook_program"] = _programs(cg)
        # and, as its mount step does (nvc_mount.c), the GPU's nodes in the container's /dev
        init = Path(cg, "cgroup.procs").read_text().split()[0]
        for name, (ma, mi) in nodes.items():
            os.mknod(f"/proc/{init}/root/dev/{name}", 0o20666, os.makedev(ma, mi))
        res["container_dev"] = sorted(n for n in os.listdir(f"/proc/{init}/root/dev") if n.startswith("nvidia"))
        res["after_hook"] = s.worker(p)
        s.k.update_cpuset(cid, "0")
        res["cpuset"] = s.k.status(cid)["cpuset"]
        res["after_update_program"] = _programs(cg)
        res["after_update"] = s.worker(p)
        got = s.check()
        probe = s.check("--probe-access")
        res.update(findings=got["findings"], check_seconds=got["check_seconds"], stderr=got["stderr"],
                   probe_access_findings=probe["findings"])
        # what runc 1.0.0-rc93..rc95's update did here: runc's own program (from the spec) in place of the one
        # attached (BPF_F_REPLACE; rc92 attached it beside, which the kernel ANDs: the same denial)
        old_fds = [devprog.load_program(code, name="runc_rc9x") for code in runc_code]
        try:
            from gpuwarden.bpf.syscall import prog_fd_by_id

            for i in query_cgroup_device(cg, effective=False).prog_ids:
                fd = prog_fd_by_id(i)
                try:
                    devprog.detach(cg, fd)
                finally:
                    os.close(fd)
            for fd in old_fds:
                devprog.attach(cg, fd, multi=True)
        finally:
            for fd in old_fds:
                os.close(fd)
        old = {"program": _programs(cg), "worker": s.worker(p)}
        lost = s.check()
        old["findings"] = lost["findings"]
        f2 = [f for f in lost["raw"].get("findings", []) if f["code"] == "GPU-DEV-002"]
        old["dev002"] = f2
        res["emulated_rc9x_update"] = old
        dev = [f for f in got["findings"] + probe["findings"] if f["code"].startswith("GPU-DEV")]
        return _fail_unless(res, {
            "spec_has_no_gpu_node": not any(c.startswith("/dev/nvidia") for c in res["config_devices"]),
            "runc_program_denies_before_the_hook": res["before_hook"].get("cuInit") not in (0, None),
            "hook_program_allows": res["after_hook"].get("cuInit") == 0,
            "one_program_after_the_hook": len(res["hook_program"]) == 1,
            "cpuset_updated": res["cpuset"] == "0",
            "update_left_the_hooks_program": res["after_update_program"] == res["hook_program"],
            "cuda_ok_after_update": res["after_update"].get("cuInit") == 0,
            # a live check does not know runc's version: the hook-only container is at most a LOW "not sure"
            # (run 21a had it MEDIUM, "will drop them", on runc 1.3.6, which keeps them)
            "nothing_at_medium_or_above": not [f for f in dev if f.get("severity") in ("medium", "high", "critical")],
            "rc9x_update_drops_the_gpu": old["worker"].get("cuInit") not in (0, None),
            "loss_confirmed": bool(f2) and f2[0]["status"] == "confirmed",
            # the loss's cause names the CPU manager's update only with runc's version hedged (it is not known here)
            "cause_hedged_without_runc_version": bool(f2) and (
                (f2[0].get("data") or {}).get("cause") != "static-cpu-manager"
                or "runc version unknown" in f2[0].get("summary", "")),
        })
    finally:
        s.close()


# --- the DRA forms through containerd's own CDI handling, with the real DRA kubelet plugin ------------------

#: the session the cri-dra-* scenarios share, in order: {"ds": dra_scenarios.Session, "s": Session, "dsm": module}
_DRA: dict[str, Any] = {}


def _dra() -> dict[str, Any]:
    """The real DRA kubelet plugin (tests/gpu/dra_scenarios.py's Session: test API server, the plugin with the
    host's driver root, the kubelet DRA stand-in on /var/lib/kubelet, claim specs in /var/run/cdi), and
    containerd whose CRI plugin resolves CDI names in /var/run/cdi (enable_cdi)."""
    if not _DRA:
        import dra_scenarios as dsm

        ds = dsm.Session()
        try:
            ds.start_plugin("cri-healthy")
            ds.register()
            s = Session()
        except BaseException:
            ds.close()
            raise
        _DRA.update(ds=ds, s=s, dsm=dsm)
    return _DRA


def _cgroup_dir(rel: str) -> str:
    """The container's cgroup whose device policy applies: the unified hierarchy's (v2), else the v1
    devices controller's (a development host's dry run)."""
    from tests.support import cri

    return f"/sys/fs/cgroup/{rel}" if cri.cgroup_mode() == "v2" else f"{cri.V1_DEVICES}/{rel}"


def _strip_hooks(spec: Path) -> list[str]:
    """The claim spec without its createContainer hooks (nvidia-cdi-hook, which this host does not have):
    the devices, mounts and env stay as the plugin wrote them. Returns the hook argvs removed."""
    import yaml

    doc = yaml.safe_load(spec.read_text())
    gone = []
    for edits in [doc.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in doc.get("devices") or []]:
        gone += [" ".join(h.get("args") or [h.get("path", "")]) for h in edits.pop("hooks", None) or []]
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return gone


def _dra_container(tag: str, *, edit: Any = None, expect_cuda: bool = True) -> dict:
    """One pod dra-<tag> with claim gpu-<tag> on the GPU: allocated (the harness as scheduler), prepared by the
    real plugin, then RunPodSandbox with the API pod's uid and CreateContainer with the claim's CDI device
    IDs in CDI_devices, as kubelet passes them; containerd resolves them in the plugin's claim spec.
    `edit(spec_path)` changes the spec between prepare and create. The container's own process is
    tools/gpu/cuda_worker.py (the node's python3 and driver libraries from read-only hostPath mounts);
    where the spec as written cannot create a container here, the attempts that follow are recorded."""
    from tests.support import cri

    d = _dra()
    ds, s, dsm = d["ds"], d["s"], d["dsm"]
    pool, devs = dsm._pool_devices(ds.slices(wait_for=1))
    if not devs:
        raise RuntimeError(f"no ResourceSlice devices published; plugin log: {ds.plugin.log()[-1500:]}")
    pod_uid = str(uuid.uuid4())
    claim_uid, ids, prep_s = ds.prepare_claim(tag, devs[0], pool, pod_uid, "cuda")
    spec = next(iter(sorted(CDI_DIR.glob(f"*{claim_uid}*"))), None)
    out: dict[str, Any] = {"pod": f"{dsm.NS}/dra-{tag}", "pod_uid": pod_uid, "claim": f"{dsm.NS}/gpu-{tag}",
                           "claim_uid": claim_uid, "device": devs[0], "cdi_ids": ids, "prepare_s": round(prep_s, 3),
                           "spec": str(spec), "spec_as_written": spec.read_text() if spec else None}
    if spec is None:
        raise RuntimeError(f"the plugin wrote no claim spec for {claim_uid} in {CDI_DIR}")
    if edit is not None:
        out["edit"] = edit(spec)
        time.sleep(1.0)  # containerd's CDI cache refreshes on the file's change (fsnotify)
    sid, _ = s.k.run_pod(f"dra-{tag}", namespace=dsm.NS, uid=pod_uid)
    io = WORK / f"io-{tag}"
    attempts = []
    cid = None
    for how in ("spec as written, node's python3 beside", "hooks removed, node's python3 beside",
                "hooks removed, busybox only (CUDA tried from the host in the container's cgroup)"):
        if how.startswith("hooks removed") and "hooks_removed" not in out:
            out["hooks_removed"] = _strip_hooks(spec)
            time.sleep(1.0)
        w = kw = None
        if "python3" in how:  # beside the spec's own /usr: the node's python3 under /gwhost (cri.host_python_beside)
            argv, mounts, env = cri.host_python_beside([sys.executable, str(TOOLS / "cuda_worker.py")], REPO,
                                                       *_pythonpath_dirs(), pythonpath=_pythonpath_dirs())
            w = cri.FifoWorker(io, argv)
            kw = {"command": w.command, "mounts": mounts + [w.mount], "envs": {**_container_env(), **env}}
        try:
            cid = s.k.create(sid, "cuda", cdi=ids, **(kw or {}))
            s.k.start(cid)
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal is the record; the next attempt follows
            attempts.append({"how": how, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"})
            if w is not None:
                w.close()
            if cid is not None:
                try:
                    s.k.remove(cid)
                except Exception:  # noqa: BLE001
                    pass
                cid = None
            continue
        attempts.append({"how": how, "created": cid})
        p = {"form": "dra", "name": f"dra-{tag}", "uid": pod_uid, "sandbox": sid, "id": cid, "container": "cuda",
             "cgroup": _cgroup_dir(f"{cri.pod_cgroup(pod_uid)}/{cid}"), "claim": (dsm.NS, claim_uid, f"gpu-{tag}")}
        s.pods.append(p)
        out["worker"] = w.read(60) if w else {}
        if w is not None:
            w.close()
        out["worker_from_host_in_cgroup"] = s.worker(p)
        if not w:
            out["worker"] = out["worker_from_host_in_cgroup"]
        out["config_devices"] = _config_devices(cid)
        break
    out["attempts"] = attempts
    if cid is None:
        raise RuntimeError(f"no container could be created for {ids}: {attempts}")
    return out


def _dra_release() -> None:
    """Every dra-* pod stopped and removed through CRI, its claim unprepared and deleted (the kubelet's and
    the claim owner's part), so the one GPU can be allocated again."""
    d = _dra()
    ds, s, dsm = d["ds"], d["s"], d["dsm"]
    for p in [p for p in s.pods if p.get("form") == "dra"]:
        s.drop(p)
    if ds.claims:
        ds.kubelet.unprepare(dsm.DRIVER, ds.claims)
    for ns, _, name in ds.claims:
        dsm._req(ds.api, "DELETE", f"/api/v1/namespaces/{ns}/pods/dra-{name.removeprefix('gpu-')}")
        dsm._req(ds.api, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
    ds.claims = []


def _dra_check(name: str) -> tuple[dict, list[dict], float]:
    import validate as v

    d = _dra()
    rep, err, dt = v.gpuwarden("/", "--probe-timeout", "3",
                               env={"PATH": f"{d['s'].bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    (d["ds"].cap / f"cri-check-{name}.json").write_text(json.dumps(rep, indent=1))
    return rep, v.summarize(rep), round(dt, 2)


def _affected(rep: dict, code: str) -> list[str]:
    return [a.get("name", "") for f in rep.get("findings", []) if f["code"] == code and f["status"] == "confirmed"
            for a in f.get("affected", [])]


def cri_dra_healthy() -> dict:
    """The real plugin's claim spec through containerd's CDI: CUDA works in the container; gpuwarden quiet."""
    res: dict[str, Any] = {"scenario": "cri-dra-healthy", "expect": None,
                           "injected": "a claim prepared by the real DRA plugin; its CDI device IDs in CreateContainer"}
    res["versions"] = _dra()["s"].versions
    c = _dra_container("cri-healthy")
    _kubelet_config()
    rep, res["findings"], res["check_seconds"] = _dra_check("healthy")
    res.update(claim=c, worker=c["worker"])
    _dra_release()
    dra = [f for f in res["findings"] if f["code"].startswith(("GPU-DRA-01", "GPU-DEV-00"))]
    return _fail_unless(res, {
        "container_has_uvm": any(x.startswith("/dev/nvidia-uvm ") for x in c["config_devices"]),
        "cuda_ok_in_the_container": c["worker"].get("cuInit") == 0,
        "no_dra_or_device_finding": not dra,
    })


def cri_dra_stale_major() -> dict:
    """(b) A claim spec whose nvidia-uvm major a driver reload left stale, resolved by containerd as it is."""
    res: dict[str, Any] = {"scenario": "cri-dra-stale-major", "expect": "GPU-DRA-011"}
    d = _dra()
    devices = Path("/proc/devices").read_text().split("Block devices")[0]
    majors = {ln.split()[1]: int(ln.split()[0]) for ln in devices.splitlines() if ln.strip()[:1].isdigit()}
    uvm = majors["nvidia-uvm"]
    old = next(m for m in range(254, 233, -1) if m not in set(majors.values()))  # dra_scenarios.dra_stale_spec's choice

    def stale(spec: Path) -> list[str]:
        text, changed = d["dsm"]._reload_majors(spec.read_text(), {uvm: old})
        spec.write_text(text)
        return changed

    res["injected"] = (f"the real plugin's claim spec with nvidia-uvm's major {uvm} written as {old} (as a driver reload "
                       "leaves a spec prepared before it) before CreateContainer")
    c = _dra_container("cri-stale", edit=stale)
    _kubelet_config()
    rep, res["findings"], res["check_seconds"] = _dra_check("stale-major")
    res.update(claim=c, worker=c["worker"], host_uvm_major=uvm, spec_uvm_major=old)
    f = [x for x in rep.get("findings", []) if x["code"] == "GPU-DRA-011"]
    res["dra011"] = f
    _dra_release()
    return _fail_unless(res, {
        "config_has_the_stale_major": any(x.startswith(f"/dev/nvidia-uvm c {old}:") for x in c["config_devices"]),
        "cuda_fails": c["worker"].get("cuInit") not in (0, None),
        "confirmed": bool(f) and f[0]["status"] == "confirmed",
        "names_claim_and_pod": {"gpu-cri-stale", "dra-cri-stale/cuda"} <= set(_affected(rep, "GPU-DRA-011")),
    })


def cri_dra_uvm_missing() -> dict:
    """(a) The plugin restarted in a /dev without nvidia-uvm (no CAP_MKNOD): its claim spec omits the node."""
    from podlayout import gpu_nodes

    d = _dra()
    ds = d["ds"]
    res: dict[str, Any] = {"scenario": "cri-dra-uvm-missing", "expect": "GPU-DRA-010"}
    ds.plugin.stop()
    nodes = [(Path(p).name, ma, mi) for p, ma, mi in gpu_nodes() if "uvm" not in p]
    nodes += [(Path(p).name, os.major(Path(p).stat().st_rdev), os.minor(Path(p).stat().st_rdev))
              for p in sorted(Path("/dev").glob("nvidia[0-9]*")) if Path(p).name not in {n for n, _, _ in nodes}]
    ds.start_plugin("cri-no-uvm", dev_nodes=nodes, drop_caps=(27,))  # CAP_MKNOD dropped, as the chart drops ALL
    ds.register()
    res["injected"] = f"the real plugin restarted in a /dev holding {', '.join(n for n, _, _ in nodes)} (no nvidia-uvm)"
    c = _dra_container("cri-nouvm")
    _kubelet_config()
    rep, res["findings"], res["check_seconds"] = _dra_check("uvm-missing")
    res.update(claim=c, worker=c["worker"])
    f = [x for x in rep.get("findings", []) if x["code"] == "GPU-DRA-010"]
    res["dra010"] = f
    _dra_release()
    return _fail_unless(res, {
        "spec_lacks_uvm": "/dev/nvidia-uvm" not in (c["spec_as_written"] or ""),
        "config_lacks_uvm": not any(x.startswith("/dev/nvidia-uvm ") for x in c["config_devices"]),
        "cuda_fails": c["worker"].get("cuInit") not in (0, None),
        "confirmed": bool(f) and f[0]["status"] == "confirmed",
        "names_claim_and_pod": {"gpu-cri-nouvm", "dra-cri-nouvm/cuda"} <= set(_affected(rep, "GPU-DRA-010")),
        "dev001_leaves_it_to_dra": not [x for x in res["findings"] if x["code"] == "GPU-DEV-001"],
    })


def cri_dra_teardown() -> dict:
    """Ends the cri-dra-* session: containerd's pods, then the plugin, API server, specs and kubelet state."""
    if _DRA:
        d = dict(_DRA)
        _DRA.clear()
        try:
            d["s"].close()
        finally:
            d["ds"].close()
    return {"scenario": "cri-dra-teardown", "expect": None, "findings": []}


def _spec_nodes() -> list[dict]:
    import yaml

    spec = yaml.safe_load(SPEC.read_text())
    nodes = list((spec.get("containerEdits") or {}).get("deviceNodes") or [])
    for d in spec.get("devices") or []:
        nodes += (d.get("containerEdits") or {}).get("deviceNodes") or []
    return nodes


def _config_devices(cid: str) -> list[str]:
    spec = json.loads((STATE / "io.containerd.runtime.v2.task/k8s.io" / cid / "config.json").read_text())
    return [f"{d['path']} c {d.get('major')}:{d.get('minor')}" for d in (spec.get("linux") or {}).get("devices") or []]


SCENARIOS = {
    "cri-update-keeps-devices": update_keeps_devices,
    "cri-memory-escape": memory_escape,
    "cri-hook-v2-update": hook_v2_update,
    "cri-cdi-uvm-missing": cdi_uvm_missing,
    "cri-plugin-uvm-stale": plugin_uvm_stale,
    "cri-plugin-nvml-hang": plugin_nvml_hang,
    "cri-dra-healthy": cri_dra_healthy,
    "cri-dra-stale-major": cri_dra_stale_major,
    "cri-dra-uvm-missing": cri_dra_uvm_missing,
    "cri-dra-teardown": cri_dra_teardown,
}
