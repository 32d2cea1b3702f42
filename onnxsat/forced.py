"""Forced extraction for ablations: one saturated e-graph, several programs with chosen e-nodes pinned.

``Saturated.of(model, options)`` imports and saturates once; ``extract`` then runs the normal
extractor on a copy of the e-graph whose pinned e-classes hold only the chosen e-node
(``onnxsat.extract.pinning``), and exports and folds the result the way ``onnxsat.optimize``
does, so a forced merge is measured as the real pipeline would write it. Every model returned
has been checked against the original on onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from onnxsat.base.errors import VerificationError
from onnxsat.base.modelio import check_model_full, serialized_size
from onnxsat.base.options import Options
from onnxsat.base.report import SaturationReport
from onnxsat.egraph.exporter import to_onnx
from onnxsat.egraph.fold import fold_constants
from onnxsat.egraph.graph_types import ENode, ExtractedGraph, SerializedEGraph
from onnxsat.egraph.importer import from_onnx
from onnxsat.egraph.program import Program
from onnxsat.extract.cost import CostModel
from onnxsat.extract.greedy import extract_greedy
from onnxsat.extract.pinning import Merge, find_merges, pin
from onnxsat.extract.serialized import serialize
from onnxsat.pipeline import compare, cost_model
from onnxsat.rules.partial import PartialRecord, apply_site_rules
from onnxsat.rules.schedule import saturate, select_rules


@dataclass
class Saturated:
    """A model's saturated e-graph, serialized once, ready for any number of pinned extractions."""

    model: onnx.ModelProto
    options: Options
    program: Program
    egraph: SerializedEGraph
    roots: list[str]
    saturation: SaturationReport
    partial: list[PartialRecord] = field(default_factory=list)
    """The per-site stage's records (PET-verified sites unioned before saturation, as in ``optimize``)."""

    @classmethod
    def of(cls, model: onnx.ModelProto, options: Options | None = None) -> Saturated:
        """Import ``model``, run the per-site stage and saturate, with the rules and budgets of ``options``."""
        options = options or Options()
        enabled = select_rules(options.rules_only, options.disable_rules, options.enable_rules)
        program = from_onnx(model, {k: list(v) for k, v in options.input_shapes.items()})
        partial = apply_site_rules(program, enabled)
        report = saturate(program, options.budgets, enabled)
        egraph = serialize(program.egraph)
        roots = [egraph.roots[i] for i in range(len(program.outputs))]
        return cls(model, options, program, egraph, roots, report, partial)

    def merges(self) -> list[Merge]:
        """The multi-pattern merges reachable from the outputs."""
        return find_merges(self.egraph, self.roots)

    def merged_weights(self, merge: Merge) -> tuple[str, ...]:
        """The original weight names of a merge's siblings, in part order (how people name a merge)."""
        weight_of = {n.output[0]: n.input[1] for n in self.model.graph.node if len(n.input) > 1}
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
        cost = cost or cost_model(self.options)
        eg = pin(self.egraph, pins) if pins else self.egraph
        graph = extract_greedy(eg, cost, self.roots)
        exported = to_onnx(
            self.program,
            graph,
            allow_contrib_ops=self.options.allow_contrib_ops,
            upgrade_opset=self.options.upgrade_opset,
        )
        model, _ = fold_constants(
            exported, serialized_size(self.model), materialize=self.options.materialize_constants
        )
        check_model_full(model)
        result, _ = compare(self.model, model, self.options)
        bad = next((o for o in result.outputs if not o.ok), None)
        if bad is not None:
            raise VerificationError(bad.name, bad.max_abs_err, bad.detail or "outputs differ")
        if not result.ok:
            raise VerificationError("(all)", float("nan"), result.skipped_reason or "not checked")
        return model, graph
