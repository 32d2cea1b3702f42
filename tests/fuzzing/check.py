"""The fuzz property, and the check that a generated model is usable at all.

``validate(case)`` says why a generated model is unusable (the checker or onnxruntime refuses
it, or its outputs are not the shapes the generator tracked: generator mistakes, discarded).
``check_case(case, extractor)`` runs ``onnxsat.optimize`` and lists what is wrong with the result:
it raised, lost or renamed an input or output, or computes something else than the original on
onnxruntime (the pipeline's own check, at batch sizes 1 and 3 when the model has the symbolic
batch dim). A failure of the pipeline's check is a bug too (a wrong rule or exporter), so the
property compares itself instead of letting ``optimize`` refuse.

Speed: ``optimize`` declares its model's rules into an e-graph once per rule subset and process
and reuses it (``onnxsat.egraph.warm``); ``warm=False`` drops the idle ones first, so the call
declares its rules into a fresh e-graph (slower).
"""

from __future__ import annotations

import onnx

import onnxsat
from onnxsat.base.report import Report
from onnxsat.cli import EXTRACTORS
from onnxsat.verification import compare_models, make_inputs, run_ort

from .builder import BATCH, NP_TYPES, FuzzCase, concrete

__all__ = ["EXTRACTORS", "check_case", "validate"]
BATCH_SIZES = (1, 3)
"""Sizes the symbolic batch dim is run at."""


def _batches(model: onnx.ModelProto) -> tuple[int, ...]:
    symbolic = any(d.dim_param == BATCH for vi in model.graph.input for d in vi.type.tensor_type.shape.dim)
    return BATCH_SIZES if symbolic else BATCH_SIZES[:1]


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def validate(case: FuzzCase) -> str | None:
    """Why the generated model is unusable (a generator mistake), or None when it is valid."""
    try:
        onnx.checker.check_model(case.model, full_check=True)
    except Exception as exc:
        return f"checker: {_line(exc)}"
    for batch in _batches(case.model):
        try:
            results = run_ort(case.model, make_inputs(case.model, 0, {BATCH: batch}))
        except Exception as exc:
            return f"onnxruntime: {_line(exc)}"
        for name, (dims, dtype) in case.expected.items():
            got = results[name]
            if tuple(got.shape) != concrete(dims, batch) or got.dtype != NP_TYPES[dtype]:
                return f"output {name}: onnxruntime gives {got.dtype}{list(got.shape)}, expected {list(dims)}"
    return None


def check_case(case: FuzzCase, extractor: str, *, warm: bool = True) -> tuple[list[str], Report | None]:
    """The fuzz property: what is wrong with ``optimize``'s result (empty: nothing), and its report."""
    model = case.model
    if not warm:
        from onnxsat.egraph.warm import forget

        forget()
    options = onnxsat.Options(extractor=extractor, verify=False, ilp_time_limit=5.0)
    try:
        out, report = onnxsat.optimize(model, options)
    except Exception as exc:
        return [f"optimize raised {_line(exc)}"], None
    problems = []
    for what in ("input", "output"):
        before, after = ([v.name for v in getattr(m.graph, what)] for m in (model, out))
        if before != after:
            problems.append(f"{what}s {after} != {before}")
    for batch in _batches(model):
        result = compare_models(model, out, seeds=options.verify_seeds, dim_values={BATCH: batch})
        if result.skipped_reason:
            problems.append(f"comparison skipped: {result.skipped_reason}")
        problems += [
            f"output {c.name} (batch {batch}): {c.detail or 'differs'} (max abs err {c.max_abs_err:.3g})"
            for c in result.failures()
        ]
    return problems, report
