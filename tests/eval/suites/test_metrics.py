"""The suites' answer metrics against values worked out by hand from each suite's definition."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from eval.suites.suite_rules import f1
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lorekv.eval.suites import metrics as m
from lorekv.eval.suites.metrics import SUITE_METRICS, metric

pytest.importorskip("rouge")
pytest.importorskip("jieba")
pytest.importorskip("rapidfuzz")
pytest.importorskip("rouge_score")


# ------------------------------------------------------------------------------------------------
# LongBench


def test_qa_f1_counts():
    # "The cat sat on the mat." -> lower, no punctuation, no articles -> cat sat on mat (4 tokens);
    # "a cat on a mat" -> cat on mat (3 tokens); overlap cat, on, mat = 3 -> P = 3/4, R = 3/3.
    assert m.qa_f1("The cat sat on the mat.", ["a cat on a mat"]) == pytest.approx(f1(3 / 4, 3 / 3))


def test_qa_f1_counts_repeated_tokens_as_a_multiset():
    # pred: paris paris (2), gold: paris (1); overlap min(2, 1) = 1 -> P = 1/2, R = 1.
    assert m.qa_f1("Paris, Paris!", ["Paris"]) == pytest.approx(f1(1 / 2, 1))


def test_qa_f1_no_overlap_and_only_articles():
    assert m.qa_f1("London", ["Paris"]) == 0.0
    # Everything is removed by normalisation: no tokens, no overlap -> 0.
    assert m.qa_f1("the a an", ["the"]) == 0.0


def test_qa_f1_takes_the_best_gold():
    # gold 1: "new york city" vs pred "new york": overlap 2 -> P = 1, R = 2/3; gold 2 exact -> 1.
    assert m.qa_f1("New York", ["New York City"]) == pytest.approx(f1(1, 2 / 3))
    assert m.qa_f1("New York", ["New York City", "new york"]) == 1.0


def test_qa_f1_zh_uses_jieba_words():
    # jieba: 北京 / ， / 上海 -> the comma normalises to '' and is dropped: [北京, 上海] vs [北京]
    # overlap 1 -> P = 1/2, R = 1.
    assert m.qa_f1_zh("北京，上海", ["北京"]) == pytest.approx(f1(1 / 2, 1))
    assert m.qa_f1_zh("上海", ["北京"]) == 0.0


def test_rouge_l_by_hand():
    # One sentence each; LCS("cat sat", "the cat sat on mat") = 2 words; the rouge package divides
    # by DISTINCT word counts: P = 2/2, R = 2/5, F = 2PR / (P + R + 1e-8).
    assert m.rouge_l("cat sat", ["the cat sat on mat"]) == pytest.approx(f1(1, 2 / 5), abs=1e-7)
    # Repeated words count once in the denominator: "the" twice -> 5 distinct gold words.
    assert m.rouge_l("the cat sat", ["the cat sat on the mat"]) == pytest.approx(f1(1, 3 / 5), abs=1e-7)


def test_rouge_l_is_case_sensitive():
    # "Cat" != "cat": LCS 1 ("sat") of 2 and 2 words -> P = R = 1/2.
    assert m.rouge_l("Cat sat", ["cat sat"]) == pytest.approx(1 / 2, abs=1e-7)


@pytest.mark.parametrize("prediction", ["", ".", "..."])
def test_rouge_l_of_an_empty_prediction_is_zero(prediction):
    assert m.rouge_l(prediction, ["the cat sat"]) == 0.0


def test_rouge_l_zh_spaces_jieba_words():
    # 北京 vs 北京 ， 上海: the comma is a word for ROUGE; LCS 1 -> P = 1/1, R = 1/3.
    assert m.rouge_l_zh("北京", ["北京，上海"]) == pytest.approx(f1(1, 1 / 3), abs=1e-7)
    assert m.rouge_l_zh("", ["北京"]) == 0.0


def test_classification_two_classes_in_the_prediction():
    # Both "sports" and "politics" occur -> the gold is one of 2 matches -> 1/2.
    classes = ["sports", "politics", "science"]
    assert m.classification("sports and politics", ["sports"], classes=classes) == 0.5
    assert m.classification("sports", ["sports"], classes=classes) == 1.0
    assert m.classification("science", ["sports"], classes=classes) == 0.0
    assert m.classification("anything", ["sports"], classes=()) == 0.0


def test_classification_drops_substrings_of_the_gold():
    # matches [Location, Location City]; "Location" is a proper substring of the gold -> removed -> 1/1.
    classes = ["Location", "Location City"]
    assert m.classification("Location City", ["Location City"], classes=classes) == 1.0


def test_classification_reproduces_the_skip_after_removal():
    # matches in class order: [abc, def, abc def]. Walking the shrinking list: "abc" (a proper
    # substring of the gold) is removed, "def" slides into its slot and is never looked at, then
    # "abc def" is the gold itself. Left: [def, abc def] -> 1/2 (a clean filter would give 1).
    classes = ["abc", "def", "abc def"]
    assert m.classification("abc def", ["abc def"], classes=classes) == 0.5
    # The skip hits whatever follows a removed class: [abc def, abc, def] -> "abc" removed at index 1,
    # "def" slides into index 1 after the loop has passed it -> [abc def, def] -> 1/2 again.
    assert m.classification("abc def", ["abc def"], classes=["abc def", "abc", "def"]) == 0.5
    # With nothing after the removed class there is nothing to skip: [abc, abc def] -> [abc def] -> 1.
    assert m.classification("abc def", ["abc def"], classes=["abc", "abc def"]) == 1.0


def test_retrieval_share_of_numbers():
    # numbers in the prediction: 12, 2 -> one of two is 12.
    assert m.retrieval("Paragraph 12 and Paragraph 2", ["Paragraph 12"]) == 0.5
    assert m.retrieval("Paragraph 12", ["Paragraph 12"]) == 1.0
    assert m.retrieval("I do not know", ["Paragraph 12"]) == 0.0  # no numbers
    assert m.retrieval_zh("段落3，段落3，段落1", ["段落3"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="Paragraph"):
        m.retrieval("1", ["no paragraph here"])


def test_count_share_of_numbers():
    # numbers 3, 4, 3 -> two of three equal the gold 3.
    assert m.count("There are 3, not 4 or 3", ["3"]) == pytest.approx(2 / 3)
    assert m.count("no idea", ["3"]) == 0.0
    assert m.count("33", ["3"]) == 0.0  # digit runs are whole numbers


def test_code_sim_first_code_line_and_integer_ratio():
    # First line without ` # // is "x = foo(1)"; vs "x = foo(2)": 1 deletion + 1 insertion = 2 of
    # 10 + 10 characters -> 100 * (1 - 2/20) = 90.
    assert m.code_sim("```python\n# call\nx = foo(1)\n```", ["x = foo(2)"]) == pytest.approx(0.90)
    # "abc" vs "abd": distance 2 of 6 -> 66.67, rounded to the integer 67 like fuzzywuzzy.
    assert m.code_sim("abc", ["abd"]) == pytest.approx(0.67)
    # Every line has a marker -> the compared line is "" -> 0 against a non-empty gold.
    assert m.code_sim("// a\n# b\n`c`", ["x"]) == 0.0
    assert m.code_sim("\n\nreturn x", ["return x"]) == 1.0


def test_code_sim_equal_empty_strings_score_100():
    # fuzzywuzzy tests equality before emptiness: ratio("", "") = 100.
    assert m.code_sim("# only a comment", [""]) == 1.0


def test_first_line_variants():
    prediction = "\n\nParis\nQuestion: where is Rome?\nAnswer: Rome"
    assert metric("qa_f1:first_line")(prediction, ["Paris"]) == 1.0
    # the whole text: paris question where is rome answer rome (7 tokens), overlap 1 -> P 1/7, R 1
    assert metric("qa_f1")(prediction, ["Paris"]) == pytest.approx(f1(1 / 7, 1))
    classes = ["LOC", "HUM"]
    text = "LOC\nType: HUM"
    assert metric("classification:first_line")(text, ["LOC"], classes=classes) == 1.0
    assert metric("classification")(text, ["LOC"], classes=classes) == 0.5
    assert metric("rouge_l:first_line")("cat sat\nmore words", ["cat sat"]) == pytest.approx(1.0, abs=1e-7)
    assert metric("rouge_l:first_line")("\nfoo\ncat sat", ["cat sat"]) == 0.0


# ------------------------------------------------------------------------------------------------
# LongBench v2


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("The correct answer is (B)", "B", 1.0),
        ("**The correct answer is (B)**", "B", 1.0),  # Markdown bold is removed first
        ("The correct answer is **C**.", "C", 1.0),
        ("The correct answer is C", "C", 1.0),
        ("The correct answer is (A). Wait: The correct answer is B", "B", 0.0),  # '(X)' form wins
        ("The correct answer is (E)", "E", 0.0),  # only A-D
        ("(B)", "B", 0.0),  # no answer sentence
        ("the correct answer is (B)", "B", 0.0),  # case-sensitive
        ("The correct answer is (D)", "B", 0.0),
    ],
)
def test_choice(prediction, gold, expected):
    assert m.choice(prediction, [gold]) == expected


# ------------------------------------------------------------------------------------------------
# InfiniteBench


def test_infbench_passkey_first_digit_run():
    assert m.infbench_passkey("The pass key is 71432.", ["71432"]) == 1.0
    assert m.infbench_passkey("Key 7 is 71432", ["71432"]) == 0.0  # the FIRST run decides
    assert m.infbench_passkey("no digits", ["71432"]) == 0.0
    assert m.infbench_passkey("0071432", ["71432"]) == 0.0  # compared as strings
    assert metric("infbench_number_string")("digits: 3000077442.", ["3000077442"]) == 1.0


def test_infbench_kv_retrieval_whole_word():
    uuid = "c14cb8ba-002b-43be"
    assert m.infbench_kv_retrieval(f'The value is: "{uuid}".', [uuid]) == 1.0
    assert m.infbench_kv_retrieval(f"The value is {uuid}x", [uuid]) == 0.0
    assert m.infbench_kv_retrieval(f"({uuid})", [uuid]) == 0.0  # parentheses are not separators


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("A. Walking Georgie", 1.0),  # first letter decides
        ("B. Walking Georgie", 0.0),  # ... even against the text
        ("Walking Georgie", 1.0),  # equals the option text
        ("I think the answer is: A", 1.0),
        ("The answer is Walking Georgie.", 1.0),  # 'answer is' + one space, then the text
        ("So, option is D", 0.0),
        ("I'd go with A here", 1.0),  # first word that is in 'ABCD'
        ("maybe BC or A", 0.0),  # 'BC' is a substring of 'ABCD', so it decides, and it is wrong
        ("  ", 0.0),
        ("no letter", 0.0),
    ],
)
def test_infbench_longbook_choice_eng(prediction, expected):
    assert m.infbench_longbook_choice_eng(prediction, ["Walking Georgie", "A"]) == expected


def test_infbench_longbook_qa_eng_is_token_f1():
    assert metric("infbench_longbook_qa_eng")("On an island.", ["the hebrides"]) == 0.0
    assert metric("infbench_longbook_qa_eng")("the Hebrides", ["the hebrides"]) == 1.0


def test_infbench_longbook_qa_chn_characters():
    # 北京市 vs 北京: characters [北, 京, 市] vs [北, 京] -> P = 2/3, R = 1.
    assert m.infbench_longbook_qa_chn("北京市", ["北京"]) == pytest.approx(f1(2 / 3, 1))
    assert m.infbench_longbook_qa_chn("上海", ["北京"]) == 0.0


def test_infbench_longbook_sum_eng_rouge_lsum():
    # rouge-score lower-cases and drops punctuation: [the, cat, sat] vs [the, cat, sat, on, the, mat]
    # LCS 3 -> P = 3/3, R = 3/6 (no de-duplication, unlike the rouge package).
    assert m.infbench_longbook_sum_eng("The cat sat.", ["the cat sat on the mat"]) == pytest.approx(f1(1, 1 / 2))
    assert m.infbench_longbook_sum_eng("", ["the cat sat on the mat"]) == 0.0
    # several references: the best F is kept
    assert m.infbench_longbook_sum_eng("The cat sat.", ["a dog", "the cat sat"]) == pytest.approx(1.0)


def test_infbench_math_find():
    assert m.infbench_math_find("The answer is 88.", ["88"]) == 1.0
    assert m.infbench_math_find("-88", ["-88"]) == 0.0  # the sign is never read
    assert m.infbench_math_find("3.5 then 4", ["3.5"]) == 1.0
    assert m.infbench_math_find("3.5", ["3"]) == 0.0  # int gold, float prediction
    assert m.infbench_math_find("no number", ["3"]) == 0.0
    assert m.infbench_math_find("4 and 88", ["88"]) == 0.0  # first number decides


def test_infbench_math_calc_correct_prefix():
    # gold [1, 3, 5, 7]; predicted 1, 3, 9, 7 -> prefix of 2 correct -> 2/4.
    assert m.infbench_math_calc("[1, 3, 9, 7]", ["[1, 3, 5, 7]"]) == 0.5
    assert m.infbench_math_calc("[1, 3, 5, 7]", ["[1, 3, 5, 7]"]) == 1.0
    # gold [1, 3, -1]: the prediction's '-1' is read as 1 -> stops at the third value -> 2/3.
    assert m.infbench_math_calc("[1, 3, -1]", ["[1, 3, -1]"]) == pytest.approx(2 / 3)
    assert m.infbench_math_calc("[1]", ["[1, 3]"]) == 0.5  # a shorter prediction
    assert m.infbench_math_calc("none", ["[1, 3]"]) == 0.0


def test_infbench_code_run_last_word():
    assert m.infbench_code_run("The return value is: -14", ["-14"]) == 1.0
    assert m.infbench_code_run("The return value is: `4`.", ["4"]) == 1.0
    assert m.infbench_code_run("4 is the value", ["4"]) == 0.0  # the LAST word decides
    assert m.infbench_code_run("", ["4"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("B. repack_carchive", 1.0),
        ("B: it is this one", 1.0),
        ("Therefore, the answer is:\n\nB. repack_carchive", 1.0),
        ("The answer is: repack_carchive", 1.0),
        ("Therefore, the answer is:\n\nC. cmd_gen", 0.0),
        ("The answer is: ", 0.0),  # ends with the prefix
        ("I think it is B", 0.0),  # no prefix with a colon
        ("Option B is:B", 0.0),  # 'is:' then one character skipped: the rest is '' -> no match
    ],
)
def test_infbench_code_debug(prediction, expected):
    assert m.infbench_code_debug(prediction, ["repack_carchive", "B"]) == expected


def test_infbench_longdialogue_qa_eng_uses_first_gold_against_upper_cased_words():
    assert m.infbench_longdialogue_qa_eng("It was Ace, I think.", ["ACE", "ACE ROTHSTEIN"]) == 1.0
    assert m.infbench_longdialogue_qa_eng("Ace Rothstein", ["ROTHSTEIN", "ACE"]) == 1.0
    assert m.infbench_longdialogue_qa_eng("Ace", ["ROTHSTEIN", "ACE"]) == 0.0  # only answers[0]
    assert m.infbench_longdialogue_qa_eng("Remo", ["Remo"]) == 0.0  # the gold is not upper-cased


# ------------------------------------------------------------------------------------------------
# LooGLE


def test_loogle_rouge_l_is_recall():
    # LCS 2 of 5 distinct gold words -> R = 2/5 (precision 1 is not used).
    assert m.loogle_rouge_l("cat sat", ["the cat sat on mat"]) == pytest.approx(2 / 5)
    # an empty prediction is scored as the text "None": 1 of 3 gold words.
    assert m.loogle_rouge_l("", ["None of them"]) == pytest.approx(1 / 3)
    assert m.loogle_rouge_l("", ["the cat"]) == 0.0
    assert m.loogle_rouge_l(".", ["the cat"]) == 0.0  # the package raises: no words


def test_loogle_cloze():
    gold = "{'<mask-0>': 'Justin Timberlake', '<mask-1>': 'Cerina Aragones', '<mask-2>': 'Kentwood'}"
    prediction = "{'<mask-0>': 'Justin Timberlake', '<mask-1>': 'Cerina', '<mask-3>': 'Kentwood'}"
    # exact: mask-0 only -> 1/3; partial: mask-0 and mask-1 share a word -> 2/3 (mask-2 missing).
    assert m.loogle_cloze_exact(prediction, [gold]) == pytest.approx(1 / 3)
    assert m.loogle_cloze_partial(prediction, [gold]) == pytest.approx(2 / 3)
    assert m.loogle_cloze_exact("Justin Timberlake", [gold]) == 0.0  # not a dict
    assert m.loogle_cloze_partial('{"<mask-0>": 5}', [gold]) == 0.0
    assert m.loogle_cloze_exact("__import__('os')", [gold]) == 0.0  # never evaluated as code
    with pytest.raises(ValueError, match="dict"):
        m.loogle_cloze_exact(prediction, ["Justin"])


# ------------------------------------------------------------------------------------------------
# RULER and the registry


def test_ruler_wrappers():
    assert metric("all")("alpha and BETA", ["alpha", "beta", "gamma"]) == pytest.approx(2 / 3)
    assert metric("part")("alpha", ["beta", "ALPHA"]) == 1.0


def test_unknown_metric_names_itself_and_the_known_ones():
    with pytest.raises(ValueError, match=r"'rouge_x'.*qa_f1:first_line.*rouge_l"):
        metric("rouge_x")


def test_registry_names():
    assert {"qa_f1:first_line", "rouge_l:first_line", "classification:first_line"} <= set(SUITE_METRICS)
    assert metric("qa_f1") is m.qa_f1
    assert all(":" not in name or name.endswith(":first_line") for name in SUITE_METRICS)


@pytest.mark.parametrize("name", sorted(SUITE_METRICS))
def test_empty_answers_raise(name):
    with pytest.raises(ValueError, match="non-empty"):
        metric(name)("anything", [])
    with pytest.raises(ValueError, match="non-empty"):
        metric(name)("anything", "a string is not a list of answers")


# ------------------------------------------------------------------------------------------------
# Properties

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40) | st.text(
    "abc ABCD.,:*()\n#`0123456789-", max_size=40
)
word = st.text("abcxyz0", min_size=1, max_size=6)
number = st.integers(min_value=-50, max_value=200).map(str)

# A strategy of gold-answer lists in the form each metric expects.
GOLDS: dict[str, st.SearchStrategy[list[str]]] = {
    name: st.lists(text, min_size=1, max_size=3) for name in SUITE_METRICS
}
GOLDS["retrieval"] = st.lists(number.map(lambda n: f"Paragraph {n.lstrip('-')}"), min_size=1, max_size=3)
GOLDS["retrieval_zh"] = st.lists(number.map(lambda n: f"段落{n.lstrip('-')}"), min_size=1, max_size=3)
GOLDS["count"] = st.lists(number, min_size=1, max_size=3)
GOLDS["infbench_math_find"] = st.lists(number | st.floats(0, 100).map(str), min_size=1, max_size=3)
GOLDS["infbench_code_run"] = st.lists(number, min_size=1, max_size=3)
GOLDS["infbench_math_calc"] = st.lists(st.lists(number, min_size=1, max_size=5).map(str), min_size=1, max_size=3)
GOLDS["infbench_code_debug"] = st.tuples(word, st.sampled_from("ABCD")).map(list)
GOLDS["infbench_longbook_choice_eng"] = st.tuples(text, st.sampled_from("ABCD")).map(list)
for _name in ("loogle_cloze_exact", "loogle_cloze_partial"):
    GOLDS[_name] = st.lists(
        st.dictionaries(st.sampled_from(["<mask-0>", "<mask-1>"]), word, min_size=1).map(repr), min_size=1, max_size=3
    )

# Metrics that take the best over their gold answers (the rest use answers[0], or the label pair).
MAXIMISING = sorted(
    set(SUITE_METRICS)
    - {
        "all",
        "in_order",
        "choice",
        "infbench_passkey",
        "infbench_number_string",
        "infbench_code_run",
        "infbench_math_find",
        "infbench_code_debug",
        "infbench_longbook_choice_eng",
        "infbench_longdialogue_qa_eng",
    }
)

fast = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _prediction_for(name: str, data: st.DataObject, golds: Sequence[str]) -> str:
    """Arbitrary text, or text built around a gold answer so that high scores are exercised too."""
    return data.draw(
        text | st.sampled_from(list(golds)) | st.builds(lambda t, g: f"{t} {g}", text, st.sampled_from(list(golds)))
    )


@pytest.mark.parametrize("name", sorted(SUITE_METRICS))
@fast
@given(data=st.data())
def test_every_metric_is_in_unit_interval(name, data):
    golds = data.draw(GOLDS[name])
    classes = data.draw(st.lists(word | st.sampled_from(golds), max_size=4))
    score = metric(name)(_prediction_for(name, data, golds), golds, classes=classes)
    assert isinstance(score, float)
    assert 0.0 <= score <= 1.0


@pytest.mark.parametrize("name", sorted(set(SUITE_METRICS) - {"all", "in_order"}))  # shares of every gold answer
@fast
@given(data=st.data())
def test_adding_a_gold_answer_never_lowers_the_score(name, data):
    golds = data.draw(GOLDS[name])
    extra = data.draw(GOLDS[name])[0]
    prediction = _prediction_for(name, data, golds)
    classes = data.draw(st.lists(word | st.sampled_from(golds), max_size=4))
    scorer = metric(name)
    assert scorer(prediction, [*golds, extra], classes=classes) >= scorer(prediction, golds, classes=classes)


@pytest.mark.parametrize("name", MAXIMISING)
@fast
@given(data=st.data())
def test_maximising_metrics_score_the_best_single_gold(name, data):
    golds = data.draw(GOLDS[name])
    prediction = _prediction_for(name, data, golds)
    classes = data.draw(st.lists(word | st.sampled_from(golds), max_size=4))
    scorer = metric(name)
    best = max(scorer(prediction, [gold], classes=classes) for gold in golds)
    assert scorer(prediction, golds, classes=classes) == pytest.approx(best)


ascii_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


@fast
@given(ascii_text, ascii_text)
def test_qa_f1_is_one_for_identical_normalised_strings(first, second):
    normalised = m._normalize_en(first)
    if normalised.split():
        assert m.qa_f1(first, [normalised]) == 1.0
        assert m.qa_f1(normalised.upper() + " .", [first]) == 1.0
    if sorted(m._normalize_en(first).split()) != sorted(m._normalize_en(second).split()):
        assert m.qa_f1(first, [second]) < 1.0


def test_scbench_kv_retrieval_is_a_case_sensitive_substring_match() -> None:
    from lorekv.eval.suites.metrics import scbench_kv_retrieval

    assert scbench_kv_retrieval("the value is a1b2-c3", ["a1b2-c3"]) == 1.0
    assert scbench_kv_retrieval("the value is A1B2-C3", ["a1b2-c3"]) == 0.0
    assert scbench_kv_retrieval("none", ["x9", "non"]) == 1.0
