"""Numeric check of an optimized model against its original on onnxruntime.

Nothing is written unless the optimized model computes what the original computes: both run on
onnxruntime's CPU provider with its own graph optimizations off, on the same seeded random
inputs, and every output is compared by name with a per-dtype tolerance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, ValueInfoProto, helper

from onnxsat import latency
from onnxsat.base import modelio
from onnxsat.base.errors import UnverifiableError, VerificationError, one_line
from onnxsat.base.weightless import infer_shapes
from onnxsat.verification_inputs import check_verifiable, dim_assignments, load_samples, make_inputs

__all__ = [
    "OutputCheck",
    "Reference",
    "check_verifiable",
    "compare_to_reference",
    "load_samples",
    "reference_run",
    "VerificationResult",
    "compare_models",
    "make_inputs",
    "run_ort",
    "tolerance",
    "weakest_float_types",
]

_OPT_LEVELS: dict[str, latency.Level] = {
    "disable_all": "disable",
    "basic": "basic",
    "extended": "extended",
    "all": "all",
}


@dataclass(frozen=True)
class OutputCheck:
    """One output's comparison: the worst absolute error over all seeds and the bound it had to meet."""

    name: str
    max_abs_err: float
    tolerance: float
    ok: bool
    detail: str = ""


@dataclass
class VerificationResult:
    """Outcome of `compare_models`.

    `skipped_reason` is set when the original model itself cannot be run (e.g. a custom-domain
    op onnxruntime lacks); `ok` is then False and the caller decides on a fallback.
    """

    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    skipped_reason: str | None = None

    def failures(self) -> list[OutputCheck]:
        return [c for c in self.outputs if not c.ok]

    def to_error(self, culprit_rules: list[str] | None = None) -> VerificationError | None:
        """The error to raise for a mismatch (first failing output); None if ok or skipped."""
        if self.ok or self.skipped_reason is not None:
            return None
        failed = self.failures()
        if not failed:
            return VerificationError("?", math.inf, "verification failed", culprit_rules)
        worst = failed[0]
        detail = worst.detail or f"tolerance {worst.tolerance:.3g}"
        return VerificationError(worst.name, worst.max_abs_err, detail, culprit_rules)


# ---------------------------------------------------------------------------------------------
# running


def run_ort(
    model: ModelProto, feeds: Mapping[str, np.ndarray], *, optimization_level: str = "disable_all"
) -> dict[str, np.ndarray]:
    """Run `model` on onnxruntime's CPU provider and return its outputs by name.

    `optimization_level` defaults to "disable_all" so that onnxruntime's own fusions neither hide
    nor cause differences. Feeds the model does not declare are ignored, so an optimized model that
    dropped an unused input runs on the original's feeds. Models over 2 GiB go through a temporary
    directory with external data.
    """
    return run_session(inference_session(model, optimization_level), feeds)


def inference_session(model: ModelProto, optimization_level: str) -> ort.InferenceSession:
    if optimization_level not in _OPT_LEVELS:
        raise ValueError(
            f"optimization_level must be one of {sorted(_OPT_LEVELS)}, not {optimization_level!r}"
        )
    # Fatal-only logging: failures come back as exceptions that the caller reports in one line.
    # No prepacking: it copies every MatMul weight into a second buffer, and takes time, for a
    # session that runs twice; every session compared is built the same way.
    return latency.ort_session(model, level=_OPT_LEVELS[optimization_level], prepacking=False, quiet=True)


def run_session(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(names, results, strict=True))


# ---------------------------------------------------------------------------------------------
# comparing


_TOLERANCES: dict[int, tuple[float, float]] = {
    TensorProto.FLOAT: (1e-3, 1e-5),
    TensorProto.COMPLEX64: (1e-3, 1e-5),
    TensorProto.FLOAT16: (1e-2, 1e-4),
    TensorProto.BFLOAT16: (5e-2, 1e-3),
    TensorProto.DOUBLE: (1e-7, 1e-10),
    TensorProto.COMPLEX128: (1e-7, 1e-10),
}
_MANTISSA_BITS: dict[int, int] = {
    TensorProto.BFLOAT16: 8,
    TensorProto.FLOAT16: 11,
    TensorProto.FLOAT: 24,
    TensorProto.COMPLEX64: 24,
    TensorProto.DOUBLE: 53,
    TensorProto.COMPLEX128: 53,
}
"""Precision of the float types whose rounding a tolerance covers (float8 types are not modelled)."""


