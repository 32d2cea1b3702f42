"""``onnxsat compile MODEL --target cuda``: PTX bundles without a GPU, or a checked GPU run.

``--emit-ptx DIR`` writes the bundle (``bundle``) and checks every PTX file with ``ptxas -v``
when ptxas is on PATH (registers and spills go in the report); ``--emit-check`` adds inputs and
the CPU backend's expected values for ``benchmarks/gpu_check.py``. Without ``--emit-ptx`` the
model runs on the GPU and is checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from onnxsat.base.errors import BadInputError


def run_cuda(args: argparse.Namespace) -> int:
    from onnxsat.base.modelio import load_model
    from onnxsat.base.options import Options
    from onnxsat.compile_command import parse_input_shapes, pin_input_shapes
    from onnxsat.verification import make_inputs

    from .kernels.cuda.plan import Launch
    from .kernels.cuda.ptx import target_machine

    if args.emit_check and args.emit_ptx is None:
        raise BadInputError("--emit-check needs --emit-ptx DIR")
    target_machine(args.arch)  # a bad --arch fails before any work
    original = pin_input_shapes(load_model(args.input), parse_input_shapes(args.input_shape))
    feeds = make_inputs(original, seed=0)
    if args.emit_ptx is None:
        return _run_on_gpu(args, original, feeds)
    model = original
    if not args.no_optimize:
        from onnxsat.pipeline import optimize

        model, _ = optimize(original, Options())
    cp, stats, manifest = emit_bundle(model, feeds, args.emit_ptx, args.arch, args.input, args.emit_check)
    launches = [s for s in cp.steps if isinstance(s, Launch)]
    result: dict[str, Any] = {
        "model": args.input,
        "target": "cuda",
        "arch": args.arch,
        "bundle": str(args.emit_ptx),
        "entry_points": len(cp.functions),
        "launches": len(launches),
        "host_steps": len(cp.steps) - len(launches),
        "forms": dict(Counter(s.form for s in launches)),
        "ptxas": None if stats is None else {
            "checked": len(stats),
            "max_registers": max((s.registers for s in stats.values()), default=0),
            "spill_bytes": sum(s.spill_stores + s.spill_loads for s in stats.values()),
            "kernels": {k: vars(v) for k, v in sorted(stats.items())},
        },
    }
    if "check" in manifest:
        result["check"] = manifest["check"]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"wrote {result['entry_points']} PTX entry points for {args.arch} to {args.emit_ptx}: {result['launches']} launches {result['forms']}, {result['host_steps']} host steps")
        if stats is None:
            print("ptxas not found on PATH: PTX not assembled")
        else:
            spills = result["ptxas"]["spill_bytes"]
            print(f"ptxas -arch={args.arch}: {len(stats)} entry points assembled, max {result['ptxas']['max_registers']} registers, {spills} spill bytes")
        if "check" in manifest:
            print(f"check data: {manifest['check']['launch_files']} launch files (run benchmarks/gpu_check.py {args.emit_ptx} on a GPU)")
    sys.stdout.flush()
    return 0


def emit_bundle(
    model: Any, feeds: dict[str, np.ndarray], out_dir: str | Path, arch: str, name: str, check: bool, check_steps: bool = True
) -> tuple[Any, Any, dict[str, Any]]:
    """Lower ``model`` at the shapes of ``feeds``, write its bundle; (CudaProgram, ptxas stats, manifest).

    ``check``: also write the CPU backend's expected values (and the weights) for gpu_check.py,
    per launch unless ``check_steps`` is False.
    """
    from onnxsat.lowering.lower import lower, value_inputs

    from .kernels.cuda.bundle import write_bundle
    from .kernels.cuda.plan import plan
    from .kernels.cuda.ptx import find_ptxas

    inits = {t.name for t in model.graph.initializer}
    shapes = {i.name: tuple(np.shape(feeds[i.name])) for i in model.graph.input if i.name not in inits}
    cp = plan(lower(model, shapes, {n: feeds[n] for n in value_inputs(model)}))
    ptx, stats = compile_and_check(cp, arch, find_ptxas() is not None)
    return cp, stats, write_bundle(out_dir, cp, ptx, stats, name, feeds if check else None, check_steps)


def compile_and_check(cp: Any, arch: str, assemble: bool) -> tuple[Any, Any]:
    """PTX for every entry point and, when ``assemble``, ptxas statistics (rejection raises)."""
    from .kernels.cuda.ptx import compile_ptx, ptxas_check_all

    ptx = compile_ptx(cp, arch)
    if not assemble:
        return ptx, None
    with tempfile.TemporaryDirectory(prefix="onnxsat-ptx-") as tmp:
        paths = []
        for name, text in ptx.ptx.items():
            path = Path(tmp) / f"{name}.ptx"
            path.write_text(text)
            paths.append(str(path))
        return ptx, ptxas_check_all(paths, arch)


def _run_on_gpu(args: argparse.Namespace, model: Any, feeds: dict[str, np.ndarray]) -> int:
    from onnxsat.base.options import Options
    from onnxsat.compile_command import check_outputs
    from onnxsat.latency import ort_session

    from .compiler import compile_cuda

    compiled = compile_cuda(model, Options(), optimize=not args.no_optimize)
    session = ort_session(model, level="all", threads=args.threads or 1)
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    errors = check_outputs(model, expected, compiled(feeds), "GPU result")
    out = {"model": args.input, "target": "cuda", "device": compiled.device.name, "max_abs_error": errors}
    print(json.dumps(out, indent=2) if args.json else f"ran {args.input} on {compiled.device.name}: matches onnxruntime {errors}")
    return 0
