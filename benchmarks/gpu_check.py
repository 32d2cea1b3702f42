"""Run an ``onnxsat compile --target cuda --emit-ptx DIR --emit-check`` bundle on a GPU.

Needs only numpy and cuda-python (no onnxsat install, no egglog, no network): the driver wrapper
is loaded by path from ../kernels/cuda/driver.py. For every launch with check data it uploads the
buffers as they were before the step on the CPU backend, launches the kernel, and compares what
it wrote with the CPU result; then it runs the whole model (when no step needs the host) and
compares the graph outputs. Timing (CUDA events, mean of repeated launches):

* every launch: microseconds and effective bandwidth (bytes of its buffers / time);
* the device's own copy bandwidth (cuMemcpyDtoD, 2 x bytes / time, 256 MiB) as the reference;
  the fused elementwise launches are reported as a fraction of it;
* GEMM launches against cuBLAS on the same shapes through CuPy or torch when either is present.

Usage: python benchmarks/gpu_check.py DIR [--json OUT] [--budget-s 240]
Exit status: 0 when every check passes, 1 on a mismatch, 2 when the bundle cannot be run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RTOL, ATOL = 1e-3, 1e-4
COPY_BYTES = 256 << 20
ELEMENTWISE_FORMS = ("vectorized", "elementwise")
WIN, LOSS = 1.02, 0.98
"""A ratio's verdict, as in ``onnxsat.latency``: win when the whole interval lies above WIN."""
MIN_BANDWIDTH_BYTES = 1 << 20
"""Launches moving less than this are launch-latency bound; their bandwidth is not summarized."""


def load_driver_module() -> Any:
    path = Path(__file__).resolve().parent.parent / "kernels" / "cuda" / "driver.py"
    spec = importlib.util.spec_from_file_location("onnxsat_cuda_driver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DTYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16, "i32": np.int32,
    "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "bool": np.bool_,
}


# ---------------------------------------------------------------- pure helpers (unit-tested on the CPU)
def load_manifest(bundle: Path) -> dict[str, Any]:
    data = json.loads((bundle / "manifest.json").read_text())
    if data.get("format") != "onnxsat-cuda-bundle/1":
        raise ValueError(f"{bundle}: not an onnxsat CUDA bundle (format {data.get('format')!r})")
    for k in data["kernels"]:
        if not (bundle / k["file"]).exists():
            raise ValueError(f"{bundle}: missing {k['file']}")
    return data


def nbytes(buf: dict[str, Any]) -> int:
    return int(np.prod(buf["shape"], dtype=np.int64)) * np.dtype(DTYPES[buf["dtype"]]).itemsize


def compare(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """(matches, max abs error): floats within RTOL/ATOL (NaN equal), other types exactly."""
    if got.shape != want.shape:
        return False, float("inf")
    if got.size == 0:
        return True, 0.0
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    if np.issubdtype(want.dtype, np.floating):
        return bool(np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)), err
    return bool(np.array_equal(got, want)), err


def launch_bytes(step: dict[str, Any], buffers: dict[str, dict[str, Any]]) -> int:
    """Bytes a launch must move at least: every buffer argument read or written once."""
    names = {a["value"] for a in step["args"] if a["kind"] == "buffer"}
    return sum(nbytes(buffers[n]) for n in names)


