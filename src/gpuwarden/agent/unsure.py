"""Never let the node die while unsure (issue 43, item 2): the operator's policy for candidates not separated.

GPU-NODE-001 names the holder of the uncharged memory only on evidence; when it cannot, it names candidates and
acts on none. If that memory keeps growing, the node reaches the kernel's min watermark, thrashes and goes
NotReady (incident 4), and eviction carries every candidate to the next node. `memory_unsure_policy` says what the
agent does then, once the projected time to the min watermark is under `memory_unsure_bound_s` and the growth
still goes on:

- `alert` (default): nothing beyond the finding;
- `stop-graphics-candidates`: evict every graphics candidate (NVML type G/C+G), never a compute pod; with the API
  unreachable and `memory_local_kill`, kill them through their cgroups;
- `fence-and-evict`: taint the node `gpuwarden.io/memory-unsure=node-memory:NoSchedule` and evict every candidate
  through the API; an operator lifts the taint.

`decide` is pure (the finding's data in, the actions out); `act` runs them through the executor and the local kill,
so every action is confined, rate-limited, cooled down, logged and printed in a dry run as any other.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from gpuwarden.findings import Finding, Status

POLICIES = ("alert", "stop-graphics-candidates", "fence-and-evict")
#: the fence's own taint key: not the fault taint the plan lifts when no driver/hardware fault is raised; an operator
#: lifts it once the node is sound (the agent cannot tell that the holder it could not name is gone)
FENCE_KEY = "gpuwarden.io/memory-unsure"
#: the growth must have taken this share of the headroom the node had when it began (MemAvailable above the min
#: watermark): a large but bounded scene loading fast projects a near watermark too, but it stops before this
GROWTH_SHARE = 0.125


class UnsurePlan(Struct):
    """What the policy asks for now: the pods to stop, whether to fence, and why (or why not)."""

    policy: str
    act: bool
    why: str
    pods: list[dict] = field(default_factory=list)  # {namespace, name, uid, cgroup, graphics}
    spared: list[str] = field(default_factory=list)  # candidates left alone, with the reason
    fence: bool = False
    reason: str = "act"  # alert | no-projection | far | stopped | small | act: the log says a change of it once


def unsure(f: Finding) -> bool:
    """GPU-NODE-001 naming candidates it could not separate (the only shape that carries data["unsure"])."""
    return f.code == "GPU-NODE-001" and f.status in (Status.AT_RISK, Status.CONFIRMED) and not (f.data or {}).get("pod") \
        and isinstance((f.data or {}).get("unsure"), dict)


def decide(data: dict, policy: str, bound_s: float, growth_bytes_per_min: int) -> UnsurePlan:
    """The policy's decision from a finding's data["unsure"] (rules/memory.py): act only when the projected time
    to the min watermark is under `bound_s`, the latest samples still grow at the growth threshold (a bounded
    growth that stopped projects nothing), and this growth has taken `GROWTH_SHARE` of the headroom the node had
    when it began (a bounded scene stops before)."""
    u = data.get("unsure") or {}
    tte, recent = u.get("seconds_to_min_watermark"), u.get("recent_rate_bytes_per_s")
    cands = [c for c in u.get("candidates") or [] if isinstance(c, dict)]
    if policy == "alert":
        return UnsurePlan(policy, False, "memory_unsure_policy is alert: the finding is the only action",
                          reason="alert")
    if tte is None:
        return UnsurePlan(policy, False, "no projection to the min watermark (not growing, or unknown)",
                          reason="no-projection")
    if tte > bound_s:
        return UnsurePlan(policy, False, f"the min watermark is {tte:.0f}s away at this rate, over the {bound_s:g}s bound",
                          reason="far")
    if recent is None or recent * 60 < growth_bytes_per_min:
        return UnsurePlan(policy, False, "the growth has stopped in the latest samples (a bounded growth)",
                          reason="stopped")
    grown, room = u.get("growth_bytes") or 0, u.get("headroom_bytes")
    if room is None or grown < GROWTH_SHARE * (room + grown):
        return UnsurePlan(policy, False, f"this growth has taken {grown / (1 << 30):.1f} GiB, under "
                          f"{GROWTH_SHARE:.1%} of the headroom it began with" if room is not None else
                          "the headroom above the min watermark is unknown", reason="small")
    pods, spared = [], []
    for c in cands:
        if c.get("kind") != "pod" or not c.get("name"):
            spared.append(f"{c.get('ref', '?')}: not a pod (a host process is never stopped by this policy)")
        elif policy == "stop-graphics-candidates" and not c.get("graphics"):
            spared.append(f"{c.get('ref', '?')}: not a graphics client (NVML does not list it as G/C+G)")
        else:
            pods.append(c)
    why = (f"candidates not separated and the min watermark {tte:.0f}s away (bound {bound_s:g}s), "
           f"still growing {recent * 60 / (1 << 30):.1f} GiB/min, {grown / (1 << 30):.1f} GiB of "
           f"{(room + grown) / (1 << 30):.1f} GiB of headroom gone: {policy}")
    fence = policy == "fence-and-evict"
    return UnsurePlan(policy, bool(pods) or fence, why, pods, spared, fence)


def act(agent: Any, acting: list[Finding]) -> list:
    """Run the policy for the raised unsure findings: evictions (and the fence) through the executor, the local
    kill when the API is unreachable. Outcomes as the memory guard's."""
    cfg = agent.cfg
    out: list = []
    for f in acting:
        if not unsure(f):
            continue
        plan = decide(f.data or {}, cfg.memory_unsure_policy, cfg.memory_unsure_bound_s, cfg.memory_growth_bytes_per_min)
        said = plan.reason
        if plan.act or getattr(agent, "_unsure_said", None) != said:  # a decision not to act: once, not per check
            agent.log.info("memory-unsure", policy=plan.policy, act=plan.act, why=plan.why,
                           pods=[f"{p.get('namespace')}/{p.get('name')}" for p in plan.pods], spared=plan.spared)
        agent._unsure_said = said
        if not plan.act:
            continue
        if cfg.remediate == "dry-run":
            print(f"[dry-run] memory unsure policy {plan.policy}: {plan.why}; would "
                  + ("taint the node and " if plan.fence else "")
                  + "stop " + (", ".join(f"{p['namespace']}/{p['name']}" for p in plan.pods) or "no pod")
                  + ("; spared: " + "; ".join(plan.spared) if plan.spared else ""), file=agent.out, flush=True)
        out += _run(agent, f, plan)
    return out


