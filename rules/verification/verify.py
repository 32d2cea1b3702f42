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

Modules: rule_pattern (the LHS read from the rule), instance_sampling (shapes and attributes per
op), rule_instances (concrete terms and their evaluation), this one (e-graph rounds, verdicts).
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from egglog import EggSmolError, EGraph
from onnx import helper

from ...egraph import lang as L
from ...egraph.commands import Commands, Term, int_vec, lit_int, lit_string
from ...egraph.exporter import to_onnx
from ...egraph.graph_types import LIST_OPS, ENode, ExtractedGraph, SerializedEGraph
from ...egraph.reach import symbol
from ...egraph.run_cache import schedule_command, send
from ...extract.cost import NodeCtx
from ...extract.greedy import topological, tree_choice
from ...extract.pricing import IndexedEGraph, Pricer, const_classes
from ...extract.serialized import serialize
from ..registry import RuleTable
from .rule_instances import (
    LEAVES,
    OPSET,
    RTOL,
    Instance,
    compare,
    evaluate,
    op_callable,
    term_graph,
    term_nodes,
    term_program,
    term_text,
    to_command,
)
from .rule_pattern import Invalid, RulePattern, Unsupported, describe_rule, parse_rule

__all__ = [
    "Counterexample",
    "RuleVerification",
    "RuleVerifier",
    "describe_rule",
    "round_symbols",
    "verify_rule",
    "verify_rules",
]

BATCH = 16
"""Candidates per e-graph round (one push/pop, two serializations, one run of the rule)."""


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


def _model_opset(pattern: RulePattern) -> int:
    """The model opset a round of this pattern's instances declares: OPSET unless its guards ask otherwise."""
    low, high = pattern.opset_range
    return min(max(OPSET, low), high)


def _queue_round(commands: Commands, batch: list[Instance], memo: dict[int, Term]) -> None:
    """What one round registers: the model opset, each instance's leaves (shape, dtype, the small
    weight marker, its tensor refs) and its matched terms as graph outputs."""
    commands.set(L.model_opset, [], lit_int(_model_opset(batch[0].pattern)))
    outputs = 0
    for index, inst in enumerate(batch):
        leaf_terms = {}
        for leaf in inst.leaves.values():
            node = commands.call(L.Tensor.weight if leaf.weight else L.Tensor.input, lit_string(leaf.name))
            leaf_terms[leaf.name] = node
            commands.set(L.shape, [node], int_vec(leaf.shape))
            commands.set(L.dtype, [node], lit_int(leaf.dtype))
            if leaf.weight:  # sampled values (normal * 4, ints within 100) are far below its bound
                commands.fact(L.small_const, node)
        for k, name in enumerate(inst.marker_leaves()):
            commands.union(commands.call(L.tensor_ref, lit_int(index * 64 + k)), leaf_terms[name])
        for root in inst.roots:
            commands.union(commands.call(L.graph_output, lit_int(outputs)), to_command(root, commands, memo))
            outputs += 1


def _symbol_of(fn: Any) -> str:
    name = symbol(fn.__egg_decls__, fn.__egg_ref__)
    assert name is not None, fn
    return name


@functools.cache
def _op_symbol(op: str) -> str:
    return _symbol_of(op_callable(op))


def round_symbols(batch: list[Instance]) -> frozenset[str]:
    """The tables ``_queue_round`` fills (``present_symbols`` of its e-graph before any rule runs),
    read from the terms: registering them in a scratch e-graph to ask cost a third of a round."""
    out = {_symbol_of(L.model_opset), _symbol_of(L.graph_output)}
    for inst in batch:
        for leaf in inst.leaves.values():
            out.update(_symbol_of(fn) for fn in (L.shape, L.dtype))
            out.add(_op_symbol("Tensor.weight" if leaf.weight else "Tensor.input"))
            if leaf.weight:
                out.add(_symbol_of(L.small_const))
        if inst.marker_leaves():
            out.add(_symbol_of(L.tensor_ref))
        out.update(_op_symbol(node.op) for root in inst.roots for node in term_nodes(root))
    return frozenset(out)


@functools.cache
def _leaf_symbols() -> frozenset[str]:
    """The tables any round may fill for its leaves (``round_symbols``), whatever its instances."""
    kinds = [L.model_opset, L.graph_output, L.shape, L.dtype, L.small_const, L.tensor_ref]
    return frozenset({_symbol_of(fn) for fn in kinds} | {_op_symbol(f"Tensor.{leaf}") for leaf in ("weight", "input")})


