"""The component reference shows what the code says: defaults, types and descriptions come from the configs."""

from __future__ import annotations

import json
import re

import pytest
from docs.hook import ROOT, load_hook
from pydantic_core import PydanticUndefined

hook = load_hook()
FAMILIES = ["sampler", "scorer", "aggregator", "policy"]


def table_rows(markdown: str) -> dict[str, list[str]]:
    """``field -> cells`` of every field row in the Markdown tables of ``markdown``."""
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"^\| `(\w+)` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in re.split(r"(?<!\\)\|", match.group(2))]
    return rows


def sections(markdown: str) -> dict[str, str]:
    """``### `name` `` section text by component name (the common table under the key '')."""
    parts = re.split(r"^### `(\w+)`$", markdown, flags=re.MULTILINE)
    return {"": parts[0], **dict(zip(parts[1::2], parts[2::2], strict=True))}


def expected_default(field) -> str:
    """The default as the page must show it, from pydantic's field info (not from the schema)."""
    if field.is_required():
        return "*required*"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    return f"`{json.dumps(value, ensure_ascii=False)}`"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_is_shown_once_with_the_codes_default(family: str) -> None:
    registry = hook.registries()[family]
    base = hook.family_base(registry)
    page = sections(hook.render_family(family))
    assert set(page) == {"", *registry.names()}, "one section per registered component"
    common = table_rows(page[""])
    assert set(common) == set(base.model_fields) - {"name"}
    for name in registry.names():
        config = registry.config_class(name)
        own = table_rows(page[name])
        assert set(own) | set(common) == set(config.model_fields) - {"name"}
        assert not set(own) & set(common), f"{name}: a common field shown twice"
        for field, cells in {**common, **own}.items():
            info = (config if field in own else base).model_fields[field]
            assert cells[1] == expected_default(info), f"{name}.{field}: shows {cells[1]}"
            assert cells[3], f"{name}.{field}: no description (add it to the config's Attributes:)"


def test_known_values_are_rendered() -> None:
    """Spot checks a reader relies on, written independently of the hook."""
    samplers = sections(hook.render_family("sampler"))
    temperature = table_rows(samplers["temperature"])
    assert temperature["num_futures"][:3] == ["int", "`4`", "≥ 1"]
    assert temperature["temperature"][:3] == ["float", "`1.0`", "> 0.0"]
    assert table_rows(samplers["prompt_window"])["window"][:2] == ['int or `"all"`', "`32`"]
    assert table_rows(samplers["lookahead"])["draft_budget"][1] == "*required*"
    assert table_rows(sections(hook.render_family("policy"))["per_layer"])["schedule"][:2] == [
        '`"pyramid"` or `"adaptive"`', '`"pyramid"`'
    ]  # fmt: skip
    assert "`snapkv(budget, window=32, pool_kernel=7)`" in hook.render_presets()


def test_a_changed_default_changes_the_page() -> None:
    """The page is derived from the config class: a subclass with another default renders it."""
    from lorekv.samplers import TemperatureConfig

    class Changed(TemperatureConfig):
        """Attributes:
        num_futures: M.
        """

        num_futures: int = 7

    assert table_rows(hook.field_table(Changed, ["num_futures"]))["num_futures"][1] == "`7`"


def test_the_page_writes_no_defaults_by_hand() -> None:
    source = (ROOT / "docs/reference/components.md").read_text()
    for family in FAMILIES:
        assert f"<!-- lorekv:components {family} -->" in source
    assert "<!-- lorekv:presets -->" in source
    assert "| default |" not in source, "a hand-written defaults table: use the generated ones"
    rendered = hook.on_page_markdown(source)
    assert "<!-- lorekv:" not in rendered and "### `projected_loo`" in rendered


def test_the_command_line_reference_is_generated_from_the_commands() -> None:
    source = (ROOT / "docs/reference/cli.md").read_text()
    assert "| default |" not in source, "a hand-written options table: use <!-- lorekv:cli COMMAND -->"
    commands = hook.cli_commands()
    assert set(re.findall(r"<!-- lorekv:cli ([\w-]+) -->", source)) == set(commands), "every command, once"
    demo = hook.render_command("demo")
    length = next(p for p in commands["demo"].params if p.name == "length")
    assert f"| `--length` | `{length.default}` |" in demo
    assert "| `--chat` / `--no-chat` | `--chat` |" in hook.render_command("generate")
    assert "| `--prompt-file` | *required* |" in hook.render_command("generate")
    assert "| `TARGETS`... | *required* |" in hook.render_command("eval")


def test_every_preset_names_its_paper_and_its_docstring_cites_it() -> None:
    """``PAPERS`` covers exactly the registered presets, each paper is cited where the preset is
    documented, and the rendered table shows it."""
    import inspect

    from lorekv.presets import PAPERS, PRESETS

    assert list(PAPERS) == list(PRESETS)
    table = {line.split(" | ")[0].strip("| `"): line for line in hook.render_presets().splitlines()[2:]}
    for name, url in PAPERS.items():
        if url is not None:
            assert url in inspect.getdoc(PRESETS[name]), name
            assert table[name].endswith(f"| [{url.rsplit('/', 1)[1]}]({url}) |"), table[name]
        else:
            assert table[name].endswith("| — |"), table[name]
