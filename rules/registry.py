"""The rule table: every rewrite rule onnxsat knows, by stable name and family.

In-tree families and plugins add rules here; the scheduler builds the egglog ruleset of the
enabled rules from it, and run reports map egglog rule names back to onnxsat names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from egglog import RewriteOrRule, Ruleset, eq, rule, ruleset, union, vars_
from egglog.egraph import FactLike

from ..egraph import lang as L


@dataclass
class RuleTable:
    """Named rules grouped by family; one onnxsat rule may be several egglog rules (per rank)."""

    families: dict[str, list[str]] = field(default_factory=dict)
    egg_rules: dict[str, list[tuple[str, RewriteOrRule]]] = field(default_factory=dict)
    """onnxsat name -> [(egglog rule name, rule)]."""
    egg_to_name: dict[str, str] = field(default_factory=dict)
    tolerances: dict[str, float] = field(default_factory=dict)
    """onnxsat name -> relative tolerance of its verification, for rules whose result differs from the
    matched term by float32 rounding of a constant (fusions into ops with float32 attributes);
    every other rule is verified exact up to float64 rounding."""
    custom: dict[str, tuple[Callable[[str], Any], str]] = field(default_factory=dict)
    """onnxsat name -> (its own verifier, its pattern as text) for rules that are not egglog rules:
    PET partial rules run as a verified pass (rules/partial.py) and are checked by PET's method."""
    default_off: set[str] = field(default_factory=set)
    """Families that run only when asked for (``--enable-rules``, or named in ``--rules-only``)."""
    _rulesets: dict[tuple[str, ...], Ruleset] = field(default_factory=dict)

    def add(self, family: str, name: str, built: RewriteOrRule, egg_name: str) -> None:
        names = self.families.setdefault(family, [])
        if name not in names:
            names.append(name)
        self.egg_rules.setdefault(name, []).append((egg_name, built))
        self.egg_to_name[egg_name] = name
        self._rulesets.clear()

    def add_custom(self, family: str, name: str, verifier: Callable[[str], Any], pattern: str) -> None:
        """A rule applied outside egglog's rulesets, with its own verifier (no egglog rules)."""
        names = self.families.setdefault(family, [])
        if name not in names:
            names.append(name)
        self.egg_rules.setdefault(name, [])
        self.custom[name] = (verifier, pattern)
        self._rulesets.clear()

    def remove(self, name: str) -> None:
        self.custom.pop(name, None)
        for egg_name, _ in self.egg_rules.pop(name, []):
            self.egg_to_name.pop(egg_name, None)
        for names in self.families.values():
            if name in names:
                names.remove(name)
        self._rulesets.clear()

    def names(self) -> list[str]:
        return [n for names in self.families.values() for n in names]

    def family_of(self, name: str) -> str | None:
        return next((family for family, names in self.families.items() if name in names), None)

    def name_of(self, egg_name: str) -> str:
        return self.egg_to_name.get(egg_name, egg_name)

    def ruleset_for(self, enabled: list[str]) -> Ruleset:
        """One egglog ruleset holding the rules of ``enabled`` (cached per set)."""
        key = tuple(sorted(enabled))
        if key not in self._rulesets:
            chosen = ruleset(name=f"rewrites-{abs(hash(key)) % 10**10}-{len(key)}")
            for name in key:
                for _, built in self.egg_rules[name]:
                    chosen.append(built)
            self._rulesets[key] = chosen
        return self._rulesets[key]


RULES = RuleTable()
"""The process-wide rule table (in-tree rules register on import of their module)."""

_t = vars_("t", L.Tensor)
(ROOT,) = _t
"""The matched term's e-class in rules made by ``rewrite_rule``."""


def rewrite_rule(
    table: RuleTable,
    family: str,
    name: str,
    lhs: L.Tensor,
    rhs: L.Tensor,
    *guards: FactLike,
    variant: str = "",
    rtol: float | None = None,
) -> None:
    """Register ``lhs => rhs`` (guards are extra facts; ``ROOT`` names the matched term).

    ``rtol``: the relative error verification allows this rule (see ``RuleTable.tolerances``).
    """
    if rtol is not None:
        table.tolerances[name] = max(rtol, table.tolerances.get(name, 0.0))
    egg_name = f"{name}{'/' + variant if variant else ''}"
    built = rule(eq(ROOT).to(lhs), *guards, name=egg_name).then(union(ROOT).with_(rhs))
    table.add(family, name, built, egg_name)
