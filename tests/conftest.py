"""Test-run order (the modules with tests marked slow start first), and a cache that holds the rules.

With CI's two xdist workers, a long test that starts near the end leaves the other worker idle
until it finishes; started first, the short tests fill in around it. Whole modules move, not
single tests: a module's fixtures (a Ray instance, a serial batch run) are set up again each
time its tests resume after another module's, which cost test_batch_ray three Ray start-ups.
Within a module the slow tests go first. The sort is stable, so the order is the same on every
worker, as xdist requires.

Each xdist worker runs onnxruntime sessions and egglog on its share of the cores, as
``onnxsat.executors`` does for its own workers: with a thread per core in every worker, the
spinning onnxruntime threads of one worker took the cores from the other (CI's two workers:
the optimize-and-verify test files took 81 s instead of 73 s).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onnxsat.latency import THREADS_ENV


def _share_the_cores() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ.setdefault(THREADS_ENV, share)
        os.environ.setdefault("RAYON_NUM_THREADS", share)


_share_the_cores()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    def slow(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None

    with_slow = {module(item) for item in items if slow(item)}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(module(item), index)
    items.sort(key=lambda item: (module(item) not in with_slow, first[module(item)], not slow(item)))


@pytest.fixture(scope="session")
def rule_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding this worker's built rules: a Python process a test starts with it
    (``Options.plugin_cache_dir``, ``$ONNXSAT_CACHE_DIR``) reads the rules instead of building them."""
    from onnxsat.rules.registry import RuleTable

    folder = tmp_path_factory.mktemp("rule-cache")
    RuleTable.default(folder)
    return folder
