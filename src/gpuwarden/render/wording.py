"""What a finding says, made readable at 3 a.m.: pure text functions used by the text report.

The rules write their summaries, evidence and remedies once, for every consumer (JSON, Events,
NodeConditions); the text report then:
- fills the names a finding knows (its pod, namespace, node) into the placeholders of its fix;
- prints times as UTC and, where the node's zone is known and not UTC, as node-local time too,
  labelled, so a summary's time can be matched against the node's own log lines;
- prints kernel `kB` counts (KiB) in binary units outside quoted log lines;
- turns references to files only a source checkout has into ones an installed user can follow.
"""

from __future__ import annotations

import datetime as dt
import re
from functools import lru_cache

from gpuwarden.findings import Finding, Report, Severity, Status
from gpuwarden.memory.ledger import KiB, human, human_seconds
from gpuwarden.parsers.wallclock import rfc3339_epoch

# -- names into fix commands -----------------------------------------------------------------------

#: device-plugin pods on a node, when the finding does not name the pod (the label of NVIDIA's chart)
PLUGIN_SELECTOR = "app.kubernetes.io/name=nvidia-device-plugin"
_PLUGIN_CMD = re.compile(r"kubectl -n <ns> delete pod <plugin[- ]pod>")
_NODE_CMD = re.compile(r"(kubectl (?:describe|cordon|uncordon|drain) node)(?=`)")


def the_pod(f: Finding) -> tuple[str, str] | None:
    """(namespace, name) of the one pod the finding is about, or None when it names none or several."""
    pod = f.data.get("pod") if isinstance(f.data, dict) else None
    if isinstance(pod, dict) and pod.get("name") and pod.get("namespace"):
        return pod["namespace"], pod["name"]
    pods = set()
    for a in f.affected:
        if a.kind == "pod" and a.namespace:
            pods.add((a.namespace, a.name))
        elif a.kind == "container" and a.namespace and "/" in a.name:
            pods.add((a.namespace, a.name.split("/", 1)[0]))
    return pods.pop() if len(pods) == 1 else None


def fill_names(remedy: str, f: Finding, node: str) -> str:
    """The remedy with the names the finding knows in place of `<ns>`, `<pod>`, `<plugin-pod>`, `<node>`."""
    plugin = next(((a.namespace, a.name) for a in f.affected if a.kind == "plugin" and a.namespace), None)
    if plugin is not None:
        remedy = _PLUGIN_CMD.sub(f"kubectl -n {plugin[0]} delete pod {plugin[1]}", remedy)
    elif node:
        remedy = _PLUGIN_CMD.sub(f"kubectl delete pod -A -l {PLUGIN_SELECTOR} --field-selector spec.nodeName={node}",
                                 remedy)
    pod = the_pod(f)
    if pod is not None:
        remedy = remedy.replace("<ns>", pod[0]).replace("<pod>", pod[1])
    if node:
        remedy = _NODE_CMD.sub(rf"\1 {node}", remedy.replace("<node>", node))
    return without_catalog_labels(remedy)


_CATALOG = re.compile(r"\s*\(A[123](?:\s*[+/]\s*A[123])*\)")
_CATALOG_LEAD = re.compile(r"\(A[123](?:\s*[+/]\s*A[123])*,\s*")
AUTOMATION = {"A1": "safe to automate", "A2": "automatable with guards", "A3": "manual"}


def without_catalog_labels(text: str) -> str:
    """A remedy without the signature catalog's automation classes (`(A2)`), which a user cannot look up."""
    return _CATALOG_LEAD.sub("(", _CATALOG.sub("", text))


def automation(text: str) -> str:
    """A rule's automation class in words: `A1 (restart device plugin)` -> `safe to automate (restart ...)`."""
    return re.sub(r"\bA[123]\b", lambda m: AUTOMATION[m[0]], text)


# -- times ------------------------------------------------------------------------------------------

_UTC_TIME = re.compile(r"\b(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.\d+)?Z")


def zone(name: str | None) -> dt.tzinfo | None:
    """The node's zone from the report (`node.timezone`), or None when unknown."""
    if not name:
        return None
    from gpuwarden.parsers.wallclock import zone as parse_zone

    try:
        return parse_zone(name)
    except Exception:  # an unknown zone name: print UTC only
        return None


def times(text: str, tz: dt.tzinfo | None, tz_name: str = "") -> str:
    """`2025-07-30 12:39:03Z` -> `2025-07-30 20:39:03 Asia/Shanghai = 12:39:03 UTC`, or `... 12:39:03 UTC`."""
    def one(m: re.Match) -> str:
        epoch = rfc3339_epoch(f"{m[1]}T{m[2]}Z")
        if epoch is None:  # not a real date (month 13): leave the text as it is
            return m[0]
        utc = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
        if tz is None or utc.astimezone(tz).utcoffset() == dt.timedelta(0):
            return f"{m[1]} {m[2]} UTC"
        local = utc.astimezone(tz)
        label = tz_name or local.strftime("UTC%z")
        return f"{local:%Y-%m-%d %H:%M:%S} {label} = {m[2]} UTC"
    return _UTC_TIME.sub(one, text)


# -- units ------------------------------------------------------------------------------------------

_KB = re.compile(r"\b(\d+) kB\b")


