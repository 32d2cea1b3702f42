"""onnxsat: an equality-saturation optimizer for ONNX tensor graphs.

Public API: ``optimize(model, options) -> (model, report)``, ``Options``/``Budgets`` and
``Report``. Everything else is internal.
"""

from __future__ import annotations

from .options import Budgets, Options
from .report import Report

__version__ = "0.1.0"
__all__ = ["optimize", "Options", "Budgets", "Report", "__version__"]


def optimize(model, options=None):  # type: ignore[no-untyped-def]
    """Optimize an ONNX ModelProto; see ``onnxsat.pipeline.optimize``."""
    from .pipeline import optimize as _optimize

    return _optimize(model, options)
