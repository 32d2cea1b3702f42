"""The lowering table: one rule per ONNX op type, with the fusion kind the partitioner reads.

Kinds: ``elementwise`` and ``layout`` rules return ``Lazy`` tensors that fuse into their consumer;
``reduce`` rules emit a kernel (their inputs fuse in as a prologue); ``extern`` rules emit BLAS
calls on materialized operands; ``static`` rules compute their output at compile time from static
shapes. Ops without a rule run the numpy reference (a ``FallbackStep``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from .lower import Lowerer, NodeView
    from .values import Lazy

Kind = Literal["elementwise", "layout", "reduce", "extern", "static"]
RuleResult = list["Lazy | np.ndarray | None"]
RuleFn = Callable[["Lowerer", "NodeView", list[Any]], RuleResult]


class NotLowered(Exception):
    """This instance of the op (attributes, dtypes) has no native lowering: use the fallback."""


@dataclass(frozen=True)
class LoweringRule:
    op_type: str
    kind: Kind
    fn: RuleFn


LOWERINGS: dict[str, LoweringRule] = {}


def lowering(*op_types: str, kind: Kind) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as the lowering of ``op_types``."""

    def deco(fn: RuleFn) -> RuleFn:
        for op in op_types:
            LOWERINGS[op] = LoweringRule(op, kind, fn)
        return fn

    return deco


def kind_of(op_type: str) -> Kind | Literal["fallback"]:
    rule = LOWERINGS.get(op_type)
    return "fallback" if rule is None else rule.kind


def load_rules() -> None:
    """Import the rule modules (they register themselves)."""
    from . import (  # noqa: F401
        rules_conv_transpose,
        rules_elementwise,
        rules_layout,
        rules_nn,
        rules_pool,
        rules_quant,
        rules_reduce,
    )
