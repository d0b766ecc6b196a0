"""nvidia_smi_xml.implausible finds a damaged size in one pass over the XML (one pattern for the four
size elements, issue 34) and answers what one pass per element answered, in the same tag order."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings, strategies as st

from gpuwarden.parsers import nvidia_smi_xml
from gpuwarden.parsers.nvidia_smi_xml import SmiReport, implausible, mib_bytes

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests/fixtures/captures/h200-2026-11-22-b/files/.gpuwarden/commands/nvidia-smi-q-x.xml"
TAGS = ("used", "free", "total", "used_memory")


def _per_tag(text: str) -> str:
    """The former code: one search per element, in tag order."""
    for tag in TAGS:
        for m in re.finditer(rf"<{tag}>\s*([^<]*?)\s*</{tag}>", text):
            if nvidia_smi_xml._NUMBER.match(m.group(1)) and mib_bytes(m.group(1)) is None:
                return f"<{tag}>{m.group(1)}</{tag}> is not a possible size"
    return ""


def test_a_real_report_has_no_damaged_size() -> None:
    text = CAPTURE.read_text()
    rep = nvidia_smi_xml.parse(text)
    assert rep is not None and implausible(rep, text) == "" == _per_tag(text)


def test_a_damaged_size_is_named_by_tag_order_not_by_position() -> None:
    text = "<free>-5 MiB</free><used>1e999 MiB</used><total>80 MiB</total>"
    assert implausible(SmiReport(driver_version="", cuda_version="", gpus=[]), text) == _per_tag(text)
    assert implausible(SmiReport(driver_version="", cuda_version="", gpus=[]), text).startswith("<used>")


_value = st.sampled_from(["80 MiB", "-1 MiB", "1e999 MiB", "nan MiB", "N/A", " 7 MiB ", "12", "+3 KiB", "inf"])
_element = st.tuples(st.sampled_from(TAGS + ("usedx", "reserved")), _value).map(lambda tv: f"<{tv[0]}>{tv[1]}</{tv[0]}>")


@settings(max_examples=300, deadline=None)
@given(st.lists(_element, max_size=12), st.sampled_from(["", "\n", " <x/> "]))
def test_one_pass_answers_as_one_pass_per_tag(elements: list[str], sep: str) -> None:
    text = sep.join(elements)
    assert implausible(SmiReport(driver_version="", cuda_version="", gpus=[]), text) == _per_tag(text)