def _run_round(
    egraph: EGraph, batch: list[Instance], analysis: Any, rules: Any
) -> tuple[SerializedEGraph, SerializedEGraph]:
    """The e-graph before and after one run of ``rules`` over the batch (the state is popped after);
    ``analysis`` saturates the analysis, both are ``run_cache.schedule_command``s."""
    egraph.push()
    stage = "analysis"
    try:
        commands = Commands(egraph)  # after the push: what it declares is popped with the round
        memo: dict[int, Term] = {}
        _queue_round(commands, batch, memo)
        commands.send()
        send(egraph, analysis)
        pre = serialize(egraph)
        if _seed_shapes(commands, batch, pre, memo):
            send(egraph, analysis)
            pre = serialize(egraph)
        stage = "rewrite"
        send(egraph, rules)
        send(egraph, analysis)
        return pre, serialize(egraph)
    except EggSmolError as exc:
        raise _Conflict(stage, str(exc).splitlines()[0]) from exc
    finally:
        egraph.pop()


def _seed_shapes(commands: Commands, batch: list[Instance], pre: SerializedEGraph, memo: dict[int, Term]) -> bool:
    """Give the reference's shapes to matched terms the analysis left without one, as import gives
    ONNX's (so rules see the shapes they see on imported models). True when something was added."""
    output = 0
    for inst in batch:
        outputs = range(output, output + len(inst.roots))
        output += len(inst.roots)
        if all(pre.roots[i] in pre.shapes for i in outputs):
            continue
        nodes = inst.op_nodes()
        try:
            (values,) = inst.evaluate_all(nodes, 1)
        except Invalid:
            continue
        for node, value in zip(nodes, values, strict=True):
            expr = memo[id(node)]
            commands.set(L.shape, [expr], int_vec(value.shape))
            commands.set(L.dtype, [expr], lit_int(int(helper.np_dtype_to_tensor_dtype(value.dtype))))
    added = bool(commands.queue)
    commands.send()
    return added


def _reachable(eg: SerializedEGraph, roots: list[str]) -> list[str]:
    seen = list(dict.fromkeys(roots))
    for eclass in seen:
        for node in eg.classes.get(eclass, []):
            seen.extend(c for c in node.children if c not in seen)
    return seen


def _display(inst: Instance) -> dict[str, str]:
    return {name: leaf.display for name, leaf in inst.leaves.items()}


