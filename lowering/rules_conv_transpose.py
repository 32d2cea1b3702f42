"""Lowering rule of ConvTranspose: the adjoint of a Conv.

One GEMM per group (``W_g^T @ X_g``, every input pixel times every tap) and a col2im kernel that
gathers each output's taps residue by residue, so its loads are unit stride and need no bounds
checks.
"""

from __future__ import annotations

import math
from typing import Any

from .conv_kernels import col2im, transpose_phases
from .kernel_ir import Const
from .rules_nn import GEMM_DTYPES, matmul
from .rules_pool import padded_input
from .table import NotLowered, lowering
from .values import Lazy, of_buffer, reshape, transpose


@lowering("ConvTranspose", kind="extern")
def _conv_transpose(cx: Any, nv: Any, xs: list[Lazy | None]) -> list[Any]:
    """One product per group, ``col = W_g^T @ X_g`` (every input pixel times every kernel tap),
    then a col2im kernel that gathers each output from its taps (see ``_col2im``)."""
    x, w = xs[0], xs[1]
    assert x is not None and w is not None
    bias = xs[2] if len(xs) > 2 else None
    if x.dtype not in GEMM_DTYPES or w.dtype != x.dtype:
        raise NotLowered(f"ConvTranspose on {x.dtype}/{w.dtype}")
    n_sp = len(x.shape) - 2
    kernel = [int(k) for k in (nv.attr("kernel_shape") or w.shape[2:])]
    strides = [int(s) for s in (nv.attr("strides") or [1] * n_sp)]
    dilations = [int(d) for d in (nv.attr("dilations") or [1] * n_sp)]
    group = int(nv.attr("group", 1))
    begin, out_sp = _conv_transpose_geometry(nv, x.shape[2:], kernel, strides, dilations)
    batch, cin = x.shape[:2]
    mg = w.shape[1]
    cout, cg, taps = mg * group, cin // group, math.prod(kernel)
    out = cx.out_buffer(nv.outputs[0], (batch, cout, *out_sp), x.dtype)
    if not math.prod(out.shape):
        return [of_buffer(out)]
    phases = [transpose_phases(o, s, k, d, b) for o, s, k, d, b in zip(out_sp, strides, kernel, dilations, begin, strict=True)]
    # Zero borders on the input give zero borders on col, so no gather needs a bounds check.
    lo = [max([0, *(-c for _, taps_r in axis for _, c in taps_r)]) for axis in phases]
    hi = [max([0, *(q - 1 + c - (d - 1) for q, taps_r in axis if q for _, c in taps_r)]) for axis, d in zip(phases, x.shape[2:], strict=True)]
    src = padded_input(cx, x, lo, hi, Const(0.0, x.dtype)) if any(lo) or any(hi) else x
    padded_sp = src.shape[2:]
    xm = reshape(src, (batch, group, cg, math.prod(padded_sp)))
    wm = transpose(reshape(w, (1, group, cg, mg * taps)), [0, 1, 3, 2])
    col = matmul(cx, wm, xm, f"{nv.outputs[0]}_col")
    cx.emit_kernel(col2im(out, col.view.buffer, bias, kernel, padded_sp, lo, phases))
    return [of_buffer(out)]


def _conv_transpose_geometry(nv: Any, in_sp: tuple[int, ...], kernel: list[int], strides: list[int], dilations: list[int]) -> tuple[list[int], list[int]]:
    """Begin pads and output sizes of a ConvTranspose (pads, output_shape, auto_pad, output_padding)."""
    n_sp = len(in_sp)
    out_pad = [int(p) for p in (nv.attr("output_padding") or [0] * n_sp)]
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    full = [s * (i - 1) + op + e for s, i, op, e in zip(strides, in_sp, out_pad, ext, strict=True)]
    output_shape = nv.attr("output_shape")
    auto_pad = nv.attr("auto_pad", "NOTSET") or "NOTSET"
    explicit = nv.attr("pads")
    if explicit is not None:
        pads = [int(p) for p in explicit]
        out_sp = [f - pads[i] - pads[i + n_sp] for i, f in enumerate(full)]
        if output_shape is not None:
            out_sp = [int(v) for v in output_shape][-n_sp:]
        return pads[:n_sp], out_sp
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # onnx's rule: total padding = full size - wanted size, split toward the end unless SAME_UPPER
        out_sp = [int(v) for v in output_shape][-n_sp:] if output_shape is not None else [i * s for i, s in zip(in_sp, strides, strict=True)]
        totals = [f - o for f, o in zip(full, out_sp, strict=True)]
        return [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals], out_sp
    return [0] * n_sp, full
