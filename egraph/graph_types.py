"""The data types of an e-graph read into Python and of one program chosen from it.

``SerializedEGraph`` holds e-classes with their candidate ``ENode`` choices (arguments are
``Ref``s to e-classes or literals); ``ExtractedGraph`` is the acyclic program an extractor picks.
They live with the graph so that export (``exporter.to_onnx``) and the extractors share them
without the egraph layer importing extraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ops import BY_CTOR

LEAF_OPS = {"Tensor.input", "Tensor.weight", "Tensor.splat", "Tensor.ints", "Tensor.none"}
LIST_OPS = {"TList.nil", "TList.cons"}
CHOICE_OPS = LEAF_OPS | LIST_OPS | {"opaque"} | set(BY_CTOR)
CONST_LEAVES = {"Tensor.weight", "Tensor.splat", "Tensor.ints", "Tensor.none"}
KERNEL_STAMP = "onnxsat.kernel"
"""Node metadata key naming the kernel extraction priced the node in (the name of the tensor that
kernel stores; a multi-output node names one per output, joined by ``STAMP_SEPARATOR``): the
lowering fuses no two nodes whose stamps differ."""
STAMP_SEPARATOR = "\n"
"""Between a multi-output node's per-output kernels in its stamp (tensor names may hold commas)."""


@dataclass(frozen=True)
class Ref:
    """A reference to an e-class (a tensor or list argument)."""

    eclass: str


@dataclass(frozen=True)
class ENode:
    """One choice: constructor name and arguments (``Ref`` for e-classes, literals as Python values)."""

    op: str
    args: tuple[Any, ...]
    children: tuple[str, ...] = field(init=False, compare=False, repr=False)
    """The e-classes among ``args``, in order (computed once: extraction reads them constantly)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", tuple(a.eclass for a in self.args if isinstance(a, Ref)))


@dataclass
class SerializedEGraph:
    """E-classes with their candidate e-nodes and per-class analysis values."""

    classes: dict[str, list[ENode]]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, int] = field(default_factory=dict)
    origins: dict[str, int] = field(default_factory=dict)
    """E-class -> smallest original tensor index in it (from ``tensor_ref`` markers)."""
    roots: dict[int, str] = field(default_factory=dict)
    """Graph output index -> its e-class."""

    def num_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())


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
    kernels: dict[str, str] = field(default_factory=dict)
    """E-class -> the e-class whose result its kernel stores (``extract.kernel_plan``): the fusion
    extraction priced, written onto the exported nodes as ``KERNEL_STAMP`` for the lowering. Empty
    for a cost model of another runtime."""

    def choice(self) -> dict[str, ENode]:
        return dict(self.nodes)
