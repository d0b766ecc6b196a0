"""The `admissions` fact: this node's pods the kubelet rejected at admission for a GPU, from the API server.

The kubelet writes a rejection into the pod's status (phase Failed, reason UnexpectedAdmissionError)
at any verbosity, but its log line for it only at V3: on most nodes the API server is where a
rejection can be read. Only a caller that talks to the API server can give this section: the agent
sets `Settings.admission_pods` to a reader of its own node's pods (field-selected by `spec.nodeName`:
one list whose answer grows with the node, not the cluster; the same list its remediation plan reads).
The reader is called only when a rule asks for the section (GPU-K8S-012 asks only while a GPU is
lost), so a healthy node costs the API server nothing. A bundle, an example or `check` on a node has
no reader: the section is unavailable, with the reason.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers.admission import Rejection, gpu_rejections

#: where the evidence says it was read
SOURCE = "API server: pods of this node"


class Admissions(Struct):
    """The node's pods rejected at admission for a GPU (oldest first), and how many pods were read."""

    rejections: list[Rejection] = field(default_factory=list)
    pods: int = 0
    source: str = SOURCE


@fact("admissions")
def collect_admissions(facts: NodeFacts) -> Admissions:
    read = facts.settings.admission_pods
    if read is None:
        raise FactUnavailable("pods rejected at admission are read from the API server, by the agent only")
    try:
        pods = read()
    except Exception as exc:  # the API down, slow or refusing: not read, never "none rejected"
        raise FactUnavailable(f"the API server: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(pods, list):
        raise FactUnavailable(f"the API server answered {type(pods).__name__}, not a list of pods")
    return Admissions(gpu_rejections(pods), len(pods))
