"""Rulesets of the rules that can match now: a rule is declared once its tables hold rows.

A selection (``egraph.reach``) holds every rule that may ever fire on a model; on a small model
most never do (a table in their body stays empty), yet egglog compiles each declared rule
(~0.3 ms, up to ~25 ms with a large guard) and searches it in every run. Here the rules of a
selection are cut into blocks (consecutive rules, each block an egglog ruleset of its own,
compiled once per e-graph), and a run gets the combined ruleset of the blocks that hold a rule
whose tables have rows, in their declared order. It matches what the whole selection would, in
the same order: a rule left out reads an empty table and cannot match in that run (egglog
searches every rule of a run before it applies any match), and whichever rules a block adds
beyond those that can match match nothing either.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from egglog import RewriteOrRule, Ruleset, ruleset, unstable_combine_rulesets
from egglog.egraph import UnstableCombinedRuleset

from .reach import EVERYTHING, Reach, closure, reach_cached

LiveRuleset = Ruleset | UnstableCombinedRuleset

_BLOCKS: dict[tuple[int, ...], tuple[Ruleset, tuple[RewriteOrRule, ...]]] = {}
"""Block rulesets by the identity of their rules (kept, so the ids stay theirs)."""
_COMBINED: dict[tuple[int, ...], tuple[LiveRuleset, tuple[Ruleset, ...]]] = {}
_EMPTY: list[Ruleset] = []


class Block:
    """Consecutive rules of a selection; their egglog ruleset is built when first run (building
    it reads each rule's declaration, which the rule-table cache builds on first use)."""

    def __init__(self, rules: Sequence[RewriteOrRule], prefix: str):
        self.rules = tuple(rules)
        self.prefix = prefix

    def ruleset(self) -> Ruleset:
        ids = tuple(id(r) for r in self.rules)
        hit = _BLOCKS.get(ids)
        if hit is None:
            built = ruleset(name=f"{self.prefix}-{len(_BLOCKS)}-{len(self.rules)}")
            for r in self.rules:
                built.append(r)
            hit = _BLOCKS[ids] = (built, self.rules)
            _BY_IDENT[built.__egg_ident__] = built
        return hit[0]


def blocks(rules: Sequence[RewriteOrRule], key: Callable[[int], Hashable], prefix: str) -> list[tuple[Block, range]]:
    """``rules`` cut where ``key`` (of the rule's index) changes, each run of equal keys one block
    (one egglog ruleset per distinct run of rules per process), with the indices it covers."""
    out: list[tuple[Block, range]] = []
    start = 0
    for i in range(1, len(rules) + 1):
        if i == len(rules) or key(i) != key(start):
            out.append((Block(rules[start:i], prefix), range(start, i)))
            start = i
    return out


def combined(parts: Sequence[Ruleset]) -> LiveRuleset:
    """One ruleset running the rules of ``parts`` in order (one per distinct list per process)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        if not _EMPTY:
            _EMPTY.append(ruleset(name="live-empty"))
        return _EMPTY[0]
    ids = tuple(id(p) for p in parts)
    hit = _COMBINED.get(ids)
    if hit is None:
        built = unstable_combine_rulesets(*parts, name=f"live-{len(_COMBINED)}-{len(parts)}")
        decls = built.__egg_decls__  # once: the blocks never change after they are built
        built.__egg_decls_thunk__ = lambda: decls  # type: ignore[method-assign]
        hit = _COMBINED[ids] = (built, tuple(parts))
        _BY_IDENT[built.__egg_ident__] = built
    return hit[0]


def can_match(reach: Reach, present: frozenset[str]) -> bool:
    """Whether a rule reading ``reach.needs`` can match while the tables ``present`` hold rows."""
    return EVERYTHING in present or reach.needs <= present


def live_ruleset(cut: Sequence[tuple[Block, Any]], live: Callable[[Any], bool]) -> LiveRuleset:
    """The combined ruleset of the blocks of ``cut`` whose part satisfies ``live``."""
    return combined([block.ruleset() for block, part in cut if live(part)])


_ANALYSIS: dict[tuple[int, ...], tuple[tuple[RewriteOrRule, ...], list[tuple[Block, range]], list[Reach]]] = {}
_ANALYSIS_LIVE: dict[tuple[tuple[int, ...], frozenset[str]], LiveRuleset] = {}


def live_analysis(rules: Sequence[RewriteOrRule], present: frozenset[str]) -> LiveRuleset:
    """The analysis ``rules`` that can match from the tables ``present``: the closure (``reach``) over
    the analysis rules alone, since a saturation of the analysis runs them until nothing changes
    and one of them may fill a table another reads. Blocks: consecutive rules reading the same tables."""
    ids = tuple(id(r) for r in rules)
    hit = _ANALYSIS.get(ids)
    if hit is None:
        reaches = [reach_cached(r) for r in rules]
        hit = _ANALYSIS[ids] = (tuple(rules), blocks(rules, lambda i: reaches[i].needs, "shapes-live"), reaches)
    _, cut, reaches = hit
    out = _ANALYSIS_LIVE.get((ids, present))
    if out is None:
        picked = set(closure(present, reaches)[0])
        out = _ANALYSIS_LIVE[(ids, present)] = live_ruleset(cut, lambda span: any(i in picked for i in span))
    return out


_BY_IDENT: dict[object, LiveRuleset] = {}
"""Every block and combined ruleset built here, by its egglog identifier."""


def declared(ident: object) -> LiveRuleset | None:
    """The block or combined ruleset of this module an e-graph registered as ``ident`` (None: another)."""
    return _BY_IDENT.get(ident)


def built_rules() -> int:
    """How many rules the blocks built in this process hold (what its runs declared, per e-graph)."""
    return sum(len(rules) for _, rules in _BLOCKS.values())
