"""The original model's run on the verification inputs, before or beside the rewrite.

``prepare_reference`` runs it in line (and checks the user's samples); ``in_background`` runs it on
a thread of its own at a lower priority while the model is rewritten (``Session.start_reference``);
``unverifiable_reason`` decides whether a model onnxruntime cannot run whole may still go on.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import onnx

from onnxsat.base.errors import UnverifiableError
from onnxsat.base.options import Options
from onnxsat.base.report import Report
from onnxsat.verification import Reference, reference_run
from onnxsat.verification_inputs import pinned_dims, prepare_samples


def prepare_reference(model: onnx.ModelProto, options: Options, samples: list[dict[str, Any]] | None = None) -> Reference | str:
    """Before any rewriting: check that the result can be verified and run the original once on
    the verification inputs (the user's ``samples``, checked here when None, else generated ones),
    so a model that cannot be checked fails early (`UnverifiableError`, exit 2) instead of after
    saturation. Returns the reason instead where `unverifiable_reason` lets the run go on."""
    try:
        if samples is None:
            samples = prepare_samples(model, options)
        dims = pinned_dims(model, options)
        return reference_run(model, seeds=options.verify_seeds, dim_values=dims, samples=samples)
    except UnverifiableError as exc:
        return unverifiable_reason(model, options, exc)


def unverifiable_reason(model: onnx.ModelProto, options: Options, exc: UnverifiableError) -> str:
    """The reason the whole original cannot be run, where the run may go on: it may still be checked
    region by region between its custom-domain nodes, or ``allow_unverified`` lets it through;
    otherwise ``exc`` is raised."""
    from onnxsat.regions import custom_nodes, region_problem

    if options.allow_unverified:
        return exc.reason
    if not custom_nodes(model):
        raise exc
    problem = region_problem(model)
    if problem is not None:
        raise UnverifiableError(f"{exc.reason}; region by region: {problem}") from exc
    return exc.reason


def _lower_priority() -> None:
    """Give the calling thread a nice value of 10 where the system allows one per thread (Linux)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def in_background(
    model: onnx.ModelProto, options: Options, samples: list[dict[str, Any]], report: Report
) -> Future[Reference | str]:
    """`prepare_reference` on a thread of its own; its wall time goes to ``report.background_seconds``."""

    def run() -> Reference | str:
        start = time.perf_counter()
        _lower_priority()  # onnxruntime's threads, made by this one, inherit it
        try:
            return prepare_reference(model, options, samples)
        finally:
            report.background_seconds["reference"] = round(time.perf_counter() - start, 4)

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxsat-reference")
    try:
        return executor.submit(run)
    finally:
        executor.shutdown(wait=False)  # the thread ends with its run
