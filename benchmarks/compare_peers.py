"""onnxsat against the ONNX optimizers people use today: onnxsim, onnxslim and onnxoptimizer.

For every model of the suite (the nine ONNX light models with seeded random weights, every model
in examples/, and any ONNX files on the command line) each tool optimizes the model in a fresh
process (its wall time, default settings; onnxsat's includes its own verification). Then, in this
process: node count, max abs error against the original on onnxruntime (ORT_DISABLE_ALL, seeded
random inputs), and the latency ratio original/optimized at ORT_DISABLE_ALL, ORT_ENABLE_BASIC and
ORT_ENABLE_ALL. Latency runs the original and every tool's result in the same interleaved rounds
(order rotated each round, so load drift hits all alike); each ratio gets a percentile-bootstrap
95% interval and a verdict from `onnxsat.latency` (win above 1.02, loss below 0.98, else tie).

    pip install -e ".[bench]"
    python benchmarks/compare_peers.py                       # writes benchmarks/results/peers.{md,json,png}
    python benchmarks/compare_peers.py --only resnet50 --rounds 30 extra/model.onnx
    python benchmarks/compare_peers.py --only vgg19 --merge  # add/redo one row, keep the others

Each row records when it was measured and the load average then; ``--merge`` keeps the rows of
an existing OUT.json that this run does not measure, so one model can be (re)measured alone.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TOOLS = ("onnxsat", "onnxsim", "onnxslim", "onnxoptimizer")
CORPUS_TOOLS = ("onnxsat", "onnxsat-contrib", "onnxslim", "onnxsim", "ort-transformers")
"""The real-model corpus run (benchmarks/realmodels.py): onnxsat with standard ops only and with
``--allow-contrib-ops``, the two simplifiers, and onnxruntime's transformer optimizer (the anchor
on transformer exports)."""
ORT_MODEL_TYPES = {
    "bert": "bert",
    "distilbert": "bert",
    "gpt2": "gpt2",
    "t5_encoder": "t5",
    "whisper_tiny_encoder": "bert",
    "llama": "gpt2",
    "qwen2": "gpt2",
    "mistral": "gpt2",
    "vit_b_16": "vit",
    "swin_t": "swin",
}
"""Corpus architecture -> onnxruntime.transformers model type (its closest fusion set); CNNs have none."""
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "all": "ORT_ENABLE_ALL"}
# Above this max abs error (relative to the output's magnitude) a tool's result counts as wrong.
ERROR_TOLERANCE = 1e-3
FLOAT16_ERROR_TOLERANCE = 1e-2
"""The same for a model that computes in float16 (float16 weights or a Cast to it): two float16
runtimes differ by ~1e-3 (onnxruntime's transformer optimizer on BERT-base in float16: 1.9e-3), as
test_realmodels allows."""


# ---------------------------------------------------------------------------------------------
# child: one tool on one model, in a fresh process


def _architecture(model_name: str) -> str:
    """A corpus model's architecture: its name up to the exporter (``bert-ts-static`` -> ``bert``)."""
    return model_name.split("-", 1)[0]


def _optimize_with(tool: str, model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    if tool in ("onnxsat", "onnxsat-contrib", "onnxsat-contrib-keep-opset"):
        import onnxsat

        contrib, keep = tool != "onnxsat", tool.endswith("keep-opset")
        options = onnxsat.Options(allow_contrib_ops=contrib, **({"upgrade_opset": None} if keep else {}))
        return onnxsat.optimize(model, options)[0]
    if tool == "ort-transformers":
        from onnxruntime.transformers import optimizer

        model_type = ORT_MODEL_TYPES.get(_architecture(name))
        if model_type is None:
            raise NotApplicable(f"no onnxruntime.transformers model type for {_architecture(name)}")
        return optimizer.optimize_model(model, model_type=model_type).model
    if tool == "onnxsim":
        import onnxsim

        simplified, ok = onnxsim.simplify(model)
        if not ok:
            raise RuntimeError("onnxsim's own check failed")
        return simplified
    if tool == "onnxslim":
        import onnxslim

        return onnxslim.slim(model)
    if tool == "onnxoptimizer":
        import onnxoptimizer

        return onnxoptimizer.optimize(model)
    raise ValueError(f"unknown tool {tool}")


class NotApplicable(Exception):
    """The tool has nothing for this kind of model (the transformer optimizer on a CNN)."""


def _cpu_seconds() -> float:
    """User + system CPU time of this process, all threads: less sensitive to other load than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_main(tool: str, src: str, dst: str, result: str) -> int:
    """Load, optimize (timed), save; the parent reads ``result`` (JSON) and ``dst``. Imports no
    onnxsat module unless the tool is onnxsat: a peer's child may run in another Python."""
    model = onnx.load(src)
    out: dict[str, object] = {}
    try:
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        optimized = _optimize_with(tool, model, Path(src).stem)
        out["seconds"] = time.perf_counter() - start
        out["cpu_seconds"] = _cpu_seconds() - cpu_start
        onnx.save(optimized, dst)
        out["status"] = "ok"
    except NotApplicable as e:
        out["status"] = f"not applicable: {e}"
    except Exception as e:  # a peer failing on a model is a result, not a crash of the benchmark
        out["status"] = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:120]}"
    Path(result).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------
