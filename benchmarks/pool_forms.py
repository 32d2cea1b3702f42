"""Pooling forms of a YOLO spatial-pyramid block on onnxruntime: which one is fastest.

examples/spp_block.onnx pools one tensor with 5 x 5, 9 x 9 and 13 x 13 MaxPools (stride 1, 'same'
padding). Equivalent forms, each checked equal to the original on onnxruntime before timing:

- onnxsat: what ``onnxsat optimize`` writes with the default options;
- separable: every pool as a k x 1 then a 1 x k pool (rule ``pool-separable`` at every site);
- cascade: YOLO's SPPF, 9 x 9 = 5 x 5 of the 5 x 5 pool and 13 x 13 = 5 x 5 of the 9 x 9 one (exact
  for stride-1 max pools; no rule makes it yet);
- cascade + separable: the cascade with each 5 x 5 pool separable.

Each form is timed against the original at ORT_ENABLE_ALL in interleaved rounds
(``onnxsat.latency``: median ratio, bootstrap 95% CI, win above 1.02).

    python benchmarks/pool_forms.py [--rounds 40]     # writes benchmarks/results/pool_forms.md
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


def _square(src: str, dst: str, k: int, separable: bool) -> list[onnx.NodeProto]:
    if not separable:
        return [_pool(src, dst, k, k)]
    return [_pool(src, f"{dst}_column", k, 1), _pool(f"{dst}_column", dst, 1, k)]


def with_pools(model: onnx.ModelProto, *, separable: bool, cascade: bool) -> onnx.ModelProto:
    """``model`` with its three pyramid MaxPools replaced by the requested form."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pools = [n for n in out.graph.node if n.op_type == "MaxPool"]
    outputs = [p.output[0] for p in pools]
    source = pools[0].input[0]
    nodes: list[onnx.NodeProto] = []
    for i, (k, name) in enumerate(zip(WINDOWS, outputs, strict=True)):
        src, size = (outputs[i - 1], WINDOWS[0]) if cascade and i else (source, k)
        nodes += _square(src, name, size, separable)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    original = onnx.load(str(EXAMPLE))
    optimized, report = onnxsat.optimize(original, onnxsat.Options())
    forms = {
        "onnxsat (default options)": optimized,
        "separable": with_pools(original, separable=True, cascade=False),
        "cascade (SPPF)": with_pools(original, separable=False, cascade=True),
        "cascade + separable": with_pools(original, separable=True, cascade=True),
    }
    x = np.random.default_rng(0).standard_normal((1, 64, 20, 20)).astype(np.float32)
    (want,) = ort_session(original).run(None, {"x": x})
    load_start = os.getloadavg()[0]
    rows: list[tuple[str, str, float, LatencyComparison]] = []
    for name, model in forms.items():
        (got,) = ort_session(model).run(None, {"x": x})
        err = float(np.abs(got - want).max())
        assert err <= 1e-5, (name, err)
        pools = ", ".join(
            "x".join(str(v) for v in next(a.ints for a in n.attribute if a.name == "kernel_shape"))
            for n in model.graph.node
            if n.op_type == "MaxPool"
        )
        rows.append((name, pools, err, compare_models(original, model, {"x": x}, rounds=args.rounds)))
        print(name, rows[-1][-1], flush=True)
    head_to_head = compare_models(forms["separable"], forms["cascade + separable"], {"x": x}, rounds=args.rounds)
    print("separable -> cascade + separable", head_to_head, flush=True)
    load_end = os.getloadavg()[0]
    lines = [
        "# Pooling forms of examples/spp_block.onnx on onnxruntime",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} cores, ORT_ENABLE_ALL,"
        f" {args.rounds} interleaved rounds per form against the original; load average {load_start:.1f} at start,"
        f" {load_end:.1f} at end. onnxsat {_revision()}, verification: {report.verification.status}.",
        "",
        "| form | MaxPool windows | max abs err | original ms | form ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {pools} | {err:.1e} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} |"
        f" [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |"
        for name, pools, err, c in rows
    ]
    c = head_to_head
    lines += [
        "",
        f"Head to head, separable -> cascade + separable: {c.baseline_ms:.3f} ms -> {c.candidate_ms:.3f} ms,"
        f" x{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}] ({c.verdict}).",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
