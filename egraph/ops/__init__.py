"""The op table (see ``registry``); importing this package registers every modelled op."""

from . import elementwise, fused, layout, nn  # noqa: F401  (registration side effects)
from .registry import BY_CTOR, OPS, OpSpec, ctor_name

for _spec in OPS.values():
    BY_CTOR[ctor_name(_spec.ctor)] = _spec

__all__ = ["OPS", "BY_CTOR", "OpSpec", "ctor_name"]
