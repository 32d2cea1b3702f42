"""Bounded saturation as an explicit schedule of named phases.

The default schedule (``default_schedule``) is: the shape/dtype/constness analysis to saturation,
then the algebra and layout phases (twice, so a layout rewrite can enable an algebraic one and
back), the PET partial-equivalence phase, one phase per plugin family, the multi-pattern phase (TENSAT's k_multi iterations) and the
fusion phase. Each phase runs only its families' enabled rules, one iteration at a time with the
analysis to fixpoint in between, under its own iteration, e-node and wall-time budgets inside the
global ones (``Budgets``; a phase without its own time budget gets an equal share of the time
left); every iteration uses egglog's back-off scheduler with a match limit, so
a single runaway iteration is bounded too. The report says which budget stopped each phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from egglog import BackOff, EggSmolError, Schedule, back_off, run

from onnxsat.base.options import PHASE_NAMES, Budgets, PhaseBudget
from onnxsat.base.report import IterationRecord, PhaseRecord, SaturationReport, StopReason

from ..egraph.live import Block, LiveRuleset, blocks, can_match, live_analysis, live_ruleset
from ..egraph.program import Program
from ..egraph.reach import Reach, Selection, closure, present_symbols, reach_cached
from ..egraph.run_cache import run as run_cached
from ..egraph.shapes import analysis_rules, analysis_ruleset
from .registry import RuleTable

_ALGEBRA, _LAYOUT, _PARTIAL, _MULTI, _FUSION = PHASE_NAMES  # the names are Options'; a new one needs a place here
ALGEBRA_FAMILIES = ("core", "algebraic", "linear", "interchange", "reduce")
LAYOUT_FAMILIES = ("layout", "shape-arith", "dtype")
PARTIAL_FAMILIES = ("partial",)
MULTI_FAMILIES = ("multi",)
FUSION_FAMILIES = ("fusion", "attention")
_IN_TREE = ALGEBRA_FAMILIES + LAYOUT_FAMILIES + PARTIAL_FAMILIES + MULTI_FAMILIES + FUSION_FAMILIES


@dataclass(frozen=True)
class Phase:
    """One named step of a schedule: the rule families it runs and its own budgets.

    ``None`` budgets take the global ones (``Budgets.iterations``, ``Budgets.enodes``) and, for time,
    an equal share of what is left of ``Budgets.seconds`` among this and the remaining phases.
    """

    name: str
    families: tuple[str, ...]
    iterations: int | None = None
    enodes: int | None = None
    seconds: float | None = None

    def limits(self) -> str:
        """The phase's own limits as ``iterations=4,seconds=5`` (empty: only the global ones)."""
        return PhaseBudget(self.iterations, self.enodes, self.seconds).describe()


def default_schedule(budgets: Budgets, families: Iterable[str] | None = None) -> list[Phase]:
    """analysis -> (algebra, layout) x 2 -> partial (PET) -> one phase per plugin family -> multi -> fusion,
    each with its own limits from ``budgets.phases`` (``--phase-budget``). ``families``: those of the
    run's rule table (default: the in-tree ones)."""
    known = list(RuleTable.default().families) if families is None else list(families)
    plugins = [Phase(f"plugin:{f}", (f,)) for f in known if f not in _IN_TREE]
    rounds = [Phase(_ALGEBRA, ALGEBRA_FAMILIES), Phase(_LAYOUT, LAYOUT_FAMILIES)] * 2
    phases = [
        *rounds,
        Phase(_PARTIAL, PARTIAL_FAMILIES),
        *plugins,
        Phase(_MULTI, MULTI_FAMILIES, iterations=budgets.k_multi),
        Phase(_FUSION, FUSION_FAMILIES),
    ]
    return [_with_own_limits(phase, budgets.phase(phase.name)) for phase in phases]


def _with_own_limits(phase: Phase, own: PhaseBudget) -> Phase:
    return replace(
        phase,
        iterations=phase.iterations if own.iterations is None else own.iterations,
        enodes=phase.enodes if own.enodes is None else own.enodes,
        seconds=phase.seconds if own.seconds is None else own.seconds,
    )


def check_phase_budgets(budgets: Budgets, table: RuleTable | None = None) -> None:
    """Raise ValueError when a per-phase budget names no phase of the default schedule."""
    plugins = default_schedule(budgets, (table or RuleTable.default()).families)
    names = [*PHASE_NAMES, *(p.name for p in plugins if p.name.startswith("plugin:"))]
    for name, _ in budgets.phases:
        if name not in names:
            raise ValueError(f"--phase-budget names unknown phase {name!r} (phases: {', '.join(names)})")


