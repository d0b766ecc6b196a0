"""`Kube.watch` when the stream breaks mid-way: the client's KubeError (status 0, unavailable: resume), never
urllib3's ProtocolError, which every caller (the informers, the agent's pods watch) would not expect.

A loopback socket plays the API server: it answers a watch with HTTP/1.1 200, chunked, one event, and then
cuts the connection inside the next chunk (what a restarted API server or a proxy's idle cut does). No
test API server is needed; the real client (kubernetes' urllib3 pool, `Kube`) reads the stream.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Iterator

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError
from gpuwarden.wake.pods import PodsWatch

EVENT = {"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "resourceVersion": "7"}}}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


class Breaking:
    """A one-request-at-a-time HTTP server: each watch gets `first` (complete chunks), then `cut` (raw bytes:
    a chunk promised longer than what is sent), then the connection closes."""

    def __init__(self, first: bytes, cut: bytes) -> None:
        self.first, self.cut = first, cut
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[str] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                req = b""
                while b"\r\n\r\n" not in req:
                    got = conn.recv(4096)
                    if not got:
                        break
                    req += got
                self.requests.append(req.split(b"\r\n", 1)[0].decode())
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + self.first)
                time.sleep(0.05)
                try:
                    conn.sendall(self.cut)
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:  # the client hung up first (the stream's end read, the source stopped)
                    pass

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def _kube(url: str) -> Kube:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    return Kube(client.ApiClient(cfg), timeout_s=3.0)


@pytest.fixture
def cut_mid_chunk() -> Iterator[Breaking]:
    line = json.dumps(EVENT).encode() + b"\n"
    s = Breaking(_chunk(line), b"400\r\n" + b'{"type": "MODIFIED", "obj')  # 1,024 bytes promised, 25 sent
    yield s
    s.close()


def test_a_watch_cut_mid_chunk_is_a_kube_error_after_the_events_it_carried(cut_mid_chunk):
    got = []
    with pytest.raises(KubeError) as e:
        for ev in _kube(cut_mid_chunk.url).watch("/api/v1/pods", "5", timeout_s=5):
            got.append(ev)
    assert got == [EVENT]  # what came whole is delivered
    assert e.value.status == 0 and e.value.unavailable  # resumable, as a dropped connection is
    assert "the watch stream broke" in str(e.value) and e.value.reason in ("ProtocolError", "IncompleteRead")


def test_a_watch_line_that_is_not_json_is_a_kube_error():
    s = Breaking(_chunk(b"<html>proxy error</html>\n"), b"0\r\n\r\n")
    try:
        with pytest.raises(KubeError) as e:
            list(_kube(s.url).watch("/api/v1/pods", "5", timeout_s=5))
        assert e.value.reason == "BadWatchEvent" and "proxy error" in str(e.value)
    finally:
        s.close()


def test_a_whole_stream_ending_cleanly_is_no_error():
    line = json.dumps(EVENT).encode() + b"\n"
    s = Breaking(_chunk(line), b"0\r\n\r\n")
    try:
        assert list(_kube(s.url).watch("/api/v1/pods", "5", timeout_s=5)) == [EVENT]
    finally:
        s.close()


def test_the_pods_watch_resumes_from_its_version_after_a_cut(cut_mid_chunk):
    """The agent's pods watch (wake/pods.py) sees a KubeError, not a ProtocolError, and resumes from the
    resourceVersion the cut stream carried (no relist)."""
    src = PodsWatch(_kube(cut_mid_chunk.url), "node-a", window_s=0.1)
    src.rv = "5"  # listed already: the watch starts from there
    src.backoff_max_s = 0.05
    assert src.start(lambda w: None) is None
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and src.resumes < 2:
            time.sleep(0.02)
        assert src.resumes >= 2, (src.why, cut_mid_chunk.requests)
        assert src.why.startswith("KubeError: HTTP 0 ") and "the watch stream broke" in src.why, src.why
        assert src.rv == "7"  # from the event the cut stream carried
        assert all("resourceVersion=7" in r for r in cut_mid_chunk.requests[1:]), cut_mid_chunk.requests
    finally:
        src.stop()
