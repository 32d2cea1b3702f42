"""Bounded saturation: one rewrite iteration at a time, analyses to fixpoint between them.

Budgets (iterations, e-nodes, seconds) are checked between iterations; every iteration runs
under egglog's back-off scheduler so a single runaway iteration is bounded too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from egglog import EggSmolError, Schedule, back_off, run

from onnxsat.options import Budgets
from onnxsat.report import IterationRecord, SaturationReport

from ..egraph.program import Program
from ..egraph.shapes import shape_rules
from .multi import FAMILY as MULTI_FAMILY
from .registry import RULES


class UnsoundRuleError(RuntimeError):
    """The analysis found two different shapes/dtypes for one e-class after a rewrite.

    ``iteration`` is where it happened; ``rules`` the rules found responsible (all enabled rules
    until ``onnxsat.minimize.find_unsound_rules`` narrows them down).
    """

    def __init__(self, rules: list[str], detail: str, iteration: int):
        super().__init__(f"unsound rewrite (two shapes or dtypes for one tensor) by rule(s) {', '.join(rules)}: {detail}")
        self.rules = rules
        self.detail = detail
        self.iteration = iteration


def _rule_name(key: object) -> str:
    """onnxsat name of a run-report key (egglog gives rule declarations or their names)."""
    return RULES.name_of(str(getattr(key, "name", None) or key))


def select_rules(
    rules_only: tuple[str, ...] = (), disable: tuple[str, ...] = (), enable: tuple[str, ...] = ()
) -> list[str]:
    """Rule names enabled by ``--rules-only`` / ``--disable-rules`` / ``--enable-rules`` (names or
    family names). Default-off families (``RuleTable.default_off``) run only when named."""
    known = RULES.names()

    def expand(items: tuple[str, ...]) -> set[str]:
        out: set[str] = set()
        for item in items:
            if item in RULES.families:
                out.update(RULES.families[item])
            elif item in known:
                out.add(item)
            else:
                raise ValueError(f"unknown rule or family {item!r} (see `onnxsat rules list`)")
        return out

    enabled = expand(rules_only) if rules_only else set(known) - expand(tuple(RULES.default_off))
    enabled |= expand(enable)
    enabled -= expand(disable)
    return [n for n in known if n in enabled]


def rewrite_step(enabled: list[str], budgets: Budgets) -> Schedule:
    """One iteration of the enabled rules under the back-off scheduler."""
    scheduler = back_off(match_limit=budgets.match_limit, ban_length=budgets.ban_length)
    return run(RULES.ruleset_for(enabled), scheduler=scheduler)


def saturate(
    program: Program,
    budgets: Budgets,
    enabled: list[str],
    on_iteration: Callable[[IterationRecord], None] | None = None,
    *,
    stop_before: int | None = None,
) -> SaturationReport:
    """Run the enabled rules within budgets; returns per-iteration records and the stop reason.

    Multi-pattern rules run first, for ``budgets.k_multi`` iterations; then the others for up to
    ``budgets.iterations``. ``stop_before`` stops before that (global) iteration index, which is
    how a failing iteration is replayed.
    """
    report = SaturationReport(enodes_before=program.node_count())
    multi = [n for n in enabled if RULES.family_of(n) == MULTI_FAMILY]
    single = [n for n in enabled if n not in set(multi)]
    phases = [("multi", multi, budgets.k_multi), ("rewrite", single, budgets.iterations)]
    start = time.perf_counter()
    report.stop_reason = "no rules enabled"
    for phase, names, limit in phases:
        if not names or not limit:
            continue
        step = rewrite_step(names, budgets)
        for _ in range(limit):
            index = len(report.iterations)
            if stop_before is not None and index >= stop_before:
                report.stop_reason = "replayed"
                break
            record, updated = _iterate(program, step, phase, index, enabled)
            report.iterations.append(record)
            if on_iteration is not None:
                on_iteration(record)
            if not updated:
                report.stop_reason = "saturated"
                break
            if record.enodes >= budgets.enodes:
                report.stop_reason = "enodes"
                break
            if time.perf_counter() - start >= budgets.seconds:
                report.stop_reason = "seconds"
                break
        else:
            report.stop_reason = "iterations"
        if report.stop_reason in ("enodes", "seconds", "replayed"):
            break
    report.enodes_after = program.node_count()
    report.seconds = time.perf_counter() - start
    return report


def _iterate(program: Program, step: Schedule, phase: str, index: int, enabled: list[str]) -> tuple[IterationRecord, bool]:
    """One rewrite iteration, then the analyses to fixpoint; conflicting shapes raise."""
    t0 = time.perf_counter()
    try:
        run_report = program.egraph.run(step)
        program.egraph.run(shape_rules.saturate())
    except EggSmolError as exc:
        raise UnsoundRuleError(enabled, str(exc).splitlines()[0], index) from exc
    matches: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for key, n in run_report.num_matches_per_rule.items():
        name = _rule_name(key)
        matches[name] = matches.get(name, 0) + int(n)
    for key, dt in run_report.search_and_apply_time_per_rule.items():
        name = _rule_name(key)
        seconds[name] = seconds.get(name, 0.0) + dt.total_seconds()
    record = IterationRecord(
        phase=phase,
        index=index,
        enodes=program.node_count(),
        seconds=time.perf_counter() - t0,
        matches=matches,
        rule_seconds=seconds,
    )
    return record, bool(run_report.updated)
