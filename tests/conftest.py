"""Test-run order: the tests marked slow start first.

With CI's two xdist workers, a long test that starts near the end leaves the other worker idle
until it finishes; started first, the short tests fill in around it. The order within each group
is the collection order (the sort is stable), the same on every worker, as xdist requires.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
