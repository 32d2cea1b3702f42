"""onnxruntime latency of the examples before and after onnxsat, with rule-family ablations.

For each example (layout_algebra, transformer_block, inception_block) the script optimizes the
model with every rule, and again without one family at a time (``multi``: the parallel
MatMul/Conv merges; ``fusion``: LayerNorm/GELU/... fusions), so a family that does not pay on
this CPU shows up as such. Each variant is timed against the original in onnxruntime with
ORT_ENABLE_ALL on both sides, in interleaved rounds (``onnxsat.latency.compare_models``): the
ratio is median(original) / median(optimized) with a bootstrap 95% interval; a win needs the
whole interval above 1.02, a loss below 0.98, anything else is a tie.

The extractor rarely picks a multi-pattern merge, so the family ablation cannot say what a merge
costs. The forced-merge ablation therefore saturates each example once, lists the merges the
e-graph holds (``onnxsat.extract.pinning``), and extracts once with each merge pinned
(``onnxsat.forced``: same e-graph, extractor, exporter and numeric check as ``optimize``). The
merged model is timed against the original and against the unpinned extraction, and the table
shows which of the two the calibrated cost model (``profiles/ort-cpu-dev-2core.json``) prices lower
and whether exact (ILP) extraction under it chooses any merge.

    python benchmarks/rule_latency.py                        # all examples, table on stdout
    python benchmarks/rule_latency.py --out benchmarks/results/rule_latency.md
    python benchmarks/rule_latency.py --only transformer --rounds 50 --threads 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import onnxsat
from onnxsat.base.options import Options
from onnxsat.extract.ilp import extract_ilp
from onnxsat.extract.profile import load_profile
from onnxsat.forced import Saturated
from onnxsat.latency import LatencyComparison, compare_models

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "ort-cpu-dev-2core.json"
MERGE_EXAMPLES = ("transformer_block", "inception_block")


@dataclass(frozen=True)
class Variant:
    """One optimization setting of an example."""

    label: str
    disable: tuple[str, ...] = ()
    allow_contrib_ops: bool = False


VARIANTS = {
    "layout_algebra": [Variant("all rules")],
    "transformer_block": [
        Variant("all rules"),
        Variant("without multi (no Q/K/V merge)", ("multi",)),
        Variant("without fusion", ("fusion",)),
        Variant("all rules, --allow-contrib-ops", (), True),
    ],
    "inception_block": [Variant("all rules"), Variant("without multi (no conv merges)", ("multi",))],
}
SEQ = 128
"""Sequence length of the transformer inputs (batch 1)."""
DIMS = {"batch": 1, "seq": SEQ, "height": 96, "width": 96}
"""Sizes of the examples' symbolic dims in the timed inputs (layout_algebra: a 96 x 96 image)."""


