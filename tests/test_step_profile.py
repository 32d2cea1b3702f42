"""The compiled run's per-step profile: the native runner's clock stamps, the labels, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.step_profile import format_profile
from onnxsat.verification import make_inputs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_native_run_is_profiled_phase_by_phase_without_changing_its_outputs(threads: int) -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    feeds = make_inputs(model, seed=0)
    compiled = CompiledModel(model, CompileOptions(threads=threads, cache=False))
    want = compiled(feeds)
    exe = compiled.executable_for(feeds)
    assert exe.native is not None
    phases = compiled.profile(feeds, runs=3)
    assert len(phases) == len(exe.native.step_ends)
    assert sum(p.tasks for p in phases) == int(exe.native.step_ends[-1])
    assert sum(len(p.steps) for p in phases) == len(exe.program.steps)  # every step named once
    assert all(p.median_us > 0 for p in phases)  # each phase's end was stamped after its start
    assert any(p.steps[0].startswith(("matmul", "implicit conv")) and p.gflops > 0 for p in phases)
    got = compiled(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    table = format_profile(phases, top=3)
    assert len(table.splitlines()) == 5 and "total over" in table
    compiled.close()


def test_the_stamps_array_must_fit_the_table() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    feeds = make_inputs(model, seed=0)
    compiled = CompiledModel(model, CompileOptions(threads=1, cache=False))
    exe = compiled.executable_for(feeds)
    assert exe.native is not None
    with pytest.raises(ValueError, match="stamps"):
        exe.native.run(None, np.zeros(len(exe.native.step_ends), np.int64))
    with pytest.raises(ValueError, match="stamps"):
        exe.native.run(None, np.zeros(len(exe.native.step_ends) + 1, np.float64))


def test_a_program_with_a_fallback_is_profiled_step_by_step() -> None:
    model = onnx.load(str(EXAMPLES / "control_flow.onnx"))
    feeds = make_inputs(model, seed=0)
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    exe = compiled.executable_for(feeds)
    assert exe.native is None
    phases = compiled.profile(feeds, runs=2)
    assert len(phases) == len(exe.program.steps)
    assert any(p.steps[0].startswith("numpy ") for p in phases)
    assert all(p.median_us > 0 for p in phases)
    compiled.close()


def test_compile_profile_prints_the_slowest_steps() -> None:
    cmd = [sys.executable, "-m", "onnxsat", "compile", str(EXAMPLES / "small_cnn.onnx"), "--threads", "2", "--rounds", "3", "--no-cache"]
    shown = subprocess.run([*cmd, "--profile", "4"], capture_output=True, text=True, check=True).stdout
    assert "where a run's time goes (2 threads" in shown
    table = shown.split("where a run's time goes", 1)[1].splitlines()
    assert len(table) == 7  # heading line, column names, four steps, total
    result = json.loads(subprocess.run([*cmd, "--profile", "--json"], capture_output=True, text=True, check=True).stdout)
    assert result["profile"] and all(entry["median_us"] > 0 and entry["steps"] for entry in result["profile"])
