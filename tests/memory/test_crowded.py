"""Issue 17: GPU-NODE-001 on a crowded node: several GPU tenants, several GPUs, legitimate load.

Recorded on the GPU machine (tests/gpu/memory_scenarios.py, docs/validation.md run 7): the raw samples the
agent would take while a graphics pod leaks beside another graphics pod and a compute pod filling the GPU
(`tests/fixtures/memory/crowded/*-samples.json`), and `gpuwarden collect` captures at the end of each scenario
(`tests/fixtures/memory/crowded/*.tar.gz`). Multi-GPU nodes are derived from the single-GPU capture (tests/fixtures/memory/ORIGIN.md).
The two rules checked throughout: the compute pod is never named, and ambiguity is never acted on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.bundle.archive import open_bundle
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Severity, Status
from gpuwarden.memory.attribution import GpuMemory, GpuProcess, GpuView, Suspect, separate
from gpuwarden.memory.trend import SAMPLES_FILE, MemoryHistory, MemSample
from gpuwarden.remediation.plan import attributed_pod
from gpuwarden.root import BundleRoot
from gpuwarden.rules import get_rule
from tests.support.bundles import bundle

FIX = Path(__file__).resolve().parents[1] / "fixtures/memory/crowded"
MIB, GIB = 1 << 20, 1 << 30
FILLER, STEADY, LEAKER = "ml/filler-0", "viz/steady-0", "viz/render-0"


def recorded(name: str) -> list[dict]:
    return json.loads((FIX / f"{name}-samples.json").read_text())["samples"]


def view_of(s: dict) -> GpuView:
    procs, mem = [], []
    for g in s["gpus"]:
        gid = str(g["index"])
        procs += [GpuProcess(p["pid"], "G", p["used"], gid) for p in g["graphics"]]
        procs += [GpuProcess(p["pid"], "C", p["used"], gid) for p in g["compute"]]
        mem.append(GpuMemory(gid, g["total"] - g["free"], g["free"], g["total"]))
    return GpuView("NVML (recorded)", tuple(procs), tuple(mem))


def suspects_of(s: dict) -> list[Suspect]:
    out = []
    for ref, p in s["pods"].items():
        ns, name = ref.split("/")
        pids = [int(x) for x in p["procs"]]
        if pids:
            out.append(Suspect("pod", name, ns, p["uid"], pids=pids, devices=["/dev/nvidia0", "/dev/nvidiactl"]))
    return out


def sample_of(s: dict, view: GpuView) -> MemSample:
    sus = suspects_of(s)
    return MemSample(s["t"], s["gap"], s["MemAvailable"], 66 * MIB, {x.key: x.ref for x in sus},
                     {x.key: tuple(x.pids) for x in sus}, view.full(0.05))


def replay(name: str):
    """The separation after every recorded sample, as the agent's checks would make it."""
    h = MemoryHistory(100, window_s=300, growth_bytes_per_min=1 << 30)
    for s in recorded(name):
        view = view_of(s)
        sample = sample_of(s, view)
        t = h.trend_with(sample)
        h.add(sample)
        yield s, t, separate(suspects_of(s), True, view, t)


# ------------------------------------------------------------------ recorded sample histories

def test_late_leaker_is_named_from_the_agents_samples_and_the_compute_pod_never():
    seps = list(replay("late-leaker"))
    for s, _, sep in seps:
        assert FILLER not in {x.ref for x in sep.remaining}
        if s["gap"] > GIB:  # beyond a healthy baseline (before the leaker came, the steady pod was alone)
            assert sep.holder is None or sep.holder.ref == LEAKER
    s, t, sep = seps[-1]
    assert (sep.holder.ref, sep.confidence, sep.method) == (LEAKER, "high", "arrival")
    steady = next(c for c in sep.candidates if c.suspect.ref == STEADY)
    assert steady.score < next(c for c in sep.candidates if c.suspect.ref == LEAKER).score
    assert any("nothing grew" in x for x in steady.con)
    # the rate from the first samples: the growth is reported at once, with the time to the min watermark
    assert t.rate is None and t.early_rate and t.change_bytes > 4 * GIB and t.change_s < 10
    assert t.seconds_to_min_watermark is not None
    # it was named as soon as the growth began
    first = next(i for i, (s, _, x) in enumerate(seps) if x.holder is not None and s["gap"] > GIB)
    assert seps[first][1].growth_intervals <= 2 and seps[first][0]["leak_s"] < 5


