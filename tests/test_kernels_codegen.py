"""The LLVM backend against the kernel IR's numpy interpreter, the math library against float64,
the arena planner, the partitioner and the on-disk kernel cache."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

from onnxsat.kernels.arena import lifetimes, plan_arena
from onnxsat.kernels.codegen import invariant_parts
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.executable import compile_together
from onnxsat.lowering.interpret import interpret
from onnxsat.lowering.kernel_ir import (
    NUMPY_DTYPES,
    Binary,
    Buffer,
    Compare,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    Select,
    Store,
    Unary,
    Var,
    add,
    i64,
    loads_in,
    mul,
)
from onnxsat.lowering.lower import lower
from onnxsat.lowering.partition import PNode, partition
from onnxsat.lowering.program import KernelStep


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: list[str], opset: int = 18) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])


FUSION_CASES = {
    "bias-gelu": (
        [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Gelu", ["s"], ["y"])],
        {"x": [3, 5, 8], "b": [8]},
    ),
    "transpose-softmax": (
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), helper.make_node("Softmax", ["t"], ["y"], axis=-1)],
        {"x": [2, 6, 5]},
    ),
    "residual-layernorm": (
        [
            helper.make_node("Add", ["x", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
        ],
        {"x": [4, 16], "r": [4, 16], "g": [16], "b": [16]},
    ),
    "concat-pad-reduce": (
        [
            helper.make_node("Concat", ["x", "r"], ["c"], axis=1),
            helper.make_node("Pad", ["c", "pads"], ["p"], mode="reflect"),
            helper.make_node("ReduceSum", ["p", "axes"], ["y"], keepdims=0),
        ],
        {"x": [2, 3, 4], "r": [2, 2, 4]},
    ),
    "squeeze-excite-scale": (  # the per-channel sigmoid is hoisted out of the pixel loop
        [helper.make_node("Sigmoid", ["s"], ["g"]), helper.make_node("Mul", ["x", "g"], ["y"])],
        {"x": [1, 6, 5, 7], "s": [1, 6, 1, 1]},
    ),
    "tanh-sigmoid-exp": (
        [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Exp", ["s"], ["y"])],
        {"x": [7, 9]},
    ),
    "bias-erf-gelu": (  # GELU as torch exports it: the biased tensor f is read twice in one kernel
        [
            helper.make_node("Add", ["x", "b"], ["f"]),
            helper.make_node("Div", ["f", "c"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "c"], ["e1"]),
            helper.make_node("Mul", ["f", "e1"], ["g"]),
            helper.make_node("Mul", ["g", "c"], ["y"]),
        ],
        {"x": [3, 5, 40], "b": [40], "c": [1]},
    ),
}


def _with_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.initializer.extend(
        [
            helper.make_tensor("pads", TensorProto.INT64, [6], [0, 1, 0, 0, 1, 0]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        ]
    )
    return model


@pytest.mark.parametrize("name", sorted(FUSION_CASES))
def test_llvm_kernels_agree_with_the_interpreter(name: str) -> None:
    """Every kernel of a fused program gives the same buffer contents compiled and interpreted."""
    nodes, inputs = FUSION_CASES[name]
    model = _with_constants(_model(nodes, inputs, ["y"]))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    program = lower(model, {n: tuple(s) for n, s in inputs.items()})
    (exe,) = compile_together([program], None, CompileOptions(threads=1, cache=False))
    native = exe.run(feeds)
    arrays = {**{b.name: np.array(v) for b, v in ((b, exe.fixed[b.name]) for b in program.buffers().values() if b.name in exe.fixed)}}
    for tensor, buf in program.inputs:
        arrays[buf.name] = feeds[tensor]
    for _, buf in program.outputs:
        arrays[buf.name] = np.zeros(buf.shape, NUMPY_DTYPES[buf.dtype])
    for step in program.steps:
        assert isinstance(step, KernelStep), "these programs need no BLAS"
        interpret(step.kernel, arrays)
    for tensor, buf in program.outputs:
        np.testing.assert_allclose(native[tensor], arrays[buf.name], rtol=2e-5, atol=2e-6)


def test_only_what_the_loop_cannot_change_is_hoisted() -> None:
    """``invariant_parts``: the costly subexpression free of the loop's variables, in a loop that
    surely runs, reading no buffer the kernel writes."""
    x, s, out = Buffer("x", "f32", (6, 7)), Buffer("s", "f32", (6,)), Buffer("out", "f32", (6, 7))
    p, j = Var("p"), Var("j")
    gate = Unary("sigmoid", Load(s, p))

    def loop(value: Expr, stop: Expr = i64(7)) -> Loop:
        return Loop("j", stop, (Store(out, add(mul(p, i64(7)), j), value),))

    def readable(e: Expr) -> bool:
        return all(load.buffer.name != "out" for load in loads_in(e))

    pixel = Load(x, add(mul(p, i64(7)), j))
    assert invariant_parts(loop(Binary("mul", pixel, gate)), readable) == [gate]
    assert invariant_parts(loop(Binary("mul", pixel, gate), stop=Var("n")), readable) == []  # may not run
    assert invariant_parts(loop(Unary("exp", pixel)), readable) == []  # changes with j
    assert invariant_parts(loop(Unary("exp", Load(out, p))), readable) == []  # written by the kernel


def test_fusion_makes_one_kernel_per_chain() -> None:
    nodes, inputs = FUSION_CASES["bias-gelu"]
    program = lower(_model(nodes, inputs, ["y"]), {n: tuple(s) for n, s in inputs.items()})
    assert sum(isinstance(s, KernelStep) for s in program.steps) == 1


@pytest.mark.parametrize("op", ["exp", "erf", "tanh", "sigmoid"])
def test_math_library_accuracy(op: str) -> None:
    """The vectorizable float32 exp/sigmoid/erf/tanh against float64 references, over their whole
    range (the ends of exp's clamp included): below 5e-7 relative (measured: 1.8e-7 exp, 2.5e-7
    sigmoid, 2.9e-7 tanh, 3.3e-7 erf), results below the smallest normal float flushed or tiny,
    overflow to inf, and NaN in gives NaN out."""
    x = np.concatenate(
        [np.linspace(-12, 12, 4001), np.linspace(-1e-3, 1e-3, 101), np.linspace(-110, 110, 2001), np.linspace(88.3, 88.8, 501),
         np.linspace(-87.5, -86.5, 501), [-100.0, 100.0, 0.0, np.inf, -np.inf, np.nan]]
    ).astype(np.float32)
    src = Buffer("x", "f32", x.shape)
    dst = Buffer("y", "f32", x.shape)
    p = Var("p")
    kernel = Kernel("k", (src, dst), ("y",), "p", x.size, (Store(dst, p, Unary(op, Load(src, p))),))
    program_free = compile_together([_one_kernel_program(kernel)], None, CompileOptions(threads=1, cache=False))[0]
    got = program_free.run({"x": x})["y"]
    x64 = x.astype(np.float64)
    ref = {
        "exp": np.exp(x64),
        "erf": np.array([math.erf(v) if not math.isnan(v) else v for v in x64]),
        "tanh": np.tanh(x64),
        "sigmoid": 1.0 / (1.0 + np.exp(-x64)),
    }[op]
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32)  # exp(100) is inf in float32
        rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)
    normal = np.isfinite(ref32) & (np.abs(ref) >= np.finfo(np.float32).tiny)
    assert np.max(rel[normal]) < 5e-7, f"{op}: worst relative error {np.max(rel[normal]):.2e}"
    assert np.all(np.abs(got[~normal & np.isfinite(ref32)]) < 2 * np.finfo(np.float32).tiny)
    assert np.array_equal(np.isinf(got), np.isinf(ref32))
    assert np.array_equal(np.isnan(got), np.isnan(ref))


def _one_kernel_program(kernel: Kernel):  # type: ignore[no-untyped-def]
    from onnxsat.lowering.program import KernelProgram

    return KernelProgram([("x", kernel.params[0])], [("y", kernel.params[1])], [KernelStep(kernel)])


def test_arena_reuses_dead_buffers_and_never_overlaps_live_ones() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"])]
    nodes += [helper.make_node("MatMul", ["r", "w"], ["h2"]), helper.make_node("Relu", ["h2"], ["r2"])]
    nodes += [helper.make_node("MatMul", ["r2", "w"], ["y"])]
    model = _model(nodes, {"x": [8, 32], "w": [32, 32]}, ["y"])
    program = lower(model, {"x": (8, 32), "w": (32, 32)})
    io = {b.name for _, b in program.inputs + program.outputs}
    plan = plan_arena(program.steps, io)
    live = lifetimes(program.steps, io)
    assert plan.size < plan.naive_size
    items = list(live.items())
    for i, (a, (ba, fa, la)) in enumerate(items):
        for b, (bb, fb, lb) in items[i + 1 :]:
            if not (la < fb or lb < fa):
                oa, ob = plan.offsets[a], plan.offsets[b]
                assert oa + ba.nbytes <= ob or ob + bb.nbytes <= oa, f"{a} and {b} overlap while both live"


def test_partition_groups_chains_and_stores_shared_tensors() -> None:
    nodes = [
        PNode("n0", "elementwise", ("x",), ("a",)),
        PNode("n1", "elementwise", ("a",), ("b",)),
        PNode("n2", "reduce", ("b",), ("c",)),
        PNode("n3", "elementwise", ("b", "c"), ("d",)),
    ]
    parts = partition(nodes, ["d"])
    assert parts.roots == {"b", "c", "d"}  # b has two consumers; c is a reduction; d is the output
    assert parts.groups["b"] == ["n0", "n1"]
    assert parts.order.index("b") < parts.order.index("c") < parts.order.index("d")


def test_partition_inlines_a_tensor_shared_only_inside_one_kernel() -> None:
    """f is read by two elementwise nodes of g's kernel: inlined (LLVM computes it once). Read
    by two kernels, it is stored."""
    chain = [
        PNode("n0", "elementwise", ("x", "b"), ("f",)),
        PNode("n1", "elementwise", ("f",), ("d",)),
        PNode("n2", "elementwise", ("d",), ("e",)),
        PNode("n3", "elementwise", ("f", "e"), ("g",)),
    ]
    parts = partition(chain, ["g"])
    assert parts.roots == {"g"} and sorted(parts.groups["g"]) == ["n0", "n1", "n2", "n3"]
    parts = partition([*chain, PNode("n4", "elementwise", ("f",), ("h",))], ["g", "h"])
    assert parts.roots == {"f", "g", "h"}
    nodes, inputs = FUSION_CASES["bias-erf-gelu"]
    program = lower(_model(nodes, inputs, ["y"]), {n: tuple(s) for n, s in inputs.items()})
    assert sum(isinstance(s, KernelStep) for s in program.steps) == 1


def test_compiled_kernels_are_cached_on_disk(tmp_path: Path) -> None:
    nodes, inputs = FUSION_CASES["tanh-sigmoid-exp"]
    model = _model(nodes, inputs, ["y"])
    feeds = {"x": np.random.default_rng(0).standard_normal((7, 9)).astype(np.float32)}
    first = CompiledModel(model, CompileOptions(threads=1, cache_dir=str(tmp_path)))
    second = CompiledModel(model, CompileOptions(threads=1, cache_dir=str(tmp_path)))
    assert not first.stats(feeds).cache_hit and second.stats(feeds).cache_hit
    assert len(list(tmp_path.glob("*.o"))) == 2  # the one kernel, and the native runner's code
    assert len(list(tmp_path.glob("*.artefact"))) == 1 and second.stats(feeds).artefact_hit
    np.testing.assert_array_equal(first(feeds)["y"], second(feeds)["y"])


def test_a_cold_build_compiles_the_shared_code_with_the_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an empty cache the micro-kernel variants a program's products use are compiled in the
    kernels' parallel batch and left in the cache, so loading them compiles nothing more (one at a
    time after the kernels they were most of ResNet-18's cold compile)."""
    from onnxsat.kernels import jit
    from onnxsat.latency import ort_session

    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [conv, helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "fc", "fb"], ["y"])]
    model = _model(nodes, {"x": [1, 8, 10, 10]}, ["y"])
    rng = np.random.default_rng(0)
    for name, value in {"w": rng.standard_normal((16, 8, 3, 3)), "b": rng.standard_normal(16), "fc": rng.standard_normal((1600, 10)), "fb": rng.standard_normal(10)}.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32), name))
    feeds = {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}
    compiled_alone: list[str] = []
    emit = jit.emit_object
    monkeypatch.setattr(jit, "emit_object", lambda text, *args: compiled_alone.append(text.split("\n")[0]) or emit(text, *args))  # support_code's
    compiled = CompiledModel(model, CompileOptions(threads=2, cache_dir=str(tmp_path)))
    got = compiled(feeds)["y"]
    assert compiled.stats(feeds).one_native_call
    assert compiled_alone == ['; ModuleID = "onnxsat_runner"']  # and no micro-kernel variant
    assert len(list(tmp_path.rglob("*.o"))) >= 4  # kernels, the runner, the conv's and the Gemm's variants
    np.testing.assert_allclose(got, ort_session(model).run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_inputs_are_not_modified_and_outputs_are_fresh() -> None:
    nodes, inputs = FUSION_CASES["bias-gelu"]
    model = _model(nodes, inputs, ["y"])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    before = {k: v.copy() for k, v in feeds.items()}
    compiled = CompiledModel(model, CompileOptions(threads=1, cache=False))
    y1 = compiled(feeds)["y"]
    y2 = compiled(feeds)["y"]
    assert y1 is not y2 and np.array_equal(y1, y2)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], before[k])