# parent


@dataclass
class ToolResult:
    """One tool on one model; latency maps a level to a `LatencyComparison.to_dict()`."""

    status: str
    seconds: float | None = None
    cpu_seconds: float | None = None
    nodes: int | None = None
    max_abs_err: float | None = None
    latency: dict[str, dict] = field(default_factory=dict)


@dataclass
class ModelResult:
    name: str
    nodes: int
    original_ms: dict[str, float] = field(default_factory=dict)
    tools: dict[str, ToolResult] = field(default_factory=dict)
    note: str = ""
    measured: str = ""
    """When this row was measured and the 1-minute load average then (rows of a merged file differ)."""

    @classmethod
    def from_dict(cls, data: dict) -> ModelResult:
        tools = {name: ToolResult(**tr) for name, tr in data.get("tools", {}).items()}
        return cls(**{**data, "tools": tools})


def merge_results(previous: list[ModelResult], fresh: list[ModelResult]) -> list[ModelResult]:
    """``previous`` with each row this run measured replaced in place; new rows appended in run order."""
    by_name = {r.name: r for r in fresh}
    merged = [by_name.pop(r.name, r) for r in previous]
    return merged + [r for r in fresh if r.name in by_name]


def build_suite(workdir: Path, extra: list[Path], only: list[str]) -> list[tuple[str, Path]]:
    """The light models with seeded random weights (pre-softmax logits exposed), examples/*, extras."""
    sys.path.insert(0, str(ROOT))
    from tests.models import LIGHT_MODELS, expose_pre_softmax, load_light, randomize_weights

    suite: list[tuple[str, Path]] = []
    for path in [*sorted((ROOT / "examples").glob("*.onnx")), *extra]:
        if only and not any(o in path.stem for o in only):
            continue
        suite.append((path.stem, path))
    # Smallest first, so an interrupted run has covered as many models as it could.
    for file_name in sorted(LIGHT_MODELS, key=lambda n: _light_cost(n)):
        name = Path(file_name).stem.removeprefix("light_") + "-light"
        if only and not any(o in name for o in only):
            continue
        path = workdir / f"{name}.onnx"
        onnx.save(expose_pre_softmax(randomize_weights(load_light(file_name), seed=0)), str(path))
        suite.append((name, path))
    return suite


