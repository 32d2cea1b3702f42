"""Pooling forms of a YOLO spatial-pyramid block on onnxruntime: which one is fastest.

examples/spp_block.onnx pools one tensor with 5 x 5, 9 x 9 and 13 x 13 MaxPools (stride 1, 'same'
padding). Equivalent forms, each checked equal to the original on onnxruntime before timing:

- onnxsat: what ``onnxsat optimize`` writes with the default options;
- separable: every pool as a k x 1 then a 1 x k pool (rule ``pool-separable`` at every site);
- cascade: YOLO's SPPF, 9 x 9 = 5 x 5 of the 5 x 5 pool and 13 x 13 = 5 x 5 of the 9 x 9 one (exact
  for stride-1 max pools; rule pool-cascade);
- cascade + separable: the cascade with each 5 x 5 pool separable;
- 5 x 5 + separable 9, 13: what onnxsat wrote before rule pool-cascade (the 5 x 5 pool whole).

Each form is timed against the original at each onnxruntime level asked for (default: all three)
in interleaved rounds (``onnxsat.latency``: median ratio, bootstrap 95% CI, win above 1.02).

    python benchmarks/pool_forms.py [--rounds 40] [--levels disable,basic,all]
    # writes benchmarks/results/pool_forms.md
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
from onnxsat.latency import LatencyComparison, compare_models, ort_session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "spp_block.onnx"
RESULTS = ROOT / "benchmarks" / "results" / "pool_forms.md"
WINDOWS = (5, 9, 13)


def _pool(src: str, dst: str, kh: int, kw: int) -> onnx.NodeProto:
    return helper.make_node("MaxPool", [src], [dst], kernel_shape=[kh, kw], pads=[kh // 2, kw // 2] * 2)


def _square(src: str, dst: str, k: int, separable: bool, min_separable: int) -> list[onnx.NodeProto]:
    if not separable or k < min_separable:
        return [_pool(src, dst, k, k)]
    return [_pool(src, f"{dst}_column", k, 1), _pool(f"{dst}_column", dst, 1, k)]


def with_pools(
    model: onnx.ModelProto, *, separable: bool, cascade: bool, min_separable: int = 1
) -> onnx.ModelProto:
    """``model`` with its three pyramid MaxPools replaced by the requested form (with ``separable``,
    windows from ``min_separable`` on are split)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pools = [n for n in out.graph.node if n.op_type == "MaxPool"]
    outputs = [p.output[0] for p in pools]
    source = pools[0].input[0]
    nodes: list[onnx.NodeProto] = []
    for i, (k, name) in enumerate(zip(WINDOWS, outputs, strict=True)):
        src, size = (outputs[i - 1], WINDOWS[0]) if cascade and i else (source, k)
        nodes += _square(src, name, size, separable, min_separable)
    first = list(out.graph.node).index(pools[0])
    kept = [n for n in out.graph.node if n.op_type != "MaxPool"]
    del out.graph.node[:]
    out.graph.node.extend(kept[:first] + nodes + kept[first:])
    onnx.checker.check_model(out, full_check=True)
    return out


def _revision() -> str:
    """The commit measured, marked when the working tree had uncommitted changes."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"at {git('rev-parse', '--short', 'HEAD')}" + (" with uncommitted changes" if dirty else "")


LEVELS = ("disable", "basic", "all")
LEVEL_NAMES = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "all": "ORT_ENABLE_ALL"}


def _levels(text: str) -> list[str]:
    levels = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in levels if v not in LEVELS]
    if bad or not levels:
        raise argparse.ArgumentTypeError(f"levels must be among {', '.join(LEVELS)}; got {text!r}")
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--levels", type=_levels, default=list(LEVELS), help="comma-separated: disable,basic,all")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    original = onnx.load(str(EXAMPLE))
    optimized, report = onnxsat.optimize(original, onnxsat.Options())
    forms = {
        "onnxsat (default options)": optimized,
        "separable": with_pools(original, separable=True, cascade=False),
        "cascade (SPPF)": with_pools(original, separable=False, cascade=True),
        "cascade + separable": with_pools(original, separable=True, cascade=True),
        "5x5 + separable 9, 13 (before pool-cascade)": with_pools(
            original, separable=True, cascade=False, min_separable=9
        ),
    }
    x = np.random.default_rng(0).standard_normal((1, 64, 20, 20)).astype(np.float32)
    (want,) = ort_session(original).run(None, {"x": x})
    load_start = os.getloadavg()[0]
    rows: list[tuple[str, str, str, float, LatencyComparison]] = []
    for level in args.levels:
        for name, model in forms.items():
            (got,) = ort_session(model, level=level).run(None, {"x": x})
            err = float(np.abs(got - want).max())
            assert err <= 1e-5, (name, level, err)
            pools = ", ".join(
                "x".join(str(v) for v in next(a.ints for a in n.attribute if a.name == "kernel_shape"))
                for n in model.graph.node
                if n.op_type == "MaxPool"
            )
            comparison = compare_models(original, model, {"x": x}, level=level, rounds=args.rounds)
            rows.append((LEVEL_NAMES[level], name, pools, err, comparison))
            print(level, name, comparison, flush=True)
    load_end = os.getloadavg()[0]
    lines = [
        "# Pooling forms of examples/spp_block.onnx on onnxruntime",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} cores,"
        f" {args.rounds} interleaved rounds per form against the original at each level; load average"
        f" {load_start:.1f} at start, {load_end:.1f} at end. onnxsat {_revision()},"
        f" verification: {report.verification.status}.",
        "",
        "| level | form | MaxPool windows | max abs err | original ms | form ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {level} | {name} | {pools} | {err:.1e} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} |"
        f" [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |"
        for level, name, pools, err, c in rows
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
