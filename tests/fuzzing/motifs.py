"""Motifs: the op chains the rule families match, so random graphs make the rules fire.

Each motif draws one of a few variants of a family (algebraic identities, MatMul/Gemm algebra,
Conv weight algebra and Pad/BatchNorm folding, parallel branches for the multi-pattern merges,
transpose sinking and view chains, shape arithmetic); the rest of the graph is random around it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto as TP

from .builder import (
    INTS,
    MAX_DIM,
    Dims,
    GraphBuilder,
    Tensor,
    broadcast,
    concrete,
    image_dims,
    is_image,
    is_matrix,
)
from .ops import batch_norm, conv, same_but

F = TP.FLOAT


def _emit(b: GraphBuilder, op: str, u: Tensor, v: Tensor) -> Tensor | None:
    dims = broadcast(u.dims, v.dims)
    return None if dims is None else b.node1(op, [u.name, v.name], dims, u.dtype)


def motif_algebra(b: GraphBuilder) -> None:
    """(x op a) op b with constants, x*a + x*b, negation forms, relu(x) - relu(-x), abs chains."""
    kind = b.choice(["const-chain", "mul-factor", "neg", "relu-difference", "abs", "double"])
    x = b.pick(lambda t: t.dtype in (F, TP.DOUBLE) + (INTS if kind in ("const-chain", "mul-factor") else ()))
    if x is None:
        return
    const = lambda sign="": b.weight(b.partner_dims(x.dims), x.dtype, sign=sign)  # noqa: E731
    if kind == "const-chain":
        first = b.choice(["Add", "Mul", "Sub", "Div"])
        y = _emit(b, first, x, const("pos" if first == "Div" else ""))
        second = b.choice(["Add", "Mul", "Sub", "Div"])
        if y is not None:
            _emit(b, second, y, const("pos" if second == "Div" else ""))
    elif kind == "mul-factor":
        p, q = _emit(b, "Mul", x, const()), _emit(b, "Mul", x, const())
        if p is not None and q is not None:
            _emit(b, "Add", p, q)
    elif kind == "neg":
        y = (
            b.pick(lambda t: t.dtype == x.dtype and broadcast(t.dims, x.dims) is not None, allow_const=True)
            or x
        )
        form = b.choice(["neg-sub", "add-neg", "sub-neg", "mul-negs", "div-negs"])
        neg_y = b.node1("Neg", [y.name], y.dims, x.dtype)
        if form == "neg-sub":
            d = _emit(b, "Sub", x, y)
            if d is not None:
                b.node1("Neg", [d.name], d.dims, x.dtype)
        elif form in ("add-neg", "sub-neg"):
            _emit(b, "Add" if form == "add-neg" else "Sub", *((x, neg_y) if b.flag() else (neg_y, x)))
        else:
            neg_x = b.node1("Neg", [x.name], x.dims, x.dtype)
            _emit(b, "Div" if form == "div-negs" and y.sign == "pos" else "Mul", neg_x, neg_y)
    elif kind == "relu-difference":
        r1 = b.node1("Relu", [x.name], x.dims, x.dtype, sign="nonneg")
        r2 = b.node1("Relu", [b.node1("Neg", [x.name], x.dims, x.dtype).name], x.dims, x.dtype, sign="nonneg")
        b.node1("Sub", [r1.name, r2.name], x.dims, x.dtype)
    else:  # abs(abs/neg x), neg(neg x), relu(relu x)
        op = {"abs": "Abs", "double": b.choice(["Neg", "Relu"])}[kind]
        inner = b.node1(b.choice(["Abs", "Neg"]) if op == "Abs" else op, [x.name], x.dims, x.dtype)
        b.node1(op, [inner.name], x.dims, x.dtype)


def motif_matmul(b: GraphBuilder) -> None:
    """x@a + x@b, a@x + b@x, (x@W1)@W2, w^T @ x^T, Transpose into Gemm, Gemm * s or + bias."""
    x = b.pick_or_input(is_matrix, lambda b: (b.integer(1, 4), b.integer(1, 4)))
    if x is None:
        return
    m, k = x.dims
    n = b.integer(1, MAX_DIM)
    kind = b.choice(["factor", "factor-left", "assoc", "transposes", "gemm-trans", "gemm-then"])
    if kind == "factor":
        y1 = b.node1("MatMul", [x.name, b.weight((int(k), n)).name], (m, n), F)
        y2 = b.node1("MatMul", [x.name, b.weight((int(k), n)).name], (m, n), F)
        b.node1("Add", [y1.name, y2.name], (m, n), F)
    elif kind == "factor-left" and isinstance(m, int):
        y1 = b.node1("MatMul", [b.weight((n, m)).name, x.name], (n, k), F)
        y2 = b.node1("MatMul", [b.weight((n, m)).name, x.name], (n, k), F)
        b.node1("Add", [y1.name, y2.name], (n, k), F)
    elif kind == "assoc":
        y = b.node1("MatMul", [x.name, b.weight((int(k), n)).name], (m, n), F)
        p = b.integer(1, MAX_DIM)
        b.node1("MatMul", [y.name, b.weight((n, p)).name], (m, p), F)
    elif kind == "transposes":
        wt = b.node1("Transpose", [b.weight((int(k), n)).name], (n, k), F, perm=[1, 0])
        xt = b.node1("Transpose", [x.name], (k, m), F, perm=[1, 0])
        b.node1("MatMul", [wt.name, xt.name], (n, m), F)
    elif kind == "gemm-trans":
        w = b.weight(b.choice([(n, int(k)), (int(k), n)]))
        wt = b.node1("Transpose", [w.name], w.dims[::-1], F, perm=[1, 0])
        bias = [b.weight((n,)).name] if b.flag() else []
        b.node1("Gemm", [x.name, wt.name, *bias], (m, n), F, transB=int(wt.dims != (k, n)))
    else:
        bias = [b.weight(b.choice([(n,), (1, n)])).name] if b.flag() else []
        g = b.node1(
            "Gemm", [x.name, b.weight((int(k), n)).name, *bias], (m, n), F, alpha=b.choice([1.0, 0.5])
        )
        if b.flag():
            b.node1("Mul", [g.name, b.splat(b.choice([2.0, 0.5, -1.0]), (), F).name], (m, n), F)
        else:
            b.node1("Add", [g.name, b.weight(b.choice([(n,), (1, n), (1, 1), ()])).name], (m, n), F)


def motif_parallel(b: GraphBuilder) -> None:
    """Sibling MatMuls or Convs sharing an input (TENSAT's multi-pattern merges), combined or not."""
    if b.flag():
        x = b.pick_or_input(
            lambda t: t.dtype == F and t.rank >= 2 and isinstance(t.dims[-1], int),
            lambda b: (b.integer(1, 3), b.integer(1, 4)),
        )
        if x is None:
            return
        outs = []
        for _ in range(b.integer(2, 3)):
            n = b.integer(1, 3)
            outs.append(
                b.node1("MatMul", [x.name, b.weight((int(x.dims[-1]), n)).name], (*x.dims[:-1], n), F)
            )
        axis = x.rank - 1
    else:
        x = b.pick_or_input(is_image, image_dims)
        if x is None:
            return
        kinds = [(1, 0), (3, 1)] if b.flag() else [(b.choice([1, 3]), 0)] * 2  # 1x1 next to 3x3, or equal
        made = [conv(b, x, b.integer(1, 3), k, pad, bias=True) for k, pad in kinds + kinds[: b.integer(0, 1)]]
        outs = [y for y in made if y is not None]
        axis = 1
    if len(outs) >= 2 and b.flag():  # else each branch is used on its own (or is an output)
        if all(same_but(outs[0], axis)(o) for o in outs):
            dims = tuple(
                sum(int(o.dims[axis]) for o in outs) if i == axis else d for i, d in enumerate(outs[0].dims)
            )
            b.node1("Concat", [o.name for o in outs], dims, F, axis=axis)


def motif_conv(b: GraphBuilder) -> None:
    """Conv(x, w1) + Conv(x, w2), Conv(x, w) + Conv(y, w), per-channel scale/shift after Conv,
    Conv + BatchNorm, zero Pad before Conv or AveragePool."""
    x = b.pick_or_input(is_image, image_dims)
    if x is None:
        return
    m, k = b.integer(1, 3), b.integer(1, 3)
    pad, n = b.integer(0, k - 1), x.rank - 2
    kind = b.choice(["weight-sum", "input-sum", "scale", "shift", "batchnorm", "pad-conv", "pad-avgpool"])
    if kind in ("weight-sum", "input-sum"):
        w = b.weight((m, int(x.dims[1]), *[k] * n))
        y1 = conv(b, x, m, k, pad, weight=w)
        other = b.pick(lambda t: t.dims == x.dims and t.dtype == F, allow_const=True) or x
        y2 = conv(b, x, m, k, pad) if kind == "weight-sum" else conv(b, other, m, k, pad, weight=w)
        if y1 is not None and y2 is not None:
            b.node1("Add", [y1.name, y2.name], y1.dims, F)
    elif kind in ("scale", "shift", "batchnorm"):
        y = conv(b, x, m, k, pad, bias=b.flag())
        if y is not None and kind == "batchnorm":
            batch_norm(b, y)
        elif y is not None:
            a = b.weight(b.choice([(m, *[1] * n), (1, m, *[1] * n)]))
            b.node1("Mul" if kind == "scale" else "Add", [y.name, a.name], y.dims, F)
    else:
        pads = [0, 0, *[b.integer(0, 1) for _ in range(2 * n)]]
        pads = pads[: 2 + n] + [0, 0] + pads[2 + n :]
        dims: Dims = (
            *x.dims[:2],
            *[int(d) + pads[i] + pads[i + x.rank] for i, d in enumerate(x.dims) if i >= 2],
        )
        extra = [b.const(np.array(0.0, np.float32), pool=False).name] if b.flag() else []
        padded = b.node1("Pad", [x.name, b.ints(pads), *extra], dims, F)
        if kind == "pad-conv":
            conv(b, padded, m, k, 0)
        elif min(int(d) for d in dims[2:]) >= k:
            attrs: dict[str, Any] = {"kernel_shape": [k] * n, "count_include_pad": 1}
            b.node1(
                "AveragePool", [padded.name], (*dims[:2], *[int(d) - k + 1 for d in dims[2:]]), F, **attrs
            )


def motif_layout(b: GraphBuilder) -> None:
    """Transposes around elementwise ops, Concat of one unary op, view-op pairs, Cast to the same type."""
    x = b.pick(lambda t: t.rank >= 1 and t.dtype in (F, TP.DOUBLE, TP.INT64))
    if x is None:
        return
    kind = b.choice(["transpose-binary", "transpose-unary", "concat-unary", "views", "cast-same"])
    perm = b.perm(x.rank)
    tdims = tuple(x.dims[p] for p in perm)
    if kind == "transpose-binary":
        y = (
            b.pick(
                lambda t: t.dtype == x.dtype and t.rank == x.rank and broadcast(t.dims, x.dims) is not None,
                allow_const=True,
            )
            if b.flag()
            else None
        )
        if y is None:
            y = (
                b.splat(b.choice([2.0, 0.0, 1.0]), (), x.dtype)
                if b.flag()
                else b.weight(concrete(x.dims), x.dtype)
            )
        tx = b.node1("Transpose", [x.name], tdims, x.dtype, perm=perm)
        if y.rank:
            y = b.node1("Transpose", [y.name], tuple(y.dims[p] for p in perm), x.dtype, perm=perm)
        _emit(b, b.choice(["Add", "Mul", "Sub"]), *((tx, y) if b.flag() else (y, tx)))
    elif kind == "transpose-unary" and x.dtype == F:
        tx = b.node1("Transpose", [x.name], tdims, F, perm=perm)
        f = b.node1(b.choice(["Relu", "Tanh", "Neg", "Sigmoid"]), [tx.name], tdims, F)
        b.node1("Transpose", [f.name], x.dims, F, perm=[int(i) for i in np.argsort(perm)])
    elif kind == "concat-unary" and x.dtype == F and isinstance(x.dims[0], int):
        op = b.choice(["Relu", "Neg", "Exp", "Abs"])
        parts = [x, b.pick(same_but(x, 0), allow_const=True) or x]
        fs = [b.node1(op, [p.name], p.dims, F) for p in parts]
        b.node1("Concat", [f.name for f in fs], (sum(int(p.dims[0]) for p in parts), *x.dims[1:]), F, axis=0)
    elif kind == "views" and x.rank < 4:
        a = b.integer(0, x.rank)
        u = b.node1("Unsqueeze", [x.name, b.ints([a])], (*x.dims[:a], 1, *x.dims[a:]), x.dtype)
        second = b.choice(["Squeeze", "Reshape", "Flatten"])
        if second == "Squeeze":
            b.node1("Squeeze", [u.name, b.ints([a])], x.dims, x.dtype)
        elif second == "Flatten" and all(isinstance(d, int) for d in x.dims):
            b.node1(
                "Flatten",
                [u.name],
                (int(np.prod(concrete(x.dims[:a]))), int(np.prod(concrete(x.dims[a:])))),
                x.dtype,
                axis=a,
            )
        elif all(isinstance(d, int) for d in x.dims):
            b.node1("Reshape", [u.name, b.ints(list(concrete(x.dims)))], x.dims, x.dtype)
    elif kind == "cast-same":
        b.node1("Cast", [x.name], x.dims, x.dtype, sign=x.sign, to=x.dtype)


def motif_shape_arith(b: GraphBuilder) -> None:
    """Shape -> Gather (scalars) -> Mul -> Unsqueeze -> Concat -> Reshape to [d0 * d1, -1]."""
    x = b.pick(lambda t: t.rank >= 2 and t.dtype in (F, TP.DOUBLE, TP.INT64) and isinstance(t.dims[1], int))
    if x is None or not all(isinstance(d, int) for d in x.dims[2:]):
        return
    first = (
        x.dims[0]
        if x.dims[1] == 1
        else (int(x.dims[0]) * int(x.dims[1]) if isinstance(x.dims[0], int) else None)
    )
    if first is None:
        return
    i64 = TP.INT64
    shape = b.node("Shape", [x.name], [((x.rank,), i64)], pool=False)[0]
    d0, d1 = (
        b.node("Gather", [shape.name, b.ints([i], scalar=True)], [((), i64)], pool=False)[0] for i in (0, 1)
    )
    prod = b.node("Mul", [d0.name, d1.name], [((), i64)], pool=False)[0]
    lead = b.node("Unsqueeze", [prod.name, b.ints([0])], [((1,), i64)], pool=False)[0]
    target = b.node("Concat", [lead.name, b.ints([-1])], [((2,), i64)], pool=False, axis=0)[0]
    b.node1(
        "Reshape", [x.name, target.name], (first, int(np.prod(concrete(x.dims[2:])))), x.dtype, sign=x.sign
    )


def motif_fusion(b: GraphBuilder) -> None:
    """The decomposed activations and normalizations exporters write (SiLU, GELU erf/tanh,
    HardSigmoid/HardSwish, Softmax, LayerNorm with scale and bias), which the fusion rules fuse."""
    x = b.pick(lambda t: t.dtype == F and t.rank >= 1 and isinstance(t.dims[-1], int))
    if x is None:
        return
    kind = b.choice(["silu", "gelu-erf", "gelu-tanh", "hard-sigmoid", "hard-swish", "softmax", "layer-norm"])
    d = x.dims

    def op(name: str, *args: Tensor | float, **attrs: Any) -> Tensor:
        ins = [a if isinstance(a, Tensor) else b.splat(a, (), F) for a in args]
        dims = (
            broadcast(*[t.dims for t in ins])
            if name not in ("ReduceMax", "ReduceSum", "ReduceMean")
            else None
        )
        if dims is None:  # a reduction over the last axis, kept
            dims = (*d[:-1], 1)
            if name == "ReduceSum" or b.opset >= 18:
                return b.node1(name, [ins[0].name, b.ints([-1])], dims, F, keepdims=1)
            return b.node1(name, [ins[0].name], dims, F, keepdims=1, axes=[-1])
        return b.node1(name, [t.name for t in ins], dims, F, **attrs)

    if kind == "silu":
        s = op("Sigmoid", x)
        op("Mul", *((x, s) if b.flag() else (s, x)))
    elif kind == "gelu-erf":
        arg = op("Div", x, float(np.sqrt(2.0))) if b.flag() else op("Mul", x, float(1 / np.sqrt(2.0)))
        op("Mul", op("Mul", x, op("Add", op("Erf", arg), 1.0)), 0.5)
    elif kind == "gelu-tanh":
        inner = op("Add", x, op("Mul", op("Pow", x, 3.0), 0.044715))
        op("Mul", op("Mul", x, 0.5), op("Add", op("Tanh", op("Mul", inner, float(np.sqrt(2 / np.pi)))), 1.0))
    elif kind in ("hard-sigmoid", "hard-swish"):
        relu6 = op("Clip", op("Add", x, 3.0), 0.0, 6.0)
        op("Div", op("Mul", x, relu6) if kind == "hard-swish" else relu6, 6.0)
    elif kind == "softmax":
        shifted = op("Exp", op("Sub", x, op("ReduceMax", x)))
        op("Div", shifted, op("ReduceSum", shifted))
    else:
        centered = op("Sub", x, op("ReduceMean", x))
        squares = op("Pow", centered, 2.0) if b.flag() else op("Mul", centered, centered)
        normed = op("Div", centered, op("Sqrt", op("Add", op("ReduceMean", squares), 1e-5)))
        if b.flag():
            op("Add", op("Mul", normed, b.weight(concrete(d[-1:]))), b.weight(concrete(d[-1:])))
