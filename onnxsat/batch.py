"""``onnxsat batch``: optimize many models, on a process pool or on Ray, resumable, never stopped by one.

``run_batch(inputs, outdir, options)`` finds the models (files, folders searched for ``*.onnx``,
``@list.txt`` files), names one output per model (``OUTDIR/<stem>.onnx``; a stem shared by
several inputs gets a suffix from its input's path, the same on every run), skips the models a
previous run already did (the sidecar ``OUT.onnx.onnxsat.json`` records the input's sha256, the
options' fingerprint and the project version; all three must match and the output must be the
file that run wrote), runs one task per remaining model on an executor (``onnxsat.executors``)
and writes a JSON summary. A model that cannot be loaded, optimized or verified is one entry
with its one-line error; the others go on.

Where bytes travel. The tasks read their model by path and write their output into a staging
folder inside OUTDIR, which the driver renames into place once the task has come back: this
assumes OUTDIR and the inputs are on a filesystem every worker sees (always true on one machine;
on a cluster, a shared filesystem). Without one (``shared_fs=False``, Ray only) the driver puts
each input's bytes in the object store once and the task returns the written files' bytes,
which the driver writes; models with external data need the shared filesystem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsat.base import __version__
from onnxsat.base.errors import BadInputError, OnnxsatError, UnverifiableError, VerificationError, one_line
from onnxsat.base.options import Options
from onnxsat.executors import Executor, ProcessExecutor, SerialExecutor, Task, default_jobs

__all__ = [
    "BatchSummary",
    "ModelJob",
    "ModelResult",
    "SIDECAR_SUFFIX",
    "find_models",
    "options_fingerprint",
    "output_names",
    "optimize_one",
    "run_batch",
]

SIDECAR_SUFFIX = ".onnxsat.json"
"""``OUT.onnx`` + this: what the run that wrote ``OUT.onnx`` was (input hash, options, version)."""
SIDECAR_FORMAT = 1
STAGING_PREFIX = ".onnxsat-staging-"

WRITTEN_STATUSES = ("written", "unchanged", "unverified")
"""Statuses of a model whose output this run wrote."""
OK_STATUSES = ("written", "unchanged", "skipped")

# Options fields that do not change the written model: left out of the fingerprint.
_NOT_FINGERPRINTED = {"progress", "dump_dir", "plugin_cache_dir", "jobs"}


@dataclass
class ModelResult:
    """One model's line of the summary.

    ``status``: written (optimized and written); unchanged (written, but the optimizer kept the
    model as it was); unverified (written without verification, ``--allow-unverified``);
    skipped (a previous run's output is still valid); refused (the optimized model did not match
    the original, or cannot be verified: nothing written); failed (the model could not be read or
    optimized, or its worker died twice: nothing written); not-run (the batch was interrupted).
    """

    input: str
    output: str
    status: str
    nodes_before: int | None = None
    nodes_after: int | None = None
    cost_before: float | None = None
    cost_after: float | None = None
    seconds: float | None = None
    verification: str | None = None
    error: str | None = None
    attempts: int = 1
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BatchSummary:
    """What a batch did: one ``ModelResult`` per model, in input order, and the run's settings."""

    models: list[ModelResult]
    outdir: str
    executor: str
    jobs: int
    options_fingerprint: str
    version: str = __version__
    seconds: float = 0.0
    summary_path: str | None = None

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.models:
            counts[m.status] = counts.get(m.status, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def ok(self) -> bool:
        """No model failed or was refused (unverified ones were written on request)."""
        return all(m.status in OK_STATUSES or m.status == "unverified" for m in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "outdir": self.outdir,
            "executor": self.executor,
            "jobs": self.jobs,
            "options_fingerprint": self.options_fingerprint,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "models": [m.to_dict() for m in self.models],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# planning: which models, which outputs, which are done already


def find_models(inputs: Iterable[str | Path], *, exclude: Path | None = None) -> list[Path]:
    """Files as given; folders searched (recursively, hidden folders skipped) for ``*.onnx``;
    ``@FILE`` a list of paths, one per line (blank lines and ``#`` comments skipped; relative
    paths are relative to the list file's folder). Folder searches leave out ``exclude`` (the
    output folder); a path named twice counts once. Raises ``BadInputError`` for a list file
    that cannot be read; a missing model path is kept and fails as that model's entry."""
    found: list[Path] = []
    for item in inputs:
        text = str(item)
        if text.startswith("@"):
            listing = Path(text[1:])
            try:
                lines = listing.read_text(encoding="utf-8").splitlines()
            except OSError as e:
                raise BadInputError(f"list file {listing}: {e.strerror or one_line(e)}") from e
            entries = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
            found += find_models([listing.parent / e for e in entries], exclude=exclude)
        elif Path(text).is_dir():
            for path in sorted(Path(text).rglob("*.onnx")):
                rel = path.relative_to(text).parts
                if any(part.startswith(".") for part in rel[:-1]):
                    continue
                if exclude is not None and _inside(path, exclude):
                    continue
                if path.is_file():
                    found.append(path)
        else:
            found.append(Path(text))
    seen: dict[str, Path] = {}
    for path in found:
        seen.setdefault(os.path.realpath(path), path)
    return list(seen.values())


def _inside(path: Path, folder: Path) -> bool:
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(folder))
    except ValueError:
        return False
    return True


def output_names(inputs: Sequence[Path]) -> list[str]:
    """``<stem>.onnx`` per input; where stems clash, the input first in path order keeps it and the
    others get ``<stem>-<8 hex of their real path's sha1>.onnx``: the same names on every run."""
    by_stem: dict[str, list[str]] = {}
    for path in inputs:
        by_stem.setdefault(path.stem, []).append(os.path.realpath(path))
    names = []
    for path in inputs:
        real = os.path.realpath(path)
        if sorted(by_stem[path.stem])[0] == real:
            names.append(f"{path.stem}.onnx")
        else:
            names.append(f"{path.stem}-{hashlib.sha1(real.encode()).hexdigest()[:8]}.onnx")
    return names


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def input_digest(path: Path) -> str:
    """sha256 of the model file and of every external-data file its main graph names (sorted):
    the weights changing counts as the input changing."""
    import onnx

    digest = hashlib.sha256(_sha256_file(path).encode())
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:  # not a model: its own bytes are all there is to hash (it fails later)
        return digest.hexdigest()
    locations = sorted(
        {
            e.value
            for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for e in t.external_data
            if e.key == "location"
        }
    )
    for location in locations:
        data = path.parent / location
        digest.update(location.encode() + b"\0")
        digest.update(_sha256_file(data).encode() if data.is_file() else b"missing")
    return digest.hexdigest()


def _file_digest(path: str) -> str:
    p = Path(path)
    return _sha256_file(p) if p.is_file() else "missing"


def options_fingerprint(options: Options, *, external_data: bool = False) -> str:
    """sha256 of everything that decides the written model: the options (less progress, dump and
    cache folders, and jobs), the contents of the rule, cost-profile and sample files they name,
    and the installed rule plugins (name and distribution version)."""
    from importlib import metadata

    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    data = {k: v for k, v in fields.items() if k not in _NOT_FINGERPRINTED}
    data = json.loads(json.dumps(_plain(data), sort_keys=True, default=repr))
    data["external_data"] = external_data
    data["files"] = {
        p: _file_digest(p)
        for p in (
            *options.rule_files,
            *options.verify_inputs,
            *([options.cost_profile] if options.cost_profile else []),
        )
    }
    if options.entry_point_plugins:
        data["entry_points"] = sorted(
            f"{ep.name}={ep.value}@{ep.dist.version if ep.dist else '?'}"
            for ep in metadata.entry_points(group="onnxsat.rules")
        )
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def sidecar_path(output: Path) -> Path:
    return output.with_name(output.name + SIDECAR_SUFFIX)


def _previous(output: Path, digest: str, fingerprint: str) -> dict[str, Any] | None:
    """The sidecar's record when it says ``output`` is this input under these options and this
    version, and ``output`` is still the file it wrote; else None (the model is redone)."""
    try:
        record = json.loads(sidecar_path(output).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != SIDECAR_FORMAT:
        return None
    if (record.get("input_sha256"), record.get("options_fingerprint"), record.get("version")) != (
        digest,
        fingerprint,
        __version__,
    ):
        return None
    if not output.is_file() or _sha256_file(output) != record.get("output_sha256"):
        return None
    return record


# ---------------------------------------------------------------------------------------------
# one model (runs in a worker)


@dataclass(frozen=True)
class ModelJob:
    """What a worker needs to optimize one model. ``staging``: a folder on the shared filesystem
    to write the output into (None: return the written files' bytes). ``crash_once_marker``: a
    test hook that makes the worker process exit on its first attempt (the marker file records
    the attempt), to exercise the executors' retries."""

    input: str
    output: str
    options: Options
    external_data: bool = False
    staging: str | None = None
    crash_once_marker: str | None = None


def optimize_one(job: ModelJob, input_bytes: bytes | None = None) -> dict[str, Any]:
    """Optimize ``job.input`` (or ``input_bytes``, its contents shipped to a worker without the
    shared filesystem); returns a plain dict: the result fields, and where the output is (a staged
    path or the files' bytes). Any error becomes the result's ``error``: never raises for a model."""
    if job.crash_once_marker is not None and not os.path.exists(job.crash_once_marker):
        Path(job.crash_once_marker).write_text(str(os.getpid()))
        os._exit(70)
    start = time.perf_counter()
    result: dict[str, Any] = {"status": "failed"}
    with contextlib.ExitStack() as stack:
        try:
            source = job.input
            if input_bytes is not None:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="onnxsat-in-"))
                source = os.path.join(tmp, Path(job.input).name)
                Path(source).write_bytes(input_bytes)
            result.update(_optimize_file(job, source, stack))
        except (VerificationError, UnverifiableError) as e:
            result.update(status="refused", error=one_line(e))
        except OnnxsatError as e:
            result.update(status="failed", error=one_line(e))
        except Exception as e:  # an internal error is this model's failure, not the batch's
            result.update(status="failed", error=f"internal error: {type(e).__name__}: {one_line(e)}")
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def _optimize_file(job: ModelJob, source: str, stack: contextlib.ExitStack) -> dict[str, Any]:
    from onnxsat.base.modelio import check_output_path
    from onnxsat.file_run import load_checked, optimize_loaded, write_result

    final = Path(job.output)
    if job.staging is not None:
        check_output_path(final, source)
        staged = Path(tempfile.mkdtemp(prefix="m-", dir=job.staging)) / final.name
    else:
        staged = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnxsat-out-"))) / final.name
    options = _one_process(job.options)
    loaded = load_checked(source, final, options, external_data=job.external_data)
    optimized, report = optimize_loaded(loaded, options)
    fields: dict[str, Any] = {
        "nodes_before": report.total_before,
        "nodes_after": report.total_after,
        "cost_before": report.cost_before,
        "cost_after": report.cost_after,
        "verification": report.verification.status,
        "warnings": list(report.warnings),
    }
    if report.verification.status == "failed":
        detail = f" ({report.verification.detail})" if report.verification.detail else ""
        return fields | {"status": "refused", "error": f"optimized model does not match the original{detail}"}
    write_result(
        optimized,
        report,
        staged,
        external_data=job.external_data,
        input_path=source,
        loaded_at=loaded.loaded_at,
    )
    unchanged = bool(report.kept_original) or (
        report.nodes_before == report.nodes_after and report.cost_after >= report.cost_before
    )
    status = (
        "unverified"
        if report.verification.status == "unverified"
        else "unchanged"
        if unchanged
        else "written"
    )
    files = [staged] + (
        [staged.with_name(staged.name + ".data")] if staged.with_name(staged.name + ".data").exists() else []
    )
    fields |= {"status": status, "report": report.to_dict()}
    if job.staging is not None:
        return fields | {"staged": [str(p) for p in files]}
    return fields | {"files": {p.name: p.read_bytes() for p in files}}


