"""The rule registry and the Hit a rule yields."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from gpuwarden.findings import Affected, Evidence, Severity, Status

_RULE_MODULES = (
    "gpuwarden.rules.devices",
    "gpuwarden.rules.kubelet",
    "gpuwarden.rules.mps",
    "gpuwarden.rules.memory",
    "gpuwarden.rules.driver",
    "gpuwarden.rules.hardware",
    "gpuwarden.rules.plugin",
    "gpuwarden.rules.runtime",
)

_RULES: dict[str, "Rule"] = {}


@dataclass
class Hit:
    """What a rule found; the engine turns it into a Finding."""

    status: "Status"
    summary: str
    affected: list[Affected] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    severity: Severity | None = None  # overrides the rule's default (AT-RISK is usually lower)
    remedy: str | None = None  # overrides or specialises the rule's remedy
    mechanism: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    severity: Severity
    family: str
    needs: tuple[str, ...]
    remedy: str
    references: tuple[str, ...]
    automation: str
    func: Callable[..., Iterable[Hit]]

    @property
    def explanation(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")


def rule(
    code: str,
    *,
    title: str,
    severity: Severity,
    family: str,
    needs: tuple[str, ...] = (),
    remedy: str,
    references: tuple[str, ...] = (),
    automation: str = "A3",
) -> Callable[[Callable[..., Iterable[Hit]]], Callable[..., Iterable[Hit]]]:
    """Register a rule under its stable catalog code."""

    def deco(fn: Callable[..., Iterable[Hit]]) -> Callable[..., Iterable[Hit]]:
        if code in _RULES and _RULES[code].func is not fn:
            raise ValueError(f"rule code {code} registered twice")
        _RULES[code] = Rule(code, title, severity, family, tuple(needs), inspect.cleandoc(remedy),
                            tuple(references), automation, fn)
        return fn

    return deco


#: rule modules that failed to import -> why (reported by the engine; the other rules still run)
LOAD_ERRORS: dict[str, str] = {}


def _load() -> None:
    for mod in _RULE_MODULES:
        if mod in LOAD_ERRORS:
            continue
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                LOAD_ERRORS[mod] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one broken family must not hide the others
            LOAD_ERRORS[mod] = f"{type(exc).__name__}: {exc}"


def all_rules() -> list[Rule]:
    _load()
    return sorted(_RULES.values(), key=lambda r: r.code)


def get_rule(code: str) -> Rule | None:
    _load()
    return _RULES.get(code.upper())
