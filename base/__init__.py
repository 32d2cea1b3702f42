"""``onnxsat.base``: what every layer may use, importing nothing of the project.

``errors`` (the exception types and exit codes), ``options`` (``Options``/``Budgets``: every
setting of a run), ``modelio`` (loading, checking and saving ONNX files), ``lazy_weights``
(initializers kept in their file until needed) and ``report`` (the records a run fills in).
"""

__version__ = "0.1.0"
