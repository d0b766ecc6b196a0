#!/usr/bin/env python3
"""GPU-machine scenarios through the real NVIDIA DRA kubelet plugin (registered in validate.py's SCENARIOS).

One session, in order (each scenario's result recorded as in validate.py): a real test API server
(etcd + tools/testapiserver with resource.k8s.io) on loopback, a Node, the `gpu.nvidia.com`
DeviceClass; the upstream `gpu-kubelet-plugin` (tests/support/realdra.py) with the host's driver
root, registered by the kubelet DRA stand-in (tests/support/kubelet_dra.py) on the host's
/var/lib/kubelet, publishing ResourceSlices for the real GPUs. This script plays the scheduler: it
writes each ResourceClaim's allocation (one GPU of the published pool) and reservedFor, then the
stand-in calls NodePrepareResources, reads the claim's CDI spec the plugin wrote and "starts the
container": a process in a kubelet-named cgroup v2 whose device program runc would build from the
spec's device nodes (tools/gpu/podlayout.py), with containerd's config.json, running cuInit.

- dra-healthy: the plugin with the host's /dev; the claim's spec holds nvidia-uvm, cuInit 0;
  gpuwarden quiet (no finding at medium or above).
- dra-one-gpu-lost (e): a second claim on the other GPU, its container started; that GPU made lost to
  the agent only (tools/gpu/nvml_inject_shim.c as its NVML probe's library: NVML_ERROR_GPU_IS_LOST for
  one index while a trigger file exists); the real agent (in-process, remediate on, dra_driver) must
  create one DeviceTaintRule on exactly that device and no node taint, the first container must keep
  working (alive, cuInit, a kernel), and the rule must go once the trigger is removed.
- dra-stale-spec (b): the first claim's real spec with nvidia-uvm's dynamic major written as a driver
  reload leaves it (the spec keeps the old number, the host moved on); GPU-DRA-011 must name the claim
  and the pod; the spec is restored.
- dra-uvm-missing (a): the plugin restarted in a private mount namespace whose /dev (tmpfs) holds
  the GPU nodes and nvidiactl but not nvidia-uvm, without CAP_MKNOD (as the chart drops it); its
  spec for a new claim omits /dev/nvidia-uvm, the container's cuInit fails; gpuwarden must name the
  claim and the pod (GPU-DRA-010, node-side DRA rules).
- dra-plugin-killed (d): kill -9: its sockets stay, its ResourceSlices stay in the API; the probe
  gets connection refused and the node's process table shows no plugin (GPU-DRA-030 CONFIRMED; on
  `/` only: under GW_DRA_NODE_ROOT, a tree that is not the running node, it is not evaluated).
- dra-nvml-hang (c): restarted with its NVML hung in nvmlInit (tools/gpu/nvml_inject_shim.c,
  LD_PRELOAD on the plugin only, trigger file present from the start): it never serves again. Where
  its old sockets remain they refuse while its process runs: GPU-DRA-030 AT-RISK high since issue 44
  ("gone" only with no plugin process; recorded CONFIRMED before, not re-run since), within the
  probe's deadline. Then NVML hung after a healthy start: a new
  claim's prepare is timed, and the probe's verdict recorded as it is.

The server enforces the chart's RBAC and admission policies (tests/support/rbac.py; on a machine without
the Helm SDK a rendering made with `--render-authz FILE`, given as GW_DRA_AUTHZ_FILE): the agent acts with its
node-bound ServiceAccount token, the plugin under the ServiceAccount and ClusterRole of Kubernetes' example
DRA driver, through a TLS front (tests/support/tlsfront.py), the harness as an admin. GW_DRA_AUTHZ=0: none.

Captures (specs, checkpoints, slices, logs) go to $OUT/dra/. Nothing on the GPU is configured; every
process is stopped, every cgroup, socket, spec and state file this created is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools/gpu"
sys.path[:0] = [p for p in (str(REPO / "src"), str(REPO), str(TOOLS), str(REPO / "tests/gpu")) if p not in sys.path]

NODE = "gw-gpu-node"
NS = "ml"
WORK = Path("/tmp/gw-dra")
#: a dry run without a GPU (CI, a development host): GW_DRA_NODE_ROOT holds the node's kubelet and CDI
#: directories, GW_DRA_DRIVER_ROOT a driver root with a fake NVML (tests/support/realdra.py), and
#: GW_DRA_NO_CONTAINER=1 skips the cgroup v2 container (no cuInit to try)
NODE_ROOT = Path(os.environ.get("GW_DRA_NODE_ROOT", "/"))
DRIVER_ROOT = os.environ.get("GW_DRA_DRIVER_ROOT", "/")
NO_CONTAINER = os.environ.get("GW_DRA_NO_CONTAINER") == "1"
KR = NODE_ROOT / "var/lib/kubelet"
CDI_ROOT = NODE_ROOT / "var/run/cdi"
ETC_CDI = NODE_ROOT / "etc/cdi"
OUT = Path(os.environ.get("OUT", "/tmp/gw-validation"))
DRIVER = "gpu.nvidia.com"
PROBE_TIMEOUT = "3"
LOG = print
#: the admin's bearer token where the server enforces authorization (none here: see Session)
TOKEN = ""
AGENT_NS = "gpuwarden"


def _req(api: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    hdr = {"Content-Type": "application/json", **({"Authorization": f"Bearer {TOKEN}"} if TOKEN else {})}
    r = urllib.request.Request(api + path, data=data, method=method, headers=hdr)
    try:
        with urllib.request.urlopen(r, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:400]!r}") from None


class Session:
    """The API server, the plugin, the stand-in and everything created, torn down by close()."""

    def __init__(self) -> None:
        from tests.support import apiserver, realdra

        WORK.mkdir(parents=True, exist_ok=True)
        self.cap = OUT / "dra"
        self.cap.mkdir(parents=True, exist_ok=True)
        self.binary = realdra.unpack(WORK)
        global DRIVER_ROOT
        if DRIVER_ROOT == "/":
            DRIVER_ROOT = realdra.host_driver_root(WORK)
        self.server, self.ids, self.front, self.plugin_token, self.authz_note = _start_server()
        self.api = self.server.url
        self.kubeconfig = Path(self.server.kubeconfig_path)
        global TOKEN
        TOKEN = _kubeconfig_token(self.kubeconfig)  # the harness plays scheduler and kubelet: the admin's
        if self.front is not None:  # the plugin under its own identity, through TLS (see tests/support/tlsfront.py)
            self.kubeconfig = self.front.kubeconfig(self.plugin_token, WORK / "plugin-kubeconfig.json")
        _req(self.api, "POST", "/api/v1/namespaces", {"metadata": {"name": AGENT_NS}})
        _req(self.api, "POST", "/api/v1/nodes", {"metadata": {"name": NODE, "uid": str(uuid.uuid4())}})
        _req(self.api, "POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        groups = {g["name"] for g in _req(self.api, "GET", "/apis").get("groups", [])}
        #: an API server without resource.k8s.io (an older build): the plugin serves its sockets and waits
        #: for the API; registration, the probe, kill -9 and the NVML hang run, claims cannot
        self.dra_api = "resource.k8s.io" in groups
        if self.dra_api:
            self._device_class()
        self.init_state()

    def _device_class(self) -> None:
        _req(self.api, "POST", "/apis/resource.k8s.io/v1/deviceclasses", {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})

    def init_state(self) -> None:
        self.plugin = None
        self.pods: list[Any] = []
        self.workers: list[subprocess.Popen] = []
        self.claims: list[tuple[str, str, str]] = []
        self.kubelet = None
        self.made_kr = not KR.exists()

    # -- plugin ----------------------------------------------------------------------------------
    def start_plugin(self, name: str, *, dev_nodes=None, drop_caps=(), env=None, wait: bool = True, verbosity: int = 6):
        from tests.support import realdra, realplugin

        a = realdra.args(NODE, KR, CDI_ROOT, DRIVER_ROOT, self.kubeconfig, verbosity=verbosity)
        self.plugin = realplugin.RealPlugin(self.binary, a, dev_nodes=dev_nodes, drop_caps=drop_caps, env=env,
                                            log_path=self.cap / f"plugin-{name}.log").start()
        if wait and not self.plugin.wait_log("GRPC server started\" logger=\"registrar\"", 60):
            raise RuntimeError(f"plugin {name} did not serve; log: {self.plugin.log()[-2000:]}")
        return self.plugin

    def register(self):
        from tests.support.kubelet_dra import KubeletDra

        self.kubelet = KubeletDra(KR, cdi_dirs=[str(ETC_CDI), str(CDI_ROOT)], timeout=20)
        return self.kubelet.register(DRIVER)

    def slices(self, wait_for: int = 0, timeout: float = 30) -> list[dict]:
        if not self.dra_api:
            return []
        end = time.monotonic() + timeout
        while True:
            items = _req(self.api, "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{NODE}").get("items", [])
            if len(items) >= wait_for or time.monotonic() > end:
                return items
            time.sleep(0.3)

    # -- scheduler + kubelet + runtime -----------------------------------------------------------
    def prepare_claim(self, tag: str, device: str, pool: str, pod_uid: str, container: str) -> tuple[str, list[str], float]:
        """Pod dra-<tag> with claim gpu-<tag> in the API, the claim allocated `device` and reserved for the pod
        (the scheduler's part), then NodePrepareResources through the stand-in (the kubelet's); the claim's
        uid, its CDI device IDs and the prepare's seconds."""
        pod_name, claim_name = f"dra-{tag}", f"gpu-{tag}"
        _req(self.api, "POST", f"/api/v1/namespaces/{NS}/pods", {
            "metadata": {"name": pod_name, "uid": pod_uid},
            "spec": {"nodeName": NODE, "containers": [{"name": container, "image": container, "resources": {
                "claims": [{"name": "gpu"}]}}], "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]}})
        claim = _req(self.api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", {
            "metadata": {"name": claim_name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}})
        claim["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]}
        _req(self.api, "PUT", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim_name}/status", claim)
        uid = claim["metadata"]["uid"]
        self.claims.append((NS, uid, claim_name))
        t0 = time.monotonic()
        got = self.kubelet.prepare(DRIVER, pod_uid, [(NS, uid, claim_name)])
        return uid, [i for d in got[uid].devices for i in d.cdi_device_ids], time.monotonic() - t0

    def claim_pod(self, tag: str, device: str, pool: str) -> dict:
        """A pod with one claim, allocated `device`, prepared by the plugin, its container started."""
        from podlayout import Pod
        from tests.support.kubelet_dra import device_rules  # noqa: F401  (documents the rules' origin)
        import validate as v

        pod = Pod(NS, f"dra-{tag}", "cuda", None)
        uid, ids, prep_s = self.prepare_claim(tag, device, pool, pod.uid, "cuda")
        claim_name = f"gpu-{tag}"
        nodes = self.kubelet.cdi_device_nodes(ids, host_dev=str(NODE_ROOT))
        pod.nodes = [(n["path"], n["major"], n["minor"]) for n in nodes if n["type"] == "c"]
        out: dict = {"container": "not started (GW_DRA_NO_CONTAINER)"}
        if not NO_CONTAINER:
            pod.create()
            self.pods.append(pod)
            worker, out = v.start_worker([pod.procs])
            self.workers.append(worker)
        return {"pod": pod.ref, "pod_uid": pod.uid, "claim": f"{NS}/{claim_name}", "claim_uid": uid,
                "device": device, "cdi_ids": ids, "nodes": [n["path"] for n in nodes], "prepare_s": round(prep_s, 3),
                "worker": out}

    def check(self, name: str) -> tuple[list[dict], float]:
        import validate as v
        from podlayout import kubelet_state

        if not NO_CONTAINER:
            kubelet_state(self.pods)
        rep, err, dt = v.gpuwarden(str(NODE_ROOT), "--probe-timeout", PROBE_TIMEOUT)
        (self.cap / f"check-{name}.json").write_text(json.dumps(rep, indent=1))
        return v.summarize(rep), round(dt, 2)

    def capture(self, name: str) -> None:
        d = self.cap / name
        d.mkdir(parents=True, exist_ok=True)
        for src in (CDI_ROOT, ETC_CDI):
            for f in sorted(src.glob("*")) if src.is_dir() else []:
                shutil.copy2(f, d / f"{src.name}__{f.name}")
        for f in (KR / "dra_manager_state", KR / "plugins" / DRIVER / "checkpoint.json"):
            if f.exists():
                shutil.copy2(f, d / f.name)
        if not self.dra_api:
            return
        (d / "resourceslices.json").write_text(json.dumps(self.slices(), indent=1))
        (d / "resourceclaims.json").write_text(json.dumps(
            _req(self.api, "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"), indent=1))
        (d / "sockets.txt").write_text("\n".join(f"{p} {'socket' if p.is_socket() else p.stat().st_mode}"
                                                 for p in sorted(KR.rglob("*.sock"))))

    def kill9(self) -> None:
        if self.plugin is not None and self.plugin.proc.poll() is None:
            self.plugin.proc.send_signal(signal.SIGKILL)
            self.plugin.proc.wait(10)
        if self.plugin is not None:
            self.plugin.stop()

    def release_claims(self) -> None:
        """End every pod started so far and give its claim back, as the kubelet and the claim's owner do:
        the container's processes stopped, its cgroup removed, NodeUnprepareResources, the claim deleted."""
        for w in self.workers:
            w.kill()
            w.wait()
        for p in self.pods:
            p.remove()
        if self.claims:
            self.kubelet.unprepare(DRIVER, self.claims)
        for ns, _, name in self.claims:  # claim gpu-<tag> is pod dra-<tag>'s (claim_pod)
            _req(self.api, "DELETE", f"/api/v1/namespaces/{ns}/pods/dra-{name.removeprefix('gpu-')}")
            _req(self.api, "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
        self.workers, self.pods, self.claims = [], [], []

    def denied(self, user: str) -> list[dict]:
        """The requests of `user` the server refused so far (a server enforcing authorization)."""
        return [a for a in self.server.audit() if a.get("user") == user and not a.get("allowed")]

    def close(self) -> None:
        for w in self.workers:
            w.kill()
            w.wait()
        for p in self.pods:
            p.remove()
        if self.plugin is not None:
            self.plugin.stop()
        if self.front is not None:
            self.front.close()
        self.server.stop()
        for _, uid, _ in self.claims:
            for d in (CDI_ROOT, ETC_CDI):
                for f in d.glob(f"*{uid}*") if d.is_dir() else []:
                    f.unlink()
        from podlayout import clear_kubelet_state

        if self.made_kr and NODE_ROOT == Path("/"):
            clear_kubelet_state()
        else:
            shutil.rmtree(KR / "plugins" / DRIVER, ignore_errors=True)
            for f in (KR / "plugins_registry" / f"{DRIVER}-reg.sock", KR / "dra_manager_state"):
                f.unlink(missing_ok=True)


_S: Session | None = None


#: the DRA kubelet plugin's identity: the ServiceAccount and ClusterRole of Kubernetes' example DRA driver
#: (kubelet plugin: get claims and nodes, manage its ResourceSlices)
PLUGIN_USER = "system:serviceaccount:nvidia-dra-driver-gpu:nvidia-dra-driver-gpu-service-account-kubeletplugin"
PLUGIN_RULES = [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                 "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]


def _start_server():
    """The test API server enforcing the chart's RBAC and admission policies for an agent on NODE
    (remediation on, the DRA driver named), the plugin under its own ServiceAccount behind a TLS front.

    GW_DRA_AUTHZ=0, or no `openssl` for the front's certificate: no authorization (every client an admin),
    said in the results."""
    from tests.support import apiserver, rbac, tlsfront

    if os.environ.get("GW_DRA_AUTHZ", "1") == "0":
        return apiserver.start_apiserver(timeout=90), None, None, "", "no authorization (GW_DRA_AUTHZ=0)"
    try:
        authz, ids = chart_authz()
    except ImportError as exc:  # no Helm SDK here: a rendering made elsewhere (--render-authz), if given
        given = os.environ.get("GW_DRA_AUTHZ_FILE")
        if not given:
            return apiserver.start_apiserver(timeout=90), None, None, "", f"no authorization: {exc}, no GW_DRA_AUTHZ_FILE"
        doc = json.loads(Path(given).read_text())
        authz, ids = doc["authz"], rbac.Identities(**doc["ids"])
    token = os.urandom(12).hex()
    authz["tokens"][token] = {"user": PLUGIN_USER, "groups": ["system:serviceaccounts"], "extra": {}}
    authz["clusterRoles"].append({"metadata": {"name": "gw-test-dra-kubeletplugin"}, "rules": PLUGIN_RULES})
    authz["clusterRoleBindings"].append({
        "metadata": {"name": "gw-test-dra-kubeletplugin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gw-test-dra-kubeletplugin"},
        "subjects": [{"kind": "User", "name": PLUGIN_USER}]})
    server = apiserver.start_apiserver(timeout=90, authz=authz)
    try:
        front = tlsfront.TlsFront(server.url, WORK / "front")
    except (tlsfront.Unavailable, OSError, subprocess.SubprocessError) as exc:
        server.stop()
        return apiserver.start_apiserver(timeout=90), None, None, "", f"no authorization: {exc}"
    return server, ids, front, token, (f"the chart's RBAC and admission policies enforced; agent {ids.agent_user} "
                                f"(token naming node {NODE}), plugin {PLUGIN_USER} over TLS")


def chart_authz():
    """The chart's RBAC and policies for an agent on NODE with remediation on and the DRA driver named."""
    from tests.support import rbac

    return rbac.chart_authz("on", {"execute": False}, [NODE], values={"agent": {"remediate": "on", "dra_driver": DRIVER}})


def render_authz(path: str) -> None:
    """Write chart_authz() to `path` for a machine without the Helm SDK (GW_DRA_AUTHZ_FILE there)."""
    import dataclasses

    authz, ids = chart_authz()
    Path(path).write_text(json.dumps({"authz": authz, "ids": dataclasses.asdict(ids)}))


def _kubeconfig_token(path: Path) -> str:
    users = json.loads(path.read_text()).get("users") or [{}]
    return (users[0].get("user") or {}).get("token") or ""


def _session() -> Session:
    global _S
    if _S is None:
        _S = Session()
    return _S


def _result(name: str, expect: str | None, **kw: Any) -> dict:
    return {"scenario": name, "expect": expect, **kw}


def _pool_devices(slices: list[dict]) -> tuple[str, list[str]]:
    pool, devs = "", []
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        devs += [d["name"] for d in s["spec"].get("devices") or []]
    return pool, sorted(devs)


def dra_healthy() -> dict:
    s = _session()
    s.start_plugin("healthy")
    reg = s.register()
    slices = s.slices(wait_for=1)
    pool, devs = _pool_devices(slices)
    c: dict = {"skipped": "the API server serves no resource.k8s.io: no claim"}
    if s.dra_api:
        if not devs:
            raise RuntimeError(f"no ResourceSlice devices published; log: {s.plugin.log()[-2000:]}")
        c = s.claim_pod("healthy", devs[0], pool)
    s.capture("healthy")
    findings, dt = s.check("healthy")
    return _result("dra-healthy", None, findings=findings, check_seconds=dt, worker=c.get("worker", {}), claim=c,
                   announced=[x for x in s.plugin.log().splitlines() if "About to announce device" in x],
                   registration={"supported_versions": list(reg.info.supported_versions), "service": reg.service},
                   slices=[{"name": x["metadata"]["name"], "pool": x["spec"]["pool"], "devices":
                            [d["name"] for d in x["spec"].get("devices") or []]} for x in slices],
                   stand_in=list(s.kubelet.log), authorization=s.authz_note,
                   plugin_requests_denied=s.denied(PLUGIN_USER) if s.ids else "not enforced")


def dra_uvm_missing() -> dict:
    from podlayout import gpu_nodes

    s = _session()
    if s.dra_api and len(_pool_devices(s.slices(wait_for=1))[1]) < 2:
        s.release_claims()  # one GPU: the earlier pod ends first, as it must before another claim can have it
    s.plugin.stop()  # SIGTERM: a rolling restart of the plugin pod
    nodes = [(Path(p).name, ma, mi) for p, ma, mi in gpu_nodes() if "uvm" not in p]
    nodes += [(Path(p).name, os.major(Path(p).stat().st_rdev), os.minor(Path(p).stat().st_rdev))
              for p in sorted(Path("/dev").glob("nvidia[0-9]*")) if Path(p).name not in {n for n, _, _ in nodes}]
    s.start_plugin("no-uvm", dev_nodes=nodes, drop_caps=(27,), verbosity=7)  # CAP_MKNOD dropped, as the chart drops ALL
    s.register()
    c: dict = {"skipped": "the API server serves no resource.k8s.io: no claim"}
    if s.dra_api:
        pool, devs = _pool_devices(s.slices(wait_for=1))
        c = s.claim_pod("no-uvm", devs[-1], pool)
    s.capture("uvm-missing")
    findings, dt = s.check("uvm-missing")
    return _result("dra-uvm-missing", "GPU-DRA-010" if s.dra_api else None, findings=findings, check_seconds=dt,
                   worker=c.get("worker", {}), claim=c, plugin_dev=[n for n, _, _ in nodes],
                   plugin_uvm_lines=[x for x in s.plugin.log().splitlines() if "uvm" in x.lower()][:20])


def dra_plugin_killed() -> dict:
    s = _session()
    before = s.slices()
    s.kill9()
    time.sleep(1.0)
    after = s.slices()
    s.capture("plugin-killed")
    findings, dt = s.check("plugin-killed")
    return _result("dra-plugin-killed", "GPU-DRA-030", findings=findings, check_seconds=dt,
                   slices_before=[x["metadata"]["name"] for x in before],
                   slices_after_kill=[x["metadata"]["name"] for x in after],
                   sockets_left=[str(p) for p in KR.rglob("*.sock")])


def dra_nvml_hang() -> dict:
    from tests.support import realplugin

    s = _session()
    shim = realplugin.build_shim(TOOLS / "nvml_inject_shim.c", WORK / "shim", libs=["-ldl"])
    trigger = WORK / "nvml-hang"
    trigger.write_text("hang\n")
    env = {"LD_PRELOAD": str(shim), "GW_NVML_HANG_FILE": str(trigger)}
    from tests.support import realdra

    lib = Path(DRIVER_ROOT) / realdra.LIBDIR / "libnvidia-ml.so.1"  # the NVML the plugin loads, the shim forwards to
    env["GW_NVML_REAL"] = str(lib) if lib.exists() else realdra.host_nvml()
    hung = s.start_plugin("nvml-hung-at-start", env=env, wait=False)
    hung.wait_log("Initializing NVML", 30)
    time.sleep(3.0)
    started = "GRPC server started" in hung.log()
    findings, dt = s.check("nvml-hang")
    res = _result("dra-nvml-hang", "GPU-DRA-030", findings=findings, check_seconds=dt, plugin_served=started,
                  plugin_alive=hung.proc.poll() is None, plugin_log_tail=hung.log().strip().splitlines()[-3:])
    hung.stop()
    if not s.dra_api:
        trigger.unlink(missing_ok=True)
        res["later"] = {"skipped": "the API server serves no resource.k8s.io: no claim to prepare"}
        return res
    # NVML hung after a healthy start: does a prepare reach NVML, and what does the probe see meanwhile?
    trigger.unlink()
    s.start_plugin("nvml-hung-later", env=env)
    s.register()
    pool, devs = _pool_devices(s.slices(wait_for=1))
    trigger.write_text("hang\n")
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=_try(lambda: s.claim_pod("late-hang", devs[0], pool))), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(25)
    res["later"] = {"prepare_returned": not t.is_alive(), "waited_s": round(time.monotonic() - t0, 2),
                    "result": box.get("r")}
    later_findings, _ = s.check("nvml-hang-later")
    res["later"]["findings"] = later_findings
    s.capture("nvml-hang")
    trigger.unlink(missing_ok=True)
    return res


def _in_pod(pod: Any, argv: list[str], timeout: float = 120) -> dict:
    """Run a process inside the pod's container cgroup (its device program applies), one JSON line back."""
    def enter() -> None:
        with open(pod.procs, "w") as f:
            f.write(str(os.getpid()))

    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=enter)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s"}
    try:
        return {"rc": p.returncode, **json.loads(p.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"rc": p.returncode, "stdout": p.stdout[-500:], "stderr": p.stderr[-1500:]}


#: a CUDA kernel in the container: the sum of 2*i over 2**20 ints on the one GPU its cgroup allows
KERNEL = ("import json, torch; n = 1 << 20; x = torch.arange(n, device='cuda'); s = int((x * 2).sum()); "
          "torch.cuda.synchronize(); p = torch.cuda.get_device_properties(0); "
          "print(json.dumps({'visible': torch.cuda.device_count(), 'gpu_uuid': 'GPU-' + str(p.uuid), "
          "'pci_bus': p.pci_bus_id, 'kernel_sum_ok': s == n * (n - 1)}))")


def _smi_index() -> dict[str, int]:
    """GPU UUID -> NVML index (nvidia-smi), to name the GPU the injection makes lost."""
    p = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=30)
    return {u.strip(): int(i) for i, u in (ln.split(",") for ln in p.stdout.splitlines() if "," in ln)}


def dra_one_gpu_lost() -> dict:
    """(e) Two GPUs, one claim and one running container each; NVML made to call one GPU lost to the
    agent only; the real agent (remediate on, dra_driver gpu.nvidia.com, in-process) fences exactly that
    device with a DeviceTaintRule, no node taint; the other container keeps working; the fence is lifted
    once the injection stops."""
    from gpuwarden.kube.client import Kube
    from gpuwarden.root import HostRoot
    from podlayout import kubelet_state
    from tests.support import realdra, realplugin
    from tests.support.agent_kube import new_agent

    s = _session()
    slices = s.slices(wait_for=1)
    pool, devs = _pool_devices(slices)
    if len(devs) < 2:
        raise RuntimeError(f"needs two GPUs in the slice, got {devs}")
    attrs = {d["name"]: {k: next(iter(v.values())) for k, v in (d.get("attributes") or {}).items()}
             for x in slices for d in x["spec"].get("devices") or []}
    keep_pod = s.pods[0] if s.pods else None  # dra-healthy's container, on devs[0]
    other = s.claim_pod("gpu1", devs[1], pool)  # the second container, on devs[1]: this GPU is made lost
    lost_dev = devs[1]
    index = _smi_index().get(str(attrs[lost_dev].get("uuid")), attrs[lost_dev].get("index"))
    lib = realdra.host_nvml()
    shim = realplugin.build_shim(TOOLS / "nvml_inject_shim.c", WORK / "shim-lost", soname=None,
                                 libs=["-Wl,--no-as-needed", lib, "-ldl"])
    trigger = WORK / "nvml-lost"
    saved = {k: os.environ.get(k) for k in ("GPUWARDEN_NVML_LIBRARY", "GW_NVML_REAL", "GW_NVML_LOST_INDEX_FILE")}
    os.environ.update(GPUWARDEN_NVML_LIBRARY=str(shim), GW_NVML_REAL=lib, GW_NVML_LOST_INDEX_FILE=str(trigger))
    admin = Kube(s.server.api_client())
    agent_api = s.server.api_client(s.ids.agent_token(NODE)) if s.ids else s.server.api_client()
    agent, out = new_agent(Kube(agent_api), NODE, HostRoot(str(NODE_ROOT)), AGENT_NS, remediate="on",
                           dra_driver=DRIVER, probes=True, probe_timeout_s=10)
    R = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    res: dict = {"lost_device": lost_dev, "lost_index": index, "lost_uuid": attrs[lost_dev].get("uuid"),
                 "kept_device": devs[0], "kept_uuid": attrs[devs[0]].get("uuid"), "other_claim": other,
                 "injected": f"GPUWARDEN_NVML_LIBRARY={shim.name} (tools/gpu/nvml_inject_shim.c linked against {lib}) "
                             f"for the agent's NVML probe child only; while {trigger.name} holds '{index}', "
                             "nvmlDeviceGetHandleByIndex answers NVML_ERROR_GPU_IS_LOST for that index"}

    def checks(n: int, tag: str) -> list[dict]:
        got = []
        for i in range(n):
            if not NO_CONTAINER:
                kubelet_state(s.pods)
            r = agent.check()
            got.append({"check": f"{tag}-{i}", "findings": [f"{f.code}:{f.status.name}" for f in r.findings
                                                           if f.severity >= 3 or f.code.startswith("GPU-HW")],
                        "actions": [f"{o.action.kind} {o.action.target.name} {o.result}" for o in r.outcomes],
                        "errors": list(r.errors)})
        return got

    try:
        res["before"] = checks(2, "healthy")
        res["rules_before"] = admin.list(R)["items"]
        trigger.write_text(f"{index}\n")
        t0 = time.monotonic()
        res["lost"] = checks(3, "lost")
        res["fenced_after_s"] = round(time.monotonic() - t0, 2)
        rules = admin.list(R)["items"]
        res["device_taint_rules"] = rules  # as the API returns them
        res["node_taints"] = (admin.get_node(NODE).get("spec") or {}).get("taints") or []
        res["events"] = [{k: e.get(k) for k in ("reason", "message", "type")} | {"object": e["involvedObject"]["name"]}
                         for e in admin.list_events(field_selector="reason=TaintedDevice")]
        if keep_pod is not None and not NO_CONTAINER:
            res["kept_worker_alive"] = s.workers[0].poll() is None
            res["kept_cuinit"] = _in_pod(keep_pod, [sys.executable, str(TOOLS / "cuda_worker.py"), "--exit"])
            res["kept_kernel"] = _in_pod(keep_pod, [sys.executable, "-c", KERNEL])
        (s.cap / "one-gpu-lost").mkdir(parents=True, exist_ok=True)
        (s.cap / "one-gpu-lost" / "devicetaintrules.json").write_text(json.dumps(admin.list(R), indent=1))
        (s.cap / "one-gpu-lost" / "resourceslices.json").write_text(json.dumps(slices, indent=1))
        trigger.unlink()
        t0 = time.monotonic()
        res["recovered"] = checks(4, "recovered")
        res["rules_after"] = admin.list(R)["items"]
        res["cleared_after_s"] = round(time.monotonic() - t0, 2)
        res["untainted_events"] = [e.get("message") for e in admin.list_events(field_selector="reason=UntaintedDevice")]
    finally:
        trigger.unlink(missing_ok=True)
        agent.stop() if hasattr(agent, "stop") else None
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    res["agent_log_tail"] = out.getvalue()[-3000:]
    res["authorization"] = s.authz_note
    res["agent_requests_denied"] = s.denied(s.ids.agent_user) if s.ids else "not enforced"
    rules = res.get("device_taint_rules") or []
    sel = [r["spec"]["deviceSelector"] for r in rules]
    res["pass"] = (sel == [{"driver": DRIVER, "pool": pool, "device": lost_dev}] and not res.get("node_taints")
                   and res["agent_requests_denied"] in ([], "not enforced")
                   and res.get("rules_after") == [] and (NO_CONTAINER or (res.get("kept_worker_alive") and
                   res.get("kept_cuinit", {}).get("cuInit") == 0 and res.get("kept_kernel", {}).get("kernel_sum_ok"))))
    seen = {c for chk in res.get("lost", []) for c in chk["findings"]}
    return _result("dra-one-gpu-lost", "GPU-HW-002", findings=[
        {"code": c.split(":")[0], "status": c.split(":")[1].lower()} for c in sorted(seen)], **res)


def _reload_majors(text: str, renumber: dict[int, int]) -> tuple[str, list[str]]:
    """The claim spec as a driver reload leaves it: unchanged, while the host's dynamic majors moved.
    Here the host stays and the spec takes the other side: each deviceNode `major:` in `renumber` is
    written as the major the module held before. Returns the text and the lines changed."""
    import re

    changed: list[str] = []

    def sub(m: "re.Match[str]") -> str:
        old = int(m.group(2))
        if old not in renumber:
            return m.group(0)
        changed.append(f"{m.group(0).strip()} -> major: {renumber[old]}")
        return f"{m.group(1)}{renumber[old]}"

    return re.sub(r"(\n\s*major:\s*)(\d+)", sub, text), changed


def dra_stale_spec() -> dict:
    """(b) The healthy claim's real spec, made as a driver reload leaves it: its nvidia-uvm major is no
    longer the host's (the dynamic major moved); GPU-DRA-011 must name the claim and the pod. The spec is
    restored afterwards."""
    s = _session()
    devices = Path("/proc/devices").read_text() if NODE_ROOT == Path("/") else (NODE_ROOT / "proc/devices").read_text()
    chars = devices.split("Block devices")[0]
    majors = {ln.split()[1]: int(ln.split()[0]) for ln in chars.splitlines() if ln.strip()[:1].isdigit()}
    uvm = majors.get("nvidia-uvm")
    if uvm is None or not s.claims:
        raise RuntimeError(f"no nvidia-uvm major in /proc/devices ({sorted(majors)}) or no claim")
    ns, uid, name = s.claims[0]
    [spec] = [f for f in CDI_ROOT.glob(f"*{uid}*")]
    original = spec.read_text()
    # the kernel hands out dynamic char majors from 254 downwards (fs/char_dev.c find_dynamic_major):
    # a reload that found its old number taken got the next free one below; that one is free here now
    used = set(majors.values())
    old = next(m for m in range(254, 233, -1) if m not in used and m != uvm)
    stale, changed = _reload_majors(original, {uvm: old})
    d = s.cap / "stale-spec"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"original__{spec.name}").write_text(original)
    (d / f"stale__{spec.name}").write_text(stale)
    (d / "proc_devices").write_text(devices)
    try:
        spec.write_text(stale)
        findings, dt = s.check("stale-spec")
    finally:
        spec.write_text(original)
    after, _ = s.check("stale-spec-restored")
    return _result("dra-stale-spec", "GPU-DRA-011", findings=findings, check_seconds=dt, claim=f"{ns}/{name}",
                   claim_uid=uid, spec=str(spec), host_uvm_major=uvm, spec_uvm_major=old, changed=changed,
                   after_restore=[f"{f['code']}:{f['status']}" for f in after])


def _try(fn):
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def teardown() -> dict:
    global _S
    if _S is not None:
        _S.close()
        _S = None
    return _result("dra-teardown", None, findings=[])


SCENARIOS = {
    "dra-healthy": dra_healthy,
    "dra-one-gpu-lost": dra_one_gpu_lost,
    "dra-stale-spec": dra_stale_spec,
    "dra-uvm-missing": dra_uvm_missing,
    "dra-plugin-killed": dra_plugin_killed,
    "dra-nvml-hang": dra_nvml_hang,
    "dra-teardown": teardown,
}


def main() -> int:
    import argparse

    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--render-authz", metavar="FILE", help="write the chart's authorization for GW_DRA_AUTHZ_FILE and exit")
    a = ap.parse_args()
    if a.render_authz:
        render_authz(a.render_authz)
        return 0
    OUT = Path(a.out)
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for name, fn in SCENARIOS.items():
            if a.only and name not in a.only and name != "dra-teardown":
                continue
            t0 = time.monotonic()
            try:
                res = fn()
            except Exception as exc:
                import traceback
                res = _result(name, "?", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])
            res["seconds"] = round(time.monotonic() - t0, 2)
            results.append(res)
            codes = [f"{f['code']}:{f['status']}" for f in res.get("findings", [])]
            LOG(f"[{name}] {res.get('seconds')}s expect {res.get('expect')}; gpuwarden said {codes or 'nothing'}; "
                f"worker {res.get('worker', {})}; {res.get('error', '')}", flush=True)
    finally:
        teardown()
        (OUT / "dra-validation.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
