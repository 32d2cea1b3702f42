"""``python -m onnxsat``: the same command line as the ``onnxsat`` console script."""

from onnxsat.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
