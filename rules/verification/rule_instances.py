"""Concrete instances of a rule's left-hand side: terms with every variable filled in, their
egglog and ONNX views, and evaluation with ``onnx.reference`` in float64."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx
from egglog import EGraph, String, f64, i64
from egglog.declarations import (
    CallDecl,
    ClassMethodRef,
    InitRef,
    LitDecl,
    MethodRef,
    TypedExprDecl,
    UnboundVarDecl,
)
from onnx import TensorProto, helper, numpy_helper

from ...egraph import lang as L
from ...egraph.commands import Commands, Term, int_vec, lit_float, lit_int, lit_string
from ...egraph.exporter import to_onnx
from ...egraph.graph_types import ENode, ExtractedGraph, Ref
from ...egraph.ops import BY_CTOR, OpSpec
from ...egraph.program import Program
from ...extract.greedy import topological
from .instance_sampling import HINTABLE, SAMPLERS, Gen, Known, Want, arg_names
from .rule_pattern import Invalid, RulePattern, Unsupported, op_name

DOUBLE, INT64, BOOL = TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL
RTOL = 1e-9
OPSET = 18
LEAVES = ("Tensor.input", "Tensor.weight")
MAX_KNOWN_INTS = 8
"""An evaluated int64 vector up to this long passes its values to the samplers (a computed shape)."""


# ---------------------------------------------------------------- instances
@dataclass(frozen=True)
class TermLit:
    sort: str
    value: Any


@dataclass(eq=False)
class TermNode:
    """One node of a concrete instance term (its identity is the node: shared subterms stay shared)."""

    op: str
    args: tuple[TermNode | TermLit, ...]


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


class Instance:
    """A rule's matched terms with every variable filled in: the terms, their leaves, the values."""

    def __init__(self, pattern: RulePattern, rng: np.random.Generator, tag: int):
        self.pattern, self.rng, self.tag = pattern, rng, tag
        self.gen = Gen(rng, pattern.rank_hints)
        self.env: dict[str, Any] = {}
        self.leaves: dict[str, _Leaf] = {}
        self.built: dict[int, TermNode] = {}
        self.known: dict[int, Known | None] = {}
        self.weights: dict[str, onnx.TensorProto] = {}
        self.root_ranks = {
            id(d): pattern.dim_hints[v][-1] for d, v in zip(pattern.roots, pattern.root_vars, strict=True) if -1 in pattern.dim_hints.get(v, {})
        }
        """A root's rank its guards give (``shape(t) == Vec(...)``), for its op's sampler."""
        self.roots = [self.term(d, None) for d in pattern.roots]

    def prim(self, d: TypedExprDecl, want: Any) -> Any:
        e = d.expr
        if isinstance(e, LitDecl):
            return e.value
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                default = {"i64": 0, "f64": self.gen.special(), "String": "", "Vec": ()}.get(d.tp.ident.name)
                low, high = self.pattern.float_ranges.get(e.name, (-math.inf, math.inf))
                if math.isfinite(low) and math.isfinite(high):  # a constant the guards pin (up to rounding)
                    default = want = float(self.rng.uniform(low, high))
                self.env[e.name] = default if want is None else want
            return self.env[e.name]
        if isinstance(e, CallDecl):
            if isinstance(e.callable, InitRef) and e.callable.ident.name == "Vec":
                return tuple(self.prim(a, None) for a in e.args)
            if isinstance(e.callable, ClassMethodRef) and e.callable.method_name == "empty":
                return ()
            if isinstance(e.callable, MethodRef) and e.callable.method_name in _PRIM_METHODS:
                if not self.closed(d):
                    raise Invalid("a computed attribute reads a variable not bound yet")
                return _PRIM_METHODS[e.callable.method_name](*(self.prim(a, None) for a in e.args))
        raise Unsupported(f"cannot instantiate the primitive expression {e}")

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
        name = op_name(e)
        return name.startswith("Tensor.") or name in HINTABLE

    def term(self, d: TypedExprDecl, want: Want | None) -> TermNode:
        if id(d) in self.built:
            return self.built[id(d)]
        e = d.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                defined = self.pattern.defs.get(e.name)
                self.env[e.name] = (
                    self.term(defined, want) if defined else self.leaf(e.name, want or Want(self.gen.shape()))
                )
            return cast(TermNode, self.env[e.name])
        if not isinstance(e, CallDecl):
            raise Unsupported(f"cannot instantiate {e}")
        op = op_name(e)
        if op in BY_CTOR:
            node = self.op(BY_CTOR[op], e, want, self.root_ranks.get(id(d)))
        elif op.startswith("Tensor."):
            node = self.leaf_call(op, e, want or Want(self.gen.shape()))
        else:
            raise Unsupported(f"cannot instantiate a call to {op}")
        self.built[id(d)] = node
        return node

    def leaf(self, var: str, want: Want, weight: bool | None = None) -> TermNode:
        if want.kind == "none" or (want.optional and weight is None and self.gen.chance(0.25)):
            return TermNode("Tensor.none", ())
        if want.kind == "ints":
            return TermNode("Tensor.ints", (TermLit("Vec", want.values), TermLit("i64", 0 if want.shape == () else 1)))
        shape = want.shape
        hint = self.pattern.dim_hints.get(var, {})
        rank = hint.get(-1, len(shape))
        if hint and self.gen.chance(0.7):  # the guards' rank and dims, the wanted dims filling the rest
            fill = (*(self.gen.dim() for _ in range(rank - len(shape))), *shape[len(shape) - rank :])
            shape = tuple(hint.get(i, self._linked(var, i, d)) for i, d in enumerate(fill))
        name = f"{var}__{self.tag}"
        dtype = self.pattern.dtype_hints.get(var) or {"bool": BOOL, "index": INT64}.get(want.kind, DOUBLE)
        weight = var in self.pattern.const_vars if weight is None else weight
        self.leaves[name] = _Leaf(name, var, shape, dtype, want.kind, weight, want.high)
        if weight:
            self.weights[name] = numpy_helper.from_array(_random(self.leaves[name], self.rng), name)
        return TermNode("Tensor.weight" if weight else "Tensor.input", (TermLit("String", name),))

    def _linked(self, var: str, axis: int, default: int) -> int:
        """The dim a guard equates with an axis of a tensor variable built already, else ``default``."""
        other, other_axis = self.pattern.dim_links.get(var, {}).get(axis, ("", 0))
        built = self.env.get(other)
        known = self.known_of(built) if isinstance(built, TermNode) else None
        return known.shape[other_axis] if known is not None and -len(known.shape) <= other_axis < len(known.shape) else default

    def leaf_call(self, op: str, e: CallDecl, want: Want) -> TermNode:
        if op == "Tensor.none":
            return TermNode(op, ())
        if op == "Tensor.splat":
            dt = {"ints": INT64, "index": INT64, "bool": BOOL}.get(want.kind, DOUBLE)
            value, dims = self.prim(e.args[0], self.gen.special()), self.prim(e.args[1], want.shape)
            return TermNode(
                op,
                (TermLit("f64", float(value)), TermLit("Vec", tuple(dims)), TermLit("i64", self.prim(e.args[2], dt))),
            )
        if op == "Tensor.ints":
            rank = self.prim(e.args[1], 0 if want.shape == () else 1)
            count = 1 if rank == 0 else (want.shape[0] if len(want.shape) == 1 else self.gen.dim())
            values = want.values if want.kind == "ints" else tuple(self.gen.dim() for _ in range(count))
            return TermNode(op, (TermLit("Vec", tuple(self.prim(e.args[0], values))), TermLit("i64", rank)))
        if op in LEAVES:
            var = str(self.prim(e.args[0], f"leaf{len(self.leaves)}"))
            kind = "data" if want.kind in ("ints", "none") else want.kind
            return self.leaf(var, Want(want.shape, kind), weight=op == "Tensor.weight")
        raise Unsupported(f"cannot instantiate {op}")

    def op(self, spec: OpSpec, e: CallDecl, want: Want | None, out_rank: int | None = None) -> TermNode:
        """Build one modelled op: fixed arguments first, then the sampler's proposals for the rest
        (``out_rank``: the rank guards give its result, passed as the rank of ``__out__``)."""
        names = arg_names(spec)
        if len(names) != len(e.args):
            raise Unsupported(f"{spec.op_type}: {len(e.args)} arguments, the op table has {len(names)}")
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
        ranks: dict[str, int] = {"__out__": out_rank} if out_rank is not None and want is None else {}
        ranks |= {
            name: self.pattern.dim_hints[d.expr.name][-1]
            for name, d in zip(names, e.args, strict=True)
            if isinstance(d.expr, UnboundVarDecl) and -1 in self.pattern.dim_hints.get(d.expr.name, {}) and self.deferred(d)
        }
        if ranks:
            known["__ranks__"] = ranks
        sampler = SAMPLERS.get(spec.name)
        wants = sampler(self.gen, known) if sampler else {n: Want(self.gen.shape()) for n in names}
        args: list[TermNode | TermLit] = []
        for name, d in zip(names, e.args, strict=True):
            sort = d.tp.ident.name
            if sort == "Tensor":
                args.append(self.term(d, wants.get(name)))
            elif sort == "TList":
                args.append(self.tlist(d, cast(list[Want], wants.get(name) or [])))
            else:
                default = next((a.default for a in spec.attrs if a.name == name), None)
                args.append(TermLit(sort, self.prim(d, wants.get(name, default))))
        return TermNode(spec.name, tuple(args))

    def tlist(self, d: TypedExprDecl, wants: list[Want]) -> TermNode:
        e = d.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.env:
                self.env[e.name] = term_list([self.leaf(f"{e.name}{i}", w) for i, w in enumerate(wants)])
            return cast(TermNode, self.env[e.name])
        op = op_name(e) if isinstance(e, CallDecl) else str(e)
        if op == "TList.nil":
            return TermNode(op, ())
        if op == "TList.cons":
            args = cast(CallDecl, e).args
            return TermNode(
                op, (self.term(args[0], wants[0] if wants else None), self.tlist(args[1], wants[1:]))
            )
        raise Unsupported(f"cannot instantiate a list made by {op}")

    def known_of(self, node: TermNode) -> Known | None:
        if id(node) not in self.known:
            if node.op == "Tensor.none":
                self.known[id(node)] = None
            elif node.op in LEAVES:
                leaf = self.leaves[cast(TermLit, node.args[0]).value]
                self.known[id(node)] = Known(leaf.shape, leaf.dtype)
            elif node.op == "Tensor.ints":
                values, rank = (cast(TermLit, a).value for a in node.args)
                self.known[id(node)] = Known((len(values),) if rank else (), INT64, tuple(values))
            else:
                (value,) = self.evaluate(node, 1)
                dtype = int(helper.np_dtype_to_tensor_dtype(value.dtype))
                small_ints = dtype == INT64 and value.ndim <= 1 and value.size <= MAX_KNOWN_INTS  # a computed shape
                values = tuple(int(v) for v in value.reshape(-1)) if small_ints else None
                self.known[id(node)] = Known(value.shape, dtype, values)
        return self.known[id(node)]

    def evaluate(self, node: TermNode, seeds: int) -> list[np.ndarray]:
        return [outs[0] for outs in self.evaluate_all([node], seeds)]

    def evaluate_all(self, nodes: list[TermNode], seeds: int) -> list[list[np.ndarray]]:
        try:
            graph = term_graph(*nodes)
            return evaluate(term_program(self, graph), graph, [self.feeds(s) for s in range(seeds)])
        except Exception as exc:
            raise Invalid("the reference cannot evaluate the instance") from exc

    def op_nodes(self) -> list[TermNode]:
        return list({id(n): n for r in self.roots for n in term_nodes(r) if n.op in BY_CTOR}.values())

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, self.tag])
        return {n: _random(leaf, rng) for n, leaf in self.leaves.items() if not leaf.weight}

    def marker_leaves(self) -> list[str]:
        """Leaf names of the variables the rule reads import order of, in creation order."""
        nodes = [self.env[v] for v in self.pattern.markers if v in self.env]
        names = {cast(TermLit, n.args[0]).value for n in nodes if n.op in LEAVES}
        return [n for n in self.leaves if n in names]

    def leaf_text(self) -> dict[str, str]:
        kinds: dict[int, str] = {DOUBLE: "f64", INT64: "i64", BOOL: "bool"}
        return {
            x.display: f"{'weight' if x.weight else 'input'} {kinds.get(x.dtype, str(x.dtype))}{list(x.shape)}"
            for x in self.leaves.values()
        }


