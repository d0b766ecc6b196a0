"""The `nvidia_smi` fact: the captured `nvidia-smi -q -x` report, as text (for quoting its lines) and parsed."""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import nvidia_smi_xml

SMI_XML = "/.gpuwarden/commands/nvidia-smi-q-x.xml"


class NvidiaSmiFacts(Struct, frozen=True):
    """The nvidia-smi XML report of the node, when there is one."""
    source: str
    text: str  # the file as captured (an error message instead of XML is quoted from here)
    report: nvidia_smi_xml.SmiReport | None  # None: not parseable, or holding impossible values


@fact("nvidia_smi")
def collect_nvidia_smi(facts: NodeFacts) -> NvidiaSmiFacts:
    text = facts.read_text(SMI_XML)
    if not text:
        raise FactUnavailable(f"{SMI_XML}: not captured")
    report = nvidia_smi_xml.parse(text)
    if report is None:
        facts.gap(SMI_XML, "not parseable XML (garbage or truncated)")
    elif why := nvidia_smi_xml.implausible(report, text):
        facts.gap(SMI_XML, f"unreadable: impossible value ({why})")
        report = None
    return NvidiaSmiFacts(SMI_XML, text, report)
