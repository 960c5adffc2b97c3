"""Python files of docs/ (the mkdocs hooks, the griffe extension), imported as modules for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_module(path: str) -> ModuleType:
    """The Python file at ``path`` (relative to the repository) as a module."""
    name = "lorekv_docs_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_hook() -> ModuleType:
    return load_module("docs/hooks/components.py")
