"""The node's pods watch (gpuwarden.wake.pods) against the real test API server: a pod on this node rejected at
admission for a lost GPU wakes the agent within a bound; a pod on another node is never seen (every request the
source sends is field-selected by its node); the API server away at start or in the middle costs no hang, the
source keeps retrying and catches up once the server is back (what it missed meanwhile is the periodic
check's); 5,000 pods failing on the node are a few wakes, in bounded memory."""

from __future__ import annotations

import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.wake.pods import PodsWatch

pytestmark = pytest.mark.apiserver

LOST = ("Allocate failed due to rpc error: code = Unknown desc = GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee: "
        "GPU is lost, which is unexpected")
#: the fault (the kubelet's status write) -> the wake, on this shared two-core machine
BOUND_S = 2.0


def reject(kube: Kube, namespace: str, name: str, node: str, message: str = LOST) -> float:
    """A pod bound to `node` that the kubelet rejected at admission (Kubelet.rejectPod's status); the time the
    rejection was written."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/x:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    status = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                         "message": "Pod was rejected: " + message, "startTime": format_rfc3339(time.time())}}
    kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", status,
                 content_type="application/merge-patch+json")
    return time.time()


class Recorded:
    """A Kube of its own for the source, every request's method and URL recorded."""

    def __init__(self, api: Any, host: str = "") -> None:
        if host:
            api.configuration.host = host
        self.urls: list[tuple[str, str]] = []
        call = api.call_api

        def recording(method: str, url: str, *a: Any, **kw: Any) -> Any:
            self.urls.append((method, url))
            return call(method, url, *a, **kw)

        api.call_api = recording
        self.kube = Kube(api, timeout_s=3.0)

    def selectors(self) -> set[str]:
        return {";".join(parse_qs(urlsplit(u).query).get("fieldSelector", ["(none)"])) for _, u in self.urls}


