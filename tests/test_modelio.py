"""load_model rejects every broken input with a one-line BadInputError; saving is atomic."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.base import modelio
from onnxsat.base.errors import BadInputError, OnnxsatError
from onnxsat.base.modelio import (
    check_output_path,
    load_model,
    order_like,
    save_model_atomic,
    topological_nodes,
)

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(LIGHT_DIR.glob("*.onnx"))
OPSET = [helper.make_opsetid("", 17)]


def _vi(name: str, shape: list[int | str], elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=(), opsets=OPSET, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    return helper.make_model(graph, opset_imports=list(opsets), ir_version=ir_version)


def _mlp(seed: int = 0, hidden: int = 64) -> onnx.ModelProto:
    """x[2,16] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> y[2,8]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, hidden)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((hidden, 8)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "W2"], ["y"], name="mm2"),
    ]
    return _model(nodes, [_vi("x", [2, 16])], [_vi("y", [2, 8])], inits)


def _write(tmp_path: Path, data: bytes | onnx.ModelProto, name: str = "model.onnx") -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.SerializeToString())
    return p


def _assert_bad(path: Path, *fragments: str, **kwargs) -> str:
    """load_model must fail with a one-line message containing `fragments`, file untouched."""
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(BadInputError) as info:
        load_model(path, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    assert info.value.exit_code == 2
    for fragment in fragments:
        assert fragment in msg, msg
    if before is not None:
        assert path.read_bytes() == before
    return msg


def _ort_run(model_or_path, feeds):
    src = str(model_or_path) if isinstance(model_or_path, Path) else model_or_path.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---------------------------------------------------------------------------------------------
# good models


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_models_load(path: Path) -> None:
    before = path.read_bytes()
    model = load_model(path)
    reference = onnx.load(str(path))
    assert [n.output[0] for n in model.graph.node] == [n.output[0] for n in reference.graph.node]
    assert topological_nodes(model.graph) == list(model.graph.node)
    assert path.read_bytes() == before


def test_small_model_round_trip(tmp_path: Path) -> None:
    model = _mlp()
    p = _write(tmp_path, model)
    assert load_model(p) == model
    assert load_model(str(p)) == model  # str paths too


def test_optional_empty_input_is_not_dangling(tmp_path: Path) -> None:
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "hi")]
    load_model(_write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])], inits)))


def _if_model(then_reads: str) -> onnx.ModelProto:
    """If(cond) whose then-branch reads `then_reads` from the outer scope."""
    then_graph = helper.make_graph(
        [helper.make_node("Relu", [then_reads], ["t_out"])], "then", [], [_vi("t_out", [3])]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])], "else", [], [_vi("e_out", [3])]
    )
    nodes = [
        helper.make_node("Abs", ["x"], ["ax"], name="abs"),
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_graph, else_branch=else_graph),
    ]
    return _model(nodes, [_vi("x", [3]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [3])])


def test_subgraph_may_read_outer_scope(tmp_path: Path) -> None:
    load_model(_write(tmp_path, _if_model("ax")))


def test_unsorted_acyclic_graph_is_reordered_in_memory(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["t"], ["y"], name="second"),
        helper.make_node("Neg", ["x"], ["t"], name="first"),
    ]
    p = _write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])]))
    before = p.read_bytes()
    model = load_model(p)
    assert [n.name for n in model.graph.node] == ["first", "second"]
    assert p.read_bytes() == before


def test_subgraph_dependency_orders_outer_nodes(tmp_path: Path) -> None:
    """An If reading 'ax' from its branch must come after the node producing 'ax'."""
    model = _if_model("ax")
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    loaded = load_model(_write(tmp_path, model))
    assert [n.name for n in loaded.graph.node] == ["abs", "if"]


def test_topological_nodes_is_stable() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Relu", ["x"], ["b"], name="b"),
        helper.make_node("Add", ["c", "a"], ["d"], name="d"),
        helper.make_node("Relu", ["x"], ["c"], name="c"),
        helper.make_node("Relu", ["x"], ["e"], name="e"),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1])], [_vi("d", [1]), _vi("e", [1]), _vi("b", [1])])
    assert [n.name for n in topological_nodes(graph)] == ["a", "b", "c", "d", "e"]