def test_two_graphics_pods_from_the_start_stay_candidates_and_nobody_is_named():
    for s, t, sep in replay("two-graphics"):
        assert sep.holder is None
        assert FILLER not in {x.ref for x in sep.remaining}
    assert {x.ref for x in sep.remaining} == {STEADY, LEAKER} and sep.confidence == "medium"
    assert "stopping one of them" in sep.separate_by
    assert t.growth_intervals >= 4


def test_freed_memory_names_the_pod_that_left():
    samples = recorded("two-graphics")
    view = view_of(samples[-1])
    h = MemoryHistory(100, window_s=300)
    for s in samples:
        h.add(sample_of(s, view_of(s)))
    gone = dict(samples[-1], t=samples[-1]["t"] + 2, gap=samples[0]["gap"],
                pods={k: v for k, v in samples[-1]["pods"].items() if k != LEAKER})
    t = h.trend_with(sample_of(gone, view))
    sep = separate(suspects_of(samples[-1]), True, view, t)  # the leaker still listed (a stale scan)
    assert (sep.holder.ref, sep.method, sep.confidence) == (LEAKER, "freed", "high")


# ------------------------------------------------------------------ captures of the same runs

def check(root, hist: MemoryHistory | None = None):
    facts = NodeFacts(root, Settings(memory_history=hist))
    report = engine.run(facts, [get_rule("GPU-NODE-001")], mode="bundle")
    assert report.errors == [], report.errors
    return facts, report


@pytest.fixture
def capture(tmp_path):
    n = iter(range(100))
    keep = []  # the unpacked bundles live as long as the test

    def open_(name: str, files: dict[str, str] | None = None, remove: tuple[str, ...] = ()) -> BundleRoot:
        work = tmp_path / f"{name}-{next(n)}"
        work.mkdir()
        root, tmp = open_bundle(FIX / f"{name}.tar.gz", str(work))
        keep.append(tmp)
        if not files and not remove:
            return root
        bundle(work / "ov", files or {}, meta={"captured_at": NodeFacts(root).now, "remove": list(remove)}, tz=None)
        return BundleRoot(work / "ov", lower=root)
    return open_


def refs(f) -> set[str]:
    return {f"{a.namespace}/{a.name}" for a in f.affected if a.kind == "pod"}


@pytest.mark.rule("GPU-NODE-001", "negative")
@pytest.mark.parametrize("name", ["late-leaker", "two-graphics"])
def test_one_shot_without_the_agent_two_graphics_clients_are_candidates_and_nothing_is_acted_on(capture, name):
    facts, report = check(capture(name, remove=(SAMPLES_FILE,)))  # a node where no agent keeps samples
    [f] = report.findings
    assert (f.status, f.severity) == (Status.AT_RISK, Severity.HIGH)
    assert refs(f) == {STEADY, LEAKER} and FILLER not in f.summary
    assert "Candidates, not separated (medium confidence" in f.summary and "what would separate them" in f.summary
    assert attributed_pod(f) is None and "pod" not in f.data
    assert f.data["attribution"]["confidence"] == "medium"
    text = " ".join(e.text for e in f.evidence)
    assert "ml/filler-0: ELIMINATED, compute-only client" in text and "confidence high" not in text


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_one_shot_check_beside_the_agent_confirms_the_late_leaker(capture):
    """The capture holds the samples the real agent kept on the GPU machine while the leaker arrived."""
    facts, report = check(capture("late-leaker"))
    [f] = report.findings
    assert f.status == Status.CONFIRMED and f.summary.startswith("At +")  # the danger first
    assert "viz/render-0 has escaped its memory limit" in f.summary and "Named by arrival (high confidence)" in f.summary
    assert refs(f) == {LEAKER} and attributed_pod(f)[1] == "render-0"
    assert any(e.source.startswith("the agent's samples (/run/gpuwarden") for e in f.evidence)
    # the same from the raw samples of the scenario, written as the agent writes them
    now = NodeFacts(capture("late-leaker")).now
    _, report = check(capture("late-leaker", {SAMPLES_FILE: agent_samples("late-leaker", now)}))
    assert report.findings[0].status == Status.CONFIRMED and refs(report.findings[0]) == {LEAKER}


def test_samples_the_agent_took_after_the_check_began_are_left_out(capture):
    root = capture("late-leaker")
    now = NodeFacts(root).now
    d = json.loads(root.read_text(SAMPLES_FILE))
    d["samples"].append(dict(d["samples"][-1], t=now + 5))  # the agent sampled again while the check ran
    _, report = check(capture("late-leaker", {SAMPLES_FILE: json.dumps(d)}))
    assert report.findings[0].status == Status.CONFIRMED


