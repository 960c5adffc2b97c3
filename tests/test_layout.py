"""The architecture as imports: contracts and the four families never touch transformers or the
binding; only ``lorekv.hf``, ``lorekv.models`` and ``lorekv.text_generation`` (a transformers pipeline
class) import transformers; arrows point down; no import cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import lorekv

PACKAGE = Path(lorekv.__file__).parent
CONTRACTS = ("registry", "trajectories", "scores", "validation", "token_rules", "compiling", "tensorfiles")
FAMILIES = ("samplers", "scorers", "aggregators", "policies")
BINDING = ("hf", "models")
# The text pipeline is a transformers Pipeline subclass that builds a lorekv Pipeline: it needs both.
TRANSFORMERS_USERS = (*BINDING, "text_generation")
# What each layer may import from lorekv (besides itself); everything else is an upward arrow.
ALLOWED = {
    "contracts": {"contracts"},
    "families": {"contracts", "families"},
    "hf": {"contracts", "hf"},
    "models": {"models"},
    "pipeline": {"contracts", "families", "hf", "pipeline"},
    "presets": {"pipeline", "presets"},
    # Compression while generating: a pipeline (and its presets) with a buffer, run by the binding.
    "schedule": {"contracts", "families", "hf", "pipeline", "presets", "schedule"},
    "runfiles": {"contracts", "runfiles"},
    "text_generation": {"contracts", "families", "hf", "models", "pipeline", "presets", "schedule", "text_generation"},
    # Registers the text pipeline when transformers' pipelines load; imports nothing at import time.
    "autoregister": {"text_generation", "autoregister"},
    # Fits a surrogate on a teacher pipeline's scores over calibration texts (the task families, suite files).
    "distill": {"contracts", "families", "hf", "models", "pipeline", "presets", "runfiles", "eval", "distill"},
    "eval": {"contracts", "families", "hf", "models", "pipeline", "presets", "schedule", "runfiles", "eval"},
    "cost": {"contracts", "families", "hf", "models", "pipeline", "presets", "runfiles", "eval", "cost"},
    "cli": {
        "contracts",
        "families",
        "hf",
        "models",
        "pipeline",
        "presets",
        "schedule",
        "runfiles",
        "text_generation",
        "eval",
        "cost",
        "distill",
        "cli",
    },
    "root": {
        "contracts",
        "families",
        "hf",
        "models",
        "pipeline",
        "presets",
        "schedule",
        "text_generation",
        "eval",
        "cost",
        "autoregister",
    },  # fmt: skip
    "extras": set(),
}
# Leaves every layer may import: lorekv.extras (optional dependencies) imports nothing of lorekv.
LEAVES = {"extras"}


def layer_of(module: str) -> str:
    """The architectural layer of a dotted ``lorekv...`` module name."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    top = parts[1]
    if top in CONTRACTS:
        return "contracts"
    if top in FAMILIES:
        return "families"
    if top in LEAVES:
        return top
    if top == "__main__":  # ``python -m lorekv``: the command line's entry point
        return "cli"
    return top


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def runtime_nodes(node: ast.AST):
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            continue
        yield child
        yield from runtime_nodes(child)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports at run time, at any depth (function-level imports included)."""
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "lorekv")
    return found


def module_names() -> set[str]:
    return {name for name, _ in modules()}


def edges(name: str, path: Path, known: set[str]) -> set[str]:
    """The lorekv modules ``name`` runs at import or call time: ``from a.b import c`` names the
    module ``a.b.c`` when there is one (a submodule), else ``a.b`` (a name defined there)."""
    out = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            for alias in node.names:
                out.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module)
    return out - {name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_import_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """No module imports, directly or through others, a module that imports it back, lazy
    (function-level) imports included: the house is a tree, whatever runs first."""
    known = module_names()
    graph = {name: edges(name, path, known) for name, path in modules()}
    assert not import_cycles(graph), import_cycles(graph)


def package_of(module: str) -> str:
    """The package a module belongs to: itself for a package, else its parent."""
    return module if (PACKAGE.parent / module.replace(".", "/")).is_dir() else module.rsplit(".", 1)[0]


def test_no_private_names_imported_across_packages() -> None:
    """A module uses another package's private name (``_x``) nowhere: what two packages share is public."""
    found = []
    for name, path in modules():
        for node in runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lorekv"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and package_of(node.module) != package_of(name):
                    found.append(f"{name} imports {private} from {node.module}")
    assert not found, found


def test_every_module_has_a_layer() -> None:
    unknown = {name for name, _ in modules() if layer_of(name) not in ALLOWED}
    assert not unknown, f"modules outside the architecture: {unknown}"


@pytest.mark.parametrize("name,path", modules(), ids=[name for name, _ in modules()])
def test_imports_point_down(name: str, path: Path) -> None:
    layer = layer_of(name)
    found = imports(path)
    if layer not in TRANSFORMERS_USERS:
        assert not {m for m in found if m.split(".")[0] == "transformers"}, f"{name} imports transformers"
    upward = {
        m for m in found
        if m.startswith("lorekv.") and layer_of(m) not in ALLOWED[layer] | LEAVES and m != "lorekv"
    }  # fmt: skip
    assert not upward, f"{name} ({layer}) imports {sorted(upward)}"


def test_contracts_and_families_import_with_transformers_blocked() -> None:
    """Importing every contract and family module works when transformers cannot be imported."""
    names = [name for name, _ in modules() if layer_of(name) in ("contracts", "families")]
    script = (
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "import importlib\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "assert not any(m == 'lorekv.hf' or m.startswith('lorekv.hf.') for m in sys.modules), 'binding imported'\n"
        f"print(len({names!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(names) >= 20


def test_public_api() -> None:
    from lorekv import Pipeline, PipelineConfig, decode, generate_full, load, preset
    from lorekv.hf.decoding import decode as binding_decode
    from lorekv.models.loading import load as models_load
    from lorekv.pipeline import Pipeline as pipeline_class

    assert Pipeline is pipeline_class and decode is binding_decode and load is models_load
    assert isinstance(preset("lore_kv", 64), PipelineConfig) and callable(generate_full)
    with pytest.raises(AttributeError, match="no_such_name"):
        lorekv.no_such_name  # noqa: B018


def test_lazy_exports_match_all() -> None:
    assert sorted(lorekv.__all__) == sorted(lorekv._EXPORTS)
