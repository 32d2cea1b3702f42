"""A 1x1 Conv followed by a zero-padded k x k Conv, with nothing between, as one k x k Conv over the
product weights (a weight-only subgraph, folded at export) plus PET's border correction.

Interior outputs are exact: ``w2 * (w1 x + b1) + b2 = (w2 w1) x + (b2 + sum w2 b1)``. At the border the
second Conv's taps on its zero padding see 0, not the first Conv's bias ``b1``, while the merged Conv
adds ``w2 b1`` for every tap: with a bias on the 1x1 Conv the output rows and columns whose window
reads padding differ (PET's differing boxes), and the correction recomputes them with the original
two Convs on the few input rows/columns they read (without ``b1`` the site is exact). It pays when
the 1x1 Conv expands the channels (``C_mid`` > ``C_in``, ``C_out``): ``C_in*C_mid + k*k*C_mid*C_out``
multiply-adds per pixel become ``k*k*C_in*C_out`` (an inverted/linear bottleneck without its
activation, or a projection feeding a convolution).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...egraph.graph_types import SerializedEGraph
from ..verification.rule_instances import TermLit, TermNode
from .partial import (
    NONE,
    OpCall,
    PartialRule,
    Site,
    Term,
    Window,
    WindowedOp,
    full_cuts,
    ints,
    leaf,
    overwrite,
    register,
    reshape,
    site_families,
    slice_axis,
    transpose,
)
from .partial_families import rebind_leaves, shared_leaves

FAMILIES = site_families()

RULE = "conv-pointwise-merge"


def _node(op: str, *args: Term | TermLit) -> Term:
    return TermNode(op, tuple(args))


def merged_weight(w1: Term, w2: Term, c_in: int, c_mid: int, c_out: int, kh: int, kw: int) -> Term:
    """``W[o, c, i, j] = sum_m w2[o, m, i, j] * w1[m, c]`` as one MatMul between transposes."""
    rows = reshape(transpose(w2, [0, 2, 3, 1]), [c_out * kh * kw, c_mid])
    product = _node("matmul", rows, reshape(w1, [c_mid, c_in]))
    return transpose(reshape(product, [c_out, kh, kw, c_in]), [0, 3, 1, 2])


def merged_bias(b1: Term | None, w2: Term, b2: Term | None, c_mid: int, c_out: int) -> Term:
    """``b2[o] + sum_{m,i,j} w2[o, m, i, j] * b1[m]`` (``NONE`` when neither Conv has a bias)."""
    if b1 is None:
        return b2 if b2 is not None else NONE
    taps = _node("reduce_sum", w2, ints([2, 3]), TermLit("i64", 0), TermLit("i64", 0))  # [C_out, C_mid]
    spread = reshape(_node("matmul", taps, reshape(b1, [c_mid, 1])), [c_out])
    return spread if b2 is None else _node("add", spread, b2)


def border_rows(window: Window, size: int, out: int) -> list[tuple[int, int]]:
    """Output rows whose window reads padding: ``[0, a)`` and ``[b, out)`` (where the merged Conv differs)."""
    a = min(out, -(-window.pad_before // window.stride))
    b = max(a, min(out, (size + window.pad_before - window.extent) // window.stride + 1))
    return [(s, e) for s, e in ((0, a), (b, out)) if s < e]


def _pointwise(c: OpCall) -> bool:
    """A plain 1x1 Conv: no padding, stride 1, one group, with a known weight."""
    named = WindowedOp(c.op, c.attrs).named
    w = c.in_shapes[1]
    return (
        w is not None and len(w) == 4 and tuple(w[2:]) == (1, 1) and named["group"] == 1
        and not any(named["pads"]) and all(s == 1 for s in named.get("strides") or (1, 1))
    )


def merge_site(first: OpCall, second: OpCall, *, skip_corrections: int = 0) -> Site | None:
    """The merged form of ``second(first(x))``, or None when out of scope.

    ``skip_corrections`` drops that many correction slabs (a deliberately wrong rule, for tests)."""
    x_shape, w1_shape, w2_shape = first.in_shapes[0], first.in_shapes[1], second.in_shapes[1]
    if x_shape is None or w1_shape is None or w2_shape is None or len(x_shape) != 4 or len(w2_shape) != 4:
        return None
    if first.inputs[0] is None or first.inputs[1] is None or second.inputs[1] is None:
        return None
    op2 = WindowedOp(second.op, second.attrs)
    named = op2.named
    if named["group"] != 1 or any(d != 1 for d in named["dilations"]) or tuple(w2_shape[2:]) == (1, 1):
        return None  # 1x1 after 1x1 is an exact merge; grouped/dilated second Convs are out of scope
    n, c_in, height, width = x_shape
    c_out, c_mid, kh, kw = w2_shape
    win_h, win_w = op2.windows([kh, kw])
    if any(w.pad_before >= w.extent or w.pad_after >= w.extent for w in (win_h, win_w)):
        return None  # rows of padding only: not a border of the image
    dtype = first.dtype
    leaves: dict[str, tuple[str, tuple[int, ...], int]] = {"x": (first.inputs[0], x_shape, dtype), "w1": (first.inputs[1], w1_shape, dtype)}
    leaves["w2"] = (second.inputs[1], w2_shape, dtype)
    x, w1, w2 = leaf("x"), leaf("w1"), leaf("w2")
    b1 = b2 = None
    if len(first.inputs) > 2 and first.inputs[2] is not None and first.in_shapes[2] is not None:
        leaves["b1"], b1 = (first.inputs[2], first.in_shapes[2], dtype), leaf("b1")
    if len(second.inputs) > 2 and second.inputs[2] is not None and second.in_shapes[2] is not None:
        leaves["b2"], b2 = (second.inputs[2], second.in_shapes[2], dtype), leaf("b2")
    op1 = WindowedOp(first.op, first.attrs)
    p1, p2 = [w1, b1 if b1 is not None else NONE], [w2, b2 if b2 is not None else NONE]
    original = op2.apply(op1.apply(x, p1), p2)
    weight = merged_weight(w1, w2, c_in, c_mid, c_out, kh, kw)
    mutant = op2.apply(x, [weight, merged_bias(b1, w2, b2, c_mid, c_out)])
    _, _, out_h, out_w = second.out_shape

    def recompute(axis: int, window: Window, size: int, start: int, end: int) -> Term:
        """Output rows [start, end) along ``axis`` by the original two Convs on the input rows they read."""
        lo, hi = window.reads(start, end)
        clip_lo, clip_hi = max(0, lo), min(size, hi)
        middle = op1.apply(slice_axis(x, axis, clip_lo, clip_hi), p1)
        return op2.with_pads(axis - 2, clip_lo - lo, hi - clip_hi).apply(middle, p2)

    slabs: list[tuple[int, int, int]] = []
    composite = mutant
    if b1 is not None:  # without b1 the padding is the same zero on both sides: exact
        plan = [(3, win_w, width, out_w), (2, win_h, height, out_h)]  # columns first, then full-width rows
        for axis, window, size, out in plan:
            found = [(axis, s, e) for s, e in border_rows(window, size, out)]
            kept = found[skip_corrections:] if axis == 3 else found
            composite = overwrite(composite, axis, out, [(s, e, recompute(axis, window, size, s, e)) for _, s, e in kept])
            slabs += found
    shared = shared_leaves(original, mutant, composite)
    memo: dict[int, Term] = {}
    cuts = full_cuts(second.out_shape)
    cuts[2] = win_h.cuts([0, height], out_h)
    cuts[3] = win_w.cuts([0, width], out_w)
    return Site(
        rule=RULE,
        outputs=[second.out],
        leaves=leaves,
        originals=[rebind_leaves(original, shared, memo)],
        mutants=[rebind_leaves(mutant, shared, memo)],
        composites=[rebind_leaves(composite, shared, memo)],
        corrections=[slabs],
        cuts=[cuts],
        out_shapes=[second.out_shape],
    )


def _find(calls: list[OpCall], eg: SerializedEGraph | None) -> list[Site]:
    """Every k x k Conv whose input is a 1x1 Conv's output."""
    pointwise = {c.out: c for c in calls if c.op == "conv" and _pointwise(c)}
    sites = []
    for c in calls:
        first = pointwise.get(c.inputs[0]) if c.op == "conv" and c.inputs and c.inputs[0] is not None else None
        site = merge_site(first, c) if first is not None else None
        if site is not None:
            sites.append(site)
    return sites


