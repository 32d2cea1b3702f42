"""The split thresholds of ``kernels/parallel.py`` (and ``executable.GEMM_SPLIT_FLOPS``) on whole models.

``parallel_threshold.py`` measures one kernel alone, which wakes the parked helpers on every
run; inside a model the helpers are already awake. This builds one compiled program per
threshold set in one process (the same model, the same inputs) and times them in interleaved
rounds (a short settle before each block; the median of the block's calls), so every set meets
the same machine state. The ratio is per round, base time / set time (above 1: faster).

    python benchmarks/split_thresholds_ab.py /work/realmodels-full/mobilenet_v3_small-ts-static.onnx
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx

from onnxsat.base.modelio import load_model
from onnxsat.kernels import executable, parallel
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel

SETS = {
    "1M ops, 1 MiB, GEMM 2M FLOPs": (1_000_000.0, float(1 << 20), 2_000_000.0),
    "250K, 256 KiB, 500K": (250_000.0, float(1 << 18), 500_000.0),
    "100K, 128 KiB, 200K": (100_000.0, float(1 << 17), 200_000.0),
    "40K, 64 KiB, 80K": (40_000.0, float(1 << 16), 80_000.0),
}


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    return {
        vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
        for vi in model.graph.input
        if vi.name not in inits
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a float32 model with static input shapes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per block")
    args = parser.parse_args()
    model = load_model(args.model)
    feeds = _inputs(model)
    saved = parallel.PARALLEL_MIN_COST, parallel.PARALLEL_MIN_BYTES, executable.GEMM_SPLIT_FLOPS
    programs = {}
    try:
        for name, (cost, nbytes, flops) in SETS.items():
            parallel.PARALLEL_MIN_COST, parallel.PARALLEL_MIN_BYTES, executable.GEMM_SPLIT_FLOPS = cost, nbytes, flops
            programs[name] = CompiledModel(model, CompileOptions(threads=args.threads, cache=False))
            programs[name](feeds)  # compiled now, under these thresholds
    finally:
        parallel.PARALLEL_MIN_COST, parallel.PARALLEL_MIN_BYTES, executable.GEMM_SPLIT_FLOPS = saved
    times: dict[str, list[float]] = {name: [] for name in SETS}
    for _ in range(args.rounds):
        for name, compiled in programs.items():
            time.sleep(0.002)
            for _ in range(3):
                compiled(feeds)
            calls = []
            for _ in range(args.calls):
                start = time.perf_counter()
                compiled(feeds)
                calls.append(time.perf_counter() - start)
            times[name].append(float(np.median(calls)) * 1e3)
    base = np.array(times[next(iter(SETS))])
    for name, ms in times.items():
        print(f"{name:32s} median {np.median(ms):8.2f} ms   base / this, per round: x{np.median(base / np.array(ms)):.3f}")
    for compiled in programs.values():
        compiled.close()


if __name__ == "__main__":
    main()