def corpus_suite(corpus: Path, only: list[str]) -> list[tuple[str, Path, dict]]:
    """The exported models of a real-model corpus (export.py's INDEX.json), each with seeded feeds
    of valid ranges (token ids inside the vocabulary, 0/1 masks), smallest file first."""
    sys.path.insert(0, str(ROOT))
    from tests.realmodels_feeds import feeds_for

    index = json.loads((corpus / "INDEX.json").read_text())
    suite = [
        (name, corpus / record["file"], feeds_for(record["inputs"], seed=0))
        for name, record in index.items()
        if "error" not in record and (not only or any(o in name for o in only))
    ]
    return sorted(suite, key=lambda entry: entry[1].stat().st_size)


def _light_cost(file_name: str) -> int:
    """Approximate work of a light model: its weight count (read from the ConstantOfShape shapes)."""
    from onnx import numpy_helper

    from tests.models import load_light

    model = load_light(file_name)
    shapes = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return sum(
        int(np.prod(shapes[n.input[0]]))
        for n in model.graph.node
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes
    )


def installed(tool: str) -> bool:
    module = {
        "onnxsat-contrib": "onnxsat",
        "onnxsat-contrib-keep-opset": "onnxsat",
        "ort-transformers": "onnxruntime.transformers.optimizer",
    }.get(
        tool, tool
    )
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run_tool(
    tool: str, src: Path, workdir: Path, timeout: float, peers_python: str | None = None
) -> tuple[ToolResult, Path | None]:
    """``tool`` on ``src`` in a fresh process; peers in ``peers_python`` when given (the transformer
    optimizer's fusions import torch, which onnxsat's environment does not have)."""
    dst = workdir / f"{src.stem}.{tool}.onnx"
    result = workdir / f"{src.stem}.{tool}.json"
    python = sys.executable if tool.startswith("onnxsat") or peers_python is None else peers_python
    cmd = [python, __file__, "--child", tool, str(src), str(dst), str(result)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ToolResult(f"timeout after {timeout:g} s"), None
    if not result.exists():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ToolResult(f"crashed (exit {proc.returncode}): {tail[:120]}"), None
    data = json.loads(result.read_text())
    if data["status"] != "ok":
        return ToolResult(data["status"]), None
    return ToolResult("ok", seconds=data["seconds"], cpu_seconds=data.get("cpu_seconds")), dst


def max_abs_error(original: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict) -> float:
    """Largest |difference| over all outputs, relative to max(1, |reference|) per output."""
    from onnxsat.verification import run_ort

    ref, got = run_ort(original, feeds), run_ort(optimized, feeds)
    if set(ref) != set(got):
        return math.inf
    worst = 0.0
    for name, value in ref.items():
        a, b = np.asarray(value, np.float64), np.asarray(got[name], np.float64)
        if a.shape != b.shape:
            return math.inf
        if a.size:
            scale = max(1.0, float(np.abs(a).max()))
            worst = max(worst, float(np.abs(a - b).max()) / scale)
    return worst


def _timing_worker(conn: Any, path: str, level: str, threads: int, feeds: dict) -> None:
    """One model's onnxruntime session, alone in its process: on each request of ``calls``, one
    untimed run, then ``calls`` timed ones (seconds sent back); None ends it."""
    from onnxsat.latency import ort_session

    session = ort_session(onnx.load(path), level=level, threads=threads)  # type: ignore[arg-type]
    wanted = {i.name for i in session.get_inputs()}
    own = {k: v for k, v in feeds.items() if k in wanted}
    session.run(None, own)
    conn.send("ready")
    while (calls := conn.recv()) is not None:
        session.run(None, own)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            session.run(None, own)
            samples.append(time.perf_counter() - t0)
        conn.send(samples)


RESPAWN_ROUNDS = 3
"""Rounds between fresh processes for every model (see ``time_interleaved``)."""


def time_interleaved(
    models: list[onnx.ModelProto], feeds: dict, level: str, rounds: int, threads: int, seed: int = 0
) -> np.ndarray:
    """Milliseconds, shape (len(models), rounds): each model's session in a process of its own, and
    each round times every one (median of a few calls after an untimed one) in a fresh seeded
    random order; with several threads, after a pause that lets the last process's spinning
    onnxruntime threads sleep.

    Where onnxruntime lays a session out in memory moves its time by 5-10%: in one process the
    second of two sessions of the very same GPT-2 ran its Gemms 7% slower (and the fourth of four),
    so the order models were loaded in decided ties and "losses"; in processes of their own one of
    three identical ones ran 5% slower, by the draw of its address layout, and the one loaded first
    ran 3-5% slower or faster than the others for a whole process. So every model gets a fresh
    process every ``RESPAWN_ROUNDS`` rounds, loaded in a fresh random order: with ten draws in 30
    rounds rather than three, the bootstrap interval carries the draw (two copies of one Mistral
    file measured x0.993 and x1.023 against the original, each with an interval of +-1%, when a
    process held 10 rounds)."""
    import multiprocessing

    from onnxsat.base.modelio import save_model_atomic

    ctx = multiprocessing.get_context("spawn")
    times = np.empty((len(models), rounds))
    rng = np.random.default_rng(seed)
    calls = 0
    with tempfile.TemporaryDirectory(prefix="onnxsat-timing-") as tmp:
        paths = []
        for i, model in enumerate(models):
            paths.append(Path(tmp) / f"model{i}.onnx")
            save_model_atomic(model, paths[-1], durable=False)
        for first in range(0, rounds, RESPAWN_ROUNDS):
            workers: list[tuple[Any, Any]] = []
            try:
                order = rng.permutation(len(paths))
                for i in order:
                    mine, theirs = ctx.Pipe()
                    args = (theirs, str(paths[i]), level, threads, feeds)
                    process = ctx.Process(target=_timing_worker, args=args, daemon=True)
                    process.start()
                    workers.append((process, mine))
                    mine.recv()  # loaded before the next one starts
                workers = [workers[j] for j in np.argsort(order)]  # back in the models' order
                if not calls:
                    workers[0][1].send(1)
                    one_call = workers[0][1].recv()[0]
                    calls = 1 if one_call > 0.05 else 3 if one_call > 0.005 else 5
                for r in range(first, min(rounds, first + RESPAWN_ROUNDS)):
                    for i in rng.permutation(len(models)):
                        if threads > 1:
                            time.sleep(0.05)
                        workers[i][1].send(calls)
                        times[i, r] = float(np.median(workers[i][1].recv())) * 1e3
            finally:
                for process, conn in workers:
                    try:
                        conn.send(None)
                    except OSError:
                        pass
                    process.join(timeout=30)
    return times


def measure_latency(
    models: dict[str, onnx.ModelProto], feeds: dict, level: str, rounds: int, threads: int
) -> tuple[float, dict[str, dict]]:
    """Original's median ms and, per tool, original/tool ratio with its bootstrap CI and verdict."""
    from onnxsat.latency import LatencyComparison, bootstrap_ratio_ci

    names = list(models)
    times = time_interleaved([models[n] for n in names], feeds, level, rounds, threads)
    base = times[0]
    out: dict[str, dict] = {}
    for i, name in enumerate(names[1:], start=1):
        low, high = bootstrap_ratio_ci(base, times[i], block=RESPAWN_ROUNDS)  # a process per run of rounds
        cmp = LatencyComparison(
            baseline_ms=float(np.median(base)),
            candidate_ms=float(np.median(times[i])),
            ratio=float(np.median(base) / np.median(times[i])),
            ci_low=low,
            ci_high=high,
            rounds=rounds,
        )
        out[name] = cmp.to_dict()
    return float(np.median(base)), out


def benchmark_model(
    name: str,
    path: Path,
    tools: list[str],
    workdir: Path,
    args: argparse.Namespace,
    feeds: dict | None = None,
) -> ModelResult:
    """Every tool on one model, then errors and interleaved latency on ``feeds`` (default: seeded
    random inputs from onnxsat's verification)."""
    from onnxsat.base.errors import one_line
    from onnxsat.verification import make_inputs

    original = onnx.load(str(path))
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    result = ModelResult(name=name, nodes=len(original.graph.node), measured=f"{stamp}, load {_load():.1f}")
    optimized: dict[str, onnx.ModelProto] = {}
    for tool in tools:
        print(f"  {tool} ...", file=sys.stderr, flush=True)
        tr, out_path = run_tool(tool, path, workdir, args.timeout, args.peers_python)
        result.tools[tool] = tr
        if out_path is not None:
            optimized[tool] = onnx.load(str(out_path))
            tr.nodes = len(optimized[tool].graph.node)
    try:
        feeds = make_inputs(original, seed=0) if feeds is None else feeds
        from onnxsat.verification import run_ort

        run_ort(original, feeds)
    except Exception as e:
        result.note = f"onnxruntime cannot run the original: {one_line(e, 100)}"
        return result
    runnable: dict[str, onnx.ModelProto] = {"original": original}
    half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in original.graph.initializer) or any(
        n.op_type == "Cast" and a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for n in original.graph.node for a in n.attribute
    )
    tolerance = FLOAT16_ERROR_TOLERANCE if half else ERROR_TOLERANCE
    for tool, model in optimized.items():
        try:
            tr = result.tools[tool]
            tr.max_abs_err = max_abs_error(original, model, feeds)
            if tr.max_abs_err > tolerance:
                tr.status = "wrong outputs"
            else:
                runnable[tool] = model
        except Exception as e:
            result.tools[tool].status = f"does not run: {one_line(e, 100)}"
    for level in args.levels.split(","):
        print(f"  latency {LEVELS[level]} ...", file=sys.stderr, flush=True)
        base_ms, ratios = measure_latency(runnable, feeds, level, args.rounds, args.threads)
        result.original_ms[level] = base_ms
        for tool, cmp in ratios.items():
            result.tools[tool].latency[level] = cmp
    result.measured += f" at start, {_load():.1f} at end"
    return result


