"""Worker processes for the distinct parts of a region-wise run (``Options.jobs``, ``--jobs N``).

Saturating one region uses one core (one rayon thread per worker), so the distinct regions of a
large model, and then the windows around its cuts, are spread over a pool of processes. Workers
are spawned, never forked: egglog runs rayon threads, and a process forked after they started may
deadlock. Each worker sets ``executors.WORKER_ENV`` before egglog is imported, then imports the
pipeline and builds the run's rule table once (``_start``: from the rule-table disk cache when the
options name one), and is kept for every part of the run: the region phase and the window phase.

A task is a part's model as bytes, its run's options and rule names; the answer is the part's
exported program as bytes with its costs, saturation report and warnings (``by_regions.Outcome``).
Answers are taken in the order the parts were given, never in the order workers finish, and a
part's answer depends on nothing but the task, so the stitched model is the one ``jobs=1``
writes whenever no region stops on a time budget. A task that fails in a worker is solved again
in this process (which raises what the serial run raises, or warns and goes on); a worker that
dies (killed, out of memory) ends the pool with a warning and the rest is solved in this process.

This module imports nothing heavy at the top: a worker imports it before setting up egglog.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxsat.base.errors import one_line
from onnxsat.base.options import Options
from onnxsat.executors import START_METHOD, WORKER_ENV

if TYPE_CHECKING:
    from onnxsat.by_regions import Outcome

@dataclass(frozen=True)
class Task:
    """One part to saturate: its model as bytes, its node count (for warnings), its run's options
    (``by_regions.part_options``) and the enabled rule names."""

    model: bytes
    nodes: int
    options: Options
    rules: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """A worker's answer: the part's program as bytes and the rest of its ``Outcome``, or why it failed."""

    model: bytes = b""
    cost_before: float = 0.0
    cost_after: float = 0.0
    saturation: Any = None
    warnings: tuple[str, ...] = ()
    error: str = ""
    """Empty on success; else the exception, in one line (the part is then solved in the caller)."""


_STATE: dict[str, Any] = {}
"""A worker's rule table and plugin loads, built once by ``_start``."""


def _start(options: Options, lazy_key: str) -> None:
    """A worker's start-up, once: ``WORKER_ENV``, the parent's lazy-weight marker (so weights
    left in their file are read, not refused), the pipeline imported and the rule table built."""
    os.environ.update(WORKER_ENV)
    from onnxsat.base import lazy_weights

    lazy_weights.adopt_key(lazy_key)
    import onnxsat.pipeline  # noqa: F401  (the import is part of the start-up paid once)
    from onnxsat.rules.plugins import load_plugins

    _STATE["table"], _STATE["loads"] = load_plugins(options)


def _ready() -> int:
    """A no-op task: submitting one per worker starts them all at once."""
    return os.getpid()


def solve(task: Task) -> Answer:
    """A worker's task: one part saturated, extracted and exported (``by_regions.solve_part``)."""
    import onnx

    from onnxsat.by_regions import solve_part

    try:
        model = onnx.load_model_from_string(task.model)
        outcome = solve_part(
            model, task.nodes, task.options, list(task.rules), _STATE["table"], _STATE["loads"]
        )
        return Answer(
            outcome.model.SerializeToString(),
            outcome.cost_before,
            outcome.cost_after,
            outcome.saturation,
            tuple(outcome.warnings),
        )
    except Exception as exc:  # answered, not raised: the caller solves the part again itself
        return Answer(error=f"{type(exc).__name__}: {one_line(exc, 300)}")


class Pool:
    """``jobs`` worker processes for one region-wise run; use as a context manager.

    ``options``: the run's options (its plugins and rule-table cache are what each worker loads).
    The workers start when the pool is made, so their start-up overlaps the partition.
    """

    def __init__(self, jobs: int, options: Options):
        from onnxsat.base import lazy_weights

        self.jobs = jobs
        self.warnings: list[str] = []
        self._answered = 0
        context = multiprocessing.get_context(START_METHOD)
        self._executor: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=context,
            initializer=_start,
            initargs=(options, lazy_weights.BASE_KEY),
        )
        self._starting = [self._executor.submit(_ready) for _ in range(jobs)]  # spawns every worker now

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (tasks not started are cancelled)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    @property
    def alive(self) -> bool:
        return self._executor is not None

    def map(self, tasks: Sequence[Task], fallback: Callable[[int], Outcome]) -> list[Outcome]:
        """Each task's outcome, in the order of ``tasks``. Task ``k`` failed in its worker (or
        the pool is gone): ``fallback(k)`` solves it in this process instead."""
        import onnx

        from onnxsat.by_regions import Outcome

        futures: dict[int, Future[Answer]] | None = None
        if self._executor is not None:
            # Largest parts first (fewer idle workers at the end); the answers are still taken in task order.
            order = sorted(range(len(tasks)), key=lambda k: (-tasks[k].nodes, k))
            try:
                futures = {k: self._executor.submit(_solver(), tasks[k]) for k in order}
            except BrokenProcessPool as exc:
                self._broken(exc)
        outcomes: list[Outcome] = []
        for k, task in enumerate(tasks):
            answer: Answer | None = None
            if futures is not None and self._executor is not None:
                try:
                    answer = futures[k].result()
                except BrokenProcessPool as exc:
                    self._broken(exc)
            if answer is None:
                outcomes.append(fallback(k))
            elif answer.error:
                self.warnings.append(
                    f"a region of {task.nodes} nodes failed in a worker process ({answer.error}): solved in this process"
                )
                outcomes.append(fallback(k))
            else:
                self._answered += 1
                model = onnx.load_model_from_string(answer.model)
                outcomes.append(
                    Outcome(
                        model, answer.cost_before, answer.cost_after, answer.saturation, list(answer.warnings)
                    )
                )
        return outcomes

    def _broken(self, exc: BaseException) -> None:
        hint = (
            "; a worker that dies before its first answer may be a script without the"
            " `if __name__ == '__main__':` guard that spawned processes need"
            if not self._answered
            else ""
        )
        self.warnings.append(
            f"a worker process of --jobs {self.jobs} died ({one_line(exc, 200) or type(exc).__name__}):"
            f" the remaining regions are solved in this process{hint}"
        )
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _solver() -> Callable[[Task], Answer]:
    """The task function, looked up when a task is sent (a test replaces it with one that crashes)."""
    return solve
