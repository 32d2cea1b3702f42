"""Time and memory of ``onnxsat.optimize`` with the full rule library at default budgets on the ONNX
"light" models and the transformer example, one fresh process per model.

Each model runs in its own interpreter so that peak RSS is that model's alone (taken from the
kernel's accounting of the child via ``os.wait4``, which also works when the child crashes or is
killed). The wall time is that of the ``onnxsat.optimize`` call, verification included, without
interpreter start-up or model loading. Results print as a markdown table, followed by the floors
from the issues (resnet50-light and the transformer example <= 20 s, densenet121-light <= 60 s,
peak RSS <= 4 GiB, stricter than the rule-library issue's 6 GiB) with PASS/FAIL, then the e-graph
size after each saturation iteration per schedule phase; the exit status is 1 if a floor fails or
a model errors.

    python benchmarks/optimize_light.py                  # all light models shipped with onnx
    python benchmarks/optimize_light.py --out results.md extra/model.onnx
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Floors from the issue: optimize wall time per model (s), and peak RSS for every model.
TIME_FLOORS_S: dict[str, float] = {"resnet50-light": 20.0, "densenet121-light": 60.0, "transformer_block": 20.0}
EXAMPLE_MODELS = ("transformer_block.onnx",)
"""examples/ models benchmarked by default (the rule-library issue's speed floor names the transformer)."""
RSS_FLOOR_MIB = 4096.0


@dataclass
class Result:
    """One model's row; `status` is the verification status, or what went wrong."""

    name: str
    path: str
    seconds: float | None = None
    cpu_seconds: float | None = None
    """User + system CPU time of the whole child (import and loading included): load-independent."""
    rss_mib: float | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    status: str = ""
    ok: bool = False
    stages: dict[str, float] | None = None
    phases: list[dict] | None = None
    """Per schedule phase: name, stop reason, and the e-graph size after each of its iterations."""


def light_models() -> list[Path]:
    """The light models inside the installed onnx package (weights are one constant each)."""
    import onnx

    light = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
    return sorted(light.glob("*.onnx"))


def display_name(path: Path) -> str:
    """``light_resnet50.onnx`` -> ``resnet50-light``, the name the issue's floors use."""
    stem = path.stem
    return f"{stem.removeprefix('light_')}-light" if stem.startswith("light_") else stem


# ---------------------------------------------------------------------------------------------
# child: optimize one model, write a JSON result


def child_main(model_path: str, result_path: str, verify: bool) -> int:
    """Runs in the fresh process: load, optimize (timed), and write what the parent tabulates."""
    import onnxsat
    from onnxsat.base.errors import one_line
    from onnxsat.base.modelio import load_model

    out: dict[str, object] = {}
    code = 0
    try:
        model = load_model(model_path)
        start = time.perf_counter()
        _optimized, report = onnxsat.optimize(model, onnxsat.Options(verify=verify, progress=False))
        out["seconds"] = time.perf_counter() - start
        out["nodes_before"] = report.total_before
        out["nodes_after"] = report.total_after
        out["status"] = report.verification.status
        sat = report.saturation
        out["stages"] = report.stage_seconds
        out["phases"] = [
            {
                "name": p.name,
                "stop": p.stop_reason,
                "enodes": [it.enodes for it in sat.iterations[p.first_iteration : p.first_iteration + p.iterations]]
                or [p.enodes],
            }
            for p in sat.phases
        ]
        out["ok"] = report.verification.status in ("passed", "skipped", "regionwise")
    except Exception as e:
        out["status"] = f"error: {type(e).__name__}: {one_line(e, 120)}"
        code = 1
    Path(result_path).write_text(json.dumps(out))
    return code


# ---------------------------------------------------------------------------------------------
# parent: one child per model, then the table


def _maxrss_mib(ru_maxrss: int) -> float:
    # Linux reports KiB, macOS bytes.
    return ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else ru_maxrss / 1024


def run_one(path: Path, verify: bool, timeout: float) -> Result:
    """Optimize `path` in a child process; peak RSS comes from `os.wait4` on that child alone."""
    result = Result(name=display_name(path), path=str(path))
    with tempfile.TemporaryDirectory(prefix="onnxsat-bench-") as tmp:
        result_file = Path(tmp) / "result.json"
        stderr_file = Path(tmp) / "stderr.txt"
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(path), "--result", str(result_file)]
        if not verify:
            cmd.append("--no-verify")
        with open(stderr_file, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + timeout
            timed_out = False
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    timed_out = True
                    pid, status, rusage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        result.rss_mib = _maxrss_mib(rusage.ru_maxrss)
        result.cpu_seconds = rusage.ru_utime + rusage.ru_stime

        if timed_out:
            result.status = f"timeout after {timeout:g} s"
            return result
        if result_file.exists():
            data = json.loads(result_file.read_text())
            result.seconds = data.get("seconds")
            result.nodes_before = data.get("nodes_before")
            result.nodes_after = data.get("nodes_after")
            result.status = str(data.get("status", ""))
            result.ok = bool(data.get("ok", False))
            result.stages = data.get("stages")
            result.phases = data.get("phases")
            return result
        rc = proc.returncode
        why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        tail = [ln for ln in stderr_file.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        result.status = f"crashed ({why})" + (f": {tail[0][:120]}" if tail else "")
        return result


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(results: list[Result], verify: bool) -> tuple[str, bool]:
    """The markdown report and whether every floor passed and every model ran."""
    import onnx

    import onnxsat

    lines = [
        "# onnxsat optimize: ONNX light models and examples, full rule library, default budgets",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; onnxsat {getattr(onnxsat, '__version__', '?')},"
        f" onnx {onnx.__version__}, Python {platform.python_version()}, {platform.machine()},"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (other processes share the CPUs);"
        f" default Options{'' if verify else ' with verify=False'}",
        "",
        "| model | optimize (s) | child CPU (s) | peak RSS (MiB) | nodes before | nodes after | verification |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {_fmt(r.seconds, '.2f')} | {_fmt(r.cpu_seconds, '.1f')} | {_fmt(r.rss_mib, '.0f')}"
            f" | {_fmt(r.nodes_before, 'd')}"
            f" | {_fmt(r.nodes_after, 'd')} | {r.status} |"
        )

    all_ok = all(r.ok for r in results)
    lines += ["", "## Floors", "", "| floor | measured | result |", "|---|---:|---|"]
    by_name = {r.name: r for r in results}
    for name, limit in TIME_FLOORS_S.items():
        r = by_name.get(name)
        if r is None:
            lines.append(f"| {name} optimize <= {limit:g} s | not run | - |")
            continue
        passed = r.ok and r.seconds is not None and r.seconds <= limit
        all_ok &= passed
        measured = f"{r.seconds:.2f} s" if r.seconds is not None else r.status
        lines.append(f"| {name} optimize <= {limit:g} s | {measured} | {'PASS' if passed else 'FAIL'} |")
    measured_rss = [r for r in results if r.rss_mib is not None]
    if measured_rss:
        worst = max(measured_rss, key=lambda r: r.rss_mib or 0.0)
        passed = all((r.rss_mib or 0.0) <= RSS_FLOOR_MIB for r in measured_rss)
        all_ok &= passed
        lines.append(
            f"| peak RSS <= {RSS_FLOOR_MIB / 1024:g} GiB (every model) | max {worst.rss_mib:.0f} MiB"
            f" ({worst.name}) | {'PASS' if passed else 'FAIL'} |"
        )
    lines += ["", "## E-graph size per iteration", "", "| model | phase: stop reason, e-nodes after each iteration |", "|---|---|"]
    for r in results:
        phases = "; ".join(f"{p['name']} ({p['stop']}): {', '.join(map(str, p['enodes']))}" for p in r.phases or [])
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in (r.stages or {}).items())
        lines.append(f"| {r.name} | {phases or '-'}<br>stages: {stages or '-'} |")
    failed = [r.name for r in results if not r.ok]
    if failed:
        lines += ["", f"Models that did not run cleanly: {', '.join(failed)}"]
    return "\n".join(lines) + "\n", all_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark onnxsat.optimize on the ONNX light models (one process per model).",
    )
    parser.add_argument("models", nargs="*", type=Path, help="extra ONNX files to benchmark")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table to this file")
    parser.add_argument("--only", default=None, help="run only models whose name contains one of these comma-separated texts")
    parser.add_argument("--no-light", action="store_true", help="skip the light models; run only MODELS")
    parser.add_argument("--no-examples", action="store_true", help="skip the examples/ models run by default")
    parser.add_argument("--no-verify", action="store_true", help="optimize with verify=False")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model (default 900)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child is not None:
        return child_main(args.child, args.result, verify=not args.no_verify)

    examples = Path(__file__).resolve().parent.parent / "examples"
    paths = ([] if args.no_light else light_models()) + [p.resolve() for p in args.models]
    paths += [] if args.no_examples else [examples / name for name in EXAMPLE_MODELS]
    if args.only:
        wanted = args.only.split(",")
        paths = [p for p in paths if any(w in display_name(p) for w in wanted)]
    if not paths:
        print("no models to benchmark", file=sys.stderr)
        return 2

    results = []
    for path in paths:
        print(f"optimizing {display_name(path)} ...", file=sys.stderr, flush=True)
        r = run_one(path, verify=not args.no_verify, timeout=args.timeout)
        print(
            f"  {_fmt(r.seconds, '.2f')} s, {_fmt(r.rss_mib, '.0f')} MiB, {r.status}",
            file=sys.stderr,
            flush=True,
        )
        results.append(r)

    text, all_ok = render(results, verify=not args.no_verify)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
