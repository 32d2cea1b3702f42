"""The real-model corpus compiled to native CPU kernels: compile time (cold and warm), correctness
against onnxruntime, whether a run is one native call, and latency against onnxruntime.

For every corpus model (export.py's INDEX.json; files over ``--max-mb`` are skipped) two fresh
processes run in turn, so nothing of one stage warms the next:

1. optimize (``onnxsat.optimize``, verified, under ``--cost-target``), then compile the optimized
   model with an empty cache directory: the *cold* compile stage (every kernel, the GEMM
   micro-kernel and the native runner compiled by LLVM), with its stage times;
2. compile the same optimized model again with that cache directory: the *warm* compile stage (a
   hit on the whole compiled artefact); then check the compiled model against onnxruntime on the
   original model (max |a-b| <= 1e-4 * max|ref| + 1e-6 per output, 1e-2 * max|ref| + 1e-4 for outputs
   computed in float16, or onnxruntime's own difference between ORT_ENABLE_ALL and ORT_DISABLE_ALL
   where larger, as on QDQ models; on the corpus's seeded feeds)
   and time it against onnxruntime ORT_ENABLE_ALL with the same threads (``onnxsat.latency``:
   interleaved rounds, each runtime settled before its block, bootstrap 95% intervals).

    python benchmarks/compiled_realmodels.py --corpus /work/realmodels-full --threads 2 --rounds 30
    python benchmarks/compiled_realmodels.py --quick          # the small committed exports, tests/data/realmodels

Writes benchmarks/results/compiled_realmodels.{md,json} (``--out``). Latency ratios only mean
something on a quiet machine: each row records the load average when it was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_peers import corpus_suite, geomean, machine_description  # noqa: E402
from compiled_vs_ort import SETTLE_S  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
QUICK_CORPUS = ROOT / "tests" / "data" / "realmodels"
RTOL, ATOL = 1e-4, 1e-6
"""An output is correct when max |a-b| <= RTOL * max|ref| + ATOL."""
FLOAT16_RTOL, FLOAT16_ATOL = 1e-2, 1e-4
"""The same for an output computed in float16 (~10 ulps; test_realmodels and optimize's verification
allow the same): two float16 runtimes differ by roundings far above 1e-4."""


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------------------
# child processes


def _compile(model: onnx.ModelProto, feeds: dict[str, np.ndarray], options: Any) -> tuple[Any, float]:
    from onnxsat.kernels.compiled import CompiledModel

    start = time.perf_counter()
    compiled = CompiledModel(model, options)
    compiled.executable_for(feeds)  # a model with symbolic dims compiles on its first signature
    return compiled, time.perf_counter() - start


def _stats(compiled: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    stats = compiled.stats(feeds)
    return {
        "stages": {k: round(v, 3) for k, v in stats.stage_seconds.items()},
        "artefact_hit": stats.artefact_hit,
        "kernels": stats.kernels,
        "one_native_call": stats.one_native_call,
        "fallbacks": stats.fallbacks,
    }


def child_cold(src: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Optimize, save the optimized model, compile it with an empty cache."""
    from onnxsat.base.modelio import load_model
    from onnxsat.base.options import Options
    from onnxsat.compiler import optimize_options
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.pipeline import optimize

    feeds = dict(np.load(work / "feeds.npz"))
    model = load_model(str(src))
    start = time.perf_counter()
    # the options onnxsat.compile optimizes with (the model's opset kept: see optimize_options)
    run_options = optimize_options(Options(target=args.cost_target, verify_samples=(feeds,)), CompileOptions())
    optimized, _ = optimize(model, run_options)
    optimize_s = time.perf_counter() - start
    options = CompileOptions(threads=args.threads, cache_dir=str(work / "cache"), jobs=args.jobs)
    compiled, seconds = _compile(optimized, feeds, options)
    # saved after compiling: saving with external data points the in-memory tensors at the file
    onnx.save(optimized, str(work / "optimized.onnx"), save_as_external_data=True, location="optimized.data")
    result = {
        "optimize_s": round(optimize_s, 2),
        "cold_s": round(seconds, 3),
        "cold": _stats(compiled, feeds),
        "load_cold": _load(),
    }
    compiled.close()
    return result


