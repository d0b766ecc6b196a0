"""`gpuwarden agent --example NAME --no-kube --dry-run`: the demo shows the product. No boot grace
on an example; a fault raised, its NodeCondition and Events as the agent would write them, and
the dry-run remediation, from the agent's real code (agent/offline.py answers for the API server)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main


@pytest.mark.parametrize("example, condition, event_on, action", [
    ("uvm-missing", "GPUDeviceAccess=True reason=GpuDev001", "Pod/ml/trainer-0",
     "WOULD DO: restart-device-plugin pod kube-system/nvidia-device-plugin-x7k2p"),
    ("egl-framebuffer-escape", "GPUUnchargedMemory=True reason=GpuNode001", "Pod/viz/render-0",
     "WOULD DO: evict-pod-for-memory pod viz/render-0"),
])
def test_the_demo_shows_fault_condition_event_and_dry_run(example, condition, event_on, action):
    r = CliRunner().invoke(main, ["agent", "--example", example, "--no-kube", "--cycles", "2", "--interval", "0.05",
                                  "--dry-run", "--listen", "", "--log-format", "text"])
    assert r.exit_code == 0, r.output
    out, err = r.stdout, r.stderr
    assert "[offline] no API server" in out
    assert f"[would write] Node " in out and condition in out
    assert f"[would write] Event Warning " in out and f"about {event_on}:" in out
    assert action in out
    assert "grace=True" not in err and "msg=fault-raised" in err
    assert "monitor-failed" not in err and "Traceback" not in err


def test_the_demo_writes_nothing_anywhere_without_dry_run():
    r = CliRunner().invoke(main, ["agent", "--example", "uvm-missing", "--no-kube", "--cycles", "2", "--interval",
                                  "0.05", "--listen", ""])
    assert r.exit_code == 0
    assert "[would write] Node" in r.stdout and "[dry-run]" not in r.stdout  # remediation off: no plan


def test_the_demo_as_the_help_writes_it_shows_its_plan_within_seconds():
    """No --interval: an example is checked every second, so the plan is out in seconds, not minutes."""
    import time

    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["agent", "--example", "uvm-missing", "--no-kube", "--dry-run", "--cycles", "3",
                                  "--listen", ""])
    took = time.monotonic() - t0
    assert r.exit_code == 0, r.output
    assert "WOULD DO: restart-device-plugin" in r.stdout
    assert took < 20, took  # 3 checks 1 s apart (about 3-6 s; generous for a loaded machine), not 2 x 60 s
    help_text = CliRunner().invoke(main, ["agent", "--help"]).stdout
    assert "gpuwarden agent --example uvm-missing --no-kube --dry-run --cycles 3" in help_text


@pytest.mark.parametrize("args, file, interval", [
    (["--example", "uvm-missing"], None, 1.0),                       # the demo: 1 s
    (["--example", "uvm-missing", "--interval", "30s"], None, 30.0),  # a flag wins
    (["--example", "uvm-missing"], "interval: 45s\n", 45.0),          # so does the config file
    (["--example", "uvm-missing"], "interval_s: 60\n", 60.0),         # even when it says the default
    ([], None, 60.0),                                                 # a node: a minute
])
def test_an_example_gets_a_short_interval_unless_one_is_set(tmp_path, args, file, interval):
    from gpuwarden.agent import config as C

    if file is not None:
        (tmp_path / "agent.yaml").write_text(file)
        args = [*args, "--config", str(tmp_path / "agent.yaml")]
    cfg, _ = C.parse_args(args)
    assert cfg.interval_s == interval