def tolerance(dtype: np.dtype | type | str) -> tuple[float, float]:
    """(rtol, atol) for outputs of `dtype`; an output passes when max|opt - ref| <= atol + rtol * max|ref|.

    The relative part scales with the largest reference magnitude of the output, not with each
    element: reassociated sums (what rewrites do) err in proportion to the values summed, so
    near-zero elements would otherwise demand impossible relative accuracy. There is
    deliberately no floor of 1 on that scale: on random inputs a 1000-class softmax gives
    probabilities near 1e-3, and a floor would make the bound as large as the outputs, blind to
    real bugs. `atol` covers outputs that are zero or tiny everywhere. float32 (1e-3, 1e-5)
    leaves ~1e4 ulps of room for reassociation in deep nets; float16 (1e-2, 1e-4) is ~10 ulps;
    float64 (1e-7, 1e-10). Integers, bools and strings must match exactly: (0, 0).
    """
    dt = np.dtype(dtype)
    if dt.name == "bfloat16":
        return _TOLERANCES[TensorProto.BFLOAT16]
    try:
        elem_type = helper.np_dtype_to_tensor_dtype(dt)
    except (KeyError, ValueError, TypeError):
        return 0.0, 0.0
    return _TOLERANCES.get(elem_type, (0.0, 0.0))


def weakest_float_types(model: ModelProto) -> dict[str, int]:
    """Per float output of the main graph, the lowest-precision float type its value is computed in.

    A rewrite may reassociate or fuse any step of the computation, so an output is only as exact
    as the least precise float tensor on its way: float32 math cast to float64 at the end differs
    from a correct rewrite by float32 roundings, and is held to float32's tolerance. The walk goes
    backwards from each output through float tensors only (an integer or bool tensor, such as a
    Shape result, carries no rounding error forward), so a pure float64 computation keeps
    float64's tolerance. Types come from the graph's declarations, initializers, Cast targets and
    onnx shape inference; tensors of unknown type are walked through without counting.
    """
    graph = model.graph
    types = _declared_types(model)
    producer = {out: node for node in graph.node for out in node.output if out}
    weakest: dict[str, int] = {}
    for output in graph.output:
        own = types.get(output.name)
        if own not in _MANTISSA_BITS:
            continue
        best, seen, todo = own, {output.name}, [output.name]
        while todo:
            name = todo.pop()
            elem_type = types.get(name)
            if elem_type is not None and elem_type not in _MANTISSA_BITS:
                continue  # integers, bools, strings: no rounding error flows through them
            if elem_type is not None and _MANTISSA_BITS[elem_type] < _MANTISSA_BITS[best]:
                best = elem_type
            node = producer.get(name)
            for source in node.input if node is not None else ():
                if source and source not in seen:
                    seen.add(source)
                    todo.append(source)
        weakest[output.name] = best
    return weakest


def _declared_types(model: ModelProto) -> dict[str, int]:
    graph = model.graph
    types: dict[str, int] = {}
    inferred = _inferred_value_infos(model)
    for vi in [*inferred, *graph.value_info, *graph.input, *graph.output]:
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    for node in graph.node:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.output:
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            if to:
                types[node.output[0]] = to
    return types


def _inferred_value_infos(model: ModelProto) -> list[ValueInfoProto]:
    if modelio.serialized_size(model) > modelio.MAX_PROTO_BYTES:
        return []
    try:
        return list(infer_shapes(model).graph.value_info)
    except Exception:
        return []


@dataclass
class Reference:
    """The original model's outputs on the verification inputs, computed once (one onnxruntime
    session, every seed or sample) and compared with every candidate: the optimized model, a
    retry without some rules, each step of the minimizer."""

    feeds: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    origin: str
    """Where the inputs came from: ``seeds [0, 1]`` or ``2 sample(s) from --verify-inputs``."""
    seconds: float
    """Session creation and runs of the original."""


def reference_run(
    original: ModelProto,
    *,
    seeds: Sequence[int] = (0, 1),
    dim_values: Mapping[str, int] | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
) -> Reference:
    """Run the original once per seed (or per user sample) on one session; `UnverifiableError`
    when it cannot be run: inputs that cannot be generated, or onnxruntime refusing the original
    on every input tried (values derived from the consumers of size-like operands first, plain
    random ones next)."""
    if not seeds and not samples:
        raise ValueError("a reference run needs at least one seed or sample")
    start = time.perf_counter()
    try:
        session = inference_session(original, "disable_all")
    except Exception as e:
        raise UnverifiableError(f"onnxruntime cannot run the original model ({one_line(e)})") from e
    attempts: list[tuple[str, Callable[[], list[dict[str, Any]]]]]
    if samples:
        attempts = [("sample(s) from --verify-inputs", lambda: [dict(s) for s in samples])]
    else:
        # the default sizes with and without derived size operands, then other symbol values
        # (related sizes an exporter named independently), each with derived operands
        assignments = dim_assignments(original, dim_values)
        tries = [(assignments[0], True), (assignments[0], False)] + [(a, True) for a in assignments[1:]]
        attempts = [
            (_inputs_label(seeds, dims, dim_values), _generator(original, seeds, dims, derive))
            for dims, derive in tries
        ]
    first_error: Exception | None = None
    for origin, make in attempts:
        try:
            feeds = make()
        except ValueError as e:
            raise UnverifiableError(f"cannot generate inputs for the original model ({e})") from e
        try:
            outputs = [run_session(session, f) for f in feeds]
        except Exception as e:
            first_error = first_error or e
            continue
        label = f"{len(feeds)} {origin}" if samples else origin
        return Reference(feeds, outputs, label, time.perf_counter() - start)
    what = "the given inputs" if samples else "generated inputs"
    raise UnverifiableError(f"onnxruntime cannot run the original model on {what} ({one_line(first_error)})")


