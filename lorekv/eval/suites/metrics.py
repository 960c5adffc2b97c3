"""The answer metrics of the standard long-context suites, scored the way each suite scores them.

Every metric scores ONE sample: ``metric(prediction, answers, *, classes=())`` returns a float in
[0, 1]. ``answers`` holds the sample's gold answers; where a suite takes the best score over its gold
answers, the metric does it, so a caller never has to. ``classes`` is only read by LongBench's
classification metric (the label set of TREC / LSHT). Suites average these per-sample scores
(LongBench and InfiniteBench report ``100 * mean``).

The definitions follow each suite's own scoring code rather than its paper's prose, because the
published numbers come from the code; where the code has a quirk that changes scores, the quirk is
reproduced and the metric's docstring says so. Where the code cannot be followed (it crashes on an
input, or depends on the model being scored) the docstring says what is done instead.

Suites and names (:data:`SUITE_METRICS`):

- LongBench (https://arxiv.org/abs/2308.14508, THUDM/LongBench ``LongBench/metrics.py``):
  ``qa_f1``, ``qa_f1_zh``, ``rouge_l``, ``rouge_l_zh``, ``classification``, ``retrieval``,
  ``retrieval_zh``, ``count``, ``code_sim``, and the first-line variants ``qa_f1:first_line``,
  ``rouge_l:first_line``, ``classification:first_line`` that LongBench's ``eval.py`` applies to
  trec, triviaqa, samsum and lsht.
- LongBench v2 (https://arxiv.org/abs/2412.15204, THUDM/LongBench ``pred.py``): ``choice``.
- InfiniteBench (https://arxiv.org/abs/2402.13718, OpenBMB/InfiniteBench ``src/compute_scores.py``):
  ``infbench_passkey``, ``infbench_number_string``, ``infbench_kv_retrieval``,
  ``infbench_longbook_choice_eng``, ``infbench_longbook_qa_eng``, ``infbench_longbook_qa_chn``,
  ``infbench_longbook_sum_eng``, ``infbench_math_find``, ``infbench_math_calc``, ``infbench_code_run``,
  ``infbench_code_debug``, ``infbench_longdialogue_qa_eng``.
- LooGLE (https://arxiv.org/abs/2311.04939, bigai-nlco/LooGLE ``Evaluation/automatic_metrics.py``):
  ``loogle_rouge_l``, ``loogle_cloze_exact``, ``loogle_cloze_partial``. LooGLE's BLEU, METEOR and
  BERTScore are not provided: they need nltk's WordNet data and a BERT model, which this module
  does not download.
- RULER (https://arxiv.org/abs/2404.06654): ``all`` and ``part``, from :mod:`lorekv.eval.tasks.metrics`.
- lorekv's long-output tasks: ``in_order`` (list recall), from :mod:`lorekv.eval.tasks.metrics`.

The suites' tokenisers and ROUGE implementations are third-party packages (``rouge``, ``jieba``,
``rapidfuzz``, ``rouge-score``); they are imported when a metric first needs them, and the
``lorekv[suites]`` extra installs them.
"""

from __future__ import annotations

import ast
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from lorekv.eval.tasks import metrics as ruler
from lorekv.extras import require


