"""NVVM IR -> PTX with llvmlite's NVPTX target; libdevice linked; ``ptxas`` checks and statistics.

Each entry point is compiled in a module of its own, so every ``.ptx`` file is self-contained and
loads on its own, and compile time grows linearly with the number of kernels. A module that
calls ``__nv_*`` math gets libdevice (``libdevice.10.bc`` from the CUDA toolkit, parsed once per
process) linked in; every symbol but the entry point is then made internal and dead globals are
dropped *before* optimizing, so the optimizer only sees (and inlines) the libdevice functions
used instead of all ~350 of them.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import llvmlite.binding as llvm
from llvmlite import ir

from onnxsat.base.errors import OnnxsatError

from .gemm import add_gemm_kernel, gemm_kernel_name
from .nvvm import TRIPLE, add_kernel
from .plan import CudaProgram

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
DEFAULT_ARCH = "sm_90"
PTX_ISA = "+ptx80"
"""PTX ISA 8.0: accepted by ptxas for sm_80 through sm_90 (CUDA 12.0 or later drivers)."""
LIBDEVICE_GLOBS = (
    "{cuda}/nvvm/libdevice/libdevice.10.bc",
    "/usr/local/cuda*/nvvm/libdevice/libdevice.10.bc",
    "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc",
)

_INIT_LOCK = threading.Lock()
_READY = False


class CudaToolError(OnnxsatError):
    """The CUDA toolkit pieces this needs (libdevice, ptxas) are missing, or ptxas rejected PTX."""

    exit_code = 2


def _init() -> None:
    global _READY
    with _INIT_LOCK:
        if not _READY:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _READY = True


def find_libdevice() -> str:
    """Path of ``libdevice.10.bc`` (``$CUDA_HOME``/``$CUDA_PATH``, then the usual install places)."""
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for pattern in LIBDEVICE_GLOBS:
        found = sorted(glob.glob(pattern.format(cuda=cuda)))
        if found:
            return found[-1]
    raise CudaToolError("libdevice.10.bc not found: install the CUDA toolkit or set CUDA_HOME")


@lru_cache(maxsize=1)
def _libdevice_bitcode() -> bytes:
    with open(find_libdevice(), "rb") as f:
        return f.read()


def target_machine(arch: str) -> llvm.TargetMachine:
    if arch not in ARCHS:
        raise CudaToolError(f"unsupported --arch {arch!r} (choose from {', '.join(ARCHS)})")
    _init()
    return llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, features=PTX_ISA, opt=3)


def build_module(cp: CudaProgram, only: str | None = None) -> ir.Module:
    """The NVVM IR module holding every entry point of ``cp`` (or just the one named ``only``)."""
    module = ir.Module(name=only or "onnxsat_cuda")
    module.triple = TRIPLE
    for name, kernel in cp.kernels.items():
        if only in (None, name):
            add_kernel(module, kernel, cp.forms[name])
    for dtype in sorted(cp.gemm_dtypes):
        if only in (None, gemm_kernel_name(dtype)):
            add_gemm_kernel(module, dtype)
    return module


@dataclass
class PtxModule:
    """Each entry point's PTX text for one target architecture."""

    arch: str
    ptx: dict[str, str]


_LIBDEVICE_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _parsed_libdevice() -> llvm.ModuleRef:
    return llvm.parse_bitcode(_libdevice_bitcode())


def _libdevice_copy() -> llvm.ModuleRef:
    with _LIBDEVICE_LOCK:
        return _parsed_libdevice().clone()


def compile_ptx(cp: CudaProgram, arch: str = DEFAULT_ARCH) -> PtxModule:
    """Compile every entry point of ``cp`` to PTX for ``arch`` (no GPU needed)."""
    tm = target_machine(arch)
    return PtxModule(arch, {name: compile_entry(build_module(cp, only=name), name, tm) for name in cp.functions})


def compile_entry(module: ir.Module, name: str, tm: llvm.TargetMachine) -> str:
    """PTX for the entry point ``name`` of ``module``: link libdevice if needed, internalize,
    drop dead globals, optimize at O3, emit."""
    llmod = llvm.parse_assembly(str(module))
    if any(f.is_declaration and f.name.startswith("__nv_") for f in llmod.functions):
        llmod.link_in(_libdevice_copy())
    llmod.triple = TRIPLE
    llmod.data_layout = str(tm.target_data)
    _internalize(llmod, keep={name})
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    dce = llvm.create_new_module_pass_manager()
    dce.add_global_dead_code_eliminate_pass()
    dce.run(llmod, pb)
    llmod.verify()
    pb.getModulePassManager().run(llmod, pb)
    return str(tm.emit_assembly(llmod))


def _internalize(mod: llvm.ModuleRef, keep: set[str]) -> None:
    for fn in mod.functions:
        if not fn.is_declaration and fn.name not in keep:
            fn.linkage = llvm.Linkage.internal
    for gv in mod.global_variables:
        if not gv.is_declaration:
            gv.linkage = llvm.Linkage.internal


# ---------------------------------------------------------------- ptxas
@dataclass(frozen=True)
class PtxasStats:
    """What ``ptxas -v`` reports for one entry point."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int


def find_ptxas() -> str | None:
    found = shutil.which("ptxas")
    if found:
        return found
    for candidate in sorted(glob.glob("/usr/local/cuda*/bin/ptxas")):
        return candidate
    return None


_STATS = re.compile(
    r"Function properties for (?P<fn>\S+)\s+(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, "
    r"(?P<ld>\d+) bytes spill loads.*?Used (?P<regs>\d+) registers(?P<rest>[^\n]*)",
    re.S,
)


def parse_ptxas_verbose(text: str) -> dict[str, PtxasStats]:
    """Entry point -> statistics from ``ptxas -v`` output."""
    stats: dict[str, PtxasStats] = {}
    for m in _STATS.finditer(text):
        smem = re.search(r"(\d+) bytes smem", m.group("rest"))
        stats[m.group("fn")] = PtxasStats(
            int(m.group("regs")), int(m.group("st")), int(m.group("ld")), int(m.group("stack")), int(smem.group(1)) if smem else 0
        )
    return stats


def ptxas_check(path: str, arch: str, ptxas: str | None = None) -> dict[str, PtxasStats]:
    """Assemble the PTX file at ``path`` for ``arch``; raise ``CudaToolError`` with ptxas's message
    when it is rejected. Returns the per-entry statistics."""
    exe = ptxas or find_ptxas()
    if exe is None:
        raise CudaToolError("ptxas not found on PATH (install the CUDA toolkit)")
    proc = subprocess.run([exe, f"-arch={arch}", "-v", path, "-o", os.devnull], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()
        raise CudaToolError(f"ptxas rejected {path}: {first[0] if first else 'exit ' + str(proc.returncode)}")
    return parse_ptxas_verbose(proc.stdout + proc.stderr)


def ptxas_check_all(paths: list[str], arch: str, workers: int | None = None) -> dict[str, PtxasStats]:
    """``ptxas_check`` on many files in parallel; statistics of every entry point."""
    exe = find_ptxas()
    if exe is None:
        raise CudaToolError("ptxas not found on PATH (install the CUDA toolkit)")
    merged: dict[str, PtxasStats] = {}
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        for stats in pool.map(lambda p: ptxas_check(p, arch, exe), paths):
            merged.update(stats)
    return merged
