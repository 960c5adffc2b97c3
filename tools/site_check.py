"""The documentation site as a reader sees it: built, served on localhost, opened in headless Chromium.

Builds the site (``mkdocs build --strict``), serves it, and for each page checked has Chromium
render it (``--dump-dom``: the DOM after its scripts ran) and take a screenshot. It checks that
the leaderboard page renders its tables and that the browser fetched each of its figures (the
server answered 200, or 304 to the second look), and that the navigation lists at most ``--max-nav``
entries under Benchmarks. Prints one line per check; exits 1 if any fails.

    apt-get install chromium        # Debian's build; the check starts it with --headless
    python tools/site_check.py --screenshots site-check/

tests/docs/test_browser.py runs it when /usr/bin/chromium exists.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--virtual-time-budget=5000",
]  # fmt: skip
"""Headless, and nothing that reaches for the network behind the page's back."""


class _Server(http.server.ThreadingHTTPServer):
    """Serves a folder and records (path, status) of every request."""

    def __init__(self, folder: Path) -> None:
        self.requests: list[tuple[str, int]] = []
        handler = functools.partial(_Handler, directory=str(folder))
        super().__init__(("127.0.0.1", 0), handler)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.server.requests.append((self.path.split("?")[0], int(code)))  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    """An element of the rendered DOM: its tag, attributes, children and own text."""

    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: str = ""

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()

    def all_text(self) -> str:
        return " ".join(" ".join(n.text for n in self.walk()).split())


class _Tree(HTMLParser):
    """The DOM Chromium dumps, as a tree of :class:`Node` (void elements have no end tag)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self._open[-1].children.append(node)
        if tag not in VOID:
            self._open.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].text += data


def parse(html: str) -> Node:
    tree = _Tree()
    tree.feed(html)
    return tree.root


def section_entries(root: Node, title: str) -> int | None:
    """How many entries the navigation lists directly under the section ``title`` (None: no such section)."""
    labels = {n.attrs["id"]: n.all_text() for n in root.walk() if n.tag == "label" and "id" in n.attrs}
    for nav in root.walk():
        if nav.tag == "nav" and labels.get(nav.attrs.get("aria-labelledby", "")) == title:
            lists = [c for c in nav.children if c.tag == "ul" and "md-nav__list" in c.classes()]
            if lists:
                return sum(1 for c in lists[0].children if c.tag == "li" and "md-nav__item" in c.classes())
    return None


def render(chromium: str, url: str, screenshot: Path | None) -> str:
    """The DOM of ``url`` after Chromium ran its scripts; a screenshot as well when asked."""
    with tempfile.TemporaryDirectory() as profile:
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [chromium, *flags, "--window-size=1400,2400", f"--screenshot={screenshot}", url],
                capture_output=True, timeout=120, check=True,
            )  # fmt: skip
        done = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or "<html" not in done.stdout:
        raise RuntimeError(f"chromium could not render {url}: {done.stderr[-1000:]}")
    return done.stdout


def build_site(folder: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT, check=True, capture_output=True, env=env, timeout=600,
    )  # fmt: skip


def check(site: Path, chromium: str, *, max_nav: int, screenshots: Path | None) -> list[tuple[bool, str]]:
    """(passed, description) of every check on the built ``site``."""
    server = _Server(site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    results: list[tuple[bool, str]] = []
    try:
        page = "leaderboard/leaderboard/"
        shot = screenshots / "leaderboard.png" if screenshots else None
        root = parse(render(chromium, base + page, shot))
        content = next(n for n in root.walk() if n.tag == "article" and "md-content__inner" in n.classes())
        tables = sum(1 for n in content.walk() if n.tag == "table")
        results.append((tables >= 2, f"{page}: {tables} tables rendered (at least 2)"))
        figures = [
            n.attrs.get("src", "") for n in content.walk() if n.tag == "img" and n.attrs.get("src", "").endswith(".png")
        ]
        results.append((len(figures) >= 1, f"{page}: {len(figures)} figures in the page (at least 1)"))
        for src in figures:
            path = "/" + re.sub(r"^(\.\./)+", "", (Path("/" + page) / src).as_posix()).lstrip("/")
            path = os.path.normpath(path)
            fetched = [code for requested, code in server.requests if os.path.normpath(requested) == path]
            results.append(
                (200 in fetched and set(fetched) <= {200, 304}, f"{path}: fetched by the browser, answers {fetched}")
            )
        entries = section_entries(root, "Benchmarks")
        results.append(
            (
                entries is not None and entries <= max_nav,
                f"navigation: {entries} entries under Benchmarks (at most {max_nav})",
            )
        )
        if shot is not None:
            results.append((shot.stat().st_size > 20_000, f"{shot}: screenshot of {shot.stat().st_size} bytes"))
    finally:
        server.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="An already built site (default: build one in a temporary folder).")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--max-nav", type=int, default=10, help="Most entries allowed under Benchmarks.")
    parser.add_argument("--screenshots", type=Path, help="Folder for the screenshots (default: none).")
    args = parser.parse_args(argv)
    if not Path(args.chromium).exists():
        parser.error(f"--chromium: {args.chromium} does not exist; install Debian's chromium or pass its path")
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            build_site(site)
        results = check(site, args.chromium, max_nav=args.max_nav, screenshots=args.screenshots)
    for passed, text in results:
        print(("ok   " if passed else "FAIL ") + text)
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