def agent_samples(name: str, facts_now: float) -> str:
    """The recorded samples as the agent's samples file, its clock ending just before the capture."""
    samples = recorded(name)
    h = MemoryHistory(120, window_s=300, growth_bytes_per_min=1 << 30)
    shift = facts_now - 2.0 - samples[-1]["t"]
    for s in samples:
        v = view_of(s)
        x = sample_of(s, v)
        h.add(MemSample(x.t + shift, x.gap, x.available, x.min_watermark, x.candidates, x.pids, x.full_gpus))
    return json.dumps(h.to_json())


@pytest.mark.rule("GPU-NODE-001", "negative")
def test_one_shot_check_beside_the_agent_keeps_two_graphics_ambiguous(capture):
    _, report = check(capture("two-graphics"))  # with the real agent's samples
    [f] = report.findings
    assert f.status == Status.AT_RISK and refs(f) == {STEADY, LEAKER} and attributed_pod(f) is None
    assert "stopping one of them" in f.summary


def test_stale_or_garbage_agent_samples_are_ignored(capture):
    _, report = check(capture("late-leaker", {SAMPLES_FILE: agent_samples("late-leaker", 1_000_000.0)}))
    assert report.findings[0].status == Status.AT_RISK
    _, report = check(capture("late-leaker", {SAMPLES_FILE: '{"samples": [{"t": "x"}]}'}))
    assert report.findings[0].status == Status.AT_RISK
    assert any(g.source == SAMPLES_FILE and "not the agent's memory samples" in g.reason for g in report.gaps)


@pytest.mark.rule("GPU-NODE-001", "negative")
def test_heavy_legitimate_load_is_information_at_most(capture):
    facts, report = check(capture("heavy-legit"))
    assert [(f.severity, f.status) for f in report.findings] == [(Severity.INFO, Status.AT_RISK)]
    assert "Information only" in report.findings[0].summary
    assert attributed_pod(report.findings[0]) is None


# ------------------------------------------------------------------ several GPUs (derived from the capture)

def eight_gpus(capture, moves: dict[int, int], free_gib: dict[int, float], checkpoint: dict[str, int] | None = None,
               drop: tuple[int, ...] = ()) -> BundleRoot:
    """The late-leaker capture on an 8-GPU node: GPU 0 as captured; `moves` puts a pid on another GPU, whose
    free memory is `free_gib` (default: full); `checkpoint` gives pods (by ref) a GPU in the kubelet's checkpoint."""
    base = capture("late-leaker", remove=(SAMPLES_FILE,))  # one-shot: GPUs alone must separate them
    probes = json.loads(base.read_text("/.gpuwarden/probes.json"))
    g0 = probes["nvml"]["value"]["gpus"][0]
    gpus = []
    for i in range(8):
        g = json.loads(json.dumps(g0))
        g.update(index=i, minor=i, uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}")
        if i in free_gib:
            g["memory"]["free"] = int(free_gib[i] * GIB)
            g["memory"]["used"] = g["memory"]["total"] - g["memory"]["free"]
        g["processes"] = [p for p in g0["processes"] if moves.get(p["pid"], 0) == i and p["pid"] not in drop]
        gpus.append(g)
    probes["nvml"]["value"]["gpus"] = gpus
    files = {"/.gpuwarden/probes.json": json.dumps(probes)}
    if checkpoint:
        uids = {}
        for p in ("/var/log/pods",):
            for n in base.listdir(p):
                ns, name, uid = n.split("_")
                uids[f"{ns}/{name}"] = uid
        entries = [{"PodUID": uids[r], "ContainerName": "render", "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"-1": [gpus[i]["uuid"]]}} for r, i in checkpoint.items()]
        files["/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"] = json.dumps(
            {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"nvidia.com/gpu": [g["uuid"] for g in gpus]}},
             "Checksum": 0})
    bundle(base.base.parent / "8gpu", files, captured_at=NodeFacts(base).now, tz=None)
    return BundleRoot(base.base.parent / "8gpu", lower=base)


def pids(capture) -> dict[str, int]:
    probes = json.loads(capture("late-leaker").read_text("/.gpuwarden/probes.json"))
    procs = probes["nvml"]["value"]["gpus"][0]["processes"]
    g = sorted((p for p in procs if p["type"] == "G"), key=lambda p: p["used"])
    return {STEADY: g[0]["pid"], LEAKER: g[-1]["pid"], FILLER: next(p["pid"] for p in procs if p["type"] == "C")}


