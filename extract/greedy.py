"""Sharing-aware greedy extraction (tree pass, then a greedy-DAG pass) and DAG scoring.

Both passes run on an integer-indexed copy of the e-graph (``IndexedEGraph``) so that 100k-node
graphs take seconds. The tree pass is Knuth's generalization of Dijkstra: with non-negative
node costs, classes are settled in order of their cheapest tree cost, each once, so the result
is the exact minimum tree cost and never a cycle. The DAG pass prices a candidate by the union
of the sub-DAG it needs (a tensor used twice is paid once), with each class's sub-DAG kept as a
bit set (a Python int), and skips any candidate whose sub-DAG contains its own class. Every
result is scored by one independent function, ``pricing.dag_cost``, and the cheaper of the two is
returned.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..egraph.graph_types import ENode, ExtractedGraph, SerializedEGraph
from ..egraph.ops import BY_CTOR
from .cost import CostModel
from .pricing import IndexedEGraph, Pricer, const_classes, dag_cost
from .serialized import gc_paused

INF = float("inf")
DAG_PASS_MAX_CLASSES = 60_000
"""Above this the DAG pass is skipped (its bit sets grow as classes squared; ILP remains exact)."""
_BITS_LOOP_MAX = 48
"""Bit sets with at most this many new members are summed bit by bit, larger ones with numpy."""


def tree_choice(ix: IndexedEGraph, settled: list[int] | None = None) -> list[int]:
    """Per class the node of minimum tree cost (Knuth's algorithm; -1 for classes without a term).

    ``settled`` receives the classes in the order they were settled: cheapest tree cost first, so
    every class after the classes its cheapest nodes read."""
    n_classes = len(ix.names)
    best = [INF] * (n_classes + 1)  # the extra slot is the "missing child" class
    choice = [-1] * n_classes
    pending = [len(d) for d in ix.distinct]
    heap = [(ix.prices[n], n) for n, d in enumerate(ix.distinct) if not d]
    heapq.heapify(heap)
    while heap:
        total, n = heapq.heappop(heap)
        c = ix.node_class[n]
        if choice[c] >= 0:
            continue
        choice[c], best[c] = n, total
        if settled is not None:
            settled.append(c)
        for p in ix.parents[c]:
            pending[p] -= 1
            if pending[p] == 0 and choice[ix.node_class[p]] < 0:
                heapq.heappush(heap, (ix.prices[p] + sum(best[k] for k in ix.kids[p]), p))
    return choice


def _dag_choice(ix: IndexedEGraph, start: list[int], order: list[int]) -> list[int]:
    """Greedy-DAG: each class keeps the cheapest candidate by the cost of the union of its sub-DAG.

    A class's sub-DAG is a bit set over class numbers; ``member`` holds the price each member
    class contributes (its currently chosen node's), so the union's cost is the larger child's
    total plus the members the other children add.
    """
    n_classes = len(ix.names)
    sets = [0] * (n_classes + 1)  # 0 = no sub-DAG yet (a computed one always holds its own bit)
    totals = [INF] * (n_classes + 1)
    member = [0.0] * (n_classes + 1)
    choice = list(start)
    prices, distinct, class_nodes = ix.prices, ix.distinct, ix.class_nodes
    for _ in range(3):
        changed = False
        for c in order:
            for n in class_nodes[c]:
                kids = distinct[n]
                if len(kids) == 1:  # the common case, without the union
                    merged = sets[kids[0]]
                    if not merged:
                        continue
                    sub = totals[kids[0]]
                elif not kids:
                    merged, sub = 0, 0.0
                else:
                    if not all(sets[k] for k in kids):
                        continue
                    base = max(kids, key=totals.__getitem__)
                    merged, sub = sets[base], totals[base]
                    for k in kids:
                        if k != base:
                            extra = sets[k] & ~merged
                            if extra:
                                sub += _sum_members(extra, member)
                                merged |= extra
                if (merged >> c) & 1:
                    continue  # would be a cycle
                total = sub + prices[n]
                if total < totals[c] - 1e-12:
                    sets[c], totals[c], choice[c] = merged | (1 << c), total, n
                    member[c] = prices[n]
                    changed = True
        if not changed:
            break
    return choice


def _sum_members(bits: int, member: list[float]) -> float:
    """Sum of ``member[i]`` over the set bits i of ``bits``."""
    if bits.bit_count() <= _BITS_LOOP_MAX:
        total = 0.0
        while bits:
            low = bits & -bits
            total += member[low.bit_length() - 1]
            bits ^= low
        return total
    raw = np.frombuffer(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    flags = np.unpackbits(raw, bitorder="little")[: len(member)]
    return float(flags @ np.asarray(member[: len(flags)]))


def topological(choice: dict[str, ENode], roots: list[str]) -> list[tuple[str, ENode]]:
    """Post-order over the chosen nodes from the roots; raises on a cycle."""
    order: list[tuple[str, ENode]] = []
    state: dict[str, int] = {}  # 1 = on stack, 2 = done
    for root in roots:
        if state.get(root) == 2:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            eclass, i = stack[-1]
            children = choice[eclass].children
            if i < len(children):
                stack[-1] = (eclass, i + 1)
                child = children[i]
                s = state.get(child)
                if s == 1:
                    raise RuntimeError(f"extraction produced a cycle through {child}")
                if s is None:
                    state[child] = 1
                    stack.append((child, 0))
            else:
                stack.pop()
                state[eclass] = 2
                order.append((eclass, choice[eclass]))
    return order


def complete_kernels(
    eg: SerializedEGraph, nodes: list[tuple[str, ENode]], roots: list[str]
) -> list[tuple[str, ENode]]:
    """Every output of a chosen multi-output fused kernel (an op with a fixed ``output_count``, e.g.
    the residual Add + RMSNorm) is taken by its class when that class is in the program.

    Classes are chosen one by one, so one class may take the kernel and another its output's old
    node (the plain Add): the export would then write the kernel and that node too. Once the kernel
    runs its other outputs are free, so each class holding one takes it (unless that makes a cycle).
    """
    outputs: dict[tuple[object, ...], dict[int, str]] = {}
    for eclass, candidates in eg.classes.items():
        for node in candidates:
            spec = BY_CTOR.get(node.op)
            if spec is not None and spec.output_count:
                outputs.setdefault((node.op, node.args[:-1]), {})[int(node.args[-1])] = eclass
    if not outputs:
        return nodes
    choice = dict(nodes)
    chosen = {(n.op, n.args[:-1]) for n in choice.values() if (n.op, n.args[:-1]) in outputs}
    changed = False
    for key in sorted(chosen, key=str):
        for index, eclass in outputs[key].items():
            kernel = next(n for n in eg.classes[eclass] if (n.op, n.args[:-1]) == key and n.args[-1] == index)
            if eclass in choice and choice[eclass] is not kernel:
                choice[eclass], changed = kernel, True
    if not changed:
        return nodes
    try:
        return topological(choice, roots)
    except RuntimeError:  # a cycle: keep the program as chosen
        return nodes


def extract_greedy(
    eg: SerializedEGraph, cost: CostModel, roots: list[str], *, tree_only: bool = False
) -> ExtractedGraph:
    """The cheaper (by ``dag_cost``) of the tree and the greedy-DAG extraction of ``roots``."""
    with gc_paused():
        return _extract_greedy(eg, cost, roots, tree_only)


def _extract_greedy(
    eg: SerializedEGraph, cost: CostModel, roots: list[str], tree_only: bool
) -> ExtractedGraph:
    const = const_classes(eg)
    price = Pricer(eg, cost, const)
    ix = IndexedEGraph(eg, price)
    settled: list[int] = []
    tree_index = tree_choice(ix, settled)
    tree = ix.as_choice(tree_index)
    missing = [r for r in roots if r not in tree]
    if missing:
        raise RuntimeError(f"no finite-cost term for output e-classes {missing}")
    candidates = [("tree", topological(tree, roots))]
    if not tree_only and len(eg.classes) <= DAG_PASS_MAX_CLASSES:
        # Classes in the order the tree pass settled them, so a class is priced after the classes
        # its candidates read: in the order of the tree's program, a Sigmoid the tree did not use
        # came after the Mul reading it, its total lagged a sweep behind the Conv below both, and
        # x * sigmoid(x) lost to fused_silu(x) by that lag (efficientnet's 45 SiLUs, +17% cost).
        seen = set(settled)
        order = settled + [c for c in range(len(ix.names)) if c not in seen]
        dag = _dag_choice(ix, tree_index, order)
        candidates.append(("greedy-dag", topological(ix.as_choice(dag), roots)))
    candidates = [(name, complete_kernels(eg, nodes, roots)) for name, nodes in candidates]
    method, nodes = min(candidates, key=lambda c: (dag_cost(c[1], price), c[0] != "greedy-dag"))
    return ExtractedGraph(
        nodes=nodes,
        roots=roots,
        shapes=eg.shapes,
        dtypes=eg.dtypes,
        origins=eg.origins,
        const_classes=const,
        cost=dag_cost(nodes, price),
        method=method,
    )
