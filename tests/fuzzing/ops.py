"""Generators of single modelled ops: each picks inputs that fit from the builder's pool and
emits one node (or a short fixed chain: a transpose pair, MatMul + bias, Conv + BatchNorm)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import numpy_helper

from .builder import (
    BATCH,
    FLOATS,
    INTS,
    MAX_DIM,
    NP_TYPES,
    Dim,
    Dims,
    GraphBuilder,
    Tensor,
    broadcast,
    concrete,
    divisors,
    image_dims,
    is_image,
    is_matrix,
    product,
    runs,
)

# ------------------------------------------------------------------------------ single ops
UNARY = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Neg",
    "Exp",
    "Abs",
    "Sqrt",
    "Log",
    "Reciprocal",
    "Erf",
    "Identity",
    "LeakyRelu",
    "Softmax",
    "Dropout",
]
_OUT_SIGN = {
    "Relu": "nonneg",
    "Abs": "nonneg",
    "Sqrt": "nonneg",
    "Sigmoid": "pos",
    "Exp": "pos",
    "Softmax": "pos",
    "Reciprocal": "pos",
}


def gen_unary(b: GraphBuilder, op: str) -> None:
    x = b.pick(lambda t: runs(op, t.dtype) and (t.dtype in FLOATS or op in ("Neg", "Abs", "Identity")))
    if x is None:
        return
    if op in ("Log", "Reciprocal") and x.sign != "pos":  # keep values finite
        x = b.node1("Exp", [x.name], x.dims, x.dtype, sign="pos")
    if op == "Sqrt" and not x.sign:
        x = b.node1("Abs", [x.name], x.dims, x.dtype, sign="nonneg")
    attrs: dict[str, Any] = {}
    if op == "LeakyRelu":
        attrs["alpha"] = b.choice([0.01, 0.2, -0.5])
    if op == "Softmax" and x.rank:
        attrs["axis"] = b.integer(-x.rank, x.rank - 1)
    if op == "Softmax" and not x.rank:
        return
    sign = x.sign if op in ("Identity", "Dropout") or (x.sign == "pos" and op in ("Relu", "Abs")) else ""
    outs: list[tuple[Dims, int]] = [(x.dims, x.dtype)]
    if op == "Dropout" and b.flag():
        outs.append((x.dims, TP.BOOL))  # an unused mask output
    b.node(op, [x.name], outs, sign=sign or _OUT_SIGN.get(op, ""), **attrs)


def gen_clip(b: GraphBuilder) -> None:
    x = b.pick(lambda t: t.dtype in (TP.FLOAT, TP.DOUBLE))
    if x is None:
        return
    lo, hi = b.choice([(-1.0, 1.0), (0.0, 6.0), (-2.0, 0.0)])
    mode = b.choice(["both", "min", "max"])
    bound = lambda v: b.const(np.array(v, NP_TYPES[x.dtype]), pool=False).name  # noqa: E731
    inputs = [x.name, bound(lo) if mode != "max" else "", *([bound(hi)] if mode != "min" else [])]
    b.node1("Clip", inputs, x.dims, x.dtype, sign="nonneg" if mode != "max" and lo >= 0 else "")


BINARY = ["Add", "Mul", "Sub", "Div", "Pow"]


def gen_binary(b: GraphBuilder, op: str) -> None:
    ok = FLOATS if op == "Pow" else FLOATS + INTS
    x = b.pick(lambda t: runs(op, t.dtype) and t.dtype in ok)
    if x is None:
        return
    y: Tensor | None = None
    mode = b.choice(["splat", "tensor", "const"])
    if op == "Pow":  # whole exponents (any base), 0.5 only of a non-negative base
        y = b.splat(b.choice([2.0, 3.0, 1.0] + ([0.5] if x.sign else [])), b.partner_dims(x.dims), x.dtype)
    elif mode == "tensor":  # divisors must be positive (integer inputs may be 0)
        y = b.pick(
            lambda t: (
                t.dtype == x.dtype
                and broadcast(x.dims, t.dims) is not None
                and (op != "Div" or t.sign == "pos")
            ),
            allow_const=True,
        )
    if y is None and mode == "splat":
        values = (
            ([1.0, 2.0, 0.5] if x.dtype in FLOATS else [1.0, 2.0, 3.0])
            if op == "Div"
            else [0.0, 1.0, -1.0, 2.0]
        )
        y = b.splat(b.choice(values), b.partner_dims(x.dims), x.dtype)
    if y is None:
        y = b.weight(b.partner_dims(x.dims), x.dtype, sign="pos" if op == "Div" else "")
    dims = broadcast(x.dims, y.dims)
    if dims is None:
        return
    pos = op in ("Add", "Mul", "Div") and x.sign == "pos" and y.sign == "pos"
    b.node1(
        op,
        [y.name, x.name] if op in ("Add", "Mul") and b.flag() else [x.name, y.name],
        dims,
        x.dtype,
        sign="pos" if pos else "",
    )


def _matmul_dims(a: Dims, w: Dims) -> Dims | None:
    a2, w2 = ((1, *a) if len(a) == 1 else a), ((*w, 1) if len(w) == 1 else w)
    batch = broadcast(a2[:-2], w2[:-2])
    if a2[-1] != w2[-2] or not isinstance(a2[-1], int) or batch is None:
        return None
    out = [*batch, a2[-2], w2[-1]]
    if len(w) == 1:
        out.pop()
    if len(a) == 1:
        out.pop(-2 if len(w) > 1 else -1)
    return tuple(out)


def gen_matmul(b: GraphBuilder) -> None:
    x = b.pick(
        lambda t: t.dtype in (TP.FLOAT, TP.DOUBLE) + INTS and t.rank >= 1 and isinstance(t.dims[-1], int)
    )
    if x is None:
        return
    w = (
        b.pick(
            lambda t: t.dtype == x.dtype and t.rank >= 1 and _matmul_dims(x.dims, t.dims) is not None,
            allow_const=True,
        )
        if b.flag()
        else None
    )
    if w is None:
        k = int(x.dims[-1])
        w = b.weight(b.choice([(k, b.integer(1, MAX_DIM)), (k,)]), x.dtype)
    dims = _matmul_dims(x.dims, w.dims)
    assert dims is not None
    y = b.node1("MatMul", [x.name, w.name], dims, x.dtype)
    if dims and b.flag():  # + bias: matmul-add-to-gemm
        bias = b.weight(
            b.choice([concrete(dims[-1:]), (1, *concrete(dims[-1:])), concrete(dims), ()]), x.dtype
        )
        out = broadcast(dims, bias.dims)
        if out is not None:
            b.node1("Add", [y.name, bias.name] if b.flag() else [bias.name, y.name], out, x.dtype)


def gen_gemm(b: GraphBuilder) -> None:
    a = b.pick_or_input(is_matrix, lambda b: (b.integer(1, 4), b.integer(1, 4)))
    if a is None or not isinstance(a.dims[0], int) and b.flag():
        return
    trans_a, trans_b = (b.flag() and isinstance(a.dims[0], int)), b.flag()
    m, k = (a.dims[1], a.dims[0]) if trans_a else a.dims
    n = b.integer(1, MAX_DIM)
    inputs = [a.name, b.weight((n, int(k)) if trans_b else (int(k), n)).name]
    attrs: dict[str, Any] = {"transA": int(trans_a), "transB": int(trans_b)}
    if b.flag():
        attrs["alpha"] = b.choice([0.5, 2.0])
    if b.flag():
        inputs.append(b.weight(b.choice([(n,), (1, n), ()] + ([(m, n)] if isinstance(m, int) else []))).name)
        attrs["beta"] = b.choice([1.0, 0.5, 0.0])
    b.node1("Gemm", inputs, (m, n), TP.FLOAT, **attrs)


def conv(
    b: GraphBuilder,
    x: Tensor,
    m: int,
    kernel: int,
    pad: int,
    stride: int = 1,
    group: int = 1,
    weight: Tensor | None = None,
    bias: bool = False,
) -> Tensor | None:
    """Conv of ``x`` (square kernel, symmetric pads), or None when the window does not fit."""
    n, c = x.rank - 2, int(x.dims[1])
    spatial = [(int(d) + 2 * pad - kernel) // stride + 1 for d in x.dims[2:]]
    if min(spatial) < 1:
        return None
    weight = weight or b.weight((m, c // group, *[kernel] * n))
    inputs = [x.name, weight.name] + ([b.weight((m,)).name] if bias else [])
    attrs = {"pads": [pad] * (2 * n), "strides": [stride] * n, **({"group": group} if group > 1 else {})}
    return b.node1("Conv", inputs, (x.dims[0], m, *spatial), TP.FLOAT, **attrs)


def batch_norm(b: GraphBuilder, x: Tensor) -> Tensor:
    c = int(x.dims[1])
    stats = [b.weight((c,)), b.weight((c,)), b.weight((c,)), b.weight((c,), sign="pos")]
    return b.node1(
        "BatchNormalization",
        [x.name, *[s.name for s in stats]],
        x.dims,
        x.dtype,
        epsilon=b.choice([1e-5, 1e-3]),
    )


def gen_conv(b: GraphBuilder) -> None:
    x = b.pick_or_input(is_image, image_dims)
    if x is None:
        return
    c = int(x.dims[1])
    group = b.choice(divisors(c)) if b.flag() else 1
    kernel = b.integer(1, 3)
    y = conv(
        b, x, group * b.integer(1, 2), kernel, b.integer(0, kernel - 1), b.integer(1, 2), group, bias=b.flag()
    )
    if y is not None and b.flag():
        batch_norm(b, y)


def gen_pool(b: GraphBuilder, op: str) -> None:
    x = b.pick_or_input(is_image, image_dims)
    if x is None:
        return
    if op == "GlobalAveragePool":
        b.node1(op, [x.name], (*x.dims[:2], *[1] * (x.rank - 2)), TP.FLOAT)
        return
    k, s, n = b.integer(1, 3), b.integer(1, 2), x.rank - 2
    pad = b.integer(0, k - 1)
    spatial = [(int(d) + 2 * pad - k) // s + 1 for d in x.dims[2:]]
    if min(spatial) < 1:
        return
    attrs: dict[str, Any] = {"kernel_shape": [k] * n, "pads": [pad] * 2 * n, "strides": [s] * n}
    if op == "AveragePool" and b.flag():
        attrs["count_include_pad"] = 1
    b.node1(op, [x.name], (*x.dims[:2], *spatial), TP.FLOAT, **attrs)


def gen_layer_norm(b: GraphBuilder) -> None:
    x = b.pick(lambda t: t.dtype == TP.FLOAT and t.rank >= 1 and isinstance(t.dims[-1], int))
    if x is not None and b.opset >= 17:
        scale, bias = b.weight(concrete(x.dims[-1:])), b.weight(concrete(x.dims[-1:]))
        b.node1("LayerNormalization", [x.name, scale.name, bias.name], x.dims, TP.FLOAT, axis=-1)


def gen_conv_transpose(b: GraphBuilder) -> None:
    x = b.pick_or_input(is_image, image_dims)
    if x is None:
        return
    n, m, k, s = x.rank - 2, b.integer(1, 3), b.integer(1, 3), b.integer(1, 2)
    pad = b.integer(0, k - 1)
    spatial = [(int(d) - 1) * s - 2 * pad + k for d in x.dims[2:]]
    if min(spatial) < 1:
        return
    inputs = [x.name, b.weight((int(x.dims[1]), m, *[k] * n)).name] + (
        [b.weight((m,)).name] if b.flag() else []
    )
    attrs = {"pads": [pad] * 2 * n, "strides": [s] * n}
    b.node1("ConvTranspose", inputs, (x.dims[0], m, *spatial), TP.FLOAT, **attrs)


def gen_lrn(b: GraphBuilder) -> None:
    x = b.pick_or_input(lambda t: is_image(t) and t.rank == 4, image_dims)
    if x is not None:
        b.node1("LRN", [x.name], x.dims, TP.FLOAT, size=b.choice([1, 3]), alpha=1e-3, beta=0.75, bias=1.0)


def gen_gelu(b: GraphBuilder) -> None:
    x = b.pick(lambda t: t.dtype == TP.FLOAT)
    if x is not None and b.opset >= 20:
        b.node1("Gelu", [x.name], x.dims, TP.FLOAT, approximate=b.choice(["none", "tanh"]))


# ------------------------------------------------------------------------------ layout ops
def gen_transpose(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Transpose", t.dtype) and t.rank >= 1)
    if x is None:
        return
    perm = b.perm(x.rank)
    y = b.node1("Transpose", [x.name], tuple(x.dims[p] for p in perm), x.dtype, sign=x.sign, perm=perm)
    if b.flag():  # a pair: composes, or cancels when the second is the inverse
        second = b.perm(x.rank) if b.flag() else [int(p) for p in np.argsort(perm)]
        b.node1("Transpose", [y.name], tuple(y.dims[p] for p in second), x.dtype, sign=x.sign, perm=second)


def _factor(b: GraphBuilder, n: int, rank: int) -> list[int]:
    """``rank`` dims whose product is ``n``."""
    dims = []
    for _ in range(rank - 1):
        dims.append(b.choice(divisors(n)))
        n //= dims[-1]
    return [*dims, n] if rank else []


def gen_reshape(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Reshape", t.dtype) and sum(not isinstance(d, int) for d in t.dims) <= 1)
    if x is None:
        return
    total = math.prod(d for d in x.dims if isinstance(d, int))
    if all(isinstance(d, int) for d in x.dims):
        dims: list[Dim] = list(_factor(b, total, b.integer(0 if total == 1 else 1, 4)))
        target = [int(d) for d in dims]
        if target and b.flag():
            target[b.integer(0, len(target) - 1)] = -1
    else:  # the batch dim stays a -1 (or a 0 where it stays in place)
        rest = _factor(b, total, b.integer(0 if total == 1 else 1, 3))
        at = b.integer(0, len(rest))
        dims, target = [*rest[:at], BATCH, *rest[at:]], [*rest[:at], -1, *rest[at:]]
        if at < x.rank and x.dims[at] == BATCH and b.flag():
            target[at] = 0
    b.node1("Reshape", [x.name, b.ints(target)], tuple(dims), x.dtype, sign=x.sign)


def gen_flatten(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Flatten", t.dtype) and t.rank >= 1)
    if x is None:
        return
    axis = b.integer(0, x.rank)
    left, right = product(x.dims[:axis]), product(x.dims[axis:])
    if left is not None and right is not None:
        b.node1("Flatten", [x.name], (left, right), x.dtype, sign=x.sign, axis=axis)


def gen_squeeze_unsqueeze(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Squeeze", t.dtype) and (1 in t.dims or t.rank < 4))
    if x is None:
        return
    ones = [i for i, d in enumerate(x.dims) if d == 1]
    if ones and b.flag():
        axes = sorted(b.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True)))
        dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
        b.node1("Squeeze", [x.name, b.ints([a - x.rank if b.flag() else a for a in axes])], dims, x.dtype)
    elif x.rank < 4:
        axis = b.integer(0, x.rank)
        b.node1(
            "Unsqueeze", [x.name, b.ints([axis])], (*x.dims[:axis], 1, *x.dims[axis:]), x.dtype, sign=x.sign
        )


def same_but(x: Tensor, axis: int) -> Callable[[Tensor], bool]:
    """Tensors that concatenate with ``x`` along ``axis``."""
    return lambda t: (
        t.dtype == x.dtype
        and t.rank == x.rank
        and isinstance(t.dims[axis], int)
        and all(p == q for i, (p, q) in enumerate(zip(t.dims, x.dims, strict=True)) if i != axis)
    )


def gen_concat(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Concat", t.dtype) and any(isinstance(d, int) for d in t.dims))
    if x is None:
        return
    axis = b.choice([i for i, d in enumerate(x.dims) if isinstance(d, int)])
    parts = [x]
    for _ in range(b.integer(1, 2)):
        other = b.pick(same_but(x, axis), allow_const=True) if b.flag() else None
        if other is None and all(isinstance(d, int) for d in x.dims):
            other = b.weight(
                tuple(b.integer(1, 2) if i == axis else d for i, d in enumerate(concrete(x.dims))), x.dtype
            )
        parts.append(other or x)
    dims = tuple(sum(int(p.dims[axis]) for p in parts) if i == axis else d for i, d in enumerate(x.dims))
    b.node1("Concat", [p.name for p in parts], dims, x.dtype, axis=axis - x.rank if b.flag() else axis)


def gen_split(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Split", t.dtype) and any(isinstance(d, int) and d >= 2 for d in t.dims))
    if x is None:
        return
    axis = b.choice([i for i, d in enumerate(x.dims) if isinstance(d, int) and d >= 2])
    d = int(x.dims[axis])
    cut = sorted(b.draw(st.lists(st.integers(1, d - 1), min_size=1, max_size=min(2, d - 1), unique=True)))
    sizes = [q - p for p, q in zip([0, *cut], [*cut, d], strict=True)]
    inputs = [x.name] + ([b.ints(sizes)] if len(set(sizes)) > 1 or b.flag() else [])
    outs = [(tuple(s if i == axis else e for i, e in enumerate(x.dims)), x.dtype) for s in sizes]
    attrs = {"num_outputs": len(sizes)} if b.opset >= 18 and len(inputs) == 1 else {}
    b.node("Split", inputs, outs, sign=x.sign, axis=axis, **attrs)


def gen_slice(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Slice", t.dtype) and any(isinstance(d, int) for d in t.dims))
    if x is None:
        return
    axis = b.choice([i for i, d in enumerate(x.dims) if isinstance(d, int)])
    d = int(x.dims[axis])
    first, step = b.integer(0, d - 1), b.choice([1, 1, 2, -1])
    if step > 0:  # ends past the dim are clamped; negative starts count from the end
        stop = b.integer(first + 1, d)
        start, end, n = b.choice([first, first - d]), (2**63 - 1 if stop == d and b.flag() else stop), 0
        n = -(-(stop - first) // step)
    else:
        stop = b.integer(-1, first - 1)
        start, end, n = first, (stop if stop >= 0 else -(2**63)), first - stop
    inputs = [x.name, b.ints([start]), b.ints([end]), b.ints([axis - x.rank if b.flag() else axis])]
    if step != 1 or b.flag():
        inputs.append(b.ints([step]))
    dims = tuple(n if i == axis else e for i, e in enumerate(x.dims))
    b.node1("Slice", inputs, dims, x.dtype, sign=x.sign)


def gen_gather(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Gather", t.dtype) and any(isinstance(d, int) for d in t.dims))
    if x is None:
        return
    axis = b.choice([i for i, d in enumerate(x.dims) if isinstance(d, int)])
    shape = b.choice([(), (b.integer(1, 3),), (2, 2)])
    idx = b.const(
        np.asarray(b.rng.integers(-int(x.dims[axis]), int(x.dims[axis]), shape), np.int64), pool=False
    )
    dims = (*x.dims[:axis], *shape, *x.dims[axis + 1 :])
    b.node1("Gather", [x.name, idx.name], dims, x.dtype, sign=x.sign, axis=axis)


def gen_expand(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Expand", t.dtype) and t.rank <= 3)
    if x is None:
        return
    target = [
        b.choice([1, 2, 3]) if d == 1 else (b.choice([d, 1]) if isinstance(d, int) else 1) for d in x.dims
    ]
    if b.flag():
        target.insert(0, b.integer(1, 3))
    dims = broadcast(x.dims, tuple(target))
    assert dims is not None
    b.node1("Expand", [x.name, b.ints(target)], dims, x.dtype, sign=x.sign)


def gen_pad(b: GraphBuilder) -> None:
    x = b.pick(lambda t: t.dtype in (TP.FLOAT, TP.DOUBLE) and 1 <= t.rank <= 4)
    if x is None:
        return
    mode = b.choice(["constant", "constant", "reflect", "edge"])
    pads = [
        0 if not isinstance(d, int) else b.integer(0, min(2, d - 1) if mode == "reflect" else 2)
        for d in x.dims
        for _ in (0, 1)
    ]
    begin, end = pads[0::2], pads[1::2]
    inputs = [x.name, b.ints(begin + end)]
    if mode == "constant" and b.flag():
        inputs.append(b.const(np.array(b.choice([0.0, 1.5]), NP_TYPES[x.dtype]), pool=False).name)
    dims = tuple(
        d if not isinstance(d, int) else d + p + q for d, p, q in zip(x.dims, begin, end, strict=True)
    )
    b.node1("Pad", inputs, dims, x.dtype, mode=mode)


def gen_reduce(b: GraphBuilder, op: str) -> None:
    x = b.pick(lambda t: runs(op, t.dtype) and t.rank >= 1)
    if x is None:
        return
    axes = sorted(b.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, unique=True)))
    keep = b.flag()
    dims = tuple(1 if i in axes else d for i, d in enumerate(x.dims) if keep or i not in axes)
    axes_arg = [a - x.rank if b.flag() else a for a in axes]
    if op == "ReduceSum" or b.opset >= 18:
        b.node1(op, [x.name, b.ints(axes_arg)], dims, x.dtype, keepdims=int(keep))
    else:
        b.node1(op, [x.name], dims, x.dtype, keepdims=int(keep), axes=axes_arg)


def gen_cast(b: GraphBuilder) -> None:
    x = b.pick(lambda t: True)
    if x is None:
        return
    # Not float32/16 -> float64: verification holds the result to float64's tolerance
    # (test_fuzz_regressions.py::test_float32_math_cast_to_float64).
    targets = [TP.FLOAT, TP.INT64, TP.BOOL, TP.INT32, x.dtype] + (
        [TP.FLOAT16] if x.dtype != TP.DOUBLE else []
    )
    to = b.choice(targets + ([TP.DOUBLE] if x.dtype not in (TP.FLOAT, TP.FLOAT16) else []))
    if x.dtype == TP.FLOAT16 and to in INTS:
        to = TP.FLOAT
    b.node1("Cast", [x.name], x.dims, to, sign=x.sign if to in FLOATS and x.dtype in FLOATS else "", to=to)


def gen_where(b: GraphBuilder) -> None:
    x = b.pick(lambda t: runs("Where", t.dtype) and t.dtype != TP.BOOL)
    if x is None:
        return
    cond = b.pick(lambda t: t.dtype == TP.BOOL and broadcast(t.dims, x.dims) is not None, allow_const=True)
    cond = cond or b.weight(b.partner_dims(x.dims), TP.BOOL)
    y = b.pick(
        lambda t: t.dtype == x.dtype and broadcast(t.dims, x.dims, cond.dims) is not None, allow_const=True
    )
    dims = broadcast(cond.dims, x.dims, y.dims) if y is not None else None
    if y is not None and dims is not None:
        b.node1("Where", [cond.name, x.name, y.name], dims, x.dtype, sign=x.sign if x.sign == y.sign else "")


def gen_shape_chain(b: GraphBuilder) -> None:
    """Shape -> Gather -> Concat -> Reshape (PyTorch's export of a view keeping the leading dims),
    or Shape -> ConstantOfShape -> Mul/Add (ones/zeros like a tensor)."""
    x = b.pick(lambda t: runs("Reshape", t.dtype) and t.rank >= 1 and t.dtype != TP.BOOL)
    if x is None:
        return
    shape = b.node("Shape", [x.name], [((x.rank,), TP.INT64)], pool=False)[0]
    if b.flag() and x.dtype in (TP.FLOAT, TP.DOUBLE):
        value = numpy_helper.from_array(np.array([b.choice([0.0, 1.0])], NP_TYPES[x.dtype]), "value")
        like = b.node("ConstantOfShape", [shape.name], [(x.dims, x.dtype)], pool=False, value=value)[0]
        b.node1(b.choice(["Mul", "Add"]), [x.name, like.name], x.dims, x.dtype)
        return
    keep = b.integer(0, x.rank - 1)
    rest = product(x.dims[keep:])
    if not isinstance(rest, int) or keep == 0:
        return
    lead = b.node("Gather", [shape.name, b.ints(list(range(keep)))], [((keep,), TP.INT64)], pool=False)[0]
    tail = _factor(b, rest, b.integer(1, 2))
    written = [-1 if i == 0 and b.flag() else d for i, d in enumerate(tail)]
    target = b.node(
        "Concat", [lead.name, b.ints(written)], [((keep + len(tail),), TP.INT64)], pool=False, axis=0
    )
    b.node1("Reshape", [x.name, target[0].name], (*x.dims[:keep], *tail), x.dtype, sign=x.sign)


def gen_repeat(b: GraphBuilder) -> None:
    """Repeat an earlier single-output node verbatim (a common subexpression)."""
    made = {t.name: t for t in b.pool}
    singles = [n for n in b.nodes if len(n.output) == 1 and n.output[0] in made]
    if singles:
        node = singles[b.integer(0, len(singles) - 1)]
        src = made[node.output[0]]
        copy = b.node(node.op_type, list(node.input), [(src.dims, src.dtype)], sign=src.sign)[0]
        b.nodes[-1].attribute.extend(node.attribute)
        copy.const = src.const
