"""The raw material: distinct keys and values, made-up words, haystacks and needle insertion."""

from __future__ import annotations

import math
import random
import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lorekv.eval.tasks import make_sample
from lorekv.eval.tasks.words import (
    ADJECTIVES,
    NOISE,
    NOUNS,
    draw_distinct,
    insert_at_depths,
    made_up_words,
    noise_sentences,
    prose_sentences,
)


def test_draw_distinct_never_reuses_a_used_value() -> None:
    pairs = [f"{a}-{n}" for a in ADJECTIVES for n in NOUNS]
    left = pairs[100:103]
    used = set(pairs) - set(left)
    drawn = draw_distinct(random.Random(0), "word", 3, used)
    assert sorted(drawn) == sorted(left)
    assert used == set(pairs)
    with pytest.raises(ValueError, match="distinct words"):
        draw_distinct(random.Random(0), "word", 1, used)


@pytest.mark.parametrize("kind", ["number", "word", "uuid"])
def test_draw_distinct_is_seeded(kind) -> None:
    first = draw_distinct(random.Random(5), kind, 50, set())
    assert first == draw_distinct(random.Random(5), kind, 50, set())
    assert len(set(first)) == 50


def test_made_up_words_are_distinct_and_of_one_shape() -> None:
    words = made_up_words(random.Random(1), 2000)
    assert len(set(words)) == 2000
    assert all(re.fullmatch(r"[^aeiou][aeiou][^aeiou][aeiou][^aeiou]", w) for w in words)


def test_haystacks_grow_by_one_unit() -> None:
    assert noise_sentences(7) == [*NOISE, NOISE[0], NOISE[1]]
    for size in (1, 17, 500):
        assert sum(len(s.split()) for s in prose_sentences(3, size)) == size


@given(
    units=st.lists(st.text(alphabet="ab", min_size=1, max_size=3), max_size=12),
    depths=st.lists(st.floats(min_value=0, max_value=1), max_size=5),
)
def test_insert_at_depths_keeps_the_units_in_order(units, depths) -> None:
    items = [f"<{k}>" for k in range(len(depths))]
    out = insert_at_depths(units, items, depths)
    assert [u for u in out if not u.startswith("<")] == units
    for k, depth in enumerate(depths):
        before = sum(1 for u in out[: out.index(items[k])] if not u.startswith("<"))
        assert before == min(len(units), round(depth * len(units)))


@pytest.mark.parametrize("alpha", [2.0, 1.5])
def test_frequent_words_counts_follow_zipf(alpha, tiny_tokenizer) -> None:
    sample = make_sample({"name": "frequent_words", "alpha": alpha}, tiny_tokenizer, 2000, seed=1)
    counts = sorted(Counter(sample.context.split("\n\n", 1)[1].split()).values(), reverse=True)
    top = counts[0]
    assert counts == [math.floor(top / r**alpha) for r in range(1, len(counts) + 1)]
    assert math.floor(top / (len(counts) + 1) ** alpha) == 0
