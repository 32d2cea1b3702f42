"""Real models through the CPU lowering: every light model (seeded random weights) and every example
compiles and matches onnxruntime.

The cheap light models compile without LLVM optimizations (``opt_level=0``), the heavy ones (marked
slow) at O3, which costs less than running unoptimized code on them; the examples compile at O3,
and one goes through the public ``onnxsat.compile`` (optimize with small budgets, then lower).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxsat
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from tests.models import (
    EXAMPLES,
    LIGHT_MODELS,
    expose_pre_softmax,
    heavy_light,
    load_light,
    randomize_weights,
)
from tests.test_examples_models import RUNNABLE, _random_feeds

CHEAP_LIGHT = {"light_squeezenet.onnx", "light_shufflenet.onnx", "light_inception_v1.onnx"}
"""The light models that compile and run in a few seconds; the others are marked slow."""
RTOL, ATOL = 1e-3, 1e-4


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        # float32 sums of a wide range (light_shufflenet's logits reach 4e6) differ by their order's
        # rounding: each element within RTOL of its own value or 1e-4 of the output's largest
        scale = float(np.max(np.abs(expected))) if expected.size and expected.dtype.kind == "f" else 0.0
        np.testing.assert_allclose(got[name], expected, rtol=RTOL, atol=ATOL + 1e-4 * scale, err_msg=name)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in CHEAP_LIGHT else heavy_light(n)) for n in LIGHT_MODELS]
)
def test_light_model_matches_onnxruntime(name: str) -> None:
    from onnxsat.verification import make_inputs

    model = expose_pre_softmax(randomize_weights(load_light(name)))
    feeds = make_inputs(model, seed=0)
    # O0 compiles the small models fastest; the heavy ones spend longer running than compiling
    compiled = CompiledModel(model, CompileOptions(threads=1, cache=False, opt_level=0 if name in CHEAP_LIGHT else 3))
    _assert_matches(compiled(feeds), _ort(model, feeds))
    assert not compiled.stats(feeds).fallbacks, "every op of the light models has a native lowering"


@pytest.mark.parametrize("name", RUNNABLE)
def test_example_matches_onnxruntime(name: str) -> None:
    model = onnx.load(str(EXAMPLES / f"{name}.onnx"))
    compiled = CompiledModel(model, CompileOptions(cache=False))
    rng = np.random.default_rng(0)
    for _ in range(3):  # control_flow takes both branches
        feeds = _random_feeds(model, rng)
        _assert_matches(compiled(feeds), _ort(model, feeds))


def test_public_compile_optimizes_then_lowers() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    options = onnxsat.Options(budgets=onnxsat.Budgets(iterations=2, seconds=5.0), verify_seeds=(0,))
    compiled = onnxsat.compile(model, target="cpu", options=options)
    assert compiled.optimize_report is not None
    feeds = _random_feeds(model, np.random.default_rng(1))
    _assert_matches(compiled(**feeds), _ort(model, feeds))


def test_unknown_target_is_a_clear_error() -> None:
    from onnxsat.base.errors import OnnxsatError

    with pytest.raises(OnnxsatError, match="target 'tpu'"):
        onnxsat.compile(onnx.load(str(EXAMPLES / "small_cnn.onnx")), target="tpu")


def test_cli_compile_checks_against_onnxruntime(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from onnxsat.cli import main

    assert main(["compile", str(EXAMPLES / "transformer_block.onnx"), "--no-optimize", "--input-shape", "input_ids:2,7",
                 "--input-shape", "attention_mask:2,7", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kernels"] > 0 and result["fallbacks"] == {}
    assert all(err < 1e-3 for err in result["max_abs_error"].values())


def test_cli_compile_bad_input_is_one_line_exit_2(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from onnxsat.cli import main

    assert main(["compile", "does-not-exist.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnxsat: error:") and "\n" not in err


@pytest.mark.parametrize("name", ["llama-decode-dynamo-dynamic", "bert-ts-dynamic"])
def test_public_compile_of_a_transformer_export_is_one_native_call(name: str) -> None:
    """Attention, masks (comparisons, And, GatherND) and norms all lower to kernels: no fallback
    splits the compiled model (optimize keeps the model's opset for compile, so attention is
    written as the chain the lowering fuses, not an opset-23 op it has no kernel for)."""
    import json
    from pathlib import Path

    from tests.realmodels_feeds import feeds_for

    data = Path(__file__).parent / "data" / "realmodels"
    record = json.loads((data / "INDEX.json").read_text())[name]
    model = onnx.load(data / record["file"])
    compiled = onnxsat.compile(model, compile_options=CompileOptions(cache=False, opt_level=0))
    feeds = feeds_for(record["inputs"], seed=11)
    _assert_matches(compiled(feeds), _ort(model, feeds))
    assert compiled.stats(feeds).one_native_call, compiled.stats(feeds).fallbacks
