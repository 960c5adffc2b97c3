"""`mkdocs build --strict` passes, and the built pages hold what the docs promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from docs.hook import ROOT, load_module


@dataclass(frozen=True)
class Site:
    """One strict build of the site, shared by the tests of this module (a build takes seconds)."""

    root: Path
    stderr: str

    def page(self, path: str) -> str:
        return (self.root / path).read_text()

    def pages(self) -> dict[Path, str]:
        return {path: path.read_text() for path in sorted(self.root.rglob("*.html"))}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return Site(root, result.stderr)


def test_the_site_builds_strictly(site: Site) -> None:
    assert "WARNING" not in site.stderr
    home = site.page("index.html")
    assert '<pre class="mermaid">' in home, "the pipeline diagram is a mermaid block"
    assert "Pipeline.from_config" in re.sub(r"<[^>]+>", "", home), "the short example is on the home page"
    components = site.page("reference/components/index.html")
    temperature = components[components.index('id="temperature"') :]
    row = re.search(r"<td><code>num_futures</code></td>\s*<td>int</td>\s*<td><code>(\d+)</code></td>", temperature)
    assert row, "the temperature sampler's num_futures row is rendered"
    from lorekv.samplers import TemperatureConfig

    assert int(row.group(1)) == TemperatureConfig.model_fields["num_futures"].default
    api = site.page("reference/api/index.html")
    assert 'id="lorekv.pipeline.Pipeline"' in api and "compress" in api
    grid = site.page("tutorials/ablations/index.html")
    assert "smollm2_ablations" in grid and "lore_kv[M=1]" in grid, "the grid file is included as it is"


SCRIPT = re.compile(r"<script\b([^>]*)>", re.IGNORECASE)
SRC = re.compile(r"""\bsrc=["']([^"']+)["']""")
DIAGRAM = '<pre class="mermaid">'


def scripts(html: str) -> list[tuple[str, str]]:
    """``(src, attributes)`` of every external ``<script>`` of a page."""
    return [(src.group(1), attrs) for attrs in SCRIPT.findall(html) if (src := SRC.search(attrs))]


def local_file(site: Site, page: Path, src: str) -> Path:
    """The file of the site that a page's relative (or, on 404.html, root-relative) ``src`` names."""
    return site.root / urlsplit(urljoin(page.relative_to(site.root).as_posix(), src)).path.lstrip("/")


INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.IGNORECASE | re.DOTALL)


def test_no_page_loads_a_script_from_another_host(site: Site) -> None:
    """Offline, a remote script never arrives: every script the pages load is in the site."""
    for path, html in site.pages().items():
        for body in INLINE_SCRIPT.findall(html):
            assert not re.search(r"https?:|//\w", body), f"{path}: an inline script names a remote address"
        for src, _ in scripts(html):
            assert not urlsplit(src).scheme and not src.startswith("//"), f"{path}: remote script {src}"
            assert local_file(site, path, src).is_file(), f"{path}: script {src} is not in the built site"


def test_every_diagram_renders_offline(site: Site) -> None:
    """Each page with a mermaid block loads the site's own mermaid, before Material would fetch one.

    Material's bundle fetches mermaid from a CDN only when no global ``mermaid`` exists by the
    time the page has loaded; the vendored script, loaded synchronously on the same page,
    defines it, and its major version is the one Material asks the CDN for.
    """
    with_diagrams = {path: html for path, html in site.pages().items() if DIAGRAM in html}
    assert len(with_diagrams) >= 4, "the home page and the concepts pages draw diagrams"
    assert site.root / "index.html" in with_diagrams
    for path, html in with_diagrams.items():
        mermaid = [(src, attrs) for src, attrs in scripts(html) if "mermaid" in src.rsplit("/", 1)[-1]]
        assert len(mermaid) == 1, f"{path}: one local mermaid script, got {mermaid}"
        src, attrs = mermaid[0]
        assert not re.search(r"\b(async|defer|type=.module)", attrs), f"{path}: {src} must run before the page loads"
        code = local_file(site, path, src).read_text()
        assert 'globalThis["mermaid"]' in code, f"{src} defines the global Material looks for"
    bundle = next((site.root / "assets/javascripts").glob("bundle.*.min.js")).read_text()
    wanted = re.search(r"mermaid@(\d+)", bundle)
    shipped = re.search(r'\{version:"(\d+)\.\d+\.\d+"\}', code)
    assert wanted and shipped and wanted.group(1) == shipped.group(1), "the vendored mermaid is the major Material uses"


ROLE_SHOWN = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|obj|exc|const|type):(?:<code>|`)")


def test_the_api_page_shows_no_sphinx_role(site: Site) -> None:
    """Docstrings cite objects with Sphinx roles; the API page shows them as code, not as markup."""
    api = site.page("reference/api/index.html")
    assert not ROLE_SHOWN.findall(api), sorted(set(re.findall(r":\w+:<code>[^<]*", api)))[:10]
    assert "<code>PipelineConfig</code>" in api, "a role's target is still shown, in code"
    compress = re.escape('href="#lorekv.pipeline.Pipeline.compress"><code>compress()</code></a>')
    assert re.search(r'<a class="autorefs[^>]*' + compress, api), "a role whose target is on the page links to it"
    for path, html in site.pages().items():
        assert not ROLE_SHOWN.findall(html), f"{path} shows a Sphinx role literally"


def test_roles_read_as_sphinx_shows_them() -> None:
    roles = load_module("docs/hooks/rst_roles.py").roles_to_markdown
    assert roles("see :class:`~lorekv.pipeline.PipelineConfig`.") == "see `PipelineConfig`."
    assert roles(":func:`lorekv.hf.decode` and :meth:`compress`") == "`lorekv.hf.decode()` and `compress()`"
    assert roles(":data:`the presets <lorekv.presets.PRESETS>`, :mod:`lorekv.eval`") == "`the presets`, `lorekv.eval`"
    assert roles("``x`` and :math:`n`") == "``x`` and :math:`n`", "other markup is left as it is"
    linked = roles(":meth:`~lorekv.pipeline.Pipeline.compress` or :class:`Other`", {"lorekv.x": ""}.get)
    assert linked == "`compress()` or `Other`", "only what the resolver resolves is linked"
    full = {"lorekv.pipeline.Pipeline.compress": "lorekv.pipeline.Pipeline.compress"}.get
    assert roles("see :meth:`~lorekv.pipeline.Pipeline.compress`", full) == (
        'see <autoref identifier="lorekv.pipeline.Pipeline.compress" optional><code>compress()</code></autoref>'
    )
