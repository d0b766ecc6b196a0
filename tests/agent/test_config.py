"""Agent configuration: defaults, YAML, flags, precedence, strictness, documentation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwarden import options
from gpuwarden.agent import config as C
from gpuwarden.options import show_default

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"


def test_defaults_are_safe():
    c = C.AgentConfig()
    assert c.remediate == "off"
    assert c.debounce_raise >= 2 and c.debounce_clear >= 2
    assert c.interval_s == 60.0
    assert c.condition_statuses == ["confirmed"]


def test_yaml_file_then_flags(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("interval: 5m\nboot-grace: 90s\nremediate: true\nselect: [GPU-DEV, GPU-K8S]\nprobes: false\n"
                 "cooldown_s: 120\n")
    cfg, _ = C.parse_args(["--config", str(f), "--interval", "30", "--select", "GPU-DRV"])
    assert cfg.interval_s == 30.0  # the flag wins over the file
    assert cfg.boot_grace_s == 90.0
    assert cfg.remediate == "dry-run"  # enabled without saying "on" is a dry run
    assert cfg.select == ["GPU-DRV"]
    assert cfg.probes is False
    assert cfg.cooldown_s == 120.0


def test_dry_run_flag_and_choices():
    cfg, _ = C.parse_args(["--dry-run"])
    assert cfg.remediate == "dry-run"
    cfg, _ = C.parse_args(["--remediate", "on"])
    assert cfg.acting
    with pytest.raises(SystemExit):
        C.parse_args(["--remediate", "yes-please"])


def test_unknown_key_is_an_error(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("intervall: 5\n")
    with pytest.raises(C.ConfigError, match="unknown option 'intervall'"):
        C.parse_args(["--config", str(f)])


def test_bad_values():
    with pytest.raises(C.ConfigError):
        C.from_mapping({"interval": "soon"})
    with pytest.raises(C.ConfigError):
        C.from_mapping({"probes": "maybe"})
    with pytest.raises(C.ConfigError):
        C.from_mapping({"condition_statuses": ["sometimes"]}).validate()


def test_durations_in_files_and_flags():
    """One grammar (parsers.duration) for the file and the flags: units down to ms, up to days."""
    assert C.from_mapping({"interval": "1h"}).interval_s == 3600
    assert C.from_mapping({"interval": "250ms"}).interval_s == 0.25
    assert C.from_mapping({"interval": 7}).interval_s == 7.0
    assert C.from_mapping({"boot_grace": "1d"}).boot_grace_s == 86400
    assert C.from_mapping({"cooldown": "1h30m"}).cooldown_s == 5400
    cfg, _ = C.parse_args(["--interval", "500ms", "--boot-grace", "1d"])
    assert (cfg.interval_s, cfg.boot_grace_s) == (0.5, 86400)
    with pytest.raises(C.ConfigError, match="^interval: not a duration"):
        C.from_mapping({"interval": "5 parsecs"})


def test_resolved_uses_environment(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    c = C.AgentConfig().resolved()
    assert (c.node_name, c.namespace, c.root) == ("gpu-7", "ops", "/")


def test_every_option_is_a_flag_and_round_trips():
    flags = {o for p in C.command_params() for o in p.opts + p.secondary_opts}
    for name in C.FIELDS:
        assert options.flag(C.FIELDS[name]) in flags
    # the printed config is a valid --config file
    back = C.from_mapping(C.to_mapping(C.AgentConfig()))
    assert back == C.AgentConfig()


def test_docs_list_every_option_with_its_default():
    text = DOC.read_text()
    table = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \| `([^`]*)` \|", text, re.M)}
    d = C.to_mapping(C.AgentConfig())
    for key, value in d.items():
        assert key in table, f"docs/agent.md does not document {key}"
        shown = show_default(value, C.FIELDS[C.KEYS[key]].metadata.get("duration", False))
        if C.FIELDS[C.KEYS[key]].metadata.get("auto"):
            shown = "(auto)"
        assert table[key] == shown, f"docs/agent.md: {key} default {table[key]!r} != {shown!r}"


def test_check_does_not_import_the_kubernetes_client():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from gpuwarden.cli import main; "
            "r = CliRunner().invoke(main, ['check', '--example', 'healthy', '--format', 'json']); "
            "print(r.exit_code, 'kubernetes' in sys.modules, 'gpuwarden.agent.loop' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": "src", "PATH": "/usr/bin:/bin"}, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split()[1:] == ["False", "False"], out.stdout + out.stderr
