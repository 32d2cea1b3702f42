"""Per conv form, the compiled CNN's step times with the conv products on OpenBLAS
(``gemm="blas"``: bias and activation in kernels of their own) and on the micro-kernel with fused
epilogues (``gemm="llvm"``), each step's minimum over interleaved rounds (the Python step loop, 2 threads):
on a loaded machine the minimum is the step's own cost, without the preemption a whole run sees.

    python benchmarks/conv_steps_ab.py resnet18-ts-static --rounds 20
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv_profile import conv_forms  # noqa: E402


def main() -> None:
    from onnxsat.base.modelio import load_model
    from onnxsat.kernels.blas import single_threaded_blas
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.lowering.program import KernelStep, MatMulStep

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--corpus", type=Path, default=Path("/work/realmodels-full"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    single_threaded_blas()
    model = load_model(str(args.corpus / f"{args.model}.onnx"))
    sigs = conv_forms(onnx.load(str(args.corpus / f"{args.model}.onnx")))["__sigs__"]  # type: ignore[index]
    x = model.graph.input[0]
    feeds = {x.name: np.random.default_rng(0).standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.float32)}
    per: dict[str, dict[str, float]] = {}
    runs = {}
    for gemm in ("blas", "llvm"):
        compiled = CompiledModel(model, CompileOptions(threads=args.threads, gemm=gemm))
        exe = compiled.executable_for(feeds)
        arrays = dict(exe.fixed)
        arrays.update({b.name: feeds[n] for n, b in exe.program.inputs})
        exe.run_steps(arrays)
        runs[gemm] = (compiled, exe, arrays, np.full(len(exe.runners), np.inf))
    for _ in range(args.rounds):  # the two forms interleaved, round by round
        for _, exe, arrays, best in runs.values():
            for i, run in enumerate(exe.runners):
                t0 = time.perf_counter()
                run(arrays)
                best[i] = min(best[i], time.perf_counter() - t0)
    for gemm, (compiled, exe, _, best) in runs.items():
        groups: dict[str, float] = defaultdict(float)
        for step, t in zip(exe.program.steps, best, strict=True):
            if isinstance(step, MatMulStep):
                m, k, n = step.a.shape[-2], step.a.shape[-1], step.b.shape[-1]
                key = f"conv {sigs.get((m, k, n), 'matmul')}"
            elif isinstance(step, KernelStep):
                name = step.kernel.name
                key = "direct conv" if "conv_" in name else "im2col" if "im2col" in name else "pad" if name.startswith("pad_") else "other kernels"
            else:
                key = "fallback"
            groups[key] += float(t) * 1e3
        groups["total (steps)"] = float(best.sum()) * 1e3
        per[gemm] = groups
        compiled.close()
    keys = sorted(set(per["blas"]) | set(per["llvm"]), key=lambda k: -per["blas"].get(k, 0.0))
    print(f"{args.model}: step minima over {args.rounds} rounds, ms (blas = before, llvm = after)")
    for key in keys:
        a, b = per["blas"].get(key, 0.0), per["llvm"].get(key, 0.0)
        print(f"  {key:24s} {a:8.3f} {b:8.3f}  x{a / b if b else float('inf'):.2f}")


if __name__ == "__main__":
    main()
