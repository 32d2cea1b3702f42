"""Pricing an e-graph's nodes for extraction: what every extractor and the rule checks share.

``const_classes`` finds the e-classes computable from weights alone, ``Pricer`` prices one
e-node under a cost model (cached per node and per signature the cost model sees),
``IndexedEGraph`` numbers classes and nodes for the fast passes, and ``dag_cost`` is the one
independent score of an extracted program (each chosen node paid once).
"""

from __future__ import annotations

from ..egraph.graph_types import CONST_LEAVES, ENode, Ref, SerializedEGraph
from .cost import CostModel, NodeCtx, known_dims


def const_classes(eg: SerializedEGraph) -> set[str]:
    """E-classes computable from weights alone: a worklist from the constant leaves upwards."""
    waiting: dict[tuple[str, int], int] = {}
    users: dict[str, list[tuple[str, int]]] = {}
    ready: list[str] = []
    for eclass, nodes in eg.classes.items():
        for i, node in enumerate(nodes):
            if node.op in ("Tensor.input", "opaque"):
                continue
            if node.op in CONST_LEAVES or node.op == "TList.nil":
                ready.append(eclass)
                continue
            kids = set(node.children)
            if not kids:
                continue  # a constructor without tensor inputs that is no constant leaf
            waiting[(eclass, i)] = len(kids)
            for kid in kids:
                users.setdefault(kid, []).append((eclass, i))
    const: set[str] = set()
    while ready:
        eclass = ready.pop()
        if eclass in const:
            continue
        const.add(eclass)
        for key in users.get(eclass, ()):
            waiting[key] -= 1
            if waiting[key] == 0 and key[0] not in const:
                ready.append(key[0])
    return const


class Pricer:
    """``price(eclass, node)``: the cost model's price of one e-node, cached per node."""

    def __init__(self, eg: SerializedEGraph, cost: CostModel, const: set[str], chosen: dict[str, ENode] | None = None):
        self.eg, self.cost, self.const = eg, cost, const
        self.chosen = chosen
        """An extracted program: the ops of an input class are then its chosen node's alone."""
        self.cache: dict[int, tuple[ENode, float]] = {}
        self.class_ops: dict[str, frozenset[str]] = {}
        self._class_info: dict[str, tuple[tuple[int, ...] | None, int | None, frozenset[str], bool]] = {}
        self.by_signature: dict[tuple[object, ...], float] = {}

    def ops_of(self, eclass: str) -> frozenset[str]:
        """Every op an e-class can be computed by (what ORT may fuse a consumer into)."""
        ops = self.class_ops.get(eclass)
        if ops is None:
            picked = self.chosen.get(eclass) if self.chosen is not None else None
            nodes = (picked,) if picked is not None else self.eg.classes.get(eclass, ())
            ops = self.class_ops[eclass] = frozenset(n.op for n in nodes)
        return ops

    def _info(self, eclass: str) -> tuple[tuple[int, ...] | None, int | None, frozenset[str], bool]:
        """What the cost model sees of an e-class: shape (known dims), dtype, ops, constness."""
        info = self._class_info.get(eclass)
        if info is None:
            shape = known_dims(self.eg.shapes.get(eclass))
            info = (shape, self.eg.dtypes.get(eclass), self.ops_of(eclass), eclass in self.const)
            self._class_info[eclass] = info
        return info

    def __call__(self, eclass: str, node: ENode) -> float:
        # Keyed by identity (nodes live in ``eg.classes`` for the pricer's lifetime); the node is
        # kept in the entry so an id is never reused by another object while cached.
        hit = self.cache.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        children = node.children
        op = node.op
        shape, dtype, ops, const = (
            zip(*map(self._info, children), strict=True) if children else ((), (), (), ())
        )
        out_shape, out_dtype, _, out_const = self._info(eclass)
        node_const = op in CONST_LEAVES or (out_const and op != "opaque" and all(const))
        # Nodes that agree on everything the cost model sees cost the same (saturation makes many).
        literals = tuple(a for a in node.args if not isinstance(a, Ref))
        signature = (op, literals, out_shape, out_dtype, shape, dtype, node_const, ops, const)
        value = self.by_signature.get(signature)
        if value is None:
            ctx = NodeCtx(node, out_shape, out_dtype, list(shape), list(dtype), node_const, ops, const)
            value = self.by_signature[signature] = max(0.0, float(self.cost.node_cost(ctx)))
        self.cache[id(node)] = (node, value)
        return value


class IndexedEGraph:
    """The e-graph with classes and nodes numbered: children and parents as int lists."""

    def __init__(self, eg: SerializedEGraph, price: Pricer):
        self.names = sorted(eg.classes)
        index = {c: i for i, c in enumerate(self.names)}
        self.nodes: list[ENode] = []
        self.node_class: list[int] = []
        self.kids: list[tuple[int, ...]] = []
        """Children of each node, with repeats (tree cost counts a repeated child twice)."""
        self.distinct: list[tuple[int, ...]] = []
        self.class_nodes: list[list[int]] = []
        self.parents: list[list[int]] = [[] for _ in self.names]
        self.prices: list[float] = []
        missing = len(self.names)  # children without a class: an index no class has
        nodes, node_class, all_kids, all_distinct = self.nodes, self.node_class, self.kids, self.distinct
        parents, prices, get = self.parents, self.prices, index.get
        for ci, eclass in enumerate(self.names):
            own = []
            for node in eg.classes[eclass]:
                n = len(nodes)
                kids = tuple([get(k, missing) for k in node.children])
                distinct = (
                    kids if len(kids) < 2 or len(set(kids)) == len(kids) else tuple(dict.fromkeys(kids))
                )
                nodes.append(node)
                node_class.append(ci)
                all_kids.append(kids)
                all_distinct.append(distinct)
                prices.append(price(eclass, node))
                for k in distinct:
                    if k != missing:
                        parents[k].append(n)
                own.append(n)
            self.class_nodes.append(own)

    def as_choice(self, choice: list[int]) -> dict[str, ENode]:
        return {self.names[c]: self.nodes[n] for c, n in enumerate(choice) if n >= 0}


def dag_cost(nodes: list[tuple[str, ENode]], price: Pricer) -> float:
    """The independent score of an extracted program: each chosen node paid once, priced with the
    ops the program computes its inputs with. (The search prices a node by every op its input
    classes hold, which saturation grows: a conv reading a class that also holds a Split paid the
    NCHWc ReorderInput whichever node was picked, so a saturated shufflenet scored 59% above the
    very program it was imported from.)"""
    chosen = Pricer(price.eg, price.cost, price.const, chosen=dict(nodes))
    return sum(chosen(eclass, node) for eclass, node in nodes)
