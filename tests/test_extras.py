"""The core install: compression needs none of the optional packages, and each optional part,
without its package, fails in one line naming the ``pip install 'lorekv[...]'`` that fixes it.

The subprocess tests hide packages behind ``sys.meta_path``: every finder is wrapped so that a
hidden name is not found (``import`` raises ModuleNotFoundError, ``importlib.util.find_spec``
returns None), as when the package is not installed. transformers itself imports tqdm (a
dependency of transformers 5), so tqdm is hidden once transformers is loaded: lorekv must not
import it again.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import lorekv
from lorekv.extras import require

ROOT = Path(lorekv.__file__).parent.parent
PACKAGE = ROOT / "lorekv"
OPTIONAL = (
    "matplotlib",
    "tqdm",
    "typer",
    "gguf",
    "accelerate",
    "jieba",
    "rouge",
    "rapidfuzz",
    "rouge_score",
    "datasets",
)
DEV_EXTRAS = ("test", "docs")
NOT_IN_CLI = ("hub",)  # datasets (pyarrow, pandas): only for benchmark files read from a hub

HIDE = f"""
import sys

HIDDEN = {{"matplotlib", "typer", "gguf", "accelerate"}}


class Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN.add("tqdm")
for name in [m for m in sys.modules if m.split(".")[0] == "tqdm"]:
    del sys.modules[name]


def loaded():
    return sorted({{m.split(".")[0] for m in sys.modules}} & {set(OPTIONAL)!r})
"""

CORE = """
import torch

from lorekv import Pipeline, preset

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
)
model = LlamaForCausalLM(config).eval()
ids = torch.randint(0, 61, (1, 40))
kept = {}
for name, options in (("lore_kv", {}), ("snapkv", {"window": 2})):
    compressed = Pipeline.from_config(preset(name, 4, **options)).compress(model, ids)
    kept[name] = compressed.stats.kept
print(json.dumps({"kept": kept, "loaded": loaded()}))
"""

MISSING = """
import contextlib
import io
import runpy
import tempfile
from pathlib import Path

errors = {}


def fails(key, fn):
    try:
        fn()
    except ModuleNotFoundError as error:
        errors[key] = str(error)
    else:
        errors[key] = None


def figures():
    import lorekv.eval.figures


def progress():
    from lorekv.eval.harness import _progress

    _progress(3, 0, True)


tmp = Path(tempfile.mkdtemp())
(tmp / "model.gguf").write_bytes(b"")


def gguf():
    from lorekv import load

    load(str(tmp / "model.gguf"))


def device_map():
    from lorekv import load

    load(str(tmp), device_map="cpu")


fails("figures", figures)
fails("progress", progress)
fails("gguf", gguf)
fails("device_map", device_map)
stderr = io.StringIO()
code = None
with contextlib.redirect_stderr(stderr):
    try:
        runpy.run_module("lorekv", run_name="__main__")
    except SystemExit as done:
        code = done.code
errors["cli"] = {"code": code, "stderr": stderr.getvalue()}
print(json.dumps({"errors": errors, "loaded": loaded()}))
"""


def run_hidden(body: str) -> dict:
    """Run ``body`` with the optional packages hidden; it prints one JSON object."""
    script = "import json\n" + HIDE + body
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def fix(package: str, what: str, extra: str) -> str:
    return f"lorekv {what}: {package} is not installed; pip install 'lorekv[{extra}]'"


def test_compression_without_the_optional_packages() -> None:
    """``from lorekv import Pipeline, preset`` and two compressions import none of them."""
    out = run_hidden(CORE)
    assert out["kept"] == {"lore_kv": [[4, 4], [4, 4]], "snapkv": [[4, 4], [4, 4]]}
    assert out["loaded"] == []


def test_each_optional_part_names_its_extra() -> None:
    out = run_hidden(MISSING)
    errors = out["errors"]
    assert errors["figures"] == fix("matplotlib", "report figures", "plots")
    assert errors["progress"] == fix("tqdm", "eval progress bar", "eval")
    assert errors["gguf"] == fix("gguf", "GGUF loading", "gguf")
    assert errors["device_map"] == fix("accelerate", "device_map placement", "accelerate")
    assert errors["cli"] == {"code": 2, "stderr": "error: " + fix("typer", "command line", "cli") + "\n"}
    assert out["loaded"] == []


def test_require_returns_the_module() -> None:
    assert require("json.decoder", extra="plots", what="x") is sys.modules["json.decoder"]


def test_require_names_the_extra() -> None:
    with pytest.raises(ModuleNotFoundError) as caught:
        require("lorekv_no_such_package.sub", extra="plots", what="report figures")
    assert str(caught.value) == fix("lorekv_no_such_package", "report figures", "plots")
    assert caught.value.name == "lorekv_no_such_package"


def test_require_keeps_a_broken_package_s_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed package whose own dependency is missing is not reported as the package missing."""
    (tmp_path / "lorekv_broken_package.py").write_text("import lorekv_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("lorekv_broken_package", extra="plots", what="report figures")
    assert caught.value.name == "lorekv_missing_dependency"
    assert "pip install" not in str(caught.value)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def name_of(requirement: str) -> str:
    name = requirement.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0]
    return name.strip().lower().replace("-", "_")  # the import name (rouge-score -> rouge_score)


def require_calls() -> list[tuple[str, str, str]]:
    """(file, package, extra) of every ``require("module", extra=...)`` in the package's source."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                module = node.args[0]
                extra = next(k.value for k in node.keywords if k.arg == "extra")
                assert isinstance(module, ast.Constant) and isinstance(extra, ast.Constant), f"{path.name}: literals"
                found.append((path.name, module.value.split(".")[0], extra.value))
    return found


def test_core_dependencies_leave_out_the_optional_packages() -> None:
    core = {name_of(r) for r in pyproject()["dependencies"]}
    assert core.isdisjoint(OPTIONAL), core & set(OPTIONAL)
    assert {"torch", "transformers", "einops", "pydantic", "pyyaml"} <= core


def test_every_extra_named_in_an_error_brings_the_package() -> None:
    extras = {extra: {name_of(r) for r in reqs} for extra, reqs in pyproject()["optional-dependencies"].items()}
    calls = require_calls()
    assert {package for _, package, _ in calls} == set(OPTIONAL), calls
    for where, package, extra in calls:
        assert extra in extras, f"{where}: extra {extra!r} is not in pyproject.toml"
        assert package in extras[extra], f"{where}: lorekv[{extra}] does not install {package}"
    for extra, packages in extras.items():
        if extra not in DEV_EXTRAS:
            assert packages <= extras["all"], f"lorekv[all] leaves out {packages - extras['all']}"
            left_out = packages - extras["cli"] - {p for e in NOT_IN_CLI for p in extras[e]}
            assert not left_out, f"lorekv[cli] leaves out {left_out}"


def test_console_script_is_the_guarded_entry_point() -> None:
    import importlib

    target = pyproject()["scripts"]["lorekv"]
    module, function = target.split(":")
    assert target == "lorekv.__main__:main"
    assert callable(getattr(importlib.import_module(module), function))