@pytest.mark.rule("GPU-NODE-001", "positive")
def test_eight_gpus_the_only_graphics_client_of_a_full_gpu_is_named(capture):
    p = pids(capture)
    # the steady renderer has GPU 5 to itself, with 60 GiB free: its objects stay in GPU memory
    facts, report = check(eight_gpus(capture, {p[STEADY]: 5}, {5: 60.0}))
    [f] = report.findings
    sep = facts.get("memory").escape.separation
    assert f.status == Status.CONFIRMED and refs(f) == {LEAKER}
    c = {x.suspect.ref: x for x in sep.candidates}
    assert c[STEADY].gpus == ("5",) and c[LEAKER].gpus == ("0",) and c[FILLER].eliminated
    assert "the only graphics client of a full GPU" in c[LEAKER].decisive


@pytest.mark.rule("GPU-NODE-001", "negative")
def test_eight_gpus_two_graphics_clients_of_full_gpus_stay_ambiguous(capture):
    p = pids(capture)
    facts, report = check(eight_gpus(capture, {p[STEADY]: 3, p[FILLER]: 1}, {}))
    [f] = report.findings
    assert f.status == Status.AT_RISK and refs(f) == {STEADY, LEAKER} and attributed_pod(f) is None


def test_eight_gpus_a_pod_nvml_does_not_list_is_placed_by_the_kubelet_checkpoint(capture):
    p = pids(capture)
    facts, report = check(eight_gpus(capture, {}, {6: 70.0}, checkpoint={STEADY: 6}, drop=(p[STEADY],)))
    c = {x.suspect.ref: x for x in facts.get("memory").escape.separation.candidates}
    assert c[STEADY].gpus == ("6",) and c[STEADY].gpus_from == "the kubelet's device allocation"
    assert report.findings[0].status == Status.CONFIRMED and refs(report.findings[0]) == {LEAKER}


def test_a_host_process_named_holder_never_leads_to_a_pod_eviction():
    """High confidence for a host process: the guard's hook must not fall back to some pod of the list."""
    from gpuwarden.findings import Finding

    s = recorded("late-leaker")[-1]
    view = view_of(s)
    pod = suspects_of(s)
    host = Suspect("process", "render", pids=[4242], devices=["/dev/nvidia0"])
    view = GpuView(view.source, tuple(p for p in view.processes if p.type == "C") + (GpuProcess(4242, "G", None, "0"),),
                   view.memory)
    sep = separate(pod + [host], True, view, None)
    assert sep.holder is host and sep.confidence == "high"
    f = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s",
                data={"attribution": {"confidence": "high", "suspects": [{"kind": "process", "ref": host.ref}]}})
    assert attributed_pod(f) is None


def test_two_graphics_publish_the_candidates_for_the_unsure_policy(capture):
    """What agent/unsure.py reads (issue 43): the remaining candidates, graphics or not, with their cgroups, and how
    near the min watermark the growth takes the node; and nothing of it once a holder is named."""
    _, report = check(capture("two-graphics"))
    [f] = report.findings
    u = f.data["unsure"]
    assert {c["ref"] for c in u["candidates"]} == {STEADY, LEAKER}
    assert all(c["kind"] == "pod" and c["graphics"] and c["cgroup"] for c in u["candidates"])
    assert "seconds_to_min_watermark" in u and "recent_rate_bytes_per_s" in u
    _, named = check(capture("late-leaker", {SAMPLES_FILE: agent_samples("late-leaker", NodeFacts(capture("late-leaker")).now)}))
    assert "unsure" not in named.findings[0].data


def test_the_sample_carries_each_candidates_signals_read_through_the_root(capture):
    """Issue 43: kernel time and faults from /proc/<pid>/stat, NVIDIA/DRM mappings from /proc/<pid>/maps, summed
    per candidate into the agent's sample; an unreadable maps file is unread (None), never zero."""
    base = NodeFacts(capture("two-graphics")).get("memory")
    pod_holders = [h for h in base.holders if h.pod_uid]
    h = pod_holders[0]
    maps = ("7f0000000000-7f0000200000 rw-s 00000000 00:05 1030 /dev/nvidia0\n"
            "7f0000300000-7f0000400000 rw-s 00000000 00:05 1032 /dev/dri/renderD128\n")
    hist = MemoryHistory(120, window_s=300, growth_bytes_per_min=1 << 30)
    facts = NodeFacts(capture("two-graphics", {f"/proc/{h.pid}/maps": maps}), Settings(memory_history=hist))
    m = facts.get("memory")
    got = next(x for x in m.holders if x.pid == h.pid)
    assert got.dev_maps == (2, 0x300000) and got.faults is not None and got.kernel_s is not None
    sig = m.sample.signals[h.pod_uid]
    assert sig.dev_maps == 2 and sig.dev_map_bytes == 0x300000 and sig.faults is not None
    other = next(x for x in m.holders if x.pod_uid and x.pid != h.pid and x.pod_uid != h.pod_uid)
    assert other.dev_maps is None  # not in the capture: unread
