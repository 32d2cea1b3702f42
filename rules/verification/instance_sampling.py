"""Random small shapes and attributes for rule instances, one sampler per op, valid by construction."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from ...egraph.ops import OpSpec
from ...egraph.shapes import MAX_RANK

DOUBLE, INT64 = TensorProto.DOUBLE, TensorProto.INT64


# ---------------------------------------------------------------- random choices
@dataclass(frozen=True)
class Want:
    """What a position wants: a tensor of ``shape`` of a kind (data, positive, bool, index, ints, none)."""

    shape: tuple[int, ...] = ()
    kind: str = "data"
    values: tuple[int, ...] = ()
    optional: bool = False
    high: int = 1


@dataclass(frozen=True)
class Known:
    shape: tuple[int, ...]
    dtype: int
    values: tuple[int, ...] | None = None
    """A small int constant's values (``Tensor.ints``), else None."""


NONE = Want(kind="none")


def _ints(values: Iterable[int], rank: int = 1) -> Want:
    vals = tuple(int(v) for v in values)
    return Want(() if rank == 0 else (len(vals),), "ints", vals)


class Gen:
    """Random small shapes and attributes for one candidate; dims and attributes are drawn from
    small pools and reused, so operands line up (MatMul K, broadcasting, sibling Convs)."""

    def __init__(self, rng: np.random.Generator, rank_hints: tuple[int, ...]):
        self.rng = rng
        self.hints = rank_hints
        self.pool = [1, *(int(d) for d in rng.choice([2, 3, 4], size=2))]
        self.memory: dict[str, Any] = {}

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq: Iterable[Any]) -> Any:
        items = list(seq)
        return items[int(self.rng.integers(len(items)))]

    def between(self, lo: int, hi: int) -> int:
        """Uniform in ``[lo, hi)``."""
        return int(self.rng.integers(lo, hi)) if hi > lo else lo

    def reuse(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.memory or self.chance(0.3):
            self.memory[key] = make()
        return self.memory[key]

    def rank(self, lo: int = 0, hi: int = MAX_RANK) -> int:
        hinted = [h for h in self.hints if lo <= h <= hi]
        if hinted and self.chance(0.6):
            return int(self.pick(hinted))
        if self.chance(0.1):
            return self.between(lo, hi + 1)
        return int(self.pick([r for r in (1, 2, 2, 3, 3, 4) if lo <= r <= hi] or [lo]))

    def dim(self) -> int:
        return int(self.pick(self.pool)) if self.chance(0.7) else self.between(1, 5)

    def shape(self, rank: int | None = None, lo: int = 0, hi: int = MAX_RANK) -> tuple[int, ...]:
        dims = [self.dim() for _ in range(self.rank(lo, hi) if rank is None else rank)]
        while math.prod(dims) > 256:
            dims[int(np.argmax(dims))] -= 1
        return tuple(dims)

    def partner(self, s: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``s``: equal, a suffix, some dims 1, one axis kept, scalar, larger."""
        u = self.rng.random()
        if u < 0.3:
            return s
        if u < 0.45:
            return s[self.between(0, len(s) + 1) :]
        if u < 0.6:
            return tuple(1 if self.chance(0.5) else d for d in s)
        if u < 0.75 and s:
            keep = self.between(0, len(s))
            return tuple(d if i == keep else 1 for i, d in enumerate(s))[self.between(0, keep + 1) :]
        if u < 0.85:
            return ()
        return self.shape(rank=self.between(1, 3)) + s if len(s) < MAX_RANK - 1 else s

    def perm(self, r: int) -> tuple[int, ...]:
        return tuple(range(r)) if self.chance(0.25) else tuple(int(i) for i in self.rng.permutation(r))

    def axes(self, r: int, n_max: int = 3, lo: int = 1) -> tuple[int, ...]:
        n = self.between(min(lo, r), min(n_max, r) + 1)
        return tuple(sorted(int(a) for a in self.rng.choice(r, size=n, replace=False)))

    def special(self) -> float:
        return float(self.pick([0.0, 1.0, -1.0, 0.5, 2.0])) if self.chance(0.6) else float(self.rng.normal())


# ---------------------------------------------------------------- per-op samplers
# A sampler proposes, by constructor argument name, a valid value for every position; the
# instantiator keeps what the pattern fixes and passes it in ``k`` (tensors as ``Known``, absent
# ones as None, literals as Python values, "__out__": the shape the consumer wants, if any, and
# "__ranks__": the ranks guards give the open leaves, by argument name).
Sampler = Callable[[Gen, dict[str, Any]], dict[str, Any]]


def _shape(g: Gen, k: dict[str, Any], name: str, lo: int = 0, hi: int = MAX_RANK) -> tuple[int, ...]:
    known, out = k.get(name), k.get("__out__")
    if isinstance(known, Known):
        return known.shape
    return out if out is not None and lo <= len(out) <= hi else g.shape(lo=lo, hi=hi)


def _attr(k: dict[str, Any], name: str, make: Callable[[], Any]) -> Any:
    return k[name] if name in k else make()


def _s_unary(name: str, **attrs: Callable[[Gen], Any]) -> Sampler:
    return lambda g, k: {name: Want(_shape(g, k, name)), **{a: f(g) for a, f in attrs.items()}}


def _s_binary(a: str, b: str) -> Sampler:
    def sample(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
        if isinstance(k.get(b), Known) and not isinstance(k.get(a), Known):
            return {a: Want(g.partner(k[b].shape)), b: Want(k[b].shape)}
        if not isinstance(k.get(a), Known) and g.chance(0.3):  # sometimes the right operand is the big one
            sb = _shape(g, k, b)
            return {a: Want(g.partner(sb)), b: Want(sb)}
        sa = _shape(g, k, a)
        return {a: Want(sa), b: Want(g.partner(sa))}

    return sample


def _s_where(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    out_shape = k.get("__out__")
    if out_shape is not None and not any(isinstance(k.get(n), Known) for n in ("X", "Y", "condition")) and g.chance(0.6):
        # the condition and Y of the output's shape, X the smaller one (a guard Where(IsNaN(p), 0, p))
        return {"X": Want(g.partner(out_shape)), "Y": Want(out_shape), "condition": Want(out_shape, "bool")}
    out = _s_binary("X", "Y")(g, k)
    return {**out, "condition": Want(g.partner(out["X"].shape), "bool")}


def _s_axis(data: str, end: int = 0) -> Sampler:
    """One data input and an ``axis`` in ``[0, rank + end)``."""

    def sample(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
        s = _shape(g, k, data, lo=1)
        return {data: Want(s), "axis": g.between(0, len(s) + end)}

    return sample


def _s_matmul(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    if isinstance(k.get("B"), Known) and not isinstance(k.get("A"), Known):
        sb = k["B"].shape
        kk = sb[-2] if len(sb) >= 2 else (sb[0] if sb else 1)
        return {"A": Want((g.dim(), kk) if g.chance(0.8) else (kk,)), "B": Want(sb)}
    out = k.get("__out__")
    if out is not None and len(out) >= 2 and not isinstance(k.get("A"), Known):
        kk = g.dim()
        if len(out) >= 3 and g.chance(0.7):  # batched, both operands of the output's batch (attention)
            return {"A": Want((*out[:-1], kk)), "B": Want((*out[:-2], kk, out[-1]))}
        return {"A": Want((*out[:-1], kk)), "B": Want((kk, out[-1]))}
    sa = _shape(g, k, "A", lo=1, hi=4)
    kk, n = (sa[-1] if sa else 1), g.dim()
    if len(sa) >= 3 and g.chance(0.7):  # both operands of one batch (attention's products)
        right: tuple[int, ...] = (*sa[:-2], kk, n)
    elif len(sa) >= 2 and g.chance(0.3):
        right = g.partner(sa[:-2])[-2:] + (kk, n)
    else:
        right = (kk,) if g.chance(0.1) else (kk, n)
    return {"A": Want(sa), "B": Want(right)}


def _s_gemm(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    ta, tb = _attr(k, "transA", lambda: g.pick([0, 1])), _attr(k, "transB", lambda: g.pick([0, 1]))
    m, kk, n = g.dim(), g.dim(), g.dim()
    if isinstance(k.get("A"), Known) and len(k["A"].shape) == 2:
        m, kk = k["A"].shape[::-1] if ta else k["A"].shape
    if isinstance(k.get("B"), Known) and len(k["B"].shape) == 2:
        kk, n = k["B"].shape[::-1] if tb else k["B"].shape
    return {
        "A": Want((kk, m) if ta else (m, kk)),
        "B": Want((n, kk) if tb else (kk, n)),
        "C": Want(g.pick([(n,), (m, n), (1, n), (m, 1), ()]), optional=True),
        "alpha": g.pick([1.0, 1.0, 0.5, 2.0]),
        "beta": g.pick([1.0, 1.0, 0.5, 2.0]),
        "transA": ta,
        "transB": tb,
    }


def _s_conv(transposed: bool) -> Sampler:
    def sample(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
        xs = k["X"].shape if isinstance(k.get("X"), Known) else None
        ws = k["W"].shape if isinstance(k.get("W"), Known) else None
        fixed = [len(k[a]) for a in ("strides", "dilations") if isinstance(k.get(a), tuple)]
        n = len(xs) - 2 if xs else len(ws) - 2 if ws else fixed[0] if fixed else g.rank(3, 5) - 2
        group = _attr(k, "group", lambda: g.pick([1, 1, 1, 2]))
        strides = _attr(
            k, "strides", lambda: g.reuse("strides", lambda: tuple(g.pick([1, 1, 2]) for _ in range(n)))
        )
        dil = _attr(
            k, "dilations", lambda: g.reuse("dil", lambda: tuple(g.pick([1, 1, 1, 2]) for _ in range(n)))
        )
        pads = _attr(
            k, "pads", lambda: g.reuse("pads", lambda: tuple(g.pick([0, 0, 1]) for _ in range(2 * n)))
        )
        kernel = ws[2:] if ws else g.reuse("kernel", lambda: tuple(g.pick([1, 2, 3]) for _ in range(n)))
        if xs is None:
            cin = (ws[0] if transposed else ws[1] * group) if ws else group * g.pick([1, 2])
            xs = (g.pick([1, 2]), cin, *[max(g.dim(), 2 * d + 1) for d in dil])  # room for any kernel up to 3
        cin = xs[1] if len(xs) > 1 else 1
        group = group if cin % group == 0 else 1
        cout = (ws[1] * group if transposed else ws[0]) if ws else group * g.pick([1, 2])
        w = ws or ((cin, cout // group, *kernel) if transposed else (cout, cin // group, *kernel))
        out = {"X": Want(xs), "W": Want(w), "B": Want((cout,), optional=True), "strides": strides, "pads": pads}
        out.update(dilations=dil, group=group, output_padding=tuple(0 for _ in range(n)))
        return out

    return sample


def _s_batch_norm(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "X", lo=2, hi=5)
    params = {name: Want(xs[1:2]) for name in ("scale", "B", "mean")}
    return {**params, "X": Want(xs), "var": Want(xs[1:2], "positive"), "epsilon": g.pick([1e-5, 1e-3, 0.1])}


def _s_layer_norm(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "X", lo=1)
    axis = _attr(k, "axis", lambda: g.between(-len(xs), len(xs)))
    inner = xs[axis:] if -len(xs) <= axis < len(xs) else ()
    return {
        "X": Want(xs),
        "Scale": Want(inner),
        "B": Want(inner, optional=True),
        "axis": axis,
        "epsilon": g.pick([1e-5, 1e-3]),
    }


def _s_pool(average: bool) -> Sampler:
    def sample(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
        xs = _shape(g, k, "X", lo=3, hi=5)
        n = len(xs) - 2
        # Now and then a large window (rules guarded on window size, e.g. pool-separable's k >= 5).
        large = float(g.rng.random())
        sizes = [5, 6, 7] if large < 0.3 else [1, 2, 3]
        kernel = _attr(k, "kernel", lambda: tuple(g.pick(sizes) for _ in range(n)))
        if not isinstance(k.get("X"), Known):
            xs = (*xs[:2], *(max(s, kk + 1) for s, kk in zip(xs[2:], kernel, strict=False)))
        out = {"X": Want(xs), "kernel": kernel, "strides": tuple(g.pick([1, 2]) for _ in range(n))}
        pads = tuple(g.between(0, kk) for kk in kernel)
        pads = (*pads, *(pads if g.chance(0.5) else (g.between(0, kk) for kk in kernel)))  # begin != end too
        if not average and n == 2 and "kernel" not in k and large < 0.1:
            # A third of the large ones: a stride-1 'same' square window of 9, 11 or 13 (pool-cascade's
            # guard), made from the draws above so that the random stream of other samples is unchanged.
            side = 2 * kernel[0] - 1
            out.update(kernel=(side, side), strides=(1, 1))
            pads = (kernel[0] - 1,) * 4
        out.update(pads=pads, ceil_mode=g.pick([0, 0, 1]))
        return {**out, "count_include_pad": g.pick([0, 1])} if average else {**out, "dilations": (1,) * n}

    return sample


def _factor(g: Gen, numel: int, rank: int) -> list[int]:
    dims, left = [], numel
    for _ in range(rank - 1):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        dims.append(g.pick([d for d in divisors if d > 1] or [1]) if g.chance(0.7) else g.pick(divisors))
        left //= dims[-1]
    return [*dims, left] if rank else []


def _regroup(g: Gen, dims: tuple[int, ...], rank: int | None) -> tuple[int, ...]:
    """A shape of the same elements as ``dims`` the way models reshape: trailing dims merged (heads
    merged, a flatten) or the last dim split (heads split), sometimes the leading ones (batch dims),
    to ``rank`` dims where a guard gives it; else one of those at random, ``dims`` itself, or a
    random factoring."""
    if rank is None:
        u = g.rng.random()
        if u < 0.2 or not dims:
            return dims
        if u < 0.5 and len(dims) >= 2:
            rank = len(dims) - 1
        elif u < 0.7 and len(dims) < MAX_RANK:
            rank = len(dims) + 1
        else:
            return tuple(_factor(g, math.prod(dims), g.rank(0 if math.prod(dims) == 1 else 1)))
    leading = g.chance(0.3)  # the batch dims (a batched transpose), else the trailing ones
    if rank < len(dims):
        if not rank:
            return ()
        merged = len(dims) - rank + 1
        if leading:
            return (math.prod(dims[:merged]), *dims[merged:])
        return (*dims[: rank - 1], math.prod(dims[rank - 1 :]))
    if rank > len(dims) and dims:
        parts = _factor(g, dims[0] if leading else dims[-1], rank - len(dims) + 1)
        return (*parts, *dims[1:]) if leading else (*dims[:-1], *parts)
    return dims


def _s_reshape(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    allowzero = _attr(k, "allowzero", lambda: 0)
    out, data, fixed = k.get("__out__"), k.get("data"), k.get("shape")
    rank = k.get("__ranks__", {}).get("data")
    if isinstance(fixed, Known) and fixed.values is not None and fixed.shape and not isinstance(data, Known):
        # the target is fixed: data of its elements (a 0 copies data's dim there, -1 is inferred)
        dims = tuple(v if v > 0 or (v == 0 and allowzero) else g.dim() for v in fixed.values)
        xs = dims if 0 in fixed.values else _regroup(g, dims, rank)
        return {"data": Want(xs), "shape": _ints(fixed.values), "allowzero": allowzero}
    if out is not None and not isinstance(data, Known):  # meet the consumer's shape
        xs, target = _regroup(g, tuple(out), rank), list(out)
    else:
        xs = _shape(g, k, "data")
        out_rank = k.get("__ranks__", {}).get("__out__")
        if g.chance(0.15) and out_rank in (None, len(xs)):
            return {"data": Want(xs), "shape": _ints(xs), "allowzero": allowzero}
        target = list(_regroup(g, xs, out_rank if out_rank is not None and g.chance(0.7) else None))
    if target and g.chance(0.2):
        target[g.between(0, len(target))] = -1
    same = [i for i, d in enumerate(target) if i < len(xs) and d == xs[i]]
    if not allowzero and same and g.chance(0.15):
        target[g.pick(same)] = 0
    return {"data": Want(xs), "shape": _ints(target), "allowzero": allowzero}


def _s_squeeze(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = list(_shape(g, k, "data", lo=1))
    ones = [i for i, d in enumerate(xs) if d == 1]
    if g.chance(0.2):  # no axes: every 1 goes (none may be left)
        return {"data": Want(tuple(xs)), "axes": NONE}
    if not isinstance(k.get("data"), Known):
        ones = list(g.axes(len(xs)))
        xs = [1 if i in ones else d for i, d in enumerate(xs)]
    axes = (
        sorted(int(a) for a in g.rng.choice(ones, size=g.between(1, len(ones) + 1), replace=False))
        if ones
        else []
    )
    return {"data": Want(tuple(xs)), "axes": _ints(axes) if axes else NONE}


def _s_unsqueeze(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", hi=MAX_RANK - 1)
    n = g.between(1, min(3, MAX_RANK - len(xs)) + 1)
    axes = g.axes(len(xs) + n, n_max=n, lo=n)
    return {"data": Want(xs), "axes": _ints(tuple(a - len(xs) - n for a in axes) if g.chance(0.2) else axes)}


def _s_concat(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    items = k.get("inputs") or []
    known = [s for s in items if isinstance(s, Known)]
    base = known[0].shape if known else g.shape(lo=1)
    axis = _attr(k, "axis", lambda: g.between(0, len(base)))
    count = max(len(items), g.between(1, 4))
    return {
        "inputs": [Want(tuple(g.dim() if i == axis else d for i, d in enumerate(base))) for _ in range(count)],
        "axis": axis,
    }


def _s_split(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = list(_shape(g, k, "input", lo=1))
    axis = _attr(k, "axis", lambda: g.between(0, len(xs)))
    known = isinstance(k.get("input"), Known)
    if g.chance(0.6):
        sizes = [g.dim() for _ in range(g.between(1, 4))]
        if known:
            parts = min(len(sizes), xs[axis])
            sizes = [1] * (parts - 1) + [xs[axis] - parts + 1]
        xs[axis] = sum(sizes)
        return {
            "input": Want(tuple(xs)),
            "split": _ints(sizes),
            "axis": axis,
            "num_outputs": 0,
            "index": g.between(0, len(sizes)),
        }
    parts = g.pick([d for d in range(1, 4) if xs[axis] % d == 0] or [1]) if known else g.between(1, 4)
    xs[axis] = xs[axis] if known else parts * g.dim()
    return {
        "input": Want(tuple(xs)),
        "split": NONE,
        "axis": axis,
        "num_outputs": parts,
        "index": g.between(0, parts),
    }


def _s_slice(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    if xs and xs[-1] % 2 == 0 and g.chance(0.5):  # one half of the last axis (rotate-half, chunk, GLU)
        half, last = xs[-1] // 2, g.pick([len(xs) - 1, -1])
        first = getattr(k.get("starts"), "values", None) or g.pick([(0,), (half,)])  # a fixed start picks the half
        bounds = (0, half) if first == (0,) else (half, g.pick([xs[-1], 2**62]))
        return {"data": Want(xs), "starts": _ints(bounds[:1]), "ends": _ints(bounds[1:]), "axes": _ints([last]),
                "steps": g.pick([NONE, _ints([1])])}  # fmt: skip
    axes = [int(a) for a in g.rng.permutation(len(xs))[: g.between(1, min(3, len(xs)) + 1)]]
    starts = [g.between(-xs[a], xs[a] + 1) for a in axes]
    ends = [g.between(-xs[a], xs[a] + 1) if g.chance(0.8) else 2**62 for a in axes]
    out = {"data": Want(xs), "starts": _ints(starts), "ends": _ints(ends), "axes": _ints(axes)}
    return {**out, "steps": _ints([g.pick([1, 1, 2]) for _ in axes])}


def _s_gather(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    axis = _attr(k, "axis", lambda: g.between(0, len(xs)))
    d = xs[axis] if -len(xs) <= axis < len(xs) else 1
    if axis == 0 and g.chance(0.2):
        return {"data": Want(xs), "indices": Want((g.dim(), g.dim()), "index", high=d), "axis": axis}
    count = 0 if g.chance(0.3) else g.dim()
    return {
        "data": Want(xs),
        "indices": _ints([g.between(-d, d) for _ in range(max(count, 1))], 0 if count == 0 else 1),
        "axis": axis,
    }


def _s_expand(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "input")
    target = [g.dim() if d == 1 else (1 if g.chance(0.2) else d) for d in xs]
    lead = [g.dim() for _ in range(g.between(0, 2))] if len(xs) < MAX_RANK else []
    return {"input": Want(xs), "shape": _ints(lead + target)}


def _s_pad(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    mode = _attr(k, "mode", lambda: g.pick(["constant", "constant", "edge", "reflect"]))
    pads = [0 if g.chance(0.5) else g.between(1, (d if mode == "reflect" else 3)) for d in xs * 2]
    if "__out__" in k and not isinstance(k.get("data"), Known):  # the padded result is the wanted shape
        xs = tuple(max(d - pads[i] - pads[i + len(xs)], 1) for i, d in enumerate(xs))
        pads = [min(p, max(xs[i % len(xs)] - 1, 0)) if mode == "reflect" else p for i, p in enumerate(pads)]
    return {
        "data": Want(xs),
        "pads": _ints(pads),
        "constant_value": Want((), optional=True),
        "axes": NONE,
        "mode": mode,
    }


def _s_reduce(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data")
    axes = g.axes(len(xs)) if xs and g.chance(0.8) else ()
    out = {"data": Want(xs), "axes": _ints(axes) if axes else NONE, "keepdims": g.pick([0, 1])}
    return {**out, "noop_with_empty_axes": 0 if axes or g.chance(0.7) else 1}


def _s_bias_gelu(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """A bias over the last axis (what the bias-GELU fusion and onnxruntime's BiasGelu take)."""
    xs = _shape(g, k, "X", lo=1)
    return {"X": Want(xs), "bias": Want(xs[-1:]), "approximate": g.pick(["none", "tanh"]), "dtype": DOUBLE}


def _s_rms_norm(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """A scale over the last axis (what the RMSNorm fusion and RMSNormalization's axis -1 take)."""
    xs = _shape(g, k, "X", lo=1)
    return {"X": Want(xs), "scale": Want(xs[-1:]), "epsilon": g.pick([1e-5, 1e-6]), "dtype": DOUBLE}


def _s_skip_rms_norm(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """A skip of x's shape, 2-D or 3-D (what the residual RMSNorm fusion takes)."""
    xs = _shape(g, k, "X", lo=2, hi=3)
    return {"X": Want(xs), "skip": Want(xs), "scale": Want(xs[-1:]), "epsilon": g.pick([1e-5, 1e-6]),
            "dtype": DOUBLE, "index": g.pick([0, 1])}  # fmt: skip


def _s_attention(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """4-D q [B, H, T, D], k [B, H, S, D], v [B, H, S, Dv] and a [1|B, 1|H, T, S] float mask or none
    (what the attention fusion takes); the output [B, H, T, Dv] a consumer wants, if it wants one."""
    out = k.get("__out__")
    qs = _shape(g, k, "Q", lo=4, hi=4)
    s, dv = g.dim(), g.dim()
    if out is not None and len(out) == 4 and not isinstance(k.get("Q"), Known):  # qs is out: D is free
        qs, dv = (*qs[:3], g.dim()), out[3]
    mask = (g.pick([1, qs[0]]), g.pick([1, qs[1]]), qs[2], s)
    return {"Q": Want(qs), "K": Want((*qs[:2], s, qs[3])), "V": Want((*qs[:2], s, dv)),
            "attn_mask": Want(mask, optional=True), "scale": g.pick([1.0, 0.125, 0.5]), "dtype": DOUBLE}  # fmt: skip


def _s_attention_3d(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """q [B, T, H * D], k [B, S, H * D], v [B, S, H * Dv] and a [1|B, 1|H, T, S] float mask or none."""
    heads = _attr(k, "heads", lambda: g.pick([1, 2, 3]))
    qs = _shape(g, k, "Q", lo=3, hi=3)
    if qs[2] % heads:
        qs = (*qs[:2], heads * max(qs[2] // heads, 1))
    s, dv = g.dim(), heads * g.dim()
    mask = (g.pick([1, qs[0]]), g.pick([1, heads]), qs[1], s)
    return {"Q": Want(qs), "K": Want((qs[0], s, qs[2])), "V": Want((qs[0], s, dv)), "attn_mask": Want(mask, optional=True),
            "scale": g.pick([1.0, 0.125, 0.5]), "heads": heads, "dtype": DOUBLE}  # fmt: skip


def _s_rotary(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    """4-D x [1, H, T, D] with D even and cos, sin [1, 1, T, D] (what the rotary fusion takes)."""
    xs = _shape(g, k, "X", lo=4, hi=4)
    xs = (1, xs[1], xs[2], 2 * max(xs[3] // 2, 1))
    return {"X": Want(xs), "cos": Want((1, 1, *xs[2:])), "sin": Want((1, 1, *xs[2:])), "dtype": DOUBLE}


def _s_shape_of(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data")
    r = len(xs)
    ends = (0, 2**63 - 1) if g.chance(0.75) else (g.between(-r, r + 1), g.between(-r, r + 1))
    return {"data": Want(xs), "start": ends[0], "end": ends[1]}


def _s_transpose(g: Gen, k: dict[str, Any]) -> dict[str, Any]:
    perm, out = k.get("perm"), k.get("__out__")
    if isinstance(k.get("data"), Known):
        s = k["data"].shape
    elif out is not None and (perm is None or len(perm) == len(out)):
        perm = perm or g.perm(len(out))
        s = tuple(out[list(perm).index(i)] for i in range(len(out)))  # the inverse permutation
    else:
        s = g.shape(rank=None if perm is None else len(perm))
    return {"data": Want(s), "perm": perm or g.perm(len(s))}


SAMPLERS: dict[str, Sampler] = {
    **{
        op: _s_unary("X")
        for op in ("relu", "sigmoid", "tanh", "erf", "neg", "exp", "log", "sqrt", "reciprocal")
    },
    **{op: _s_unary("X") for op in ("abs_", "identity", "reorder_nchwc", "global_average_pool")},
    "leaky_relu": _s_unary("X", alpha=lambda g: g.pick([0.01, 0.1, 0.2])),
    "gelu": _s_unary("X", approximate=lambda g: g.pick(["none", "tanh"])),
    "hard_sigmoid": _s_unary("X", alpha=lambda g: g.pick([0.2, 0.5]), beta=lambda g: g.pick([0.5, 0.25])),
    "hard_swish": _s_unary("X"),
    "swish": _s_unary("X", alpha=lambda g: g.pick([1.0, 0.5])),
    "fused_silu": _s_unary("X"),
    "fused_gelu": _s_unary("X", approximate=lambda g: g.pick(["none", "tanh"]), dtype=lambda g: DOUBLE),
    "fused_bias_gelu": _s_bias_gelu,
    "fused_rms_norm": _s_rms_norm,
    "fused_skip_rms_norm": _s_skip_rms_norm,
    "fused_attention": _s_attention,
    "fused_attention_3d": _s_attention_3d,
    "fused_rotary": _s_rotary,
    "isnan": _s_unary("X"),
    "cast": _s_unary("input", to=lambda g: g.pick([DOUBLE, DOUBLE, TensorProto.FLOAT, INT64])),
    "clip": lambda g, k: {
        "input": Want(_shape(g, k, "input")),
        "min": Want((), optional=True),
        "max": Want((), optional=True),
    },
    "softmax": _s_axis("input"),
    **{op: _s_binary("A", "B") for op in ("add", "sub", "mul", "div", "pow_")},
    "where": _s_where,
    "matmul": _s_matmul,
    "gemm": _s_gemm,
    "conv": _s_conv(False),
    "conv_transpose": _s_conv(True),
    "batch_norm": _s_batch_norm,
    "layer_norm": _s_layer_norm,
    "lrn": lambda g, k: {
        "X": Want(_shape(g, k, "X", lo=4, hi=4)),
        "alpha": g.pick([1e-4, 0.1]),
        "beta": 0.75,
        "bias": g.pick([1.0, 2.0]),
        "size": g.pick([1, 3, 5]),
    },  # fmt: skip
    "max_pool": _s_pool(False),
    "average_pool": _s_pool(True),
    "transpose": _s_transpose,
    "reshape": _s_reshape,
    "flatten": _s_axis("input", end=1),
    "squeeze": _s_squeeze,
    "unsqueeze": _s_unsqueeze,
    "concat": _s_concat,
    "split": _s_split,
    "slice_": _s_slice,
    "gather": _s_gather,
    "expand": _s_expand,
    "pad": _s_pad,
    "reduce_mean": _s_reduce,
    "reduce_sum": _s_reduce,
    "reduce_max": _s_reduce,
    "shape_of": _s_shape_of,
    "constant_of_shape": lambda g, k: {"input": _ints(g.shape(hi=4)), "value": g.special(), "dtype": DOUBLE},
}
"""Constructor name -> sampler; an op without one gets random data inputs and default attributes."""

HINTABLE = {
    op for op, s in SAMPLERS.items()
    if op not in {"gemm", "conv", "conv_transpose", "max_pool", "average_pool", "global_average_pool",
                  "flatten", "squeeze", "unsqueeze", "concat", "split", "slice_", "gather", "expand",
                  "reduce_mean", "reduce_sum", "reduce_max", "shape_of", "constant_of_shape"}
}  # fmt: skip
"""Ops whose sampler can meet a wanted output shape: a parent leaves them open until it knows that shape."""


def arg_names(spec: OpSpec) -> list[str]:
    names = [i.rstrip("?*") for i in spec.inputs] + [a.name for a in spec.attrs]
    return names + (["index"] if spec.indexed_outputs else [])
