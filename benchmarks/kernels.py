"""Kernel-level speed of the CPU backend, against what the memory and numpy can do in the same run.

1. Fused elementwise chains (relu(a*b+c) and x*sigmoid(x)*s) at 1M and 16M floats: the compiled
   kernel alone (output buffer preallocated, no Python allocation), reported as bytes moved per
   second, against ``np.copyto`` moving the same number of bytes. Floor: >= 70% of that copy.
   A reference row per size, ``np.multiply(x, s)`` (one thread), shows what a one-in one-out loop
   with ordinary stores reaches: each store first reads its cache line (write-allocate), which a
   large ``np.copyto`` avoids, so at 16M floats such a loop moves 3 lines per 2 counted. Outputs of
   8 MiB and more are written with non-temporal stores (kernels/streaming.py); at 16M each chain
   also runs compiled with ordinary stores, in the same interleaved rounds, to show what that buys.
2. GEMM 1024x1024x1024 float32: the compiled model's BLAS step against ``np.matmul`` on the
   same threads (which BLAS numpy uses is logged via threadpoolctl). Floor: >= 80% of numpy.
3. Pools (SPP-style MaxPool 5/9/13 at stride 1, AveragePool 3x3 stride 2): the whole compiled
   model against onnxruntime (ORT_ENABLE_ALL, same threads), ``onnxsat.latency.compare_latency``
   (interleaved rounds, ratio of medians with a bootstrap 95% interval). Goal: within 1.25x.

Timings are medians over interleaved rounds (kernel, reference, kernel, ...), so machine load
hits both sides alike.

    python benchmarks/kernels.py [--rounds 30] [--threads 2] [--only elementwise] [--out benchmarks/results/kernels.md]
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


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], out: str, inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()]
    graph = helper.make_graph(nodes, "bench", ins, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _interleaved(fns: list[Callable[[], object]], rounds: int, settle_s: float = 0.0) -> list[float]:
    """Median seconds per call of each function, rounds interleaved. ``settle_s``: an untimed pause
    and call before each timed one, so OpenBLAS's threads (they spin ~0.1 s after numpy's product)
    do not take a core from the next function's threads (``onnxsat.latency.compare_latency``)."""
    times: list[list[float]] = [[] for _ in fns]
    for f in fns:
        f()
    for r in range(rounds):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            if settle_s > 0:
                time.sleep(settle_s)
                fns[i]()
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def _kernel_call(compiled: object, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    """Run the compiled steps on preallocated buffers (what a fused graph spends in kernels): the
    native task table with the inputs placed once, or the step loop where a program has none."""
    exe = compiled.executable_for(feeds)  # type: ignore[attr-defined]
    if exe.native is not None:
        for name, buf in exe.program.inputs:
            np.copyto(exe.io[buf.name], feeds[name].reshape(buf.shape))
        return lambda: exe.native.run(exe.workers)
    arrays = dict(exe.fixed)
    for name, buf in exe.program.inputs:
        arrays[buf.name] = feeds[name]
    for _, buf in exe.program.outputs:
        arrays[buf.name] = np.empty(buf.shape, np.float32)
    runners = exe.runners

    def call() -> None:
        for run in runners:
            run(arrays)

    return call


def _ordinary_stores(model: onnx.ModelProto, threads: int) -> object:
    """The model compiled with streaming stores switched off (for comparison only)."""
    from onnxsat.kernels import streaming
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel

    saved = streaming.STREAM_MIN_BYTES
    streaming.STREAM_MIN_BYTES = 1 << 62
    try:
        compiled = CompiledModel(model, CompileOptions(threads=threads))
        compiled.executable_for({i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32) for i in model.graph.input})
        return compiled
    finally:
        streaming.STREAM_MIN_BYTES = saved


