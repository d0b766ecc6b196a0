"""The agent logs incident 4's separation once per change (agent/memguard.note_separation): who it would name,
by what method, and the tracking's reason, so the naming is visible between the raise and an action."""

from __future__ import annotations

import io
import json

from gpuwarden import engine
from gpuwarden.agent.memguard import note_separation
from gpuwarden.examples import open_example
from gpuwarden.facts.node import NodeFacts
from gpuwarden.kube.log import Log
from gpuwarden.rules import get_rule


class _Agent:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.log = Log("json", node="n", stream=self.out)

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.out.getvalue().splitlines()]


def _findings(example: str):
    return engine.run(NodeFacts(open_example(example)), [get_rule("GPU-NODE-001")], mode="bundle").findings


def test_logged_once_per_change_and_never_without_the_finding():
    a = _Agent()
    fs = _findings("driver-memory-cascade")
    note_separation(a, fs)
    note_separation(a, fs)  # unchanged: nothing more
    [rec] = a.lines()
    assert rec["msg"] == "memory-separation" and rec["method"] == "sole-holder"
    assert rec["holder"] == "render/egl-render-0" and rec["status"] == "confirmed" and rec["confidence"] == "high"
    note_separation(a, [])  # the finding gone: nothing logged, and the next one is a change again
    note_separation(a, fs)
    assert len(a.lines()) == 2
    b = _Agent()
    note_separation(b, _findings("healthy"))
    assert b.lines() == []