def pair_sample(
    c_in: int, c_mid: int, c_out: int, size: tuple[int, int], kernel: tuple[int, int], pads: Sequence[int],
    strides: tuple[int, int] = (1, 1), *, bias1: bool = True, bias2: bool = True, tag: str = "",
) -> list[OpCall]:
    """A 1x1 Conv and the k x k Conv reading it, as calls with their shapes (rule samples, tests)."""
    h, w = size
    first = OpCall(
        "conv", f"{tag}m", (f"{tag}x", f"{tag}w1", f"{tag}b1" if bias1 else None), ((1, 1), (0, 0, 0, 0), (1, 1), 1),
        ((1, c_in, h, w), (c_mid, c_in, 1, 1), (c_mid,) if bias1 else None), (1, c_mid, h, w), 1,
    )
    win_h = Window(kernel[0], strides[0], pads[0], pads[2])
    win_w = Window(kernel[1], strides[1], pads[1], pads[3])
    second = OpCall(
        "conv", f"{tag}y", (f"{tag}m", f"{tag}w2", f"{tag}b2" if bias2 else None), (strides, tuple(pads), (1, 1), 1),
        ((1, c_mid, h, w), (c_out, c_mid, *kernel), (c_out,) if bias2 else None), (1, c_out, win_h.out_size(h), win_w.out_size(w)), 1,
    )
    return [first, second]


register(
    FAMILIES,
    PartialRule(
        RULE,
        "A 1x1 Conv (with bias) feeding a zero-padded k x k Conv: one k x k Conv over the product weights"
        " (folded at export); the border rows/columns, where the padding hides the 1x1 Conv's bias, are"
        " recomputed by the original pair on the input rows they read.",
        _find,
        lambda: [
            *pair_sample(2, 5, 3, (6, 7), (3, 3), (1, 1, 1, 1), tag="a"),
            *pair_sample(3, 4, 2, (8, 5), (3, 3), (1, 1, 1, 1), (2, 2), tag="b"),
            *pair_sample(2, 3, 2, (7, 7), (5, 5), (2, 1, 2, 3), bias2=False, tag="c"),
            *pair_sample(1, 4, 3, (6, 6), (3, 1), (1, 0, 1, 0), tag="d"),
            *pair_sample(2, 4, 2, (5, 6), (3, 3), (1, 1, 1, 1), bias1=False, tag="e"),
        ],
        "conv(conv(x, w1 1x1, b1), w2 k x k, b2): first Conv pads 0 stride 1 group 1; second group 1,"
        " dilations 1, pads below the kernel",
        ops=frozenset({"conv"}),
    )
)
