"""Fixtures shared by the evaluation tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2-135M-Instruct's tokenizer (the model cache loads in seconds)."""
    pytest.importorskip("gguf")
    from lorekv.models import load

    _, tokenizer = load("smollm2-135m-instruct")
    return tokenizer
