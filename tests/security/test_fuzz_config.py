"""The agent's and the controller's config as a typed schema: any YAML document, any bytes, any file
type gives a valid config or one ConfigError line naming the key; never another exception."""

from __future__ import annotations

import math
import os
import threading

import pytest
from hypothesis import example, given, strategies as st

from gpuwarden.agent import config as ac
from gpuwarden.agent.config import BOUNDS, ConfigError, from_mapping, load_file
from gpuwarden.controller import config as cc

_value = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                   st.sampled_from([".inf", ".nan", "-1", "0", "99999999999999999999h", "90s", "host:port", ":99999",
                                    "0.0.0.0:9465", "healthy", "[::]:80", "1e309"]),
                   st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_key = st.sampled_from(sorted(ac.KEYS))


def _valid(cfg) -> None:
    ac.check_schema(cfg, BOUNDS)  # what validate() enforces, asserted on the result
    for name, (lo, hi) in BOUNDS.items():
        v = getattr(cfg, name)
        assert not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi, (name, v)


@given(doc=st.dictionaries(_key, _value, max_size=6))
@example(doc={"interval": float("inf")})  # issue 18: traceback after the first check
@example(doc={"interval": "99999999999999999999h"})
@example(doc={"interval": float("nan")})  # issue 18: a busy loop, 894 checks in 10 s
@example(doc={"history_len": float("inf")})
@example(doc={"cycles": float("inf")})
@example(doc={"listen": "host:port"})
@example(doc={"listen": "host:99999999999999999999"})
@example(doc={"probe_timeout": -1, "boot_grace": -1, "history_len": 0, "rate_burst": -1, "rate_per_hour": float("nan")})
@example(doc={"example": ["healthy"]})  # issue 18: "cannot start: KeyError"
def test_any_mapping_is_a_valid_config_or_one_error_naming_the_key(doc) -> None:
    try:
        cfg = from_mapping(doc)
        cfg.validate()
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg
        named = [ac.public_name(ac.KEYS[k]) for k in doc]
        assert msg.split(":", 1)[0] in named, msg  # the key as the user writes it, first
        return
    _valid(cfg)


@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-16")),
                     st.text(max_size=200).map(lambda t: t.encode("latin-1", "replace"))))
@example(raw=b"node_name: caf\xe9\n")  # issue 18: UnicodeDecodeError traceback
@example(raw="node_name: x\n".encode("utf-16"))
@example(raw=b"[" * 5000)
def test_any_file_content_loads_or_is_one_config_error(tmp_path_factory, raw: bytes) -> None:
    p = tmp_path_factory.mktemp("c") / "agent.yaml"
    p.write_bytes(raw)
    _a_config_or_one_error(p)


def _a_config_or_one_error(p) -> None:
    try:
        cfg = load_file(str(p))
        cfg.validate()
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    _valid(cfg)


def test_a_fifo_or_a_huge_file_is_refused_at_once(tmp_path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    done = threading.Event()

    def load():
        with pytest.raises(ConfigError, match="not a regular file"):
            load_file(str(fifo))
        done.set()

    t = threading.Thread(target=load, daemon=True)
    t.start()
    assert done.wait(5), "load_file blocked on a FIFO"
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(100 << 20)  # 100 MB (sparse): refused without reading it
    with pytest.raises(ConfigError, match="larger than"):
        load_file(str(big))


@given(args=st.lists(st.tuples(st.sampled_from(["--interval", "--lease-duration", "--storm-fraction", "--cascade-nodes",
                                                "--max-quarantines", "--listen", "--retry-period"]), _value.map(str)),
                     max_size=4))
def test_controller_flags_are_a_valid_config_or_one_error(args) -> None:
    argv = [x for pair in args for x in pair]
    try:
        cfg = cc.parse_args(argv)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    except SystemExit:  # a usage error (click), e.g. a value that looks like a flag
        return
    ac.check_schema(cfg, cc.BOUNDS)


def test_yaml_tags_that_build_objects_are_refused(tmp_path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text("interval: !!python/object/apply:os.getpid []\n")
    with pytest.raises(ConfigError, match="not YAML"):
        load_file(str(p))


# --- issue 30: alias bombs, empty selections, numeric argument abuse --------------------------------

@given(key=st.sampled_from(["select", "ignore", "condition_statuses"]), levels=st.integers(1, 12),
       width=st.integers(1, 12))
@example(key="select", levels=9, width=10)  # issue 30: 100 % CPU to 1.48 GB
def test_an_alias_bomb_is_a_config_or_one_error_at_once(tmp_path_factory, key: str, levels: int, width: int) -> None:
    lines = [f"{key}:", '  - &a0 ["confirmed"]']
    lines += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    p = tmp_path_factory.mktemp("b") / "agent.yaml"
    p.write_text("\n".join(lines) + "\n")
    _a_config_or_one_error(p)


_CODE = st.one_of(st.sampled_from(["GPU", "GPU-DEV", "GPU-DEV-001", "GPU-XXX-999", "gpu-drv", "GPU-K8S-0", "", " ",
                                   "*", ",", "GPU-NODE-001,GPU-HW"]), st.text(max_size=12))


@pytest.fixture
def rules_loaded():
    """Import every rule module once, before the property's deadline starts counting."""
    from gpuwarden import engine

    return engine.all_rules()


@given(select=st.lists(_CODE, max_size=4), ignore=st.lists(_CODE, max_size=4))
@example(select=["GPU-XXX-999"], ignore=[])  # issue 30: ran no rule, logged findings: 0
@example(select=[], ignore=["GPU"])
def test_an_agent_selection_runs_a_rule_or_is_refused(rules_loaded, select: list[str], ignore: list[str]) -> None:
    from gpuwarden import engine

    try:
        cfg = from_mapping({"select": select, "ignore": ignore})
        cfg.validate()
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert engine.select(engine.all_rules(), cfg.select, cfg.ignore)


@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-(1 << 70), 1 << 70).map(str),
                       st.sampled_from(["inf", "-inf", "nan", "1e308", "1e-308", "0", "-0", "", "5", "3600", "3600.0001",
                                        "0x10", "1_000", "５"]), st.text(max_size=8)))
def test_a_deadline_argument_is_finite_and_bounded_or_a_usage_error(value: str) -> None:
    import click

    from gpuwarden.cli import Seconds

    for lo, hi in ((0.01, 3600), (1, 7 * 86400)):
        try:
            v = Seconds(lo, hi).convert(value, None, None)
        except click.BadParameter as exc:
            assert "\n" not in exc.format_message()
            continue
        assert math.isfinite(v) and lo <= v <= hi