def test_max_reductions_vectorize_and_propagate_nan() -> None:
    """ReduceMax/Max follow numpy (a NaN anywhere gives NaN) and the row maximum of a softmax
    becomes a vector reduction (a scalar select chain cost the BERT softmax 2x)."""
    model = _model(
        [helper.make_node("ReduceMax", ["x"], ["r"], keepdims=0), helper.make_node("Max", ["x", "z"], ["m"]),
         helper.make_node("Softmax", ["x"], ["s"], axis=-1)],
        {"x": [4, 1000], "z": [4, 1000]}, ["r", "m", "s"],
    )
    rng = np.random.default_rng(0)
    x, z = rng.standard_normal((4, 1000)).astype(np.float32), rng.standard_normal((4, 1000)).astype(np.float32)
    x[1, 5], z[2, 7] = np.nan, np.nan
    compiled = CompiledModel(model, CompileOptions(threads=1, cache=False))
    got = compiled(x=x, z=z)
    np.testing.assert_array_equal(got["r"], np.max(x))  # no axes: over everything, so NaN
    np.testing.assert_array_equal(got["m"], np.maximum(x, z))
    module = compiled.executable_for({"x": x, "z": z}).module
    assert module is not None
    assert "llvm.vector.reduce.fmaximum" in module.optimized_ir()


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (13, 7, 45), (6, 64, 32), (65, 33, 100), (128, 96, 64), (400, 300, 70), (20, 2100, 50), (11, 20, 31), (130, 40, 64), (100, 17, 40), (15, 9, 33)]
)
def test_packed_gemm_micro_kernel(shape: tuple[int, int, int]) -> None:
    """Every row-tail height (M % 8), column tails (N % 48), several row and K blocks, against float64 numpy."""
    from onnxsat.kernels.gemm import pack_b, sgemm_function

    m, k, n = shape
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n + 3), np.nan, np.float32)  # ldc > n: the columns past n must stay untouched
    bp = pack_b(b)
    assert bp.ctypes.data % 64 == 0
    sgemm_function()(a.ctypes.data, k, bp.ctypes.data, k, c.ctypes.data, n + 3, m, n, 0, bp.shape[0])
    np.testing.assert_allclose(c[:, :n], a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4 * k)
    assert np.all(np.isnan(c[:, n:]))


