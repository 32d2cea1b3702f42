"""Run a schedule on an e-graph many times without rebuilding egglog's command each time.

``EGraph.run(schedule)`` converts the schedule to an egg command on every call, and on the way
checks that every rule of its rulesets is registered by hashing each rule's declaration (a deep
hash, recomputed every time); it then turns the run report's rule names back into declarations
the same way. With a few hundred rules that Python work costs as much as the rewrite iteration
it drives (measured on a region-wise run: ~30 s of Python around ~40 s of egglog's own run).
Saturation runs the same few schedules once per iteration, so ``run`` builds each schedule's
command once per e-graph state and sends it again, and reads the report's rule names as strings.

The cache is per egglog state object: ``push``/``pop`` swap that object, so a command is never
sent to a state whose rulesets it did not register. This reads three of egglog's private
members (``_add_decls``, ``_state``, ``_run_program``); without them it falls back to the public
``EGraph.run`` (``tests/test_run_cache.py`` checks both give one report).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from egglog import EGraph, Schedule, bindings


@dataclass(frozen=True)
class RunResult:
    """What a run changed: whether anything, and per rule (its declaration's name) the matches
    and the search-and-apply seconds."""

    updated: bool
    matches: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class _StateCache:
    """Commands and rule names built for one egglog state."""

    def __init__(self, state: Any):
        self.state = weakref.ref(state)
        self.commands: dict[Any, Any] = {}
        self.names: dict[str, str] = {}


_CACHES: dict[int, _StateCache] = {}


def run(egraph: EGraph, schedule: Schedule) -> RunResult:
    """``egraph.run(schedule)``, with the egg command built once per e-graph state."""
    try:
        state = egraph._state
        run_program = egraph._run_program
    except AttributeError:  # another egglog: the public path
        return run_public(egraph, schedule)
    cache = _CACHES.get(id(state))
    if cache is None or cache.state() is not state:
        _forget_dead()
        cache = _CACHES[id(state)] = _StateCache(state)
    decl = schedule.schedule
    command = cache.commands.get(decl)
    if command is None:
        egraph._add_decls(schedule)
        command = cache.commands[decl] = state.run_schedule_to_egg(decl)
    (output,) = run_program(command)
    assert isinstance(output, bindings.RunScheduleOutput)  # what EGraph.run asserts too
    report = output.report
    rule_decls = state.rule_name_to_command_decl

    def name(key: str) -> str:
        known = cache.names.get(key)
        if known is None:
            known = cache.names[key] = _decl_name_once(rule_decls[key])
        return known

    return _result(report.updated, report.num_matches_per_rule, report.search_and_apply_time_per_rule, name)


def run_public(egraph: EGraph, schedule: Schedule) -> RunResult:
    """``egraph.run(schedule)`` through egglog's public path (the fallback, and what ``run`` is
    checked against)."""
    report = egraph.run(schedule)
    return _result(report.updated, report.num_matches_per_rule, report.search_and_apply_time_per_rule, decl_name)


_DECL_NAMES: dict[int, tuple[Any, str]] = {}
"""id of a rule declaration -> (it, its name): a pushed state is a new one with the same rule
declarations, and naming a declaration without a name prints it whole (milliseconds each)."""


def _decl_name_once(decl: Any) -> str:
    known = _DECL_NAMES.get(id(decl))
    if known is None or known[0] is not decl:
        known = _DECL_NAMES[id(decl)] = (decl, decl_name(decl))
    return known[1]


def decl_name(decl: Any) -> str:
    """A run report's rule: its declaration's name (rules without one: the declaration itself)."""
    return str(getattr(decl, "name", None) or decl)


def _result(
    updated: bool, matches: Mapping[Any, int], seconds: Mapping[Any, timedelta], name: Callable[[Any], str]
) -> RunResult:
    """A run report's figures summed per rule name (twin declarations share one)."""
    result = RunResult(bool(updated))
    for key, n in matches.items():
        result.matches[name(key)] = result.matches.get(name(key), 0) + int(n)
    for key, dt in seconds.items():
        result.seconds[name(key)] = result.seconds.get(name(key), 0.0) + dt.total_seconds()
    return result


def _forget_dead() -> None:
    for key in [k for k, c in _CACHES.items() if c.state() is None]:
        del _CACHES[key]


def schedule_command(egraph: EGraph, schedule: Schedule) -> Any:
    """The egg command ``egraph.run(schedule)`` sends, its rulesets registered now: for a caller that
    runs it many times with ``send`` (in this state or states pushed from it) and reads no report,
    which saves ``run``'s check of every rule and its report's conversion (milliseconds each)."""
    egraph._add_decls(schedule)
    return egraph._state.run_schedule_to_egg(schedule.schedule)


def send(egraph: EGraph, command: Any) -> bool:
    """Run a ``schedule_command``; whether it changed the e-graph."""
    (output,) = egraph._run_program(command)
    assert isinstance(output, bindings.RunScheduleOutput)
    return bool(output.report.updated)
