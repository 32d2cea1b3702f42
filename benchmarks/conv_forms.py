"""Convolution lowering forms of the CPU compiler, each pair timed in one run: which one is faster.

- ConvTranspose: GEMM + col2im (what ``CompiledModel`` does with a ConvTranspose) against the
  sub-pixel form that ``onnxsat.optimize`` extracts by default (Conv + depth-to-space transposes),
  on examples/decoder_block.onnx;
- Conv with few output channels per group: the direct kernel against im2col + GEMM (the direct
  kernel switched off by setting ``DIRECT_MAX_CHANNELS`` to 0 while the baseline compiles), on the
  examples that have such convs.

Both sides are checked equal (max abs difference printed) and timed with
``onnxsat.latency.compare_latency``: interleaved rounds, ratio = baseline time / candidate time
(above 1: the candidate, the form the compiler uses, is faster) with a bootstrap 95% interval.

    python benchmarks/conv_forms.py [--rounds 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent


def _pair(name: str, baseline: Callable[[], object], candidate: Callable[[], object], feeds: dict[str, np.ndarray], rounds: int) -> str:
    from onnxsat.latency import compare_latency

    a, b = baseline(), candidate()
    assert isinstance(a, dict) and isinstance(b, dict)
    diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    c = compare_latency(baseline, candidate, rounds=rounds)
    return f"| {name} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}] | {diff:.1e} |"


def _runner(model: Callable[[dict[str, np.ndarray]], object], feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    return lambda: model(feeds)


def main(argv: list[str] | None = None) -> int:
    import onnxsat
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.lowering import conv_kernels
    from onnxsat.verification import make_inputs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    print(f"threads {args.threads}, {args.rounds} interleaved rounds, load average {os.getloadavg()[0]:.1f}")
    print("| pair (baseline -> candidate) | baseline ms | candidate ms | ratio [95% CI] | max abs diff |")
    print("|---|---|---|---|---|")

    decoder = onnx.load(str(ROOT / "examples" / "decoder_block.onnx"))
    feeds = make_inputs(decoder, seed=0)
    subpixel, _ = onnxsat.optimize(decoder)
    via_subpixel = CompiledModel(subpixel, CompileOptions(threads=args.threads, cache=False))
    via_col2im = CompiledModel(decoder, CompileOptions(threads=args.threads, cache=False))
    print(_pair("decoder_block: sub-pixel Conv -> GEMM + col2im", lambda: via_subpixel(feeds), lambda: via_col2im(feeds), feeds, args.rounds), flush=True)

    limit = conv_kernels.DIRECT_MAX_CHANNELS
    for name in ("decoder_block", "small_cnn", "inception_block"):
        model = onnx.load(str(ROOT / "examples" / f"{name}.onnx"))
        feeds = make_inputs(model, seed=0)
        conv_kernels.DIRECT_MAX_CHANNELS = 0
        try:
            gemm = CompiledModel(model, CompileOptions(threads=args.threads, cache=False))
        finally:
            conv_kernels.DIRECT_MAX_CHANNELS = limit
        direct = CompiledModel(model, CompileOptions(threads=args.threads, cache=False))
        print(_pair(f"{name}: im2col + GEMM -> direct conv", _runner(gemm, feeds), _runner(direct, feeds), feeds, args.rounds), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