def _masked_stores(assembly: str) -> list[str]:
    """x86 vector stores that write only some lanes: AVX's ``vmaskmovps`` to memory, AVX-512's
    stores under a ``{%k}`` mask."""
    stores = []
    for line in assembly.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0].startswith("v") and "mov" in words[0]:
            last = words[1].rsplit(",", 1)[-1]
            if ("maskmov" in words[0] and last.strip().endswith(")")) or ("{%k" in last and ")" in last):
                stores.append(line.strip())
    return stores


def test_an_in_place_select_is_not_a_masked_store() -> None:
    """``y[j] = y[j] > 0 ? y[j] : 0`` (the ReLU pass after a grouped conv's channel loop) stays a
    blend and a plain store: LLVM's code generator would make it a masked store, which AVX2
    runs microcoded (RegNet's grouped convs spent most of their time in it)."""
    from onnxsat.kernels.codegen import build_module
    from onnxsat.kernels.jit import assembly, host_target

    y, j = Buffer("y", "f32", (4096,)), Var("j")
    value = Load(y, j)
    relu = Select(Compare("gt", value, Const(0.0, "f32")), value, Const(0.0, "f32"))
    kernel = Kernel("relu_in_place", (y,), ("y",), "p", 1, (Loop("j", i64(4096), (Store(y, j, relu),)),))
    code = assembly(str(build_module([kernel])), host_target(), 3)
    assert "relu_in_place" in code
    assert _masked_stores(code) == []


