"""ConvTranspose as a sub-pixel convolution: one Conv with s_h*s_w*C_out output channels (each
phase's taps of the transposed kernel, gathered from the original weight by a weight-only
subgraph that export folds to a constant) whose channel blocks are interleaved back into the
output grid (a DepthToSpace written with 4-D and 5-D transposes), then sliced to the output.

Output row ``o`` of a stride-``s`` ConvTranspose reads input rows ``i`` with ``o + p - s*i`` in
``[0, k)``. On the grid ``o + r = s*q + b`` (phase ``b``, shift ``r`` chosen so every phase reads
the same few input rows ``q - j``), phase ``b`` is a plain correlation over rows ``q - j_max ..
q - j_min`` with taps ``s*j + b - r + p`` (zero where out of the kernel): the Conv's zero padding
is the ConvTranspose's missing contributions, so PET's check finds no differing box at any border
and the composite needs no correction: an exact site rule, on by default (family ``layout``), each
site still PET-verified at its own shapes before it enters the e-graph. onnxruntime runs
ConvTranspose as a GEMM into a ``C_out*k*k``-row column buffer plus a col2im scatter; the Conv
form skips both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...egraph.graph_types import SerializedEGraph
from ..verification.rule_instances import TermLit, TermNode
from .partial import (
    NONE,
    OpCall,
    PartialRule,
    Site,
    Term,
    WindowedOp,
    call,
    concat,
    every_position,
    ints,
    leaf,
    register,
    reshape,
    site_families,
    transpose,
)
from .partial_families import exact_site

FAMILIES = site_families()

RULE = "conv-transpose-subpixel"


@dataclass(frozen=True)
class PhasePlan:
    """One spatial axis of the sub-pixel form of a ConvTranspose."""

    stride: int
    kernel: int
    shift: int
    """``r``: output row ``o`` sits at row ``o + r`` of the interleaved Conv output."""
    taps: int
    """``T``: the Conv's kernel extent (input rows each phase reads, zero taps included)."""
    j_max: int
    offsets: tuple[int, ...]
    """Per phase ``b``: ``b - r + pad_before``, so tap ``t`` of phase ``b`` is kernel row ``s*(j_max - t) + offset``."""
    pad_before: int
    pad_after: int
    rows: int
    """``Q``: Conv output rows per phase."""
    out: int

    def kernel_row(self, phase: int, tap: int) -> int | None:
        """The ConvTranspose kernel row tap ``tap`` of phase ``phase`` uses (None: a zero tap)."""
        row = self.stride * (self.j_max - tap) + self.offsets[phase]
        return row if 0 <= row < self.kernel else None


