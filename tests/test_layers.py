"""The layers only import downwards, and no module uses another module's private names.

Layer order, bottom first: base < egraph < rules, extract (which may use each other) < lowering
< kernels (with kernels.cuda) < the top package (API, CLI, Session, commands). Every import
statement of every module is read from its source, function-local ones included, with relative
imports resolved and ``importlib.import_module("...")`` strings counted as imports, so a lazy
import cannot hide a back-edge.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = "onnxsat"
LAYERS = {
    "onnxsat.base": 0,
    "onnxsat.egraph": 1,
    "onnxsat.rules": 2,
    "onnxsat.extract": 2,
    "onnxsat.lowering": 3,
    "onnxsat.kernels": 4,
}
TOP_LAYER = 5
LAYER_NAMES = {0: "base", 1: "egraph", 2: "rules/extract", 3: "lowering", 4: "kernels", 5: "top package"}


def package_dirs() -> dict[str, Path]:
    """Import package -> folder, from pyproject's package-dir (a package without an entry is a
    subfolder of its parent's folder)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: ROOT / folder for name, folder in config["package-dir"].items()}
    dirs = {}
    for name in config["packages"]:
        if name in mapped:
            dirs[name] = mapped[name]
        else:
            parent, _, leaf = name.rpartition(".")
            dirs[name] = dirs[parent] / leaf
    return dirs


def project_modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    modules: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


MODULES = project_modules()


def layer(module: str) -> int:
    """The layer of a project module (the longest matching subpackage; otherwise the top)."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return TOP_LAYER


@dataclass(frozen=True)
class Import:
    """One imported module (and, for ``from m import name``, the name), with its line."""

    module: str
    name: str | None
    line: int


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(module: str, path: Path) -> tuple[list[Import], list[tuple[str, int]]]:
    """All imports of one module, and its attribute uses ``alias._name`` of imported project modules."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.stem == "__init__"
    found: list[Import] = []
    module_aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(alias.name, None, node.lineno))
                if alias.asname:
                    module_aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    found.append(Import(submodule, None, node.lineno))
                    module_aliases[alias.asname or alias.name] = submodule
                else:
                    found.append(Import(source, alias.name, node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append(Import(arg.value, None, node.lineno))
    private_uses = [
        (f"{module_aliases[node.value.id]}.{node.attr}", node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in module_aliases
        and module_aliases[node.value.id] in MODULES
        and _is_private(node.attr)
    ]
    return [i for i in found if i.module == TOP or i.module.startswith(TOP + ".")], private_uses


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _target(imp: Import) -> str:
    """The module an import depends on: ``from onnxsat import cli`` depends on onnxsat.cli."""
    return imp.module


def back_edges() -> list[str]:
    edges = []
    for module, path in MODULES.items():
        for imp in imports_of(module, path)[0]:
            target = _target(imp)
            if layer(target) > layer(module):
                what = f"{target}.{imp.name}" if imp.name else target
                edges.append(
                    f"{path.relative_to(ROOT)}:{imp.line}: {module} ({LAYER_NAMES[layer(module)]}) imports"
                    f" {what} ({LAYER_NAMES[layer(target)]})"
                )
    return edges


def private_imports() -> list[str]:
    found = []
    for module, path in MODULES.items():
        imports, attribute_uses = imports_of(module, path)
        where = path.relative_to(ROOT)
        for imp in imports:
            if imp.module != module and (
                (imp.name and _is_private(imp.name)) or any(_is_private(p) for p in imp.module.split("."))
            ):
                found.append(f"{where}:{imp.line}: {module} imports {imp.module}.{imp.name or ''}".rstrip("."))
        for name, line in attribute_uses:
            if name.rpartition(".")[0] != module:
                found.append(f"{where}:{line}: {module} uses {name}")
    return found


def test_the_checker_sees_the_package() -> None:
    """The walk finds every subpackage (a renamed folder must not silently empty the check)."""
    packages = {m.rpartition(".")[0] if not MODULES[m].stem == "__init__" else m for m in MODULES}
    assert set(LAYERS) <= packages
    assert len(MODULES) > 100


def test_no_import_runs_against_the_layer_order() -> None:
    edges = back_edges()
    assert not edges, "imports against the layer order:\n" + "\n".join(edges)


def test_no_module_imports_another_modules_private_names() -> None:
    found = private_imports()
    assert not found, "private names used across modules:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from onnxsat.pipeline import optimize\n", ["onnxsat.pipeline.optimize"]),
        ("def f():\n    from ..verification import make_inputs\n", ["onnxsat.verification.make_inputs"]),
        ("import importlib\nimportlib.import_module('onnxsat.cli')\n", ["onnxsat.cli"]),
        ("from onnxsat import cli\n", ["onnxsat.cli"]),
    ],
)
def test_the_reader_finds_lazy_relative_and_string_imports(tmp_path: Path, source: str, expected: list[str]) -> None:
    """A module of the extract layer with these lines has exactly these upward imports."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    imports, _ = imports_of("onnxsat.extract.probe", path)
    seen = [f"{i.module}.{i.name}" if i.name else i.module for i in imports]
    assert seen == expected
    assert all(layer(_target(i)) > layer("onnxsat.extract.probe") for i in imports)


def test_the_reader_finds_private_attribute_use(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text("from onnxsat import pipeline\npipeline._rewrite(1)\npipeline.optimize(2)\n")
    _, uses = imports_of("onnxsat.probe", path)
    assert uses == [("onnxsat.pipeline._rewrite", 2)]