class Metric(Protocol):
    """A per-sample answer metric: the score of ``prediction`` against ``answers``, in [0, 1]."""

    def __call__(self, prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float: ...


LONGBENCH = "THUDM/LongBench (https://arxiv.org/abs/2308.14508)"
LONGBENCH_V2 = "THUDM/LongBench v2 (https://arxiv.org/abs/2412.15204)"
INFINITEBENCH = "OpenBMB/InfiniteBench (https://arxiv.org/abs/2402.13718)"
LOOGLE = "bigai-nlco/LooGLE (https://arxiv.org/abs/2311.04939)"

# Full-width and CJK punctuation that LongBench and InfiniteBench strip from Chinese answers on top of
# string.punctuation (the same set in both suites' normalize_zh_answer).
_ZH_PUNCTUATION = frozenset(
    string.punctuation
    + "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～"
    + "｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    + "–—‘’‛“”„‟…‧﹏."
)
_EN_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DIGITS = re.compile(r"\d+")


# --------------------------------------------------------------------------------------------------
# Shared pieces


def _golds(answers: Sequence[str]) -> Sequence[str]:
    """``answers`` itself, after checking it is a non-empty sequence of strings (not one string)."""
    if isinstance(answers, str) or len(answers) == 0:
        raise ValueError(f"answers must be a non-empty sequence of strings, got {answers!r}")
    return answers


def _best(score: Callable[[str, str], float], prediction: str, answers: Sequence[str]) -> float:
    """The best ``score(prediction, gold)`` over the gold answers (how the suites handle several golds)."""
    return max(float(score(prediction, gold)) for gold in _golds(answers))


def _normalize_en(text: str) -> str:
    """SQuAD-style normalisation: lower-case, drop ASCII punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _EN_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _normalize_zh(text: str) -> str:
    """Chinese normalisation: lower-case, drop ASCII and CJK punctuation, drop all whitespace."""
    return "".join(ch for ch in text.lower() if ch not in _ZH_PUNCTUATION and not ch.isspace())


def _token_f1(predicted: Sequence[str], gold: Sequence[str]) -> float:
    """Bag-of-tokens F1: overlap = multiset intersection; 0 when nothing overlaps."""
    overlap = sum((Counter(predicted) & Counter(gold)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


def _jieba_words(text: str) -> list[str]:
    """``text`` segmented by jieba in its default (accurate, not full) mode."""
    jieba = require("jieba", extra="suites", what="Chinese metrics")
    return list(jieba.cut(text, cut_all=False))


def _number_share(prediction: str, target: str) -> float:
    """The share of the digit runs in ``prediction`` that equal ``target``; 0 when there are none."""
    numbers = _DIGITS.findall(prediction)
    if not numbers:
        return 0.0
    return sum(number == target for number in numbers) / len(numbers)


def _replace_all(text: str, characters: Sequence[str], by: str = " ") -> str:
    for character in characters:
        text = text.replace(character, by)
    return text


def _collapse_double_spaces(text: str) -> str:
    while "  " in text:
        text = text.replace("  ", " ")
    return text


# --------------------------------------------------------------------------------------------------
# LongBench


def qa_f1(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """Token F1 of the SQuAD-normalised prediction and gold answer, best over the gold answers.

    Both strings are lower-cased, stripped of ASCII punctuation and of the articles a/an/the, and
    split on whitespace; F1 = 2PR / (P + R) with P and R the multiset overlap over the prediction's
    and the gold's token counts (0 when nothing overlaps). From LongBench ``LongBench/metrics.py``,
    ``qa_f1_score`` (with ``normalize_answer``), maximised over the golds in ``LongBench/eval.py``,
    ``scorer`` (https://arxiv.org/abs/2308.14508). InfiniteBench's longbook_qa_eng is the same.
    """
    return _best(lambda p, g: _token_f1(_normalize_en(p).split(), _normalize_en(g).split()), prediction, answers)


def qa_f1_zh(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """Token F1 over jieba words, best over the gold answers.

    Each string is segmented by jieba (accurate mode), each word normalised (lower-cased, ASCII and
    CJK punctuation and whitespace removed) and empty words dropped; then the F1 of :func:`qa_f1`.
    From LongBench ``LongBench/metrics.py``, ``qa_f1_zh_score`` (https://arxiv.org/abs/2308.14508).
    """

    def words(text: str) -> list[str]:
        return [word for word in map(_normalize_zh, _jieba_words(text)) if word]

    return _best(lambda p, g: _token_f1(words(p), words(g)), prediction, answers)


def _rouge_package_l_f(prediction: str, gold: str) -> float:
    """The ``rouge`` package's ROUGE-L F (summary-level LCS over '.'-split sentences); 0 if it raises."""
    rouge = require("rouge", extra="suites", what="LongBench ROUGE-L")
    try:
        return float(rouge.Rouge().get_scores([prediction], [gold], avg=True)["rouge-l"]["f"])
    except Exception:  # the package raises on an empty hypothesis or reference; LongBench scores that 0
        return 0.0


def rouge_l(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """ROUGE-L F-measure as the ``rouge`` PyPI package computes it, best over the gold answers.

    The package splits both texts into sentences on '.', takes the union LCS of each gold sentence
    with the prediction's sentences, divides by the numbers of DISTINCT words for recall and
    precision, and returns 2PR / (P + R + 1e-8). It is case-sensitive, and it raises on an empty
    text, which LongBench scores 0. From LongBench ``LongBench/metrics.py``, ``rouge_score``
    (https://arxiv.org/abs/2308.14508); the same package is used so that numbers match.
    """
    return _best(_rouge_package_l_f, prediction, answers)


def rouge_l_zh(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """:func:`rouge_l` on jieba-segmented text (words joined by single spaces), best over the gold answers.

    From LongBench ``LongBench/metrics.py``, ``rouge_zh_score`` (https://arxiv.org/abs/2308.14508).
    """

    def spaced(text: str) -> str:
        return " ".join(_jieba_words(text))

    return _best(lambda p, g: _rouge_package_l_f(spaced(p), spaced(g)), prediction, answers)


def _classification_one(prediction: str, gold: str, classes: Sequence[str]) -> float:
    matched = [name for name in classes if name in prediction]
    # Drop the matched classes that are proper substrings of the gold label. This walks the list
    # the way a Python for-loop walks a list it is shrinking: after a removal the next element
    # shifts into the current slot and is never examined. LongBench's loop behaves so, and its
    # published numbers include the effect, so it is kept deliberately.
    position = 0
    while position < len(matched):
        name = matched[position]
        position += 1
        if name != gold and name in gold:
            matched.remove(name)
    return 1.0 / len(matched) if gold in matched else 0.0


def classification(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 / (number of class names found in the prediction) if the gold class is among them, else 0.

    The class names of ``classes`` that occur in the prediction (substring test, in ``classes``
    order) are collected; those that are proper substrings of the gold label are removed; the score
    is 1/len if the gold label remains, else 0; best over the gold answers. The removal skips the
    element after each removed one (LongBench removes from the list while iterating over it); this
    is reproduced DELIBERATELY, so that scores match LongBench's published numbers. From LongBench
    ``LongBench/metrics.py``, ``classification_score`` (https://arxiv.org/abs/2308.14508).
    """
    if isinstance(classes, str):
        raise ValueError(f"classes must be a sequence of class names, not one string: {classes!r}")
    return _best(lambda p, g: _classification_one(p, g, classes), prediction, answers)


def _gold_paragraph(gold: str, pattern: str) -> str:
    found = re.findall(pattern, gold)
    if not found:
        raise ValueError(f"gold answer {gold!r} does not name a paragraph (pattern {pattern!r})")
    return found[0]


def retrieval(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The share of the prediction's numbers that equal the gold paragraph's number ("Paragraph N").

    N is the first ``Paragraph (\\d+)`` of the gold answer; every maximal digit run of the
    prediction is a number; the score is (#numbers equal to N) / (#numbers), 0 when the prediction
    has none; best over the gold answers. From LongBench ``LongBench/metrics.py``,
    ``retrieval_score`` (https://arxiv.org/abs/2308.14508).
    """
    return _best(lambda p, g: _number_share(p, _gold_paragraph(g, r"Paragraph (\d+)")), prediction, answers)


def retrieval_zh(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """:func:`retrieval` for the Chinese gold form "段落N".

    From LongBench ``LongBench/metrics.py``, ``retrieval_zh_score`` (https://arxiv.org/abs/2308.14508).
    """
    return _best(lambda p, g: _number_share(p, _gold_paragraph(g, r"段落(\d+)")), prediction, answers)


def count(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The share of the prediction's numbers (digit runs) equal to the gold count, 0 if it has none.

    Best over the gold answers. From LongBench ``LongBench/metrics.py``, ``count_score``
    (https://arxiv.org/abs/2308.14508).
    """
    return _best(_number_share, prediction, answers)


def _first_code_line(prediction: str) -> str:
    """The first line (after leading newlines) holding none of '`', '#', '//'; '' if there is none."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def _fuzzywuzzy_ratio(first: str, second: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` (with python-Levenshtein): an integer percentage."""
    if first == second:  # fuzzywuzzy checks equality first, so two empty strings score 100
        return 100
    if not first or not second:
        return 0
    fuzz = require("rapidfuzz.fuzz", extra="suites", what="LongBench code similarity")
    return int(round(fuzz.ratio(first, second)))


def code_sim(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """fuzzywuzzy's ratio / 100 between the prediction's first code line and the gold line.

    The prediction's first line (after leading newlines) without '`', '#' or '//' is compared with
    the gold: ratio = round(100 * (1 - d / (len_a + len_b))) with d the insert/delete edit distance,
    100 for equal strings and 0 when exactly one is empty; best over the gold answers. From LongBench
    ``LongBench/metrics.py``, ``code_sim_score`` (https://arxiv.org/abs/2308.14508).

    LongBench calls ``fuzzywuzzy.fuzz.ratio``. With python-Levenshtein installed, fuzzywuzzy
    returns ``int(round(100 * Levenshtein.ratio(a, b)))`` after its equality and empty-string checks,
    and python-Levenshtein (0.18 and later) computes that ratio as rapidfuzz's normalised Indel
    similarity, the same quantity ``rapidfuzz.fuzz.ratio`` returns x 100; rounding it the same way
    gives fuzzywuzzy's integer. (Without python-Levenshtein fuzzywuzzy falls back to difflib's
    SequenceMatcher, whose ratio differs; the python-Levenshtein value is the one reproduced.)
    """
    return _best(lambda p, g: _fuzzywuzzy_ratio(_first_code_line(p), g) / 100, prediction, answers)


def first_line(metric: Metric) -> Metric:
    """``metric`` applied to the prediction's first line only (after leading newlines are dropped).

    LongBench's ``eval.py`` (``scorer``) cuts the prediction so for trec, triviaqa, samsum and lsht,
    where the model tends to continue with further few-shot examples after its answer.
    """

    def on_first_line(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
        return metric(prediction.lstrip("\n").split("\n")[0], answers, classes=classes)

    name = getattr(metric, "__name__", "metric")
    on_first_line.__name__ = on_first_line.__qualname__ = f"{name}_first_line"
    on_first_line.__doc__ = (
        f"``{name}`` on the prediction's first line (LongBench's rule for trec/triviaqa/samsum/lsht)."
    )
    return on_first_line


# --------------------------------------------------------------------------------------------------
# LongBench v2

_V2_PARENTHESISED = re.compile(r"The correct answer is \(([A-D])\)")
_V2_BARE = re.compile(r"The correct answer is ([A-D])")


def _v2_letter(prediction: str) -> str | None:
    """The letter LongBench v2 extracts: asterisks removed, '(X)' form searched first, then the bare form."""
    text = prediction.replace("*", "")
    found = _V2_PARENTHESISED.search(text) or _V2_BARE.search(text)
    return found.group(1) if found else None


def choice(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the letter extracted from the prediction equals the gold letter ``answers[0]``, else 0.

    The letter is the first 'The correct answer is (X)' (X in A-D) after every '*' is removed (so
    Markdown bold does not hide it), else the first 'The correct answer is X'; no match scores 0.
    From LongBench v2 ``pred.py``, ``extract_answer`` and the ``judge`` field it feeds, averaged by
    ``result.py`` (https://arxiv.org/abs/2412.15204).
    """
    return float(_v2_letter(prediction) == _golds(answers)[0])


# --------------------------------------------------------------------------------------------------
# InfiniteBench


def _first_digit_run(prediction: str) -> str:
    """The first maximal run of ASCII digits in ``prediction``; '' if there is none."""
    found = re.search(r"[0-9]+", prediction)
    return found.group(0) if found else ""


def infbench_passkey(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the prediction's first run of digits is exactly the gold ``answers[0]``, else 0.

    The comparison is between strings (leading zeros count). InfiniteBench compares with its single
    label, the first when given a list, so later answers are ignored. From InfiniteBench
    ``src/compute_scores.py``, ``get_score_one_passkey`` and ``get_score_one_number_string`` (both
    via ``first_int_match``) (https://arxiv.org/abs/2402.13718).
    """
    return float(_first_digit_run(prediction) == _golds(answers)[0])


_INFBENCH_WORD_BREAKS = ("\n", ":", '"', "'", ".", ",", "?", "!", "{", "}")


def infbench_kv_retrieval(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the gold value is one of the prediction's words, else 0 (best over the gold answers).

    Words: the prediction with newline, ':', quotes, '.', ',', '?', '!', '{', '}' replaced by spaces,
    split on whitespace. From InfiniteBench ``src/compute_scores.py``, ``get_score_one_kv_retrieval``
    (https://arxiv.org/abs/2402.13718), whose label is one string; with one gold answer the score is
    the same.
    """

    def one(p: str, gold: str) -> float:
        return float(gold in _replace_all(p, _INFBENCH_WORD_BREAKS).split())

    return _best(one, prediction, answers)


def _after_first_prefix(text: str, prefixes: Sequence[str]) -> str | None:
    """The text after the first of ``prefixes`` found (in that order) and one more character, as
    InfiniteBench's choice scorers read an answer ('' when the text ends there); None if none is found.
    A text that ends right at the prefix gives '', which starts with no option (upstream's 0)."""
    for prefix in prefixes:
        at = text.find(prefix)
        if at != -1:
            return text[at + len(prefix) + 1 :]
    return None


def infbench_longbook_choice_eng(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """InfiniteBench's multiple-choice rule; ``answers`` is its label ``[option text, option letter]``.

    After stripping: empty scores 0; a first character in 'ABCD' decides alone (1 if it is one of
    the answers); a prediction equal to one of the answers scores 1; otherwise, with quote and
    punctuation characters turned into spaces and double spaces collapsed, the first of 'answer is:',
    'answer:', 'answer is', 'option is' found decides (1 if the text after it and one space starts
    with an answer); else the first word that is a substring of 'ABCD' decides. From InfiniteBench
    ``src/compute_scores.py``, ``get_score_one_longbook_choice_eng``, label as built by
    ``src/eval_utils.py``, ``get_answer`` (https://arxiv.org/abs/2402.13718).
    """
    label = list(_golds(answers))
    text = prediction.strip()
    if not text:
        return 0.0
    if text[0] in "ABCD":
        return float(text[0] in label)
    if text in label:
        return 1.0
    text = _collapse_double_spaces(_replace_all(text, ("\n", '"', "'", ".", ",", "?", "!", "{", "}")))
    rest = _after_first_prefix(text, ("answer is:", "answer:", "answer is", "option is"))
    if rest is not None:
        return float(any(rest.startswith(option) for option in label))
    for word in text.split():
        if word in "ABCD":  # a substring test, as upstream: "BC" counts as a letter word (and then scores 0)
            return float(word in label)
    return 0.0


def infbench_longbook_qa_chn(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """Character F1 of the normalised prediction and gold (one character = one token), best over the golds.

    Normalisation lower-cases and removes ASCII and CJK punctuation and all whitespace; no word
    segmentation (unlike LongBench's :func:`qa_f1_zh`). From InfiniteBench ``src/compute_scores.py``,
    ``qa_f1_score_zh`` (https://arxiv.org/abs/2402.13718).
    """
    return _best(lambda p, g: _token_f1(list(_normalize_zh(p)), list(_normalize_zh(g))), prediction, answers)


def infbench_longbook_sum_eng(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """ROUGE-Lsum F-measure from Google's ``rouge-score``, no stemming, best over the gold answers.

    rouge-score lower-cases, keeps [a-z0-9] tokens, splits sentences on newlines and takes the
    summary-level union LCS; with several references ``score_multi`` keeps the best F. From
    InfiniteBench ``src/compute_scores.py``, ``get_score_one_longbook_sum_eng``, which calls
    ``evaluate.load("rouge")`` (a wrapper of rouge-score with ``use_stemmer=False``) and reads
    ``rougeLsum`` (https://arxiv.org/abs/2402.13718).
    """
    scorer_module = require("rouge_score.rouge_scorer", extra="suites", what="InfiniteBench ROUGE-Lsum")
    scorer = scorer_module.RougeScorer(["rougeLsum"], use_stemmer=False)
    return float(scorer.score_multi(list(_golds(answers)), prediction)["rougeLsum"].fmeasure)


def _parse_number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"gold answer {text!r} is not a number") from None


def infbench_math_find(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the prediction's first unsigned number equals the gold number ``answers[0]``, else 0.

    The first match of ``\\d+\\.\\d+|\\d+`` is compared as an int when the gold is an integer, as a
    float otherwise; no number scores 0, and a minus sign is never read. From InfiniteBench
    ``src/compute_scores.py``, ``get_score_one_math_find`` (https://arxiv.org/abs/2402.13718). Where
    the gold is an integer and the first number has a decimal point, InfiniteBench raises (it calls
    ``int("3.5")``); this scores such a prediction 0.
    """
    gold = _parse_number(_golds(answers)[0].strip())
    found = re.search(r"\d+\.\d+|\d+", prediction)
    if found is None:
        return 0.0
    if isinstance(gold, int):
        try:
            return float(int(found.group(0)) == gold)
        except ValueError:
            return 0.0
    return float(float(found.group(0)) == gold)


def infbench_math_calc(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The length of the prediction's correct prefix of values over the gold sequence's length.

    Each gold answer is the whole expected sequence written as one string, e.g. ``"[1, 3, -1, -11]"``
    (its integers, signs included, are read with ``-?\\d+``). The prediction's values are its
    maximal runs of digits as unsigned integers, as InfiniteBench reads them; counting stops at the
    first mismatch; best over the gold answers. From InfiniteBench ``src/compute_scores.py``,
    ``get_score_one_math_calc`` (https://arxiv.org/abs/2402.13718). Consequences kept from upstream: a
    negative gold value never matches (the prediction's '-' is dropped), so the prefix stops there.
    Not reproduced: upstream drops the first predicted number when the model is named "gpt4".
    """

    def one(p: str, gold: str) -> float:
        expected = [int(value) for value in re.findall(r"-?\d+", gold)]
        if not expected:
            raise ValueError(f"gold answer {gold!r} holds no integers")
        predicted = [int(run) for run in re.findall(r"[0-9]+", p)]
        correct = 0
        for want, got in zip(expected, predicted, strict=False):
            if want != got:
                break
            correct += 1
        return correct / len(expected)

    return _best(one, prediction, answers)


def infbench_code_run(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the prediction's last word, read as an integer, equals the gold integer ``answers[0]``, else 0.

    Words: the stripped prediction with newline, '.', '`', quotes and ':' turned into spaces; a last
    word that Python's ``int`` cannot read scores 0. From InfiniteBench ``src/compute_scores.py``,
    ``get_score_one_code_run`` (https://arxiv.org/abs/2402.13718).
    """
    gold = _parse_number(_golds(answers)[0].strip())
    words = _replace_all(prediction.strip(), ("\n", ".", "`", "'", '"', ":")).split()
    if not words:
        return 0.0
    try:
        return float(int(words[-1]) == gold)
    except ValueError:
        return 0.0


def infbench_code_debug(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """InfiniteBench's Code.Debug rule; ``answers`` is its label ``[function name, option letter]``.

    1 if the stripped prediction starts with 'X.' or 'X:' (X the letter). Otherwise, with newline,
    '`', quotes, '-', '*', 'Option' and 'option' turned into spaces and double spaces collapsed, the
    first of 'answer is:', 'is:', 'answer:', 'correct option is:' found decides: 1 if the text after
    it and one space starts with the letter or the function name; no prefix scores 0. From
    InfiniteBench ``src/compute_scores.py``, ``get_score_one_code_debug``, label as built by
    ``src/eval_utils.py``, ``get_answer`` (https://arxiv.org/abs/2402.13718).
    """
    label = _golds(answers)
    if len(label) < 2:
        raise ValueError(f"code_debug answers must be [function name, option letter], got {answers!r}")
    function_name, letter = label[0], label[1]
    text = prediction.strip()
    if text[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    text = _replace_all(text, ("\n", "`", "'", '"', "-", "*", "Option", "option"))
    text = _collapse_double_spaces(text)
    rest = _after_first_prefix(text, ("answer is:", "is:", "answer:", "correct option is:"))
    return 0.0 if rest is None else float(rest.startswith(letter) or rest.startswith(function_name))


def infbench_longdialogue_qa_eng(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if the gold name ``answers[0]`` is one of the prediction's upper-cased words, else 0.

    Words as in :func:`infbench_kv_retrieval`, each upper-cased; the gold is NOT upper-cased and
    only the first gold answer is used, as upstream does (so a lower-case or multi-word gold never
    matches). From InfiniteBench ``src/compute_scores.py``, ``get_score_one_longdialogue_qa_eng``
    (https://arxiv.org/abs/2402.13718).
    """
    words = [word.upper() for word in _replace_all(prediction.strip(), _INFBENCH_WORD_BREAKS).split()]
    return float(_golds(answers)[0] in words)


# --------------------------------------------------------------------------------------------------
# LooGLE


def _loogle_prediction(prediction: str) -> str:
    """LooGLE's ``automatic_eval.py`` scores an empty output as the text 'None'."""
    return "None" if prediction == "" else prediction


def loogle_rouge_l(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """ROUGE-L RECALL from the ``rouge`` PyPI package, best over the gold answers.

    LooGLE reads ``rouge-l`` ``r`` (its ``get_rouge_score`` defaults to ``metric="r"``) of
    ``Rouge().get_scores(hyps=[prediction], refs=[gold])``, after replacing an empty prediction by
    'None'. Where the package raises (a prediction or gold with no words, e.g. '.'), LooGLE's script
    stops; this scores 0. From LooGLE ``Evaluation/automatic_metrics.py``, ``get_rouge_score``, and
    ``Evaluation/automatic_eval.py``, ``evaluation`` (https://arxiv.org/abs/2311.04939).
    """
    rouge = require("rouge", extra="suites", what="LooGLE ROUGE-L")

    def one(p: str, gold: str) -> float:
        try:
            return float(rouge.Rouge().get_scores(hyps=[_loogle_prediction(p)], refs=[gold])[0]["rouge-l"]["r"])
        except Exception:
            return 0.0

    return _best(one, prediction, answers)


def _literal_dict(text: str) -> dict[Any, Any] | None:
    """``text`` read as a Python dict literal; None if it is not one."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _loogle_cloze(prediction: str, answers: Sequence[str], partial_match: bool) -> float:
    def one(p: str, gold: str) -> float:
        reference = _literal_dict(gold)
        if not reference:
            raise ValueError(f"LooGLE cloze gold must be a non-empty dict literal of mask -> answer, got {gold!r}")
        predicted = _literal_dict(_loogle_prediction(p))
        if predicted is None:
            return 0.0
        hits = 0
        for mask, want in reference.items():
            if mask not in predicted:
                continue
            got = predicted[mask]
            if not partial_match:
                hits += got == want
            elif isinstance(got, str) and isinstance(want, str):
                hits += bool(set(want.split()) & set(got.split()))
        return hits / len(reference)

    return _best(one, prediction, answers)


def loogle_cloze_exact(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The share of the gold masks whose predicted filler equals the gold filler exactly.

    Each gold answer is LooGLE's cloze reference written as a dict literal, e.g.
    ``"{'<mask-0>': 'Justin Timberlake'}"``; the prediction is read as a dict literal too (anything
    else scores 0). From LooGLE ``Evaluation/automatic_metrics.py``, ``get_exact_match``
    (https://arxiv.org/abs/2311.04939). Differences: LooGLE reads the prediction with ``eval`` (here
    ``ast.literal_eval``, which reads the same literals and runs no code), and reports
    (sum of hits) / (sum of masks) over the whole task, whereas the mean of these per-sample shares
    weights samples equally.
    """
    return _loogle_cloze(prediction, answers, partial_match=False)


def loogle_cloze_partial(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The share of the gold masks whose predicted filler shares at least one whitespace word with the gold.

    Input forms and differences as :func:`loogle_cloze_exact`; a predicted filler that is not a
    string counts as a miss (LooGLE would raise on it). From LooGLE
    ``Evaluation/automatic_metrics.py``, ``get_partial_match`` (https://arxiv.org/abs/2311.04939).
    """
    return _loogle_cloze(prediction, answers, partial_match=True)


# --------------------------------------------------------------------------------------------------
# SCBench


def scbench_kv_retrieval(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """1 if a gold value occurs in the prediction (case-sensitive substring), else 0.

    SCBench scores its key-value, hash-hop and prefix-suffix retrieval this way, not by
    InfiniteBench's word match. From microsoft/MInference ``scbench/compute_scores.py``,
    ``get_score_one_kv_retrieval`` (https://arxiv.org/abs/2412.10319).
    """
    return float(any(gold in prediction for gold in _golds(answers)))


# --------------------------------------------------------------------------------------------------
# RULER


def ruler_all(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """RULER's string_match_all: the share of gold answers found in the prediction, case-insensitively.

    From NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` (https://arxiv.org/abs/2404.06654);
    implemented by :func:`lorekv.eval.tasks.metrics.string_match_all`.
    """
    return ruler.string_match_all(prediction, answers)


def in_order(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """The share of gold answers the prediction holds in their gold order, as whole words
    (lorekv's list recall; :func:`lorekv.eval.tasks.metrics.string_match_in_order`)."""
    return ruler.string_match_in_order(prediction, answers)


def ruler_part(prediction: str, answers: Sequence[str], *, classes: Sequence[str] = ()) -> float:
    """RULER's string_match_part: 1 if any gold answer is found in the prediction, case-insensitively.

    From NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` (https://arxiv.org/abs/2404.06654);
    implemented by :func:`lorekv.eval.tasks.metrics.string_match_part`.
    """
    return ruler.string_match_part(prediction, answers)


# --------------------------------------------------------------------------------------------------
# Registry

_BASE: dict[str, Metric] = {
    # LongBench
    "qa_f1": qa_f1,
    "qa_f1_zh": qa_f1_zh,
    "rouge_l": rouge_l,
    "rouge_l_zh": rouge_l_zh,
    "classification": classification,
    "retrieval": retrieval,
    "retrieval_zh": retrieval_zh,
    "count": count,
    "code_sim": code_sim,
    # LongBench v2
    "choice": choice,
    # InfiniteBench (passkey and number_string share one scorer; longbook_qa_eng is LongBench's qa_f1)
    "infbench_passkey": infbench_passkey,
    "infbench_number_string": infbench_passkey,
    "infbench_kv_retrieval": infbench_kv_retrieval,
    "infbench_longbook_choice_eng": infbench_longbook_choice_eng,
    "infbench_longbook_qa_eng": qa_f1,
    "infbench_longbook_qa_chn": infbench_longbook_qa_chn,
    "infbench_longbook_sum_eng": infbench_longbook_sum_eng,
    "infbench_math_find": infbench_math_find,
    "infbench_math_calc": infbench_math_calc,
    "infbench_code_run": infbench_code_run,
    "infbench_code_debug": infbench_code_debug,
    "infbench_longdialogue_qa_eng": infbench_longdialogue_qa_eng,
    # LooGLE
    "loogle_rouge_l": loogle_rouge_l,
    "loogle_cloze_exact": loogle_cloze_exact,
    "loogle_cloze_partial": loogle_cloze_partial,
    # SCBench
    "scbench_kv_retrieval": scbench_kv_retrieval,
    # RULER
    "all": ruler_all,
    "part": ruler_part,
    # lorekv's long-output tasks
    "in_order": in_order,
}

FIRST_LINE_METRICS: tuple[str, ...] = ("qa_f1", "rouge_l", "classification")
"""The metrics LongBench applies to a first-line-only prediction for some datasets."""

SUITE_METRICS: dict[str, Metric] = {
    **_BASE,
    **{f"{name}:first_line": first_line(_BASE[name]) for name in FIRST_LINE_METRICS},
}
"""Metric name -> per-sample metric, for every suite (the names of the module docstring)."""


def metric(name: str) -> Metric:
    """The metric registered as ``name`` in :data:`SUITE_METRICS`.

    Raises:
        ValueError: ``name`` is not registered; the message lists the known names.
    """
    try:
        return SUITE_METRICS[name]
    except KeyError:
        known = ", ".join(sorted(SUITE_METRICS))
        raise ValueError(f"unknown metric {name!r}; known metrics: {known}") from None


__all__ = [
    "FIRST_LINE_METRICS",
    "SUITE_METRICS",
    "Metric",
    "choice",
    "classification",
    "code_sim",
    "count",
    "first_line",
    "infbench_code_debug",
    "infbench_code_run",
    "infbench_kv_retrieval",
    "infbench_longbook_choice_eng",
    "infbench_longbook_qa_chn",
    "infbench_longbook_sum_eng",
    "infbench_longdialogue_qa_eng",
    "infbench_math_calc",
    "infbench_math_find",
    "infbench_passkey",
    "loogle_cloze_exact",
    "loogle_cloze_partial",
    "scbench_kv_retrieval",
    "loogle_rouge_l",
    "metric",
    "qa_f1",
    "qa_f1_zh",
    "retrieval",
    "retrieval_zh",
    "rouge_l",
    "rouge_l_zh",
    "ruler_all",
    "ruler_part",
    "in_order",
]
