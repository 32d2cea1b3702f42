"""Saturation that scales: a large graph saturated region by region, identical regions once.

``rewrite_by_regions(session)`` is ``Session.rewrite`` for graphs above ``Options.region_nodes``
nodes: the graph is cut into regions of about ``Options.region_size`` nodes
(``egraph.regions.partition``), each distinct region (by its canonical key) is loaded, saturated
with the full schedule and its own budgets, extracted and exported as a model of its own, and
its program is replayed on every region with the same key (same computation, other weights);
the regions are put back into one graph, then the rules run once more on a window around each
cut (the nodes a few hops either side; windows are keyed and replayed the same way) so no
rewrite spanning a cut is lost, a common-subexpression pass merges what regions recomputed, and
the whole model is folded and checked as ``Session.export`` does. The session's ``verify`` then
checks the stitched model against the original like any result.

With ``Options.jobs`` above 1 the distinct regions, and then the distinct windows, are solved on
a pool of worker processes (``onnxsat.jobs``) started while the graph is partitioned; a part's
program depends only on the part, and the programs are stitched in part order, so the model is
the one a serial run writes. ``Options.region_replay`` off saturates every region and window on
its own (no replay): a result no worse, at the cost of saturating the twins.

The report's estimated costs are summed over the regions (each priced as a model of its own,
before and after), a window adding what it saved: importing the whole graph only to price it
would cost as much as importing it to saturate. A region's price can exceed its share of the
whole graph's (a tensor computed from weights in another region is an input there, not a folded
constant), so these sums compare with each other, not with a whole-graph run's; ``price``
prices any model on the whole-graph scale.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from onnxsat.base.errors import one_line
from onnxsat.base.options import Options
from onnxsat.base.report import RegionSummary, Report, SaturationReport
from onnxsat.egraph.importer import import_symbols, written_symbols
from onnxsat.egraph.opset_upgrade import UpgradeError, convert_whole_model
from onnxsat.egraph.regions import (
    SMALL_CONSTANT,
    Part,
    PartitionError,
    cut_windows,
    eliminate_common_subexpressions,
    part_key,
    part_models,
    partition,
    rename_part,
    replace_parts,
    value_types,
)
from onnxsat.rules.schedule import select

if TYPE_CHECKING:
    from onnxsat.jobs import Pool
    from onnxsat.pipeline import Session
    from onnxsat.rules.plugins import PluginLoad
    from onnxsat.rules.registry import RuleTable


@dataclass
class _Solved:
    """One distinct part's optimized program and what it cost."""

    model: onnx.ModelProto
    names: list[str]
    """The representative's tensor names in canonical order (``part_key``)."""
    external: frozenset[str]
    """Its inputs and constants (defined outside the part)."""
    cost_before: float
    cost_after: float
    saturation: SaturationReport
    replayable: bool
    """Every initializer it added is small or uniform (so none was computed from its weights)."""
    copies: frozenset[str]
    """The representative's copied shape computations (``Part.copies``): fresh names when stitched."""


def use_regions(model: onnx.ModelProto, options: Options) -> bool:
    """Whether ``model`` is saturated by regions: ``region_nodes`` set and the graph larger."""
    return 0 < options.region_nodes < len(model.graph.node)


def part_options(options: Options, part: Part, upgrade: bool, symbols: frozenset[str] = frozenset()) -> Options:
    """The run's options for one part: not verified (the stitched model is), no dump, no progress,
    no observed sizes of its own, no large constants folded from its weights, the rules of the tables
    ``symbols`` declared (the whole graph's: one declared e-graph for every part), the pins of the graph inputs it reads; without ``upgrade`` no conversion to a newer opset (a
    window is written at the opset of the graph around it)."""
    pins = {k: v for k, v in options.input_shapes.items() if k in part.inputs}
    return replace(
        options,
        region_nodes=0,
        jobs=1,
        verify=False,
        dump_dir=None,
        progress=False,
        measure=False,
        observe_shapes=False,  # the whole graph's observed sizes are in the part's types already
        fold_elements=SMALL_CONSTANT,  # keyed by value (part_key): the program stays replayable
        declare_symbols=options.declare_symbols | symbols,
        input_shapes=pins,
        upgrade_opset=options.upgrade_opset if upgrade else None,
    )


@dataclass
class Outcome:
    """What saturating one part gives (``solve_part``): plain data, so a worker process can send it."""

    model: onnx.ModelProto
    """The part's optimized program (unfolded), or its own model when kept as it is."""
    cost_before: float
    cost_after: float
    saturation: SaturationReport
    warnings: list[str]


