"""A program's kernels to loaded native code: each distinct kernel once, cached by content,
compiled in parallel, and the whole set cached as one artefact.

Kernels that differ only in their buffers (repeated layers) share one function, named after its
canonical form's digest, so one kernel is one LLVM module with one object-cache entry, shared by
every model that has it. Missing objects are compiled over ``CompileOptions.jobs`` processes
(``compile_pool``) and linked into one MCJIT engine. With an artefact key, the whole result (all
objects and the kernel -> function map) is stored and found again without building LLVM IR.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from llvmlite import ir

from onnxsat.base import disk_cache
from onnxsat.lowering.kernel_ir import Kernel, canonical, render

from . import artefact_cache
from .codegen import build_module
from .compile_options import CompileOptions
from .compile_pool import compile_objects
from .jit import LoadedObjects, host_target, object_key, support_entry

PARALLEL_MIN_KERNELS = 4
"""Fewer kernels than this to compile are compiled in this process (a helper's start costs more)."""


@dataclass
class BuildStats:
    """Where a build's time went (seconds) and what the caches gave."""

    seconds: dict[str, float] = field(default_factory=dict)
    """llvm_ir, llvm_compile, load (and support: the shared runner and GEMM code, set by ``Executable``)."""
    kernels: int = 0
    """Distinct kernels (functions)."""
    compiled: int = 0
    """Objects compiled by LLVM in this build (the rest came from the object cache)."""
    artefact_hit: bool = False


def function_name(kernel: Kernel) -> tuple[str, Kernel]:
    """The content-derived function name of ``kernel`` and its canonical form so named."""
    canon = canonical(kernel)
    name = "k_" + hashlib.sha256(render(canon).encode()).hexdigest()[:24]
    return name, replace(canon, name=name)


def compile_kernels(
    kernels: list[Kernel], options: CompileOptions, key: str | None = None, support: Mapping[str, Callable[[], ir.Module]] | None = None
) -> tuple[LoadedObjects, dict[str, str], BuildStats]:
    """Native code for ``kernels``: the loaded objects, kernel name -> function name, and how
    the build went. ``key``: the artefact key of this set (None: no artefact cache). ``support``:
    shared modules (``jit.support_code`` name -> builder) whose objects the disk cache lacks are
    compiled in the same parallel batch and stored there, where ``support_code`` finds them (alone
    after the kernels they took most of a cold compile: ResNet-18's were ~8 s of ~9)."""
    stats = BuildStats()
    start = time.perf_counter()
    host = host_target()
    directory = cache_directory(options)
    names = {k.name for k in kernels}
    if directory is not None and key is not None:
        found = artefact_cache.load(directory, key)
        if found is not None and set(found.symbols) == names:
            loaded = LoadedObjects(found.objects, host, cache_hit=True)
            stats.artefact_hit, stats.kernels = True, len(found.objects)
            stats.seconds["load"] = time.perf_counter() - start
            return loaded, found.symbols, stats
    symbols: dict[str, str] = {}
    unique: dict[str, Kernel] = {}
    for kernel in kernels:
        fn, canon = function_name(kernel)
        symbols[kernel.name] = fn
        unique.setdefault(fn, canon)
    texts = [str(build_module([k], name=fn)) for fn, k in unique.items()]
    stats.kernels = len(texts)
    extra = _missing_support(support or {}, directory, options.opt_level)
    extra_texts = [str(build()) for build in extra.values()]
    stats.seconds["llvm_ir"] = time.perf_counter() - start
    mark = time.perf_counter()
    keys = [object_key(t, host, options.opt_level) for t in texts]
    objects: list[bytes | None] = [disk_cache.read(directory / f"{k}.o") if directory else None for k in keys]
    missing = [i for i, obj in enumerate(objects) if obj is None]
    jobs = options.compile_jobs if len(missing) + len(extra) >= PARALLEL_MIN_KERNELS or len(extra) > 1 else 1
    compiled = compile_objects([texts[i] for i in missing] + extra_texts, host, options.opt_level, jobs)
    for i, obj in zip(missing, compiled, strict=False):
        objects[i] = obj
        if directory is not None:
            disk_cache.write(directory / f"{keys[i]}.o", obj)
    for entry, obj in zip(extra, compiled[len(missing) :], strict=True):
        disk_cache.write(entry, obj)
    stats.compiled = len(missing)
    stats.seconds["llvm_compile"] = time.perf_counter() - mark
    mark = time.perf_counter()
    done = [obj for obj in objects if obj is not None]
    loaded = LoadedObjects(done, host, cache_hit=not missing, texts=texts, opt_level=options.opt_level)
    stats.seconds["load"] = time.perf_counter() - mark
    if directory is not None and key is not None:
        artefact_cache.store(directory, key, artefact_cache.Artefact(symbols, done))
    return loaded, symbols, stats


def _missing_support(support: Mapping[str, Callable[[], ir.Module]], directory: Path | None, opt_level: int) -> dict[Path, Callable[[], ir.Module]]:
    """Cache entry -> builder of the support modules the disk cache lacks (none without a cache:
    there is nowhere to leave them for ``support_code``)."""
    if directory is None:
        return {}
    entries = {support_entry(name, directory, opt_level): build for name, build in support.items()}
    return {entry: build for entry, build in entries.items() if entry is not None and not entry.exists()}


def prestart_helpers(options: CompileOptions) -> None:
    """Start the compile helpers now, so they boot while the model is lowered."""
    from .compile_pool import prestart

    if options.compile_jobs > 1:
        prestart(options.compile_jobs - 1)


def cache_directory(options: CompileOptions) -> Path | None:
    """The checked cache directory of ``options`` (None: off, or refused with a warning)."""
    directory = options.cache_path()
    return disk_cache.private_dir(directory) if directory is not None else None
