"""Exceptions that carry the exit code the CLI reports.

The CLI catches `OnnxsatError` at the top, prints `str(err)` (one line, no traceback) and
exits with `err.exit_code`, so every layer can fail with a precise message without knowing
about the CLI.
"""

from __future__ import annotations

import math

__all__ = ["OnnxsatError", "BadInputError", "UnverifiableError", "VerificationError", "one_line"]


class OnnxsatError(Exception):
    """Base class of the errors onnxsat reports to users; `exit_code` is the process exit status."""

    exit_code: int = 1


class BadInputError(OnnxsatError):
    """The input model is missing or invalid, or the output path cannot be written (exit 2)."""

    exit_code = 2


class UnverifiableError(OnnxsatError):
    """The optimized model cannot be checked (the original does not run on any input onnxsat can
    make, or a type it cannot feed): nothing is written unless the user allows it (exit 2)."""

    exit_code = 2

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"cannot verify the optimized model: {one_line(reason, 170)}; give sample inputs with"
            " --verify-inputs FILE.npz (or --allow-unverified, or --no-verify)"
        )

    def __reduce__(self):  # picklable with its one-argument __init__
        return (type(self), (self.reason,))


class TimeLimitError(OnnxsatError):
    """The time limit (``Budgets.seconds``) ran out before the model was even imported; the
    pipeline returns the input unchanged (a caller of a lower layer sees exit 2)."""

    exit_code = 2

    def __init__(self, imported: int, total: int) -> None:
        self.imported, self.total = imported, total
        super().__init__(f"the time limit ran out after importing {imported:,} of {total:,} nodes")

    def __reduce__(self):  # picklable with its two-argument __init__
        return (type(self), (self.imported, self.total))


class VerificationError(OnnxsatError):
    """The optimized model's outputs do not match the original's on onnxruntime (exit 3).

    `culprit_rules` names the rewrite rules involved when the caller could narrow them down,
    so the message points at a rule rather than at a file.
    """

    exit_code = 3

    def __init__(
        self,
        output_name: str,
        max_abs_err: float,
        detail: str,
        culprit_rules: list[str] | None = None,
    ) -> None:
        self.output_name = output_name
        self.max_abs_err = max_abs_err
        self.detail = detail
        self.culprit_rules = list(culprit_rules) if culprit_rules else []
        super().__init__(self._message())

    def _message(self) -> str:
        # output_name "" and a NaN error mean "not tied to one output" (e.g. an unsound rule caught
        # before any output was compared): say only what is known.
        msg = "optimized model does not match the original"
        parts = []
        if self.output_name:
            msg += f" on output '{self.output_name}'"
        if not math.isnan(self.max_abs_err):
            parts.append(f"max abs error {self.max_abs_err:.3g}")
        if self.detail:
            parts.append(self.detail)
        if parts:
            msg += ": " + "; ".join(parts)
        if self.culprit_rules:
            msg += f"; rules involved: {', '.join(self.culprit_rules)}"
        return msg

    def __reduce__(self):  # keep the custom __init__ picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.output_name, self.max_abs_err, self.detail, self.culprit_rules))


def one_line(err: object, limit: int = 300) -> str:
    """First non-empty line of an error's text, trimmed: messages for people, not tracebacks.

    Library errors (onnx.checker, protobuf, onnxruntime) often span several lines; the CLI
    prints one.
    """
    text = str(err)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or type(err).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
