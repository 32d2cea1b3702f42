"""``onnxsat.study``: plain records on rule effectiveness, for notebooks and scripts.

Everything here is built on ``onnxsat.optimize`` and its report: one dict per saturation
iteration (e-graph size per phase, matches, time), one dict per rule (matches, search/apply
time, family, source, whether it shows in the extracted program), and ablations (disable one
rule family, re-run, compare extracted cost and, when asked, onnxruntime latency). Records are
plain dicts so they go straight into pandas, matplotlib or JSON.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from onnxsat.base.options import Options
from onnxsat.base.report import Report
from onnxsat.executors import ALL_CORES, Executor, SerialExecutor, Task
from onnxsat.pipeline import optimize
from onnxsat.rules.registry import RuleTable

__all__ = [
    "Run",
    "ablation",
    "extractor_records",
    "extractor_sweep",
    "iteration_records",
    "rule_records",
    "rules_in_program",
    "run",
    "summary",
    "table",
    "load_model",
]

Record = dict[str, Any]


@dataclass
class Run:
    """One optimize run of one model: the optimized model and its report."""

    name: str
    original: onnx.ModelProto
    optimized: onnx.ModelProto
    report: Report
    options: Options = field(default_factory=Options)

    def rules(self) -> RuleTable:
        """The run's rule table (the in-tree rules and the plugins its options asked for)."""
        from onnxsat.rules.plugins import load_plugins

        return load_plugins(self.options)[0]


def run(name: str, model: onnx.ModelProto, options: Options | None = None) -> Run:
    """Optimize ``model`` (verified on onnxruntime like any run) and keep what the study needs."""
    options = options or Options()
    optimized, report = optimize(model, options)
    return Run(name, model, optimized, report, options)


def iteration_records(result: Run) -> list[Record]:
    """One record per saturation iteration: phase (the ruleset run: multi or rewrite), e-nodes after it,
    wall seconds, total matches and the number of rules that matched."""
    return [
        {
            "model": result.name,
            "phase": it.phase,
            "iteration": it.index,
            "enodes": it.enodes,
            "seconds": it.seconds,
            "matches": sum(it.matches.values()),
            "rules_matched": sum(1 for n in it.matches.values() if n),
        }
        for it in result.report.saturation.iterations
    ]


def rule_records(result: Run) -> list[Record]:
    """One record per rule that matched at least once: matches and search+apply seconds (egglog's
    run report, summed over iterations), family, source, and ``in_program`` (see ``rules_in_program``);
    then one per per-site rule that added a site (e.g. the ``partial`` family; ``_site_rule_records``).

    egglog 13.2's run report gives zero durations per rule, so ``seconds`` is 0 there; the
    iteration records' ``seconds`` are measured wall times.
    """
    rules = result.rules()
    matches: Counter[str] = Counter()
    seconds: dict[str, float] = {}
    first: dict[str, int] = {}
    for it in result.report.saturation.iterations:
        for rule, n in it.matches.items():
            if n:
                matches[rule] += n
                first.setdefault(rule, it.index)
        for rule, dt in it.rule_seconds.items():
            seconds[rule] = seconds.get(rule, 0.0) + dt
    used = rules_in_program(result)
    return [
        {
            "model": result.name,
            "rule": rule,
            "family": rules.family_of(rule),
            "source": rules.source_of(rule),
            "matches": n,
            "seconds": seconds.get(rule, 0.0),
            "first_iteration": first[rule],
            "in_program": used.get(rule, False),
        }
        for rule, n in sorted(matches.items(), key=lambda kv: (-kv[1], kv[0]))
    ] + _site_rule_records(result)


def _site_rule_records(result: Run) -> list[Record]:
    """Per-site (PET-verified) rules, which run before saturation: ``matches`` counts the sites added
    to the e-graph, ``first_iteration`` is 0, ``seconds`` the whole per-site stage's time over its
    rules, and ``in_program`` whether extraction used one of the rule's sites (the report's record)."""
    rules_table = result.rules()
    emitted = [p for p in result.report.partial if p["status"] == "emitted"]
    rules = sorted({p["rule"] for p in emitted})
    stage = result.report.stage_seconds.get("partial", 0.0)
    return [
        {
            "model": result.name,
            "rule": rule,
            "family": rules_table.family_of(rule),
            "source": rules_table.source_of(rule),
            "matches": sum(p["rule"] == rule for p in emitted),
            "seconds": stage / len(rules),
            "first_iteration": 0,
            "in_program": any(p["used"] for p in emitted if p["rule"] == rule),
        }
        for rule in rules
    ]


