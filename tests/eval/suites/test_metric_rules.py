"""Every rule of each suite's scoring definition, exercised on purpose (issue 33).

Three kinds of test:
- tables of inputs built to hit one rule each (whitespace, punctuation and articles in Latin and
  CJK text, every comment and fence marker the code metric skips, casing, empty and multi-line
  predictions, several gold answers), with the value worked out by hand from the suite's code;
- invariants under hypothesis (normalisation idempotent, F1 symmetric in its two bags, 1 for a
  text against itself);
- differential checks against the suites' own rules written out in ``suite_rules.py`` with the
  libraries the suites call (rouge, jieba, fuzzywuzzy with python-Levenshtein, rouge-score), on
  generated strings rich in the characters the rules treat specially.
"""

from __future__ import annotations

import pytest
from eval.suites import suite_rules as upstream
from eval.suites.suite_rules import f1
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lorekv.eval.suites import metrics as m
from lorekv.eval.suites.metrics import metric

pytest.importorskip("rouge")
pytest.importorskip("jieba")
pytest.importorskip("rapidfuzz")
pytest.importorskip("rouge_score")


def case(prediction: str, answers: list[str], expected: float, rule: str):
    return pytest.param(prediction, answers, expected, id=rule)


# ------------------------------------------------------------------------------------------------
# Rules, one input each


QA_F1 = [
    case("PARIS", ["paris"], 1.0, "casing"),
    case("The Theater", ["theater"], 1.0, "article-only-as-a-word"),
    case("a banana, an apple", ["banana apple"], 1.0, "articles-a-an"),
    case("the1 cat", ["cat"], f1(1 / 2, 1), "no-article-before-a-digit"),
    case("state-of-the-art", ["state of the art"], 0.0, "punctuation-before-articles-joins-words"),
    case("don't", ["dont"], 1.0, "apostrophe-removed"),
    case("U.S.A.", ["usa"], 1.0, "dots-removed"),
    case("Paris，France", ["paris france"], 0.0, "cjk-comma-is-not-english-punctuation"),
    case("Paris\tFrance\u3000Europe\xa0now", ["paris france europe now"], 1.0, "unicode-whitespace-splits"),
    case("Paris\nis the capital", ["Paris"], f1(1 / 3, 1), "multi-line-prediction"),
    case("", ["paris"], 0.0, "empty-prediction"),
    case("the a an", ["the"], 0.0, "nothing-left-after-normalisation"),
    case("Paris Paris", ["paris"], f1(1 / 2, 1), "repeated-tokens-multiset"),
    case("blue", ["whale", "blue whale"], f1(1, 1 / 2), "several-golds-best"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), QA_F1)
@pytest.mark.parametrize("name", ["qa_f1", "infbench_longbook_qa_eng"])
def test_qa_f1_rules(name, prediction, answers, expected):
    assert metric(name)(prediction, answers) == pytest.approx(expected)


QA_F1_ZH = [
    case("北京\u3000上海", ["北京上海"], 1.0, "ideographic-space-dropped"),
    case("北京\n上海\t", ["北京 上海"], 1.0, "newline-and-tab-dropped"),
    case("北京\r\n", ["北京"], 1.0, "carriage-return-dropped"),
    case("北京。", ["北京"], 1.0, "cjk-full-stop"),
    case("“北京”", ["北京"], 1.0, "cjk-quotes"),
    case("上海》、北京", ["上海北京"], 1.0, "cjk-closing-title-mark-and-enumeration-comma"),
    # LongBench's set holds the closing title mark but not the opening one: 《 stays a word
    case("《上海》", ["上海"], f1(1 / 2, 1), "opening-title-mark-is-not-in-the-set"),
    case("NBA!", ["nba"], 1.0, "latin-casing-and-ascii-punctuation"),
    case("", ["北京"], 0.0, "empty-prediction"),
    case("。。。", ["北京"], 0.0, "punctuation-only"),
    case("上海", ["北京", "上海"], 1.0, "several-golds-best"),
    case("北京北京", ["北京"], f1(1 / 2, 1), "repeated-words-multiset"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), QA_F1_ZH)
