"""Does the onnxsat-cpu cost model predict what onnxsat's compiled kernels measure? (issue 20, floor 3)

1. Calibrate ``--cost-target onnxsat-cpu``: every calibration sample compiled by onnxsat and run
   as one native call (``onnxsat.calibrate``); per-node error on the held-out shapes.
2. Corpus models (static shapes, files up to ``--max-mb``): each optimized as ``onnxsat.compile``
   optimizes with ``CompileOptions(cost_target="onnxsat-cpu")``, under the calibrated profile,
   compiled, timed as calibration times (low percentile of calls spread over
   interleaved rounds) and priced (``calibrate.predict_model_us`` of the optimized model: the sum
   of its nodes' costs with the lowering's fusions, plus the fixed cost of a call). Floor: each
   within 25% of the measured latency.
3. Pairs of equivalent programs (``calibration.py``'s merges: parallel MatMuls or 1x1 Convs
   reading one input vs one wide op + Split), compiled both ways, timed in interleaved rounds
   (median, bootstrap 95% CI; a pair that differs by more than 5% with an interval spanning 1 is
   timed again with twice the rounds) and priced. Floor: among pairs whose measured latency
   differs by more than 5%, the faster one predicted in >= 85%.

    python benchmarks/calibration_compiled.py --corpus /work/realmodels-full --threads 2 \
        --out benchmarks/results/calibration_compiled.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import MIN_DIFF, RETRY_FACTOR, Pair, merge_pairs  # noqa: E402

FLOOR_MODEL_ERROR = 0.25
FLOOR_SIGN = 0.85


def corpus_models(corpus: Path, max_mb: float, only: list[str]) -> dict[str, Path]:
    """Static-shape corpus models up to ``max_mb`` (dynamic ones price symbolic dims as 1)."""
    index = json.loads((corpus / "INDEX.json").read_text())
    chosen = {}
    for name, entry in sorted(index.items()):
        if entry.get("error") or entry.get("shapes") != "static" or entry.get("bytes", 0) > max_mb * 1e6:
            continue
        if only and not any(part in name for part in only):
            continue
        chosen[name] = corpus / entry["file"]
    return chosen


def time_compiled(models: dict[str, onnx.ModelProto], threads: int, seconds: float) -> dict[str, float]:
    """Microseconds per call of each model compiled as it is, timed as calibration times."""
    from onnxsat.calibrate import runner, time_runs

    runs = [runner(m, threads, "onnxsat-cpu") for m in models.values()]
    return dict(zip(models, time_runs(runs, seconds=seconds), strict=True))


def measure_pair(pair: Pair, threads: int, rounds: int) -> None:
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.latency import compare_latency
    from onnxsat.verification import make_inputs

    feeds = make_inputs(pair.a, seed=0)
    a = CompiledModel(pair.a, CompileOptions(threads=threads))
    b = CompiledModel(pair.b, CompileOptions(threads=threads))
    pair.measured = compare_latency(lambda: a(feeds), lambda: b(feeds), rounds=rounds, calls_per_round=5).to_dict()
    if pair.counts and pair.spans_one:  # as calibration.py: a counted pair the noise may have flipped
        print(f"  interval spans 1: again with {RETRY_FACTOR * rounds} rounds", file=sys.stderr, flush=True)
        pair.measured = compare_latency(
            lambda: a(feeds), lambda: b(feeds), rounds=RETRY_FACTOR * rounds, calls_per_round=5
        ).to_dict()
        pair.retimed = True
    a.close()
    b.close()


def render(cal: Any, models: list[dict[str, Any]], pairs: list[Pair], args: argparse.Namespace, seconds: float) -> tuple[str, bool]:
    load_start, load_end = args.load_start, os.getloadavg()[0]
    lines = [
        "# onnxsat-cpu cost model: predicted vs measured (onnxsat's compiled CPU kernels)",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; {platform.processor() or platform.machine()},"
        f" {os.cpu_count()} CPUs; load average {load_start:.2f} at the start, {load_end:.2f} at the end;"
        f" threads {args.threads}; `python benchmarks/calibration_compiled.py --corpus {args.corpus}"
        f" --threads {args.threads}`; {seconds:.0f} s in total.",
        "",
        f"Calibration: {len(cal.measured)} single-node models compiled and timed in {cal.seconds:.1f} s; fixed"
        f" cost per call {cal.baseline_us:.1f} us; median per-node error on held-out shapes"
        f" {cal.median_error(True):.1%} (fit shapes {cal.median_error(False):.1%}).",
        "",
        "| class | peak GFLOP/s | bandwidth GB/s | spills above (KiB) | spill GB/s | overhead us | compute and memory |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for cls, c in sorted(cal.cost.classes.items()):
        lines.append(
            f"| {cls} | {c.peak_gflops:.3g} | {c.bandwidth_gbs:.3g} | {c.cache_bytes / 1024:.0f}"
            f" | {c.spill_gbs:.3g} | {c.overhead_us:.2f} | {'add' if c.additive else 'overlap'} |"
        )
    lines += [
        "",
        "## Corpus models, optimized for onnxsat-cpu and compiled",
        "",
        "| model | nodes | measured (ms) | predicted (ms) | predicted / measured | within 25% |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in models:
        ratio = row["predicted_us"] / row["measured_us"]
        lines.append(
            f"| {row['name']} | {row['nodes']} | {row['measured_us'] / 1e3:.3f} | {row['predicted_us'] / 1e3:.3f}"
            f" | {ratio:.2f} | {'yes' if abs(ratio - 1) <= FLOOR_MODEL_ERROR else 'no'} |"
        )
    within = sum(abs(r["predicted_us"] / r["measured_us"] - 1) <= FLOOR_MODEL_ERROR for r in models)
    lines += [
        "",
        "## Pairs of equivalent programs, compiled both ways",
        "",
        "ratio = time(A) / time(B), A the separate ops, B the merge; above 1: B is faster.",
        "",
        "| pair | A measured (ms) | A predicted (ms) | B measured (ms) | B predicted (ms) | measured ratio [95% CI]"
        " | predicted ratio | counts | sign |",
        "|---|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for p in pairs:
        m = p.measured
        assert m is not None
        lines.append(
            f"| {p.name} | {m['baseline_ms']:.3f} | {p.predicted_a_us / 1e3:.3f} | {m['candidate_ms']:.3f}"
            f" | {p.predicted_b_us / 1e3:.3f} | {m['ratio']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
            f" | {p.predicted_ratio:.3f} | {'yes' if p.counts else 'no'} | {'ok' if p.sign_ok else 'WRONG'} |"
        )
    counted = [p for p in pairs if p.counts]
    sign_rate = sum(p.sign_ok for p in counted) / len(counted) if counted else float("nan")
    ok_models = bool(models) and within == len(models)
    ok_sign = bool(counted) and sign_rate >= FLOOR_SIGN
    significant = [p for p in counted if p.measured is not None and not p.spans_one]
    lines += [
        "",
        f"Of the {len(counted)} pairs that differ by more than {MIN_DIFF:.0%}, {len(significant)} have a 95% CI that"
        f" excludes 1 (the others stayed ambiguous after {sum(p.retimed for p in pairs)} re-timings with"
        f" {RETRY_FACTOR}x the rounds): sign correct in {sum(p.sign_ok for p in significant)} of them.",
        "",
        "## Floors",
        "",
        "| floor | measured | result |",
        "|---|---:|---|",
        f"| every corpus model within {FLOOR_MODEL_ERROR:.0%} | {within} of {len(models)} | {'PASS' if ok_models else 'FAIL'} |",
        f"| sign on pairs differing > {MIN_DIFF:.0%}, >= {FLOOR_SIGN:.0%} | {sign_rate:.0%} of {len(counted)}"
        f" | {'PASS' if ok_sign else 'FAIL'} |",
    ]
    return "\n".join(lines) + "\n", ok_models and ok_sign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="onnxsat-cpu cost model vs onnxsat's compiled kernels.")
    parser.add_argument("--corpus", type=Path, required=True, help="the exported corpus (INDEX.json)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the compiled models (default 2)")
    parser.add_argument("--seconds", type=float, default=20.0, help="calibration timing budget (default 20)")
    parser.add_argument("--model-seconds", type=float, default=20.0, help="corpus timing budget (default 20)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per pair (default 30)")
    parser.add_argument("--max-mb", type=float, default=150.0, help="skip model files larger than this")
    parser.add_argument("--only", action="append", default=[], help="only models whose name contains this")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    args.load_start = os.getloadavg()[0]

    import tempfile

    from onnxsat.base.options import Options
    from onnxsat.calibrate import calibrate, predict_model_us
    from onnxsat.compiler import optimize_options
    from onnxsat.extract.profile import save_profile
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.pipeline import optimize

    start = time.perf_counter()
    print("calibrating ...", file=sys.stderr, flush=True)
    cal = calibrate("onnxsat-cpu", threads=args.threads, seconds=args.seconds)
    profile = Path(tempfile.mkdtemp()) / "onnxsat-cpu.json"
    save_profile(cal.cost, profile)
    # what onnxsat.compile optimizes with (the model's own opset kept: no fused kinds the lowering lacks)
    options = optimize_options(
        Options(cost_profile=str(profile), verify=False), CompileOptions(cost_target="onnxsat-cpu")
    )
    optimized: dict[str, onnx.ModelProto] = {}
    for name, path in corpus_models(args.corpus, args.max_mb, args.only).items():
        print(f"optimizing {name} ...", file=sys.stderr, flush=True)
        optimized[name], _ = optimize(onnx.load(str(path)), options)
    print("timing the corpus models ...", file=sys.stderr, flush=True)
    measured = time_compiled(optimized, args.threads, args.model_seconds)
    rows = [
        {
            "name": name,
            "nodes": len(model.graph.node),
            "measured_us": measured[name],
            "predicted_us": predict_model_us(model, cal.cost),
        }
        for name, model in optimized.items()
    ]
    pairs = merge_pairs()
    for pair in pairs:
        print(f"timing {pair.name} ...", file=sys.stderr, flush=True)
        pair.predicted_a_us = predict_model_us(pair.a, cal.cost)
        pair.predicted_b_us = predict_model_us(pair.b, cal.cost)
        measure_pair(pair, args.threads, args.rounds)
    text, ok = render(cal, rows, pairs, args, time.perf_counter() - start)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
