"""``onnxsat compile MODEL --target cpu [--bench] [--profile]``: compile, check against onnxruntime, time.

The compiled model is always checked against the original on onnxruntime with seeded random
inputs (a mismatch exits with status 3); ``--bench`` adds an interleaved latency comparison
(``onnxsat.latency``) against onnxruntime at ORT_ENABLE_ALL with the same thread count;
``--profile`` times each step of the compiled run (``kernels.step_profile``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from onnxsat.base.errors import BadInputError, VerificationError
from onnxsat.kernels.compile_options import COST_TARGETS, CompileOptions


def check_outputs(model: Any, expected: dict[str, Any], got: dict[str, np.ndarray], what: str) -> dict[str, float]:
    """Each output's max abs error to onnxruntime's; ``VerificationError`` when one is beyond what
    optimize's verification allows for it (``verification.compare_values``: the tolerance of the
    least precise float type it is computed in, so a float16 model is held to float16's)."""
    from onnxsat.verification import compare_values, weakest_float_types

    weakest = weakest_float_types(model)
    errors: dict[str, float] = {}
    for name, want in expected.items():
        check = compare_values(name, want, got[name], weakest.get(name))
        errors[name] = check.max_abs_err
        if not check.ok:
            raise VerificationError(name, check.max_abs_err, f"{what} differs from onnxruntime: {check.detail}")
    return errors