def phase_rules(phase: Phase, enabled: list[str], table: RuleTable | None = None) -> list[str]:
    """The enabled rules a phase runs (``--rules-only``/``--disable-rules`` already applied)."""
    families = (table or RuleTable.default()).families
    members = {name for family in phase.families for name in families.get(family, ())}
    return [n for n in enabled if n in members]


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


def select_rules(
    rules_only: tuple[str, ...] = (),
    disable: tuple[str, ...] = (),
    enable: tuple[str, ...] = (),
    table: RuleTable | None = None,
) -> list[str]:
    """Rule names of ``table`` (the run's; default: the in-tree one) enabled by ``--rules-only`` /
    ``--disable-rules`` / ``--enable-rules`` (names or family names). Default-off families
    (``RuleTable.default_off``) run only when named."""
    rules = table or RuleTable.default()
    known = rules.names()

    def expand(items: Iterable[str]) -> set[str]:
        return expand_rule_names(items, rules)

    enabled = expand(rules_only) if rules_only else set(known) - expand(rules.default_off)
    enabled |= expand(enable)
    enabled -= expand(disable)
    return [n for n in known if n in enabled]


def expand_rule_names(items: Iterable[str], table: RuleTable | None = None) -> set[str]:
    """Rule and family names of ``table`` (default: the in-tree one) -> the rule names they stand
    for; ValueError on an unknown name."""
    rules = table or RuleTable.default()
    known = set(rules.names())
    out: set[str] = set()
    for item in items:
        if item in rules.families:
            out.update(rules.families[item])
        elif item in known:
            out.add(item)
        else:
            raise ValueError(f"unknown rule or family {item!r} (see `onnxsat rules list`)")
    return out


def rewrite_step(
    enabled: list[str], budgets: Budgets, table: RuleTable | None = None, only: frozenset[int] | None = None
) -> Schedule:
    """One iteration of the enabled rules (``only``: of those egglog rules, see ``select``) under the
    back-off scheduler."""
    scheduler = back_off(match_limit=budgets.match_limit, ban_length=budgets.ban_length)
    return run((table or RuleTable.default()).ruleset_for(enabled, only), scheduler=scheduler)


_CUTS: dict[
    tuple[int, tuple[str, ...], frozenset[int] | None],
    tuple[RuleTable, list[tuple[Block, range]], list[Reach], dict[frozenset[str], LiveRuleset]],
] = {}
"""A phase's rules cut in blocks per rule name, their reaches, and the live ruleset per set of filled tables."""


def live_rewrites(
    names: list[str], table: RuleTable, only: frozenset[int] | None, present: frozenset[str]
) -> LiveRuleset:
    """The rules of ``names`` (``only``: of those egglog rules) that can match while the tables
    ``present`` hold rows, in ``RuleTable.ruleset_for``'s order: one block per rule name
    (``egraph.live``), declared when a rule of it can first match."""
    key = (id(table), tuple(sorted(names)), only)
    hit = _CUTS.get(key)
    if hit is None or hit[0] is not table:
        built = [(name, b) for name in key[1] for _, b in table.egg_rules[name] if only is None or id(b) in only]
        rules = [b for _, b in built]
        cut = blocks(rules, lambda i: built[i][0], "rewrites-live")
        hit = _CUTS[key] = (table, cut, [reach_cached(b) for b in rules], {})
    _, cut, reaches, by_present = hit
    live = by_present.get(present)
    if live is None:
        live = by_present[present] = live_ruleset(cut, lambda span: any(can_match(reaches[i], present) for i in span))
    return live


def live_step(
    names: list[str], scheduler: BackOff, table: RuleTable, only: frozenset[int] | None, present: frozenset[str]
) -> Schedule:
    """One iteration of the rules of ``names`` that can match now (``live_rewrites``) under ``scheduler``."""
    return run(live_rewrites(names, table, only, present), scheduler=scheduler)


def select(enabled: list[str], table: RuleTable, start: frozenset[str] | None) -> Selection | None:
    """The analysis and rewrite rules that may fire on a program whose import fills the tables
    ``start`` (``egraph.reach.closure``); None for ``start`` None (every rule)."""
    if start is None:
        return None
    analysis = analysis_rules()
    rewrites = [b for name in enabled for _, b in table.egg_rules[name]]
    chosen, available = closure(start, [reach_cached(b) for b in [*analysis, *rewrites]])
    picked = set(chosen)
    n = len(analysis)
    return Selection(
        tuple(r for i, r in enumerate(analysis) if i in picked),
        frozenset(id(b) for i, b in enumerate(rewrites) if n + i in picked),
        available,
        table,
        tuple(enabled),
    )


