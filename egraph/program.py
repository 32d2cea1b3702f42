"""``Program``: an e-graph plus the side tables that import fills and export reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx
from egglog import EGraph, Ruleset

from . import lang as L


class TensorRefs(Mapping[str, Any]):
    """Original tensor name -> its ``tensor_ref`` marker as an egglog expression, built on access
    (the import itself writes egglog commands, ``egraph.commands``; expressions are for callers
    that query the e-graph through egglog's Python API)."""

    def __init__(self, indices: Mapping[str, int]):
        self._indices = indices

    def __getitem__(self, name: str) -> Any:
        return L.tensor_ref(self._indices[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


@dataclass
class OpaqueNode:
    """An unmodelled node kept verbatim; its TList holds real inputs then captured outer names."""

    node: onnx.NodeProto
    n_inputs: int
    captured: list[str]


@dataclass
class TensorInfo:
    """What ONNX shape inference said about a tensor (dims: >= 0 known, < 0 symbolic)."""

    dtype: int | None
    dims: tuple[int, ...] | None


@dataclass
class Program:
    """Everything between import and export.

    ``names[i]`` is the original tensor with origin index ``i``; ``outputs`` are the graph
    outputs in order, each with the term that computes it.
    """

    egraph: EGraph
    model: onnx.ModelProto
    opset: int
    outputs: list[tuple[str, L.Tensor]]
    names: list[str]
    weights: dict[str, onnx.TensorProto]
    opaque: dict[int, OpaqueNode]
    symbols: dict[int, str]
    true_inputs: list[str]
    overridable: set[str]
    node_meta: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    """First output name -> (op_type, node name, doc_string) of original nodes."""
    unknown_ops: Counter[str] = field(default_factory=Counter)
    opaque_reasons: Counter[str] = field(default_factory=Counter)
    terms: Mapping[str, Any] = field(default_factory=dict)
    """Original tensor name -> its ``tensor_ref`` expression (``TensorRefs``)."""
    infos: dict[str, TensorInfo] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    selection: Any = None
    """The rules declared for this program (``egraph.reach.Selection``); None: every enabled rule."""

    def analysis(self) -> Ruleset:
        """The analysis ruleset of this program: its selection's rules that can match on the e-graph
        as it is now (``egraph.live``), else every analysis rule."""
        from .shapes import analysis_ruleset

        if self.selection is None:
            return analysis_ruleset()
        from .live import live_analysis
        from .reach import present_symbols

        return live_analysis(self.selection.analysis_rules, present_symbols(self.egraph))  # type: ignore[return-value]

    def node_count(self) -> int:
        return sum(n for _, n in self.egraph.all_function_sizes())