def add_parser(sub: Any) -> None:
    """Register the ``compile`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        "compile",
        help="compile a model to native CPU kernels, check it against onnxruntime, optionally time it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", metavar="INPUT", help="the ONNX model to compile (read only)")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"], help="code generation target (default: cpu)")
    p.add_argument("--emit-ptx", metavar="DIR", default=None, help="cuda: write one .ptx per kernel and manifest.json to DIR (no GPU needed)")
    p.add_argument("--emit-check", action="store_true", help="cuda, with --emit-ptx: also write inputs and expected CPU values for benchmarks/gpu_check.py")
    p.add_argument("--arch", default="sm_90", help="cuda: PTX target architecture (default: sm_90; also sm_80, sm_86, sm_89)")
    p.add_argument("--bench", action="store_true", help="time the compiled model against onnxruntime")
    p.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds for --bench (default: 30)")
    p.add_argument("--profile", type=int, nargs="?", const=15, default=None, metavar="TOP", help="time each step of the compiled run (as it runs, all threads) and print the TOP slowest (default: 15)")
    p.add_argument("--threads", type=int, default=None, help="threads for both sides (default: all cores)")
    p.add_argument("--opt-level", type=int, default=3, choices=[0, 1, 2, 3], help="LLVM optimization level (default: 3)")
    p.add_argument("--gemm", default="llvm", choices=["llvm", "blas"], help="products with constant weights: onnxsat's micro-kernel (llvm, default) or OpenBLAS")
    p.add_argument("--no-epilogues", action="store_true", help="no bias (+ ReLU) epilogues in the GEMM micro-kernel (separate kernels)")
    p.add_argument("--jobs", type=int, default=None, help="processes compiling kernels in parallel (default: the cores, at most 8)")
    p.add_argument("--cache-dir", default=None, help="compiled-code cache directory (default: ~/.cache/onnxsat/kernels)")
    p.add_argument("--no-cache", action="store_true", help="compile everything, read and write no compiled-code cache")
    p.add_argument("--cost-target", default=None, choices=list(COST_TARGETS), help="cost model the optimizer extracts under (default: onnxsat-cpu, the compiled kernels')")
    p.add_argument("--no-optimize", action="store_true", help="lower the model as given (skip onnxsat optimize)")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="fix an input's shape (repeatable); needed for symbolic dims",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition(":")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(",") if d)
        except ValueError as exc:
            raise BadInputError(f"bad --input-shape {spec!r} (want NAME:D1,D2,...)") from exc
        if not name:
            raise BadInputError(f"bad --input-shape {spec!r} (want NAME:D1,D2,...)")
    return shapes


def pin_input_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> Any:
    """A copy of ``model`` whose listed inputs have the given static shapes."""
    import onnx

    if not shapes:
        return model
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    for vi in pinned.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                dims.add().dim_value = d
    return pinned


def compile_options(args: argparse.Namespace) -> CompileOptions:
    """The ``CompileOptions`` the command-line flags ask for."""
    try:
        return CompileOptions(
            threads=args.threads or os.cpu_count() or 1,
            opt_level=args.opt_level,
            gemm=args.gemm,
            epilogues=not args.no_epilogues,
            cache=not args.no_cache,
            cache_dir=args.cache_dir,
            jobs=args.jobs,
            cost_target=args.cost_target,
        )
    except ValueError as exc:
        raise BadInputError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    from onnxsat.base.modelio import load_model
    from onnxsat.base.options import Options
    from onnxsat.kernels.step_profile import format_profile
    from onnxsat.latency import compare_latency, ort_session
    from onnxsat.verification import make_inputs

    from .compiler import compile_model

    if args.target == "cuda":
        from .compile_cuda_command import run_cuda

        return run_cuda(args)
    if args.emit_ptx or args.emit_check:
        raise BadInputError("--emit-ptx/--emit-check need --target cuda")
    model = pin_input_shapes(load_model(args.input), parse_input_shapes(args.input_shape))
    options = compile_options(args)
    threads = options.run_threads
    compiled = compile_model(model, args.target, Options(), options, optimize=not args.no_optimize)
    feeds = make_inputs(model, seed=0)
    session = ort_session(model, level="all", threads=threads)
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    errors = check_outputs(model, expected, compiled(feeds), "compiled model")
    stats = compiled.stats(feeds)
    result: dict[str, Any] = {
        "model": args.input,
        "target": args.target,
        "kernels": stats.kernels,
        "blas_calls": stats.blas_calls,
        "fallbacks": stats.fallbacks,
        "arena_bytes": stats.arena_bytes,
        "compile_seconds": round(stats.compile_seconds, 3),
        "compile_stage_seconds": {k: round(v, 3) for k, v in stats.stage_seconds.items()},
        "artefact_cache_hit": stats.artefact_hit,
        "one_native_call": stats.one_native_call,
        "max_abs_error": errors,
    }
    if args.bench:
        cmp = compare_latency(lambda: session.run(None, feeds), lambda: compiled(feeds), rounds=args.rounds)
        result["latency"] = {"onnxruntime_ms": cmp.baseline_ms, "compiled_ms": cmp.candidate_ms, **cmp.to_dict()}
    phases = compiled.profile(feeds, runs=max(args.rounds, 1)) if args.profile is not None else None
    if phases is not None:
        result["profile"] = [{"steps": list(p.steps), "tasks": p.tasks, "median_us": round(p.median_us, 2), "gflops": round(p.gflops, 1)} for p in phases]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"compiled {args.input} for {args.target}: {stats.kernels} kernels, {stats.blas_calls} BLAS calls, arena {stats.arena_bytes} bytes")
        print(f"numpy fallbacks: {stats.fallbacks or 'none'}")
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in stats.stage_seconds.items())
        cached = " (compiled artefact from the cache)" if stats.artefact_hit else ""
        print(f"compile stage {stats.compile_seconds:.2f} s{cached}: {stages}")
        print("matches onnxruntime: " + ", ".join(f"{k} (max abs err {v:.2e})" for k, v in errors.items()))
        if args.bench:
            print(f"latency vs onnxruntime (ORT_ENABLE_ALL, {threads} threads): {cmp}")
        if phases is not None:
            print(f"where a run's time goes ({threads} threads, median of {max(args.rounds, 1)} runs):")
            print(format_profile(phases, top=args.profile))
    sys.stdout.flush()
    return 0
