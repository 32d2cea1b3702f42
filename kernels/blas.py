"""BLAS GEMM through a function pointer into the OpenBLAS that numpy ships (ctypes, GIL released).

numpy's wheels bundle ``libscipy_openblas64_`` (ILP64, symbols prefixed ``scipy_``). Calling its
``cblas_sgemm`` directly lets a step pass strided operands, alpha/beta and an output buffer with
no temporary; when the library is not found, ``np.matmul`` does the same work.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from collections.abc import Callable

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


@functools.cache
def _library() -> ctypes.CDLL | None:
    root = os.path.dirname(os.path.dirname(np.__file__))
    for pattern in ("numpy.libs/libscipy_openblas64_*.so*", "numpy.libs/libopenblas64_*.so*", "numpy.libs/libopenblas*.so*"):
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


@functools.cache
def gemm_function(dtype: str) -> Callable[..., None] | None:
    """``cblas_?gemm`` (row-major, 64-bit ints) for ``f32``/``f64``, or None when unavailable."""
    lib = _library()
    if lib is None:
        return None
    base = "sgemm" if dtype == "f32" else "dgemm"
    scalar = ctypes.c_float if dtype == "f32" else ctypes.c_double
    for name in (f"scipy_cblas_{base}64_", f"cblas_{base}64_", f"cblas_{base}"):
        fn = getattr(lib, name, None)
        if fn is None:
            continue
        i64, ptr, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        fn.argtypes = [cint, cint, cint, i64, i64, i64, scalar, ptr, i64, ptr, i64, scalar, ptr, i64]
        fn.restype = None
        return fn  # type: ignore[no-any-return]
    return None


@functools.cache
def _thread_local_setter() -> Callable[[int], int] | None:
    lib = _library()
    fn = getattr(lib, "openblas_set_num_threads_local", None) if lib is not None else None
    if fn is not None:
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def single_threaded_blas() -> int | None:
    """Make BLAS calls from the calling thread single-threaded (OpenBLAS's thread-local setting);
    returns the previous setting for ``restore_blas_threads``.

    The runtime splits GEMMs over its own threads; OpenBLAS's spinning worker threads on top of
    that cost far more than they give on a loaded machine. Other threads (numpy) are unaffected.
    """
    setter = _thread_local_setter()
    return int(setter(1)) if setter is not None else None


def restore_blas_threads(previous: int | None) -> None:
    """Give the calling thread back its BLAS thread setting (the caller's own numpy calls must
    not turn single-threaded because a compiled model ran on that thread)."""
    setter = _thread_local_setter()
    if setter is not None and previous is not None:
        setter(previous)


def blas_info() -> dict[str, str]:
    """Which BLAS library serves GEMM, for benchmark logs."""
    lib = _library()
    info = {"library": getattr(lib, "_name", "none") if lib is not None else "none (np.matmul)"}
    if lib is not None:
        cfg = getattr(lib, "scipy_openblas_get_config64_", None) or getattr(lib, "openblas_get_config", None)
        if cfg is not None:
            cfg.restype = ctypes.c_char_p
            info["config"] = cfg().decode()
    return info


def matrix_layout(shape: tuple[int, int], strides: tuple[int, int]) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a strided matrix for row-major BLAS, or None."""
    rows, cols = shape
    sr, sc = strides
    if sc == 1 and sr >= max(cols, 1):
        return NO_TRANS, sr
    if sr == 1 and sc >= max(rows, 1):
        return TRANS, sc
    if rows == 1 and sc == 1:
        return NO_TRANS, max(cols, 1)
    if cols == 1 and sr == 1:
        return TRANS, max(rows, 1)
    return None
