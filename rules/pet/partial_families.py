"""The PET transformation families onnxsat knows, as partial rules (see ``partial.py``).

Each family finds its sites among the imported op applications, builds the mutant, declares
where it may differ (from the op's receptive field) and the correction, and lists a few small
sample calls the rule table verifies it on. Every site is still verified at its own shapes by
PET's method before anything reaches the e-graph.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from ...egraph.graph_types import SerializedEGraph
from .partial import (
    NONE,
    OpCall,
    PartialRule,
    Site,
    Term,
    Window,
    WindowedOp,
    concat,
    every_position,
    full_cuts,
    leaf,
    overwrite,
    recompute_slab,
    register,
    reshape,
    site_families,
    slice_axis,
    transpose,
)

FAMILIES = site_families()

TILES = 2
"""Spatial-to-batch cuts the height into this many tiles."""


# ---------------------------------------------------------------- shared helpers
def _windowed(call: OpCall) -> tuple[WindowedOp, list[Window], list[Term], dict[str, tuple[str, tuple[int, ...], int]]] | None:
    """A 2-D Conv/pool call as (op, windows per spatial axis, parameter terms, leaves), or None."""
    x_shape = call.in_shapes[0]
    if x_shape is None or len(x_shape) != 4 or call.inputs[0] is None:
        return None
    op = WindowedOp(call.op, call.attrs)
    named = op.named
    if named.get("ceil_mode", 0) != 0:
        return None
    leaves: dict[str, tuple[str, tuple[int, ...], int]] = {"x": (call.inputs[0], x_shape, call.dtype)}
    params: list[Term] = []
    if call.op == "conv":
        w_shape = call.in_shapes[1]
        if w_shape is None or call.inputs[1] is None:
            return None
        kernel = list(w_shape[2:])
        leaves["w"] = (call.inputs[1], w_shape, call.dtype)
        params.append(leaf("w"))
        if len(call.inputs) > 2 and call.inputs[2] is not None and call.in_shapes[2] is not None:
            leaves["b"] = (call.inputs[2], call.in_shapes[2], call.dtype)
            params.append(leaf("b"))
        else:
            params.append(NONE)
    else:
        kernel = list(named["kernel"])
    if len(kernel) != 2:
        return None
    return op, op.windows(kernel), params, leaves


def shared_leaves(*terms: Term) -> dict[str, Term]:
    """Leaf name -> the one leaf node object used in ``terms`` (a site binds each leaf once)."""
    from ..verification.rule_instances import term_nodes

    return {n.args[0].value: n for t in terms for n in term_nodes(t) if n.op == "Tensor.input"}  # type: ignore[union-attr]


def rebind_leaves(term: Term, leaves: dict[str, Term], memo: dict[int, Term] | None = None) -> Term:
    """``term`` with every leaf replaced by the shared leaf node of its name."""
    from ..verification.rule_instances import TermNode

    memo = {} if memo is None else memo
    if id(term) in memo:
        return memo[id(term)]
    if term.op == "Tensor.input":
        out = leaves[term.args[0].value]  # type: ignore[union-attr]
    else:
        out = TermNode(term.op, tuple(rebind_leaves(a, leaves, memo) if isinstance(a, TermNode) else a for a in term.args))
    memo[id(term)] = out
    return out


def exact_site(rule: str, call: OpCall, leaves: dict[str, tuple[str, tuple[int, ...], int]], original: Term, mutant: Term,
               cuts: list[list[int]], multilinear: bool = True) -> Site:
    """A site whose mutant needs no correction under the family's guards (PET's check must find no
    differing box): the composite is the mutant itself."""
    shared = shared_leaves(original, mutant)
    memo: dict[int, Term] = {}
    mutant = rebind_leaves(mutant, shared, memo)
    return Site(
        rule=rule,
        outputs=[call.out],
        leaves=leaves,
        originals=[rebind_leaves(original, shared, memo)],
        mutants=[mutant],
        composites=[mutant],
        corrections=[[]],
        cuts=[cuts],
        out_shapes=[call.out_shape],
        multilinear=multilinear,
    )


def _conv_sample(n: int, c: int, h: int, w: int, k: int, kh: int, kw: int, pads: Sequence[int], *, dil: int = 1, bias: bool = True, tag: str = "") -> OpCall:
    ins: tuple[str | None, ...] = (f"{tag}x", f"{tag}w", f"{tag}b" if bias else None)
    shapes = ((n, c, h, w), (k, c, kh, kw), (k,) if bias else None)
    win_h = Window((kh - 1) * dil + 1, 1, pads[0], pads[2])
    win_w = Window((kw - 1) * dil + 1, 1, pads[1], pads[3])
    out = (n, k, win_h.out_size(h), win_w.out_size(w))
    return OpCall("conv", f"{tag}y", ins, ((1, 1), tuple(pads), (dil, dil), 1), shapes, out, 1)


# ---------------------------------------------------------------- 1, 2: spatial dim to batch, halo correction
def spatial_to_batch_site(rule: str, call: OpCall, tiles: int = TILES, trim: int = 0) -> Site | None:
    """Cut the height into ``tiles`` tiles stacked on the batch, run the op once, restack; the rows
    whose window straddles a seam are recomputed on the input rows they read.

    ``trim`` shrinks each correction by that many rows (a deliberately wrong rule, for tests)."""
    parts = _windowed(call)
    if parts is None:
        return None
    op, (win_h, win_w), params, leaves = parts
    n, _, height, width = call.in_shapes[0]  # type: ignore[misc]
    out_h = call.out_shape[2]
    tile = height // tiles
    if height % tiles or tile % win_h.stride or tile < win_h.extent:
        return None
    if not (win_h.extent - win_h.stride <= win_h.pad_before + win_h.pad_after < win_h.extent):
        return None  # tile outputs would not line up with the original rows
    if win_h.extent <= win_h.stride:
        return None  # windows never cross a seam: nothing partial about it
    x = leaf("x")
    stacked = concat([slice_axis(x, 2, t * tile, (t + 1) * tile) for t in range(tiles)], 0)
    y = op.apply(stacked, params)
    mutant = concat([slice_axis(y, 0, t * n, (t + 1) * n) for t in range(tiles)], 2)
    seams = [t * tile for t in range(1, tiles)]
    slabs = []
    for seam in seams:
        a, b = win_h.straddling(seam, out_h)
        a, b = a + trim, max(a + trim, b - trim)
        if a < b:
            slabs.append((a, b, recompute_slab(op, x, params, 2, win_h, height, a, b)))
    composite = overwrite(mutant, 2, out_h, slabs)
    original = op.apply(x, params)
    shared = shared_leaves(original, mutant, composite)
    memo: dict[int, Term] = {}
    cuts = full_cuts(call.out_shape)
    cuts[2] = win_h.cuts([0, height, *seams], out_h)
    cuts[3] = win_w.cuts([0, width], call.out_shape[3])
    return Site(
        rule=rule,
        outputs=[call.out],
        leaves=leaves,
        originals=[rebind_leaves(original, shared, memo)],
        mutants=[rebind_leaves(mutant, shared, memo)],
        composites=[rebind_leaves(composite, shared, memo)],
        corrections=[[(2, a, b) for a, b, _ in slabs]],
        cuts=[cuts],
        out_shapes=[call.out_shape],
        multilinear=call.op != "max_pool",
    )


def _spatial_finder(rule: str, ops: frozenset[str]):  # type: ignore[no-untyped-def]
    def find(calls: list[OpCall], eg: SerializedEGraph | None) -> list[Site]:
        sites = [spatial_to_batch_site(rule, c) for c in calls if c.op in ops]
        return [s for s in sites if s is not None]

    return find


register(
    FAMILIES,
    PartialRule(
        "conv-spatial-to-batch",
        "Conv with a small batch and a tall input: height tiles stacked on the batch (one Conv over"
        " more, smaller images), rows straddling a seam recomputed (PET's halo correction).",
        _spatial_finder("conv-spatial-to-batch", frozenset({"conv"})),
        lambda: [
            _conv_sample(1, 3, 8, 6, 4, 3, 3, (1, 1, 1, 1)),
            _conv_sample(2, 2, 12, 5, 3, 3, 3, (1, 0, 1, 0)),
            _conv_sample(1, 2, 16, 7, 2, 5, 3, (2, 1, 2, 1), bias=False),
            _conv_sample(1, 4, 10, 10, 2, 3, 1, (1, 0, 1, 0)),
            _conv_sample(1, 2, 16, 8, 3, 3, 3, (2, 2, 2, 2), dil=2),
        ],
        "conv(x, w, b) on NCHW, H % 2 == 0, height stride fits tiles, 'same'-style height padding",
    )
)


def _pool_sample(op: str, n: int, c: int, h: int, w: int, k: int, s: int, pads: Sequence[int], tag: str = "") -> OpCall:
    win_h, win_w = Window(k, s, pads[0], pads[2]), Window(k, s, pads[1], pads[3])
    out = (n, c, win_h.out_size(h), win_w.out_size(w))
    attrs = ((k, k), (s, s), tuple(pads), (1, 1), 0) if op == "max_pool" else ((k, k), (s, s), tuple(pads), 0, 0)
    return OpCall(op, f"{tag}y", (f"{tag}x",), attrs, ((n, c, h, w),), out, 1)


register(
    FAMILIES,
    PartialRule(
        "pool-spatial-to-batch",
        "AveragePool/MaxPool with overlapping windows: height tiles stacked on the batch, rows"
        " straddling a seam recomputed (MaxPool is not multilinear: random tests only).",
        _spatial_finder("pool-spatial-to-batch", frozenset({"average_pool", "max_pool"})),
        lambda: [
            _pool_sample("average_pool", 1, 2, 8, 6, 3, 1, (1, 1, 1, 1)),
            _pool_sample("average_pool", 2, 1, 12, 9, 3, 2, (1, 1, 1, 1)),
            _pool_sample("average_pool", 1, 3, 16, 5, 5, 1, (2, 0, 2, 0)),
            _pool_sample("max_pool", 2, 3, 16, 10, 3, 2, (1, 1, 1, 1)),
            _pool_sample("max_pool", 1, 2, 12, 12, 3, 2, (1, 1, 1, 1)),
        ],
        "average_pool/max_pool(x) on NCHW, ceil_mode 0, overlapping windows along the height",
    )
)


# ---------------------------------------------------------------- 3: independent convs concatenated along the width
def _reaches(eg: SerializedEGraph, start: str, target: str) -> bool:
    seen, stack = {start}, [start]
    while stack:
        eclass = stack.pop()
        if eclass == target:
            return True
        for node in eg.classes.get(eclass, []):
            for child in node.children:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
    return False


def concat_width_site(rule: str, c1: OpCall, c2: OpCall) -> Site | None:
    """Two Convs with one weight, bias and attributes on inputs of equal N, C, H: one Conv over the
    inputs concatenated along the width, each output sliced out; columns whose window straddles
    the seam are recomputed on their own input."""
    p1, p2 = _windowed(c1), _windowed(c2)
    if p1 is None or p2 is None:
        return None
    op, (win_h, win_w), params, leaves1 = p1
    s1, s2 = c1.in_shapes[0], c2.in_shapes[0]
    assert s1 is not None and s2 is not None
    if win_w.stride != 1 or s1[:3] != s2[:3] or min(s1[3], s2[3]) < win_w.extent:
        return None
    w1, w2 = s1[3], s2[3]
    out1, out2 = c1.out_shape[3], c2.out_shape[3]
    x1, x2 = leaf("x1"), leaf("x2")
    total = win_w.out_size(w1 + w2)
    y = op.apply(concat([x1, x2], 3), params)
    m1, m2 = slice_axis(y, 3, 0, out1), slice_axis(y, 3, w1, w1 + out2)
    a, b = win_w.straddling(w1, total)
    fix1 = (a, min(b, out1)) if a < out1 else None
    fix2 = (max(a, w1) - w1, min(b - w1, out2)) if b > w1 else None
    outs = []
    for m, x, width, out_w, fix in ((m1, x1, w1, out1, fix1), (m2, x2, w2, out2, fix2)):
        slabs = [] if fix is None or fix[0] >= fix[1] else [(fix[0], fix[1], recompute_slab(op, x, params, 3, win_w, width, *fix))]
        outs.append((m, overwrite(m, 3, out_w, slabs), [(3, s, e) for s, e, _ in slabs], width, x))
    originals = [op.apply(x1, params), op.apply(x2, params)]
    shared = shared_leaves(*originals, *(o[1] for o in outs))
    memo: dict[int, Term] = {}
    leaves = {k: v for k, v in leaves1.items() if k != "x"}
    leaves["x1"] = (c1.inputs[0], s1, c1.dtype)  # type: ignore[assignment]
    leaves["x2"] = (c2.inputs[0], s2, c2.dtype)  # type: ignore[assignment]
    all_cuts = []
    for call, (_, _, _, width, _) in zip((c1, c2), outs, strict=True):
        cuts = full_cuts(call.out_shape)
        cuts[2] = win_h.cuts([0, s1[2]], call.out_shape[2])
        cuts[3] = win_w.cuts([0, width], call.out_shape[3])
        all_cuts.append(cuts)
    return Site(
        rule=rule,
        outputs=[c1.out, c2.out],
        leaves=leaves,
        originals=[rebind_leaves(t, shared, memo) for t in originals],
        mutants=[rebind_leaves(o[0], shared, memo) for o in outs],
        composites=[rebind_leaves(o[1], shared, memo) for o in outs],
        corrections=[o[2] for o in outs],
        cuts=all_cuts,
        out_shapes=[c1.out_shape, c2.out_shape],
    )


def _find_concat_width(calls: list[OpCall], eg: SerializedEGraph | None) -> list[Site]:
    groups: dict[tuple, list[OpCall]] = defaultdict(list)  # type: ignore[type-arg]
    for c in calls:
        if c.op == "conv" and c.in_shapes[0] is not None:
            groups[(c.inputs[1:], c.attrs, c.in_shapes[0][:3])].append(c)
    sites = []
    for group in groups.values():
        group.sort(key=lambda c: (eg.origins.get(c.out, 0) if eg else 0, c.out))
        while len(group) >= 2:
            c1 = group.pop(0)
            partner = next(
                (c for c in group if c.inputs[0] != c1.inputs[0] and (eg is None or not (
                    _reaches(eg, c.inputs[0], c1.out) or _reaches(eg, c1.inputs[0], c.out)  # type: ignore[arg-type]
                ))),
                None,
            )
            if partner is None:
                continue
            group.remove(partner)
            site = concat_width_site("conv-concat-width", c1, partner)
            if site is not None:
                sites.append(site)
    return sites


def _width_pairs() -> list[OpCall]:
    out = []
    for i, (h, wa, wb, k, pads) in enumerate(
        [(6, 5, 7, 3, (1, 1, 1, 1)), (4, 8, 8, 3, (0, 1, 0, 1)), (5, 6, 4, 3, (0, 0, 0, 0)), (3, 9, 5, 5, (1, 2, 1, 2)), (7, 4, 6, 3, (1, 0, 1, 2))]
    ):
        a = _conv_sample(1, 2, h, wa, 3, k, k, pads, tag=f"p{i}a")
        b = _conv_sample(1, 2, h, wb, 3, k, k, pads, tag=f"p{i}b")
        same = (f"p{i}w", f"p{i}bias")  # one weight and bias for the pair
        out += [
            OpCall(a.op, a.out, (a.inputs[0], *same), a.attrs, a.in_shapes, a.out_shape, 1),
            OpCall(b.op, b.out, (b.inputs[0], *same), b.attrs, b.in_shapes, b.out_shape, 1),
        ]
    return out


register(
    FAMILIES,
    PartialRule(
        "conv-concat-width",
        "Independent Convs sharing weight, bias and attributes: one Conv over their inputs"
        " concatenated along the width, each output sliced out, seam columns recomputed.",
        _find_concat_width,
        _width_pairs,
        "conv(x1, w, b), conv(x2, w, b): same attributes, equal N, C, H, width stride 1, independent",
    )
)


# ---------------------------------------------------------------- 4: dilated Conv on a space-to-batch view
def dilated_site(rule: str, call: OpCall) -> Site | None:
    """A Conv with dilation d (stride 1, pads multiples of d, H and W multiples of d) is a plain Conv
    over the d*d phases of its input stacked on the batch, interleaved back (PET's space-to-batch)."""
    parts = _windowed(call)
    if parts is None or call.op != "conv":
        return None
    op, _, params, leaves = parts
    named = op.named
    dil, strides, pads = tuple(named["dilations"]), tuple(named["strides"]), tuple(named["pads"])
    d = dil[0]
    n, c, height, width = call.in_shapes[0]  # type: ignore[misc]
    _, k, out_h, out_w = call.out_shape
    if d < 2 or dil != (d, d) or strides != (1, 1) or any(p % d for p in pads) or height % d or width % d:
        return None
    if out_h % d or out_w % d:
        return None
    x = leaf("x")
    phases = reshape(transpose(reshape(x, [n, c, height // d, d, width // d, d]), [3, 5, 0, 1, 2, 4]), [d * d * n, c, height // d, width // d])
    named["dilations"], named["pads"] = (1, 1), tuple(p // d for p in pads)
    plain = WindowedOp(op.op, tuple(named.values()))
    y = plain.apply(phases, params)
    mutant = reshape(transpose(reshape(y, [d, d, n, k, out_h // d, out_w // d]), [2, 3, 4, 0, 5, 1]), [n, k, out_h, out_w])
    return exact_site(rule, call, leaves, op.apply(x, params), mutant, every_position(call.out_shape, (2, 3)))


register(
    FAMILIES,
    PartialRule(
        "dilated-conv-to-batch",
        "Dilated Conv as a plain Conv over the d*d input phases stacked on the batch (space-to-batch);"
        " PET's check finds no differing box under the guard, so no correction is needed.",
        lambda calls, eg: [s for s in (dilated_site("dilated-conv-to-batch", c) for c in calls if c.op == "conv") if s],
        lambda: [
            _conv_sample(1, 2, 8, 8, 3, 3, 3, (2, 2, 2, 2), dil=2),
            _conv_sample(2, 1, 6, 12, 2, 3, 3, (0, 2, 0, 2), dil=2),
            _conv_sample(1, 3, 12, 9, 2, 3, 3, (3, 3, 3, 3), dil=3),
            _conv_sample(1, 2, 8, 4, 2, 3, 1, (2, 0, 2, 0), dil=2, bias=False),
            _conv_sample(1, 1, 10, 10, 4, 5, 5, (4, 4, 4, 4), dil=2),
        ],
        "conv(x, w, b) with dilations (d, d), d >= 2, strides 1, pads and H, W multiples of d",
    )
)


# ---------------------------------------------------------------- 5: MatMul batch dims folded into one GEMM
def matmul_gemm_site(rule: str, call: OpCall) -> Site | None:
    """A batched MatMul with a 2-D right operand is one (batch*M, K) x (K, N) GEMM, reshaped back."""
    a_shape, b_shape = call.in_shapes
    if a_shape is None or b_shape is None or len(a_shape) < 3 or len(b_shape) != 2 or None in call.inputs:
        return None
    rows = math.prod(a_shape[:-1])
    a, b = leaf("a"), leaf("b")
    original = _call2("matmul", a, b)
    mutant = reshape(_call2("matmul", reshape(a, [rows, a_shape[-1]]), b), list(call.out_shape))
    leaves = {"a": (call.inputs[0], a_shape, call.dtype), "b": (call.inputs[1], b_shape, call.dtype)}
    return exact_site(rule, call, leaves, original, mutant, full_cuts(call.out_shape))  # type: ignore[arg-type]


def _call2(op: str, a: Term, b: Term) -> Term:
    from ..verification.rule_instances import TermNode

    return TermNode(op, (a, b))


def _matmul_sample(a: tuple[int, ...], n: int, tag: str) -> OpCall:
    return OpCall("matmul", f"{tag}y", (f"{tag}a", f"{tag}b"), (), (a, (a[-1], n)), (*a[:-1], n), 1)


register(
    FAMILIES,
    PartialRule(
        "matmul-batch-to-gemm",
        "Batched MatMul with a 2-D weight: batch dims folded into the rows of one larger GEMM"
        " (exact: PET's check finds no differing box).",
        lambda calls, eg: [s for s in (matmul_gemm_site("matmul-batch-to-gemm", c) for c in calls if c.op == "matmul") if s],
        lambda: [
            _matmul_sample((2, 3, 4), 5, "m0"),
            _matmul_sample((1, 7, 3), 2, "m1"),
            _matmul_sample((2, 2, 3, 5), 4, "m2"),
            _matmul_sample((4, 1, 6), 3, "m3"),
            _matmul_sample((3, 5, 2), 7, "m4"),
        ],
        "matmul(a, b) with rank(a) >= 3 and rank(b) == 2",
    )
)


RULE_NAMES = [
    "conv-spatial-to-batch",
    "pool-spatial-to-batch",
    "conv-concat-width",
    "dilated-conv-to-batch",
    "matmul-batch-to-gemm",
    "conv-transpose-subpixel",  # registered by partial_subpixel.py
    "conv-pointwise-merge",  # registered by partial_merge.py
]
