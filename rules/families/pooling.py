"""Pooling rewrites (layout family): a large 2-D pooling window made separable.

A k_h x k_w MaxPool is a k_h x 1 pool (the height's stride and pads) then a 1 x k_w pool (the
width's): the max over a window's in-bounds rectangle is the max over its rows of the max over
its columns, padding included (it is -inf either way). An AveragePool factors the same way in
floor mode: the divisor is the in-bounds rectangle's area (count_include_pad=0) or k_h * k_w
(count_include_pad=1, every window lies inside the padded input), both products of a height and a
width factor. Exact rewrites (no correction); k_h * k_w reads per output become k_h + k_w.

A stride-1 "same" MaxPool of a large odd window k is also a 5 x 5 pool then a (k - 4) x (k - 4)
pool (YOLOv5's SPPF cascade): with -inf padding, the max over window k1 then window k2 is the max
over window k1 + k2 - 1, exact at the borders too. A pyramid's 9 x 9 becomes the 5 x 5 of its 5 x 5
branch and its 13 x 13 the 5 x 5 of the 9 x 9, sharing passes; it wins at every onnxruntime level.
"""

from __future__ import annotations

from egglog import Vec, i64, ne, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ..registry import Family

FAMILY = Family("layout")
FAMILIES = (FAMILY,)

MIN_SEPARABLE_WINDOW = 5
"""Measured on this CPU (onnxruntime, ORT_ENABLE_ALL, benchmarks/results/partial_candidates.md):
the two 1-D passes beat one k x k pool from k = 5 on (x1.2-1.5; x1.9 at 7, x5.6 at 13) and lose
at 3, so smaller windows are left whole."""

CASCADE_STEP = 5
"""The cascade's first window: the smallest the SPP pyramids share (5, 9, 13)."""
MIN_CASCADE_WINDOW = 9
"""The smallest window the cascade splits: 9 = 5 then 5 (a 7 would be 5 then 3; not measured)."""

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

_NOT_CASCADED: dict[str, FactLike] = {
    "below-cascade": kernel[0] < i64(MIN_CASCADE_WINDOW),
    "not-square": ne(kernel[1]).to(kernel[0]),
    "height-stride": ne(strides[0]).to(_ONE),
    "width-stride": ne(strides[1]).to(_ONE),
    "not-same": ne(pads[0] * i64(2) + _ONE).to(kernel[0]),
    "width-pad": ne(pads[1]).to(pads[0]),
    "bottom-pad": ne(pads[2]).to(pads[0]),
    "right-pad": ne(pads[3]).to(pads[0]),
}
"""One variant per way a MaxPool misses pool-cascade's guard (egglog has no negated guard): a
stride-1 'same' square window of 9 or more is left to the cascade, whose 5 x 5 passes are not a
loss at any onnxruntime level, where separable passes lose at ORT_ENABLE_BASIC and ORT_DISABLE_ALL
(benchmarks/results/pool_forms.md)."""

# A large MaxPool window as a column max then a row max (k + k instead of k * k reads per output).
for _why, _fact in _NOT_CASCADED.items():
    FAMILY.rewrite(
    "pool-separable",
        L.max_pool(x, kernel, strides, pads, dil, _FLOOR),
        L.max_pool(L.max_pool(x, *_COLUMN, _NO_DILATION, _FLOOR), *_ROW, _NO_DILATION, _FLOOR),
        *_GUARDS,
        dil == _NO_DILATION,
        _fact,
        variant=f"max-{_why}",
    )
# ... and a large AveragePool window as a column mean then a row mean (either divisor convention).
FAMILY.rewrite(
    "pool-separable",
    L.average_pool(x, kernel, strides, pads, _FLOOR, cip),
    L.average_pool(L.average_pool(x, *_COLUMN, _FLOOR, cip), *_ROW, _FLOOR, cip),
    *_GUARDS,
    variant="average",
)

_SQUARE_SAME_STRIDE_1: tuple[FactLike, ...] = (
    L.shape(x) == shape,
    shape.length() == i64(4),
    kernel.length() == i64(2),
    strides.length() == i64(2),
    pads.length() == i64(4),
    kernel[0] >= i64(MIN_CASCADE_WINDOW),
    kernel[1] == kernel[0],
    strides == Vec(_ONE, _ONE),
    dil == _NO_DILATION,
    # 'same' pads (k - 1) / 2 on every side, which also makes k odd.
    pads[0] * i64(2) + _ONE == kernel[0],
    pads[1] == pads[0],
    pads[2] == pads[0],
    pads[3] == pads[0],
)
_STEP_PAD = (CASCADE_STEP - 1) // 2
_REST = kernel[0] - i64(CASCADE_STEP - 1)
_REST_PAD = pads[0] - i64(_STEP_PAD)

# A 'same' k x k MaxPool (k >= 9 odd) as the k - 4 window's pool of the 5 x 5 window's pool.
FAMILY.rewrite(
    "pool-cascade",
    L.max_pool(x, kernel, strides, pads, dil, _FLOOR),
    L.max_pool(
        L.max_pool(x, L.ivec([CASCADE_STEP] * 2), strides, L.ivec([_STEP_PAD] * 4), _NO_DILATION, _FLOOR),
        Vec(_REST, _REST),
        strides,
        Vec(_REST_PAD, _REST_PAD, _REST_PAD, _REST_PAD),
        _NO_DILATION,
        _FLOOR,
    ),
    *_SQUARE_SAME_STRIDE_1,
)

RULE_NAMES = ["pool-separable", "pool-cascade"]
