"""The API side of a DRA node (GPU-K8S-020..022): catalog entries of verdicts the agent makes.

These three codes judge what the API server says about the node (its ResourceSlices, the pods'
device health, their FailedPrepareDynamicResources Events) against what the node shows. A node or a
bundle carries no API object, so they are not node rules: they are registered here with
`scope="api"` so that they are first-class in the catalog (`gpuwarden explain`, `gpuwarden rules`,
docs/rules.md, the catalog's tests) while the engine never runs them on a node's facts (engine.run
leaves API-scope entries out). The verdicts themselves are `agent.dra.judge`, a pure function of what
the agent read, stamped with this metadata (`agent.monitors.make_finding`), as every agent-raised
code is. The functions below are that catalog entry's page; asked to run on a node's facts they
say "not evaluated", never "fine".
"""

from __future__ import annotations

from typing import Iterator

from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.findings import Severity
from gpuwarden.rules.base import Hit, rule

API_ONLY = ("an API-side verdict: the gpuwarden agent raises it from the API server's ResourceSlices "
            "(agent.dra_driver); a node or a bundle does not carry them")


@rule(
    "GPU-K8S-020",
    title="ResourceSlices advertise GPUs of a node whose DRA kubelet plugin is gone",
    severity=Severity.HIGH,
    family="dra",
    scope="api",
    automation="A2 (restart the plugin pod; delete the node's slices if the driver is meant to be gone)",
    remedy="""
        1. Restart the DRA driver's kubelet plugin on this node (delete its pod; its DaemonSet recreates it):
           a registered plugin republishes its slices, an unregistered one has the kubelet delete them.
        2. If the driver is meant to be gone from this node, delete its slices so the scheduler stops
           placing GPU pods here: kubectl delete resourceslices --field-selector spec.nodeName=NODE,spec.driver=DRIVER
        3. Delete the pods stuck in ContainerCreating with FailedPrepareDynamicResources: they are placed again.
    """,
    references=("kubernetes/kubernetes#141912",),
)
def slices_of_a_gone_plugin(facts: NodeFacts) -> Iterator[Hit]:
    """ResourceSlices still advertise GPUs of a node whose DRA kubelet plugin is gone.

    The scheduler places a pod that claims a GPU by the node's ResourceSlices alone. When the DRA
    driver's kubelet plugin dies or is removed, its slices can stay (kubernetes#141912): the
    scheduler keeps allocating their devices and binding pods that the kubelet can never prepare.

    CONFIRMED (raised by the agent): the node's slices of the driver (field-selected by node and
    driver, newest pool generation only) list at least one device, and both the plugin's
    registration socket (`/var/lib/kubelet/plugins_registry/<driver>-reg.sock`) and its
    `plugins/<driver>/dra.sock` are absent while the kubelet's `plugins_registry` exists. Pending
    pods with FailedPrepareDynamicResources Events are named. A socket that cannot be read, or
    another kubelet root directory, is "unknown", never "fine"; a socket present but hung is
    GPU-DRA-030's. Clears when the sockets are back or the slices are gone.
    Not evaluated by `gpuwarden check` on a node or a bundle: it needs the API.
    """
    raise FactUnavailable(API_ONLY)
    yield  # pragma: no cover


@rule(
    "GPU-K8S-021",
    title="ResourceSlices of the node advertise no GPU while the node has GPUs",
    severity=Severity.HIGH,
    family="dra",
    scope="api",
    automation="A2 (restart the plugin pod)",
    remedy="""
        1. Restart the DRA driver's kubelet plugin on this node: it enumerates the GPUs again and republishes.
        2. If it publishes empty slices again, its NVML could not see the GPUs when it started: check
           the driver (nvidia-smi) and the plugin's log, and that the driver was ready before the plugin.
    """,
    references=("kubernetes-sigs/dra-driver-nvidia-gpu#1008",),
)
def empty_slices(facts: NodeFacts) -> Iterator[Hit]:
    """The node's ResourceSlices advertise no GPU while the node has GPUs.

    A DRA driver that starts before its GPUs are visible publishes slices with no device and may
    never publish again (dra-driver-nvidia-gpu#1008): no GPU pod is ever placed on the node, and
    nothing fails that an operator would see.

    CONFIRMED (raised by the agent): every slice of the driver's newest generation has no device,
    the newest was published more than 120 s ago (younger: the driver may still be starting, so
    "unknown"), and the node's driver shows at least one GPU. Without the node's GPUs it is
    "unknown". Clears when a newer generation with devices is published.
    Not evaluated by `gpuwarden check` on a node or a bundle: it needs the API.
    """
    raise FactUnavailable(API_ONLY)
    yield  # pragma: no cover


@rule(
    "GPU-K8S-022",
    title="A device taint outlives its cause (the GPU is present and quiet, the taint stays)",
    severity=Severity.MEDIUM,
    family="dra",
    scope="api",
    automation="A3",
    remedy="""
        1. Confirm the GPU is healthy (nvidia-smi -q -i UUID; no Xid since the taint was added).
        2. Restart the DRA driver's kubelet plugin on this node: its health taints are cleared only then.
    """,
    references=("kubernetes-sigs/dra-driver-nvidia-gpu#904", "kubernetes-sigs/dra-driver-nvidia-gpu#1455"),
)
def taint_outlives_its_cause(facts: NodeFacts) -> Iterator[Hit]:
    """A device taint of the driver's own health checking outlives its cause.

    The NVIDIA DRA driver taints a device in its ResourceSlice when its health checking sees an
    Xid or a lost GPU (`gpu.nvidia.com/*`), and removes such taints only when its plugin restarts
    (dra-driver-nvidia-gpu#904, #1455): the GPU stays fenced after its cause is gone.

    AT-RISK (raised by the agent): such a taint (effect not `None`) on a slice device is older than
    600 s, the GPU it names (its `uuid` attribute) is present on the node, no Xid of that GPU was
    logged since the taint's `timeAdded`, and no pod reports the device Unhealthy
    (`allocatedResourcesStatus`). Never CONFIRMED: a node cannot prove a silent cause gone. Without
    the node's GPUs or kernel log it is "unknown". Clears when the taint is gone or the cause shows
    again. Not evaluated by `gpuwarden check` on a node or a bundle: it needs the API.
    """
    raise FactUnavailable(API_ONLY)
    yield  # pragma: no cover
