"""Models the fuzzer found wrong (minimized, in tests/data/fuzz/), checked with the fuzz property.

Each file is optimized with every extractor and must match the original on onnxruntime
(``fuzzing.check.check_case``). Open bugs are ``xfail(strict=True)`` with the reason naming the
code at fault: the test starts failing (XPASS) when the bug is fixed, and then the mark goes.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from .fuzzing.builder import FuzzCase
from .fuzzing.check import EXTRACTORS, check_case

DATA = Path(__file__).parent / "data" / "fuzz"

CASES: dict[str, str | None] = {
    # rules/families/core.py matmul-add-to-gemm had no dtype guard: int64 MatMul + Add became an int64
    # Gemm, which onnxruntime's CPU provider does not implement. Fixed: float types only.
    "int64_matmul_add": None,
    # rules/families/algebraic.py div-mul-const ((x/a)*b => x*(b/a)) reassociated integer Div, which
    # truncates: (x/2)*2 became x*1. Fixed: float types only.
    "int64_div_mul": None,
    # rules/families/algebraic.py mul-div-const ((x*a)/b => x*(a/b)): the same for (x*3)/2. Fixed likewise.
    "int64_mul_div": None,
    # onnxsat/verification.py took the tolerance from the OUTPUT dtype only: float32 math cast to
    # float64 at the end was held to float64's tolerance, so matmul-const-assoc's correct float32
    # reassociation (error ~1 float32 ulp) failed verification. Fixed: the tolerance follows the
    # least precise float type the output is computed in (weakest_float_types).
    "float32_matmuls_cast_to_float64": None,
}
"""File stem in tests/data/fuzz -> None (fixed) or why it still fails (the test is an xfail)."""


def _params() -> list:  # type: ignore[type-arg]
    params = []
    for stem, reason in CASES.items():
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params += [pytest.param(stem, extractor, marks=marks, id=f"{stem}-{extractor}") for extractor in EXTRACTORS]
    return params


def test_every_saved_model_is_listed() -> None:
    assert sorted(p.stem for p in DATA.glob("*.onnx")) == sorted(CASES)


@pytest.mark.parametrize(("stem", "extractor"), _params())
def test_fuzz_regression(stem: str, extractor: str) -> None:
    model = onnx.load(DATA / f"{stem}.onnx")
    problems, _ = check_case(FuzzCase(model), extractor)
    assert not problems, "\n".join(problems)
