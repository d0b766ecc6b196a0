"""safeyaml.plain, the documents read without PyYAML (JSON, plain block mappings), against PyYAML:
whatever it reads, PyYAML reads the same (values and their types), and it is not sure of the rest."""

from __future__ import annotations

import json
import math
import string
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuwarden import safeyaml


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True is not 1, 1.0 is not 1, key order counts)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(_same(ka, kb) and _same(a[ka], b[kb]) for ka, kb in zip(a, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b) or (math.isnan(a) and math.isnan(b))
    return a == b


def _check(text: str) -> Any:
    """plain(text), which when not None must be what safeyaml's PyYAML path and yaml.safe_load read."""
    got = safeyaml.plain(text)
    if got is not None:
        docs = safeyaml.load_all(text)  # PyYAML (libyaml's parser where present), bounded
        assert len(docs) == 1 and _same(got, docs[0]), (text, got, docs)
        assert _same(got, yaml.safe_load(text)), text
        assert _same(safeyaml.load(text), got)
    return got


KUBEADM = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
"""

GKE = """\
apiVersion: kubelet.config.k8s.io/v1beta1
cgroupRoot: /
clusterDNS:
  - 10.0.0.10
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
featureGates:
  DisableKubeletCloudCredentialProviders: true
  ExecProbeTimeout: false
kind: KubeletConfiguration
kubeReserved:
  cpu: 1060m
  ephemeral-storage: 41Gi
readOnlyPort: 10255   # comment
tlsCipherSuites: []
"""

EKS = json.dumps({
    "kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "address": "0.0.0.0", "authentication": {"anonymous": {"enabled": False}, "webhook": {"cacheTTL": "2m0s",
                                                                                      "enabled": True}},
    "clusterDNS": ["10.100.0.10"], "clusterDomain": "cluster.local", "cpuManagerPolicy": "static",
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"}, "featureGates":
    {"RotateKubeletServerCertificate": True}, "kubeReserved": {"cpu": "70m", "memory": "442Mi"},
    "maxPods": 58, "imageGCHighThresholdPercent": 85, "registryPullQPS": 0.5, "systemReserved": None,
}, indent=4)


@pytest.mark.parametrize("text", [KUBEADM, GKE, EKS, json.dumps(json.loads(EKS)), "a: 1\n", "{}", "[]",
                                  "a:\n  - x\n  - 'y z'\nb:\n", "a:\n- 1.5\n- -2\n- +3\nb: {}\n"])
def test_real_configs_are_read_without_pyyaml_as_pyyaml_reads_them(text: str) -> None:
    assert _check(text) is not None


def test_the_example_kubelet_config_is_read_without_pyyaml() -> None:
    from gpuwarden.examples import open_example

    text = open_example("healthy").read_text("/var/lib/kubelet/config.yaml")
    assert _check(text)["cgroupDriver"] == "cgroupfs"


#: every YAML 1.1 form PyYAML reads as something other than text, and the look-alikes it reads as text
SCALARS = [
    "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF", "true", "True", "TRUE", "false",
    "False", "FALSE", "y", "n", "Y", "N", "yES", "tRUE", "~", "null", "Null", "NULL", "nULL", "none", "None",
    "0", "-0", "+0", "00", "007", "08", "0o17", "0b101", "-0b1", "0x1F", "0X1F", "-0x1f", "0x", "1_000", "1__0",
    "_1", "1:30", "-1:30:00", "190:20:30.15", "1:60", "1.5", "-1.5", "+1.5", "1.", ".5", "-.5", "1.5e3",
    "1.5e+3", "1.5E-3", "1e3", "1e+3", ".inf", "-.inf", "+.INF", ".Inf", ".nan", ".NaN", ".NAN", "nan", "inf",
    "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5", "2001-12-15T02:59:43.1Z",
    "2001-13-45", "127.0.0.1", "10.96.0.10", "1.2.3", "1..2", "1.2.", "0s", "500Mi", "10%", "5m0s", "1h30m",
    "0.5", "00.5", "1" * 120, "1" * 5000, "9" * 99 + ".5", "=", "<<", "-", "- x", "--", "-x", "+x", ".x", "/",
    "/a/b", "a b", "a  b", "a #b", "a#b", "a: b", "a:", "a:b", "x:[", "'q'", "'it''s'", '"d"', '"a\\tb"',
    '"a\\/b"', '""', "''", '"x"#c', '"x" #c', "{}", "[]", "{a: 1}", "[1]", "&a x", "*a", "!!str 1",
    "!!int 1", "|", ">", "%x", "@x", "`x", "?x", "? x", ",x", "#", "a\\b", "~x", "x~",
]

KEYS = ["a", "key", "memory.available", "kubernetes.io/os", "ephemeral-storage", "_x", "on", "off", "yes", "y",
        "n", "no", "true", "null", "Null", "~", "1", "0x1", "1.5", "<<", "=", "-x", "a b", "a:b", "'q'", '"q"',
        "k" * 300, "k" * 2000, "é", "x\ty", "?", "a#b", "a #b", "[a]"]


@pytest.mark.parametrize("value", SCALARS)
@pytest.mark.parametrize("form", ["k: {}\n", "k: {}", "k:   {}  \n", "k:\n- {}\n", "k:\n  - {}\n", "k: {} # c\n"])
def test_each_scalar_form_is_read_as_pyyaml_reads_it_or_left_to_it(value: str, form: str) -> None:
    _check(form.replace("{}", value, 1))


@pytest.mark.parametrize("key", KEYS)
def test_each_key_form_is_read_as_pyyaml_reads_it_or_left_to_it(key: str) -> None:
    _check(f"{key}: 1\nb: 2\n")
    _check(f"a:\n  {key}: x\n")
    _check(json.dumps({key: 1}))


@pytest.mark.parametrize("text", [
    # hostile or outside the subset: PyYAML decides (and safeyaml's bounds hold)
    "a: &x [1, 2]\nb: *x\n", "a: !!python/object:os.system x\n", "a:\n\tb: 1\n", "a: 1\r\nb: 2\r\n",
    "\ufeffa: 1\n", "a: 1\n---\nb: 2\n", "--- \na: 1\n", "%YAML 1.1\n---\na: 1\n", "a: 1\n...\n",
    "a: b\n  c\n", "a:\n    b: 1\n  c: 2\n", "a:\n  - x\n  b: 1\n", "a:\n  - x\n - y\n", "- a\n- b\n",
    "  a: 1\n", "a: 1\n a: 2\n", "a: |\n  text\n", "a: >\n  text\n", "a: [1,\n  2]\n", "a: {b: 1}\n",
    "a: 1\na: 2\n", "a:\n  b: 1\na: 3\n", "a:\n-\n", "a:\n- # c\n  x\n", "a:\n- - x\n", "a:\n- b: 1\n",
    "? a\n: 1\n", "a: 'multi\n  line'\n", 'a: "multi\n  line"\n', "a:#x\n", "a :1\n", "\n\n# only a comment\n",
    "", "   ", "a", "a\n", "{\"a\": 1e5}", "{\"a\": 1.5e5}", "{\"a\": NaN}", "{\"a\": Infinity}", "[1, 2", '"x"',
    '{"a" : 1}', '{"a"\n: 1}', '{"\\u00e9": 1}', '{"a": "\\ud83d\\ude00"}', '["\\/"]', '{"a":\t1}', "[" * 70 + "]" * 70,
    "a: " + "[" * 70, "a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 80)),
    "".join(f"k{i}: {i}\n" for i in range(60_000)), json.dumps(list(range(120_000))),
    '{"a": 1, "a": 2}', '{"a": {"b": 1}, "a": [2]}', "[-0, 0.0, -0.0, 1.0, 1E+2, 1.0E2, -1.5e-3, 1e400, 1.0e+400]",
    "[" + "1" * 5000 + "]", '[1.5, "x", true, false, null, {}, []]', '{"":1}', '{"a":1,"b":[1,2,{"c":"d"}]}',
])
def test_hostile_and_outside_documents_go_to_pyyaml(text: str) -> None:
    _check(text)
    try:
        docs = safeyaml.load_all(text)
        want = ("error", "more than one document") if len(docs) > 1 else ("ok", docs[0] if docs else None)
    except safeyaml.YamlError as exc:
        want = ("error", str(exc))
    try:
        got = ("ok", safeyaml.load(text))
    except safeyaml.YamlError as exc:
        got = ("error", str(exc))
    assert got[0] == want[0] and (got[1] == want[1] if got[0] == "error" else _same(got[1], want[1])), text[:80]


def test_bytes_are_read_as_their_ascii_text_and_other_bytes_left_to_pyyaml() -> None:
    assert _same(safeyaml.plain(KUBEADM.encode()), safeyaml.plain(KUBEADM)) and safeyaml.load(b"a: 1") == {"a": 1}
    assert safeyaml.plain("a: é".encode()) is None and safeyaml.load("a: é".encode()) == {"a": "é"}
    assert safeyaml.plain("a: 1".encode("utf-16")) is None and safeyaml.load("a: 1".encode("utf-16")) == {"a": 1}


def test_bounds_hold_on_the_fast_path() -> None:
    many = "".join(f"k{i}: {i}\n" for i in range(60_000))  # 120,001 nodes
    assert safeyaml.plain(many) is None and safeyaml.plain(many, max_nodes=200_000) is not None
    with pytest.raises(safeyaml.YamlError, match="nodes"):
        safeyaml.load(many)
    deep = "".join(" " * i + f"k{i}:\n" for i in range(70))
    assert safeyaml.plain(deep) is None and safeyaml.plain(deep, max_depth=100) is not None
    with pytest.raises(safeyaml.YamlError, match="nested deeper"):
        safeyaml.load("a: " + "x[" * 70)


# -- Hypothesis: documents drawn inside the subset, at its edges and outside it -------------------------------

_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "
_scalar_token = st.one_of(
    st.sampled_from(SCALARS[:-40]),
    st.from_regex(r"[-+]?[0-9_]{1,6}(\.[0-9_]{0,4})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){1,4}", fullmatch=True),
    st.from_regex(r"[0-9]{1,4}[a-zA-Z%]{1,3}", fullmatch=True),
    st.from_regex(r"[a-zA-Z/_][a-zA-Z0-9_./:-]{0,12}", fullmatch=True),
    st.text(alphabet=_PRINTABLE, min_size=1, max_size=10).map(lambda s: s.strip() or "x"),
    st.text(alphabet=string.ascii_letters + " #:'\"", min_size=1, max_size=8).map(lambda s: f'"{s}"'),
    st.text(alphabet=string.ascii_letters + " #:\"", min_size=0, max_size=8).map(lambda s: f"'{s}'"),
)
_key = st.one_of(st.sampled_from(KEYS[:-6]), st.from_regex(r"[A-Za-z_][A-Za-z0-9_./-]{0,8}", fullmatch=True))


@st.composite
def _block_doc(draw: st.DrawFn) -> str:
    step = draw(st.sampled_from([1, 2, 2, 4]))
    indentless = draw(st.booleans())
    lines: list[str] = []

    def mapping(indent: int, depth: int) -> None:
        for _ in range(draw(st.integers(1, 4))):
            key = draw(_key)
            kind = draw(st.sampled_from(["scalar", "scalar", "map", "seq", "empty"] if depth < 4 else ["scalar"]))
            pad = " " * indent
            if kind == "scalar":
                tail = draw(st.sampled_from(["", "", "  ", " # note", "#x"]))
                lines.append(f"{pad}{key}: {draw(_scalar_token)}{tail}")
            elif kind == "empty":
                lines.append(f"{pad}{key}:" + draw(st.sampled_from(["", " ", " # c"])))
            elif kind == "map":
                lines.append(f"{pad}{key}:")
                mapping(indent + step, depth + 1)
            else:
                lines.append(f"{pad}{key}:")
                at = indent if indentless else indent + step
                for _ in range(draw(st.integers(1, 3))):
                    lines.append(" " * at + "- " + draw(_scalar_token))
            if draw(st.integers(0, 9)) == 0:
                lines.append(draw(st.sampled_from(["", "# comment", " " * indent + "# c", "   "])))

    mapping(0, 0)
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = draw(_block_doc())
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "indent", "dedent"]))
        if op == "insert":
            text = text[:i] + draw(st.sampled_from(list(" -:#'\"{}[]&*!|>?,\t\r\n.0x") + ["  ", "- ", ": "])) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 4)):]
        else:
            start = text.rfind("\n", 0, i) + 1
            text = text[:start] + " " + text[start:] if op == "indent" else text[:start] + text[start + 1:]
    return text


_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=_PRINTABLE, max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet=_PRINTABLE, max_size=6), inner,
                                                                  max_size=4),
    max_leaves=20)


@st.composite
def _json_doc(draw: st.DrawFn) -> str:
    doc = draw(st.one_of(st.lists(_json_value, max_size=4), st.dictionaries(st.text(max_size=6), _json_value,
                                                                            max_size=5)))
    indent = draw(st.sampled_from([None, 0, 1, 2, 4]))
    seps = draw(st.sampled_from([None, (",", ":"), (", ", ": "), (" ,", " : ")]))
    return json.dumps(doc, indent=indent, separators=seps, ensure_ascii=draw(st.booleans()))


_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_block_doc())
def test_block_documents_read_as_pyyaml_reads_them(text: str) -> None:
    _check(text)


@_SETTINGS
@given(_mutated())
def test_damaged_block_documents_read_as_pyyaml_reads_them_or_left_to_it(text: str) -> None:
    _check(text)


@_SETTINGS
@given(_json_doc())
def test_json_documents_read_as_pyyaml_reads_them_or_left_to_it(text: str) -> None:
    _check(text)


@_SETTINGS
@given(st.text(alphabet=_PRINTABLE + "\n\t", max_size=60))
def test_any_text_reads_as_pyyaml_reads_it_or_is_left_to_it(text: str) -> None:
    _check(text)


def test_a_document_of_the_subset_loads_no_yaml_module() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom gpuwarden import safeyaml\n"
            f"assert safeyaml.load({KUBEADM!r})['clusterDNS'] == ['10.96.0.10']\n"
            f"assert safeyaml.load({EKS!r})['maxPods'] == 58\n"
            "print(sorted(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src")))
    assert out.stdout.strip() == "[]", out.stderr
