"""The node's pods watch on a scripted client: a pod rejected at admission for a lost GPU wakes, other pods do
not; the list and every watch are field-selected by the node; a broken watch resumes from its resourceVersion,
410 relists; an API server that is away costs no hang; 5,000 failing pods are a few wakes in bounded memory.
(Against the real test API server: tests/k8s/test_wake_pods_apiserver.py.)"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

from gpuwarden.kube.errors import KubeError
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.wake.pods import PodsWatch

NODE = "gpu-node-1"
LOST = ("Allocate failed due to rpc error: code = Unknown desc = GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee: "
        "GPU is lost, which is unexpected")


def pod(name: str, rv: int, message: str | None = LOST, ns: str = "ml", resource: str = "nvidia.com/gpu",
        reason: str = "UnexpectedAdmissionError", age_s: float = 0.0) -> dict:
    st: dict[str, Any] = {"phase": "Pending"}
    if message is not None:
        st = {"phase": "Failed", "reason": reason, "message": "Pod was rejected: " + message,
              "startTime": format_rfc3339(time.time() - age_s)}
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "resourceVersion": str(rv)},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]},
            "status": st}


class Resp:
    """What the watch hands `on_response`: closing it ends a watch that waits for its next event."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


class ScriptedKube:
    """Answers lists with `pods` (pages of `page`) and each watch with the next session of `sessions`:
    a list of events, or an exception to raise. Once the script is out, a watch waits until closed."""

    def __init__(self, pods: list[dict] | None = None, sessions: list[Any] | None = None, page: int = 500,
                 list_error: Exception | None = None, list_rv: str = "100") -> None:
        self.pods, self.sessions, self.page = pods or [], list(sessions or []), page
        self.list_error, self.list_rv = list_error, list_rv
        self.calls: list[tuple[str, str, str, str]] = []  # (kind, path, field selector, resourceVersion)
        self.resp: Resp | None = None

    def iter_items(self, path: str, label_selector: str = "", field_selector: str = "", limit: int = 500,
                   meta: dict | None = None, accept: str = "") -> Iterator[dict]:
        self.calls.append(("list", path, field_selector, ""))
        if self.list_error is not None:
            raise self.list_error
        for i in range(0, len(self.pods), self.page):
            yield from self.pods[i:i + self.page]
        if meta is not None:
            meta["resourceVersion"] = self.list_rv

    def watch(self, path: str, resource_version: str, timeout_s: int = 60, field_selector: str = "",
              label_selector: str = "", on_response: Any = None) -> Iterator[dict]:
        self.calls.append(("watch", path, field_selector, resource_version))
        self.resp = Resp()
        if self.sessions:
            step = self.sessions.pop(0)
            if isinstance(step, Exception):
                raise step
            if on_response is not None:
                on_response(self.resp)
            yield from step
            return
        if on_response is not None:
            on_response(self.resp)
        self.resp.closed.wait(30)


def run(kube: Any, wait: float = 0.5, **kw: Any) -> tuple[PodsWatch, list]:
    got: list = []
    src = PodsWatch(kube, NODE, window_s=kw.pop("window_s", 0.2), **kw)
    assert src.start(got.append) is None
    time.sleep(wait)
    return src, got


def wait_for(pred: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.01)
    return pred()


def test_a_pod_rejected_for_a_lost_gpu_wakes_with_its_name_and_reason():
    kube = ScriptedKube(sessions=[[{"type": "ADDED", "object": pod("trainer-1", 101, message=None)},
                                   {"type": "MODIFIED", "object": pod("trainer-1", 102)}]])
    src, got = run(kube)
    try:
        (w,) = got
        assert (w.source, w.topic) == ("pods", "admission")
        assert w.detail == ("ml/trainer-1: UnexpectedAdmissionError: GPU is lost, "
                            "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
        assert src.rv == "102"
    finally:
        src.stop()


def test_every_request_is_field_selected_by_the_node():
    kube = ScriptedKube(sessions=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}}]])
    src, _ = run(kube)
    src.stop()
    assert [c[:3] for c in kube.calls] == [("list", "/api/v1/pods", f"spec.nodeName={NODE}"),
                                           ("watch", "/api/v1/pods", f"spec.nodeName={NODE}"),
                                           ("watch", "/api/v1/pods", f"spec.nodeName={NODE}")]
    assert [c[3] for c in kube.calls] == ["", "100", "150"]  # the list's version, then the bookmark's


