"""Forced extraction for ablations: one saturated e-graph, several programs with chosen e-nodes pinned.

``Saturated.of(model, options)`` loads and saturates once (a ``Session``); ``extract`` then runs
the session's extract stage with the pinned e-classes holding only the chosen e-node
(``onnxsat.extract.pinning``), and its export and verify stages, so a forced merge is measured
as the real pipeline would write it. Every model returned has been checked against the original
on onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from onnxsat.base.errors import VerificationError
from onnxsat.base.options import Options
from onnxsat.base.report import SaturationReport
from onnxsat.egraph.graph_types import ENode, ExtractedGraph, SerializedEGraph
from onnxsat.egraph.program import Program
from onnxsat.extract.cost import CostModel
from onnxsat.extract.pinning import Merge, find_merges
from onnxsat.pipeline import Session
from onnxsat.rules.pet.partial import PartialRecord


@dataclass
class Saturated:
    """A model's saturated e-graph, serialized once, ready for any number of pinned extractions."""

    session: Session

    @classmethod
    def of(cls, model: onnx.ModelProto, options: Options | None = None) -> Saturated:
        """Load ``model``, run the per-site stage and saturate, with the rules and budgets of ``options``."""
        session = Session(model, options)
        session.saturate()
        return cls(session)

    @property
    def model(self) -> onnx.ModelProto:
        return self.session.model

    @property
    def options(self) -> Options:
        return self.session.options

    @property
    def program(self) -> Program:
        assert self.session.program is not None
        return self.session.program

    @property
    def egraph(self) -> SerializedEGraph:
        return self.session.saturated()

    @property
    def roots(self) -> list[str]:
        return self.session.roots()

    @property
    def saturation(self) -> SaturationReport:
        assert self.session.saturation is not None
        return self.session.saturation

    @property
    def partial(self) -> list[PartialRecord]:
        """The per-site stage's records (PET-verified sites unioned before saturation, as in ``optimize``)."""
        return self.session.partial

    def merges(self) -> list[Merge]:
        """The multi-pattern merges reachable from the outputs."""
        return find_merges(self.egraph, self.roots)

    def merged_weights(self, merge: Merge) -> tuple[str, ...]:
        """The original weight names of a merge's siblings, in part order (how people name a merge)."""
        weight_of = {n.output[0]: n.input[1] for n in self.session.source().graph.node if len(n.input) > 1}
        names = []
        for eclass, _ in merge.parts:
            origin = self.egraph.origins.get(eclass)
            tensor = self.program.names[origin] if origin is not None and origin < len(self.program.names) else eclass
            names.append(weight_of.get(tensor, tensor))
        return tuple(names)

    def label(self, merge: Merge) -> str:
        """E.g. ``conv(branch1x1 + branch3x3_reduce)``."""
        parts = [w.removesuffix(".weight").removesuffix(".weight_t") for w in self.merged_weights(merge)]
        return f"{merge.op}({' + '.join(parts)})"

    def extract(
        self, pins: Mapping[str, ENode] | None = None, cost: CostModel | None = None
    ) -> tuple[onnx.ModelProto, ExtractedGraph]:
        """Extract with ``pins`` forced (greedy-DAG under ``cost``, the options' target by default),
        export, fold, and check against the original on onnxruntime (raises on a mismatch)."""
        graph = self.session.extract(extractor="greedy-dag", cost=cost, pins=pins)
        model = self.session.export(graph)
        summary = self.session.verify(model, name_culprits=False)
        if summary.status == "unverified":
            raise VerificationError("(all)", float("nan"), summary.detail)
        return model, graph
