"""Partitioning: which tensors are stored (kernel outputs) and which fuse into their consumers.

The graph is the one extraction chose (exported to ONNX); the partitioner only groups it and
never rewrites it. A tensor is stored when it is a graph output, the result of a reduce/extern/
fallback op, or an elementwise/layout result used by more than one consumer (recomputing it in
each would repeat work) unless all its consumers are elementwise nodes of one kernel: there it is
inlined into each use and LLVM computes it once (common subexpression), with no store and reload
(BERT's bias add before the erf GELU, read by the Div and the Mul, was a pass of its own over the
512 x 3072 FFN activation). Everything else is inlined into the kernel of its single consumer.
Each group is one root plus the inlined tensors it absorbs; the groups form a DAG (checked with
networkx), so kernels can run in topological order. A program extraction grouped into kernels
(``KERNEL_STAMP`` on its nodes) also stores every tensor read across two of its kernels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import networkx as nx

INLINE_KINDS = ("elementwise", "layout")


@dataclass(frozen=True)
class PNode:
    """A node as the partitioner sees it."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class Partition:
    roots: set[str]
    """Tensors that are stored in a buffer."""
    groups: dict[str, list[str]] = field(default_factory=dict)
    """Root tensor -> names of the nodes whose work its kernel does (the root's node last)."""
    order: list[str] = field(default_factory=list)
    """Roots in an order where every group runs after the groups it reads."""


def partition(
    nodes: Sequence[PNode], graph_outputs: Sequence[str], is_free: Callable[[str], bool] = lambda t: False, stored: Collection[str] = ()
) -> Partition:
    """Group ``nodes`` (in topological order) into kernels.

    ``is_free(tensor)`` says a tensor costs nothing to recompute (a view of a stored buffer or a
    constant), so it may be inlined into several consumers. ``stored`` tensors are stored whatever
    their producer (extraction put their readers in other kernels).
    """
    consumers: dict[str, list[PNode]] = defaultdict(list)
    for node in nodes:
        for t in set(node.inputs):
            if t:
                consumers[t].append(node)
    roots: set[str] = set(graph_outputs) | set(stored)
    producer: dict[str, PNode] = {}
    for node in nodes:
        for t in node.outputs:
            producer[t] = node
            if node.kind not in INLINE_KINDS:
                roots.add(t)
            elif len(consumers[t]) > 1 and not is_free(t):
                roots.add(t)
    groups, member_of = _groups(roots, producer)
    # a shared elementwise tensor whose consumers are all elementwise members of one kernel is
    # inlined there too (one at a time: un-rooting a tensor can merge groups)
    shared = [n.outputs[0] for n in nodes if n.kind == "elementwise" and len(n.outputs) == 1 and len(consumers[n.outputs[0]]) > 1]
    for t in shared:
        if t not in roots or t in graph_outputs or t in stored:
            continue
        users = consumers[t]
        kernels = {frozenset(member_of[u.name]) for u in users}
        if all(u.kind == "elementwise" for u in users) and len(kernels) == 1 and len(next(iter(kernels))) == 1:
            roots.discard(t)
            groups, member_of = _groups(roots, producer)
    g = nx.DiGraph()
    g.add_nodes_from(groups)
    by_name = {n.name: n for n in nodes}
    for root, members in groups.items():
        for name in members:
            for t in by_name[name].inputs:
                if t in roots and t in groups and t != root:
                    g.add_edge(t, root)
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        raise RuntimeError(f"partition has a cycle between kernels: {cycle}")
    return Partition(roots, groups, list(nx.topological_sort(g)))


def _groups(roots: set[str], producer: dict[str, PNode]) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Root -> the nodes its kernel computes (its own node last), and node -> the roots using it."""
    groups: dict[str, list[str]] = {}
    member_of: dict[str, set[str]] = defaultdict(set)

    def absorb(root: str, tensor: str, seen: set[str]) -> None:
        node = producer.get(tensor)
        if node is None or node.name in seen:
            return
        seen.add(node.name)
        member_of[node.name].add(root)
        groups[root].append(node.name)
        for t in node.inputs:
            if t and t not in roots:
                absorb(root, t, seen)

    for root in roots:
        if root in producer:
            groups[root] = []
            absorb(root, root, set())
            groups[root].reverse()
    return groups, member_of
