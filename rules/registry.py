"""The rule table: every rewrite rule onnxsat knows, by stable name and family.

A ``Family`` collects one family's rules, one call per rule (``rewrite``, ``rule`` for
multi-pattern rules, ``custom_rule`` for rules applied outside egglog); each in-tree module
fills its own at import and lists them in ``FAMILIES``. ``RuleTable.default()`` is the in-tree
table, its families in one visible order (``IN_TREE_ORDER``), built once per process (or read
from the disk cache, ``table_cache``); a run that loads plugins extends a copy (``with_rules``),
so what a plugin adds is seen by that run only. The scheduler builds the egglog ruleset of the enabled
rules from the run's table, and run reports map egglog rule names back to onnxsat names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egglog import RewriteOrRule, Ruleset, eq, rule, ruleset, union, vars_
from egglog.egraph import ActionLike, FactLike

from ..egraph import lang as L

_t = vars_("t", L.Tensor)
(ROOT,) = _t
"""The matched term's e-class in rules made by ``Family.rewrite``."""


def _rewrite(name: str, lhs: L.Tensor, rhs: L.Tensor, guards: tuple[FactLike, ...], variant: str) -> tuple[str, RewriteOrRule]:
    """``lhs => rhs`` as the ``rule(eq(ROOT).to(lhs), *guards).then(union(ROOT).with_(rhs))`` the verifier reads."""
    egg_name = f"{name}{'/' + variant if variant else ''}"
    return egg_name, rule(eq(ROOT).to(lhs), *guards, name=egg_name).then(union(ROOT).with_(rhs))


@dataclass
class Family:
    """One rule family: its rules in order, each under a stable kebab-case name.

    One onnxsat rule may be several egglog rules (``variant``: per rank, per operand order);
    ``default_off`` families run only when asked for (``--enable-rules``, or ``--rules-only``).
    """

    name: str
    default_off: bool = False
    names: list[str] = field(default_factory=list)
    egg_rules: dict[str, list[tuple[str, RewriteOrRule]]] = field(default_factory=dict)
    tolerances: dict[str, float] = field(default_factory=dict)
    custom: dict[str, tuple[Callable[[str], Any], str]] = field(default_factory=dict)

    def rewrite(
        self,
        name: str,
        lhs: L.Tensor,
        rhs: L.Tensor,
        *guards: FactLike,
        variant: str = "",
        rtol: float | None = None,
    ) -> None:
        """``lhs => rhs`` when ``guards`` hold (egglog facts; ``ROOT`` names the matched term).

        ``rtol``: the relative error verification allows this rule (see ``RuleTable.tolerances``).
        """
        if rtol is not None:
            self.tolerances[name] = max(rtol, self.tolerances.get(name, 0.0))
        egg_name, built = _rewrite(name, lhs, rhs, guards, variant)
        self.add(name, built, egg_name)

    def rule(self, name: str, *facts: FactLike, then: Iterable[ActionLike], variant: str = "") -> None:
        """A multi-pattern rule: when all ``facts`` match, run the actions ``then``."""
        egg_name = f"{name}{'/' + variant if variant else ''}"
        self.add(name, rule(*facts, name=egg_name).then(*then), egg_name)

    def add(self, name: str, built: RewriteOrRule, egg_name: str) -> None:
        """An egglog rule built elsewhere (plugins), under onnxsat name ``name``."""
        if name not in self.names:
            self.names.append(name)
        self.egg_rules.setdefault(name, []).append((egg_name, built))

    def custom_rule(self, name: str, verifier: Callable[[str], Any], pattern: str) -> None:
        """A rule applied outside egglog's rulesets, with its own verifier (no egglog rules)."""
        if name not in self.names:
            self.names.append(name)
        self.egg_rules.setdefault(name, [])
        self.custom[name] = (verifier, pattern)