def widen(program: Program, enabled: list[str], table: RuleTable) -> None:
    """Grow the program's selection when its e-graph holds a table the selection did not foresee
    (a pass after import wrote it), so no rule that may fire is left out."""
    selection = program.selection
    if selection is None:
        return
    present = present_symbols(program.egraph)
    if not present <= selection.available:
        program.selection = select(enabled, table, selection.available | present)


def saturate(
    program: Program,
    budgets: Budgets,
    enabled: list[str],
    on_iteration: Callable[[IterationRecord], None] | None = None,
    *,
    stop_before: int | None = None,
    schedule: list[Phase] | None = None,
    table: RuleTable | None = None,
) -> SaturationReport:
    """Run the schedule's phases within budgets; returns per-iteration and per-phase records.

    A phase stops at its first budget reached or when an iteration changes nothing (saturated);
    the global e-node and time budgets stop the whole schedule. ``stop_before`` stops before that
    (global) iteration index, which is how a failing iteration is replayed. ``table``: the run's
    rule table (default: the in-tree one).
    """
    table = table or RuleTable.default()
    report = SaturationReport(enodes_before=program.node_count())
    schedule = schedule if schedule is not None else default_schedule(budgets, table.families)
    widen(program, enabled, table)
    only = program.selection.rewrites if program.selection is not None else None
    phases = [(p, phase_rules(p, enabled, table)) for p in schedule]
    phases = [(p, names) for p, names in phases if names]
    present = present_symbols(program.egraph)
    for _, names in phases:  # compile the rules that can match already: a fixed cost, not exploration time
        program.egraph.run(run(live_rewrites(names, table, only, present)) * 0)
    start = time.perf_counter()
    report.phases.append(_analysis(program, len(report.iterations)))
    global_stop: StopReason | None = None
    for position, (phase, names) in enumerate(phases):
        share = (start + budgets.seconds - time.perf_counter()) / (len(phases) - position)
        record = _run_phase(
            program, phase, names, budgets, report, start, share, enabled, on_iteration, stop_before, table
        )
        report.phases.append(record)
        if _global_budget_hit(record, program, budgets, start):
            global_stop = record.stop_reason
            break
    report.stop_reason = global_stop or _overall(report.phases[1:])
    report.enodes_after = program.node_count()
    report.seconds = time.perf_counter() - start
    return report


def _analysis(program: Program, index: int) -> PhaseRecord:
    """The analyses to saturation (import ran them; rerun so the record says it)."""
    t0 = time.perf_counter()
    run_cached(program.egraph, program.analysis().saturate())
    return PhaseRecord("analysis", 0, StopReason.SATURATED, program.node_count(), time.perf_counter() - t0, first_iteration=index)


def _run_phase(
    program: Program,
    phase: Phase,
    names: list[str],
    budgets: Budgets,
    report: SaturationReport,
    start: float,
    share: float,
    enabled: list[str],
    on_iteration: Callable[[IterationRecord], None] | None,
    stop_before: int | None,
    table: RuleTable,
) -> PhaseRecord:
    """One phase; without its own time budget it gets ``share`` (an equal part of what is left of
    the global one, so a slow early phase cannot starve the later ones)."""
    limit = budgets.iterations if phase.iterations is None else phase.iterations
    enodes = min(budgets.enodes, phase.enodes if phase.enodes is not None else budgets.enodes)
    t0 = time.perf_counter()
    deadline = min(start + budgets.seconds, t0 + (share if phase.seconds is None else phase.seconds))
    only = program.selection.rewrites if program.selection is not None else None
    scheduler = back_off(match_limit=budgets.match_limit, ban_length=budgets.ban_length)
    first = len(report.iterations)
    stop = StopReason.ITERATIONS
    for _ in range(limit):
        index = len(report.iterations)
        if stop_before is not None and index >= stop_before:
            stop = StopReason.REPLAYED
            break
        step = live_step(names, scheduler, table, only, present_symbols(program.egraph))
        record, updated = _iterate(program, step, phase.name, index, enabled, table)
        report.iterations.append(record)
        if on_iteration is not None:
            on_iteration(record)
        if not updated:
            stop = StopReason.SATURATED
            break
        if record.enodes >= enodes:
            stop = StopReason.ENODES
            break
        if time.perf_counter() >= deadline:
            stop = StopReason.SECONDS
            break
    if limit <= 0:
        stop = StopReason.NO_ITERATIONS
    return PhaseRecord(
        phase.name,
        len(report.iterations) - first,
        stop,
        program.node_count(),
        time.perf_counter() - t0,
        first_iteration=first,
        rules=len(names),
        limits=phase.limits(),
    )