# ---------------------------------------------------------------- the verifier
class RuleVerifier:
    """Verifies rules one by one. A round runs in an e-graph that holds the rule and only the
    analysis rules that may fire on the round's terms (``egraph.reach``, as ``optimize`` declares
    them: tens of the ~500, so its push/pop costs milliseconds, not tenths of a second), kept for
    the rule's later rounds; each round is pushed and popped, so rules never see each other's
    instances."""

    def __init__(
        self,
        table: RuleTable | None = None,
        *,
        seeds: int = 3,
        min_instances: int = 5,
        max_candidates: int = 300,
        seed: int = 0,
    ):
        self.table = RuleTable.default() if table is None else table
        self.seeds, self.min_instances, self.max_candidates, self.seed = (
            seeds,
            min_instances,
            max_candidates,
            seed,
        )
        self.rtol = RTOL
        """Tolerance of the rule being verified (``RuleTable.tolerances``)."""
        self._declared: dict[tuple[str, str], tuple[EGraph, Any, Any]] = {}
        """(analysis ruleset, rule ruleset) -> an e-graph with both declared, for the current rule, and
        the commands that run them (``run_cache.schedule_command``: ``EGraph.run`` checks every rule
        and converts its report, milliseconds a run)."""
        self._symbols: frozenset[str] = frozenset()
        """The tables the current rule's rounds have filled so far (``round_symbols``, accumulated)."""

    def verify(self, name: str) -> RuleVerification:
        """Verify one rule of the table (a ``KeyError`` for an unknown name)."""
        if name in self.table.custom:  # partial rules: PET's method (rules/verify_partial.py)
            return self.table.custom[name][0](name)  # type: ignore[no-any-return]
        start = time.perf_counter()
        result = RuleVerification(name, self.table.family_of(name), False, 0, "")
        try:
            self._verify(result)
        except Unsupported as exc:
            result.ok, result.detail = False, f"cannot instantiate the rule: {exc}"
        result.seconds = round(time.perf_counter() - start, 3)
        return result

    def _verify(self, result: RuleVerification) -> None:
        patterns = [parse_rule(egg_name, built) for egg_name, built in self.table.egg_rules[result.name]]
        self.rtol = self.table.tolerances.get(result.name, RTOL)
        self._declared.clear()  # the previous rule's e-graphs
        self._symbols = _leaf_symbols()
        target = max(1, math.ceil(self.min_instances / len(patterns)))
        fired = {p.egg_name: 0 for p in patterns}
        discarded: Counter[str] = Counter()
        rng = np.random.default_rng(self.seed)
        used = 0
        while used < self.max_candidates:
            need = [p for p in patterns if fired[p.egg_name] < target] or patterns
            need = [p for p in need if _model_opset(p) == _model_opset(need[0])]  # one opset per round
            if (
                all(fired[p.egg_name] >= target for p in patterns)
                and sum(fired.values()) >= self.min_instances
            ):
                break
            batch: list[Instance] = []
            for i in range(min(BATCH, self.max_candidates - used)):
                used += 1
                try:
                    batch.append(Instance(need[i % len(need)], rng, used))
                except Invalid as exc:
                    discarded[str(exc)] += 1
                except (ArithmeticError, IndexError, KeyError, ValueError) as exc:
                    discarded[f"no valid values for this pattern ({type(exc).__name__})"] += 1
            result.counterexample = self._check_batch(batch, result.name, fired, discarded)
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

    def _round(self, batch: list[Instance], name: str) -> tuple[SerializedEGraph, SerializedEGraph]:
        """One round of rule ``name`` over the batch, in an e-graph declaring what may fire on it."""
        from ..schedule import select

        # A selection for every table the rule's rounds have filled, not only this round's: the
        # analysis rules it adds cannot fire on this round, and the rule's rounds share one e-graph
        # (declaring one costs ~20 ms; rounds that differ in a leaf kind or variant made 2.5 per rule).
        self._symbols |= round_symbols(batch)
        selection = select([name], self.table, self._symbols)
        assert selection is not None
        rules = self.table.ruleset_for([name], selection.rewrites)
        key = (str(selection.analysis.__egg_ident__.name), str(rules.__egg_ident__.name))
        declared = self._declared.get(key)
        if declared is None:  # declared before any push: what is declared inside a push is popped with it
            egraph = EGraph()
            saturate = selection.analysis.saturate()
            egraph.run(saturate)  # the e-graph is empty, so nothing fires
            egraph.run(rules)
            declared = (egraph, schedule_command(egraph, saturate), schedule_command(egraph, rules))
            self._declared[key] = declared
        return _run_round(declared[0], batch, declared[1], declared[2])

    def _check_batch(
        self, batch: list[Instance], name: str, fired: dict[str, int], discarded: Counter[str]
    ) -> Counterexample | None:
        if not batch:
            return None
        try:
            pre, post = self._round(batch, name)
        except _Conflict as exc:
            if len(batch) > 1:  # find the candidate: run them one by one
                return next(
                    (c for inst in batch if (c := self._check_batch([inst], name, fired, discarded))), None
                )
            if exc.stage == "analysis":
                discarded["the shape analysis rejects the instance"] += 1
                return None
            inst = batch[0]
            try:
                lhs = "; ".join(text for text, _ in self._references(inst))
            except Invalid as invalid:  # an invalid instance proves nothing about the rule
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
                indexed = IndexedEGraph(post, Pricer(post, _UnitCost(), const_classes(post)))
                tree = indexed.as_choice(tree_choice(indexed))
            try:
                found = self._check_instance(inst, post, roots, tree)
            except Invalid as exc:
                discarded[str(exc)] += 1
                continue
            fired[inst.pattern.egg_name] += 1
            if found is not None:
                return found
        return None

    def _references(self, inst: Instance) -> list[tuple[str, list[np.ndarray]]]:
        """Text and values (per seed) of the instance's matched terms; ``Invalid`` if ONNX rejects them."""
        out = []
        for term in inst.roots:
            graph = term_graph(term)
            try:
                model = to_onnx(term_program(inst, graph), graph)
                onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
            except Exception as exc:
                raise Invalid("ONNX shape inference rejects the instance") from exc
            out.append((term_text(graph, _display(inst)), inst.evaluate(term, self.seeds)))
        return out

    def _check_instance(
        self, inst: Instance, post: SerializedEGraph, roots: list[str], tree: dict[str, ENode]
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
                text = term_text(graph, display)
                try:
                    outs = [o[0] for o in evaluate(term_program(inst, graph), graph, feeds)]
                except Exception as exc:
                    if base is None:
                        raise Invalid("the reference cannot evaluate a subterm") from exc
                    error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    reason = f"the reference cannot evaluate a rewritten term: {error}"
                    return Counterexample(lhs_text, inst.leaf_text(), base[0], text, math.inf, reason)
                if base is None:
                    base = (text, outs)
                    continue
                for s, (ref, out) in enumerate(zip(base[1], outs, strict=True)):
                    ok, err, reason = compare(ref, out, self.rtol)
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
    """Verify one rule of ``table`` (default: the in-tree table) on generated instances."""
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
    table = RuleTable.default() if table is None else table
    unknown = [n for n in names or [] if n not in table.egg_rules]
    if unknown:
        raise KeyError(f"unknown rule(s): {', '.join(unknown)}")
    verifier = RuleVerifier(
        table, seeds=seeds, min_instances=min_instances, max_candidates=max_candidates, seed=seed
    )
    return [verifier.verify(n) for n in (table.names() if names is None else names)]
