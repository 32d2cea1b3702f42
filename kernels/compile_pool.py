"""LLVM modules compiled to object code in parallel, by helper processes.

llvmlite serializes every call into LLVM behind one process-wide lock (``llvmlite.binding.ffi``),
so threads compile one module at a time; separate processes do not share it. The helpers are
plain subprocesses (``serve``, on this process's import path) that read modules as text on
stdin and write object code on stdout: nothing is pickled, no ``__main__`` is re-imported (a
script without a main guard works), and nothing is forked from a process where egglog's threads
run (the child execs at once). They start on first use, are reused by later compiles in the
process and end with it. This process compiles one share itself while the helpers do the rest,
and a helper that fails costs a warning and a compile here, never a wrong object.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import struct
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .jit import HostTarget, emit_object

_LEN = struct.Struct("<Q")
_LOCK = threading.Lock()
_HELPERS: list[subprocess.Popen[bytes]] = []


def _write_frame(stream: object, payload: bytes) -> None:
    stream.write(_LEN.pack(len(payload)) + payload)  # type: ignore[attr-defined]
    stream.flush()  # type: ignore[attr-defined]


def _read_frame(stream: object) -> bytes:
    head = stream.read(_LEN.size)  # type: ignore[attr-defined]
    if len(head) != _LEN.size:
        raise EOFError("compile helper closed its output")
    (size,) = _LEN.unpack(head)
    payload: bytes = stream.read(size)  # type: ignore[attr-defined]
    if len(payload) != size:
        raise EOFError("compile helper output cut short")
    return payload


_HELPER_CODE = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); from onnxsat.kernels.compile_pool import serve; serve()"
"""A helper's program: this process's import path exactly (``-I``: no current directory, user site
or PYTHONPATH of its own), so it runs this checkout's compiler even when started from another."""


def _start_helper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _HELPER_CODE, json.dumps(sys.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def prestart(helpers: int) -> None:
    """Start ``helpers`` helper processes now (they boot while the caller lowers the model). One
    that cannot start costs a warning: its share is compiled in this process."""
    with _LOCK:
        _HELPERS[:] = [h for h in _HELPERS if h.poll() is None]
        while len(_HELPERS) < helpers:
            try:
                _HELPERS.append(_start_helper())
            except OSError as exc:
                warnings.warn(
                    f"kernel compile helper could not start ({exc}); compiling in this process", stacklevel=2
                )
                return


def _take_helpers(count: int) -> list[subprocess.Popen[bytes]]:
    prestart(count)
    with _LOCK:
        taken, _HELPERS[:] = _HELPERS[:count], _HELPERS[count:]
    return taken


def _give_back(helpers: list[subprocess.Popen[bytes]]) -> None:
    with _LOCK:
        _HELPERS.extend(h for h in helpers if h.poll() is None)


@atexit.register
def shutdown() -> None:
    """End the helper processes (closing stdin is their signal to exit)."""
    with _LOCK:
        helpers, _HELPERS[:] = list(_HELPERS), []
    for helper in helpers:
        with contextlib.suppress(OSError, ValueError):
            assert helper.stdin is not None
            helper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            helper.wait(timeout=2)
        if helper.poll() is None:
            helper.kill()


def _remote(
    helper: subprocess.Popen[bytes], texts: list[str], host: HostTarget, opt_level: int
) -> list[bytes]:
    request = {
        "triple": host.triple,
        "cpu": host.cpu,
        "features": host.features,
        "opt_level": opt_level,
        "modules": texts,
    }
    _write_frame(helper.stdin, json.dumps(request).encode())
    header = json.loads(_read_frame(helper.stdout))
    if not header.get("ok"):
        raise RuntimeError(header.get("error", "compile helper failed"))
    return [_read_frame(helper.stdout) for _ in texts]


def shares(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of ``sizes`` cut into ``parts`` groups of about equal total size (largest first
    to the lightest group); empty groups are dropped."""
    groups: list[list[int]] = [[] for _ in range(max(parts, 1))]
    totals = [0] * len(groups)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        g = totals.index(min(totals))
        groups[g].append(i)
        totals[g] += sizes[i]
    return [g for g in groups if g]


def compile_objects(texts: Sequence[str], host: HostTarget, opt_level: int, jobs: int) -> list[bytes]:
    """``emit_object`` of every module text, in order, over ``jobs`` processes (this one included)."""
    groups = shares([len(t) for t in texts], min(jobs, len(texts)))
    if len(groups) <= 1:
        return [emit_object(t, host, opt_level) for t in texts]
    helpers = _take_helpers(len(groups) - 1)
    results: dict[int, bytes] = {}
    failed: list[int] = [i for g in groups[1 + len(helpers) :] for i in g]  # no helper for these

    def remote(helper: subprocess.Popen[bytes], group: list[int]) -> None:
        try:
            for i, obj in zip(
                group, _remote(helper, [texts[i] for i in group], host, opt_level), strict=True
            ):
                results[i] = obj
        except (OSError, EOFError, RuntimeError, ValueError) as exc:
            warnings.warn(
                f"kernel compile helper failed ({exc}); compiling its kernels in this process", stacklevel=3
            )
            helper.kill()
            failed.extend(group)

    with ThreadPoolExecutor(max(len(helpers), 1)) as pool:
        futures = [pool.submit(remote, h, g) for h, g in zip(helpers, groups[1:], strict=False)]
        for i in groups[0]:
            results[i] = emit_object(texts[i], host, opt_level)
        for future in futures:
            future.result()
    _give_back(helpers)
    for i in failed:
        results[i] = emit_object(texts[i], host, opt_level)
    return [results[i] for i in range(len(texts))]


def serve() -> None:
    """A helper's loop: one request frame in, a header frame and one frame per object out."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            request = json.loads(_read_frame(stdin))
        except EOFError:
            return
        try:
            host = HostTarget(request["triple"], request["cpu"], request["features"])
            objects = [emit_object(t, host, int(request["opt_level"])) for t in request["modules"]]
        except Exception as exc:  # noqa: BLE001 - any failure goes back to the parent as a message
            _write_frame(stdout, json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode())
            continue
        _write_frame(stdout, json.dumps({"ok": True}).encode())
        for obj in objects:
            _write_frame(stdout, obj)


if __name__ == "__main__":
    serve()
