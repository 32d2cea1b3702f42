"""Sharing-aware greedy extraction (tree pass, then a greedy-DAG pass) and DAG scoring.

The tree pass is Bellman-Ford over e-classes with non-negative node costs; it only switches a
class's choice on a strict improvement, which can never close a cycle. The DAG pass prices a
candidate by the union of the sub-DAG it needs (a tensor used twice is paid once) and skips any
candidate whose sub-DAG contains its own class. Every result is scored by one independent
function, ``dag_cost``, and the cheaper of the two is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cost import CostModel, NodeCtx, known_dims
from .serialized import CONST_LEAVES, ENode, SerializedEGraph

INF = float("inf")
DAG_PASS_MAX_CLASSES = 4_000
"""Above this the quadratic DAG pass is skipped (tree result; ILP remains exact)."""


@dataclass
class ExtractedGraph:
    """An acyclic program: ``nodes`` in topological order (e-class, chosen node)."""

    nodes: list[tuple[str, ENode]]
    roots: list[str]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, int] = field(default_factory=dict)
    origins: dict[str, int] = field(default_factory=dict)
    const_classes: set[str] = field(default_factory=set)
    cost: float = 0.0
    method: str = "greedy-dag"
    gap: float | None = None
    """Relative distance to the best proven lower bound (ILP only; ``None`` when unknown)."""
    optimal: bool = False
    """True when the extractor proved ``cost`` minimal (ILP only)."""

    def choice(self) -> dict[str, ENode]:
        return dict(self.nodes)


def const_classes(eg: SerializedEGraph) -> set[str]:
    """E-classes computable from weights alone (fixpoint over all candidates)."""
    const: set[str] = set()
    changed = True
    while changed:
        changed = False
        for eclass, nodes in eg.classes.items():
            if eclass in const:
                continue
            for node in nodes:
                if node.op in CONST_LEAVES or node.op == "TList.nil":
                    ok = True
                elif node.op in ("Tensor.input", "opaque"):
                    ok = False
                else:
                    ok = all(c in const for c in node.children)
                if ok:
                    const.add(eclass)
                    changed = True
                    break
    return const


class _Pricer:
    def __init__(self, eg: SerializedEGraph, cost: CostModel, const: set[str]):
        self.eg, self.cost, self.const = eg, cost, const
        self.cache: dict[tuple[str, ENode], float] = {}
        self.class_ops: dict[str, frozenset[str]] = {}

    def ops_of(self, eclass: str) -> frozenset[str]:
        """Every op an e-class can be computed by (what ORT may fuse a consumer into)."""
        ops = self.class_ops.get(eclass)
        if ops is None:
            ops = self.class_ops[eclass] = frozenset(n.op for n in self.eg.classes.get(eclass, ()))
        return ops

    def __call__(self, eclass: str, node: ENode) -> float:
        key = (eclass, node)
        if key not in self.cache:
            children = node.children
            node_const = eclass in self.const and all(c in self.const for c in children) and node.op != "opaque"
            ctx = NodeCtx(
                node=node,
                out_shape=known_dims(self.eg.shapes.get(eclass)),
                out_dtype=self.eg.dtypes.get(eclass),
                in_shapes=[known_dims(self.eg.shapes.get(c)) for c in children],
                in_dtypes=[self.eg.dtypes.get(c) for c in children],
                is_const=node_const or node.op in CONST_LEAVES,
                in_ops=tuple(self.ops_of(c) for c in children),
                in_const=tuple(c in self.const for c in children),
            )
            self.cache[key] = max(0.0, float(self.cost.node_cost(ctx)))
        return self.cache[key]


def _tree_choice(eg: SerializedEGraph, price: _Pricer) -> dict[str, ENode]:
    best: dict[str, float] = {}
    choice: dict[str, ENode] = {}
    changed = True
    while changed:
        changed = False
        for eclass in sorted(eg.classes):
            for node in eg.classes[eclass]:
                children = node.children
                if any(c not in best for c in children):
                    continue
                total = price(eclass, node) + sum(best[c] for c in children)
                if total < best.get(eclass, INF):
                    best[eclass], choice[eclass] = total, node
                    changed = True
    return choice


def _dag_choice(eg: SerializedEGraph, price: _Pricer, start: dict[str, ENode], order: list[str]) -> dict[str, ENode]:
    """Greedy-DAG: each class keeps the cheapest candidate by the cost of the union of its sub-DAG."""
    sets: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    choice = dict(start)
    for _ in range(3):
        changed = False
        for eclass in order:
            for node in eg.classes[eclass]:
                children = node.children
                if any(c not in sets for c in children):
                    continue
                merged: dict[str, float] = {}
                for c in children:
                    merged.update(sets[c])
                if eclass in merged:
                    continue  # would be a cycle
                merged[eclass] = price(eclass, node)
                total = sum(merged.values())
                if total < totals.get(eclass, INF) - 1e-12:
                    sets[eclass], totals[eclass], choice[eclass] = merged, total, node
                    changed = True
        if not changed:
            break
    return choice


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


def dag_cost(nodes: list[tuple[str, ENode]], price: _Pricer) -> float:
    """The independent score of an extracted program: each chosen node paid once."""
    return sum(price(eclass, node) for eclass, node in nodes)


def extract_greedy(eg: SerializedEGraph, cost: CostModel, roots: list[str], *, tree_only: bool = False) -> ExtractedGraph:
    const = const_classes(eg)
    price = _Pricer(eg, cost, const)
    tree = _tree_choice(eg, price)
    missing = [r for r in roots if r not in tree]
    if missing:
        raise RuntimeError(f"no finite-cost term for output e-classes {missing}")
    candidates = [("tree", topological(tree, roots))]
    if not tree_only and len(eg.classes) <= DAG_PASS_MAX_CLASSES:
        order = [eclass for eclass, _ in candidates[0][1]]
        order += sorted(c for c in eg.classes if c not in set(order))
        dag = _dag_choice(eg, price, tree, order)
        candidates.append(("greedy-dag", topological(dag, roots)))
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