def solve_part(
    model: onnx.ModelProto,
    nodes: int,
    options: Options,
    rules: list[str],
    table: RuleTable,
    loads: list[PluginLoad],
) -> Outcome:
    """Load, saturate, extract and export one part of ``nodes`` nodes under its run's ``options``
    (``part_options``): in this process or in a worker (``onnxsat.jobs``), the same result.

    Two shapes meeting in one e-class: the part is imported again without the sizes ONNX
    inference invented (as a whole-graph run is); meeting again (a size invented for a tensor
    crossing the cut, now an input symbol of the part, that a rewrite computes), the part is
    kept as it is, with a warning: no region is ever written from a run found inconsistent."""
    from onnxsat.rules.schedule import UnsoundRuleError

    warnings: list[str] = []
    try:
        try:
            exported, before, after, saturation = _saturate_part(
                model, options, rules, table, loads, warnings
            )
        except UnsoundRuleError:
            if not options.seed_invented_dims:
                raise
            again = replace(options, seed_invented_dims=False)
            exported, before, after, saturation = _saturate_part(model, again, rules, table, loads, warnings)
    except UnsoundRuleError as exc:
        warnings.append(
            f"a region of {nodes} nodes kept as it is: two shapes met in it ({one_line(exc, 200)})"
        )
        exported, before, after = model, 0.0, 0.0
        saturation = SaturationReport(stop_reason="kept: two shapes met")
    if (
        len(exported.graph.node) > len(model.graph.node) and after >= before
    ):  # more nodes for nothing: keep the part
        exported, after = model, before
    return Outcome(exported, before, after, saturation, warnings)


def _solved(part: Part, names: list[str], outcome: Outcome) -> _Solved:
    external = frozenset([*part.inputs, *part.constants])
    exported = outcome.model
    replayable = all(
        t.name in external or int(np.prod(t.dims)) <= SMALL_CONSTANT or _uniform(t)
        for t in exported.graph.initializer
    )
    return _Solved(
        exported,
        names,
        external,
        outcome.cost_before,
        outcome.cost_after,
        outcome.saturation,
        replayable,
        frozenset(part.copies),
    )


def _saturate_part(
    model: onnx.ModelProto,
    options: Options,
    rules: list[str],
    table: RuleTable,
    loads: list[PluginLoad],
    warnings: list[str],
) -> tuple[onnx.ModelProto, float, float, SaturationReport]:
    """One part through load, saturate, extract and export: its program and costs before/after."""
    from onnxsat.pipeline import Session

    report = Report(model_name=model.graph.name)
    with Session(model, options, rules=list(rules), report=report, table=table, loads=loads) as inner:
        inner.load()
        saturation = inner.saturate()
        graph = inner.extract()
        assert inner.original is not None and inner.program is not None
        if graph.cost > inner.original.cost:
            graph = inner.original
        exported = inner.unfolded(graph)
        before, after = inner.original.cost, graph.cost
    warnings.extend(w for w in report.warnings if w not in warnings)
    return exported, before, after, saturation


def price(session: Session, model: onnx.ModelProto) -> float:
    """The estimated cost of ``model`` as it stands (imported and extracted, nothing rewritten):
    how the region-wise result and the original are priced on one scale."""
    from onnxsat.extract.greedy import extract_greedy
    from onnxsat.extract.serialized import serialize
    from onnxsat.pipeline import Session, cost_model

    options = replace(session.options, region_nodes=0, verify=False, dump_dir=None, progress=False)
    with Session(
        model, options, rules=list(session.rules), report=Report(), table=session.table, loads=session.loads
    ) as priced:
        program = priced.load()
        serialized = serialize(program.egraph)
        roots = [serialized.roots[i] for i in range(len(program.outputs))]
        return extract_greedy(serialized, cost_model(options), roots).cost


def _uniform(tensor: onnx.TensorProto) -> bool:
    from onnxsat.base.lazy_weights import tensor_array

    flat = tensor_array(tensor).reshape(-1)
    return bool(flat.size == 0 or np.all(flat == flat[0]))


