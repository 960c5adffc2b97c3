"""The site in a real browser: tools/site_check.py's checks in headless Chromium, where it is installed
(``apt-get install chromium``; CI's clean machine has none, and the test is skipped there)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from docs.hook import load_module

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no Chromium on this machine (apt-get install chromium)")
def test_the_leaderboard_renders_in_headless_chromium_and_the_navigation_stays_short(tmp_path: Path) -> None:
    site_check = load_module("tools/site_check.py")
    site = tmp_path / "site"
    site_check.build_site(site)
    results = site_check.check(site, CHROMIUM, max_nav=10, screenshots=tmp_path)
    failed = [text for passed, text in results if not passed]
    assert not failed, failed
    assert sum("fetched by the browser" in text for _, text in results) >= 2, results
