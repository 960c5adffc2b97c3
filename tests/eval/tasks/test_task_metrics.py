"""RULER's string-match metrics: worked examples and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lorekv.eval.suites.metrics import metric as suite_metric
from lorekv.eval.tasks import METRICS, string_match_all, string_match_in_order, string_match_part

text = st.text(alphabet="abAB -", max_size=20)
answers = st.lists(st.text(alphabet="abAB-", min_size=1, max_size=4), min_size=1, max_size=4)


def test_worked_examples() -> None:
    prediction = "The values are 1234567 and Amber-Fox."
    gold = ["1234567", "amber-fox", "7654321"]
    assert string_match_all(prediction, gold) == pytest.approx(2 / 3)
    assert string_match_part(prediction, gold) == 1.0
    assert string_match_all("nothing here", gold) == 0.0
    assert string_match_part("nothing here", gold) == 0.0
    assert string_match_all("QPEBH, xkjda", ["qpebh", "XKJDA"]) == 1.0


def test_registry_maps_names_to_functions() -> None:
    assert METRICS == {"all": string_match_all, "part": string_match_part, "in_order": string_match_in_order}
    assert suite_metric("in_order")("a b", ["b", "a"]) == 0.5


@pytest.mark.parametrize("bad", [[], (), "abc"])
def test_answers_must_be_a_non_empty_sequence(bad) -> None:
    for metric in METRICS.values():
        with pytest.raises(ValueError, match="answers"):
            metric("abc", bad)


@given(text, answers)
def test_all_is_one_exactly_when_every_answer_is_a_substring(prediction: str, gold: list[str]) -> None:
    every = all(a.lower() in prediction.lower() for a in gold)
    assert (string_match_all(prediction, gold) == 1.0) == every


@given(text, answers)
def test_all_is_the_fraction_found_and_part_is_any(prediction: str, gold: list[str]) -> None:
    found = [a.lower() in prediction.lower() for a in gold]
    score_all, score_part = string_match_all(prediction, gold), string_match_part(prediction, gold)
    assert 0.0 <= score_all <= 1.0 and score_part in (0.0, 1.0)
    assert score_all == pytest.approx(sum(found) / len(gold))
    assert score_part == float(any(found))
    assert score_part >= score_all


@given(text, st.text(alphabet="abAB-", min_size=1, max_size=4))
def test_one_answer_part_equals_all(prediction: str, answer: str) -> None:
    assert string_match_part(prediction, [answer]) == string_match_all(prediction, [answer])


@given(text, answers)
def test_case_does_not_matter(prediction: str, gold: list[str]) -> None:
    for metric in METRICS.values():
        assert metric(prediction.upper(), [a.lower() for a in gold]) == metric(prediction.lower(), gold)


@given(answers)
def test_the_answers_themselves_score_one(gold: list[str]) -> None:
    assert string_match_all(" ".join(gold), gold) == 1.0


def test_in_order_worked_examples() -> None:
    gold = ["cedar", "scarf", "pine", "apple"]
    assert string_match_in_order("1. cedar\n2. scarf\n3. pine\n4. apple", gold) == 1.0
    assert string_match_in_order("1. cedar\n2. pine\n3. scarf\n4. apple", gold) == 0.75  # one misplaced
    assert string_match_in_order("cedar cedar cedar", gold) == 0.25  # a repeat counts once
    assert string_match_in_order("pineapple, Cedar-like SCARF", gold) == 0.5  # whole words only
    assert string_match_in_order("apple pine scarf cedar", gold) == 0.25


def brute_in_order(prediction: str, gold: list[str]) -> float:
    """The longest common subsequence of the gold list and the whole words of the prediction."""
    words = prediction.lower().split()
    table = [[0] * (len(words) + 1) for _ in range(len(gold) + 1)]
    for i, answer in enumerate(gold):
        for j, word in enumerate(words):
            same = answer.lower() == word
            table[i + 1][j + 1] = table[i][j] + 1 if same else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1] / len(gold)


@given(
    st.lists(st.text(alphabet="abcAB", min_size=1, max_size=3), min_size=1, max_size=6, unique_by=str.lower),
    st.lists(st.integers(min_value=0, max_value=8), max_size=14),
)
def test_in_order_is_the_longest_common_subsequence_with_the_gold_list(gold: list[str], picks: list[int]) -> None:
    """Whole words only, distinct gold items: the closed form equals a brute-force LCS over the
    prediction's words (picks beyond the gold list are words of other letters)."""
    words = [gold[k] if k < len(gold) else "x" * (k - len(gold) + 1) for k in picks]
    prediction = " ".join(w.swapcase() for w in words)
    assert string_match_in_order(prediction, gold) == pytest.approx(brute_in_order(prediction, gold))
