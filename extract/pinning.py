"""Pinned extraction: force chosen e-nodes into the extracted program, for ablations.

The multi-pattern merges (parallel MatMuls/Gemms/Convs over concatenated weights, then a
Split) are rarely what an extractor picks, so their measured cost cannot be read off a normal
run. ``find_merges`` lists the merges an e-graph holds; ``pin`` restricts chosen e-classes to
one e-node each, so any extractor run on the result must use that node (the rest of the
program is still extracted under the cost model, and still goes through the exporter and the
numeric check).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..egraph.graph_types import ENode, Ref, SerializedEGraph

MERGEABLE_OPS = ("matmul", "gemm", "conv")
"""Ops the multi-pattern rules merge (their weight is the second argument)."""


@dataclass(frozen=True)
class Merge:
    """One merged op in the e-graph and the sibling e-classes its Split parts stand for."""

    merged_class: str
    merged_node: ENode
    """The MatMul/Gemm/Conv over concatenated weights."""
    parts: tuple[tuple[str, ENode], ...]
    """(sibling e-class, its ``split`` e-node reading ``merged_class``), in part order."""

    @property
    def op(self) -> str:
        return self.merged_node.op

    def choices(self) -> dict[str, ENode]:
        """The pins that force this merge: the merged op and every part."""
        return {self.merged_class: self.merged_node, **dict(self.parts)}


def reachable(eg: SerializedEGraph, roots: Iterable[str]) -> set[str]:
    """E-classes some choice of e-nodes can reach from ``roots`` (through any e-node of a class)."""
    seen: set[str] = set()
    stack = [r for r in roots]
    while stack:
        eclass = stack.pop()
        if eclass in seen or eclass not in eg.classes:
            continue
        seen.add(eclass)
        for node in eg.classes[eclass]:
            stack.extend(c for c in node.children if c not in seen)
    return seen


def _merged_node(eg: SerializedEGraph, eclass: str) -> ENode | None:
    """The e-node of ``eclass`` that is a mergeable op whose weight e-class holds a Concat."""
    for node in eg.classes.get(eclass, ()):
        if node.op not in MERGEABLE_OPS or len(node.args) < 2 or not isinstance(node.args[1], Ref):
            continue
        if any(w.op == "concat" for w in eg.classes.get(node.args[1].eclass, ())):
            return node
    return None


def find_merges(eg: SerializedEGraph, roots: Iterable[str]) -> list[Merge]:
    """Every merged op reachable from ``roots`` with the Split parts that read it, sorted by e-class."""
    live = reachable(eg, roots)
    parts: dict[str, list[tuple[int, str, ENode]]] = {}
    for eclass in live:
        for node in eg.classes[eclass]:
            if node.op == "split" and isinstance(node.args[0], Ref):
                index = node.args[-1]
                parts.setdefault(node.args[0].eclass, []).append((int(index), eclass, node))
    merges = []
    for source, found in sorted(parts.items()):
        merged = _merged_node(eg, source)
        if merged is None or len({index for index, _, _ in found}) < 2:
            continue
        found.sort(key=lambda p: (p[0], p[1]))
        merges.append(Merge(source, merged, tuple((eclass, node) for _, eclass, node in found)))
    return merges


def pin(eg: SerializedEGraph, choices: Mapping[str, ENode]) -> SerializedEGraph:
    """A copy of ``eg`` in which each e-class of ``choices`` holds only its chosen e-node."""
    classes = dict(eg.classes)
    for eclass, node in choices.items():
        if node not in classes.get(eclass, ()):
            raise ValueError(f"e-class {eclass} has no e-node {node.op}{node.args}")
        classes[eclass] = [node]
    return SerializedEGraph(classes, eg.shapes, eg.dtypes, eg.origins, eg.roots)
