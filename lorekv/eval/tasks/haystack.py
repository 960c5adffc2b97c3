"""Haystack prose: English sentences of the Python reference manual, which ships with Python
(``pydoc_data``), so tasks need no download.

``pydoc_data`` differs between Python builds (pyenv and Debian's 3.11 ship different text), and
so do the prompts drawn from it: a sample is reproducible on one Python build.
"""

from __future__ import annotations

import re
from functools import cache
from pydoc_data.topics import topics


@cache
def haystack_sentences() -> tuple[str, ...]:
    """Prose sentences of the Python reference manual (code, grammar and tables left out)."""
    sentences: list[str] = []
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            lines = paragraph.splitlines()
            if not lines or any(line.startswith((" ", "\t")) for line in lines):
                continue
            text = " ".join(line.strip() for line in lines)
            if len(text) < 80 or re.search(r"[*=`|]{2}|::=|\*\*\*", text):
                continue
            for sentence in re.split(r"(?<=[.!?])\s+", text):
                letters = sum(ch.isalpha() or ch == " " for ch in sentence)
                if len(sentence) >= 40 and sentence[0].isupper() and letters / len(sentence) > 0.85:
                    sentences.append(sentence)
    return tuple(sentences)
