"""E-graphs whose rules are already declared, reused for one model after another.

Declaring ~1,000 egglog rules into a new ``EGraph`` costs seconds; ``push()``/``pop()`` on an
e-graph that has them costs milliseconds. ``warm_egraph(key, rulesets)`` hands out an e-graph
with the rules declared and nothing else, pushed, and pops it when the model is done, so every
model starts from the same state a fresh e-graph with those rules would have. One e-graph per
rule set is kept per process; a caller that needs a second one while the first is in use (a
nested run) gets another, which is kept too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from egglog import EGraph, Schedule

from .live import LiveRuleset, declared
from .reach import Selection

MAX_KEPT = 8
"""Idle e-graphs kept per process: a run declares only its model's rules (``egraph.reach``), so a
process that sees many kinds of model holds one per rule subset; the least recently used go first."""

_FREE: dict[tuple[str, ...], list[tuple[EGraph, Selection | None]]] = {}
_LATER: dict[int, list[LiveRuleset]] = {}
"""id of an idle e-graph -> the rulesets its last use declared under its push (``egraph.live``)."""
DECLARED: dict[tuple[str, ...], int] = {}
"""Rule-set key -> how many e-graphs had its rules declared in this process (a test reads it)."""


class WarmEGraph:
    """A pushed e-graph from ``warm_egraph``; ``fresh()`` returns it to the declared-only state."""

    def __init__(self, egraph: EGraph, selection: Selection | None = None):
        self._egraph = egraph
        self._used = False
        self.selection = selection
        """The rules declared (``egraph.reach``), which the import's analysis runs; None: all."""

    def fresh(self) -> EGraph:
        """The e-graph with only the rules declared (drops whatever a previous attempt added)."""
        if self._used:
            self._egraph.pop()
            self._egraph.push()
        self._used = True
        return self._egraph


@contextmanager
def warm_egraph(
    key: tuple[str, ...], schedules: Sequence[Schedule], selection: Selection | None = None
) -> Iterator[WarmEGraph]:
    """A reused e-graph with the rules of ``schedules`` declared (``key`` names that rule set), pushed
    for one use; ``selection`` says which rules those are (``egraph.reach``). Without an idle one
    for ``key``, an idle one whose selection covers ``selection`` is used (with its own selection,
    which the run then follows) before a new one is declared."""
    held_key, (egraph, held) = _idle(key, selection) or (key, (_declared(key, schedules), selection))
    for later in _LATER.pop(id(egraph), []):  # what earlier uses declared as it could first match
        egraph.run(later * 0)
    before = set(egraph._state.rulesets)
    egraph.push()
    try:
        yield WarmEGraph(egraph, held)
    finally:
        used = [ident for ident in egraph._state.rulesets if ident not in before]
        egraph.pop()
        kept = _FREE.pop(held_key, [])
        kept.append((egraph, held))
        _FREE[held_key] = kept  # most recently used last
        # Rules declared under the push are gone with it: the next use declares them before its push
        # (not now: a process that optimizes one model never pays for it).
        _LATER[id(egraph)] = [r for r in map(declared, used) if r is not None]
        _forget_oldest()


def _idle(
    key: tuple[str, ...], selection: Selection | None
) -> tuple[tuple[str, ...], tuple[EGraph, Selection | None]] | None:
    if _FREE.get(key):
        return key, _FREE[key].pop()
    if selection is None:
        return None
    for other, kept in reversed(_FREE.items()):
        for i, (_, held) in enumerate(kept):
            if held is not None and held.covers(selection):
                return other, kept.pop(i)
    return None


def forget() -> None:
    """Drop every idle e-graph (their memory; the next run of each rule set declares it again)."""
    _FREE.clear()
    _LATER.clear()


def idle() -> dict[tuple[str, ...], int]:
    """Rule-set key -> how many idle e-graphs with its rules this process keeps."""
    return {key: len(kept) for key, kept in _FREE.items() if kept}


def _forget_oldest() -> None:
    while sum(len(kept) for kept in _FREE.values()) > MAX_KEPT:
        oldest = next(k for k, kept in _FREE.items() if kept)
        egraph, _ = _FREE[oldest].pop(0)
        _LATER.pop(id(egraph), None)


def _declared(key: tuple[str, ...], schedules: Sequence[Schedule]) -> EGraph:
    egraph = EGraph()
    for schedule in schedules:
        egraph.run(schedule * 0)  # declares the rules; runs nothing
    DECLARED[key] = DECLARED.get(key, 0) + 1
    return egraph
