"""The docs name only things that exist: ``Class.attribute`` mentions and cited Markdown files.

A rename in the code (``PositionedCache.expanded`` became ``branches``) or a file that was never
in the repository (a ``DESIGN.md``) leaves the prose pointing at nothing; nothing else fails then.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from functools import cache
from pathlib import Path

from docs.blocks import ROOT

import lorekv

MENTION = re.compile(r"`~?(?:[a-z_]+\.)*([A-Z]\w*)\.(\w+)")
MARKDOWN_FILE = re.compile(r"[\w./-]*[\w-]\.md\b")
WRITTEN = {"report.md", "leaderboard.md"}  # files the code writes (a report, a leaderboard), not ones it cites


def sources() -> list[Path]:
    return [*sorted((ROOT / "lorekv").rglob("*.py")), *sorted((ROOT / "tools").glob("*.py"))]


def prose() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md")), *sources()]


@cache
def classes() -> dict[str, type]:
    """Every class defined in lorekv, by name (the first found when two share one).

    A module whose optional dependency is not installed (an extra) is left out, and so are the
    mentions of its classes.
    """
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(lorekv.__path__, "lorekv."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as error:
            if error.name and error.name.split(".")[0] == "lorekv":
                raise
            continue
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__.startswith("lorekv"):
                found.setdefault(name, value)
    return found


def instance_attributes(cls: type) -> set[str]:
    """Names assigned as ``self.name = ...`` in the class's own methods."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    return {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }


def has(cls: type, name: str) -> bool:
    """Whether ``cls`` has ``name``: a class attribute, a field (dataclass, pydantic) or set in a method."""
    if hasattr(cls, name) or name in getattr(cls, "model_fields", {}):
        return True
    return any(name in getattr(k, "__annotations__", {}) or name in instance_attributes(k) for k in cls.__mro__)


def test_every_class_attribute_the_docs_name_exists() -> None:
    missing, checked = [], 0
    for path in prose():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for owner, name in MENTION.findall(line):
                if owner in classes():
                    checked += 1
                    if not has(classes()[owner], name):
                        missing.append(f"{path.relative_to(ROOT)}:{number}: {owner}.{name}")
    assert checked >= 40, "the docs name many attributes: the pattern still finds them"
    assert not missing, "named but not in the code:\n" + "\n".join(missing)


def test_the_checker_sees_a_rename() -> None:
    from lorekv.hf.cache import PositionedCache, PositionedLayer

    assert has(PositionedCache, "branches") and not has(PositionedCache, "expanded")
    assert has(PositionedLayer, "window"), "an attribute set in __init__ counts"
    assert MENTION.findall("over `PositionedCache.expanded(M)` and `~lorekv.hf.CompressionStats.held`") == [
        ("PositionedCache", "expanded"),
        ("CompressionStats", "held"),
    ]


def test_every_markdown_file_the_code_cites_exists() -> None:
    missing = []
    for path in sources():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for cited in MARKDOWN_FILE.findall(line):
                if cited not in WRITTEN and not any((base / cited).exists() for base in (ROOT, ROOT / "docs")):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)