def _one_process(options: Options) -> Options:
    """Per-model options: no progress bars (the batch has its own), and the model's own work in the
    worker's one process (``Options.jobs`` parallelizes regions; the batch parallelizes models)."""
    return dataclasses.replace(options, progress=False, jobs=1)


# ---------------------------------------------------------------------------------------------
# the batch (runs in the driver)


def run_batch(
    inputs: Sequence[str | Path],
    outdir: str | Path,
    options: Options | None = None,
    *,
    external_data: bool = False,
    executor: Executor | None = None,
    jobs: int | None = None,
    force: bool = False,
    shared_fs: bool = True,
    summary_path: str | Path | None = None,
    on_result: Callable[[ModelResult], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    crash_once_marker: str | None = None,
) -> BatchSummary:
    """Optimize every model ``inputs`` names into ``outdir`` and write the summary JSON
    (``summary_path``, default ``outdir/summary.json``, atomically); returns the summary.

    ``executor``: where the models run (default: a process pool of ``jobs`` workers, default one
    per core up to one per model; ``jobs=1``: in this process). ``force`` redoes models whose
    sidecar says they are done. ``on_plan(n)`` is called with the number of models, ``on_result``
    with each model's result as it comes (skipped ones first). Raises ``BadInputError`` only for
    the batch as a whole (no models, an output folder that cannot be made); a bad model is its entry.
    """
    from onnxsat.file_run import write_text_atomic

    started = time.perf_counter()
    options = options or Options()
    out = Path(outdir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"output folder {out}: {e.strerror or one_line(e)}") from e
    models = find_models(inputs, exclude=out)
    if not models:
        raise BadInputError("no models found (give .onnx files, folders holding them, or @list.txt)")
    summary_file = Path(summary_path) if summary_path is not None else out / "summary.json"
    from onnxsat.base.modelio import check_output_path

    check_output_path(summary_file)  # a summary that cannot be written fails now, not at the end
    fingerprint = options_fingerprint(options, external_data=external_data)
    outputs = [out / name for name in output_names(models)]
    results: list[ModelResult | None] = [None] * len(models)
    digests: dict[int, str] = {}
    if on_plan is not None:
        on_plan(len(models))

    todo: list[int] = []
    for i, (model, output) in enumerate(zip(models, outputs, strict=True)):
        try:
            digests[i] = input_digest(model)
        except OSError as e:
            results[i] = ModelResult(
                str(model), str(output), "failed", error=f"{model}: {e.strerror or one_line(e)}"
            )
            continue
        previous = None if force else _previous(output, digests[i], fingerprint)
        if previous is None:
            todo.append(i)
            continue
        results[i] = dataclasses.replace(
            _result_from(previous.get("result", {}), str(model), str(output)), status="skipped", seconds=0.0
        )
    for r in results:
        if r is not None and on_result is not None:
            on_result(r)

    own_executor = executor is None
    if executor is None:
        workers = jobs if jobs is not None else default_jobs(len(todo))
        executor = SerialExecutor() if workers <= 1 else ProcessExecutor(workers)
    else:  # the caller's executor: its own pool size (0 where it has none, as on Ray)
        workers = getattr(executor, "jobs", 0)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out)) if shared_fs else None
    summary = BatchSummary(
        [], str(out), type(executor).__name__, workers, fingerprint, summary_path=str(summary_file)
    )
    try:
        tasks = []
        for i in todo:
            job = ModelJob(
                str(models[i]),
                str(outputs[i]),
                options,
                external_data=external_data,
                staging=None if staging is None else str(staging),
                crash_once_marker=crash_once_marker,
            )
            shipped = None
            if not shared_fs:
                data = _read_self_contained(models[i])
                if data is None:
                    refused = ModelResult(
                        str(models[i]),
                        str(outputs[i]),
                        "failed",
                        error="cannot be shipped to a worker: it keeps weights in other files, or cannot be"
                        " read (needs the shared filesystem)",
                    )
                    results[i] = refused
                    if on_result is not None:
                        on_result(refused)
                    continue
                shipped = executor.share(data)
            tasks.append(Task(i, optimize_one, (job, shipped)))
        for done in executor.run(tasks):
            i = done.key
            if done.ok:
                result = _finish(done.value, models[i], outputs[i], digests[i], fingerprint)
            else:
                result = ModelResult(str(models[i]), str(outputs[i]), "failed", error=done.error)
            result.attempts = done.attempts
            results[i] = result
            if on_result is not None:
                on_result(result)
    finally:
        if own_executor:
            executor.close()
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        summary.models = [
            r if r is not None else ModelResult(str(m), str(o), "not-run")
            for r, m, o in zip(results, models, outputs, strict=True)
        ]
        summary.seconds = time.perf_counter() - started
        write_text_atomic(summary_file, summary.to_json() + "\n")
    return summary


