"""Extracted graph -> kernel programs for the CPU backend.

``kernel_ir`` (the loop-nest IR) and ``interpret`` (its numpy meaning); ``values`` (lazy fused
tensors and strided views); ``table`` with ``rules_*`` (one lowering rule per op); ``partition``
(which tensors are stored); ``loops`` (kernel loop nests); ``lower`` (the driver) producing a
``program.KernelProgram``.
"""
