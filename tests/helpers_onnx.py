"""Shared helpers for the op-level tests: ONNX backend node cases, fast import, round trip, running.

* ``node_cases()`` generates the ONNX backend node test cases of the modelled ops at test time
  (the onnx wheel ships no node test files), keeping single-node cases whose node is a modelled
  op and dropping training/random/sequence cases and cases newer than the installed onnx.
* ``imported(model)`` imports a model with ``from_onnx`` as ``optimize`` does: into a reused
  e-graph that holds the analysis rules its import may fire (``egraph.reach``; tens of the ~500,
  so declaring them costs milliseconds), reverted with ``push``/``pop`` after each import (whose
  cost grows with the rules declared: ~0.1-0.3 s with every rule). One e-graph per rule subset is
  kept per process. ``fresh=True`` imports into a new ``EGraph`` with every analysis rule (a few
  tests check both agree).
* ``roundtrip(program)`` extracts and exports without any rewrite, as ``optimize`` does.
* ``run_model`` runs a model on onnxruntime or ``onnx.reference``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsat.egraph import importer as _importer
from onnxsat.egraph import lang as L
from onnxsat.egraph.exporter import to_onnx
from onnxsat.egraph.fold import fold_constants
from onnxsat.egraph.ops import OPS
from onnxsat.egraph.program import Program
from onnxsat.egraph.shapes import shape_rules
from onnxsat.extract.cost import RooflineCost
from onnxsat.extract.greedy import extract_greedy
from onnxsat.extract.serialized import serialize

NEWEST_OPSET = onnx.defs.onnx_opset_version()
EXCLUDED_WORDS = ("training", "random", "sequence", "_seq_")
"""Backend cases with these in their name are out of scope (training mode, random ops, sequences)."""


# ---------------------------------------------------------------- backend node test cases
def _module_key(name: str) -> str:
    return name.replace("_", "").lower()


@functools.cache
def _generated_cases(full: bool) -> tuple[Any, ...]:
    """All generated backend node cases (``full``), or those of the modules named after modelled ops.

    Generating every case takes ~18 s (pooling references dominate); the modules of the modelled
    ops are found by name (``maxpool.py`` holds MaxPool, ``batch_normalization.py``
    BatchNormalization...). ``test_node_case_modules_are_complete`` checks nothing is missed.
    """
    import onnx.backend.test.case.node as node_cases

    if full:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tuple(node_cases.collect_testcases(None))
    return _cases_of_modules(frozenset(OPS))


def _cases_of_modules(ops: frozenset[str]) -> tuple[Any, ...]:
    """The cases generated so far, after importing the case modules named after ``ops``."""
    import onnx.backend.test.case.node as node_cases

    wanted = {_module_key(op) for op in ops}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in pkgutil.iter_modules(node_cases.__path__):
            if _module_key(info.name) in wanted:
                importlib.import_module(f"{node_cases.__name__}.{info.name}")
    # collect_testcases appends to this list as modules are imported; read it without
    # importing every other module.
    return tuple(node_cases._NodeTestCases)


def single_node_cases(ops: frozenset[str]) -> list[Any]:
    """The generated single-node cases of ``ops`` (any opset, any type), sorted by name."""
    cases = {c.name: c for c in _cases_of_modules(ops)}.values()
    chosen = [c for c in cases if c.model is not None and len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in ops]
    return sorted(chosen, key=lambda c: c.name)


def case_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def main_op(case: Any) -> str | None:
    """The op a case tests: its only node's op_type (None for multi-node cases and for function
    expansions of other ops, ``*_expanded*``, whose body may be one modelled node)."""
    model = case.model
    if model is None or len(model.graph.node) != 1 or "_expanded" in case.name:
        return None
    node = model.graph.node[0]
    return node.op_type if node.domain in ("", "ai.onnx") else None


def in_scope(case: Any) -> bool:
    op = main_op(case)
    if op is None or op not in OPS or not case.data_sets:
        return False
    if case_opset(case.model) > NEWEST_OPSET:
        return False
    return not any(word in case.name for word in EXCLUDED_WORDS)


def node_cases(*, full: bool = False) -> list[Any]:
    """In-scope backend node cases of the modelled ops, sorted by (op, name)."""
    cases = [c for c in _generated_cases(full) if in_scope(c)]
    return sorted(cases, key=lambda c: (main_op(c), c.name))


def case_params(cases: Sequence[Any]) -> list[Any]:
    """``pytest.param(case, id='Op-test_name')`` for each case."""
    import pytest

    return [pytest.param(c, id=f"{main_op(c)}-{c.name.removeprefix('test_')}") for c in cases]


# ---------------------------------------------------------------- import
@functools.cache
def _warm_egraph(rules: bool = False) -> Any:
    """An empty e-graph that already holds the compiled shape rules (and, with ``rules``, the
    rewrite rulesets ``optimize`` runs by default: registering them costs ~1-3 s per e-graph)."""
    from egglog import EGraph

    egraph = EGraph()
    egraph.run(shape_rules.saturate())
    if rules:
        from onnxsat.base.options import Budgets
        from onnxsat.rules.schedule import rewrite_step, schedule_rulesets, select_rules

        for names in schedule_rulesets(select_rules(), Budgets()):  # the rulesets saturate() runs
            egraph.run(rewrite_step(names, Budgets()))
    return egraph


@contextmanager
def warm_import(rules: bool = False) -> Iterator[None]:
    """The next ``from_onnx`` in this block gets the warmed e-graph (reverted on exit); any later
    one in the block gets a fresh ``EGraph`` as usual. ``rules``: the e-graph also holds the
    default rewrite rules (for running ``optimize`` many times)."""
    egraph = _warm_egraph(rules)
    original = _importer.EGraph
    handed_out = False

    def factory() -> Any:
        nonlocal handed_out
        if handed_out:
            return original()
        handed_out = True
        return egraph

    egraph.push()
    _importer.EGraph = factory  # type: ignore[assignment]
    try:
        yield
    finally:
        _importer.EGraph = original  # type: ignore[assignment]
        egraph.pop()


_ANALYSIS_EGRAPHS: dict[tuple[str, ...], Any] = {}
"""Analysis-rule key -> an e-graph with those rules declared (``imported``)."""


@contextmanager
def imported(
    model: onnx.ModelProto,
    *,
    trust_onnx_shapes: bool = False,
    input_shapes: dict[str, list[int]] | None = None,
    fresh: bool = False,
) -> Iterator[Program]:
    """``from_onnx(model)``, valid inside the ``with`` block (see the module docstring)."""
    if fresh:
        yield _importer.from_onnx(model, input_shapes, trust_onnx_shapes=trust_onnx_shapes)
        return
    from egglog import EGraph

    from onnxsat.base.options import Budgets
    from onnxsat.egraph.warm import WarmEGraph
    from onnxsat.rules.schedule import declarations

    key, schedules, selection = declarations([], Budgets(), start=_importer.import_symbols(model))
    egraph = _ANALYSIS_EGRAPHS.get(key)
    if egraph is None:
        egraph = _ANALYSIS_EGRAPHS[key] = EGraph()
        for schedule in schedules:
            egraph.run(schedule * 0)  # declares the rules; runs nothing
    egraph.push()
    try:
        yield _importer.from_onnx(
            model, input_shapes, trust_onnx_shapes=trust_onnx_shapes, warm=WarmEGraph(egraph, selection)
        )
    finally:
        egraph.pop()


def analysis_shape(program: Program, name: str) -> tuple[int, ...] | None:
    """The analysis' shape of original tensor ``name`` (>= 0 known, < 0 symbolic), or None."""
    value = program.egraph.lookup_function_value(L.shape(program.terms[name]))
    if value is None:
        return None
    return tuple(int(v.value) for v in value.value)


