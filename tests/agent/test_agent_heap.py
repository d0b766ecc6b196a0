"""The agent's Python heap and its bounded structures stop growing after warm-up (in process; not timed).

bench/agent_soak.py measures RSS over 1,000 checks; RSS also moves with the C allocator, so this test
looks at what a leak in our code grows: the objects tracemalloc sees allocated after warm-up and still
alive, the agent's histories, debounce states, metric series, log cursors and outbox, CPython's `re`
cache, and the open fds. A report kept per check (~100 KiB) or a dict keyed by a time or a pid fails it
within a few checks; the bound leaves room for what CPython itself keeps (its type attribute cache
holds up to 4,096 attribute-name strings; parsers.zoneinfo no longer feeds it one per check).
"""

from __future__ import annotations

import gc
import io
import os
import re
import sys
import tracemalloc
import urllib.request
from typing import Any

import pytest

from gpuwarden.agent.config import parse_args
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.offline import WRITES_KEPT
from gpuwarden.kube.log import Log

WARMUP = 60  # imports, history_len (30) observations per series, the first condition writes
ROTATE = 60  # traced before the first measure: every rolling window (30 entries) is then traced memory
CHECKS = 200  # from the first measure to the second
#: growth of the traced heap over CHECKS checks: measured 2.3 KiB (healthy) and 9.3 KiB (uvm-missing),
#: 2026-11-27, Python 3.11; a report or a finding list kept per check is several KiB a check
HEAP_GROWTH_BYTES = 32 * 1024


def _settle() -> None:
    """Collect garbage and empty CPython's type attribute cache: it keeps the attribute-name strings of
    the latest lookups (4,096 entries, ~55 B each: ~0.2 MiB at most), and C code such as strftime and
    XMLParser looks names up with a fresh string on every call, so it fills over thousands of checks."""
    sys._clear_type_cache()
    gc.collect()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def sizes(agent: Agent) -> dict[str, int]:
    """Every structure of the agent that a long run could grow, by its size."""
    h = agent.history
    series = [*h.containers.values(), *h.gpus.values(), *h.probes.values()]
    out = {
        "history.containers": len(h.containers), "history.gpus": len(h.gpus), "history.probes": len(h.probes),
        "history.last_seen": len(h._last_seen), "history.longest": max(map(len, series), default=0),
        "debounce.states": len(agent.debounce.states),
        "memory_history.samples": len(agent.memory_history.samples),
        "log_cursors": len(agent.log_cursors),
        "last_findings": len(agent.last_findings), "families": len(agent.families),
        "metric series": sum(len(m.samples) for m in agent.metrics.registry.collect()),
        "re cache": len(re._cache),  # type: ignore[attr-defined]
    }
    if hasattr(agent.kube, "writes"):
        out["offline writes"] = len(agent.kube.writes)
    if agent.outbox is not None:
        out["outbox events"] = len(agent.outbox.events)
        out["outbox conditions"] = len(agent.outbox.conditions)
    return out


def _agent(example: str) -> Agent:
    cfg, _ = parse_args(["--no-kube", "--example", example, "--interval", "0.01", "--listen", "127.0.0.1:0"])
    cfg = cfg.resolved()
    sink = io.StringIO()
    agent = Agent(cfg, out=sink, log=Log(cfg.log_format, stream=sink, node="heap-test"))
    agent.start()
    return agent


def _run(agent: Agent, n: int) -> None:
    for i in range(n):
        agent.check()
        if i % 20 == 0:  # the /metrics server's sockets count in the fds
            with urllib.request.urlopen(f"http://{agent.server.address}/metrics", timeout=10) as r:
                r.read()
        agent.out.seek(0)  # the printed writes and the log: kept from growing by the test itself
        agent.out.truncate()


@pytest.mark.parametrize("example", ["healthy", "uvm-missing"])
def test_agent_heap_and_bounded_structures_stop_growing(example: str) -> None:
    agent = _agent(example)
    try:
        _soak(agent)
    finally:
        agent.server.stop()


