"""Nodes and onnxruntime latency on the real-model corpus: onnxsat (standard ops, and with
``--allow-contrib-ops``) against onnxslim, onnx-simplifier and onnxruntime's transformer optimizer.

The corpus is an export of ``benchmarks/realmodels/manifest.json`` (``export.py --size full``; not
committed). Every tool runs in its own process; then, in this process, each result is checked
against the original on the corpus's seeded feeds (token ids inside the vocabulary, 0/1 masks) and
timed at ORT_DISABLE_ALL, ORT_ENABLE_BASIC and ORT_ENABLE_ALL in interleaved rounds with bootstrap
95% intervals (``compare_peers.py`` does the work; this is its corpus run).

    python benchmarks/realmodels.py --corpus EXPORT_DIR --peers-python PY [--only bert] [--rounds 30] [--merge]
        -> benchmarks/results/realmodels.{md,json,png}

PY is a Python with onnxslim, onnxsim and torch (the transformer optimizer's fusions import it), for
example the one export.py runs in; onnxsat runs in this Python.
"""

from __future__ import annotations

import sys

from compare_peers import CORPUS_TOOLS, RESULTS
from compare_peers import main as compare_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--corpus" not in argv:
        print(
            "realmodels.py: --corpus DIR is required (an export of benchmarks/realmodels/manifest.json)",
            file=sys.stderr,
        )
        return 2
    defaults = ["--tools", ",".join(CORPUS_TOOLS), "--out", str(RESULTS / "realmodels"), "--threads", "1"]
    return compare_main(defaults + argv)  # flags given later win


if __name__ == "__main__":
    sys.exit(main())
