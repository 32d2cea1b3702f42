"""Kernels of the convolutions that are not a plain GEMM: the direct Conv and ConvTranspose's col2im.

A Conv with few output channels per group (depthwise, or a 3-channel image head) wastes most of a
GEMM tile and im2col copies its input once per tap, so it runs as a direct kernel over the
zero-padded input: for each input channel the taps' weights are scalars, and one loop adds
``w * x[shifted]`` of every tap into each output channel of the group (unit-stride loads the
vectorizer turns into vector code). The first channel stores, the others accumulate. A strided
or narrow depthwise Conv has no long unit-stride row to vectorize along, so it runs channel-blocked
instead: over a padded NCHWc copy of its input, 16 (or 8) channels per vector (MLAS's layout).
The kernels that read vectors of channels (Winograd's input transform, the position-major conv's
windows) read a padded channels-last copy (``channels_last_padded``).

ConvTranspose is ``col = W_g^T @ X_g`` (a GEMM, in rules_nn) followed by ``col2im`` here, which
gathers every output from its taps residue by residue modulo the stride.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxsat.extract.conv_layout import FLAT_VECTOR, channel_block

from .kernel_ir import (
    Binary,
    Buffer,
    Compare,
    Const,
    Decl,
    Expr,
    Kernel,
    Load,
    Local,
    Loop,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    add,
    flat_index,
    i64,
    mod,
    mul,
    subexpressions,
    unflatten,
)
from .loops import buffers_of, outer_kernel
from .rules_pool import padded_input
from .values import Lazy, View, contiguous_strides, general, of_buffer, of_view, reshape, transpose

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
    ``activation`` is applied as each output is stored (one input channel per group: depthwise),
    or after the last input channel over the block just computed, so a conv's ReLU/HardSwish/SiLU
    is not a pass of its own over the output.
    """
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
    inner: str, start: Expr, stop: Expr, activation: Callable[[Expr], Expr] | None = None, activation_pass: bool = False,
    mask: Callable[[tuple[int, ...]], Expr | None] | None = None,
) -> list[Stmt]:
    """Channel 0 stores ``bias + sum w * x`` for every output of the inner loop; channels 1.. add
    theirs, and a last loop applies ``activation``. One channel: ``activation_pass`` applies it in a
    second loop over the stored outputs, not as each is stored. ``mask(tap)``: where that tap is
    added (None: everywhere); a select of the sum with and without it, one masked FMA."""
    ci = Var("ci")

    def weights(c: Expr) -> tuple[Stmt, ...]:
        return tuple(Decl(f"w{m}_{t}", dt, w_at(m, c, tap)) for m in range(mg) for t, tap in enumerate(taps))

    def window(m: int, c: Expr, first: Expr, tag: str) -> tuple[tuple[Stmt, ...], Expr]:
        """Declarations and the sum; a masked tap's running sum is a local, not a repeated subtree."""
        acc, decls = first, []
        for t, tap in enumerate(taps):
            more = Binary("add", acc, Binary("mul", Local(f"w{m}_{t}", dt), x_at(c, tap)))
            where = None if mask is None else mask(tap)
            if where is None:
                acc = more
                continue
            decls.append(Decl(f"{tag}{m}_{t}", dt, Select(where, more, acc)))
            acc = Local(f"{tag}{m}_{t}", dt)
        return tuple(decls), acc

    zero = Const(0.0, dt)

    def opening(m: int) -> tuple[tuple[Stmt, ...], Expr]:  # channel 0's sum, from the bias
        return window(m, i64(0), bias_at(m) if bias_at is not None else zero, "s")

    def stored(m: int, sums: tuple[tuple[Stmt, ...], Expr], then: Callable[[Expr], Expr] | None = None) -> tuple[Stmt, ...]:
        decls, value = sums
        if then is None:
            return (*decls, Store(out, out_at(m), value))
        return (*decls, Decl(f"v{m}", dt, value), Store(out, out_at(m), then(Local(f"v{m}", dt))))

    first: tuple[Stmt, ...] = tuple(stmt for m in range(mg) for stmt in stored(m, opening(m)))
    if activation is not None and cg == 1 and activation_pass:
        then = tuple(Store(out, out_at(m), activation(Load(out, out_at(m)))) for m in range(mg))
        return [*weights(i64(0)), Loop(inner, stop, first, start), Loop(inner, stop, then, start)]
    if activation is not None and cg == 1:
        first = tuple(stmt for m in range(mg) for stmt in stored(m, opening(m), activation))
    body: list[Stmt] = [*weights(i64(0)), Loop(inner, stop, first, start)]
    if cg > 1:
        rest = tuple(stmt for m in range(mg) for stmt in stored(m, window(m, ci, Load(out, out_at(m)), "r")))
        body.append(Loop(ci.name, i64(cg), (*weights(ci), Loop(inner, stop, rest, start)), i64(1)))
        if activation is not None:  # after the last channel, over the block still in cache
            body.append(Loop(inner, stop, tuple(Store(out, out_at(m), activation(Load(out, out_at(m)))) for m in range(mg)), start))
    return body



