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

import numpy as np

from onnxsat.base.modelio import load_model
from onnxsat.kernels import executable, parallel
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.latency import block_median
from onnxsat.verification_inputs import make_inputs

SETS = {
    "1M ops, 1 MiB, GEMM 2M FLOPs": (1_000_000.0, float(1 << 20), 2_000_000.0),
    "250K, 256 KiB, 500K": (250_000.0, float(1 << 18), 500_000.0),
    "100K, 128 KiB, 200K": (100_000.0, float(1 << 17), 200_000.0),
    "40K, 64 KiB, 80K": (40_000.0, float(1 << 16), 80_000.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a float32 model with static input shapes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per block")
    args = parser.parse_args()
    model = load_model(args.model)
    feeds = make_inputs(model, seed=0)
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
            times[name].append(block_median(lambda c=compiled: c(feeds), args.calls, settle_s=0.002, untimed=3) * 1e3)
    base = np.array(times[next(iter(SETS))])
    for name, ms in times.items():
        print(f"{name:32s} median {np.median(ms):8.2f} ms   base / this, per round: x{np.median(base / np.array(ms)):.3f}")
    for compiled in programs.values():
        compiled.close()


if __name__ == "__main__":
    main()
