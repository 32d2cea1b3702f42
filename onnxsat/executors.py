"""Where independent pieces of work run: in this process, on a local process pool, or on Ray.

``onnxsat batch`` (one task per model) and the ``onnxsat.study`` sweeps (one task per cell) hand
their tasks to one of these executors and read the results back as they finish. A task is a
module-level function and its arguments; what it returns must pickle. Every task comes back
exactly once, as a value or as a one-line error: an exception raised by the task is its result
(reported, not retried: it would fail again), while a worker that died under it (killed, out
of memory, a lost node) gets the task run once more before it is reported failed.

Workers are started with the spawn method, never fork: egglog runs rayon threads, and a process
forked after they started can deadlock. Each worker runs egglog on one thread
(``RAYON_NUM_THREADS=1``) and onnxruntime sessions (verification) on its task's share of the
cores (``latency.THREADS_ENV``): parallelism comes from the tasks, not from inside one.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from onnxsat.base.errors import BadInputError, one_line

__all__ = [
    "ALL_CORES",
    "Done",
    "Executor",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "Task",
    "default_jobs",
    "ray_available",
]

ALL_CORES = -1
"""``Task.cpus`` for work that must have its node to itself (latency measurements): Ray requests
every core of a node, the process pool runs it with nothing else in flight."""

WORKER_ENV = {"RAYON_NUM_THREADS": "1"}
"""Set in every worker before egglog starts its thread pool."""

START_METHOD = "spawn"
"""Never fork (egglog's threads); spawn gives each worker a fresh interpreter."""


@dataclass(frozen=True)
class Task:
    """One piece of work: ``fn(*args)``; ``key`` identifies its result; ``cpus`` its core request
    (None: the executor's default; ``ALL_CORES``: a whole node)."""

    key: Any
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    cpus: int | None = None


@dataclass(frozen=True)
class Done:
    """A task's outcome: ``value`` when it returned, else ``error`` (one line); ``attempts`` counts
    the runs it took as far as the executor sees them (2 after a worker died under the first; Ray
    retries inside its scheduler, so a Ray task that succeeded on its retry shows 1)."""

    key: Any
    value: Any = None
    error: str | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None


class Executor(Protocol):
    """Runs tasks and yields each one's ``Done`` as it finishes (completion order)."""

    def share(self, value: Any) -> Any:
        """A handle to pass ``value`` to many tasks (as a top-level argument) while sending it once."""
        ...

    def run(self, tasks: Sequence[Task]) -> Iterator[Done]: ...

    def close(self) -> None: ...


def default_jobs(tasks: int) -> int:
    """Workers for ``tasks`` tasks on this machine: the usable cores, at most one per task."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks))


def _error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


class SerialExecutor:
    """Every task in this process, one after the other (``--jobs 1``)."""

    jobs = 1

    def share(self, value: Any) -> Any:
        return value

    def run(self, tasks: Sequence[Task]) -> Iterator[Done]:
        for task in tasks:
            try:
                yield Done(task.key, value=task.fn(*task.args))
            except Exception as exc:
                yield Done(task.key, error=_error_line(exc))

    def close(self) -> None:
        pass


def _init_worker(env: dict[str, str]) -> None:
    os.environ.update(env)


def _call(fn: Callable[..., Any], threads: int | None, *args: Any) -> Any:
    """A task in a worker: ``fn(*args)`` with onnxruntime sessions that name no thread count on
    ``threads`` threads (the task's share of the cores; None: every core)."""
    from onnxsat.latency import THREADS_ENV

    if threads is None:
        os.environ.pop(THREADS_ENV, None)
    else:
        os.environ[THREADS_ENV] = str(threads)
    return fn(*args)


class ProcessExecutor:
    """A pool of ``jobs`` spawned worker processes on this machine.

    A worker that dies breaks the whole pool (``BrokenProcessPool``); the pool is then rebuilt and
    every task that was unfinished is submitted again, each at most ``retries`` more times.
    """

    def __init__(self, jobs: int, *, retries: int = 1) -> None:
        self.jobs = max(1, jobs)
        self.retries = retries
        self._pool: cf.ProcessPoolExecutor | None = None

    def share(self, value: Any) -> Any:
        return value

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.jobs,
            mp_context=multiprocessing.get_context(START_METHOD),
            initializer=_init_worker,
            initargs=(WORKER_ENV,),
        )

    def run(self, tasks: Sequence[Task]) -> Iterator[Done]:
        shared = [t for t in tasks if t.cpus != ALL_CORES]
        alone = [t for t in tasks if t.cpus == ALL_CORES]
        share = max(1, (os.cpu_count() or 1) // self.jobs)
        yield from self._run(shared, self.jobs, share)
        yield from self._run(alone, 1, None)  # each with the machine to itself

    def _run(self, tasks: Sequence[Task], in_flight: int, threads: int | None) -> Iterator[Done]:
        attempts = {i: 0 for i in range(len(tasks))}
        waiting = list(range(len(tasks)))
        running: dict[cf.Future[Any], int] = {}
        while waiting or running:
            if self._pool is None:
                self._pool = self._new_pool()
            broken = False
            while waiting and len(running) < in_flight:
                i = waiting.pop(0)
                attempts[i] += 1
                try:
                    running[self._pool.submit(_call, tasks[i].fn, threads, *tasks[i].args)] = i
                except cf.BrokenExecutor:
                    attempts[i] -= 1
                    waiting.insert(0, i)
                    broken = True
                    break
            if not broken:
                finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    exc = future.exception()
                    if exc is None:
                        yield Done(tasks[i].key, value=future.result(), attempts=attempts[i])
                    elif isinstance(exc, cf.BrokenExecutor):
                        broken = True
                        running[future] = i  # handled with the other casualties below
                    else:
                        yield Done(tasks[i].key, error=_error_line(exc), attempts=attempts[i])
            if broken:
                # Which task killed its worker is unknown: every unfinished one is tried again.
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
                for future, i in sorted(running.items(), key=lambda kv: kv[1]):
                    if future.done() and future.exception() is None:
                        yield Done(tasks[i].key, value=future.result(), attempts=attempts[i])
                    elif attempts[i] > self.retries:
                        yield Done(tasks[i].key, error="worker process died", attempts=attempts[i])
                    else:
                        waiting.insert(0, i)
                running.clear()
                waiting.sort()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def ray_available() -> bool:
    """Whether Ray is installed here (``pip install 'onnxsat[ray]'``), without importing it (seconds)."""
    if "ray" in sys.modules:  # imported already, or blocked (None)
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BadInputError("Ray is not installed: pip install 'onnxsat[ray]'") from None
    return ray


def _ray_call(fn: Callable[..., Any], cpus: int, *args: Any) -> Any:
    """The Ray task body: ``fn(*args)`` on its ``cpus`` cores (Ray resolves object refs given as
    top-level arguments)."""
    return _call(fn, cpus, *args)


class RayExecutor:
    """Each task one Ray task with its own core request, results read back as they finish.

    ``address`` None starts a local Ray instance (``num_cpus`` cores, default all); an address
    (``ray://host:10001``, ``host:6379`` or ``auto``) joins a running cluster. When Ray is already
    initialized in this process (a notebook, a test fixture) that instance is used and left
    running. Ray re-runs a task whose worker died once (``max_retries``); an exception raised by
    the task itself is reported, not retried. Arguments are shipped through the object store
    with each task; ``share`` puts a value there once for many tasks.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        task_cpus: int = 1,
        retries: int = 1,
    ) -> None:
        ray = _import_ray()
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.ERROR,  # the batch's progress line is the only chatter
                "runtime_env": {"env_vars": dict(WORKER_ENV)},
            }
            if address is None:
                kwargs["num_cpus"] = num_cpus
            try:
                ray.init(address=address, **kwargs)
            except Exception as exc:  # an unreachable address, a cluster of another Ray version
                where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
                raise BadInputError(f"cannot {where}: {one_line(exc)}") from exc
            self._started = True
        self.task_cpus = task_cpus
        self.retries = retries
        self._remote = ray.remote(_ray_call)

    def share(self, value: Any) -> Any:
        return self._ray.put(value)

    def node_cpus(self) -> int:
        """The cores of the largest live node: what an ``ALL_CORES`` task requests."""
        counts = [int(n["Resources"].get("CPU", 0)) for n in self._ray.nodes() if n.get("Alive")]
        return max([c for c in counts if c > 0], default=1)

    def run(self, tasks: Sequence[Task]) -> Iterator[Done]:
        ray = self._ray
        pending: dict[Any, int] = {}
        for i, task in enumerate(tasks):
            cpus = self.node_cpus() if task.cpus == ALL_CORES else (task.cpus or self.task_cpus)
            ref = self._remote.options(
                num_cpus=cpus,
                max_retries=self.retries,
                retry_exceptions=False,
                runtime_env={"env_vars": dict(WORKER_ENV)},
            ).remote(task.fn, cpus, *task.args)
            pending[ref] = i
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = tasks[pending.pop(ref)]
                try:
                    yield Done(task.key, value=ray.get(ref))
                except ray.exceptions.RayTaskError as exc:  # the task's own exception
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    yield Done(task.key, error=_error_line(cause))
                except ray.exceptions.RayError as exc:  # its worker died, also on the retry
                    yield Done(
                        task.key,
                        error=f"{type(exc).__name__}: {one_line(exc)}",
                        attempts=self.retries + 1,
                    )

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
