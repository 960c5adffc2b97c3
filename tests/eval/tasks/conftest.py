"""A tiny regex tokenizer for the task tests (fast, no model); the real SmolLM2 one is in tests/eval/conftest.py."""

from __future__ import annotations

import re

import pytest

TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


class TinyTokenizer:
    """Words and punctuation marks, each with its leading whitespace, as tokens; no chat template.

    Enough of the Hugging Face call interface for the tasks: ``input_ids`` and ``offset_mapping``.
    """

    chat_template = None

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False) -> dict:
        spans = [m.span() for m in TOKEN.finditer(text)]
        assert "".join(text[a:b] for a, b in spans) == text
        ids = [self.vocab.setdefault(text[a:b], len(self.vocab)) for a, b in spans]
        out: dict = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return out


@pytest.fixture(scope="session")
def tiny_tokenizer() -> TinyTokenizer:
    return TinyTokenizer()
