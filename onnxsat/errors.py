"""The public error types, ``onnxsat.errors.*``; they live in ``onnxsat.base.errors``."""

from onnxsat.base.errors import BadInputError, OnnxsatError, UnverifiableError, VerificationError, one_line

__all__ = ["BadInputError", "OnnxsatError", "UnverifiableError", "VerificationError", "one_line"]
