"""A model's structure without its large weight bytes, for passes that read no weight values.

ONNX shape inference takes a ModelProto, serializes it for its C++ side and parses the result
back: on a whole model that is three transient copies of every weight (a 436 MB BERT peaked
1.3 GB above its own size in shape inference alone). Shape inference reads initializers' types
and dims, and values only of shape-like inputs (Reshape's shape, Slice's starts, ...), which are
small. So `infer_shapes` runs it on a shell whose large main-graph initializers are external
references to a file that does not exist: the same dims and dtype, no bytes. Large means what
stays in its file when a model is loaded lazily (`onnxsat.base.lazy_weights.worth_leaving`: a MiB
for a type that may be a size, 4 KiB for others). A pass that did read such a value fails on that
node as it does for weights kept in their file, never on invented values.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from .lazy_weights import worth_leaving
from .modelio import model_shell

_MISSING = "onnxsat-weightless.absent"


def weightless(model: ModelProto, location: str = _MISSING) -> ModelProto:
    """A copy of ``model`` whose large main-graph initializers carry dims and dtype but no bytes
    (copied one tensor at a time: the peak is one tensor, not the model); their external data is
    at ``location`` (by default a file that does not exist)."""
    shell = model_shell(model, {"initializer"})
    for tensor in model.graph.initializer:
        copy = shell.graph.initializer.add()
        if not _large(tensor):
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type, copy.doc_string = tensor.name, tensor.data_type, tensor.doc_string
        copy.dims.extend(tensor.dims)
        copy.data_location = TensorProto.EXTERNAL
        entry = copy.external_data.add()
        entry.key, entry.value = "location", location
    return shell


def stripped(model: ModelProto) -> list[TensorProto]:
    """The initializers `weightless` leaves without bytes, in order."""
    return [t for t in model.graph.initializer if _large(t)]


def has_large_weights(model: ModelProto) -> bool:
    """Whether `weightless` leaves out any bytes of ``model``."""
    return any(_large(t) for t in model.graph.initializer)


def _large(tensor: TensorProto) -> bool:
    """Raw bytes of a plain dtype that `worth_leaving` out, judged from dims (reading ``raw_data``
    or its size would copy it); strings in raw_data are left for the checker to refuse."""
    if not tensor.HasField("raw_data") or tensor.data_type == TensorProto.STRING:
        return False
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:  # packed and unknown types: kept whole
        return False
    dims = tuple(tensor.dims)
    return worth_leaving(tensor.data_type, dims, math.prod(dims) * itemsize)


def restore_weights(shell: ModelProto, model: ModelProto) -> bool:
    """Put ``model``'s bytes back into the initializers a pass kept from `weightless` ``model``
    (matched by name, dtype and dims); False, and ``shell`` half restored, when one is unmatched."""
    originals = {t.name: t for t in model.graph.initializer if _large(t)}
    for tensor in shell.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL or not any(e.value == _MISSING for e in tensor.external_data):
            continue
        original = originals.get(tensor.name)
        if original is None or original.data_type != tensor.data_type or list(original.dims) != list(tensor.dims):
            return False
        tensor.CopyFrom(original)
    return True


def infer_shapes(model: ModelProto, **kwargs: Any) -> ModelProto:
    """``onnx.shape_inference.infer_shapes(model, **kwargs)`` on `weightless` ``model``: the same
    value infos, inputs and outputs; its large initializers have no bytes (read only its types)."""
    return onnx.shape_inference.infer_shapes(weightless(model), **kwargs)


def has_symbolic_inputs(model: ModelProto) -> bool:
    """Whether a graph input has a dim that is not a number (a named or unnamed free size)."""
    return any(
        not d.HasField("dim_value")
        for i in model.graph.input
        if i.type.HasField("tensor_type") and i.type.tensor_type.HasField("shape")
        for d in i.type.tensor_type.shape.dim
    )


def infer_types(model: ModelProto) -> ModelProto:
    """``model`` with every tensor's type ONNX shape inference (data propagation on) finds, the
    symbolic sizes of a model with free input dims named by onnxruntime's symbolic shape inference.

    ONNX inference invents a fresh name (``unk__3``) for each size it cannot carry through an op,
    so after the first Add of a BERT the batch and sequence are new symbols in every layer, and a
    rule that needs two tensors' sequence to be the same size never fires (a region of a graph,
    seeded from these types, sees none of its sizes tied to the others). onnxruntime's inference
    carries ``batch`` and ``sequence`` (or ``past_sequence + 1``) through. It runs without merging
    sizes first, then with merges where that alone fails, keeping them only where they hold
    (``_merges_hold``: a BERT's ``Min(512, sequence)`` slice of its position table added to the
    ``sequence`` activations). Models it cannot finish (an op it does not know) keep ONNX's types."""
    if has_symbolic_inputs(model):
        symbolic = _symbolic(model)
        if symbolic is not None:
            return symbolic
    return infer_shapes(model, strict_mode=False, data_prop=True)