def _heads(d: TypedExprDecl) -> list[TypedExprDecl]:
    out, e = [], d.expr
    while isinstance(e, CallDecl) and op_name(e) == "TList.cons":
        out.append(e.args[0])
        e = e.args[1].expr
    return out


def term_list(items: list[TermNode]) -> TermNode:
    out = TermNode("TList.nil", ())
    for item in reversed(items):
        out = TermNode("TList.cons", (item, out))
    return out


def term_nodes(root: TermNode) -> list[TermNode]:
    seen: dict[int, TermNode] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(a for a in node.args if isinstance(a, TermNode))
    return list(seen.values())


def _random(leaf: _Leaf, rng: np.random.Generator) -> np.ndarray:
    if leaf.dtype != {"bool": BOOL, "index": INT64}.get(leaf.kind, DOUBLE):  # pinned by a dtype guard
        if leaf.dtype == BOOL:
            return rng.random(leaf.shape) < 0.5
        np_type = helper.tensor_dtype_to_np_dtype(leaf.dtype)
        if np.issubdtype(np_type, np.integer):
            low = 0 if np.issubdtype(np_type, np.unsignedinteger) else -100
            return rng.integers(low, 100, size=leaf.shape).astype(np_type)
        return (rng.standard_normal(leaf.shape) * 4).astype(np_type)
    if leaf.kind == "bool":
        return rng.random(leaf.shape) < 0.5
    if leaf.kind == "index":
        return rng.integers(0, max(leaf.high, 1), size=leaf.shape).astype(np.int64)
    if leaf.kind == "positive":
        return rng.uniform(0.5, 2.0, size=leaf.shape)
    return rng.standard_normal(leaf.shape)