def _root_op(text: str) -> str | None:
    """The constructor at the root of a rule side printed as ``t := op(...)`` (None for a bare variable)."""
    found = re.match(r"\s*\w+ := ([\w.]+)\(", text)
    return found.group(1) if found else None


def rules_in_program(result: Run) -> dict[str, bool]:
    """Which matched rules show in the extracted program: a cheap approximation of provenance.

    A rule counts when the op its right-hand side builds occurs more often in the optimized model
    than in the original, or, for a rule that rewrites to an existing term (an elimination such
    as ``x * 1 => x``), when the op at the root of its left-hand side occurs less often. A rule
    whose effect another rule also produces is credited too, and one whose result was rewritten
    again is not: exact provenance would need the creating rule of every extracted e-node, which
    egglog does not record.
    """
    from onnxsat.egraph.ops import BY_CTOR
    from onnxsat.rules.verification.verify import describe_rule

    table = result.rules()
    before = Counter(n.op_type for n in result.original.graph.node)
    after = Counter(n.op_type for n in result.optimized.graph.node)
    out: dict[str, bool] = {}
    for rule in result.report.saturation.rule_matches():
        if rule not in table.egg_rules:
            continue
        credited = False
        for variant in describe_rule(table, rule)["variants"]:
            rhs = [_root_op(t) for t in variant["rhs"]]
            lhs = [_root_op(t) for t in variant["lhs"]]
            for built in rhs:
                if built in BY_CTOR and after[BY_CTOR[built].op_type] > before[BY_CTOR[built].op_type]:
                    credited = True
            if all(op is None for op in rhs):
                for gone in lhs:
                    if gone in BY_CTOR and after[BY_CTOR[gone].op_type] < before[BY_CTOR[gone].op_type]:
                        credited = True
        out[rule] = credited
    return out


def ablation(
    name: str,
    model: onnx.ModelProto,
    options: Options | None = None,
    *,
    families: Iterable[str] | None = None,
    latency_rounds: int = 0,
    calls_per_round: int = 5,
    full: Run | None = None,
    executor: Executor | None = None,
) -> list[Record]:
    """Re-run with each rule family disabled in turn; one record per family plus the ``(none)`` baseline.

    ``cost_increase`` is the extracted cost without the family over the cost with every family:
    the share of the optimization that family is responsible for (1.0: it did not matter).
    With ``latency_rounds`` > 0 each optimized model is also timed on onnxruntime against the
    full run's model (``onnxsat.latency``: interleaved rounds, bootstrap 95% CI; use >= 30 rounds
    for a claim). ``full``: a run of ``model`` with ``options`` already made (not repeated).

    ``executor`` (``onnxsat.executors``: a process pool, Ray) runs the full run and then every
    family's cell as its own task (default: one after the other in this process); the model and
    the full run's optimized model are sent once. A cell that measures latency asks for a whole
    node (``ALL_CORES``), so no other cell runs beside its timings. The records are the same on
    every executor (latencies aside, which are measurements).
    """
    options = options or Options()
    executor = executor or SerialExecutor()
    shared_model = executor.share(model)
    if full is None:
        full = _one_value(executor, Task("(full)", run, (name, shared_model, options)))
    chosen = list(full.rules().families) if families is None else list(families)
    cells = ["(none)"] + [f for f in chosen if f not in options.disable_rules]
    shared_full = executor.share(full.optimized)
    cpus = ALL_CORES if latency_rounds > 0 else None
    tasks = [
        Task(
            family,
            _ablation_cell,
            (
                name,
                shared_model,
                options,
                family,
                shared_full,
                full.report if family == "(none)" else None,
                full.report.cost_after,
                latency_rounds,
                calls_per_round,
            ),
            cpus=cpus,
        )
        for family in cells
    ]
    records: dict[str, Record] = {}
    for done in executor.run(tasks):
        if not done.ok:
            raise RuntimeError(f"ablation of {name}, cell {done.key}: {done.error}")
        records[done.key] = done.value
    return [records[family] for family in cells]


def _one_value(executor: Executor, task: Task) -> Any:
    (done,) = list(executor.run([task]))
    if not done.ok:
        raise RuntimeError(f"{task.key}: {done.error}")
    return done.value


