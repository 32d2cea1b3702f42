"""Rule verification: check the rule egglog actually runs, on instances of its own left-hand side.

The left-hand side is read from the built egglog rule (``RuleDecl``): its body's ``t == term``
facts whose ``t`` the head unions are the matched terms, the rest are guards. Variables are
instantiated: tensors become input leaves (weights where a guard asks ``is_const``; small int
constants where the op reads values, e.g. a Reshape target) with random small shapes, attributes
random values fit for their position (a permutation for a perm, pads >= 0...). Shapes are chosen
per op so an instance is valid, steered by guards that pin a rank or a dim. Candidates go into an
e-graph state of their own (push/pop) with the shape analysis, only this rule runs once, and
where a matched e-class gained a node, every term of every changed e-class is exported and
evaluated with ``onnx.reference`` in float64 on several seeds: all must agree. Instances the
analysis or the reference cannot handle are discarded, not failures; a rule (or one of its egglog
rules) that fires too rarely fails, since a guard nothing satisfies proves nothing.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import onnx
from egglog import EggSmolError, EGraph, RewriteOrRule, Ruleset, String, f64, i64, set_, union
from egglog.declarations import (
    CallDecl,
    ClassMethodRef,
    EqDecl,
    ExprFactDecl,
    FunctionRef,
    InitRef,
    LitDecl,
    MethodRef,
    RuleDecl,
    TypedExprDecl,
    UnboundVarDecl,
    UnionDecl,
)
from egglog.pretty import PrettyContext
from onnx import TensorProto, helper, numpy_helper

from ..egraph import lang as L
from ..egraph.exporter import to_onnx
from ..egraph.ops import BY_CTOR, OpSpec
from ..egraph.program import Program
from ..egraph.shapes import MAX_RANK, shape_rules
from ..extract.cost import NodeCtx
from ..extract.greedy import ExtractedGraph, _Pricer, _tree_choice, const_classes, topological
from ..extract.serialized import LIST_OPS, ENode, Ref, SerializedEGraph, serialize
from .registry import RULES, RuleTable

__all__ = [
    "Counterexample",
    "RuleVerification",
    "RuleVerifier",
    "describe_rule",
    "verify_rule",
    "verify_rules",
]

DOUBLE, INT64, BOOL = TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
RTOL = 1e-9
OPSET = 18
BATCH = 16
"""Candidates per e-graph round (one push/pop, two serializations, one run of the rule)."""
LEAVES = ("Tensor.input", "Tensor.weight")


# ---------------------------------------------------------------- results
@dataclass
class Counterexample:
    """An instance on which two terms of one e-class disagree (or the analysis found two shapes)."""

    instance: str
    leaves: dict[str, str]
    term_a: str
    term_b: str
    max_abs_err: float
    reason: str
    seed: int = 0

    def render(self) -> str:
        leaves = ", ".join(f"{k}: {v}" for k, v in self.leaves.items())
        return (
            f"instance: {self.instance}\n  leaves: {leaves}\n  term a: {self.term_a}\n  term b: {self.term_b}\n"
            f"  {self.reason} (max abs error {self.max_abs_err:.3g}, input seed {self.seed})"
        )


@dataclass
class RuleVerification:
    """The verdict on one rule: ``ok`` only if each of its egglog rules fired and every term agreed."""

    name: str
    family: str | None
    ok: bool
    instances_fired: int
    detail: str
    counterexample: Counterexample | None = None
    candidates: int = 0
    variants_fired: dict[str, int] = field(default_factory=dict)
    discarded: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (an infinite error, e.g. for shapes that differ, becomes None)."""
        out = asdict(self)
        cex = out["counterexample"]
        if cex is not None and not math.isfinite(cex["max_abs_err"]):
            cex["max_abs_err"] = None
        return out


class _Invalid(Exception):
    """This candidate is not a valid instance (discarded, never a failure)."""


class _Unsupported(Exception):
    """The rule uses a construct the instantiator cannot fill in."""


# ---------------------------------------------------------------- patterns, read from the built rule
@dataclass
class _Pattern:
    """One egglog rule: its matched terms, what its guards ask of variables, and the guards as text."""

    egg_name: str
    roots: list[TypedExprDecl]
    defs: dict[str, TypedExprDecl]
    """Variables the body equates with a term that the head does not rewrite (built as that term)."""
    markers: list[str]
    """Variables the body reads ``tensor_ref`` of (given import-order markers in creation order)."""
    const_vars: frozenset[str]
    rank_hints: tuple[int, ...]
    dim_hints: dict[str, dict[int, int]]
    """Tensor variable -> {axis: dim} from guards like ``shape(w) == Vec(a, b, 1, 1)``; -1 is the rank."""
    guards: list[str]
    lhs: list[str]
    rhs: list[str]


def _text(decls: Any, decl: Any) -> str:
    """egglog's own printing on one line (no black pass: it is slow), ``eq(a).to(b)`` as ``a == b``."""
    text = PrettyContext(decls, defaultdict(int))(decl)
    if text.startswith("eq(") and ").to(" in text and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text[2:], start=2):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return f"{text[3:i]} == {text[i + 5 : -1]}" if text[i:].startswith(").to(") else text
    return text


def _op_name(call: CallDecl) -> str:
    ref = call.callable
    if isinstance(ref, FunctionRef):
        return ref.ident.name
    if isinstance(ref, ClassMethodRef):
        return f"{ref.ident.name}.{ref.method_name}"
    return type(ref).__name__


def _var(expr: Any) -> str | None:
    return expr.name if isinstance(expr, UnboundVarDecl) else None


