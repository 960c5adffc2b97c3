"""Shared test setup.

- ``tiny_models.py``: tiny random Llama (GQA) and Gemma 3 (hybrid) models built from a config
  in the test itself (no downloads, milliseconds per call); exposed here as fixtures too.
- ``strategies.py``: hypothesis strategies for captured attention.
- Hypothesis profiles: ``default`` (no deadline: CI machines are shared and noisy) and
  ``thorough`` (``HYPOTHESIS_PROFILE=thorough``: ten times the examples).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from tiny_models import tiny_gemma3, tiny_llama

settings.register_profile("default", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def llama():
    """A tiny random float64 Llama: 2 layers, 4 query heads over 2 KV heads."""
    return tiny_llama()


@pytest.fixture
def gemma3():
    """A tiny random float64 Gemma 3: sliding, sliding, full, sliding attention (window 6)."""
    return tiny_gemma3()