# ---------------------------------------------------------------- egglog and ONNX views of a term
def to_egglog(node: TermNode, memo: dict[int, Any]) -> Any:
    if id(node) not in memo:
        args = [
            to_egglog(a, memo) if isinstance(a, TermNode)
            else L.ivec([int(v) for v in a.value]) if a.sort == "Vec"
            else {"i64": lambda v: i64(int(v)), "f64": lambda v: f64(float(v)), "String": String}[a.sort](a.value)
            for a in node.args
        ]  # fmt: skip
        memo[id(node)] = op_callable(node.op)(*args)
    return memo[id(node)]


def op_callable(op: str) -> Any:
    """The language callable a term node's ``op`` names (a modelled op's constructor or a leaf/list one)."""
    if op in BY_CTOR:
        return BY_CTOR[op].ctor
    owner, _, method = op.rpartition(".")
    return getattr({"Tensor": L.Tensor, "TList": L.TList}[owner], method)


def to_command(node: TermNode, commands: Commands, memo: dict[int, Term]) -> Term:
    """``to_egglog`` as an egglog command term (``egraph.commands``): the same term, built without
    egglog's Python expression layer, which cost half of a verification round."""
    if id(node) not in memo:
        args = [
            to_command(a, commands, memo) if isinstance(a, TermNode)
            else int_vec(int(v) for v in a.value) if a.sort == "Vec"
            else {"i64": lit_int, "f64": lit_float, "String": lit_string}[a.sort](a.value)
            for a in node.args
        ]  # fmt: skip
        memo[id(node)] = commands.call(op_callable(node.op), *args)
    return memo[id(node)]