def _soak(agent: Agent) -> None:
    _run(agent, WARMUP)
    gc.collect()
    before, fds = sizes(agent), _fds()
    tracemalloc.start(1)
    try:
        _run(agent, ROTATE)
        _settle()
        first, snap = tracemalloc.get_traced_memory()[0], tracemalloc.take_snapshot()
        _run(agent, CHECKS)
        _settle()
        grown = tracemalloc.get_traced_memory()[0] - first
        top = tracemalloc.take_snapshot().compare_to(snap, "lineno")[:5]
    finally:
        tracemalloc.stop()
    after = sizes(agent)
    assert agent.checks == WARMUP + ROTATE + CHECKS
    assert grown <= HEAP_GROWTH_BYTES, "\n".join(map(str, top))
    assert after == before, {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    assert _fds() == fds
    bounds: dict[str, Any] = {"history.longest": agent.history.maxlen,
                              "memory_history.samples": agent.memory_history.samples.maxlen,
                              "offline writes": WRITES_KEPT, "re cache": re._MAXCACHE}  # type: ignore[attr-defined]
    assert all(after.get(k, 0) <= bound for k, bound in bounds.items()), (after, bounds)


def test_sizes_sees_a_structure_that_grows() -> None:
    """The negative: a series keyed by something new every check shows in `sizes` (and in the heap)."""
    agent = _agent("healthy")
    try:
        _run(agent, 3)
    finally:
        agent.server.stop()
    before = sizes(agent)
    for i in range(5):
        agent.debounce.observe(f"GPU-TEST-{i}", "bad", float(i))
    assert sizes(agent)["debounce.states"] == before["debounce.states"] + 5


def test_offline_api_keeps_only_its_latest_writes() -> None:
    from gpuwarden.agent.offline import OfflineKube

    kube = OfflineKube("n1", [], out=io.StringIO())
    for i in range(3 * WRITES_KEPT):
        kube.request_text("POST", "/api/v1/namespaces/default/events", {"reason": f"R{i}", "metadata": {}})
    assert len(kube.writes) == WRITES_KEPT and kube.written == 3 * WRITES_KEPT
    assert kube.writes[-1][2]["reason"] == f"R{3 * WRITES_KEPT - 1}"  # the latest are kept


def _shrunk_tuples(n: int) -> None:
    """What `dataclasses.fields` does: tuple(generator) takes a 10-slot tuple and shrinks it to 2-9 items;
    dropped, each goes onto CPython's free list of its size and stays allocated there."""
    for i in range(n):
        tuple(x for x in range(2 + i % 8))


def test_agent_run_empties_the_interpreters_free_lists_after_each_check() -> None:
    """The agent's own loop keeps the interpreter's free lists from filling (docs/performance.md §9).

    The negative first: checks called without the loop, each dropping 200 shrunk tuples, leave them all
    allocated on the tuple free lists (no full collection comes on its own). Then `run()` with the same
    checks: its full collection after each check empties them, and it leaves nothing frozen behind."""
    cfg, _ = parse_args(["--no-kube", "--example", "healthy", "--interval", "0.01", "--listen", "",
                         "--cycles", "20"])
    cfg = cfg.resolved()
    sink = io.StringIO()

    class Churning(Agent):
        def check(self):  # noqa: ANN202
            try:
                return super().check()
            finally:
                _shrunk_tuples(200)
                sink.seek(0)
                sink.truncate()

    agent = Churning(cfg, out=sink, log=Log(cfg.log_format, stream=sink, node="heap-test"))
    for _ in range(WARMUP):  # the rules' imports, every rolling window full
        agent.check()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(20):
        agent.check()
    kept = sys.getallocatedblocks() - before
    assert kept >= 0.75 * 20 * 200, kept  # 4,000 shrunk tuples: held on the free lists

    gc.collect()
    frozen = gc.get_freeze_count()
    before = sys.getallocatedblocks()
    assert agent.run() == 0
    kept = sys.getallocatedblocks() - before
    assert agent.checks == WARMUP + 20 + 20
    assert kept < 0.1 * 20 * 200, kept  # measured: ~110 blocks (the loop's own)
    assert gc.get_freeze_count() == frozen
