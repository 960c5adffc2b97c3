"""mkdocs hook: the component and command-line references, rendered from the code.

A page writes ``<!-- lorekv:components FAMILY -->`` (``sampler``, ``scorer``, ``aggregator`` or
``policy``) and gets, in its place, the fields common to the family (its base config) and one
section per registered component: the class's summary, then a table of the config's own fields
with their type, default and allowed range taken from ``model_json_schema()`` and the
description from the ``Attributes:`` section of the config's docstring. A default is therefore
written once, in code; ``tests/docs/test_components_page.py`` checks the rendered tables
against the configs. ``<!-- lorekv:presets -->`` renders every preset's signature and paper, and
``<!-- lorekv:cli COMMAND -->`` a ``lorekv`` subcommand's arguments and options, with their
defaults and help, from the typer app.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

MARKER = re.compile(r"^<!-- lorekv:components (\w+) -->$", re.MULTILINE)
PRESETS_MARKER = "<!-- lorekv:presets -->"
CLI_MARKER = re.compile(r"^<!-- lorekv:cli ([\w-]+) -->$", re.MULTILINE)


def registries() -> dict[str, Any]:
    """The four registries by family name, every built-in component registered."""
    import lorekv.pipeline  # noqa: F401  (imports, and so registers, every built-in component)
    from lorekv.aggregators import AGGREGATORS
    from lorekv.policies import POLICIES
    from lorekv.samplers import SAMPLERS
    from lorekv.scorers import SCORERS

    return {r.family: r for r in (SAMPLERS, SCORERS, AGGREGATORS, POLICIES)}


def _rst_to_md(text: str) -> str:
    """Docstring markup to Markdown: ``x`` -> `x`, :class:`X` -> `X`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def attribute_docs(cls: type) -> dict[str, str]:
    """Field descriptions from the ``Attributes:`` sections of ``cls`` and its bases (nearest first)."""
    fields = set(getattr(cls, "model_fields", {}))
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        lines = inspect.cleandoc(klass.__doc__ or "").splitlines()
        if "Attributes:" not in lines:
            continue
        current: str | None = None
        for line in lines[lines.index("Attributes:") + 1 :]:
            match = re.match(r"^\s*(\w+): (.*)$", line)
            if match and match.group(1) in fields:
                current = match.group(1)
                if current in docs:  # a subclass already described it
                    current = None
                else:
                    docs[current] = match.group(2).strip()
            elif not line.strip():
                current = None  # a blank line ends the entry
            elif current is not None and line.startswith((" ", "\t")):
                docs[current] += " " + line.strip()
            else:
                current = None
    return {name: _rst_to_md(text) for name, text in docs.items()}


