"""A rule's left-hand side read back from the built egglog rule: matched terms, guards, variables.

Verification instantiates what egglog actually runs, so it reads the ``RuleDecl`` rather than a
hand-written copy of the pattern.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from egglog import RewriteOrRule
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

from ...egraph.shapes import MAX_RANK
from ..registry import RuleTable


class Invalid(Exception):
    """This candidate is not a valid instance (discarded, never a failure)."""


class Unsupported(Exception):
    """The rule uses a construct the instantiator cannot fill in."""



# ---------------------------------------------------------------- patterns, read from the built rule
@dataclass
class RulePattern:
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
    opset_range: tuple[int, int] = (0, 1 << 30)
    """Model opsets the guards allow (``model_opset() >= n`` / ``< n``), inclusive."""
    dim_links: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    """Tensor variable -> {axis: (tensor variable, its axis)} from guards like ``shape(c) == Vec(1,
    s[2])`` where ``shape(x) == s``: the dim is x's, once x is built."""
    float_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    """f64 variable -> [low, high] from guards like ``c >= 1.41`` (constants matched up to rounding)."""
    dtype_hints: dict[str, int] = field(default_factory=dict)
    """Tensor variable -> ONNX element type from guards like ``dtype(x) == 10`` (dtype-guarded rules)."""
    root_vars: list[str] = field(default_factory=list)
    """The variable each of ``roots`` is bound to (its guards' hints are the root's)."""


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


def op_name(call: CallDecl) -> str:
    ref = call.callable
    if isinstance(ref, FunctionRef):
        return ref.ident.name
    if isinstance(ref, ClassMethodRef):
        return f"{ref.ident.name}.{ref.method_name}"
    return type(ref).__name__


def _var(expr: Any) -> str | None:
    return expr.name if isinstance(expr, UnboundVarDecl) else None


def parse_rule(egg_name: str, built: RewriteOrRule) -> RulePattern:
    decl = built.decl
    decls = built.__egg_decls__
    if not isinstance(decl, RuleDecl):
        raise Unsupported(f"{egg_name} is not a rule")
    unioned = [_var(a.lhs) for a in decl.head if isinstance(a, UnionDecl)]
    rhs = [
        f"{_var(a.lhs)} := {_text(decls, a.rhs)}" if isinstance(a, UnionDecl) else _text(decls, a)
        for a in decl.head
    ]
    pattern = RulePattern(egg_name, [], {}, [], frozenset(), (), {}, [], [], rhs)
    shape_vars: dict[str, str] = {}
    """Vec variable -> the tensor variable it is the shape of (``shape(x) == s``)."""
    for fact in decl.body:
        if isinstance(fact, EqDecl) and isinstance(fact.left, CallDecl) and op_name(fact.left) == "shape":
            target = fact.left.args[0].expr
            if isinstance(target, UnboundVarDecl) and isinstance(fact.right, UnboundVarDecl):
                shape_vars[fact.right.name] = target.name
    for fact in decl.body:
        if isinstance(fact, EqDecl) and isinstance(fact.left, CallDecl) and op_name(fact.left) == "shape":
            target = fact.left.args[0].expr
            if isinstance(target, UnboundVarDecl) and isinstance(fact.right, CallDecl):
                _literal_dims(pattern, target.name, fact.right, shape_vars)
        if isinstance(fact, EqDecl) and isinstance(fact.left, CallDecl) and op_name(fact.left) == "dtype":
            target = fact.left.args[0].expr
            if isinstance(target, UnboundVarDecl) and isinstance(fact.right, LitDecl):
                pattern.dtype_hints[target.name] = int(fact.right.value)  # type: ignore[arg-type]
    const_vars, hints = set(), set()
    for fact in decl.body:
        if (
            isinstance(fact, EqDecl)
            and isinstance(fact.left, UnboundVarDecl)
            and isinstance(fact.right, CallDecl)
        ):
            name, term = fact.left.name, TypedExprDecl(fact.tp, fact.right)
            if fact.tp.ident.name == "Tensor" and op_name(fact.right) != "tensor_ref":
                if name in unioned:
                    pattern.roots.append(term)
                    pattern.root_vars.append(name)
                    pattern.lhs.append(f"{name} := {_text(decls, fact.right)}")
                else:
                    pattern.defs[name] = term
                continue
            if op_name(fact.right) == "tensor_ref":
                pattern.markers.append(name)
            elif fact.left.name in shape_vars:
                _literal_dims(pattern, shape_vars[fact.left.name], fact.right, shape_vars)
        pattern.guards.append(_text(decls, fact))
        expr = fact.typed_expr.expr if isinstance(fact, ExprFactDecl) else None
        if (
            isinstance(expr, CallDecl)
            and op_name(expr) == "is_const"
            and isinstance(expr.args[0].expr, UnboundVarDecl)
        ):
            const_vars.add(expr.args[0].expr.name)
        if isinstance(expr, CallDecl):
            _bound_hint(pattern, expr)
        if isinstance(fact, EqDecl):
            for side, other in ((fact.left, fact.right), (fact.right, fact.left)):
                if not (isinstance(side, CallDecl) and isinstance(other, LitDecl)):
                    continue
                method = side.callable.method_name if isinstance(side.callable, MethodRef) else ""
                value = int(other.value)  # type: ignore[arg-type]
                if method == "length":
                    hints.add(value)
                    if _var(side.args[0].expr) in shape_vars:  # shape(x) == s, s.length() == n: x's rank
                        pattern.dim_hints.setdefault(shape_vars[side.args[0].expr.name], {})[-1] = value  # type: ignore[union-attr]
                elif method == "__getitem__" and _var(side.args[0].expr) in shape_vars:
                    index = side.args[1].expr
                    if isinstance(index, LitDecl):
                        hint = pattern.dim_hints.setdefault(shape_vars[side.args[0].expr.name], {})  # type: ignore[union-attr]
                        hint[int(index.value)] = value  # type: ignore[arg-type]
    if not pattern.roots:
        raise Unsupported(
            f"{egg_name} rewrites no matched term (no `t == term` fact whose t the head unions)"
        )
    pattern.const_vars = frozenset(const_vars)
    pattern.rank_hints = tuple(sorted(h for h in hints if 0 <= h <= MAX_RANK))
    return pattern


