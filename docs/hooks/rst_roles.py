"""Griffe extension for the API page: Sphinx roles in docstrings become Markdown code.

lorekv's docstrings are Google style but cite other objects with Sphinx roles
(``:class:`~lorekv.pipeline.PipelineConfig```, ``:meth:`compress```), which read well in
``help()`` and in an editor. mkdocstrings renders docstrings as Markdown, where a role would show
literally; this extension rewrites each role as Sphinx would display it, in code: the target's
last component when it starts with ``~``, the explicit title of ``title <target>``, and ``()``
after a function or method. Loaded by mkdocstrings-python (``extensions`` in ``mkdocs.yml``);
``tests/docs/test_site.py`` checks that the built API page shows no role.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|data|attr|mod|obj|exc|const|type):`([^`]+)`")
CALLABLE = {"func", "meth"}


def _shown(kind: str, target: str) -> str:
    """The text Sphinx shows for ``:kind:`target```."""
    titled = re.fullmatch(r"(.+?)\s*<([^>]+)>", target)
    if titled:
        return titled.group(1)
    text = target.split(".")[-1] if target.startswith("~") else target
    text = text.lstrip("~")
    return f"{text}()" if kind in CALLABLE and not text.endswith(")") else text


def roles_to_markdown(text: str) -> str:
    """``text`` with every Sphinx role replaced by inline code of what Sphinx would show."""
    return ROLE.sub(lambda m: f"`{_shown(m.group(1), m.group(2))}`", text)


class RstRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the object tree is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = roles_to_markdown(obj.docstring.value)