def feeds_for(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Seeded inputs (symbolic dims sized by ``DIMS``): token ids below the vocabulary for int64
    inputs, a mask of ones, normal floats."""
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else DIMS[d.dim_param] for d in tt.shape.dim]
        if tt.elem_type == onnx.TensorProto.INT64:
            feeds[vi.name] = np.ones(dims, np.int64) if "mask" in vi.name else rng.integers(0, 100, dims)
        else:
            feeds[vi.name] = rng.standard_normal(dims).astype(
                onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            )
    return feeds


def op_summary(model: onnx.ModelProto) -> str:
    counts = Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node
    )
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def family_matches(report: onnxsat.Report) -> str:
    """Matches per rule family over all saturation iterations (did a family fire at all?)."""
    from onnxsat.rules import RULES

    counts: Counter[str] = Counter()
    for record in report.saturation.iterations:
        for rule, n in record.matches.items():
            counts[RULES.family_of(rule) or rule] += n
    return (
        ", ".join(f"{family} {n}" for family, n in sorted(counts.items()) if family in ("multi", "fusion"))
        or "-"
    )


def run_case(
    name: str, variant: Variant, rounds: int, threads: int | None
) -> tuple[onnx.ModelProto, onnx.ModelProto, LatencyComparison, float, str]:
    model = onnx.load(EXAMPLES / f"{name}.onnx")
    options = Options(disable_rules=variant.disable, allow_contrib_ops=variant.allow_contrib_ops)
    start = time.perf_counter()
    optimized, report = onnxsat.optimize(model, options)
    seconds = time.perf_counter() - start
    if report.verification.status not in ("passed", "regionwise"):
        raise RuntimeError(f"{name} ({variant.label}) was not verified: {report.verification}")
    feeds = feeds_for(model, np.random.default_rng(0))
    comparison = compare_models(model, optimized, feeds, level="all", threads=threads, rounds=rounds)
    return model, optimized, comparison, seconds, family_matches(report)


@dataclass(frozen=True)
class CalibratedView:
    """What the calibrated cost model says about the merges of one saturated e-graph."""

    unmerged: float
    merged: dict[str, float]
    """Merge label -> DAG cost of the extraction with that merge pinned."""
    ilp_picks: list[str]
    """Labels of the merges that exact extraction under the profile chooses."""

    @classmethod
    def of(cls, saturated: Saturated) -> CalibratedView:
        calibrated = load_profile(PROFILE)
        _, free = saturated.extract(cost=calibrated)
        merged = {
            saturated.label(m): saturated.extract(m.choices(), cost=calibrated)[1].cost
            for m in saturated.merges()
        }
        chosen = {eclass for eclass, _ in extract_ilp(saturated.egraph, calibrated, saturated.roots).nodes}
        picks = [saturated.label(m) for m in saturated.merges() if m.merged_class in chosen]
        return cls(free.cost, merged, picks)


def forced_merge_rows(name: str, rounds: int, threads: int | None) -> list[dict[str, object]]:
    """One row per merge in ``name``'s saturated e-graph: the merge pinned vs the free extraction.

    The calibrated costs are read twice where the model has symbolic dims: as optimized (the cost
    model sees unknown sizes) and with the dims pinned to the timed inputs' sizes.
    """
    model = onnx.load(EXAMPLES / f"{name}.onnx")
    feeds = feeds_for(model, np.random.default_rng(0))
    saturated = Saturated.of(model)
    free, _ = saturated.extract()
    symbolic = {
        vi.name: tuple(feeds[vi.name].shape)
        for vi in model.graph.input
        if any(d.dim_param or not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
    }
    views = {"as optimized": CalibratedView.of(saturated)}
    if symbolic:
        views["dims pinned"] = CalibratedView.of(Saturated.of(model, Options(input_shapes=symbolic)))
    rows: list[dict[str, object]] = []
    for merge in saturated.merges():
        merged, _ = saturated.extract(merge.choices())
        label = saturated.label(merge)
        vs_original = compare_models(model, merged, feeds, level="all", threads=threads, rounds=rounds)
        vs_free = compare_models(free, merged, feeds, level="all", threads=threads, rounds=rounds)
        print(f"{name:18} {label:44} vs original {vs_original}; vs unmerged {vs_free}", file=sys.stderr, flush=True)
        rows.append(
            {
                "example": name,
                "merge": label,
                "nodes": f"{len(model.graph.node)} / {len(free.graph.node)} / {len(merged.graph.node)}",
                "ops_after": op_summary(merged),
                "vs_original": vs_original.to_dict(),
                "vs_unmerged": vs_free.to_dict(),
                "calibrated": "; ".join(
                    f"{how}: {v.unmerged:.1f} / {v.merged.get(label, float('nan')):.1f}, ILP picks"
                    f" {', '.join(v.ilp_picks) or 'none'}"
                    for how, v in views.items()
                ),
            }
        )
    return rows


def _ratio_cell(d: dict[str, object]) -> str:
    return f"{d['ratio']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}] {d['verdict']}"


def render_merges(rows: list[dict[str, object]]) -> list[str]:
    lines = [
        "",
        "## Forced merges",
        "",
        "Each multi-pattern merge the saturated e-graph holds (default budgets), extracted with the merge"
        " pinned and verified against the original on onnxruntime. Nodes: original / unmerged (the free"
        " greedy-DAG extraction) / merged. Ratios as above (above 1: the merged model is faster than the"
        " reference named in the column). Calibrated: the DAG cost (us) of the unmerged / the merged"
        " extraction under `profiles/ort-cpu-dev-2core.json`, and the merges that exact (ILP) extraction"
        " under that profile chooses; for the transformer once as optimized (symbolic batch/sequence: the"
        f" cost model sees unknown sizes) and once with the dims pinned to the timed 1 x {SEQ}.",
        "",
        "| example | merge | nodes | ms original / merged | merged vs original | merged vs unmerged |"
        " calibrated cost unmerged / merged, ILP picks |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, u = r["vs_original"], r["vs_unmerged"]
        assert isinstance(o, dict) and isinstance(u, dict)
        lines.append(
            f"| {r['example']} | {r['merge']} | {r['nodes']} | {o['baseline_ms']:.3f} / {o['candidate_ms']:.3f} |"
            f" {_ratio_cell(o)} | {_ratio_cell(u)} | {r['calibrated']} |"
        )
    lines += ["", "Op counts of the merged models:", ""]
    lines += [f"- {r['example']}, {r['merge']}: {r['ops_after']}" for r in rows]
    return lines


def render(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    lines = [
        "# Rule latency: examples before and after onnxsat on onnxruntime",
        "",
        f"Generated by `python benchmarks/rule_latency.py` on {datetime.date.today()}: {platform.processor() or platform.machine()},"
        f" {os.cpu_count()} logical CPUs, Python {platform.python_version()}, onnxruntime {ort.__version__},"
        f" onnxsat {onnxsat.__version__}.",
        "",
        f"Both sides run in onnxruntime with ORT_ENABLE_ALL and {args.threads or 'default'} intra-op thread(s);"
        f" {args.rounds} interleaved rounds of 5 calls each (median per round). Ratio = median original /"
        " median optimized (above 1: onnxsat's model is faster), with a bootstrap 95% interval. Verdict: win if the"
        " interval lies above 1.02, loss if below 0.98, else tie. Inputs: batch 1; transformer sequence"
        f" {SEQ}; layout_algebra a {DIMS['height']} x {DIMS['width']} image. The machine is shared with other jobs, so intervals are wide; a tie means no measurable"
        " difference here, not a proof of none. Load average (1/5/15 min) at the start of the run"
        f" {'/'.join(f'{x:.1f}' for x in args.load_before)}, at the end"
        f" {'/'.join(f'{x:.1f}' for x in args.load_after)}.",
        "",
        "| example | variant | nodes | multi/fusion matches | original ms | optimized ms | ratio | 95% CI | verdict |"
        " optimize s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['example']} | {r['variant']} | {r['nodes_before']} -> {r['nodes_after']} | {r['matches']} |"
            f" {r['baseline_ms']:.3f} |"
            f" {r['candidate_ms']:.3f} | {r['ratio']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['verdict']} |"
            f" {r['optimize_s']:.1f} |"
        )
    lines += ["", "Op counts after optimization:", ""]
    for r in rows:
        lines.append(f"- {r['example']}, {r['variant']}: {r['ops_after']}")
    expected = json.loads((EXAMPLES / "layout_algebra.expected.json").read_text())
    for r in rows:
        if r["example"] == "layout_algebra":
            ok = r["nodes_after"] == expected["min_ops"]
            lines += [
                "",
                f"layout_algebra: {r['nodes_after']} ops after optimization; the hand-derived minimum is"
                f" {expected['min_ops']} ({'reached' if ok else 'NOT reached'}).",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=[], help="examples whose name contains one of these")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides (default 1)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--merges-only", action="store_true", help="only the forced-merge ablation")
    args = parser.parse_args(argv)
    args.load_before = os.getloadavg()
    rows: list[dict[str, object]] = []
    for name, variants in VARIANTS.items():
        if args.only and not any(o in name for o in args.only) or args.merges_only:
            continue
        for variant in variants:
            model, optimized, cmp, seconds, matches = run_case(name, variant, args.rounds, args.threads)
            row = {
                "example": name,
                "variant": variant.label,
                "nodes_before": len(model.graph.node),
                "nodes_after": len(optimized.graph.node),
                "ops_after": op_summary(optimized),
                "optimize_s": seconds,
                "matches": matches,
                **cmp.to_dict(),
            }
            rows.append(row)
            print(f"{name:18} {variant.label:34} {cmp}", file=sys.stderr, flush=True)
    merge_rows: list[dict[str, object]] = []
    for name in MERGE_EXAMPLES:
        if not args.only or any(o in name for o in args.only):
            merge_rows += forced_merge_rows(name, args.rounds, args.threads)
    args.load_after = os.getloadavg()
    text = render(rows, args) + "\n".join(render_merges(merge_rows)) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
