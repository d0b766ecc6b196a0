"""The controller's flags and `fleet --since` read durations with the one grammar (parsers.duration)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.controller import config as C


def test_controller_flags_take_every_unit():
    cfg = C.parse_args(["--interval", "500ms", "--window", "1d", "--event-hold", "1h30m"])
    assert (cfg.interval_s, cfg.window_s, cfg.event_hold_s) == (0.5, 86400, 5400)


def test_controller_bad_duration_names_the_flag():
    with pytest.raises(C.ConfigError, match="^--interval: not a duration"):
        C.from_flags({"interval_s": "soon"})


@pytest.mark.parametrize("since", ["1d", "500ms", "90", "1h30m"])
def test_fleet_since_takes_every_unit(tmp_path, since):
    # a valid --since passes to the next step: loading the (missing) kubeconfig
    out = CliRunner().invoke(main, ["fleet", "--since", since, "--kubeconfig", str(tmp_path / "none")])
    assert out.exit_code == 2 and "--since" not in out.output and "kubeconfig" in out.output.lower(), out.output


def test_fleet_since_refuses_a_non_duration(tmp_path):
    out = CliRunner().invoke(main, ["fleet", "--since", "1x", "--kubeconfig", str(tmp_path / "none")])
    assert out.exit_code == 2 and "--since" in out.output and "not a duration" in out.output, out.output
