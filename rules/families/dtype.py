"""Cast rules with dtype guards: a Cast chain loses its middle step only when that step is exact.

``cast(cast(x, mid), to) == cast(x, to)`` holds when every value of x's type is exactly
representable in ``mid`` (float16 -> float32 -> float16 is the identity; int64 -> float32 -> int64
is not, nor is float32 -> float16 -> float32). Then the outer Cast converts the same value either
way. ``cast-same`` (layout.py) removes a Cast to the type a tensor already has.

QuantizeLinear / DequantizeLinear are not modelled: they stay opaque nodes, which no rule reads or
moves, so every Q/DQ pair stays exactly where the exporter put it and ORT's QDQ transformer sees
the pattern it expects. Moving layout ops across a DQ(Q(x)) pair (ORT's QDQ propagation) would
need the pair modelled with its per-axis scale remapped; that is open work.
"""

from __future__ import annotations

from egglog import Vec, i64, vars_

from ...egraph import lang as L
from ..registry import Family

FAMILY = Family("dtype")
FAMILIES = (FAMILY,)

(x,) = vars_("x", L.Tensor)
mid, to = vars_("mid to", i64)

FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL = 1, 2, 3, 4, 5, 6, 7, 9
FLOAT16, DOUBLE, UINT32, UINT64, BFLOAT16 = 10, 11, 12, 13, 16

EXACT_WIDENINGS: dict[int, tuple[int, ...]] = {
    BOOL: (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE),
    UINT8: (UINT16, INT16, UINT32, INT32, UINT64, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE),
    INT8: (INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE),
    UINT16: (UINT32, INT32, UINT64, INT64, FLOAT, DOUBLE),
    INT16: (INT32, INT64, FLOAT, DOUBLE),
    UINT32: (UINT64, INT64, DOUBLE),
    INT32: (INT64, DOUBLE),
    FLOAT16: (FLOAT, DOUBLE),
    BFLOAT16: (FLOAT, DOUBLE),
    FLOAT: (DOUBLE,),
}
"""src -> the types that hold every value of src exactly (integers up to 2**11 in float16, 2**8 in bfloat16)."""

# cast(cast(x, mid), to) => cast(x, to) when x -> mid is exact: one Cast instead of two (mixed
# precision exports cast up and back down around ops that were moved; with to == x's type the
# remaining Cast is then removed by cast-same). One variant per source type, its dtype pinned.
for _src, _mids in EXACT_WIDENINGS.items():
    FAMILY.rewrite(
        "cast-cast-lossless",
        L.cast(L.cast(x, mid), to),
        L.cast(x, to),
        L.dtype(x) == i64(_src),
        Vec(*[i64(m) for m in _mids]).contains(mid),
        variant=str(_src),
    )

RULE_NAMES = list(FAMILY.names)
