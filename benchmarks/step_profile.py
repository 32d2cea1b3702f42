"""Where a compiled model's time goes, step by step, next to onnxruntime's per-node profile.

For one model of ``compiled_vs_ort.py`` (default: the BERT-base layer at sequence 512): each step
of the CompiledModel (kernel, GEMM, fallback) is timed on its own, in the Python step loop, median
over ``--rounds`` (the step loop adds a pool hand-off per parallel kernel that the one native call
of a real run does not pay, so small steps read high); ``--single`` also times every kernel alone
on one thread (no hand-off: compute and memory only). onnxruntime runs with profiling on
(ORT_ENABLE_ALL, same threads) and its per-node kernel times are medians over the same rounds.
Both tables end with GEMM and non-GEMM totals. A diagnosis tool, not a latency claim: the ratio
of whole runs comes from ``compiled_vs_ort.py``.

    python benchmarks/step_profile.py                       # bert-512, 2 threads, 15 rounds
    python benchmarks/step_profile.py --model bert-128 --single
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compiled_vs_ort import MODELS, _feeds  # noqa: E402

GEMM_OPS = {"MatMul", "Gemm", "FusedMatMul", "Conv"}


def compiled_steps(name: str, threads: int, rounds: int, single: bool) -> list[tuple[str, bool, float, float | None]]:
    """(step name, is a GEMM, median ms in the step loop, median ms alone on one thread or None)."""
    from onnxsat.kernels.blas import restore_blas_threads, single_threaded_blas
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.lowering.program import KernelStep, MatMulStep

    model = MODELS[name]()
    feeds = _feeds(model)
    cm = CompiledModel(model, CompileOptions(threads=threads))
    cm(feeds)
    exe = cm.executable_for(feeds)
    arrays = dict(exe.fixed)
    for tensor, buf in exe.program.inputs:
        arrays[buf.name] = np.ascontiguousarray(feeds[tensor])
    for _, buf in exe.program.outputs:
        arrays[buf.name] = exe.io.get(buf.name, np.empty(buf.shape, np.float32))
    times: list[list[float]] = [[] for _ in exe.runners]
    previous = single_threaded_blas()
    try:
        for _ in range(rounds):
            for i, run in enumerate(exe.runners):
                start = time.perf_counter()
                run(arrays)
                times[i].append(time.perf_counter() - start)
    finally:
        restore_blas_threads(previous)
    rows = []
    for step, ts in zip(exe.program.steps, times, strict=True):
        alone = None
        if isinstance(step, KernelStep):
            label = step.kernel.name
            if single:
                k = step.kernel
                args = (ctypes.c_void_p * len(k.params))(*[arrays[b.name].ctypes.data for b in k.params])
                fn = exe.functions[k.name]
                solo = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    fn(args, 0, k.parallel_extent)
                    solo.append(time.perf_counter() - start)
                alone = float(np.median(solo)) * 1e3
        elif isinstance(step, MatMulStep):
            label = f"matmul {step.out.name} {step.a.shape} @ {step.b.shape}"
        else:
            label = f"fallback {step.node.op_type}"
        rows.append((label, isinstance(step, MatMulStep), float(np.median(ts)) * 1e3, alone))
    cm.close()
    return rows


def ort_nodes(name: str, threads: int, rounds: int) -> list[tuple[str, bool, float]]:
    """(node name and op, is a GEMM, median kernel ms) from onnxruntime's profiler."""
    import onnxruntime as ort

    model = MODELS[name]()
    feeds = _feeds(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="onnxsat-profile-") as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(rounds + 3):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations[(e["name"].removesuffix("_kernel_time"), e["args"].get("op_name", "?"))].append(e["dur"] / 1e3)
    return [(f"{node} ({op})", op in GEMM_OPS, float(np.median(d[3:] or d))) for (node, op), d in durations.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-512", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--single", action="store_true", help="also time each kernel alone on one thread")
    args = parser.parse_args(argv)
    print(f"{args.model}, {args.threads} threads, medians of {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print("\ncompiled steps (ms; step loop" + (", alone on one thread)" if args.single else ")"))
    totals = {True: 0.0, False: 0.0}
    for label, gemm, ms, alone in compiled_steps(args.model, args.threads, args.rounds, args.single):
        totals[gemm] += ms
        print(f"{ms:9.2f}" + (f" {alone:9.2f}" if alone is not None else "") + f"  {label}")
    print(f"GEMM {totals[True]:.2f} ms, other {totals[False]:.2f} ms")
    print("\nonnxruntime nodes (ms)")
    totals = {True: 0.0, False: 0.0}
    for label, gemm, ms in ort_nodes(args.model, args.threads, args.rounds):
        totals[gemm] += ms
        print(f"{ms:9.2f}  {label}")
    print(f"GEMM {totals[True]:.2f} ms, other {totals[False]:.2f} ms")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