def child_warm(src: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Compile the optimized model again (cache warm), check it against onnxruntime, time it."""
    from onnx import TensorProto

    from onnxsat.base.modelio import load_model
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.latency import compare_latency, ort_session
    from onnxsat.verification import weakest_float_types

    feeds = dict(np.load(work / "feeds.npz"))
    optimized = onnx.load(str(work / "optimized.onnx"))
    weakest = weakest_float_types(load_model(str(src)))
    options = CompileOptions(threads=args.threads, cache_dir=str(work / "cache"), jobs=args.jobs)
    compiled, seconds = _compile(optimized, feeds, options)
    result: dict[str, Any] = {"warm_s": round(seconds, 3), "warm": _stats(compiled, feeds)}
    session = ort_session(load_model(str(src)), level="all", threads=args.threads)
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feeds), strict=True))
    unfused = ort_session(load_model(str(src)), level="disable", threads=args.threads)
    own = dict(zip(names, unfused.run(None, feeds), strict=True))
    got = compiled(feeds)
    errors = {}
    correct = True
    for name, ref in want.items():
        ref64, have = np.asarray(ref, np.float64), np.asarray(got[name], np.float64)
        err = float(np.max(np.abs(have - ref64))) if ref64.size else 0.0
        half = weakest.get(name) in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        rtol, atol = (FLOAT16_RTOL, FLOAT16_ATOL) if half else (RTOL, ATOL)
        bound = rtol * (float(np.max(np.abs(ref64))) if ref64.size else 0.0) + atol
        levels = float(np.max(np.abs(np.asarray(own[name], np.float64) - ref64))) if ref64.size else 0.0
        errors[name] = {"max_abs_err": err, "bound": max(bound, levels), "ort_levels_diff": levels}
        correct = correct and have.shape == ref64.shape and err <= max(bound, levels)
    result["errors"], result["correct"] = errors, correct
    if args.rounds:
        result["load_latency_start"] = _load()
        cmp = compare_latency(
            lambda: session.run(None, feeds), lambda: compiled(feeds), rounds=args.rounds, settle_s=SETTLE_S
        )
        result["latency"] = cmp.to_dict()
        result["load_latency_end"] = _load()
    compiled.close()
    return result


# ---------------------------------------------------------------------------------------------
# driver


def run_model(
    name: str, path: Path, feeds: dict[str, np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "mb": round(path.stat().st_size / 2**20, 1)}
    with tempfile.TemporaryDirectory(prefix="onnxsat-compiled-") as tmp:
        work = Path(tmp)
        np.savez(work / "feeds.npz", **feeds)
        for stage in ("cold", "warm"):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                stage,
                str(path),
                str(work),
                "--threads",
                str(args.threads),
                "--rounds",
                str(args.rounds),
                "--cost-target",
                args.cost_target,
            ]
            if args.jobs:
                cmd += ["--jobs", str(args.jobs)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            out = work / f"{stage}.json"
            if done.returncode != 0 or not out.exists():
                lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
                row["error"] = f"{stage}: exit {done.returncode}: {lines[-1][:300] if lines else ''}"
                return row
            row.update(json.loads(out.read_text()))
    return row


def _ratio_cell(row: dict[str, Any]) -> str:
    lat = row.get("latency")
    if not lat:
        return ""
    return f"{lat['baseline_ms']:.2f} | {lat['candidate_ms']:.2f} | x{lat['ratio']:.2f} [{lat['ci_low']:.2f}, {lat['ci_high']:.2f}]"


def render(rows: list[dict[str, Any]], header: dict[str, str]) -> str:
    lines = [
        "# Real-model corpus, compiled to native CPU kernels",
        "",
        f"Machine: {header['machine']}. Command: `{header['command']}`.",
        f"Threads {header['threads']} (both runtimes), {header['rounds']} interleaved rounds, cost target {header['cost_target']}, "
        f"measured {header['date']}; load average {header['load_start']} at start, {header['load_end']} at the end.",
        "",
        header.get("skipped", ""),
        "",
        f"Latency counts only when measured quiet (load average below the {os.cpu_count()} cores; the issue's floors are for a "
        "quiet machine): a loaded run's ratios and milliseconds say little. Rerun quietly with "
        "`python benchmarks/compiled_realmodels.py --corpus /work/realmodels-full --threads 2 --rounds 30`; "
        "`--render` rewrites the .md from the .json.",
        "",
        "Correct: max |a-b| <= 1e-4 * max|ref| + 1e-6 on every output against onnxruntime (the original model); "
        "1e-2 * max|ref| + 1e-4 for outputs computed in float16; or within onnxruntime's own difference between "
        "ORT_ENABLE_ALL and ORT_DISABLE_ALL where that is larger (a QDQ model: integer kernels against the "
        "float emulation differ by one quantization step). "
        "One call: the whole run is one native call (no numpy fallback). Compile times are the compile stage "
        "after optimize (cold: empty cache, every kernel, the GEMM micro-kernel and the native runner built; "
        "warm: a fresh process, the compiled artefact found in the cache). Ratio = onnxruntime time / compiled "
        "time (above 1: compiled faster), with its bootstrap 95% interval.",
        "",
        "| model | MB | optimize s | compile cold s | compile warm s | correct | one call | ORT ms | compiled ms | ratio [95% CI] | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mb']} | failed: {r['error']} | | | | | | | | |")
            continue
        warm = f"{r['warm_s']:.2f}" + ("" if r["warm"]["artefact_hit"] else " (miss)")
        one = "yes" if r["warm"]["one_native_call"] else f"no: {r['warm']['fallbacks']}"
        ratio = _ratio_cell(r) or " | | "
        load = r.get("load_latency_start", r.get("load_cold", ""))
        lines.append(
            f"| {r['model']} | {r['mb']} | {r['optimize_s']:.1f} | {r['cold_s']:.2f} | {warm} | "
            f"{'yes' if r['correct'] else 'NO'} | {one} | {ratio} | {load} |"
        )
    ratios = [r["latency"]["ratio"] for r in rows if "latency" in r]
    if ratios:
        lines += ["", f"Geometric mean of the ratios: x{geomean(ratios):.2f} over {len(ratios)} models."]
    lines += [
        "",
        "Cold compile stage by stage (seconds):",
        "",
        "| model | " + " | ".join(STAGES) + " |",
        "|---|" + "---|" * len(STAGES),
    ]
    for r in rows:
        if "cold" in r:
            lines.append(
                f"| {r['model']} | "
                + " | ".join(f"{r['cold']['stages'].get(s, 0):.2f}" for s in STAGES)
                + " |"
            )
    lines += [
        "",
        "hash: model digest (artefact key); lower: lowering to kernel IR; llvm_ir: LLVM IR built per distinct kernel; "
        "llvm_compile: optimization and code generation of the distinct kernels (parallel over the compile jobs); "
        "load: linking the objects; support: the GEMM micro-kernel and native runner (compiled once per machine "
        "and cache, so only on a cold cache); setup: task tables, packed weights, arena.",
    ]
    return "\n".join(lines) + "\n"


STAGES = ("hash", "lower", "llvm_ir", "llvm_compile", "load", "support", "setup")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="an export of benchmarks/realmodels/manifest.json (INDEX.json inside)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="the small committed exports (tests/data/realmodels)"
    )
    parser.add_argument("--only", nargs="*", default=[], help="models whose name contains one of these")
    parser.add_argument(
        "--max-mb", type=float, default=150.0, help="skip model files larger than this (default: 150)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--jobs", type=int, default=None, help="compile processes (default: CompileOptions' default)"
    )
    parser.add_argument("--rounds", type=int, default=30, help="interleaved latency rounds (0: no timing)")
    parser.add_argument("--cost-target", default="onnxsat-cpu", help="cost model optimize extracts under (default: the one onnxsat.compile uses)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per model stage")
    parser.add_argument("--out", type=Path, default=RESULTS / "compiled_realmodels")
    parser.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    parser.add_argument("--child", nargs=3, metavar=("STAGE", "MODEL", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        stage, src, work = args.child
        result = (child_cold if stage == "cold" else child_warm)(Path(src), Path(work), args)
        (Path(work) / f"{stage}.json").write_text(json.dumps(result))
        return 0
    if args.render:
        data = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(render(data["rows"], data["header"]))
        return 0
    corpus = QUICK_CORPUS if args.quick or args.corpus is None else args.corpus
    everything = corpus_suite(corpus, args.only)
    suite = [(n, p, f) for n, p, f in everything if p.stat().st_size <= args.max_mb * 2**20]
    skipped = sorted(n for n, p, _ in everything if p.stat().st_size > args.max_mb * 2**20)
    header = {
        "machine": machine_description(),
        "command": "python benchmarks/compiled_realmodels.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "threads": str(args.threads),
        "rounds": str(args.rounds),
        "cost_target": args.cost_target,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_start": str(_load()),
        "skipped": f"Over {args.max_mb:g} MB, not run: {', '.join(skipped) or 'none'}.",
    }
    rows = []
    for name, path, feeds in suite:
        print(f"{name} ...", flush=True)
        row = run_model(name, path, feeds, args)
        print(json.dumps(row), flush=True)
        rows.append(row)
    header["load_end"] = str(_load())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(render(rows, header))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
