"""`mkdocs build --strict` passes, and the built pages hold what the docs promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from docs.hook import ROOT


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr

    home = (site / "index.html").read_text()
    assert '<pre class="mermaid">' in home, "the pipeline diagram is a mermaid block"
    assert "Pipeline.from_config" in re.sub(r"<[^>]+>", "", home), "the short example is on the home page"
    components = (site / "reference/components/index.html").read_text()
    row = re.search(r"<td><code>num_futures</code></td>\s*<td>int</td>\s*<td><code>(\d+)</code></td>", components)
    assert row, "the temperature sampler's num_futures row is rendered"
    from lorekv.samplers import TemperatureConfig

    assert int(row.group(1)) == TemperatureConfig.model_fields["num_futures"].default
    api = (site / "reference/api/index.html").read_text()
    assert 'id="lorekv.pipeline.Pipeline"' in api and "compress" in api
    grid = (site / "tutorials/ablations/index.html").read_text()
    assert "smollm2_ablations" in grid and "lore_kv[M=1]" in grid, "the grid file is included as it is"
