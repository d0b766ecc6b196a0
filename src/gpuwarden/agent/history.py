"""What only time shows: short per-container, per-GPU, per-probe and memory histories, and the debouncer.

Everything is in memory and bounded (`history_len` observations per series); series of
containers and GPUs not seen for `history_len` checks are dropped. Times are the agent's
clock (epoch seconds), not a bundle's capture time.
"""

from __future__ import annotations

import collections
from typing import Deque, Iterable, Literal

from msgspec import Struct, field

Obs = Literal["bad", "good", "unknown"]


class ContainerKey(Struct, frozen=True):
    """One container incarnation: a restart (new id) starts a new series, with fresh device rules."""

    pod_uid: str
    container: str
    container_id: str
    namespace: str = ""
    pod: str = ""

    @property
    def ref(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{ns}{self.pod or self.pod_uid}/{self.container or self.container_id[:12]}"


class ContainerObs(Struct, frozen=True):
    t: float
    #: device node path -> allowed (True/False) or None (undecided)
    verdicts: dict[str, bool | None]
    #: device node path -> the verdict's evidence, for drift messages
    evidence: dict[str, str] = field(default_factory=dict)
    source: str = ""  # devices.list / bpf / open()
    gpus: tuple[str, ...] = ()  # device ids from pod-resources (authoritative when present)


class Drift(Struct, frozen=True):
    """A device rule present at first sight of a container and gone now."""

    key: ContainerKey
    path: str
    first_seen: float  # first observation of the container (allowed then)
    last_allowed: float
    denied_since: float
    source: str
    evidence_then: str
    evidence_now: str


class GpuObs(Struct):
    t: float
    holders: tuple[str, ...]  # "ns/pod/container" from pod-resources
    health: str = ""  # "Healthy": registered in the kubelet's device-manager checkpoint; "": not known


class NodeHistory:
    """What the agent has seen on its node: per-container, per-GPU and per-probe observations."""

    def __init__(self, maxlen: int = 30) -> None:
        self.maxlen = max(2, int(maxlen))
        self.containers: dict[ContainerKey, Deque[ContainerObs]] = {}
        self.gpus: dict[str, Deque[GpuObs]] = {}
        self.probes: dict[str, Deque[tuple[float, str]]] = {}
        self._last_seen: dict[object, int] = {}
        self.cycle = 0

    # -- recording ---------------------------------------------------------------------------------
    def begin(self) -> None:
        self.cycle += 1

    def _touch(self, key: object) -> None:
        self._last_seen[key] = self.cycle

    def record_container(self, key: ContainerKey, obs: ContainerObs) -> None:
        series = self.containers.setdefault(key, collections.deque(maxlen=self.maxlen))
        series.append(obs)
        self._touch(key)

    def record_gpu(self, gpu: str, obs: GpuObs) -> None:
        series = self.gpus.setdefault(gpu, collections.deque(maxlen=self.maxlen))
        series.append(obs)
        self._touch(("gpu", gpu))

    def record_probe(self, name: str, t: float, status: str) -> None:
        series = self.probes.setdefault(name, collections.deque(maxlen=self.maxlen))
        series.append((t, status))

    def prune(self) -> None:
        """Forget containers and GPUs not seen for `maxlen` checks."""
        horizon = self.cycle - self.maxlen
        for key in [k for k in self.containers if self._last_seen.get(k, 0) <= horizon]:
            del self.containers[key]
            self._last_seen.pop(key, None)
        for gpu in [g for g in self.gpus if self._last_seen.get(("gpu", g), 0) <= horizon]:
            del self.gpus[gpu]
            self._last_seen.pop(("gpu", gpu), None)

    # -- what history shows ------------------------------------------------------------------------
    def drifts(self) -> list[Drift]:
        """Device rules allowed at a container's first observation and denied in its latest one."""
        out: list[Drift] = []
        for key, series in self.containers.items():
            if len(series) < 2 or self._last_seen.get(key) != self.cycle:
                continue
            first, last = series[0], series[-1]
            for path, now in last.verdicts.items():
                if now is not False or first.verdicts.get(path) is not True:
                    continue
                last_allowed = first.t
                denied_since = last.t
                for o in series:
                    v = o.verdicts.get(path)
                    if v is True:
                        last_allowed = o.t
                for o in series:
                    if o.t > last_allowed and o.verdicts.get(path) is False:
                        denied_since = o.t
                        break
                out.append(Drift(key, path, first.t, last_allowed, denied_since, last.source,
                                 first.evidence.get(path, ""), last.evidence.get(path, "")))
        return out

    def timeouts(self, name: str, window: int) -> tuple[int, int, list[float]]:
        """(timeouts, observations, times of the timeouts) in the last `window` observations of a probe."""
        series = list(self.probes.get(name, ()))[-window:]
        ts = [t for t, s in series if s == "timeout"]
        return len(ts), len(series), ts

    def gpu_holders(self, gpu: str) -> list[tuple[float, tuple[str, ...]]]:
        return [(o.t, o.holders) for o in self.gpus.get(gpu, ())]


# ---------------------------------------------------------------------------------------------------
# debounce


class _State(Struct):
    raised: bool = False
    bad: int = 0  # consecutive bad observations
    good: int = 0  # consecutive good observations
    since: float = 0.0  # when raised/cleared last
    last: Obs = "unknown"


class Debouncer:
    """N consecutive bad observations raise, M consecutive good ones clear; unknown changes nothing.

    "Lost observability never clears a fault": an `unknown` observation (the rule could not be
    evaluated, the probe had no socket) neither counts towards clearing nor resets a streak, so a
    raised fault stays raised, and a clean streak interrupted by blindness continues afterwards.
    A `good` resets the bad streak and a `bad` resets the good streak.
    """

    def __init__(self, raise_after: int = 2, clear_after: int = 3) -> None:
        self.raise_after = max(1, int(raise_after))
        self.clear_after = max(1, int(clear_after))
        self.states: dict[str, _State] = {}

    def preset(self, key: str, raised: bool, since: float = 0.0) -> None:
        """Start from a known state (a condition already True on the Node when the agent starts)."""
        self.states[key] = _State(raised=raised, since=since)

    def raised(self, key: str) -> bool:
        s = self.states.get(key)
        return bool(s and s.raised)

    def raised_keys(self) -> list[str]:
        return sorted(k for k, s in self.states.items() if s.raised)

    def observe(self, key: str, obs: Obs, now: float, allow_raise: bool = True) -> str | None:
        """Feed one observation; returns "raised" or "cleared" on a transition, else None."""
        s = self.states.setdefault(key, _State())
        s.last = obs
        if obs == "bad":
            s.bad += 1
            s.good = 0
            if not s.raised and s.bad >= self.raise_after and allow_raise:
                s.raised, s.since = True, now
                return "raised"
        elif obs == "good":
            s.good += 1
            s.bad = 0
            if s.raised and s.good >= self.clear_after:
                s.raised, s.since = False, now
                return "cleared"
        return None

    def observe_all(self, observations: Iterable[tuple[str, Obs]], now: float,
                    allow_raise: bool = True) -> dict[str, str]:
        out = {}
        for key, obs in observations:
            t = self.observe(key, obs, now, allow_raise)
            if t:
                out[key] = t
        return out
