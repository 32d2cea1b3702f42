"""Rewrite rules: the rule table, the in-tree families, schedules and verification.

Importing this package registers every in-tree family in ``registry.RULES``, in this order.
"""

from . import (  # noqa: F401  (each module registers its family)
    algebraic,
    core,
    dtype,
    fusion,
    interchange,
    layout,
    linear,
    multi,
    partial_families,  # PET partial rules: a verified pass, off by default
    partial_merge,  # PET partial rule: 1x1 Conv + k x k Conv merged, border corrected (off by default)
    partial_subpixel,  # an exact site rule: the same verified pass, on by default (layout family)
    pooling,
    reduce,
    shape_fold,
    transpose,
    views,
)
from .registry import RULES

__all__ = ["RULES"]
