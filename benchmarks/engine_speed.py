"""Engine speed: wall time and peak memory of ``onnxsat optimize`` on real models, beside the peers.

For every model of the real-model corpus (``benchmarks/realmodels``: the full exports in a corpus
directory with its ``INDEX.json``, or with ``--quick`` the small committed ones in
``tests/data/realmodels``) each tool runs in a fresh process, one after the other on the same
model (so load drift hits them alike):

- ``onnxsat optimize IN -o OUT --json`` as a user runs it (verification on). Its wall time is the
  whole process, imports included; the report's stage times give the verification part
  (``reference``, ``samples`` and ``verify``), so "without verification" is the wall time less
  those stages.
- onnxslim and onnx-simplifier through ``compare_peers.py``'s child (``--child TOOL IN OUT
  RESULT``), in ``--peers-python`` (their environment): the child reports the optimize call's own
  seconds; the process's wall time includes importing the tool and loading the model.

Peak RSS of each child comes from ``os.wait4`` (the kernel's ``ru_maxrss`` of that process alone),
CPU seconds (user + system) likewise; CPU is less sensitive to other load than wall time.

The decoder scaling curve (``--decoders DIR``): a Llama-style decoder (hidden 256, 4 heads,
sequence 128, TorchScript export) at each of ``--layers``, exported once into DIR by this script
run with ``--export-decoders`` in the export environment (torch, transformers). Each size is
optimized without verification with the default options, whole-graph (``--region-nodes 0``) and
with ``--region-nodes``, and gives nodes before and after, wall and CPU time, and peak RSS.

Beside each corpus model, onnxruntime's session from the file and one run of the original (the
verification floor's yardstick), and the engine issue's per-model floors; ``--fixed-rounds N``
also measures the fixed-cost floor (``small_cnn``, ``rules list``, bare imports) over N
interleaved rounds of fresh processes.

Every row records the 1-minute load average before it; on a loaded machine only ratios measured
in the same run mean anything.

    /work/venv-export/bin/python benchmarks/engine_speed.py --export-decoders /tmp/decoders
    python benchmarks/engine_speed.py --quick
    python benchmarks/engine_speed.py --corpus /work/realmodels-full --decoders /tmp/decoders --fixed-rounds 30 \\
        --peers-python /work/venv-export/bin/python --markdown benchmarks/results/engine_speed.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICK_CORPUS = ROOT / "tests" / "data" / "realmodels"
PEERS = ("onnxslim", "onnxsim")
VERIFY_STAGES = ("reference", "samples", "verify")
"""Report stages that are the numeric check (onnxsat.pipeline): the original's run, the inputs, the comparison."""
DECODER_LAYERS = (1, 2, 4, 8, 16, 32, 64)
DECODER_CONFIG = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 688,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
}
"""The scaling curve's decoder (LlamaConfig); the layer count varies. A small vocabulary keeps the
embedding and head small, so the weights grow with the layers only."""


# ---------------------------------------------------------------------------------------------
# one child process


@dataclass
class Run:
    """One tool on one model in a fresh process."""

    status: str
    wall: float
    cpu: float
    rss_mb: float
    nodes: int | None = None
    seconds: float | None = None
    """The tool's own figure: a peer's optimize call; onnxsat's time without verification."""
    verify: float | None = None
    """onnxsat: the verification stages of the report (the time verification added to the run)."""
    beside: float | None = None
    """onnxsat: the original's reference run on a thread beside the rewrite (its own wall time,
    overlapping the stages; the part the run waited for is in ``verify``)."""
    stages: dict[str, float] = field(default_factory=dict)