def _parse(egg_name: str, built: RewriteOrRule) -> _Pattern:
    decl = built.decl
    decls = built.__egg_decls__
    if not isinstance(decl, RuleDecl):
        raise _Unsupported(f"{egg_name} is not a rule")
    unioned = [_var(a.lhs) for a in decl.head if isinstance(a, UnionDecl)]
    rhs = [
        f"{_var(a.lhs)} := {_text(decls, a.rhs)}" if isinstance(a, UnionDecl) else _text(decls, a)
        for a in decl.head
    ]
    pattern = _Pattern(egg_name, [], {}, [], frozenset(), (), {}, [], [], rhs)
    shape_vars: dict[str, str] = {}
    for fact in decl.body:
        if isinstance(fact, EqDecl) and isinstance(fact.left, CallDecl) and _op_name(fact.left) == "shape":
            target = fact.left.args[0].expr
            if isinstance(target, UnboundVarDecl) and isinstance(fact.right, UnboundVarDecl):
                shape_vars[fact.right.name] = target.name
            elif isinstance(target, UnboundVarDecl) and isinstance(fact.right, CallDecl):
                _literal_dims(pattern, target.name, fact.right)
    const_vars, hints = set(), set()
    for fact in decl.body:
        if (
            isinstance(fact, EqDecl)
            and isinstance(fact.left, UnboundVarDecl)
            and isinstance(fact.right, CallDecl)
        ):
            name, term = fact.left.name, TypedExprDecl(fact.tp, fact.right)
            if fact.tp.ident.name == "Tensor" and _op_name(fact.right) != "tensor_ref":
                if name in unioned:
                    pattern.roots.append(term)
                    pattern.lhs.append(f"{name} := {_text(decls, fact.right)}")
                else:
                    pattern.defs[name] = term
                continue
            if _op_name(fact.right) == "tensor_ref":
                pattern.markers.append(name)
            elif fact.left.name in shape_vars:
                _literal_dims(pattern, shape_vars[fact.left.name], fact.right)
        pattern.guards.append(_text(decls, fact))
        expr = fact.typed_expr.expr if isinstance(fact, ExprFactDecl) else None
        if (
            isinstance(expr, CallDecl)
            and _op_name(expr) == "is_const"
            and isinstance(expr.args[0].expr, UnboundVarDecl)
        ):
            const_vars.add(expr.args[0].expr.name)
        if isinstance(fact, EqDecl):
            for side, other in ((fact.left, fact.right), (fact.right, fact.left)):
                if not (isinstance(side, CallDecl) and isinstance(other, LitDecl)):
                    continue
                method = side.callable.method_name if isinstance(side.callable, MethodRef) else ""
                value = int(other.value)  # type: ignore[arg-type]
                if method == "length":
                    hints.add(value)
                elif method == "__getitem__" and _var(side.args[0].expr) in shape_vars:
                    index = side.args[1].expr
                    if isinstance(index, LitDecl):
                        hint = pattern.dim_hints.setdefault(shape_vars[side.args[0].expr.name], {})  # type: ignore[union-attr]
                        hint[int(index.value)] = value  # type: ignore[arg-type]
    if not pattern.roots:
        raise _Unsupported(
            f"{egg_name} rewrites no matched term (no `t == term` fact whose t the head unions)"
        )
    pattern.const_vars = frozenset(const_vars)
    pattern.rank_hints = tuple(sorted(h for h in hints if 0 <= h <= MAX_RANK))
    return pattern


def _literal_dims(pattern: _Pattern, var: str, vec: CallDecl) -> None:
    """Record the rank and literal dims of a ``Vec(...)`` (or empty) shape a guard asks of ``var``."""
    if isinstance(vec.callable, InitRef):
        hint = pattern.dim_hints.setdefault(var, {})
        hint[-1] = len(vec.args)
        hint.update({i: int(a.expr.value) for i, a in enumerate(vec.args) if isinstance(a.expr, LitDecl)})  # type: ignore[arg-type]
    elif isinstance(vec.callable, ClassMethodRef) and vec.callable.method_name == "empty":
        pattern.dim_hints[var] = {-1: 0}


def describe_rule(table: RuleTable, name: str) -> dict[str, Any]:
    """Family, and per egglog rule its left-hand side(s), right-hand side(s) and guards as text."""
    variants = []
    for egg_name, built in table.egg_rules[name]:
        try:
            p = _parse(egg_name, built)
            variants.append({"egg_name": egg_name, "lhs": p.lhs, "rhs": p.rhs, "guards": p.guards})
        except _Unsupported as exc:
            variants.append({"egg_name": egg_name, "lhs": [], "rhs": [], "guards": [], "note": str(exc)})
    return {"name": name, "family": table.family_of(name), "variants": variants}


# ---------------------------------------------------------------- random choices
@dataclass(frozen=True)
class _T:
    """What a position wants: a tensor of ``shape`` of a kind (data, positive, bool, index, ints, none)."""

    shape: tuple[int, ...] = ()
    kind: str = "data"
    values: tuple[int, ...] = ()
    optional: bool = False
    high: int = 1


@dataclass(frozen=True)
class _Known:
    shape: tuple[int, ...]
    dtype: int


NONE = _T(kind="none")


def _ints(values: Iterable[int], rank: int = 1) -> _T:
    vals = tuple(int(v) for v in values)
    return _T(() if rank == 0 else (len(vals),), "ints", vals)


class _Gen:
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
# instantiator keeps what the pattern fixes and passes it in ``k`` (tensors as ``_Known``, absent
# ones as None, literals as Python values, and "__out__": the shape the consumer wants, if any).
Sampler = Callable[[_Gen, dict[str, Any]], dict[str, Any]]


def _shape(g: _Gen, k: dict[str, Any], name: str, lo: int = 0, hi: int = MAX_RANK) -> tuple[int, ...]:
    known, out = k.get(name), k.get("__out__")
    if isinstance(known, _Known):
        return known.shape
    return out if out is not None and lo <= len(out) <= hi else g.shape(lo=lo, hi=hi)


def _attr(k: dict[str, Any], name: str, make: Callable[[], Any]) -> Any:
    return k[name] if name in k else make()


def _s_unary(name: str, **attrs: Callable[[_Gen], Any]) -> Sampler:
    return lambda g, k: {name: _T(_shape(g, k, name)), **{a: f(g) for a, f in attrs.items()}}