def test_the_micro_kernel_stores_whole_vectors_plainly() -> None:
    """The packed micro-kernel (dense and channel-blocked C) stores a whole vector of C with a plain
    store and reads it back (a later K block, AVX-512's SiLU pass) with plain loads; only a panel's
    partial last vector takes masked ones (AVX2's masked stores cost the short-K products of
    MobileNet and EfficientNet two thirds of their time, the masked loads of the SiLU pass half of
    the rest)."""
    from onnxsat.kernels.gemm import build_module
    from onnxsat.kernels.jit import host_target, optimized_ir

    for blocked in (False, True):
        text = optimized_ir(str(build_module("bias_silu" if blocked else "none", blocked=blocked)), host_target(), 3)
        lines = [line.strip() for line in text.splitlines()]
        assert any(line.startswith("store <") and "x float>" in line for line in lines), "no plain vector store of C"
        assert "llvm.masked.store" in text  # the partial last vector
        if blocked:
            assert any(" = load <8 x float>" in line for line in lines), "no plain load of C"


def test_llvm_and_blas_gemm_paths_agree() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = _model(nodes, {"x": [2, 9, 40]}, ["y"])
    w = np.random.default_rng(1).standard_normal((40, 70)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 9, 40)).astype(np.float32)}
    llvm = CompiledModel(model, CompileOptions(threads=2, cache=False, gemm="llvm"))(feeds)["y"]
    blas = CompiledModel(model, CompileOptions(threads=2, cache=False, gemm="blas"))(feeds)["y"]
    np.testing.assert_allclose(llvm, blas, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(llvm, np.maximum(feeds["x"] @ w, 0), rtol=1e-5, atol=1e-5)


def test_blas_product_with_few_rows_is_split_by_columns() -> None:
    """A product whose A has fewer rows than two per thread runs as column blocks of B and C (B
    plain and transposed, with Gemm's bias through beta), against numpy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 150)).astype(np.float32)
    y = rng.standard_normal((150, 9000)).astype(np.float32)
    c = rng.standard_normal((9000,)).astype(np.float32)
    plain = _model([helper.make_node("MatMul", ["x", "y"], ["z"])], {"x": [3, 150], "y": [150, 9000]}, ["z"])
    gemm = _model([helper.make_node("Gemm", ["x", "yt", "c"], ["z"], transB=1, beta=0.5)], {"x": [3, 150], "yt": [9000, 150], "c": [9000]}, ["z"])
    for model, feeds, want in (
        (plain, {"x": x, "y": y}, x @ y),
        (gemm, {"x": x, "yt": np.ascontiguousarray(y.T), "c": c}, x @ y + 0.5 * c),
    ):
        serial = CompiledModel(model, CompileOptions(threads=1, cache=False)).executable_for(feeds).native
        compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
        native = compiled.executable_for(feeds).native
        assert native is not None and serial is not None and len(native.tasks) > len(serial.tasks)
        np.testing.assert_allclose(compiled(feeds)["z"], want, rtol=1e-4, atol=1e-3)


def test_wrong_input_dtype_is_a_clear_error() -> None:
    from onnxsat.base.errors import BadInputError

    nodes, inputs = FUSION_CASES["tanh-sigmoid-exp"]
    compiled = CompiledModel(_model(nodes, inputs, ["y"]), CompileOptions(threads=1, cache=False))
    with pytest.raises(BadInputError, match="dtype float64"):
        compiled(x=np.zeros((7, 9)))
