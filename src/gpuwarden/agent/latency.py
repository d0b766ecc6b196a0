"""How fast a fault goes from seen to raised to fenced: the two histograms of /metrics, by source and topic.

A code's clock starts when it is first observed bad, at the time the wake-up that led to the check was
seen by its source (the kernel line read, the socket gone, the pressure crossed), or at the start of the
check for a periodic one ("periodic", "all"). A clean observation stops it. When the debouncer raises
the code, seen -> raised is observed; when a fence of the code (node taint or cordon, DeviceTaintRule)
is done, raised -> fenced. A fault raised by a previous agent (carried over) starts no clock.
"""

from __future__ import annotations

from typing import Any

#: actions that fence: the node's taint or cordon, the one GPU's DeviceTaintRule
FENCES = frozenset({"taint-node", "cordon-node", "taint-device"})
#: codes kept in flight at most (a clock per code; codes are a closed catalog, this only bounds garbage)
MAX_CLOCKS = 1024


class Latency:
    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self._seen: dict[str, tuple[str, str, float]] = {}  # code -> (source, topic, seen)
        self._raised: dict[str, tuple[str, str, float]] = {}  # code -> (source, topic, raised at)

    @staticmethod
    def origin(scope: Any, now: float) -> tuple[str, str, float]:
        if scope is None or getattr(scope, "source", "periodic") == "periodic":
            return "periodic", "all", now
        return scope.source, scope.label, scope.seen or now

    def seen(self, observed: dict[str, str], scope: Any, now: float) -> None:
        """Start a clock for each newly bad code; stop it on a clean observation."""
        o = self.origin(scope, now)
        for code, obs in observed.items():
            if obs == "bad" and code not in self._seen and len(self._seen) < MAX_CLOCKS:
                self._seen[code] = o
            elif obs == "good":
                self._seen.pop(code, None)

    def raised(self, transitions: dict[str, str], scope: Any, now: float) -> None:
        for code, tr in transitions.items():
            if tr == "cleared":
                self._seen.pop(code, None)
                self._raised.pop(code, None)
                continue
            src, topic, t = self._seen.pop(code, None) or self.origin(scope, now)
            self.metrics["gpuwarden_fault_seen_to_raised_seconds"].labels(src, topic).observe(max(0.0, now - t))
            if len(self._raised) < MAX_CLOCKS:
                self._raised[code] = (src, topic, now)

    def fenced(self, outcomes: list, now: float) -> None:
        for o in outcomes:
            if o.result != "done" or o.action.kind not in FENCES:
                continue
            got = self._raised.pop(o.action.code, None)
            if got is not None:
                src, topic, t = got
                self.metrics["gpuwarden_raised_to_fenced_seconds"].labels(src, topic).observe(max(0.0, now - t))