def elementwise(n: int, rounds: int, threads: int) -> list[str]:
    from onnxsat.kernels import streaming
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel

    rng = np.random.default_rng(0)
    rows = []
    chains = {
        "relu(a*b+c)": (
            [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
            ["a", "b", "c"],
            [],
        ),
        "x*sigmoid(x)*s": (
            [helper.make_node("Sigmoid", ["a"], ["g"]), helper.make_node("Mul", ["a", "g"], ["m"]), helper.make_node("Mul", ["m", "s"], ["y"])],
            ["a"],
            [numpy_helper.from_array(np.array(1.7, np.float32), "s")],
        ),
    }
    for name, (nodes, ins, inits) in chains.items():
        model = _model(nodes, {k: [n] for k in ins}, "y", inits)
        feeds = {k: rng.standard_normal(n).astype(np.float32) for k in ins}
        compiled = CompiledModel(model, CompileOptions(threads=threads))
        kernel = _kernel_call(compiled, feeds)
        moved = 4 * n * (len(ins) + 1)
        src = np.ones(moved // 8, np.float32)
        dst = np.empty_like(src)
        fns = [kernel, lambda: np.copyto(dst, src)]  # noqa: B023
        if 4 * n >= streaming.STREAM_MIN_BYTES:
            fns.append(_kernel_call(_ordinary_stores(model, threads), feeds))
        t_kernel, t_copy, *t_plain = _interleaved(fns, rounds)
        bw_k, bw_c = moved / t_kernel / 1e9, moved / t_copy / 1e9
        ok = bw_k >= 0.7 * bw_c
        rows.append(f"| {name} | {n:,} | {t_kernel * 1e3:.3f} | {bw_k:.2f} | {bw_c:.2f} | {bw_k / bw_c:.0%} | {'PASS' if ok else 'FAIL'} |")
        for t in t_plain:
            rows.append(f"| {name}, ordinary stores (reference) | {n:,} | {t * 1e3:.3f} | {moved / t / 1e9:.2f} | {bw_c:.2f} | {t_copy / t:.0%} | - |")
    x, y, scale = rng.standard_normal(n).astype(np.float32), np.empty(n, np.float32), np.float32(1.7)
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    t_mul, t_copy = _interleaved([lambda: np.multiply(x, scale, out=y), lambda: np.copyto(dst, src)], rounds)
    rows.append(f"| numpy x*s, 1 thread (reference) | {n:,} | {t_mul * 1e3:.3f} | {8 * n / t_mul / 1e9:.2f} | {8 * n / t_copy / 1e9:.2f} | {t_copy / t_mul:.0%} | - |")
    return rows


def pools(rounds: int, threads: int) -> list[str]:
    """Compiled pooling models against onnxruntime, whole-model latency."""
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.latency import compare_latency, ort_session

    cases = {
        "SPP MaxPool 5/9/13, 1x256x20x20": ([256, 20, 20], [("MaxPool", k, 1) for k in (5, 9, 13)]),
        "AveragePool 3x3 s2, 1x64x112x112": ([64, 112, 112], [("AveragePool", 3, 2)]),
    }
    rows = []
    rng = np.random.default_rng(0)
    for name, (chw, pools_) in cases.items():
        nodes = [
            helper.make_node(op, ["x"], [f"y{i}"], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
            for i, (op, k, s) in enumerate(pools_)
        ]
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *chw])]
        outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(pools_))]
        model = helper.make_model(helper.make_graph(nodes, "pools", ins, outs), opset_imports=[helper.make_opsetid("", 17)])
        x = rng.standard_normal((1, *chw)).astype(np.float32)
        compiled = CompiledModel(model, CompileOptions(threads=threads))
        session = ort_session(model, threads=threads)
        got, want = compiled(x=x), session.run(None, {"x": x})
        err = max(float(np.max(np.abs(got[f"y{i}"] - w))) for i, w in enumerate(want))
        cmp = compare_latency(lambda: session.run(None, {"x": x}), lambda: compiled(x=x), rounds=rounds, settle_s=0.2)  # noqa: B023
        rows.append(f"| {name} | {cmp.baseline_ms:.3f} | {cmp.candidate_ms:.3f} | {cmp.ratio:.3f} [{cmp.ci_low:.3f}, {cmp.ci_high:.3f}] | {err:.1e} |")
    return rows


def gemm(size: int, rounds: int, threads: int) -> tuple[str, str]:
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel

    rng = np.random.default_rng(0)
    b = rng.standard_normal((size, size)).astype(np.float32)
    a = rng.standard_normal((size, size)).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [size, size]}, "y", [numpy_helper.from_array(b, "b")])
    compiled = CompiledModel(model, CompileOptions(threads=threads))
    kernel = _kernel_call(compiled, {"a": a})
    out = np.empty((size, size), np.float32)
    info = "threadpoolctl not installed"
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        info = "; ".join(f"{d.get('internal_api')} {d.get('version')} {d.get('architecture')} threads={d.get('num_threads')}" for d in threadpool_info())
        with threadpool_limits(threads):
            t_ours, t_np = _interleaved([kernel, lambda: np.matmul(a, b, out=out)], rounds, settle_s=0.2)
    except ImportError:
        t_ours, t_np = _interleaved([kernel, lambda: np.matmul(a, b, out=out)], rounds, settle_s=0.2)
    flops = 2.0 * size**3
    ratio = t_np / t_ours
    row = (
        f"| {size}^3 | {t_ours * 1e3:.2f} | {flops / t_ours / 1e9:.1f} | {t_np * 1e3:.2f} | {flops / t_np / 1e9:.1f} | "
        f"{ratio:.0%} | {'PASS' if ratio >= 0.8 else 'FAIL'} |"
    )
    return row, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", choices=["elementwise"], default=None, help="run the elementwise rows alone")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lines = [
        f"threads {args.threads}, medians of {args.rounds} interleaved rounds",
        "",
        "| chain | floats | kernel ms | kernel GB/s | copy GB/s (same bytes) | of copy | floor 70% |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in (1 << 20, 1 << 24):
        lines += elementwise(n, args.rounds, args.threads)
    if args.only == "elementwise":
        print("\n".join(lines))
        return 0 if "FAIL" not in "\n".join(lines) else 1
    row, info = gemm(1024, args.rounds, args.threads)
    lines += [
        "",
        "| GEMM | compiled ms | GFLOP/s | numpy ms | GFLOP/s | of numpy | floor 80% |",
        "|---|---|---|---|---|---|---|",
        row,
        "",
        f"numpy BLAS (threadpoolctl): {info}",
        "",
        "| pools | onnxruntime ms | compiled ms | ratio (ORT / compiled) [95% CI] | max abs err |",
        "|---|---|---|---|---|",
        *pools(args.rounds, args.threads),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if "FAIL" not in text else 1


if __name__ == "__main__":
    sys.exit(main())
