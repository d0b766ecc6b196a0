"""The one option layer (gpuwarden.options): one list rule and one coercion for the agent's file
and flags and the controller's flags, checked with Hypothesis."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden import options
from gpuwarden.agent import config as agent_config
from gpuwarden.controller import config as controller_config
from gpuwarden.parsers.duration import format_duration

texts = st.text(alphabet=st.sampled_from("ab-_., \t"), max_size=30)
items = st.lists(texts, max_size=5)


@given(texts)
def test_split_items_are_clean(text):
    out = options.split_list(text)
    assert all(x and "," not in x and x == x.strip() for x in out)
    assert options.split_list(",".join(out)) == out  # idempotent
    assert options.split_list([text]) == out  # a string is a list of one


@given(items, items)
def test_split_concatenates(a, b):
    assert options.split_list(a + b) == options.split_list(a) + options.split_list(b)


@pytest.fixture(scope="module")
def rules_loaded():
    """The agent's validation reads the rule catalog: imported once, outside the deadline."""
    from gpuwarden import engine

    return engine.all_rules()


@given(items)
def test_agent_file_flags_and_controller_split_alike(rules_loaded, values):
    expected = options.split_list(values)
    from_file = agent_config.from_mapping({"select": values}).select
    try:
        from_flags = agent_config.from_flags({"select": tuple(values)}).select
    except agent_config.ConfigError as exc:  # a code that matches no rule is refused (issue 30): the split one
        assert str(exc).startswith(f"select: {expected[0][:80]!r} matches no rule"), (exc, expected)
        from_flags = expected
    skip = options.coerce(controller_config.FIELDS["skip_namespaces"], tuple(values))
    assert from_file == from_flags == skip == expected


@given(st.integers(min_value=0, max_value=10 ** 7))
def test_durations_round_trip(seconds):
    f = agent_config.FIELDS["interval_s"]
    assert options.coerce(f, format_duration(seconds)) == seconds
    assert options.coerce(f, str(seconds)) == seconds


@pytest.mark.parametrize("kind_field,value,expected", [
    ("probes", "yes", True), ("probes", "OFF", False), ("probes", False, False),
    ("cycles", "3", 3), ("cycles", 4.0, 4), ("rate_per_hour", "1.5", 1.5), ("taint_key", 7, "7"),
])
def test_coerce_kinds(kind_field, value, expected):
    assert options.coerce(agent_config.FIELDS[kind_field], value) == expected


@pytest.mark.parametrize("kind_field,value", [
    ("probes", "maybe"), ("cycles", 1.5), ("cycles", True), ("rate_per_hour", [1]), ("select", 3),
    ("interval_s", "soon"), ("interval_s", -1), ("taint_key", {"a": 1}),
])
def test_coerce_refuses_with_the_key(kind_field, value):
    f = agent_config.FIELDS[kind_field]
    with pytest.raises(options.ConfigError, match=f"^{options.public_name(f)}: "):
        options.coerce(f, value)
    with pytest.raises(options.ConfigError, match="^--flag: "):
        options.coerce(f, value, "--flag")


def test_choices_are_checked_for_every_config():
    with pytest.raises(options.ConfigError, match="remediate: 'sometimes' is not one of"):
        dataclasses.replace(agent_config.AgentConfig(), remediate="sometimes").validate()
    with pytest.raises(options.ConfigError, match="actions: 'nuke' is not one of"):
        controller_config.from_flags({"actions": ("workload,nuke",)})
