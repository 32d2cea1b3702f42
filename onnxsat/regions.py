"""Verify models onnxruntime cannot run whole: cut them at their custom-domain nodes.

Opaque nodes are never rewritten, so the original and the optimized model contain the same
custom nodes. Cutting both at those nodes (their outputs become inputs fed with the same random
values, their inputs become extra outputs) leaves regions of standard ops that onnxruntime can
run; comparing every region output, including what each custom node receives, checks all that
was rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from onnxsat.base.weightless import infer_shapes
from onnxsat.verification import (
    OutputCheck,
    VerificationResult,
    compare_values,
    inference_session,
    make_inputs,
    run_session,
)

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass
class _Cut:
    model: onnx.ModelProto
    boundary_inputs: list[str]  # custom node outputs, now graph inputs (in pairing order)
    boundary_outputs: list[str]  # custom node inputs, now graph outputs (in pairing order)


def _runner(model: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], dict[str, Any]]:
    """onnxruntime for a region model, or onnx's numpy reference when onnxruntime lacks an op."""
    try:
        session = inference_session(model, "disable_all")
        return lambda feeds: run_session(session, feeds)
    except Exception:
        reference = ReferenceEvaluator(model)
        names = [o.name for o in model.graph.output]
        wanted = {i.name for i in model.graph.input}
        return lambda feeds: dict(
            zip(names, reference.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True)
        )


def _key(node: onnx.NodeProto) -> tuple[str, str, bytes]:
    return node.domain, node.op_type, b"".join(a.SerializeToString() for a in node.attribute)


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's custom-domain nodes, in a canonical order (the cut points)."""
    nodes = [n for n in model.graph.node if n.domain not in STANDARD_DOMAINS]
    return sorted(nodes, key=_key)


def _cut(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> _Cut:
    custom = custom_nodes(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    custom_ids = {id(n) for n in custom}
    kept = [n for n in model.graph.node if id(n) not in custom_ids]
    del graph.node[:]
    graph.node.extend(kept)
    boundary_inputs: list[str] = []
    boundary_outputs: list[str] = []
    for node in custom:
        for name in node.output:
            if name:
                graph.input.append(onnx.helper.make_value_info(name, types[name]))
                boundary_inputs.append(name)
        for j, name in enumerate(node.input):
            if name:
                exposed = f"__onnxsat_region_{len(boundary_outputs)}_{j}"
                graph.node.append(onnx.helper.make_node("Identity", [name], [exposed]))
                graph.output.append(onnx.helper.make_value_info(exposed, onnx.TypeProto()))
                boundary_outputs.append(exposed)
    standard = [o for o in out.opset_import if o.domain in STANDARD_DOMAINS]
    del out.opset_import[:]
    out.opset_import.extend(standard)
    return _Cut(out, boundary_inputs, boundary_outputs)


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = infer_shapes(model, strict_mode=False)  # types only: no weight copies
    infos = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    return {vi.name: vi.type for vi in infos}


def region_problem(model: onnx.ModelProto) -> str | None:
    """Why ``model`` cannot be checked region by region (a custom-op output of unknown type), or None."""
    types = _value_types(model)
    for node in custom_nodes(model):
        for name in node.output:
            tp = types.get(name)
            if name and (tp is None or not tp.tensor_type.HasField("shape") or not tp.tensor_type.elem_type):
                return f"the type of custom-op output '{name}' is unknown (add value_info)"
    return None


def compare_by_regions(
    original: onnx.ModelProto, optimized: onnx.ModelProto, *, seeds: Sequence[int] = (0, 1)
) -> VerificationResult:
    """Compare two models region by region between their custom-domain nodes."""
    if [_key(n) for n in custom_nodes(original)] != [_key(n) for n in custom_nodes(optimized)]:
        return VerificationResult(
            ok=False, skipped_reason="the custom-domain nodes differ between the models"
        )
    problem = region_problem(original)
    if problem is not None:
        return VerificationResult(ok=False, skipped_reason=problem)
    orig_types = _value_types(original)
    opt_types = _value_types(optimized)
    for node_orig, node_opt in zip(custom_nodes(original), custom_nodes(optimized), strict=True):
        for a, b in zip(node_orig.output, node_opt.output, strict=True):
            if b:
                opt_types[b] = orig_types[a]
    a_cut, b_cut = _cut(original, orig_types), _cut(optimized, opt_types)
    names = [o.name for o in original.graph.output]
    worst: dict[str, OutputCheck] = {}
    run_a, run_b = _runner(a_cut.model), _runner(b_cut.model)
    for seed in seeds:
        feeds = make_inputs(a_cut.model, seed)
        other = dict(feeds)
        for a, b in zip(a_cut.boundary_inputs, b_cut.boundary_inputs, strict=True):
            other[b] = other.pop(a) if a != b else feeds[a]
        ref, got = run_a(feeds), run_b(other)
        pairs = [(n, n, n) for n in names]
        pairs += [
            (f"input of custom node ({a})", a, b)
            for a, b in zip(a_cut.boundary_outputs, b_cut.boundary_outputs, strict=True)
        ]
        for label, a, b in pairs:
            check = compare_values(label, np.asarray(ref[a]), np.asarray(got[b]))
            old = worst.get(label)
            worst[label] = (
                check if old is None or (not check.ok or check.max_abs_err > old.max_abs_err) else old
            )
    checks = list(worst.values())
    return VerificationResult(ok=all(c.ok for c in checks), outputs=checks)