def _targets(agent: Any, pods: list[dict]) -> tuple[list, bool]:
    """The pods as remediation targets: from the node's pod list when the API answers (their owner, for the cascade
    controller), else from the finding's data; and whether the API server gave no answer at all."""
    from gpuwarden.remediation.plan import Target, pod_target

    listed: dict[str, dict] = {}
    unreachable = agent.kube is None or agent.executor is None
    if not unreachable:
        try:
            listed = {str((p.get("metadata") or {}).get("uid")): p for p in agent._node_pods()}
        except Exception as exc:
            unreachable = getattr(exc, "status", None) == 0  # KubeError(0, …): no answer at all
    return [pod_target(listed[p["uid"]]) if p.get("uid") in listed else
            Target("Pod", str(p["name"]), str(p.get("namespace", "")), str(p.get("uid", ""))) for p in pods], unreachable


def _run(agent: Any, f: Finding, plan: UnsurePlan) -> list:
    from gpuwarden.agent.memguard import kill_local
    from gpuwarden.remediation.plan import Action, RemediationPlan, Target

    cfg = agent.cfg
    why = "candidate holder of uncharged host memory that could not be separated, the node near its min watermark"
    actions = []
    if plan.fence:
        actions.append(Action("taint-node", Target("Node", cfg.node_name), f.code, plan.why,
                              {"taint": {"key": FENCE_KEY, "value": "node-memory", "effect": "NoSchedule"}}))
    targets, unreachable = _targets(agent, plan.pods)
    actions += [Action("evict-pod-for-memory", t, f.code, why) for t in targets]
    out: list = []
    if not unreachable:
        try:
            out = agent.executor.execute(RemediationPlan(cfg.node_name, actions), cfg.remediate, {f.code: f})
            unreachable = any(o.result == "failed" and o.detail.startswith("HTTP 0 ") for o in out)
        except Exception as exc:
            unreachable = getattr(exc, "status", None) == 0
            agent.log.error("remediation-failed", guard="memory-unsure", code=f.code, error=str(exc))
    if unreachable and cfg.memory_local_kill and plan.policy == "stop-graphics-candidates":
        for p, t in zip(plan.pods, targets):
            if p.get("cgroup"):
                out.append(kill_local(agent, f, t, str(p["cgroup"]), "the API server is unreachable; " + why))
    return out
