"""Where the time of a compiled CNN goes, conv form by conv form, next to onnxruntime's profile.

The compiled model runs step by step (the Python step loop over the same native kernels and
GEMM calls, 2 threads through the pool) with each step timed; onnxruntime runs with
``enable_profiling`` and its per-node times are read back. Both are grouped by the form of the
Conv (or other op) the step belongs to: depthwise kxk stride s, 1x1, dense kxk stride s, stem.

    python benchmarks/conv_profile.py /work/realmodels-full/resnet18-ts-static.onnx --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))


def conv_forms(model: onnx.ModelProto) -> dict[str, str]:
    """Output tensor of every Conv -> its form (``dw3x3s1``, ``pw``, ``dense3x3s2``, ``stem7x7s2``)."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    forms = {}
    sigs = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w = inits.get(node.input[1]) or shapes.get(node.input[1])
        x = shapes.get(node.input[0]) or [0, 0]
        group = attrs.get("group", 1)
        k = "x".join(str(v) for v in w[2:])
        s = attrs.get("strides", [1])[0]
        if group > 1 and group == x[1]:
            form = f"dw{k}s{s}"
        elif all(v == 1 for v in w[2:]):
            form = "pw" if s == 1 else f"pw_s{s}"
        elif x[1] <= 4:
            form = f"stem{k}s{s}"
        else:
            form = f"dense{k}s{s}" + (f"g{group}" if group > 1 else "")
        forms[node.output[0]] = form
        out = shapes.get(node.output[0]) or [0, 0, 0, 0]
        ohw = 1
        for v in out[2:]:
            ohw *= v
        ck = 1
        for v in w[1:]:
            ck *= v
        sigs[(w[0] // group, ck, ohw)] = form
        sigs[("out", tuple(out))] = form
    forms["__sigs__"] = sigs  # type: ignore[assignment]
    return forms


def ort_profile(path: str, feeds: dict[str, np.ndarray], rounds: int, threads: int, forms: dict[str, str]) -> dict[str, float]:
    """Per-form milliseconds per run from onnxruntime's own profile (fused nodes keep the Conv's name)."""
    import onnxruntime as ort

    model = onnx.load(path)
    name_form = {}
    for node in model.graph.node:
        if node.op_type == "Conv":
            name_form[node.name] = name_form[node.output[0]] = forms[node.output[0]]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sess.run(None, feeds)
        for _ in range(rounds):
            sess.run(None, feeds)
        prof = sess.end_profiling()
        events = json.load(open(prof))
    per: dict[str, list[float]] = defaultdict(list)
    for ev in events:
        if ev.get("cat") != "Node" or not ev["name"].endswith("_kernel_time"):
            continue
        node = ev["name"][: -len("_kernel_time")]
        op = ev["args"].get("op_name", "?")
        form = name_form.get(node.removesuffix("_nchwc"))  # the NCHWc transformer renames the Conv it replaces
        if form is None:
            form = "other:" + op + ("" if op != "Conv" else ":" + node)
        per[form].append(ev["dur"] / 1000.0)
    total = 3 + rounds
    return {f: sum(v) / total for f, v in per.items()}


def compiled_profile(path: str, feeds: dict[str, np.ndarray], rounds: int, threads: int, forms: dict[str, str], optimize_first: bool) -> tuple[dict[str, float], list[tuple[float, str, str]], float]:
    from onnxsat.base.modelio import load_model
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.lowering.program import KernelStep, MatMulStep

    model = load_model(path)
    if optimize_first:
        from onnxsat.base.options import Options
        from onnxsat.pipeline import optimize

        model, _ = optimize(model, Options(verify_samples=(feeds,)))
    compiled = CompiledModel(model, CompileOptions(threads=threads))
    exe = compiled.executable_for(feeds)
    sigs = forms["__sigs__"]  # type: ignore[index]

    def label(step: Any) -> tuple[str, str]:
        """(form, description): GEMMs by their (M, K, N), kernels by name and output shape."""
        if isinstance(step, MatMulStep):
            m, k, n = step.a.shape[-2], step.a.shape[-1], step.b.shape[-1]
            desc = f"gemm {m}x{k}x{n} bias={step.bias is not None}"
            return "gemm:" + str(sigs.get((m, k, n), "matmul")), desc
        if isinstance(step, KernelStep):
            outs = [b for b in step.kernel.params if b.name in step.kernel.outputs]
            shape = outs[0].shape if outs else ()
            kind = "direct" if "conv_" in step.kernel.name else "im2col" if "im2col" in step.kernel.name else "kernel"
            form = sigs.get(("out", tuple(shape)))
            desc = f"{step.kernel.name} {[b.shape for b in outs]}"
            return f"{kind}:{form or ''}", desc
        return "fallback", str(step.node.op_type)

    labels = [label(s) for s in exe.program.steps]
    arrays = dict(exe.fixed)
    for name, buf in exe.program.inputs:
        arrays[buf.name] = np.ascontiguousarray(feeds[name])
    from onnxsat.kernels.blas import single_threaded_blas

    single_threaded_blas()
    times = np.zeros((rounds, len(exe.runners)))
    exe.run_steps(arrays)
    for r in range(rounds):
        for i, run in enumerate(exe.runners):
            t0 = time.perf_counter()
            run(arrays)
            times[r, i] = time.perf_counter() - t0
    med = np.median(times, axis=0) * 1000
    per: dict[str, float] = defaultdict(float)
    for (form, _), t in zip(labels, med, strict=True):
        per[form] += float(t)
    top = sorted(((float(t), f, d) for (f, d), t in zip(labels, med, strict=True)), reverse=True)
    t0 = time.perf_counter()
    for _ in range(rounds):
        compiled(feeds)
    native = (time.perf_counter() - t0) / rounds * 1000
    compiled.close()
    return dict(per), top, native


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--optimize", action="store_true")
    args = ap.parse_args()
    model = onnx.load(args.model)
    forms = conv_forms(model)
    x = model.graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ort_ms = ort_profile(args.model, feeds, args.rounds, args.threads, forms)
    comp_ms, top, native = compiled_profile(args.model, feeds, args.rounds, args.threads, forms, args.optimize)
    print(f"load {os.getloadavg()[0]:.2f}; compiled native run {native:.2f} ms")
    keys = sorted(set(ort_ms) | set(comp_ms), key=lambda k: -comp_ms.get(k, 0))
    print(f"{'form':24s} {'ort ms':>8s} {'comp ms':>8s} {'ratio':>6s}")
    for k in keys:
        o, c = ort_ms.get(k, 0.0), comp_ms.get(k, 0.0)
        print(f"{k:24s} {o:8.3f} {c:8.3f} {o / c if c else float('nan'):6.2f}")
    print(f"{'total':24s} {sum(ort_ms.values()):8.3f} {sum(comp_ms.values()):8.3f}")
    for t, f, d in top[: args.top]:
        print(f"{t:7.3f} {f:12s} {d[:120]}")


if __name__ == "__main__":
    main()
