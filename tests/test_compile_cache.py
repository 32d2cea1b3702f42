"""Compile options, the compiled-artefact cache and parallel kernel compilation.

The artefact cache must never run code built for something else: a hit needs the same model,
signature and code-changing options; a damaged entry is removed with a warning and rebuilt. A
kernel compiled by a helper process must be the same object code as one compiled here.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.base.errors import BadInputError
from onnxsat.base.options import TARGET_NAMES, Options
from onnxsat.kernels import artefact_cache
from onnxsat.kernels.build import function_name
from onnxsat.kernels.codegen import build_module
from onnxsat.kernels.compile_options import COST_TARGETS, CompileOptions
from onnxsat.kernels.compile_pool import compile_objects, shares
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.kernels.jit import host_target
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep


def _mlp(seed: int = 0) -> onnx.ModelProto:
    """x @ W1 + b1 -> Relu -> Tanh -> Exp -> @ W2 -> Sigmoid * 2, and a Softmax: several distinct kernels."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("Tanh", ["h2"], ["h3"]),
        helper.make_node("Exp", ["h3"], ["m"]),
        helper.make_node("MatMul", ["m", "w2"], ["h4"]),
        helper.make_node("Sigmoid", ["h4"], ["h5"]),
        helper.make_node("Mul", ["h5", "two"], ["y"]),
        helper.make_node("Softmax", ["h4"], ["z"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8]),
        ],
        [w1, b1, w2, two],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


FEEDS = {"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}


def _outputs(cm: CompiledModel) -> dict[str, np.ndarray]:
    try:
        return cm(FEEDS)
    finally:
        cm.close()


def test_options_are_checked_and_keyed_by_what_changes_code() -> None:
    assert COST_TARGETS == TARGET_NAMES
    for bad in ({"gemm": "mkl"}, {"opt_level": 4}, {"threads": 0}, {"jobs": 0}, {"cost_target": "tpu"}):
        with pytest.raises(ValueError):
            CompileOptions(**bad)  # type: ignore[arg-type]
    base = CompileOptions()
    assert CompileOptions(threads=7, jobs=3, cache_dir="/elsewhere").code_key() == base.code_key()
    assert (
        len(
            {
                base.code_key(),
                CompileOptions(opt_level=0).code_key(),
                CompileOptions(gemm="blas").code_key(),
                CompileOptions(epilogues=False).code_key(),
            }
        )
        == 4
    )
    assert not CompileOptions(gemm="blas").gemm_epilogues and CompileOptions(cache=False).cache_path() is None


def test_cli_flags_map_to_compile_options() -> None:
    from onnxsat.compile_command import add_parser, compile_options

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "compile",
            "m.onnx",
            "--threads",
            "2",
            "--opt-level",
            "1",
            "--gemm",
            "blas",
            "--no-epilogues",
            "--jobs",
            "3",
            "--no-cache",
            "--cost-target",
            "onnxsat-cpu",
        ]
    )
    assert compile_options(args) == CompileOptions(
        threads=2, opt_level=1, gemm="blas", epilogues=False, cache=False, jobs=3, cost_target="onnxsat-cpu"
    )
    args = parser.parse_args(["compile", "m.onnx", "--jobs", "0"])
    with pytest.raises(BadInputError):
        compile_options(args)


def test_cost_target_reaches_the_optimizer_and_a_conflict_is_an_error() -> None:
    from onnxsat.compiler import optimize_options

    assert optimize_options(None, CompileOptions(cost_target="onnxsat-cpu")).target == "onnxsat-cpu"
    assert optimize_options(None, CompileOptions()).target == "onnxsat-cpu"  # the kernels' own by default
    assert optimize_options(None, CompileOptions(cost_target="ort-cpu")).target == "ort-cpu"
    assert optimize_options(Options(target="h200"), CompileOptions()).target == "h200"
    assert optimize_options(Options(), CompileOptions()).upgrade_opset is None  # no opset-23 Attention
    with pytest.raises(BadInputError):
        optimize_options(Options(target="h200"), CompileOptions(cost_target="onnxsat-cpu"))


def test_artefact_cache_miss_then_hit_gives_the_same_outputs(tmp_path: Path) -> None:
    options = CompileOptions(threads=1, cache_dir=str(tmp_path), jobs=1)
    cold = CompiledModel(_mlp(), options)
    stats = cold.stats()
    assert not stats.artefact_hit and stats.one_native_call and stats.kernels >= 2
    assert {"lower", "llvm_ir", "llvm_compile", "load", "setup"} <= set(stats.stage_seconds)
    expected = _outputs(cold)
    warm = CompiledModel(_mlp(), options)
    assert warm.stats().artefact_hit and "llvm_ir" not in warm.stats().stage_seconds
    for name, value in _outputs(warm).items():
        np.testing.assert_array_equal(value, expected[name])
    # other weights, another opt level: other keys, no hit
    assert not CompiledModel(_mlp(seed=5), options).stats().artefact_hit
    assert (
        not CompiledModel(_mlp(), CompileOptions(threads=1, cache_dir=str(tmp_path), opt_level=1))
        .stats()
        .artefact_hit
    )
    assert len(list(tmp_path.glob("*.artefact"))) == 3