def run_child(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, Run]:
    """Run ``cmd``; (exit status, stdout, a Run with wall, CPU and peak RSS of that process)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                status = -9
                break
            time.sleep(0.02)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status) if status != -9 else -9
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        tail = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
    run = Run(
        "ok" if proc.returncode == 0 else ("timeout" if status == -9 else f"exit {proc.returncode}: {tail[:100]}"),
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,  # KiB on Linux
    )
    return proc.returncode, stdout, run


def node_count(path: Path) -> int | None:
    """Nodes of the model at ``path``, counted in a child process: a child forked from this one
    starts with its resident size (Linux keeps it in ``ru_maxrss`` across exec), so this process
    never holds a model, or every later child's peak RSS would read as at least its size."""
    code = "import onnx, sys; print(len(onnx.load(sys.argv[1], load_external_data=False).graph.node))"
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
    return int(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def run_onnxsat(src: Path, work: Path, timeout: float, extra: list[str]) -> Run:
    """``onnxsat optimize`` as a user runs it; the time without verification from its report."""
    dst = work / f"{src.stem}.onnxsat.onnx"
    cmd = [sys.executable, "-m", "onnxsat", "optimize", str(src), "-o", str(dst), "--json", *extra]
    code, stdout, run = run_child(cmd, timeout)
    if code not in (0, 4):  # 4: written unverified (--allow-unverified); anything else failed
        return run
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        run.status = "no report"
        return run
    run.status = "ok" if code == 0 else "unverified"
    run.stages = dict(report.get("stage_seconds", {}))
    run.verify = round(sum(run.stages.get(s, 0.0) for s in VERIFY_STAGES), 3)
    run.beside = report.get("background_seconds", {}).get("reference")
    run.seconds = round(run.wall - run.verify, 3)
    run.nodes = node_count(dst)
    dst.unlink(missing_ok=True)
    Path(f"{dst}.data").unlink(missing_ok=True)
    return run


def run_peer(tool: str, src: Path, work: Path, timeout: float, python: str) -> Run:
    """A peer through compare_peers.py's child (the same call compare_peers measures)."""
    dst, result = work / f"{src.stem}.{tool}.onnx", work / f"{src.stem}.{tool}.json"
    result.unlink(missing_ok=True)
    cmd = [python, str(ROOT / "benchmarks" / "compare_peers.py"), "--child", tool, str(src), str(dst), str(result)]
    _, _, run = run_child(cmd, timeout)
    if result.exists():
        data = json.loads(result.read_text())
        run.status = data["status"] if data["status"] != "ok" else run.status
        run.seconds = data.get("seconds")
    elif run.status == "ok":
        run.status = "no result"
    if run.status == "ok":
        run.nodes = node_count(dst)
    dst.unlink(missing_ok=True)
    return run


ORT_ONCE = """
import json, sys, time
import onnx, onnxruntime as ort
from onnxsat.verification_inputs import dim_assignments, make_inputs
model = onnx.load(sys.argv[1])
start = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
created = time.perf_counter() - start
names = {i.name for i in session.get_inputs()}
for dims in dim_assignments(model, None):
    feeds = {k: v for k, v in make_inputs(model, 0, dims).items() if k in names}
    start = time.perf_counter()
    try:
        session.run(None, feeds)
    except Exception:
        continue
    print(json.dumps({"seconds": created + time.perf_counter() - start}))
    break
"""
"""onnxruntime on the original, as a user runs it: a session from the file (default level) and one run
on seed 0's verification inputs (the first symbol sizes it accepts, as verification tries them);
what the verification floor is measured against."""


def run_ort_once(src: Path, timeout: float) -> Run:
    code, stdout, run = run_child([sys.executable, "-c", ORT_ONCE, str(src)], timeout)
    if code == 0 and stdout.strip():
        run.seconds = round(json.loads(stdout)["seconds"], 3)
    return run


def run_fixed(rounds: int) -> dict[str, Any]:
    """The fixed-cost floor: ``optimize examples/small_cnn.onnx`` (verification on), ``rules list``
    and importing onnx, onnxruntime and egglog alone, each in a fresh process, ``rounds`` times
    interleaved (after one warm-up of each, which fills the rule cache); medians of wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "small_cnn.opt.onnx"
        commands = {
            "small_cnn": [sys.executable, "-m", "onnxsat", "optimize", str(ROOT / "examples" / "small_cnn.onnx"), "-o", str(out), "--quiet"],
            "rules_list": [sys.executable, "-m", "onnxsat", "rules", "list"],
            "imports": [sys.executable, "-c", "import onnx, onnxruntime, egglog"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(rounds + 1):
            for name, cmd in commands.items():
                code, _, run = run_child(cmd, 120)
                if code != 0:
                    raise SystemExit(f"{name}: {run.status}")
                if round_:
                    times[name].append(run.wall)
    medians = {name: round(sorted(t)[len(t) // 2], 3) for name, t in times.items()}
    return {"rounds": rounds, "load": _load(), **medians}


def peers_available(python: str) -> list[str]:
    found = []
    for tool in PEERS:
        if subprocess.run([python, "-c", f"import {tool}"], capture_output=True).returncode == 0:
            found.append(tool)
    return found


# ---------------------------------------------------------------------------------------------
# the corpus and the decoder curve


def corpus(directory: Path, only: list[str]) -> list[tuple[str, Path, dict[str, Any]]]:
    """(name, file, index record) of the exported models of ``directory``, smallest file first."""
    index = json.loads((directory / "INDEX.json").read_text())
    rows = [
        (name, directory / record["file"], record)
        for name, record in index.items()
        if "error" not in record and (not only or any(o in name for o in only))
    ]
    return sorted((r for r in rows if r[1].exists()), key=lambda r: r[1].stat().st_size)


def weight_mb(path: Path) -> float:
    """The model's size on disk (its weights, almost all of it), with a sidecar data file."""
    data = Path(f"{path}.data")
    return (path.stat().st_size + (data.stat().st_size if data.exists() else 0)) / 2**20


def decoder_name(layers: int) -> str:
    return f"llama_h256-L{layers}-ts-static"


def export_decoders(out: Path, layers: list[int]) -> int:
    """The scaling curve's decoders, with benchmarks/realmodels/export.py (needs torch and
    transformers: run in the export environment)."""
    # benchmarks/ (this script's folder, first on sys.path) holds a kernels.py that would shadow the
    # hub `kernels` package transformers imports
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    sys.path.insert(0, str(ROOT / "benchmarks" / "realmodels"))
    import export  # type: ignore[import-not-found]

    manifest = export.load_manifest()
    base = dict(manifest["architectures"]["llama"])
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "INDEX.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for n in layers:
        name = decoder_name(n)
        if name in index and (out / index[name]["file"]).exists():
            continue
        arch = {**base, "config": {"full": {**DECODER_CONFIG, "num_hidden_layers": n}}}
        manifest["architectures"]["llama_h256"] = arch
        entry = {
            "name": name,
            "architecture": "llama_h256",
            "exporter": "torchscript",
            "shapes": "static",
            "step": "forward",
            "transform": None,
            "sizes": ["full"],
            "seed": 0,
        }
        record = export.export_one(entry, manifest, "full", out)
        record["layers"] = n
        index[name] = record
        index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
    return 0


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def measure_corpus(
    models: list[tuple[str, Path, dict[str, Any]]], peers: list[str], python: str, timeout: float, work: Path
) -> list[dict[str, Any]]:
    rows = []
    for name, path, record in models:
        row: dict[str, Any] = {"model": name, "nodes": record.get("nodes"), "mb": round(weight_mb(path), 1)}
        row["load"] = _load()
        row["onnxsat"] = asdict(run_onnxsat(path, work, timeout, []))
        row["ort_once"] = asdict(run_ort_once(path, timeout))
        for tool in peers:
            row[tool] = asdict(run_peer(tool, path, work, timeout, python))
        row["load_after"] = _load()
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def measure_decoders(directory: Path, layers: list[int], region_nodes: int, timeout: float, work: Path) -> list[dict]:
    index = json.loads((directory / "INDEX.json").read_text())
    rows = []
    for n in layers:
        record = index.get(decoder_name(n))
        if record is None:
            continue
        path = directory / record["file"]
        row: dict[str, Any] = {"layers": n, "nodes": record["nodes"], "mb": round(weight_mb(path), 1), "load": _load()}
        row["default"] = asdict(run_onnxsat(path, work, timeout, ["--no-verify"]))
        row["whole"] = asdict(run_onnxsat(path, work, timeout, ["--no-verify", "--region-nodes", "0"]))
        row["regions"] = asdict(run_onnxsat(path, work, timeout, ["--no-verify", "--region-nodes", str(region_nodes)]))
        row["load_after"] = _load()
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# the results file


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cell(run: dict[str, Any], key: str = "seconds") -> str:
    return _s(run.get(key)) if run["status"] in ("ok", "unverified") else run["status"][:40]


def _floors(row: dict[str, Any]) -> dict[str, bool | None]:
    """The engine issue's per-model floors on one corpus row (None: not measurable): onnxsat without
    verification <= max(3x onnxslim, onnxslim + 2 s), both whole processes (a user waits for the
    command); verification <= 3x onnxruntime's session and one run of the original; peak RSS <=
    the model's bytes + 1 GiB."""
    o, slim, ort_once = row["onnxsat"], row.get("onnxslim"), row.get("ort_once")
    ok = o["status"] in ("ok", "unverified")
    speed = None
    if ok and slim is not None and slim["status"] == "ok" and o.get("seconds") is not None:
        speed = o["seconds"] <= max(3 * slim["wall"], slim["wall"] + 2)
    verify = None
    if ok and ort_once is not None and ort_once.get("seconds") and o.get("verify") is not None:
        verify = o["verify"] <= 3 * ort_once["seconds"]
    return {"speed": speed, "verify": verify, "rss": (o["rss_mb"] <= row["mb"] + 1024) if ok else None}


def _mark(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "**no**")


def render(
    corpus_rows: list[dict], decoder_rows: list[dict], peers: list[str], header: dict[str, str], fixed: dict | None = None
) -> str:
    lines = ["# Engine speed: onnxsat optimize on real models, beside the peers", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    if fixed:
        lines += [
            "",
            f"## Fixed cost (fresh processes, median of {fixed['rounds']} interleaved rounds, load {fixed['load']})",
            "",
            f"- `onnxsat optimize examples/small_cnn.onnx` (verification on): {fixed['small_cnn']:.2f} s"
            f" (floor 2.5 s); above importing onnx, onnxruntime and egglog alone ({fixed['imports']:.2f} s):"
            f" {fixed['small_cnn'] - fixed['imports']:.2f} s (floor 1.5 s)",
            f"- `onnxsat rules list`: {fixed['rules_list']:.2f} s (floor 1.5 s)",
        ]
    if corpus_rows:
        lines += [
            "",
            "## Corpus: one fresh process per tool and model",
            "",
            "onnxsat: whole process (imports, verification included) / without verification (wall less the"
            " report's verification stages) / verification (what it added to the run) / the original's"
            " reference run on a thread beside the rewrite (its own time, hidden behind the stages but"
            " for what verification waited) / nodes / peak RSS / CPU. Peers: their optimize"
            " call (process wall) / nodes / peak RSS. ORT once: onnxruntime's session from the file and one run"
            " of the original. Floors: no-verify time <= max(3x, +2 s) onnxslim's process; verification <= 3x"
            " ORT once; RSS <= file MB + 1024.",
            "",
        ]
        head = "| model | nodes | MB | load | onnxsat wall | no verify | verify | reference beside | nodes | RSS MB | CPU s |"
        rule = "|---|---|---|---|---|---|---|---|---|---|---|"
        for tool in peers:
            head += f" {tool} s (wall) | nodes | RSS MB |"
            rule += "---|---|---|"
        lines += [head + " ORT once s | time floor | verify floor | RSS floor |", rule + "---|---|---|---|"]
        met = {"speed": [0, 0], "verify": [0, 0], "rss": [0, 0]}
        for row in corpus_rows:
            o = row["onnxsat"]
            cells = [
                row["model"],
                str(row["nodes"]),
                str(row["mb"]),
                f"{row['load']:.1f}",
                _cell(o, "wall") if o["status"] in ("ok", "unverified") else o["status"][:40],
                _cell(o),
                _s(o.get("verify")),
                _s(o.get("beside")),
                str(o.get("nodes") or "-"),
                f"{o['rss_mb']:.0f}",
                f"{o['cpu']:.1f}",
            ]
            for tool in peers:
                p = row[tool]
                ok = p["status"] == "ok"
                cells += [
                    f"{_cell(p)} ({p['wall']:.1f})" if ok else p["status"][:40],
                    str(p.get("nodes") or "-"),
                    f"{p['rss_mb']:.0f}",
                ]
            cells.append(_s((row.get("ort_once") or {}).get("seconds")))
            floors = _floors(row)
            for key, flag in floors.items():
                if flag is not None:
                    met[key][0] += int(flag)
                    met[key][1] += 1
            cells += [_mark(floors["speed"]), _mark(floors["verify"]), _mark(floors["rss"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Floors met: " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in met.items())]
    if decoder_rows:
        modes = [m for m in ("default", "whole", "regions") if m in decoder_rows[0]]
        lines += [
            "",
            "## Decoder scaling (hidden 256, 4 heads, sequence 128; no verification)",
            "",
            "default: the default options (graphs above `--region-nodes` 3,000 by regions); whole:"
            " `--region-nodes 0`; regions: the run's `--region-nodes`.",
            "",
            "| layers | nodes | MB | load |" + "".join(f" {m}: wall s | nodes after | RSS MB | CPU s |" for m in modes),
            "|---|---|---|---|" + "---|---|---|---|" * len(modes),
        ]
        for row in decoder_rows:
            cells = [str(row["layers"]), str(row["nodes"]), str(row["mb"]), f"{row['load']:.1f}"]
            for key in modes:
                r = row[key]
                cells += [_cell(r, "wall"), str(r.get("nodes") or "-"), f"{r['rss_mb']:.0f}", f"{r['cpu']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
        eight = next((r for r in decoder_rows if r["layers"] == 8), None)
        last = decoder_rows[-1]
        if eight is not None and last["layers"] > 8:
            lines.append("")
            for key in modes:
                a, b = eight[key], last[key]
                if a["status"] == "ok" and b["status"] == "ok":
                    lines.append(
                        f"- {key}: {last['layers']} layers / 8 layers = {b['wall'] / a['wall']:.2f}x wall"
                        f" ({b['cpu'] / a['cpu']:.2f}x CPU)"
                    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"the small committed exports ({QUICK_CORPUS})")
    parser.add_argument("--corpus", type=Path, help="a corpus directory with INDEX.json (full exports)")
    parser.add_argument("--only", action="append", default=[], help="models whose name contains this (repeatable)")
    parser.add_argument("--no-corpus", action="store_true", help="only the decoder curve")
    parser.add_argument("--decoders", type=Path, help="the decoder curve's exports (see --export-decoders)")
    parser.add_argument("--layers", default=",".join(map(str, DECODER_LAYERS)))
    parser.add_argument("--region-nodes", type=int, default=400, help="--region-nodes of the curve's region runs")
    parser.add_argument("--export-decoders", type=Path, metavar="DIR", help="export the curve's decoders into DIR")
    parser.add_argument("--peers-python", default=sys.executable, help="the Python that has onnxslim and onnxsim")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per tool per model")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    parser.add_argument("--markdown", type=Path, help="write the results as markdown")
    parser.add_argument("--fixed-rounds", type=int, default=0, help="also measure the fixed-cost floor over N rounds")
    parser.add_argument(
        "--render", type=Path, nargs="+", metavar="JSON", help="measure nothing: render earlier --json files as one table"
    )
    args = parser.parse_args(argv)
    if args.render:
        parts = [json.loads(path.read_text()) for path in args.render]
        header = {f"{k} ({i + 1})": v for i, part in enumerate(parts) for k, v in part["header"].items()}
        peers = [t for t in PEERS if any(t in row for part in parts for row in part["corpus"])]
        fixed = next((part["fixed"] for part in parts if part.get("fixed")), None)
        text = render(
            [r for part in parts for r in part["corpus"]], [r for part in parts for r in part["decoders"]], peers, header, fixed
        )
        if args.markdown:
            args.markdown.write_text(text)
        print(text)
        return 0
    layers = [int(x) for x in args.layers.split(",")]
    if args.export_decoders:
        return export_decoders(args.export_decoders, layers)
    directory = QUICK_CORPUS if args.quick or args.corpus is None else args.corpus
    peers = peers_available(args.peers_python)
    header = {
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "corpus": "none" if args.no_corpus else str(directory),
        "peers": f"{', '.join(peers) or 'none'} ({args.peers_python})",
        "load average at start (1 min)": str(_load()),
        "cores": str(os.cpu_count()),
    }
    fixed = run_fixed(args.fixed_rounds) if args.fixed_rounds else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = [] if args.no_corpus else corpus(directory, args.only)
        corpus_rows = measure_corpus(models, peers, args.peers_python, args.timeout, work)
        decoder_rows = (
            measure_decoders(args.decoders, layers, args.region_nodes, args.timeout, work) if args.decoders else []
        )
    header["load average at end (1 min)"] = str(_load())
    text = render(corpus_rows, decoder_rows, peers, header, fixed)
    if args.json:
        payload = {"header": header, "fixed": fixed, "corpus": corpus_rows, "decoders": decoder_rows}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