def schema_type(prop: dict[str, Any]) -> str:
    """A JSON-schema property as a short type: `int`, `float`, `"mean"` or `"max"`, `list[list[int]]`."""
    if "anyOf" in prop:
        return " or ".join(schema_type(p) for p in prop["anyOf"])
    if "const" in prop:
        return f'`"{prop["const"]}"`' if isinstance(prop["const"], str) else f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " or ".join(f'`"{v}"`' for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        return f"list[{schema_type(prop.get('items', {})).strip('`')}]"
    return {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "null": "null"}.get(kind, "any")


def schema_range(prop: dict[str, Any]) -> str:
    """The numeric bounds a schema states (`≥ 1`, `> 0`, `≤ 1`), joined; empty when none."""
    if "anyOf" in prop:
        return "; ".join(r for r in (schema_range(p) for p in prop["anyOf"]) if r)
    if prop.get("type") == "array":
        inner = schema_range(prop.get("items", {}))
        return inner if not inner or inner.startswith("items") else f"items {inner}"
    bounds = [("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")]
    return ", ".join(f"{sign} {json.dumps(prop[key])}" for key, sign in bounds if key in prop)


def default_text(schema: dict[str, Any], field: str) -> str:
    """The default as YAML/JSON writes it (`8`, `1.0`, `"mean"`, `null`), or *required*."""
    if field in schema.get("required", []):
        return "*required*"
    return f"`{json.dumps(schema['properties'][field]['default'], ensure_ascii=False)}`"


def field_table(config: type, fields: list[str]) -> str:
    """A Markdown table of ``fields`` of ``config``: type, default, bounds from the schema, description."""
    schema = config.model_json_schema()
    docs = attribute_docs(config)
    rows = ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
    for field in fields:
        prop = schema["properties"][field]
        description = docs.get(field, "").replace("|", "\\|")
        bounds = schema_range(prop)
        rows.append(
            f"| `{field}` | {schema_type(prop)} | {default_text(schema, field)} | {bounds or '—'} | {description} |"
        )
    return "\n".join(rows)


def family_base(registry: Any) -> type:
    """The family's base config: the common ancestor of its configs just below ``ComponentConfig``."""
    from lorekv.registry import ComponentConfig

    config = registry.config_class(registry.names()[0])
    return next(c for c in config.__mro__ if ComponentConfig in c.__bases__)


def summary(obj: type) -> str:
    """The first paragraph of a class docstring, as Markdown."""
    doc = inspect.cleandoc(obj.__doc__ or "")
    return _rst_to_md(" ".join(doc.split("\n\n")[0].split()))


def render_family(family: str) -> str:
    """The Markdown for one family: its common fields, then one section per registered component."""
    registry = registries()[family]
    base = family_base(registry)
    common = [f for f in base.model_fields if f != "name"]
    out = []
    if common:
        out += [f"Fields of `{base.__name__}`, which every {family} config has:", "", field_table(base, common), ""]
    for name in registry.names():
        config = registry.config_class(name)
        component = registry._lookup(name)[1]  # the registered class (no public accessor)
        module = component.__module__.rsplit(".", 1)[0]
        intro = f"`{config.__name__}`, `{component.__name__}` (`{module}`). {summary(component)}"
        out += [f"### `{name}`", "", intro, ""]
        own = [f for f in config.model_fields if f != "name" and f not in common]
        out += [field_table(config, own) if own else f"No fields beyond the common ones of `{base.__name__}`.", ""]
    return "\n".join(out)


def paper_of(name: str) -> str:
    """A preset's paper (``lorekv.presets.PAPERS``) as a Markdown link, or an em dash for none."""
    from lorekv.presets import PAPERS

    url = PAPERS[name]
    return f"[{url.rsplit('/', 1)[1]}]({url})" if url else "—"


def render_presets() -> str:
    """A table of every preset: its signature (defaults from the function itself), docstring summary and paper."""
    from lorekv.presets import PRESETS

    rows = ["| preset | signature | method | paper |", "|---|---|---|---|"]
    for name, function in PRESETS.items():
        params = inspect.signature(function).parameters.values()
        signature = "(" + ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params) + ")"
        method = summary(function).replace("|", "\\|")
        rows.append(f"| `{name}` | `{function.__name__}{signature}` | {method} | {paper_of(name)} |")
    return "\n".join(rows)


def cli_commands() -> dict[str, Any]:
    """The ``lorekv`` command's subcommands as click commands, by name."""
    import typer.main

    from lorekv.cli import app

    return dict(typer.main.get_command(app).commands)


def render_command(name: str) -> str:
    """One subcommand: its help line and a table of its arguments and options, defaults from the code."""
    command = cli_commands()[name]
    out = [" ".join((command.help or "").split()), ""]
    if not command.params:
        return "\n".join([*out, "No arguments or options."])
    out += ["| argument / option | default | |", "|---|---|---|"]
    for param in command.params:
        flags = " / ".join(f"`{flag}`" for flag in (*param.opts, *param.secondary_opts))
        if param.param_type_name == "argument":
            flags = f"`{param.name.upper()}`" + ("..." if param.nargs == -1 else "")
        if param.required:
            default = "*required*"
        elif param.default is None or param.multiple:
            default = "—"
        elif isinstance(param.default, bool) and param.secondary_opts:
            default = f"`{param.opts[0] if param.default else param.secondary_opts[0]}`"
        else:
            default = f"`{param.default}`"
        note = " ".join((getattr(param, "help", None) or "").split()).replace("|", "\\|")
        if param.multiple and "repeatable" not in note:
            note += " (repeatable)"
        out.append(f"| {flags} | {default} | {note} |")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: replace the ``lorekv:components``, ``lorekv:presets`` and ``lorekv:cli`` markers."""
    markdown = MARKER.sub(lambda m: render_family(m.group(1)), markdown)
    markdown = CLI_MARKER.sub(lambda m: render_command(m.group(1)), markdown)
    return markdown.replace(PRESETS_MARKER, render_presets()) if PRESETS_MARKER in markdown else markdown
