"""How long the native runner's idle helpers spin before they park, on whole models.

A helper that parked on its futex answers the next run late on this VM (its vCPU idles), so a
model called after a pause runs on one thread for a while. This compiles one model per spin
count in one process (each with its own helper threads, ``native_runner.IDLE_SPINS`` set in its
run state) next to an onnxruntime session, and times them in interleaved rounds in the pattern
of ``compiled_realmodels.py``: a 0.2 s pause, one untimed call, the median of five timed calls.
Counts whose spin outlasts the pause would spin into the next block: keep them below ~0.2 s.

    python benchmarks/helper_idle_ab.py /work/realmodels-full/mobilenet_v3_small-ts-static.onnx
"""

from __future__ import annotations

import argparse
import ctypes
from collections.abc import Callable

import numpy as np

from onnxsat.base.modelio import load_model
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.native_runner import IDLE_SPINS
from onnxsat.latency import block_median, ort_session
from onnxsat.verification_inputs import make_inputs

SETTLE_S = 0.2
CALLS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--spins", default="2000,50000,100000,200000", help="comma-separated spin counts")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = load_model(args.model)
    feeds = make_inputs(model, seed=0)
    session = ort_session(model, level="all", threads=args.threads)
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    for spins in (int(s) for s in args.spins.split(",")):
        compiled = CompiledModel(model, CompileOptions(threads=args.threads, cache=True))
        assert compiled.workers is not None, "one thread: no helpers to compare"
        ctypes.c_int64.from_address(compiled.workers.start + IDLE_SPINS * 8).value = spins
        runs[f"spins {spins}"] = lambda c=compiled: c(feeds)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for r in range(args.rounds):
        names = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in names:
            times[name].append(block_median(runs[name], CALLS, settle_s=SETTLE_S, untimed=1) * 1e3)
    for name, values in times.items():
        print(f"{name:>16}: {np.median(values):.3f} ms (median of {len(values)} blocks)")


if __name__ == "__main__":
    main()
