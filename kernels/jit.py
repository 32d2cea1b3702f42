"""MCJIT compilation for the host CPU, with an on-disk object cache.

The target machine uses the host CPU name and its feature string (AVX-512 where present), O3
with loop and SLP vectorization. Compiled objects are cached on disk under a key that covers the
IR, the target triple, the CPU name and features, the LLVM version and the onnxsat version, so
code built for one CPU is never replayed on another. Entries go through `onnxsat.base.disk_cache`:
a private directory (0700, this user's), a checksum per object (a truncated or altered one is
removed and rebuilt instead of crashing LLVM), fsync before rename.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
from llvmlite import ir

from onnxsat.base import disk_cache

_INIT_LOCK = threading.Lock()
_READY = False


def _init() -> None:
    global _READY
    with _INIT_LOCK:
        if not _READY:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _READY = True


@dataclass(frozen=True)
class HostTarget:
    triple: str
    cpu: str
    features: str

    @property
    def fingerprint(self) -> str:
        from onnxsat.base import __version__

        return f"{self.triple}|{self.cpu}|{self.features}|llvm{llvm.llvm_version_info}|llvmlite{llvmlite.__version__}|onnxsat{__version__}"


def host_target() -> HostTarget:
    _init()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        # LLVM tunes AVX-512 CPUs to prefer 256-bit vectors (clock drops on old Xeons); the
        # kernels here are loops over whole rows, where 512-bit vectors measured faster
        features += ",-prefer-256-bit"
    return HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(), features)


PIPELINE = "new-pm/o{level}+loop-vectorize+slp+unroll/v1"
"""Part of the cache key: change it when the optimization pipeline changes for the same IR."""


def default_cache_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "onnxsat" / "kernels"


class CompiledModule:
    """A JIT-compiled LLVM module; ``address(name)`` gives a function's entry point."""

    def __init__(self, module: ir.Module, cache_dir: Path | None = None, opt_level: int = 3):
        _init()
        host = host_target()
        target = llvm.Target.from_triple(host.triple)
        self.tm = target.create_target_machine(cpu=host.cpu, features=host.features, opt=opt_level, codemodel="jitdefault")
        text = str(module)
        pipeline = PIPELINE.format(level=opt_level)
        self.key = hashlib.sha256(f"{host.fingerprint}\n{pipeline}\n{text}".encode()).hexdigest()
        self.cache_hit = False
        directory = disk_cache.private_dir(cache_dir) if cache_dir is not None else None
        cache_file = directory / f"{self.key}.o" if directory is not None else None
        cached = disk_cache.read(cache_file) if cache_file is not None else None
        llmod = llvm.parse_assembly(text)
        llmod.triple = host.triple
        llmod.data_layout = str(self.tm.target_data)
        llmod.verify()
        if cached is None and opt_level > 0:
            pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            pto.loop_unrolling = True
            pb = llvm.create_pass_builder(self.tm, pto)
            pb.getModulePassManager().run(llmod, pb)
        self.optimized_ir = str(llmod) if cached is None else None
        self.engine = llvm.create_mcjit_compiler(llmod, self.tm)

        def notify(mod: object, data: bytes) -> None:
            if cache_file is not None and cached is None:
                disk_cache.write(cache_file, data)

        def getbuffer(mod: object) -> bytes | None:
            if cached is not None:
                self.cache_hit = True
            return cached

        self.engine.set_object_cache(notify, getbuffer)
        self.engine.finalize_object()
        self._module = llmod

    def address(self, name: str) -> int:
        return int(self.engine.get_function_address(name))

    def assembly(self) -> str:
        return str(self.tm.emit_assembly(self._module))
