"""Weights are held once: optimizing and verifying a model of inline weights must not copy them
per stage (shape inference, the checker and onnxruntime take a whole serialized copy each when
handed the full model). Measured in a fresh process as the growth of its peak resident set
(Linux VmHWM) over the resident set once the model is loaded and the optimizer imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

WEIGHT_MIB = 48
HIDDEN = 1024
EXTRA_PER_WEIGHT = 2.5
"""Peak growth allowed per weight byte: the optimized model's own copy, onnxruntime's copy while
verifying, and slack (measured: about 2x). When shape inference, the checker, the byte counts and
onnxruntime were handed the whole model, the growth was about 7x (454 MiB for 48 MiB of weights)."""
FIXED_MIB = 160
"""The growth that does not scale with the weights (egglog's tables, onnxruntime's arenas)."""

_MEASURE = textwrap.dedent(
    """
    import json, sys, warnings
    from pathlib import Path

    def status(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
        raise RuntimeError(key)

    import onnx
    import onnxsat
    from onnxsat.base.options import Budgets, Options
    import onnxsat.pipeline  # the optimizer's modules: a fixed cost paid before the model matters

    model = onnx.load(sys.argv[1])
    before = status("VmRSS:")
    optimized, report = onnxsat.optimize(model, Options(budgets=Budgets(iterations=2)))
    print(json.dumps({"growth": status("VmHWM:") - before, "verified": report.verification.status}))
    """
)


def _mlp(path: Path, weight_mib: int) -> int:
    """MatMul -> Add -> Relu layers of seeded float32 weights, inline; returns the weight bytes."""
    rng = np.random.default_rng(0)
    layers = max(1, round(weight_mib * 2**20 / (4 * HIDDEN * HIDDEN)))
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) / np.float32(np.sqrt(HIDDEN))
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(HIDDEN, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, HIDDEN])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return layers * (HIDDEN * HIDDEN + HIDDEN) * 4


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's /proc")
def test_peak_memory_grows_by_at_most_a_few_copies_of_the_weights(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    weights = _mlp(path, WEIGHT_MIB)
    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["verified"] == "passed"
    limit = FIXED_MIB * 2**20 + EXTRA_PER_WEIGHT * weights
    assert result["growth"] <= limit, (
        f"peak grew by {result['growth'] / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"
        f" (at most {limit / 2**20:.0f} MiB)"
    )
