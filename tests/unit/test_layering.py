"""The import graph keeps its layers: config at the bottom, serving code beside the producer,
tools on top. Read from the source with ``ast``, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "producer", "workers")

# What each layer may import of ours (a layer always may import itself). Anything absent
# from this table (tools, local helpers, the CLI) sits on top and may import any layer.
ALLOWED = {
    "config": set(),
    "producer": {"config"},
    "workers.models": {"config"},
    "workers.protocol": {"config"},
    "workers.batcher": {"config", "workers.protocol", "workers.models"},
    "workers.runtime": {"config", "workers.protocol", "workers.models"},
    # The HTTP gateway is a producer: it reaches the fleet only through producer/, reads a
    # model's token count from its backend, and runs Batch API jobs as bulk jobs.
    "workers.gateway": {"config", "producer", "workers.models", "workers.tools"},
}
LAYERS = sorted(ALLOWED, key=len, reverse=True)


def layer_of(module: str) -> str | None:
    """The most specific layer ``module`` belongs to; None for the top (tools, CLI)."""
    return next(
        (layer for layer in LAYERS if module == layer or module.startswith(f"{layer}.")), None
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(source: str) -> set[str]:
    """Every module of ours that ``source`` imports (``from pkg import module`` counts the
    module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if is_module(submodule) else node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def violations(module: str, imported: set[str]) -> list[str]:
    """``module``'s imports that reach outside what its layer may import."""
    layer = layer_of(module)
    if layer is None:
        return []
    allowed = ALLOWED[layer] | {layer}
    return sorted(
        f"{module} imports {name}"
        for name in imported
        if not any(name == ok or name.startswith(f"{ok}.") for ok in allowed)
    )


def test_no_module_imports_outside_its_layer() -> None:
    """config imports nothing of ours; the producer only config; serving code (protocol,
    batcher, runtime, models) never the producer, tools, local helpers or CLI; the batcher
    and the worker runtime never each other; the gateway only config, the producer, models
    and tools."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += violations(module_name(path), imports_of(path.read_text()))
    assert found == []


def test_the_check_sees_an_import_inside_a_function() -> None:
    """A batcher module that imports the worker runtime, even lazily, is a violation."""
    source = "def plan():\n    from workers.runtime.tasks import WorkerRuntime\n"
    assert violations("workers.batcher.policy", imports_of(source)) == [
        "workers.batcher.policy imports workers.runtime.tasks"
    ]


def test_every_module_belongs_to_a_known_place() -> None:
    """A new folder under workers/ is placed in the table (or is a top-level tool)."""
    top = {"workers.tools", "workers.local", "workers.cli", "workers"}
    for path in (ROOT / "workers").rglob("__init__.py"):
        package = module_name(path)
        assert layer_of(package) is not None or package in top, package