IN_TREE_MODULES = (  # each defines FAMILIES: the Family objects it adds rules to
    "families.algebraic",
    "families.attention",
    "families.core",
    "families.dtype",
    "families.fusion",
    "families.interchange",
    "families.layout",
    "families.linear",
    "families.multi",
    "pet.partial_families",  # PET partial rules: a verified pass, off by default
    "pet.partial_merge",  # PET partial rule: 1x1 Conv + k x k Conv merged, border corrected (off by default)
    "pet.partial_subpixel",  # an exact site rule: the same verified pass, on by default (layout family)
    "families.pooling",
    "families.reduce",
    "families.shape_fold",
    "families.transpose",
    "families.views",
)
"""The modules under ``onnxsat.rules`` whose ``FAMILIES`` make the in-tree table, in this order."""

SITE_RULE_MODULES = ("pet.partial_families", "pet.partial_merge", "pet.partial_subpixel")
"""Modules of PET site rules (Python verifiers, not egglog rules): always imported, never cached."""

IN_TREE_ORDER = (
    "algebraic",
    "attention",
    "core",
    "dtype",
    "fusion",
    "interchange",
    "layout",
    "shape-arith",
    "linear",
    "multi",
    "partial",
    "reduce",
)
"""The in-tree families in table order (``onnxsat rules list``, ``select_rules``)."""

_DEFAULT: RuleTable | None = None
_IN_TREE_PARTS: dict[str, list[Family]] = {}
"""Module name -> its families, as this process built or read them (what ``table_cache`` stores)."""
_CACHES_SEEN: set[str] = set()
"""Cache folders this process has read the table from or made sure hold it."""


def _in_tree_families(cache_dir: str | Path | None) -> list[Family]:
    """The in-tree families in ``IN_TREE_ORDER``, a family's rules in module order (whatever
    imported the modules first), from ``cache_dir`` when it holds them."""
    from . import table_cache

    stored = table_cache.load(cache_dir) if cache_dir is not None else None
    built = _IN_TREE_PARTS
    for module in IN_TREE_MODULES:
        if stored is not None and module in stored:
            built[module] = stored[module]
        else:
            built[module] = list(importlib.import_module(f"{__package__}.{module}").FAMILIES)
    if cache_dir is not None:
        _CACHES_SEEN.add(str(cache_dir))
        if stored is None:
            table_cache.store(cache_dir, _storable_parts())
    return [fam for name in IN_TREE_ORDER for module in IN_TREE_MODULES for fam in built[module] if fam.name == name]


def _storable_parts() -> dict[str, list[Family]]:
    return {m: _IN_TREE_PARTS[m] for m in IN_TREE_MODULES if m not in SITE_RULE_MODULES}