def test_qa_f1_zh_rules(prediction, answers, expected):
    assert m.qa_f1_zh(prediction, answers) == pytest.approx(expected)


QA_CHN = [
    case("北 京\u3000", ["北京"], 1.0, "every-whitespace-dropped"),
    case("北京\n", ["北京"], 1.0, "newline-dropped"),
    case("北京。", ["北京"], 1.0, "cjk-punctuation"),
    case("Ab", ["ab"], 1.0, "casing"),
    case("北北", ["北"], f1(1 / 2, 1), "characters-are-a-multiset"),
    case("北京市", ["上海", "北京"], f1(2 / 3, 1), "several-golds-best"),
    case("", ["北"], 0.0, "empty-prediction"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), QA_CHN)
def test_infbench_longbook_qa_chn_rules(prediction, answers, expected):
    assert m.infbench_longbook_qa_chn(prediction, answers) == pytest.approx(expected)


CODE_SIM = [
    case("```python\nx = 1\n```", ["x = 1"], 1.0, "fence-line-skipped"),
    case("# set x\nx = 1", ["x = 1"], 1.0, "hash-comment-skipped"),
    case("// set x\nx = 1", ["x = 1"], 1.0, "slash-comment-skipped"),
    case("`x`\nx = 1", ["x = 1"], 1.0, "inline-backtick-skipped"),
    case("url = 'http://a'\nx = 1", ["x = 1"], 1.0, "double-slash-anywhere-skipped"),
    # '#' anywhere skips the line: "y = 2" vs "x = 1" share " = " (3 of 5 + 5 characters) -> 60
    case("x = 1  # set x\ny = 2", ["x = 1"], 0.60, "trailing-hash-comment-skips-the-line"),
    # a single '/' is no comment: "/ not a comment" vs "x = 1" share two spaces -> 1 - 16/20 -> 20
    case("/ not a comment\nx = 1", ["x = 1"], 0.20, "single-slash-is-code"),
    case("\n\n\nx = 1", ["x = 1"], 1.0, "leading-newlines-stripped"),
    # only newlines are stripped: "  x = 1" vs "x = 1" -> 1 - 2/12 -> 83.3 -> 83
    case("  x = 1", ["x = 1"], 0.83, "leading-spaces-kept"),
    case("\r\nx = 1", ["x = 1"], 0.0, "a-carriage-return-is-a-line"),
    case("# a\n\nx = 1", ["x = 1"], 0.0, "a-blank-line-is-the-first-code-line"),
    case("X = 1", ["x = 1"], 0.80, "case-sensitive"),
    case("x = 1", ["y = 2", "x = 1"], 1.0, "several-golds-best"),
    case("", ["x = 1"], 0.0, "empty-prediction"),
    case("# only a comment", [""], 1.0, "two-empty-strings-score-100"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), CODE_SIM)
def test_code_sim_rules(prediction, answers, expected):
    assert m.code_sim(prediction, answers) == pytest.approx(expected)


ROUGE_L = [
    case("Cat sat", ["cat sat"], 0.5, "case-sensitive"),
    case("", ["cat sat"], 0.0, "empty-prediction"),
    case("\n \t", ["cat sat"], 0.0, "whitespace-only-prediction"),
    case("cat\nsat", ["cat sat"], 1.0, "newlines-are-spaces"),
    case("cat sat", ["dog ran", "cat sat"], 1.0, "several-golds-best"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), ROUGE_L)
def test_rouge_l_rules(prediction, answers, expected):
    assert m.rouge_l(prediction, answers) == pytest.approx(expected, abs=1e-7)


def test_first_line_rules():
    on_first = metric("qa_f1:first_line")
    assert on_first("\n\nParis\nRome", ["Paris"]) == 1.0  # leading newlines stripped
    assert on_first("\r\nParis", ["Paris"]) == 0.0  # a carriage return is a line of its own
    assert on_first("  \nParis", ["Paris"]) == 0.0  # only newlines are stripped
    assert on_first("Paris", ["Rome", "Paris"]) == 1.0


