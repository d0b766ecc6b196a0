"""The memory guard (incident 4), on its own: a pod CONFIRMED to have escaped its memory limit is evicted
through the API, and with the API server unreachable killed through its own cgroup (memory_local_kill).

Functions of the agent (its executor, cooldowns, token bucket, root, log): the check decides who,
this decides how, whatever the rest of the remediation plan does.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.findings import Finding, Status


def memory_escape(f: Finding) -> bool:
    """GPU-NODE-001 CONFIRMED for one pod named at high confidence (the only shape that carries data["pod"])."""
    pod = (f.data or {}).get("pod")
    return f.code == "GPU-NODE-001" and f.status == Status.CONFIRMED and isinstance(pod, dict) and bool(pod.get("name"))


def guard(agent: Any, escapes: list[Finding], errors: list[str]) -> list:
    """The memory guard, on its own: a pod CONFIRMED (high confidence) to have escaped its memory limit is
    evicted through the API, and with the API server unreachable killed through its cgroup (memory_local_kill),
    whatever the rest of the plan does. Its own try: no other action's failure reaches it."""
    out: list = []
    for f in escapes:
        unreachable = agent.kube is None
        if agent.executor is not None:
            try:
                _, got = agent._remediate([f])
                out += got
                unreachable = any(o.result == "failed" and o.detail.startswith("HTTP 0 ") for o in got)
            except Exception as exc:
                unreachable = getattr(exc, "status", None) == 0  # KubeError(0, …): no answer at all
                errors.append(f"memory guard: {exc}")
                agent.log.error("remediation-failed", guard="memory", code=f.code, error=str(exc))
                if not unreachable:  # the API answered, but the node or pod list failed: evict all the same
                    got = evict_alone(agent, f)
                    out += got
                    unreachable = any(o.result == "failed" and o.detail.startswith("HTTP 0 ") for o in got)
        if unreachable and agent.cfg.memory_local_kill:
            out += last_resort(agent, [f])
    return out


def evict_alone(agent: Any, f: Finding) -> list:
    """The eviction without the plan's cluster view (it could not be read): the executor's guards still
    apply (breaker, cooldown, rate limit; an unreadable breaker means no action)."""
    from gpuwarden.remediation.plan import Action, RemediationPlan, Target

    pod = f.data["pod"]
    tgt = Target("Pod", str(pod.get("name", "")), str(pod.get("namespace", "")), str(pod.get("uid", "")))
    plan = RemediationPlan(agent.cfg.node_name, [Action("evict-pod-for-memory", tgt, f.code, "holds the GPU context "
                                                        "whose driver allocations no cgroup is charged for")])
    try:
        return agent.executor.execute(plan, agent.cfg.remediate, {f.code: f})  # type: ignore[union-attr]
    except Exception as exc:
        agent.log.error("remediation-failed", guard="memory", code=f.code, error=str(exc))
        return []


def last_resort(agent: Any, acting: list[Finding]) -> list:
    """Kill the escaped pod's processes through its cgroup: only when the API cannot evict it."""
    from gpuwarden.remediation.plan import Target

    out = []
    for f in acting:
        pod = (f.data or {}).get("pod") if f.code == "GPU-NODE-001" else None
        if f.status != Status.CONFIRMED or not isinstance(pod, dict) or not pod.get("cgroup"):
            continue
        tgt = Target("Pod", str(pod.get("name", "")), str(pod.get("namespace", "")), str(pod.get("uid", "")))
        out.append(kill_local(agent, f, tgt, str(pod["cgroup"]), "the API server is unreachable and the pod escaped "
                              "its memory limit"))
    return out


def kill_local(agent: Any, f: Finding, tgt: Any, cgroup: str, why: str) -> Any:
    """One pod's processes killed through `cgroup`/cgroup.kill: confined to the live root, cooled down, rate-limited,
    logged, printed in a dry run (the memory guard's last resort and the unsure policy's, agent/unsure.py)."""
    from gpuwarden.remediation.executor import RemediationOutcome
    from gpuwarden.remediation.localkill import kill_pod
    from gpuwarden.remediation.plan import Action

    dry = agent.cfg.remediate != "on"
    a = Action("kill-pod-processes", tgt, f.code, f"{why}; kill its processes through {cgroup}/cgroup.kill")
    left = agent.local_cooldowns.remaining(a.kind, tgt.key)
    if not getattr(agent.root, "live", False):  # a bundle's cgroup.procs lists another machine's pids
        o = RemediationOutcome(a, "refused", "not a live node: nothing local to kill")
    elif left > 0:
        o = RemediationOutcome(a, "cooldown", f"{left:.0f}s of cooldown left")
    elif dry:
        o = RemediationOutcome(a, "dry-run" if agent.local_bucket.available() else "rate-limited", "would " + a.why)
        print(f"[dry-run] last resort: {o.result}: kill the processes of pod {tgt.ref} ({a.why})",
              file=agent.out, flush=True)
    elif not agent.local_bucket.take():
        o = RemediationOutcome(a, "rate-limited", f"token bucket empty ({agent.cfg.rate_per_hour:g}/h)")
    else:
        r = kill_pod(agent.root, cgroup, tgt.uid)
        agent.local_cooldowns.mark(a.kind, tgt.key)
        o = RemediationOutcome(a, "done" if r.ok else "refused" if r.error.startswith("refused") else "failed",
                               r.describe())
    agent.metrics.action(a.kind, o.result, dry)
    agent.log.info("remediation", action=a.kind, target=tgt.ref, uid=tgt.uid, code=f.code, result=o.result,
                   dry_run=dry, detail=o.detail, why=a.why)
    return o


def note_separation(agent: Any, findings: list[Finding]) -> None:
    """Log GPU-NODE-001's separation when it changes (status, method, holder): who the agent would name and why,
    once per change, so an operator sees the naming happen between the raise and an action (or why none came:
    run 20b on the H200 left no trace of it). Bounded: the tracking's reason and three evidence lines."""
    f = next((x for x in findings if x.code == "GPU-NODE-001"), None)
    sep = ((f.data or {}).get("escape") or {}).get("separation") if f is not None else None
    key = None if f is None or not isinstance(sep, dict) else (f.status.value, sep.get("method"), sep.get("holder"))
    if key == getattr(agent, "_separation_key", None):
        return
    agent._separation_key = key
    if key is None:
        return
    trend = ((f.data or {}).get("escape") or {}).get("trend")  # type: ignore[union-attr]
    track = (trend.get("tracking") if isinstance(trend, dict) else None) or {}
    agent.log.info("memory-separation", status=key[0], method=key[1], holder=key[2],
                   confidence=sep.get("confidence"), remaining=[str(x)[:80] for x in (sep.get("remaining") or [])][:8],
                   tracking=str(track.get("why", "") if isinstance(track, dict) else "")[:600],
                   evidence=[str(x)[:300] for x in (sep.get("evidence") or []) if "per-process" in str(x)][:3])
