"""Which algorithm onnxsat's CPU backend runs a 2-D Conv with, decided from shapes alone: the
cost model that prices the conv for extraction (``cost``, the ``onnxsat-cpu`` target) and the
lowering that builds it (``lowering.winograd``) both ask here, so the price is of the kernel
that runs.

Winograd F(m x m, 3 x 3) runs a 3x3 stride-1 conv of one group as (m + 2)^2 products of
``tiles x Cin`` by ``Cin x Cout`` (the transformed weight) between an input and an output
transform, with (3 m / (m + 2))^2 times fewer multiplies (2.25 for m = 2, 4 for m = 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

WINOGRAD_MIN_CHANNELS = 32
"""Input and output channels from which a 3x3 conv runs as Winograd: below, the products' K or N
is too short for the micro-kernel to hide the two transforms."""

WINOGRAD_MIN_TILES = 16
"""Tiles per conv (over the batch) from which it runs as Winograd: the products' rows. Below, the
transformed weight (16/9 of the weight for F(2x2)) is read for too few rows. ResNet-18's 7 x 7
stage (16 tiles of 2) gained: 0.69 -> 0.53 ms per conv against the position-major product, two
threads; F(4x4) there (4 tiles) lost."""

WINOGRAD_F4_MIN_SIZE = 16
"""Output height and width from which the tiles are 4 x 4: on smaller images 4-wide tiles compute
too much padding (14 x 14: 16 x 16 computed) and give the products too few rows."""


def tiles_of(out_sp: Sequence[int], m: int) -> tuple[int, int]:
    """Tiles down and across an output image."""
    return math.ceil(out_sp[0] / m), math.ceil(out_sp[1] / m)


def winograd_tile(
    x_shape: Sequence[int], w_shape: Sequence[int], group: int, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], out_sp: Sequence[int]
) -> int | None:
    """The tile size m a Conv runs as F(m x m, 3 x 3) with, or None where it does not: 2-D, one
    group, 3x3, stride and dilation 1, at least ``WINOGRAD_MIN_CHANNELS`` channels in and out and
    ``WINOGRAD_MIN_TILES`` tiles."""
    if len(x_shape) != 4 or len(w_shape) != 4 or group != 1 or list(kernel) != [3, 3]:
        return None
    if any(s != 1 for s in strides) or any(d != 1 for d in dilations) or min(x_shape[1], w_shape[0]) < WINOGRAD_MIN_CHANNELS:
        return None
    if min(out_sp) < 2:
        return None
    m = 4 if min(out_sp) >= WINOGRAD_F4_MIN_SIZE else 2
    return m if x_shape[0] * math.prod(tiles_of(out_sp, m)) >= WINOGRAD_MIN_TILES else None


def winograd_work(x_shape: Sequence[int], w_shape: Sequence[int], out_sp: Sequence[int], m: int) -> tuple[float, float]:
    """FLOPs of the products and bytes moved of a Winograd conv: its input and padded copy, the
    weight transformed ((m + 2)^2 / 9 of the weight), the transformed input and the products'
    results each written once and read once, and the output."""
    batch, cin = x_shape[0], x_shape[1]
    cout = w_shape[0]
    points = (m + 2) ** 2
    tiles = batch * math.prod(tiles_of(out_sp, m))
    flops = 2.0 * points * tiles * cin * cout
    floats = 2 * math.prod(x_shape) + points * cin * cout + 2 * points * tiles * (cin + cout) + batch * cout * math.prod(out_sp)
    return flops, 4.0 * floats