def _global_budget_hit(record: PhaseRecord, program: Program, budgets: Budgets, start: float) -> bool:
    """Whether a phase was stopped by a global budget (which ends the schedule) or by its own."""
    if record.stop_reason == StopReason.REPLAYED:
        return True
    if record.stop_reason == StopReason.ENODES:
        return program.node_count() >= budgets.enodes
    if record.stop_reason == StopReason.SECONDS:
        return time.perf_counter() - start >= budgets.seconds
    return False


def _overall(phases: list[PhaseRecord]) -> StopReason:
    """One word for the whole run: saturated when every phase was, else the first phase budget hit."""
    if not phases:
        return StopReason.NO_RULES
    reasons = [p.stop_reason for p in phases]
    return next((r for r in reasons if r != StopReason.SATURATED), StopReason.SATURATED)


def schedule_rulesets(enabled: list[str], budgets: Budgets, table: RuleTable | None = None) -> list[list[str]]:
    """The rule sets the default schedule runs, one per distinct phase (to pre-register them)."""
    table = table or RuleTable.default()
    seen: list[list[str]] = []
    for phase in default_schedule(budgets, table.families):
        names = phase_rules(phase, enabled, table)
        if names and names not in seen:
            seen.append(names)
    return seen


def declarations(
    enabled: list[str],
    budgets: Budgets,
    table: RuleTable | None = None,
    start: frozenset[str] | None = None,
    *,
    eager: bool = False,
) -> tuple[tuple[str, ...], list[Schedule], Selection | None]:
    """What a run of the default schedule declares into its e-graph, and a key naming it: the
    analysis, then each phase's rewrite step (for ``egraph.warm.warm_egraph``). With ``start`` (the
    tables a model's import fills, ``egraph.importer.import_symbols``) only the rules that may fire
    on it (``select``), which the returned selection names; then only the analysis the import runs
    first, the rest declared as it can first match, unless ``eager``: every rule that can match
    from ``start`` at once too (a region's run, whose reused e-graph serves every region: rules
    declared under its push would be dropped with each region)."""
    table = table or RuleTable.default()
    selection = select(enabled, table, start)
    phases = schedule_rulesets(enabled, budgets, table)
    if selection is None or start is None:
        analysis = analysis_ruleset()
        rulesets = [table.ruleset_for(names) for names in phases]
        key = (str(analysis.__egg_ident__.name), *(str(r.__egg_ident__.name) for r in rulesets))
        return key, [analysis.saturate(), *(rewrite_step(names, budgets, table) for names in phases)], None
    # Only what the import runs first is declared here; the rest as it can first match (``egraph.live``).
    first = live_analysis(selection.analysis_rules, start)
    key = ("live", *_selection_key(selection, phases))
    if not eager:
        return key, [first.saturate()], selection
    rewrites = [run(live_rewrites(names, table, selection.rewrites, start)) for names in phases]
    return key, [first.saturate(), *rewrites], selection


_KEYS: dict[tuple[object, ...], str] = {}


def _selection_key(selection: Selection, phases: list[list[str]]) -> tuple[str, ...]:
    """A name per distinct selection and phase list in this process (the key of its warm e-graphs)."""
    ident = (id(selection.table), tuple(id(r) for r in selection.analysis_rules), selection.rewrites, tuple(map(tuple, phases)))
    if ident not in _KEYS:
        _KEYS[ident] = f"selection-{len(_KEYS)}"
    return (_KEYS[ident],)


def _iterate(
    program: Program, step: Schedule, phase: str, index: int, enabled: list[str], table: RuleTable
) -> tuple[IterationRecord, bool]:
    """One rewrite iteration, then the analyses to fixpoint; conflicting shapes raise."""
    t0 = time.perf_counter()
    try:
        result = run_cached(program.egraph, step)
        run_cached(program.egraph, program.analysis().saturate())
    except EggSmolError as exc:
        raise UnsoundRuleError(enabled, str(exc).splitlines()[0], index) from exc
    matches: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for key, n in result.matches.items():
        name = table.name_of(key)
        matches[name] = matches.get(name, 0) + n
    for key, dt in result.seconds.items():
        name = table.name_of(key)
        seconds[name] = seconds.get(name, 0.0) + dt
    record = IterationRecord(
        phase=phase,
        index=index,
        enodes=program.node_count(),
        seconds=time.perf_counter() - t0,
        matches=matches,
        rule_seconds=seconds,
    )
    return record, result.updated
