"""Which fused ops the installed onnxruntime runs on its CPU provider, found by trying them.

A fused kind is written as a single op (a standard op new at opset 23, or a com.microsoft contrib
op) only where onnxruntime has a kernel for it at that dtype; which kernels exist changes between
onnxruntime versions and builds, so it is probed, not assumed: a one-node model with the op and
dtype is run once on small random inputs, and the verdict is cached for the process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import helper

ProbeInput = tuple[tuple[int, ...], int | None]
"""An input of the probe node: its shape and its type (None: the probed dtype)."""
ABSENT: ProbeInput = ((-1,), None)
"""An optional input left out (its name empty), before one that is given."""


@dataclass(frozen=True)
class KernelProbe:
    """One node to try: op, domain, the default-domain opset, inputs, attributes, output count."""

    op_type: str
    domain: str
    opset: int
    inputs: tuple[ProbeInput, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    outputs: int = 1


@functools.cache
def ort_runs(probe: KernelProbe, dtype: int) -> bool:
    """True when onnxruntime's CPU provider builds and runs ``probe`` with ``dtype`` data."""
    import onnxruntime as ort

    names = ["" if s == ABSENT[0] else f"in{i}" for i, (s, _) in enumerate(probe.inputs)]
    types = [dtype if t is None else t for _, t in probe.inputs]
    given = [(n, t, s) for n, t, (s, _) in zip(names, types, probe.inputs, strict=True) if n]
    node = helper.make_node(
        probe.op_type,
        names,
        [f"out{i}" for i in range(probe.outputs)],
        domain=probe.domain or None,
        **dict(probe.attrs),
    )
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in given],
        [helper.make_tensor_value_info(f"out{i}", dtype, None) for i in range(probe.outputs)],
    )
    imports = [helper.make_opsetid("", probe.opset)]
    if probe.domain:
        imports.append(helper.make_opsetid(probe.domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 4
    rng = np.random.default_rng(0)
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = {n: _probe_data(rng, s, t) for n, t, s in given}
        session.run(None, feeds)
    except Exception:  # no kernel, no schema, or a kernel that rejects the inputs: it does not run
        return False
    return True


def _probe_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: int) -> np.ndarray:
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    if np.issubdtype(np_type, np.floating):
        return rng.uniform(0.5, 1.5, shape).astype(np_type)
    return np.ones(shape, np_type)  # positions, lengths: ones are valid everywhere