class _Parts:
    """Solves parts, one per key, and replays the solution on the others; with a ``pool``, the
    parts of one call are solved by its workers (the same solutions, gathered in part order)."""

    def __init__(self, session: Session, pool: Pool | None = None):
        self.session = session
        self.pool = pool
        self.solved: dict[str, _Solved] = {}
        self.runs: list[SaturationReport] = []
        self.cost_before = 0.0
        self.cost_after = 0.0
        self._symbols: frozenset[str] | None = None

    def symbols(self) -> frozenset[str]:
        """Every table the whole graph's rules may fill (``egraph.reach``): what each part declares
        rules for, so regions and windows (which hold the fused ops regions wrote) share one
        declared e-graph."""
        if self._symbols is None:
            session = self.session
            selection = select(session.rules, session.table, import_symbols(session.source()) | written_symbols())
            self._symbols = selection.available if selection is not None else frozenset()
        return self._symbols

    def optimize(
        self, model: onnx.ModelProto, parts: list[list[int]], tag: str, types: dict[str, onnx.TypeProto]
    ) -> tuple[onnx.ModelProto, list[int], int, int]:
        """``model`` with every part optimized (each a list of node indices), the new node count
        of each part, how many distinct parts were saturated and how many replayed.

        The parts to saturate are found in two waves, each solved at once (on the pool when there
        is one): the first part of every key not solved yet, then the twins of a solution that is
        not replayable (its program reads values computed from its own weights)."""
        upgrade = sum(len(p) for p in parts) == len(model.graph.node)  # no node outside the parts
        planned: list[tuple[list[int], Part, str, list[str]]] = []
        for k, (nodes, part) in enumerate(zip(parts, part_models(model, parts, types), strict=True)):
            key, names = part_key(part)
            if not self.session.options.region_replay:
                key = f"{key}/{tag}{k}"  # every part saturated on its own
            planned.append((nodes, part, key, names))
        first: dict[str, int] = {}
        for k, (_, _, key, _) in enumerate(planned):
            if key not in self.solved and key not in first:
                first[key] = k
        fresh = self._solve(planned, sorted(first.values()), upgrade)
        own = [
            k
            for k, (_, _, key, _) in enumerate(planned)
            if first.get(key) != k and not self.solved[key].replayable
        ]
        for k in own:
            nodes, part, key, names = planned[k]
            planned[k] = (nodes, part, f"{key}/{tag}{k}", names)
        fresh |= self._solve(planned, own, upgrade)
        for k in sorted(fresh):  # in part order, as a serial run meets them
            self.runs.append(self.solved[planned[k][2]].saturation)
            for w in fresh[k]:
                if w not in self.session.report.warnings:
                    self.session.report.warnings.append(w)
        distinct, replayed = len(fresh), len(planned) - len(fresh)
        for _, _, key, _ in planned:
            solved = self.solved[key]
            if tag == "r":
                self.cost_before += solved.cost_before
            self.cost_after += solved.cost_after - (0.0 if tag == "r" else solved.cost_before)
        opset = max(_opset(model), *(_opset(self.solved[key].model) for _, _, key, _ in planned))
        for key in {key for _, _, key, _ in planned}:
            self.solved[key].model = _at_opset(self.solved[key].model, opset)
        replaced = []
        sizes = []
        for k, (nodes, _, key, names) in enumerate(planned):
            solved = self.solved[key]
            mapping = {a: b for a, b in zip(solved.names, names, strict=True) if a not in solved.copies}
            new_nodes, new_weights = rename_part(solved.model, mapping, f"{tag}{k}_", solved.external)
            replaced.append((nodes, new_nodes, new_weights))
            sizes.append(len(new_nodes))
        stitched = replace_parts(model, replaced)
        domains = {o.domain: o.version for o in stitched.opset_import}
        for solved in self.solved.values():
            for o in solved.model.opset_import:
                domains[o.domain] = max(domains.get(o.domain, 0), o.version)
        del stitched.opset_import[:]
        stitched.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in sorted(domains.items()))
        return stitched, sizes, distinct, replayed

    def _solve(
        self, planned: list[tuple[list[int], Part, str, list[str]]], chosen: list[int], upgrade: bool
    ) -> dict[int, list[str]]:
        """Solve the parts ``chosen`` (indices into ``planned``) into ``self.solved``; returns
        each one's warnings."""
        session = self.session
        options = [part_options(session.options, planned[k][1], upgrade, self.symbols()) for k in chosen]

        def here(i: int) -> Outcome:
            part = planned[chosen[i]][1]
            return solve_part(
                part.model, len(part.nodes), options[i], list(session.rules), session.table, session.loads
            )

        if self.pool is not None and self.pool.alive and chosen:
            from onnxsat.jobs import Task

            rules = tuple(session.rules)
            tasks = [
                Task(planned[k][1].model.SerializeToString(), len(planned[k][1].nodes), options[i], rules)
                for i, k in enumerate(chosen)
            ]
            outcomes = self.pool.map(tasks, here)
        else:
            outcomes = [here(i) for i in range(len(chosen))]
        warnings = {}
        for k, outcome in zip(chosen, outcomes, strict=True):
            _, part, key, names = planned[k]
            self.solved[key] = _solved(part, names, outcome)
            warnings[k] = outcome.warnings
        return warnings


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A part written below ``opset`` (another part was converted to write a fused op as a standard
    one) converted up, so all parts stitch at one opset (the result is verified like any other)."""
    if _opset(model) >= opset:
        return model
    try:
        return convert_whole_model(model, opset)
    except UpgradeError as exc:
        raise PartitionError(f"a region could not be converted to opset {opset}: {exc}") from exc


def rewrite_by_regions(session: Session) -> onnx.ModelProto:
    """The session's model optimized region by region (see the module docstring); fills the
    session's report (costs, the combined saturation report, ``report.regions``, stage times)."""
    report = session.report
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = round(now - clock, 4)
        report.stage_seconds[f"regions-{name}"] = seconds[name]
        clock = now

    with early_pool(session):  # a session driven stage by stage starts its workers now
        return _by_regions(session, session.pool, lap, seconds)