def _inputs_label(seeds: Sequence[int], dims: Mapping[str, int], pinned: Mapping[str, int] | None) -> str:
    varied = "".join(f", {k}={v}" for k, v in dims.items() if (pinned or {}).get(k) != v)
    return f"seeds {list(seeds)}{varied}"


def _generator(
    model: ModelProto, seeds: Sequence[int], dims: Mapping[str, int], derive: bool
) -> Callable[[], list[dict[str, Any]]]:
    """Generated feeds per seed, made only when this attempt is reached."""
    return lambda: [make_inputs(model, seed, dims, derive=derive) for seed in seeds]


def compare_models(
    original: ModelProto,
    optimized: ModelProto,
    *,
    seeds: Sequence[int] = (0, 1),
    dim_values: Mapping[str, int] | None = None,
    reference: Reference | None = None,
) -> VerificationResult:
    """Run both models on the same random inputs per seed and compare every output by name.

    The optimized model must declare the same outputs in the same order, and produce arrays of
    the same dtype and shape, with NaNs and infinities in the same places and finite values
    within `tolerance`. If onnxruntime cannot run the original, the result is not ok and carries
    `skipped_reason`; if it cannot run the optimized model, that is a failure. A ``reference``
    from `reference_run` is reused instead of running the original again.
    """
    if not seeds and reference is None:
        raise ValueError("compare_models needs at least one seed")
    interface = _interface_checks(original, optimized)
    if interface:
        return VerificationResult(ok=False, outputs=interface)
    if reference is None:
        try:
            reference = reference_run(original, seeds=seeds, dim_values=dim_values)
        except UnverifiableError as e:
            return VerificationResult(ok=False, skipped_reason=e.reason)
    return compare_to_reference(reference, original, optimized)


def compare_to_reference(
    reference: Reference, original: ModelProto, optimized: ModelProto
) -> VerificationResult:
    """Run ``optimized`` on the reference's inputs (one session) and compare with its outputs."""
    names = [o.name for o in original.graph.output]
    interface = _interface_checks(original, optimized)
    if interface:
        return VerificationResult(ok=False, outputs=interface)
    try:
        session = inference_session(optimized, "disable_all")
        results = [run_session(session, feeds) for feeds in reference.feeds]
        del session  # its copy of the weights is not held through the comparison
    except Exception as e:
        detail = f"onnxruntime cannot run the optimized model: {one_line(e)}"
        checks = [OutputCheck(name, math.inf, 0.0, False, detail) for name in names]
        return VerificationResult(ok=False, outputs=checks)

    weakest = weakest_float_types(original)
    worst: dict[str, OutputCheck] = {}
    for ref, got in zip(reference.outputs, results, strict=True):
        for name in names:
            check = compare_values(name, ref[name], got[name], weakest.get(name))
            worst[name] = _worse(worst.get(name), check)
    checks = [worst[name] for name in names]
    return VerificationResult(ok=all(c.ok for c in checks), outputs=checks)


def _interface_checks(original: ModelProto, optimized: ModelProto) -> list[OutputCheck]:
    """Failures for outputs that are missing, extra, reordered or declared with another dtype."""
    orig = [o.name for o in original.graph.output]
    opt = [o.name for o in optimized.graph.output]
    checks: list[OutputCheck] = []
    if orig != opt:
        if set(orig) == set(opt) and len(orig) == len(opt):
            return [
                OutputCheck(n, math.inf, 0.0, False, f"output order differs: {opt} vs {orig}") for n in orig
            ]
        checks += [
            OutputCheck(n, math.inf, 0.0, False, "missing from the optimized model")
            for n in orig
            if n not in opt
        ]
        checks += [
            OutputCheck(n, math.inf, 0.0, False, "not an output of the original model")
            for n in opt
            if n not in orig
        ]
        return checks
    for a, b in zip(original.graph.output, optimized.graph.output, strict=True):
        ta, tb = a.type.tensor_type.elem_type, b.type.tensor_type.elem_type
        if ta and tb and ta != tb:
            detail = (
                f"declared dtype {TensorProto.DataType.Name(tb)} differs from the original "
                f"{TensorProto.DataType.Name(ta)}"
            )
            checks.append(OutputCheck(a.name, math.inf, 0.0, False, detail))
    return checks


