"""``transformers.pipeline("lorekv-text-generation")`` after ``import lorekv``, in either import order.

kvpress registers its pipeline on ``import kvpress``, which imports transformers. lorekv cannot:
its contracts and component families import without transformers (``import lorekv.scorers``
runs ``lorekv/__init__.py`` too). So ``import lorekv`` registers the text pipeline only when
transformers' pipelines module is loaded: at once if it already is, else the moment it finishes
loading (a one-shot import hook that wraps that one module's loader). Until then nothing of
transformers is imported. ``lorekv.register_text_generation()`` remains the explicit call.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

TARGET = "transformers.pipelines"
"""The module whose ``PIPELINE_REGISTRY`` ``transformers.pipeline`` looks tasks up in."""

PIPELINE_MODULE = "lorekv.text_generation"
"""lorekv's module of the pipeline class; importing it registers the pipeline."""


def register_now() -> None:
    """Register the text pipeline; a failure warns (naming the explicit call) rather than breaking
    the user's import of transformers.

    When transformers' pipelines load because :mod:`lorekv.text_generation` itself imports them,
    that module is mid-import here: it registers as its own last step, so nothing is done now.
    """
    module = sys.modules.get(PIPELINE_MODULE)
    if module is not None and not hasattr(module, "register"):
        return
    try:
        from lorekv.text_generation import register

        register()
    except Exception as error:  # noqa: BLE001 - any failure must leave transformers importable
        warnings.warn(
            f"lorekv could not register the 'lorekv-text-generation' pipeline ({error!r}); "
            "call lorekv.register_text_generation() to see the error",
            RuntimeWarning,
            stacklevel=2,
        )


class _RegisterAfterPipelines(importlib.abc.MetaPathFinder):
    """Finds ``transformers.pipelines`` through the other finders, then runs :func:`register_now`
    once its module has executed. Removes itself on first use."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            register_now()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Register now if transformers' pipelines are loaded, else when they load (idempotent)."""
    if TARGET in sys.modules:
        register_now()
    elif not any(isinstance(finder, _RegisterAfterPipelines) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterPipelines())


__all__ = ["PIPELINE_MODULE", "TARGET", "install", "register_now"]
