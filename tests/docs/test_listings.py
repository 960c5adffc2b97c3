"""Listings the docs show of ``lorekv components`` and ``lorekv presets`` are the commands' output.

A transcript written by hand goes stale the day a sampler or preset is registered; this compares
every ``console`` block of the docs that runs one of them with what the command prints now.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache

import pytest
from docs.blocks import ROOT

LISTINGS = ("components", "presets")
CONSOLE = re.compile(r"^```console\n(.*?)^```", re.MULTILINE | re.DOTALL)


def transcripts() -> list[tuple[str, str, str]]:
    """(page, command, shown output) for every ``$ lorekv <listing>`` in a console block of the docs."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in CONSOLE.findall(page.read_text()):
            for part in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
                command, _, output = part.partition("\n")
                if command.strip() in (f"lorekv {name}" for name in LISTINGS):
                    found.append((str(page.relative_to(ROOT)), command.split()[1], output))
    return found


@pytest.mark.parametrize("page,command,shown", transcripts(), ids=lambda v: v if "\n" not in v else "")
def test_a_listing_in_the_docs_is_what_the_command_prints(page: str, command: str, shown: str) -> None:
    printed = output(command)
    assert shown == printed, f"{page}: `lorekv {command}` prints\n{printed}"


@cache
def output(command: str) -> str:
    """What ``lorekv <command>`` prints, in a fresh process: the registries as shipped, not as
    other tests extended them."""
    return subprocess.run(
        [sys.executable, "-m", "lorekv", command], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout


def test_the_docs_show_both_listings() -> None:
    assert {command for _, command, _ in transcripts()} == set(LISTINGS)


def test_the_home_pages_table_names_every_registered_component() -> None:
    from lorekv.aggregators import AGGREGATORS
    from lorekv.policies import POLICIES
    from lorekv.samplers import SAMPLERS
    from lorekv.scorers import SCORERS

    rows = {}
    for line in (ROOT / "docs/index.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("sampler", "scorer", "aggregator", "policy"):
            rows[cells[0]] = set(re.findall(r"`(\w+)`", cells[2]))
    for registry in (SAMPLERS, SCORERS, AGGREGATORS, POLICIES):
        shipped = {name for name in registry.names() if registry.config_class(name).__module__.startswith("lorekv.")}
        assert rows.get(registry.family) == shipped, f"docs/index.md: the {registry.family} row"