@contextmanager
def early_pool(session: Session) -> Iterator[None]:
    """``session.pool`` set, for the block, to ``Options.jobs`` workers when the run goes by
    regions: started before the block (``optimize`` enters it before the reference run, so the
    workers' start-up overlaps that and the partition), closed after it, its warnings reported."""
    options = session.options
    if options.jobs <= 1 or session.pool is not None or not use_regions(session.model, options):
        yield
        return
    from onnxsat.jobs import Pool

    with Pool(options.jobs, options) as pool:
        session.pool = pool
        try:
            yield
        finally:
            session.pool = None
            session.report.warnings.extend(w for w in pool.warnings if w not in session.report.warnings)


def _by_regions(
    session: Session, pool: Pool | None, lap: Callable[[str], None], seconds: dict[str, float]
) -> onnx.ModelProto:
    options, report = session.options, session.report
    model = session.source()
    types = _with_static_shapes(value_types(model), session.static_shapes())
    ranges = partition(model, options.region_size, types)
    lap("partition")
    parts = _Parts(session, pool)
    stitched, sizes, distinct, replayed = parts.optimize(model, [list(r) for r in ranges], "r", types)
    lap("saturate")
    cuts = list(np.cumsum(sizes)[:-1])
    hops = options.region_window_hops
    windows: list[list[int]] = []
    if hops > 0:
        span = max(2, options.region_size // 4)  # a quarter: windows of regions >= half the target never meet
        for window in cut_windows(stitched, [int(c) for c in cuts], hops, span):
            if window and windows and min(window) <= max(windows[-1]):
                windows[-1] = sorted(set(windows[-1]) | set(window))  # overlapping windows: one
            elif window:
                windows.append(window)
    w_distinct = w_replayed = 0
    if windows:
        w_types = value_types(stitched)
        stitched, _, w_distinct, w_replayed = parts.optimize(stitched, windows, "w", w_types)
    lap("windows")
    stitched, merged = eliminate_common_subexpressions(stitched)
    lap("cse")
    folded = session.finish(stitched)
    lap("export")
    report.cost_before, report.cost_after = parts.cost_before, parts.cost_after
    report.extractor = options.extractor
    report.saturation = _combined(parts.runs)
    session.saturation = report.saturation
    budgets = options.budgets
    report.regions = RegionSummary(
        threshold=options.region_nodes,
        target_size=options.region_size,
        regions=len(ranges),
        distinct=distinct,
        replayed=replayed,
        sizes=[len(r) for r in ranges],
        windows=len(windows),
        windows_distinct=w_distinct,
        windows_replayed=w_replayed,
        window_hops=hops,
        merged_by_cse=merged,
        replay=options.region_replay,
        jobs=options.jobs,
        budgets=f"per region: {budgets.iterations} iterations, {budgets.enodes:,} e-nodes, {budgets.seconds:g} s",
        stop_reasons=dict(Counter(str(r.stop_reason) for r in parts.runs)),
        seconds=seconds,
    )
    return folded


def _with_static_shapes(
    types: dict[str, onnx.TypeProto], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, onnx.TypeProto]:
    """``types`` with the observed sizes (``Session.static_shapes``) where inference left them open,
    so each region's import seeds them like the whole graph's would."""
    for name, dims in shapes.items():
        known = types.get(name)
        if known is not None and known.HasField("tensor_type") and known.tensor_type.elem_type:
            types[name] = onnx.helper.make_tensor_type_proto(known.tensor_type.elem_type, list(dims))
    return types


def _combined(runs: list[SaturationReport]) -> SaturationReport:
    """One saturation report for the distinct parts' runs: sizes and time summed, iterations
    listed one after another (so the rules that fired add up), stop reasons counted."""
    reasons = Counter(str(r.stop_reason) for r in runs)
    return SaturationReport(
        iterations=[it for r in runs for it in r.iterations],
        stop_reason="by regions: " + ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items())),
        enodes_before=sum(r.enodes_before for r in runs),
        enodes_after=sum(r.enodes_after for r in runs),
        seconds=round(sum(r.seconds for r in runs), 4),
        phases=[],
    )
