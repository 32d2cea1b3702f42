"""The ONNX backend test suite through ``onnxsat.optimize``, in one process: every case ends as
optimized-and-matching, a refusal with a reason, or a failure (internal error or wrong result).

Cases: the node cases of ``onnx.backend.test.case.node.collect_testcases()`` (with their inputs and
expected outputs), the model folders shipped under ``onnx/backend/test/data`` (``model.onnx``
plus ``test_data_set_*``) and its ``light`` models (expected outputs of the inputs onnx's runner
generates). Each case is first run on onnxruntime as given: where onnxruntime cannot
run the original or disagrees with the expected outputs, the case is outside the denominator
("baseline"). Otherwise it is optimized with the case's inputs as verification samples
(``Options.verify_samples``) and the optimized model is run again and compared with the expected
outputs. Prints counts per folder and per refusal reason; ``--json`` writes every case.

    nice -n 10 python benchmarks/backend_suite.py [--sample N --seed S] [--json out.json]
    nice -n 19 python benchmarks/backend_suite.py --shard 1/4 --jsonl shard1.jsonl   # a quarter
    python benchmarks/backend_suite.py --merge shard*.jsonl                       # counts of all

``--shard K/N`` runs every N-th case of a seeded shuffle of all cases (so a shard, and any prefix
of it, covers every folder); ``--jsonl`` appends each outcome as it ends (an interrupted run keeps
what it finished, and a rerun with the same file skips the cases already there); ``--merge``
prints the counts of outcome files without running anything.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = ("pytorch-converted", "pytorch-operator", "simple", "real")
"""Folders of ``model.onnx`` plus ``test_data_set_*`` (``real`` holds only download links: no case
runs without the network); ``light`` is read by ``light_cases``."""


@dataclass
class Case:
    name: str
    folder: str
    model: onnx.ModelProto
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass
class Outcome:
    name: str
    folder: str
    status: str
    """optimized, refused, internal-error, wrong, checker, baseline."""
    reason: str = ""
    seconds: float = 0.0
    nodes: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)


def node_cases() -> Iterator[Case]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    for c in cases:
        data_sets = [([_value(v) for v in i], [_value(v) for v in o]) for i, o in c.data_sets]
        yield Case(c.name, "node", c.model, data_sets, c.rtol, c.atol)


def _value(value: Any) -> Any:
    """A case's input or output as onnxruntime takes it: a TensorProto (how cases give types
    numpy lacks a plain form for, casts to and from float16, bfloat16, float8) as its array."""
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _read_pb(path: Path) -> Any:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def folder_cases(folders: tuple[str, ...] = FOLDERS) -> Iterator[Case]:
    for folder in folders:
        for model_dir in sorted((DATA / folder).iterdir()) if (DATA / folder).is_dir() else []:
            model_path = model_dir / "model.onnx"
            if not model_path.is_file():
                continue
            data_sets = []
            for ds in sorted(model_dir.glob("test_data_set_*")):
                inputs = [_read_pb(p) for p in sorted(ds.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
                outputs = [_read_pb(p) for p in sorted(ds.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
                data_sets.append((inputs, outputs))
            yield Case(model_dir.name, folder, onnx.load(str(model_path)), data_sets)


def light_cases() -> Iterator[Case]:
    """The ``light`` models (``light_NAME.onnx`` plus expected outputs, no inputs): fed as onnx's
    backend runner feeds them (``Runner.generate_dummy_data``: arange / n, unknown dims as 1)."""
    from onnx.backend.test.runner import Runner

    for path in sorted((DATA / "light").glob("light_*.onnx")):
        model = onnx.load(str(path))
        inits = {t.name for t in model.graph.initializer}
        inputs = [Runner.generate_dummy_data(x, seed=0, random=False) for x in model.graph.input if x.name not in inits]
        outputs = [_read_pb(path.with_name(f"{path.stem}_output_{i}.pb")) for i in range(len(model.graph.output))]
        rtol = 2e-3 if "densenet" in path.stem else 1e-3
        yield Case("test_" + path.stem.removeprefix("light_"), "light", model, [(inputs, outputs)], rtol)


def all_cases() -> list[Case]:
    return [*node_cases(), *folder_cases(), *light_cases()]


def _true_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {t.name for t in model.graph.initializer} | {s.values.name for s in model.graph.sparse_initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def _feeds(model: onnx.ModelProto, inputs: list[Any]) -> dict[str, Any]:
    """Inputs by name; numpy scalars (``np.int64(10)``, as many node cases give a size) as 0-d
    arrays, which onnxruntime takes (it refuses the scalar objects themselves)."""
    names = _true_inputs(model)
    values = [v if isinstance(v, list | dict | np.ndarray) or v is None else np.asarray(v) for v in inputs]
    return dict(zip(names, values, strict=False))


def _run(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _matches(got: list[Any], expected: list[Any], rtol: float, atol: float) -> bool:
    if len(got) != len(expected):
        return False
    for g, e in zip(got, expected, strict=True):
        if isinstance(e, list) or isinstance(g, list):
            if not (isinstance(e, list) and isinstance(g, list)) or not _matches(g, e, rtol, atol):
                return False
            continue
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return False
        if e.dtype.kind in "fc":
            if not np.allclose(g.astype(np.float64), e.astype(np.float64), rtol=max(rtol, 1e-3), atol=max(atol, 1e-5), equal_nan=True):
                return False
        elif not np.array_equal(g, e):
            return False
    return True


_NUMBERS = re.compile(r"\b\d+(\.\d+)?\b")


def reason_of(message: str) -> str:
    """A refusal message reduced to its kind (names, numbers and details dropped)."""
    text = message.split(": error: ")[-1]
    if m := re.search(r"has type (\w+)", text):
        return f"unverifiable: input type {m.group(1)}"
    if "is a sequence_type" in text or "is a optional_type" in text or "is a map_type" in text:
        return "unverifiable: non-tensor input"
    if "cannot run the original model" in text:
        return "unverifiable: onnxruntime cannot run the original"
    if m := re.search(r"unsound rewrite rule\(s\) ([\w\-, ]+)", text):
        return f"unsound rule: {m.group(1).strip()}"
    if m := re.search(r"rules involved: ([\w\-, ]+)", text):
        return f"mismatch caught, rules: {m.group(1).strip()}"
    if "does not match" in text:
        return "mismatch caught"
    text = re.sub(r"'[^']*'", "'…'", text)
    return _NUMBERS.sub("N", text)[:90]


def run_case(case: Case, budget_seconds: float, iterations: int = 6, minimize_seconds: float = 120.0) -> Outcome:
    from onnxsat.base.errors import OnnxsatError
    from onnxsat.base.model_check import check_model_as_original
    from onnxsat.base.options import Budgets, Options
    from onnxsat.pipeline import optimize

    start = time.perf_counter()
    outcome = Outcome(case.name, case.folder, "baseline")
    if not case.data_sets:
        outcome.reason = "no test data"
        return outcome
    samples = [_feeds(case.model, inputs) for inputs, _ in case.data_sets]
    try:
        for feeds, (_, expected) in zip(samples, case.data_sets, strict=True):
            if not _matches(_run(case.model, feeds), expected, case.rtol, case.atol):
                outcome.reason = "onnxruntime disagrees with the expected outputs"
                return outcome
    except Exception as exc:
        outcome.reason = f"onnxruntime cannot run the original: {type(exc).__name__}"
        return outcome
    options = Options(
        budgets=Budgets(iterations=iterations, seconds=budget_seconds),
        verify_samples=tuple(samples),
        minimize_seconds=minimize_seconds,
    )
    try:
        optimized, _report = optimize(case.model, options)
    except OnnxsatError as exc:
        outcome.status, outcome.reason = "refused", reason_of(str(exc))
        outcome.extra["message"] = str(exc)[:300]
        return outcome
    except Exception as exc:
        outcome.status, outcome.reason = "internal-error", f"{type(exc).__name__}: {str(exc)[:200]}"
        return outcome
    finally:
        outcome.seconds = round(time.perf_counter() - start, 3)
    outcome.nodes = (len(case.model.graph.node), len(optimized.graph.node))
    try:
        check_model_as_original(optimized, case.model)
    except Exception as exc:
        outcome.status, outcome.reason = "checker", str(exc).splitlines()[0][:200]
        return outcome
    try:
        for feeds, (_, expected) in zip(samples, case.data_sets, strict=True):
            if not _matches(_run(optimized, feeds), expected, case.rtol, case.atol):
                outcome.status, outcome.reason = "wrong", "optimized model differs from the expected outputs"
                return outcome
    except Exception as exc:
        outcome.status, outcome.reason = "wrong", f"onnxruntime cannot run the optimized model: {str(exc)[:150]}"
        return outcome
    outcome.status = "optimized"
    return outcome


def sample_cases(cases: list[Case], count: int, seed: int) -> list[Case]:
    """A fixed, seeded choice of ``count`` cases (sorted by name, so the choice is stable)."""
    ordered = sorted(cases, key=lambda c: (c.folder, c.name))
    return sorted(random.Random(seed).sample(ordered, min(count, len(ordered))), key=lambda c: (c.folder, c.name))


def shard_cases(cases: list[Case], shard: int, shards: int, seed: int = 0) -> list[Case]:
    """Every ``shards``-th case of a seeded shuffle, starting at ``shard`` (1-based)."""
    ordered = sorted(cases, key=lambda c: (c.folder, c.name))
    random.Random(seed).shuffle(ordered)
    return ordered[shard - 1 :: shards]


def read_outcomes(paths: list[str]) -> list[Outcome]:
    """Outcomes from ``--jsonl`` files (the last line of a case wins)."""
    found: dict[tuple[str, str], Outcome] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                row["nodes"] = tuple(row.get("nodes", (0, 0)))
                found[(row["folder"], row["name"])] = Outcome(**row)
    return list(found.values())


def summarize(outcomes: list[Outcome]) -> str:
    lines = []
    folders = sorted({o.folder for o in outcomes})
    statuses = ["optimized", "refused", "internal-error", "wrong", "checker", "baseline"]
    lines.append(f"{'folder':<20}" + "".join(f"{s:>15}" for s in statuses) + f"{'optimized %':>13}")
    for folder in [*folders, "all"]:
        group = [o for o in outcomes if folder in ("all", o.folder)]
        counts = Counter(o.status for o in group)
        eligible = len(group) - counts["baseline"]
        share = f"{100 * counts['optimized'] / eligible:.1f}" if eligible else "-"
        lines.append(f"{folder:<20}" + "".join(f"{counts[s]:>15}" for s in statuses) + f"{share:>13}")
    for status in ("refused", "internal-error", "wrong", "checker", "baseline"):
        reasons = Counter(o.reason for o in outcomes if o.status == status)
        if reasons:
            lines.append(f"\n{status} by reason:")
            lines += [f"  {n:>5}  {r}" for r, n in reasons.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=None, help="run a seeded sample of N cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="regular expression on case names")
    parser.add_argument("--seconds", type=float, default=10.0, help="saturation budget per case")
    parser.add_argument("--json", default=None, help="write every outcome to this file")
    parser.add_argument("--shard", default=None, help="K/N: run the K-th of N interleaved shards")
    parser.add_argument("--jsonl", default=None, help="append each outcome to this file as it ends")
    parser.add_argument("--merge", nargs="+", default=None, help="summarize these --jsonl files")
    args = parser.parse_args(argv)
    if args.merge:
        merged = read_outcomes(args.merge)
        print(summarize(merged))
        print(f"\n{len(merged)} cases")
        return 0
    warnings.simplefilter("ignore")
    cases = all_cases()
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.name)]
    if args.sample:
        cases = sample_cases(cases, args.sample, args.seed)
    if args.shard:
        shard, shards = (int(part) for part in args.shard.split("/"))
        cases = shard_cases(cases, shard, shards, args.seed)
    done: set[tuple[str, str]] = set()
    if args.jsonl and Path(args.jsonl).is_file():
        done = {(o.folder, o.name) for o in read_outcomes([args.jsonl])}
        cases = [c for c in cases if (c.folder, c.name) not in done]
    outcomes = []
    start = time.perf_counter()
    for index, case in enumerate(cases):
        if args.jsonl:  # a provisional line, replaced by the outcome: a crash of the process shows
            with open(args.jsonl, "a") as handle:
                handle.write(
                    json.dumps(asdict(Outcome(case.name, case.folder, "internal-error", "the process died")))
                    + "\n"
                )
        outcome = run_case(case, args.seconds)
        outcomes.append(outcome)
        if args.jsonl:
            with open(args.jsonl, "a") as handle:
                handle.write(json.dumps(asdict(outcome)) + "\n")
        if outcome.status in ("internal-error", "wrong", "checker"):
            print(f"[{index + 1}/{len(cases)}] {case.folder}/{case.name}: {outcome.status}: {outcome.reason}", file=sys.stderr)
    print(summarize(outcomes))
    print(f"\n{len(cases)} cases in {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
