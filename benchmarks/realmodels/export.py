"""Export the real-model corpus (manifest.json) to ONNX with random weights and no downloads.

    /work/venv-export/bin/python benchmarks/realmodels/export.py --size full|small --out DIR [--only NAME]

torchvision models are built with ``weights=None`` and transformers models from a config object,
exported with torch's TorchScript (``dynamo=False``, opset 17) or dynamo (``dynamo=True``, its
default opset) exporter. After export every float initializer and float Constant of more than one
element is redrawn with the model's seed (see `randomize_floats`: LayerNorm gamma=1/beta=0 and
zero biases hide constant-dependent bugs), the model is checked to give finite outputs on
onnxruntime, and ``DIR/INDEX.json`` records name, file, exporter, shapes, opset, nodes, bytes,
sha256 and the input specs tests feed (tests/realmodels_feeds.py). One model failing to export is
reported in the index (``"error"``) and does not stop the others. Needs torch, torchvision and
transformers: never imported by the package or the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[2]
# Only the feeds module is taken from the repository: with its root on sys.path, the top-level
# folders (kernels/, rules/, ...) would shadow installed packages of the same name that
# transformers imports (its hub `kernels` package).
_spec = importlib.util.spec_from_file_location("realmodels_feeds", ROOT / "tests" / "realmodels_feeds.py")
assert _spec is not None and _spec.loader is not None
_feeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_feeds)
feeds_for = _feeds.feeds_for

MANIFEST = Path(__file__).with_name("manifest.json")


def load_manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())


# --------------------------------------------------------------------------------------------
# Building torch modules (imports of torch stay inside functions: the module imports without it)


def build_torchvision(config: dict[str, Any]) -> Any:
    """A torchvision model with random weights: the named builder (full) or a narrowed class (small)."""
    import torch
    from torchvision import models as tvm
    from torchvision.models import convnext, efficientnet, mobilenetv3, regnet, resnet

    c = dict(config)
    builder = c.pop("builder")
    if hasattr(tvm, builder) and builder[0].islower():
        return getattr(tvm, builder)(weights=None)
    classes = c.pop("num_classes")
    if builder == "ResNet":
        divisor = c["width_divisor"]

        class NarrowResNet(resnet.ResNet):
            """torchvision's ResNet with every stage's width divided (the stem stays 64 wide)."""

            def _make_layer(self, block, planes, blocks, stride=1, dilate=False):  # type: ignore[no-untyped-def]
                return super()._make_layer(block, planes // divisor, blocks, stride, dilate)

        model = NarrowResNet(resnet.BasicBlock, c["layers"], num_classes=classes)
        model.fc = torch.nn.Linear(512 // divisor, classes)
        return model
    if builder == "MobileNetV3":
        setting, last = mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small", width_mult=c["width_mult"])
        return mobilenetv3.MobileNetV3(setting, last, num_classes=classes)
    if builder == "EfficientNet":
        setting, last = efficientnet._efficientnet_conf(
            "efficientnet_b0", width_mult=c["width_mult"], depth_mult=c["depth_mult"]
        )
        return efficientnet.EfficientNet(setting, 0.2, last_channel=last, num_classes=classes)
    if builder == "RegNet":
        params = regnet.BlockParams.from_init_params(**c)
        return regnet.RegNet(params, num_classes=classes, norm_layer=torch.nn.BatchNorm2d)
    if builder == "ConvNeXt":
        ch, depths = c["channels"], c["depths"]
        setting = [
            convnext.CNBlockConfig(ch[i], ch[i + 1] if i + 1 < len(ch) else None, depths[i])
            for i in range(len(ch))
        ]
        return convnext.ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=classes)
    if builder == "ShuffleNetV2":
        return tvm.ShuffleNetV2(c["stages_repeats"], c["stages_out_channels"], num_classes=classes)
    if builder == "SwinTransformer":
        return tvm.SwinTransformer(**c, num_classes=classes)
    if builder == "VisionTransformer":
        return tvm.VisionTransformer(image_size=c.pop("image_size"), **c, num_classes=classes)
    raise ValueError(f"unknown torchvision builder {builder}")


def build_transformers(arch: dict[str, Any], size: str) -> tuple[Any, Any]:
    """A transformers model from its config class (random weights, eval mode, no hub access)."""
    import transformers

    config = getattr(transformers, arch["config_class"])(**arch["config"][size])
    if arch["class"] == "WhisperEncoder":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        return WhisperEncoder(config), config
    return getattr(transformers, arch["class"])(config), config


def wrap(
    entry: dict[str, Any], arch: dict[str, Any], size: str, defaults: dict[str, Any]
) -> tuple[Any, tuple, list, list, dict]:
    """(module, example args, input specs, output names, dynamic axes) for one manifest entry."""
    dynamic = entry["shapes"] == "dynamic"
    batch = defaults["dynamic_example_batch"] if dynamic else defaults["batch"]
    seq = defaults["sequence"]
    if arch["source"] == "torchvision":
        config = dict(arch["config"][size])
        image = defaults["image"][size]
        if config["builder"] == "VisionTransformer":
            config["image_size"] = image
        module = build_torchvision(config)
        specs = [
            {
                "name": "pixel_values",
                "dtype": "float32",
                "shape": [batch, 3, image, image],
                "values": "normal",
            }
        ]
        axes = {"pixel_values": {0: "batch"}, "logits": {0: "batch"}} if dynamic else {}
        return module.eval(), _example(specs), specs, ["logits"], axes
    model, config = build_transformers(arch, size)
    vocab = getattr(config, "vocab_size", None)
    cls = arch["class"]
    ids = {"name": "input_ids", "dtype": "int64", "shape": [batch, seq], "values": "ids", "high": vocab}
    mask = {"name": "attention_mask", "dtype": "int64", "shape": [batch, seq], "values": "mask"}
    bs = {0: "batch", 1: "sequence"}
    if entry["step"] == "decode":
        return _decode_step(model, config, batch, defaults["past_sequence"], dynamic)
    if cls == "BertModel":
        types = {
            "name": "token_type_ids",
            "dtype": "int64",
            "shape": [batch, seq],
            "values": "ids",
            "high": config.type_vocab_size,
        }
        specs, outputs = [ids, mask, types], ["last_hidden_state", "pooler_output"]
        axes = {
            "input_ids": bs,
            "attention_mask": bs,
            "token_type_ids": bs,
            "last_hidden_state": bs,
            "pooler_output": {0: "batch"},
        }
    elif cls == "WhisperEncoder":
        frames = 2 * config.max_source_positions
        specs = [
            {
                "name": "input_features",
                "dtype": "float32",
                "shape": [batch, config.num_mel_bins, frames],
                "values": "normal",
            }
        ]
        outputs, axes = (
            ["last_hidden_state"],
            {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
        )
    else:
        specs = [ids, mask]
        outputs = (
            ["logits"]
            if cls.endswith("ForCausalLM") or cls.endswith("LMHeadModel")
            else ["last_hidden_state"]
        )
        axes = {"input_ids": bs, "attention_mask": bs, outputs[0]: bs}
    return (
        _Named(model, [s["name"] for s in specs], outputs[0] if len(outputs) == 1 else None),
        _example(specs),
        specs,
        outputs,
        (axes if dynamic else {}),
    )


def _example(specs: list[dict[str, Any]]) -> tuple:
    import torch

    return tuple(torch.from_numpy(v) for v in feeds_for(specs, seed=0).values())


def _Named(model: Any, input_names: list[str], single: str | None) -> Any:
    """Call a transformers model by keyword and return its outputs as a tuple of tensors."""
    import torch

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):  # type: ignore[no-untyped-def]
            kwargs = dict(zip(input_names, args, strict=True))
            if "input_features" not in kwargs:
                kwargs["use_cache"] = False
            out = self.model(**kwargs)
            if single is not None:
                return out[single]
            return out["last_hidden_state"], out["pooler_output"]

    return Named().eval()


def _decode_step(
    model: Any, config: Any, batch: int, past: int, dynamic: bool
) -> tuple[Any, tuple, list, list, dict]:
    """One new token with past keys/values per layer in, logits and present keys/values out."""
    import torch
    from transformers import DynamicCache

    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    specs: list[dict[str, Any]] = [
        {
            "name": "input_ids",
            "dtype": "int64",
            "shape": [batch, 1],
            "values": "ids",
            "high": config.vocab_size,
        },
        {"name": "attention_mask", "dtype": "int64", "shape": [batch, past + 1], "values": "ones"},
    ]
    for i in range(layers):
        for kind in ("key", "value"):
            specs.append(
                {
                    "name": f"past_{kind}_{i}",
                    "dtype": "float32",
                    "shape": [batch, kv_heads, past, head_dim],
                    "values": "normal",
                }
            )
    outputs = ["logits"] + [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]

    class DecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past_kv):  # type: ignore[no-untyped-def]
            pairs = [(past_kv[2 * i], past_kv[2 * i + 1]) for i in range(layers)]
            cache = DynamicCache(ddp_cache_data=pairs, config=config)
            past_len = past_kv[0].shape[2]
            position_ids = torch.arange(1, device=input_ids.device).unsqueeze(0) + past_len
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids.expand(input_ids.shape[0], 1),
                past_key_values=cache,
                use_cache=True,
            )
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    axes: dict[str, dict[int, str]] = {}
    if dynamic:
        axes = {
            "input_ids": {0: "batch"},
            "attention_mask": {0: "batch", 1: "total_sequence"},
            "logits": {0: "batch"},
        }
        for i in range(layers):
            for kind in ("key", "value"):
                axes[f"past_{kind}_{i}"] = {0: "batch", 2: "past_sequence"}
                axes[f"present_{kind}_{i}"] = {0: "batch", 2: "total_sequence"}
    return DecodeStep().eval(), _example(specs), specs, outputs, axes


# --------------------------------------------------------------------------------------------
# Export, randomize, transform, check


def export_torch(
    module: Any,
    args: tuple,
    path: Path,
    exporter: str,
    inputs: list[str],
    outputs: list[str],
    axes: dict,
    opset: int,
) -> None:
    import torch

    with torch.no_grad():
        if exporter == "torchscript":
            # nn.MultiheadAttention's inference fast path (aten::_native_multi_head_attention, used by
            # vit_b_16) has no TorchScript symbolic: export the composite ops it stands for.
            torch.backends.mha.set_fastpath_enabled(False)
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes or None,
                do_constant_folding=True,
            )
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=_dynamic_shapes(module, inputs, axes),
                external_data=False,
            )


def _dynamic_shapes(module: Any, inputs: list[str], axes: dict[str, dict[int, str]]) -> dict | None:
    """torch.export dims for the dynamo exporter, keyed like forward's parameters (*args: a tuple).

    One named Dim per axis name; the decode step's total sequence (past + 1) is derived (AUTO).
    """
    if not axes:
        return None
    import inspect

    from torch.export import Dim

    dims: dict[str, Any] = {n: Dim(n, min=1, max=4096) for a in axes.values() for n in a.values()}
    dims["total_sequence"] = Dim.AUTO
    per_input = [{i: dims[n] for i, n in axes.get(name, {}).items()} or None for name in inputs]
    shapes: dict[str, Any] = {}
    for param in inspect.signature(module.forward).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[param.name] = tuple(per_input)
            break
        shapes[param.name] = per_input.pop(0)
    return shapes


def _redraw(values: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """New values of the same scale, or None to keep the tensor (masks, huge fills, non-finite).

    A constant tensor c (LayerNorm gamma 1, beta 0, zero biases, BatchNorm variance 1) becomes
    c * exp(N(0, 0.1)) (sign kept, so variances stay positive) or N(0, 0.02) when c is 0; any other
    tensor is redrawn from N(mean, std) of its own values.
    """
    x = values.astype(np.float64)
    if not np.all(np.isfinite(x)) or np.max(np.abs(x)) > 1e4:
        return None
    distinct = np.unique(x)
    if len(distinct) == 1:
        c = float(distinct[0])
        new = rng.normal(0.0, 0.02, x.shape) if c == 0.0 else c * np.exp(rng.normal(0.0, 0.1, x.shape))
    elif len(distinct) == 2:
        return None  # 0/1 or 0/-inf style masks
    else:
        new = rng.normal(float(x.mean()), float(x.std()), x.shape)
    return new.astype(values.dtype)


def randomize_floats(model: onnx.ModelProto, seed: int) -> int:
    """Redraw every float initializer and float Constant of more than one element; returns how many."""
    rng = np.random.default_rng(seed)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    tensors = [t for t in model.graph.initializer]
    for node in model.graph.node:
        if node.op_type == "Constant":
            tensors += [a.t for a in node.attribute if a.name == "value"]
    changed = 0
    for tensor in tensors:
        if tensor.data_type not in floats:
            continue
        values = numpy_helper.to_array(tensor)
        if values.size <= 1:
            continue
        new = _redraw(values, rng)
        if new is not None:
            tensor.CopyFrom(numpy_helper.from_array(new, tensor.name))
            changed += 1
    return changed


def to_qdq(model: onnx.ModelProto, specs: list[dict[str, Any]], seed: int, work: Path) -> onnx.ModelProto:
    """int8 QDQ (static, per-channel) from onnxruntime.quantization with a seeded calibration reader."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([feeds_for(specs, seed=seed + i) for i in range(8)])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.batches, None)

    src, dst = work / "float.onnx", work / "qdq.onnx"
    onnx.save(model, src)
    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return onnx.load(dst)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """float16 weights and compute, float32 inputs/outputs (onnxruntime.transformers' converter)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=True)


def check_finite(path: Path, specs: list[dict[str, Any]], seed: int) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for name, value in zip(
        [o.name for o in session.get_outputs()], session.run(None, feeds_for(specs, seed)), strict=True
    ):
        if not np.all(np.isfinite(value)):
            raise RuntimeError(f"output {name} is not finite on onnxruntime")


def graph_shapes(model: onnx.ModelProto) -> dict[str, list]:
    """Each graph input's and output's dims as exported (ints or symbolic names)."""

    def dims(vi: onnx.ValueInfoProto) -> list:
        return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]

    return {vi.name: dims(vi) for vi in list(model.graph.input) + list(model.graph.output)}


def export_one(entry: dict[str, Any], manifest: dict[str, Any], size: str, out: Path) -> dict[str, Any]:
    import tempfile

    import torch

    defaults = manifest["defaults"]
    arch = manifest["architectures"][entry["architecture"]]
    torch.manual_seed(entry["seed"])
    module, args, specs, outputs, axes = wrap(entry, arch, size, defaults)
    opset = defaults["opset_torchscript"]
    path = out / f"{entry['name']}.onnx"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        export_torch(module, args, raw, entry["exporter"], [s["name"] for s in specs], outputs, axes, opset)
        model = onnx.load(raw)
        randomized = randomize_floats(model, entry["seed"])
        if entry["transform"] == "qdq":
            model = to_qdq(model, specs, entry["seed"], Path(tmp))
        elif entry["transform"] == "fp16":
            model = to_fp16(model)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    check_finite(path, specs, seed=1)
    data = path.read_bytes()
    kind = arch["kind"] if entry["step"] == "forward" else "decode-step"
    print(f"{entry['name']}: exported in {time.perf_counter() - start:.1f} s", flush=True)
    return {
        "name": entry["name"],
        "file": path.name,
        "architecture": entry["architecture"],
        "source": arch["source"],
        "kind": entry["transform"] or kind,
        "exporter": entry["exporter"],
        "shapes": entry["shapes"],
        "step": entry["step"],
        "size": size,
        "seed": entry["seed"],
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "nodes": len(model.graph.node),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "randomized_tensors": randomized,
        "graph_shapes": graph_shapes(model),
        "inputs": specs,
    }


def _one_line(exc: Exception) -> str:
    """The cause of a failed export in one line (torch.export's own summary line when it has one)."""
    text = str(exc)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["full", "small"], required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out"))
    parser.add_argument("--only", action="append", help="export only this model (repeatable)")
    args = parser.parse_args(argv)
    manifest = load_manifest()
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "INDEX.json"
    index: dict[str, Any] = json.loads(index_path.read_text()) if index_path.exists() else {}
    # --only picks models by name at either size; without it, the models listed for that size.
    entries = [
        e for e in manifest["models"] if (e["name"] in args.only if args.only else args.size in e["sizes"])
    ]
    unknown = set(args.only or ()) - {e["name"] for e in manifest["models"]}
    if unknown:
        parser.error(f"not in the manifest: {', '.join(sorted(unknown))}")
    failures = 0
    for entry in entries:
        print(f"{entry['name']}: exporting", flush=True)
        try:
            record = export_one(entry, manifest, args.size, args.out)
            print(f"{entry['name']}: {record['nodes']} nodes, {record['bytes']} bytes", flush=True)
        except Exception as exc:  # one model's failure must not stop the others
            failures += 1
            reason = _one_line(exc)
            record = {
                "name": entry["name"],
                "exporter": entry["exporter"],
                "shapes": entry["shapes"],
                "error": reason,
            }
            print(f"{entry['name']}: FAILED {reason}", flush=True)
        if "file" in record and not args.out.resolve().is_relative_to(ROOT):
            record["path"] = str((args.out / record["file"]).resolve())  # corpora shared outside the repo
        index[entry["name"]] = record
        index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
    print(f"{len(entries) - failures} exported, {failures} failed; index {index_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