def plan_axis(size: int, kernel: int, stride: int, pad_before: int, pad_after: int, output_padding: int) -> PhasePlan | None:
    """The sub-pixel plan with the fewest taps along one axis, or None if it needs cropping the input."""
    out = (size - 1) * stride - pad_before - pad_after + kernel + output_padding
    best: PhasePlan | None = None
    for shift in range(stride):
        offsets = tuple(b - shift + pad_before for b in range(stride))
        js = [j for c in offsets for j in range(-kernel - 1, kernel + 2) if 0 <= stride * j + c < kernel]
        if not js:
            return None
        j_min, j_max = min(js), max(js)
        taps = j_max - j_min + 1
        rows = -(-(out + shift) // stride)
        pad_after_conv = rows - size - j_max + taps - 1
        if j_max < 0 or pad_after_conv < 0:
            continue  # the Conv would need negative padding (input cropping): not handled
        plan = PhasePlan(stride, kernel, shift, taps, j_max, offsets, j_max, pad_after_conv, rows, out)
        if best is None or plan.taps < best.taps:
            best = plan
    return best


def phase_indices(h: PhasePlan, w: PhasePlan) -> list[int]:
    """Gather indices into the weight's flattened ``k_h*k_w`` kernel (``k_h*k_w``: the appended zero),
    in (phase_h, phase_w, tap_h, tap_w) order."""
    zero = h.kernel * w.kernel
    out = []
    for bh in range(h.stride):
        for bw in range(w.stride):
            for th in range(h.taps):
                for tw in range(w.taps):
                    kh, kw = h.kernel_row(bh, th), w.kernel_row(bw, tw)
                    out.append(zero if kh is None or kw is None else kh * w.kernel + kw)
    return out


def _node(op: str, *args: Term | TermLit) -> Term:
    return TermNode(op, tuple(args))


def phase_weight(w: Term, c_in: int, c_out: int, h: PhasePlan, w_plan: PhasePlan) -> Term:
    """The Conv weight ``[s_h*s_w*C_out, C_in, T_h, T_w]`` (channel ``(b_h*s_w + b_w)*C_out + c``) as a
    weight-only subgraph of the ConvTranspose weight ``[C_in, C_out, k_h, k_w]``."""
    flat = reshape(w, [c_in, c_out, h.kernel * w_plan.kernel])
    with_zero = _node("pad", flat, ints([0, 0, 0, 0, 0, 1]), NONE, NONE, TermLit("String", "constant"))
    gathered = _node("gather", with_zero, ints(phase_indices(h, w_plan)), TermLit("i64", 2))
    phases = h.stride * w_plan.stride
    blocks = reshape(gathered, [c_in, c_out, phases, h.taps, w_plan.taps])
    return reshape(transpose(blocks, [2, 1, 0, 3, 4]), [phases * c_out, c_in, h.taps, w_plan.taps])


def interleave(y: Term, n: int, c_out: int, h: PhasePlan, w: PhasePlan) -> Term:
    """DepthToSpace (DCR) of the Conv output ``[N, s_h*s_w*C_out, Q_h, Q_w]`` as a 4-D then a 5-D
    transpose (onnxruntime runs 6-D transposes slowly here, and DepthToSpace too)."""
    sh, sw, qh, qw = h.stride, w.stride, h.rows, w.rows
    cols = transpose(reshape(y, [n * sh, sw, c_out * qh, qw]), [0, 2, 3, 1])  # [N*s_h, C*Q_h, Q_w, s_w]
    rows = transpose(reshape(cols, [n, sh, c_out, qh, qw * sw]), [0, 2, 3, 1, 4])  # [N, C, Q_h, s_h, Q_w*s_w]
    return reshape(rows, [n, c_out, qh * sh, qw * sw])


def subpixel_site(call_: OpCall) -> Site | None:
    """The sub-pixel form of a 2-D ConvTranspose (group 1, dilations 1), or None when out of scope."""
    x_shape, w_shape = call_.in_shapes[0], call_.in_shapes[1]
    if x_shape is None or w_shape is None or len(x_shape) != 4 or None in call_.inputs[:2]:
        return None
    op = WindowedOp(call_.op, call_.attrs)
    named = op.named
    strides, pads = tuple(named["strides"]), tuple(named["pads"])
    if named["group"] != 1 or any(d != 1 for d in named["dilations"]) or max(strides) < 2:
        return None
    n, c_in, height, width = x_shape
    c_out = w_shape[1]
    extra = tuple(named.get("output_padding") or (0, 0))
    h = plan_axis(height, w_shape[2], strides[0], pads[0], pads[2], extra[0])
    w = plan_axis(width, w_shape[3], strides[1], pads[1], pads[3], extra[1])
    if h is None or w is None or (h.out, w.out) != tuple(call_.out_shape[2:]):
        return None
    x_in, w_in = call_.inputs[0], call_.inputs[1]
    assert x_in is not None and w_in is not None
    leaves: dict[str, tuple[str, tuple[int, ...], int]] = {"x": (x_in, x_shape, call_.dtype), "w": (w_in, w_shape, call_.dtype)}
    x, weight = leaf("x"), leaf("w")
    bias: Term = NONE
    params: list[Term] = [weight, NONE]
    b_in = call_.inputs[2] if len(call_.inputs) > 2 else None
    if b_in is not None and call_.in_shapes[2] is not None:
        leaves["b"] = (b_in, call_.in_shapes[2], call_.dtype)
        params[1] = leaf("b")
        bias = concat([params[1]] * (h.stride * w.stride), 0)
    conv = call(
        "conv",
        [x, phase_weight(weight, c_in, c_out, h, w), bias],
        [("Vec", (1, 1)), ("Vec", (h.pad_before, w.pad_before, h.pad_after, w.pad_after)), ("Vec", (1, 1)), ("i64", 1)],
    )
    mutant = interleave(conv, n, c_out, h, w)
    if (h.shift, w.shift) != (0, 0) or (h.rows * h.stride, w.rows * w.stride) != (h.out, w.out):
        mutant = _node("slice_", mutant, ints([h.shift, w.shift]), ints([h.shift + h.out, w.shift + w.out]), ints([2, 3]), NONE)
    return exact_site(RULE, call_, leaves, op.apply(x, params), mutant, every_position(call_.out_shape, (2, 3)))


def _find(calls: list[OpCall], eg: SerializedEGraph | None) -> list[Site]:
    sites = [subpixel_site(c) for c in calls if c.op == "conv_transpose"]
    return [s for s in sites if s is not None]


def conv_transpose_sample(
    n: int, c_in: int, size: tuple[int, int], c_out: int, kernel: tuple[int, int], stride: tuple[int, int],
    pads: tuple[int, int, int, int], output_padding: tuple[int, int] = (0, 0), *, bias: bool = True, tag: str = "",
) -> OpCall:
    """A ConvTranspose call with its output shape, for the rule table's samples and the tests."""
    out = tuple(
        (size[i] - 1) * stride[i] - pads[i] - pads[i + 2] + kernel[i] + output_padding[i] for i in range(2)
    )
    ins: tuple[str | None, ...] = (f"{tag}x", f"{tag}w", f"{tag}b" if bias else None)
    shapes = ((n, c_in, *size), (c_in, c_out, *kernel), (c_out,) if bias else None)
    attrs = (stride, pads, (1, 1), 1, output_padding)
    return OpCall("conv_transpose", f"{tag}y", ins, attrs, shapes, (n, c_out, *out), 1)


register(
    FAMILIES,
    PartialRule(
        RULE,
        "ConvTranspose with stride >= 2 as one Conv over s*s phase kernels (gathered from the weight,"
        " folded at export) interleaved back by transposes (sub-pixel convolution); PET's check finds"
        " no differing box, since the Conv's zero padding is the transposed conv's border.",
        _find,
        lambda: [
            conv_transpose_sample(1, 3, (5, 4), 2, (4, 4), (2, 2), (1, 1, 1, 1), tag="t0"),
            conv_transpose_sample(2, 2, (4, 5), 3, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), tag="t1"),
            conv_transpose_sample(1, 2, (4, 4), 2, (5, 3), (2, 3), (2, 0, 1, 1), (1, 0), bias=False, tag="t2"),
            conv_transpose_sample(1, 2, (3, 4), 2, (3, 2), (3, 2), (0, 1, 0, 0), (2, 1), tag="t3"),
            conv_transpose_sample(1, 2, (4, 3), 3, (2, 2), (2, 2), (0, 0, 0, 0), tag="t4"),
        ],
        "exact, PET-verified at each site's shapes: conv_transpose(x, w, b) on NCHW, group 1, dilations 1,"
        " a stride >= 2",
        ops=frozenset({"conv_transpose"}),
        exact=True,
    )
)
