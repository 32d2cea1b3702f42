"""``optimize``: the whole flow as named stages of a ``Session`` (load, saturate, extract, export, verify)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

import onnx

from onnxsat import dump
from onnxsat.base.errors import (
    BadInputError,
    OnnxsatError,
    TimeLimitError,
    UnverifiableError,
    VerificationError,
    one_line,
)
from onnxsat.base.model_check import check_model_as_original, check_model_full
from onnxsat.base.modelio import order_like, serialized_size, weight_bytes
from onnxsat.base.options import Options
from onnxsat.base.report import Report, SaturationReport, VerificationSummary
from onnxsat.base.weightless import has_large_weights
from onnxsat.egraph.exporter import to_onnx
from onnxsat.egraph.fold import fold_constants
from onnxsat.egraph.graph_types import ENode, ExtractedGraph, SerializedEGraph
from onnxsat.egraph.importer import from_onnx, import_symbols
from onnxsat.egraph.ort_forms import avoid_slow_ort_fusions
from onnxsat.egraph.program import Program
from onnxsat.egraph.regions import PartitionError
from onnxsat.egraph.warm import warm_egraph
from onnxsat.extract.cost import CostModel, RooflineCost
from onnxsat.extract.greedy import extract_greedy
from onnxsat.extract.kernel_plan import kernel_groups
from onnxsat.extract.serialized import serialize
from onnxsat.reference import in_background, prepare_reference, unverifiable_reason
from onnxsat.rules.pet.partial import PartialRecord, apply_partial_rules, mark_used, site_rules
from onnxsat.rules.plugins import PluginLoad, load_plugins, plugin_messages, plugin_ops, plugin_summary
from onnxsat.rules.registry import RuleTable
from onnxsat.rules.schedule import UnsoundRuleError, check_phase_budgets, declarations, saturate, select_rules
from onnxsat.static_shapes import Dims, fold_sizes, fully_known, reads_new_sizes, static_sizes
from onnxsat.verification import Reference, VerificationResult
from onnxsat.verification_inputs import pinned_dims

if TYPE_CHECKING:
    from onnxsat.jobs import Pool


class OptionsError(OnnxsatError):
    """Options that make no sense (unknown rule, target or extractor)."""

    exit_code = 2


class UnsoundRewriteError(OnnxsatError):
    """A rule made two different shapes/dtypes meet in one e-class: nothing is written."""

    exit_code = 3

    def __init__(self, rules: list[str], detail: str):
        super().__init__(f"unsound rewrite rule(s) {', '.join(rules)}: {detail}")
        self.rules = rules


_BAR = "{desc} {bar:24} {n_fmt}/{total_fmt} [{elapsed}]{postfix}"


@contextmanager
def _stage(report: Report, name: str, progress: bool, total: int = 1) -> Iterator[Callable[[], None]]:
    """Time a stage into the report; with ``progress``, show a bar for it on stderr when stderr is
    a terminal, else one plain line when the stage ends (no carriage-return frames in a log).

    Yields a ``step()`` callback for stages with several steps (saturation iterations).
    """
    terminal = progress and sys.stderr.isatty()
    if terminal:
        from tqdm import tqdm  # progress bars only on a terminal: a log or --quiet does not import it

    bar = tqdm(total=total, desc=f"onnxsat {name:<11}", bar_format=_BAR, file=sys.stderr) if terminal else None
    start = time.perf_counter()
    try:
        yield (lambda: bar.update(1)) if bar is not None else (lambda: None)
    finally:  # a stage that raises (a time limit reached while importing) still counts
        elapsed = time.perf_counter() - start
        # a stage run again (a rerun without a dropped rule) adds to its total: the stages sum to the run's time
        report.stage_seconds[name] = round(report.stage_seconds.get(name, 0.0) + elapsed, 4)
    if progress and bar is None:
        print(f"onnxsat {name:<11} {elapsed:.2f}s", file=sys.stderr, flush=True)
    if bar is not None:
        bar.n = bar.total
        bar.set_postfix_str(f"{elapsed:.2f}s")
        bar.close()


def check_output(original: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
    """onnx.checker (full, held to what the original passes: `check_model_as_original`) on the
    result; when it fails, a failing original is bad input (exit 2:
    models given to the API are not checked on load), a passing one an internal error naming it."""
    try:
        check_model_as_original(optimized, original)
    except Exception as exc:
        try:
            check_model_full(original)
        except Exception as original_exc:
            raise BadInputError(f"the input model fails onnx.checker: {one_line(original_exc)}") from exc
        raise OnnxsatError(f"the optimized model fails onnx.checker (the input passes): {one_line(exc)}") from exc


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


class Session:
    """One run over one model as public stages, each returning its artefact and timing itself
    into ``report.stage_seconds``: ``load`` (the imported program), ``saturate`` (the saturation
    report), ``extract`` (the chosen program), ``export`` (the checked ONNX model) and ``verify``
    (the numeric check). ``optimize`` runs them in order; minimization, forced extraction, the
    study helpers and the CLI run the stages they need, so no stage is written twice.

    A later stage runs the earlier ones it needs when they have not run. With
    ``options.dump_dir`` every stage also writes its artefact there (``dump`` below). Use it as a
    context manager: the reused e-graph (``egraph.warm``) it imports into goes back on ``close``.

    ``rules``: the enabled rule names (default: chosen from ``options`` after loading plugins;
    reruns and minimization pass others); ``report``: one to fill in (a rerun's is the first run's).
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        options: Options | None = None,
        *,
        rules: list[str] | None = None,
        report: Report | None = None,
        table: RuleTable | None = None,
        loads: list[PluginLoad] | None = None,
    ):
        self.model = model
        self.options = options = options or Options()
        self.report = report or Report(model_name=model.graph.name, file_bytes_before=serialized_size(model))
        if rules is None:
            self.report.pinned_dims = _pins_by_input(model, options)
            self.report.nodes_before = _op_counts(model)
            with _stage(self.report, "rules", False):  # the rule library (a fixed cost, once a process)
                table, loads = load_plugins(options)  # the run's rule table: plugins asked for here, seen here only
            self.report.warnings.extend(plugin_messages(loads))
            self.report.plugins = plugin_summary(loads)
            try:
                rules = select_rules(options.rules_only, options.disable_rules, options.enable_rules, table)
                check_phase_budgets(options.budgets, table)
            except ValueError as exc:
                raise OptionsError(str(exc)) from exc
        self.rules = rules
        self.table = table or RuleTable.default()
        """The run's rule table (in-tree rules plus the plugins its options load)."""
        self.loads = loads or []
        """The run's plugins, whose op rows are in the op table while a stage runs (``plugin_ops``)."""
        self.program: Program | None = None
        self.cost: CostModel | None = None
        self.partial: list[PartialRecord] = []
        self._reference: Reference | str | Future[Reference | str] | None = None
        self.saturation: SaturationReport | None = None
        """The ``saturate`` stage's report (None until it ran)."""
        self._saturated: SerializedEGraph | None = None
        self.original: ExtractedGraph | None = None
        """The imported program's own extraction (``saturate`` prices it before rewriting)."""
        self._held = ExitStack()
        self.pool: Pool | None = None
        """Worker processes for region-wise saturation (``--jobs``), started by ``optimize`` before
        the reference run so their start-up overlaps it (``by_regions.early_pool``); reruns share it."""
        self.deadline: float | None = None
        """``time.perf_counter()`` at which a whole-run time limit (``Budgets.whole_run``) ends."""
        self._sizes: dict[str, Dims] | None = None
        self._source: onnx.ModelProto | None = None

    @property
    def reference(self) -> Reference | str | None:
        """The original's outputs on the verification inputs (``prepare_reference``), or why it could
        not run; a run started by ``start_reference`` is waited for here (stage ``reference``: the
        time waited, the run's own in ``Report.background_seconds``)."""
        pending = self._reference
        if isinstance(pending, Future):
            with self._stage("reference"):
                resolved = pending.result()  # raises what the run raised (UnverifiableError)
            self._set_reference(resolved)
        return self._reference  # type: ignore[return-value]

    @reference.setter
    def reference(self, value: Reference | str | None) -> None:
        self._reference = value

    def _set_reference(self, value: Reference | str) -> None:
        self._reference = value
        if isinstance(value, str) and self.options.allow_unverified:
            self.report.warnings.append(f"the optimized model may not be checked: {value}")

    def reference_failed(self) -> None:
        """Raise now what a background reference run (``start_reference``) raised, if it has ended:
        called between stages, so a model onnxruntime cannot run fails before saturation, not after."""
        if isinstance(self._reference, Future) and self._reference.done():
            self.reference  # noqa: B018  (resolving raises the run's error)

    def with_rules(self, rules: list[str]) -> Session:
        """A new session of the same model, options, report and reference with other rules (a rerun)."""
        other = Session(self.model, self.options, rules=rules, report=self.report, table=self.table, loads=self.loads)
        other.reference = self.reference
        other.pool = self.pool
        other.deadline = self.deadline
        other._sizes = self._sizes
        other._source = self._source
        return other

    def static_shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors of `source` whose every size is known for every input value (`sizes`): what
        the importer seeds and regions carry in their types."""
        self.source()
        return fully_known(self.sizes())

    def sizes(self) -> dict[str, Dims]:
        """The sizes that cannot depend on the input values (stage ``shapes``;
        ``onnxsat.static_shapes``): ONNX inference's of the input until `source` is built, then
        those of the source, where inference leaves them open observed once on onnxruntime;
        reruns share them. Empty without ``options.observe_shapes``."""
        if self._sizes is None:
            self._sizes = {}
            if self.options.observe_shapes:
                with self._stage("shapes"):
                    self._sizes = static_sizes(self.model, *self._pins(), observed=False)
        return self._sizes

    def _pins(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        return {k: list(v) for k, v in self.options.input_shapes.items()}, pinned_dims(self.model, self.options)

    def source(self) -> onnx.ModelProto:
        """What the rewrite reads: the input with its known `sizes` written as constants and its
        weight-only subgraphs folded (stage ``fold``; ``static_shapes.fold_sizes``), so neither
        the import nor the rules spend time on size arithmetic; reruns share it. The sizes are
        then those of the folded model, where inference sees through what folding made constant
        (an attention mask's Expand of a folded shape) and observation has less left to run;
        sizes that finds for a Shape still in it are folded too."""
        if self._source is None:
            sizes = self.sizes()
            with self._stage("fold"):
                source = fold_sizes(self.model, sizes, self.weight_limit(), self.options.fold_elements)
            if self.options.observe_shapes:
                with self._stage("shapes"):
                    later = static_sizes(source, *self._pins())
                if reads_new_sizes(source, sizes, later):
                    with self._stage("fold"):
                        source = fold_sizes(source, later, self.weight_limit(), self.options.fold_elements)
                self._sizes = later
            self._source = source
        return self._source

    def weight_limit(self) -> float:
        """The most weight bytes folding may leave (``Options.fold_limit`` of the input's)."""
        return self.options.fold_limit(weight_bytes(self.model))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give the reused e-graph back (the program's e-graph is not usable after this)."""
        self._held.close()

    def _stage(self, name: str, total: int = 1) -> AbstractContextManager[Callable[[], None]]:
        return _stage(self.report, name, self.options.progress, total)

    # ------------------------------------------------------------ stages
    def prepare_reference(self) -> Reference | str:
        """Before any rewriting (stage ``reference``): check the result can be verified and run
        the original once on the verification inputs, which ``verify`` then reuses; a model that
        cannot be checked fails here in seconds (``UnverifiableError``). Returns the reason
        instead when it may still be checked region by region or ``allow_unverified`` lets it through."""
        with self._stage("reference"):  # the inputs' generation is verification work too
            self._set_reference(prepare_reference(self.model, self.options))
        return self.reference  # type: ignore[return-value]

    def start_reference(self) -> None:
        """``prepare_reference`` with the original's run on a background thread, beside the rewrite:
        onnxruntime computes outside the GIL, so where a core is free the run the check needs anyway
        costs the wall clock little (the thread runs at a lower priority, so where none is it yields
        to the rewrite). The user's samples are checked here (a bad one fails at once); a model
        onnxruntime cannot run fails at the next stage (``reference_failed``). The input's sizes are
        observed first (``source``): observing runs the original with probes added to its graph,
        which the thread must not read meanwhile. A model whose large weights are in memory (not
        read by onnxruntime from their file) is run in line: its session's copy of them would sit
        beside the rewrite's."""
        from onnxsat.verification_inputs import prepare_samples

        if has_large_weights(self.model):
            self.prepare_reference()
            return
        self.source()
        with self._stage("reference"):
            try:
                samples = prepare_samples(self.model, self.options)
            except UnverifiableError as exc:
                self._set_reference(unverifiable_reason(self.model, self.options, exc))
                return
        self._reference = in_background(self.model, self.options, samples, self.report)

    def load(self) -> Program:
        """Import the model into a reused e-graph with the rules declared (stage ``import``)."""
        options, report = self.options, self.report
        self.reference_failed()
        self._held.enter_context(plugin_ops(self.loads))
        source, static_shapes = self.source(), self.static_shapes()
        start = import_symbols(source)  # only the rules that may fire on this model are declared
        if start is not None:
            start |= options.declare_symbols
        with self._stage("declare"):  # the rules into a fresh e-graph (reused between runs of a process)
            key, declared, selection = declarations(
                self.rules, options.budgets, self.table, start, eager=bool(options.declare_symbols)
            )
            warm = self._held.enter_context(warm_egraph(key, declared, selection))
        if options.budgets.whole_run and self.deadline is None:
            self.deadline = time.perf_counter() + options.budgets.seconds
        with self._stage("import"):
            program = from_onnx(
                source,
                {k: list(v) for k, v in options.input_shapes.items()},
                warm=warm,
                seed_invented=options.seed_invented_dims,
                time_limit=None if self.deadline is None else self.deadline - time.perf_counter(),
                static_shapes=static_shapes,
            )
        report.opset = program.opset
        report.unknown_ops = dict(program.unknown_ops)
        report.opaque_reasons = dict(program.opaque_reasons)
        self.program = program
        return program

    def saturate(self) -> SaturationReport:
        """Price the imported program (``cost-before``), union the PET-verified sites of the
        enabled per-site rules (``partial``), then run the rule schedule (``saturate``)."""
        program = self.program or self.load()
        self.reference_failed()
        options, report = self.options, self.report
        cost = self.cost = cost_model(options)
        with self._stage("cost-before"):
            before = serialize(program.egraph)
            roots = [before.roots[i] for i in range(len(program.outputs))]
            self.original = extract_greedy(before, cost, roots)
            report.cost_before = self.original.cost
        on_sites = site_rules(self.rules, before)  # per-site rules (PET-verified), only where their ops occur
        if on_sites:
            with self._stage("partial"):
                self.partial = apply_partial_rules(program, before, on_sites)
        budgets = options.budgets
        if self.deadline is not None:  # what the import left of a whole-run limit
            budgets = replace(budgets, seconds=max(0.0, self.deadline - time.perf_counter()))
        with self._stage("saturate", total=options.budgets.iterations) as step:
            report.saturation = saturate(program, budgets, self.rules, on_iteration=lambda _: step(), table=self.table)
        self.saturation = report.saturation
        self._saturated = None
        dump.saturation(self)
        return self.saturation

    def saturated(self) -> SerializedEGraph:
        """The saturated e-graph as Python tables (serialized once, shared by every extraction)."""
        if self._saturated is None:
            if self.saturation is None:
                self.saturate()
            assert self.program is not None
            self._saturated = serialize(self.program.egraph)
        return self._saturated

    def roots(self) -> list[str]:
        """The e-classes of the graph outputs, in output order."""
        eg = self.saturated()
        assert self.program is not None
        return [eg.roots[i] for i in range(len(self.program.outputs))]

    def extract(
        self,
        *,
        extractor: str | None = None,
        cost: CostModel | None = None,
        pins: Mapping[str, ENode] | None = None,
        warm_start: ExtractedGraph | None = None,
    ) -> ExtractedGraph:
        """Choose a program (stage ``extract``) with ``extractor`` (default ``options.extractor``)
        under ``cost`` (default the options' cost model), with ``pins`` forcing chosen e-nodes
        (``extract.pinning``); ILP starts from ``warm_start`` or a greedy-DAG run."""
        method = extractor or self.options.extractor
        if method not in ("greedy-dag", "tree", "ilp"):
            raise OptionsError(f"unknown extractor {method!r} (greedy-dag, tree or ilp)")
        report = self.report
        with self._stage("extract"):
            serialized = self.saturated()
            if pins:
                from onnxsat.extract.pinning import pin

                serialized = pin(serialized, pins)
            roots = self.roots()
            cost = cost or self.cost or cost_model(self.options)
            if method == "ilp":
                from onnxsat.extract.ilp import extract_ilp

                greedy = warm_start or extract_greedy(serialized, cost, roots)
                graph = extract_ilp(serialized, cost, roots, time_limit=self.options.ilp_time_limit, warm_start=greedy)
            else:
                graph = extract_greedy(serialized, cost, roots, tree_only=method == "tree")
            if isinstance(cost, RooflineCost) and cost.fusion == "onnxsat":  # the compiled kernels: their grouping goes with the program
                graph.kernels = kernel_groups(graph)
        report.cost_after = graph.cost
        if self.partial:
            for record in self.partial:
                record.used = False
            mark_used(self.partial, graph.choice(), graph.origins)
            report.partial = [asdict(r) for r in self.partial]
        report.extractor = graph.method
        report.extraction_gap = graph.gap
        dump.extracted(self, graph)
        return graph

    def export(self, graph: ExtractedGraph | None = None) -> onnx.ModelProto:
        """The chosen program as an ONNX model, constants folded (stage ``export``) and checked by
        onnx's full checker (stage ``check``)."""
        with self._stage("export"):
            folded, _ = fold_constants(self._for_runtime(self.unfolded(graph)), max_weight_bytes=self.weight_limit())
        return self._checked(folded)

    def unfolded(self, graph: ExtractedGraph | None = None) -> onnx.ModelProto:
        """The chosen program as ONNX with its constants not folded: what ``export`` folds, and what
        region-wise saturation stitches (so replaying a region is a renaming)."""
        graph = graph or self.extract()
        assert self.program is not None
        return to_onnx(
            self.program,
            graph,
            allow_contrib_ops=self.options.allow_contrib_ops,
            upgrade_opset=self.options.upgrade_opset,
            notes=self.report.warnings,
        )

    def finish(self, exported: onnx.ModelProto) -> onnx.ModelProto:
        """``exported`` with its constants folded (stage ``export``), checked against what the original
        passes (stage ``check``) and dumped: the model ``verify`` then compares."""
        with self._stage("export"):
            folded, _ = fold_constants(self._for_runtime(exported), max_weight_bytes=self.weight_limit())
        return self._checked(folded)

    def _for_runtime(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` in the form its runtime runs fastest: its nodes in the input's order where they
        kept their names (a runtime runs them as written); for onnxruntime (the ``ort-cpu`` target),
        residual adds its SkipLayerNormalization fusion would slow down are written as ``Sum``
        (``egraph.ort_forms``)."""
        order_like(model.graph, self.model.graph)
        if self.options.target != "ort-cpu":
            return model
        written = avoid_slow_ort_fusions(model)
        if written:
            self.report.warnings.append(
                f"{written} residual Add(s) before LayerNormalization written as Sum: onnxruntime's"
                " SkipLayerNormalization fusion of them measured slower than the two ops here"
            )
        return model

    def _checked(self, folded: onnx.ModelProto) -> onnx.ModelProto:
        with self._stage("check"):
            check_output(self.model, folded)
        dump.exported(self, folded)
        return folded

    def verify(self, optimized: onnx.ModelProto, *, name_culprits: bool = True) -> VerificationSummary:
        """Compare ``optimized`` with the original on onnxruntime (stage ``verify``); raises
        ``VerificationError`` on a mismatch, naming a minimal failing rule set when
        ``name_culprits``, and ``UnverifiableError`` when it cannot be checked (the summary says
        "unverified" instead with ``allow_unverified``). Uses ``prepare_reference``'s outputs when it ran."""
        with self._stage("verify"):
            summary = _verify(self.model, optimized, self.options, self.rules if name_culprits else None, self.reference)
        stages = self.report.stage_seconds
        summary.seconds = round(stages.get("reference", 0.0) + stages["verify"], 4)
        summary.background_seconds = self.report.background_seconds.get("reference", 0.0)
        self.report.verification = summary
        dump.verification(self, optimized)
        return summary

    def rewrite(self) -> onnx.ModelProto:
        """load, saturate, extract and export: the optimized model, not verified. A graph above
        ``options.region_nodes`` nodes goes region by region (``onnxsat.by_regions``)."""
        from onnxsat.by_regions import rewrite_by_regions, use_regions

        if use_regions(self.source(), self.options):
            try:
                return rewrite_by_regions(self)
            except PartitionError as exc:
                self.report.warnings.append(f"saturated whole, not by regions: {one_line(exc)}")
        elif self.options.jobs > 1:
            self.report.warnings.append(
                f"--jobs {self.options.jobs} unused: the graph of {len(self.source().graph.node)} nodes is saturated"
                " whole in one process (--jobs spreads region-wise saturation: see --region-nodes)"
            )
        self.load()
        self.saturate()
        graph = self.extract()
        if self.original is not None and graph.cost > self.original.cost:
            graph = self._better_than_greedy(graph, self.original)
        return self.export(graph)

    def _better_than_greedy(self, greedy: ExtractedGraph, original: ExtractedGraph) -> ExtractedGraph:
        """The saturated e-graph still holds the original program, so an extraction dearer than it
        is a miss of the greedy extractor (its choices are local; sharing-heavy shape arithmetic
        of dynamic-axes exports misleads it): the ILP extractor, started from the original's
        program, searches again within ``options.ilp_time_limit``; the original's is the fallback."""
        report = self.report
        found = f"extraction found {greedy.cost:,.1f} us, above the input's {original.cost:,.1f} us"
        if greedy.method == "greedy-dag":
            graph = self.extract(extractor="ilp", warm_start=original)
            if graph.cost < original.cost:
                report.warnings.append(f"{found}: the ILP extractor, started from the input's program, found {graph.cost:,.1f} us")
                return graph
        report.warnings.append(f"{found}: the input's program is kept")
        report.cost_after, report.extractor, report.extraction_gap = original.cost, greedy.method, None
        return original


def cost_model(options: Options) -> CostModel:
    """The built-in profile of ``options.target``, or the calibrated ``options.cost_profile`` file."""
    from onnxsat.extract.profile import TARGETS, load_profile

    if options.target not in TARGETS:
        raise OptionsError(f"unknown target {options.target!r} (known: {', '.join(TARGETS)})")
    if options.cost_profile is None:
        return TARGETS[options.target]
    cost = load_profile(options.cost_profile)
    if cost.name != options.target:
        raise OptionsError(
            f"cost profile {options.cost_profile} is for target {cost.name!r}, not {options.target!r}"
            f" (pass --cost-target {cost.name})"
        )
    return cost


def optimize(model: onnx.ModelProto, options: Options | None = None) -> tuple[onnx.ModelProto, Report]:
    """Optimize a model; the result is checked against the original before it is returned.

    A rule found unsound (conflicting shapes) or behind a verification failure is left out and
    the run repeated (``Options.rule_retries`` times, then once without rewrites); the report
    names the dropped rules. Raises ``VerificationError`` only when even the run without
    rewrites cannot be verified. A result worse than the input (estimated cost, nodes, weight
    bytes) is replaced by the input itself (``Report.kept_original`` says why).
    """
    from onnxsat.by_regions import early_pool

    options = options or Options()
    session = Session(model, options)
    report = session.report
    with early_pool(session):
        if options.verify:
            session.start_reference()
        try:
            optimized = _verified_rewrite(session)
        except TimeLimitError as exc:  # a whole-run limit spent on importing: nothing was rewritten
            report.kept_original = str(exc)
            report.warnings.append(
                f"{exc} ({options.budgets.seconds:g} s for the whole run): the input is returned unchanged"
            )
            report.verification = VerificationSummary(
                "skipped", "the input is returned unchanged: nothing to check"
            )
            optimized = model
    if options.measure:
        from onnxsat.measure import keep_if_faster

        with _stage(report, "measure", options.progress):
            optimized = keep_if_faster(model, optimized, options, report)
    optimized = _never_worse(model, optimized, report, session.weight_limit())
    report.nodes_after = _op_counts(optimized)
    report.opset_after = _default_opset(optimized)
    report.file_bytes_after = serialized_size(optimized)
    return optimized, report


class _InventedSizeMet(Exception):
    """A rewrite let the analysis compute a size import had seeded with ONNX inference's name for it."""


def _verified_rewrite(session: Session) -> onnx.ModelProto:
    """The best verified result. Two shapes meeting with ONNX-invented sizes seeded: the run is
    repeated without those seeds. Then rules that break a run are dropped and the run repeated,
    within ``options.rule_retries`` reruns and then one run without rewrites (whose failure is raised)."""
    try:
        return _dropping_rules(session)
    except _InventedSizeMet as exc:
        session.report.warnings.append(
            f"imported again without the sizes ONNX shape inference named but could not compute ({exc})"
        )
        options = replace(session.options, seed_invented_dims=False)
        again = Session(
            session.model, options, rules=list(session.rules), report=session.report, table=session.table, loads=session.loads
        )
        again.reference = session.reference
        again.pool = session.pool
        again._sizes = session._sizes
        again._source = session._source
        return _dropping_rules(again)


def _dropping_rules(session: Session) -> onnx.ModelProto:
    """Rules that break a run are dropped and the run repeated (see ``_verified_rewrite``)."""
    options, report, enabled = session.options, session.report, list(session.rules)
    for attempt in range(options.rule_retries + 2):
        last = attempt > options.rule_retries or not enabled
        rules = [] if attempt > options.rule_retries else enabled
        try:
            return _attempt(session if attempt == 0 else session.with_rules(rules))
        except (UnsoundRewriteError, VerificationError) as exc:
            if last:
                raise
            named = exc.rules if isinstance(exc, UnsoundRewriteError) else exc.culprit_rules
            culprits = [r for r in named if r in enabled] or list(enabled)
            why = "unsound: two shapes for one tensor" if isinstance(exc, UnsoundRewriteError) else "verification failed"
            report.dropped_rules.update({r: f"{why} ({one_line(exc, 200)})" for r in culprits})
            report.warnings.append(f"rule(s) {', '.join(culprits)} left out and the run repeated: {one_line(exc, 200)}")
            enabled = [r for r in enabled if r not in culprits]
    raise AssertionError("unreachable: the last attempt returns or raises")


def _attempt(session: Session) -> onnx.ModelProto:
    """One run of the session's rules: rewrite, check, verify (raising on an unsound rule or a mismatch)."""
    try:
        with session:
            optimized = session.rewrite()
    except UnsoundRuleError as exc:
        if session.options.seed_invented_dims:
            raise _InventedSizeMet(exc.detail) from exc
        from onnxsat.minimize import find_unsound_rules

        culprits = find_unsound_rules(session.source(), session.options, session.rules, exc.iteration)
        raise UnsoundRewriteError(culprits, exc.detail) from exc
    if session.options.verify:
        if _default_opset(optimized) > _default_opset(session.model) and not _matches(session, optimized):
            # The whole-model opset conversion, not a rule, may be what differs: run without it.
            session.report.warnings.append(
                f"the model converted to opset {_default_opset(optimized)} did not verify: written at opset"
                f" {_default_opset(session.model)} without the conversion"
            )
            session.options = replace(session.options, upgrade_opset=None)
            return _attempt(session.with_rules(list(session.rules)))
        session.verify(optimized)
    else:
        session.report.verification = VerificationSummary("skipped", "--no-verify: outputs were NOT checked")
    return optimized


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _matches(session: Session, optimized: onnx.ModelProto) -> bool:
    """``optimized`` matches the original on onnxruntime (or cannot be checked at all)."""
    result, _ = compare(session.model, optimized, session.options, session.reference)
    return result.ok or bool(result.skipped_reason)


def _never_worse(model: onnx.ModelProto, optimized: onnx.ModelProto, report: Report, weight_limit: float) -> onnx.ModelProto:
    """The input itself when the result is worse than it: a higher estimated cost, or more nodes
    or weight bytes at no lower cost. Growth the cost model prices lower is kept, with a warning
    that says so (a verified merge of parallel MatMuls adds a Split); weight bytes may grow up to
    ``weight_limit`` (`Session.weight_limit`: constants folded) for fewer nodes or a lower cost,
    with a warning that says by how much. Folding itself stays within that limit (``egraph.fold``): this is the last line of
    defence, not where growth is prevented."""
    cheaper = report.cost_after < report.cost_before
    growth = []
    nodes_before, nodes_after = len(model.graph.node), len(optimized.graph.node)
    if nodes_after > nodes_before:
        growth.append(f"nodes {nodes_before} -> {nodes_after}")
    bytes_before, bytes_after = weight_bytes(model), weight_bytes(optimized)
    folded = bytes_before < bytes_after <= weight_limit and (cheaper or nodes_after < nodes_before)
    if bytes_after > bytes_before and not folded:  # within the limit, growth must buy something
        growth.append(f"weight bytes {bytes_before:,} -> {bytes_after:,}")
    costs = f"estimated cost {report.cost_before:,.1f} -> {report.cost_after:,.1f} us"
    if cheaper or (not growth and report.cost_after <= report.cost_before * (1 + 1e-9)):
        if growth:
            report.warnings.append(f"{', '.join(growth)}: kept because the cost model prices the result lower ({costs})")
        if folded:
            report.warnings.append(
                f"weight bytes {bytes_before:,} -> {bytes_after:,} (+{(bytes_after - bytes_before) / max(bytes_before, 1):.2%}):"
                " subgraphs of constants folded into tensors (within --fold-growth; 0 keeps them as nodes)"
            )
        return optimized
    report.kept_original = "; ".join([costs, *growth])
    report.warnings.append(f"the optimized model was not better than the input ({report.kept_original}): the input is returned")
    report.cost_after = report.cost_before
    return model


def compare(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    options: Options,
    reference: Reference | str | None = None,
) -> tuple[VerificationResult, str]:
    """Numeric check on onnxruntime: the whole model, else region by region around custom ops.

    ``reference``: the original's outputs from `onnxsat.reference.prepare_reference`, reused instead of running it
    again, or the reason it could not be run. Returns the result and how it was obtained
    ("passed"/"regionwise" when ok). Never raises for a model that cannot be checked: the result
    then carries ``skipped_reason``.
    """
    from onnxsat.regions import compare_by_regions, custom_nodes
    from onnxsat.verification import compare_models, compare_to_reference

    if isinstance(reference, Reference):
        return compare_to_reference(reference, original, optimized), "passed"
    if reference is None:
        dims = pinned_dims(original, options)
        result = compare_models(original, optimized, seeds=options.verify_seeds, dim_values=dims)
        if not result.skipped_reason:
            return result, "passed"
        reference = result.skipped_reason
    if not custom_nodes(original):
        return VerificationResult(ok=False, skipped_reason=reference), "passed"
    try:
        return compare_by_regions(original, optimized, seeds=options.verify_seeds), "regionwise"
    except Exception as exc:  # the regions cannot be run either: unverified, not a crash
        return VerificationResult(ok=False, skipped_reason=f"{reference}; region by region: {one_line(exc)}"), "regionwise"


def _verify(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    options: Options,
    enabled: list[str] | None,
    reference: Reference | str | None = None,
) -> VerificationSummary:
    result, mode = compare(original, optimized, options, reference)
    errors = {o.name: float(o.max_abs_err) for o in result.outputs}
    if result.ok:
        detail = (
            f"onnxruntime, {reference.origin if isinstance(reference, Reference) else f'seeds {list(options.verify_seeds)}'}"
            if mode == "passed"
            else "onnxruntime, each region between custom-domain nodes checked on its own"
        )
        return VerificationSummary(mode, detail, errors)
    if result.skipped_reason:
        if not options.allow_unverified:
            raise UnverifiableError(result.skipped_reason)
        return VerificationSummary("unverified", f"NOT checked (--allow-unverified): {result.skipped_reason}", errors)
    bad = next(o for o in result.outputs if not o.ok)
    from onnxsat.minimize import minimal_failing_rules

    culprits = (
        minimal_failing_rules(original, options, enabled, reference if isinstance(reference, Reference) else None)
        if enabled is not None
        else None
    )
    raise VerificationError(bad.name, bad.max_abs_err, bad.detail or "outputs differ", culprit_rules=culprits)


def _pins_by_input(model: onnx.ModelProto, options: Options) -> dict[str, dict[str, int]]:
    """For the report: per pinned input, each dim the model left open (its symbol, or "dim K") -> value."""
    pins: dict[str, dict[str, int]] = {}
    for vi in model.graph.input:
        pinned = options.input_shapes.get(vi.name)
        if pinned is None:
            continue
        declared = list(vi.type.tensor_type.shape.dim)
        if not vi.type.tensor_type.HasField("shape"):
            declared = [onnx.TensorShapeProto.Dimension() for _ in pinned]
        opened = {
            (d.dim_param or f"dim {axis}"): int(value)
            for axis, (d, value) in enumerate(zip(declared, pinned, strict=False))
            if not d.HasField("dim_value")
        }
        if opened:
            pins[vi.name] = opened
    return pins


