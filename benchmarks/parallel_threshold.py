"""Where splitting one kernel over two threads starts to pay: serial against parallel per kernel class.

``kernels/parallel.py`` keeps a kernel on one thread unless its estimated cost (scalar
operations, ``Kernel.cost``) or the bytes it touches reach a threshold. This benchmark compiles
small models whose program is one kernel (a memory-bound chain relu(x*b+c), the compute-bound
x*sigmoid(x)*s, a bias + erf GELU, LayerNormalization over rows of 768, Softmax over rows of 512,
an attention head merge (12, rows, 64) -> (rows, 12, 64)) at several sizes, once with every
kernel serial and once with every kernel split over ``--threads``, checks both give the same
output, and times the kernel calls (native task table, inputs placed once) with
``onnxsat.latency.compare_latency``: ratio = serial / parallel with a bootstrap 95% interval
(above 1: splitting pays). The cost and bytes printed next to each row are where the thresholds
must sit.
On a loaded machine medians mostly say whether a second core was free; the best-of-rounds
columns (fastest single call of each side) estimate what an unloaded machine does. A one-kernel
program also wakes the parked helper threads on every run, which a kernel inside a model (helpers
already spinning between steps) does not pay: the sizes where splitting starts to pay here are
upper bounds.

    python benchmarks/parallel_threshold.py [--rounds 30] [--threads 2] [--only silu softmax]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import _kernel_call  # noqa: E402

SIZES = (65_536, 262_144, 1_048_576, 4_194_304)


def _model(nodes: list[onnx.NodeProto], shape: list[int], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "threshold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name: str, value: np.ndarray | float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def models(n: int) -> dict[str, onnx.ModelProto]:
    """One single-kernel model per kernel class, ``n`` floats of input."""
    rng = np.random.default_rng(0)
    mk = helper.make_node
    rows768, rows512, rows3072 = max(n // 768, 1), max(n // 512, 1), max(n // 3072, 1)
    return {
        "relu(x*b+c)": _model(
            [mk("Mul", ["x", "b"], ["m"]), mk("Add", ["m", "c"], ["s"]), mk("Relu", ["s"], ["y"])], [n],
            [_const("b", rng.standard_normal(n)), _const("c", rng.standard_normal(n))],
        ),
        "silu*s": _model(
            [mk("Sigmoid", ["x"], ["g"]), mk("Mul", ["x", "g"], ["m"]), mk("Mul", ["m", "s"], ["y"])], [n], [_const("s", 1.7)]
        ),
        "bias+gelu": _model(
            [mk("Add", ["x", "bias"], ["h"]), mk("Div", ["h", "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]),
             mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["h", "e1"], ["p"]), mk("Mul", ["p", "half"], ["y"])],
            [rows3072, 3072],
            [_const("bias", rng.standard_normal(3072) * 0.1), _const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)],
        ),
        "layernorm": _model(
            [mk("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-12)], [rows768, 768],
            [_const("g", rng.standard_normal(768)), _const("b", rng.standard_normal(768))],
        ),
        "softmax": _model([mk("Softmax", ["x"], ["y"], axis=-1)], [rows512, 512], []),
        "head-merge": _model([mk("Transpose", ["x"], ["y"], perm=[1, 0, 2])], [12, rows768, 64], []),
    }


def _compiled(model: onnx.ModelProto, threads: int, split: bool, feeds: dict[str, np.ndarray]) -> tuple[object, float, int]:
    """A CompiledModel whose kernels are all split (or all serial), its kernels' total cost and
    the bytes they touch."""
    from onnxsat.kernels import parallel
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.lowering.program import KernelStep

    saved = parallel.PARALLEL_MIN_COST, parallel.PARALLEL_MIN_BYTES
    parallel.PARALLEL_MIN_COST = parallel.PARALLEL_MIN_BYTES = 0.0 if split else float("inf")
    try:
        compiled = CompiledModel(model, CompileOptions(threads=threads))
        exe = compiled.executable_for(feeds)
    finally:
        parallel.PARALLEL_MIN_COST, parallel.PARALLEL_MIN_BYTES = saved
    kernels = [s.kernel for s in exe.program.steps if isinstance(s, KernelStep)]
    return compiled, sum(k.cost for k in kernels), sum(parallel.touched_bytes(k) for k in kernels)


def _best_ms(fns: list[Callable[[], None]], rounds: int) -> list[float]:
    """Fastest call of each function over ``rounds`` interleaved rounds, in ms."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return [b * 1e3 for b in best]


def main(argv: list[str] | None = None) -> int:
    from onnxsat.latency import compare_latency

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="kernel classes to run")
    parser.add_argument("--sizes", nargs="*", type=int, default=list(SIZES))
    args = parser.parse_args(argv)
    print(f"threads {args.threads}, {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}")
    print("ratio = serial / parallel (above 1: splitting the kernel pays)\n")
    print("| kernel | floats | cost (M ops) | MiB touched | serial ms | parallel ms | ratio [95% CI] | best serial ms | best parallel ms | best ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        for name, model in models(n).items():
            if args.only and name not in args.only:
                continue
            shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
            feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
            serial, cost, nbytes = _compiled(model, args.threads, False, feeds)
            parallel, _, _ = _compiled(model, args.threads, True, feeds)
            expected = serial(feeds)["y"]  # type: ignore[operator]
            got = parallel(feeds)["y"]  # type: ignore[operator]
            if not np.array_equal(expected, got):
                raise SystemExit(f"{name} at {n}: serial and parallel outputs differ")
            calls: list[Callable[[], None]] = [_kernel_call(c, feeds) for c in (serial, parallel)]
            result = compare_latency(calls[0], calls[1], rounds=args.rounds)
            best_s, best_p = _best_ms(calls, 5 * args.rounds)
            print(f"| {name} | {n:,} | {cost / 1e6:.1f} | {nbytes / 2**20:.2f} | {result.baseline_ms:.3f} | {result.candidate_ms:.3f} | "
                  f"{result.ratio:.2f} [{result.ci_low:.2f}, {result.ci_high:.2f}] | {best_s:.3f} | {best_p:.3f} | {best_s / best_p:.2f} |", flush=True)
            for c in (serial, parallel):
                c.close()  # type: ignore[attr-defined]
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
