"""The math library on a CPU without AVX-512: the divisions of sigmoid/erf/tanh become ``rcpps``
(12-bit estimate) plus a Newton step instead of ``vrcp14ps``, and must stay as accurate."""

from __future__ import annotations

import re

import pytest

from onnxsat.kernels import jit
from tests.test_kernels_codegen import test_math_library_accuracy as _accuracy


@pytest.mark.parametrize("op", ["sigmoid", "erf", "tanh"])
def test_math_library_accuracy_without_avx512(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    host = jit.host_target()
    features = ",".join("-" + f[1:] if re.match(r"\+avx512", f) else f for f in host.features.split(","))
    assert "+avx512f" not in features.split(",")
    monkeypatch.setattr(jit, "host_target", lambda: jit.HostTarget(host.triple, host.cpu, features))
    _accuracy(op)
