"""A real Kubernetes API server for tests: etcd plus tools/testapiserver, on loopback.

    server = start_apiserver()          # builds the binary if needed (minutes, once)
    api = server.api_client()           # kubernetes.client.ApiClient, via a kubeconfig
    ...
    server.stop()

The server is built on k8s.io/apiserver and stores in a real etcd, so REST
semantics (resourceVersions, conflicts, watches, selectors, patches,
server-side apply, subresources) are the real ones; there is no validation,
controller or garbage collector (see docs/testing-apiserver.md), and RBAC is
enforced only with `authz`. ValidatingAdmissionPolicies created through the API
(or given in `authz["objects"]`) are enforced by kube-apiserver's own plugin.
Tests play the kubelet, scheduler and controllers.

When the binary cannot be built or found, or etcd is missing,
`ApiServerUnavailable` says why; fixtures turn it into a skip (or a failure
when GPUWARDEN_REQUIRE_APISERVER=1).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "testapiserver" / "build.sh"
BINARY_ENV = "GPUWARDEN_TESTAPISERVER"
BUILD_TIMEOUT_S = 1200


class ApiServerUnavailable(RuntimeError):
    """The test API server cannot run here; the message says why."""


def find_binary(build: bool = True) -> str:
    """Path of the testapiserver binary: $GPUWARDEN_TESTAPISERVER, else build.sh's output."""
    given = os.environ.get(BINARY_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise ApiServerUnavailable(f"${BINARY_ENV}={given} is not an executable file")
        return given
    if not build:
        raise ApiServerUnavailable(f"${BINARY_ENV} is not set and building is disabled")
    if not BUILD_SCRIPT.exists():
        raise ApiServerUnavailable(f"{BUILD_SCRIPT} is missing")
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ApiServerUnavailable(f"{BUILD_SCRIPT} did not finish in {BUILD_TIMEOUT_S} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        detail = _tail(proc.stderr or proc.stdout, 12)
        raise ApiServerUnavailable(f"building the test API server failed (exit {proc.returncode}):\n{detail}")
    path = lines[-1].strip()
    if not os.access(path, os.X_OK):
        raise ApiServerUnavailable(f"build.sh printed {path!r}, which is not an executable file")
    return path


def find_etcd() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if not path:
        raise ApiServerUnavailable("etcd is not installed (apt-get install etcd-server; build.sh does it)")
    return path


@dataclass
class RunningApiServer:
    """A running etcd + test API server pair; `stop()` ends both and removes their files."""

    url: str
    kubeconfig_path: str
    etcd_url: str
    workdir: str
    _procs: list = field(default_factory=list, repr=False)
    audit_path: str = ""  # with authz: every authorization decision, a JSON line each

    def api_client(self, token: str = ""):
        """A fresh kubernetes.client.ApiClient configured from the kubeconfig (the admin), or for the
        identity of `token` (a server started with `authz`)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig_for(token) if token else self.kubeconfig_path,
                                client_configuration=cfg)
        return client.ApiClient(cfg)

    def kubeconfig_for(self, token: str) -> str:
        """A kubeconfig file that authenticates with `token`."""
        return _write_kubeconfig(self.workdir, self.url, token, f"kubeconfig-{token[:16]}")

    def audit(self) -> list[dict]:
        """The authorization decisions so far (a server started with `authz`)."""
        if not self.audit_path or not os.path.exists(self.audit_path):
            return []
        with open(self.audit_path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def stop(self) -> None:
        for proc in reversed(self._procs):  # the API server first, then etcd
            _terminate(proc)
        self._procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_apiserver(binary: str | None = None, etcd: str | None = None, timeout: float = 60.0,
                    authz: dict | None = None) -> RunningApiServer:
    """Start etcd and the API server on free loopback ports and wait until /readyz is ok.

    `authz` ({"tokens": {token: {"user", "groups", "extra"}}, "clusterRoles": [...], "roles": [...],
    "clusterRoleBindings": [...], "roleBindings": [...], "objects": [...]}, tests/support/rbac.py builds
    it from the chart): the server authenticates these bearer tokens and enforces RBAC; the kubeconfig
    carries an admin token (system:masters) of its own. `objects` (the chart's ValidatingAdmissionPolicies
    and bindings) are created through the API before the server is ready, so they are enforced from
    the first request."""
    binary = binary or find_binary()
    etcd = etcd or find_etcd()
    workdir = tempfile.mkdtemp(prefix="gw-apiserver-")
    server = RunningApiServer(url="", kubeconfig_path="", etcd_url="", workdir=workdir)
    atexit.register(server.stop)
    deadline = time.monotonic() + timeout
    extra: list[str] = []
    admin_token = ""
    if authz is not None:
        admin_token = os.urandom(16).hex()
        doc = {k: v for k, v in authz.items() if k != "objects"}
        doc["tokens"] = {**(authz.get("tokens") or {}),
                         admin_token: {"user": "gw-test-admin", "groups": ["system:masters"]}}
        authz_path = os.path.join(workdir, "authz.json")
        with open(authz_path, "w") as f:
            json.dump(doc, f)
        server.audit_path = os.path.join(workdir, "audit.jsonl")
        extra = ["--authz-file", authz_path, "--audit-file", server.audit_path]
        if authz.get("objects"):
            objects_path = os.path.join(workdir, "objects.json")
            with open(objects_path, "w") as f:
                json.dump(authz["objects"], f)
            extra += ["--objects", objects_path]
    try:
        etcd_proc, server.etcd_url = _start_etcd(etcd, workdir, deadline)
        server._procs.append(etcd_proc)
        api_proc, server.url = _start_server(binary, server.etcd_url, workdir, deadline, extra)
        server._procs.append(api_proc)
        server.kubeconfig_path = _write_kubeconfig(workdir, server.url, admin_token)
    except BaseException:
        server.stop()
        raise
    return server


# ---- internals -----------------------------------------------------------------


def _start_etcd(etcd: str, workdir: str, deadline: float):
    # etcd needs its ports up front: pick free ones, retry if another process took them meanwhile.
    last_log = ""
    for attempt in range(3):
        client_port, peer_port = _free_port(), _free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        data_dir = os.path.join(workdir, f"etcd-{attempt}")
        log_path = os.path.join(workdir, f"etcd-{attempt}.log")
        cmd = [
            etcd,
            "--name", "gw-test",
            "--data-dir", data_dir,
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"gw-test={peer_url}",
            "--log-level", "warn",
            "--logger", "zap",
        ]
        proc = _spawn(cmd, log_path)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _http_ok(f"{client_url}/health", lambda body: '"health":"true"' in body.replace(" ", "")):
                return proc, client_url
            time.sleep(0.05)
        else:
            _terminate(proc)
            raise ApiServerUnavailable(f"etcd not healthy before the deadline; log:\n{_tail_file(log_path)}")
        last_log = _tail_file(log_path)
        _terminate(proc)
    raise ApiServerUnavailable(f"etcd exited at start three times; last log:\n{last_log}")


def _start_server(binary: str, etcd_url: str, workdir: str, deadline: float, extra: list[str] | None = None):
    address_file = os.path.join(workdir, "apiserver.url")
    log_path = os.path.join(workdir, "apiserver.log")
    cmd = [binary, "--listen", "127.0.0.1:0", "--address-file", address_file, "--etcd-servers", etcd_url,
           *(extra or [])]
    proc = _spawn(cmd, log_path)
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ApiServerUnavailable(
                f"the test API server exited with {proc.returncode} at start; log:\n{_tail_file(log_path)}"
            )
        if url is None and os.path.exists(address_file):
            url = Path(address_file).read_text().strip()
        if url and _http_ok(f"{url}/readyz", lambda body: body.strip() == "ok"):
            return proc, url
        time.sleep(0.05)
    _terminate(proc)
    raise ApiServerUnavailable(f"the test API server was not ready before the deadline; log:\n{_tail_file(log_path)}")


def _write_kubeconfig(workdir: str, url: str, token: str = "", name: str = "kubeconfig") -> str:
    # JSON is YAML: no YAML writer needed.
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gw-test", "cluster": {"server": url}}],
        "users": [{"name": "gw-test-admin", "user": {"token": token} if token else {}}],
        "contexts": [{"name": "gw-test", "context": {"cluster": "gw-test", "user": "gw-test-admin"}}],
        "current-context": "gw-test",
        "preferences": {},
    }
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def _spawn(cmd: list[str], log_path: str) -> subprocess.Popen:
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies, so no server outlives it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _terminate(proc: subprocess.Popen, grace: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str, check) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200 and check(resp.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _tail(text: str, n: int) -> str:
    return "\n".join("    " + line for line in (text or "").strip().splitlines()[-n:])


def _tail_file(path: str, n: int = 20) -> str:
    try:
        return _tail(Path(path).read_text(errors="replace"), n)
    except OSError:
        return "    (no log)"