def gemm_shape(step: dict[str, Any]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a GEMM launch from its scalar arguments."""
    scalars = [int(a["value"]) for a in step["args"] if a["kind"] == "i64"]
    m, n, k = scalars[:3]
    return int(step["grid"][2]), m, n, k


def repeats_for(seconds_once: float, target: float = 0.05, lo: int = 3, hi: int = 200) -> int:
    return max(lo, min(hi, int(target / max(seconds_once, 1e-7))))


def summarize_bandwidth(rows: list[dict[str, Any]], copy_gbs: float) -> dict[str, Any]:
    """Fused elementwise bandwidth relative to the copy reference (large launches only)."""
    big = [r for r in rows if r["form"] in ELEMENTWISE_FORMS and r["bytes"] >= MIN_BANDWIDTH_BYTES]
    if not big or copy_gbs <= 0:
        return {"elementwise_launches": 0}
    ratios = sorted(r["gbs"] / copy_gbs for r in big)
    return {
        "elementwise_launches": len(big),
        "copy_gbs": copy_gbs,
        "median_fraction_of_copy": ratios[len(ratios) // 2],
        "best_fraction_of_copy": ratios[-1],
        "worst_fraction_of_copy": ratios[0],
    }


# ---------------------------------------------------------------- GPU side
class Runner:
    def __init__(self, bundle: Path, manifest: dict[str, Any], drv: Any):
        self.bundle, self.m, self.drv = bundle, manifest, drv
        self.dev = drv.Device()
        if int(self.dev.arch[3:]) < int(manifest["arch"][3:]):
            raise drv.CudaUnavailable(f"bundle is for {manifest['arch']} but the GPU is {self.dev.arch}")
        self.functions = {
            k["function"]: self.dev.function(self.dev.load_ptx((bundle / k["file"]).read_text()), k["function"]) for k in manifest["kernels"]
        }
        self.buffers = {b["name"]: b for b in manifest["buffers"]}
        self.index = {b["name"]: i for i, b in enumerate(manifest["buffers"])}

    def launch(self, step: dict[str, Any], pointers: dict[str, int]) -> None:
        args = self.drv.launch_args(step["args"], pointers)
        self.dev.launch(self.functions[step["function"]], step["grid"], step["block"], step["shared_bytes"], args)

    def host(self, name: str, value: np.ndarray | None) -> np.ndarray:
        buf = self.buffers[name]
        dtype = DTYPES[buf["dtype"]]
        if value is None:
            return np.zeros(buf["shape"], dtype=dtype)
        return np.ascontiguousarray(np.asarray(value).reshape(buf["shape"]), dtype=dtype)

    def check_step(self, i: int, step: dict[str, Any], data: Any, timing: bool) -> dict[str, Any]:
        names = sorted({a["value"] for a in step["args"] if a["kind"] == "buffer"})
        pointers = {n: self.dev.alloc(nbytes(self.buffers[n])) for n in names}
        try:
            for n in names:
                key = f"before_b{self.index[n]}"
                self.dev.upload(pointers[n], self.host(n, data[key] if data is not None and key in data else None))
            row: dict[str, Any] = {"step": i, "name": step["step"], "function": step["function"], "form": step["form"]}
            self.launch(step, pointers)
            if data is not None:
                worst, ok = 0.0, True
                for n in step["writes"]:
                    got = self.dev.download(pointers[n], self.host(n, None))
                    good, err = compare(got, data[f"after_b{self.index[n]}"])
                    ok, worst = ok and good, max(worst, err)
                row.update(ok=ok, max_abs_error=worst)
            if timing:
                start = time.perf_counter()
                self.launch(step, pointers)
                self.dev.synchronize()
                once = time.perf_counter() - start
                us = 1e3 * self.dev.time_ms(lambda: self.launch(step, pointers), repeats_for(once))
                moved = launch_bytes(step, self.buffers)
                row.update(us=us, bytes=moved, gbs=moved / (us * 1e-6) / 1e9 if us > 0 else 0.0)
            return row
        finally:
            for p in pointers.values():
                self.dev.free(p)

    def upload_model(self, data: Any) -> dict[str, int]:
        """Device memory for every buffer, weights and (with check data) graph inputs uploaded."""
        consts = np.load(self.bundle / "constants.npz")
        pointers = {n: self.dev.alloc(nbytes(b)) for n, b in self.buffers.items()}
        for n in self.buffers:
            key = f"b{self.index[n]}"
            if key in consts:
                self.dev.upload(pointers[n], self.host(n, consts[key]))
            elif data is not None and f"in_{key}" in data:
                self.dev.upload(pointers[n], self.host(n, data[f"in_{key}"]))
        return pointers

    def model_work(self, pointers: dict[str, int]) -> Any:
        """A function that issues every launch of the model in order (arguments packed once)."""
        launches = [
            (self.functions[s["function"]], s["grid"], s["block"], s["shared_bytes"], self.drv.launch_args(s["args"], pointers))
            for s in self.m["steps"]
            if s["elements"]
        ]

        def work() -> None:
            for function, grid, block, shared, args in launches:
                self.dev.launch(function, grid, block, shared, args)

        return work

    def whole_model(self) -> dict[str, Any]:
        data = np.load(self.bundle / "check" / "model.npz")
        pointers = self.upload_model(data)
        try:
            self.model_work(pointers)()
            results = {}
            for graph_name, n in self.m["outputs"]:
                got = self.dev.download(pointers[n], self.host(n, None))
                ok, err = compare(got, data[f"out_b{self.index[n]}"])
                results[graph_name] = {"ok": ok, "max_abs_error": err}
            return results
        finally:
            self.free_all(pointers)

    def free_all(self, pointers: dict[str, int]) -> None:
        for p in pointers.values():
            self.dev.free(p)

    def model_timer(self, pointers: dict[str, int]) -> tuple[str, Any]:
        """(how, fn): ``fn(repeats)`` = mean ms of one whole-model run, replayed as a CUDA graph
        (the stream of Python launches when graph capture is not available)."""
        work = self.model_work(pointers)
        try:
            graph = self.drv.capture_graph(self.dev, work)
            return "cuda-graph", lambda repeats: self.dev.time_ms(lambda: self.drv.replay_graph(self.dev, graph), repeats)
        except (self.drv.CudaError, AttributeError, TypeError) as exc:  # an older driver binding or API
            print(f"  (graph capture failed: {exc}; timing the launch loop)")
            return "launch-loop", lambda repeats: self.dev.time_ms(work, repeats)

    def copy_bandwidth(self) -> float:
        src, dst = self.dev.alloc(COPY_BYTES), self.dev.alloc(COPY_BYTES)
        try:
            ms = self.dev.time_ms(lambda: self.dev.copy(dst, src, COPY_BYTES), 20)
            return 2 * COPY_BYTES / (ms * 1e-3) / 1e9
        finally:
            self.dev.free(src)
            self.dev.free(dst)


def bootstrap_ratio_ci(baseline: np.ndarray, candidate: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(baseline) / median(candidate) over rounds: the
    method of ``onnxsat.latency.bootstrap_ratio_ci`` (this script cannot import onnxsat)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(baseline), size=(resamples, len(baseline)))
    ratios = np.median(baseline[idx], axis=1) / np.median(candidate[idx], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def verdict(low: float, high: float) -> str:
    return "win" if low > WIN else "loss" if high < LOSS else "tie"


def compare_models(runners: list[Runner], rounds: int) -> dict[str, Any]:
    """Whole-model times of the bundles in interleaved rounds (order rotated each round), each a
    mean over enough replays for ~20 ms; ratio = median(first) / median(other) with a bootstrap CI."""
    pointers = [r.upload_model(None) for r in runners]
    try:
        timers = [r.model_timer(p) for r, p in zip(runners, pointers, strict=True)]
        once = [t(3) for _, t in timers]
        repeats = [repeats_for(ms * 1e-3, target=0.02, hi=2000) for ms in once]
        times = np.empty((len(runners), rounds))
        for k in range(rounds):
            for j in range(len(runners)):
                i = (j + k) % len(runners)
                times[i, k] = timers[i][1](repeats[i])
        base = times[0]
        out: dict[str, Any] = {"rounds": rounds, "how": [h for h, _ in timers], "median_ms": [float(np.median(t)) for t in times], "ratios": []}
        for i in range(1, len(runners)):
            low, high = bootstrap_ratio_ci(base, times[i])
            ratio = float(np.median(base) / np.median(times[i]))
            out["ratios"].append({"bundle": runners[i].m["model"], "ratio": ratio, "ci": [low, high], "verdict": verdict(low, high)})
        return out
    finally:
        for r, p in zip(runners, pointers, strict=True):
            r.free_all(p)


def cublas_ms(batch: int, m: int, n: int, k: int, dtype: str) -> tuple[str, float] | None:
    """cuBLAS time for the same product through CuPy or torch (None when neither is installed)."""
    np_dtype = DTYPES[dtype]
    try:
        import cupy

        a = cupy.random.standard_normal((batch, m, k)).astype(np_dtype)
        b = cupy.random.standard_normal((batch, k, n)).astype(np_dtype)
        cupy.matmul(a, b)
        cupy.cuda.Device().synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(10):
            cupy.matmul(a, b)
        stop.record()
        stop.synchronize()
        return "cupy", cupy.cuda.get_elapsed_time(start, stop) / 10
    except ImportError:
        pass
    try:
        import torch

        tdt = {"f32": torch.float32, "f64": torch.float64}[dtype]
        a = torch.randn(batch, m, k, device="cuda", dtype=tdt)
        b = torch.randn(batch, k, n, device="cuda", dtype=tdt)
        torch.matmul(a, b)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            torch.matmul(a, b)
        e1.record()
        torch.cuda.synchronize()
        return "torch", e0.elapsed_time(e1) / 10
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop timing launches after this many seconds")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--compare", type=Path, nargs="+", default=[], metavar="BUNDLE",
                    help="time these bundles' whole models against BUNDLE's in interleaved rounds (check them on their own)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved whole-model rounds (default 30 with --compare, else 5)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        manifest = load_manifest(args.bundle)
        drv = load_driver_module()
        runner = Runner(args.bundle, manifest, drv)
        others = [Runner(b, load_manifest(b), drv) for b in args.compare]
    except Exception as exc:  # noqa: BLE001 - one line, exit 2: the bundle cannot run here
        print(f"gpu_check: cannot run {args.bundle}: {exc}", file=sys.stderr)
        return 2
    print(f"{runner.dev.name} ({runner.dev.arch}, {runner.dev.sm_count} SMs); bundle {manifest['model']} for {manifest['arch']}")
    checks = args.bundle / "check"
    rows = []
    for i, step in enumerate(manifest["steps"]):
        if step["kind"] != "launch" or not step["elements"]:
            continue
        path = checks / f"step_{i:04d}.npz"
        data = np.load(path) if path.exists() else None
        timing = not args.no_timing and time.perf_counter() - start < args.budget_s
        rows.append(runner.check_step(i, step, data, timing))
    failed = [r for r in rows if r.get("ok") is False]
    checked = sum("ok" in r for r in rows)
    print(f"launches checked against the CPU backend: {checked - len(failed)}/{checked} match")
    for r in failed:
        print(f"  MISMATCH step {r['step']} {r['name']} ({r['function']}, {r['form']}): max abs error {r['max_abs_error']:.3g}")
    result: dict[str, Any] = {"device": runner.dev.name, "arch": runner.dev.arch, "launches": rows, "checked": checked, "failed": len(failed)}
    if (checks / "model.npz").exists() and not any(s["kind"] == "host" for s in manifest["steps"]):
        whole = runner.whole_model()
        result["whole_model"] = whole
        print("whole model on the GPU: " + ", ".join(f"{k} {'ok' if v['ok'] else 'MISMATCH'} ({v['max_abs_error']:.2e})" for k, v in whole.items()))
        failed += [v for v in whole.values() if not v["ok"]]
    if not args.no_timing:
        copy_gbs = runner.copy_bandwidth()
        result["bandwidth"] = summarize_bandwidth([r for r in rows if "gbs" in r], copy_gbs)
        print(f"device copy bandwidth: {copy_gbs:.0f} GB/s; elementwise: {json.dumps(result['bandwidth'])}")
        gemms = []
        for r, step in zip(rows, [s for s in manifest["steps"] if s["kind"] == "launch" and s["elements"]], strict=True):
            if step["form"] == "gemm" and "us" in r:
                batch, m, n, k = gemm_shape(step)
                dtype = next(a["dtype"] for a in step["args"] if a["kind"] == "float")
                ref = cublas_ms(batch, m, n, k, dtype)
                flops = 2.0 * batch * m * n * k
                gemms.append({"shape": [batch, m, n, k], "onnxsat_tflops": flops / (r["us"] * 1e-6) / 1e12,
                              "cublas": None if ref is None else {"via": ref[0], "tflops": flops / (ref[1] * 1e-3) / 1e12}})
        result["gemm"] = gemms
        for g in gemms:
            print(f"GEMM {g['shape']}: {g['onnxsat_tflops']:.2f} TFLOP/s" + (f" vs cuBLAS ({g['cublas']['via']}) {g['cublas']['tflops']:.2f}" if g["cublas"] else " (no CuPy/torch for cuBLAS)"))
        runnable = [r for r in [runner, *others] if not any(s["kind"] == "host" for s in r.m["steps"])]
        if len(runnable) == 1 + len(others):
            timed = compare_models(runnable, args.rounds or (30 if others else 5))
            result["model_time"] = timed
            for r, ms, how in zip(runnable, timed["median_ms"], timed["how"], strict=True):
                print(f"whole model {r.m['model']}: {ms * 1e3:.1f} us ({how}, median of {timed['rounds']} rounds)")
            for c in timed["ratios"]:
                print(f"  {manifest['model']} / {c['bundle']}: x{c['ratio']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] {c['verdict']}")
        else:
            print("whole model not timed: a step runs on the host")
    result["seconds"] = time.perf_counter() - start
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
