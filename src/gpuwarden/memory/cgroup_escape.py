"""Which pod's host memory escapes its memory limit through the GPU driver, and how sure that is.

Measured on the GPU machine (docs/memory.md, docs/validation.md): with the GPU's memory full, the
driver places EGL/OpenGL framebuffers in host RAM (128 MiB per 4096x4096 framebuffer) that no memory
cgroup is charged for; the process's memory.current stays at ~115 MiB under a 2 GiB limit while
MemFree falls by 7 GiB. No /proc counter names the holder, so the holder is named by what separates
the candidates (processes holding NVIDIA device files):

- *sole holder*: one workload holds NVIDIA device files (infrastructure set aside);
- *graphics*: NVML lists exactly one candidate's processes as graphics clients ("G"/"C+G"). Only
  graphics objects move to host memory when the GPU is full; compute allocations fail instead, and
  unified memory is charged to its cgroup;
- *history* (agent): one candidate was present whenever the gap grew, across the agent's samples.

A pod's attributable host memory is what its cgroup is charged plus the uncharged memory attributed
to it (the gap beyond a healthy node's baseline). When that exceeds its limit, the pod has escaped the
limit: the kernel would have OOM-killed it at the limit had the memory been charged.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.memory.attribution import GpuView, MemoryLedger, Separation, Suspect, separate
from gpuwarden.memory.trend import Trend

MiB = 1 << 20
GiB = 1 << 30


class EscapeSettings(Struct, frozen=True):
    """Defaults and their measurements: docs/memory.md, "Escaping pods"."""

    #: uncharged memory a healthy GPU node shows with no GPU context (measured 146 MiB on an H200,
    #: 220-232 MiB on an H100, driver 580)
    baseline_bytes: int = 384 * MiB
    #: and per process holding a GPU context (measured 63-74 MiB per CUDA context on the H100, 132 MiB for
    #: the first context on the H200)
    per_context_bytes: int = 128 * MiB
    #: how far past its limit a pod's attributable memory must be before the escape is CONFIRMED
    over_limit_bytes: int = 1 * GiB
    #: a GPU with less free memory than this share of its total is full: graphics objects spill to host
    gpu_full_ratio: float = 0.05


class PodEscape(Struct):
    """A pod's memory beyond its cgroup: its charge, limit and what escaped."""
    suspect: Suspect
    limit: int
    charged: int
    uncharged: int
    over: int  # charged + uncharged - limit

    @property
    def total(self) -> int:
        return self.charged + self.uncharged

    def to_json(self) -> dict:
        return {"pod": self.suspect.ref, "uid": self.suspect.uid, "limit": self.limit, "charged": self.charged,
                "uncharged": self.uncharged, "over": self.over}


class EscapeAssessment(Struct):
    """Whether driver memory escapes pods' cgroups, with its evidence."""
    gap: int  # uncharged and in no meminfo field
    contexts: int  # processes holding a GPU context (/dev/nvidiaN or nvidia-uvm)
    baseline: int  # what a healthy node with that many contexts shows
    separation: Separation
    escape: PodEscape | None  # the holder, when it has a limit and is past it
    gpu_view: GpuView | None
    trend: Trend | None
    #: the gap the agent measured just before the holder arrived, when its history covers the arrival
    measured_before: int | None = None

    @property
    def excess(self) -> int:
        """The gap beyond a healthy node's baseline: what is large on any node."""
        return max(0, self.gap - self.baseline)

    @property
    def attributed(self) -> int:
        """What the holder is attributed: the growth since it arrived when the agent saw that, else the excess."""
        return max(0, self.gap - self.measured_before) if self.measured_before is not None else self.excess

    def to_json(self) -> dict:
        return {"gap": self.gap, "contexts": self.contexts, "baseline": self.baseline,
                "measured_before": self.measured_before, "excess": self.excess, "attributed": self.attributed,
                "separation": self.separation.to_json(), "escape": self.escape.to_json() if self.escape else None,
                "trend": self.trend.to_json() if self.trend else None,
                "gpu_view": self.gpu_view.source if self.gpu_view else None}


def assess(ledger: MemoryLedger, contexts: int, view: GpuView | None, trend: Trend | None,
           s: EscapeSettings, alloc: dict[str, tuple[str, ...]] | None = None) -> EscapeAssessment:
    a = ledger.attribution
    sep = separate(a.suspects, a.scan_complete, view, trend, s.gpu_full_ratio, alloc)
    base = s.baseline_bytes + s.per_context_bytes * contexts
    measured = trend.before.get(sep.holder.key) if sep.holder is not None and trend is not None else None
    out = EscapeAssessment(ledger.gap, contexts, base, sep, None, view, trend, measured)
    h = sep.holder
    if h is not None and h.kind == "pod" and h.limit:
        charged = h.charged or 0
        over = charged + out.attributed - h.limit
        out.escape = PodEscape(h, h.limit, charged, out.attributed, over)
    return out