def test_order_like_follows_the_reference_where_names_survived() -> None:
    # The reference interleaves two branches; the rewrite wrote them one after the other, with a new
    # node "n" (feeding "b2") and a new node "m" (feeding only the graph output).
    reference = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a1"], name="a1"),
            helper.make_node("Relu", ["x"], ["b1"], name="b1"),
            helper.make_node("Relu", ["a1"], ["a2"], name="a2"),
            helper.make_node("Relu", ["b1"], ["b2"], name="b2"),
            helper.make_node("Add", ["a2", "b2"], ["y"], name="y"),
        ],
        "g",
        [_vi("x", [1])],
        [_vi("y", [1])],
    )
    rewritten = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a1"], name="a1"),
            helper.make_node("Relu", ["a1"], ["a2"], name="a2"),
            helper.make_node("Relu", ["x"], ["b1"], name="b1"),
            helper.make_node("Neg", ["b1"], ["n"], name="n"),
            helper.make_node("Relu", ["n"], ["b2"], name="b2"),
            helper.make_node("Add", ["a2", "b2"], ["y"], name="y"),
            helper.make_node("Neg", ["a1"], ["m"], name="m"),
        ],
        "g",
        [_vi("x", [1])],
        [_vi("y", [1]), _vi("m", [1])],
    )
    order_like(rewritten, reference)
    assert [n.name for n in rewritten.node] == ["a1", "m", "b1", "a2", "n", "b2", "y"]


def test_topological_nodes_names_a_node_on_the_cycle() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="start"),
        helper.make_node("Add", ["a", "c"], ["b"], name="loop_b"),
        helper.make_node("Relu", ["b"], ["c"], name="loop_c"),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1])], [_vi("c", [1])])
    with pytest.raises(BadInputError, match=r"graph has a cycle through node 'loop_[bc]'"):
        topological_nodes(graph)


# ---------------------------------------------------------------------------------------------
# bad inputs


def test_missing_file(tmp_path: Path) -> None:
    _assert_bad(tmp_path / "nope.onnx", "not found")


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "dir.onnx"
    d.mkdir()
    _assert_bad(d, "directory")


def test_empty_file(tmp_path: Path) -> None:
    _assert_bad(_write(tmp_path, b""), "empty")


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(tmp_path: Path, seed: int) -> None:
    data = np.random.default_rng(seed).bytes(500)
    _assert_bad(_write(tmp_path, data))


def test_text_file(tmp_path: Path) -> None:
    _assert_bad(_write(tmp_path, b"hello, this is not a model\n" * 10))


def test_tensor_protobuf_is_not_a_model(tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(np.ones((3, 4), np.float32), "t")
    _assert_bad(_write(tmp_path, tensor.SerializeToString()))


def test_light_output_pb_is_not_a_model() -> None:
    pb = LIGHT_DIR / "light_squeezenet_output_0.pb"
    _assert_bad(pb)


def test_model_without_graph(tmp_path: Path) -> None:
    _assert_bad(_write(tmp_path, onnx.ModelProto(ir_version=8)), "no graph")


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_truncated_light_model(tmp_path: Path, fraction: float) -> None:
    data = (LIGHT_DIR / "light_squeezenet.onnx").read_bytes()
    _assert_bad(_write(tmp_path, data[: int(len(data) * fraction)]))


def test_truncated_by_one_byte(tmp_path: Path) -> None:
    data = _mlp().SerializeToString()
    _assert_bad(_write(tmp_path, data[:-1]))


def test_newer_default_opset(tmp_path: Path) -> None:
    newer = onnx.defs.onnx_opset_version() + 1
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [3])], [_vi("y", [3])])
    model.opset_import[0].version = newer
    _assert_bad(_write(tmp_path, model), f"opset {newer}", "default ONNX domain")


def test_newer_ir_version(tmp_path: Path) -> None:
    model = _mlp()
    model.ir_version = onnx.IR_VERSION + 1
    _assert_bad(_write(tmp_path, model), "IR version")


def test_unknown_domain_without_opset_import(tmp_path: Path) -> None:
    nodes = [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="fancy")]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    _assert_bad(_write(tmp_path, model), "com.example", "opset_import", "'fancy'")


def test_custom_domain_with_opset_import_loads(tmp_path: Path) -> None:
    nodes = [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")]
    opsets = [*OPSET, helper.make_opsetid("com.example", 1)]
    load_model(_write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])], opsets=opsets)))


def test_checker_failure_reports_first_line(tmp_path: Path) -> None:
    nodes = [helper.make_node("NotAnOnnxOp", ["x"], ["y"])]
    _assert_bad(_write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])])), "invalid ONNX model")


def test_cycle(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Add", ["x", "c"], ["b"], name="nb"),
        helper.make_node("Relu", ["b"], ["c"], name="nc"),
        helper.make_node("Relu", ["c"], ["y"], name="ny"),
    ]
    _assert_bad(_write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])])), "cycle through node 'n")


