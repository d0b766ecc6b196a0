"""What the memory scenarios (tests/gpu/memory_scenarios.py) run beside their workloads.

- `AgentRun`: the real agent as a child, its JSON log followed as it is written (each line with the time it
  arrived), so a scenario can start its leak right after the agent's first full check and say when it acted;
- `MemWatch`: MemAvailable and MemFree every 0.1 s, and when each watched worker died;
- `fbs_due` and `leak_figures`: the leak's pacing (framebuffers to make now for a target rate, never past a
  cap) and what it achieved (rate, drop at the stop against a quarter of MemAvailable);
- `ApiSession` and `KubeletStandIn`: the test API server (etcd + tools/testapiserver) under the chart's RBAC and
  admission policies, the pods as the API holds them (their uids are the cgroups' uids), and a kubelet stand-in
  that stops a pod's processes once the API has evicted or deleted it (the GPU host runs no kubelet).

Pure where it can be (fbs_due, leak_figures, KubeletStandIn with injected list/stop); tests/memory exercises them
without a GPU.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import shutil
import subprocess
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

GIB = 1 << 30
MIB = 1 << 20


from memprobe import meminfo  # noqa: E402  (tools/gpu is on the path of whoever imports this: the scenarios, its tests)


# ----------------------------------------------------------------------------------------------- the agent

class AgentRun:
    """`gpuwarden agent ...` as a child; stderr's JSON lines kept as (monotonic arrival, record)."""

    def __init__(self, argv: list[str], env: dict | None = None) -> None:
        self.argv = argv
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        self.lines: list[tuple[float, dict]] = []
        self.raw: list[str] = []
        self.out: list[str] = []
        self._cv = threading.Condition()
        self._threads = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_err(self) -> None:
        for ln in self.p.stderr:  # type: ignore[union-attr]
            now = time.monotonic()
            try:
                rec = json.loads(ln)
            except ValueError:
                self.raw.append(ln.rstrip()[:300])
                continue
            if isinstance(rec, dict):
                with self._cv:
                    self.lines.append((now, rec))
                    self._cv.notify_all()

    def _read_out(self) -> None:
        for ln in self.p.stdout:  # type: ignore[union-attr]
            self.out.append(ln.rstrip()[:300])

    def wait_for(self, pred: Callable[[dict], bool], timeout: float, after: float = 0.0) -> tuple[float, dict] | None:
        """The first record arrived after `after` (monotonic) matching `pred`, waiting up to `timeout` s."""
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                hit = next(((t, r) for t, r in self.lines if t >= after and pred(r)), None)
                left = end - time.monotonic()
                if hit is not None or left <= 0 or self.p.poll() is not None:
                    return hit
                self._cv.wait(min(left, 0.5))

    def records(self, *msgs: str) -> list[tuple[float, dict]]:
        with self._cv:
            return [(t, r) for t, r in self.lines if not msgs or r.get("msg") in msgs]

    def stop(self, since: float | None = None) -> dict:
        """Stop it (SIGTERM, then SIGKILL) and summarise: the lines that matter, with their time since `since`."""
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        for t in self._threads:
            t.join(timeout=5)
        base = self.t0 if since is None else since
        keep = ("fault-raised", "fault-cleared", "remediation", "monitor-failed", "check-failed", "remediation-failed",
                "memory-guard", "memory-unsure", "memory-fast-sampling", "wake-source-unavailable",
                "wake-source-started", "agent-started", "start-failed", "memory-separation")
        log = [dict(r, at_s=round(t - base, 3)) for t, r in self.lines if r.get("msg") in keep]
        failed = [r for r in log if r.get("msg") == "remediation-failed"]
        log = [r for r in log if r.get("msg") != "remediation-failed" or r in failed[:3]]  # the API away: 1 a second
        checks = [r for _, r in self.lines if r.get("msg") == "check"]
        return {"argv": self.argv[3:], "log": log[:80], "remediation_failed": len(failed), "checks": sum(1 for r in checks if "scope" not in r),
                "targeted": sum(1 for r in checks if "scope" in r), "rc": self.p.returncode,
                "monitor_failed": sum(1 for _, r in self.lines if r.get("msg") == "monitor-failed"),
                "stdout": self.out[-20:], "not_json": self.raw[-20:],
                "check_lines": [dict(r, at_s=round(t - base, 3)) for t, r in self.lines
                                if r.get("msg") == "check" and t - base >= -5][:80]}