def _read_self_contained(path: Path) -> bytes | None:
    """The bytes of a model file to ship to a worker without the shared filesystem; None (the
    task then fails with a clear message) when the model keeps weights in other files."""
    import onnx

    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        model = onnx.load_model_from_string(data)
    except Exception:
        return data  # not a model: the task reports why
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return None
    return data


def _result_from(record: dict[str, Any], input_path: str, output: str) -> ModelResult:
    names = {f.name for f in dataclasses.fields(ModelResult)}
    kept = {k: v for k, v in record.items() if k in names and k not in ("input", "output", "status")}
    return ModelResult(input_path, output, record.get("status", "failed"), **kept)


def _finish(
    value: dict[str, Any],
    model: Path,
    output: Path,
    digest: str,
    fingerprint: str,
) -> ModelResult:
    """Put a task's output in place (rename the staged files, or write the returned bytes, each
    atomically; the weights sidecar before the model) and record the sidecar."""
    from onnxsat.file_run import write_bytes_atomic, write_text_atomic

    result = _result_from(value, str(model), str(output))
    if result.status not in WRITTEN_STATUSES:
        if result.error is None and value.get("status") is None:
            result.error = "the task returned no status"
        return result
    try:
        if "staged" in value:
            staged = [Path(p) for p in value["staged"]]
            for src in sorted(staged, key=lambda p: not p.name.endswith(".data")):
                os.replace(src, output.with_name(src.name))
        else:
            files: dict[str, bytes] = value["files"]
            for name in sorted(files, key=lambda n: not n.endswith(".data")):
                write_bytes_atomic(output.with_name(name), files[name])
        record = {
            "format": SIDECAR_FORMAT,
            "input": str(model),
            "input_sha256": digest,
            "options_fingerprint": fingerprint,
            "version": __version__,
            "output_sha256": _sha256_file(output),
            "result": result.to_dict(),
            "report": value.get("report"),
        }
        write_text_atomic(sidecar_path(output), json.dumps(record, indent=2, sort_keys=True) + "\n")
    except (OSError, OnnxsatError) as e:
        return dataclasses.replace(result, status="failed", error=f"cannot write {output}: {one_line(e)}")
    return result
