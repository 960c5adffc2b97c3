"""Griffe extension for the API page: Sphinx roles in docstrings become Markdown, linked when they can be.

lorekv's docstrings are Google style but cite other objects with Sphinx roles
(``:class:`~lorekv.pipeline.PipelineConfig```, ``:meth:`compress```), which read well in
``help()`` and in an editor. mkdocstrings renders docstrings as Markdown, where a role would show
literally; this extension rewrites each role as Sphinx would display it, in code: the target's
last component when it starts with ``~``, the explicit title of ``title <target>``, and ``()``
after a function or method. A target that resolves to a lorekv object (a full path, or a name in
the docstring's scope) becomes an *optional* cross-reference, the kind mkdocstrings writes for
annotations: a link when the object is on the site, plain code otherwise, never a warning.
Loaded by mkdocstrings-python (``extensions`` in ``mkdocs.yml``); ``tests/docs/test_site.py``
checks the built API page.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
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


def _target(role_text: str) -> str:
    """The object path a role names (without ``~`` and without an explicit title)."""
    titled = re.fullmatch(r"(.+?)\s*<([^>]+)>", role_text)
    return (titled.group(2) if titled else role_text).lstrip("~").removesuffix("()")


def roles_to_markdown(text: str, resolve: Callable[[str], str | None] = lambda _: None) -> str:
    """``text`` with every Sphinx role replaced by what Sphinx would show, in code.

    ``resolve`` maps a role's target to the full path of an object, or None; a resolved role
    becomes an optional cross-reference to it.
    """

    def markdown(match: re.Match[str]) -> str:
        shown = _shown(match.group(1), match.group(2))
        identifier = resolve(_target(match.group(2)))
        if identifier is None:
            return f"`{shown}`"
        return f'<autoref identifier="{escape(identifier)}" optional><code>{escape(shown)}</code></autoref>'

    return ROLE.sub(markdown, text)


def resolver(obj: griffe.Object) -> Callable[[str], str | None]:
    """Full lorekv paths of the names a docstring of ``obj`` cites: as written, or in its scope."""

    def resolve(target: str) -> str | None:
        if target.startswith("lorekv."):
            return target
        head, _, rest = target.partition(".")
        try:
            path = obj.resolve(head)
        except griffe.NameResolutionError:
            return None
        path = f"{path}.{rest}" if rest else path
        return path if path.startswith("lorekv.") else None

    return resolve


class RstRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the object tree is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = roles_to_markdown(obj.docstring.value, resolver(obj))