def term_graph(*roots: TermNode) -> ExtractedGraph:
    """Terms as an extracted graph (one synthetic e-class per node) for the exporter."""
    nodes = list({id(n): n for root in roots for n in term_nodes(root)}.values())
    ids = {id(n): f"t{i}" for i, n in enumerate(nodes)}
    choice = {
        ids[id(n)]: ENode(n.op, tuple(Ref(ids[id(a)]) if isinstance(a, TermNode) else a.value for a in n.args))
        for n in nodes
    }
    tops = [ids[id(root)] for root in roots]
    return ExtractedGraph(nodes=topological(choice, tops), roots=tops)


def term_program(inst: Instance, graph: ExtractedGraph) -> Program:
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


def evaluate(
    program: Program, graph: ExtractedGraph, feeds: list[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """Export the terms and run them with ``onnx.reference`` once per feed (all outputs each time)."""
    from onnx.reference import ReferenceEvaluator

    from ..pet.verify_partial import (
        numpy_pool_ops,  # the reference's stride-1 MaxPool fails on a 1-wide kernel
    )

    evaluator = ReferenceEvaluator(to_onnx(program, graph), new_ops=numpy_pool_ops())
    with np.errstate(all="ignore"):
        return [[np.asarray(v) for v in evaluator.run(None, f)] for f in feeds]


def term_text(graph: ExtractedGraph, display: dict[str, str]) -> str:
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


def compare(ref: np.ndarray, out: np.ndarray, rtol: float = RTOL) -> tuple[bool, float, str]:
    """Float64 agreement within ``rtol`` of the output's magnitude; NaN and inf positions must match."""
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
    ok = bool(np.all(diff <= rtol * (scale + np.abs(a[fa]))))
    return ok, float(diff.max()), "" if ok else "values differ"
