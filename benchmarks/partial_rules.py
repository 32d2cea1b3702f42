"""PET partial rules on onnxruntime: does a mutant + correction pay on this CPU?

For one model per family, the script runs ``onnxsat.optimize`` with the partial family enabled
(sites PET-verified and added; the report says whether extraction chose them), then times the
original against the site's composite written as ONNX (what extraction would emit had it chosen
it) in onnxruntime (ORT_ENABLE_ALL both sides), in interleaved rounds with a bootstrap 95% CI of
median(original) / median(composite): a win needs the whole interval above 1.02.

    python benchmarks/partial_rules.py --out benchmarks/results/partial_rules.md [--rounds 30]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxsat
from onnxsat.egraph.importer import from_onnx
from onnxsat.extract.serialized import serialize
from onnxsat.latency import compare_models
from onnxsat.rules.partial import find_sites
from onnxsat.rules.verify_partial import composite_model

F = TensorProto.FLOAT


def _model(nodes: list, inputs: dict, outputs: dict, weights: dict) -> onnx.ModelProto:  # type: ignore[type-arg]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, n) for n, s in weights.items()]
    graph = helper.make_graph(
        nodes,
        "partial-bench",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs.items()],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


CASES = {
    "conv-spatial-to-batch": lambda: _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
        {"x": [1, 16, 128, 64]}, {"y": [1, 16, 128, 64]}, {"w": (16, 16, 3, 3), "b": (16,)},
    ),
    "pool-spatial-to-batch": lambda: _model(
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        {"x": [1, 32, 128, 128]}, {"y": [1, 32, 128, 128]}, {},
    ),
    "conv-concat-width": lambda: _model(
        [helper.make_node("Conv", [x, "w", "b"], [y], pads=[1, 1, 1, 1]) for x, y in (("x1", "y1"), ("x2", "y2"))],
        {"x1": [1, 16, 16, 16], "x2": [1, 16, 16, 16]}, {"y1": [1, 16, 16, 16], "y2": [1, 16, 16, 16]},
        {"w": (16, 16, 3, 3), "b": (16,)},
    ),
    "dilated-conv-to-batch": lambda: _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2])],
        {"x": [1, 32, 64, 64]}, {"y": [1, 32, 64, 64]}, {"w": (32, 32, 3, 3)},
    ),
    "matmul-batch-to-gemm": lambda: _model(
        [helper.make_node("MatMul", ["a", "m"], ["y"])], {"a": [8, 64, 256]}, {"y": [8, 64, 256]}, {"m": (256, 256)}
    ),
}


def run_case(rule: str, rounds: int, threads: int | None) -> dict[str, object]:
    model = CASES[rule]()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [run_case(r, args.rounds, args.threads) for r in CASES if args.only in r]
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
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
