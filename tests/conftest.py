"""Test-run order (the modules with tests marked slow start first), and a cache that holds the rules.

With CI's two xdist workers, a long test that starts near the end leaves the other worker idle
until it finishes; started first, the short tests fill in around it. Whole modules move, not
single tests: a module's fixtures (a Ray instance, a serial batch run) are set up again each
time its tests resume after another module's, which cost test_batch_ray three Ray start-ups.
Within a module the slow tests go first. The sort is stable, so the order is the same on every
worker, as xdist requires.
"""

from __future__ import annotations

from pathlib import Path

import pytest


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
