"""Layout and reduction lowerings on the shapes of an attention block: head split/merge reshapes
become loop nests over the real dims (no div/mod per element in the inner loop), softmax and
LayerNorm keep their fused prologues, and every program matches numpy when compiled."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.executable import compile_together
from onnxsat.lowering.kernel_ir import Binary, Expr, Kernel, Loop, Stmt, Var, dtype_of, walk_exprs
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep, MatMulStep
from onnxsat.lowering.values import common_refinement


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _shape(*dims: int) -> np.ndarray:
    return np.array(dims, np.int64)


n = helper.make_node
CASES = {
    # the attention output: heads merged back into the hidden dim
    "head-merge": (
        [n("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), n("Reshape", ["t", "s"], ["y"])],
        {"x": [1, 3, 8, 16]},
        {"s": _shape(1, 8, 48)},
        lambda x: x.transpose(0, 2, 1, 3).reshape(1, 8, 48),
    ),
    # a merge and a split in one reshape: common refinement (4, 6, 2, 5)
    "merge-and-split": (
        [n("Transpose", ["x"], ["t"], perm=[1, 0, 2]), n("Reshape", ["t", "s"], ["y"])],
        {"x": [6, 4, 10]},
        {"s": _shape(24, 2, 5)},
        lambda x: x.transpose(1, 0, 2).reshape(24, 2, 5),
    ),
    # a merge of a computed (not strided) tensor: concat along channels, then spatial dims merged
    "concat-merge": (
        [n("Concat", ["a", "b"], ["c"], axis=1), n("Reshape", ["c", "s"], ["y"])],
        {"a": [1, 2, 3, 5], "b": [1, 3, 3, 5]},
        {"s": _shape(1, 5, 15)},
        lambda a, b: np.concatenate([a, b], axis=1).reshape(1, 5, 15),
    ),
    # no common refinement (3 and 2 interleave): the flat-index form
    "no-refinement": (
        [n("Transpose", ["x"], ["t"], perm=[1, 0]), n("Reshape", ["t", "s"], ["y"])],
        {"x": [2, 3]},
        {"s": _shape(2, 3)},
        lambda x: x.T.reshape(2, 3),
    ),
    # a reshape of a merged tensor, then an elementwise consumer of the merged form
    "reshape-twice-then-add": (
        [
            n("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
            n("Reshape", ["t", "s"], ["r"]),
            n("Reshape", ["r", "s2"], ["r2"]),
            n("Add", ["r2", "b"], ["y"]),
        ],
        {"x": [2, 3, 4, 8], "b": [96]},
        {"s": _shape(2, 4, 24), "s2": _shape(2, 96)},
        lambda x, b: x.transpose(0, 2, 1, 3).reshape(2, 96) + b,
    ),
    "reshape-twice": (
        [n("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), n("Reshape", ["t", "s"], ["r"]), n("Reshape", ["r", "s2"], ["y"])],
        {"x": [2, 3, 4, 8]},
        {"s": _shape(2, 4, 24), "s2": _shape(8, 3, 8)},
        lambda x: x.transpose(0, 2, 1, 3).reshape(8, 3, 8),
    ),
    # head split with its bias add, then softmax with scale and mask (the attention prologue)
    "scaled-masked-softmax": (
        [
            n("Reshape", ["x", "s"], ["h"]),
            n("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
            n("Mul", ["t", "scale"], ["u"]),
            n("Add", ["u", "m"], ["v"]),
            n("Softmax", ["v"], ["y"], axis=-1),
        ],
        {"x": [1, 5, 24], "m": [1, 1, 1, 6]},
        {"s": _shape(1, 5, 4, 6), "scale": np.array(0.5, np.float32)},
        lambda x, m: _softmax(x.reshape(1, 5, 4, 6).transpose(0, 2, 1, 3) * 0.5 + m),
    ),
    # attention scores: the softmax overwrites the product it normalizes (nothing reads it later)
    "softmax-in-place": (
        [
            n("MatMul", ["a", "b"], ["s0"]),
            n("Mul", ["s0", "scale"], ["s1"]),
            n("Softmax", ["s1"], ["p"], axis=-1),
            n("MatMul", ["p", "c"], ["y"]),
        ],
        {"a": [2, 3, 4], "b": [2, 4, 5], "c": [2, 5, 6]},
        {"scale": np.array(0.5, np.float32)},
        lambda a, b, c: _softmax((a @ b) * 0.5) @ c,
    ),
    # ... along a middle axis too (rows interleave in memory; each element is still read first)
    "softmax-in-place-axis-1": (
        [n("MatMul", ["a", "b"], ["s0"]), n("Softmax", ["s0"], ["p"], axis=1), n("Neg", ["p"], ["y"])],
        {"a": [2, 3, 4], "b": [2, 4, 5]},
        {},
        lambda a, b: -np.moveaxis(_softmax(np.moveaxis(a @ b, 1, -1)), -1, 1),
    ),
    # ... but not when a later node still reads the product
    "softmax-input-read-later": (
        [
            n("MatMul", ["a", "b"], ["s0"]),
            n("Softmax", ["s0"], ["p"], axis=-1),
            n("Add", ["p", "s0"], ["y"]),
        ],
        {"a": [2, 3, 4], "b": [2, 4, 5]},
        {},
        lambda a, b: _softmax(a @ b) + a @ b,
    ),
    # post-LN residual block: the normalization overwrites the product (the residual input stays)
    "layernorm-in-place": (
        [
            n("MatMul", ["a", "w"], ["o"]),
            n("Add", ["o", "a"], ["r"]),
            n("LayerNormalization", ["r", "g", "be"], ["h"], axis=-1, epsilon=1e-12),
            n("Neg", ["h"], ["y"]),
        ],
        {"a": [2, 3, 40]},
        {
            "w": np.eye(40, dtype=np.float32)[::-1].copy(),
            "g": np.linspace(0.5, 1.5, 40, dtype=np.float32),
            "be": np.linspace(-1, 1, 40, dtype=np.float32),
        },
        lambda a: -_layer_norm(a[..., ::-1] + a, np.linspace(0.5, 1.5, 40), np.linspace(-1, 1, 40)),
    ),
    # attention scores with K^T from a biased head split: K is stored in its source order (a
    # bias add, not a transposing store) and the product reads it with a transpose flag
    "key-transpose-operand": (
        [
            n("Add", ["k0", "bk"], ["k1"]),
            n("Reshape", ["k1", "s"], ["k2"]),
            n("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
            n("Reshape", ["q0", "s"], ["q2"]),
            n("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
            n("MatMul", ["q", "kt"], ["y"]),
        ],
        {"k0": [1, 5, 24], "q0": [1, 5, 24]},
        {"s": _shape(1, 5, 4, 6), "bk": np.linspace(-1, 1, 24, dtype=np.float32)},
        lambda k0, q0: q0.reshape(1, 5, 4, 6).transpose(0, 2, 1, 3)
        @ (k0 + np.linspace(-1, 1, 24, dtype=np.float32)).reshape(1, 5, 4, 6).transpose(0, 2, 3, 1),
    ),
    "residual-layernorm-3d": (
        [n("Add", ["x", "r"], ["a"]), n("LayerNormalization", ["a", "g", "be"], ["y"], axis=-1, epsilon=1e-12)],
        {"x": [2, 3, 40], "r": [2, 3, 40]},
        {"g": np.linspace(0.5, 1.5, 40, dtype=np.float32), "be": np.linspace(-1, 1, 40, dtype=np.float32)},
        lambda x, r: _layer_norm(x + r, np.linspace(0.5, 1.5, 40), np.linspace(-1, 1, 40)),
    ),
    # RMSNorm after a residual Add (its prologue), and the fused residual form that stores the sum too
    "rms-norm": (
        [n("Add", ["x", "r"], ["a"]), n("RMSNormalization", ["a", "g"], ["y"], epsilon=1e-6)],
        {"x": [2, 3, 40], "r": [2, 3, 40]},
        {"g": np.linspace(0.5, 1.5, 40, dtype=np.float32)},
        lambda x, r: _rms_norm(x + r, np.linspace(0.5, 1.5, 40)),
    ),
    "skip-rms-norm": (
        [
            n("onnxsat.FusedSkipRMSNorm", ["x", "r", "g"], ["h", "s"], epsilon=1e-6),
            n("Mul", ["h", "s"], ["y"]),
        ],
        {"x": [2, 3, 40], "r": [2, 3, 40]},
        {"g": np.linspace(0.5, 1.5, 40, dtype=np.float32)},
        lambda x, r: _rms_norm(x + r, np.linspace(0.5, 1.5, 40)) * (x + r),
    ),
}


def _rms_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-12) * g + b


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[object, object]]:
    """Every case lowered and compiled in one LLVM module (one compile for the whole file)."""
    programs = {}
    for name, (nodes, inputs, inits, _) in CASES.items():
        programs[name] = lower(_model(nodes, inputs, inits), {k: tuple(v) for k, v in inputs.items()})
    exes = compile_together(list(programs.values()), None, CompileOptions(threads=1, cache=False))
    return {name: (programs[name], exe) for name, exe in zip(programs, exes, strict=True)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_and_reduce_lowerings_match_numpy(name: str, compiled: dict[str, tuple[object, object]]) -> None:
    _, inputs, _, reference = CASES[name]
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs.items()}
    _, exe = compiled[name]
    got = exe.run(feeds)["y"]  # type: ignore[attr-defined]
    want = reference(*feeds.values())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _innermost_loops(body: tuple[Stmt, ...]) -> Iterator[Loop]:
    for s in body:
        if isinstance(s, Loop):
            inner = [x for x in s.body if isinstance(x, Loop)]
            if inner:
                yield from _innermost_loops(s.body)
            else:
                yield s


def _subtree(e: object) -> Iterator[object]:
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if hasattr(x, "__dataclass_fields__") and not isinstance(x, Var):
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__ if f not in ("buffer", "op", "dtype", "name"))


def _divides(e: Expr, var: str) -> bool:
    """Whether ``e`` has an index div/mod whose operand depends on loop variable ``var``."""
    return any(
        isinstance(x, Binary)
        and x.op in ("div", "mod")
        and dtype_of(x) == "i64"
        and any(isinstance(v, Var) and v.name == var for v in _subtree(x.a))
        for x in _subtree(e)
    )


def _kernels(program: object) -> list[Kernel]:
    return [s.kernel for s in program.steps if isinstance(s, KernelStep)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["head-merge", "merge-and-split", "reshape-twice", "concat-merge"])
def test_merging_reshapes_loop_over_the_real_dims(name: str, compiled: dict[str, tuple[object, object]]) -> None:
    """A merge of non-adjacent dims is stored by a nest over the finer shape: the inner loop has
    a unit-stride store and no div/mod (the flat-index form paid one per element)."""
    program, _ = compiled[name]
    (kernel,) = _kernels(program)
    loops = list(_innermost_loops(kernel.body))
    assert loops
    for loop in loops:
        assert not any(_divides(e, loop.var) for e in walk_exprs(loop.body)), name


def test_flat_index_form_is_kept_where_no_refinement_exists(compiled: dict[str, tuple[object, object]]) -> None:
    """The test above can fail: without a common refinement the inner loop divides."""
    program, _ = compiled["no-refinement"]
    (kernel,) = _kernels(program)
    assert any(_divides(e, loop.var) for loop in _innermost_loops(kernel.body) for e in walk_exprs(loop.body))


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ((1, 512, 12, 64), (1, 512, 768), (512, 12, 64)),
        ((4, 6, 10), (24, 2, 5), (4, 6, 2, 5)),
        ((2, 3), (3, 2), None),
        ((1, 1), (1,), ()),
        ((0, 3), (3, 0), None),
    ],
)
def test_common_refinement(a: tuple[int, ...], b: tuple[int, ...], want: tuple[int, ...] | None) -> None:
    assert common_refinement(a, b) == want


@pytest.mark.parametrize(
    ("name", "in_place"),
    [
        ("softmax-in-place", True),
        ("softmax-in-place-axis-1", True),
        ("softmax-input-read-later", False),
        ("layernorm-in-place", True),
    ],
)
def test_row_kernels_overwrite_a_dead_input_only(
    name: str, in_place: bool, compiled: dict[str, tuple[object, object]]
) -> None:
    """Softmax and LayerNorm write over the product they normalize when nothing reads it later."""
    program, _ = compiled[name]
    (kernel,) = [k for k in _kernels(program) if k.name.startswith(("softmax", "layernorm"))]
    reads = {b.name for b in kernel.params if b.name not in kernel.outputs}
    matmul_out = program.steps[0].out.name  # type: ignore[attr-defined]
    assert (kernel.outputs[0] == matmul_out) is in_place
    assert (matmul_out in reads) is not in_place


def test_transposed_operand_is_stored_in_source_order(compiled: dict[str, tuple[object, object]]) -> None:
    """K^T of a biased head split is stored as (seq, heads, dim), the layout K already has, and
    passed to the product through strides (unit stride along the product's k dim); Q, a plain
    view, is passed as it is."""
    program, _ = compiled["key-transpose-operand"]
    (kernel,) = _kernels(program)
    (step,) = [s for s in program.steps if isinstance(s, MatMulStep)]  # type: ignore[attr-defined]
    assert step.b.buffer.name == kernel.outputs[0]
    assert step.b.buffer.shape == (1, 5, 4, 6)
    assert step.b.shape == (1, 4, 6, 5) and step.b.strides == (120, 6, 1, 24)
    assert step.a.buffer.shape == (1, 5, 24)
    (loop,) = _innermost_loops(kernel.body)
    assert not any(_divides(e, loop.var) for e in walk_exprs(loop.body))
