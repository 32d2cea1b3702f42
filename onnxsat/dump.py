"""``--dump-dir DIR`` (``Options.dump_dir``): each stage of a ``Session`` writes its artefact.

``saturation.json`` (the saturated e-graph's size and the rule report: per phase, per iteration,
matches per rule), ``extracted.json`` (the chosen program: e-class, op and arguments per node,
roots, cost, extractor), ``optimized.onnx`` (the exported, checked model) and
``verification.npz`` (the inputs of the first verification seed and both models' outputs on
them, keys ``input/NAME``, ``original/NAME``, ``optimized/NAME``). A later stage overwrites its
file, so after forced extractions the folder holds the last one. Nothing is written without a
dump folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxsat.base.modelio import save_model_atomic
from onnxsat.egraph.graph_types import ExtractedGraph, Ref

if TYPE_CHECKING:
    from onnxsat.pipeline import Session

SATURATION, EXTRACTED, OPTIMIZED, VERIFICATION = "saturation.json", "extracted.json", "optimized.onnx", "verification.npz"


def _folder(session: Session) -> Path | None:
    if session.options.dump_dir is None:
        return None
    folder = Path(session.options.dump_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    """JSON for what the records hold besides JSON types: e-class references, sets, numpy scalars."""
    if isinstance(value, Ref):
        return {"eclass": value.eclass}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


def saturation(session: Session) -> None:
    """After ``saturate``: e-graph size, the enabled rules and the saturation report."""
    folder = _folder(session)
    if folder is None:
        return
    eg = session.saturated()
    _write_json(
        folder / SATURATION,
        {
            "eclasses": len(eg.classes),
            "enodes": eg.num_nodes(),
            "rules": list(session.rules),
            "saturation": asdict(session.saturation) if session.saturation is not None else None,
        },
    )


def extracted(session: Session, graph: ExtractedGraph) -> None:
    """After ``extract``: the chosen program, one record per node in topological order."""
    folder = _folder(session)
    if folder is None:
        return
    _write_json(
        folder / EXTRACTED,
        {
            "method": graph.method,
            "cost": graph.cost,
            "gap": graph.gap,
            "optimal": graph.optimal,
            "roots": graph.roots,
            "nodes": [
                {"eclass": eclass, "op": node.op, "args": list(node.args), "shape": graph.shapes.get(eclass)}
                for eclass, node in graph.nodes
            ],
        },
    )


def exported(session: Session, model: onnx.ModelProto) -> None:
    """After ``export``: the model as it would be written."""
    folder = _folder(session)
    if folder is not None:
        save_model_atomic(model, folder / OPTIMIZED)


def verification(session: Session, optimized: onnx.ModelProto) -> None:
    """After ``verify``: the first seed's inputs and both models' array outputs on onnxruntime
    (a model onnxruntime cannot run contributes no outputs)."""
    folder = _folder(session)
    if folder is None:
        return
    from onnxsat.verification import inference_session, make_inputs, run_session
    from onnxsat.verification_inputs import pinned_dims

    seed = session.options.verify_seeds[0] if session.options.verify_seeds else 0
    feeds = make_inputs(session.model, seed=seed, dim_values=pinned_dims(session.model, session.options))
    arrays = {f"input/{name}": value for name, value in feeds.items()}
    for label, model in (("original", session.model), ("optimized", optimized)):
        try:
            outputs = run_session(inference_session(model, "disable_all"), feeds)
        except Exception:  # onnxruntime cannot run it (custom-domain ops): inputs only
            continue
        arrays.update({f"{label}/{k}": v for k, v in outputs.items() if isinstance(v, np.ndarray)})
    np.savez(folder / VERIFICATION, **arrays)  # type: ignore[arg-type]
