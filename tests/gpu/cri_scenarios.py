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
"""

from __future__ import annotations

import base64
import json
import lzma
import os
import shutil
import subprocess
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
        entries.append({"PodUID": p["uid"], "ContainerName": "worker", "ResourceName": "nvidia.com/gpu",
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
    "cri-cdi-uvm-missing": cdi_uvm_missing,
    "cri-plugin-uvm-stale": plugin_uvm_stale,
    "cri-plugin-nvml-hang": plugin_nvml_hang,
}
