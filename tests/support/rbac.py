"""The chart's RBAC, rendered for one mode, as the test API server enforces it (--authz-file).

    authz, ids = chart_authz(agent_mode="on", controller={"execute": True, "actions": ["workload", "taint"]},
                             agent_nodes=["gpu-a"])
    with start_apiserver(authz=authz) as s:
        agent_api = s.api_client(ids.agent_token("gpu-a"))     # system:serviceaccount:<ns>:gpuwarden
        ...
        check_least_privilege(s.audit(), authz, ids.agent_user)  # no 403, no granted rule unused

The chart is rendered by Helm's own engine (deploy/render.py); the agent's tokens carry the node-name
claim a bound ServiceAccount token of a pod on that node carries (authentication.kubernetes.io/node-name).
The chart's ValidatingAdmissionPolicies and bindings go with the RBAC (`authz["objects"]`): the server
creates them through its API before it is ready, and enforces them with kube-apiserver's own plugin.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
#: the kinds a chart renders that the test API server enforces at admission
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _render():
    spec = importlib.util.spec_from_file_location("gw_render", REPO / "deploy" / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Identities:
    namespace: str
    agent_user: str
    controller_user: str
    tokens: dict[str, dict] = field(default_factory=dict)

    def agent_token(self, node: str) -> str:
        return next(t for t, i in self.tokens.items()
                    if i["user"] == self.agent_user and i["extra"].get(NODE_NAME_CLAIM) == [node])

    @property
    def controller_token(self) -> str:
        return next(t for t, i in self.tokens.items() if i["user"] == self.controller_user)

    @property
    def legacy_agent_token(self) -> str:
        """A token of the agent's ServiceAccount that names no node (a legacy Secret token)."""
        return next(t for t, i in self.tokens.items() if i["user"] == self.agent_user and not i["extra"])


def bound_token_claims(pod: str, node: str) -> dict[str, list[str]]:
    """The extra claims kube-apiserver gives the user of a pod's bound ServiceAccount token (Kubernetes
    >= 1.32 adds the node's; the ids here are made up)."""
    pod_uid, node_uid, jti = (str(uuid.uuid4()) for _ in range(3))
    return {"authentication.kubernetes.io/pod-name": [pod], "authentication.kubernetes.io/pod-uid": [pod_uid],
            NODE_NAME_CLAIM: [node], "authentication.kubernetes.io/node-uid": [node_uid],
            "authentication.kubernetes.io/credential-id": [f"JTI={jti}"]}


def chart_authz(agent_mode: str, controller: dict, agent_nodes: list[str],
                values: dict | None = None) -> tuple[dict, Identities]:
    """The chart's Roles, ClusterRoles, bindings and admission policies for these values (`values` on
    top), and a token per identity: one per agent node, one of the agent's naming no node (a legacy
    Secret token), one for the controller."""
    objs = _render().objects({"agent": {"remediate": agent_mode}, "controller": controller, **(values or {})})
    kinds = {"ClusterRole": "clusterRoles", "Role": "roles", "ClusterRoleBinding": "clusterRoleBindings",
             "RoleBinding": "roleBindings"}
    authz: dict = {v: [] for v in kinds.values()}
    authz["objects"] = [o for o in objs if o["kind"] in ADMISSION_KINDS]
    for o in objs:
        if o["kind"] in kinds:
            authz[kinds[o["kind"]]].append(o)
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    dep = next(o for o in objs if o["kind"] == "Deployment")
    ns = ds["metadata"]["namespace"]
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    csa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    ids = Identities(ns, f"system:serviceaccount:{ns}:{sa}",
                     f"system:serviceaccount:{dep['metadata']['namespace']}:{csa}")
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
    for node in agent_nodes:
        ids.tokens[os.urandom(12).hex()] = {"user": ids.agent_user, "groups": groups,
                                            "extra": bound_token_claims(f"{ds['metadata']['name']}-{node}", node)}
    ids.tokens[os.urandom(12).hex()] = {"user": ids.agent_user, "groups": groups, "extra": {}}
    # the controller's pod runs on some node too: its token names it, and the policy must not confine it
    ids.tokens[os.urandom(12).hex()] = {"user": ids.controller_user, "groups": groups,
                                        "extra": bound_token_claims(f"{dep['metadata']['name']}-0", "cpu-node-0")}
    authz["tokens"] = ids.tokens
    return authz, ids


def granted(authz: dict, user: str, groups: tuple[str, ...] = ()) -> set[tuple[str, int, str]]:
    """(role, rule index, verb) of every rule bound to `user` (a ServiceAccount's, or a person's in
    `groups`): the unit a test holds the code to. A verb of a rule granted and never used is a finding;
    the resources of one rule are the kinds one code path handles alike (a workload's owner chain:
    Deployment, StatefulSet, ReplicaSet)."""
    out = set()

    def matches(s: dict, binding_ns: str | None) -> bool:
        if s.get("kind") == "ServiceAccount":
            return user == f"system:serviceaccount:{s.get('namespace') or binding_ns}:{s.get('name')}"
        return s.get("name") == user if s.get("kind") == "User" else s.get("name") in groups

    def bound(b: dict) -> bool:
        return any(matches(s, b["metadata"].get("namespace")) for s in b.get("subjects") or [])

    for b in authz["clusterRoleBindings"]:
        if bound(b):
            role = next(r for r in authz["clusterRoles"] if r["metadata"]["name"] == b["roleRef"]["name"])
            out |= _expand(f"ClusterRole/{role['metadata']['name']}", role)
    for b in authz["roleBindings"]:
        if bound(b) and b["roleRef"]["kind"] == "Role":
            bns = b["metadata"]["namespace"]
            role = next(r for r in authz["roles"] if r["metadata"]["name"] == b["roleRef"]["name"]
                        and r["metadata"]["namespace"] == bns)
            out |= _expand(f"Role/{bns}/{role['metadata']['name']}", role)
    return out


def _expand(label: str, role: dict) -> set[tuple[str, int, str]]:
    return {(label, i, v) for i, rule in enumerate(role.get("rules") or []) for v in rule.get("verbs") or []}


def used(audit: list[dict], user: str) -> set[tuple[str, int, str]]:
    return {(a["role"], a["rule"], a["verb"]) for a in audit if a["user"] == user and a["allowed"]}


def denied(audit: list[dict], user: str) -> list[str]:
    """The requests of `user` refused by RBAC (403) or at admission (a policy's 422: `[admission: why]`)."""
    return [f"{a['verb']} {a.get('resource', '')}{'/' + a['subresource'] if a.get('subresource') else ''} "
            f"{a.get('namespace', '')}/{a.get('name', '')} ({a['path']})"
            + (f" [admission: {a['admission']}]" if a.get("admission") else "")
            for a in audit if a["user"] == user and not a["allowed"]]


def least_privilege_report(audit: list[dict], authz: dict, user: str,
                           groups: tuple[str, ...] = ()) -> tuple[list[str], list[tuple]]:
    """(requests refused, granted (role, rule, verb) never used) for `user` (in `groups`)."""
    return denied(audit, user), sorted(granted(authz, user, groups) - used(audit, user))
