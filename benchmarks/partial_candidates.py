"""Which PET-kind transformations are faster on this CPU? Hand-built ONNX pairs on onnxruntime.

Before a transformation becomes a partial rule, this script measures the original op against the
rewritten form (ORT_ENABLE_ALL both sides, interleaved rounds, bootstrap 95% CI of
median(original) / median(rewritten); a win needs the interval above 1.02) and checks both
compute the same output. Candidates: reflect Pad + Conv with PET's border correction, a 1x1 Conv
feeding a 3x3 Conv merged with a border correction (conv-pointwise-merge), a dilated Conv as a plain Conv on a space-to-batch view
(6-D Transpose, or SpaceToDepth/DepthToSpace), a grouped Conv as one dense Conv with
block-diagonal weights, and k x k pooling as a k x 1 then a 1 x k pool.

    python benchmarks/partial_candidates.py --out benchmarks/results/partial_candidates.md [--rounds 40]
        [--only TEXT] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from partial_rules import write_results  # the sibling script (benchmarks/ is on sys.path when run)

from onnxsat.egraph.importer import from_onnx
from onnxsat.extract.serialized import serialize
from onnxsat.latency import compare_models, ort_session
from onnxsat.rules.pet.partial import find_sites
from onnxsat.rules.pet.partial_models import MODELS, site_model
from onnxsat.rules.pet.verify_partial import composite_model

Pair = tuple[str, onnx.ModelProto, onnx.ModelProto, dict[str, np.ndarray]]


def _ints(model: onnx.ModelProto, **values: list[int]) -> onnx.ModelProto:
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in values.items())
    return model


def dilated(c: int = 32, hw: int = 64, d: int = 2) -> list[Pair]:
    x = np.random.default_rng(0).standard_normal((1, c, hw, hw)).astype(np.float32)
    io = ({"x": [1, c, hw, hw]}, {"y": [1, c, hw, hw]})
    w = {"w": (c, c, 3, 3)}
    original = site_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[d] * 4, dilations=[d, d])], *io, w, weight_scale=0.1)
    s = hw // d
    transposed = _ints(
        site_model(
            [
                helper.make_node("Reshape", ["x", "s1"], ["a"]),
                helper.make_node("Transpose", ["a"], ["b"], perm=[3, 5, 0, 1, 2, 4]),
                helper.make_node("Reshape", ["b", "s2"], ["p"]),
                helper.make_node("Conv", ["p", "w"], ["q"], pads=[1] * 4),
                helper.make_node("Reshape", ["q", "s3"], ["r"]),
                helper.make_node("Transpose", ["r"], ["t"], perm=[2, 3, 4, 0, 5, 1]),
                helper.make_node("Reshape", ["t", "s4"], ["y"]),
            ],
            *io, w, weight_scale=0.1,
        ),
        s1=[1, c, s, d, s, d], s2=[d * d, c, s, s], s3=[d, d, 1, c, s, s], s4=[1, c, hw, hw],
    )
    depth = _ints(
        site_model(
            [
                helper.make_node("SpaceToDepth", ["x"], ["a"], blocksize=d),
                helper.make_node("Reshape", ["a", "z1"], ["p"]),
                helper.make_node("Conv", ["p", "w"], ["q"], pads=[1] * 4),
                helper.make_node("Reshape", ["q", "z2"], ["r"]),
                helper.make_node("DepthToSpace", ["r"], ["y"], blocksize=d, mode="DCR"),
            ],
            *io, w, weight_scale=0.1,
        ),
        z1=[d * d, c, s, s], z2=[1, d * d * c, s, s],
    )
    name = f"dilated Conv d{d} [1,{c},{hw},{hw}] 3x3"
    return [(f"{name} -> 6-D Transpose space-to-batch", original, transposed, {"x": x}),
            (f"{name} -> SpaceToDepth/DepthToSpace", original, depth, {"x": x})]


def grouped(c: int = 64, hw: int = 56, groups: int = 4) -> list[Pair]:
    rng = np.random.default_rng(0)
    wg = (rng.standard_normal((c, c // groups, 3, 3)) * 0.1).astype(np.float32)
    wd = np.zeros((c, c, 3, 3), np.float32)
    step = c // groups
    for g in range(groups):
        wd[g * step:(g + 1) * step, g * step:(g + 1) * step] = wg[g * step:(g + 1) * step]
    io = ({"x": [1, c, hw, hw]}, {"y": [1, c, hw, hw]})
    a = site_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, group=groups)], *io, {})
    a.graph.initializer.append(numpy_helper.from_array(wg, "w"))
    b = site_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], *io, {})
    b.graph.initializer.append(numpy_helper.from_array(wd, "w"))
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    return [(f"grouped Conv g{groups} [1,{c},{hw},{hw}] -> dense block-diagonal", a, b, {"x": x})]


def separable(op: str, shape: list[int], k: int, stride: int = 1) -> list[Pair]:
    p = k // 2
    io = ({"x": shape}, {"y": None})
    a = site_model([helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride] * 2, pads=[p] * 4)], *io, {})
    b = site_model(
        [
            helper.make_node(op, ["x"], ["t"], kernel_shape=[k, 1], strides=[stride, 1], pads=[p, 0, p, 0]),
            helper.make_node(op, ["t"], ["y"], kernel_shape=[1, k], strides=[1, stride], pads=[0, p, 0, p]),
        ],
        *io, {},
    )
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return [(f"{op} {k}x{k} s{stride} {shape} -> {k}x1 then 1x{k}", a, b, {"x": x})]


def reflect_pad(c: int = 32, hw: int = 128, group: int = 1) -> list[Pair]:
    """Reflect Pad + Conv (pads 0) against PET's form: the Conv on the unpadded input (the interior),
    the border rows and columns recomputed by Pad + Conv on two-row/column slices, joined by Concat."""
    n = helper.make_node
    io = ({"x": [1, c, hw, hw]}, {"y": [1, c, hw, hw]})
    w = {"w": (c, c // group, 3, 3), "b": (c,)}
    original = _ints(
        site_model([n("Pad", ["x", "p"], ["xp"], mode="reflect"), n("Conv", ["xp", "w", "b"], ["y"], group=group)], *io, w, weight_scale=0.1),
        p=[0, 0, 1, 1, 0, 0, 1, 1],
    )
    nodes = [n("Conv", ["x", "w", "b"], ["mid"], group=group)]
    for side, (start, end, axis, pads) in {
        "top": ("z0", "two", "ax2", "pt"), "bot": ("hm2", "big", "ax2", "pb"),
        "left": ("z0", "two", "ax3", "pl"), "right": ("hm2", "big", "ax3", "pr"),
    }.items():
        nodes += [
            n("Slice", ["x", start, end, axis], [f"{side}_x"]),
            n("Pad", [f"{side}_x", pads], [f"{side}_p"], mode="reflect"),
            n("Conv", [f"{side}_p", "w", "b"], [side], group=group),
        ]
    nodes += [n("Concat", ["left", "mid", "right"], ["middle"], axis=3), n("Concat", ["top", "middle", "bot"], ["y"], axis=2)]
    rewritten = _ints(
        site_model(nodes, *io, w, weight_scale=0.1),
        z0=[0], two=[2], hm2=[hw - 2], big=[hw], ax2=[2], ax3=[3],
        pt=[0, 0, 1, 1, 0, 0, 0, 1], pb=[0, 0, 0, 1, 0, 0, 1, 1], pl=[0, 0, 0, 1, 0, 0, 0, 0], pr=[0, 0, 0, 0, 0, 0, 0, 1],
    )
    x = np.random.default_rng(0).standard_normal((1, c, hw, hw)).astype(np.float32)
    return [(f"reflect Pad + Conv g{group} [1,{c},{hw},{hw}] -> Conv on the interior + border by Pad+Conv on slices", original, rewritten, {"x": x})]


def pointwise_merge() -> list[Pair]:
    """A 1x1 Conv (bias) 24 -> 96 feeding a 3x3 Conv 96 -> 24 on [1, 24, 56, 56] (the rule's benchmark
    model) against one 3x3 Conv over the product weights plus the border rows/columns recomputed by
    the pair on slices: the composite conv-pointwise-merge builds."""
    model = MODELS["conv-pointwise-merge"]["bench"]()
    program = from_onnx(model)
    eg = serialize(program.egraph)
    (site,) = find_sites(["conv-pointwise-merge"], eg)
    rewritten = composite_model(site, model, {k: program.names[eg.origins[e]] for k, (e, _, _) in site.leaves.items()})
    x = np.random.default_rng(0).standard_normal((1, 24, 56, 56)).astype(np.float32)
    return [("Conv 1x1 24->96 + Conv 3x3 96->24 [1,24,56,56] -> one 3x3 Conv + border rows/columns by the pair", model, rewritten, {"x": x})]


CANDIDATES: list[Callable[[], list[Pair]]] = [
    dilated,
    grouped,
    lambda: separable("MaxPool", [1, 64, 112, 112], 3, 2),
    lambda: separable("AveragePool", [1, 192, 28, 28], 3),
    lambda: separable("MaxPool", [1, 32, 20, 20], 5),
    lambda: separable("MaxPool", [1, 256, 20, 20], 5),
    lambda: separable("AveragePool", [1, 64, 56, 56], 7),
    lambda: separable("MaxPool", [1, 32, 20, 20], 9),
    lambda: separable("MaxPool", [1, 256, 20, 20], 13),
    reflect_pad,
    lambda: reflect_pad(64, 112, 64),
    pointwise_merge,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="", help="only candidates whose name contains this")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    lines = [
        "# PET-kind transformation candidates on onnxruntime (CPU)",
        "",
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
        f" onnxruntime ORT_ENABLE_ALL, {args.rounds} interleaved rounds, threads {args.threads or 'default'}."
        " Ratio = median(original) / median(rewritten); 95% bootstrap CI; win needs CI above 1.02.",
        "",
        "| candidate | max abs diff | original ms | rewritten ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for build in CANDIDATES:
        for name, original, rewritten, feeds in build():
            if args.only not in name:
                continue
            outs = [ort_session(m).run(None, feeds)[0] for m in (original, rewritten)]
            diff = float(np.abs(outs[0] - outs[1]).max())
            c = compare_models(original, rewritten, feeds, rounds=args.rounds, threads=args.threads)
            row = f"| {name} | {diff:.1e} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} | [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |"
            print(row, flush=True)
            lines.append(row)
    write_results(lines, args.out, load_start)


if __name__ == "__main__":
    main()