def _worse(old: OutputCheck | None, new: OutputCheck) -> OutputCheck:
    if old is None:
        return new
    if old.ok != new.ok:
        return new if not new.ok else old

    def ratio(c: OutputCheck) -> float:
        return c.max_abs_err / c.tolerance if c.tolerance > 0 else (math.inf if c.max_abs_err > 0 else 0.0)

    return new if ratio(new) > ratio(old) else old


def _all_finite_error(ref: np.ndarray, got: np.ndarray) -> tuple[float, float] | None:
    """(max|ref - got|, max|ref|) of two float arrays with no NaN or infinity, computed in their own
    precision (float16 in float32): the common case, without float64 copies of a large output such as
    a language model's logits. None when either has a non-finite value or the difference overflows:
    the caller's float64 path then compares NaN and infinity positions too."""
    work = np.float32 if ref.dtype.itemsize < 4 else ref.dtype
    r, g = ref.astype(work, copy=False), got.astype(work, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(np.max(np.abs(r - g)))
        scale = float(np.max(np.abs(r)))
    if not (math.isfinite(err) and math.isfinite(scale)):  # max propagates NaN: both arrays are finite
        return None
    return err, scale


def compare_values(name: str, ref: object, got: object, weakest: int | None = None) -> OutputCheck:
    """Compare one output; sequence outputs (lists of arrays) are compared element by element.

    ``weakest``: the lowest-precision float type the output is computed in (``weakest_float_types``);
    the tolerance is that type's when it is less precise than the output's own.
    """
    if isinstance(ref, list) or isinstance(got, list):
        if not (isinstance(ref, list) and isinstance(got, list)) or len(ref) != len(got):
            return OutputCheck(name, math.inf, 0.0, False, "sequence lengths or kinds differ")
        worst: OutputCheck | None = None
        for r, g in zip(ref, got, strict=True):
            worst = _worse(worst, compare_values(name, r, g, weakest))
        return worst or OutputCheck(name, 0.0, 0.0, True)
    return _compare_arrays(name, np.asarray(ref), np.asarray(got), weakest)


def _tolerance_of(dtype: np.dtype, weakest: int | None) -> tuple[float, float]:
    """``tolerance(dtype)``, or the weakest type's when that one is less precise."""
    own = tolerance(dtype)
    if weakest is None or weakest not in _TOLERANCES:
        return own
    rtol, atol = _TOLERANCES[weakest]
    return (rtol, atol) if rtol > own[0] else own


def _compare_arrays(name: str, ref: np.ndarray, got: np.ndarray, weakest: int | None = None) -> OutputCheck:
    if ref.dtype != got.dtype:
        return OutputCheck(
            name, math.inf, 0.0, False, f"dtype {got.dtype} differs from the original {ref.dtype}"
        )
    if ref.shape != got.shape:
        return OutputCheck(
            name, math.inf, 0.0, False, f"shape {got.shape} differs from the original {ref.shape}"
        )
    if ref.dtype.kind not in "fc":
        if ref.dtype.kind in "iub":
            diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
            err = float(diff.max()) if diff.size else 0.0
        else:
            err = 0.0
        same = bool(np.array_equal(ref, got))
        return OutputCheck(
            name, err if not same else 0.0, 0.0, same, "" if same else "values differ (exact match required)"
        )

    rtol, atol = _tolerance_of(ref.dtype, weakest)
    if ref.dtype.kind == "f" and ref.size:
        fast = _all_finite_error(ref, got)
        if fast is not None:
            err, scale = fast
            bound = atol + rtol * scale
            ok = err <= bound
            return OutputCheck(name, err, bound, ok, "" if ok else f"exceeds tolerance {bound:.3g}")
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    r, g = ref.astype(wide), got.astype(wide)
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    if not np.array_equal(nan_r, nan_g):
        count = int(np.count_nonzero(nan_r != nan_g))
        return OutputCheck(name, math.inf, 0.0, False, f"NaN positions differ at {count} elements")
    inf_r, inf_g = np.isinf(r), np.isinf(g)
    if not np.array_equal(inf_r, inf_g) or not np.array_equal(r[inf_r], g[inf_g]):
        return OutputCheck(name, math.inf, 0.0, False, "infinities differ")
    finite = np.isfinite(r)
    if not finite.any():
        return OutputCheck(name, 0.0, atol, True)
    rf, gf = r[finite], g[finite]
    err = float(np.abs(rf - gf).max())
    bound = atol + rtol * float(np.abs(rf).max())
    ok = err <= bound
    return OutputCheck(name, err, bound, ok, "" if ok else f"exceeds tolerance {bound:.3g}")