# ---------------------------------------------------------------------------------------------
# output


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs{mem}{load} at start; {platform.system()} {platform.release()}"
    )


def versions(tools: list[str]) -> str:
    names = ["onnxsat", "onnx", "onnxruntime"] + [
        t for t in tools if t in ("onnxsim", "onnxslim", "onnxoptimizer")
    ]
    dist = {"onnxsim": "onnxsim", "onnxslim": "onnxslim", "onnxoptimizer": "onnxoptimizer"}
    parts = []
    for n in names:
        try:
            parts.append(f"{n} {importlib.metadata.version(dist.get(n, n))}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{n} ?")
    return ", ".join(parts) + f", Python {platform.python_version()}"


def _cell_latency(tr: ToolResult, level: str) -> str:
    c = tr.latency.get(level)
    if c is None:
        return "-"
    return f"{c['ratio']:.3f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}] {c['verdict']}"


def render_markdown(results: list[ModelResult], tools: list[str], header: dict[str, str]) -> str:
    lines = [f"# onnxsat vs peers ({header['date']}, {header.get('progress', '')})", ""]
    lines += [
        f"- machine: {header['machine']}",
        f"- versions: {header['versions']}",
        f"- settings: {header['settings']}",
        "",
    ]
    lines += [
        "Latency cells: original/optimized median-latency ratio (above 1: the tool made the model faster), "
        "[bootstrap 95% CI], verdict (win: CI above 1.02, loss: CI below 0.98, else tie). "
        "Error: max abs difference to the original over all outputs, relative to max(1, |output|).",
        "",
    ]
    cols = (
        ["model", "tool", "time (s)", "cpu (s)", "nodes", "max err"]
        + [LEVELS[lv] for lv in LEVELS]
        + ["status"]
    )
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in results:
        lines.append(
            f"| **{r.name}** | original | | | {r.nodes} | | "
            + " | ".join(f"{r.original_ms[lv]:.2f} ms" if lv in r.original_ms else "-" for lv in LEVELS)
            + f" | {r.note or 'baseline'}{f' (measured {r.measured})' if r.measured else ''} |"
        )
        for tool in tools:
            tr = r.tools[tool]
            secs = f"{tr.seconds:.2f}" if tr.seconds is not None else "-"
            cpu = f"{tr.cpu_seconds:.2f}" if tr.cpu_seconds is not None else "-"
            nodes = str(tr.nodes) if tr.nodes is not None else "-"
            err = f"{tr.max_abs_err:.1e}" if tr.max_abs_err is not None else "-"
            cells = [_cell_latency(tr, lv) for lv in LEVELS]
            lines.append(
                f"| | {tool} | {secs} | {cpu} | {nodes} | {err} | " + " | ".join(cells) + f" | {tr.status} |"
            )
    lines += ["", "## Geometric means over the models each tool optimized correctly", ""]
    cols = ["tool", "models", "optimize time (s)", "nodes after/before"] + [
        f"ratio {LEVELS[lv]}" for lv in LEVELS
    ]
    cols += [f"wins/ties/losses {LEVELS['all']}"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for tool in tools:
        ok = [r for r in results if r.tools[tool].status == "ok"]
        g_time = geomean([r.tools[tool].seconds or 0.0 for r in ok])
        g_nodes = geomean([(r.tools[tool].nodes or 0) / r.nodes for r in ok if r.nodes])
        g_lat = [
            geomean([r.tools[tool].latency[lv]["ratio"] for r in ok if lv in r.tools[tool].latency])
            for lv in LEVELS
        ]
        verdicts = [r.tools[tool].latency["all"]["verdict"] for r in ok if "all" in r.tools[tool].latency]
        wtl = f"{verdicts.count('win')}/{verdicts.count('tie')}/{verdicts.count('loss')}"
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        lines.append(
            f"| {tool} | {len(ok)} | {fmt(g_time, '.2f')} | {fmt(g_nodes, '.3f')} | "
            + " | ".join(fmt(v, ".3f") for v in g_lat)
            + f" | {wtl} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[ModelResult], tools: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in results if r.original_ms]
    levels = [lv for lv in LEVELS if any(lv in r.original_ms for r in measured)]  # those timed
    fig, axes = plt.subplots(
        len(levels), 1, figsize=(max(8, 1.1 * len(measured) + 2), 3.2 * len(levels)), sharex=True, squeeze=False
    )
    width = 0.8 / len(tools)
    x = np.arange(len(measured))
    for ax, level in zip(axes[:, 0], levels, strict=True):
        for k, tool in enumerate(tools):
            vals, lo, hi = [], [], []
            for r in measured:
                c = r.tools[tool].latency.get(level)
                vals.append(c["ratio"] if c else np.nan)
                lo.append(c["ratio"] - c["ci_low"] if c else 0)
                hi.append(c["ci_high"] - c["ratio"] if c else 0)
            ax.bar(x + (k - (len(tools) - 1) / 2) * width, vals, width, yerr=[lo, hi], capsize=2, label=tool)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("original / optimized")
        ax.set_title(LEVELS[level], fontsize=10)
    axes[-1, 0].set_xticks(x, [r.name for r in measured], rotation=30, ha="right")
    axes[0, 0].legend(ncol=len(tools), fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*", type=Path, help="extra ONNX files to add to the suite")
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="run on a real-model corpus (a directory with export.py's INDEX.json) instead of the suite",
    )
    parser.add_argument(
        "--only", action="append", default=[], help="keep suite models whose name contains this"
    )
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated tools (default: all four)")
    parser.add_argument(
        "--rounds", type=int, default=30, help="interleaved latency rounds (>= 30 for the issue)"
    )
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads per session")
    parser.add_argument(
        "--levels",
        default=",".join(LEVELS),
        help="onnxruntime optimization levels to time, comma-separated (default: disable,basic,all)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per tool per model")
    parser.add_argument(
        "--peers-python",
        default=None,
        help="run the peers (not onnxsat) with this Python, e.g. one with torch for ort-transformers",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "peers", help="writes OUT.md, OUT.json, OUT.png"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of an existing OUT.json that this run does not measure",
    )
    parser.add_argument("--child", nargs=4, metavar=("TOOL", "IN", "OUT", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not set(args.levels.split(",")) <= set(LEVELS):
        parser.error(f"--levels: choose from {', '.join(LEVELS)}")
    if args.child:
        return child_main(*args.child)

    tools = [t for t in args.tools.split(",") if t]
    missing = [t for t in tools if args.peers_python is None and not installed(t)]
    if missing:
        print(
            f"skipping tools that are not installed: {', '.join(missing)} (pip install -e '.[bench]')",
            file=sys.stderr,
        )
        tools = [t for t in tools if t not in missing]
    header = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": machine_description(),
        "versions": versions(tools),
        "settings": (
            f"{args.rounds} interleaved rounds, {args.threads} onnxruntime threads, levels {args.levels}, default"
            f" settings of every tool; every model in processes of its own, new ones every {RESPAWN_ROUNDS} rounds"
            f" loaded in a random order, intervals resampling those runs of {RESPAWN_ROUNDS} rounds"
        ),
    }
    previous: list[ModelResult] = []
    json_path = args.out.with_suffix(".json")
    if args.merge and json_path.exists():
        old = json.loads(json_path.read_text())
        previous = [ModelResult.from_dict(r) for r in old["results"]]
        old_tools = {t for r in previous for t in r.tools}
        if old_tools != set(tools):
            print(f"--merge: {json_path} has tools {sorted(old_tools)}, this run {tools}", file=sys.stderr)
            return 2
        header["settings"] += f"; rows merged with the run of {old['header']['date']} (see each row's date)"
        for row in previous:  # rows older than per-row stamps: from the run the old file merged with
            row.measured = row.measured or f"in the run of {_merged_from(old['header'])}"
    results: list[ModelResult] = []
    markdown = ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onnxsat-peers-") as tmp:
        workdir = Path(tmp)
        suite = (
            corpus_suite(args.corpus, args.only)
            if args.corpus is not None
            else [(name, path, None) for name, path in build_suite(workdir, args.models, args.only)]
        )
        for k, (name, path, feeds) in enumerate(suite, start=1):
            print(f"{name}:", file=sys.stderr, flush=True)
            results.append(benchmark_model(name, path, tools, workdir, args, feeds))
            # Written after every model, so an interrupted run still leaves its finished rows.
            rows = merge_results(previous, results)
            header["progress"] = f"{k} of {len(suite)} models of this run done, {len(rows)} rows"
            markdown = write_results(rows, tools, header, args.out)
    print(markdown)
    return 0


def _merged_from(header: dict[str, str]) -> str:
    """The run a results file's unstamped rows come from: the one it was merged with, else its own."""
    marker = "rows merged with the run of "
    settings = header.get("settings", "")
    return settings.split(marker, 1)[1].split(" (", 1)[0] if marker in settings else header["date"]


def write_results(results: list[ModelResult], tools: list[str], header: dict[str, str], out: Path) -> str:
    """OUT.md (table), OUT.json (every number) and OUT.png (latency ratios); returns the markdown."""
    markdown = render_markdown(results, tools, header)
    out.with_suffix(".md").write_text(markdown)
    payload = {"header": header, "results": [asdict(r) for r in results]}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    plot(results, tools, out.with_suffix(".png"), f"onnxsat vs peers, {header['date']}")
    return markdown


if __name__ == "__main__":
    sys.exit(main())
