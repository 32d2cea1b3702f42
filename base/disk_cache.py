"""On-disk cache entries that another user, a damaged disk or a killed run cannot turn into a crash
or into someone else's code.

A cache directory is used only when it is a real directory owned by this user with no access for
anyone else (created 0700; `private_dir` refuses any other). Each entry carries a header with the
sha256 of its payload: `read` returns the payload only when it matches, and removes a bad entry
so it is rebuilt. `write` goes through a temporary file that is fsynced before it is renamed into
place, and whose name holds the writer's pid, so that `sweep_temps` (called by the next writer)
removes the leftovers of a run that was killed mid-write without touching a live run's. Entries
are bytes: nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import warnings
from pathlib import Path

__all__ = ["private_dir", "read", "sweep_temps", "temp_name_prefix", "write"]

_MAGIC = b"onnxsat-cache-v1 sha256="
_DIGEST_LEN = 64


def private_dir(path: str | Path) -> Path | None:
    """``path``, created 0700 if missing, or None (with a warning) when it is not a directory
    owned by this user and closed to group and others (a shared or planted cache is not used)."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(directory)
    except OSError as exc:
        warnings.warn(f"cache directory {directory} not used: {exc.strerror or exc}", stacklevel=2)
        return None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a symbolic link?)"
    elif st.st_uid != os.getuid():
        problem = "is owned by another user"
    elif st.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(st.st_mode):o}; chmod 700 to use it)"
    else:
        return directory
    warnings.warn(f"cache directory {directory} not used: it {problem}", stacklevel=2)
    return None


def read(path: Path, warn: bool = False) -> bytes | None:
    """The payload of the entry at ``path``, or None when missing or damaged (a damaged one is
    removed; with ``warn``, a warning says so, for caches whose entries are large enough that a
    silent rebuild would look like a slow cache)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    header = len(_MAGIC) + _DIGEST_LEN + 1
    payload = data[header:]
    digest = data[len(_MAGIC) : header - 1]
    if data[: len(_MAGIC)] == _MAGIC and data[header - 1 : header] == b"\n":
        if hashlib.sha256(payload).hexdigest().encode() == digest:
            return payload
    with contextlib.suppress(OSError):
        path.unlink()
    if warn:
        warnings.warn(f"cache entry {path} failed its checksum: removed, rebuilding it", stacklevel=2)
    return None


def temp_name_prefix(name: str) -> str:
    """The prefix of this process's temporary files for target ``name``: ``.NAME.PID.``."""
    return f".{name}.{os.getpid()}."


def write(path: Path, payload: bytes) -> bool:
    """Write an entry atomically (checksum header, fsync, rename); False when it could not be
    written (a cache that cannot be written only costs a rebuild)."""
    directory = path.parent
    sweep_temps(directory, path.name)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=temp_name_prefix(path.name), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(directory)
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def sweep_temps(directory: Path, name: str | None = None) -> list[Path]:
    """Remove ``.NAME.PID.*.tmp`` files (any NAME when None) whose writing process is gone."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                continue
            stem = entry.name[1:-4]
            if name is not None:
                if not stem.startswith(name + "."):
                    continue
                rest = stem[len(name) + 1 :]
            else:
                rest = stem
            pid_text = rest.split(".")[0] if name is not None else _pid_field(rest)
            if pid_text is None or not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _pid_field(stem: str) -> str | None:
    """The pid of ``NAME.PID.RANDOM`` when NAME is unknown: the last all-digit field but one."""
    parts = stem.split(".")
    return parts[-2] if len(parts) >= 3 else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
