"""Weights are held once: optimizing and verifying a model of inline weights must not copy them
per stage (shape inference, the checker and onnxruntime take a whole serialized copy each when
handed the full model). Measured in a fresh process as the growth of its peak resident set
(Linux VmHWM) over the resident set once the model is loaded and the optimizer imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from onnxsat.base.modelio import weight_bytes

from .models import mlp

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


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's /proc")
def test_peak_memory_grows_by_at_most_a_few_copies_of_the_weights(tmp_path: Path, rule_cache_dir: Path) -> None:
    path = tmp_path / "mlp.onnx"
    model = mlp(WEIGHT_MIB, HIDDEN)
    onnx.save(model, str(path))
    weights = weight_bytes(model)
    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "ONNXSAT_CACHE_DIR": str(rule_cache_dir)},  # the rules are read, not built
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["verified"] == "passed"
    limit = FIXED_MIB * 2**20 + EXTRA_PER_WEIGHT * weights
    assert result["growth"] <= limit, (
        f"peak grew by {result['growth'] / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"
        f" (at most {limit / 2**20:.0f} MiB)"
    )