def _symbolic(model: ModelProto) -> ModelProto | None:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, logger

    shell = model_shell(model, {"initializer"})
    large = {t.name for t in model.graph.initializer if _large(t) or t.data_location == TensorProto.EXTERNAL}
    for tensor in model.graph.initializer:  # inputs, not bytes: it reads the values of initializers it folds
        if tensor.name in large:
            shell.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            shell.graph.initializer.add().CopyFrom(tensor)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        for auto_merge in (False, True):
            # SymbolicShapeInference.infer_shapes's steps without its last: where inference is
            # incomplete it saves the model into the working directory, a write the input steers
            inference = SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
            try:
                inference._preprocess(shell)
                complete = False
                while inference.run_:
                    complete = inference._infer_impl()
                inference._update_output_from_vi()
            except Exception:
                continue
            if not complete or not _merges_hold(inference.suggested_merge_):
                continue
            inferred = inference.out_mp_
            keep = [i for i in inferred.graph.input if i.name not in large]
            del inferred.graph.input[:]
            inferred.graph.input.extend(keep)
            return inferred  # type: ignore[no-any-return]
    finally:
        logger.setLevel(level)
    return None


MERGE_CHECKED_UP_TO = 1 << 16
"""Sizes of the one free symbol at which a merge of two sizes is checked (``_merges_hold``)."""


def _merges_hold(merges: dict[str, Any]) -> bool:
    """Whether every merge onnxruntime's inference made (``{merged: kept}``, sizes an elementwise op
    broadcasts against each other) is sound: broadcasting also passes where one of the two is 1,
    so ``a + c`` of free sizes ``a`` and ``c`` does not make them one (a 1 against a 5 is valid).
    A merge holds where both sizes are expressions of one and the same free symbol and are 1 at
    the same values of it (checked up to ``MERGE_CHECKED_UP_TO``): ``Min(512, sequence)`` is 1
    exactly where ``sequence`` is, and where the two differ neither is 1, so the model cannot run."""
    import sympy  # imported here: ~0.3 s, paid only by models with free sizes

    functions = {"Min": sympy.Min, "Max": sympy.Max, "floor": sympy.floor, "ceiling": sympy.ceiling, "Mod": sympy.Mod}

    def parse(text: str) -> Any:  # every other name a symbol: a size called "sequence" is not sympy's function
        names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) - set(functions)
        return sympy.parse_expr(text, local_dict={**functions, **{n: sympy.Symbol(n) for n in names}})

    for merged, kept in merges.items():
        try:
            a, b = parse(str(merged)), parse(str(kept))
        except Exception:  # what sympy cannot read is not checked, so not kept
            return False
        symbols = a.free_symbols | b.free_symbols
        if len(symbols) != 1 or a.free_symbols != b.free_symbols:
            return False
        values = np.arange(1, MERGE_CHECKED_UP_TO + 1)
        (symbol,) = symbols
        ones = [np.broadcast_to(sympy.lambdify(symbol, e, "numpy")(values), values.shape) == 1 for e in (a, b)]
        if not np.array_equal(ones[0], ones[1]):
            return False
    return True
