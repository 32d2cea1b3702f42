"""The public error types, ``onnxsat.errors.*``; they live in ``onnxsat.base.errors``."""

from onnxsat.base.errors import BadInputError, OnnxsatError, VerificationError, one_line

__all__ = ["BadInputError", "OnnxsatError", "VerificationError", "one_line"]