def binary_units(text: str) -> str:
    """`131981020 kB` (the kernel's kB are KiB) -> `125.9 GiB`."""
    return _KB.sub(lambda m: human(int(m[1]) * KiB), text)


# -- references ---------------------------------------------------------------------------------------

_LOCAL_PATH = re.compile(r"\s*\((?:\.\./)?shared/[^)]*\)")
_INCIDENT = re.compile(r"\bincidents? (\d+[ab]?)(?:(?:,| and) (\d+[ab]?))*", re.I)


#: how an example's description or a rule's reference says the incident took its DRA form
_DRA_FORM = re.compile(r"\bDRA form\b", re.I)


@lru_cache(maxsize=1)
def incident_examples() -> dict[tuple[str, bool], tuple[str, ...]]:
    """(incident id (`1`, `5a`), in its DRA form) -> the built-in examples that reproduce it, from each
    example's description ("Incident 1: ...", "The DRA form of incident 1: ...")."""
    from gpuwarden import examples

    out: dict[tuple[str, bool], list[str]] = {}
    for name in examples.names():
        text = examples.describe(name)
        m = re.search(r"\bIncidents? ([\dab]+(?:(?:,| and) [\dab]+)*)", text, re.I)
        for n in re.findall(r"\d+[ab]?", m[1]) if m else ():
            out.setdefault((n, bool(_DRA_FORM.search(text))), []).append(name)
    return {k: tuple(v) for k, v in out.items()}


def _examples_of(incident: str, dra: bool = False) -> list[str]:
    """`5b`: the examples of 5b; `5`: those of 5, 5a and 5b; `dra`: those of its DRA form only."""
    return [e for (k, form), names in incident_examples().items()
            if form == dra and (k == incident or (incident.isdigit() and k.rstrip("ab") == incident)) for e in names]


def reference(ref: str) -> str:
    """A reference an installed user can follow: a checkout's file path becomes the example to run."""
    if not _LOCAL_PATH.search(ref):
        return ref
    ref = _LOCAL_PATH.sub("", ref)
    nums = re.findall(r"\d+[ab]?", _INCIDENT.search(ref)[0]) if _INCIDENT.search(ref) else []
    shown = [e for n in nums for e in _examples_of(n, bool(_DRA_FORM.search(ref)))]
    if shown:
        ref += " (reproduced by " + ", ".join(f"`gpuwarden check --example {e}`" for e in dict.fromkeys(shown)) + ")"
    return ref


# -- how soon it matters -------------------------------------------------------------------------------

def urgency(f: Finding) -> str:
    """How soon the finding matters, in a few words, from its status, severity and data."""
    d = f.data if isinstance(f.data, dict) else {}
    thrash = d.get("thrash") if isinstance(d.get("thrash"), dict) else None
    trend = (d.get("escape") or {}).get("trend") if isinstance(d.get("escape"), dict) else None
    eta = trend.get("seconds_to_min_watermark") if isinstance(trend, dict) else None
    if thrash is not None and thrash.get("present"):
        return "node thrashing now: act now"
    if eta is not None:
        return f"node thrashes in ~{human_seconds(eta)} at this rate: act now"
    if thrash is not None:
        if not isinstance(trend, dict) or (trend.get("samples") or 0) < 2:
            return "no thrash yet; rate unknown (one check)"
        if trend.get("growing"):
            return "no thrash yet; growing"
        return "no thrash yet; not growing now" if trend.get("rate_bytes_per_s") is not None else \
            "no thrash yet; rate not known yet"
    if f.status == Status.CONFIRMED:
        return {Severity.CRITICAL: "failing now: act now", Severity.HIGH: "failing now"}.get(
            f.severity, "present now, not urgent")
    return {Severity.CRITICAL: "not failing yet: fix soon", Severity.HIGH: "not failing yet: fix soon"}.get(
        f.severity, "not failing: fix when convenient")


def who(f: Finding, node: str) -> str:
    """The first affected object, and how many more."""
    if not f.affected:
        return f"node {node}" if node else "this node"
    a = f.affected[0]
    ns = f"{a.namespace}/" if a.namespace else ""
    name = f"{a.kind} {ns}{a.name}" if a.kind != "node" or a.name != "this node" else f"node {node or a.name}"
    if a.kind == "gpu" and a.index is not None:
        name = a.gpu_label()
    more = len(f.affected) - 1
    return name + (f" +{more} more" if more else "")


def short_title(title: str) -> str:
    """The title without its trailing parenthetical (the mechanism, told in the details)."""
    return re.sub(r"\s*\([^()]*\)$", "", title)


# -- not checked ---------------------------------------------------------------------------------------

def source_label(source: str) -> str:
    """A short name for an unreadable evidence source: `memory.stat`, `kubelet log`, `/proc/*/fd`."""
    if source.startswith("/sys/fs/cgroup/"):
        return "cgroup " + source.rsplit("/", 1)[-1]
    return source


def origin(report: Report) -> str:
    """Where the report's node came from, as its header says it: `built-in example uvm-missing`, `live: /`."""
    src = str(report.node.get("source", ""))
    kind, _, what = src.partition(":")
    if report.mode == "example" or kind == "example":
        return f"built-in example {what or src}"
    return f"{kind}: {what}" if what else src
