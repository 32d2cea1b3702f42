"""PET partial rules on onnxruntime: does a mutant + correction pay on this CPU?

For one model per family, the script runs ``onnxsat.optimize`` with the partial family enabled
(sites PET-verified and added; the report says whether extraction chose them), then times the
original against the site's composite written as ONNX (what extraction would emit had it chosen
it) in onnxruntime (ORT_ENABLE_ALL both sides), in interleaved rounds with a bootstrap 95% CI of
median(original) / median(composite): a win needs the whole interval above 1.02.

Then, on examples/linear_bottleneck.onnx (a 1x1 expansion feeding a 3x3 Conv, no activation
between), the same with and without the partial family, with default and one onnxruntime thread.

Then, on examples/spp_block.onnx (a YOLO-style spatial-pyramid-pooling block), the whole
pipeline with the partial family enabled against the original and against onnxsat without it:
which sites extraction used, verification, max abs error on onnxruntime, and the latency ratios.

With ``--cost-profile FILE`` (from ``onnxsat calibrate -o FILE``) the example is also optimized
under that measured profile.

    python benchmarks/partial_rules.py --out benchmarks/results/partial_rules.md [--rounds 30]
        [--cost-profile benchmarks/results/partial_rules.profile.json]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

import onnxsat
from onnxsat.egraph.importer import from_onnx
from onnxsat.extract.serialized import serialize
from onnxsat.latency import compare_models, ort_session
from onnxsat.rules.families.pooling import MIN_SEPARABLE_WINDOW
from onnxsat.rules.pet.partial import find_sites
from onnxsat.rules.pet.partial_models import MODELS
from onnxsat.rules.pet.verify_partial import composite_model


def run_case(rule: str, rounds: int, threads: int | None) -> dict[str, object]:
    model = MODELS[rule]["bench"]()
    _, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("core",), enable_rules=(rule,)))
    program = from_onnx(model)
    eg = serialize(program.egraph)
    (site,) = find_sites([rule], eg)
    composite = composite_model(site, model, {n: program.names[eg.origins[c]] for n, (c, _, _) in site.leaves.items()})
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    cmp = compare_models(model, composite, feeds, rounds=rounds, threads=threads)
    (record,) = [p for p in report.partial]
    return {
        "rule": rule,
        "status": record["status"],
        "boxes": f"{record['differing_boxes']}/{record['boxes']}",
        "corrected": record["corrected_fraction"],
        "used": record["used"],
        "cost": f"{report.cost_before:.1f} -> {report.cost_after:.1f}",
        "verification": report.verification.status,
        "cmp": cmp,
        "composite_nodes": len(composite.graph.node),
    }


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "spp_block.onnx"


def all_separable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every MaxPool/AveragePool of a window >= 5 x 5 written as its two 1-D passes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel = attrs.get("kernel_shape", [0])
        if node.op_type not in ("MaxPool", "AveragePool") or min(kernel) < MIN_SEPARABLE_WINDOW:
            nodes.append(node)
            continue
        (kh, kw), pads, strides = kernel, attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1])
        rest = {k: v for k, v in attrs.items() if k not in ("kernel_shape", "pads", "strides")}
        mid = f"{node.output[0]}_columns"
        nodes.append(helper.make_node(node.op_type, [node.input[0]], [mid], kernel_shape=[kh, 1], pads=[pads[0], 0, pads[2], 0], strides=[strides[0], 1], **rest))
        nodes.append(helper.make_node(node.op_type, [mid], [node.output[0]], kernel_shape=[1, kw], pads=[0, pads[1], 0, pads[3]], strides=[1, strides[1]], **rest))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def run_example(rounds: int, threads: int | None, cost_profile: Path | None = None) -> list[str]:
    """The example model through ``onnxsat.optimize`` with and without the partial family, timed."""
    model = onnx.load(str(EXAMPLE))
    with_partial, report = onnxsat.optimize(model, onnxsat.Options(enable_rules=("partial",)))
    without, plain = onnxsat.optimize(model, onnxsat.Options())
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    outs = [ort_session(m, threads=threads).run(None, feeds) for m in (model, with_partial)]
    err = max(float(np.abs(a - b).max()) for a, b in zip(*outs, strict=True))
    vs_original = compare_models(model, with_partial, feeds, rounds=rounds, threads=threads)
    vs_plain = compare_models(without, with_partial, feeds, rounds=rounds, threads=threads)
    vs_forced = compare_models(with_partial, all_separable(model), feeds, rounds=rounds, threads=threads)
    calibrated = None
    if cost_profile is not None:
        with_profile, _ = onnxsat.optimize(model, onnxsat.Options(enable_rules=("partial",), cost_profile=str(cost_profile)))
        calibrated = compare_models(model, with_profile, feeds, rounds=rounds, threads=threads)
        pools_calibrated = [
            f"{list(a.ints)}" for n in with_profile.graph.node if n.op_type.endswith("Pool") for a in n.attribute if a.name == "kernel_shape"
        ]
    lines = [
        "",
        f"## Example: {EXAMPLE.name} (onnxsat optimize, `--enable-rules partial`)",
        "",
        "| site | rule | status | PET check | used by extraction |",
        "|---|---|---|---|---|",
    ]
    for p in report.partial:
        lines.append(f"| {p['shapes']} | {p['rule']} | {p['status']} | {p['detail']} | {'yes' if p['used'] else 'no'} |")
    pools = [
        f"{n.op_type}{list(a.ints)}" for n in with_partial.graph.node if n.op_type.endswith("Pool") for a in n.attribute if a.name == "kernel_shape"
    ]
    lines += [
        "",
        f"Optimized pools: {', '.join(pools)}. Verification: {report.verification.status};"
        f" max abs error vs the original on onnxruntime: {err:.2e}. Estimated cost (us):"
        f" {report.cost_before:.1f} -> {report.cost_after:.1f} (without partial rules: {plain.cost_after:.1f}).",
        "",
        "| comparison | baseline ms | with partial ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|",
    ]
    rows = [
        ("original vs optimized with partial rules", vs_original),
        ("optimized without vs with partial rules", vs_plain),
        ("optimized with partial rules vs every pool >= 5 x 5 separable (by hand: what the cost model leaves)", vs_forced),
    ]
    if calibrated is not None:
        rows.append((f"original vs optimized with partial rules and the calibrated profile (pools {', '.join(pools_calibrated)})", calibrated))
    for name, c in rows:
        lines.append(f"| {name} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} | [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |")
    return lines


BOTTLENECK = EXAMPLE.parent / "linear_bottleneck.onnx"


def run_bottleneck(rounds: int) -> list[str]:
    """examples/linear_bottleneck.onnx through ``onnxsat.optimize`` with and without the partial family,
    timed against the original and against onnxsat's default output, with default and one thread."""
    model = onnx.load(str(BOTTLENECK))
    with_partial, report = onnxsat.optimize(model, onnxsat.Options(enable_rules=("partial",)))
    without, plain = onnxsat.optimize(model, onnxsat.Options())
    feeds = {"x": np.random.default_rng(0).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}
    outs = [ort_session(m).run(None, feeds)[0] for m in (model, with_partial)]
    err = float(np.abs(outs[0] - outs[1]).max())
    lines = [
        "",
        f"## Example: {BOTTLENECK.name} (onnxsat optimize, `--enable-rules partial`)",
        "",
        "| site | rule | status | PET check | used by extraction |",
        "|---|---|---|---|---|",
    ]
    for p in report.partial:
        lines.append(f"| {p['shapes']} | {p['rule']} | {p['status']} | {p['detail']} | {'yes' if p['used'] else 'no'} |")
    ops = [n.op_type for n in with_partial.graph.node]
    lines += [
        "",
        f"Optimized: {len(ops)} nodes ({ops.count('Conv')} Conv, {ops.count('Slice')} Slice, {ops.count('Concat')} Concat)."
        f" Verification: {report.verification.status}; max abs error vs the original on onnxruntime: {err:.2e}"
        f" (outputs up to {float(np.abs(outs[0]).max()):.1f}). Estimated cost (us): {report.cost_before:.1f} ->"
        f" {report.cost_after:.1f} (without partial rules: {plain.cost_after:.1f}).",
        "",
        "| comparison | threads | baseline ms | with partial ms | ratio | 95% CI | verdict | load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for threads in (None, 1):
        for name, base in (("original vs optimized with partial rules", model), ("optimized without vs with partial rules", without)):
            c = compare_models(base, with_partial, feeds, rounds=rounds, threads=threads)
            lines.append(
                f"| {name} | {threads or 'default'} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} |"
                f" [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} | {os.getloadavg()[0]:.1f} |"
            )
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-example", action="store_true", help="skip the spp_block example")
    parser.add_argument("--no-bottleneck", action="store_true", help="skip the linear_bottleneck example")
    parser.add_argument("--cost-profile", type=Path, default=None, help="also optimize the example with this profile (`onnxsat calibrate -o FILE`)")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    rows = [run_case(r, args.rounds, args.threads) for r in MODELS if args.only in r]
    lines = [
        "# PET partial rules on onnxruntime (CPU)",
        "",
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
        f" onnxruntime ORT_ENABLE_ALL, {args.rounds} interleaved rounds, threads {args.threads or 'default'}."
        " Ratio = median(original) / median(composite); 95% bootstrap CI; win needs CI above 1.02.",
        "",
        "| rule | site | differing/boxes | corrected | extracted by default cost model | est. cost (us) | original ms | composite ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cmp"]
        lines.append(
            f"| {r['rule']} | {r['status']} | {r['boxes']} | {r['corrected']:.1%} | {'yes' if r['used'] else 'no'} | {r['cost']} |"  # type: ignore[str-format]
            f" {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} | [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |"  # type: ignore[attr-defined]
        )
    if not args.no_example:
        lines += run_example(args.rounds, args.threads, args.cost_profile)
    if not args.no_bottleneck:
        lines += run_bottleneck(args.rounds)
    print(write_results(lines, args.out, load_start))


def write_results(lines: list[str], out: Path | None, load_start: float) -> str:
    """The table text with the load average at start and end, written atomically to ``out`` if given."""
    lines = [*lines, "", f"Load average (1 min) at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f} (a shared 2-core machine)."]
    text = "\n".join(lines) + "\n"
    if out:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    return text


if __name__ == "__main__":
    main()
