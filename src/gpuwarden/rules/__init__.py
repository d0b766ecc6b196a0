"""Rules: one module per failure family, each rule a small function of facts.

A rule yields `Hit`s; the engine stamps the rule's code, title, remedy and
references on them. The docstring of a rule is its `gpuwarden explain` page.
"""

from gpuwarden.rules.base import Hit, Rule, all_rules, get_rule, rule

__all__ = ["Hit", "Rule", "all_rules", "get_rule", "rule"]
