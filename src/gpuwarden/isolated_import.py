"""Importing the modules that register rules and fact collectors, one failure at a time.

A rule family or fact module that fails to import (a syntax error in a hot fix, a missing optional
dependency) must cost only what it would have checked: its error is recorded for the report and
every other module still loads.
"""

from __future__ import annotations

import importlib


def import_isolated(mod: str, errors: dict[str, str]) -> None:
    """Import `mod` unless it already failed; record why in `errors` if it does now.

    A module that does not exist at all (a name in an index, not yet written) is skipped silently.
    """
    if mod in errors:
        return
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name != mod:
            errors[mod] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a broken module must not take the others down
        errors[mod] = f"{type(exc).__name__}: {exc}"
