"""``onnxsat calibrate``: measure the roofline constants of each op class on this machine.

Each sample is a single-node ONNX model (MatMul, Gemm, Conv, Relu/Add/Mul, ReduceMean/Softmax,
Transpose/Concat, MaxPool/GlobalAveragePool, Reshape) timed on the runtime of the cost target:
onnxruntime (``ort-cpu``), or compiled by onnxsat to native kernels and run as one native call
(``onnxsat-cpu``: the cost model of what ``onnxsat.compile`` runs). The time of a model without
nodes is the fixed cost of an inference call and is subtracted, so what is fitted is the node's
own time. Per op class, the constants of
time = overhead + max(FLOPs / peak, bytes / bandwidth or spill bandwidth) + the terms onnxruntime
adds around a kernel (NCHWc reorders and unblocked convs, Split's extra outputs; see
``ClassConstants``) are fitted by non-negative weighted least squares (relative error; a grid
over the machine balance, the spill factor and the cache size makes the model linear). On
``onnxsat-cpu`` the products' and convs' compute and memory may add instead (``PACKING_CLASSES``),
whichever fits better.
Samples marked ``held_out`` are never used in the fit: the error reported on them is the
model's prediction error on shapes it has not seen.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .base.options import MEASURED_TARGETS
from .calibration_samples import Sample, empty_model, samples
from .extract.conv_layout import prefers_blocked
from .extract.cost import (
    OP_CLASSES,
    ClassConstants,
    RooflineCost,
    nchwc_unblocked,
    onnxsat_conv,
    onnxsat_depthwise_waste,
    relative_error,
)

NOISE_US = 2.0
"""Timing noise of one call here: fit weights are 1 / (time + noise), so relative error counts
for real work, and nodes of a microsecond or less do not dominate the fit."""
_BALANCES = np.logspace(-3, 4, 141)
"""Machine balances (FLOPs per byte at which compute and memory time are equal) tried in the fit."""
_SPILL_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
"""How many times slower than the cached bandwidth a kernel larger than the cache may stream."""
_CACHE_FRACTIONS = (0.5, 0.75, 1.0)
"""Fractions of the per-core cache tried as the size where a class's kernels start to spill
(code, the runtime's own data and the other operands share the cache)."""


QUANTILE = 10
"""Percentile of a sample's run times that is kept: other processes only ever add time, so a
low percentile over rounds spread in time is the least disturbed estimate of the node itself."""


CALLS_PER_ROUND = 2


def runner(
    model: onnx.ModelProto, threads: int | None, target: str = "ort-cpu", *, kernels_only: bool = False
) -> Callable[[], object]:
    """A zero-argument call of ``model`` on the runtime of ``target``, on seeded random inputs:
    an onnxruntime session, or the model compiled by onnxsat as it is (no optimize), one native
    call. ``kernels_only``: the compiled model's task table alone, on the inputs a first call left
    in its buffers (a single-node sample's inputs and outputs are copied in and out of the call,
    which inside a model they are not: a 96-channel 112 x 112 depthwise conv's copies took as
    long as the conv)."""
    from .verification import make_inputs

    feeds = make_inputs(model, seed=1)
    if target == "onnxsat-cpu":
        from .kernels.compile_options import CompileOptions
        from .kernels.compiled import CompiledModel

        compiled = CompiledModel(model, CompileOptions(threads=threads))
        compiled(feeds)
        exe = compiled.executable_for(feeds)
        table = exe.native
        if kernels_only and table is not None:

            def kernels(owner: CompiledModel = compiled) -> None:  # the model (its helpers) lives as long
                assert table is not None
                table.run(exe.workers)

            return kernels
        return lambda: compiled(feeds)
    from .latency import ort_session

    sess = ort_session(model, threads=threads)
    return lambda: sess.run(None, feeds)


def time_runs(runs: list[Callable[[], object]], *, seconds: float, min_rounds: int = 5) -> list[float]:
    """Per runnable, the ``QUANTILE`` percentile of its call time (microseconds).

    Rounds call every runnable a few times in turn (the first call untimed), so a burst of load elsewhere hits all of them
    alike instead of ruining one; rounds continue until ``seconds`` have passed.
    """
    for run in runs:
        run()
        run()
    times: list[list[float]] = [[] for _ in runs]
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < min_rounds or time.perf_counter() < deadline:
        for run, acc in zip(runs, times, strict=True):
            run()  # warms the caches the previous runnable evicted, as a model's previous node would
            for _ in range(CALLS_PER_ROUND):
                start = time.perf_counter()
                run()
                acc.append(time.perf_counter() - start)
        rounds += 1
    return [float(np.percentile(acc, QUANTILE)) * 1e6 for acc in times]


@dataclass
class Measured:
    sample: Sample
    flops: float
    bytes: float
    node_us: float
    """Measured time minus the fixed cost of a call."""
    predicted_us: float = 0.0
    reorder: float = 0.0
    """Bytes of layout copies the runtime adds around the node (``Sample.reorders``)."""
    reorder_kernels: int = 0
    """How many such copies."""
    unblocked: bool = False
    """A conv onnxruntime runs without its blocked layout (``nchwc_unblocked``)."""

    @property
    def kernels(self) -> int:
        """Dispatches the node pays: its own (one per copy in a chain) and one per layout copy
        around it (a chain of convs stays blocked: one pair of reorders for all)."""
        return self.sample.chain + self.reorder_kernels

    def predict(self, consts: ClassConstants, graph_output_us: float = 0.0) -> float:
        """The node's predicted time as measured: its kernel(s) and handing back its outputs."""
        kernel = consts.time_us(
            self.flops, self.bytes, self.reorder, self.kernels, self.sample.outputs, self.unblocked_flops
        )
        return kernel + graph_output_us * self.sample.outputs

    @property
    def unblocked_flops(self) -> float:
        return self.flops if self.unblocked else 0.0

    @property
    def rel_error(self) -> float:
        return relative_error(self.predicted_us, self.node_us)


def measure(
    sample_list: list[Sample], *, threads: int | None = None, seconds: float = 10.0, target: str = "ort-cpu"
) -> tuple[float, list[Measured]]:
    """The fixed cost of a call and every sample's own time (microseconds) on ``target``'s runtime
    (a ``fed`` sample's on onnxsat's: after its feeding 1x1 conv, whose own time is taken off).
    onnxruntime's blocked-layout terms (reorders around a conv, unblocked convs) are onnxruntime's
    only: onnxsat's kernels read and write the plain layout."""
    ort = target == "ort-cpu"
    fed = [sample.fed and target == "onnxsat-cpu" for sample in sample_list]
    models = [empty_model()]
    models += [sample.model(fed=f) for sample, f in zip(sample_list, fed, strict=True)]
    models += [sample.feeder_model() for sample, f in zip(sample_list, fed, strict=True) if f]
    runs = [runner(m, threads, target, kernels_only=True) for m in models]
    baseline, *totals = time_runs(runs, seconds=seconds)
    own, feeders = totals[: len(sample_list)], iter(totals[len(sample_list) :])
    out: list[Measured] = []
    for sample, total, f in zip(sample_list, own, fed, strict=True):
        flops, bytes_moved = sample.work()
        if not ort and sample.cls == "conv":  # Winograd convs: a class of their own
            cls, flops, bytes_moved = onnxsat_conv(list(sample.inputs), sample.out_shape, sample.attrs, flops, bytes_moved)
            sample = replace(sample, cls=cls)
        if not ort and sample.cls == "depthwise":  # run in the layout a model without extraction's choice gets
            x, w = sample.inputs[:2]
            blocked = prefers_blocked(x, w, int(sample.attrs.get("group", 1)), sample.attrs["strides"], sample.out_shape[2:])
            waste = onnxsat_depthwise_waste(list(sample.inputs), sample.out_shape, sample.attrs, blocked)
            flops, bytes_moved = flops * waste, bytes_moved * waste
        node_us = max(total - (next(feeders) if f else baseline), MIN_NODE_US)
        count, moved = sample.reorders() if ort else (0, 0.0)
        unblocked = ort and nchwc_unblocked(sample.op, list(sample.inputs))
        out.append(Measured(sample, flops, bytes_moved, node_us, moved, count, unblocked))
    return baseline, out


PACKING_CLASSES = ("conv", "matmul")
"""Classes whose onnxsat kernels copy an operand into place before computing (the GEMM's packed
panels of an image, a conv's transposed input): on the ``onnxsat-cpu`` target their compute and
memory time may add. Measured: a merge of sibling 1x1 convs saves the input copies (x1.05-1.2)
where the max form predicted a tie; with every class free to add, the fits of the depthwise and
elementwise classes wandered between runs and four corpus models fell out of the 25% band."""

MIN_NODE_US = 0.05
"""Floor of a node's own time (a node can measure at or below the empty model's time)."""


@dataclass(frozen=True)
class Dispatch:
    """What a kernel costs beyond its roofline, measured by the dispatch samples (microseconds)."""

    per_kernel: float
    """One more kernel inside a model."""
    per_output: float
    """Each extra output of a multi-output kernel (Split), inside a model."""
    per_graph_output: float
    """Handing one output back to the caller (allocation and fetch): single-node samples pay it for
    each of their outputs, a model for each of its outputs, and no choice of extraction changes it."""


def dispatch_costs(rows: list[Measured]) -> Dispatch:
    """Per-kernel, per-output and per-graph-output costs from the dispatch samples of all classes.

    One set for every class (onnxruntime's per-kernel work hardly depends on the op, and one tiny
    sample is within a microsecond of noise), each a median: a kernel is the time per extra copy of
    a chain over its single-node sample; a graph output is what a single tiny node takes beyond its
    kernels; a Split's extra output is what a tiny Split takes beyond its kernel and graph outputs.
    """
    singles = {r.sample.label: r for r in rows if r.sample.chain == 1}
    steps = []
    for r in rows:
        one = singles.get(r.sample.label.rsplit("*", 1)[0]) if r.sample.chain > 1 else None
        if one is not None:
            steps.append((r.node_us - one.node_us) / (r.sample.chain - 1))
    plain = [r for r in singles.values() if r.sample.outputs == 1]
    chained = bool(steps)
    if not chained:  # no chains: a single node's whole time counts as its dispatch
        steps = [r.node_us / r.kernels for r in plain]
    per_kernel = max(0.0, float(statistics.median(steps))) if steps else 0.0
    handover = [r.node_us - per_kernel * r.kernels for r in plain] if chained else []
    per_graph_output = max(0.0, float(statistics.median(handover))) if handover else 0.0
    extra = [
        (r.node_us - per_kernel * r.kernels - per_graph_output * r.sample.outputs) / (r.sample.outputs - 1)
        for r in singles.values()
        if r.sample.outputs > 1
    ]
    per_output = max(0.0, float(statistics.median(extra))) if extra else 0.0
    return Dispatch(per_kernel, per_output, per_graph_output)


def fit_class(
    rows: list[Measured],
    cache_bytes: float = math.inf,
    dispatch: Dispatch | None = None,
    kernel_spills: bool = True,
    additive: bool = False,
) -> ClassConstants:
    """Weighted least squares (weights 1 / (time + noise)) of
    overhead * kernels + a * max(flops, r * bytes') + c * reorder bytes + d * (outputs - 1)
    + e * FLOPs of unblocked convs.

    ``additive``: the sum flops + r * bytes' is tried too (``ClassConstants.additive``: kernels
    that copy an operand into place before computing), and kept where it fits better.

    bytes' = bytes while they fit in the cache, q * bytes beyond it (reorder bytes alike). For
    each machine balance r, spill factor q and cache size (a fraction of ``cache_bytes``) on a
    grid, the model is linear
    in (overhead, a, c, d, e), all kept non-negative (columns that are zero for every row are
    left out); the grid point with the smallest weighted residual wins. peak = 1/a, bandwidth =
    peak/r, spill bandwidth = bandwidth/q, reorder bandwidth = 1/c, cost per extra output = d,
    extra rate of unblocked convs = 1/e.

    ``dispatch`` pins (overhead, d) to what dispatch-only samples measured (``dispatch_costs``):
    left free, the intercept also absorbs how far the larger kernels fall off the roofline, which
    overprices the kernels a merge saves (a tiny merge then looks faster than it measures).
    """
    t = np.array([r.node_us for r in rows])
    flops = np.array([r.flops for r in rows])
    nbytes = np.array([r.bytes for r in rows])
    kernels = np.array([float(r.kernels) for r in rows])
    reorder = np.array([r.reorder for r in rows])
    extra_outputs = np.array([r.sample.outputs - 1.0 for r in rows])
    if dispatch is not None:
        t = t - dispatch.per_kernel * kernels - dispatch.per_output * extra_outputs
        t = t - dispatch.per_graph_output * (extra_outputs + 1.0)
        kernels, extra_outputs = np.zeros_like(kernels), np.zeros_like(extra_outputs)
    unblocked = np.array([r.unblocked_flops for r in rows])
    w = 1.0 / (np.array([r.node_us for r in rows]) + NOISE_US)  # relative error of the whole time
    best: tuple[float, np.ndarray, float, float, float, float, bool] | None = None  # resid, coef, r, q, q2, cache, additive
    caches = [cache_bytes * f for f in _CACHE_FRACTIONS] if math.isfinite(cache_bytes) else [math.inf]
    for cache in caches:
        spilled, reorder_spilled = nbytes > cache, reorder > cache
        if not (spilled.any() or reorder_spilled.any()) and cache != caches[-1]:
            continue  # same as the largest cache size
        # The kernel and the layout copies around it spill apart: a blocked conv streams its input
        # once from tiles that fit, while a reorder is a plain strided copy of the whole tensor.
        spills = _SPILL_FACTORS if spilled.any() and kernel_spills else (1.0,)
        for q, summed in itertools.product(spills, (False, True) if additive else (False,)):
            eff = np.where(spilled, q * nbytes, nbytes)
            memory = eff[None, :] * _BALANCES[:, None]  # one row per balance
            x = flops[None, :] + memory if summed else np.maximum(flops[None, :], memory)
            for q2 in _SPILL_FACTORS if reorder_spilled.any() else (1.0,):
                reorder_eff = np.where(reorder_spilled, q2 * reorder, reorder)
                fixed = [
                    np.broadcast_to(c, x.shape) for c in (kernels, reorder_eff, extra_outputs, unblocked)
                ]
                design = np.stack([fixed[0], x, *fixed[1:]], axis=2)
                resid, coef = _nonneg_fit(design, t, w)
                i = int(np.argmin(resid))
                if best is None or resid[i] < best[0]:
                    best = (float(resid[i]), coef[i], float(_BALANCES[i]), float(q), float(q2), float(cache), summed)
    assert best is not None
    _, (overhead, a, c, per_output, e), r, q, q2, cache, summed = best
    if dispatch is not None:  # the per-output cost belongs to multi-output kernels only
        overhead = dispatch.per_kernel
        per_output = dispatch.per_output if any(r.sample.outputs > 1 for r in rows) else 0.0
    extras = {
        "reorder_gbs": float(1.0 / (c * 1e3) if c > 0 else math.inf),
        "reorder_spill": q2,
        "output_us": float(per_output),
        "unblocked_gflops": float(1.0 / (e * 1e3) if e > 0 else math.inf),
        "additive": summed,
    }
    if a <= 0:
        return ClassConstants(math.inf, math.inf, float(overhead), cache_bytes=cache, **extras)
    peak = 1.0 / (a * 1e3)  # a is microseconds per FLOP; peak in GFLOP/s
    bandwidth = peak / r
    return ClassConstants(
        float(peak),
        float(bandwidth),
        float(overhead),
        spill_gbs=float(bandwidth / q),
        cache_bytes=cache,
        **extras,
    )


def spill_threshold_bytes(target: str, threads: int | None) -> float:
    """The cache a kernel's bytes must exceed before the fit may price them as spilled: one core's
    for onnxruntime; the cores' together for onnxsat's kernels, which split a large kernel over
    the threads, each core's cache holding its part (three sibling products of 0.6 MB of weights
    each measured a tie with their merge, which a 1.8 MB kernel spilling past one core's cache
    made look twice as dear)."""
    cores = (threads or os.cpu_count() or 1) if target == "onnxsat-cpu" else 1
    return cache_bytes() * cores


def cache_bytes() -> float:
    """Per-core cache the spill term starts after: the largest cache level private to CPU 0
    (Linux sysfs), else 1 MiB."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip()
            kind = (index / "type").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction" and shared in ("0", "0-0") and size.endswith("K"):
            best = max(best, int(size[:-1]) * 1024)
    return float(best or 1 << 20)


def _nonneg_fit(x: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative weighted least squares t ~ x[g] @ coef for a batch of designs ``x[g]``
    (shape: batch, rows, columns); returns per design (residual, coef).

    Few columns, so every subset of the nonzero columns is solved (normal equations) and the
    best solution without a negative coefficient kept.
    """
    batch, _, n = x.shape
    cols = [j for j in range(n) if np.any(x[:, :, j])]
    xw, tw = x[:, :, cols] * w[None, :, None], t * w
    gram = np.einsum("gri,grj->gij", xw, xw)
    rhs = np.einsum("gri,r->gi", xw, tw)
    tt = float(tw @ tw)
    best_resid = np.full(batch, tt)
    best_coef = np.zeros((batch, len(cols)))
    for mask in range(1, 1 << len(cols)):
        use = [i for i in range(len(cols)) if mask >> i & 1]
        sub = gram[:, use][:, :, use] + np.eye(len(use)) * 1e-300
        try:
            sol = np.linalg.solve(sub, rhs[:, use, None])[:, :, 0]
        except np.linalg.LinAlgError:
            continue
        coef = np.zeros((batch, len(cols)))
        coef[:, use] = sol
        resid = tt - 2 * np.einsum("gi,gi->g", coef, rhs) + np.einsum("gi,gij,gj->g", coef, gram, coef)
        better = np.all(sol >= 0, axis=1) & np.isfinite(resid) & (resid < best_resid)
        best_resid = np.where(better, resid, best_resid)
        best_coef[better] = coef[better]
    full = np.zeros((batch, n))
    full[:, cols] = best_coef
    return np.maximum(best_resid, 0.0), full


@dataclass
class Calibration:
    """A fitted profile and the evidence of how well it predicts."""

    cost: RooflineCost
    measured: list[Measured]
    baseline_us: float
    seconds: float

    def held_out(self) -> list[Measured]:
        return [m for m in self.measured if m.sample.held_out]

    def median_error(self, held_out: bool = True) -> float:
        rows = [m.rel_error for m in self.measured if m.sample.held_out == held_out]
        return float(statistics.median(rows)) if rows else float("nan")

    def report(self) -> dict[str, Any]:
        """Per sample predicted vs measured, and median relative errors (fit and held-out)."""
        per_class: dict[str, float] = {}
        for cls in OP_CLASSES:
            errs = [m.rel_error for m in self.held_out() if m.sample.cls == cls]
            if errs:
                per_class[cls] = round(float(statistics.median(errs)), 4)
        return {
            "seconds": round(self.seconds, 2),
            "run_overhead_us": round(self.baseline_us, 3),
            "median_rel_error_held_out": round(self.median_error(True), 4),
            "median_rel_error_fit": round(self.median_error(False), 4),
            "median_rel_error_held_out_per_class": per_class,
            "samples": [
                {
                    "op": m.sample.label,
                    "class": m.sample.cls,
                    "held_out": m.sample.held_out,
                    "measured_us": round(m.node_us, 3),
                    "predicted_us": round(m.predicted_us, 3),
                    "rel_error": round(m.rel_error, 4),
                }
                for m in self.measured
            ],
        }

    def render(self) -> str:
        lines = [f"{'op':<44} {'class':<12} {'set':<8} {'measured us':>12} {'predicted us':>13} {'error':>7}"]
        for m in self.measured:
            lines.append(
                f"{m.sample.label:<44} {m.sample.cls:<12} {'held-out' if m.sample.held_out else 'fit':<8}"
                f" {m.node_us:>12.2f} {m.predicted_us:>13.2f} {m.rel_error:>7.1%}"
            )
        lines.append("")
        lines.append(
            f"median relative error per node: held-out {self.median_error(True):.1%},"
            f" fit {self.median_error(False):.1%}; fixed cost per call {self.baseline_us:.1f} us;"
            f" {self.seconds:.1f} s"
        )
        return "\n".join(lines)


def calibrate(
    target: str = "ort-cpu",
    *,
    quick: bool = False,
    threads: int | None = None,
    seconds: float | None = None,
) -> Calibration:
    """Measure, fit per class, and predict every sample (held-out ones were not fitted)."""
    from .extract.profile import builtin_profile

    if target not in MEASURED_TARGETS:
        from .base.errors import BadInputError

        raise BadInputError(
            f"calibration measures this CPU: --cost-target {' or '.join(MEASURED_TARGETS)} (not {target!r})"
        )
    start = time.perf_counter()
    seconds = seconds if seconds is not None else (3.0 if quick else 20.0)
    base = builtin_profile(target)
    cache = spill_threshold_bytes(target, threads)
    baseline, measured = measure(samples(quick), threads=threads, seconds=seconds, target=target)
    classes: dict[str, ClassConstants] = {}
    tiny = [m for m in measured if m.sample.dispatch and not m.sample.held_out]
    pinned = dispatch_costs(tiny) if tiny else None
    for cls in OP_CLASSES:
        rows = [m for m in measured if m.sample.cls == cls and not m.sample.held_out]
        if not rows:
            continue
        if cls == "view":  # a metadata-only op: its whole time beyond handing back its output
            handover = pinned.per_graph_output if pinned is not None else 0.0
            view_us = max(0.0, float(statistics.median(r.node_us for r in rows)) - handover)
            classes[cls] = ClassConstants(math.inf, math.inf, view_us)
            continue
        # A blocked conv streams tiles that fit the cache: only its layout copies spill.
        fitted = [r for r in rows if not r.sample.dispatch] or rows
        classes[cls] = fit_class(
            fitted,
            cache,
            pinned,
            kernel_spills=cls not in ("conv", "depthwise"),
            additive=target == "onnxsat-cpu" and cls in PACKING_CLASSES,
        )
    default = classes.get("elementwise", base.default)
    cost = RooflineCost(
        name=target,
        default=default,
        classes=classes,
        view_overhead_us=classes["view"].overhead_us if "view" in classes else base.view_overhead_us,
        fusion=base.fusion,
        run_overhead_us=baseline,
        graph_output_us=pinned.per_graph_output if pinned is not None else 0.0,
        calibrated=True,
        source=(
            f"onnxsat calibrate on {platform.node() or 'this machine'} ({platform.machine()},"
            f" {_runtime_version(target)}, threads {threads or 'default'}),"
            f" {datetime.date.today().isoformat()}{' --quick' if quick else ''}"
        ),
    )
    for m in measured:
        m.predicted_us = m.predict(cost.constants(m.sample.cls), cost.graph_output_us)
    return Calibration(cost, measured, baseline, time.perf_counter() - start)


@dataclass
class ModelCheck:
    """A whole model: the cost model's latency (sum of its nodes' costs + the fixed cost of a call) vs measured."""

    name: str
    predicted_us: float
    measured_us: float

    @property
    def rel_error(self) -> float:
        return relative_error(self.predicted_us, self.measured_us)


def predict_model_us(model: onnx.ModelProto, cost: RooflineCost) -> float:
    """The cost model's latency of ``model`` as written: its imported e-graph, extracted unsaturated."""
    from .egraph.importer import from_onnx
    from .extract.greedy import extract_greedy
    from .extract.serialized import serialize

    program = from_onnx(model)
    eg = serialize(program.egraph)
    roots = [eg.roots[i] for i in range(len(program.outputs))]
    extracted = extract_greedy(eg, cost, roots)
    handover = cost.graph_output_us * len(model.graph.output)
    return (
        float(extracted.cost)
        + cost.run_overhead_us
        + handover
        + _output_reorders_us(eg, extracted.nodes, roots, cost)
    )


def _output_reorders_us(eg: Any, nodes: list[tuple[str, Any]], roots: list[str], cost: RooflineCost) -> float:
    """The ReorderOutput onnxruntime puts after a conv whose result is a graph output (node costs
    charge a conv's ReorderOutput to the consumer that needs it; a graph output has none)."""
    if cost.fusion != "ort":
        return 0.0
    chosen = dict(nodes)
    total = 0.0
    for root in dict.fromkeys(roots):
        node = chosen.get(root)
        shape = eg.shapes.get(root)
        if node is not None and node.op == "conv" and shape is not None and len(shape) == 4:
            moved = math.prod(max(d, 1) for d in shape) * 4.0
            total += cost.constants("conv").time_us(0.0, 0.0, moved, kernels=1)
    return total


def check_models(
    models: dict[str, onnx.ModelProto],
    cost: RooflineCost,
    *,
    threads: int | None = None,
    seconds: float = 5.0,
) -> list[ModelCheck]:
    """Whole-model error: every model timed on the runtime of the profile's target (interleaved,
    low percentile as in calibration) and priced."""
    target = cost.name if cost.name in MEASURED_TARGETS else "ort-cpu"
    measured = time_runs([runner(m, threads, target) for m in models.values()], seconds=seconds)
    return [
        ModelCheck(name, predict_model_us(model, cost), us)
        for (name, model), us in zip(models.items(), measured, strict=True)
    ]


def _runtime_version(target: str) -> str:
    if target == "onnxsat-cpu":
        import llvmlite

        from .base import __version__

        return f"onnxsat {__version__} compiled kernels, llvmlite {llvmlite.__version__}"
    import onnxruntime as ort

    return f"onnxruntime {ort.__version__}"
