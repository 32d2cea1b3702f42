"""The same input and options give a byte-identical output, whatever PYTHONHASHSEED is."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from .models import EXAMPLES, LIGHT_DIR

_SCRIPT = """
import hashlib, sys, onnx, onnxsat
model, _ = onnxsat.optimize(onnx.load(sys.argv[1]), onnxsat.Options(verify=False))
print(hashlib.sha256(model.SerializeToString()).hexdigest())
"""


def _digest(path: str, seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, path], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "path",
    [str(EXAMPLES / "transformer_block.onnx"), str(EXAMPLES / "layout_algebra.onnx"), str(LIGHT_DIR / "light_shufflenet.onnx")],
    ids=["transformer", "layout_algebra", "shufflenet"],
)
def test_output_is_byte_identical_across_hash_seeds(path: str) -> None:
    first, second = _digest(path, "1"), _digest(path, "4242")
    assert first == second
    assert len(first) == len(hashlib.sha256().hexdigest())
