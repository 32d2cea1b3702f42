"""Memory planning: intermediate buffers share one arena, reused by liveness.

A buffer lives from the first step that touches it to the last one (inclusive, so a kernel never
reads and writes overlapping memory). Placement is greedy by size, largest first, at the lowest
offset that overlaps no already-placed buffer alive at the same time (as TFLite's planner does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from onnxsat.lowering.kernel_ir import Buffer
from onnxsat.lowering.program import Step, step_buffers

ALIGN = 64


@dataclass(frozen=True)
class ArenaPlan:
    offsets: dict[str, int]
    """Buffer name -> byte offset in the arena."""
    size: int
    naive_size: int
    """Bytes without reuse (every intermediate in its own allocation), for the report."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def lifetimes(steps: Sequence[Step], exclude: Iterable[str], pinned: Iterable[str] = ()) -> dict[str, tuple[Buffer, int, int]]:
    """Buffer name -> (buffer, first step, last step), for buffers not in ``exclude``; a ``pinned``
    buffer lives through every step."""
    skip = set(exclude)
    found: dict[str, tuple[Buffer, int, int]] = {}
    for i, step in enumerate(steps):
        for buf in step_buffers(step):
            if buf.name in skip:
                continue
            if buf.name in found:
                b, first, _ = found[buf.name]
                found[buf.name] = (b, first, i)
            else:
                found[buf.name] = (buf, i, i)
    for name in set(pinned) & set(found):
        found[name] = (found[name][0], 0, max(len(steps) - 1, 0))
    return found


def plan_arena(steps: Sequence[Step], exclude: Iterable[str], pinned: Iterable[str] = ()) -> ArenaPlan:
    """Offsets of the buffers not in ``exclude`` (``pinned`` ones share their memory with none)."""
    live = lifetimes(steps, exclude, pinned)
    order = sorted(live.values(), key=lambda t: (-t[0].nbytes, t[1], t[0].name))
    placed: list[tuple[int, int, int, int]] = []  # offset, end, first, last
    offsets: dict[str, int] = {}
    size = 0
    for buf, first, last in order:
        need = _align(max(buf.nbytes, 1))
        conflicts = sorted((o, e) for o, e, f, l_ in placed if not (l_ < first or last < f))
        offset = 0
        for o, e in conflicts:
            if offset + need <= o:
                break
            offset = max(offset, e)
        placed.append((offset, offset + need, first, last))
        offsets[buf.name] = offset
        size = max(size, offset + need)
    naive = sum(_align(max(b.nbytes, 1)) for b, _, _ in live.values())
    return ArenaPlan(offsets, size, naive)