class Proxy:
    """A TCP relay to the API server that a test can cut (listener and every connection closed: the
    API server is away) and restore on the same port."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.up = (u.hostname, u.port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        self._ls = socket.socket()
        self._ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ls.bind(("127.0.0.1", self.port))
        self._ls.listen(16)
        threading.Thread(target=self._accept, args=(self._ls,), daemon=True).start()

    def cut(self) -> None:
        try:
            self._ls.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone would not: the port stays open)
        except OSError:
            pass
        self._ls.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._socks.clear()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                a, _ = ls.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.up)
            except OSError:
                a.close()
                continue
            with self._lock:
                self._socks += [a, b]
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            a.close()
            b.close()


def wait_for(pred: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.01)
    return pred()


@pytest.fixture
def admin(k8s):
    return Kube(k8s.api)


@pytest.fixture
def sources():
    started: list[PodsWatch] = []
    yield started
    for s in started:
        s.stop()


def watching(sources: list, kube: Kube, node: str, **kw: Any) -> tuple[PodsWatch, list]:
    got: list = []
    src = PodsWatch(kube, node, **kw)
    sources.append(src)
    assert src.start(got.append) is None
    return src, got


def test_a_pod_on_this_node_failing_admission_wakes_and_other_nodes_are_never_seen(k8s, admin, sources):
    node, other = k8s.name("gpu-node"), k8s.name("other-node")
    rec = Recorded(k8s.server.api_client())
    src, got = watching(sources, rec.kube, node, window_s=0.2)
    assert wait_for(lambda: src.up, 5.0)
    reject(admin, k8s.namespace, "elsewhere", other)  # another node's pod: never read by this node's source
    t = reject(admin, k8s.namespace, "trainer-1", node)
    assert wait_for(lambda: got, BOUND_S), "no wake"
    took = time.time() - t
    (w,) = got
    assert (w.source, w.topic) == ("pods", "admission")
    assert w.detail.startswith(f"{k8s.namespace}/trainer-1: UnexpectedAdmissionError: GPU is lost")
    time.sleep(0.5)
    assert len(got) == 1 and "elsewhere" not in w.detail
    # every request it sent was the node's pods, field-selected: a list, then watches from its version
    assert rec.selectors() == {f"spec.nodeName={node}"} and {m for m, _ in rec.urls} == {"GET"}
    assert all(urlsplit(u).path == "/api/v1/pods" for _, u in rec.urls)
    print(f"pod rejected -> wake: {took * 1000:.0f} ms")
    t0 = time.monotonic()
    src.stop()  # the watch waiting for its next event is shut, not waited out
    assert time.monotonic() - t0 < 1.0 and not src.up


def test_a_pod_rejected_for_another_resource_wakes_nothing(k8s, admin, sources):
    node = k8s.name("gpu-node")
    src, got = watching(sources, Kube(k8s.server.api_client()), node, window_s=0.2)
    assert wait_for(lambda: src.up, 5.0)
    reject(admin, k8s.namespace, "no-gpu-named", node,
           "Allocate failed due to rpc error: code = DeadlineExceeded desc = context deadline exceeded, which is unexpected")
    time.sleep(1.0)
    assert got == []


def test_rejections_already_there_at_start_are_a_leading_and_a_trailing_wake(k8s, admin, sources):
    node = k8s.name("gpu-node")
    for i in range(3):
        reject(admin, k8s.namespace, f"before-{i}", node)
    src, got = watching(sources, Kube(k8s.server.api_client()), node, window_s=0.3)
    assert wait_for(lambda: len(got) == 2, 3.0)
    assert got[1].detail.endswith("(+1 more)") and src.lists == 1


def test_the_api_server_away_at_start_is_no_hang(k8s, sources):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    rec = Recorded(k8s.server.api_client(), host=f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    src, got = watching(sources, rec.kube, k8s.name("gpu-node"), backoff_max_s=2.0)
    assert time.monotonic() - t0 < 0.1
    assert wait_for(lambda: len(rec.urls) >= 2, 5.0)  # it keeps trying, with backoff
    assert not src.up and src.why and got == []
    t1 = time.monotonic()
    src.stop()
    assert time.monotonic() - t1 < 1.0


def test_the_api_server_away_and_back_the_watch_catches_up(k8s, admin, sources):
    node = k8s.name("gpu-node")
    proxy = Proxy(k8s.server.url)
    rec = Recorded(k8s.server.api_client(), host=proxy.url)
    src, got = watching(sources, rec.kube, node, window_s=0.2, backoff_max_s=2.0)
    assert wait_for(lambda: src.up, 5.0)
    try:
        proxy.cut()
        assert wait_for(lambda: not src.up, 5.0)
        reject(admin, k8s.namespace, "while-away", node)  # the periodic check's, while the watch is away
        time.sleep(1.5)
        assert got == [] and not src.up
    finally:
        proxy.restore()
    assert wait_for(lambda: got, 5.0), "the watch did not catch up after the API server came back"
    assert got[0].detail.startswith(f"{k8s.namespace}/while-away:")
    t = reject(admin, k8s.namespace, "after", node)
    assert wait_for(lambda: len(got) == 2, BOUND_S) and got[1].detail.startswith(f"{k8s.namespace}/after:")
    print(f"after the outage, pod rejected -> wake: {(time.time() - t) * 1000:.0f} ms; resumes {src.resumes}, "
          f"lists {src.lists}")
    proxy.cut()


def test_5000_pods_failing_on_the_node_are_a_few_wakes_in_bounded_memory(k8s, admin, sources):
    import tracemalloc

    node = k8s.name("gpu-node")
    half = 2500

    def make(i: int) -> None:
        reject(admin, k8s.namespace, f"p-{i}", node)

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(half)))  # already failing when the agent starts: its first list
    made = time.monotonic() - t0
    tracemalloc.start()
    try:
        src, got = watching(sources, Kube(k8s.server.api_client()), node, window_s=1.0, max_seen=1000)
        assert wait_for(lambda: src.up, 60.0)
        peak_list = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(half, 2 * half)))  # failing while it watches
    counted = lambda: sum(1 + int(w.detail.rsplit("(+", 1)[1].split()[0]) if "(+" in w.detail else 1 for w in got)  # noqa: E731
    assert wait_for(lambda: counted() == 2 * half, 30.0), counted()
    time.sleep(1.5)
    assert counted() == 2 * half
    span = max(w.seen for w in got) - min(w.seen for w in got)
    assert len(got) <= 4 + span / 1.0, (len(got), span)  # one leading, then one a window
    assert len(src._seen) == 1000 and peak_list < 16 << 20, peak_list
    print(f"5,000 failing pods: {len(got)} wakes over {span:.1f} s; the list of 2,500 peaked at "
          f"{peak_list / 1024:.0f} KiB traced; 2,500 pods made in {made:.1f} s")
