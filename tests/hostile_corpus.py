"""A generator of hostile inputs: path tricks, forged markers, output paths that are the input's
files, huge or impossible declared shapes.

`build_corpus(root)` writes every case under ``root`` (one directory per case, ``model/`` holding
the input) next to one canary file outside every model directory whose marker bytes must never
appear in any output. Each case says which exit statuses are acceptable: a hostile reference is
refused (2) before any work; a legitimate but odd one is optimized (0). Used by
``tests/test_security.py``; ``python tests/hostile_corpus.py DIR`` writes the corpus for manual runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CANARY_MARKER = b"ONNXSAT-CANARY-7f3a91"
"""Bytes of the canary file outside the model directories; no output may contain them."""
LARGE = 1 << 20
"""At the lazy-weights threshold: tensors this large take the lazy path, smaller ones are read."""


@dataclass
class HostileCase:
    name: str
    model_dir: Path
    args: list[str]
    """``onnxsat`` arguments (after the command) that run the case."""
    exits: frozenset[int]
    """Acceptable exit statuses."""
    message: str = ""
    """A fragment the one-line error must contain (lower case), when the case must be refused."""

    @property
    def inputs(self) -> list[Path]:
        """Every file of the model directory (symbolic links not followed): none may change."""
        return sorted(p for p in self.model_dir.rglob("*") if p.is_file() and not p.is_symlink())


def canary_bytes(count: int) -> bytes:
    """``count`` bytes (a multiple of 4) made of the marker, valid float32 data."""
    reps = count // len(CANARY_MARKER) + 1
    return (CANARY_MARKER * reps)[:count]


def _external(name: str, shape: tuple[int, ...], entries: dict[str, str]) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _shape_for(nbytes: int) -> tuple[int, int]:
    return (nbytes // 4 // 64, 64)


def _add_model(weight: TensorProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """y = x + w, with ``w`` the given (external) initializer."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", weight.name], ["y"])],
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save(model: onnx.ModelProto, directory: Path, name: str = "model.onnx") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(model.SerializeToString())
    return path


def _out(case_dir: Path) -> str:
    (case_dir / "out").mkdir(exist_ok=True)
    return str(case_dir / "out" / "opt.onnx")


Builder = Callable[[Path, Path], HostileCase]
"""(case directory, canary file) -> the case, written."""


def _escape(kind: str, nbytes: int) -> Builder:
    """A weight whose location reaches the canary through an absolute path, ``..``, a symlinked
    directory, a symlinked file, or a forged ``basepath`` (with a decoy file next to the model)."""

    def build(case_dir: Path, canary: Path) -> HostileCase:
        model_dir = case_dir / "model"
        model_dir.mkdir(parents=True)
        shape = _shape_for(nbytes)
        entries = {"offset": "0", "length": str(nbytes)}
        if kind == "absolute":
            entries["location"] = str(canary)
        elif kind == "dotdot":
            entries["location"] = os.path.relpath(canary, model_dir)
        elif kind == "symlinked-dir":
            os.symlink(canary.parent, model_dir / "sub")
            entries["location"] = f"sub/{canary.name}"
        elif kind == "symlinked-file":
            os.symlink(canary, model_dir / "w.bin")
            entries["location"] = "w.bin"
        elif kind == "forged-basepath":
            (model_dir / canary.name).write_bytes(b"\0" * nbytes)  # the decoy the checker looks at
            entries["location"] = canary.name
            entries["basepath"] = str(canary.parent)
        else:
            raise ValueError(kind)
        _save(_add_model(_external("w", shape, entries), shape), model_dir)
        return HostileCase(
            f"{kind}-{nbytes}",
            model_dir,
            [str(model_dir / "model.onnx"), "-o", _out(case_dir)],
            frozenset({2}),
        )

    return build


def _weights_file(model_dir: Path, nbytes: int, name: str = "w.bin") -> dict[str, str]:
    (model_dir / name).write_bytes(np.arange(nbytes // 4, dtype=np.float32).tobytes())
    return {"location": name, "offset": "0", "length": str(nbytes)}


def _constant_attribute(case_dir: Path, canary: Path) -> HostileCase:
    """A Constant node whose ``value`` tensor is external data outside the model's directory."""
    model_dir = case_dir / "model"
    model_dir.mkdir(parents=True)
    os.symlink(canary.parent, model_dir / "sub")
    shape = _shape_for(4096)
    value = _external("c", shape, {"location": f"sub/{canary.name}", "length": "4096"})
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])],
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, model_dir)
    return HostileCase(
        "constant-attribute", model_dir, [str(model_dir / "model.onnx"), "-o", _out(case_dir)], frozenset({2})
    )