def test_self_loop(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "y"], ["y"], name="self")]
    _assert_bad(
        _write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])])), "cycle through node 'self'"
    )


def test_dangling_input(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
    _assert_bad(_write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("y", [3])])), "'ghost'", "'add'")


def test_dangling_input_in_subgraph(tmp_path: Path) -> None:
    _assert_bad(_write(tmp_path, _if_model("ghost")), "'ghost'", "subgraph 'then_branch'")


def test_graph_output_not_produced(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3]), _vi("z", [3])])
    _assert_bad(_write(tmp_path, model), "graph output 'z'")


def test_duplicate_output_names(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="one"),
        helper.make_node("Neg", ["x"], ["y"], name="two"),
    ]
    model = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    _assert_bad(_write(tmp_path, model), "'y' is produced by two nodes", "'one'", "'two'")


def test_node_output_shadows_graph_input(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["x"], name="shadow")]
    _assert_bad(
        _write(tmp_path, _model(nodes, [_vi("x", [3])], [_vi("x", [3])])), "graph input or initializer"
    )


@pytest.mark.parametrize("delta", [-4, 4])
def test_raw_initializer_size_mismatch(tmp_path: Path, delta: int) -> None:
    model = _mlp()
    w = model.graph.initializer[0]
    w.raw_data = w.raw_data[:delta] if delta < 0 else w.raw_data + b"\0" * delta
    _assert_bad(_write(tmp_path, model), "initializer 'W1'", "bytes")


def test_typed_initializer_size_mismatch(tmp_path: Path) -> None:
    model = _mlp()
    bad = TensorProto(name="b1", data_type=TensorProto.FLOAT, dims=[64], float_data=[1.0] * 63)
    model.graph.initializer[1].CopyFrom(bad)
    _assert_bad(_write(tmp_path, model), "initializer 'b1'", "float_data")


def test_constant_attribute_size_mismatch(tmp_path: Path) -> None:
    value = numpy_helper.from_array(np.ones(4, np.float32), "")
    value.raw_data = value.raw_data[:-4]
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=value),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    _assert_bad(_write(tmp_path, _model(nodes, [_vi("x", [4])], [_vi("y", [4])])), "'const'", "bytes")


# ---------------------------------------------------------------------------------------------
# external data


def _save_external(model: onnx.ModelProto, path: Path) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model strips the weights of the model it externalizes
    onnx.save_model(
        copy,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".weights",
        size_threshold=0,
    )


def test_external_data_loads(tmp_path: Path) -> None:
    model = _mlp()
    p = tmp_path / "ext.onnx"
    _save_external(model, p)
    loaded = load_model(p)
    for got, want in zip(loaded.graph.initializer, model.graph.initializer, strict=True):
        assert not onnx.external_data_helper.uses_external_data(got)
        np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))


def test_external_data_not_loaded_keeps_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "ext.onnx"
    _save_external(_mlp(), p)
    monkeypatch.chdir("/")  # the checker must resolve the sidecar relative to the model, not the cwd
    loaded = load_model(p, load_external_data=False)
    assert all(onnx.external_data_helper.uses_external_data(t) for t in loaded.graph.initializer)


def test_missing_external_data_file(tmp_path: Path) -> None:
    p = tmp_path / "ext.onnx"
    _save_external(_mlp(), p)
    (tmp_path / "ext.onnx.weights").unlink()
    _assert_bad(p, "external data")
    _assert_bad(p, load_external_data=False)


def test_truncated_external_data_file(tmp_path: Path) -> None:
    p = tmp_path / "ext.onnx"
    _save_external(_mlp(), p)
    sidecar = tmp_path / "ext.onnx.weights"
    sidecar.write_bytes(sidecar.read_bytes()[:100])
    _assert_bad(p)