def full_check(rec: dict) -> bool:
    """A periodic (full) check's log line: a wake-up's carries its scope."""
    return rec.get("msg") == "check" and "scope" not in rec


def acted(rec: dict, action: str, target: str = "", results: tuple[str, ...] = ("done",)) -> bool:
    return (rec.get("msg") == "remediation" and rec.get("action") == action and rec.get("result") in results
            and (not target or rec.get("target") == target))


# ----------------------------------------------------------------------------------------------- memory

class MemWatch:
    """MemAvailable and MemFree every `period` s in a thread, and the moment each watched process died."""

    def __init__(self, period: float = 0.1, read: Callable[[], dict] = meminfo) -> None:
        self.period = period
        self.read = read
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, MemAvailable, MemFree)
        self.watched: dict[str, Any] = {}  # name -> Popen
        self.died: dict[str, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "MemWatch":
        self._t.start()
        return self

    def watch(self, name: str, popen: Any) -> None:
        self.watched[name] = popen

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            mi = self.read()
            self.samples.append((now, mi.get("MemAvailable", 0), mi.get("MemFree", 0)))
            for name, p in list(self.watched.items()):
                if name not in self.died and p.poll() is not None:
                    self.died[name] = now
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    def available(self) -> int:
        return self.samples[-1][1] if self.samples else self.read().get("MemAvailable", 0)


def fbs_due(rate_bytes_per_s: float, elapsed_s: float, leaked_bytes: int, per_fb_bytes: int, cap_bytes: int,
            max_step: int) -> int:
    """Framebuffers to make now so that the leak follows `rate_bytes_per_s`, never past `cap_bytes` in all and never
    more than `max_step` at once (what one worker command makes). `leaked_bytes` is what is gone so far."""
    if per_fb_bytes <= 0 or leaked_bytes + per_fb_bytes > cap_bytes:
        return 0
    want = min(rate_bytes_per_s * elapsed_s, cap_bytes) - leaked_bytes
    return max(0, min(max_step, math.ceil(want / per_fb_bytes), (cap_bytes - leaked_bytes) // per_fb_bytes))


def leak_figures(samples: list[tuple[float, int, int]], t_start: float, t_stop: float | None,
                 t_held: float | None = None) -> dict:
    """From MemWatch's samples: MemAvailable at the leak's start, its lowest up to the stop (the drop at the stop),
    the rate the leak achieved (least-squares slope of MemAvailable once it has begun to move, up to `t_held` when
    the leak was held at its cap), and the drop against a quarter of MemAvailable at the start (issue 41's target)."""
    before = [s for s in samples if s[0] <= t_start]
    during = [s for s in samples if s[0] > t_start and (t_stop is None or s[0] <= t_stop)]
    if not before or len(during) < 3:
        return {"error": "too few memory samples around the leak"}
    avail0 = before[-1][1]
    low = min(s[1] for s in during)
    drop = avail0 - low
    # the first framebuffers fill the GPU's last free memory and move nothing; a held leak moves nothing either
    moving = [s for s in during if avail0 - s[1] > 256 * MIB and (t_held is None or s[0] <= t_held)]
    slope = 0.0
    if len(moving) >= 3:
        n = len(moving)
        mt = sum(s[0] for s in moving) / n
        ma = sum(s[1] for s in moving) / n
        den = sum((s[0] - mt) ** 2 for s in moving)
        slope = -sum((s[0] - mt) * (s[1] - ma) for s in moving) / den if den > 0 else 0.0
    return {"memavailable_at_start": avail0, "memavailable_low": low, "drop_at_stop": drop,
            "drop_share": round(drop / avail0, 4) if avail0 else None, "quarter": avail0 // 4,
            "before_a_quarter": drop < avail0 / 4, "rate_bytes_per_min": int(slope * 60),
            "rate_gib_per_min": round(slope * 60 / GIB, 1),
            "moving_after_s": round(moving[0][0] - t_start, 3) if moving else None}


# ----------------------------------------------------------------------------------------------- the API side

def unpack_kit(kit: str | os.PathLike, into: str | os.PathLike) -> dict[str, str]:
    """The test API server and etcd carried to a host without them: `kit/testapiserver[.xz]`, `kit/etcd[.xz]`
    (xz: the carry limit). Decompressed into `into`, made executable; returns {"testapiserver": path, "etcd": path}."""
    out = {}
    Path(into).mkdir(parents=True, exist_ok=True)
    for name in ("testapiserver", "etcd"):
        dst = Path(into) / name
        for src in (Path(kit) / name, Path(kit) / f"{name}.xz"):
            if not src.exists():
                continue
            if src.suffix == ".xz":
                with lzma.open(src) as f, open(dst, "wb") as g:
                    shutil.copyfileobj(f, g, 1 << 20)
            else:
                shutil.copyfile(src, dst)
            dst.chmod(0o755)
            out[name] = str(dst)
            break
    return out


class KubeletStandIn:
    """What the kubelet does once the API server has evicted (deleted) a pod of its node: stop the pod's containers.

    `list_pods()` gives the node's pods as the API holds them, `stop(uid)` kills that pod's processes; every
    `period` s each tracked uid missing from the list, or carrying a deletionTimestamp, is stopped once (and,
    with `finalize`, a pod left terminating is removed from the API as the kubelet does after its containers
    are gone)."""

    def __init__(self, list_pods: Callable[[], list[dict]], stop: Callable[[str], Any], period: float = 0.1,
                 finalize: Callable[[dict], Any] | None = None) -> None:
        self.list_pods = list_pods
        self.stop_pod = stop
        self.finalize = finalize
        self.period = period
        self.tracked: dict[str, str] = {}  # uid -> ns/name
        self.stopped: dict[str, dict] = {}  # uid -> {"ref", "t", "why", "result"}
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def track(self, uid: str, ref: str) -> None:
        self.tracked[uid] = ref

    def start(self) -> "KubeletStandIn":
        self._t.start()
        return self

    def step(self) -> None:
        try:
            pods = {str((p.get("metadata") or {}).get("uid")): p for p in self.list_pods()}
        except Exception as exc:  # the API busy or away: try again at the next step
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        for uid, ref in list(self.tracked.items()):
            if uid in self.stopped:
                continue
            p = pods.get(uid)
            why = "deleted" if p is None else "terminating" if (p.get("metadata") or {}).get("deletionTimestamp") else ""
            if not why:
                continue
            t = time.monotonic()
            try:
                r = self.stop_pod(uid)
                result = "stopped" if r is None else str(r)
            except Exception as exc:
                result = f"failed: {type(exc).__name__}: {exc}"
            self.stopped[uid] = {"ref": ref, "t": t, "why": why, "result": result}
            if p is not None and self.finalize is not None:
                try:
                    self.finalize(p)
                except Exception as exc:
                    self.errors.append(f"finalize {ref}: {exc}"[:200])

    def _run(self) -> None:
        while not self._halt.is_set():
            self.step()
            self._halt.wait(self.period)

    def halt(self) -> None:
        self._halt.set()
        self._t.join(timeout=5)


OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True}


class ApiSession:
    """The test API server under the chart's RBAC and admission policies (agent remediate=on), a Node, the
    agent's namespace and the pods' namespaces; the agent reaches it with its node-bound ServiceAccount token,
    the harness as an admin. GW_MEM_AUTHZ_FILE: a rendering made elsewhere (`memory_scenarios.py render-authz
    FILE`, the GPU host has no Helm SDK); GW_MEM_APISERVER_KIT: a folder with testapiserver[.xz] and etcd[.xz]."""

    def __init__(self, node: str, work: str = "/tmp/gw-mem-api") -> None:
        from gpuwarden.kube.client import Kube
        from tests.support import apiserver

        kit = os.environ.get("GW_MEM_APISERVER_KIT")
        self.kit: dict[str, str] = unpack_kit(kit, work) if kit else {}
        if "testapiserver" in self.kit:
            os.environ["GPUWARDEN_TESTAPISERVER"] = self.kit["testapiserver"]
        authz, self.ids, self.authz_note = self._authz(node)
        t0 = time.monotonic()
        self.server = apiserver.start_apiserver(timeout=120, authz=authz, etcd=self.kit.get("etcd"),
                                                 binary=self.kit.get("testapiserver"))
        self.start_s = round(time.monotonic() - t0, 2)
        self.node = node
        self.admin = Kube(self.server.api_client())
        for ns in {self.ids.namespace if self.ids else "gpuwarden", "viz", "ml"}:
            self.admin.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": ns}})
        self._make_node()

    def _make_node(self) -> None:
        self.admin.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node, "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status"}]}})

    @staticmethod
    def _authz(node: str) -> tuple[dict | None, Any, str]:
        from tests.support import rbac

        given = os.environ.get("GW_MEM_AUTHZ_FILE")
        try:
            if given:
                doc = json.loads(Path(given).read_text())
                authz, ids = doc["authz"], rbac.Identities(**doc["ids"])
            else:
                authz, ids = chart_authz(node)
        except (ImportError, OSError, KeyError, ValueError) as exc:
            return None, None, f"no authorization: {type(exc).__name__}: {exc} (set GW_MEM_AUTHZ_FILE)"
        return authz, ids, f"the chart's RBAC and admission policies enforced (remediate on); agent {ids.agent_user}, " \
                           f"its token naming node {node}"

    @property
    def namespace(self) -> str:
        return self.ids.namespace if self.ids else "gpuwarden"

    def agent_kubeconfig(self) -> str:
        return self.server.kubeconfig_for(self.ids.agent_token(self.node)) if self.ids else self.server.kubeconfig_path

    def pod(self, namespace: str, name: str, gpu: bool = True) -> str:
        """A pod bound to the node, Running, owned by a ReplicaSet (the cascade controller's workload); its uid."""
        res = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "ownerReferences": [dict(OWNER, name=name.rsplit("-", 1)[0] + "-rs",
                                                      uid=f"00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}")]},
                "spec": {"nodeName": self.node, "terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "main", "image": "registry.example/x:1", "resources": res}]}}
        p = self.admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        self.admin.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                           {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                           content_type="application/merge-patch+json")
        return str(p["metadata"]["uid"])

    def node_pods(self) -> list[dict]:
        return self.admin.list_pods(node_name=self.node)

    def remove(self, pod: dict) -> None:
        md = pod["metadata"]
        self.admin.delete_pod(md["namespace"], md["name"], grace_s=0)

    def clear(self) -> None:
        """A fresh node for the next scenario: its pods, the Events (an agent rebuilds its cooldowns from them:
        the same pod name would be in cooldown) and the Node itself (its conditions and taints) made anew."""
        for p in self.node_pods():
            try:
                self.remove(p)
            except Exception:
                pass
        for e in self.admin.list_events():
            md = e.get("metadata") or {}
            try:
                self.admin.request("DELETE", f"/api/v1/namespaces/{md.get('namespace')}/events/{md.get('name')}")
            except Exception:
                pass
        try:
            self.admin.request("DELETE", f"/api/v1/nodes/{self.node}")
        except Exception:
            pass
        self._make_node()

    def events(self) -> list[dict]:
        return [{"reason": e.get("reason"), "action": e.get("action"), "note": (e.get("note") or e.get("message") or "")[:200],
                 "regarding": (e.get("regarding") or e.get("involvedObject") or {}).get("name")}
                for e in self.admin.list_events(namespace="", field_selector="reportingComponent=gpuwarden")]

    def denied(self) -> list[str] | str:
        from tests.support import rbac

        return rbac.denied(self.server.audit(), self.ids.agent_user) if self.ids else "not enforced"

    def close(self) -> None:
        self.server.stop()


def chart_authz(node: str) -> tuple[dict, Any]:
    """The chart's RBAC and policies for an agent on `node` with remediation on and the memory guard's last resort."""
    from tests.support import rbac

    return rbac.chart_authz("on", {"execute": False}, [node], values={"agent": {"remediate": "on",
                                                                                "memory_local_kill": True}})


def render_authz(path: str, node: str) -> None:
    """chart_authz() to `path`, for a host without the Helm SDK (GW_MEM_AUTHZ_FILE there)."""
    import dataclasses

    authz, ids = chart_authz(node)
    Path(path).write_text(json.dumps({"authz": authz, "ids": dataclasses.asdict(ids)}))