def _ablation_cell(
    name: str,
    model: onnx.ModelProto,
    options: Options,
    family: str,
    full_optimized: onnx.ModelProto,
    full_report: Report | None,
    full_cost: float,
    rounds: int,
    calls: int,
) -> Record:
    """One ablation cell (a task): the run without ``family`` (the full run's own report for the
    ``(none)`` baseline), its record, and with ``rounds`` its latency against the full run's model."""
    if full_report is not None:
        optimized, report = full_optimized, full_report
    else:
        variant = dataclasses.replace(options, disable_rules=(*options.disable_rules, family))
        optimized, report = optimize(model, variant)
    record: Record = {
        "model": name,
        "disabled": family,
        "cost_before": report.cost_before,
        "cost_after": report.cost_after,
        "cost_increase": report.cost_after / full_cost if full_cost else float("nan"),
        "nodes_after": report.total_after,
        "enodes": report.saturation.enodes_after,
    }
    if rounds > 0:
        from onnxsat.latency import compare_models
        from onnxsat.verification import make_inputs

        feeds = make_inputs(full_optimized, seed=0)
        cmp = compare_models(full_optimized, optimized, feeds, rounds=rounds, calls_per_round=calls, threads=1)
        record.update(
            latency_full_ms=cmp.baseline_ms,
            latency_ms=cmp.candidate_ms,
            latency_ratio=cmp.ratio,
            latency_ci=(cmp.ci_low, cmp.ci_high),
        )
    return record


def summary(records: Sequence[Record], key: str, value: str) -> dict[str, float]:
    """Sum ``value`` per ``key`` over records (e.g. matches per family), largest first."""
    total: dict[str, float] = {}
    for record in records:
        total[str(record[key])] = total.get(str(record[key]), 0.0) + float(record[value])
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def extractor_records(
    name: str,
    model: onnx.ModelProto,
    options: Options | None = None,
    methods: Sequence[str] = ("tree", "greedy-dag", "ilp"),
) -> list[Record]:
    """Saturate once, then extract the same e-graph with each method: DAG cost, seconds, gap, nodes.

    ``cost`` is what the extractor reports for its choice (DAG cost: a shared tensor counts once);
    ``gap`` is ILP's distance to its proven lower bound (None for the heuristics).
    """
    import time

    from onnxsat.pipeline import Session

    with Session(model, options or Options()) as session:  # plugins, rules, the per-site stage as in optimize
        session.saturate()
        egraph = session.saturated()
        records = []
        greedy = None
        for method in methods:
            if method not in ("tree", "greedy-dag", "ilp"):
                raise ValueError(f"unknown extractor {method!r} (tree, greedy-dag or ilp)")
            start = time.perf_counter()
            graph = session.extract(extractor=method, warm_start=greedy)
            greedy = graph if method == "greedy-dag" else greedy
            records.append(
                {
                    "model": name,
                    "extractor": method,
                    "cost": graph.cost,
                    "seconds": time.perf_counter() - start,
                    "gap": graph.gap,
                    "optimal": graph.optimal,
                    "nodes": sum(1 for _, n in graph.nodes if not n.op.startswith(("Tensor.", "TList."))),
                    "eclasses": len(egraph.classes),
                }
            )
    return records


def extractor_sweep(
    models: Mapping[str, onnx.ModelProto],
    options: Options | None = None,
    methods: Sequence[str] = ("tree", "greedy-dag", "ilp"),
    *,
    executor: Executor | None = None,
) -> list[Record]:
    """``extractor_records`` of every model, each model one task on ``executor`` (default: in this
    process); records in the order of ``models``."""
    executor = executor or SerialExecutor()
    names = list(models)
    tasks = [Task(n, extractor_records, (n, executor.share(models[n]), options, tuple(methods))) for n in names]
    found: dict[str, list[Record]] = {}
    for done in executor.run(tasks):
        if not done.ok:
            raise RuntimeError(f"extractor comparison of {done.key}: {done.error}")
        found[done.key] = done.value
    return [record for n in names for record in found[n]]


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
"""The repository's example models (present in a source checkout)."""


def load_model(spec: str) -> onnx.ModelProto:
    """``light:NAME.onnx`` (an ONNX light model shipped in the onnx package), else a file in examples/."""
    if spec.startswith("light:"):
        light = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
        return onnx.load(str(light / spec.removeprefix("light:")))
    return onnx.load(str(EXAMPLES / spec))


def table(records: Sequence[Record], columns: Sequence[str] | None = None) -> str:
    """Records as a Markdown table (``IPython.display.Markdown`` renders it; it reads as text too)."""
    if not records:
        return "(no records)"
    cols = list(columns or records[0].keys())

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "nan" if math.isnan(value) else f"{value:.4g}"
        if isinstance(value, tuple):
            return "[" + ", ".join(cell(v) for v in value) + "]"
        return str(value)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in records]
    return "\n".join(lines)