def analysis_dtype(program: Program, name: str) -> int | None:
    value = program.egraph.lookup_function_value(L.dtype(program.terms[name]))
    return None if value is None else int(value.value)


def symbolic_shape(program: Program, name: str) -> tuple[int | str, ...] | None:
    """The analysis' shape with symbolic dims replaced by their names."""
    dims = analysis_shape(program, name)
    if dims is None:
        return None
    return tuple(d if d >= 0 else program.symbols.get(d, f"?{d}") for d in dims)


def onnx_inferred(
    model: onnx.ModelProto,
) -> dict[str, tuple[int | None, tuple[int | str | None, ...] | None]]:
    """ONNX shape inference: name -> (elem_type or None, dims or None); dims are ints, names or None."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    out: dict[str, tuple[int | None, tuple[int | str | None, ...] | None]] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
            )
        out[vi.name] = (tt.elem_type or None, dims)
    return out


def fully_known(dims: Sequence[Any] | None) -> bool:
    return dims is not None and all(isinstance(d, int) and d >= 0 for d in dims)


# ---------------------------------------------------------------- round trip
def roundtrip(program: Program, original: onnx.ModelProto) -> onnx.ModelProto:
    """Extract (greedy, roofline cost) and export without rewrites, then fold like ``optimize``."""
    serialized = serialize(program.egraph)
    roots = [serialized.roots[i] for i in range(len(program.outputs))]
    graph = extract_greedy(serialized, RooflineCost(), roots)
    exported = to_onnx(program, graph)
    folded, _ = fold_constants(exported)
    return folded


# ---------------------------------------------------------------- running
def to_numpy(value: Any) -> Any:
    """Case data as numpy (TensorProto values are converted; numpy scalars become 0-d arrays)."""
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def feeds_for(model: onnx.ModelProto, inputs: Sequence[Any]) -> dict[str, Any]:
    """The case's inputs by graph input name (the case lists values for present inputs in order)."""
    names = [i.name for i in model.graph.input]
    return {n: to_numpy(v) for n, v in zip(names, inputs, strict=False)}


