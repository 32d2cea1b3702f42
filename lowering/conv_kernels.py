"""Kernels of the convolutions that are not a plain GEMM: the direct Conv and ConvTranspose's col2im.

A Conv with few output channels per group (depthwise, or a 3-channel image head) wastes most of a
GEMM tile and im2col copies its input once per tap, so it runs as a direct kernel over the
zero-padded input: for each input channel the taps' weights are scalars, and one loop adds
``w * x[shifted]`` of every tap into each output channel of the group (unit-stride loads the
vectorizer turns into vector code). The first channel stores, the others accumulate.

ConvTranspose is ``col = W_g^T @ X_g`` (a GEMM, in rules_nn) followed by ``col2im`` here, which
gathers every output from its taps residue by residue modulo the stride.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from .kernel_ir import (
    Binary,
    Buffer,
    Const,
    Decl,
    Expr,
    Kernel,
    Load,
    Local,
    Loop,
    Stmt,
    Store,
    Var,
    add,
    flat_index,
    i64,
    mod,
    mul,
    unflatten,
)
from .loops import buffers_of
from .values import Lazy, View, contiguous_strides, of_buffer, of_view

DIRECT_MAX_CHANNELS = 16
"""Output channels per group up to which a windowed Conv is a direct kernel: a product with so few
rows wastes most of a GEMM tile, and im2col would copy the input once per tap."""
DIRECT_MAX_TERMS = 144
"""Channels x taps of one direct-conv expression beyond which it would spill registers."""
FLAT_BLOCK_FLOATS = 8192
"""Output floats (all channels of a group) one unit of the flat direct conv keeps hot in L1/L2."""
MIN_UNITS = 16
"""Parallel units the flat direct conv aims for (its positions are cut into blocks to get them)."""


def fits_direct(mg: int, kernel: list[int]) -> bool:
    """Whether a windowed Conv with ``mg`` output channels per group runs as a direct kernel."""
    return mg <= DIRECT_MAX_CHANNELS and mg * math.prod(kernel) <= DIRECT_MAX_TERMS


def direct_conv(
    cx: Any, tensor: str, src: Lazy, w: Lazy, bias: Lazy | None, group: int, kernel: list[int], strides: list[int], dilations: list[int], out_sp: tuple[int, ...],
    activation: Callable[[Expr], Expr] | None = None,
) -> Lazy:
    """A windowed Conv of the zero-padded ``src`` (already holding every tap of every output).

    Stride 1: the flat form, whose inner loop runs over the padded plane's flat positions (so a
    14-wide image still fills vectors); its output is a view that skips the padding columns.
    Otherwise the row form, parallel over output rows, inner loop along the output width.
    ``activation`` (one input channel per group only: depthwise) is applied as each output is
    stored, so a depthwise conv's ReLU/HardSwish/SiLU is not a pass of its own.
    """
    assert activation is None or w.shape[1] == 1
    batch, cout = src.shape[0], w.shape[0]
    if all(s == 1 for s in strides):
        stored = cx.materialize(src, "conv_in")
        return _flat_direct_conv(cx, tensor, stored.view.buffer, w, bias, group, kernel, dilations, out_sp, activation)
    out = cx.out_buffer(tensor, (batch, cout, *out_sp), src.dtype)
    cx.emit_kernel(_row_direct_conv(out, src, w, bias, group, kernel, strides, dilations, activation))
    return of_buffer(out)


def _conv_body(
    dt: str, mg: int, cg: int, taps: list[tuple[int, ...]], w_at: Callable[[int, Expr, tuple[int, ...]], Expr],
    x_at: Callable[[Expr, tuple[int, ...]], Expr], out_at: Callable[[int], Expr], out: Buffer, bias_at: Callable[[int], Expr] | None,
    inner: str, start: Expr, stop: Expr, activation: Callable[[Expr], Expr] | None = None,
) -> list[Stmt]:
    """Channel 0 stores ``bias + sum w * x`` for every output of the inner loop; channels 1.. add theirs."""
    ci = Var("ci")

    def weights(c: Expr) -> tuple[Stmt, ...]:
        return tuple(Decl(f"w{m}_{t}", dt, w_at(m, c, tap)) for m in range(mg) for t, tap in enumerate(taps))

    def window(m: int, c: Expr, first: Expr) -> Expr:
        acc = first
        for t, tap in enumerate(taps):
            acc = Binary("add", acc, Binary("mul", Local(f"w{m}_{t}", dt), x_at(c, tap)))
        return acc

    zero = Const(0.0, dt)
    first: tuple[Stmt, ...]
    if activation is not None and cg == 1:
        first = tuple(
            stmt
            for m in range(mg)
            for stmt in (Decl(f"v{m}", dt, window(m, i64(0), bias_at(m) if bias_at is not None else zero)), Store(out, out_at(m), activation(Local(f"v{m}", dt))))
        )
    else:
        first = tuple(Store(out, out_at(m), window(m, i64(0), bias_at(m) if bias_at is not None else zero)) for m in range(mg))
    body: list[Stmt] = [*weights(i64(0)), Loop(inner, stop, first, start)]
    if cg > 1:
        rest = tuple(Store(out, out_at(m), window(m, ci, Load(out, out_at(m)))) for m in range(mg))
        body.append(Loop(ci.name, i64(cg), (*weights(ci), Loop(inner, stop, rest, start)), i64(1)))
    return body


def _flat_direct_conv(
    cx: Any, tensor: str, src: Buffer, w: Lazy, bias: Lazy | None, group: int, kernel: list[int], dilations: list[int], out_sp: tuple[int, ...],
    activation: Callable[[Expr], Expr] | None = None,
) -> Lazy:
    """Stride-1 direct conv over flat padded positions ``j``: output ``o`` sits at ``j = flat(o)`` in
    the padded plane and tap ``t`` reads ``x[j + flat(t * dilation)]``. Positions in the padding
    columns compute values nobody reads; the result is a strided view of the plane."""
    dt = src.dtype
    batch, cin, *padded_sp = src.shape
    cout, cg = w.shape[0], w.shape[1]
    mg = cout // group
    pstr = contiguous_strides(padded_sp)
    plane = math.prod(padded_sp)
    span = sum((o - 1) * s for o, s in zip(out_sp, pstr, strict=True)) + 1
    wide = cx.buffer(f"{tensor}_wide", (batch, cout, *padded_sp), dt)
    block = min(span, max(256, FLAT_BLOCK_FLOATS // mg))
    blocks = math.ceil(span / block)
    want = math.ceil(MIN_UNITS / (batch * group))
    if blocks < want:
        block = max(256, math.ceil(span / want))
        blocks = math.ceil(span / block)
    block = math.ceil(span / blocks / 16) * 16
    blocks = math.ceil(span / block)
    p, j = Var("p"), Var("j")
    n, g, b = unflatten(p, (batch, group, blocks))
    taps = list(itertools.product(*(range(k) for k in kernel)))

    def x_at(c: Expr, tap: tuple[int, ...]) -> Expr:
        off = sum(k * d * s for k, d, s in zip(tap, dilations, pstr, strict=True))
        channel = add(add(mul(n, i64(cin)), mul(g, i64(cg))), c)
        return Load(src, add(add(mul(channel, i64(plane)), j), i64(off)))

    def out_at(m: int) -> Expr:
        return add(mul(add(add(mul(n, i64(cout)), mul(g, i64(mg))), i64(m)), i64(plane)), j)

    start = mul(b, i64(block))
    stop = Binary("min", add(start, i64(block)), i64(span))
    body = _conv_body(
        dt, mg, cg, taps, lambda m, c, tap: w.gen([add(mul(g, i64(mg)), i64(m)), c, *(i64(k) for k in tap)]), x_at, out_at, wide,
        (lambda m: bias.gen([add(mul(g, i64(mg)), i64(m))])) if bias is not None else None, j.name, start, stop, activation,
    )
    inputs = [src, *buffers_of(w), *(buffers_of(bias) if bias is not None else [])]
    cost = float(batch * cout * span * cg * len(taps) * 2)
    kernel_ir = Kernel(f"fconv_{wide.name}", tuple(dict.fromkeys([*inputs, wide])), (wide.name,), "p", batch * group * blocks, tuple(body), cost)
    cx.emit_kernel(kernel_ir)
    return of_view(View(wide, contiguous_strides(wide.shape), 0), (batch, cout, *out_sp))


def _row_direct_conv(
    out: Buffer, src: Lazy, w: Lazy, bias: Lazy | None, group: int, kernel: list[int], strides: list[int], dilations: list[int],
    activation: Callable[[Expr], Expr] | None = None,
) -> Kernel:
    """Direct conv parallel over (n, group, leading output rows), inner loop along the output width."""
    dt = out.dtype
    batch, cout, *out_sp = out.shape
    cg = w.shape[1]
    mg = cout // group
    p, ow = Var("p"), Var("ow")
    n, g, *lead = unflatten(p, (batch, group, *out_sp[:-1]))
    taps = list(itertools.product(*(range(k) for k in kernel)))

    def x_at(c: Expr, tap: tuple[int, ...]) -> Expr:
        pos = [add(mul(o, i64(s)), i64(k * d)) for o, s, k, d in zip([*lead, ow], strides, tap, dilations, strict=True)]
        return src.gen([n, add(mul(g, i64(cg)), c), *pos])

    def out_at(m: int) -> Expr:
        return flat_index([n, add(mul(g, i64(mg)), i64(m)), *lead, ow], out.shape)

    body = _conv_body(
        dt, mg, cg, taps, lambda m, c, tap: w.gen([add(mul(g, i64(mg)), i64(m)), c, *(i64(k) for k in tap)]), x_at, out_at, out,
        (lambda m: bias.gen([add(mul(g, i64(mg)), i64(m))])) if bias is not None else None, ow.name, i64(0), i64(out_sp[-1]), activation,
    )
    inputs = [*buffers_of(src), *buffers_of(w), *(buffers_of(bias) if bias is not None else [])]
    units = batch * group * math.prod(out_sp[:-1])
    cost = float(math.prod(out.shape) * cg * len(taps) * 2)
    return Kernel(f"dconv_{out.name}", tuple(dict.fromkeys([*inputs, out])), (out.name,), "p", units, tuple(body), cost)


Tap = tuple[int, int]
"""A kernel index and the input offset ``c`` it reads from: input ``q + c`` for output ``q * stride + r``."""
Phase = tuple[int, list[Tap]]
"""Outputs ``o = q * stride + r`` of one residue ``r``: their count, and the taps that reach them."""


def transpose_phases(out: int, stride: int, k: int, dil: int, begin: int) -> list[Phase]:
    """ConvTranspose along one axis, per output residue modulo the stride: how many outputs, and
    which kernel taps feed them.

    Output ``o`` gets tap ``t`` from input ``i = (o + begin - t * dil) / stride`` when that
    divides exactly; with ``o = q * stride + r`` the tap set depends only on ``r`` and ``i = q + c``.
    """
    result = []
    for r in range(stride):
        count = max(0, -(-(out - r) // stride))
        taps = [(t, (r + begin - t * dil) // stride) for t in range(k) if (r + begin - t * dil) % stride == 0]
        result.append((count, taps))
    return result


def col2im(out: Buffer, col: Buffer, bias: Lazy | None, kernel: list[int], padded_sp: tuple[int, ...], lo: list[int], phases: list[list[Phase]]) -> Kernel:
    """``out[n, oc, o] = bias[oc] + sum over taps of col[n, oc, tap, i]``, parallel over (n, oc).

    Outputs are visited residue by residue (``o = q * s + r``), so each residue's tap set is
    static and every load is ``col[..., q + c + lo]`` (``col`` has ``lo`` zero cells in front):
    unit stride along the innermost loop. The innermost loop stores all residues of the last axis
    side by side (a full interleaved group) and a tail loop finishes widths the stride does not divide.
    """
    dt = out.dtype
    n_sp = len(kernel)
    out_sp = out.shape[2:]
    cout = out.shape[1]
    taps, plane = math.prod(kernel), math.prod(padded_sp)
    p = Var("p")
    col_base = mul(p, i64(taps * plane))
    out_base = mul(p, i64(math.prod(out_sp)))
    qv = [Var(f"q{i}") for i in range(n_sp)]
    start: list[Stmt] = [Decl("bv", dt, bias.gen([mod(p, cout)]) if bias is not None else Const(0.0, dt))]

    def value(tap_sets: tuple[list[Tap], ...], q_last: Expr) -> Expr:
        acc: Expr = Local("bv", dt)
        for combo in itertools.product(*tap_sets):
            tap = flat_index([i64(t) for t, _ in combo], tuple(kernel))
            pos = [add(q, i64(c + pad)) for q, (_, c), pad in zip([*qv[:-1], q_last], combo, lo, strict=True)]
            acc = Binary("add", acc, Load(col, add(add(col_base, mul(tap, i64(plane))), flat_index(pos, padded_sp))))
        return acc

    def store_at(rs: tuple[int, ...], q_last: Expr, r_last: int) -> Expr:
        pos = [add(mul(q, i64(len(a))), i64(r)) for q, a, r in zip([*qv[:-1], q_last], phases, [*rs, r_last], strict=True)]
        return add(out_base, flat_index(pos, out_sp))

    last = phases[-1]
    s_last = len(last)
    full_q = out_sp[-1] // s_last
    body: list[Stmt] = list(start)
    for lead in itertools.product(*(list(enumerate(axis)) for axis in phases[:-1])):
        if any(count == 0 for _, (count, _) in lead):
            continue
        residues = tuple(r for r, _ in lead)
        sets = tuple(t for _, (_, t) in lead)
        q_last = qv[-1]

        def row(rs: range, q_last: Expr = q_last, residues: tuple[int, ...] = residues, sets: tuple[list[Tap], ...] = sets) -> tuple[Stmt, ...]:
            return tuple(Store(out, store_at(residues, q_last, r), value((*sets, last[r][1]), q_last)) for r in rs)

        inner: list[Stmt] = []
        if full_q:
            inner.append(Loop(q_last.name, i64(full_q), row(range(s_last))))
        if out_sp[-1] % s_last:
            inner.append(Loop(q_last.name, i64(full_q + 1), row(range(out_sp[-1] % s_last)), i64(full_q)))
        nest: tuple[Stmt, ...] = tuple(inner)
        for q, (_, (count, _)) in reversed(list(zip(qv[:-1], lead, strict=True))):
            nest = (Loop(q.name, i64(count), nest),)
        body.extend(nest)
    units = out.shape[0] * cout
    reads = math.prod(sum(count * len(t) for count, t in axis) for axis in phases)
    params = tuple(dict.fromkeys([col, *(buffers_of(bias) if bias is not None else []), out]))
    return Kernel(f"col2im_{out.name}", params, (out.name,), "p", units, tuple(body), float(units * reads * 2))
