"""Differential fuzzing of ``onnxsat.optimize``: random valid ONNX graphs (``strategy.fuzz_models``)
and the property every optimized model must satisfy (``check.check_case``).

``builder`` tracks dims/dtypes while emitting nodes, ``ops`` generates single modelled ops,
``motifs`` the op chains the rules match, ``strategy`` assembles them into models, ``check``
validates a generated model and runs the property through a warm pipeline. Used by
``tests/test_fuzz.py`` (CI profile) and ``benchmarks/fuzz.py`` (thousands of examples).
"""