def run_ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def ort_ran_ops(model: onnx.ModelProto, folder: Path) -> Counter[str]:
    """Op counts of the graph onnxruntime runs for ``model`` at ORT_ENABLE_ALL (after its own
    fusions), written to ``folder`` by onnxruntime and read back."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.optimized_model_filepath = str(folder / "ort.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(folder / "ort.onnx").graph.node)


def run_reference(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(ReferenceEvaluator(model).run(None, feeds))


def outputs_match(actual: Sequence[Any], expected: Sequence[Any], rtol: float, atol: float) -> str | None:
    """None when every output matches (shape, dtype kind and values within tolerance), else why."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        a, e = np.asarray(to_numpy(a)), np.asarray(to_numpy(e))
        if a.shape != e.shape:
            return f"output {i}: shape {a.shape}, expected {e.shape}"
        if a.dtype != e.dtype and not (a.dtype.kind == e.dtype.kind == "O"):
            return f"output {i}: dtype {a.dtype}, expected {e.dtype}"
        if a.dtype.kind in "fc" or e.dtype.kind in "fc":
            af, ef = a.astype(np.float64), e.astype(np.float64)
            ok = np.isclose(af, ef, rtol=rtol, atol=atol, equal_nan=True)
            if not ok.all():
                bad = np.abs(af - ef)[~ok]
                return f"output {i}: {int((~ok).sum())} values differ (max abs err {np.nanmax(bad) if bad.size else 'nan'})"
        elif a.dtype.kind in "biu" or a.dtype.kind == "O":
            if not np.array_equal(a, e):
                return f"output {i}: values differ"
        else:  # float8/float4/int4 and other custom types: compare their bits as floats
            if not np.array_equal(a.astype(np.float32), e.astype(np.float32), equal_nan=True):
                return f"output {i}: values differ"
    return None


def engine_for(case: Any) -> str:
    """``"onnxruntime"`` when ORT runs the original case and reproduces its expected outputs
    (cached per case), else ``"reference"`` (``onnx.reference.ReferenceEvaluator``).

    ORT lacks some kernels/types of the newest opsets (float4/int2/float8 variants, bfloat16 I/O,
    Pow with unsigned exponents) and returns float8 outputs as raw uint8.
    """
    if case.name not in _ENGINES:
        inputs, expected = case.data_sets[0]
        try:
            got = run_ort(case.model, feeds_for(case.model, inputs))
            ok = outputs_match(got, expected, case.rtol, case.atol) is None
        except Exception:  # noqa: BLE001  (no kernel / type / opset in ORT)
            ok = False
        _ENGINES[case.name] = "onnxruntime" if ok else "reference"
    return _ENGINES[case.name]


_ENGINES: dict[str, str] = {}


