"""Rewrite rules: the rule table, the in-tree families, schedules and verification.

Importing this package registers every in-tree family in ``registry.RULES``, in this order.
"""

from . import algebraic, core, fusion, interchange, layout, linear, multi  # noqa: F401  (each module registers its family)
from . import partial_families  # noqa: F401,I001  (PET partial rules: a verified pass, off by default)
from .registry import RULES

__all__ = ["RULES"]