def _s_binary(a: str, b: str) -> Sampler:
    def sample(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
        if isinstance(k.get(b), _Known) and not isinstance(k.get(a), _Known):
            return {a: _T(g.partner(k[b].shape)), b: _T(k[b].shape)}
        if not isinstance(k.get(a), _Known) and g.chance(0.3):  # sometimes the right operand is the big one
            sb = _shape(g, k, b)
            return {a: _T(g.partner(sb)), b: _T(sb)}
        sa = _shape(g, k, a)
        return {a: _T(sa), b: _T(g.partner(sa))}

    return sample


def _s_where(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    out = _s_binary("X", "Y")(g, k)
    return {**out, "condition": _T(g.partner(out["X"].shape), "bool")}


def _s_axis(data: str, end: int = 0) -> Sampler:
    """One data input and an ``axis`` in ``[0, rank + end)``."""

    def sample(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
        s = _shape(g, k, data, lo=1)
        return {data: _T(s), "axis": g.between(0, len(s) + end)}

    return sample


def _s_matmul(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    if isinstance(k.get("B"), _Known) and not isinstance(k.get("A"), _Known):
        sb = k["B"].shape
        kk = sb[-2] if len(sb) >= 2 else (sb[0] if sb else 1)
        return {"A": _T((g.dim(), kk) if g.chance(0.8) else (kk,)), "B": _T(sb)}
    out = k.get("__out__")
    if out is not None and len(out) >= 2 and not isinstance(k.get("A"), _Known):
        kk = g.dim()
        return {"A": _T((*out[:-1], kk)), "B": _T((kk, out[-1]))}
    sa = _shape(g, k, "A", lo=1, hi=4)
    kk, n = (sa[-1] if sa else 1), g.dim()
    if len(sa) >= 2 and g.chance(0.3):
        right: tuple[int, ...] = g.partner(sa[:-2])[-2:] + (kk, n)
    else:
        right = (kk,) if g.chance(0.1) else (kk, n)
    return {"A": _T(sa), "B": _T(right)}


def _s_gemm(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    ta, tb = _attr(k, "transA", lambda: g.pick([0, 1])), _attr(k, "transB", lambda: g.pick([0, 1]))
    m, kk, n = g.dim(), g.dim(), g.dim()
    if isinstance(k.get("A"), _Known) and len(k["A"].shape) == 2:
        m, kk = k["A"].shape[::-1] if ta else k["A"].shape
    if isinstance(k.get("B"), _Known) and len(k["B"].shape) == 2:
        kk, n = k["B"].shape[::-1] if tb else k["B"].shape
    return {
        "A": _T((kk, m) if ta else (m, kk)),
        "B": _T((n, kk) if tb else (kk, n)),
        "C": _T(g.pick([(n,), (m, n), (1, n), (m, 1), ()]), optional=True),
        "alpha": g.pick([1.0, 1.0, 0.5, 2.0]),
        "beta": g.pick([1.0, 1.0, 0.5, 2.0]),
        "transA": ta,
        "transB": tb,
    }


def _s_conv(transposed: bool) -> Sampler:
    def sample(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
        xs = k["X"].shape if isinstance(k.get("X"), _Known) else None
        ws = k["W"].shape if isinstance(k.get("W"), _Known) else None
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
        out = {"X": _T(xs), "W": _T(w), "B": _T((cout,), optional=True), "strides": strides, "pads": pads}
        out.update(dilations=dil, group=group, output_padding=tuple(0 for _ in range(n)))
        return out

    return sample


def _s_batch_norm(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "X", lo=2, hi=5)
    params = {name: _T(xs[1:2]) for name in ("scale", "B", "mean")}
    return {**params, "X": _T(xs), "var": _T(xs[1:2], "positive"), "epsilon": g.pick([1e-5, 1e-3, 0.1])}


def _s_layer_norm(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "X", lo=1)
    axis = _attr(k, "axis", lambda: g.between(-len(xs), len(xs)))
    inner = xs[axis:] if -len(xs) <= axis < len(xs) else ()
    return {
        "X": _T(xs),
        "Scale": _T(inner),
        "B": _T(inner, optional=True),
        "axis": axis,
        "epsilon": g.pick([1e-5, 1e-3]),
    }


def _s_pool(average: bool) -> Sampler:
    def sample(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
        xs = _shape(g, k, "X", lo=3, hi=5)
        n = len(xs) - 2
        kernel = _attr(k, "kernel", lambda: tuple(g.pick([1, 2, 3]) for _ in range(n)))
        if not isinstance(k.get("X"), _Known):
            xs = (*xs[:2], *(max(s, kk + 1) for s, kk in zip(xs[2:], kernel, strict=False)))
        out = {"X": _T(xs), "kernel": kernel, "strides": tuple(g.pick([1, 2]) for _ in range(n))}
        out.update(pads=tuple(g.between(0, kk) for kk in kernel) * 2, ceil_mode=g.pick([0, 0, 1]))
        return {**out, "count_include_pad": g.pick([0, 1])} if average else {**out, "dilations": (1,) * n}

    return sample


def _factor(g: _Gen, numel: int, rank: int) -> list[int]:
    dims, left = [], numel
    for _ in range(rank - 1):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        dims.append(g.pick([d for d in divisors if d > 1] or [1]) if g.chance(0.7) else g.pick(divisors))
        left //= dims[-1]
    return [*dims, left] if rank else []


def _s_reshape(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data")
    allowzero = _attr(k, "allowzero", lambda: 0)
    if g.chance(0.15):
        return {"data": _T(xs), "shape": _ints(xs), "allowzero": allowzero}
    numel = math.prod(xs)
    target = _factor(g, numel, g.rank(0 if numel == 1 else 1))
    if target and g.chance(0.2):
        target[g.between(0, len(target))] = -1
    same = [i for i, d in enumerate(target) if i < len(xs) and d == xs[i]]
    if not allowzero and same and g.chance(0.15):
        target[g.pick(same)] = 0
    return {"data": _T(xs), "shape": _ints(target), "allowzero": allowzero}


def _s_squeeze(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = list(_shape(g, k, "data", lo=1))
    ones = [i for i, d in enumerate(xs) if d == 1]
    if g.chance(0.2):  # no axes: every 1 goes (none may be left)
        return {"data": _T(tuple(xs)), "axes": NONE}
    if not isinstance(k.get("data"), _Known):
        ones = list(g.axes(len(xs)))
        xs = [1 if i in ones else d for i, d in enumerate(xs)]
    axes = (
        sorted(int(a) for a in g.rng.choice(ones, size=g.between(1, len(ones) + 1), replace=False))
        if ones
        else []
    )
    return {"data": _T(tuple(xs)), "axes": _ints(axes) if axes else NONE}


def _s_unsqueeze(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", hi=MAX_RANK - 1)
    n = g.between(1, min(3, MAX_RANK - len(xs)) + 1)
    axes = g.axes(len(xs) + n, n_max=n, lo=n)
    return {"data": _T(xs), "axes": _ints(tuple(a - len(xs) - n for a in axes) if g.chance(0.2) else axes)}


def _s_concat(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    items = k.get("inputs") or []
    known = [s for s in items if isinstance(s, _Known)]
    base = known[0].shape if known else g.shape(lo=1)
    axis = _attr(k, "axis", lambda: g.between(0, len(base)))
    count = max(len(items), g.between(1, 4))
    return {
        "inputs": [_T(tuple(g.dim() if i == axis else d for i, d in enumerate(base))) for _ in range(count)],
        "axis": axis,
    }


def _s_split(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = list(_shape(g, k, "input", lo=1))
    axis = _attr(k, "axis", lambda: g.between(0, len(xs)))
    known = isinstance(k.get("input"), _Known)
    if g.chance(0.6):
        sizes = [g.dim() for _ in range(g.between(1, 4))]
        if known:
            parts = min(len(sizes), xs[axis])
            sizes = [1] * (parts - 1) + [xs[axis] - parts + 1]
        xs[axis] = sum(sizes)
        return {
            "input": _T(tuple(xs)),
            "split": _ints(sizes),
            "axis": axis,
            "num_outputs": 0,
            "index": g.between(0, len(sizes)),
        }
    parts = g.pick([d for d in range(1, 4) if xs[axis] % d == 0] or [1]) if known else g.between(1, 4)
    xs[axis] = xs[axis] if known else parts * g.dim()
    return {
        "input": _T(tuple(xs)),
        "split": NONE,
        "axis": axis,
        "num_outputs": parts,
        "index": g.between(0, parts),
    }


def _s_slice(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    axes = [int(a) for a in g.rng.permutation(len(xs))[: g.between(1, min(3, len(xs)) + 1)]]
    starts = [g.between(-xs[a], xs[a] + 1) for a in axes]
    ends = [g.between(-xs[a], xs[a] + 1) if g.chance(0.8) else 2**62 for a in axes]
    out = {"data": _T(xs), "starts": _ints(starts), "ends": _ints(ends), "axes": _ints(axes)}
    return {**out, "steps": _ints([g.pick([1, 1, 2]) for _ in axes])}


def _s_gather(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    axis = _attr(k, "axis", lambda: g.between(0, len(xs)))
    d = xs[axis] if -len(xs) <= axis < len(xs) else 1
    if axis == 0 and g.chance(0.2):
        return {"data": _T(xs), "indices": _T((g.dim(), g.dim()), "index", high=d), "axis": axis}
    count = 0 if g.chance(0.3) else g.dim()
    return {
        "data": _T(xs),
        "indices": _ints([g.between(-d, d) for _ in range(max(count, 1))], 0 if count == 0 else 1),
        "axis": axis,
    }


def _s_expand(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "input")
    target = [g.dim() if d == 1 else (1 if g.chance(0.2) else d) for d in xs]
    lead = [g.dim() for _ in range(g.between(0, 2))] if len(xs) < MAX_RANK else []
    return {"input": _T(xs), "shape": _ints(lead + target)}


def _s_pad(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data", lo=1)
    mode = _attr(k, "mode", lambda: g.pick(["constant", "constant", "edge", "reflect"]))
    pads = [0 if g.chance(0.5) else g.between(1, (d if mode == "reflect" else 3)) for d in xs * 2]
    if "__out__" in k and not isinstance(k.get("data"), _Known):  # the padded result is the wanted shape
        xs = tuple(max(d - pads[i] - pads[i + len(xs)], 1) for i, d in enumerate(xs))
        pads = [min(p, max(xs[i % len(xs)] - 1, 0)) if mode == "reflect" else p for i, p in enumerate(pads)]
    return {
        "data": _T(xs),
        "pads": _ints(pads),
        "constant_value": _T((), optional=True),
        "axes": NONE,
        "mode": mode,
    }


def _s_reduce(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data")
    axes = g.axes(len(xs)) if xs and g.chance(0.8) else ()
    out = {"data": _T(xs), "axes": _ints(axes) if axes else NONE, "keepdims": g.pick([0, 1])}
    return {**out, "noop_with_empty_axes": 0 if axes or g.chance(0.7) else 1}


def _s_shape_of(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    xs = _shape(g, k, "data")
    r = len(xs)
    ends = (0, 2**63 - 1) if g.chance(0.75) else (g.between(-r, r + 1), g.between(-r, r + 1))
    return {"data": _T(xs), "start": ends[0], "end": ends[1]}


def _s_transpose(g: _Gen, k: dict[str, Any]) -> dict[str, Any]:
    perm, out = k.get("perm"), k.get("__out__")
    if isinstance(k.get("data"), _Known):
        s = k["data"].shape
    elif out is not None and (perm is None or len(perm) == len(out)):
        perm = perm or g.perm(len(out))
        s = tuple(out[list(perm).index(i)] for i in range(len(out)))  # the inverse permutation
    else:
        s = g.shape(rank=None if perm is None else len(perm))
    return {"data": _T(s), "perm": perm or g.perm(len(s))}


SAMPLERS: dict[str, Sampler] = {
    **{
        op: _s_unary("X")
        for op in ("relu", "sigmoid", "tanh", "erf", "neg", "exp", "log", "sqrt", "reciprocal")
    },
    **{op: _s_unary("X") for op in ("abs_", "identity", "global_average_pool")},
    "leaky_relu": _s_unary("X", alpha=lambda g: g.pick([0.01, 0.1, 0.2])),
    "gelu": _s_unary("X", approximate=lambda g: g.pick(["none", "tanh"])),
    "cast": _s_unary("input", to=lambda g: g.pick([DOUBLE, DOUBLE, TensorProto.FLOAT, INT64])),
    "clip": lambda g, k: {
        "input": _T(_shape(g, k, "input")),
        "min": _T((), optional=True),
        "max": _T((), optional=True),
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
        "X": _T(_shape(g, k, "X", lo=4, hi=4)),
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
    "shape_of": _s_shape_of,
    "constant_of_shape": lambda g, k: {"input": _ints(g.shape(hi=4)), "value": g.special(), "dtype": DOUBLE},
}
"""Constructor name -> sampler; an op without one gets random data inputs and default attributes."""

HINTABLE = {
    op for op, s in SAMPLERS.items()
    if op not in {"gemm", "conv", "conv_transpose", "max_pool", "average_pool", "global_average_pool", "reshape",
                  "flatten", "squeeze", "unsqueeze", "concat", "split", "slice_", "gather", "expand",
                  "reduce_mean", "reduce_sum", "shape_of", "constant_of_shape"}
}  # fmt: skip
"""Ops whose sampler can meet a wanted output shape: a parent leaves them open until it knows that shape."""


def _arg_names(spec: OpSpec) -> list[str]:
    names = [i.rstrip("?*") for i in spec.inputs] + [a.name for a in spec.attrs]
    return names + (["index"] if spec.indexed_outputs else [])


# ---------------------------------------------------------------- instances
@dataclass(frozen=True)
class _Lit:
    sort: str
    value: Any


@dataclass(eq=False)
class _Node:
    """One node of a concrete instance term (its identity is the node: shared subterms stay shared)."""

    op: str
    args: tuple[_Node | _Lit, ...]


@dataclass
class _Leaf:
    name: str
    display: str
    shape: tuple[int, ...]
    dtype: int
    kind: str
    weight: bool
    high: int = 1


_PRIM_METHODS: dict[str, Callable[..., Any]] = {
    "__add__": lambda a, b: a + b,
    "__sub__": lambda a, b: a - b,
    "__mul__": lambda a, b: a * b,
    "__truediv__": lambda a, b: int(a / b) if isinstance(a, int) else a / b,
    "__mod__": lambda a, b: a - b * int(a / b),
    "__getitem__": lambda v, i: v[i],
    "length": len,
    "append": lambda v, w: v + w,
    "push": lambda v, x: (*v, x),
    "pop": lambda v: v[:-1],
    "set": lambda v, i, x: (*v[:i], x, *v[i + 1 :]),
    "remove": lambda v, i: (*v[:i], *v[i + 1 :]),
    "min": min,
    "max": max,
}
"""Primitive operations a pattern may apply to bound variables (egglog semantics: i64 ``/`` truncates)."""


class _Instance:
    """A rule's matched terms with every variable filled in: the terms, their leaves, the values."""

    def __init__(self, pattern: _Pattern, rng: np.random.Generator, tag: int):
        self.pattern, self.rng, self.tag = pattern, rng, tag
        self.gen = _Gen(rng, pattern.rank_hints)
        self.env: dict[str, Any] = {}
        self.leaves: dict[str, _Leaf] = {}
        self.built: dict[int, _Node] = {}
        self.known: dict[int, _Known | None] = {}
        self.weights: dict[str, onnx.TensorProto] = {}
        self.roots = [self.term(d, None) for d in pattern.roots]

    def prim(self, d: TypedExprDecl, want: Any) -> Any:
        e = d.expr
        if isinstance(e, LitDecl):
            return e.value
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                default = {"i64": 0, "f64": self.gen.special(), "String": "", "Vec": ()}.get(d.tp.ident.name)
                self.env[e.name] = default if want is None else want
            return self.env[e.name]
        if isinstance(e, CallDecl):
            if isinstance(e.callable, InitRef) and e.callable.ident.name == "Vec":
                return tuple(self.prim(a, None) for a in e.args)
            if isinstance(e.callable, ClassMethodRef) and e.callable.method_name == "empty":
                return ()
            if isinstance(e.callable, MethodRef) and e.callable.method_name in _PRIM_METHODS:
                if not self.closed(d):
                    raise _Invalid("a computed attribute reads a variable not bound yet")
                return _PRIM_METHODS[e.callable.method_name](*(self.prim(a, None) for a in e.args))
        raise _Unsupported(f"cannot instantiate the primitive expression {e}")

    def closed(self, d: TypedExprDecl) -> bool:
        """No unbound variable inside (so its value does not depend on a proposal)."""
        e = d.expr
        if isinstance(e, UnboundVarDecl):
            return e.name in self.env
        return all(self.closed(a) for a in e.args) if isinstance(e, CallDecl) else True

    def deferred(self, d: TypedExprDecl) -> bool:
        """A tensor argument to build after the op's sampler ran (an open leaf, or an open op that can meet a shape)."""
        e = d.expr
        if self.closed(d) or not isinstance(e, UnboundVarDecl | CallDecl):
            return False
        if isinstance(e, UnboundVarDecl):
            return e.name not in self.pattern.defs
        name = _op_name(e)
        return name.startswith("Tensor.") or name in HINTABLE

    def term(self, d: TypedExprDecl, want: _T | None) -> _Node:
        if id(d) in self.built:
            return self.built[id(d)]
        e = d.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                defined = self.pattern.defs.get(e.name)
                self.env[e.name] = (
                    self.term(defined, want) if defined else self.leaf(e.name, want or _T(self.gen.shape()))
                )
            return cast(_Node, self.env[e.name])
        if not isinstance(e, CallDecl):
            raise _Unsupported(f"cannot instantiate {e}")
        op = _op_name(e)
        if op in BY_CTOR:
            node = self.op(BY_CTOR[op], e, want)
        elif op.startswith("Tensor."):
            node = self.leaf_call(op, e, want or _T(self.gen.shape()))
        else:
            raise _Unsupported(f"cannot instantiate a call to {op}")
        self.built[id(d)] = node
        return node

    def leaf(self, var: str, want: _T, weight: bool | None = None) -> _Node:
        if want.kind == "none" or (want.optional and weight is None and self.gen.chance(0.25)):
            return _Node("Tensor.none", ())
        if want.kind == "ints":
            return _Node("Tensor.ints", (_Lit("Vec", want.values), _Lit("i64", 0 if want.shape == () else 1)))
        shape = want.shape
        hint = self.pattern.dim_hints.get(var, {})
        rank = hint.get(-1, len(shape))
        if hint and self.gen.chance(0.7) and (rank == len(shape) or all(i in hint for i in range(rank))):
            shape = (
                tuple(hint.get(i, d) for i, d in enumerate(shape))
                if rank == len(shape)
                else tuple(hint[i] for i in range(rank))
            )
        name = f"{var}__{self.tag}"
        dtype = {"bool": BOOL, "index": INT64}.get(want.kind, DOUBLE)
        weight = var in self.pattern.const_vars if weight is None else weight
        self.leaves[name] = _Leaf(name, var, shape, dtype, want.kind, weight, want.high)
        if weight:
            self.weights[name] = numpy_helper.from_array(_random(self.leaves[name], self.rng), name)
        return _Node("Tensor.weight" if weight else "Tensor.input", (_Lit("String", name),))

    def leaf_call(self, op: str, e: CallDecl, want: _T) -> _Node:
        if op == "Tensor.none":
            return _Node(op, ())
        if op == "Tensor.splat":
            dt = {"ints": INT64, "index": INT64, "bool": BOOL}.get(want.kind, DOUBLE)
            value, dims = self.prim(e.args[0], self.gen.special()), self.prim(e.args[1], want.shape)
            return _Node(
                op,
                (_Lit("f64", float(value)), _Lit("Vec", tuple(dims)), _Lit("i64", self.prim(e.args[2], dt))),
            )
        if op == "Tensor.ints":
            rank = self.prim(e.args[1], 0 if want.shape == () else 1)
            count = 1 if rank == 0 else (want.shape[0] if len(want.shape) == 1 else self.gen.dim())
            values = want.values if want.kind == "ints" else tuple(self.gen.dim() for _ in range(count))
            return _Node(op, (_Lit("Vec", tuple(self.prim(e.args[0], values))), _Lit("i64", rank)))
        if op in LEAVES:
            var = str(self.prim(e.args[0], f"leaf{len(self.leaves)}"))
            kind = "data" if want.kind in ("ints", "none") else want.kind
            return self.leaf(var, _T(want.shape, kind), weight=op == "Tensor.weight")
        raise _Unsupported(f"cannot instantiate {op}")

    def op(self, spec: OpSpec, e: CallDecl, want: _T | None) -> _Node:
        """Build one modelled op: fixed arguments first, then the sampler's proposals for the rest."""
        names = _arg_names(spec)
        if len(names) != len(e.args):
            raise _Unsupported(f"{spec.op_type}: {len(e.args)} arguments, the op table has {len(names)}")
        known: dict[str, Any] = {} if want is None or want.kind == "none" else {"__out__": want.shape}
        for name, d in zip(names, e.args, strict=True):
            sort = d.tp.ident.name
            if sort == "Tensor" and not self.deferred(d):
                known[name] = self.known_of(self.term(d, None))
            elif sort == "TList":
                known[name] = [
                    None if self.deferred(h) else self.known_of(self.term(h, None)) for h in _heads(d)
                ]
            elif sort not in ("Tensor", "TList") and self.closed(d):
                known[name] = self.prim(d, None)
        sampler = SAMPLERS.get(spec.name)
        wants = sampler(self.gen, known) if sampler else {n: _T(self.gen.shape()) for n in names}
        args: list[_Node | _Lit] = []
        for name, d in zip(names, e.args, strict=True):
            sort = d.tp.ident.name
            if sort == "Tensor":
                args.append(self.term(d, wants.get(name)))
            elif sort == "TList":
                args.append(self.tlist(d, cast(list[_T], wants.get(name) or [])))
            else:
                default = next((a.default for a in spec.attrs if a.name == name), None)
                args.append(_Lit(sort, self.prim(d, wants.get(name, default))))
        return _Node(spec.name, tuple(args))

    def tlist(self, d: TypedExprDecl, wants: list[_T]) -> _Node:
        e = d.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                self.env[e.name] = _tlist([self.leaf(f"{e.name}{i}", w) for i, w in enumerate(wants)])
            return cast(_Node, self.env[e.name])
        op = _op_name(e) if isinstance(e, CallDecl) else str(e)
        if op == "TList.nil":
            return _Node(op, ())
        if op == "TList.cons":
            args = cast(CallDecl, e).args
            return _Node(
                op, (self.term(args[0], wants[0] if wants else None), self.tlist(args[1], wants[1:]))
            )
        raise _Unsupported(f"cannot instantiate a list made by {op}")

    def known_of(self, node: _Node) -> _Known | None:
        if id(node) not in self.known:
            if node.op == "Tensor.none":
                self.known[id(node)] = None
            elif node.op in LEAVES:
                leaf = self.leaves[cast(_Lit, node.args[0]).value]
                self.known[id(node)] = _Known(leaf.shape, leaf.dtype)
            else:
                (value,) = self.evaluate(node, 1)
                self.known[id(node)] = _Known(value.shape, int(helper.np_dtype_to_tensor_dtype(value.dtype)))
        return self.known[id(node)]

    def evaluate(self, node: _Node, seeds: int) -> list[np.ndarray]:
        return [outs[0] for outs in self.evaluate_all([node], seeds)]

    def evaluate_all(self, nodes: list[_Node], seeds: int) -> list[list[np.ndarray]]:
        try:
            graph = _graph(*nodes)
            return _evaluate(_program(self, graph), graph, [self.feeds(s) for s in range(seeds)])
        except Exception as exc:
            raise _Invalid("the reference cannot evaluate the instance") from exc

    def op_nodes(self) -> list[_Node]:
        return list({id(n): n for r in self.roots for n in _walk(r) if n.op in BY_CTOR}.values())

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, self.tag])
        return {n: _random(leaf, rng) for n, leaf in self.leaves.items() if not leaf.weight}

    def marker_leaves(self) -> list[str]:
        """Leaf names of the variables the rule reads import order of, in creation order."""
        nodes = [self.env[v] for v in self.pattern.markers if v in self.env]
        names = {cast(_Lit, n.args[0]).value for n in nodes if n.op in LEAVES}
        return [n for n in self.leaves if n in names]

    def leaf_text(self) -> dict[str, str]:
        kinds: dict[int, str] = {DOUBLE: "f64", INT64: "i64", BOOL: "bool"}
        return {
            x.display: f"{'weight' if x.weight else 'input'} {kinds.get(x.dtype, str(x.dtype))}{list(x.shape)}"
            for x in self.leaves.values()
        }


def _heads(d: TypedExprDecl) -> list[TypedExprDecl]:
    out, e = [], d.expr
    while isinstance(e, CallDecl) and _op_name(e) == "TList.cons":
        out.append(e.args[0])
        e = e.args[1].expr
    return out


def _tlist(items: list[_Node]) -> _Node:
    out = _Node("TList.nil", ())
    for item in reversed(items):
        out = _Node("TList.cons", (item, out))
    return out


def _walk(root: _Node) -> list[_Node]:
    seen: dict[int, _Node] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(a for a in node.args if isinstance(a, _Node))
    return list(seen.values())


def _random(leaf: _Leaf, rng: np.random.Generator) -> np.ndarray:
    if leaf.kind == "bool":
        return rng.random(leaf.shape) < 0.5
    if leaf.kind == "index":
        return rng.integers(0, max(leaf.high, 1), size=leaf.shape).astype(np.int64)
    if leaf.kind == "positive":
        return rng.uniform(0.5, 2.0, size=leaf.shape)
    return rng.standard_normal(leaf.shape)


# ---------------------------------------------------------------- egglog and ONNX views of a term
def _to_egglog(node: _Node, memo: dict[int, Any]) -> Any:
    if id(node) not in memo:
        args = [
            _to_egglog(a, memo) if isinstance(a, _Node)
            else L.ivec([int(v) for v in a.value]) if a.sort == "Vec"
            else {"i64": lambda v: i64(int(v)), "f64": lambda v: f64(float(v)), "String": String}[a.sort](a.value)
            for a in node.args
        ]  # fmt: skip
        owner, _, method = node.op.rpartition(".")
        ctor = (
            BY_CTOR[node.op].ctor
            if node.op in BY_CTOR
            else getattr({"Tensor": L.Tensor, "TList": L.TList}[owner], method)
        )
        memo[id(node)] = ctor(*args)
    return memo[id(node)]


def _graph(*roots: _Node) -> ExtractedGraph:
    """Terms as an extracted graph (one synthetic e-class per node) for the exporter."""
    nodes = list({id(n): n for root in roots for n in _walk(root)}.values())
    ids = {id(n): f"t{i}" for i, n in enumerate(nodes)}
    choice = {
        ids[id(n)]: ENode(n.op, tuple(Ref(ids[id(a)]) if isinstance(a, _Node) else a.value for a in n.args))
        for n in nodes
    }
    tops = [ids[id(root)] for root in roots]
    return ExtractedGraph(nodes=topological(choice, tops), roots=tops)


def _program(inst: _Instance, graph: ExtractedGraph) -> Program:
    """A synthetic program around one instance: its inputs as graph inputs, its weights, one output per root."""
    opset = max([OPSET] + [BY_CTOR[n.op].min_opset for _, n in graph.nodes if n.op in BY_CTOR])
    inputs = [
        helper.make_tensor_value_info(x.name, x.dtype, list(x.shape))
        for x in inst.leaves.values()
        if not x.weight
    ]
    names = [f"y{i}" for i in range(len(graph.roots))]
    outputs = [helper.make_empty_tensor_value_info(n) for n in names]
    onnx_graph = helper.make_graph([], "rule-instance", inputs, outputs)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return Program(
        egraph=cast(EGraph, None),  # the exporter reads only the side tables
        model=model,
        opset=opset,
        outputs=[(n, L.Tensor.none()) for n in names],
        names=[],
        weights=inst.weights,
        opaque={},
        symbols={},
        true_inputs=[i.name for i in inputs],
        overridable=set(),
    )


def _evaluate(
    program: Program, graph: ExtractedGraph, feeds: list[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """Export the terms and run them with ``onnx.reference`` once per feed (all outputs each time)."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(to_onnx(program, graph))
    with np.errstate(all="ignore"):
        return [[np.asarray(v) for v in evaluator.run(None, f)] for f in feeds]


def _term_text(graph: ExtractedGraph, display: dict[str, str]) -> str:
    choice = graph.choice()

    def text(eclass: str) -> str:
        node = choice[eclass]
        if node.op in LEAVES:
            return display.get(node.args[0], node.args[0])
        if node.op.startswith("TList."):
            items = []
            while node.op == "TList.cons":
                items.append(text(node.args[0].eclass))
                node = choice[node.args[1].eclass]
            return "[" + ", ".join(items) + "]"
        parts = [
            text(a.eclass) if isinstance(a, Ref) else repr(list(a) if isinstance(a, tuple) else a)
            for a in node.args
        ]
        return f"{node.op.replace('Tensor.', '')}({', '.join(parts)})"

    return text(graph.roots[0])


def _compare(ref: np.ndarray, out: np.ndarray) -> tuple[bool, float, str]:
    """Float64 agreement within ``RTOL`` of the output's magnitude; NaN and inf positions must match."""
    if ref.shape != out.shape:
        return False, math.inf, f"shapes differ: {list(ref.shape)} vs {list(out.shape)}"
    if ref.dtype != out.dtype:
        return False, math.inf, f"dtypes differ: {ref.dtype} vs {out.dtype}"
    a, b = ref.astype(np.float64), out.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not (np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(fa, fb)):
        return False, math.inf, "NaN/inf positions differ"
    if not np.array_equal(np.nan_to_num(a[~fa], nan=0.0), np.nan_to_num(b[~fb], nan=0.0)):
        return False, math.inf, "infinities differ in sign"
    diff = np.abs(a[fa] - b[fb])
    if not diff.size:
        return True, 0.0, ""
    scale = max(1.0, float(np.abs(a[fa]).max()))
    ok = bool(np.all(diff <= RTOL * (scale + np.abs(a[fa]))))
    return ok, float(diff.max()), "" if ok else "values differ"


# ---------------------------------------------------------------- one e-graph round
class _UnitCost:
    """Smallest terms below the chosen node: verification wants readable terms, not fast ones."""

    name = "unit"

    def node_cost(self, ctx: NodeCtx) -> float:
        return 1.0


class _Conflict(Exception):
    """egglog refused a merge (two shapes or dtypes for one e-class) at ``stage``."""

    def __init__(self, stage: str, detail: str):
        super().__init__(detail)
        self.stage = stage


def _run_round(
    egraph: EGraph, batch: list[_Instance], rules: Ruleset
) -> tuple[SerializedEGraph, SerializedEGraph]:
    """The e-graph before and after one run of ``rules`` over the batch (the state is popped after)."""
    egraph.push()
    stage = "analysis"
    try:
        memo: dict[int, Any] = {}
        actions: list[Any] = []
        outputs = 0
        for index, inst in enumerate(batch):
            leaf_exprs = {}
            for leaf in inst.leaves.values():
                node = (L.Tensor.weight if leaf.weight else L.Tensor.input)(leaf.name)
                leaf_exprs[leaf.name] = node
                actions += [
                    set_(L.shape(node)).to(L.ivec(list(leaf.shape))),
                    set_(L.dtype(node)).to(i64(leaf.dtype)),
                ]
            for k, name in enumerate(inst.marker_leaves()):
                actions.append(union(L.tensor_ref(index * 64 + k)).with_(leaf_exprs[name]))
            for root in inst.roots:
                actions.append(union(L.graph_output(outputs)).with_(_to_egglog(root, memo)))
                outputs += 1
        egraph.register(*actions)
        egraph.run(shape_rules.saturate())
        pre = serialize(egraph)
        if _seed_shapes(egraph, batch, pre, memo):
            egraph.run(shape_rules.saturate())
            pre = serialize(egraph)
        stage = "rewrite"
        egraph.run(rules)
        egraph.run(shape_rules.saturate())
        return pre, serialize(egraph)
    except EggSmolError as exc:
        raise _Conflict(stage, str(exc).splitlines()[0]) from exc
    finally:
        egraph.pop()


def _seed_shapes(egraph: EGraph, batch: list[_Instance], pre: SerializedEGraph, memo: dict[int, Any]) -> bool:
    """Give the reference's shapes to matched terms the analysis left without one, as import gives
    ONNX's (so rules see the shapes they see on imported models). True when something was added."""
    actions: list[Any] = []
    output = 0
    for inst in batch:
        outputs = range(output, output + len(inst.roots))
        output += len(inst.roots)
        if all(pre.roots[i] in pre.shapes for i in outputs):
            continue
        nodes = inst.op_nodes()
        try:
            (values,) = inst.evaluate_all(nodes, 1)
        except _Invalid:
            continue
        for node, value in zip(nodes, values, strict=True):
            expr = memo[id(node)]
            actions += [set_(L.shape(expr)).to(L.ivec(list(value.shape)))]
            actions += [set_(L.dtype(expr)).to(i64(int(helper.np_dtype_to_tensor_dtype(value.dtype))))]
    if actions:
        egraph.register(*actions)
    return bool(actions)


def _reachable(eg: SerializedEGraph, roots: list[str]) -> list[str]:
    seen = list(dict.fromkeys(roots))
    for eclass in seen:
        for node in eg.classes.get(eclass, []):
            seen.extend(c for c in node.children if c not in seen)
    return seen


def _display(inst: _Instance) -> dict[str, str]:
    return {name: leaf.display for name, leaf in inst.leaves.items()}


# ---------------------------------------------------------------- the verifier
class RuleVerifier:
    """Verifies rules one by one in one e-graph (the analysis is compiled once; each round is
    pushed and popped, so rules never see each other's instances)."""

    def __init__(
        self,
        table: RuleTable | None = None,
        *,
        seeds: int = 3,
        min_instances: int = 5,
        max_candidates: int = 300,
        seed: int = 0,
    ):
        self.table = RULES if table is None else table
        self.seeds, self.min_instances, self.max_candidates, self.seed = (
            seeds,
            min_instances,
            max_candidates,
            seed,
        )
        self.egraph = EGraph()
        # Declared before any push: what is declared inside a push is popped with it.
        self.egraph.run(shape_rules.saturate())

    def verify(self, name: str) -> RuleVerification:
        """Verify one rule of the table (a ``KeyError`` for an unknown name)."""
        start = time.perf_counter()
        result = RuleVerification(name, self.table.family_of(name), False, 0, "")
        try:
            self._verify(result)
        except _Unsupported as exc:
            result.ok, result.detail = False, f"cannot instantiate the rule: {exc}"
        result.seconds = round(time.perf_counter() - start, 3)
        return result

    def _verify(self, result: RuleVerification) -> None:
        patterns = [_parse(egg_name, built) for egg_name, built in self.table.egg_rules[result.name]]
        rules = self.table.ruleset_for([result.name])
        self.egraph.run(rules)  # declared outside the rounds; the base e-graph is empty, so nothing fires
        target = max(1, math.ceil(self.min_instances / len(patterns)))
        fired = {p.egg_name: 0 for p in patterns}
        discarded: Counter[str] = Counter()
        rng = np.random.default_rng(self.seed)
        used = 0
        while used < self.max_candidates:
            need = [p for p in patterns if fired[p.egg_name] < target] or patterns
            if (
                all(fired[p.egg_name] >= target for p in patterns)
                and sum(fired.values()) >= self.min_instances
            ):
                break
            batch: list[_Instance] = []
            for i in range(min(BATCH, self.max_candidates - used)):
                used += 1
                try:
                    batch.append(_Instance(need[i % len(need)], rng, used))
                except _Invalid as exc:
                    discarded[str(exc)] += 1
                except (ArithmeticError, IndexError, KeyError, ValueError) as exc:
                    discarded[f"no valid values for this pattern ({type(exc).__name__})"] += 1
            result.counterexample = self._check_batch(batch, rules, fired, discarded)
            if result.counterexample is not None:
                break
        result.candidates, result.variants_fired, result.discarded = used, fired, dict(discarded)
        result.instances_fired = sum(fired.values())
        if result.counterexample is not None:
            result.detail = f"counterexample: {result.counterexample.reason}"
            return
        silent = [v for v, n in fired.items() if n == 0]
        if result.instances_fired < self.min_instances or silent:
            result.detail = (
                f"guard never satisfied on generated instances: fired on {result.instances_fired} of {used} candidates"
                f" (needs {self.min_instances})" + (f"; never fired: {', '.join(silent)}" if silent else "")
            )
            return
        result.ok = True
        result.detail = f"all terms agree on {result.instances_fired} instances x {self.seeds} seeds"

    def _check_batch(
        self, batch: list[_Instance], rules: Ruleset, fired: dict[str, int], discarded: Counter[str]
    ) -> Counterexample | None:
        if not batch:
            return None
        try:
            pre, post = _run_round(self.egraph, batch, rules)
        except _Conflict as exc:
            if len(batch) > 1:  # find the candidate: run them one by one
                return next(
                    (c for inst in batch if (c := self._check_batch([inst], rules, fired, discarded))), None
                )
            if exc.stage == "analysis":
                discarded["the shape analysis rejects the instance"] += 1
                return None
            inst = batch[0]
            try:
                lhs = "; ".join(text for text, _ in self._references(inst))
            except _Invalid as invalid:  # an invalid instance proves nothing about the rule
                discarded[str(invalid)] += 1
                return None
            reason = f"two shapes or dtypes for one e-class after the rewrite: {exc}"
            return Counterexample(lhs, inst.leaf_text(), lhs, "(the rewrite's result)", math.inf, reason)
        seen: set[str] = set()
        tree: dict[str, ENode] | None = None
        output = 0
        for inst in batch:
            outputs = list(range(output, output + len(inst.roots)))
            output += len(inst.roots)
            roots = [post.roots[i] for i in outputs]
            grew = any(len(post.classes[post.roots[i]]) > len(pre.classes[pre.roots[i]]) for i in outputs)
            if not grew or seen.intersection(roots):
                continue
            seen.update(roots)
            if any(pre.roots[i] not in pre.shapes for i in outputs):
                discarded["the shape analysis gives a matched term no shape"] += 1
                continue
            if tree is None:  # smallest term per e-class, shared by the batch's instances
                tree = _tree_choice(post, _Pricer(post, _UnitCost(), const_classes(post)))
            try:
                found = self._check_instance(inst, post, roots, tree)
            except _Invalid as exc:
                discarded[str(exc)] += 1
                continue
            fired[inst.pattern.egg_name] += 1
            if found is not None:
                return found
        return None

    def _references(self, inst: _Instance) -> list[tuple[str, list[np.ndarray]]]:
        """Text and values (per seed) of the instance's matched terms; ``_Invalid`` if ONNX rejects them."""
        out = []
        for term in inst.roots:
            graph = _graph(term)
            try:
                model = to_onnx(_program(inst, graph), graph)
                onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
            except Exception as exc:
                raise _Invalid("ONNX shape inference rejects the instance") from exc
            out.append((_term_text(graph, _display(inst)), inst.evaluate(term, self.seeds)))
        return out

    def _check_instance(
        self, inst: _Instance, post: SerializedEGraph, roots: list[str], tree: dict[str, ENode]
    ) -> Counterexample | None:
        """Every term of every matched or changed e-class agrees with the instance's own value."""
        display, feeds = _display(inst), [inst.feeds(s) for s in range(self.seeds)]
        refs = dict(zip(roots, self._references(inst), strict=True))
        lhs_text = "; ".join(text for text, _ in refs.values())
        for eclass in _reachable(post, roots):
            nodes = [n for n in post.classes.get(eclass, []) if n.op not in LIST_OPS]
            if eclass not in refs and len(nodes) < 2:
                continue
            base = refs.get(eclass)
            for node in nodes:
                choice = {**tree, "verify-top": node}
                graph = ExtractedGraph(nodes=topological(choice, ["verify-top"]), roots=["verify-top"])
                if any(n.op in LEAVES and n.args[0] not in inst.leaves for _, n in graph.nodes):
                    continue  # a term of another candidate that hash-consing put in this class
                text = _term_text(graph, display)
                try:
                    outs = [o[0] for o in _evaluate(_program(inst, graph), graph, feeds)]
                except Exception as exc:
                    if base is None:
                        raise _Invalid("the reference cannot evaluate a subterm") from exc
                    error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    reason = f"the reference cannot evaluate a rewritten term: {error}"
                    return Counterexample(lhs_text, inst.leaf_text(), base[0], text, math.inf, reason)
                if base is None:
                    base = (text, outs)
                    continue
                for s, (ref, out) in enumerate(zip(base[1], outs, strict=True)):
                    ok, err, reason = _compare(ref, out)
                    if not ok:
                        return Counterexample(lhs_text, inst.leaf_text(), base[0], text, err, reason, s)
        return None


def verify_rule(
    name: str,
    *,
    seeds: int = 3,
    min_instances: int = 5,
    max_candidates: int = 300,
    seed: int = 0,
    table: RuleTable | None = None,
) -> RuleVerification:
    """Verify one rule of ``table`` (default: the process-wide ``RULES``) on generated instances."""
    return verify_rules(
        [name],
        seeds=seeds,
        min_instances=min_instances,
        max_candidates=max_candidates,
        seed=seed,
        table=table,
    )[0]


def verify_rules(
    names: list[str] | None = None,
    *,
    seeds: int = 3,
    min_instances: int = 5,
    max_candidates: int = 300,
    seed: int = 0,
    table: RuleTable | None = None,
) -> list[RuleVerification]:
    """Verify ``names`` (default: every rule of the table), sharing one e-graph between them.

    ``seeds`` input draws per instance; ``min_instances`` instances (and each egglog rule at least
    once) must fire within ``max_candidates`` generated candidates per rule.
    """
    table = RULES if table is None else table
    unknown = [n for n in names or [] if n not in table.egg_rules]
    if unknown:
        raise KeyError(f"unknown rule(s): {', '.join(unknown)}")
    verifier = RuleVerifier(
        table, seeds=seeds, min_instances=min_instances, max_candidates=max_candidates, seed=seed
    )
    return [verifier.verify(n) for n in (table.names() if names is None else names)]
