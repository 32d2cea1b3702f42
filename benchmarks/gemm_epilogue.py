"""GEMM epilogues on and off: the same model compiled twice, with a MatMul's bias Add (+ Relu) in
the packed GEMM's store of each C tile or as kernels of their own, timed in interleaved rounds
(``onnxsat.latency.compare_latency``, bootstrap 95% interval). Ratios above 1: epilogues faster.

    python benchmarks/gemm_epilogue.py --only mlp bert-128 --rounds 40 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compiled_vs_ort import MODELS, _feeds  # noqa: E402

from onnxsat.kernels.compile_options import CompileOptions  # noqa: E402
from onnxsat.kernels.compiled import CompiledModel  # noqa: E402
from onnxsat.latency import compare_latency  # noqa: E402

DEFAULT = ("mlp", "bert-128", "bert-512")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=list(DEFAULT), choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for name in args.only:
        model = MODELS[name]()
        feeds = _feeds(model)
        separate = CompiledModel(model, CompileOptions(threads=args.threads, epilogues=False))
        fused = CompiledModel(model, CompileOptions(threads=args.threads))
        want, got = separate(feeds), fused(feeds)
        error = max(float(np.max(np.abs(want[k] - got[k]))) for k in want)
        kernels = (separate.executable_for(feeds).stats.kernels, fused.executable_for(feeds).stats.kernels)
        result = compare_latency(lambda: separate(feeds), lambda: fused(feeds), rounds=args.rounds)  # noqa: B023
        print(f"{name}: kernels {kernels[0]} -> {kernels[1]}, max |diff| {error:.2e}; separate -> epilogues {result} (load {os.getloadavg()[0]:.2f})")
        separate.close()
        fused.close()


if __name__ == "__main__":
    main()
