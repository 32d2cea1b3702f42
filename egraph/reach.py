"""Which rules can ever fire on a model: the op closure of its e-graph.

An egglog rule matches only when every table its body reads (a constructor such as ``conv``, a
function such as ``shape``, a relation such as ``is_const``) has a row. Rows come from the import
and from rule heads, so a rule whose body reads a table that neither the model fills nor any rule
that can fire writes never matches. ``closure`` computes, from the symbols a model starts with,
the rules that may fire (to a fixpoint: a rule that may fire adds what its head writes); declaring
only those gives the same e-graph as declaring all, at a fraction of the declaration cost.

A symbol is the name of a table-backed callable (``onnxsat.egraph.lang.conv``,
``onnxsat.egraph.lang.Tensor.ints``); primitives (i64, f64, String, Vec arithmetic) have no table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from egglog import EGraph, RewriteOrRule, Ruleset
from egglog.declarations import (
    BiRewriteDecl,
    CallDecl,
    ChangeDecl,
    ClassMethodRef,
    ConstantRef,
    Declarations,
    EqDecl,
    ExprActionDecl,
    ExprFactDecl,
    FunctionRef,
    InitRef,
    LetDecl,
    LitDecl,
    MethodRef,
    PropertyRef,
    RewriteDecl,
    RuleDecl,
    SetDecl,
    TypedExprDecl,
    UnboundVarDecl,
    UnionDecl,
)


@dataclass(frozen=True)
class Reach:
    """What one egglog rule reads to match (``needs``) and what its head may write (``creates``)."""

    needs: frozenset[str]
    creates: frozenset[str]


EVERYTHING = "*"
"""A symbol in ``creates`` of a rule this module cannot read: it may write any table."""


def symbol(decls: Declarations, ref: Any) -> str | None:
    """The table name a callable reference reads or writes; None for a primitive (no table)."""
    if isinstance(ref, FunctionRef):
        decl = decls._functions.get(ref.ident)
        return None if decl is None or getattr(decl, "builtin", False) else str(ref.ident)
    if isinstance(ref, MethodRef | ClassMethodRef | PropertyRef | InitRef):
        cls = decls._classes.get(ref.ident)
        if cls is None or cls.builtin:
            return None
        return f"{ref.ident}.{getattr(ref, 'method_name', None) or getattr(ref, 'property_name', '__init__')}"
    if isinstance(ref, ConstantRef):
        return str(ref.ident)
    return EVERYTHING


def _walk(decls: Declarations, item: Any, out: set[str]) -> None:
    if isinstance(item, TypedExprDecl):
        item = item.expr
    if isinstance(item, CallDecl):
        name = symbol(decls, item.callable)
        if name is not None:
            out.add(name)
        for arg in item.args:
            _walk(decls, arg, out)
    elif isinstance(item, UnboundVarDecl | LitDecl):
        return
    elif isinstance(item, EqDecl):
        _walk(decls, item.left, out)
        _walk(decls, item.right, out)
    elif isinstance(item, ExprFactDecl | ExprActionDecl | LetDecl):
        _walk(decls, item.typed_expr, out)
    elif isinstance(item, SetDecl):
        _walk(decls, item.call, out)
        _walk(decls, item.rhs, out)
    elif isinstance(item, UnionDecl):
        _walk(decls, item.lhs, out)
        _walk(decls, item.rhs, out)
    elif isinstance(item, ChangeDecl):
        _walk(decls, item.call, out)
    else:  # a construct not read here: treat it as writing anything (never as needing something)
        out.add(EVERYTHING)


def reach_of(built: RewriteOrRule) -> Reach:
    """The tables ``built`` needs to match and may write (conservative: unknown parts write all)."""
    decls, decl = built.__egg_decls__, built.decl
    needs: set[str] = set()
    creates: set[str] = set()
    if isinstance(decl, RuleDecl):
        for fact in decl.body:
            _walk(decls, fact, needs)
        for action in decl.head:
            _walk(decls, action, creates)
    elif isinstance(decl, RewriteDecl):
        _walk(decls, decl.lhs, needs)
        for fact in decl.conditions:
            _walk(decls, fact, needs)
        _walk(decls, decl.rhs, creates)
    elif isinstance(decl, BiRewriteDecl):  # either side may match: it needs what both share
        left: set[str] = set()
        right: set[str] = set()
        _walk(decls, decl.lhs, left)
        _walk(decls, decl.rhs, right)
        for fact in decl.conditions:
            _walk(decls, fact, needs)
        needs |= left & right
        creates = left | right
    else:
        return Reach(frozenset(), frozenset({EVERYTHING}))
    needs.discard(EVERYTHING)  # an unread body construct: assume it matches
    return Reach(frozenset(needs), frozenset(creates))


def closure(start: Iterable[str], reaches: Sequence[Reach]) -> tuple[list[int], frozenset[str]]:
    """Indices of the rules that may fire from tables ``start``, and every table that may get rows."""
    available = set(start)
    chosen = [False] * len(reaches)
    changed = True
    while changed:
        changed = False
        for i, reach in enumerate(reaches):
            if chosen[i] or (EVERYTHING not in available and not reach.needs <= available):
                continue
            chosen[i] = True
            if not reach.creates <= available:
                available |= reach.creates
                changed = True
    return [i for i, c in enumerate(chosen) if c], frozenset(available)


def present_symbols(egraph: EGraph) -> frozenset[str]:
    """The tables of ``egraph`` that hold rows (what its rules can match now)."""
    state = egraph._state
    decls = state.__egg_decls__
    out: set[str] = set()
    for callable_, size in egraph.all_function_sizes():
        if size:
            name = symbol(decls, getattr(callable_, "__egg_ref__", None) or _ref_of(callable_))
            out.add(name or EVERYTHING)
    return frozenset(out)


def _ref_of(callable_: Any) -> Any:
    """The declaration reference of a callable egglog hands back (functions and class methods)."""
    return getattr(callable_, "__egg_callable_ref__", None)


@dataclass(frozen=True)
class Selection:
    """The rules declared for one model: its analysis ruleset, the rewrite rules that may fire
    (identities of built egglog rules; None: every enabled one), and the tables that may get rows
    under them (a table outside it getting rows means the selection must grow, ``widen``)."""

    analysis_rules: tuple[RewriteOrRule, ...]
    """The analysis rules that may fire, in declaration order (a run declares those that can
    match now, ``egraph.live``)."""
    rewrites: frozenset[int] | None
    available: frozenset[str]
    table: Any = None
    """The rule table the rewrite rules came from (kept, so their identities stay theirs)."""
    enabled: tuple[str, ...] = ()
    """The enabled rule names the selection was made from."""

    @property
    def analysis(self) -> Ruleset:
        """Every analysis rule of the selection as one ruleset (built on first use)."""
        from .shapes import analysis_ruleset

        return analysis_ruleset(list(self.analysis_rules))

    def covers(self, other: Selection) -> bool:
        """Whether every rule ``other`` declares is declared here too (same table and enabled rules,
        a closure from more tables): an e-graph with this selection runs ``other``'s model exactly as
        one with ``other``'s would, the extra rules never matching on it."""
        return self.table is other.table and self.enabled == other.enabled and self.available >= other.available


def language_symbols(decls: Declarations) -> frozenset[str]:
    """Every table a set of declarations defines (functions, constructors, relations, class methods)."""
    out = {str(ident) for ident, decl in decls._functions.items() if not getattr(decl, "builtin", False)}
    for ident, cls in decls._classes.items():
        if not cls.builtin:
            out.update(f"{ident}.{name}" for name in cls.class_methods)
    out.update(str(ident) for ident in decls._constants)
    return frozenset(out)


_REACH: dict[int, tuple[RewriteOrRule, Reach]] = {}
"""Reach of built rules by identity (the rule is kept so its id stays its own)."""


def remember(built: RewriteOrRule, needs: Iterable[str], creates: Iterable[str]) -> None:
    """Take the reach of ``built`` as computed before (the rule-table cache stores it with the rule)."""
    _REACH[id(built)] = (built, Reach(frozenset(needs), frozenset(creates)))


def reach_cached(built: RewriteOrRule) -> Reach:
    """``reach_of``, once per built rule per process."""
    hit = _REACH.get(id(built))
    if hit is None or hit[0] is not built:
        hit = _REACH[id(built)] = (built, reach_of(built))
    return hit[1]
