"""Shape, dtype and constness analyses as egglog rules: the arithmetic they share, their tables,
and the rules as a ruleset built on first use.

Shapes are ``Vec[i64]`` per e-class (``>= 0`` known dims, ``< 0`` symbolic). The rules below
compute the shape of a term from its inputs' shapes, so a term a rewrite creates gets a shape
without help from Python. Where a rule needs a rank (broadcasting, transposes, conv windows)
one rule per rank is generated; ranks up to ``MAX_RANK`` are covered. Ops or instances not
covered here keep the shape ONNX shape inference gave them at import.

The rules themselves are written in ``shape_defs`` (importing it builds them, about a second);
``in_tree_rules`` returns them built once per process, from the declarations on disk when
``rules/table_cache.py`` has them, and ``analysis_ruleset`` a ruleset of any subset of them (a
run declares only the rules its model can fire, ``egraph.reach``).

Broadcasting a dim pair uses only i64 arithmetic (egglog has no conditionals in actions):
``1`` is mapped below every other value, the larger of the pair wins (a known dim beats a
symbolic one), and two 1s give 1.
"""

from __future__ import annotations

from typing import Any

from egglog import RewriteOrRule, Ruleset, Vec, function, i64, i64Like, relation, ruleset

from . import lang as L

MAX_RANK = 6
_BIG = 1 << 50
"""Below every dim the analysis writes (pair codes included): ``bdim``'s stand-in for a 1."""

def is_one(x: i64) -> i64:
    """1 when ``x == 1`` else 0 (for integers)."""
    return i64(1) - (x - 1).max(i64(1) - x).min(1)


def is_zero(x: i64) -> i64:
    return i64(1) - x.max(i64(0) - x).min(1)


def is_negative(x: i64) -> i64:
    """1 when ``x < 0`` else 0 (no overflow at the i64 extremes, e.g. INT64_MAX slice ends)."""
    return i64(0) - x.min(0).max(-1)


PAIR_BASE = 1 << 40
"""Symbolic dims at or below ``-PAIR_BASE`` stand for the broadcast of two other symbols; they stay
above ``-(PAIR_BASE + PAIR_SPAN)``, so a pair of pairs is a pair code too."""
PAIR_SPAN = 1 << 39


def bdim(a: i64, b: i64) -> i64:
    """The broadcast of two dims.

    Two different symbols give a third one named by the pair (either may be 1 at run time, so
    the result is neither). The pair code mixes both symbols, ordered so ``a+b`` and ``b+a``
    agree, into ``PAIR_SPAN`` values: every digit of both enters, so a pair of pairs does not
    collapse onto a pair of their parts (a code kept only low digits: bcast(bcast(s1, s2), s3)
    was bcast(s2, s3)). ``_BIG`` lies below every code, so a 1 never wins against a symbol.
    """
    fa = a - is_one(a) * (_BIG + 1)
    fb = b - is_one(b) * (_BIG + 1)
    r = fa.max(fb)
    r = r + is_zero(r + _BIG) * (_BIG + 1)
    lo, hi = a.min(b), a.max(b)
    # -lo, -hi < 2^41 (PAIR_BASE + PAIR_SPAN), so the products stay far below 2^63
    mixed = ((i64(0) - lo) * 1_000_003 + (i64(0) - hi) * 7_919) % PAIR_SPAN
    pair = i64(0) - (i64(PAIR_BASE) + mixed)
    two_symbols = is_negative(a) * is_negative(b) * (i64(1) - is_zero(a - b))
    return r + two_symbols * (pair - r)


def int_eq(x: i64, y: i64) -> i64:
    """1 when ``x == y`` else 0."""
    return is_zero(x - y)


def int_ge(x: i64, y: i64) -> i64:
    """1 when ``x >= y`` else 0."""
    return (x - y + 1).max(0).min(1)


def norm_axis(axis: i64, rank: i64) -> i64:
    """A possibly negative axis counted from the front."""
    return axis + rank * is_negative(axis)


def clamp(x: i64, lo: i64 | int, hi: i64 | int) -> i64:
    return x.max(lo).min(hi)


def unsqueezed_dims(dims: list, axes: list) -> list:
    """``dims`` with 1s inserted at output positions ``axes`` (distinct, normalized)."""
    padded = vec_of(list(dims) + [i64(1)])
    out = []
    for i in range(len(dims) + len(axes)):
        is_axis = sum((int_eq(i64(i), a) for a in axes), i64(0))
        before = sum((i64(1) - int_ge(a, i64(i)) for a in axes), i64(0))  # axes strictly before i
        src = clamp(i64(i) - before, 0, len(dims))
        out.append(is_axis + (i64(1) - is_axis) * padded[src])
    return out


def vec_of(items: list) -> Vec[i64]:
    return Vec(*items) if items else Vec[i64].empty()


# ---------------------------------------------------------------- the analysis tables
bshape_req = relation("bshape_req", Vec[i64], Vec[i64])


@function
def bshape(x: Vec[i64], y: Vec[i64]) -> Vec[i64]:
    """The numpy broadcast of two shapes."""


axis_sum_req = relation("axis_sum_req", L.TList, i64)


@function
def axis_sum(xs: L.TList, axis: i64Like) -> i64:
    """Sum of ``shape[axis]`` over a tensor list."""


numel_req = relation("numel_req", Vec[i64])


@function
def numel(dims: Vec[i64]) -> i64:
    """Element count of a fully known shape."""


TABLES = (bshape_req, bshape, axis_sum_req, axis_sum, numel_req, numel)
"""The analysis's own tables (beyond the language's ``shape``, ``dtype`` and constness relations)."""


# ---------------------------------------------------------------- the rules, built on first use
_IN_TREE: list[RewriteOrRule] | None = None
_EXTRA: list[RewriteOrRule] = []
_RULESETS: dict[tuple[int, ...], tuple[Ruleset, list[RewriteOrRule]]] = {}


def in_tree_rules() -> list[RewriteOrRule]:
    """The in-tree analysis rules in declaration order, built once per process (or given by
    ``use_stored`` from the disk cache before anything needed them)."""
    global _IN_TREE
    if _IN_TREE is None:
        from .shape_defs import RULES

        _IN_TREE = list(RULES)
    return _IN_TREE


def use_stored(rules: list[RewriteOrRule]) -> None:
    """Take the in-tree rules read from the disk cache (ignored once they exist in this process)."""
    global _IN_TREE
    if _IN_TREE is None:
        _IN_TREE = list(rules)


def add_rules(*built: RewriteOrRule) -> None:
    """Analysis rules of an op added at run time (a plugin's op row); they join every analysis."""
    _EXTRA.extend(built)


def analysis_rules() -> list[RewriteOrRule]:
    """Every analysis rule: the in-tree ones, then those of op rows added at run time."""
    return [*in_tree_rules(), *_EXTRA]


def analysis_ruleset(rules: list[RewriteOrRule] | None = None) -> Ruleset:
    """A ruleset of ``rules`` (default: every analysis rule), one per distinct list per process, so
    an e-graph that has it declared never declares it again."""
    chosen = analysis_rules() if rules is None else rules
    key = tuple(id(r) for r in chosen)
    if key not in _RULESETS:
        built = ruleset(name="shapes" if not _RULESETS else f"shapes-{len(_RULESETS)}-{len(chosen)}")
        for r in chosen:
            built.append(r)
        _RULESETS[key] = (built, chosen)
    return _RULESETS[key][0]


def __getattr__(name: str) -> Any:
    if name == "shape_rules":  # every analysis rule as one ruleset (tests, rule verification)
        return analysis_ruleset()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
