"""Optional dependencies: a missing one fails where it is first needed, naming the extra that brings it.

``pip install lorekv`` installs what compression needs (torch, transformers, einops, pydantic,
pyyaml, numpy). The command line, progress bars, report figures, GGUF files and ``device_map``
placement need more; ``pyproject.toml``'s extras bring it (``lorekv[cli]``, ``lorekv[eval]``,
``lorekv[plots]``, ``lorekv[gguf]``, ``lorekv[accelerate]``, ``lorekv[suites]``, ``lorekv[all]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, *, extra: str, what: str) -> ModuleType:
    """Import ``module`` (dotted names allowed); if its package is not installed, fail in one line.

    Args:
        module: the module to import, e.g. ``"matplotlib"`` or ``"tqdm.auto"``; its top-level
            name is the package's name on PyPI.
        extra: the lorekv extra that installs it, e.g. ``"plots"``.
        what: what needs it, e.g. ``"report figures"``.

    Raises:
        ModuleNotFoundError: ``lorekv report figures: matplotlib is not installed; pip install
            'lorekv[plots]'``. A package that is installed but fails to import (a dependency of
            its own missing) raises its own error unchanged.
    """
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name not in (package, module):
            raise
        message = f"lorekv {what}: {package} is not installed; pip install 'lorekv[{extra}]'"
        raise ModuleNotFoundError(message, name=package) from None
