"""The chart's ValidatingAdmissionPolicy that confines each agent to its node, its CEL evaluated.

Every expression of the rendered policy is compiled and evaluated here with a second CEL
implementation (cel-python), without a server, on the requests kube-apiserver would give it: the
agent writing to its own Node, pod and Events (admitted) and to another node's (refused), a token
without the node-name claim (refused), and another user (the policy does not match). The test API
server enforces the same policy with kube-apiserver's own plugin: tests/k8s/test_node_confinement.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gw_render", REPO / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

CLAIM = "authentication.kubernetes.io/node-name"
AGENT = "system:serviceaccount:gpuwarden:gpuwarden"


def policy() -> dict:
    return next(o for o in render.objects({}) if o["kind"] == "ValidatingAdmissionPolicy")


def admit(user: str, extra: dict | None, resource: str, obj: dict | None, old: dict | None = None,
          operation: str = "") -> tuple[bool, str]:
    """(admitted, message) as the policy decides: matchConditions, variables, validations in order."""
    import celpy
    env = celpy.Environment()

    def run(expr: str, act: dict):
        return env.program(env.compile(expr)).evaluate(act)

    p = policy()["spec"]
    request = {"userInfo": {"username": user, **({"extra": extra} if extra is not None else {})},
               "resource": {"group": "", "version": "v1", "resource": resource},
               "operation": operation or ("DELETE" if obj is None else "UPDATE" if old is not None else "CREATE")}
    act = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
           "oldObject": celpy.json_to_cel(old)}
    if not all(bool(run(m["expression"], act)) for m in p["matchConditions"]):
        return True, "not matched"
    variables = {v["name"]: run(v["expression"], act) for v in p["variables"]}
    act["variables"] = celpy.json_to_cel({k: str(v) for k, v in variables.items()})
    for v in p["validations"]:
        if not bool(run(v["expression"], act)):
            msg = v.get("message") or str(run(v["messageExpression"], act))
            return False, msg
    return True, ""


def node(name: str) -> dict:
    return {"metadata": {"name": name}}


def pod(on: str) -> dict:
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"nodeName": on}}


def event(instance: str, host: str | None = None, about: str | None = None, label: str | None = None,
          related: dict | None = None, annotation: str | None = None) -> dict:
    """An Event reported by `instance`; about Node `about` (default: the reporting node), else about a pod."""
    involved = {"kind": "Node", "name": about or instance} if about != "pod" else {"kind": "Pod", "name": "p"}
    md = {"name": "e", **({"labels": {"gpuwarden.io/node": label}} if label else {}),
          **({"annotations": {"gpuwarden.io/node": annotation}} if annotation else {})}
    return {"metadata": md, "involvedObject": involved, "reportingInstance": instance,
            "source": {"host": host or instance}, **({"related": related} if related else {})}


POD = {"kind": "Pod", "name": "p", "namespace": "ml", "uid": "u1"}


MINE = {CLAIM: ["gpu-a"]}


@pytest.mark.parametrize("case,resource,obj,old,ok", [
    ("own Node conditions", "nodes", node("gpu-a"), node("gpu-a"), True),
    ("another Node's conditions", "nodes", node("gpu-b"), node("gpu-b"), False),
    ("a pod on its node", "pods", None, pod("gpu-a"), True),
    ("a pod on another node", "pods", None, pod("gpu-b"), False),
    ("a pod on no node", "pods", None, {"metadata": {"name": "p"}, "spec": {}}, False),
    ("an Event for its node", "events", event("gpu-a"), None, True),
    ("an Event for another node", "events", event("gpu-b"), None, False),
    ("an Event with another source host", "events", event("gpu-a", "gpu-b"), None, False),
    ("an Event on its Node about a pod, labelled for it", "events", event("gpu-a", label="gpu-a", related=POD), None, True),
    ("an Event about a pod (its node unknowable here)", "events", event("gpu-a", about="pod", label="gpu-a"), None, False),
    ("an Event about another Node", "events", event("gpu-a", about="gpu-b"), None, False),
    ("an Event relating another Node", "events", event("gpu-a", related={"kind": "Node", "name": "gpu-b"}), None, False),
    ("an Event labelled for another node", "events", event("gpu-a", label="gpu-b"), None, False),
    ("an Event annotated for another node", "events", event("gpu-a", annotation="gpu-b"), None, False),
    ("its own Event bumped", "events", event("gpu-a"), event("gpu-a"), True),
    ("another node's Event retargeted to it", "events", event("gpu-a"), event("gpu-b"), False),
    ("its Event moved to another pod", "events", event("gpu-a", related=POD),
     event("gpu-a", related={**POD, "name": "q"}), False),
])
def test_the_agent_is_confined_to_its_node(case, resource, obj, old, ok):
    admitted, msg = admit(AGENT, MINE, resource, obj, old)
    assert admitted is ok, (case, msg)
    if not ok:
        assert "gpu-a" in msg


def test_a_token_without_the_node_claim_is_refused():
    admitted, msg = admit(AGENT, {}, "nodes", node("gpu-a"), node("gpu-a"))
    assert not admitted and "no node name" in msg
    assert not admit(AGENT, None, "events", event("gpu-a"))[0]


def test_other_users_are_not_matched():
    assert admit("system:serviceaccount:gpuwarden:gpuwarden-controller", None, "nodes", node("gpu-b")) == \
        (True, "not matched")


def test_the_policy_is_bound_and_denies():
    objs = render.objects({})
    b = next(o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert b["spec"]["policyName"] == policy()["metadata"]["name"] and b["spec"]["validationActions"] == ["Deny"]
    assert not [o for o in render.objects({"nodeConfinement": {"create": False}}) if "Admission" in o["kind"]]


def test_the_eviction_policy_is_on_by_default_and_only_where_the_agent_evicts():
    def names(values):
        return sorted(o["metadata"]["name"] for o in render.objects(values) if o["kind"] == "ValidatingAdmissionPolicy")

    on = {"agent": {"remediate": "on"}}
    assert names(on) == ["gpuwarden-eviction-confinement", "gpuwarden-node-confinement"]
    assert names({**on, "nodeConfinement": {"evictions": False}}) == ["gpuwarden-node-confinement"]
    for mode in ("off", "dry-run"):  # no pods/eviction in their RBAC: no policy, no pods informer
        assert names({"agent": {"remediate": mode}, "nodeConfinement": {"evictions": True}}) == [
            "gpuwarden-node-confinement"]
    [b] = [o for o in render.objects({**on, "nodeConfinement": {"evictions": True}})
           if o["kind"] == "ValidatingAdmissionPolicyBinding" and "eviction" in o["metadata"]["name"]]
    assert b["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}


# -- the policy follows the cluster's version (.Capabilities.KubeVersion) ----------------------------------


def _notes(values: dict, version: str) -> str:
    return next(t for n, t in render.template(values, version).items() if n.endswith("NOTES.txt"))


def _policies(values: dict, version: str) -> list[str]:
    return [o["kind"] for o in render.objects(values, version) if "AdmissionPolicy" in o["kind"]]


@pytest.mark.parametrize("version", ["1.29.0", "1.30.0", "1.31.9"])
def test_by_default_below_1_32_no_policy_refuses_the_agent_and_notes_say_why(version):
    assert _policies({}, version) == []
    notes = _notes({}, version)
    assert "Node confinement: off, because Kubernetes v" + version in notes and "older than 1.32" in notes


@pytest.mark.parametrize("version", ["1.32.0", "1.37.0"])
def test_by_default_from_1_32_the_agent_is_confined(version):
    assert _policies({}, version) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert "Node confinement: on" in _notes({}, version)


def test_forced_on_where_the_api_is_missing_fails_saying_what_to_set():
    from helm_python.errors import HelmError

    with pytest.raises(HelmError, match=r"needs Kubernetes >= 1.30 .* set nodeConfinement.create=auto \(or false\)"):
        render.objects({"nodeConfinement": {"create": True}}, "1.29.0")
    with pytest.raises(HelmError, match="must be auto, true or false"):
        render.objects({"nodeConfinement": {"create": "yes"}}, "1.37.0")


def test_forced_on_before_1_32_renders_with_a_warning_and_off_is_off():
    assert _policies({"nodeConfinement": {"create": True}}, "1.31.0")
    assert "WARNING: Kubernetes v1.31.0 is older than 1.32" in _notes({"nodeConfinement": {"create": True}}, "1.31.0")
    assert _policies({"nodeConfinement": {"create": False}}, "1.37.0") == []
    assert "Node confinement: off (nodeConfinement.create=false)" in _notes({"nodeConfinement": {"create": False}},
                                                                            "1.37.0")
