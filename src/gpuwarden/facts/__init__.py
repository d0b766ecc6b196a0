"""The node model: typed facts built from parsers, read through one Root.

Facts are computed lazily and once: a rule asks for the sections it needs, and
a section whose sources are missing is recorded as unavailable with the reason
instead of failing the run.
"""

from gpuwarden.facts.node import FactUnavailable, NodeFacts, NotApplicable, Settings, fact, registered_facts

__all__ = ["FactUnavailable", "NodeFacts", "NotApplicable", "Settings", "fact", "registered_facts"]
