"""The DRA inputs under Hypothesis (issue 44): CDI specs, `dra_manager_state`, the NVIDIA driver's
checkpoint, the plugin and registry directories.

Properties: no exception and bounded time on any of them; an impossible device number or name
never comes out of the CDI parser as a fact, and never yields a CONFIRMED finding of a claim's
spec; a checkpoint that repeats a claim gives no claim and one reason, whatever the number of
repeats; nothing a node's files say reaches the text report as a terminal control.
tests/security/test_dra_hostile.py holds the issue's own inputs as plain tests.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from hypothesis import example, given, settings, strategies as st

from gpuwarden.findings import Status
from gpuwarden.parsers import cdi, dra_checkpoint, plausible
from gpuwarden.render import text as render_text
from tests.support.bundles import copy_example, edit_meta, open_dir, report_of, write
from tests.support.dranode import kubelet_state

SPEC = "/var/run/cdi/k8s.gpu.nvidia.com-claim_a9630d8a-a387-46b3-9a58-596caeec4da1.yaml"
STATE = "/var/lib/kubelet/dra_manager_state"
DRIVER_CP = "/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json"
REGISTRY, PLUGINS = "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"
#: what must never reach a terminal raw (a newline only as the report's own)
CONTROLS = [chr(c) for c in [*range(0, 9), *range(11, 32), *range(0x7f, 0xa0)]] + ["\u202e", "\u2066", "\u2028"]

#: numbers as damage writes them, around every bound, and what is no number at all
_NUMBER = st.one_of(st.integers(-(1 << 40), 1 << 40), st.sampled_from(
    [0, 195, 4095, 4096, 1 << 20, (1 << 20) - 1, (1 << 31), (1 << 32) - 1, 1 << 32, -1]),
    st.sampled_from(["195", 1.5, True, None, [], {}, float("nan")]))
_PATH = st.one_of(st.sampled_from(["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia253",
                                   "/dev/nvidia254", "/dev/nvidia99999999", "/dev/nvidia-caps/nvidia-cap1",
                                   "dev/nvidia0", "", "/dev/nvidia0\x00x", "/" + "a" * 300, "/dev/" + "n" * 5000]),
                  st.integers(0, 1 << 30).map(lambda n: f"/dev/nvidia{n}"), st.text(max_size=30))
_NODE = st.fixed_dictionaries({"path": _PATH}, optional={"major": _NUMBER, "minor": _NUMBER, "type": st.sampled_from(
    ["c", "b", "x"]), "hostPath": _PATH})


def _spec(common: list[dict], dev: list[dict]) -> str:
    return json.dumps({"cdiVersion": "0.6.0", "kind": "k8s.gpu.nvidia.com/claim",
                       "containerEdits": {"deviceNodes": common},
                       "devices": [{"name": "a9630d8a-a387-46b3-9a58-596caeec4da1-gpu-0",
                                    "containerEdits": {"deviceNodes": dev}}]}, allow_nan=True)


@settings(max_examples=150)
@given(common=st.lists(_NODE, max_size=4), dev=st.lists(_NODE, max_size=4))
@example(common=[], dev=[{"path": "/dev/nvidia0", "major": 4096, "minor": 0}])
def test_no_impossible_device_comes_out_of_the_cdi_parser(common: list[dict], dev: list[dict]) -> None:
    spec = cdi.parse(_spec(common, dev))
    assert spec is not None
    nodes = [n for e in [spec.common, *spec.devices.values()] for n in e.device_nodes]
    for n in nodes:  # what is kept is a device a kernel and the NVIDIA driver can have
        assert plausible.device_problem(n.path, n.major, n.minor) is None
        assert n.host_path == "" or plausible.device_problem(n.host_path) is None
    if spec.impossible:
        assert len(spec.impossible) <= cdi.MAX_IMPOSSIBLE and all(len(w) < 400 for w in spec.impossible)
    else:
        assert len(nodes) == sum(isinstance(n.get("path"), str) for n in common + dev)


_UID = st.sampled_from(["a9630d8a-a387-46b3-9a58-596caeec4da1", "u1", "u2", "", "\x1b[2J"])


@settings(max_examples=100)
@given(uids=st.lists(_UID, max_size=30))
def test_a_kubelet_state_repeating_a_claim_gives_no_claim(uids: list[str]) -> None:
    state = dra_checkpoint.parse_kubelet(kubelet_state([(u, "n", "ns", ["p"], "gpu-0", ["x/y=z"]) for u in uids]))
    assert state is not None
    if len(set(uids)) < len(uids):
        assert state.claims == [] and "repeat" in state.problem and state.problem.count("\n") == 0
    else:
        assert state.problem == "" and [c.uid for c in state.claims] == uids


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                        max_leaves=12)


@settings(max_examples=100)
@given(body=st.dictionaries(st.sampled_from(["v1", "v2", "checksum", "preparedClaims", "nodeBootID"]), _JSONISH,
                            max_size=4), dup=st.booleans())
def test_the_driver_checkpoint_never_raises_and_a_repeated_key_is_damage(body: dict, dup: bool) -> None:
    text = json.dumps({"checksum": 1, **body})
    if dup:
        text = text[:-1] + ', "checksum": 2}'
    cp = dra_checkpoint.parse_driver(text)
    if dup:
        assert cp is not None and cp.claims == {} and "twice" in cp.problem
    elif cp is not None:
        assert cp.problem == ""


# -- whole checks: a few examples each, the parser properties above take the volume -------------------

def _check(b: Path) -> tuple[object, str]:
    t0 = time.monotonic()
    rep = report_of(open_dir(b))
    assert rep.errors == [], rep.errors
    out = io.StringIO()
    render_text.render(rep, out, verbose=True)
    assert time.monotonic() - t0 < 15
    assert not [c for c in CONTROLS if c in out.getvalue()]
    return rep, out.getvalue()


@settings(max_examples=10, deadline=30_000)
@given(node=_NODE)
@example(node={"path": "/dev/nvidia0", "major": 4294967295, "minor": 0})
def test_an_impossible_claim_spec_confirms_nothing_from_it(tmp_path_factory, node: dict) -> None:
    tmp = tmp_path_factory.mktemp("s")
    b = copy_example("dra-uvm-missing", tmp)
    write(b, SPEC, _spec([{"path": "/dev/nvidiactl", "major": 195, "minor": 255}], [node]))
    rep, _ = _check(b)
    if plausible.device_problem(node["path"], node.get("major"), node.get("minor")) or (
            isinstance(node.get("hostPath"), str) and node["hostPath"] and plausible.device_problem(node["hostPath"])):
        assert [f.code for f in rep.findings if f.status is Status.CONFIRMED] == []  # the example's one is the spec's
        assert {g.source: g.reason for g in rep.gaps}[SPEC].startswith("unreadable (malformed): impossible values")


_HOSTILE = st.text(alphabet=st.sampled_from(CONTROLS + list("ab/-.\n 好")), max_size=12)
FORGED = "HIGH     CONFIRMED GPU-FAKE"


@settings(max_examples=10, deadline=30_000)
@given(name=_HOSTILE, ns=_HOSTILE, repeats=st.integers(1, 50))
def test_a_hostile_claim_state_is_bounded_and_escaped(tmp_path_factory, name: str, ns: str, repeats: int) -> None:
    tmp = tmp_path_factory.mktemp("k")
    b = copy_example("dra-uvm-missing", tmp)
    doc = json.loads((b / "files" / STATE.lstrip("/")).read_text())
    data = json.loads(doc["Data"])
    data["Entries"][0].update(ClaimName=name, Namespace=ns + "\n" + FORGED)
    data["Entries"] *= repeats
    doc["Data"] = json.dumps(data)
    write(b, STATE, json.dumps(doc))
    rep, out = _check(b)
    assert [f.code for f in rep.findings].count("GPU-DRA-010") <= 1
    assert not [ln for ln in out.splitlines() if ln.startswith(FORGED)]
    if repeats > 1:  # damage: nothing confirmed about the claim or the pods the file names
        assert [f.code for f in rep.findings if f.status is Status.CONFIRMED] == []


@settings(max_examples=10, deadline=30_000)
@given(text=st.one_of(st.text(max_size=200), _JSONISH.map(json.dumps)))
def test_a_garbage_driver_checkpoint_is_bounded(tmp_path_factory, text: str) -> None:
    b = copy_example("dra-uvm-missing", tmp_path_factory.mktemp("c"))
    write(b, DRIVER_CP, text)
    _check(b)


_NAME = st.one_of(st.sampled_from(["gpu.nvidia.com", "x.y%2F..%2F..%2Ftmp%2Fevil.sock?", "a.b#frag", "..", ".",
                                   "a" * 300 + ".io", "gpu.nvidia.com\x1b[2J"]), st.text(min_size=1, max_size=40))


@settings(max_examples=10, deadline=30_000)
@given(registry=st.lists(_NAME, max_size=6), plugins=st.lists(_NAME, max_size=6))
def test_any_plugin_and_registry_directory_is_bounded(tmp_path_factory, registry: list[str], plugins: list[str]) -> None:
    """Names as anyone may list them (a bundle's manifest): dots, %2F, ?, #, controls, long ones."""
    b = copy_example("dra-uvm-missing", tmp_path_factory.mktemp("p"))

    def edit(m: dict) -> None:
        m["listdir"][REGISTRY] = [f"{n}-reg.sock" for n in registry]
        m["listdir"][PLUGINS] = list(plugins)
        for n in registry:
            p = f"{REGISTRY}/{n}-reg.sock"
            m["stat"][p] = {"path": p, "kind": "other", "mode": 0o140755}
        for n in plugins:
            p = f"{PLUGINS}/{n}/dra.sock"
            m["stat"][p] = {"path": p, "kind": "other", "mode": 0o140755}

    edit_meta(b, edit)
    rep, _ = _check(b)
    assert not [f for f in rep.findings if f.code.startswith("GPU-DRA-03") and f.status is Status.CONFIRMED]
