"""Bounded log scans: --log-window (a time window, with a look-back for device-plugin calls) and
LogCursors (the agent's incremental scan), and logscan.merge, which the latter rests on."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

from gpuwarden.logs import scan as logscan, signatures as logsignatures, window
from gpuwarden.logs.cursors import LogCursors
from gpuwarden.logs.decode import decoder
from gpuwarden.logs.scan import Signature, merge, scan
from gpuwarden.parsers.duration import parse_duration
from tests.support.bundles import CAPTURED, SH, bundle, bundle_file, facts_of
from tests.support.kubelet_log import adding, alloc, gpa, noise, syncloop

UID = "69e0758e-d625-4013-9258-df8b7ddf04e2"
LOG = "/.gpuwarden/logs/kubelet.log"


def hms(sec: int) -> str:
    return f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}.000100"


def kubelet_log(start: int = 19 * 3600, end: int = 21 * 3600 + 4 * 60, per_s: int = 3, events=()) -> str:
    """Noise every second from `start` to `end` (seconds of the day, Jul 30, Shanghai time), with
    `events` (second -> text) placed at their second."""
    ev = dict(events)
    out = []
    for sec in range(start, end):
        if sec in ev:
            out.append(ev[sec])
        for _ in range(per_s):
            out.append(noise(hms(sec), 45878))
    return "".join(out)


@pytest.fixture(autouse=True)
def small_bounds(monkeypatch):
    # the shipped bounds (1 MB tail, 64 KB bisection grain) need logs of tens of MB
    monkeypatch.setattr(window, "WINDOW_MIN_TAIL", 4096)
    monkeypatch.setattr(window, "WINDOW_GRAIN", 2048)


def calls(lf):
    return [(c.rpc, c.outcome, c.pod_uid) for c in lf.devicemanager.calls]


# --- --log-window ----------------------------------------------------------------------------------

def returned_pair(sec: int) -> dict[int, str]:
    return {sec: gpa(hms(sec), 45878, UID, "c") + alloc(hms(sec).replace(".000100", ".000200"), 45878)
            + syncloop(hms(sec).replace(".000100", ".000300"), 45878)}


def test_window_scans_only_the_tail(tmp_path: Path) -> None:
    text = kubelet_log(events={**returned_pair(19 * 3600 + 600), **returned_pair(21 * 3600 + 60)})
    root = bundle(tmp_path, {LOG: text})
    full = facts_of(root).get("logs")
    win = facts_of(root, log_window_s=900).get("logs")
    assert full.kubelet.start == 0 and full.kubelet.count("kubelet.gpa.issue") == 2
    k = win.kubelet
    assert k.start > 0 and k.count("kubelet.gpa.issue") == 1  # the 19:10 call is before the window
    # the window begins at most one bisection grain before 20:50 (the capture is 21:05)
    first_line = text.encode()[k.start:].split(b"\n", 1)[0].decode()
    assert " 20:4" in first_line or " 20:5" in first_line
    assert k.last_time == full.kubelet.last_time
    assert calls(win) == [("GetPreferredAllocation", "returned", UID), ("Allocate", "returned", UID)]
    f = facts_of(root, log_window_s=900)
    f.get("logs")
    assert any(g.source == LOG and g.reason.startswith("log window: scanned the last 15m") for g in f.gaps())


def test_window_looks_back_to_a_call_hung_since_before_it(tmp_path: Path) -> None:
    hung = 20 * 3600 + 5 * 60  # 20:05, an hour before the capture: a hang older than the window
    text = kubelet_log(events={**returned_pair(19 * 3600 + 600),
                               hung: gpa(hms(hung), 45878, UID, "trainer"),
                               hung + 300: adding(hms(hung + 300), 45878, "ml/queued-0")})
    root = bundle(tmp_path, {LOG: text})
    full = facts_of(root).get("logs")
    f = facts_of(root, log_window_s=900)
    win = f.get("logs")
    assert calls(full)[-1] == ("GetPreferredAllocation", "open", UID)
    assert calls(win) == [("GetPreferredAllocation", "open", UID)]
    (c,) = win.devicemanager.open_calls()
    (cf,) = full.devicemanager.open_calls()
    assert (c.waited_s, c.log_after_s, c.event.offset) == (cf.waited_s, cf.log_after_s, cf.event.offset)
    assert [p for _, p, _ in win.devicemanager.queued_pods()] == ["ml/queued-0"]
    assert win.kubelet.start <= c.event.offset < text.encode().index(b"20:50:00")
    assert any(g.reason.startswith("log window: extended back to the latest device-plugin call") for g in f.gaps())


def test_window_without_any_call_scans_the_window_only(tmp_path: Path) -> None:
    root = bundle(tmp_path, {LOG: kubelet_log()})
    f = facts_of(root, log_window_s=900)
    k = f.get("logs").kubelet
    assert k.start > 0 and not k.events
    assert any(g.reason.endswith("; no device-plugin call before it either") for g in f.gaps())


def test_window_longer_than_the_log_scans_it_whole(tmp_path: Path) -> None:
    root = bundle(tmp_path, {LOG: kubelet_log(start=20 * 3600 + 59 * 60, events=returned_pair(21 * 3600))})
    f = facts_of(root, log_window_s=3600)
    k = f.get("logs").kubelet
    assert k.start == 0 and k.first_time is not None and k.count("kubelet.gpa.issue") == 1
    assert not any("log window" in g.reason for g in f.gaps())


def test_window_keeps_the_tail_of_a_log_that_went_silent(tmp_path: Path) -> None:
    # nothing logged in the last hour: the last WINDOW_MIN_TAIL bytes are still read
    root = bundle(tmp_path, {LOG: kubelet_log(end=20 * 3600, events=returned_pair(19 * 3600 + 3000))})
    k = facts_of(root, log_window_s=900).get("logs").kubelet
    assert k.start > 0 and k.last_time is not None and k.count("kubelet.gpa.issue") == 1


def test_window_does_not_bound_the_kernel_log(tmp_path: Path) -> None:
    kern = "".join(f"<4>[{i}.000000] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
                   for i in range(1, 400))
    root = bundle(tmp_path, {LOG: kubelet_log(), "/.gpuwarden/logs/kernel.log": kern, "/proc/stat": "btime 1753876000\n"})
    lf = facts_of(root, log_window_s=60).get("logs")
    assert lf.kernel.start == 0 and lf.kernel.count("kernel.xid") == 399


@pytest.mark.parametrize("text,seconds", [("900", 900), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400),
                                          (" 1.5m ", 90)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text, positive=True) == seconds  # what --log-window accepts


@pytest.mark.parametrize("text", ["", "m", "-5m", "0", "1x", "nan", "inf"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text, positive=True)


def test_cli_log_window(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuwarden.cli import main

    ok = CliRunner().invoke(main, ["check", "--example", "healthy", "--log-window", "15m", "--format", "json"])
    assert ok.exit_code in (0, 1), ok.output
    bad = CliRunner().invoke(main, ["check", "--example", "healthy", "--log-window", "soon"])
    assert bad.exit_code == 2 and "--log-window" in bad.output


# --- LogCursors: the agent's incremental scan ------------------------------------------------------------

def same(a, b) -> None:
    """Two LogFacts hold the same kubelet scan and the same plugin-call verdicts."""
    ka, kb = a.kubelet, b.kubelet
    assert ka.counts == kb.counts
    assert [(e.sig, e.offset, e.time) for e in ka.events] == [(e.sig, e.offset, e.time) for e in kb.events]
    assert {k: e.offset for k, e in ka.first_hit.items()} == {k: e.offset for k, e in kb.first_hit.items()}
    assert (ka.first_time, ka.last_time, ka.last_pid, ka.last_line) == (kb.first_time, kb.last_time, kb.last_pid,
                                                                        kb.last_line)
    assert calls(a) == calls(b)
    assert [(c.waited_s, c.log_after_s) for c in a.devicemanager.calls] == \
        [(c.waited_s, c.log_after_s) for c in b.devicemanager.calls]


def reads_during(fn):
    """fn()'s result, and the (start, stop) of every file read by a scan while it ran."""
    reads = []
    real = logscan._file_chunks

    def spy(f, start, size=None, stop=None):
        reads.append((start, stop))
        return real(f, start, size, stop)

    logscan._file_chunks = spy
    try:
        return fn(), reads
    finally:
        logscan._file_chunks = real


