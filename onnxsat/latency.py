"""Honest latency comparison of two runnables: interleaved rounds and a bootstrap confidence interval.

Machines here are shared and noisy, so a single timing of each side proves nothing. Rounds
alternate A and B (the order flips each round, so drift hits both sides alike), each round times
a few calls and keeps their median, and the speed-up of B over A is the ratio of the medians over
rounds, with a percentile-bootstrap 95% interval. A win needs the whole interval above 1.02, a
loss below 0.98; anything else is a tie.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort

from onnxsat.base import lazy_weights, modelio, weightless

WIN, LOSS = 1.02, 0.98
Verdict = Literal["win", "loss", "tie"]
Level = Literal["disable", "basic", "extended", "all"]
_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class LatencyComparison:
    """Medians in milliseconds; ``ratio`` = baseline / candidate (above 1: the candidate is faster)."""

    baseline_ms: float
    candidate_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    rounds: int

    @property
    def verdict(self) -> Verdict:
        if self.ci_low > WIN:
            return "win"
        if self.ci_high < LOSS:
            return "loss"
        return "tie"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}

    def __str__(self) -> str:
        return (
            f"{self.baseline_ms:.3f} ms -> {self.candidate_ms:.3f} ms, x{self.ratio:.3f} "
            f"[95% CI {self.ci_low:.3f}, {self.ci_high:.3f}] over {self.rounds} rounds: {self.verdict}"
        )


def bootstrap_ratio_ci(
    baseline: np.ndarray, candidate: np.ndarray, *, resamples: int = 2000, seed: int = 0, block: int = 1
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(baseline) / median(candidate), resampling rounds,
    or runs of ``block`` consecutive rounds where they share a state that moves the times (rounds
    timed by the same processes: resampling them one by one would take one draw of the processes'
    memory layout for ``block`` independent ones and make the interval too narrow)."""
    rng = np.random.default_rng(seed)
    n = len(baseline)
    starts = np.arange(0, n, block)
    chosen = rng.choice(starts, size=(resamples, len(starts)))
    idx = (chosen[:, :, None] + np.arange(block)).reshape(resamples, -1)
    idx = np.where(idx < n, idx, chosen.repeat(block, axis=1))  # a short last run repeats its first round
    ratios = np.median(baseline[idx], axis=1) / np.median(candidate[idx], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def block_median(fn: Callable[[], object], calls: int, *, settle_s: float = 0.0, untimed: int = 0) -> float:
    """Median seconds of ``calls`` timed calls of ``fn``, after a pause of ``settle_s`` and
    ``untimed`` calls (one timing block of an interleaved comparison)."""
    if settle_s > 0:
        time.sleep(settle_s)
    for _ in range(untimed):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def compare_latency(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    rounds: int = 30,
    calls_per_round: int = 5,
    warmup: int = 3,
    seed: int = 0,
    settle_s: float = 0.0,
) -> LatencyComparison:
    """Time ``baseline`` and ``candidate`` in interleaved rounds; see the module docstring.

    ``settle_s``: for two different runtimes in one process, each side's block starts after an
    untimed pause of this length and one untimed call, so it is not timed while the other runtime's
    worker threads still spin after their last call (onnxruntime's and OpenBLAS's spin for
    milliseconds; on two cores that halves the other side's threads), and runs as it would alone.
    """
    if rounds < 2:
        raise ValueError("rounds must be at least 2")
    for _ in range(warmup):
        baseline()
        candidate()
    times = np.empty((2, rounds))
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for side in order:
            fn = baseline if side == 0 else candidate
            times[side, r] = block_median(fn, calls_per_round, settle_s=settle_s, untimed=1 if settle_s > 0 else 0)
    a, b = times * 1e3
    low, high = bootstrap_ratio_ci(a, b, seed=seed)
    return LatencyComparison(
        baseline_ms=float(np.median(a)),
        candidate_ms=float(np.median(b)),
        ratio=float(np.median(a) / np.median(b)),
        ci_low=low,
        ci_high=high,
        rounds=rounds,
    )


THREADS_ENV = "ONNXSAT_ORT_THREADS"
"""Intra-op threads of the sessions that name none: an executor's worker sets it to its task's
share of the cores (``onnxsat.executors``), so two models verified side by side do not each start
a thread per core; unset, onnxruntime's default (every core)."""


def default_threads() -> int | None:
    """``THREADS_ENV`` as a thread count, or None (onnxruntime's default)."""
    value = os.environ.get(THREADS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def ort_session(
    model: onnx.ModelProto,
    *,
    level: Level = "all",
    threads: int | None = None,
    prepacking: bool = True,
    quiet: bool = False,
) -> ort.InferenceSession:
    """A CPU onnxruntime session at the given graph-optimization level (``threads`` intra-op
    threads; None: ``default_threads``).

    Weights still in their file (``onnxsat.base.lazy_weights``) are mapped by onnxruntime from their
    folder, never read into the process; a model past protobuf's 2 GiB goes through a temporary
    file with external data. ``prepacking=False`` keeps onnxruntime from copying weights into
    prepacked buffers (a second copy of a large model's weights). ``quiet`` logs fatal errors only
    (callers that report failures as exceptions in one line).
    """
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS[level]
    if quiet:
        so.log_severity_level = 4
    threads = default_threads() if threads is None else threads
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if not prepacking:
        so.add_session_config_entry("session.disable_prepacking", "1")
    providers = ["CPUExecutionProvider"]
    if weightless.has_large_weights(model) or lazy_weights.lazy_initializers(model):
        # From bytes, onnxruntime's wrapper keeps the serialized model and onnxruntime parses a
        # second copy before making its tensors: three copies of every weight. Handed over as
        # arrays (one copy, which onnxruntime uses in place) beside the model without their bytes;
        # lazy weights onnxruntime reads from their file itself.
        session = _with_weight_arrays(model, so, providers)
        if session is not None:
            return session
    if lazy_weights.lazy_initializers(model):
        shell, folder = lazy_weights.ort_model(model)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        return ort.InferenceSession(shell, so, providers=providers)
    if modelio.serialized_size(model) > modelio.MAX_PROTO_BYTES:
        with tempfile.TemporaryDirectory(prefix="onnxsat-latency-") as tmp:
            path = Path(tmp) / "model.onnx"
            modelio.save_model_atomic(model, path, external_data=True, durable=False)
            return ort.InferenceSession(str(path), so, providers=providers)  # weights read at creation
    return ort.InferenceSession(model.SerializeToString(), so, providers=providers)


def _with_weight_arrays(
    model: onnx.ModelProto, so: ort.SessionOptions, providers: list[str]
) -> ort.InferenceSession | None:
    """A session of ``model`` whose large in-memory weights onnxruntime gets as arrays (its lazy
    ones it reads from their file); None where it does not take them so (a dtype numpy holds but
    onnxruntime's arrays do not, a shell over 2 GiB)."""
    shell = weightless.weightless(model)
    if modelio.serialized_size(shell) > modelio.MAX_PROTO_BYTES:
        return None
    try:
        names, values = [], []
        for tensor in weightless.stripped(model):
            names.append(tensor.name)
            values.append(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(lazy_weights.tensor_array(tensor))))
        if names:
            so.add_external_initializers(names, values)
    except Exception:  # e.g. bfloat16 or float8 arrays
        return None
    if lazy_weights.lazy_initializers(shell):
        serialized, folder = lazy_weights.ort_model(shell)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    else:
        serialized = shell.SerializeToString()
    session = ort.InferenceSession(serialized, so, providers=providers)
    session._onnxsat_weights = values  # type: ignore[attr-defined]  # the arrays live as long as it
    return session


def compare_models(
    baseline: onnx.ModelProto,
    candidate: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    level: Level = "all",
    threads: int | None = None,
    rounds: int = 30,
    calls_per_round: int = 5,
    seed: int = 0,
) -> LatencyComparison:
    """Latency of two ONNX models on the same inputs in onnxruntime (same level and threads on both
    sides; when either keeps its weights in their file, neither prepacks them, so both hold one copy)."""
    prepacking = not any(lazy_weights.lazy_initializers(m) for m in (baseline, candidate))
    sessions = [ort_session(m, level=level, threads=threads, prepacking=prepacking) for m in (baseline, candidate)]
    runs = []
    for sess in sessions:
        names = {i.name for i in sess.get_inputs()}
        own = {k: v for k, v in feeds.items() if k in names}
        runs.append(lambda s=sess, f=own: s.run(None, f))
    return compare_latency(runs[0], runs[1], rounds=rounds, calls_per_round=calls_per_round, seed=seed)