def _bound_hint(pattern: RulePattern, call: CallDecl) -> None:
    """Record a guard ``model_opset() >= n`` (or ``< n``) and ``f64 var >= / <= literal``."""
    ref = call.callable
    if not (isinstance(ref, MethodRef) and len(call.args) == 2 and isinstance(call.args[1].expr, LitDecl)):
        return
    subject, bound, method = call.args[0].expr, call.args[1].expr.value, ref.method_name
    if isinstance(subject, CallDecl) and op_name(subject) == "model_opset":
        lo, hi = pattern.opset_range
        n = int(bound)  # type: ignore[arg-type]
        low = {"__ge__": n, "__gt__": n + 1}.get(method, lo)
        high = {"__lt__": n - 1, "__le__": n}.get(method, hi)
        pattern.opset_range = (max(lo, low), min(hi, high))
    elif isinstance(subject, UnboundVarDecl) and ref.ident.name == "f64" and method in ("__ge__", "__le__"):
        lo_f, hi_f = pattern.float_ranges.get(subject.name, (-math.inf, math.inf))
        value = float(bound)  # type: ignore[arg-type]
        pattern.float_ranges[subject.name] = (value, hi_f) if method == "__ge__" else (lo_f, value)


def _literal_dims(pattern: RulePattern, var: str, vec: CallDecl, shape_vars: dict[str, str]) -> None:
    """Record the rank and literal dims of a ``Vec(...)`` (or empty) shape a guard asks of ``var``,
    and its dims that are another tensor's (``s[i]`` where ``shape(y) == s``)."""
    if isinstance(vec.callable, InitRef):
        hint = pattern.dim_hints.setdefault(var, {})
        hint[-1] = len(vec.args)
        hint.update({i: int(a.expr.value) for i, a in enumerate(vec.args) if isinstance(a.expr, LitDecl)})  # type: ignore[arg-type]
        for i, a in enumerate(vec.args):
            e = a.expr
            if (
                isinstance(e, CallDecl)
                and isinstance(e.callable, MethodRef)
                and e.callable.method_name == "__getitem__"
                and _var(e.args[0].expr) in shape_vars
                and isinstance(e.args[1].expr, LitDecl)
            ):
                other = shape_vars[e.args[0].expr.name]  # type: ignore[union-attr]
                pattern.dim_links.setdefault(var, {})[i] = (other, int(e.args[1].expr.value))  # type: ignore[arg-type]
    elif isinstance(vec.callable, ClassMethodRef) and vec.callable.method_name == "empty":
        pattern.dim_hints[var] = {-1: 0}


def describe_rule(table: RuleTable, name: str) -> dict[str, Any]:
    """Family, and per egglog rule its left-hand side(s), right-hand side(s) and guards as text."""
    variants = []
    if name in table.custom:
        kind = "PET partial rule" if table.family_of(name) == "partial" else "exact site rule, PET-verified per site"
        variants.append({"egg_name": name, "lhs": [], "rhs": [], "guards": [table.custom[name][1]], "note": kind})
    for egg_name, built in table.egg_rules[name]:
        try:
            p = parse_rule(egg_name, built)
            variants.append({"egg_name": egg_name, "lhs": p.lhs, "rhs": p.rhs, "guards": p.guards})
        except Unsupported as exc:
            variants.append({"egg_name": egg_name, "lhs": [], "rhs": [], "guards": [], "note": str(exc)})
    return {"name": name, "family": table.family_of(name), "variants": variants}
