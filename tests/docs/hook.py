"""The mkdocs hook ``docs/hooks/components.py``, imported as a module for the tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_hook():
    spec = importlib.util.spec_from_file_location("lorekv_docs_components_hook", ROOT / "docs/hooks/components.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