NUMBERS = [
    case("Paragraph 12", ["Paragraph 12"], 1.0, "retrieval-one-number"),
    case("Paragraph12 and 3", ["Paragraph 12"], 0.5, "retrieval-digits-inside-a-word"),
    case("Paragraph １２", ["Paragraph 12"], 0.0, "retrieval-fullwidth-digits-are-numbers-not-12"),
    case("", ["Paragraph 12"], 0.0, "retrieval-empty"),
    case("Paragraph 3", ["Paragraph 12", "Paragraph 3"], 1.0, "retrieval-several-golds"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), NUMBERS)
def test_retrieval_rules(prediction, answers, expected):
    assert m.retrieval(prediction, answers) == pytest.approx(expected)


def test_retrieval_zh_and_count_rules():
    assert m.retrieval_zh("段落３", ["段落3"]) == 0.0  # a full-width digit run is a number, and not '3'
    assert m.retrieval_zh("答案是段落3。\n段落4", ["段落3"]) == 0.5
    assert m.count("3 passages\n(3)", ["3"]) == 1.0
    assert m.count("3.5", ["3"]) == 0.5  # digit runs: 3 and 5
    assert m.count("-3", ["3"]) == 1.0  # no sign
    assert m.count("3", ["4", "3"]) == 1.0


PASSKEY = [
    case("The pass key is 71432.", ["71432"], 1.0, "first-run"),
    case("１２３ then 71432", ["71432"], 1.0, "fullwidth-digits-are-not-digits"),
    case("71432abc", ["71432"], 1.0, "letters-end-the-run"),
    case("7 1432", ["71432"], 0.0, "a-space-ends-the-run"),
    case("", ["71432"], 0.0, "empty"),
    case("71432", ["1", "71432"], 0.0, "first-gold-only"),
]


@pytest.mark.parametrize(("prediction", "answers", "expected"), PASSKEY)
def test_infbench_passkey_rules(prediction, answers, expected):
    assert m.infbench_passkey(prediction, answers) == expected


@pytest.mark.parametrize("separator", ["\n", ":", '"', "'", ".", ",", "?", "!", "{", "}", " ", "\t"])
def test_infbench_kv_retrieval_splits_on_each_of_its_separators(separator):
    assert m.infbench_kv_retrieval(f"value{separator}ab-12{separator}", ["ab-12"]) == 1.0
    assert m.infbench_kv_retrieval(f"value{separator}AB-12", ["ab-12"]) == 0.0  # case-sensitive


@pytest.mark.parametrize("joiner", ["(", ")", ";", "[", "]", "-", "/", "\u3000x"])
def test_infbench_kv_retrieval_other_characters_join_words(joiner):
    expected = 1.0 if joiner == "\u3000x" else 0.0  # U+3000 is whitespace for str.split, 'x' a word of its own
    assert m.infbench_kv_retrieval(f"ab-12{joiner}", ["ab-12"]) == expected


def test_classification_rules():
    classes = ["Sports", "Politics"]
    assert m.classification("sports", ["Sports"], classes=classes) == 0.0  # case-sensitive substring
    assert m.classification("Sports\nPolitics", ["Sports"], classes=classes) == 0.5  # multi-line
    assert m.classification("", ["Sports"], classes=classes) == 0.0
    assert m.classification("Politics", ["Sports", "Politics"], classes=classes) == 1.0  # several golds


def test_loogle_rouge_l_rules():
    assert m.loogle_rouge_l("Cat sat", ["cat sat"]) == pytest.approx(1 / 2)  # case-sensitive recall
    assert m.loogle_rouge_l("cat", ["dog", "cat sat"]) == pytest.approx(1 / 2)  # several golds: best recall
    assert m.loogle_rouge_l("cat\nsat", ["cat sat"]) == pytest.approx(1.0)  # multi-line


# ------------------------------------------------------------------------------------------------
# Invariants

ATOMS = [
    "the", "The", "a", "An", "an", "cat", "Paris", "x = 1", "北京", "上海", "的", "是", "京", "NBA", "1", "42",
    "３", ",", ".", "!", "'", "-", "_", "，", "。", "、", "“", "”", "《", "》", "…", " ", "  ", "\t", "\n", "\u3000",
    "\xa0", "\r", "#", "//", "/", "`", "```",
]  # fmt: skip
"""Pieces that each hit a rule: articles, casing, Latin and CJK words and punctuation, every
whitespace kind, digits (full-width too), the code metric's comment and fence markers."""

