"""``optimize``: the whole flow as one readable function of named stages."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import onnx
from tqdm import tqdm

from onnxsat.base.errors import OnnxsatError, UnverifiableError, VerificationError, one_line
from onnxsat.base.modelio import check_model_full, serialized_size
from onnxsat.base.options import Options
from onnxsat.base.report import Report, VerificationSummary
from onnxsat.egraph.exporter import to_onnx
from onnxsat.egraph.fold import fold_constants
from onnxsat.egraph.graph_types import ExtractedGraph
from onnxsat.egraph.importer import from_onnx
from onnxsat.egraph.warm import WarmEGraph, warm_egraph
from onnxsat.extract.cost import CostModel
from onnxsat.extract.greedy import extract_greedy
from onnxsat.extract.serialized import serialize
from onnxsat.rules.partial import PartialRecord, apply_partial_rules, mark_used, site_rules
from onnxsat.rules.plugins import load_plugins
from onnxsat.rules.schedule import UnsoundRuleError, check_phase_budgets, declarations, saturate, select_rules
from onnxsat.verification import Reference, VerificationResult
from onnxsat.verification_inputs import pinned_dims


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
    """Time a stage into the report; with ``progress``, show a bar for it on stderr.

    Yields a ``step()`` callback for stages with several steps (saturation iterations).
    """
    bar = tqdm(total=total, desc=f"onnxsat {name:<11}", bar_format=_BAR, file=sys.stderr) if progress else None
    start = time.perf_counter()
    yield (lambda: bar.update(1)) if bar is not None else (lambda: None)
    report.stage_seconds[name] = round(time.perf_counter() - start, 4)
    if bar is not None:
        bar.n = bar.total
        bar.set_postfix_str(f"{report.stage_seconds[name]:.2f}s")
        bar.close()


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def rewrite_model(model: onnx.ModelProto, options: Options, enabled: list[str], report: Report) -> onnx.ModelProto:
    """Import, saturate with ``enabled`` rules, extract, export and fold (no verification)."""
    key, declared = declarations(enabled, options.budgets)
    with warm_egraph(key, declared) as warm:
        return _rewrite_in(model, options, enabled, report, warm)


def _rewrite_in(model: onnx.ModelProto, options: Options, enabled: list[str], report: Report, warm: WarmEGraph) -> onnx.ModelProto:
    progress = options.progress
    with _stage(report, "import", progress):
        program = from_onnx(model, {k: list(v) for k, v in options.input_shapes.items()}, warm=warm)
    report.opset = program.opset
    report.unknown_ops = dict(program.unknown_ops)
    report.opaque_reasons = dict(program.opaque_reasons)
    cost = cost_model(options)
    with _stage(report, "cost-before", progress):
        before = serialize(program.egraph)
        roots = [before.roots[i] for i in range(len(program.outputs))]
        report.cost_before = extract_greedy(before, cost, roots).cost
    partial: list[PartialRecord] = []
    on_sites = site_rules(enabled, before)  # per-site rules (PET-verified), only where their ops occur
    if on_sites:
        with _stage(report, "partial", progress):
            partial = apply_partial_rules(program, before, on_sites)
    with _stage(report, "saturate", progress, total=options.budgets.iterations) as step:
        report.saturation = saturate(program, options.budgets, enabled, on_iteration=lambda _: step())
    with _stage(report, "extract", progress):
        graph = _extract(program, cost, options)
    report.cost_after = graph.cost
    if partial:
        mark_used(partial, graph.choice(), graph.origins)
        report.partial = [asdict(r) for r in partial]
    report.extractor = graph.method
    report.extraction_gap = graph.gap
    with _stage(report, "export", progress):
        exported = to_onnx(
            program,
            graph,
            allow_contrib_ops=options.allow_contrib_ops,
            upgrade_opset=options.upgrade_opset,
            notes=report.warnings,
        )
        folded, _ = fold_constants(exported, serialized_size(model), materialize=options.materialize_constants)
    return folded


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
            f" (pass --target {cost.name})"
        )
    return cost


def _extract(program, cost: CostModel, options: Options) -> ExtractedGraph:  # type: ignore[no-untyped-def]
    serialized = serialize(program.egraph)
    roots = [serialized.roots[i] for i in range(len(program.outputs))]
    if options.extractor not in ("greedy-dag", "tree", "ilp"):
        raise OptionsError(f"unknown extractor {options.extractor!r} (greedy-dag, tree or ilp)")
    greedy = extract_greedy(serialized, cost, roots, tree_only=options.extractor == "tree")
    if options.extractor != "ilp":
        return greedy
    from onnxsat.extract.ilp import extract_ilp

    return extract_ilp(serialized, cost, roots, time_limit=options.ilp_time_limit, warm_start=greedy)


def optimize(model: onnx.ModelProto, options: Options | None = None) -> tuple[onnx.ModelProto, Report]:
    """Optimize a model; the result is checked against the original before it is returned.

    Raises ``VerificationError`` (naming a minimal failing rule set) instead of returning a
    model whose outputs differ from the original's.
    """
    options = options or Options()
    report = Report(model_name=model.graph.name, file_bytes_before=serialized_size(model))
    report.pinned_dims = _pins_by_input(model, options)
    report.nodes_before = _op_counts(model)
    report.warnings.extend(load_plugins(options))
    try:
        enabled = select_rules(options.rules_only, options.disable_rules, options.enable_rules)
        check_phase_budgets(options.budgets)
    except ValueError as exc:
        raise OptionsError(str(exc)) from exc
    reference = _prepare_reference(model, options, report) if options.verify else None
    if isinstance(reference, str) and options.allow_unverified:
        report.warnings.append(f"the optimized model may not be checked: {reference}")
    try:
        optimized = rewrite_model(model, options, enabled, report)
    except UnsoundRuleError as exc:
        from onnxsat.minimize import find_unsound_rules

        culprits = find_unsound_rules(model, options, enabled, exc.iteration)
        raise UnsoundRewriteError(culprits, exc.detail) from exc
    with _stage(report, "check", options.progress):
        check_model_full(optimized)
    if options.verify:
        with _stage(report, "verify", options.progress):
            if _default_opset(optimized) > report.opset:
                optimized, options = _without_failed_upgrade(model, optimized, options, enabled, report, reference)
            report.verification = _verify(model, optimized, options, enabled, reference)
        report.verification.seconds = round(
            report.stage_seconds.get("reference", 0.0) + report.stage_seconds["verify"], 4
        )
    else:
        report.verification = VerificationSummary("skipped", "--no-verify: outputs were NOT checked")
    if options.measure:
        from onnxsat.measure import keep_if_faster

        with _stage(report, "measure", options.progress):
            optimized = keep_if_faster(model, optimized, options, report)
    report.nodes_after = _op_counts(optimized)
    report.opset_after = _default_opset(optimized)
    report.file_bytes_after = serialized_size(optimized)
    return optimized, report


def _prepare_reference(model: onnx.ModelProto, options: Options, report: Report) -> Reference | str:
    """Before any rewriting: check that the result can be verified and run the original once on
    the verification inputs (the user's samples, else generated ones), so a model that cannot be
    checked fails in seconds (`UnverifiableError`, exit 2) instead of after saturation.

    Returns the reason instead when the whole original cannot be run but may still be checked
    region by region between its custom-domain nodes, or ``allow_unverified`` lets it through.
    """
    from onnxsat.regions import custom_nodes, region_problem
    from onnxsat.verification import reference_run
    from onnxsat.verification_inputs import prepare_samples

    try:
        samples = prepare_samples(model, options)
        with _stage(report, "reference", options.progress):
            dims = pinned_dims(model, options)
            return reference_run(model, seeds=options.verify_seeds, dim_values=dims, samples=samples)
    except UnverifiableError as exc:
        if options.allow_unverified:
            return exc.reason
        if not custom_nodes(model):
            raise
        problem = region_problem(model)
        if problem is not None:
            raise UnverifiableError(f"{exc.reason}; region by region: {problem}") from exc
        return exc.reason


def compare(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    options: Options,
    reference: Reference | str | None = None,
) -> tuple[VerificationResult, str]:
    """Numeric check on onnxruntime: the whole model, else region by region around custom ops.

    ``reference``: the original's outputs from `_prepare_reference`, reused instead of running it
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


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _without_failed_upgrade(
    model: onnx.ModelProto,
    optimized: onnx.ModelProto,
    options: Options,
    enabled: list[str],
    report: Report,
    reference: Reference | str | None,
) -> tuple[onnx.ModelProto, Options]:
    """``optimized`` (converted to a newer opset) and the options, or, when it does not match the
    original, the model rewritten at its own opset: the whole-model conversion, not a rule, may be
    what differs, so it is dropped (with a warning) before any rule is blamed."""
    result, _ = compare(model, optimized, options, reference)
    if result.ok or result.skipped_reason:
        return optimized, options
    report.warnings.append(
        f"the model converted to opset {_default_opset(optimized)} did not verify: written at opset"
        f" {report.opset} without the conversion"
    )
    options = replace(options, upgrade_opset=None)
    optimized = rewrite_model(model, options, enabled, report)
    check_model_full(optimized)
    return optimized, options


def _verify(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    options: Options,
    enabled: list[str],
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

    culprits = minimal_failing_rules(original, options, enabled)
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