def _keep_in(cache_dir: str | Path) -> None:
    """Store the table this process already holds in ``cache_dir`` when that has none yet: a
    process that built its rules before it was given a cache (a test run, a batch's coordinator)
    fills it, so the worker processes it then starts read the rules instead of each building them."""
    from . import table_cache

    if str(cache_dir) in _CACHES_SEEN:
        return
    _CACHES_SEEN.add(str(cache_dir))
    if not table_cache.holds_table(cache_dir):
        table_cache.store(cache_dir, _storable_parts())


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
    sources: dict[str, str] = field(default_factory=dict)
    """Rule name -> where it came from, for plugin rules (in-tree rules are absent)."""

    @classmethod
    def default(cls, cache_dir: str | Path | None = None) -> RuleTable:
        """The in-tree table, built once per process (plugins extend a copy, see ``with_rules``).

        With ``cache_dir``, the first call in a process reads the built rules from there
        (``table_cache``) instead of building them, or stores them there after building; a later
        call stores them in a ``cache_dir`` that has none.
        """
        global _DEFAULT
        if _DEFAULT is None:
            _DEFAULT = cls.of(_in_tree_families(cache_dir))
        elif cache_dir is not None:
            _keep_in(cache_dir)
        return _DEFAULT

    @classmethod
    def of(cls, families: Iterable[Family]) -> RuleTable:
        """A table of ``families``, in that order."""
        table = cls()
        for fam in families:
            table.add_family(fam)
        return table

    def add_family(self, fam: Family, source: str | None = None) -> None:
        """Every rule of ``fam`` (``source``: where a plugin's rules came from)."""
        self.families.setdefault(fam.name, [])
        if fam.default_off:
            self.default_off.add(fam.name)
        for name in fam.names:
            if name in fam.custom:
                self.add_custom(fam.name, name, *fam.custom[name])
            for egg_name, built in fam.egg_rules[name]:
                self.add(fam.name, name, built, egg_name)
            if name in fam.tolerances:
                self.tolerances[name] = fam.tolerances[name]
            if source is not None:
                self.sources[name] = source

    def copy(self) -> RuleTable:
        """A table with the same rules, whose own rows can be added and removed independently."""
        return RuleTable(
            families={f: list(names) for f, names in self.families.items()},
            egg_rules={n: list(rules) for n, rules in self.egg_rules.items()},
            egg_to_name=dict(self.egg_to_name),
            tolerances=dict(self.tolerances),
            custom=dict(self.custom),
            default_off=set(self.default_off),
            sources=dict(self.sources),
        )

    def with_rules(self, families: Iterable[tuple[Family, str]]) -> RuleTable:
        """A copy with the rules of ``families`` added, each under its source (plugins)."""
        extended = self.copy()
        for fam, source in families:
            extended.add_family(fam, source)
        return extended

    def source_of(self, name: str) -> str:
        """``in-tree``, or ``plugin NAME (SOURCE)`` for a plugin rule."""
        return self.sources.get(name, "in-tree")

    def add(self, family: str, name: str, built: RewriteOrRule, egg_name: str) -> None:
        names = self.families.setdefault(family, [])
        if name not in names:
            names.append(name)
        self.egg_rules.setdefault(name, []).append((egg_name, built))
        self.egg_to_name[egg_name] = name

    def add_custom(self, family: str, name: str, verifier: Callable[[str], Any], pattern: str) -> None:
        """A rule applied outside egglog's rulesets, with its own verifier (no egglog rules)."""
        names = self.families.setdefault(family, [])
        if name not in names:
            names.append(name)
        self.egg_rules.setdefault(name, [])
        self.custom[name] = (verifier, pattern)

    def remove(self, name: str) -> None:
        self.custom.pop(name, None)
        for egg_name, _ in self.egg_rules.pop(name, []):
            self.egg_to_name.pop(egg_name, None)
        for names in self.families.values():
            if name in names:
                names.remove(name)
        self.sources.pop(name, None)

    def names(self) -> list[str]:
        return [n for names in self.families.values() for n in names]

    def family_of(self, name: str) -> str | None:
        return next((family for family, names in self.families.items() if name in names), None)

    def name_of(self, egg_name: str) -> str:
        return self.egg_to_name.get(egg_name, egg_name)

    def ruleset_for(self, enabled: list[str], only: frozenset[int] | None = None) -> Ruleset:
        """One egglog ruleset holding the rules of ``enabled`` (``only``: those of its egglog rules
        whose identity is in it, the ones that may fire on a model, see ``schedule.select``).

        Cached per process by the egglog rules it holds, so every table with those rules (the
        in-tree one, a run's copy with plugins) gives the same ruleset object and an e-graph
        that has it declared (``egraph.warm``) never declares it again.
        """
        built = [b for name in sorted(enabled) for _, b in self.egg_rules[name] if only is None or id(b) in only]
        key = tuple(id(b) for b in built)
        if key not in _RULESETS:
            chosen = ruleset(name=f"rewrites-{len(_RULESETS)}-{len(enabled)}")
            for rewrite in built:
                chosen.append(rewrite)
            _RULESETS[key] = (chosen, built)
        return _RULESETS[key][0]


_RULESETS: dict[tuple[int, ...], tuple[Ruleset, list[RewriteOrRule]]] = {}
"""Egglog rulesets by the identity of their rules (the rules are kept so the ids stay theirs)."""


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
    """Add ``lhs => rhs`` to ``table`` directly (plugins' own tables; tests that need a rule outside
    any family), as ``Family.rewrite`` does."""
    rows = Family(family)
    rows.rewrite(name, lhs, rhs, *guards, variant=variant, rtol=rtol)
    if name in rows.tolerances:
        rows.tolerances[name] = max(rows.tolerances[name], table.tolerances.get(name, 0.0))
    table.add_family(rows)


def __getattr__(name: str) -> Any:
    if name == "RULES":  # the in-tree table, built on first use
        return RuleTable.default()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