def test_cursor_reads_only_what_was_appended(tmp_path: Path) -> None:
    head = kubelet_log(end=20 * 3600, events=returned_pair(19 * 3600 + 100))
    tail = kubelet_log(start=20 * 3600, events={**returned_pair(20 * 3600 + 100),
                                                 20 * 3600 + 200: gpa(hms(20 * 3600 + 200), 45878, UID, "x")})
    root = bundle(tmp_path, {LOG: head})
    path = bundle_file(tmp_path, LOG)
    cur = LogCursors()
    first = facts_of(root, log_cursors=cur).get("logs")
    same(first, facts_of(root).get("logs"))
    with open(path, "a") as f:
        f.write(tail)
    second, reads = reads_during(lambda: facts_of(root, log_cursors=cur).get("logs"))
    assert reads[0] == (len(head.encode()), len((head + tail).encode()))  # the main pass: the new part only
    same(second, facts_of(root).get("logs"))
    assert calls(second)[-1] == ("GetPreferredAllocation", "open", UID)


def test_cursor_leaves_a_line_being_written_for_the_next_check(tmp_path: Path) -> None:
    body = kubelet_log(end=19 * 3600 + 60)
    line = gpa(hms(19 * 3600 + 61), 45878, UID, "c")
    root = bundle(tmp_path, {LOG: body + line[:40]})
    path = bundle_file(tmp_path, LOG)
    cur = LogCursors()
    assert facts_of(root, log_cursors=cur).get("logs").kubelet.count("kubelet.gpa.issue") == 0
    with open(path, "a") as f:
        f.write(line[40:])
    got = facts_of(root, log_cursors=cur).get("logs")
    assert got.kubelet.count("kubelet.gpa.issue") == 1
    same(got, facts_of(root).get("logs"))