def test_large_model_checked_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the protobuf limit the checker must get the path; simulate with a tiny limit."""
    p = tmp_path / "ext.onnx"
    _save_external(_mlp(), p)
    seen: list[object] = []
    real = onnx.checker.check_model
    monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 100)
    monkeypatch.setattr(onnx.checker, "check_model", lambda m, *a, **k: (seen.append(m), real(m, *a, **k)))
    load_model(p)
    assert seen == [str(p)]


# ---------------------------------------------------------------------------------------------
# saving


def _listing(d: Path) -> list[str]:
    return sorted(x.name for x in d.iterdir())


def test_save_inline_round_trip(tmp_path: Path) -> None:
    model = _mlp()
    out = tmp_path / "out.onnx"
    save_model_atomic(model, out)
    assert onnx.load(str(out)) == model
    assert _listing(tmp_path) == ["out.onnx"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_save_overwrites_existing_output(tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old")
    save_model_atomic(_mlp(), out)
    assert load_model(out) == _mlp()


def test_save_external_round_trip(tmp_path: Path) -> None:
    model = _mlp()
    snapshot = model.SerializeToString()
    out = tmp_path / "out.onnx"
    save_model_atomic(model, out, external_data=True)
    assert model.SerializeToString() == snapshot, "the caller's model must not be modified"
    assert _listing(tmp_path) == ["out.onnx", "out.onnx.data"]
    assert out.stat().st_size < 2000  # weights live in the sidecar
    raw = onnx.load(str(out), load_external_data=False)
    big = [t.name for t in raw.graph.initializer if onnx.external_data_helper.uses_external_data(t)]
    assert big == ["W1", "W2"]  # b1 (256 bytes) stays inline
    assert {e.value for t in raw.graph.initializer for e in t.external_data if e.key == "location"} == {
        "out.onnx.data"
    }
    loaded = load_model(out)
    assert loaded == model
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_array_equal(_ort_run(out, {"x": x})[0], _ort_run(model, {"x": x})[0])


def test_save_switches_to_external_data_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(modelio, "MAX_PROTO_BYTES", 1000)
    out = tmp_path / "big.onnx"
    save_model_atomic(_mlp(), out)
    assert _listing(tmp_path) == ["big.onnx", "big.onnx.data"]
    assert load_model(out) == _mlp()


def test_save_rejects_unloaded_external_references(tmp_path: Path) -> None:
    src = tmp_path / "src.onnx"
    _save_external(_mlp(), src)
    model = onnx.load(str(src), load_external_data=False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(OnnxsatError, match="still refers to external data"):
        save_model_atomic(model, out_dir / "out.onnx")
    assert _listing(out_dir) == []


def test_output_is_existing_directory(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    with pytest.raises(BadInputError, match="is a directory"):
        save_model_atomic(_mlp(), target)
    assert _listing(tmp_path) == ["taken"]
    assert _listing(target) == []


def test_output_directory_missing(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="does not exist"):
        save_model_atomic(_mlp(), tmp_path / "no" / "such" / "out.onnx")
    assert _listing(tmp_path) == []


def test_output_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(BadInputError, match="not a directory"):
        check_output_path(tmp_path / "file" / "out.onnx")


def test_output_is_input(tmp_path: Path) -> None:
    src = _write(tmp_path, _mlp(), "in.onnx")
    before = src.read_bytes()
    for same in (src, tmp_path / "." / "in.onnx", str(src)):
        with pytest.raises(BadInputError, match="is the input model"):
            check_output_path(same, src)
    link = tmp_path / "link.onnx"
    link.symlink_to(src)
    with pytest.raises(BadInputError, match="is the input model"):
        save_model_atomic(_mlp(1), link, input_path=src)
    assert src.read_bytes() == before
    assert _listing(tmp_path) == ["in.onnx", "link.onnx"]


def test_check_output_path_accepts_new_file(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "new.onnx", tmp_path / "in.onnx") == tmp_path / "new.onnx"
    assert _listing(tmp_path) == []  # the writability probe cleans up


def test_sidecar_path_is_directory(tmp_path: Path) -> None:
    (tmp_path / "out.onnx.data").mkdir()
    with pytest.raises(BadInputError, match="external data path"):
        save_model_atomic(_mlp(), tmp_path / "out.onnx", external_data=True)
    assert _listing(tmp_path) == ["out.onnx.data"]


@pytest.mark.parametrize("external", [False, True])
def test_failed_write_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, external: bool
) -> None:
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelio.os, "replace", refuse)
    with pytest.raises(BadInputError, match="cannot write .*No space left"):
        save_model_atomic(_mlp(), tmp_path / "out.onnx", external_data=external)
    assert _listing(tmp_path) == []


def test_failed_model_replace_removes_new_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith(".onnx"):
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(modelio.os, "replace", replace)
    with pytest.raises(BadInputError):
        save_model_atomic(_mlp(), tmp_path / "out.onnx", external_data=True)
    assert _listing(tmp_path) == []


def test_failed_serialization_leaves_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_model):
        raise OnnxsatError("cannot serialize the model (too big)")

    monkeypatch.setattr(modelio, "_serialize", boom)
    with pytest.raises(OnnxsatError):
        save_model_atomic(_mlp(), tmp_path / "out.onnx", external_data=True)
    assert _listing(tmp_path) == []
