"""Seeded inputs of valid ranges for the real-model corpus, from the input specs in its index.

The corpus index (written by benchmarks/realmodels/export.py) describes every input by dtype,
concrete shape and value kind: "normal" floats, "ids" in [0, high) (token ids within the
vocabulary, token types), or "mask" (attention masks of 0/1 whose first position is always 1,
like left-aligned padding) or "ones" (a decode step's mask over past and new tokens). Export and tests build inputs with this one function (numpy only: CI
has no torch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["feeds_for"]

_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


def feeds_for(inputs: list[dict[str, Any]], seed: int) -> dict[str, np.ndarray]:
    """One seeded feed per input spec ({"name", "dtype", "shape", "values", "high"?})."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = tuple(int(d) for d in spec["shape"])
        dtype = _DTYPES[spec["dtype"]]
        kind = spec["values"]
        if kind == "ids":
            feeds[spec["name"]] = rng.integers(0, int(spec["high"]), size=shape).astype(dtype)
        elif kind == "mask":
            mask = np.ones(shape, dtype=dtype)
            for row in mask.reshape(-1, shape[-1]):
                row[shape[-1] - int(rng.integers(0, max(1, shape[-1] // 4))) :] = 0
            feeds[spec["name"]] = mask
        elif kind == "ones":
            feeds[spec["name"]] = np.ones(shape, dtype=dtype)
        elif kind == "normal":
            feeds[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            raise ValueError(f"unknown input value kind {kind!r} for {spec['name']}")
    return feeds