@pytest.mark.parametrize("how", ["rotated", "truncated", "rewritten"])
def test_cursor_rescans_a_replaced_file(tmp_path: Path, how: str) -> None:
    old = kubelet_log(end=19 * 3600 + 600, events=returned_pair(19 * 3600 + 100))
    new = kubelet_log(start=19 * 3600 + 700, end=19 * 3600 + 1400, events=returned_pair(19 * 3600 + 800))
    root = bundle(tmp_path, {LOG: old})
    path = bundle_file(tmp_path, LOG)
    cur = LogCursors()
    facts_of(root, log_cursors=cur).get("logs")
    if how == "rotated":  # logrotate create: a new file under the name
        os.rename(path, str(path) + ".1")
        path.write_text(new)
    elif how == "truncated":  # copytruncate, then less than before was written
        with open(path, "r+") as f:
            f.truncate(0)
            f.write(new[:len(new) // 2].rsplit("\n", 1)[0] + "\n")
    else:  # the same inode rewritten with other bytes, longer than before
        with open(path, "r+") as f:
            f.write(new + new)
    got = facts_of(root, log_cursors=cur).get("logs")
    same(got, facts_of(root).get("logs"))


def test_cursor_with_window_then_incremental(tmp_path: Path) -> None:
    hung = 20 * 3600 + 5 * 60
    text = kubelet_log(end=21 * 3600, events={**returned_pair(19 * 3600 + 600), hung: gpa(hms(hung), 45878, UID, "t")})
    root = bundle(tmp_path, {LOG: text})
    path = bundle_file(tmp_path, LOG)
    cur = LogCursors()
    a = facts_of(root, log_cursors=cur, log_window_s=900).get("logs")
    with open(path, "a") as f:
        f.write(kubelet_log(start=21 * 3600, end=21 * 3600 + 240))
    b = facts_of(root, log_cursors=cur, log_window_s=900).get("logs")
    assert calls(a) == calls(b) == [("GetPreferredAllocation", "open", UID)]
    assert b.kubelet.last_time > a.kubelet.last_time and b.kubelet.start == a.kubelet.start


# --- logscan.merge ----------------------------------------------------------------------------------------

def test_merge_of_two_parts_equals_one_scan() -> None:
    rng = random.Random(7)
    sigs = [Signature("t.gpa", b"GetPreferredAllocation", keep=3), Signature("t.alloc", b"allocation request", keep=2),
            Signature("t.sync", b"SyncLoop", keep=1)]
    lines = []
    for i in range(600):
        t = hms(19 * 3600 + i)
        lines.append(rng.choice([noise(t, 45878), noise(t, 45878), gpa(t, 45878, UID, "c"), alloc(t, 45878),
                                 syncloop(t, 45878)]))
    data = "".join(lines).encode()
    dec = decoder("klog", CAPTURED, SH)
    whole = scan(io.BytesIO(data), sigs, dec, log="kubelet", source="/k", fmt="klog")
    for _ in range(25):
        cut = sum(len(x.encode()) for x in lines[:rng.randrange(len(lines) + 1)])
        a = scan(io.BytesIO(data[:cut]), sigs, dec, log="kubelet", source="/k", fmt="klog")
        b = scan(io.BytesIO(data), sigs, dec, log="kubelet", source="/k", fmt="klog", start=cut)
        m = merge(a, b, sigs)
        assert m.counts == whole.counts
        assert [(e.sig, e.offset) for e in m.events] == [(e.sig, e.offset) for e in whole.events]
        assert {k: e.offset for k, e in m.first_hit.items()} == {k: e.offset for k, e in whole.first_hit.items()}
        assert (m.first_time, m.last_time, m.last_line, m.end) == (whole.first_time, whole.last_time,
                                                                    whole.last_line, whole.end)


def test_scan_stop_reads_no_further() -> None:
    data = "".join(gpa(hms(19 * 3600 + i), 45878, UID, "c") for i in range(50)).encode()
    stop = data.index(b"\n", len(data) // 2) + 1
    s = scan(io.BytesIO(data), logsignatures.for_log("kubelet"), decoder("klog", CAPTURED, SH), log="kubelet",
             source="/k", fmt="klog", stop=stop)
    assert s.end == stop and s.count("kubelet.gpa.issue") == data[:stop].count(b"\n")


def test_follow_ups_of_an_open_call_are_incremental_too(tmp_path: Path) -> None:
    """A call left open is searched after (for its return, and for pods queued behind it) to the end
    of the log; with cursors each later check reads only what was appended, and answers as a fresh
    whole-file scan does, also once the call returns."""
    hung = 20 * 3600 + 300
    head = kubelet_log(end=20 * 3600 + 600, events={hung: gpa(hms(hung), 45878, UID, "t")})
    root = bundle(tmp_path, {LOG: head})
    path = bundle_file(tmp_path, LOG)
    cur = LogCursors()
    a = facts_of(root, log_cursors=cur).get("logs")
    same(a, facts_of(root).get("logs"))
    assert calls(a) == [("GetPreferredAllocation", "open", UID)]

    def queued(lf):
        return [(e.offset, e.get("op")) for e in lf.devicemanager.queued], lf.devicemanager.syncloop_after

    with open(path, "a") as f:  # the kubelet goes on, and a pod queues behind the hung call
        f.write(kubelet_log(start=20 * 3600 + 600, end=20 * 3600 + 700,
                            events={20 * 3600 + 650: adding(hms(20 * 3600 + 650), 45878, "ml/next-0")}))
    b, reads = reads_during(lambda: facts_of(root, log_cursors=cur).get("logs"))
    fresh = facts_of(root).get("logs")
    same(b, fresh)
    assert queued(b) == queued(fresh) and queued(b)[0]
    n = len(head.encode())
    # nothing up to the end of the log is read again from before the appended part (the pod's
    # admission is looked for only before the call: a read that ends there)
    assert all(start >= n for start, stop in reads if stop is None or stop > n), reads

    with open(path, "a") as f:  # the call returns: the same kubelet's sync loop moves on
        f.write(syncloop(hms(20 * 3600 + 701), 45878))
    c = facts_of(root, log_cursors=cur).get("logs")
    same(c, facts_of(root).get("logs"))
    assert calls(c)[0][1] == "returned"