def test_damaged_artefact_is_removed_with_a_warning_and_rebuilt(tmp_path: Path) -> None:
    options = CompileOptions(threads=1, cache_dir=str(tmp_path), jobs=1)
    expected = _outputs(CompiledModel(_mlp(), options))
    (entry,) = tmp_path.glob("*.artefact")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # one flipped byte in the object code
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="failed its checksum"):
        rebuilt = CompiledModel(_mlp(), options)
    assert not rebuilt.stats().artefact_hit
    for name, value in _outputs(rebuilt).items():
        np.testing.assert_array_equal(value, expected[name])
    assert CompiledModel(_mlp(), options).stats().artefact_hit  # written again


def test_artefact_with_other_kernels_is_not_used(tmp_path: Path) -> None:
    """A manifest whose kernels are not the program's (a stale entry) is a miss, not a crash."""
    options = CompileOptions(threads=1, cache_dir=str(tmp_path), jobs=1)
    cm = CompiledModel(_mlp(), options)
    key = cm.artefact_key({"x": (4, 16)}, {})
    found = artefact_cache.load(tmp_path, key)
    assert found is not None
    artefact_cache.store(tmp_path, key, artefact_cache.Artefact({"other": "k_0"}, found.objects))
    assert not CompiledModel(_mlp(), options).stats().artefact_hit


def test_parallel_compile_equals_serial() -> None:
    program = lower(_mlp(), {"x": (4, 16)})
    kernels = [s.kernel for s in program.steps if isinstance(s, KernelStep)]
    texts = [str(build_module([k], name=fn)) for fn, k in dict(function_name(k) for k in kernels).items()]
    assert len(texts) >= 2
    host = host_target()
    serial = compile_objects(texts, host, 3, jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a helper that failed (and was replaced by a compile here) warns
        parallel = compile_objects(texts, host, 3, jobs=2)  # one share here, one in a helper process
    assert parallel == serial
    one = _outputs(CompiledModel(_mlp(), CompileOptions(threads=1, cache=False, jobs=1)))
    two = _outputs(CompiledModel(_mlp(), CompileOptions(threads=1, cache=False, jobs=2)))
    for name, value in one.items():
        np.testing.assert_array_equal(two[name], value)


def test_shares_balance_sizes() -> None:
    groups = shares([10, 1, 1, 8, 2], 2)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    totals = sorted(sum([10, 1, 1, 8, 2][i] for i in g) for g in groups)
    assert totals == [11, 11]
    assert shares([5], 4) == [[0]]


def test_model_digest_sees_every_weight_value_in_any_field(tmp_path: Path) -> None:
    def model(tensor: onnx.TensorProto) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Relu", ["w"], ["y"])],
            "g",
            [],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
            [tensor],
        )
        return helper.make_model(graph)

    values = ([1.0, 2.0, 3.0], [1.0, 2.0, 3.5])
    listed = [
        artefact_cache.model_digest(model(helper.make_tensor("w", TensorProto.FLOAT, [3], v))) for v in values
    ]
    raw = [
        artefact_cache.model_digest(model(numpy_helper.from_array(np.array(v, np.float32), "w")))
        for v in values
    ]
    assert listed[0] != listed[1] and listed == raw  # the values count, not the field holding them
    big = _mlp()
    before = artefact_cache.model_digest(big)
    onnx.save(big, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    assert artefact_cache.model_digest(onnx.load(str(tmp_path / "m.onnx"))) == before


def test_helpers_that_cannot_start_cost_a_warning_not_the_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxsat.kernels import compile_pool

    def refuse() -> None:
        raise OSError("no processes left")

    program = lower(_mlp(), {"x": (4, 16)})
    kernels = [s.kernel for s in program.steps if isinstance(s, KernelStep)]
    texts = [str(build_module([k], name=fn)) for fn, k in dict(function_name(k) for k in kernels).items()]
    host = host_target()
    compile_pool.shutdown()  # no parked helper from an earlier test
    monkeypatch.setattr(compile_pool, "_start_helper", refuse)
    with pytest.warns(UserWarning, match="could not start"):
        objects = compile_objects(texts, host, 3, jobs=3)
    assert objects == compile_objects(texts, host, 3, jobs=1)
