"""Folding of shape computations once shapes are known (onnx-simplifier's main win), including
models with a symbolic batch dim: a Gather of a known dim out of a partly symbolic Shape, Shape
with start/end, ConstantOfShape of a constant, Reshape/Expand targets replaced by the analysed
shape, and the ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chain PyTorch exports for
``x.view(x.size(0), ...)`` turned into a literal target that copies the dim (a 0 entry).

Int constants of rank 0/1 (``Tensor.ints``) are what these rules read and produce.
"""

from __future__ import annotations

from egglog import Vec, f64, i64, vars_
from egglog.egraph import FactLike

from ...egraph import lang as L
from ...egraph.shapes import clamp, norm_axis
from ..registry import ROOT as t
from ..registry import Family

SHAPE_FAMILY = Family("shape-arith")
FAMILIES = (SHAPE_FAMILY,)

x, z, target = vars_("x z target", L.Tensor)
(tail,) = vars_("tail", L.TList)
sa, sx, sz, va, vb, vc, vg = vars_("sa sx sz va vb vc vg", Vec[i64])
ia, ib, az, dt = vars_("ia ib az dt", i64)
(fv,) = vars_("fv", f64)

INT64_MAX = 2**63 - 1
_SCALAR = i64(0)
_VECTOR = i64(1)


def _ints(v: Vec[i64], rank: i64 = _VECTOR) -> L.Tensor:
    return L.Tensor.ints(v, rank)


def _known(v: Vec[i64], rank: int, low: int = 0) -> list[FactLike]:
    return [v.length() == i64(rank), *[v[i] >= i64(low) for i in range(rank)]]


_FULL_SHAPE = L.shape_of(z, i64(0), i64(INT64_MAX))
_in_z = (vg[0] < sz.length(), vg[0] >= i64(0) - sz.length())

# ---------------------------------------------------------------- reading known dims
# Gather of a known dim out of a Shape whose other dims may be symbolic is that dim.
SHAPE_FAMILY.rewrite(
    "gather-shape-known-dim",
    L.gather(_FULL_SHAPE, _ints(vg, _SCALAR), i64(0)),
    _ints(Vec(sz[norm_axis(vg[0], sz.length())]), _SCALAR),
    L.shape(z) == sz,
    *_in_z,
    sz[norm_axis(vg[0], sz.length())] >= i64(0),
)
SHAPE_FAMILY.rewrite(
    "gather-shape-known-dim",
    L.gather(_FULL_SHAPE, _ints(vg), i64(0)),
    _ints(Vec(sz[norm_axis(vg[0], sz.length())])),
    L.shape(z) == sz,
    vg.length() == i64(1),
    *_in_z,
    sz[norm_axis(vg[0], sz.length())] >= i64(0),
    variant="vector",
)

# Shape with start/end over known dims is a constant (opset-15 Shape, PyTorch's x.shape[1:]).
for _n in range(1, 6):
    _start = clamp(norm_axis(ia, sx.length()), 0, sx.length())
    _end = clamp(norm_axis(ib.min(i64(2**62)), sx.length()), 0, sx.length())
    SHAPE_FAMILY.rewrite(
        "shape-range-of-known",
        L.shape_of(x, ia, ib),
        _ints(Vec(*[sx[_start + i] for i in range(_n)])),
        L.shape(x) == sx,
        _end - _start == i64(_n),
        *[sx[_start + i] >= i64(0) for i in range(_n)],
        variant=str(_n),
    )

# Slice of a constant int vector (x.shape[2:] after the Shape folded) is a constant.
for _n in range(1, 5):
    _len = va.length()
    _start = clamp(norm_axis(vb[0], _len), 0, _len)
    _end = clamp(norm_axis(vc[0].min(i64(2**62)), _len), 0, _len)
    for _axes_name, _axes in (("implicit", L.Tensor.none()), ("axis0", _ints(Vec(i64(0))))):
        SHAPE_FAMILY.rewrite(
            "slice-const-ints",
            L.slice_(_ints(va), _ints(vb), _ints(vc), _axes, L.Tensor.none()),
            _ints(Vec(*[va[_start + i] for i in range(_n)])),
            vb.length() == i64(1),
            vc.length() == i64(1),
            _end - _start == i64(_n),
            variant=f"{_axes_name}-{_n}",
        )

