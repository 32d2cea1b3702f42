"""``CudaModel``: a model compiled to PTX and run on a GPU through the driver API.

Like the CPU ``CompiledModel`` it specializes on input shapes at the first call. Every buffer is
its own device allocation (so kernel pointers never alias and are 256-byte aligned), constants
are uploaded once, launches run in order on one stream, and host steps (numpy fallbacks) copy
their buffers down, run the CPU backend's runner, and copy the results back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnxsat.base.errors import OnnxsatError
from onnxsat.lowering.kernel_ir import NUMPY_DTYPES
from onnxsat.lowering.lower import LoweringError, lower, value_inputs
from onnxsat.lowering.program import KernelProgram, step_buffers, step_writes

from .driver import CudaUnavailable, Device, launch_args
from .plan import CudaProgram, HostStep, Launch, plan
from .ptx import ARCHS, compile_ptx


class CudaTargetError(OnnxsatError):
    """The cuda target cannot run here (no cuda-python, no GPU, unsupported device)."""

    exit_code = 2


def open_device(ordinal: int = 0) -> Device:
    try:
        return Device(ordinal)
    except CudaUnavailable as exc:
        raise CudaTargetError(f"target 'cuda' is not available: {exc}") from exc


class _Loaded:
    """One planned program on the device: buffers allocated, constants uploaded, functions loaded."""

    def __init__(self, device: Device, cp: CudaProgram, arch: str):
        self.device, self.cp = device, cp
        ptx = compile_ptx(cp, arch)
        self.functions = {name: device.function(device.load_ptx(text), name) for name, text in ptx.ptx.items()}
        self.buffers = cp.buffers()
        self.pointers = {name: device.alloc(buf.nbytes) for name, buf in self.buffers.items()}
        for name, value in {**cp.program.constants, **cp.tables}.items():
            buf = self.buffers.get(name)
            if buf is None:
                continue  # folded away: no step reads it
            device.upload(self.pointers[name], np.ascontiguousarray(np.asarray(value).reshape(buf.shape), dtype=NUMPY_DTYPES[buf.dtype]))
        host = [s.step for s in cp.steps if isinstance(s, HostStep)]
        self.host_runners = dict(zip(map(id, host), _host_runners(cp.program, host), strict=True))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        d = self.device
        for name, buf in self.cp.program.inputs:
            d.upload(self.pointers[buf.name], np.ascontiguousarray(feeds[name], dtype=NUMPY_DTYPES[buf.dtype]).reshape(buf.shape))
        for step in self.cp.steps:
            if isinstance(step, Launch):
                if step.elements:
                    d.launch(self.functions[step.function], step.grid, step.block, step.shared_bytes, launch_args([_spec(a) for a in step.args], self.pointers))
            else:
                self._host(step)
        outputs = {}
        for name, buf in self.cp.program.outputs:
            outputs[name] = d.download(self.pointers[buf.name], np.empty(buf.shape, dtype=NUMPY_DTYPES[buf.dtype]))
        return outputs

    def _host(self, step: HostStep) -> None:
        arrays = {b.name: self.device.download(self.pointers[b.name], np.empty(b.shape, dtype=NUMPY_DTYPES[b.dtype])) for b in step_buffers(step.step)}
        self.host_runners[id(step.step)](arrays)
        for b in step_writes(step.step):
            self.device.upload(self.pointers[b.name], arrays[b.name])

    def close(self) -> None:
        for ptr in self.pointers.values():
            self.device.free(ptr)
        self.pointers.clear()


def _spec(arg: Any) -> dict[str, Any]:
    return {"kind": arg.kind, "value": arg.value, "dtype": arg.dtype}


def _host_runners(program: KernelProgram, steps: list[Any]) -> list[Any]:
    from dataclasses import replace

    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.executable import Executable

    if not steps:
        return []
    return list(Executable(replace(program, steps=list(steps)), None, CompileOptions(threads=1, cache=False)).runners)


class CudaModel:
    """Call with keyword arrays or a dict; returns a dict of numpy outputs (computed on the GPU)."""

    def __init__(self, model: onnx.ModelProto, device: Device | None = None, arch: str | None = None):
        self.model = model
        self.device = device or open_device()
        self.arch = arch or _nearest_arch(self.device.arch)
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.value_inputs = value_inputs(model)
        self._loaded: dict[Any, _Loaded] = {}
        self.optimize_report: Any = None

    def loaded_for(self, feeds: dict[str, np.ndarray]) -> _Loaded:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise LoweringError(f"missing input(s) {', '.join(missing)}")
        shapes = {n: tuple(np.shape(feeds[n])) for n in self.input_names}
        known = {n: np.asarray(feeds[n]) for n in self.value_inputs}
        key = (tuple(sorted(shapes.items())), tuple((k, v.tobytes()) for k, v in sorted(known.items())))
        if key not in self._loaded:
            self._loaded[key] = _Loaded(self.device, plan(lower(self.model, shapes, known)), self.arch)
        return self._loaded[key]

    def __call__(self, feeds: dict[str, np.ndarray] | None = None, **kwargs: np.ndarray) -> dict[str, np.ndarray]:
        inputs = dict(feeds or {}, **kwargs)
        return self.loaded_for(inputs).run(inputs)

    def close(self) -> None:
        for loaded in self._loaded.values():
            loaded.close()
        self._loaded.clear()


def _nearest_arch(device_arch: str) -> str:
    """The newest PTX target not above the device (PTX JIT-compiles forward, never backward)."""
    cc = int(device_arch[3:])
    usable = [a for a in ARCHS if int(a[3:]) <= cc]
    if not usable:
        raise CudaTargetError(f"GPU {device_arch} is older than the oldest supported target {ARCHS[0]}")
    return usable[-1]