def _subgraph_initializer(case_dir: Path, canary: Path) -> HostileCase:
    """An If whose then-branch holds an external initializer reaching the canary through ``..``."""
    model_dir = case_dir / "model"
    model_dir.mkdir(parents=True)
    shape = _shape_for(4096)
    inner = _external("w", shape, {"location": os.path.relpath(canary, model_dir), "length": "4096"})
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, list(shape))],
        initializer=[inner],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, list(shape))],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "hostile",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, model_dir)
    return HostileCase(
        "subgraph-initializer",
        model_dir,
        [str(model_dir / "model.onnx"), "-o", _out(case_dir)],
        frozenset({2}),
    )


def _sparse_initializer(case_dir: Path, canary: Path) -> HostileCase:
    """A sparse initializer whose values are external data behind a symlinked directory."""
    model_dir = case_dir / "model"
    model_dir.mkdir(parents=True)
    os.symlink(canary.parent, model_dir / "sub")
    values = _external("w", (4,), {"location": f"sub/{canary.name}", "length": "16"})
    indices = numpy_helper.from_array(np.array([0, 1, 2, 3], np.int64), "w_indices")
    sparse = helper.make_sparse_tensor(values, indices, [2, 4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    graph.sparse_initializer.append(sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _save(model, model_dir)
    return HostileCase(
        "sparse-initializer", model_dir, [str(model_dir / "model.onnx"), "-o", _out(case_dir)], frozenset({2})
    )


def _past_end(case_dir: Path, canary: Path) -> HostileCase:
    """Offset and length that lie past the end of the (inside) weights file."""
    model_dir = case_dir / "model"
    model_dir.mkdir(parents=True)
    shape = _shape_for(4096)
    entries = _weights_file(model_dir, 4096)
    entries["offset"] = "4096"
    _save(_add_model(_external("w", shape, entries), shape), model_dir)
    return HostileCase(
        "past-end",
        model_dir,
        [str(model_dir / "model.onnx"), "-o", _out(case_dir)],
        frozenset({2}),
        "past the end",
    )


def _location_is_directory(case_dir: Path, canary: Path) -> HostileCase:
    model_dir = case_dir / "model"
    (model_dir / "w.bin").mkdir(parents=True)
    shape = _shape_for(4096)
    _save(_add_model(_external("w", shape, {"location": "w.bin", "length": "4096"}), shape), model_dir)
    return HostileCase(
        "location-is-directory",
        model_dir,
        [str(model_dir / "model.onnx"), "-o", _out(case_dir)],
        frozenset({2}),
        "regular file",
    )


def _output_is_weights(nbytes: int, external: bool) -> Builder:
    """``-o w.bin`` where w.bin is the input's weights file, or ``-o o.onnx --external-data`` where
    ``o.onnx.data`` is: the input must stay intact."""

    def build(case_dir: Path, canary: Path) -> HostileCase:
        model_dir = case_dir / "model"
        model_dir.mkdir(parents=True)
        shape = _shape_for(nbytes)
        weights = "o.onnx.data" if external else "w.bin"
        entries = _weights_file(model_dir, nbytes, weights)
        _save(_add_model(_external("w", shape, entries), shape), model_dir)
        out = model_dir / ("o.onnx" if external else "w.bin")
        args = [str(model_dir / "model.onnx"), "-o", str(out)] + (["--external-data"] if external else [])
        return HostileCase(
            f"output-is-{'sidecar' if external else 'weights'}-{nbytes}",
            model_dir,
            args,
            frozenset({2}),
            "input",
        )

    return build


def _inside_symlink_ok(nbytes: int) -> Builder:
    """Legitimate: the weights sit in a subdirectory reached through a symlink that stays inside."""

    def build(case_dir: Path, canary: Path) -> HostileCase:
        model_dir = case_dir / "model"
        (model_dir / "real").mkdir(parents=True)
        os.symlink("real", model_dir / "weights")
        shape = _shape_for(nbytes)
        entries = _weights_file(model_dir / "real", nbytes)
        entries["location"] = "weights/w.bin"
        _save(_add_model(_external("w", shape, entries), shape), model_dir)
        return HostileCase(
            f"inside-symlink-{nbytes}",
            model_dir,
            [str(model_dir / "model.onnx"), "-o", _out(case_dir)],
            frozenset({0}),
        )

    return build


def _graph_case(name: str, make: Callable[[], onnx.ModelProto], exits: frozenset[int], message: str = "") -> Builder:
    def build(case_dir: Path, canary: Path) -> HostileCase:
        model_dir = case_dir / "model"
        _save(make(), model_dir)
        return HostileCase(name, model_dir, [str(model_dir / "model.onnx"), "-o", _out(case_dir)], exits, message)

    return build


def _one_node(
    node: onnx.NodeProto,
    inputs: list[onnx.ValueInfoProto],
    output: onnx.ValueInfoProto,
    initializers: list[TensorProto] | None = None,
    opsets: list[onnx.OperatorSetIdProto] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph([node], "hostile", inputs, [output], initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _float(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _relu_of(vi: onnx.ValueInfoProto) -> onnx.ModelProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    out.name = "y"
    return _one_node(helper.make_node("Relu", [vi.name], ["y"]), [vi], out)


def _negative_dim() -> onnx.ModelProto:
    return _relu_of(_float("x", [2, -3]))


def _huge_input(shape: list[int | str]) -> Callable[[], onnx.ModelProto]:
    return lambda: _relu_of(_float("x", shape))


def _int64s(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _constant_of_shape_4tib() -> onnx.ModelProto:
    node = helper.make_node("ConstantOfShape", ["s"], ["c"])
    graph = helper.make_graph(
        [node, helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
        "hostile",
        [_float("x", [1])],
        [_float("y", [])],
        initializer=[_int64s("s", [1 << 20, 1 << 20])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _expand_overflow() -> onnx.ModelProto:
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    return _one_node(node, [_float("x", [1, 1])], _float("y", [None, None]), [_int64s("s", [1 << 62, 1 << 62])])


def _reshape_allowzero() -> onnx.ModelProto:
    # allowzero=1 with a 0 in the shape and a -1: onnxruntime refuses it at run time
    node = helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)
    return _one_node(node, [_float("x", [2, 3])], _float("y", [None, None]), [_int64s("s", [0, -1])], [helper.make_opsetid("", 14)])


def _typed_input(elem_type: int) -> Callable[[], onnx.ModelProto]:
    def make() -> onnx.ModelProto:
        vi = helper.make_tensor_value_info("x", elem_type, [2, 3])
        return _relu_of(vi) if elem_type != TensorProto.STRING else _one_node(
            helper.make_node("Identity", ["x"], ["y"]), [vi], helper.make_tensor_value_info("y", elem_type, [2, 3])
        )

    return make


def _untyped_custom_op() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mystery", ["r"], ["m"], domain="com.example"),
        helper.make_node("Neg", ["m"], ["n"]),
        helper.make_node("Neg", ["n"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "hostile", [_float("x", [2, 3])], [_float("y", [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


def _no_verify(builder: Builder) -> Builder:
    def build(case_dir: Path, canary: Path) -> HostileCase:
        case = builder(case_dir, canary)
        case.args.append("--no-verify")
        case.name += "-no-verify"
        return case

    return build


BUILDERS: dict[str, Builder] = {
    **{
        f"{kind}-{size}": _escape(kind, size)
        for kind in ("absolute", "dotdot", "symlinked-dir", "symlinked-file", "forged-basepath")
        for size in (4096, LARGE)
    },
    "symlinked-dir-large-no-verify": _no_verify(_escape("symlinked-dir", LARGE)),
    "constant-attribute": _constant_attribute,
    "subgraph-initializer": _subgraph_initializer,
    "sparse-initializer": _sparse_initializer,
    "past-end": _past_end,
    "location-is-directory": _location_is_directory,
    **{
        f"output-is-{'sidecar' if ext else 'weights'}-{size}": _output_is_weights(size, ext)
        for ext in (False, True)
        for size in (4096, LARGE)
    },
    "inside-symlink-4096": _inside_symlink_ok(4096),
    "negative-dim": _graph_case("negative-dim", _negative_dim, frozenset({2}), "negative"),
    "input-2e40": _graph_case("input-2e40", _huge_input([1 << 40]), frozenset({2}), "--no-verify"),
    "input-2e20-squared": _graph_case("input-2e20-squared", _huge_input([1 << 20, 1 << 20]), frozenset({2}), "--no-verify"),
    "constant-of-shape-4tib": _graph_case("constant-of-shape-4tib", _constant_of_shape_4tib, frozenset({2})),
    "expand-overflow": _graph_case("expand-overflow", _expand_overflow, frozenset({2})),
    "reshape-allowzero": _graph_case("reshape-allowzero", _reshape_allowzero, frozenset({2})),
    "string-input": _graph_case("string-input", _typed_input(TensorProto.STRING), frozenset({0})),
    "bfloat16-input": _graph_case("bfloat16-input", _typed_input(TensorProto.BFLOAT16), frozenset({2}), "--verify-inputs"),
    "untyped-custom-op": _graph_case("untyped-custom-op", _untyped_custom_op, frozenset({2}), "--allow-unverified"),
}


def write_canary(root: Path) -> Path:
    outside = root / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    canary = outside / "canary.bin"
    canary.write_bytes(canary_bytes(LARGE))
    return canary


def build_case(root: Path, name: str) -> HostileCase:
    """Write case ``name`` under ``root/name`` (the canary under ``root/outside``)."""
    canary = root / "outside" / "canary.bin"
    if not canary.exists():
        write_canary(root)
    return BUILDERS[name](root / name, canary)


def build_corpus(root: Path) -> list[HostileCase]:
    return [build_case(root, name) for name in BUILDERS]


if __name__ == "__main__":
    for case in build_corpus(Path(sys.argv[1])):
        print(f"{case.name}: onnxsat optimize {' '.join(case.args)}  (exit {sorted(case.exits)})")
