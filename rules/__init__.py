"""Rewrite rules: the rule table, the in-tree families, schedules and verification.

The in-tree families are built when the rule table is first needed (``RuleTable.default()``;
``RULES`` names it), not on import of this package, so commands that only read rule names and
modules that only need the rule machinery do not build ~1,000 egglog rules.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RULES"]


def __getattr__(name: str) -> Any:
    if name == "RULES":
        from .registry import RuleTable

        return RuleTable.default()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