def run_with(engine: str, model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    return run_ort(model, feeds) if engine == "onnxruntime" else run_reference(model, feeds)


# ---------------------------------------------------------------- one import per case
@dataclass
class CaseResult:
    """What importing one backend case (``trust_onnx_shapes=False``) and exporting it gave."""

    shapes: dict[str, tuple[int, ...] | None]
    dtypes: dict[str, int | None]
    symbols: dict[int, str]
    opaque: bool
    opaque_reasons: dict[str, int]
    unknown_ops: dict[str, int]
    exported: onnx.ModelProto | None = None
    export_error: str | None = None


@functools.cache
def _case_result(name: str) -> CaseResult:
    case = _CASES_BY_NAME[name]
    with imported(case.model) as program:
        result = CaseResult(
            shapes={n: analysis_shape(program, n) for n in program.terms},
            dtypes={n: analysis_dtype(program, n) for n in program.terms},
            symbols=dict(program.symbols),
            opaque=bool(program.opaque),
            opaque_reasons=dict(program.opaque_reasons),
            unknown_ops=dict(program.unknown_ops),
        )
        try:
            result.exported = roundtrip(program, case.model)
        except Exception as exc:  # noqa: BLE001  (reported by the round-trip test)
            result.export_error = f"{type(exc).__name__}: {exc}"
    return result


_CASES_BY_NAME: dict[str, Any] = {}


def case_result(case: Any) -> CaseResult:
    """Import + export of a backend case, computed once per process (both test files use it)."""
    _CASES_BY_NAME[case.name] = case
    return _case_result(case.name)


EXPECTED_OPAQUE: dict[str, str] = {
    # AveragePool dilations (opset 19) are not modelled by average_pool.
    r"test_averagepool_\w*dilations\w*": "AveragePool with dilations",
    # Cast's saturate (opset 19) / round_mode (opset 25) float8 attributes are not modelled.
    r"test_cast_no_saturate_\w+": "attributes ['saturate'] not modelled",
    r"test_cast_e8m0_FLOAT(16)?_to_FLOAT8E8M0": "attributes ['round_mode', 'saturate'] not modelled",
    r"test_convtranspose_autopad_same": "ConvTranspose with auto_pad SAME",
    r"test_convtranspose_(kernel_shape|output_shape)": "ConvTranspose with output_shape",
    # The cases also output Mean and InvStdDev; the modelled op has one output.
    r"test_layer_normalization_\w+": "LayerNormalization: extra outputs are used",
    # The Indices output of MaxPool is not modelled.
    r"test_maxpool_with_argmax_\w+": "MaxPool: extra outputs are used",
}
"""Backend cases that hit a real unsupported feature: case-name pattern -> the opaque reason."""


def expected_opaque_reason(name: str) -> str | None:
    for pattern, reason in EXPECTED_OPAQUE.items():
        if re.fullmatch(pattern, name):
            return reason
    return None


# ---------------------------------------------------------------- generated models
def int64s(name: str, values: list[int]) -> onnx.TensorProto:
    """An int64 vector initializer (shape, axes, pads and slice operands)."""
    return numpy_helper.from_array(np.array(values, np.int64), name)


def vi(name: str, elem: int, shape: Sequence[int | str | None]) -> onnx.ValueInfoProto:
    """A tensor value info; ``None`` dims are unknown (graph outputs need a shape to pass the checker)."""
    return helper.make_tensor_value_info(name, elem, shape)


def out_vi(name: str, elem: int, rank: int) -> onnx.ValueInfoProto:
    """A graph output of known rank and unknown dims (shape inference fills in the rest)."""
    return helper.make_tensor_value_info(name, elem, [None] * rank)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opset: int,
    initializers: Sequence[TensorProto] = (),
) -> onnx.ModelProto:
    """A checked model at ``opset`` with the oldest IR version that supports it (as converters write)."""
    opsets = [helper.make_opsetid("", opset)]
    ir_version = helper.find_min_ir_version_for(opsets)
    inputs = list(inputs)
    if ir_version < 4:  # initializers must also be graph inputs before IR 4
        inputs += [vi(t.name, t.data_type, list(t.dims)) for t in initializers]
    graph = helper.make_graph(list(nodes), "g", inputs, list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    onnx.checker.check_model(model, full_check=True)
    return model
