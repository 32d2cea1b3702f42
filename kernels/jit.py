"""MCJIT compilation for the host CPU, with an on-disk object cache.

The target machine uses the host CPU name and its feature string (AVX-512 where present), O3
with loop and SLP vectorization. Compiled objects are cached on disk under a key that covers the
IR, the target triple, the CPU name and features, the LLVM version and the onnxsat version, so
code built for one CPU is never replayed on another. Entries go through `onnxsat.base.disk_cache`:
a private directory (0700, this user's), a checksum per object (a truncated or altered one is
removed and rebuilt instead of crashing LLVM), fsync before rename. Code built from this
package's sources alone (``support_code``: the GEMM micro-kernel, the native runner) is keyed by
the sources' fingerprint instead, so a hit needs no IR at all.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable
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
        # kernels here are loops over whole rows, where 512-bit vectors measured faster.
        # Its cost model also takes masked gathers and scatters as cheap there, but they are
        # microcoded: a blocked depthwise conv that scattered each 8-channel vector over 8
        # planes ran 1.4x slower than with scalar stores, and stalled the SiLU after it
        # (EfficientNet-B0 x1.03, MobileNetV3-small x1.05, ShuffleNetV2 x1.04; the rest ties)
        features += ",-prefer-256-bit,+prefer-no-gather,+prefer-no-scatter"
    return HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(), features)


PIPELINE = "new-pm/o{level}+loop-vectorize+slp+unroll/v1"
"""Part of the cache key: change it when the optimization pipeline changes for the same IR."""


class CompiledModule:
    """A JIT-compiled LLVM module; ``address(name)`` gives a function's entry point."""

    def __init__(self, module: ir.Module, cache_dir: Path | None = None, opt_level: int = 3):
        host = host_target()
        self.tm = target_machine(host, opt_level)
        text = str(module)
        self.key = object_key(text, host, opt_level)
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


def target_machine(host: HostTarget, opt_level: int) -> llvm.TargetMachine:
    """The MCJIT target machine for ``host`` at ``opt_level``."""
    _init()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(
        cpu=host.cpu, features=host.features, opt=opt_level, codemodel="jitdefault"
    )


def _optimized(text: str, host: HostTarget, opt_level: int) -> tuple[llvm.TargetMachine, llvm.ModuleRef]:
    tm = target_machine(host, opt_level)
    llmod = llvm.parse_assembly(text)
    llmod.triple = host.triple
    llmod.data_layout = str(tm.target_data)
    llmod.verify()
    if opt_level > 0:
        pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_unrolling = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(llmod, pb)
    return tm, llmod


def emit_object(text: str, host: HostTarget, opt_level: int) -> bytes:
    """Object code for one LLVM module given as text: parse, verify, run the optimization pipeline
    (``PIPELINE``), emit. Pure in its arguments, so a compile process gives the same bytes as this one."""
    tm, llmod = _optimized(text, host, opt_level)
    return bytes(tm.emit_object(llmod))


def optimized_ir(text: str, host: HostTarget, opt_level: int) -> str:
    """The module as the optimization pipeline leaves it, before code generation (for tests and
    debugging: what vectorized, which intrinsics remained)."""
    return str(_optimized(text, host, opt_level)[1])


def assembly(text: str, host: HostTarget, opt_level: int) -> str:
    """The module's machine code as assembly text (for tests: which instructions a pattern became)."""
    tm, llmod = _optimized(text, host, opt_level)
    return str(tm.emit_assembly(llmod))


def object_key(text: str, host: HostTarget, opt_level: int) -> str:
    """The disk-cache key of ``emit_object(text, host, opt_level)``."""
    pipeline = PIPELINE.format(level=opt_level)
    return hashlib.sha256(f"{host.fingerprint}\n{pipeline}\n{text}".encode()).hexdigest()


class LoadedObjects:
    """Object files linked into one MCJIT engine; ``address(name)`` gives a function's entry point.

    ``cache_hit`` says whether every object came from a cache (no LLVM compile in this process)."""

    def __init__(
        self,
        objects: list[bytes],
        host: HostTarget,
        cache_hit: bool = False,
        texts: list[str] | None = None,
        opt_level: int = 3,
    ):
        """``texts``/``opt_level``: the modules the objects were compiled from, when known here
        (``optimized_ir`` needs them)."""
        tm = target_machine(host, 0)
        empty = llvm.parse_assembly("")
        empty.triple = host.triple
        empty.data_layout = str(tm.target_data)
        self.engine = llvm.create_mcjit_compiler(empty, tm)
        for data in objects:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        self.engine.finalize_object()
        self.cache_hit = cache_hit
        self._tm = tm
        self._host = host
        self._texts = texts
        self._opt_level = opt_level

    def optimized_ir(self) -> str:
        """Every module's optimized IR, recomputed from its text (not kept: it is large)."""
        if self._texts is None:
            raise ValueError("the module texts are not known (the code came from the artefact cache)")
        return "\n".join(optimized_ir(t, self._host, self._opt_level) for t in self._texts)

    def address(self, name: str) -> int:
        address = int(self.engine.get_function_address(name))
        if not address:
            raise KeyError(f"no compiled function {name!r}")
        return address


@functools.cache
def code_fingerprint() -> str:
    """sha256 of the lowering and kernels packages' sources (what turns a model into code)."""
    from onnxsat import lowering

    h = hashlib.sha256()
    for folder in (Path(lowering.__file__).resolve().parent, Path(__file__).resolve().parent):
        for path in sorted(folder.rglob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def support_entry(name: str, cache_dir: Path | None, opt_level: int = 3) -> Path | None:
    """Where the disk cache keeps the object of support module ``name`` (None: no cache). Its IR is
    a function of this package's sources alone, so the key is their fingerprint."""
    if cache_dir is None:
        return None
    key = hashlib.sha256(
        f"support|{name}|{code_fingerprint()}|{host_target().fingerprint}|{PIPELINE.format(level=opt_level)}".encode()
    ).hexdigest()
    return disk_cache.private_dir(cache_dir) / f"{key}.o"


def support_code(
    name: str, build: Callable[[], ir.Module], cache_dir: Path | None, opt_level: int = 3
) -> LoadedObjects:
    """Code this package builds from its own sources alone (the GEMM micro-kernel, the native
    runner), loaded from the disk cache (``support_entry``) without building or parsing any IR
    (that took ~0.3 s per process), or built, compiled and stored there."""
    host = host_target()
    entry = support_entry(name, cache_dir, opt_level)
    cached = disk_cache.read(entry) if entry is not None else None
    if cached is not None:
        return LoadedObjects([cached], host, cache_hit=True)
    text = str(build())
    obj = emit_object(text, host, opt_level)
    if entry is not None:
        disk_cache.write(entry, obj)
    return LoadedObjects([obj], host, texts=[text], opt_level=opt_level)