ACTIVATION_PASS_MAX_BLOCK = 2048
"""Positions per block up to which the flat conv applies a transcendental activation (SiLU) in a
second pass over the block instead of as each vector is stored. One thread, SiLU: 480 x 14 x 14
3x3 and 240 x 28 x 28 5x5 convs (one block of 256 / 912 per channel) ran 6% faster with the pass;
144 x 56 x 56 3x3 (3,200) and 32 x 112 x 112 3x3 (two blocks of 6,400) 4-5% slower."""


def flat_slack(padded_sp: list[int]) -> list[int]:
    """Extra zero cells after a stride-1 direct conv's padded input (``padded_sp``) so its flat form
    can run whole vectors: the last output vector may reach ``FLAT_VECTOR - 1`` positions past the
    last output, whose taps read that far past the padded plane."""
    if len(padded_sp) < 2:
        return [FLAT_VECTOR - 1]
    return [0] * (len(padded_sp) - 2) + [-(-(FLAT_VECTOR - 1) // padded_sp[-1]), 0]


def _flat_direct_conv(
    cx: Any, tensor: str, src: Buffer, w: Lazy, bias: Lazy | None, group: int, kernel: list[int], dilations: list[int], out_sp: tuple[int, ...],
    activation: Callable[[Expr], Expr] | None = None,
) -> Lazy:
    """Stride-1 direct conv over flat padded positions ``j``: output ``o`` sits at ``j = flat(o)`` in
    the padded plane and tap ``t`` reads ``x[j + flat(t * dilation)]``. Positions in the padding
    columns compute values nobody reads; the result is a strided view of the plane. The positions
    run to a whole number of vectors (``src`` holds ``flat_slack`` more cells): a 14 x 14 plane's
    248 positions left 8 to a scalar loop, which with a SiLU took a third of the kernel's time."""
    batch, cin, *padded_sp = src.shape
    cout = w.shape[0]
    pstr = contiguous_strides(padded_sp)
    span = sum((o - 1) * s for o, s in zip(out_sp, pstr, strict=True)) + 1
    span = -(-span // FLAT_VECTOR) * FLAT_VECTOR
    assert span - 1 + sum((k - 1) * d * s for k, d, s in zip(kernel, dilations, pstr, strict=True)) < math.prod(padded_sp), "no flat_slack"
    wide = cx.buffer(f"{tensor}_wide", (batch, cout, *padded_sp), src.dtype)

    def offset(tap: tuple[int, ...]) -> int:
        return sum(k * d * s for k, d, s in zip(tap, dilations, pstr, strict=True))

    _flat_kernel(cx, src, wide, span, w, bias, group, kernel, offset, activation)
    return of_view(View(wide, contiguous_strides(wide.shape), 0), (batch, cout, *out_sp))


def _phase_tap(tap: tuple[int, ...], strides: list[int], dilations: list[int]) -> tuple[int, int, int]:
    """(phase index, row, column) where tap ``tap`` of a 2-D conv reads in the phase planes."""
    (kh, kw), (sh, sw), (dh, dw) = tap, strides, dilations
    return (kh * dh) % sh * sw + (kw * dw) % sw, (kh * dh) // sh, (kw * dw) // sw


def _phase_span(out_sp: tuple[int, ...], wph: int) -> int:
    """Flat output positions a phased conv computes: its rows ``wph`` apart, in whole vectors."""
    return -(-((out_sp[0] - 1) * wph + out_sp[1]) // FLAT_VECTOR) * FLAT_VECTOR


def phase_flat_geometry(out_sp: tuple[int, ...], strides: list[int], dilations: list[int], kernel: list[int]) -> Callable[[int], int]:
    """The slack ``phase_planes`` must leave after each phase's image for ``phased_direct_conv``: its
    furthest tap reads ``_phase_span`` positions from that tap's start."""

    def slack(wph: int) -> int:
        reach = max(row * wph + col for tap in itertools.product(*(range(k) for k in kernel)) for _, row, col in [_phase_tap(tap, strides, dilations)])
        rows_used = -(-(reach + _phase_span(out_sp, wph)) // wph)
        image_rows = (out_sp[0] - 1) + -(-((kernel[0] - 1) * dilations[0] + 1) // strides[0])
        return max(0, rows_used - image_rows) * wph

    return slack


def phase_planes(
    cx: Any, x: Lazy, begin: list[int], need: list[int], strides: list[int], slack: Callable[[int], int]
) -> tuple[Buffer, int, int]:
    """The zero-padded 2-D input of a conv stored as its s x s phases [N, C, sh, sw, Hph, Wph] (rows
    and columns ``i * s + phase``; stride 1: the padded input itself), so each tap of a strided conv
    reads one phase with a stride-1 window; ``slack(Wph)``: zero cells wanted after each phase's
    image (reads of the last output run past it). Returns (buffer, Hph, Wph)."""
    (sh, sw) = strides
    batch, cin, h, wd = x.shape
    wph = -(-(begin[1] + wd + need[1]) // sw)
    hph = -(-(begin[0] + h + need[0]) // sh) + -(-slack(wph) // wph)
    padded = padded_input(cx, x, begin, [sh * hph - begin[0] - h, sw * wph - begin[1] - wd], Const(0.0, x.dtype))
    if (sh, sw) != (1, 1):
        padded = cx.materialize(transpose(reshape(padded, (batch, cin, hph, sh, wph, sw)), [0, 1, 3, 5, 2, 4]), "phases")
    assert padded.is_view and padded.view.offset == 0
    return padded.view.buffer, hph, wph


def phased_direct_conv(
    cx: Any, tensor: str, phases: Buffer, phase_shape: tuple[int, int], w: Lazy, bias: Lazy | None, group: int, kernel: list[int], strides: list[int],
    dilations: list[int], out_sp: tuple[int, ...], activation: Callable[[Expr], Expr] | None = None,
) -> Lazy:
    """A strided 2-D direct conv as the flat stride-1 kernel over the phase planes of its padded
    input ([N, C, sh, sw, Hph, Wph]): output ``(oh, ow)`` sits at ``j = oh * Wph + ow`` and tap ``t``
    reads its phase at ``j`` plus the tap's row and column there, so every load is unit-stride.
    Positions past the output width compute values nobody reads; the result is a strided view."""
    batch = phases.shape[0]
    cout = w.shape[0]
    hph, wph = phase_shape
    span = _phase_span(out_sp, wph)

    def offset(tap: tuple[int, ...]) -> int:
        index, row, col = _phase_tap(tap, strides, dilations)
        return index * hph * wph + row * wph + col

    last = max(offset(tap) for tap in itertools.product(*(range(k) for k in kernel)))
    assert last + span <= math.prod(phases.shape[2:]), "phase planes without slack"
    out = cx.buffer(f"{tensor}_phased", (batch, cout, span), phases.dtype)
    _flat_kernel(cx, phases, out, span, w, bias, group, kernel, offset, activation)
    return of_view(View(out, (cout * span, span, wph, 1), 0), (batch, cout, *out_sp))


@dataclass(frozen=True)
class RowPadded:
    """Where a stride-1 depthwise conv's input image lies in planes padded with zero rows only
    (``row_padded_depthwise``): each channel's plane is ``pitch`` floats, the image's rows run on
    unbroken from element ``offset``, ``width`` apart, so a 1x1 conv's product stores its rows of C
    there as they are (``pitch`` apart), with no padded copy. ``base``: where output 0's first tap
    reads; ``span``: output positions computed per channel (whole vectors); ``left``: padding columns
    before the image."""

    width: int
    offset: int
    pitch: int
    base: int
    span: int
    left: int


def row_padded_geometry(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int],
    out_sp: tuple[int, ...],
) -> RowPadded | None:
    """The row-padded planes of a depthwise Conv that runs flat (2-D, stride 1, as wide as its input;
    the caller has decided it is not channel-blocked); None for any other conv."""
    if len(x_shape) != 4 or len(out_sp) != 2 or any(s != 1 for s in strides):
        return None
    _, chans, height, width = x_shape
    if not (group == chans == w_shape[0] and w_shape[1] == 1 and fits_direct(1, kernel)) or out_sp[1] != width or min(out_sp) < 1:
        return None
    top, left = begin
    reach_h, reach_w = (kernel[0] - 1) * dilations[0], (kernel[1] - 1) * dilations[1]
    if left > reach_w:
        return None
    span = -(-out_sp[0] * width // FLAT_VECTOR) * FLAT_VECTOR
    lead = -(top * width) % FLAT_VECTOR  # the image starts on a vector boundary, the product's stores aligned
    while lead < left:
        lead += FLAT_VECTOR
    base = lead - left
    end = max(base + span + reach_h * width + reach_w, lead + (top + height) * width)
    return RowPadded(width, lead + top * width, -(-end // FLAT_VECTOR) * FLAT_VECTOR, base, span, left)


def row_padded_depthwise(
    cx: Any, tensor: str, planes: Buffer, geometry: RowPadded, w: Lazy, bias: Lazy | None, kernel: list[int], dilations: list[int],
    out_sp: tuple[int, ...], activation: Callable[[Expr], Expr] | None = None,
) -> Lazy:
    """The flat stride-1 depthwise conv over row-padded ``planes`` (``RowPadded``): output ``j`` and
    tap ``(dr, dc)`` read ``planes[base + j + dr * width + dc]``. A tap left or right of the image
    reads the neighbouring row's edge there, so it is added only where its column is inside the
    image (a constant mask per tap column, one masked fused multiply-add per tap). The output is a
    view of [N, C, span]."""
    batch, chans = planes.shape[:2]
    width, (dh, dw) = geometry.width, dilations
    out = cx.buffer(f"{tensor}_rows", (batch, chans, geometry.span), planes.dtype)
    column = np.arange(geometry.span) % width
    shifts = sorted({tap_w * dw - geometry.left for tap_w in range(kernel[1])} - {0})
    inside = np.stack([(column + e >= 0) & (column + e < width) for e in shifts]).astype(np.float32) if shifts else None
    masks = None if inside is None else cx.const_lazy(inside)

    def offset(tap: tuple[int, ...]) -> int:
        return geometry.base + tap[0] * dh * width + tap[1] * dw

    def mask(tap: tuple[int, ...], j: Expr) -> Expr | None:
        e = tap[1] * dw - geometry.left
        if masks is None or e == 0:
            return None
        return Compare("gt", masks.gen([i64(shifts.index(e)), j]), Const(0.5, "f32"))

    _flat_kernel(cx, planes, out, geometry.span, w, bias, chans, kernel, offset, activation, mask, [] if masks is None else buffers_of(masks))
    return of_view(View(out, (chans * geometry.span, geometry.span, width, 1), 0), (batch, chans, *out_sp))


def _flat_kernel(
    cx: Any, src: Buffer, out: Buffer, span: int, w: Lazy, bias: Lazy | None, group: int, kernel: list[int], offset: Callable[[tuple[int, ...]], int],
    activation: Callable[[Expr], Expr] | None, mask: Callable[[tuple[int, ...], Expr], Expr | None] | None = None, mask_buffers: list[Buffer] | None = None,
) -> None:
    """A flat stride-1 conv: output position ``j`` (of ``span`` per channel plane of ``out``) adds
    tap ``t`` of input channel ``c`` from ``src[c][j + offset(t)]`` (where ``mask(t, j)``, if any),
    parallel over blocks of positions of each (image, group)."""
    dt = src.dtype
    batch, cin = src.shape[:2]
    cout, cg = w.shape[0], w.shape[1]
    mg = cout // group
    plane, out_plane = math.prod(src.shape[2:]), math.prod(out.shape[2:])
    block = min(span, max(256, FLAT_BLOCK_FLOATS // mg))
    blocks = math.ceil(span / block)
    want = math.ceil(MIN_UNITS / (batch * group))
    if blocks < want:
        block = max(256, math.ceil(span / want))
        blocks = math.ceil(span / block)
    block = math.ceil(span / blocks / FLAT_VECTOR) * FLAT_VECTOR
    blocks = math.ceil(span / block)
    p, j = Var("p"), Var("j")
    n, g, b = unflatten(p, (batch, group, blocks))
    taps = list(itertools.product(*(range(k) for k in kernel)))

    def x_at(c: Expr, tap: tuple[int, ...]) -> Expr:
        channel = add(add(mul(n, i64(cin)), mul(g, i64(cg))), c)
        return Load(src, add(add(mul(channel, i64(plane)), j), i64(offset(tap))))

    def out_at(m: int) -> Expr:
        return add(mul(add(add(mul(n, i64(cout)), mul(g, i64(mg))), i64(m)), i64(out_plane)), j)

    start = mul(b, i64(block))
    stop = Binary("min", add(start, i64(block)), i64(span))
    body = _conv_body(
        dt, mg, cg, taps, lambda m, c, tap: w.gen([add(mul(g, i64(mg)), i64(m)), c, *(i64(k) for k in tap)]), x_at, out_at, out,
        (lambda m: bias.gen([add(mul(g, i64(mg)), i64(m))])) if bias is not None else None, j.name, start, stop, activation,
        activation_pass=block <= ACTIVATION_PASS_MAX_BLOCK and activation is not None and _transcendental(activation(Local("v", dt))),
        mask=None if mask is None else (lambda tap: mask(tap, j)),
    )
    inputs = [src, *buffers_of(w), *(buffers_of(bias) if bias is not None else []), *(mask_buffers or [])]
    cost = float(batch * cout * span * cg * len(taps) * 2)
    cx.emit_kernel(Kernel(f"fconv_{out.name}", tuple(dict.fromkeys([*inputs, out])), (out.name,), "p", batch * group * blocks, tuple(body), cost))


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


ROW_ACTIVATION_MIN_WIDTH = 14
"""Output width from which a blocked depthwise conv applies a transcendental activation (SiLU) in
a pass along its rows: on 7-wide rows that pass is mostly a scalar tail (measured 3% slower)."""


def _transcendental(e: Expr) -> bool:
    """Whether ``e`` calls exp, sigmoid, tanh or erf (an activation of ~20 dependent operations)."""
    return any(isinstance(x, Unary) and x.op in ("exp", "sigmoid", "tanh", "erf") for x in subexpressions(e))


def blocked_depthwise_conv(
    cx: Any, tensor: str, x: Lazy, packed_w: Lazy, bias: Lazy | None, kernel: list[int], strides: list[int], dilations: list[int],
    begin: list[int], padded_sp: tuple[int, ...], out_sp: tuple[int, ...], activation: Callable[[Expr], Expr] | None = None,
    stored: Buffer | None = None, channels_last: bool = False,
) -> Lazy:
    """A depthwise Conv over a zero-padded copy of ``x`` laid out [N, C/8, H, W, 8] (NCHWc, as
    MLAS runs it): each output position computes 8 channels in one vector, whatever the stride or
    the width (a stride-2 conv along a 7- or 14-wide row does not vectorize along the row).
    ``packed_w`` is the weight laid out [C/8, taps, 8]. The output is stored NCHW. The block is
    ``channel_block(C)`` channels (8 in these docstrings). ``stored``: that copy already exists (a
    pointwise conv's product wrote it). ``channels_last``: the output is stored [N, H, W, C] (a
    view gives it as NCHW), each vector of 8 channels in one store: for a small image whose readers
    run position-major (a channels-last copy then reads it contiguously, a global pool by runs)."""
    dt = x.dtype
    batch, chans = x.shape[:2]
    block = channel_block(chans)
    blocks = chans // block
    xb = stored if stored is not None else _blocked_padded(cx, x, begin, padded_sp)
    out = cx.out_buffer(tensor, (batch, *out_sp, chans) if channels_last else (batch, chans, *out_sp), dt)
    p, ow, c = Var("p"), Var("ow"), Var("c")
    n, cb, oh = unflatten(p, (batch, blocks, out_sp[0]))
    channel = add(mul(cb, i64(block)), c)
    acc: Expr = bias.gen([channel]) if bias is not None else Const(0.0, dt)
    for t, (th, tw) in enumerate(itertools.product(range(kernel[0]), range(kernel[1]))):
        ih = add(mul(oh, i64(strides[0])), i64(th * dilations[0]))
        iw = add(mul(ow, i64(strides[1])), i64(tw * dilations[1]))
        tap = Load(xb, flat_index([n, cb, ih, iw, c], xb.shape))
        acc = Binary("add", acc, Binary("mul", packed_w.gen([cb, i64(t), c]), tap))
    at = flat_index([n, oh, ow, channel] if channels_last else [n, channel, oh, ow], out.shape)
    if activation is not None and not channels_last and out_sp[1] >= ROW_ACTIVATION_MIN_WIDTH and _transcendental(activation(Local("v", dt))):
        # The taps' vectors first, then the activation along each of the 8 stored rows (16 lanes,
        # unit stride): applied to each 8-channel vector as it is stored, a SiLU made the kernel
        # 1.2x slower (96x112 3x3/2, 144x56 5x5/2, 240x28 3x3/2, one thread)
        apply = Store(out, at, activation(Load(out, at)))
        body: tuple[Stmt, ...] = (
            Loop(ow.name, i64(out_sp[1]), (Loop(c.name, i64(block), (Store(out, at, acc),)),)),
            Loop(c.name, i64(block), (Loop(ow.name, i64(out_sp[1]), (apply,)),)),
        )
    else:
        value = activation(Local("v", dt)) if activation is not None else Local("v", dt)
        lanes = (Decl("v", dt, acc), Store(out, at, value))
        body = (Loop(ow.name, i64(out_sp[1]), (Loop(c.name, i64(block), lanes),)),)
    inputs = [xb, *buffers_of(packed_w), *(buffers_of(bias) if bias is not None else [])]
    units = batch * blocks * out_sp[0]
    cost = float(math.prod(out.shape) * math.prod(kernel) * 2)
    cx.emit_kernel(Kernel(f"bdconv_{out.name}", tuple(dict.fromkeys([*inputs, out])), (out.name,), "p", units, body, cost))
    if channels_last:
        return of_view(View(out, (math.prod(out.shape[1:]), 1, out_sp[1] * chans, chans), 0), (batch, chans, *out_sp))
    return of_buffer(out)


def _blocked_padded(cx: Any, x: Lazy, begin: list[int], padded_sp: tuple[int, ...]) -> Buffer:
    """``x`` [N, C, H, W] stored zero-padded as [N, C/8, Hp, Wp, 8], parallel over padded rows; the
    producer of ``x`` (an activation) fuses into it."""
    dt = x.dtype
    batch, chans, height, width = x.shape
    hp, wp = padded_sp
    block = channel_block(chans)
    blocks = chans // block
    xb = cx.buffer("nchwc", (batch, blocks, hp, wp, block), dt)
    zero = Const(0.0, dt)
    w, c = Var("w"), Var("c")
    row_floats = wp * block

    def body(o: list[Expr], flat: Expr) -> tuple[Stmt, ...]:
        n, cb, r = o
        start = mul(flat, i64(row_floats))
        src_row = add(r, i64(-begin[0]))
        inside = Binary("and", Compare("ge", src_row, i64(0)), Compare("lt", src_row, i64(height)))
        clamped = Binary("min", Binary("max", src_row, i64(0)), i64(height - 1))
        value = Select(inside, x.gen([n, add(mul(cb, i64(block)), c), clamped, w]), zero)
        lead, interior = begin[1] * block, (begin[1] + width) * block
        at = add(add(start, i64(lead)), add(mul(w, i64(block)), c))
        stmts: list[Stmt] = []
        if lead:
            stmts.append(Loop(w.name, i64(lead), (Store(xb, add(start, w), zero),)))
        stmts.append(Loop(w.name, i64(width), (Loop(c.name, i64(block), (Store(xb, at, value),)),)))
        if interior < row_floats:
            stmts.append(Loop(w.name, i64(row_floats), (Store(xb, add(start, w), zero),), i64(interior)))
        return tuple(stmts)

    cx.emit_kernel(outer_kernel(f"nchwc_{xb.name}", buffers_of(x), [xb], (batch, blocks, hp), body, float(math.prod(xb.shape) * (x.size + 2))))
    return xb


def channels_last_padded(cx: Any, x: Lazy, begin: list[int], padded_sp: tuple[int, int]) -> Buffer:
    """``x`` [N, C, H, W] stored zero-padded and channels last, [N, Hp, Wp, C] (``begin`` rows and
    columns of zeros before the image, the rest after): the kernels that read a vector of channels
    per window value read it (Winograd's input transform, the position-major conv's windows). From
    a channels-last ``x`` each row is a contiguous copy; the producer of ``x`` fuses into it."""

    def value(idx: list[Expr]) -> Expr:
        n, h, w, c = idx
        at, inside = [], []
        for pos, lo, extent in ((h, begin[0], x.shape[2]), (w, begin[1], x.shape[3])):
            src = add(pos, i64(-lo))
            inside += [Compare("ge", src, i64(0)), Compare("lt", src, i64(extent))]
            at.append(Binary("min", Binary("max", src, i64(0)), i64(extent - 1)))
        cond = Binary("and", Binary("and", inside[0], inside[1]), Binary("and", inside[2], inside[3]))
        return Select(cond, x.gen([n, c, *at]), Const(0.0, x.dtype))

    return cx.materialize(general((x.shape[0], *padded_sp, x.shape[1]), x.dtype, value, x.size + 8), "nhwc").view.buffer


def pack_depthwise_weight(w: np.ndarray) -> np.ndarray:
    """A depthwise weight [C, 1, kh, kw] as ``blocked_depthwise_conv`` reads it: [C/8, taps, 8]."""
    chans = w.shape[0]
    block = channel_block(chans)
    return w.reshape(chans // block, block, -1).transpose(0, 2, 1).copy()


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
