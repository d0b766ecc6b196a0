"""The rule registry and the Hit a rule yields."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from msgspec import Struct, field

from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.isolated_import import import_isolated

#: rule module -> the codes it registers: `--select` imports only the modules it needs (and their
#: facts' parsers), not all nine. tests/test_perf_paths.py checks this against the registry.
_RULE_MODULES: dict[str, tuple[str, ...]] = {
    "gpuwarden.rules.devices": ("GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003"),
    "gpuwarden.rules.kubelet": ("GPU-K8S-001",),
    "gpuwarden.rules.mps": ("GPU-K8S-007", "GPU-K8S-011"),
    "gpuwarden.rules.memory": ("GPU-NODE-001",),
    "gpuwarden.rules.driver": ("GPU-DRV-001", "GPU-DRV-002", "GPU-DRV-003", "GPU-DRV-004", "GPU-DRV-005",
                               "GPU-DRV-006", "GPU-DRV-007"),
    "gpuwarden.rules.hardware": ("GPU-HW-001", "GPU-HW-002", "GPU-HW-003", "GPU-HW-004", "GPU-HW-005",
                                 "GPU-HW-006", "GPU-HW-007", "GPU-HW-008"),
    "gpuwarden.rules.plugin": ("GPU-K8S-002", "GPU-K8S-003", "GPU-K8S-006", "GPU-K8S-008", "GPU-K8S-009"),
    "gpuwarden.rules.runtime": ("GPU-K8S-004", "GPU-K8S-005", "GPU-K8S-010"),
    "gpuwarden.rules.device_nodes": ("GPU-DEV-004", "GPU-DEV-005"),
    "gpuwarden.rules.dra": ("GPU-DRA-010", "GPU-DRA-011", "GPU-DRA-012", "GPU-DRA-013"),
    "gpuwarden.rules.dra_plugin": ("GPU-DRA-030",),
    "gpuwarden.rules.lost_gpu": ("GPU-K8S-012",),
    "gpuwarden.rules.dra_api": ("GPU-K8S-020", "GPU-K8S-021", "GPU-K8S-022"),
}

_RULES: dict[str, "Rule"] = {}
SCOPES = ("node", "api")


class Hit(Struct):
    """What a rule found; the engine turns it into a Finding."""

    status: "Status"
    summary: str
    affected: list[Affected] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    severity: Severity | None = None  # overrides the rule's default (AT-RISK is usually lower)
    remedy: str | None = None  # overrides or specialises the rule's remedy
    mechanism: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class Rule(Struct, frozen=True):
    """A registered rule: its stable code, metadata and the function that evaluates it."""
    code: str
    title: str
    severity: Severity
    family: str
    needs: tuple[str, ...]
    remedy_doc: str  # as written in the rule's module: `remedy` is it cleaned, on first use
    references: tuple[str, ...]
    automation: str
    func: Callable[..., Iterable[Hit]]
    #: sections read when available (never required: the rule runs without them)
    uses: tuple[str, ...] = ()
    #: "node": judged from a node's facts by the engine; "api": a verdict the agent makes from the API
    #: server's objects, in the catalog (explain, docs/rules.md) but never run by the engine on a node
    scope: str = "node"

    @property
    def explanation(self) -> str:
        import inspect  # not at import: a check that finds nothing never reads a remedy or an explanation

        return inspect.cleandoc(self.func.__doc__ or "")

    @property
    def remedy(self) -> str:
        import inspect

        return inspect.cleandoc(self.remedy_doc)


def rule(
    code: str,
    *,
    title: str,
    severity: Severity,
    family: str,
    needs: tuple[str, ...] = (),
    uses: tuple[str, ...] = (),
    remedy: str,
    references: tuple[str, ...] = (),
    automation: str = "A3",
    scope: str = "node",
) -> Callable[[Callable[..., Iterable[Hit]]], Callable[..., Iterable[Hit]]]:
    """Register a rule under its stable catalog code.

    `needs`: the fact sections it cannot be evaluated without (the engine reports it "not evaluated"
    with their reasons when one is unavailable); `uses`: the sections it reads when they are there.
    A rule reads nothing else (tests/rules/test_rule_sections.py holds every rule to this).
    `scope="api"`: a catalog entry of a verdict the agent makes from the API (rules/dra_api.py).
    """
    if scope not in SCOPES:
        raise ValueError(f"rule {code}: scope must be one of {SCOPES}, not {scope!r}")

    def deco(fn: Callable[..., Iterable[Hit]]) -> Callable[..., Iterable[Hit]]:
        if code in _RULES and _RULES[code].func is not fn:
            raise ValueError(f"rule code {code} registered twice")
        _RULES[code] = Rule(code, title, severity, family, tuple(needs), remedy,
                            tuple(references), automation, fn, tuple(uses), scope)
        return fn

    return deco


#: rule modules that failed to import -> why (reported by the engine; the other rules still run)
LOAD_ERRORS: dict[str, str] = {}


def _load(modules: Iterable[str] = _RULE_MODULES) -> None:
    for mod in modules:
        import_isolated(mod, LOAD_ERRORS)  # one broken family must not hide the others


def all_rules() -> list[Rule]:
    _load()
    return sorted(_RULES.values(), key=lambda r: r.code)


def rules_for(only: Iterable[str] = ()) -> list[Rule]:
    """The rules a `--select` of codes or prefixes can pick, importing only their modules
    (all of them when nothing is selected, or when the index knows no module for a selection)."""
    only_u = [s.upper() for s in only]
    mods = [m for m, codes in _RULE_MODULES.items() if any(c.startswith(o) for c in codes for o in only_u)]
    if not only_u or not mods:
        return all_rules()
    _load(mods)
    return sorted((r for r in _RULES.values() if any(r.code.startswith(o) for o in only_u)), key=lambda r: r.code)


def require_any(facts: Any, names: Iterable[str]) -> dict[str, Any]:
    """The available sections among `names` (a rule's `uses`); FactUnavailable, so that the rule is
    reported "not evaluated" with every reason, when none is."""
    from gpuwarden.facts import FactUnavailable

    got: dict[str, Any] = {}
    why: list[str] = []
    for n in names:
        try:
            got[n] = facts.get(n)
        except FactUnavailable as exc:
            why.append(f"{n}: {exc}")
    if not got:
        raise FactUnavailable("; ".join(why))
    return got


def get_rule(code: str) -> Rule | None:
    _load()
    return _RULES.get(code.upper())
