"""The CUDA backend without a GPU: GPU kernel forms keep the kernel IR's meaning (interpreter),
every entry point of the examples and light models assembles with ptxas for sm_90 and sm_80, no
unused libdevice function survives, and a ``--emit-check`` bundle replays on the CPU.

ptxas is on CI's PATH: there (CI=true) a missing ptxas fails these tests instead of skipping.
Nothing here claims GPU correctness; tests/test_cuda_gpu.py runs on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxsat.lowering.interpret import interpret
from onnxsat.lowering.kernel_ir import (
    NUMPY_DTYPES,
    Binary,
    Buffer,
    Const,
    Kernel,
    Load,
    Store,
    Unary,
    flat_index,
)
from onnxsat.lowering.loops import nest
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep
from tests.models import EXAMPLES, LIGHT_DIR, LIGHT_MODELS, heavy_light, load_light
from tests.test_examples_models import RUNNABLE, SYMBOLIC_DIMS

ROOT = Path(__file__).resolve().parent.parent
CHEAP_LIGHT = {"light_squeezenet.onnx", "light_shufflenet.onnx", "light_inception_v1.onnx"}
BOTH_ARCHS_LIGHT = {"light_squeezenet.onnx", "light_shufflenet.onnx"}
"""Light models whose kernels are assembled for sm_80 as well as sm_90 (the examples all are)."""


def _ptxas_or_skip() -> None:
    from onnxsat.kernels.cuda.ptx import find_ptxas

    if find_ptxas() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ptxas is not on PATH in CI: the CUDA toolkit must be installed there")
        pytest.skip("ptxas not on PATH")


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inits = {t.name for t in model.graph.initializer}
    return {
        vi.name: tuple(d.dim_value if d.HasField("dim_value") else SYMBOLIC_DIMS.get(d.dim_param, 2) for d in vi.type.tensor_type.shape.dim)
        for vi in model.graph.input
        if vi.name not in inits
    }


def _random_arrays(kernel: Kernel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {}
    for b in kernel.params:
        dt = NUMPY_DTYPES[b.dtype]
        arrays[b.name] = (rng.standard_normal(b.shape) if dt.kind == "f" else rng.integers(0, 3, b.shape)).astype(dt)
    return arrays


def _same_meaning(original: Kernel, rewritten: Kernel, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    want = _random_arrays(original, rng)
    got = {k: v.copy() for k, v in want.items()}
    interpret(original, want)
    interpret(rewritten, got)
    for name in original.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# ---------------------------------------------------------------- GPU forms keep the meaning
def _chain_kernel(shape: tuple[int, ...]) -> Kernel:
    """``out = exp(a) + b`` with b broadcast along the last axis, through ``lowering.loops.nest``."""
    a = Buffer("a", "f32", shape)
    b = Buffer("b", "f32", shape[-1:])
    out = Buffer("out", "f32", shape)
    n = nest(shape)

    def body(idx: list) -> list:
        value = Binary("add", Unary("exp", Load(a, flat_index(idx, shape))), Load(b, idx[-1]))
        return [Store(out, flat_index(idx, shape), value)]

    return Kernel("chain", (a, b, out), ("out",), "p", n.parallel_extent, n.build(body))


@pytest.mark.parametrize("shape", [(3, 7), (4100,), (2, 4100), (8,)])
def test_flattened_and_vectorized_forms_match_the_interpreter(shape: tuple[int, ...]) -> None:
    from onnxsat.kernels.cuda.transform import flatten_elementwise, vectorize

    kernel = _chain_kernel(shape)
    flat = flatten_elementwise(kernel)
    assert flat is not None, "both loop shapes of lowering.loops.nest flatten"
    assert flat.parallel_extent == int(np.prod(shape))
    _same_meaning(kernel, flat)
    wide = vectorize(flat, 4)
    if int(np.prod(shape)) % 4:
        assert wide is None
    else:
        assert wide is not None and wide.parallel_extent * 4 == flat.parallel_extent
        _same_meaning(kernel, wide)


def test_gpu_forms_of_example_kernels_match_the_interpreter() -> None:
    """Every elementwise kernel of two examples, flattened (and vectorized), means the same."""
    from onnxsat.kernels.cuda.plan import gpu_form

    checked, convs = 0, 0
    for name in ("layout_algebra", "transformer_block", "inception_block"):
        model = onnx.load(str(EXAMPLES / f"{name}.onnx"))
        for step in lower(model, _static_shapes(model)).steps:
            if not isinstance(step, KernelStep):
                continue
            form_kernel, form = gpu_form(step.kernel)
            if form in ("vectorized", "elementwise") and form_kernel.parallel_extent <= 20_000:
                _same_meaning(step.kernel, form_kernel)
                checked += 1
                convs += step.kernel.name.startswith("fconv")
    assert checked >= 7 and convs >= 2, "inception_block's direct convolutions run one thread per output position"


def _channel_loop_kernel(store_stride: int, neighbour_read: bool) -> Kernel:
    """A direct 1-D convolution shaped like lowering's: weights as scalars, the first input channel
    stored, the others accumulated into the output inside a channel loop (4 outputs of 6 positions)."""
    from onnxsat.lowering.kernel_ir import Decl, Loop, Var

    x, w, out = Buffer("x", "f32", (3, 8)), Buffer("w", "f32", (2, 3, 3)), Buffer("out", "f32", (2 * store_stride + 6,))
    i, j, ci = (lambda v: Const(v, "i64")), Var("j"), Var("ci")

    def taps(co: int, channel: object, acc: object) -> object:
        for k in range(3):
            acc = Binary("add", acc, Binary("mul", Var(f"w{co}_{k}"), Load(x, Binary("add", Binary("mul", channel, i(8)), Binary("add", j, i(k))))))
        return acc

    def decls(channel: object) -> list:
        return [Decl(f"w{co}_{k}", "f32", Load(w, Binary("add", Binary("mul", channel, i(3)), i(co * 9 + k)))) for co in range(2) for k in range(3)]

    def at(co: int) -> object:
        return Binary("add", i(co * store_stride), j)

    first = Loop("j", i(6), tuple(Store(out, at(co), taps(co, i(0), Const(0.0, "f32"))) for co in range(2)))
    read = (lambda co: Load(out, Binary("add", at(co), i(1)))) if neighbour_read else (lambda co: Load(out, at(co)))
    rest = Loop("j", i(6), tuple(Store(out, at(co), taps(co, ci, read(co))) for co in range(2)))
    body = (*decls(i(0)), first, Loop("ci", i(3), (*decls(ci), rest), start=i(1)))
    return Kernel("conv1d", (x, w, out), ("out",), "p", 1, body)  # type: ignore[arg-type]


def test_channel_loops_flatten_only_when_elements_are_independent() -> None:
    from onnxsat.kernels.cuda.transform import flatten_elementwise

    kernel = _channel_loop_kernel(store_stride=6, neighbour_read=False)
    flat = flatten_elementwise(kernel)
    assert flat is not None and flat.parallel_extent == 6
    _same_meaning(kernel, flat)
    assert flatten_elementwise(_channel_loop_kernel(store_stride=5, neighbour_read=False)) is None, "output rows overlap"
    assert flatten_elementwise(_channel_loop_kernel(store_stride=6, neighbour_read=True)) is None, "reads a neighbour's element"
    # lowering's direct convolution over a batch of two (output planes at (n * C + c) * H * W)
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")],
    )
    convs = [s.kernel for s in lower(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": (2, 3, 6, 6)}).steps
             if isinstance(s, KernelStep) and s.kernel.name.startswith("fconv")]
    assert convs, "a direct convolution kernel"
    for conv in convs:
        flat = flatten_elementwise(conv)
        assert flat is not None and flat.parallel_extent > conv.parallel_extent
        _same_meaning(conv, flat)


def test_reduction_parts_recognize_reduction_kernels_only() -> None:
    from onnxsat.kernels.cuda.nvvm import uses_warp_reduction
    from onnxsat.lowering.loops import reduction_kernel

    x = Buffer("x", "f32", (3, 100))
    out = Buffer("s", "f32", (3,))
    k = reduction_kernel("sum", out, (3,), (100,), lambda o, r: Load(x, flat_index([*o, *r], (3, 100))), "add", Const(0.0, "f32"), lambda acc, o: acc, [x])
    assert uses_warp_reduction(k)
    assert not uses_warp_reduction(_chain_kernel((3, 7)))


def test_ptxas_verbose_output_parses() -> None:
    from onnxsat.kernels.cuda.ptx import parse_ptxas_verbose

    text = (
        "ptxas info    : Compiling entry function 'k3' for 'sm_90'\n"
        "ptxas info    : Function properties for k3\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem\n"
    )
    stats = parse_ptxas_verbose(text)["k3"]
    assert (stats.registers, stats.spill_stores, stats.spill_loads, stats.stack_bytes, stats.shared_bytes) == (40, 4, 12, 8, 8192)


# ---------------------------------------------------------------- ptxas on every kernel
def _models() -> list:
    params = [pytest.param(("example", n), id=n) for n in RUNNABLE]
    for n in LIGHT_MODELS:
        params.append(pytest.param(("light", n), id=n, marks=() if n in CHEAP_LIGHT else heavy_light(n)))
    return params


@pytest.mark.parametrize("which", _models())
def test_every_kernel_assembles_with_ptxas(which: tuple[str, str], tmp_path: Path) -> None:
    _ptxas_or_skip()
    from onnxsat.kernels.cuda.plan import Launch, plan
    from onnxsat.kernels.cuda.ptx import compile_ptx, ptxas_check_all

    kind, name = which
    model = onnx.load(str(EXAMPLES / f"{name}.onnx")) if kind == "example" else load_light(name)
    cp = plan(lower(model, _static_shapes(model)))
    launches = [s for s in cp.steps if isinstance(s, Launch)]
    assert {s.function for s in launches} == set(cp.functions)
    checked = 0
    # the light models beyond the two smallest are checked for the default arch only, to keep CI's time
    archs = ("sm_90", "sm_80") if kind == "example" or name in BOTH_ARCHS_LIGHT else ("sm_90",)
    for arch in archs:
        ptx = compile_ptx(cp, arch)
        paths = []
        for fn, text in ptx.ptx.items():
            assert f".target {arch}" in text
            assert ".func" not in text, f"{fn}: an unused (or uninlined) libdevice function survived"
            assert len(re.findall(r"^\.visible \.entry", text, re.M)) == 1, f"{fn}: one entry point per file"
            path = tmp_path / f"{arch}_{fn}.ptx"
            path.write_text(text)
            paths.append(str(path))
        stats = ptxas_check_all(paths, arch)
        assert set(stats) == set(cp.functions)
        checked += len(stats)
    print(f"{name}: ptxas accepted {checked} entry points ({' + '.join(archs)}) for {len(launches)} launches")


def test_libdevice_math_is_linked_and_inlined() -> None:
    """exp/erf/tanh/pow go through libdevice, and only what is used stays (no .func at all)."""
    from onnxsat.kernels.cuda.plan import plan
    from onnxsat.kernels.cuda.ptx import build_module, compile_ptx
    from onnxsat.lowering.program import KernelProgram

    shape = (64,)
    x, y = Buffer("x", "f32", shape), Buffer("y", "f32", shape)
    kernels = []
    for i, op in enumerate(("exp", "erf", "tanh")):
        out = Buffer(f"o{i}", "f32", shape)
        n = nest(shape)
        kernels.append(Kernel(f"u{i}", (x, out), (out.name,), "p", n.parallel_extent, n.build(lambda idx, op=op, out=out: [Store(out, idx[0], Unary(op, Load(x, idx[0])))])))
    out = Buffer("o_pow", "f32", shape)
    n = nest(shape)
    kernels.append(Kernel("pw", (x, y, out), (out.name,), "p", n.parallel_extent, n.build(lambda idx: [Store(out, idx[0], Binary("pow", Load(x, idx[0]), Load(y, idx[0])))])))
    program = KernelProgram(inputs=[("x", x), ("y", y)], outputs=[], steps=[KernelStep(k) for k in kernels])
    cp = plan(program)
    unlinked = str(build_module(cp))
    for name in ("__nv_expf", "__nv_erff", "__nv_tanhf", "__nv_powf"):
        assert f"declare float @\"{name}\"" in unlinked or f"declare float @{name}" in unlinked, name
    ptx = compile_ptx(cp)
    for fn, text in ptx.ptx.items():
        assert ".func" not in text and "call" not in text and "__nv_" not in text, fn
        assert len(text) < 20_000, f"{fn}: {len(text)} bytes of PTX (libdevice left in?)"


# ---------------------------------------------------------------- the bundle, replayed on the CPU
def _gemm_reference(step: dict, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """What the GEMM kernel computes from its launch arguments (numpy, strided views)."""
    names = [a["value"] for a in step["args"] if a["kind"] == "buffer"]
    m, n, k, a_row, a_col, b_row, b_col = (int(a["value"]) for a in step["args"] if a["kind"] == "i64")
    alpha, beta = (float(a["value"]) for a in step["args"] if a["kind"] == "float")
    a, b, c, a_offs, b_offs = (arrays[x] for x in names)
    out = c.reshape(-1).copy()
    for z in range(step["grid"][2]):
        av = np.lib.stride_tricks.as_strided(a.reshape(-1)[a_offs[z]:], (m, k), (a_row * a.itemsize, a_col * a.itemsize))
        bv = np.lib.stride_tricks.as_strided(b.reshape(-1)[b_offs[z]:], (k, n), (b_row * b.itemsize, b_col * b.itemsize))
        block = out[z * m * n:(z + 1) * m * n].reshape(m, n)
        block[...] = alpha * (av.astype(np.float64) @ bv.astype(np.float64)) + (beta * block if beta else 0)
    return out.reshape(c.shape)


def test_emit_check_bundle_replays_on_the_cpu(tmp_path: Path) -> None:
    """``onnxsat compile --target cuda --emit-ptx --emit-check``: manifest and files are complete, and
    each launch's recorded before/after values agree with the GPU form of its kernel (interpreter) or
    with the GEMM its arguments describe (numpy): the data gpu_check.py compares against is right."""
    _ptxas_or_skip()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    from onnxsat.kernels.cuda.plan import gpu_form

    out = tmp_path / "bundle"
    cmd = [sys.executable, "-m", "onnxsat", "compile", str(EXAMPLES / "small_cnn.onnx"), "--target", "cuda", "--no-optimize",
           "--emit-ptx", str(out), "--emit-check", "--arch", "sm_80", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    manifest = gpu_check.load_manifest(out)
    assert manifest["arch"] == "sm_80" and report["ptxas"]["checked"] == len(manifest["kernels"])
    assert {"gemm", "warp-reduction", "vectorized"} <= set(report["forms"])
    buffers = manifest["buffers"]
    index = {b["name"]: i for i, b in enumerate(buffers)}
    program = lower(onnx.load(str(EXAMPLES / "small_cnn.onnx")), _static_shapes(onnx.load(str(EXAMPLES / "small_cnn.onnx"))))
    kernels = {s.kernel.name: s.kernel for s in program.steps if isinstance(s, KernelStep)}
    replayed = 0
    for i, step in enumerate(manifest["steps"]):
        data = np.load(out / "check" / f"step_{i:04d}.npz")
        arrays = {b["name"]: data[f"before_b{index[b['name']]}"].copy() for b in buffers if f"before_b{index[b['name']]}" in data}
        if step["form"] == "gemm":
            want = data[f"after_b{index[step['writes'][0]]}"]
            ok, err = gpu_check.compare(_gemm_reference(step, arrays).astype(want.dtype), want)
            assert ok, f"step {i}: gemm arguments disagree with the CPU result ({err})"
        else:
            kernel = kernels[step["step"]]
            form_kernel, form = gpu_form(kernel)
            assert form == step["form"]
            if kernel.cost > 20_000:
                continue  # the scalar interpreter is too slow for the big convolutions
            interpret(form_kernel, arrays)
            for name in step["writes"]:
                ok, err = gpu_check.compare(arrays[name], data[f"after_b{index[name]}"])
                assert ok, f"step {i} {name}: {err}"
        replayed += 1
    assert replayed >= 6
    print(f"replayed {replayed} of {len(manifest['steps'])} launches of the bundle on the CPU")


def test_gpu_check_helpers() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    assert gpu_check.compare(np.array([1.0, np.nan], np.float32), np.array([1.0005, np.nan], np.float32))[0]
    assert not gpu_check.compare(np.array([1.0], np.float32), np.array([1.1], np.float32))[0]
    assert not gpu_check.compare(np.array([1, 2]), np.array([1, 3]))[0]
    assert not gpu_check.compare(np.zeros(2), np.zeros(3))[0]
    bufs = {"x": {"dtype": "f32", "shape": [4, 4]}, "y": {"dtype": "f16", "shape": [8]}}
    step = {"args": [{"kind": "buffer", "value": "x"}, {"kind": "buffer", "value": "y"}, {"kind": "buffer", "value": "x"}]}
    assert gpu_check.launch_bytes(step, bufs) == 64 + 16
    rows = [{"form": "vectorized", "bytes": 1 << 24, "gbs": 3000.0}, {"form": "vectorized", "bytes": 1 << 24, "gbs": 4000.0},
            {"form": "gemm", "bytes": 1 << 24, "gbs": 1.0}, {"form": "elementwise", "bytes": 10, "gbs": 1.0}]
    summary = gpu_check.summarize_bandwidth(rows, 4000.0)
    assert summary["elementwise_launches"] == 2 and summary["best_fraction_of_copy"] == 1.0 and summary["worst_fraction_of_copy"] == 0.75
    assert gpu_check.repeats_for(1.0) == 3 and gpu_check.repeats_for(1e-9) == 200
    # whole-model comparisons use onnxsat.latency's interval and verdicts (the script cannot import onnxsat)
    from onnxsat.latency import bootstrap_ratio_ci

    rng = np.random.default_rng(1)
    base, cand = 2.0 + rng.random(30), 1.0 + rng.random(30)
    assert gpu_check.bootstrap_ratio_ci(base, cand) == bootstrap_ratio_ci(base, cand)
    assert [gpu_check.verdict(*ci) for ci in [(1.03, 1.2), (0.9, 0.97), (0.99, 1.05)]] == ["win", "loss", "tie"]


def test_cuda_target_errors_are_one_line(tmp_path: Path) -> None:
    model = str(EXAMPLES / "layout_algebra.onnx")
    bad_arch = subprocess.run([sys.executable, "-m", "onnxsat", "compile", model, "--target", "cuda", "--arch", "sm_70", "--emit-ptx", str(tmp_path / "b")],
                              capture_output=True, text=True, timeout=120)
    assert bad_arch.returncode == 2 and "sm_70" in bad_arch.stderr and len(bad_arch.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
    check_only = subprocess.run([sys.executable, "-m", "onnxsat", "compile", model, "--target", "cuda", "--emit-check"], capture_output=True, text=True, timeout=120)
    assert check_only.returncode == 2 and "--emit-ptx" in check_only.stderr
    assert LIGHT_DIR.exists()


def test_softmax_and_layernorm_rows_get_a_warp_each() -> None:
    """Softmax and LayerNorm kernels run one warp per row; a pass whose accumulator does not start
    at its operation's identity, or rows too short for a warp, keep one thread per row."""
    from dataclasses import replace

    from onnx import TensorProto, helper

    from onnxsat.kernels.cuda.plan import gpu_form
    from onnxsat.kernels.cuda.transform import warp_row_passes
    from onnxsat.lowering.kernel_ir import Decl

    def model(width: int) -> onnx.ModelProto:
        nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1)]
        graph = helper.make_graph(
            nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4, width]) for o in ("p", "n")],
            [onnx.numpy_helper.from_array(np.ones(width, np.float32), "g"), onnx.numpy_helper.from_array(np.zeros(width, np.float32), "b")],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    kernels = [s.kernel for s in lower(model(128), {"x": (4, 128)}).steps if isinstance(s, KernelStep)]
    assert sorted(gpu_form(k)[1] for k in kernels) == ["warp-rows", "warp-rows"]
    softmax = next(k for k in kernels if k.name.startswith("softmax"))
    assert list(warp_row_passes(softmax).values()) == [("m",), ("s",), ()]  # type: ignore[union-attr]
    shifted = replace(softmax, body=tuple(replace(s, init=Const(1.0, "f32")) if isinstance(s, Decl) and s.name == "s" else s for s in softmax.body))
    assert warp_row_passes(shifted) is None
    short = [s.kernel for s in lower(model(16), {"x": (4, 16)}).steps if isinstance(s, KernelStep)]
    assert all(gpu_form(k)[1] == "thread-per-unit" for k in short)


def test_gemm_epilogues_stay_on_the_host_for_the_gpu() -> None:
    """The GPU GEMM has no bias/ReLU epilogue: a product lowered with one must not launch without it."""
    from onnx import TensorProto, helper

    from onnxsat.kernels.cuda.plan import HostStep, Launch, plan

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused = plan(lower(model, {"x": (4, 8)}, gemm_epilogues=True))
    assert [type(s) for s in fused.steps] == [HostStep] and "epilogue" in fused.steps[0].reason  # type: ignore[union-attr]
    assert any(isinstance(s, Launch) and s.form == "gemm" for s in plan(lower(model, {"x": (4, 8)})).steps)
