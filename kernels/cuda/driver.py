"""The CUDA driver API through cuda-python, in the few calls onnxsat needs.

This module imports nothing from onnxsat (only numpy and, lazily, cuda-python), so
``benchmarks/gpu_check.py`` can load it by path on a GPU machine without egglog or onnx.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class CudaUnavailable(RuntimeError):
    """cuda-python is not installed, or no CUDA device/driver is present."""


class CudaError(RuntimeError):
    """A driver call failed."""


def load_driver() -> Any:
    """The cuda-python driver module (``cuda.bindings.driver``; older releases: ``cuda.cuda``)."""
    try:
        from cuda.bindings import driver

        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # type: ignore[no-redef]

        return driver
    except ImportError as exc:
        raise CudaUnavailable("the cuda target needs cuda-python: pip install 'onnxsat[cuda]'") from exc


def _check(driver: Any, result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(CUresult, value...)`` tuple; raise on an error code."""
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)
        label = name[1].decode() if isinstance(name, tuple) and len(name) > 1 and name[1] else str(err)
        raise CudaError(f"{what} failed: {label}")
    rest = values[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


class Device:
    """One GPU with its primary context and one stream."""

    def __init__(self, ordinal: int = 0):
        self.driver = d = load_driver()
        try:
            _check(d, d.cuInit(0), "cuInit")
            count = _check(d, d.cuDeviceGetCount(), "cuDeviceGetCount")
        except CudaError as exc:
            raise CudaUnavailable(f"no usable CUDA driver/device ({exc})") from exc
        if count <= ordinal:
            raise CudaUnavailable(f"no CUDA device {ordinal} (found {count})")
        self.device = _check(d, d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(d, d.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        _check(d, d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = _check(d, d.cuStreamCreate(0), "cuStreamCreate")
        attr = d.CUdevice_attribute
        major = self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.sm_count = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        raw = _check(d, d.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        self._keep: list[Any] = []

    def attribute(self, which: Any) -> int:
        return int(_check(self.driver, self.driver.cuDeviceGetAttribute(which, self.device), "cuDeviceGetAttribute"))

    # ------------------------------------------------------------ code
    def load_ptx(self, ptx: str) -> Any:
        """A module from PTX text (the driver JIT-compiles it for this device)."""
        image = np.frombuffer(ptx.encode() + b"\0", dtype=np.uint8)
        module = _check(self.driver, self.driver.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")
        self._keep.append(module)
        return module

    def function(self, module: Any, name: str) -> Any:
        return _check(self.driver, self.driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")

    # ------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> int:
        """Device memory (at least one byte, so every buffer has a distinct, 256-aligned address)."""
        return int(_check(self.driver, self.driver.cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        _check(self.driver, self.driver.cuMemFree(ptr), "cuMemFree")

    def upload(self, ptr: int, array: np.ndarray) -> None:
        host = np.ascontiguousarray(array)
        if host.nbytes:
            _check(self.driver, self.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def download(self, ptr: int, out: np.ndarray) -> np.ndarray:
        assert out.flags.c_contiguous
        if out.nbytes:
            self.synchronize()
            _check(self.driver, self.driver.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy on the stream (the reference for memory bandwidth)."""
        _check(self.driver, self.driver.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream), "cuMemcpyDtoDAsync")

    # ------------------------------------------------------------ launches and timing
    def launch(
        self, function: Any, grid: Sequence[int], block: Sequence[int], shared: int, args: Sequence[tuple[str, Any]]
    ) -> None:
        """Launch on the stream; ``args`` are ``(kind, value)``: ``ptr``, ``i64``, ``f32``, ``f64``."""
        kinds = {"ptr": np.uint64, "i64": np.int64, "f32": np.float32, "f64": np.float64}
        values = [np.array([value], dtype=kinds[kind]) for kind, value in args]
        pointers = np.array([v.ctypes.data for v in values], dtype=np.uint64)
        _check(
            self.driver,
            self.driver.cuLaunchKernel(function, *grid, *block, shared, self.stream, pointers.ctypes.data, 0),
            "cuLaunchKernel",
        )

    def synchronize(self) -> None:
        _check(self.driver, self.driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def time_ms(self, work: Any, repeats: int) -> float:
        """Mean milliseconds of ``work()`` over ``repeats`` runs, timed with stream events."""
        d = self.driver
        start = _check(d, d.cuEventCreate(0), "cuEventCreate")
        stop = _check(d, d.cuEventCreate(0), "cuEventCreate")
        work()
        _check(d, d.cuEventRecord(start, self.stream), "cuEventRecord")
        for _ in range(repeats):
            work()
        _check(d, d.cuEventRecord(stop, self.stream), "cuEventRecord")
        _check(d, d.cuEventSynchronize(stop), "cuEventSynchronize")
        ms = float(_check(d, d.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
        d.cuEventDestroy(start)
        d.cuEventDestroy(stop)
        return ms / repeats


def capture_graph(dev: Device, work: Any) -> Any:
    """An instantiated CUDA graph of the launches ``work()`` issues on ``dev``'s stream.

    Replaying it costs one launch, so a whole-model time is the GPU's time rather than the
    Python launch loop's (tens of microseconds per ``cuLaunchKernel`` call from Python).
    """
    d = dev.driver
    mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    _check(d, d.cuStreamBeginCapture(dev.stream, mode), "cuStreamBeginCapture")
    try:
        work()
    finally:
        graph = _check(d, d.cuStreamEndCapture(dev.stream), "cuStreamEndCapture")
    # cuda-bindings 12+: cuGraphInstantiate(graph, flags); older releases spell it ...WithFlags
    instantiate = getattr(d, "cuGraphInstantiateWithFlags", None) or d.cuGraphInstantiate
    executable = _check(d, instantiate(graph, 0), "cuGraphInstantiate")
    dev._keep.append(graph)
    return executable


def replay_graph(dev: Device, executable: Any) -> None:
    _check(dev.driver, dev.driver.cuGraphLaunch(executable, dev.stream), "cuGraphLaunch")


def launch_args(arg_specs: Sequence[dict[str, Any]], pointers: dict[str, int]) -> list[tuple[str, Any]]:
    """Manifest argument specs (``{"kind": "buffer"|"i64"|"float", ...}``) as ``Device.launch`` args."""
    out: list[tuple[str, Any]] = []
    for spec in arg_specs:
        if spec["kind"] == "buffer":
            out.append(("ptr", pointers[spec["value"]]))
        elif spec["kind"] == "i64":
            out.append(("i64", int(spec["value"])))
        else:
            out.append((spec["dtype"], float(spec["value"])))
    return out
