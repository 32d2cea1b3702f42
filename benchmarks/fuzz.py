"""Differential fuzzing of ``onnxsat.optimize``, thousands of examples at a time.

The generator and the property are those of ``tests/test_fuzz.py`` (``tests/fuzzing``): random
valid models over the modelled ops, optimized with the full rule library and one extractor
(rotating over every extractor), compared with the original on onnxruntime. Every failing model
is saved to ``--out`` and printed; then (unless ``--no-shrink``) hypothesis reproduces the first
example of each kind of failure and minimizes it, and the minimized model is saved and printed.

    python benchmarks/fuzz.py                          # 1000 examples, random seed (printed)
    python benchmarks/fuzz.py --examples 3000 --seed 7 --out /tmp/fuzz
    python benchmarks/fuzz.py --only MotifConv Conv --extractor ilp

The summary gives examples, discards (models onnxruntime or the checker refuse: generator
mistakes), failures by kind, seconds per example, and how many examples each rule fired in
(rules that never fired are listed: the generator does not reach them). Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import onnx
from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxsat.rules.schedule import select_rules  # noqa: E402
from tests.fuzzing.builder import FuzzCase  # noqa: E402
from tests.fuzzing.check import EXTRACTORS, check_case, validate  # noqa: E402
from tests.fuzzing.strategy import GENERATORS, fuzz_models  # noqa: E402


def signature(problem: str) -> str:
    """A failure's kind: its text without tensor names and numbers."""
    text = re.sub(r"\b(t|c|in)\d+\b", "T", problem)
    return re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:160]


class Fuzzer:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.strategy = fuzz_models(max_ops=args.max_ops, only=args.only)
        self.examples = self.valid = 0
        self.discards: Counter[str] = Counter()
        self.failures: dict[str, tuple[int, str, list[str]]] = {}
        """signature -> (first example index, extractor, its problems)."""
        self.failing = 0
        self.fired: Counter[str] = Counter()
        self.seconds = 0.0

    def extractor(self, index: int) -> str:
        return self.args.extractor[index % len(self.args.extractor)]

    def settings(self, phases: list[Phase]) -> settings:
        return settings(
            max_examples=self.args.examples,
            deadline=None,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        )

    def run(self) -> None:
        @seed(self.args.seed)
        @self.settings([Phase.generate])
        @given(self.strategy)
        def body(case: FuzzCase) -> None:
            self.examples += 1
            reason = validate(case)
            if reason is not None:
                self.discards[signature(reason)] += 1
                return
            self.valid += 1
            start = time.perf_counter()
            extractor = self.extractor(self.examples)
            problems, report = check_case(case, extractor, warm=not self.args.fresh)
            self.seconds += time.perf_counter() - start
            if report is not None and report.saturation is not None:
                self.fired.update(
                    {r for it in report.saturation.iterations for r, n in it.matches.items() if n}
                )
            if problems:
                self.record(case, extractor, problems)
            if self.examples % 100 == 0:
                print(
                    f"[{self.examples} examples, {self.failing} failing, "
                    f"{self.seconds / max(self.valid, 1):.2f} s per example]",
                    flush=True,
                )

        body()

    def record(self, case: FuzzCase, extractor: str, problems: list[str]) -> None:
        self.failing += 1
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"fail-{self.failing:04d}.onnx"
        onnx.save(case.model, path)
        print(f"FAIL {path} [{extractor}]:\n  " + "\n  ".join(problems), flush=True)
        for problem in problems:
            self.failures.setdefault(signature(problem), (self.examples, extractor, problems))

    def shrink(self, sig: str) -> FuzzCase | None:
        """Replay the run (same seed, same examples) up to the first example failing with ``sig``,
        and let hypothesis minimize it; earlier examples are skipped without optimizing."""
        first, extractor, _ = self.failures[sig]
        count, found = [0], []

        @seed(self.args.seed)
        @self.settings([Phase.generate, Phase.shrink])
        @given(self.strategy)
        def body(case: FuzzCase) -> None:
            count[0] += 1
            if count[0] < first or validate(case) is not None:
                return
            problems, _ = check_case(case, extractor, warm=not self.args.fresh)
            if any(signature(p) == sig for p in problems):
                found.append(case)
                raise AssertionError(sig)

        try:
            body()
        except AssertionError:
            return found[-1] if found else None
        return None

    def summary(self) -> int:
        print(f"\n## fuzz summary (seed {self.args.seed})")
        print(f"examples: {self.examples}; discarded by validation: {sum(self.discards.values())}")
        for reason, n in self.discards.most_common():
            print(f"  {n:5d}  {reason}")
        print(
            f"optimized and compared: {self.valid} ({', '.join(self.args.extractor)} in turn), "
            f"{self.seconds / max(self.valid, 1):.2f} s per example"
        )
        print(f"failing examples: {self.failing}; kinds of failure: {len(self.failures)}")
        for sig, (first, extractor, _) in self.failures.items():
            print(f"  first at example {first} [{extractor}]: {sig}")
        rules = select_rules()
        print(f"rules that fired (examples): {len([r for r in rules if self.fired[r]])} of {len(rules)}")
        print(
            "  "
            + ", ".join(
                f"{r} {self.fired[r]}" for r in sorted(rules, key=lambda r: -self.fired[r]) if self.fired[r]
            )
        )
        print("  never: " + (", ".join(r for r in rules if not self.fired[r]) or "-"))
        return 1 if self.failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=1000, help="models to generate (default 1000)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    parser.add_argument("--max-ops", type=int, default=8, help="most generator calls per model (default 8)")
    parser.add_argument(
        "--only", nargs="+", choices=list(GENERATORS), help="only these generators (default all)"
    )
    parser.add_argument(
        "--extractor",
        nargs="+",
        default=list(EXTRACTORS),
        choices=EXTRACTORS,
        help="extractors, used in turn (default all)",
    )
    parser.add_argument(
        "--out", default="fuzz-failures", help="folder for failing models (default ./fuzz-failures)"
    )
    parser.add_argument("--fresh", action="store_true", help="a fresh e-graph per optimize call (slower)")
    parser.add_argument("--no-shrink", dest="shrink", action="store_false", help="do not minimize failures")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**32)
    print(f"seed {args.seed}", flush=True)

    fuzzer = Fuzzer(args)
    start = time.perf_counter()
    try:
        fuzzer.run()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(f"\nwall time: {time.perf_counter() - start:.0f} s")
    if args.shrink and fuzzer.failures:
        print("\n## minimized failures")
        for k, sig in enumerate(fuzzer.failures, 1):
            case = fuzzer.shrink(sig)
            if case is None:
                print(f"- {sig}: not reproduced")
                continue
            path = Path(args.out) / f"min-{k:02d}.onnx"
            onnx.save(case.model, path)
            print(f"- {sig}\n  saved {path}:\n{onnx.printer.to_text(case.model)}", flush=True)
    return fuzzer.summary()


if __name__ == "__main__":
    sys.exit(main())
