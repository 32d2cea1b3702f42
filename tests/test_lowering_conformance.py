"""ONNX backend node tests through ``CompiledModel``: the conformance of the CPU lowering.

The denominator is every float32 node test of every op in the tensor language (``OPS``): a
single-node case whose tensors are float32, plus native integer/bool tensors for indices, shapes
and conditions. Cases that involve another floating format (float16, double, bfloat16, float8,
float4) or a packed sub-byte integer (int4, int2) are not float32 tests. A case passes only when
it compiled with no numpy fallback step and every output matches the expected values. The pass
rate per op is printed (run with ``-s`` to see it).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

from onnxsat.lowering.lower import LoweringError, lower, value_inputs
from tests.helpers_onnx import case_params, main_op, node_cases

NATIVE_AUX_TYPES = {2, 3, 4, 5, 6, 7, 9, 12, 13}
"""uint8, int8, uint16, int16, int32, int64, bool, uint32, uint64: index/shape/condition tensors."""
FLOAT = 1
PASS_RATE_FLOOR = 0.95

KNOWN_FAILURES: dict[str, str] = {}
"""Case name -> why it does not pass yet (each still counts as a failure in the pass rate)."""


def is_float32_case(case: Any) -> bool:
    graph = case.model.graph
    types = [v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)]
    return FLOAT in types and all(t == FLOAT or t in NATIVE_AUX_TYPES for t in types)


def float32_cases() -> list[Any]:
    return [c for c in node_cases() if is_float32_case(c)]


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> bool:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if expected.dtype.kind in "fc":
        return bool(np.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True))
    return bool(np.array_equal(actual, expected))


def evaluate(cases: list[Any], opt_level: int) -> dict[str, tuple[bool, str]]:
    """Case name -> (passed, detail), with all cases compiled in one LLVM module."""
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.executable import compile_together

    results: dict[str, tuple[bool, str]] = {}
    lowered = []
    for case in cases:
        inputs, _ = case.data_sets[0]
        feeds = dict(zip([i.name for i in case.model.graph.input], inputs, strict=False))
        known = {n: np.asarray(feeds[n]) for n in value_inputs(case.model)}
        shapes = {n: tuple(np.shape(v)) for n, v in feeds.items()}
        try:
            program = lower(case.model, shapes, known)
        except (LoweringError, NotImplementedError, ValueError, KeyError, AssertionError) as exc:
            results[case.name] = (False, f"lowering: {type(exc).__name__}: {exc}")
            continue
        if program.fallbacks:
            results[case.name] = (False, f"fallback: {dict(program.fallbacks)}")
            continue
        lowered.append((case, program))
    executables = compile_together([p for _, p in lowered], None, CompileOptions(threads=1, cache=False, opt_level=opt_level))
    for (case, _), exe in zip(lowered, executables, strict=True):
        ok, detail = True, "ok"
        for inputs, expected in case.data_sets:
            got = exe.run(dict(zip([i.name for i in case.model.graph.input], inputs, strict=False)))
            for vi, want in zip(case.model.graph.output, expected, strict=False):
                want = np.asarray(want)
                if not _close(got[vi.name], want, case.rtol, max(case.atol, 1e-6)):
                    same = got[vi.name].shape == want.shape
                    err = np.max(np.abs(got[vi.name].astype(np.float64) - want.astype(np.float64))) if same and want.size else "shape"
                    ok, detail = False, f"O{opt_level}: output {vi.name} differs (max abs err {err})"
        results[case.name] = (ok, detail)
    return results


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[bool, str]]:
    """Every case compiled without LLVM optimizations (fast), and the first case of every op again
    at O3 (vectorized, reassociated reductions): a case passes when every run of it passes."""
    cases = float32_cases()
    results = evaluate(cases, 0)
    first_per_op = list({str(main_op(c)): c for c in reversed(cases)}.values())
    for name, (ok, detail) in evaluate(first_per_op, 3).items():
        if not ok:
            results[name] = (False, detail)
    by_op: dict[str, list[bool]] = collections.defaultdict(list)
    for case in cases:
        by_op[str(main_op(case))].append(results[case.name][0])
    total = sum(sum(v) for v in by_op.values())
    print(f"\nCPU lowering conformance: {total}/{len(cases)} float32 node tests pass ({total / max(len(cases), 1):.1%})")
    for op, flags in sorted(by_op.items()):
        print(f"  {op:<20} {sum(flags):>3}/{len(flags):<3}")
    for name, (ok, detail) in sorted(results.items()):
        if not ok:
            print(f"  FAIL {name}: {detail}")
    return results


def test_pass_rate_floor(outcomes: dict[str, tuple[bool, str]]) -> None:
    passed = sum(ok for ok, _ in outcomes.values())
    assert outcomes, "no float32 node tests found"
    assert passed / len(outcomes) >= PASS_RATE_FLOOR, f"only {passed}/{len(outcomes)} pass"


def test_every_modelled_op_has_float32_cases_or_none_exist() -> None:
    """The denominator covers the language: every op with a float32 backend test is in it."""
    ops = {main_op(c) for c in float32_cases()}
    assert {"Add", "MatMul", "Conv", "Softmax", "LayerNormalization"} <= ops


@pytest.mark.parametrize("case", case_params(float32_cases()))
def test_node_case(case: Any, outcomes: dict[str, tuple[bool, str]]) -> None:
    if case.name in KNOWN_FAILURES:
        pytest.skip(KNOWN_FAILURES[case.name])
    ok, detail = outcomes[case.name]
    assert ok, detail


def test_lowering_table_covers_every_modelled_op() -> None:
    """One op, one row: every op of the tensor language has a lowering rule."""
    from onnxsat.egraph.ops import OPS
    from onnxsat.lowering.table import LOWERINGS, load_rules

    load_rules()
    assert sorted(set(OPS) - set(LOWERINGS)) == []
