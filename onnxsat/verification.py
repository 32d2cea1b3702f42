"""Numeric check of an optimized model against its original on onnxruntime.

Nothing is written unless the optimized model computes what the original computes: both run on
onnxruntime's CPU provider with its own graph optimizations off, on the same seeded random
inputs, and every output is compared by name with a per-dtype tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import ModelProto, TensorProto, ValueInfoProto, helper

from onnxsat import latency
from onnxsat.base import lazy_weights, modelio
from onnxsat.base.errors import VerificationError, one_line

__all__ = [
    "OutputCheck",
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

_FLOAT_TYPES: dict[int, type] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
}
_INT_TYPES: dict[int, type] = {
    TensorProto.INT8: np.int8,
    TensorProto.INT16: np.int16,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
    TensorProto.UINT8: np.uint8,
    TensorProto.UINT16: np.uint16,
    TensorProto.UINT32: np.uint32,
    TensorProto.UINT64: np.uint64,
}
# Integer inputs that index nothing we can see get values in [0, _DEFAULT_INT_HIGH).
_DEFAULT_INT_HIGH = 4


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
# inputs


def make_inputs(
    model: ModelProto, seed: int, dim_values: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Seeded random feeds for the model's true graph inputs.

    Inputs that are also initializers are never fed: before IR 4 they are constants, from IR 4
    on they are overridable defaults, and keeping the default is what the model means. Symbolic
    dims take `dim_values[symbol]`, else 1 for names containing "batch" and 4 otherwise (the same
    symbol always gets the same size); dims with neither a value nor a name get 1. Integer inputs
    used directly as Gather indices stay within the gathered axis, other integers lie in [0, 4),
    floats are standard normal, bools fair coin flips. Raises ValueError for input types it
    cannot generate (non-tensors, strings, unknown rank).
    """
    graph = model.graph
    initializers = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    inputs = [vi for vi in graph.input if vi.name not in initializers]
    symbols: dict[str, int] = dict(dim_values or {})
    shapes = {vi.name: _concrete_shape(vi, symbols) for vi in inputs}
    index_bounds = _gather_index_bounds(model, {vi.name for vi in inputs}, shapes)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in inputs:
        elem_type = vi.type.tensor_type.elem_type
        feeds[vi.name] = _random_tensor(rng, vi.name, elem_type, shapes[vi.name], index_bounds.get(vi.name))
    return feeds


def _default_dim(symbol: str) -> int:
    return 1 if "batch" in symbol.lower() else 4


def _concrete_shape(vi: ValueInfoProto, symbols: dict[str, int]) -> tuple[int, ...]:
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise ValueError(f"input '{vi.name}' is a {kind or 'value of unknown type'}, not a tensor")
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        raise ValueError(f"input '{vi.name}' has unknown rank; cannot choose a shape for it")
    dims: list[int] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param:
            dims.append(symbols.setdefault(d.dim_param, _default_dim(d.dim_param)))
        else:  # anonymous dynamic dim: 1 broadcasts against anything
            dims.append(1)
    return tuple(dims)


def _gather_index_bounds(
    model: ModelProto, input_names: set[str], shapes: dict[str, tuple[int, ...]]
) -> dict[str, int]:
    """Exclusive upper bound for integer inputs that feed a Gather's indices directly."""
    graph = model.graph
    gathers = [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and n.domain in ("", "ai.onnx")
        and len(n.input) >= 2
        and n.input[1] in input_names
    ]
    if not gathers:
        return {}
    known: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in graph.initializer}
    known.update(shapes)
    inferred: dict[str, tuple[int, ...]] | None = None
    bounds: dict[str, int] = {}
    for node in gathers:
        data_shape = known.get(node.input[0])
        if data_shape is None:
            if inferred is None:
                inferred = _inferred_static_shapes(model)
            data_shape = inferred.get(node.input[0])
        if not data_shape:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(data_shape) <= axis < len(data_shape):
            continue
        size = data_shape[axis]
        if size is None:
            continue
        name = node.input[1]
        bounds[name] = min(bounds.get(name, size), size)
    return bounds


def _inferred_static_shapes(model: ModelProto) -> dict[str, tuple[int, ...]]:
    """Static shapes from onnx shape inference; dims it cannot pin down are None."""
    if modelio.serialized_size(model) > modelio.MAX_PROTO_BYTES:
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") == "tensor_type" and tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)  # type: ignore[misc]
    return shapes


def _random_tensor(
    rng: np.random.Generator, name: str, elem_type: int, shape: tuple[int, ...], int_high: int | None
) -> np.ndarray:
    if elem_type in _FLOAT_TYPES:
        return np.asarray(rng.standard_normal(shape), dtype=_FLOAT_TYPES[elem_type])
    if elem_type in _INT_TYPES:
        high = _DEFAULT_INT_HIGH if int_high is None else max(int_high, 1)
        return np.asarray(rng.integers(0, high, size=shape), dtype=_INT_TYPES[elem_type])
    if elem_type == TensorProto.BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    type_name = (
        TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
    )
    raise ValueError(f"input '{name}' has type {type_name}, which verification cannot generate")


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
    # Weights still in their file skip prepacking (it would copy every MatMul weight into a second
    # buffer); results are compared between two sessions that both skip it.
    return latency.ort_session(
        model,
        level=_OPT_LEVELS[optimization_level],
        prepacking=not lazy_weights.lazy_initializers(model),
        quiet=True,
    )


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
        return list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    except Exception:
        return []


def compare_models(
    original: ModelProto,
    optimized: ModelProto,
    *,
    seeds: Sequence[int] = (0, 1),
    dim_values: Mapping[str, int] | None = None,
) -> VerificationResult:
    """Run both models on the same random inputs per seed and compare every output by name.

    The optimized model must declare the same outputs in the same order, and produce arrays of
    the same dtype and shape, with NaNs and infinities in the same places and finite values
    within `tolerance`. If onnxruntime cannot run the original, the result is not ok and carries
    `skipped_reason`; if it cannot run the optimized model, that is a failure.
    """
    if not seeds:
        raise ValueError("compare_models needs at least one seed")
    names = [o.name for o in original.graph.output]
    interface = _interface_checks(original, optimized)
    if interface:
        return VerificationResult(ok=False, outputs=interface)

    try:
        feeds_per_seed = [make_inputs(original, seed, dim_values) for seed in seeds]
    except ValueError as e:
        return VerificationResult(
            ok=False, skipped_reason=f"cannot generate inputs for the original model: {e}"
        )
    try:
        session = inference_session(original, "disable_all")
        references = [run_session(session, feeds) for feeds in feeds_per_seed]
    except Exception as e:
        return VerificationResult(
            ok=False, skipped_reason=f"onnxruntime cannot run the original model: {one_line(e)}"
        )
    try:
        session = inference_session(optimized, "disable_all")
        results = [run_session(session, feeds) for feeds in feeds_per_seed]
    except Exception as e:
        detail = f"onnxruntime cannot run the optimized model: {one_line(e)}"
        checks = [OutputCheck(name, math.inf, 0.0, False, detail) for name in names]
        return VerificationResult(ok=False, outputs=checks)

    weakest = weakest_float_types(original)
    worst: dict[str, OutputCheck] = {}
    for ref, got in zip(references, results, strict=True):
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
