"""PET-style partial-equivalence rules: a mutant that differs from the original op only on some
output regions, plus a correction that recomputes those regions; the e-graph gets the fully
equivalent composite (mutant + correction), never the bare mutant.

How a partial rule runs (``apply_partial_rules``, called by the pipeline after import):

1. Each family looks at the imported graph's op applications (``OpCall``: op, attributes, input
   and output e-classes, concrete shapes) and proposes ``Site`` s: the original terms, the mutant
   terms, the declared correction slabs (output regions where the mutant may differ, computed
   from the op's receptive field), the PET box grid, and the composite terms.
2. A site whose corrections exceed ``max_correction`` of its outputs is not emitted.
3. Every other site is verified at its own shapes by PET's method (``verify_partial``; cached by
   rule and shapes); only a verified site's composite is unioned into the e-graph. So nothing
   unverified is ever in the e-graph and extraction needs no special case: the cost model prices
   the mutant and the correction like any other ops and decides.

Site rules whose mutant needs no correction (``PartialRule.exact``, e.g. the sub-pixel ConvTranspose)
are exact rewrites: they run by default, listed in the ``layout`` family, through the same per-site
verification; the corrected partial families stay opt-in (``--enable-rules partial``).

Terms are built once, as ``rule_instances`` nodes over named leaves: the verifier exports and
evaluates exactly those terms, and the pass turns the same terms into egglog expressions with
each leaf bound to its e-class (``tensor_ref``), so what is verified is what is unioned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import EggSmolError, union

from ...egraph import lang as L
from ...egraph.graph_types import ENode, Ref, SerializedEGraph
from ...egraph.shapes import analysis_ruleset
from ..registry import Family
from ..verification.rule_instances import TermLit, TermNode, term_list, to_egglog

FAMILY = "partial"
MAX_CORRECTION = 0.25
"""Default: a site whose correction slabs cover more than this fraction of its outputs is not emitted."""

Term = TermNode
Slab = tuple[int, int, int]
"""A correction region of one output: (axis, start, end) over the full extent of the other axes."""


# ---------------------------------------------------------------- term builders
def leaf(name: str) -> Term:
    return TermNode("Tensor.input", (TermLit("String", name),))


def ints(values: Sequence[int]) -> Term:
    return TermNode("Tensor.ints", (TermLit("Vec", tuple(int(v) for v in values)), TermLit("i64", 1)))


NONE: Term = TermNode("Tensor.none", ())


def call(op: str, tensors: Sequence[Term], attrs: Sequence[tuple[str, Any]]) -> Term:
    """An op node: tensor arguments, then literal attributes as (sort, value)."""
    return TermNode(op, (*tensors, *(TermLit(sort, value) for sort, value in attrs)))


def slice_axis(x: Term, axis: int, start: int, end: int) -> Term:
    return TermNode("slice_", (x, ints([start]), ints([end]), ints([axis]), NONE))


def concat(items: Sequence[Term], axis: int) -> Term:
    return items[0] if len(items) == 1 else TermNode("concat", (term_list(list(items)), TermLit("i64", axis)))


def reshape(x: Term, dims: Sequence[int]) -> Term:
    return TermNode("reshape", (x, ints(dims), TermLit("i64", 0)))


def transpose(x: Term, perm: Sequence[int]) -> Term:
    return TermNode("transpose", (x, TermLit("Vec", tuple(perm))))


# ---------------------------------------------------------------- windowed ops (Conv, pooling)
@dataclass(frozen=True)
class Window:
    """One spatial axis of a windowed op: effective kernel extent, stride, pads before/after."""

    extent: int
    stride: int
    pad_before: int
    pad_after: int

    def out_size(self, size: int) -> int:
        return (size + self.pad_before + self.pad_after - self.extent) // self.stride + 1

    def reads(self, start: int, end: int) -> tuple[int, int]:
        """Input interval [lo, hi) that output rows [start, end) read (padding included)."""
        return start * self.stride - self.pad_before, (end - 1) * self.stride - self.pad_before + self.extent

    def straddling(self, seam: int, out_size: int) -> tuple[int, int]:
        """Output rows [a, b) whose window holds input rows on both sides of ``seam``."""
        a = max(0, -(-(seam + self.pad_before - self.extent + 1) // self.stride))
        b = min(out_size, (seam + self.pad_before - 1) // self.stride + 1)
        return a, max(a, b)

    def cuts(self, boundaries: Sequence[int], out_size: int) -> list[int]:
        """Output rows where a window edge crosses a boundary: PET's box edges along this axis."""
        found = {0, out_size}
        for b in boundaries:
            for offset in (0, self.extent - 1):  # window start and window end cross b
                i = -(-(b + self.pad_before - offset) // self.stride)
                if 0 < i < out_size:
                    found.add(i)
        return sorted(found)


@dataclass(frozen=True)
class WindowedOp:
    """A Conv or pooling application: rebuilds itself with other pads, on other inputs."""

    op: str
    attrs: tuple[Any, ...]
    """The e-node's literal arguments, in the op table's order."""

    @property
    def named(self) -> dict[str, Any]:
        from ...egraph.ops import BY_CTOR

        return {a.name: v for a, v in zip(BY_CTOR[self.op].attrs, self.attrs, strict=True)}

    def windows(self, kernel: Sequence[int]) -> list[Window]:
        """Per spatial axis (``kernel``: the spatial kernel dims; the weight's for Conv)."""
        named = self.named
        rank = len(kernel)
        strides = tuple(named.get("strides") or (1,) * rank)
        dil = tuple(named.get("dilations") or (1,) * rank)
        pads = tuple(named["pads"])
        return [
            Window((kernel[i] - 1) * dil[i] + 1, strides[i], pads[i], pads[rank + i]) for i in range(rank)
        ]

    def with_pads(self, axis: int, before: int, after: int) -> WindowedOp:
        """The same op with spatial ``axis`` (0-based among spatial axes) padded differently."""
        named = self.named
        pads = list(named["pads"])
        rank = len(pads) // 2
        pads[axis], pads[rank + axis] = before, after
        named["pads"] = tuple(pads)
        return WindowedOp(self.op, tuple(named.values()))

    def apply(self, x: Term, params: Sequence[Term]) -> Term:
        """This op on ``x`` (``params``: the other tensor inputs, e.g. Conv's weight and bias)."""
        from ...egraph.ops import BY_CTOR

        sorts = {"int": "i64", "float": "f64", "string": "String", "ints": "Vec"}
        kinds = [sorts[a.kind] for a in BY_CTOR[self.op].attrs]
        return call(self.op, [x, *params], list(zip(kinds, self.attrs, strict=True)))


def recompute_slab(
    op: WindowedOp, x: Term, params: Sequence[Term], axis: int, window: Window, in_size: int, start: int, end: int
) -> Term:
    """Output rows [start, end) along tensor ``axis`` (spatial axis ``axis - 2``) computed by the
    original op on just the input rows they read: real padding stays, interior rows become data."""
    lo, hi = window.reads(start, end)
    clip_lo, clip_hi = max(0, lo), min(in_size, hi)
    sliced = slice_axis(x, axis, clip_lo, clip_hi)
    return op.with_pads(axis - 2, clip_lo - lo, hi - clip_hi).apply(sliced, params)


def overwrite(mutant: Term, axis: int, size: int, slabs: Sequence[tuple[int, int, Term]]) -> Term:
    """``mutant`` with rows [a, b) along ``axis`` replaced by each correction (Slice + Concat)."""
    parts: list[Term] = []
    at = 0
    for a, b, corr in sorted(slabs, key=lambda s: s[0]):
        if a > at:
            parts.append(slice_axis(mutant, axis, at, a))
        parts.append(corr)
        at = b
    if at < size:
        parts.append(slice_axis(mutant, axis, at, size))
    return concat(parts, axis) if parts else mutant


# ---------------------------------------------------------------- sites
@dataclass(frozen=True)
class OpCall:
    """One op application of the imported graph: inputs by e-class (None: absent), concrete shapes."""

    op: str
    out: str
    inputs: tuple[str | None, ...]
    attrs: tuple[Any, ...]
    in_shapes: tuple[tuple[int, ...] | None, ...]
    out_shape: tuple[int, ...]
    dtype: int


@dataclass
class Site:
    """One place a partial rule applies: terms over named leaves, and what the rule claims."""

    rule: str
    outputs: list[str]
    """E-class of each original output (the composite is unioned there)."""
    leaves: dict[str, tuple[str, tuple[int, ...], int]]
    """Leaf name -> (e-class, shape, dtype)."""
    originals: list[Term]
    mutants: list[Term]
    """The mutant's value for each output, shaped like the original (before any correction)."""
    composites: list[Term]
    corrections: list[list[Slab]]
    """Per output: the slabs the correction recomputes (PET's differing boxes must lie inside)."""
    cuts: list[list[list[int]]]
    """Per output, per axis: box edges (sorted, from 0 to the dim); boxes are their products."""
    out_shapes: list[tuple[int, ...]]
    multilinear: bool = True
    """PET's m+1-positions theorem holds (Conv, AveragePool, MatMul); else random tests only."""

    def key(self) -> tuple[Any, ...]:
        """What verification depends on: the rule, the op attributes, the shapes (cache key)."""
        from ..verification.rule_instances import term_graph

        graph = term_graph(*self.composites, *self.originals)
        ops = tuple((n.op, tuple(a for a in n.args if not isinstance(a, Ref))) for _, n in graph.nodes)
        shapes = tuple((name, shape, dtype) for name, (_, shape, dtype) in sorted(self.leaves.items()))
        return (self.rule, ops, shapes)

    def corrected_fraction(self) -> float:
        total = sum(math.prod(s) for s in self.out_shapes)
        fixed = 0
        for shape, slabs in zip(self.out_shapes, self.corrections, strict=True):
            for axis, a, b in slabs:
                fixed += (b - a) * math.prod(shape) // max(shape[axis], 1)
        return fixed / total if total else 0.0


def full_cuts(shape: Sequence[int]) -> list[list[int]]:
    """One box over the whole output."""
    return [[0, d] for d in shape]


def every_position(shape: Sequence[int], axes: Sequence[int]) -> list[list[int]]:
    """Boxes of one position along ``axes`` (mutants that interleave phases are not affine across them)."""
    return [list(range(d + 1)) if i in axes else [0, d] for i, d in enumerate(shape)]


@dataclass(frozen=True)
class PartialRule:
    """A named partial rule: its family's site finder and a few small calls to verify it on."""

    name: str
    doc: str
    find: Callable[[list[OpCall], SerializedEGraph | None], list[Site]]
    samples: Callable[[], list[OpCall]]
    pattern: str
    """The matched op and guards, as text for ``onnxsat rules list``."""
    ops: frozenset[str] = frozenset({"conv", "conv_transpose", "average_pool", "max_pool", "matmul"})
    """The ops whose applications ``find`` looks at (no such op in a model: the rule does no work)."""
    exact: bool = False
    """The mutant needs no correction (PET's check must find no differing box). Exact site rules join
    the default-on ``EXACT_FAMILY``; rules with a correction stay in the opt-in ``partial`` family."""


PARTIAL_RULES: dict[str, PartialRule] = {}
EXACT_FAMILY = "layout"
"""Where exact site rules are listed and enabled (by default), next to the exact pool-separable rule."""


def site_families() -> tuple[Family, Family]:
    """A module's own families for its site rules (``register``): the opt-in ``partial`` one and
    ``EXACT_FAMILY``."""
    return Family(FAMILY, default_off=True), Family(EXACT_FAMILY)


def register(families: tuple[Family, Family], rule: PartialRule) -> None:
    """Add a site rule to ``families`` (from ``site_families``), verified by PET's method: a partial
    rule to the opt-in family ``partial``, an exact one to the default-on ``EXACT_FAMILY``."""
    from .verify_partial import verify_partial_rule

    PARTIAL_RULES[rule.name] = rule
    partial, exact = families
    (exact if rule.exact else partial).custom_rule(rule.name, verify_partial_rule, rule.pattern)


# ---------------------------------------------------------------- the pass
@dataclass
class PartialRecord:
    """One site a partial rule found: verified and emitted, or why not."""

    rule: str
    outputs: list[str]
    shapes: str
    status: str
    """emitted, rejected (verification failed), or too-large (correction over the threshold)."""
    corrected_fraction: float
    differing_boxes: int = 0
    boxes: int = 0
    cached: bool = False
    detail: str = ""
    used: bool = False
    """Set after extraction: the extracted program computes this site's output with the composite."""
    tops: list[Any] = field(default_factory=list, repr=False)
    """The composite's top levels per output (ops and literal arguments, ``signature``): how
    ``mark_used`` recognizes it (the top op alone can be the original's, e.g. a separable pool's
    second pass, or another site's on the same output, e.g. a Concat along the height)."""
    origins: list[int] = field(default_factory=list, repr=False)


def calls_of(eg: SerializedEGraph, ops: frozenset[str]) -> list[OpCall]:
    """Op applications of ``ops`` in an imported e-graph whose tensors all have known shapes."""
    out = []
    for eclass, nodes in eg.classes.items():
        shape = eg.shapes.get(eclass)
        if shape is None or any(d < 0 for d in shape) or eclass not in eg.origins:
            continue
        for node in nodes:
            if node.op not in ops:
                continue
            inputs: list[str | None] = []
            shapes: list[tuple[int, ...] | None] = []
            for arg in node.args:
                if not isinstance(arg, Ref):
                    continue
                child = arg.eclass
                if any(n.op == "Tensor.none" for n in eg.classes.get(child, [])):
                    inputs.append(None)
                    shapes.append(None)
                    continue
                inputs.append(child)
                shapes.append(eg.shapes.get(child))
            if any(i is not None and (s is None or any(d < 0 for d in s) or i not in eg.origins) for i, s in zip(inputs, shapes, strict=True)):
                continue
            attrs = tuple(a for a in node.args if not isinstance(a, Ref))
            out.append(OpCall(node.op, eclass, tuple(inputs), attrs, tuple(shapes), tuple(shape), eg.dtypes.get(eclass, 1)))
    return out


_VERDICTS: dict[tuple[Any, ...], Any] = {}
"""PET verdicts by site key (rule, ops, shapes), kept for the process."""


def verify_site_cached(site: Site) -> tuple[Any, bool]:
    """PET verdict on ``site`` at its shapes, and whether it came from the cache."""
    from .verify_partial import verify_site

    key = site.key()
    if key in _VERDICTS:
        return _VERDICTS[key], True
    verdict = verify_site(site)
    _VERDICTS[key] = verdict
    return verdict, False


def site_rules(enabled: Sequence[str], eg: SerializedEGraph) -> list[str]:
    """The enabled site rules whose ops occur in ``eg`` (none: the pass has nothing to do)."""
    names = [n for n in enabled if n in PARTIAL_RULES]
    if not names:
        return []
    present = {node.op for nodes in eg.classes.values() for node in nodes}
    return [n for n in names if PARTIAL_RULES[n].ops & present]


def find_sites(enabled: Sequence[str], eg: SerializedEGraph) -> list[Site]:
    names = site_rules(enabled, eg)
    if not names:
        return []
    calls = calls_of(eg, frozenset().union(*(PARTIAL_RULES[n].ops for n in names)))
    return [site for name in names for site in PARTIAL_RULES[name].find(calls, eg)]


def apply_partial_rules(
    program: Any, eg: SerializedEGraph, enabled: Sequence[str], max_correction: float = MAX_CORRECTION
) -> list[PartialRecord]:
    """Find, verify and union the sites of the enabled partial rules into ``program.egraph``.

    ``eg`` is the imported e-graph, serialized (the pipeline has it for the cost before). Only
    sites verified at their own shapes are unioned; the records say what happened to each.
    """
    records = []
    actions = []
    for site in find_sites(enabled, eg):
        shapes = ", ".join(f"{list(s)}" for _, s, _ in site.leaves.values())
        fraction = site.corrected_fraction()
        record = PartialRecord(site.rule, site.outputs, shapes, "emitted", round(fraction, 4))
        if fraction > max_correction:
            record.status = "too-large"
            record.detail = f"correction covers {fraction:.0%} of the output (limit {max_correction:.0%})"
            records.append(record)
            continue
        verdict, record.cached = verify_site_cached(site)
        record.differing_boxes, record.boxes = verdict.differing_boxes, verdict.boxes
        record.detail = verdict.detail
        if not verdict.ok:
            record.status = "rejected"
            records.append(record)
            continue
        memo: dict[int, Any] = {}
        for node in _leaf_nodes(site):
            memo[id(node)] = L.tensor_ref(eg.origins[site.leaves[node.args[0].value][0]])  # type: ignore[union-attr]
        for out, composite in zip(site.outputs, site.composites, strict=True):
            actions.append(union(L.tensor_ref(eg.origins[out])).with_(to_egglog(composite, memo)))
        record.tops = [signature(c) for c in site.composites]
        record.origins = [eg.origins[o] for o in site.outputs]
        records.append(record)
    if actions:
        try:
            program.egraph.register(*actions)
            program.egraph.run(_analysis(program).saturate())
        except EggSmolError as exc:  # a verified composite with another shape: a framework bug
            rules = sorted({r.rule for r in records if r.status == "emitted"})
            raise RuntimeError(f"partial rule(s) {', '.join(rules)} gave a tensor two shapes: {exc}") from exc
    return records


def _analysis(program: Any) -> Any:
    """The program's analysis ruleset (``Program.analysis``), or every analysis rule for a caller that
    passes only an e-graph holder."""
    analysis = getattr(program, "analysis", None)
    return analysis() if analysis is not None else analysis_ruleset()


def apply_site_rules(program: Any, enabled: Sequence[str], eg: SerializedEGraph | None = None) -> list[PartialRecord]:
    """The per-site stage as ``onnxsat.optimize`` runs it before saturation: the enabled site rules'
    sites found, PET-verified and unioned into the freshly imported ``program`` (``eg``: its serialized
    e-graph, if the caller has it). Nothing to do (and no serialization) when none is enabled."""
    from ...extract.serialized import serialize

    if not any(n in PARTIAL_RULES for n in enabled):
        return []
    eg = serialize(program.egraph) if eg is None else eg
    on_sites = site_rules(enabled, eg)
    return apply_partial_rules(program, eg, on_sites) if on_sites else []


def _leaf_nodes(site: Site) -> list[Term]:
    """The leaf nodes of the site's composites (each becomes its e-class's ``tensor_ref``)."""
    from ..verification.rule_instances import term_nodes

    return [n for root in site.composites for n in term_nodes(root) if n.op == "Tensor.input"]


SIGNATURE_DEPTH = 4
"""How many levels of a composite ``mark_used`` compares with the extracted program (a Concat, its
list cells, the parts and their inputs: enough to tell two sites' composites on one output apart)."""

ANY = "*"


def signature(term: Term, depth: int = SIGNATURE_DEPTH) -> Any:
    """``term``'s top ``depth`` levels as nested tuples ``(op, literals, children)``; leaves and deeper
    levels are ``ANY`` (plain data, so a record stays JSON-serializable)."""
    if depth == 0 or term.op == "Tensor.input":
        return ANY
    children = tuple(signature(a, depth - 1) for a in term.args if isinstance(a, TermNode))
    return (term.op, _literals(term.args), children)


def _chosen_matches(sig: Any, eclass: str, chosen: dict[str, ENode]) -> bool:
    """The extracted program computes ``eclass`` with the term ``sig`` describes."""
    if sig == ANY:
        return True
    node = chosen.get(eclass)
    op, literals, children = sig
    if node is None or node.op != op or _literals(node.args) != tuple(literals):
        return False
    refs = [a.eclass for a in node.args if isinstance(a, Ref)]
    return len(refs) == len(children) and all(_chosen_matches(c, r, chosen) for c, r in zip(children, refs, strict=True))


def mark_used(records: list[PartialRecord], chosen: dict[str, ENode], origins: dict[str, int]) -> None:
    """After extraction: a site is used when the program chosen for one of its outputs is its
    composite, compared over the composite's top levels (``signature``)."""
    by_origin = {index: eclass for eclass, index in origins.items()}
    for record in records:
        if record.status != "emitted":
            continue
        for origin, top in zip(record.origins, record.tops, strict=True):
            eclass = by_origin.get(origin)
            if eclass is not None and _chosen_matches(top, eclass, chosen):
                record.used = True


def _literals(args: Sequence[Any]) -> tuple[Any, ...]:
    """The literal (non-tensor) arguments of a term or e-node, lists as tuples, comparable across both."""
    out = []
    for arg in args:
        if isinstance(arg, (Ref, TermNode)):
            continue
        value = arg.value if isinstance(arg, TermLit) else arg
        out.append(tuple(value) if isinstance(value, list) else value)
    return tuple(out)
