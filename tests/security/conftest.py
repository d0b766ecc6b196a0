"""Hypothesis settings of the fuzz properties: fixed budgets, so CI time is bounded.

The `ci` profile (default) runs each property a fixed number of examples with a per-example
deadline; `HYPOTHESIS_PROFILE=fuzz` runs a longer campaign locally. Failing examples Hypothesis
finds are kept in its database (.hypothesis/) and, once understood, added to corpus.py.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=2000, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("fuzz", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
