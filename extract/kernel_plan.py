"""Which nodes of an extracted program one compiled CPU kernel computes: the fusion extraction
priced, decided on the chosen program and handed to the lowering with it.

The ``onnxsat-cpu`` cost model prices an elementwise, layout or view node as computed inside the
kernel of the node that reads it, and an activation (or a product's bias row) after a conv or a
product as that kernel's store. ``kernel_groups`` turns those prices into kernels: a node of an
inlined class joins the kernel of its reader when it has one reader, or when every reader is an
inlined node of one kernel (computed once there); read by several kernels, or a graph output, its
result is stored by a kernel of its own. An epilogue joins its producer's kernel when it is that
producer's only reader (float32: the lowering's product and conv epilogues are float32 kernels). Every other node (conv, product, reduction, pool, gather, opaque ops)
is a kernel that stores its result. Ops the cost model does not know (opaque: quantization,
masks' And) get no group, nor do the inlined nodes they read: the lowering groups those. The
exporter writes the groups onto the nodes (``KERNEL_STAMP``) and ``lowering`` fuses no two nodes
of different groups.
"""

from __future__ import annotations

from collections import defaultdict

from ..egraph.graph_types import LEAF_OPS, LIST_OPS, ENode, ExtractedGraph
from ..egraph.ops.registry import numel
from .cost import INLINED_CLASSES, op_class

FLOAT32 = 1
"""``onnx.TensorProto.FLOAT``: the type of the tensors the lowering's epilogues store."""
_EPILOGUES = {
    "conv": frozenset({"relu", "hard_swish", "fused_silu"}),
    "gemm": frozenset({"relu"}),
}
"""Activations a producer's kernel applies as it stores (the lowering's conv and Gemm epilogues);
a product's bias row (``add``, then ``relu``) and the SiLU written as ``x * sigmoid(x)`` are
matched by ``_epilogue_chain``."""


def kernel_groups(graph: ExtractedGraph) -> dict[str, str]:
    """E-class -> the e-class of its kernel's root, for every chosen node computed at run time."""
    choice = graph.choice()
    readers: dict[str, list[str]] = defaultdict(list)
    for eclass, node in graph.nodes:
        if _computed(eclass, node, graph):
            for kid in dict.fromkeys(_tensor_inputs(node, choice)):
                readers[kid].append(eclass)
    outputs = set(graph.roots)
    group: dict[str, str] = {}
    for eclass, node in graph.nodes:  # epilogues first: their readers then join their kernel
        if not _computed(eclass, node, graph) or eclass in group:
            continue
        for member in _epilogue_chain(eclass, node, choice, readers, outputs, graph):
            group[member] = eclass
    for eclass, node in reversed(graph.nodes):
        if not _computed(eclass, node, graph) or eclass in group or node.op == "opaque":
            continue  # an op the cost model does not know: the lowering groups it
        users = readers.get(eclass, [])
        if _inlined(node) and any(u not in group for u in users):
            continue  # read by such an op: no opinion either
        group[eclass] = eclass
        if eclass in outputs or not users or not _inlined(node):
            continue
        kernels = {group[u] for u in users}
        if len(kernels) == 1 and (len(users) == 1 or all(_inlined(choice[u]) for u in users)):
            group[eclass] = kernels.pop()
    return group


def _computed(eclass: str, node: ENode, graph: ExtractedGraph) -> bool:
    """A node that runs in the compiled program (not a leaf, a list cell or a folded constant)."""
    return node.op not in LEAF_OPS and node.op not in LIST_OPS and eclass not in graph.const_classes


def _inlined(node: ENode) -> bool:
    cls = op_class(node.op)
    return cls in INLINED_CLASSES or cls == "view"


def _tensor_inputs(node: ENode, choice: dict[str, ENode]) -> list[str]:
    """The tensor e-classes a node reads, through the list cells of a variadic op's inputs."""
    found: list[str] = []
    for kid in node.children:
        cell = choice.get(kid)
        if cell is not None and cell.op in LIST_OPS:
            found += _tensor_inputs(cell, choice)
        else:
            found.append(kid)
    return found


def _epilogue_chain(
    eclass: str, node: ENode, choice: dict[str, ENode], readers: dict[str, list[str]], outputs: set[str], graph: ExtractedGraph
) -> list[str]:
    """The nodes that ``eclass`` (a conv or product) applies as it stores, when it has any."""

    def sole(tensor: str) -> str | None:
        users = readers.get(tensor, [])
        return users[0] if len(users) == 1 and tensor not in outputs else None

    op = node.op
    if graph.dtypes.get(eclass) != FLOAT32:  # the epilogues are the float32 kernels'
        return []
    if op in _EPILOGUES:
        user = sole(eclass)
        if user is not None and choice[user].op in _EPILOGUES[op]:
            return [user]
        users = readers.get(eclass, [])
        if op == "conv" and len(users) == 2 and eclass not in outputs:
            sig = next((u for u in users if choice[u].op == "sigmoid"), None)
            mul = next((u for u in users if choice[u].op == "mul"), None)
            if sig is not None and mul is not None and sole(sig) == mul and sorted(choice[mul].children) == sorted([eclass, sig]):
                return [sig, mul]
        return []
    if op == "matmul":
        add = sole(eclass)
        if add is None or choice[add].op != "add":
            return []
        other = next((k for k in choice[add].children if k != eclass), None)
        width = (graph.shapes.get(eclass) or (0,))[-1]
        row = graph.shapes.get(other) if other is not None else None
        if other not in graph.const_classes or row is None or numel(row) != width:
            return []
        relu = sole(add)
        return [add, relu] if relu is not None and choice[relu].op == "relu" else [add]
    return []
