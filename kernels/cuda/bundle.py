"""``--emit-ptx DIR`` and ``--emit-check``: a directory a GPU machine can run without onnxsat.

``DIR/manifest.json`` lists the entry points (PTX file, form, ptxas registers and spills), the
buffer table (name, dtype, shape, role), and the steps in order: launches (function, grid,
block, arguments) and host steps (numpy fallbacks the GPU does not run). ``DIR/<function>.ptx``
holds one entry point each. ``constants.npz`` holds the GEMM offset tables and,
with ``--emit-check``, the weights; ``--emit-check`` also writes ``check/model.npz`` (graph inputs and the CPU backend's outputs) and
``check/step_NNNN.npz`` for every launch (its buffers before the step and what it wrote after),
computed by the CPU backend, so ``benchmarks/gpu_check.py`` checks each kernel on its own.
Keys in the npz files are ``b<index>`` into the buffer table.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from onnxsat.lowering.kernel_ir import NUMPY_DTYPES
from onnxsat.lowering.program import KernelProgram, step_buffers, step_writes

from .plan import CudaProgram, HostStep, Launch
from .ptx import PtxasStats, PtxModule

FORMAT = "onnxsat-cuda-bundle/1"


def buffer_table(cp: CudaProgram) -> list[dict[str, Any]]:
    """Every buffer with its role: ``input``, ``output``, ``constant`` or ``intermediate``."""
    program = cp.program
    inputs = {b.name for _, b in program.inputs}
    outputs = {b.name for _, b in program.outputs}
    constants = set(program.constants) | set(cp.tables)
    table = []
    for name, buf in sorted(cp.buffers().items()):
        role = "input" if name in inputs else "output" if name in outputs else "constant" if name in constants else "intermediate"
        table.append({"name": name, "dtype": buf.dtype, "shape": list(buf.shape), "role": role})
    return table


def manifest(cp: CudaProgram, ptx: PtxModule, stats: Mapping[str, PtxasStats] | None, model: str) -> dict[str, Any]:
    kernels = []
    for fn in cp.functions:
        entry: dict[str, Any] = {"function": fn, "file": f"{fn}.ptx", "form": cp.forms.get(fn, "gemm")}
        if stats is not None and fn in stats:
            entry.update(asdict(stats[fn]))
        kernels.append(entry)
    steps: list[dict[str, Any]] = []
    for step in cp.steps:
        if isinstance(step, Launch):
            steps.append(
                {
                    "kind": "launch",
                    "step": step.step,
                    "function": step.function,
                    "form": step.form,
                    "grid": list(step.grid),
                    "block": list(step.block),
                    "shared_bytes": step.shared_bytes,
                    "args": [asdict(a) for a in step.args],
                    "writes": list(step.writes),
                    "elements": step.elements,
                }
            )
        else:
            steps.append(
                {
                    "kind": "host",
                    "step": type(step.step).__name__,
                    "reason": step.reason,
                    "reads": [b.name for b in step_buffers(step.step)],
                    "writes": [b.name for b in step_writes(step.step)],
                }
            )
    return {
        "format": FORMAT,
        "model": model,
        "arch": ptx.arch,
        "kernels": kernels,
        "buffers": buffer_table(cp),
        "inputs": [[n, b.name] for n, b in cp.program.inputs],
        "outputs": [[n, b.name] for n, b in cp.program.outputs],
        "steps": steps,
    }


def write_bundle(
    out_dir: str | Path,
    cp: CudaProgram,
    ptx: PtxModule,
    stats: Mapping[str, PtxasStats] | None,
    model: str,
    check: Mapping[str, np.ndarray] | None = None,
    check_steps: bool = True,
) -> dict[str, Any]:
    """Write the bundle atomically (a temporary sibling directory renamed into place).

    ``check``: graph input feeds; when given, the check files are computed and written too
    (with ``check_steps`` False only the whole model's: per-launch files of a large model can
    outgrow what travels to a GPU machine). Returns the manifest.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        data = manifest(cp, ptx, stats, model)
        for fn, text in ptx.ptx.items():
            (tmp / f"{fn}.ptx").write_text(text)
        index = {b["name"]: i for i, b in enumerate(data["buffers"])}
        # GEMM offset tables are always needed to launch; weights only for checking (they can be large)
        values = {**cp.tables, **(cp.program.constants if check is not None else {})}
        np.savez(tmp / "constants.npz", **{f"b{index[n]}": np.asarray(v) for n, v in values.items() if n in index})  # type: ignore[arg-type]
        if check is not None:
            data["check"] = write_check(tmp, cp, data["buffers"], check, check_steps)
        (tmp / "manifest.json").write_text(json.dumps(data, indent=1))
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return data


def _replace_dir(new: Path, target: Path) -> None:
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
        os.replace(target, old / "x")
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, target)


def write_check(
    out: Path, cp: CudaProgram, table: list[dict[str, Any]], feeds: Mapping[str, np.ndarray], steps: bool = True
) -> dict[str, Any]:
    """Run the program on the CPU backend step by step and save what each launch should do."""
    index = {b["name"]: i for i, b in enumerate(table)}
    arrays = cpu_arrays(cp, feeds)
    (out / "check").mkdir()
    runners = cpu_step_runners(cp.program)
    launches = 0
    for i, (step, runner) in enumerate(zip(cp.steps, runners, strict=True)):
        if isinstance(step, Launch) and steps:
            names = [a.value for a in step.args if a.kind == "buffer"]
            before = {f"b{index[n]}": arrays[n].copy() for n in names}  # type: ignore[index]
            runner(arrays)
            after = {f"b{index[n]}": arrays[n] for n in step.writes}
            np.savez(out / "check" / f"step_{i:04d}.npz", **{f"before_{k}": v for k, v in before.items()}, **{f"after_{k}": v for k, v in after.items()})  # type: ignore[arg-type]
            launches += 1
        else:
            runner(arrays)
    graph = {f"in_b{index[b.name]}": arrays[b.name] for _, b in cp.program.inputs}
    graph.update({f"out_b{index[b.name]}": arrays[b.name] for _, b in cp.program.outputs})
    np.savez(out / "check" / "model.npz", **graph)  # type: ignore[arg-type]
    return {"launch_files": launches, "host_steps": sum(isinstance(s, HostStep) for s in cp.steps)}


def cpu_arrays(cp: CudaProgram, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A separate array per buffer (no arena sharing), constants and inputs filled in."""
    arrays: dict[str, np.ndarray] = {}
    for name, buf in cp.buffers().items():
        arrays[name] = np.zeros(buf.shape, dtype=NUMPY_DTYPES[buf.dtype])
    for name, value in {**cp.program.constants, **cp.tables}.items():
        if name not in arrays:
            continue  # folded away: no step reads it
        np.copyto(arrays[name], np.asarray(value).reshape(arrays[name].shape), casting="unsafe")
    for graph_name, buf in cp.program.inputs:
        np.copyto(arrays[buf.name], np.asarray(feeds[graph_name]).reshape(buf.shape), casting="unsafe")
    return arrays


def cpu_step_runners(program: KernelProgram) -> list[Any]:
    """The CPU backend's runner for each step (each takes the buffer-name -> array dict)."""
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.executable import Executable

    return list(Executable(program, None, CompileOptions(threads=1, cache=False)).runners)
