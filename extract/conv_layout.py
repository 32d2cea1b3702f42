"""Which layout onnxsat's CPU backend runs a depthwise conv in: over its input laid out flat (NCHW,
vectors along the image's positions) or channel-blocked (NCHWc, vectors across channels, as MLAS
runs it). The e-graph holds both (rule ``depthwise-conv-nchwc``: the conv reading
``reorder_nchwc(x)``), the ``onnxsat-cpu`` cost model prices each kernel and the reorder copy,
extraction picks, and the lowering runs the conv in the layout extraction chose. A model that
did not come from that extraction runs in the layout ``prefers_blocked`` gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CHANNEL_BLOCKS = (16, 8)
"""Channels a blocked depthwise conv computes side by side, the widest that divides the channels:
16 (one AVX-512 vector of float32) ran EfficientNet-B0's strided and 7 x 7 depthwise convs
1.2-1.5x faster than 8, one thread; 8 keeps MobileNetV3's 72 and 88 channels blocked."""

FLAT_VECTOR = 16
"""The flat conv's positions run in whole vectors of this many floats (AVX-512 lanes)."""

BLOCKED_MAX_WIDTH = 8
"""Output width up to which a stride-1 depthwise Conv runs channel-blocked without a choice made
by extraction: a wider one fills vectors along the flat padded plane (measured on an AVX-512
host: 7-wide ~20% faster blocked, 14-wide ~30% slower)."""


def channel_block(chans: int) -> int:
    """The NCHWc block of a depthwise conv over ``chans`` channels (0: none divides them)."""
    return next((b for b in CHANNEL_BLOCKS if chans % b == 0), 0)


def can_run_blocked(x_shape: Sequence[int] | None, w_shape: Sequence[int] | None, group: int) -> bool:
    """Whether a Conv has a channel-blocked kernel: 2-D, one input and one output channel per group,
    the channels a multiple of a block."""
    if x_shape is None or w_shape is None or len(x_shape) != 4 or len(w_shape) != 4:
        return False
    chans = x_shape[1]
    return group == chans == w_shape[0] and w_shape[1] == 1 and channel_block(chans) > 0


def prefers_blocked(x_shape: Sequence[int], w_shape: Sequence[int], group: int, strides: Sequence[int], out_sp: Sequence[int]) -> bool:
    """The layout without extraction's choice: blocked where it can run so and the conv is strided or
    narrow (where the flat stride-1 form cannot fill vectors)."""
    return can_run_blocked(x_shape, w_shape, group) and (any(s > 1 for s in strides) or out_sp[-1] <= BLOCKED_MAX_WIDTH)


def flat_lane_waste(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], out_sp: Sequence[int]) -> float:
    """Lanes the flat depthwise kernel computes per output it keeps (the blocked kernel's lanes are
    channels, every one kept): at stride 1 it runs along the padded rows, ``reach`` columns more
    per row; strided, whole vectors along each output row. Measured against the blocked kernel (two
    Zen 3 threads, each conv after its 1x1 expansion, EfficientNet-B0's, MobileNetV3's and
    ConvNeXt's shapes, 15 rounds): flat/blocked x1.45-1.79 on 7-wide images (waste 1.29-1.86),
    x0.87-1.31 on 14-wide (median 1.21; waste 1.14-1.43), x0.83-1.2 on 28- to 112-wide, x1.08-1.81
    strided (1.14-2.29): the flat kernel is never much faster, so its waste is what tells them
    apart."""
    out_w = out_sp[-1]
    if out_w < 1:
        return 1.0
    if all(s == 1 for s in strides):
        return (out_w + (kernel[-1] - 1) * dilations[-1]) / out_w
    return math.ceil(out_w / FLAT_VECTOR) * FLAT_VECTOR / out_w
