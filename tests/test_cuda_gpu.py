"""The CUDA backend on a GPU (``pytest -m cuda``): compiled models match onnxruntime, and a
``--emit-check`` bundle passes ``benchmarks/gpu_check.py``. Without cuda-python or a GPU the
GPU tests skip, and the public API raises one clear error instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxsat
from tests.models import EXAMPLES, expose_pre_softmax, load_light, randomize_weights

ROOT = Path(__file__).resolve().parent.parent


def _device_or_none() -> object | None:
    from onnxsat.kernels.cuda.driver import CudaUnavailable, Device

    try:
        return Device()
    except CudaUnavailable:
        return None


def test_cuda_target_without_a_gpu_is_a_clear_error() -> None:
    if _device_or_none() is not None:
        pytest.skip("a GPU is present")
    from onnxsat.kernels.cuda.runtime import CudaTargetError

    model = onnx.load(str(EXAMPLES / "layout_algebra.onnx"))
    with pytest.raises(CudaTargetError, match="target 'cuda' is not available"):
        onnxsat.compile(model, target="cuda")


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["small_cnn", "transformer_block", "inception_block", "layout_algebra", "light_squeezenet.onnx"])
def test_gpu_matches_onnxruntime(name: str) -> None:
    if _device_or_none() is None:
        pytest.skip("no CUDA GPU")
    from onnxsat.kernels.cuda.runtime import CudaModel
    from onnxsat.verification import make_inputs

    model = expose_pre_softmax(randomize_weights(load_light(name))) if name.endswith(".onnx") else onnx.load(str(EXAMPLES / f"{name}.onnx"))
    feeds = make_inputs(model, seed=0, dim_values={"batch": 2, "seq": 7})
    got = CudaModel(model)(feeds)
    for key, want in _ort(model, feeds).items():
        np.testing.assert_allclose(got[key], want, rtol=1e-3, atol=1e-4, err_msg=key)


@pytest.mark.cuda
def test_gpu_check_passes_on_a_bundle(tmp_path: Path) -> None:
    if _device_or_none() is None:
        pytest.skip("no CUDA GPU")
    bundle = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "onnxsat", "compile", str(EXAMPLES / "small_cnn.onnx"), "--target", "cuda", "--no-optimize",
                    "--emit-ptx", str(bundle), "--emit-check"], check=True, timeout=600)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(bundle), "--budget-s", "30"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