# Squeeze / Reshape of a one-element int vector to a scalar and back.
SHAPE_FAMILY.rewrite("squeeze-const-ints", L.squeeze(_ints(va), L.Tensor.none()), _ints(va, _SCALAR), va.length() == i64(1))
SHAPE_FAMILY.rewrite("squeeze-const-ints", L.squeeze(_ints(va), _ints(Vec(i64(0)))), _ints(va, _SCALAR), va.length() == i64(1), variant="axis0")
for _rank in (0, 1):
    SHAPE_FAMILY.rewrite(
        "reshape-const-ints",
        L.reshape(L.Tensor.ints(va, ia), target, az),
        L.Tensor.ints(va, i64(_rank)),
        L.shape(t) == sa,
        sa.length() == i64(_rank),
        variant=str(_rank),
    )

# ConstantOfShape of a constant shape is a splat that rules can read (x * ones => x).
SHAPE_FAMILY.rewrite(
    "constant-of-shape-const",
    L.constant_of_shape(_ints(va), fv, dt),
    L.Tensor.splat(fv, va, dt),
    L.shape(t) == va,
)

# ---------------------------------------------------------------- targets from the analysis
for _r in range(1, 7):
    # A Reshape whose output shape is known takes it as a literal target; whatever computed the
    # old target (a Shape -> Gather -> Concat chain) becomes dead. Dims >= 1: a 0 would copy.
    SHAPE_FAMILY.rewrite(
        "reshape-known-target",
        L.reshape(x, target, az),
        L.reshape(x, _ints(sa), i64(0)),
        L.shape(t) == sa,
        *_known(sa, _r, low=1),
        variant=str(_r),
    )
    # Likewise an Expand to a known shape (the broadcast of x's shape and the target is the output).
    SHAPE_FAMILY.rewrite("expand-known-target", L.expand(x, target), L.expand(x, _ints(sa)), L.shape(t) == sa, *_known(sa, _r), variant=str(_r))


# ---------------------------------------------------------------- symbolic dims copied by Reshape
def _dim_of(shape_src: L.Tensor, index: Vec[i64]) -> L.Tensor:
    """``unsqueeze(gather(Shape(src), i), [0])``: one dim of a tensor as a 1-element vector."""
    gathered = L.gather(L.shape_of(shape_src, i64(0), i64(INT64_MAX)), _ints(index, _SCALAR), i64(0))
    return L.unsqueeze(gathered, _ints(Vec(i64(0))))


def _same_dim(src_shape: Vec[i64], index: Vec[i64], dim: i64) -> list[FactLike]:
    """Dim ``index[0]`` of ``src_shape`` is ``dim`` (the same known value or the same symbol)."""
    return [
        index[0] < src_shape.length(),
        index[0] >= i64(0) - src_shape.length(),
        src_shape[norm_axis(index[0], src_shape.length())] == dim,
    ]


# reshape(x, concat(dim_i(z), ...)) where z's dim i is x's dim 0 => the entry becomes 0 (copy x's dim):
# the Shape chain of x.view(x.size(0), -1) disappears even with a symbolic batch dim. Entries
# keep their positions, so other 0s still copy the same dims; concat-const-ints then folds the
# literal parts (x.view(B, S, heads, -1) takes two steps, the second after a literal prefix).
SHAPE_FAMILY.rewrite(
    "reshape-target-copied-dims",
    L.reshape(x, L.concat(L.TList.cons(_dim_of(z, vg), tail), i64(0)), i64(0)),
    L.reshape(x, L.concat(L.TList.cons(_ints(Vec(i64(0))), tail), i64(0)), i64(0)),
    L.shape(x) == sx,
    sx.length() >= i64(1),
    L.shape(z) == sz,
    *_same_dim(sz, vg, sx[0]),
    variant="first",
)
SHAPE_FAMILY.rewrite(
    "reshape-target-copied-dims",
    L.reshape(x, L.concat(L.TList.cons(_ints(va), L.TList.cons(_dim_of(z, vg), tail)), i64(0)), i64(0)),
    L.reshape(x, L.concat(L.TList.cons(_ints(va.push(i64(0))), tail), i64(0)), i64(0)),
    L.shape(x) == sx,
    sx.length() > va.length(),
    L.shape(z) == sz,
    *_same_dim(sz, vg, sx[va.length()]),
    variant="after-literal",
)

RULE_NAMES = [
    "gather-shape-known-dim",
    "shape-range-of-known",
    "slice-const-ints",
    "squeeze-const-ints",
    "reshape-const-ints",
    "constant-of-shape-const",
    "reshape-known-target",
    "expand-known-target",
    "reshape-target-copied-dims",
]
