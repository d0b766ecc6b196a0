"""The `gpu_operator` fact: the GPU Operator validator's status files in /run/nvidia/validations.

The validator writes one file per stage (driver-ready, toolkit-ready, cuda-ready, plugin-ready);
the operand pods wait in Init for the file of the stage before them (GPU-K8S-009).
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.root import Missing, StatInfo

VALIDATIONS = "/run/nvidia/validations"
STAGE_FILES = ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready")


class OperatorValidations(Struct):
    """The GPU Operator's validation files on the node."""
    names: list[str]  # the directory's entries
    workload_type: str | None  # `workload-type`'s content ("container", "vm-passthrough", …)
    driver_ready: str | None  # `driver-ready`'s content (the driver root and version it found)
    #: stage file -> mtime, on a live node only (a bundle's copies carry the capture's times)
    mtimes: dict[str, float] = field(default_factory=dict)


@fact("gpu_operator")
def collect_gpu_operator(facts: NodeFacts) -> OperatorValidations:
    names = facts.root.listdir(VALIDATIONS)
    if isinstance(names, Missing):
        raise FactUnavailable(f"{VALIDATIONS}: {names.kind} (no GPU Operator)")
    out = OperatorValidations(names, facts.read_text(f"{VALIDATIONS}/workload-type"),
                              facts.read_text(f"{VALIDATIONS}/driver-ready"))
    if facts.root.live:
        for s in STAGE_FILES:
            if s in names and isinstance(st := facts.root.stat(f"{VALIDATIONS}/{s}"), StatInfo):
                out.mtimes[s] = st.mtime
    return out
