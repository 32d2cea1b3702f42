"""Optimizing one model file: the steps ``onnxsat optimize`` and each model of ``onnxsat batch`` share.

``load_checked`` does everything that can fail fast (output paths, the dump folder, the cost
profile, loading and checking the model, ``--input-shape`` pins, the verification samples) so a
bad input costs seconds, not a saturation run; ``optimize_loaded`` runs the optimizer with the
command line's warning policy and timings; ``write_result`` writes the model atomically.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxsat.base.errors import BadInputError, one_line
from onnxsat.base.options import Options
from onnxsat.base.report import Report

__all__ = [
    "Loaded",
    "check_input_shapes",
    "load_checked",
    "optimize_loaded",
    "write_result",
    "write_text_atomic",
]


@dataclass
class Loaded:
    """A model read and checked for one run, with the files it was read from."""

    model: onnx.ModelProto
    sources: frozenset[Path]
    loaded_at: float
    """``time.perf_counter()`` when the model was read."""
    samples_seconds: float = 0.0


def check_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Reject ``--input-shape`` pins that name no graph input or contradict its declared shape.

    Done right after loading so a typo costs seconds, not a saturation run.
    """
    initializers = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in initializers}
    for name, dims in shapes.items():
        if name not in inputs:
            known = ", ".join(sorted(inputs)) or "none"
            raise BadInputError(f"--input-shape names '{name}', which is not a graph input (inputs: {known})")
        ttype = inputs[name].type.tensor_type
        if not ttype.HasField("shape"):
            continue  # rank unknown: the pin defines it
        declared = ttype.shape.dim
        if len(declared) != len(dims):
            raise BadInputError(
                f"--input-shape {name}: {len(dims)} dims given, but the input has rank {len(declared)}"
            )
        for axis, (d, pinned) in enumerate(zip(declared, dims, strict=True)):
            if d.HasField("dim_value") and d.dim_value != pinned:
                raise BadInputError(
                    f"--input-shape {name}: dim {axis} is fixed to {d.dim_value} in the model, not {pinned}"
                )


def load_checked(
    input_path: str | Path,
    out_path: Path,
    options: Options,
    *,
    external_data: bool,
    report_path: Path | None = None,
) -> Loaded:
    """Load ``input_path`` for a run writing ``out_path``: everything that can be refused is refused here.

    ``out_path`` must have passed ``modelio.check_output_path``; neither it nor ``report_path`` may
    be a file the model is read from.
    """
    from onnxsat.base.modelio import (
        check_not_an_input,
        check_output_path,
        check_weights_not_overwritten,
        load_model_and_sources,
    )

    if options.dump_dir is not None:  # the dump must not overwrite what is read
        from onnxsat import dump

        try:
            Path(options.dump_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInputError(f"--dump-dir {options.dump_dir}: {exc.strerror or exc}") from exc
        for name in (dump.SATURATION, dump.EXTRACTED, dump.OPTIMIZED, dump.VERIFICATION):
            check_output_path(Path(options.dump_dir) / name, input_path)
    if options.cost_profile is not None:  # a bad profile fails now, not after saturation
        from onnxsat.pipeline import cost_model

        cost_model(options)
    # Large external weights stay in their file (held once, mapped by onnxruntime) unless
    # --measure needs the whole model in memory for its latency sessions.
    model, sources = load_model_and_sources(input_path, lazy=not options.measure)
    check_not_an_input(out_path, sources)
    if report_path is not None:
        check_not_an_input(report_path, sources, what="--report-json path")
    check_weights_not_overwritten(model, out_path, external_data=external_data)
    check_input_shapes(model, options.input_shapes)
    loaded = time.perf_counter()
    if options.verify:  # an unverifiable model or a bad sample file fails now, not after saturation
        from onnxsat.base.errors import UnverifiableError
        from onnxsat.verification_inputs import prepare_samples

        try:
            prepare_samples(model, options)
        except UnverifiableError:
            if not options.allow_unverified:
                raise
    return Loaded(model, sources, loaded, time.perf_counter() - loaded)


def optimize_loaded(loaded: Loaded, options: Options) -> tuple[onnx.ModelProto, Report]:
    """Optimize a loaded model: plugin warnings are left to the report, numpy's RuntimeWarnings
    (overflow, invalid value in folding) to verification, which judges the values."""
    modules = time.perf_counter()  # imported only now: a bad input fails before this fixed cost
    from onnxsat.pipeline import optimize
    from onnxsat.rules.plugins import PluginWarning

    modules_seconds = time.perf_counter() - modules
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        optimized, report = optimize(loaded.model, options)
    report.stage_seconds["samples"] = round(
        loaded.samples_seconds, 4
    )  # verification inputs, checked up front
    report.stage_seconds["modules"] = round(modules_seconds, 4)  # the optimizer's own modules imported
    return optimized, report


def write_result(
    optimized: onnx.ModelProto,
    report: Report,
    out_path: Path,
    *,
    external_data: bool,
    input_path: str | Path | None,
    loaded_at: float,
) -> None:
    """Write the optimized model atomically and record the write time and the wall time since load."""
    from onnxsat.base.modelio import save_model_atomic

    written = time.perf_counter()
    save_model_atomic(optimized, out_path, external_data=external_data, input_path=input_path)
    report.stage_seconds["write"] = round(time.perf_counter() - written, 4)
    report.seconds_after_load = round(time.perf_counter() - loaded_at, 4)


def write_text_atomic(path: Path, text: str) -> None:
    """``write_bytes_atomic`` of ``text`` in UTF-8: never a half-written report."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    """Write via a temp file in the same directory, fsync and ``os.replace``: never a half-written file."""
    from onnxsat.base import disk_cache

    disk_cache.sweep_temps(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=disk_cache.temp_name_prefix(path.name), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise BadInputError(f"cannot write {path}: {e.strerror or one_line(e)}") from e
