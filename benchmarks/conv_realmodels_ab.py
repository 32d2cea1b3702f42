"""The real CNNs compiled with the conv GEMM on OpenBLAS (``gemm="blas"``: the im2col/input
product on OpenBLAS, bias and activation in a kernel of their own) and on onnxsat's micro-kernel
(``gemm="llvm"``: unpacked-B micro-kernel, bias and ReLU fused into the product), side by side with
onnxruntime (ORT_ENABLE_ALL) in interleaved rounds, with bootstrap 95% intervals of
ORT time / compiled time. The models are compiled as exported (no optimize step), so the two
compiled forms differ only in the conv products.

    python benchmarks/conv_realmodels_ab.py --corpus /work/realmodels-full --rounds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("mobilenet_v3_small-dynamo-static", "efficientnet_b0-ts-static", "resnet18-ts-static")
SETTLE_S = 0.2


def main() -> None:
    from onnxsat.base.modelio import load_model
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.latency import bootstrap_ratio_ci, ort_session

    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, default=Path("/work/realmodels-full"))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    for name in args.models:
        model = load_model(str(args.corpus / f"{name}.onnx"))
        x = model.graph.input[0]
        shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
        feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        session = ort_session(model, level="all", threads=args.threads)
        want = session.run(None, feeds)[0]
        with tempfile.TemporaryDirectory() as tmp:
            runs = {"ort": lambda session=session, feeds=feeds: session.run(None, feeds)}
            compiled = {}
            for gemm in ("blas", "llvm"):
                c = CompiledModel(model, CompileOptions(threads=args.threads, gemm=gemm, cache_dir=tmp))
                got = next(iter(c(feeds).values()))
                err = float(np.max(np.abs(got - want)))
                bound = 1e-4 * float(np.max(np.abs(want))) + 1e-6
                print(f"{name} {gemm}: max|a-b| {err:.2e} (bound {bound:.2e}) {'ok' if err <= bound else 'WRONG'}; one call {c.stats(feeds).one_native_call}")
                compiled[gemm] = c
                runs[gemm] = lambda c=c, feeds=feeds: c(feeds)
            for fn in runs.values():
                fn()
            times = {k: np.empty(args.rounds) for k in runs}
            load0 = os.getloadavg()[0]
            keys = list(runs)
            for r in range(args.rounds):
                order = keys[r % len(keys):] + keys[: r % len(keys)]
                for k in order:
                    time.sleep(SETTLE_S)
                    runs[k]()
                    samples = []
                    for _ in range(args.calls):
                        t0 = time.perf_counter()
                        runs[k]()
                        samples.append(time.perf_counter() - t0)
                    times[k][r] = np.median(samples) * 1e3
            load1 = os.getloadavg()[0]
            line = [f"{name}: load {load0:.2f}-{load1:.2f}, ort {np.median(times['ort']):.2f} ms"]
            for k in ("blas", "llvm"):
                lo, hi = bootstrap_ratio_ci(times["ort"], times[k])
                line.append(f"{k} {np.median(times[k]):.2f} ms x{np.median(times['ort']) / np.median(times[k]):.2f} [{lo:.2f}, {hi:.2f}]")
            lo, hi = bootstrap_ratio_ci(times["blas"], times["llvm"])
            line.append(f"llvm vs blas x{np.median(times['blas']) / np.median(times['llvm']):.2f} [{lo:.2f}, {hi:.2f}]")
            print("; ".join(line), flush=True)
            for c in compiled.values():
                c.close()


if __name__ == "__main__":
    main()
