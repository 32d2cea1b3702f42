"""Does the calibrated cost model predict what onnxruntime measures? (issue 4, "Must show")

1. Calibrate (``onnxsat.calibrate``, full sample set) and report predicted vs measured
   time per node on the held-out shapes (never used in the fit): floor, median relative error
   <= 25%.
2. Pairs (A, B) of equivalent models: parallel MatMuls and parallel 1x1 Convs that share an
   input, unmerged vs merged into one wider op + Split (the multi-pattern rules' rewrite), at
   several sizes; and each light model / example vs its ``onnxsat.optimize`` output. Each pair
   is timed with ``onnxsat.latency.compare_models`` (interleaved rounds, median, bootstrap 95%
   CI) and priced by the calibrated model (sum of node costs of the imported model plus the
   fixed cost of a call). Floor: among pairs whose measured latency differs by more than 5%,
   the sign of the difference is predicted correctly in >= 80%.
3. Whole-model error: predicted vs measured latency of every model timed.

Everything runs single-threaded (``--threads``, default 1) on both sides so the shared machine's
noise stays small; a profile from this run can be saved with ``--profile-out``.

    python benchmarks/calibration.py --out benchmarks/results/calibration.md
    python benchmarks/calibration.py --no-models          # synthetic pairs only (minutes less)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FLOOR_NODE_ERROR = 0.25
FLOOR_SIGN = 0.80
MIN_DIFF = 0.05
PREDICTED_TIE = 1e-3


# ---------------------------------------------------------------------------------------------
# pairs built by hand: the rewrite of the multi-pattern merges


def _model(
    nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[str], inits: list[Any]
) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "pair", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def parallel_matmuls(m: int, k: int, n: int, branches: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``branches`` MatMuls reading one input vs one MatMul with concatenated weights + Split."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((k, n)).astype(np.float32) for _ in range(branches)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (m, k))
    outs = [f"y{i}" for i in range(branches)]
    sep = _model(
        [helper.make_node("MatMul", ["x", f"w{i}"], [o]) for i, o in enumerate(outs)],
        [x],
        outs,
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)],
    )
    split = numpy_helper.from_array(np.array([n] * branches, dtype=np.int64), "sizes")
    merged = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Split", ["y", "sizes"], outs, axis=1),
        ],
        [x],
        outs,
        [numpy_helper.from_array(np.concatenate(ws, axis=1), "w"), split],
    )
    return sep, merged


def parallel_convs(c: int, hw: int, o: int, branches: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``branches`` 1x1 Convs reading one input vs one Conv with stacked filters + Split."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((o, c, 1, 1)).astype(np.float32) for _ in range(branches)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c, hw, hw))
    outs = [f"y{i}" for i in range(branches)]
    sep = _model(
        [helper.make_node("Conv", ["x", f"w{i}"], [out]) for i, out in enumerate(outs)],
        [x],
        outs,
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)],
    )
    split = numpy_helper.from_array(np.array([o] * branches, dtype=np.int64), "sizes")
    merged = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["y"]),
            helper.make_node("Split", ["y", "sizes"], outs, axis=1),
        ],
        [x],
        outs,
        [numpy_helper.from_array(np.concatenate(ws, axis=0), "w"), split],
    )
    return sep, merged


MATMUL_SIZES = [
    (1, 64, 64, 3),
    (4, 128, 128, 3),
    (16, 256, 256, 2),
    (32, 512, 512, 3),
    (64, 256, 1024, 2),
    (128, 1024, 1024, 3),
    (256, 256, 64, 4),
    (1, 1024, 1024, 2),
    (8, 64, 2048, 3),
    (8, 64, 2048, 2),  # the pair tests/test_calibration.py expects not to be merged
]
CONV_SIZES = [(16, 28, 16, 3), (64, 14, 64, 2), (64, 56, 64, 3), (256, 7, 256, 2), (32, 28, 128, 2)]


# ---------------------------------------------------------------------------------------------
# measuring and predicting


@dataclass
class Pair:
    name: str
    kind: str
    a: onnx.ModelProto
    b: onnx.ModelProto
    predicted_a_us: float = 0.0
    predicted_b_us: float = 0.0
    measured: dict[str, Any] | None = None
    retimed: bool = False

    @property
    def predicted_ratio(self) -> float:
        return self.predicted_a_us / self.predicted_b_us

    @property
    def measured_ratio(self) -> float:
        assert self.measured is not None
        return float(self.measured["ratio"])

    @property
    def counts(self) -> bool:
        return abs(self.measured_ratio - 1.0) > MIN_DIFF

    @property
    def settled(self) -> bool:
        """The whole 95% interval lies outside the 5% band: the pair counts whatever the noise."""
        assert self.measured is not None
        return self.measured["ci_high"] < 1.0 - MIN_DIFF or self.measured["ci_low"] > 1.0 + MIN_DIFF

    @property
    def spans_one(self) -> bool:
        assert self.measured is not None
        return self.measured["ci_low"] <= 1.0 <= self.measured["ci_high"]

    @property
    def sign_ok(self) -> bool:
        """The predicted ratio is on the measured side of 1; a predicted tie (the model sees no
        difference, e.g. the optimizer changed nothing it prices) is never a correct sign."""
        if abs(self.predicted_ratio - 1.0) < PREDICTED_TIE:
            return False
        return (self.predicted_ratio > 1.0) == (self.measured_ratio > 1.0)


RETRY_FACTOR = 2
"""A pair that counts (measured difference > 5%) with an interval spanning 1 is timed again with
this many times the rounds, and the longer run replaces the first."""
RETRY_MAX_MS = 100.0
"""Only pairs whose model runs below this are re-timed (a light model at 1 s a call would add
minutes; the whole benchmark is meant to run within 12 minutes on a quiet machine)."""


def measure_pair(pair: Pair, threads: int, rounds: int) -> None:
    from onnxsat.latency import compare_models
    from onnxsat.verification import make_inputs

    feeds = make_inputs(pair.a, seed=0)
    probe = compare_models(pair.a, pair.b, feeds, threads=threads, rounds=2, calls_per_round=1)
    calls = 1 if probe.baseline_ms > 20 else 5
    pair.measured = compare_models(
        pair.a, pair.b, feeds, threads=threads, rounds=rounds, calls_per_round=calls
    ).to_dict()
    if pair.counts and pair.spans_one and pair.measured["baseline_ms"] <= RETRY_MAX_MS:
        print(f"  interval spans 1: again with {RETRY_FACTOR * rounds} rounds", file=sys.stderr, flush=True)
        pair.measured = compare_models(
            pair.a, pair.b, feeds, threads=threads, rounds=RETRY_FACTOR * rounds, calls_per_round=calls
        ).to_dict()
        pair.retimed = True


def merge_pairs() -> list[Pair]:
    """The multi-pattern merges at every size: parallel MatMuls and 1x1 Convs, separate vs merged."""
    pairs = [Pair(f"matmul m{m} k{k} n{n} x{b}", "merge", *parallel_matmuls(m, k, n, b)) for m, k, n, b in MATMUL_SIZES]
    pairs += [Pair(f"conv1x1 c{c} hw{hw} o{o} x{b}", "merge", *parallel_convs(c, hw, o, b)) for c, hw, o, b in CONV_SIZES]
    return pairs


def light_models() -> list[Path]:
    return sorted(
        (Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light").glob("*.onnx")
    )


def model_pairs(only: str | None) -> list[Pair]:
    """Each light model and example vs its onnxsat.optimize output (default options)."""
    from onnxsat.base.options import Options
    from onnxsat.pipeline import optimize

    pairs = []
    for path in light_models() + sorted(EXAMPLES.glob("*.onnx")):
        name = path.stem
        if only and not any(part in name for part in only.split(",")):
            continue
        print(f"optimizing {name} ...", file=sys.stderr, flush=True)
        model = onnx.load(str(path))
        try:
            optimized, _ = optimize(model, Options())
        except Exception as exc:  # a model the optimizer refuses is reported, not fatal
            print(f"  skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", file=sys.stderr)
            continue
        pairs.append(Pair(name, "optimize", model, optimized))
    return pairs


# ---------------------------------------------------------------------------------------------
# report


def render(cal: Any, pairs: list[Pair], threads: int, seconds: float) -> tuple[str, bool]:
    import onnxruntime as ort

    lines = [
        "# Cost-model calibration: predicted vs measured (onnxruntime, CPU)",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; onnxruntime {ort.__version__},"
        f" Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs (shared with other"
        f" jobs; load average {os.getloadavg()[1]:.1f} over the last 5 minutes); intra-op threads {threads};"
        f" `python benchmarks/calibration.py`; {seconds:.0f} s in total.",
        "",
        f"Calibration: {len(cal.measured)} single-node models timed in {cal.seconds:.1f} s; fixed cost per call"
        f" {cal.baseline_us:.1f} us. Per-node error = |predicted - measured| / measured of the node's own time"
        " (call time minus the empty model's).",
        "",
        "## Per node, held-out shapes (not used in the fit)",
        "",
        "| op | class | measured (us) | predicted (us) | error |",
        "|---|---|---:|---:|---:|",
    ]
    for m in cal.held_out():
        lines.append(
            f"| {m.sample.label} | {m.sample.cls} | {m.node_us:.2f} | {m.predicted_us:.2f} | {m.rel_error:.1%} |"
        )
    node_err = cal.median_error(True)
    lines += [
        "",
        f"Median relative error: held-out {node_err:.1%} (fit shapes {cal.median_error(False):.1%}).",
        "",
        "Fitted constants:",
        "",
        "| class | peak GFLOP/s | bandwidth GB/s | spills above (KiB) | spill GB/s | overhead us"
        " | per extra output us | reorder GB/s | reorder spill factor | unblocked conv GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cls, c in sorted(cal.cost.classes.items()):
        lines.append(
            f"| {cls} | {c.peak_gflops:.3g} | {c.bandwidth_gbs:.3g} | {c.cache_bytes / 1024:.0f}"
            f" | {c.spill_gbs:.3g} | {c.overhead_us:.2f} | {c.output_us:.2f} | {c.reorder_gbs:.3g}"
            f" | {c.reorder_spill:.3g} | {c.unblocked_gflops:.3g} |"
        )
    lines += [
        "",
        f"Fixed cost of one inference call {cal.cost.run_overhead_us:.2f} us; handing back one graph output"
        f" {cal.cost.graph_output_us:.2f} us; a metadata-only op {cal.cost.view_overhead_us:.2f} us. The"
        " overhead is one dispatch inside a model (measured on chains of tiny nodes, the same for every"
        " class) and a Split's per-output cost what a tiny Split takes beyond it. Time of a node = overhead x dispatches + extra outputs x"
        " per-output cost + max(FLOPs / peak, bytes / bandwidth, or bytes / spill bandwidth when"
        " they exceed the cache size) + reorder bytes / reorder bandwidth + FLOPs of an unblocked conv"
        " / its rate (`onnxsat.extract.cost.ClassConstants`).",
    ]
    lines += [
        "",
        "## Pairs of equivalent models: does the model predict which one is faster?",
        "",
        "ratio = time(A) / time(B); above 1: B is faster. Measured: median over interleaved rounds with"
        " bootstrap 95% CI. Pairs with a measured difference of at most 5% do not count.",
        "",
        "| pair | kind | A measured (ms) | A predicted (ms) | B measured (ms) | B predicted (ms) | measured ratio"
        " [95% CI] | predicted ratio | counts | sign |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for p in pairs:
        assert p.measured is not None
        m = p.measured
        lines.append(
            f"| {p.name} | {p.kind} | {m['baseline_ms']:.3f} | {p.predicted_a_us / 1e3:.3f} | {m['candidate_ms']:.3f}"
            f" | {p.predicted_b_us / 1e3:.3f} | {m['ratio']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
            f" | {p.predicted_ratio:.3f} | {'yes' if p.counts else 'no'} | {'ok' if p.sign_ok else 'WRONG'} |"
        )
    counted = [p for p in pairs if p.counts]
    sign_rate = sum(p.sign_ok for p in counted) / len(counted) if counted else float("nan")
    model_errs = []
    for p in pairs:
        assert p.measured is not None
        model_errs.append(abs(p.predicted_a_us / 1e3 - p.measured["baseline_ms"]) / p.measured["baseline_ms"])
        model_errs.append(
            abs(p.predicted_b_us / 1e3 - p.measured["candidate_ms"]) / p.measured["candidate_ms"]
        )
    model_err = statistics.median(model_errs) if model_errs else float("nan")
    settled = [p for p in counted if p.measured is not None and p.measured["verdict"] != "tie"]
    outside = [p for p in pairs if p.settled]
    lines += [
        "",
        f"Sign correct in {sum(p.sign_ok for p in counted)} of {len(counted)} pairs that differ by more than 5%"
        f" ({sign_rate:.0%}). Of those, the {len(settled)} whose 95% CI also excludes a tie (whole interval"
        f" above 1.02 or below 0.98, `onnxsat.latency`'s verdict): {sum(p.sign_ok for p in settled)} correct."
        f" Pairs whose whole 95% CI lies outside the 5% band: {len(outside)}, sign correct in"
        f" {sum(p.sign_ok for p in outside)}. Pairs re-timed with {RETRY_FACTOR}x the rounds because they"
        f" counted with an interval spanning 1: {sum(p.retimed for p in pairs)}.",
        "",
        f"Whole-model error: median |predicted - measured| / measured over the {len(model_errs)} models timed above:"
        f" {model_err:.1%}.",
        "",
        "## Floors",
        "",
        "| floor | measured | result |",
        "|---|---:|---|",
    ]
    ok_node = node_err <= FLOOR_NODE_ERROR
    ok_sign = bool(counted) and sign_rate >= FLOOR_SIGN
    lines.append(
        f"| per-node median relative error, held-out shapes <= {FLOOR_NODE_ERROR:.0%} | {node_err:.1%}"
        f" | {'PASS' if ok_node else 'FAIL'} |"
    )
    lines.append(
        f"| sign of the difference on pairs differing > 5%, >= {FLOOR_SIGN:.0%} | {sign_rate:.0%} of {len(counted)}"
        f" | {'PASS' if ok_sign else 'FAIL'} |"
    )
    return "\n".join(lines) + "\n", ok_node and ok_sign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Calibrated cost model vs onnxruntime measurements.")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    parser.add_argument("--profile-out", type=Path, default=None, help="also save the fitted profile here")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per pair (default 30)")
    parser.add_argument("--seconds", type=float, default=20.0, help="calibration timing budget (default 20)")
    parser.add_argument("--no-models", action="store_true", help="skip light models and examples")
    parser.add_argument(
        "--only", default=None, help="only models whose name contains one of these comma-separated texts"
    )
    args = parser.parse_args(argv)

    from onnxsat.calibrate import calibrate, predict_model_us
    from onnxsat.extract.profile import save_profile

    start = time.perf_counter()
    print("calibrating ...", file=sys.stderr, flush=True)
    cal = calibrate(threads=args.threads, seconds=args.seconds)
    if args.profile_out is not None:
        save_profile(cal.cost, args.profile_out, cal.report())
    pairs = merge_pairs()
    if not args.no_models:
        pairs += model_pairs(args.only)
    timed = []
    for pair in pairs:
        print(f"timing {pair.name} ...", file=sys.stderr, flush=True)
        try:
            pair.predicted_a_us = predict_model_us(pair.a, cal.cost)
            pair.predicted_b_us = predict_model_us(pair.b, cal.cost)
            measure_pair(pair, args.threads, args.rounds)
        except Exception as exc:  # e.g. a custom-domain op onnxruntime cannot run: reported, not fatal
            print(f"  skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
            continue
        timed.append(pair)
    text, ok = render(cal, timed, args.threads, time.perf_counter() - start)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
