"""Winograd convolution: a 3x3 stride-1 Conv as F(m x m, 3 x 3) (Lavin and Gray, "Fast Algorithms
for Convolutional Neural Networks", 2016).

The output is cut into m x m tiles; each tile's (m + 2) x (m + 2) input window ``d`` is
transformed to ``V = B^T d B``, each 3x3 filter ``g`` to ``U = G g G^T`` (once, at compile time),
and the tile is ``A^T (U * V) A``. Summed over input channels the elementwise product is, for each
of the (m + 2)^2 tile positions xi, one product ``V_xi (tiles x Cin) @ U_xi (Cin x Cout)``: GEMMs
with (3 m / (m + 2))^2 times fewer multiplies than the direct conv (2.25x for m = 2, 4x for
m = 4), on the packed micro-kernel with the transformed weight as its constant B. A conv is
a channels-last zero-padded copy of the input, the input transform, the products (one phase:
they are independent), and the output transform, which adds the bias, applies the activation and
stores the result channels last. Every transform loop runs over channels, so its loads and stores
are unit-stride vectors whatever the image width (over tile columns, 14 of them at 56 x 56, the
loops stayed scalar and the transforms cost as much as the products). The result is an NCHW view
of the channels-last store; the elementwise ops after it keep that layout (``Lowerer.store``) and
the convs reading it take windows of channels (``rules_nn``).

ResNet-18 (two threads): its 3x3 stride-1 convs took 0.69 ms (56 x 56 x 64, implicit GEMM) against
0.36 ms as F(4x4). The transforms are exact in real arithmetic; in float32 F(4x4) loses about a
digit against the direct sum (1e-5 of the largest output at 256 channels), well inside
onnxruntime's tolerance; tests check both sizes against onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsat.extract.conv_algorithm import tiles_of

from .conv_kernels import channels_last_padded
from .kernel_ir import (
    Binary,
    Const,
    Decl,
    Expr,
    Load,
    Local,
    Loop,
    Stmt,
    Store,
    Unary,
    Var,
    add,
    flat_index,
    i64,
    mul,
)
from .loops import buffers_of, outer_kernel
from .program import MatMulStep, StridedOperand
from .values import Lazy, nchw_view


@dataclass(frozen=True)
class Transforms:
    """The F(m x m, 3 x 3) matrices: ``bt`` (alpha x alpha) the input's, ``g`` (alpha x 3) the
    filter's, ``at`` (m x alpha) the output's; alpha = m + 2."""

    m: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray

    @property
    def alpha(self) -> int:
        return self.m + 2


TRANSFORMS: dict[int, Transforms] = {
    # interpolation points 0, 1, -1 and infinity
    2: Transforms(
        2,
        np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64),
    ),
    # points 0, 1, -1, 2, -2 and infinity
    4: Transforms(
        4,
        np.array(
            [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
            np.float64,
        ),
        np.array(
            [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
            np.float64,
        ),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64),
    ),
}


def transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """``G g G^T`` for every filter of ``weight`` [Cout, Cin, 3, 3], laid out [alpha^2, Cin, Cout]
    (the constant B of each tile position's product), computed in float64 and rounded once."""
    g = TRANSFORMS[m].g
    cout, cin, kh, kw = weight.shape
    taps = np.asarray(weight, np.float64).transpose(2, 3, 1, 0).reshape(kh, kw * cin * cout)  # [i, (j, c, o)]
    rows = (g @ taps).reshape(-1, kw, cin * cout)  # [a, j, (c, o)]: G g
    # [a, b, (c, o)]: (G g) G^T, as two large products (a product per 3 x 3 filter took ResNet-18's
    # warm compile 0.5 s of its 1.1)
    return (g @ rows).reshape(-1, cin, cout).astype(np.float32)


def _combination(coefficients: np.ndarray, terms: Sequence[Expr]) -> Expr:
    """``sum(c * t)`` over the nonzero coefficients, a unit one as a plain add or subtract."""
    out: Expr | None = None
    for c, t in zip(coefficients.tolist(), terms, strict=True):
        if c == 0:
            continue
        if abs(c) == 1:
            out = t if out is None and c > 0 else Unary("neg", t) if out is None else Binary("add" if c > 0 else "sub", out, t)
            continue
        scaled = Binary("mul", Const(float(c), "f32"), t)
        out = scaled if out is None else Binary("add", out, scaled)
    return out if out is not None else Const(0.0, "f32")


def _two_sided(left: np.ndarray, right: np.ndarray, tile: Sequence[Sequence[Expr]], name: str) -> tuple[list[Stmt], list[list[Expr]]]:
    """``left @ tile @ right^T`` as locals: the rows pass first (``left @ tile``), each value once."""
    stmts: list[Stmt] = []
    rows: list[list[Expr]] = []
    for a in range(left.shape[0]):
        row: list[Expr] = []
        for j in range(len(tile[0])):
            local = f"{name}r{a}_{j}"
            stmts.append(Decl(local, "f32", _combination(left[a], [tile[i][j] for i in range(len(tile))])))
            row.append(Local(local, "f32"))
        rows.append(row)
    out = [[_combination(right[b], rows[a]) for b in range(right.shape[0])] for a in range(left.shape[0])]
    return stmts, out


CHANNEL_CHUNK = 64
"""Channels per unit of the transforms' parallel range (the vector loop's length)."""


def _chunk(channels: int) -> int:
    return CHANNEL_CHUNK if channels % CHANNEL_CHUNK == 0 else channels


def winograd_conv(
    cx: Any, tensor: str, x: Lazy, begin: list[int], u: np.ndarray, bias: Lazy | None, m: int, out_sp: tuple[int, ...], activation: Callable[[Expr], Expr] | None,
) -> Lazy:
    """The Conv of ``x`` (zero-padded by ``begin`` before the image) whose transformed weight is
    ``u`` (``transform_weight``): its input padded channels last to whole tiles, the input
    transform, one product per tile position, and the output transform with bias and
    activation. Every transform loop runs over channels (unit stride: vector lanes), and the
    result is stored channels last, given back as an NCHW view of it."""
    t = TRANSFORMS[m]
    alpha = t.alpha
    points = alpha * alpha
    batch, cin = x.shape[:2]
    cout = u.shape[2]
    th, tw = tiles_of(out_sp, m)
    tiles = batch * th * tw
    padded = channels_last_padded(cx, x, begin, (th * m + 2, tw * m + 2))
    hp, wp = padded.shape[1:3]
    v = cx.buffer(f"{tensor}_wv", (points, tiles, cin), "f32")
    tx, lane = Var("tx"), Var("lane")
    in_chunk, out_chunk = _chunk(cin), _chunk(cout)

    def input_tile(o: list[Expr], flat: Expr) -> tuple[Stmt, ...]:
        n, ty, part = o
        c = add(mul(part, i64(in_chunk)), lane)
        tile = add(mul(add(mul(n, i64(th)), ty), i64(tw)), tx)
        d = [[Load(padded, add(mul(add(mul(add(mul(n, i64(hp)), add(mul(ty, i64(m)), i64(i))), i64(wp)), add(mul(tx, i64(m)), i64(j))), i64(cin)), c)) for j in range(alpha)] for i in range(alpha)]
        stmts, values = _two_sided(t.bt, t.bt, d, "d")
        stores = [Store(v, add(mul(add(i64(xi * tiles), tile), i64(cin)), c), values[xi // alpha][xi % alpha]) for xi in range(points)]
        return (Loop(tx.name, i64(tw), (Loop(lane.name, i64(in_chunk), (*stmts, *stores)),)),)

    cx.emit_kernel(outer_kernel(f"wgin_{v.name}", [padded], [v], (batch, th, cin // in_chunk), input_tile, float(v.numel * 8)))
    weights = cx.const_lazy(u).view.buffer
    products = []
    for xi in range(points):
        out = cx.buffer(f"{tensor}_wm{xi}", (tiles, cout), "f32")
        cx.emit(MatMulStep(StridedOperand(v, (tiles, cin), (cin, 1), xi * tiles * cin), StridedOperand(weights, (cin, cout), (cout, 1), xi * cin * cout), out))
        products.append(out)
    grid = (batch, th * m, tw * m, cout)
    y = cx.buffer(f"{tensor}_nhwc", grid, "f32")

    def output_tile(o: list[Expr], flat: Expr) -> tuple[Stmt, ...]:
        n, ty, part = o
        c = add(mul(part, i64(out_chunk)), lane)
        tile = add(mul(add(mul(n, i64(th)), ty), i64(tw)), tx)
        mt = [[Load(products[a * alpha + b], add(mul(tile, i64(cout)), c)) for b in range(alpha)] for a in range(alpha)]
        stmts, values = _two_sided(t.at, t.at, mt, "m")
        offset = bias.gen([c]) if bias is not None else None
        for i in range(m):
            for j in range(m):
                local = f"y{i}_{j}"
                stmts.append(Decl(local, "f32", values[i][j] if offset is None else Binary("add", values[i][j], offset)))
                value: Expr = Local(local, "f32")
                where = add(mul(flat_index([n, add(mul(ty, i64(m)), i64(i)), add(mul(tx, i64(m)), i64(j))], grid[:3]), i64(cout)), c)
                stmts.append(Store(y, where, value if activation is None else activation(value)))
        return (Loop(tx.name, i64(tw), (Loop(lane.name, i64(out_chunk), tuple(stmts)),)),)

    inputs = [*products, *(buffers_of(bias) if bias is not None else [])]
    cx.emit_kernel(outer_kernel(f"wgout_{y.name}", inputs, [y], (batch, th, cout // out_chunk), output_tile, float(points * tiles * cout * 6)))
    return nchw_view(y, (batch, cout, *out_sp))


__all__ = ["TRANSFORMS", "Transforms", "transform_weight", "winograd_conv"]