@pytest.mark.parametrize("obj", [
    pod("pending", 101, message=None),
    pod("cpu", 101, message="Allocate failed due to requested number of devices unavailable for cpu", resource="cpu"),
    pod("outofgpu", 101, message="Node didn't have enough resource: nvidia.com/gpu", reason="OutOfnvidia.com/gpu"),
    pod("timeout", 101, message="Allocate failed due to rpc error: code = DeadlineExceeded, which is unexpected"),
    pod("stale", 101, age_s=601),  # rejected before the admission rule's window: the node keeps Failed pods
    {"metadata": "garbage"}, {}, "not a pod",
])
def test_pods_not_rejected_for_a_gpu_wake_nothing(obj):
    kube = ScriptedKube(sessions=[[{"type": "MODIFIED", "object": obj}, {"type": "DELETED", "object": pod("d", 5)}]])
    src, got = run(kube)
    src.stop()
    assert got == []


def test_a_pod_seen_once_is_not_a_second_wake():
    again = [{"type": "MODIFIED", "object": pod("trainer-1", 101 + i)} for i in range(5)]
    kube = ScriptedKube(pods=[pod("trainer-1", 90)], sessions=[again])
    src, got = run(kube, window_s=0.01)
    src.stop()
    assert [w.detail.split(":")[0] for w in got] == ["ml/trainer-1"]


def test_a_broken_watch_resumes_from_its_version_and_410_relists():
    kube = ScriptedKube(sessions=[
        [{"type": "ADDED", "object": pod("ok", 120, message=None)}],
        KubeError(0, "unreachable", "connection reset"),  # resume from 120, no list
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}],
    ])
    kube.pods = [pod("lost-while-away", 130)]  # the relist finds what the watch missed
    src, got = run(kube, wait=0.0)
    wait_for(lambda: src.lists == 2 and got, 6.0)
    src.stop()
    kinds = [(c[0], c[3]) for c in kube.calls]
    assert kinds[:5] == [("list", ""), ("watch", "100"), ("watch", "120"), ("watch", "120"), ("list", "")]
    assert src.resumes == 1 and src.lists == 2
    assert [w.detail.split(":")[0] for w in got] == ["ml/lost-while-away"]


def test_an_api_server_away_is_no_hang_and_is_retried_with_backoff():
    kube = ScriptedKube(list_error=KubeError(0, "unreachable", "connection refused"))
    t0 = time.monotonic()
    import io

    from gpuwarden.kube.log import Log

    got: list = []
    out = io.StringIO()
    src = PodsWatch(kube, NODE, backoff_max_s=2.0, log=Log("text", out))
    assert src.start(got.append) is None
    assert time.monotonic() - t0 < 0.1  # start never waits for the API
    time.sleep(3.0)
    t1 = time.monotonic()
    src.stop()
    assert time.monotonic() - t1 < 1.0
    lists = [c for c in kube.calls if c[0] == "list"]
    assert 2 <= len(lists) <= 5  # 0.5-1 s, 1-2 s, 1-2 s ...: retried, never in a loop
    assert not src.up and "connection refused" in src.why and got == []
    assert out.getvalue().count("wake-pods-failed") == len(lists)  # one line a try, never a flood


def test_a_watch_that_waits_is_ended_by_stop():
    kube = ScriptedKube()
    src, _ = run(kube, wait=0.3)
    assert src.up
    t0 = time.monotonic()
    src.stop()
    assert time.monotonic() - t0 < 1.0 and kube.resp is not None and kube.resp.closed.is_set()


def test_5000_failing_pods_are_a_few_wakes_in_bounded_memory():
    import tracemalloc

    kube = ScriptedKube(pods=[pod(f"p-{i}", 1000 + i) for i in range(2500)],
                        sessions=[[{"type": "MODIFIED", "object": pod(f"w-{i}", 5000 + i)} for i in range(2500)]])
    tracemalloc.start()
    try:
        src, got = run(kube, wait=0.0, max_seen=1000)
        assert wait_for(lambda: src.rv == "7499", 30.0)
        time.sleep(0.5)  # the last trailing wake
        src.stop()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    counts = [1 + int(w.detail.rsplit("(+", 1)[1].split()[0]) if "(+" in w.detail else 1 for w in got]
    assert sum(counts) == 5000 and len(got) <= 20, len(got)
    assert len(src._seen) == 1000  # remembered pods are capped
    assert peak < 2 << 20, peak  # what the source allocated while it read them (the pods were there before)


def test_no_client_or_no_node_is_a_reason():
    assert PodsWatch(None, NODE).start(lambda w: None).startswith("no API server")
    assert PodsWatch(ScriptedKube(), "").start(lambda w: None).startswith("no node name")