texts = st.lists(st.sampled_from(ATOMS), max_size=14).map("".join) | st.text(max_size=16)
golds = st.lists(texts, min_size=1, max_size=3)
checks = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@checks
@given(texts)
def test_normalisations_are_idempotent(text):
    assert m._normalize_en(m._normalize_en(text)) == m._normalize_en(text)
    assert m._normalize_zh(m._normalize_zh(text)) == m._normalize_zh(text)
    assert not any(ch.isspace() for ch in m._normalize_zh(text))


@pytest.mark.parametrize("name", ["qa_f1", "qa_f1_zh", "infbench_longbook_qa_chn"])
@checks
@given(texts, texts)
def test_f1_is_symmetric_in_its_two_bags(name, first, second):
    score = metric(name)
    assert score(first, [second]) == pytest.approx(score(second, [first]))


@pytest.mark.parametrize("name", ["qa_f1", "qa_f1_zh", "infbench_longbook_qa_chn", "code_sim", "rouge_l"])
@checks
@given(texts)
def test_a_text_scores_one_against_itself_when_anything_is_left_to_compare(name, text):
    score = metric(name)(text, [text])
    if name == "code_sim":
        assert score == 1.0 or upstream.code_sim(text, text) < 1.0  # only the first code line is compared
    elif name == "rouge_l":
        assert score == pytest.approx(1.0, abs=1e-6) or score == 0.0  # 0 where the package raises (no words)
    else:
        assert score == 1.0 or score == 0.0


# ------------------------------------------------------------------------------------------------
# Differential: lorekv against the suites' rules with their own libraries

DIFFERENTIAL = {
    "qa_f1": upstream.qa_f1,
    "qa_f1_zh": upstream.qa_f1_zh,
    "rouge_l": upstream.rouge_l,
    "rouge_l_zh": upstream.rouge_l_zh,
    "code_sim": upstream.code_sim,
    "count": upstream.number_share,
    "infbench_kv_retrieval": upstream.kv_retrieval,
    "infbench_longbook_qa_chn": upstream.longbook_qa_chn,
    "infbench_longbook_sum_eng": upstream.longbook_sum_eng,
    "loogle_rouge_l": upstream.loogle_rouge_l,
    "qa_f1:first_line": lambda p, g: upstream.qa_f1(upstream.first_line(p), g),
    "rouge_l:first_line": lambda p, g: upstream.rouge_l(upstream.first_line(p), g),
}


@pytest.mark.parametrize("name", sorted(DIFFERENTIAL))
@checks
@given(texts, golds)
def test_each_metric_equals_its_suites_rule_on_generated_strings(name, prediction, answers):
    want = upstream.best(DIFFERENTIAL[name], prediction, answers)
    assert metric(name)(prediction, answers) == pytest.approx(want, abs=1e-12)


@checks
@given(texts, st.lists(st.integers(0, 200).map(str), min_size=1, max_size=3))
def test_number_metrics_equal_their_suites_rules(prediction, numbers):
    paragraphs = [f"Paragraph {n}" for n in numbers]
    assert m.retrieval(prediction, paragraphs) == upstream.best(upstream.retrieval, prediction, paragraphs)
    assert m.infbench_passkey(prediction, numbers) == upstream.passkey(prediction, numbers[0])


code = st.text(st.sampled_from("abxy =()[]:;._'\"1234\t #/`\n北"), max_size=24)


@settings(max_examples=300, deadline=None)
@given(code, code)
def test_code_similarity_is_fuzzywuzzys_integer_ratio(first, second):
    """fuzzywuzzy's ``fuzz.ratio`` with python-Levenshtein, the library LongBench calls, on every pair
    of lines (rounding at .5 included: Python's round, on the ratio as the library computes it)."""
    fuzz = pytest.importorskip("fuzzywuzzy.fuzz")
    pytest.importorskip("Levenshtein")
    assert m._fuzzywuzzy_ratio(first, second) == fuzz.ratio(first, second)
