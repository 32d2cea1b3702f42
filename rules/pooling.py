"""Pooling rewrites (layout family): a large 2-D pooling window made separable.

A k_h x k_w MaxPool is a k_h x 1 pool (the height's stride and pads) then a 1 x k_w pool (the
width's): the max over a window's in-bounds rectangle is the max over its rows of the max over
its columns, padding included (it is -inf either way). An AveragePool factors the same way in
floor mode: the divisor is the in-bounds rectangle's area (count_include_pad=0) or k_h * k_w
(count_include_pad=1, every window lies inside the padded input), both products of a height and a
width factor. Exact rewrites (no correction); k_h * k_w reads per output become k_h + k_w.
"""

from __future__ import annotations

from egglog import Vec, i64, vars_
from egglog.egraph import FactLike

from ..egraph import lang as L
from .layout import FAMILY
from .registry import RULES, rewrite_rule

MIN_SEPARABLE_WINDOW = 5
"""Measured on this CPU (onnxruntime, ORT_ENABLE_ALL, benchmarks/results/partial_candidates.md):
the two 1-D passes beat one k x k pool from k = 5 on (x1.2-1.5; x1.9 at 7, x5.6 at 13) and lose
at 3, so smaller windows are left whole."""

(x,) = vars_("x", L.Tensor)
kernel, strides, pads, dil, shape = vars_("kernel strides pads dil shape", Vec[i64])
(cip,) = vars_("cip", i64)

_ONE, _ZERO = i64(1), i64(0)
_FLOOR = _ZERO  # ceil_mode 0: with ceil_mode a window may pass the padded input (AveragePool's divisor changes)
_GUARDS: tuple[FactLike, ...] = (
    L.shape(x) == shape,
    shape.length() == i64(4),
    kernel.length() == i64(2),
    strides.length() == i64(2),
    pads.length() == i64(4),
    kernel[0] >= i64(MIN_SEPARABLE_WINDOW),
    kernel[1] >= i64(MIN_SEPARABLE_WINDOW),
    # Pads below the kernel (onnxruntime refuses others): no window lies wholly in the padding.
    pads[0] < kernel[0],
    pads[2] < kernel[0],
    pads[1] < kernel[1],
    pads[3] < kernel[1],
)
_COLUMN = (Vec(kernel[0], _ONE), Vec(strides[0], _ONE), Vec(pads[0], _ZERO, pads[2], _ZERO))
"""The first pass: the window's height, with the height's stride and pads."""
_ROW = (Vec(_ONE, kernel[1]), Vec(_ONE, strides[1]), Vec(_ZERO, pads[1], _ZERO, pads[3]))
"""The second pass: the window's width, with the width's stride and pads."""
_NO_DILATION = Vec(_ONE, _ONE)

# A large MaxPool window as a column max then a row max (k + k instead of k * k reads per output).
rewrite_rule(
    RULES,
    FAMILY,
    "pool-separable",
    L.max_pool(x, kernel, strides, pads, dil, _FLOOR),
    L.max_pool(L.max_pool(x, *_COLUMN, _NO_DILATION, _FLOOR), *_ROW, _NO_DILATION, _FLOOR),
    *_GUARDS,
    dil == _NO_DILATION,
    variant="max",
)
# ... and a large AveragePool window as a column mean then a row mean (either divisor convention).
rewrite_rule(
    RULES,
    FAMILY,
    "pool-separable",
    L.average_pool(x, kernel, strides, pads, _FLOOR, cip),
    L.average_pool(L.average_pool(x, *_COLUMN, _FLOOR, cip), *_ROW, _FLOOR, cip),
    *_GUARDS,
    variant="average",
)

RULE_NAMES = ["pool-separable"]
